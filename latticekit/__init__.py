"""latticekit: exact n-gram rescoring of blockwise-parallel draft lattices.

Take the top-k tokens of each draft head (a :class:`SausageLattice`), rescore every path
with a Katz back-off :class:`NGramLM` conditioned on the decoded prefix, and keep the p best
drafts (:func:`pbest`, :func:`pbest_batch`). ``latticekit.torch`` verifies them in one
masked forward pass of the target model.
"""

from latticekit._version import __version__
from latticekit.errors import (
    ArpaFormatError,
    LatticeError,
    LatticeKitError,
    ModelFormatError,
    VocabularyError,
)
from latticekit.lattice import SausageLattice
from latticekit.ngram import NGramLM
from latticekit.search import Path, PBestResult, pbest, pbest_batch

__all__ = [
    "__version__",
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
