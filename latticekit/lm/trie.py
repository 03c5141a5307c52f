"""The n-gram trie and special word ids, now in the core: :mod:`latticekit.ngram_trie`.

Kept so that ``from latticekit.lm.trie import ...`` goes on working.
"""

from latticekit.ngram_trie import BOS, EOS, SPECIAL_WORDS, UNK, NGramTrie

__all__ = ["UNK", "BOS", "EOS", "SPECIAL_WORDS", "NGramTrie"]
