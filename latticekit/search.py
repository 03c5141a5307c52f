"""Exact p-best drafts of a sausage lattice rescored by an n-gram model."""

from __future__ import annotations

import math
import os
from typing import Any, Iterator, List, NamedTuple, Optional, Sequence, Union

import numpy as np

from latticekit._arrays import _INT32_MAX, token_array
from latticekit.errors import LatticeError
from latticekit.lattice import SausageLattice
from latticekit.ngram import NGramLM

__all__ = ["Path", "PBestResult", "pbest", "pbest_batch"]


class Path(NamedTuple):
    """One draft and its scores (natural logs).

    ``score == draft_score + alpha * lm_score`` and
    ``lm_score == lm.score(tokens, context, bos)``.
    """

    tokens: tuple[int, ...]
    score: float
    draft_score: float
    lm_score: float


class PBestResult:
    """The p best paths of every lattice of a batch, as arrays and as :class:`Path` lists.

    Indexing (``result[b]``) and iteration give ``list[Path]`` per lattice, best first.

    Attributes:
        tokens (`np.ndarray` of shape `(batch, q, h)`): int32 drafts, -1 past ``counts[b]``;
            q is ``min(p, the largest number of paths of any lattice of the batch)``.
        scores, draft_scores, lm_scores (`np.ndarray` of shape `(batch, q)`): float64, NaN
            past ``counts[b]``.
        counts (`np.ndarray` of shape `(batch,)`): paths found per lattice (< p only when the
            lattice has fewer than p paths).
        pops, transitions (`np.ndarray` of shape `(batch,)`): search effort per lattice:
            partial paths created, and model transitions computed.
    """

    def __init__(self, tokens: np.ndarray, scores: np.ndarray, draft_scores: np.ndarray, lm_scores: np.ndarray,
                 counts: np.ndarray, pops: np.ndarray, transitions: np.ndarray) -> None:
        self.tokens = tokens
        self.scores = scores
        self.draft_scores = draft_scores
        self.lm_scores = lm_scores
        self.counts = counts
        self.pops = pops
        self.transitions = transitions

    def __len__(self) -> int:
        return int(self.counts.shape[0])

    def __getitem__(self, b: int) -> List[Path]:
        n = int(self.counts[b])
        rows = self.tokens[b, :n].tolist()
        s, d, l = self.scores[b].tolist(), self.draft_scores[b].tolist(), self.lm_scores[b].tolist()
        return [Path(tuple(rows[i]), s[i], d[i], l[i]) for i in range(n)]

    def __iter__(self) -> Iterator[List[Path]]:
        for b in range(len(self)):
            yield self[b]


# Worker threads of one pbest_batch call; far more than any machine runs at once.
MAX_THREADS = 1024


def _check_search_args(lm: Any, p: Any, alpha: Any) -> None:
    """Checks what the search takes; the core then bounds alpha by the model's values (an
    alpha that would overflow the path scores is a LatticeError)."""
    if not isinstance(lm, NGramLM):
        raise LatticeError(f"lm must be an NGramLM, got {type(lm).__name__}")
    if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or p < 1:
        raise LatticeError(f"p must be an integer >= 1, got {p!r}")
    if p > 2**20:
        raise LatticeError(f"p={p} is too large (at most 2**20)")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.floating, np.integer)):
        raise LatticeError(f"alpha must be a finite number >= 0, got {alpha!r}")
    try:
        finite = math.isfinite(alpha)
    except OverflowError:  # an int beyond float's range
        finite = False
    if not finite or alpha < 0:
        raise LatticeError(f"alpha must be a finite number >= 0, got {alpha!r}")


def pbest(
    lattice: SausageLattice,
    lm: NGramLM,
    p: int,
    alpha: float = 1.0,
    context: Any = (),
    bos: bool = False,
) -> List[Path]:
    """The p highest-scoring drafts of a lattice, best first.

    A path's score is ``draft_score + alpha * lm_score``: the sum of its arc scores plus
    alpha times its natural-log n-gram probability after ``context``, with exact back-off
    semantics (an n-gram that exists is never bypassed through a back-off). The result is
    exact: these are the p best of all paths. Ties break by token sequence, ascending.

    Args:
        lattice: a single lattice (use :func:`pbest_batch` for a batch).
        lm: the n-gram model.
        p: number of paths wanted; fewer come back only when the lattice has fewer.
        alpha: weight of the n-gram score, finite and >= 0, and small enough that no path
            score overflows (about 1e300 / (|largest model value| x (h + 2 x order))).
        context: the decoded prefix (token ids); only its last ``order - 1`` tokens matter.
        bos: the prefix starts at ``<s>``.

    Returns:
        ``min(p, lattice.num_paths)`` paths, best first.

    Raises:
        LatticeError: a batched lattice, p < 1, alpha negative, not finite or so large that
            the path scores would overflow.
        VocabularyError: negative ids among the last ``order - 1`` tokens of context
            (the only ones read).
    """
    if not isinstance(lattice, SausageLattice):
        raise LatticeError(f"lattice must be a SausageLattice, got {type(lattice).__name__}")
    if lattice.is_batch:
        raise LatticeError("pbest takes one lattice; use pbest_batch for a batch")
    _check_search_args(lm, p, alpha)
    tail = _context_tail(context, lm.order - 1)
    p = min(int(p), lattice.num_paths)  # the output buffers need no more rows than paths
    return lm._core.pbest_one(lattice.tokens, lattice.scores, lattice.widths, tail, bool(bos),
                              p, float(alpha), Path)


