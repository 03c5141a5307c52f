"""latticekit inside vLLM: its n-gram drafting as a speculative-decoding proposer.

::

    import vllm
    from latticekit.vllm import speculative_config

    llm = vllm.LLM(model, speculative_config=speculative_config(8, lm="embedded"))

or, for ``vllm serve``, ``--speculative-config '{"method": "custom_class", "model":
"latticekit.vllm.NGramProposer", "num_speculative_tokens": 8}'`` with the settings in
``LATTICEKIT_VLLM_CONFIG`` (:mod:`latticekit.vllm.config`). Nothing here imports vLLM or
torch: vLLM imports the proposer in its worker process. docs/vllm.md says more.
"""

from latticekit.vllm.config import ENV, PROPOSER, ProposerConfig, speculative_config
from latticekit.vllm.proposer import NGramProposer

__all__ = ["ENV", "PROPOSER", "NGramProposer", "ProposerConfig", "speculative_config"]
