"""Sausage lattices (confusion networks) of draft tokens."""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

from latticekit._arrays import int32_ids, to_numpy
from latticekit._core import lattice_problem
from latticekit.errors import LatticeError, VocabularyError

__all__ = ["SausageLattice"]


class SausageLattice:
    """h positions with up to k weighted arcs each: k^h candidate drafts.

    Position i offers ``tokens[i, :widths[i]]`` with natural-log scores (larger is better).
    A lattice may also be a batch: arrays of shape ``(batch, h, k)``.

    Attributes:
        tokens (`np.ndarray` of shape `(h, k)` or `(batch, h, k)`): int32 token ids.
        scores (`np.ndarray` of the same shape): float32 arc scores.
        widths (`np.ndarray` of shape `(h,)` or `(batch, h)`): int32 arcs used per position.
    """

    __slots__ = ("tokens", "scores", "widths")
    tokens: np.ndarray
    scores: np.ndarray
    widths: np.ndarray

    def __init__(self, tokens: Any, scores: Any, widths: Any = None) -> None:
        """Validates and stores a lattice.

        Args:
            tokens: integer token ids, shape ``(h, k)`` or ``(batch, h, k)``.
            scores: finite arc scores of the same shape (natural log, larger is better).
            widths: optional arcs used per position, shape ``(h,)`` or ``(batch, h)``, each
                in ``1..k``; arcs past the width are ignored. Default: all k.

        Raises:
            LatticeError: wrong shapes or dtypes, non-finite scores, widths out of range, or a
                token repeated within a position.
            VocabularyError: negative token ids, or ids beyond int32.
        """
        tokens = to_numpy(tokens)
        scores = to_numpy(scores)
        if tokens.ndim not in (2, 3):
            raise LatticeError(f"tokens must have shape (h, k) or (batch, h, k), got {tokens.shape}")
        if scores.shape != tokens.shape:
            raise LatticeError(f"scores shape {scores.shape} differs from tokens shape {tokens.shape}")
        if tokens.shape[-1] < 1 or tokens.shape[-2] < 1:
            raise LatticeError(f"a lattice needs at least one position and one arc, got shape {tokens.shape}")
        if not np.issubdtype(tokens.dtype, np.integer):
            raise LatticeError(f"tokens must be integers, got dtype {tokens.dtype}")
        if not np.issubdtype(scores.dtype, np.floating):
            raise LatticeError(f"scores must be floating point, got dtype {scores.dtype}")
        # negative ids may pad arcs past a position's width; lattice_problem below refuses the rest
        tokens = int32_ids(tokens, "the lattice", negative=True)
        k = tokens.shape[-1]
        if widths is None:
            widths = np.full(tokens.shape[:-1], k, dtype=np.int32)
        else:
            widths = to_numpy(widths)
            if widths.shape != tokens.shape[:-1]:
                raise LatticeError(f"widths must have shape {tokens.shape[:-1]}, got {widths.shape}")
            if not np.issubdtype(widths.dtype, np.integer):
                raise LatticeError(f"widths must be integers, got dtype {widths.dtype}")
            if widths.size and (widths.min() < 1 or widths.max() > k):
                raise LatticeError(f"widths must lie in 1..{k}")
            widths = np.ascontiguousarray(widths, dtype=np.int32)
        # Scores are checked as stored: a float64 beyond float32's range would become inf.
        with np.errstate(over="ignore"):
            scores = np.ascontiguousarray(scores, dtype=np.float32)
        h = tokens.shape[-2]
        problem = lattice_problem(tokens.reshape(-1, h, k), scores.reshape(-1, h, k),
                                  widths.reshape(-1, h))
        if problem is not None:
            kind, b, i, j = problem
            where = (b, i) if tokens.ndim == 3 else (i,)
            if kind == 0:
                raise VocabularyError(f"negative token id {int(tokens[where][j])} in the lattice")
            if kind == 1:
                score = float(scores[where][j])
                beyond = "" if math.isnan(score) else " (or beyond float32's range, ~3.4e38)"
                raise LatticeError(f"lattice scores must be finite: {score}{beyond} at position "
                                   f"{where}, arc {j}")
            # A token twice within one position would make two paths spell the same draft.
            raise LatticeError(f"position {where} lists a token twice; each arc of a position must differ")
        self.tokens = tokens
        self.scores = scores
        self.widths = widths

    @classmethod
    def from_logits(cls, logits: Any, k: int, fix_first: bool = False) -> "SausageLattice":
        """Top-k lattice of the heads' logits, log-softmax scored.

        Top-k and log-softmax run on the tensor's own device (a CUDA tensor stays on the
        GPU); only the ``(h, k)`` result crosses to the host.

        Args:
            logits (`np.ndarray` or `torch.Tensor` of shape `(h, vocab)` or `(batch, h, vocab)`):
                one row per head, head 1 first.
            k: arcs per position, ``1 <= k <= vocab``.
            fix_first: keep only the arg-max at position 1 (head 1 is the model's own next
                token, always accepted under greedy decoding).

        Returns:
            A lattice of shape ``(h, k)`` or ``(batch, h, k)``, arcs sorted best first.

        Raises:
            LatticeError: bad shape, k out of range, non-finite logits.
        """
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool):
            raise LatticeError(f"k must be an int, got {type(k).__name__}")
        is_torch = type(logits).__module__.startswith("torch")
        if is_torch:
            import torch

            if logits.dtype.is_complex or logits.dtype == torch.bool:
                raise LatticeError(f"logits must be real numbers, got dtype {logits.dtype}")
        else:
            try:
                logits = np.asarray(logits)
            except (TypeError, ValueError) as exc:  # ragged nested lists, ...
                raise LatticeError(f"logits must be an array of real numbers: {exc}") from exc
            if logits.dtype.kind not in "iuf":
                raise LatticeError(f"logits must be real numbers, got dtype {logits.dtype}")
        shape = tuple(logits.shape)
        if len(shape) not in (2, 3):
            raise LatticeError(f"logits must have shape (h, vocab) or (batch, h, vocab), got {shape}")
        if shape[-2] < 1:
            raise LatticeError(f"logits need at least one head (h >= 1), got shape {shape}")
        vocab = shape[-1]
        if not 1 <= k <= vocab:
            raise LatticeError(f"k={k} must lie in 1..vocab ({vocab})")
        if is_torch:
            with torch.no_grad():
                x = logits.float()
                # NaN propagates to both ends: one pass, where isfinite().all() makes a mask (at 16
                # rows of 8 heads over 49,152 words on one EPYC core, 1.3 ms against 18 ms)
                ends = torch.stack(torch.aminmax(x)) if x.numel() else x.new_zeros(2)
                if not bool(torch.isfinite(ends).all()):
                    raise LatticeError("logits must be finite (found NaN or inf)")
                values, indices = torch.topk(torch.log_softmax(x, dim=-1), k, dim=-1)
                scores = values.cpu().numpy()
                tokens = indices.to(torch.int32).cpu().numpy()
        else:
            x = np.asarray(logits, dtype=np.float64)
            if not np.all(np.isfinite(x)):
                raise LatticeError("logits must be finite (found NaN or inf)")
            top = x.max(axis=-1, keepdims=True)
            logprobs = x - top - np.log(np.exp(x - top).sum(axis=-1, keepdims=True))
            part = np.argpartition(-logprobs, k - 1, axis=-1)[..., :k]
            part_scores = np.take_along_axis(logprobs, part, axis=-1)
            # Best first; equal scores by token id for determinism.
            order = np.lexsort((part, -part_scores), axis=-1)
            tokens = np.take_along_axis(part, order, axis=-1).astype(np.int32)
            with np.errstate(over="ignore"):  # below float32's range is -inf: refused below
                scores = np.take_along_axis(part_scores, order, axis=-1).astype(np.float32)
        widths = np.full(tokens.shape[:-1], k, dtype=np.int32)
        if fix_first:
            widths[..., 0] = 1
        return cls(tokens, scores, widths)

    # -- shape -------------------------------------------------------------------------

    @property
    def is_batch(self) -> bool:
        return self.tokens.ndim == 3

    @property
    def h(self) -> int:
        """Number of positions."""
        return int(self.tokens.shape[-2])

    @property
    def k(self) -> int:
        """Arcs per position (the widest)."""
        return int(self.tokens.shape[-1])

    @property
    def batch_size(self) -> Optional[int]:
        return int(self.tokens.shape[0]) if self.is_batch else None

    @property
    def num_paths(self) -> int:
        """Number of distinct drafts of a single lattice: the product of the widths."""
        if self.is_batch:
            raise LatticeError("num_paths is defined for a single lattice; index the batch first")
        return int(np.prod(self.widths.astype(object)))

    def arc_scores(self, positions: Any, tokens: Any) -> np.ndarray:
        """The score of ``tokens[i]`` among the arcs of position ``positions[i]`` (within its width),
        NaN where it is not among them or the position lies past the lattice; one lattice.

        Args:
            positions (`np.ndarray` of shape `(n,)`): positions, 0-based (>= 0).
            tokens (`np.ndarray` of shape `(n,)`): token ids.

        Returns:
            `np.ndarray` of shape `(n,)`, float64.
        """
        if self.is_batch:
            raise LatticeError("arc_scores reads one lattice; index the batch first")
        positions = np.asarray(positions, dtype=np.int64).reshape(-1)
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        out = np.full(positions.shape[0], np.nan)
        inside = np.nonzero(positions < self.h)[0]
        rows = positions[inside]
        hit = (self.tokens[rows] == tokens[inside, None]) & (np.arange(self.k) < self.widths[rows, None])
        found = hit.any(axis=1)
        arcs = hit.argmax(axis=1)
        out[inside[found]] = self.scores[rows[found], arcs[found]]
        return out

    def __len__(self) -> int:
        if not self.is_batch:
            raise TypeError("a single lattice has no len(); use .h and .k")
        return int(self.tokens.shape[0])

    def __getitem__(self, i: int) -> "SausageLattice":
        if not self.is_batch:
            raise TypeError("only a batch of lattices can be indexed")
        out = SausageLattice.__new__(SausageLattice)
        out.tokens, out.scores, out.widths = self.tokens[i], self.scores[i], self.widths[i]
        return out

    def __repr__(self) -> str:
        batch = f"batch={self.batch_size}, " if self.is_batch else ""
        return f"SausageLattice({batch}h={self.h}, k={self.k})"
