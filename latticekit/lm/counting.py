"""Counting n-grams of a corpus into sorted count tables.

A corpus is a sequence of sentences; each sentence is read as ``<s> w1 ... wn </s>`` and every
window of 1 to ``order`` words inside it is counted, exactly like OpenGrm's ``ngramcount``:
``<s>`` is counted as a unigram (once per sentence) and as a context, ``</s>`` as a predicted
word.

Count tables are *hierarchical*: the table of order ``k`` stores, for each n-gram, the row of
its first ``k - 1`` words in the table of order ``k - 1`` (``prefix``) and its last word
(``word``), sorted by ``(prefix, word)``. Since every lower-order table is itself sorted
lexicographically, the key ``prefix * vocab_size + word`` is sorted in the lexicographic order
of the n-grams, which makes every lookup a ``numpy.searchsorted`` and every merge a
``numpy.unique``, whatever the order and the vocabulary size.

Counting is done in chunks of sentences (bounded memory per chunk); chunk tables are spilled to
disk as ``.npy`` runs and merged, optionally in worker processes (see :func:`count_corpus`).
"""

from __future__ import annotations

import os
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from latticekit.errors import LatticeKitError
from latticekit.lm.trie import BOS, EOS, SPECIAL_WORDS, UNK, NGramTrie

__all__ = [
    "UNK",
    "BOS",
    "EOS",
    "SPECIAL_WORDS",
    "CorpusError",
    "NGramCounts",
    "count_stream",
    "merge_counts",
    "count_corpus",
    "sentences_to_stream",
]

class CorpusError(LatticeKitError, ValueError):
    """A corpus cannot be counted: it is empty, undecodable, or has ids out of range.

    Attributes:
        path: the file being read ("" for in-memory input).
        line: 1-based line number of the offending line (0 when the whole input is at fault).
    """

    def __init__(self, message: str, path: str = "", line: int = 0) -> None:
        super().__init__(message)
        self.path = path
        self.line = line


@dataclass
class NGramCounts(NGramTrie):
    """Sorted n-gram count tables of orders 1..``order`` (see :class:`NGramTrie`).

    Attributes:
        count: ``count[k-1]`` (int64 `[n_k]`) is how often each k-gram was seen.
        sentences: number of sentences counted.
        tokens: number of words counted, ``<s>`` and ``</s>`` excluded.
    """

    count: List[np.ndarray] = field(default_factory=list)
    sentences: int = 0
    tokens: int = 0

    def save(self, directory: str) -> None:
        """Write the tables as ``.npy`` files into ``directory`` (a spilled run)."""
        os.makedirs(directory, exist_ok=True)
        meta = np.array([self.vocab_size, self.order, self.sentences, self.tokens], np.int64)
        np.save(os.path.join(directory, "meta.npy"), meta)
        for k in range(self.order):
            np.save(os.path.join(directory, f"prefix{k + 1}.npy"), self.prefix[k])
            np.save(os.path.join(directory, f"word{k + 1}.npy"), self.word[k])
            np.save(os.path.join(directory, f"count{k + 1}.npy"), self.count[k])

    @classmethod
    def load(cls, directory: str, mmap: bool = True) -> "NGramCounts":
        """Read tables written by :meth:`save` (memory-mapped by default)."""
        mode = "r" if mmap else None
        vocab_size, order, sentences, tokens = np.load(os.path.join(directory, "meta.npy"))
        out = cls(int(vocab_size), sentences=int(sentences), tokens=int(tokens))
        for k in range(int(order)):
            out.prefix.append(np.load(os.path.join(directory, f"prefix{k + 1}.npy"), mmap_mode=mode))
            out.word.append(np.load(os.path.join(directory, f"word{k + 1}.npy"), mmap_mode=mode))
            out.count.append(np.load(os.path.join(directory, f"count{k + 1}.npy"), mmap_mode=mode))
        return out

    def prune_min_counts(self, min_counts: Sequence[int]) -> "NGramCounts":
        """Drop n-grams seen fewer times than their order's minimum count.

        ``min_counts[k-1]`` is the minimum for order ``k`` (missing orders: 1). Unigrams are
        never dropped. To keep the tables closed under prefixes and suffixes (every kept n-gram
        needs its history state and its back-off n-gram), the effective minimum of an order is
        the largest minimum of the orders up to it; the usual settings (e.g. 1, 1, 2, 4) are
        non-decreasing anyway.

        Args:
            min_counts: per-order minimum counts, each >= 1.

        Returns:
            New pruned tables (the prefix rows renumbered).

        Raises:
            ValueError: if a minimum count is < 1.
        """
        mins = [int(m) for m in min_counts]
        if any(m < 1 for m in mins):
            raise ValueError(f"min counts must be >= 1, got {list(min_counts)}")
        keep = []
        effective = 1
        for k in range(1, self.order + 1):
            if k >= 2 and k - 1 < len(mins):
                effective = max(effective, mins[k - 1])
            count = np.asarray(self.count[k - 1])
            keep.append(count >= effective if k > 1 else np.ones(len(count), bool))
        out = NGramCounts(
            self.vocab_size,
            [np.asarray(p) for p in self.prefix],
            [np.asarray(w) for w in self.word],
            sentences=self.sentences,
            tokens=self.tokens,
        )
        masks = out.select(keep)
        out.count = [np.asarray(c)[m] for c, m in zip(self.count, masks)]
        return out


