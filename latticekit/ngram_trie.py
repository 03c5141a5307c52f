"""The sorted n-gram trie: the layout of a set of n-gram tables, and the word-id rules.

The core's interchange formats (ARPA text out, OpenGrm model FSTs) read and write n-gram
tables through it, and :mod:`latticekit.lm` holds its counts and back-off models in it. Every
word table starts with the three special words ``<unk>``, ``<s>``, ``</s>`` (ids 0, 1, 2),
the order :attr:`latticekit.NGramLM.words` has too.

The table of order ``k`` stores, for each n-gram, the row of its first ``k - 1`` words in the
table of order ``k - 1`` (``prefix``) and its last word (``word``), sorted by
``(prefix, word)``. Since every lower-order table is itself sorted lexicographically, the
int64 key ``prefix * vocab_size + word`` is sorted in the lexicographic order of the n-grams
(as long as ``rows * vocab_size`` fits in 63 bits), and the n-grams extending one row of the
table below are contiguous: a lookup is a binary search among them (in the C++ core).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import numpy as np

from latticekit import _core

__all__ = ["UNK", "BOS", "EOS", "SPECIAL_WORDS", "NGramTrie", "index_tables"]

#: Internal word ids of the three special words (the first three entries of every word table).
UNK, BOS, EOS = 0, 1, 2
SPECIAL_WORDS = ("<unk>", "<s>", "</s>")


@dataclass
class NGramTrie:
    """Sorted n-gram tables of orders 1..``order`` (structure only).

    Attributes:
        vocab_size: size of the internal word-id space; every word id is ``< vocab_size``.
        prefix: ``prefix[k-1]`` (int64 `[n_k]`) is the row of each k-gram's first ``k - 1``
            words in the table of order ``k - 1`` (zeros for unigrams).
        word: ``word[k-1]`` (int32 `[n_k]`) is each k-gram's last word id.
    """

    vocab_size: int
    prefix: List[np.ndarray] = field(default_factory=list)
    word: List[np.ndarray] = field(default_factory=list)

    @property
    def order(self) -> int:
        """Highest n-gram order of the tables."""
        return len(self.word)

    def total(self, order: int) -> int:
        """Number of n-grams of ``order``."""
        return len(self.word[order - 1])

    def keys(self, order: int) -> np.ndarray:
        """Sorted int64 keys ``prefix * vocab_size + word`` of the table of ``order``."""
        return np.asarray(self.prefix[order - 1]) * np.int64(self.vocab_size) + np.asarray(
            self.word[order - 1]
        )

    def ngram_ids(self, order: int) -> np.ndarray:
        """The word ids of every n-gram of ``order``.

        Returns:
            ids (`np.ndarray` of shape `(n, order)`, int32), rows in table order.
        """
        n = self.total(order)
        ids = np.empty((n, order), dtype=np.int32)
        rows = np.arange(n, dtype=np.int64)
        for k in range(order, 0, -1):
            ids[:, k - 1] = np.asarray(self.word[k - 1])[rows]
            rows = np.asarray(self.prefix[k - 1])[rows]
        return ids

    def lookup(self, order: int, prefix_rows: np.ndarray, words: np.ndarray) -> np.ndarray:
        """Rows of the n-grams ``(prefix, word)`` in the table of ``order``, -1 where absent.

        Args:
            order: the table to search.
            prefix_rows: int64 rows in the table of ``order - 1`` (ignored for unigrams;
                negative rows give -1).
            words: word ids, same shape as ``prefix_rows``.

        Returns:
            int64 rows, same shape as ``words``.
        """
        words = np.asarray(words, dtype=np.int64)
        shape = words.shape
        if order > 1:
            parents = np.broadcast_to(np.asarray(prefix_rows, dtype=np.int64), shape)
            n_parents = self.total(order - 1)
        else:
            parents = np.zeros(shape, np.int64)
            n_parents = 1
        # a word outside the vocabulary becomes -1, which no table row has
        query = np.where((words >= 0) & (words < self.vocab_size), words, -1).ravel()
        rows = _core.lookup_children(
            np.ascontiguousarray(self.prefix[order - 1], dtype=np.int64),
            np.ascontiguousarray(self.word[order - 1], dtype=np.int32),
            n_parents,
            np.ascontiguousarray(parents, dtype=np.int64).ravel(),
            query,
        )
        return rows.reshape(shape)

    def lookup_ngrams(self, ids: np.ndarray) -> np.ndarray:
        """Rows of whole n-grams given as word ids, -1 where absent.

        Args:
            ids (`np.ndarray` of shape `(n, k)`): word ids of n-grams of order ``k``.

        Returns:
            int64 rows `[n]` in the table of order ``k``.
        """
        ids = np.asarray(ids, dtype=np.int64)
        rows = np.zeros(len(ids), np.int64)
        for k in range(1, ids.shape[1] + 1):
            rows = self.lookup(k, rows, ids[:, k - 1])
        return rows

    def suffix_rows(self, order: int, below: Optional[np.ndarray] = None) -> np.ndarray:
        """Row of each n-gram's last ``order - 1`` words in the table of ``order - 1``.

        Args:
            order: the table whose suffixes are wanted.
            below: ``suffix_rows(order - 1)`` when the caller has it (saves recomputing it).

        Returns:
            int64 `[n_order]` (-1 where a suffix is missing, which a well-formed model never
            has); zeros for unigrams.
        """
        if order == 1:
            return np.zeros(self.total(1), dtype=np.int64)
        if order == 2:
            return self.lookup(1, np.zeros(self.total(2), np.int64), self.word[1])
        if below is None:
            below = self.suffix_rows(order - 1)
        inner = below[np.asarray(self.prefix[order - 1])]
        return self.lookup(order - 1, inner, self.word[order - 1])

    def child_counts(self, order: int) -> np.ndarray:
        """How many n-grams of ``order + 1`` extend each n-gram of ``order``.

        Returns:
            int64 `[n_order]` (zeros at the highest order).
        """
        if order >= self.order:
            return np.zeros(self.total(order), np.int64)
        return np.bincount(np.asarray(self.prefix[order]), minlength=self.total(order)).astype(
            np.int64
        )

    def select(self, keep: Sequence[np.ndarray]) -> List[np.ndarray]:
        """Keep the rows flagged in ``keep`` (one bool array per order), renumbering prefixes.

        A row whose prefix row is dropped is dropped too. Modifies this trie in place.

        Args:
            keep: ``keep[k-1]`` (bool `[n_k]`) flags the rows of order ``k`` to keep.

        Returns:
            The final keep masks (after dropping orphans), one per order.
        """
        new_row_of_old = None
        final = []
        for k in range(1, self.order + 1):
            mask = np.asarray(keep[k - 1], dtype=bool).copy()
            prefix = np.asarray(self.prefix[k - 1])
            if new_row_of_old is not None:
                mapped = new_row_of_old[prefix]
                mask &= mapped >= 0
                self.prefix[k - 1] = np.ascontiguousarray(mapped[mask])
            else:
                self.prefix[k - 1] = np.ascontiguousarray(prefix[mask])
            self.word[k - 1] = np.ascontiguousarray(np.asarray(self.word[k - 1])[mask])
            new_row_of_old = np.full(len(mask), -1, np.int64)
            new_row_of_old[mask] = np.arange(int(mask.sum()), dtype=np.int64)
            final.append(mask)
        return final

    @classmethod
    def from_ngram_ids(cls, vocab_size: int, ids_per_order: Sequence[np.ndarray]) -> "NGramTrie":
        """Build a trie from unsorted n-gram id matrices, one per order.

        Args:
            vocab_size: size of the word-id space.
            ids_per_order: ``ids_per_order[k-1]`` (int `[n_k, k]`) lists the n-grams of order
                ``k``; every prefix of an n-gram must be listed at the order below.

        Returns:
            The trie, with ``order_rows[k-1]`` attribute-free: use :meth:`lookup_ngrams` to find
            where each input row went.

        Raises:
            ValueError: if an n-gram's prefix is missing or an n-gram is listed twice.
        """
        trie = cls(vocab_size)
        for k, ids in enumerate(ids_per_order, start=1):
            ids = np.asarray(ids, dtype=np.int64).reshape(-1, k)
            if k == 1:
                prefix = np.zeros(len(ids), np.int64)
            else:
                prefix = trie.lookup_ngrams(ids[:, :-1])
                if np.any(prefix < 0):
                    bad = ids[np.argmax(prefix < 0)]
                    raise ValueError(f"{k}-gram {bad.tolist()} has no {k - 1}-gram prefix")
            keys = prefix * np.int64(vocab_size) + ids[:, -1]
            order = np.argsort(keys, kind="stable")
            keys = keys[order]
            if len(keys) > 1 and np.any(keys[1:] == keys[:-1]):
                raise ValueError(f"a {k}-gram is listed twice")
            trie.prefix.append(prefix[order])
            trie.word.append(ids[order, -1].astype(np.int32))
        return trie


def index_tables(
    vocab_size: int,
    ids: Sequence[np.ndarray],
    log10_prob: Sequence[np.ndarray],
    log10_backoff: Sequence[np.ndarray],
) -> Tuple[NGramTrie, List[np.ndarray], List[np.ndarray]]:
    """The trie of n-grams listed in any order, and their values in its row order.

    Args:
        vocab_size: size of the word-id space.
        ids: ``ids[k-1]`` (int `[n_k, k]`) the k-grams.
        log10_prob, log10_backoff: ``[k-1]`` (float `[n_k]`) their values, row for row.

    Returns:
        ``(trie, log10_prob, log10_backoff)``, the values float64 `[n_k]` per order, in the
        trie's (lexicographic) row order.

    Raises:
        ValueError: duplicate n-grams or missing histories (from :meth:`NGramTrie.from_ngram_ids`).
    """
    trie = NGramTrie.from_ngram_ids(vocab_size, ids)
    probs: List[np.ndarray] = []
    backoffs: List[np.ndarray] = []
    for k in range(1, len(ids) + 1):
        rows = trie.lookup_ngrams(ids[k - 1])
        p = np.empty(len(rows))
        b = np.empty(len(rows))
        p[rows] = log10_prob[k - 1]
        b[rows] = log10_backoff[k - 1]
        probs.append(p)
        backoffs.append(b)
    return trie, probs, backoffs
