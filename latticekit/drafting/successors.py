"""A Katz back-off model's next tokens after a context, most probable first, over its whole vocabulary.

A best-first search over continuations (:mod:`latticekit.drafting.continuations`) asks, at every
node, for the r-th most probable next token. :class:`KatzSuccessors` answers exactly, with the
model's own back-off semantics (:class:`~latticekit.NGramLM`, KenLM's): after a context whose
longest known suffix is the state s_0, with back-off states s_1, ..., s_L (the root),

    log10 p(w | context) = bo(s_0) + ... + bo(s_{j-1}) + log10 P(s_j w),   j the first level with s_j w,

so the tokens in decreasing probability are a merge of the levels' explicit successors (each
level sorted once, offset by the back-off weights above it), where a token is taken at the
first level that lists it and skipped at every lower one. The sums are the core's, in the same
order and precision, so ``logprob`` equals :meth:`NGramLM.token_logprobs` bit for bit
(``tests/decoding/test_headsfree.py``).

Only words that are token ids are proposed: ``<unk>`` (which stands for every id the model
lacks), ``<s>`` and ``</s>`` never are, though they are scored as the model scores them.

The index is numpy arrays over the model's n-gram tables (an n-gram of order n keyed by its
prefix's row in the table of order n - 1 times the number of words, plus its last word), built
once per model (about 0.1 s for the shipped 400k-n-gram model) and shared. States are kept per
context (the last ``order - 1`` tokens) with their ranked tokens computed as far as asked.
"""

from __future__ import annotations

import heapq
import math
import weakref
from collections.abc import Iterator, Sequence
from typing import Optional

import numpy as np

from latticekit.errors import DecoderConfigError
from latticekit.ngram import NGramLM

__all__ = ["KatzSuccessors", "KatzState"]

LN10 = math.log(10.0)
#: States kept per model before the memo is emptied (a long decode visits many contexts).
MAX_STATES = 200_000