def sentences_to_stream(sentences: Iterable[np.ndarray], offset: int = 0) -> np.ndarray:
    """Concatenate sentences of internal word ids into one ``<s> ... </s>`` stream.

    Args:
        sentences: int arrays of word ids (already mapped to internal ids).
        offset: added to every id (3 maps token ids onto internal ids after the specials).

    Returns:
        int32 stream (`[tokens + 2 * sentences]`).
    """
    parts = []
    for s in sentences:
        s = np.asarray(s, dtype=np.int64)
        parts.append(np.concatenate(([BOS], s + offset, [EOS])))
    if not parts:
        return np.empty(0, np.int32)
    return np.concatenate(parts).astype(np.int32)


def count_stream(stream: np.ndarray, order: int, vocab_size: int) -> NGramCounts:
    """Count every n-gram of orders 1..``order`` in a stream of sentences.

    Args:
        stream: int32 word ids, sentences written as ``<s> w1 ... wn </s>`` back to back.
        order: highest order to count (>= 1).
        vocab_size: every id in ``stream`` must be below it.

    Returns:
        The sorted count tables.

    Raises:
        ValueError: if ``order`` < 1 or the stream is malformed.
    """
    if order < 1:
        raise ValueError(f"order must be >= 1, got {order}")
    stream = np.ascontiguousarray(stream, dtype=np.int32)
    n = len(stream)
    sentences = int(np.count_nonzero(stream == BOS))
    if n and (stream[0] != BOS or stream[-1] != EOS or sentences != np.count_nonzero(stream == EOS)):
        raise ValueError("stream must be sentences written as <s> ... </s>")
    out = NGramCounts(vocab_size, sentences=sentences, tokens=n - 2 * sentences)
    V = np.int64(vocab_size)
    # Order 1: every position.
    words, inverse, counts = np.unique(stream, return_inverse=True, return_counts=True)
    out.prefix.append(np.zeros(len(words), np.int64))
    out.word.append(words.astype(np.int32))
    out.count.append(counts.astype(np.int64))
    pos = np.arange(n, dtype=np.int64)
    rows = inverse.astype(np.int64)
    for k in range(2, order + 1):
        # An n-gram of order k ends one after an (k-1)-gram that did not end the sentence.
        extend = stream[pos] != EOS
        pos = pos[extend] + 1
        keys = rows[extend] * V + stream[pos]
        uniq, rows, counts = np.unique(keys, return_inverse=True, return_counts=True)
        rows = rows.astype(np.int64)
        out.prefix.append(uniq // V)
        out.word.append((uniq % V).astype(np.int32))
        out.count.append(counts.astype(np.int64))
        if len(pos) == 0:
            for _ in range(k + 1, order + 1):
                out.prefix.append(np.zeros(0, np.int64))
                out.word.append(np.zeros(0, np.int32))
                out.count.append(np.zeros(0, np.int64))
            break
    return out


def merge_counts(tables: Sequence[NGramCounts]) -> NGramCounts:
    """Merge count tables of the same order and word-id space, summing counts.

    Counting two shards and merging gives exactly the tables of counting their concatenation.

    Args:
        tables: count tables (memory-mapped runs are fine).

    Returns:
        The merged tables.

    Raises:
        ValueError: if the tables disagree on order or vocabulary size.
    """
    if not tables:
        raise ValueError("nothing to merge")
    order = tables[0].order
    V = max(t.vocab_size for t in tables)
    if any(t.order != order for t in tables):
        raise ValueError("cannot merge count tables of different orders")
    out = NGramCounts(
        V,
        sentences=sum(t.sentences for t in tables),
        tokens=sum(t.tokens for t in tables),
    )
    maps: List[np.ndarray] = [np.zeros(0, np.int64)] * len(tables)
    for k in range(1, order + 1):
        keys = []
        for i, t in enumerate(tables):
            prefix = np.asarray(t.prefix[k - 1])
            mapped = maps[i][prefix] if k > 1 else prefix
            keys.append(mapped * np.int64(V) + np.asarray(t.word[k - 1]))
        all_keys = np.concatenate(keys)
        uniq, inverse = np.unique(all_keys, return_inverse=True)
        all_counts = np.concatenate([np.asarray(t.count[k - 1]) for t in tables])
        summed = np.bincount(inverse, weights=all_counts, minlength=len(uniq))
        out.prefix.append(uniq // V)
        out.word.append((uniq % V).astype(np.int32))
        out.count.append(np.rint(summed).astype(np.int64))
        bounds = np.cumsum([0] + [len(x) for x in keys])
        maps = [inverse[bounds[i]:bounds[i + 1]].astype(np.int64) for i in range(len(tables))]
    return out


def _count_chunk_to_run(args: Tuple[np.ndarray, int, int, str]) -> str:
    stream, order, vocab_size, directory = args
    count_stream(stream, order, vocab_size).save(directory)
    return directory


def count_corpus(
    streams: Iterable[np.ndarray],
    order: int,
    vocab_size_hint: int,
    workers: int = 2,
    spill_dir: Optional[str] = None,
    merge_fan_in: int = 8,
    progress: Optional[object] = None,
) -> NGramCounts:
    """Count a corpus given as chunks of ``<s> ... </s>`` streams, with bounded memory.

    Each chunk is counted (in ``workers`` processes when > 1) into a sorted run spilled to
    ``spill_dir``; runs are merged ``merge_fan_in`` at a time, so peak memory is about one
    chunk per worker plus the merged tables (which grow with the number of *distinct*
    n-grams, not with the corpus).

    Args:
        streams: chunks of word ids (see :func:`count_stream`).
        order: highest order to count.
        vocab_size_hint: lower bound of the word-id space (grown to fit every chunk).
        workers: processes used for counting chunks.
        spill_dir: where runs go (a fresh temporary directory when None).
        merge_fan_in: how many runs are merged at once.
        progress: optional object with ``update(n_tokens)`` (e.g. a tqdm bar).

    Returns:
        The merged count tables.

    Raises:
        CorpusError: if the corpus has no sentence.
    """
    if order < 1:
        raise ValueError(f"order must be >= 1, got {order}")
    own_tmp = None
    if spill_dir is None:
        own_tmp = tempfile.TemporaryDirectory(prefix="latticekit-counts-")
        spill_dir = own_tmp.name
    try:
        return _count_runs(streams, order, vocab_size_hint, workers, spill_dir, merge_fan_in, progress)
    finally:
        if own_tmp is not None:
            own_tmp.cleanup()


def _count_runs(
    streams: Iterable[np.ndarray],
    order: int,
    vocab_size: int,
    workers: int,
    spill_dir: str,
    fan_in: int,
    progress: Optional[object],
) -> NGramCounts:
    runs: List[str] = []
    n_run = 0

    def jobs() -> Iterator[Tuple[np.ndarray, int, int, str]]:
        nonlocal n_run, vocab_size
        for chunk in streams:
            chunk = np.asarray(chunk, dtype=np.int32)
            if len(chunk) == 0:
                continue
            vocab_size = max(vocab_size, int(chunk.max()) + 1)
            if progress is not None:
                progress.update(len(chunk))  # type: ignore[attr-defined]
            n_run += 1
            yield chunk, order, vocab_size, os.path.join(spill_dir, f"run{n_run}")

    def merge_runs(paths: List[str]) -> str:
        nonlocal n_run
        merged = merge_counts([NGramCounts.load(p) for p in paths])
        n_run += 1
        target = os.path.join(spill_dir, f"run{n_run}")
        merged.save(target)
        for p in paths:
            for name in os.listdir(p):
                os.remove(os.path.join(p, name))
            os.rmdir(p)
        return target

    if workers > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            pending = []
            for job in jobs():
                pending.append(pool.submit(_count_chunk_to_run, job))
                if len(pending) >= workers:  # keep at most `workers` chunks in flight
                    runs.append(pending.pop(0).result())
                if len(runs) >= fan_in:
                    runs = [merge_runs(runs)]
            runs.extend(f.result() for f in pending)
    else:
        for job in jobs():
            runs.append(_count_chunk_to_run(job))
            if len(runs) >= fan_in:
                runs = [merge_runs(runs)]
    if not runs:
        raise CorpusError("the corpus has no sentence to count")
    tables = [NGramCounts.load(p) for p in runs]
    if len(tables) == 1:
        t = tables[0]
        return NGramCounts(
            t.vocab_size,
            [np.array(a) for a in t.prefix],
            [np.array(a) for a in t.word],
            [np.array(a) for a in t.count],
            t.sentences,
            t.tokens,
        )
    return merge_counts(tables)
