"""Building n-gram models: counting, Katz estimation, pruning, perplexity, OpenFst interop.

Everything here reproduces OpenGrm NGram (``ngramcount``, ``ngrammake --method=katz``,
``ngramshrink --method=relative_entropy``, ``ngramperplexity``) without needing it installed.
"""

from latticekit.lm.arpa_io import read_arpa, write_arpa, write_model_arpa
from latticekit.lm.counting import CorpusError, NGramCounts, count_stream, merge_counts
from latticekit.lm.katz import estimate_katz, katz_discounts
from latticekit.lm.model import BackoffModel

__all__ = [
    "BackoffModel",
    "CorpusError",
    "NGramCounts",
    "count_stream",
    "estimate_katz",
    "katz_discounts",
    "merge_counts",
    "read_arpa",
    "write_arpa",
    "write_model_arpa",
]
