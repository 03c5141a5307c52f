"""The p most probable continuations of a text under the heads-free drafting model, as a tree.

:func:`best_continuations` is a best-first search over the tree of token sequences after the
text: a node is a sequence of 1..``max_depth`` tokens, its score the sum of its tokens'
conditional log-probabilities under :class:`~latticekit.drafting.cache_model.CacheModel`. Scores only
fall along a path (every conditional is <= 1), so the nodes leave the priority queue in
decreasing score and the first p to leave are exactly the p most probable nodes, every node's
parent among them before it: a prefix-closed draft tree, the one with the most expected
accepted tokens were the model's probabilities the acceptance probabilities. Ties break by
token sequence, ascending, as in :func:`latticekit.pbest`.

Children are generated lazily: a popped node pushes its next sibling (its parent's next token,
most probable first: a merge of the cache's followers of the longest match and the static
model's ranked tokens, :mod:`~latticekit.drafting.successors`) and a bound for its own children
(its score: no child scores higher), which is expanded into the first child only when the bound
itself is popped; the frontier stays near p entries and no node's next-token distribution is
read unless one of its children could still be among the best. Within one distribution the
cache's followers are read by decreasing count and scored only while one could still rank next
(its count's share plus the largest static probability an unread follower can have), so a
context that thousands of tokens followed in a long text costs the few that matter.

Why a direct search and not columns of candidates through the lattice search
(:func:`latticekit.pbest`): the cache model's probabilities depend on the whole path (the match
grows with every copied token), which a sausage lattice's per-position arc scores cannot hold,
and the lattice search takes a compiled :class:`~latticekit.NGramLM`, which the cache (growing
every step) is not. The search visits about 2p nodes, in the C++ core
(``csrc/latticekit/continuations.h``, over the cache of ``csrc/latticekit/ngram_cache.h``);
``tests/decoding/test_headsfree.py`` checks it against brute-force enumeration, and
``tests/drafting/`` against the pure-Python search it replaced.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

import numpy as np

from latticekit.drafting.cache_model import CacheModel, _token_array
from latticekit.drafting.calibration import CandidateTree
from latticekit.errors import DecoderConfigError

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

    def tree(self, head_logprob: Optional[np.ndarray] = None, sources: Optional[np.ndarray] = None) -> CandidateTree:
        """The nodes as a :class:`CandidateTree`: the cache model's conditionals as the cache
        feature, the static model's as the n-gram feature, heads' scores where given (NaN: none);
        its sources as the caller gives them (a text's, or a text's united with a memory's;
        None: unnamed)."""
        head = head_logprob if head_logprob is not None else np.full(self.size, np.nan)
        return CandidateTree(self.tokens, self.parents, self.depths, head, self.static_logprob, self.logprob, sources)


def best_continuations(model: CacheModel, ids: Sequence[int], p: int, max_depth: int) -> Continuations:
    """The ``p`` most probable continuations of ``ids`` of 1..``max_depth`` tokens (see the
    module docstring), fewer when the model proposes fewer.

    Args:
        model: the cache model, synced to ``ids`` (:meth:`CacheModel.sync`) or not: the search
            reads its counts as they are.
        ids: the text (prompt and decoded tokens); only its last ``model.context_size`` matter.
        p: nodes wanted (none below 1).
        max_depth: the longest continuation (>= 1).

    Raises:
        DecoderConfigError: ``max_depth`` below 1.
    """
    if max_depth < 1:
        raise DecoderConfigError(f"max_depth must be >= 1, got {max_depth}")
    tail = _token_array(ids[len(ids) - min(len(ids), model.context_size):])
    if p < 1:
        empty = np.zeros(0, dtype=np.int64)
        return Continuations(empty, empty, empty, np.zeros(0), np.zeros(0), np.zeros(0))
    successors = model.successors.core if model.successors is not None else None
    return Continuations(*model.cache.best_continuations(tail, successors, model.vocab_size, p, max_depth))
