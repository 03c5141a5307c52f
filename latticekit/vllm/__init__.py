"""latticekit inside vLLM: its n-gram drafting as a speculative-decoding proposer.

::

    import vllm
    from latticekit.vllm import speculative_config

    llm = vllm.LLM(model, speculative_config=speculative_config(8, lm="embedded"))

or, for ``vllm serve``, ``--speculative-config '{"method": "custom_class", "model":
"latticekit.vllm.NGramProposer", "num_speculative_tokens": 8}'`` with the settings in
``LATTICEKIT_VLLM_CONFIG`` (:mod:`latticekit.vllm.config`). With draft heads (``heads=``),
``latticekit.vllm.LatticeProposer`` drafts from their lattice (:mod:`latticekit.vllm.lattice`).
Importing this package imports neither vLLM nor torch: vLLM imports the proposer in its worker
process, and the lattice proposer imports torch when the engine hands it the model.
docs/vllm.md says more.
"""

from latticekit.vllm.config import ENV, LATTICE_PROPOSER, PROPOSER, ProposerConfig, speculative_config
from latticekit.vllm.lattice import LatticeProposer
from latticekit.vllm.proposer import NGramProposer

__all__ = ["ENV", "PROPOSER", "LATTICE_PROPOSER", "NGramProposer", "LatticeProposer", "ProposerConfig",
           "speculative_config"]
