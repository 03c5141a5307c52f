"""Building n-gram models: counting, Katz estimation, pruning, perplexity, OpenFst interop.

Everything here reproduces OpenGrm NGram 1.3.11 (``ngramcount``, ``ngrammake --method=katz``,
``ngramshrink --method=relative_entropy``, ``ngramperplexity``) without needing it installed;
see ``docs/building_models.md``. OpenFst interop lives in :mod:`latticekit.lm.fst` (needs
pynini) and is not imported here.
"""

from latticekit.lm.arpa_io import read_arpa, write_arpa, write_model_arpa
from latticekit.lm.build import add_unseen_vocabulary, build_katz, count_ngrams
from latticekit.lm.counting import CorpusError, NGramCounts, count_stream, merge_counts
from latticekit.lm.katz import estimate_katz, format_discounts, katz_discounts
from latticekit.lm.model import BackoffModel
from latticekit.lm.ppl import PerplexityResult, perplexity, perplexity_of_files
from latticekit.lm.prune import prune_relative_entropy

__all__ = [
    "BackoffModel",
    "CorpusError",
    "NGramCounts",
    "PerplexityResult",
    "add_unseen_vocabulary",
    "build_katz",
    "count_ngrams",
    "count_stream",
    "estimate_katz",
    "format_discounts",
    "katz_discounts",
    "merge_counts",
    "perplexity",
    "perplexity_of_files",
    "prune_relative_entropy",
    "read_arpa",
    "write_arpa",
    "write_model_arpa",
]