def pbest_batch(
    lattices: Union[SausageLattice, Sequence[SausageLattice]],
    lm: NGramLM,
    p: int,
    alpha: float = 1.0,
    contexts: Optional[Sequence[Any]] = None,
    bos: bool = False,
    threads: Optional[int] = None,
) -> PBestResult:
    """:func:`pbest` for a batch of lattices in one call, without the GIL, over threads.

    Args:
        lattices: a batched :class:`SausageLattice` (``(batch, h, k)``) or a sequence of
            single lattices of equal ``h`` (different ``k`` are padded through widths).
        lm: the n-gram model, shared read-only by all threads.
        p, alpha, bos: as in :func:`pbest`.
        contexts: one decoded prefix per lattice, or None for none.
        threads: worker threads, 1 to ``MAX_THREADS`` (1024); default ``os.cpu_count()``
            (at most 1024). No more threads start than there are lattices.

    Returns:
        A :class:`PBestResult`; ``result[b]`` is ``pbest`` of lattice b. Its arrays have
        ``min(p, the largest number of paths of any lattice)`` rows per lattice.

    Raises:
        LatticeError: mismatched shapes or bad arguments.
        ThreadStartError: the system refused a worker thread (an ``OSError``); the threads
            that had started were joined.
    """
    _check_search_args(lm, p, alpha)
    tokens, scores, widths = _stack(lattices)
    if threads is None:
        threads = min(os.cpu_count() or 1, MAX_THREADS)
    return _search(tokens, scores, widths, lm, p, alpha, contexts, bos, threads)


def _search(tokens: np.ndarray, scores: np.ndarray, widths: np.ndarray, lm: NGramLM, p: int, alpha: float,
            contexts: Optional[Sequence[Any]], bos: bool, threads: int) -> PBestResult:
    """The validated arrays of a batch, (batch, h, k), through the core search."""
    batch = tokens.shape[0]
    if contexts is None:
        flat = offsets = None
    else:
        if len(contexts) != batch:
            raise LatticeError(f"{len(contexts)} contexts for {batch} lattices")
        keep = lm.order - 1
        parts = [_context_tail(c, keep) for c in contexts]
        offsets = np.zeros(batch + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([len(c) for c in parts])
        flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or not 1 <= threads <= MAX_THREADS:
        raise LatticeError(f"threads must be an integer in 1..{MAX_THREADS}, got {threads!r}")
    out = lm._core.pbest_batch(tokens, scores, widths, flat, offsets, bool(bos), int(p),
                               float(alpha), int(threads))
    return PBestResult(*out)


def _context_tail(context: Any, keep: int) -> np.ndarray:
    """The last ``keep`` tokens of a decoded prefix (the only ones that matter), validated,
    as contiguous int32. Only those are checked, so a long context costs nothing extra."""
    if isinstance(context, (list, tuple)):
        tail = context[len(context) - min(len(context), keep):]
        if all(type(t) is int and 0 <= t <= _INT32_MAX for t in tail):
            return np.array(tail, dtype=np.int32)
        return token_array(tail, "context")
    if getattr(context, "ndim", None) != 1:  # not a 1-D array or tensor: convert it whole
        context = token_array(context, "context")
    return token_array(context[len(context) - min(len(context), keep):], "context")


def _stack(lattices: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if isinstance(lattices, SausageLattice):
        if not lattices.is_batch:
            lattices = [lattices]
        else:
            return lattices.tokens, lattices.scores, lattices.widths
    lattices = list(lattices)
    if not lattices:
        empty = np.zeros((0, 1, 1), dtype=np.int32)
        return empty, empty.astype(np.float32), np.zeros((0, 1), dtype=np.int32)
    for i, lat in enumerate(lattices):
        if not isinstance(lat, SausageLattice) or lat.is_batch:
            raise LatticeError(f"lattices[{i}] must be a single SausageLattice")
    h = lattices[0].h
    if any(lat.h != h for lat in lattices):
        raise LatticeError("all lattices of a batch need the same number of positions h")
    k = max(lat.k for lat in lattices)
    batch = len(lattices)
    tokens = np.zeros((batch, h, k), dtype=np.int32)
    scores = np.zeros((batch, h, k), dtype=np.float32)
    widths = np.zeros((batch, h), dtype=np.int32)
    for b, lat in enumerate(lattices):
        tokens[b, :, : lat.k] = lat.tokens
        scores[b, :, : lat.k] = lat.scores
        widths[b] = lat.widths
    return tokens, scores, widths
