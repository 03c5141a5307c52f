"""latticekit: exact n-gram rescoring of blockwise-parallel draft lattices.

Take the top-k tokens of each draft head (a :class:`SausageLattice`), rescore every path
with a Katz back-off :class:`NGramLM` conditioned on the decoded prefix, and keep the p best
drafts (:func:`pbest`, :func:`pbest_batch`). ``latticekit.torch`` verifies them in one
masked forward pass of the target model; :func:`generate` (torch, loaded on first use) decodes
with all of it, faster than greedy decoding and with the same tokens; :func:`decode` runs any
:class:`DecoderConfig` (``latticekit.drafting`` holds the drafters, torch-free).
"""

from typing import Any

from latticekit._version import __version__
from latticekit.errors import (
    ArpaFormatError,
    LatticeError,
    LatticeKitError,
    ModelFormatError,
    VocabularyError,
)
from latticekit.drafting.config import DecoderConfig
from latticekit.lattice import SausageLattice
from latticekit.ngram import NGramLM
from latticekit.search import Path, PBestResult, pbest, pbest_batch

__all__ = [
    "__version__",
    "generate",
    "decode",
    "greedy_decode",
    "DecoderConfig",
    "NGramLM",
    "SausageLattice",
    "Path",
    "PBestResult",
    "pbest",
    "pbest_batch",
    "LatticeKitError",
    "ArpaFormatError",
    "ModelFormatError",
    "LatticeError",
    "VocabularyError",
]


def __getattr__(name: str) -> Any:
    if name == "generate":  # needs torch: imported on first use
        from latticekit.decoding.generation import generate

        return generate
    if name in ("decode", "greedy_decode"):
        from latticekit.decoding import loop

        return getattr(loop, name)
    raise AttributeError(f"module 'latticekit' has no attribute {name!r}")
