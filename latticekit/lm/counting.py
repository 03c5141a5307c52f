"""Counting n-grams of a corpus into sorted count tables.

A corpus is a sequence of sentences; each sentence is read as ``<s> w1 ... wn </s>`` and every
window of 1 to ``order`` words inside it is counted, exactly like OpenGrm's ``ngramcount``:
``<s>`` is counted as a unigram (once per sentence) and as a context, ``</s>`` as a predicted
word.

Count tables are *hierarchical*: the table of order ``k`` stores, for each n-gram, the row of
its first ``k - 1`` words in the table of order ``k - 1`` (``prefix``) and its last word
(``word``), sorted by ``(prefix, word)``. Since every lower-order table is itself sorted
lexicographically, the key ``prefix * vocab_size + word`` is sorted in the lexicographic order
of the n-grams: counting is one radix sort of such keys per order, and merging sorted tables is
one pass over them, whatever the order and the vocabulary size.

Counting is done in chunks of sentences (bounded memory per chunk) by the C++ core
(``latticekit/counting.h``), in threads; chunk tables are held in memory up to a budget, then
merged and spilled to disk as raw runs, and the runs merged front to back (see
:func:`count_corpus`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Iterable, List, Optional, Sequence, Union

import numpy as np

from latticekit import _core
from latticekit.errors import CorpusError
from latticekit.ngram_trie import BOS, EOS, SPECIAL_WORDS, UNK, NGramTrie

# np.load parses a .npy header with ast.literal_eval, and CPython 3.11's AST builder keeps its
# recursion depth per interpreter, not per thread: counts loaded in several threads at once
# (concurrent count_corpus calls spilling their runs) failed with "SystemError: AST
# constructor recursion depth mismatch". Loading a count folder's meta holds this lock.
_META_LOCK = threading.Lock()

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

_COLUMN_DTYPES: dict[str, np.dtype[Any]] = {"i64": np.dtype(np.int64), "i32": np.dtype(np.int32)}


def run_files(directory: str, k: int) -> "tuple[str, str, str]":
    """The raw files (native-endian int64 prefix, int32 word, int64 count) of order ``k`` of a
    spilled run; ``meta.npy`` holds the vocabulary size, sentences, tokens and table sizes."""
    return (
        os.path.join(directory, f"prefix{k}.i64"),
        os.path.join(directory, f"word{k}.i32"),
        os.path.join(directory, f"count{k}.i64"),
    )


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

    @property
    def nbytes(self) -> int:
        """Bytes held by the tables."""
        return sum(int(np.asarray(a).nbytes) for a in (*self.prefix, *self.word, *self.count))

    def save(self, directory: str) -> None:
        """Write the tables into ``directory`` (a spilled run; see :func:`run_files`)."""
        os.makedirs(directory, exist_ok=True)
        for k in range(1, self.order + 1):
            for column, path in zip((self.prefix, self.word, self.count), run_files(directory, k)):
                np.ascontiguousarray(column[k - 1], dtype=_COLUMN_DTYPES[path[-3:]]).tofile(path)
        self._save_meta(directory, [self.total(k) for k in range(1, self.order + 1)])

    def _save_meta(self, directory: str, sizes: Sequence[int]) -> None:
        meta = np.array([self.vocab_size, self.sentences, self.tokens, *sizes], np.int64)
        np.save(os.path.join(directory, "meta.npy"), meta)

    @classmethod
    def load(cls, directory: str, mmap: bool = True) -> "NGramCounts":
        """Read tables written by :meth:`save` (memory-mapped by default)."""
        out, sizes = cls._load_meta(directory)
        for k, n in enumerate(sizes, start=1):
            for column, path in zip((out.prefix, out.word, out.count), run_files(directory, k)):
                dtype = _COLUMN_DTYPES[path[-3:]]
                if n == 0:
                    column.append(np.zeros(0, dtype))
                elif mmap:
                    column.append(np.memmap(path, dtype=dtype, mode="r", shape=(n,)))
                else:
                    column.append(np.fromfile(path, dtype=dtype, count=n))
        return out

    @classmethod
    def _load_meta(cls, directory: str) -> "tuple[NGramCounts, List[int]]":
        with _META_LOCK:
            meta = np.load(os.path.join(directory, "meta.npy")).tolist()
        vocab_size, sentences, tokens, *sizes = meta
        return cls(vocab_size, sentences=sentences, tokens=tokens), sizes

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

    One radix sort per order in the C++ core (``latticekit/counting.h``); the GIL is released
    while it runs, so chunks can be counted in threads.

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
    for prefix, word, count in _core.count_stream(stream, order, vocab_size, EOS):
        out.prefix.append(prefix)
        out.word.append(word)
        out.count.append(count)
    return out


def merge_counts(tables: Sequence[NGramCounts], min_counts: Optional[Sequence[int]] = None) -> NGramCounts:
    """Merge count tables of the same order and word-id space, summing counts.

    Counting two shards and merging gives exactly the tables of counting their concatenation.

    Args:
        tables: count tables (memory-mapped runs are fine).
        min_counts: per-order minimum counts applied to the merged counts, as
            :meth:`NGramCounts.prune_min_counts` does (None: keep everything).

    Returns:
        The merged tables.

    Raises:
        ValueError: if the tables disagree on order or vocabulary size, or a minimum count is < 1.
    """
    return _merge_tables(list(tables), min_counts, release_inputs=False)


def _effective_min_counts(order: int, min_counts: Optional[Sequence[int]]) -> List[int]:
    """Per order, the minimum count :meth:`NGramCounts.prune_min_counts` applies (1: none)."""
    mins = [int(m) for m in (min_counts or [])]
    if any(m < 1 for m in mins):
        raise ValueError(f"min counts must be >= 1, got {list(min_counts or [])}")
    out = [1]
    for k in range(2, order + 1):
        out.append(max(out[-1], mins[k - 1]) if k - 1 < len(mins) else out[-1])
    return out


Run = Union["NGramCounts", str]  # tables in memory, or the directory of a spilled run


def _merge_tables(
    inputs: List[Run],
    min_counts: Optional[Sequence[int]],
    release_inputs: bool,
    spill_to: Optional[str] = None,
    scratch: Optional[str] = None,
) -> NGramCounts:
    """Merge order by order in the C++ core (a k-way merge of sorted tables, no sort).

    Spilled runs (directories) are read front to back in blocks, never loaded. With
    ``release_inputs`` the in-memory input tables of an order are dropped once that order is
    merged. With ``spill_to`` the merged tables are written there (and returned
    memory-mapped). Row maps between orders go to files in ``scratch`` (default: a temporary
    directory) when any run is on disk or ``spill_to`` is set, else stay in memory.
    """
    if not inputs:
        raise ValueError("nothing to merge")
    heads = []
    sizes: List[Optional[List[int]]] = []
    for run in inputs:
        if isinstance(run, str):
            head, run_sizes = NGramCounts._load_meta(run)
            heads.append(head)
            sizes.append(run_sizes)
        else:
            heads.append(run)
            sizes.append(None)
    orders = {len(s) if s is not None else t.order for t, s in zip(heads, sizes)}
    if len(orders) != 1:
        raise ValueError("cannot merge count tables of different orders")
    order = orders.pop()
    V = max(t.vocab_size for t in heads)
    mins = _effective_min_counts(order, min_counts)
    out = NGramCounts(
        V,
        sentences=sum(t.sentences for t in heads),
        tokens=sum(t.tokens for t in heads),
    )
    maps_on_disk = spill_to is not None or any(isinstance(r, str) for r in inputs)
    own_scratch = None
    if maps_on_disk and scratch is None:
        own_scratch = tempfile.TemporaryDirectory(prefix="latticekit-maps-")
        scratch = own_scratch.name
    if spill_to is not None:
        os.makedirs(spill_to, exist_ok=True)
    try:
        merged_sizes = []
        maps: List[Any] = [None] * len(inputs)
        for k in range(1, order + 1):
            runs: List[tuple[Any, Any, Any, int]] = []  # columns: arrays, or a spilled run's files
            for i, run in enumerate(inputs):
                if isinstance(run, str):
                    runs.append((*run_files(run, k), sizes[i][k - 1]))  # type: ignore[index]
                else:
                    runs.append((run.prefix[k - 1], run.word[k - 1], run.count[k - 1], run.total(k)))
            row_maps: List[Any] = [None] * len(inputs)
            if k < order:  # the highest order needs no row maps
                if maps_on_disk:
                    row_maps = [os.path.join(scratch, f"map{k}.{i}.i64") for i in range(len(inputs))]  # type: ignore[arg-type]
                else:
                    row_maps = [np.empty(r[3], np.int64) for r in runs]
            output = run_files(spill_to, k) if spill_to is not None else None
            merged = _core.merge_count_order(runs, maps, V, mins[k - 1], row_maps, output)
            row_sizes = [r[3] for r in runs]
            del runs
            for m in maps:
                if isinstance(m, tuple):
                    os.remove(m[0])
            maps = [(m, n) if isinstance(m, str) else m for m, n in zip(row_maps, row_sizes)]
            if release_inputs:
                for run in inputs:
                    if not isinstance(run, str):
                        run.prefix[k - 1] = np.zeros(0, np.int64)
                        run.word[k - 1] = np.zeros(0, np.int32)
                        run.count[k - 1] = np.zeros(0, np.int64)
            if isinstance(merged, int):  # spill_to: the tables went to files
                merged_sizes.append(int(merged))
            else:
                prefix, word, count = merged
                out.prefix.append(prefix)
                out.word.append(word)
                out.count.append(count)
                del merged, prefix, word, count
    finally:
        if own_scratch is not None:
            own_scratch.cleanup()
    if spill_to is not None:
        out._save_meta(spill_to, merged_sizes)
        return NGramCounts.load(spill_to)
    return out


#: Default memory for count runs held in memory before they are merged and spilled (bytes).
DEFAULT_RUN_MEMORY = 512 << 20


def count_corpus(
    streams: Iterable[np.ndarray],
    order: int,
    vocab_size_hint: int,
    workers: int = 2,
    spill_dir: Optional[str] = None,
    merge_fan_in: int = 8,
    progress: Optional[object] = None,
    run_memory: int = DEFAULT_RUN_MEMORY,
    min_counts: Optional[Sequence[int]] = None,
) -> NGramCounts:
    """Count a corpus given as chunks of ``<s> ... </s>`` streams, with bounded memory.

    Chunks are counted in ``workers`` threads (the C++ counting releases the GIL) while the
    calling thread reads the next chunk. Count runs are held in memory until they take more
    than ``run_memory`` bytes; then they are merged into one sorted run spilled to
    ``spill_dir`` (raw files, see :func:`run_files`), and spilled runs are merged
    ``merge_fan_in`` at a time. Merges read spilled runs front to back through small
    buffers and keep the maps between orders on disk, so peak memory is about
    ``run_memory``, plus ``workers`` chunks being counted (~40 bytes per id), plus the
    reading of the next chunk, plus the final tables, which grow with the number of
    *distinct* n-grams kept (see ``min_counts``), not with the corpus.

    Args:
        streams: chunks of word ids (see :func:`count_stream`).
        order: highest order to count.
        vocab_size_hint: lower bound of the word-id space (grown to fit every chunk).
        workers: threads counting chunks.
        spill_dir: where runs go: a private temporary folder is made inside it (or in the
            system's temporary directory when None) and removed at the end.
        merge_fan_in: how many spilled runs are merged at once.
        progress: optional object with ``update(n_tokens)`` (e.g. a tqdm bar).
        run_memory: bytes of count runs held in memory before spilling.
        min_counts: per-order minimum counts applied in the final merge (as
            :meth:`NGramCounts.prune_min_counts`), so the unpruned tables of a large corpus
            never have to fit in memory.

    Returns:
        The merged count tables.

    Raises:
        CorpusError: if the corpus has no sentence.
        ValueError: if ``order`` < 1 or a minimum count is < 1.
    """
    if order < 1:
        raise ValueError(f"order must be >= 1, got {order}")
    _effective_min_counts(order, min_counts)  # reject bad minimums before counting
    # A private folder (inside spill_dir when given), so that builds sharing a spill_dir
    # never touch each other's runs; removed at the end, whatever happens.
    if spill_dir is not None:
        os.makedirs(spill_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="latticekit-counts-", dir=spill_dir) as own_tmp:
        runs = _RunStore(own_tmp, run_memory, merge_fan_in)
        _count_into(runs, streams, order, vocab_size_hint, max(1, workers), progress)
        _core.release_free_memory()  # what the counting threads freed
        return runs.finish(min_counts)


class _RunStore:
    """Count runs held in memory up to a budget, then merged and spilled to disk."""

    def __init__(self, spill_dir: str, run_memory: int, fan_in: int) -> None:
        self.spill_dir = spill_dir
        self.run_memory = run_memory
        self.fan_in = max(2, fan_in)
        self.held: List[Run] = []
        self.held_bytes = 0
        self.spilled: List[str] = []
        self.n_spilled = 0

    def add(self, run: NGramCounts) -> None:
        self.held.append(run)
        self.held_bytes += run.nbytes
        if self.held_bytes > self.run_memory:
            self._spill(self.held)
            self.held, self.held_bytes = [], 0
            if len(self.spilled) >= self.fan_in:
                paths, self.spilled = self.spilled, []
                self._spill(paths)  # type: ignore[arg-type]
                for p in paths:
                    shutil.rmtree(p)

    def _spill(self, runs: List[Run]) -> None:
        self.n_spilled += 1
        target = os.path.join(self.spill_dir, f"run{self.n_spilled}")
        _merge_tables(runs, None, release_inputs=True, spill_to=target, scratch=self.spill_dir)
        self.spilled.append(target)

    def finish(self, min_counts: Optional[Sequence[int]]) -> NGramCounts:
        runs: List[Run] = [*self.held, *self.spilled]
        self.held = []
        if not runs:
            raise CorpusError("the corpus has no sentence to count")
        merged = _merge_tables(runs, min_counts, release_inputs=True, scratch=self.spill_dir)
        del runs
        for path in self.spilled:
            shutil.rmtree(path)
        self.spilled = []
        return merged


def _count_into(
    runs: _RunStore,
    streams: Iterable[np.ndarray],
    order: int,
    vocab_size: int,
    workers: int,
    progress: Optional[object],
) -> None:
    with ThreadPoolExecutor(max_workers=workers) as pool:
        pending: "deque[Future[NGramCounts]]" = deque()
        for chunk in streams:
            chunk = np.ascontiguousarray(chunk, dtype=np.int32)
            if len(chunk) == 0:
                continue
            vocab_size = max(vocab_size, int(chunk.max()) + 1)
            if progress is not None:
                progress.update(len(chunk))  # type: ignore[attr-defined]
            pending.append(pool.submit(count_stream, chunk, order, vocab_size))
            del chunk
            while len(pending) > workers:  # at most `workers` chunks counting, one being read
                runs.add(pending.popleft().result())
        while pending:
            runs.add(pending.popleft().result())
