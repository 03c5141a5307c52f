"""A back-off n-gram model held as numpy tables: the working form of latticekit.lm.

:class:`BackoffModel` is what estimation produces, pruning shrinks, the ARPA and FST
converters read and write, and the perplexity code scores. It keeps log10 values in float64;
:meth:`BackoffModel.tables` gives the ``(ids, log10_prob, log10_backoff)`` float32 triples of
the ``NGramLM`` contract.

Why float64 (the one statement of it; the float64 ARPA reader and the docs point here):
OpenGrm holds every weight as a float32 ``-ln p`` and prints ``log10 p = -w / ln 10`` computed
in double with 7 significant digits. That log10 value is not a float32 number: storing it as
one (as the compiled ``NGramLM`` does, which is ample for scoring) can change the printed 7th
digit. Estimation applies OpenGrm's float32 roundings to the ``-ln`` weights (see
:mod:`latticekit.lm.katz`) and keeps the log10 values in float64, and :func:`read_arpa
<latticekit.lm.arpa_io.read_arpa>` keeps them as printed, so that building, pruning and
re-writing a model give OpenGrm's ARPA text byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import numpy as np

from latticekit.errors import VocabularyError
from latticekit.ngram_trie import BOS, EOS, SPECIAL_WORDS, UNK, NGramTrie, index_tables

__all__ = ["BackoffModel", "LN10"]

LN10 = float(np.log(10.0))


@dataclass
class BackoffModel(NGramTrie):
    """A back-off n-gram model (see :class:`~latticekit.ngram_trie.NGramTrie` for the layout).

    Attributes:
        words: the word table; ``words[i]`` is the word of internal id ``i``
            (``<unk>``, ``<s>``, ``</s>`` first).
        log10_prob: ``log10_prob[k-1]`` (float64 `[n_k]`) log10 probability of each k-gram
            given its history (``<s>`` has -99, following SRILM).
        log10_backoff: ``log10_backoff[k-1]`` (float64 `[n_k]`) log10 back-off weight of the
            history state each k-gram opens; NaN where it opens none (n-grams ending in
            ``</s>``, highest order).
    """

    words: List[str] = field(default_factory=list)
    log10_prob: List[np.ndarray] = field(default_factory=list)
    log10_backoff: List[np.ndarray] = field(default_factory=list)

    @classmethod
    def from_arrays(
        cls,
        words: Sequence[str],
        ids: Sequence[np.ndarray],
        log10_prob: Sequence[np.ndarray],
        log10_backoff: Sequence[np.ndarray],
    ) -> "BackoffModel":
        """A model from per-order n-grams in any order.

        Args:
            words: the word table.
            ids: ``ids[k-1]`` (int `[n_k, k]`) the k-grams, indexing ``words``.
            log10_prob, log10_backoff: ``[k-1]`` (float `[n_k]`) their values, row for row.

        Raises:
            ValueError: duplicate n-grams or missing histories (from the trie).
        """
        trie, probs, backoffs = index_tables(len(words), ids, log10_prob, log10_backoff)
        return cls(len(words), trie.prefix, trie.word, list(words), probs, backoffs)

    @property
    def counts(self) -> Tuple[int, ...]:
        """Number of n-grams per order."""
        return tuple(self.total(k) for k in range(1, self.order + 1))

    def tables(self) -> List[Tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The ``NGramLM.from_ngrams`` tables: per order ``(ids, log10_prob, log10_backoff)``.

        Returns:
            For order ``k``: ids (int32 `[n, k]` indexing :attr:`words`), log10_prob
            (float32 `[n]`), log10_backoff (float32 `[n]`, 0 where no back-off).
        """
        out = []
        for k in range(1, self.order + 1):
            bo = np.nan_to_num(self.log10_backoff[k - 1], nan=0.0)
            out.append(
                (
                    self.ngram_ids(k),
                    np.asarray(self.log10_prob[k - 1], np.float32),
                    np.asarray(bo, np.float32),
                )
            )
        return out

    def log10_tables(self) -> List[Tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The float64 tables the ARPA writer and the FST converter take, per order.

        Returns:
            For order ``k``: ids (int32 `[n, k]` indexing :attr:`words`), log10_prob (float64
            `[n]`), log10_backoff (float64 `[n]`, NaN where the n-gram opens no state).
        """
        return [
            (self.ngram_ids(k), self.log10_prob[k - 1], self.log10_backoff[k - 1])
            for k in range(1, self.order + 1)
        ]

    def word_ids(self, words: Sequence[str]) -> np.ndarray:
        """Internal ids of ``words`` (``UNK`` = 0 for words not in the table)."""
        index = {w: i for i, w in enumerate(self.words)}
        return np.fromiter((index.get(w, UNK) for w in words), dtype=np.int64, count=len(words))

    def copy(self) -> "BackoffModel":
        """A deep copy."""
        return BackoffModel(
            self.vocab_size,
            [np.array(a) for a in self.prefix],
            [np.array(a) for a in self.word],
            list(self.words),
            [np.array(a) for a in self.log10_prob],
            [np.array(a) for a in self.log10_backoff],
        )

    # ----------------------------------------------------------------------------- scoring
    def score_positions(
        self, stream: np.ndarray, starts: np.ndarray, bos: Optional[np.ndarray] = None
    ) -> Tuple[np.ndarray, np.ndarray]:
        """log10 p of every word of a stream of segments, with back-off (vectorised).

        A segment is scored from the ``<s>`` state when its ``bos`` flag is set, else from the
        unigram state; the segment's first element is then a real word. Words not in the
        model get NaN.

        Args:
            stream: int64 word ids of segments back to back (`[n]`).
            starts: int64 `[n]`, for each position the index where its segment starts.
            bos: bool `[n]`, whether the position's segment starts after ``<s>``
                (default: all True).

        Returns:
            (log10 p (float64 `[n]`), matched order (int64 `[n]`, 0 for unknown words)).
        """
        stream = np.asarray(stream, np.int64)
        starts = np.asarray(starts, np.int64)
        n = len(stream)
        if bos is None:
            bos = np.ones(n, bool)
        V = self.vocab_size
        pos = np.arange(n, dtype=np.int64)
        at_start = pos == starts
        valid_word = (stream >= 0) & (stream < V)
        words = np.where(valid_word, stream, 0)
        bos_row = self.lookup(1, np.zeros(1, np.int64), np.array([BOS]))[0]
        # histories[k-1][i]: row of the k-gram ending just before position i (the history of
        # the word at i), -1 if there is none; <s> counts as history where bos is set.
        rows = np.where(valid_word, self.lookup(1, np.zeros(n, np.int64), words), -1)
        histories: List[np.ndarray] = []
        all_rows: List[np.ndarray] = [rows]
        for k in range(2, self.order + 1):
            hist = np.full(n, -1, np.int64)
            hist[1:] = all_rows[-1][:-1]
            hist[at_start] = -1
            if k == 2:
                hist[at_start & bos] = bos_row
            histories.append(hist)
            rows = np.where(valid_word & (hist >= 0), self.lookup(k, hist, words), -1)
            all_rows.append(rows)
        logp = np.full(n, np.nan)
        matched = np.zeros(n, np.int64)
        backoff_sum = np.zeros(n)
        done = ~valid_word
        for k in range(self.order, 0, -1):
            r = all_rows[k - 1]
            hit = (~done) & (r >= 0)
            logp[hit] = self.log10_prob[k - 1][r[hit]] + backoff_sum[hit]
            matched[hit] = k
            done |= hit
            if k >= 2:
                hist = histories[k - 2]
                miss = (~done) & (hist >= 0)
                bo = self.log10_backoff[k - 2][hist[miss]]
                backoff_sum[miss] += np.nan_to_num(bo, nan=0.0)
        return logp, matched

    @staticmethod
    def special_words() -> Tuple[str, str, str]:
        """The three special words, in internal id order."""
        return SPECIAL_WORDS

    def __post_init__(self) -> None:
        if self.words and tuple(self.words[:3]) != SPECIAL_WORDS:
            raise VocabularyError(f"word table must start with {SPECIAL_WORDS}")

    @property
    def eos(self) -> int:
        """Internal id of ``</s>``."""
        return EOS
