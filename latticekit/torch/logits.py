"""The logits of a tree pass, projected from the final hidden states only where a walk reads them.

A tree pass has one row per node plus the root (row 0 is the root, row ``i + 1`` is node ``i``),
but an acceptance walk reads at most ``h + 1`` of them: the rows along the path it accepts.
The output projection (``hidden -> vocab``) is a large share of a small model's pass (SmolLM2-135M:
a 49152 x 576 matrix against ~106M parameters in the body), so a pass computes the final hidden
states of every row and :class:`TreeLogits` projects them in at most two blocks:

* the first block is the root and the first draft's nodes (the best path of a p-best list),
  projected with the pass;
* when a walk reaches a node whose row is not projected yet, the second block is that node and
  its whole subtree: the walk cannot leave it, so no third projection is ever needed.

Each projection reads the whole matrix (SmolLM2 on the benchmark's CPU: ~15-35 ms for 1-16
rows, then ~0.5-1 ms per row), so a second one costs about as much as ``2 (h + 1)`` rows; a
tree with fewer than ``_LAZY_MIN_FACTOR`` times the first block's rows is projected whole
with the pass (:func:`first_block_rows` returns None).

A row's logits are those of the projection applied to all rows up to the rounding of the
matrix product: the BLAS may use a different kernel for a different number of rows (on the
CPU one row goes through a matrix-vector kernel that rounds differently in the last bit), the
same kind of difference a tree pass already has from a one-token pass.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import torch

from latticekit.torch.tree import DraftTree

__all__ = ["TreeLogits", "ArgmaxRows", "first_block_rows"]

#: Smallest number of rows a projection of more than one row is padded to (see ``_project``).
_MIN_GEMM_ROWS = 4
#: Trees with fewer rows than this many times the first block are projected whole with the pass.
_LAZY_MIN_FACTOR = 3


def first_block_rows(tree: DraftTree) -> Optional[list[int]]:
    """Rows of the first projection: the root and draft 0's nodes (``0 .. len(draft 0)``), or
    None when the tree is too small for a second projection to pay (project every row).

    Draft 0 occupies nodes ``0 .. len - 1`` (node indices follow first insertion), so the rows
    are one contiguous run.
    """
    rows = int(tree.draft_lengths[0]) + 1
    if tree.num_nodes + 1 < _LAZY_MIN_FACTOR * rows:
        return None
    return list(range(rows))


class TreeLogits:
    """Row-addressable logits of one tree pass, projected on first read.

    Args:
        tree: the tree of the pass.
        hidden_states (`torch.Tensor` of shape `(num_nodes + 1, hidden)`): final hidden states.
        project: maps hidden states `(m, hidden)` to logits `(m, vocab)`; None when
            ``known_rows`` holds every row already.
        known_rows: rows whose logits the pass computed already.
        known_logits (`torch.Tensor` of shape `(len(known_rows), vocab)`): their logits.
    """

    def __init__(
        self,
        tree: DraftTree,
        hidden_states: torch.Tensor,
        project: Optional[Callable[[torch.Tensor], torch.Tensor]],
        known_rows: list[int],
        known_logits: torch.Tensor,
    ) -> None:
        self.tree = tree
        self.hidden_states = hidden_states
        self.project = project
        self._rows: dict[int, torch.Tensor] = {}
        self._argmax: dict[int, int] = {}
        self._lazy_argmax = hidden_states.device.type == "cpu"
        #: Number of projections made after the pass (branch switches), for tests and benchmarks.
        self.projections = 0
        self._store(known_rows, known_logits)

    @classmethod
    def complete(cls, tree: DraftTree, hidden_states: torch.Tensor, logits: torch.Tensor) -> "TreeLogits":
        """Wraps the logits of every row `(num_nodes + 1, vocab)` (nothing left to project)."""
        return cls(tree, hidden_states, None, list(range(logits.shape[0])), logits)

    def _store(self, rows: list[int], logits: torch.Tensor) -> None:
        for i, row in enumerate(rows):
            self._rows[row] = logits[i]
        if not self._lazy_argmax:  # one call and one device sync per block
            self._argmax.update(zip(rows, logits.argmax(dim=-1).tolist()))

    def _project(self, rows: list[int]) -> None:
        """Projects ``rows`` in one call. Two or three rows are padded to four with copies of
        the first: MKL's sgemm takes a path 2-3x slower for them than for one or four rows of
        a 49152 x 576 head (measured on the benchmark's CPU); each row's result is unchanged."""
        assert self.project is not None
        padded = rows + rows[:1] * (_MIN_GEMM_ROWS - len(rows)) if 1 < len(rows) < _MIN_GEMM_ROWS else rows
        index = torch.tensor(padded, dtype=torch.long, device=self.hidden_states.device)
        self._store(rows, self.project(self.hidden_states.index_select(0, index))[: len(rows)])
        self.projections += 1

    def _branch_rows(self, row: int) -> list[int]:
        """The node of ``row`` and all its descendants, minus projected rows."""
        nodes = np.flatnonzero(self.tree.ancestors()[:, row - 1])
        return [int(n) + 1 for n in nodes if int(n) + 1 not in self._rows]

    def __getitem__(self, row: int) -> torch.Tensor:
        """Logits of ``row`` (0 = root, ``i + 1`` = node ``i``), `(vocab,)`."""
        logits = self._rows.get(row)
        if logits is None:
            if self.project is None or not 0 < row < len(self.hidden_states):
                raise IndexError(f"row {row} outside the pass's {len(self.hidden_states)} rows")
            self._project(self._branch_rows(row))
            logits = self._rows[row]
        return logits

    def argmax(self, row: int) -> int:
        """``self[row].argmax()`` (the first index on exact ties), cached per row."""
        token = self._argmax.get(row)
        if token is None:
            logits = self[row]  # may project a block, which fills the cache off the CPU
            token = self._argmax.get(row)
            if token is None:
                token = self._argmax[row] = int(logits.argmax())
        return token

    @property
    def projected_rows(self) -> np.ndarray:
        """Rows whose logits exist, sorted."""
        return np.array(sorted(self._rows), dtype=np.int64)

    def all(self) -> torch.Tensor:
        """Logits of every row in order, `(num_nodes + 1, vocab)`; projects what is missing in one call."""
        n = len(self.hidden_states)
        missing = [row for row in range(n) if row not in self._rows]
        if missing:
            self._project(missing)
        return torch.stack([self._rows[row] for row in range(n)])


class ArgmaxRows:
    """``TreeLogits`` seen as the row-indexable arg-max sequence :func:`greedy_accept` reads."""

    def __init__(self, logits: TreeLogits) -> None:
        self.logits = logits

    def __getitem__(self, row: int) -> int:
        return self.logits.argmax(row)