class KatzSuccessors:
    """The next-token index of one :class:`NGramLM` over token ids (words spelled as decimal ids).

    Use :meth:`of` to share one index per model.

    Raises:
        DecoderConfigError: the model's words are not token ids (a model read with ``vocab``).
    """

    def __init__(self, lm: NGramLM) -> None:
        words = lm.words
        token_of = lm.word_token_ids()
        if not (token_of >= 0).any():
            raise DecoderConfigError("the static n-gram model's words must be token ids (decimal)")
        self.lm = lm
        self.order = lm.order
        self.base = len(words)
        self.token_of = token_of  # word id -> token id, -1 for <unk>, <s>, </s>
        self.word_of = np.zeros(int(token_of.max()) + 1, dtype=np.int64)  # token id -> word id (0: <unk>)
        self.word_of[token_of[token_of >= 0]] = np.nonzero(token_of >= 0)[0]
        # Per order n (index n - 1): sorted keys, and the rows re-sorted by (prefix, -log10 p, token id).
        self.keys: list[np.ndarray] = []
        self.backoff: list[np.ndarray] = []
        self.log10p: list[np.ndarray] = []
        self.ranked_words: list[np.ndarray] = []
        self.ranked_log10p: list[np.ndarray] = []
        for n in range(1, self.order + 1):
            ids, log10p, backoff = lm.ngrams(n)
            ids = ids.astype(np.int64)
            if n == 1:
                keys = ids[:, 0]
            else:
                prefix = self._rows(ids[:, : n - 1])
                if (prefix < 0).any():  # the model fills missing prefixes in; a guard all the same
                    raise DecoderConfigError("the n-gram model is not prefix-closed")
                keys = prefix * self.base + ids[:, n - 1]
            rank = np.lexsort((token_of[ids[:, n - 1]], -log10p.astype(np.float64), keys // self.base))
            self.keys.append(keys)
            self.log10p.append(log10p)
            self.backoff.append(backoff)
            self.ranked_words.append(ids[rank, n - 1])
            self.ranked_log10p.append(log10p[rank])
        self._states: dict[tuple[int, ...], KatzState] = {}

    @classmethod
    def of(cls, lm: NGramLM) -> "KatzSuccessors":
        """The index of ``lm``, built on first use and kept while the model lives."""
        index = _INDEXES.get(lm)
        if index is None:
            index = _INDEXES[lm] = cls(lm)
        return index

    # -- rows of the n-gram tables -------------------------------------------------------------

    def _rows(self, ngrams: np.ndarray) -> np.ndarray:
        """Row of each n-gram (word ids, `(count, n)`) in the table of its order; -1 if absent."""
        rows = np.full(ngrams.shape[0], -1, dtype=np.int64)
        found = np.ones(ngrams.shape[0], dtype=bool)
        for j in range(ngrams.shape[1]):
            key = ngrams[:, j] if j == 0 else rows * self.base + ngrams[:, j]
            keys = self.keys[j]
            at = np.minimum(np.searchsorted(keys, key), len(keys) - 1)
            found &= keys[at] == key
            rows = np.where(found, at, -1)
            rows = np.maximum(rows, 0)  # keep the arithmetic defined; `found` remembers misses
        return np.where(found, rows, -1)

    def _row(self, words: Sequence[int]) -> int:
        """Row of one n-gram (word ids) in the table of its order, or -1."""
        row = 0
        for j, word in enumerate(words):
            key = word if j == 0 else row * self.base + word
            keys = self.keys[j]
            at = int(np.searchsorted(keys, key))
            if at >= len(keys) or keys[at] != key:
                return -1
            row = at
        return row

    def has(self, n: int, row: int, word: int) -> bool:
        """Whether the state at ``row`` of order ``n - 1`` (``row`` 0 and n = 1: the root) has
        an arc for ``word``."""
        keys = self.keys[n - 1]
        key = word if n == 1 else row * self.base + word
        at = int(np.searchsorted(keys, key))
        return at < len(keys) and int(keys[at]) == key

    def arc_log10p(self, n: int, row: int, word: int) -> Optional[float]:
        """log10 P(state word) for the arc of ``word`` at a state of order ``n - 1``, or None."""
        keys = self.keys[n - 1]
        key = word if n == 1 else row * self.base + word
        at = int(np.searchsorted(keys, key))
        if at < len(keys) and int(keys[at]) == key:
            return float(self.log10p[n - 1][at])
        return None

    def span(self, n: int, row: int) -> tuple[int, int]:
        """The arcs (rows of order n) of the state at ``row`` of order ``n - 1``."""
        if n == 1:
            return 0, len(self.keys[0])
        keys = self.keys[n - 1]
        return int(np.searchsorted(keys, row * self.base)), int(np.searchsorted(keys, (row + 1) * self.base))

    # -- states ----------------------------------------------------------------------------------

    def words(self, tokens: Sequence[int]) -> list[int]:
        """Word ids of token ids (ids the model lacks are ``<unk>``, word 0)."""
        top = len(self.word_of)
        return [int(self.word_of[t]) if 0 <= t < top else 0 for t in tokens]

    def state(self, context: Sequence[int]) -> "KatzState":
        """The state after ``context`` (token ids; only the last ``order - 1`` matter)."""
        keep = self.order - 1
        key = tuple(context[len(context) - min(len(context), keep):]) if keep else ()
        state = self._states.get(key)
        if state is None:
            if len(self._states) >= MAX_STATES:
                self._states.clear()
            state = self._states[key] = KatzState(self, self.words(key))
        return state


_INDEXES: "weakref.WeakKeyDictionary[NGramLM, KatzSuccessors]" = weakref.WeakKeyDictionary()


class KatzState:
    """The model after one context: exact log-probabilities and the ranked next tokens.

    Attributes:
        levels: ``(n, row, offset)`` from the longest known suffix of the context down to the
            root: arcs of order n leave the state at ``row`` (of order n - 1), and a word found
            there scores ``offset + log10 P`` (``offset``: the back-off weights above, in log10).
    """

    __slots__ = ("index", "levels", "_ranked", "_merge")

    def __init__(self, index: KatzSuccessors, context_words: Sequence[int]) -> None:
        self.index = index
        suffixes = []  # rows of the known suffixes of the context, longest first
        for m in range(len(context_words), 0, -1):
            row = index._row(context_words[len(context_words) - m:])
            if row >= 0:
                suffixes.append((m + 1, row))
        suffixes.append((1, 0))
        levels = []
        offset = 0.0
        for n, row in suffixes:
            levels.append((n, row, offset))
            if n > 1:
                offset += float(index.backoff[n - 2][row])  # this state's back-off weight
        self.levels = levels
        self._ranked: list[tuple[int, float]] = []
        self._merge: Optional[Iterator[tuple[int, float]]] = None

    def log10p(self, word: int) -> float:
        """log10 p(word | context), as the core computes it."""
        index = self.index
        for n, row, offset in self.levels:
            p = index.arc_log10p(n, row, word)
            if p is not None:
                return offset + p
        raise AssertionError("every word has a unigram")  # pragma: no cover

    def logprob(self, token: int) -> float:
        """Natural-log p(token | context); ids the model lacks score as ``<unk>``."""
        return self.log10p(self.index.words((token,))[0]) * LN10

    def ranked(self, r: int) -> Optional[tuple[int, float]]:
        """The r-th most probable proposable token (0-based) and its natural-log probability,
        ties by token id; None past the last."""
        while len(self._ranked) <= r:
            if self._merge is None:
                self._merge = self._ranked_tokens()
            nxt = next(self._merge, None)
            if nxt is None:
                return None
            self._ranked.append(nxt)
        return self._ranked[r]

    def _ranked_tokens(self) -> Iterator[tuple[int, float]]:
        index = self.index
        token_of = index.token_of
        heap: list[tuple[float, int, int, int, int]] = []  # (-log10 p, token, level, position, end)
        for level, (n, row, offset) in enumerate(self.levels):
            lo, hi = index.span(n, row)
            self._push(heap, level, lo, hi)
        while heap:
            neg, token, level, pos, end = heapq.heappop(heap)
            self._push(heap, level, pos + 1, end)
            word = int(index.ranked_words[self.levels[level][0] - 1][pos])
            if any(index.has(n, row, word) for n, row, _ in self.levels[:level]):
                continue  # listed by a longer context: scored there
            yield int(token_of[word]), -neg * LN10

    def _push(self, heap: list[tuple[float, int, int, int, int]], level: int, pos: int, end: int) -> None:
        """The level's next proposable arc at or after ``pos`` onto the merge heap."""
        index = self.index
        n, _, offset = self.levels[level]
        words, log10p = index.ranked_words[n - 1], index.ranked_log10p[n - 1]
        while pos < end:
            token = int(index.token_of[words[pos]])
            if token >= 0:
                heapq.heappush(heap, (-(offset + float(log10p[pos])), token, level, pos, end))
                return
            pos += 1
