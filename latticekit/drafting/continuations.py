"""The p most probable continuations of a text under the heads-free drafting model, as a tree.

:func:`best_continuations` is a best-first search over the tree of token sequences after the
text: a node is a sequence of 1..``max_depth`` tokens, its score the sum of its tokens'
conditional log-probabilities under :class:`~latticekit.drafting.cache_model.CacheModel`. Scores only
fall along a path (every conditional is <= 1), so the nodes leave the priority queue in
decreasing score and the first p to leave are exactly the p most probable nodes, every node's
parent among them before it: a prefix-closed draft tree, the one with the most expected
accepted tokens were the model's probabilities the acceptance probabilities. Ties break by
token sequence, ascending, as in :func:`latticekit.pbest`.

Children are generated lazily: a popped node pushes its next sibling (its parent's next token
in :class:`~latticekit.drafting.cache_model.Children` order) and a bound for its own children (its
score: no child scores higher), which is expanded into the first child only when the bound
itself is popped; the frontier stays near p entries and no node's next-token distribution is
read unless one of its children could still be among the best.

Why a direct search and not columns of candidates through the lattice search
(:func:`latticekit.pbest`): the cache model's probabilities depend on the whole path (the match
grows with every copied token), which a sausage lattice's per-position arc scores cannot hold,
and the core search takes a compiled :class:`~latticekit.NGramLM`, which the cache (rebuilt
every step) is not. The search visits about 2p nodes, in Python; ``tests/decoding/test_headsfree.py``
checks it against brute-force enumeration.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

import numpy as np

from latticekit.drafting.cache_model import CacheModel, Children
from latticekit.drafting.calibration import CandidateTree

__all__ = ["Continuations", "best_continuations"]


@dataclass
class Continuations:
    """The nodes :func:`best_continuations` found, best first (parents before children).

    Attributes:
        tokens, parents, depths (`(n,)` int64): as in :class:`CandidateTree`.
        logprob (`(n,)` float64): the node's conditional log-probability under the cache model.
        static_logprob (`(n,)` float64): under the static model alone.
        score (`(n,)` float64): the path's log-probability (sum of ``logprob`` from the root).
    """

    tokens: np.ndarray
    parents: np.ndarray
    depths: np.ndarray
    logprob: np.ndarray
    static_logprob: np.ndarray
    score: np.ndarray

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])

    def paths(self) -> list[tuple[int, ...]]:
        """Every node's token sequence."""
        out: list[tuple[int, ...]] = []
        for i in range(self.size):
            parent = int(self.parents[i])
            out.append((out[parent] if parent >= 0 else ()) + (int(self.tokens[i]),))
        return out

    def tree(self, head_logprob: Optional[np.ndarray] = None) -> CandidateTree:
        """The nodes as a :class:`CandidateTree`: the cache model's conditionals as the cache
        feature, the static model's as the n-gram feature, heads' scores where given (NaN: none)."""
        head = head_logprob if head_logprob is not None else np.full(self.size, np.nan)
        return CandidateTree(self.tokens, self.parents, self.depths, head, self.static_logprob, self.logprob)


def best_continuations(model: CacheModel, ids: Sequence[int], p: int, max_depth: int) -> Continuations:
    """The ``p`` most probable continuations of ``ids`` of 1..``max_depth`` tokens (see the
    module docstring), fewer when the model proposes fewer.

    Args:
        model: the cache model, synced to ``ids`` (:meth:`CacheModel.sync`) or not: the search
            reads its counts as they are.
        ids: the text (prompt and decoded tokens); only its last ``model.context_size`` matter.
        p: nodes wanted (>= 1).
        max_depth: the longest continuation (>= 1).
    """
    tail = tuple(int(t) for t in ids[len(ids) - min(len(ids), model.context_size):])
    keep = model.context_size
    tokens: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    logprob: list[float] = []
    static: list[float] = []
    score: list[float] = []
    paths: list[tuple[int, ...]] = []
    tails: list[tuple[int, ...]] = []
    bounds: list[int] = []  # a bound on each node's match length: its parent's plus one
    expanded: list[Optional[Children]] = []
    root = model.children(tail)
    # Entries: (-score, path, parent node (-1: root), rank among the parent's children); a rank
    # of -1 is the bound of a node's children (its own score), expanded when popped.
    heap: list[tuple[float, tuple[int, ...], int, int]] = []

    def push_child(parent: int, rank: int) -> None:
        children = root if parent < 0 else expanded[parent]
        assert children is not None
        child = children.ranked(rank)
        if child is not None:
            base = score[parent] if parent >= 0 else 0.0
            prefix = paths[parent] if parent >= 0 else ()
            heapq.heappush(heap, (-(base + child[1]), prefix + (child[0],), parent, rank))

    push_child(-1, 0)
    while heap and len(tokens) < p:
        neg, path, parent, rank = heapq.heappop(heap)
        if rank < 0:  # the bound of a node's children: read its distribution now
            node = parent
            expanded[node] = model.children(tails[node], bounds[node])
            push_child(node, 0)
            continue
        children = root if parent < 0 else expanded[parent]
        assert children is not None
        token, lp, lp_static = children.ranked(rank)  # type: ignore[misc]
        node = len(tokens)
        tokens.append(token)
        parents.append(parent)
        depths.append(len(path))
        logprob.append(lp)
        static.append(lp_static)
        score.append(-neg)
        paths.append(path)
        tails.append((tails[parent] if parent >= 0 else tail)[-keep + 1:] + (token,) if keep > 1
                     else (token,))
        bounds.append(children.match + 1)
        expanded.append(None)
        push_child(parent, rank + 1)
        if len(path) < max_depth:
            heapq.heappush(heap, (neg, path, node, -1))
    return Continuations(np.asarray(tokens, dtype=np.int64), np.asarray(parents, dtype=np.int64),
                         np.asarray(depths, dtype=np.int64), np.asarray(logprob, dtype=np.float64),
                         np.asarray(static, dtype=np.float64), np.asarray(score, dtype=np.float64))

