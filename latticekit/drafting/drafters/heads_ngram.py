"""``heads+ngram``: ``auto`` with the heads' lattice united with the n-gram models' continuations.

Draft heads miss what only the text itself knows: the name defined three lines up, the function
the answer is copying. Every step this drafter

1. finds the p most probable continuations of the decoded text under the n-gram cache model
   (as ``headsfree`` does: :func:`~latticekit.drafting.continuations.best_continuations`);
2. unites each column of the heads' lattice with the tokens those continuations hold at that
   depth (:func:`~latticekit.decoding.lattices.united`: each scored by the heads like their own
   top-k arcs), and takes the p best paths of the united lattice under
   ``draft + alpha * n-gram`` (the exact search, as ``auto`` does);
3. merges both sets of paths into one candidate trie, every node with its head, n-gram and
   cache-model log-probabilities, and lets ``auto``'s chooser pick the tree (acceptance
   estimates starting from the mean of the heads' and the cache model's logits).

A replay (:mod:`latticekit.eval.replay`) reads the trace's lattices, which hold the heads' top k
alone: its columns are not united (the n-gram continuations still join the trie, without a
head score).
"""

from __future__ import annotations

from typing import cast

import numpy as np

from latticekit.drafting.calibration import CandidateTree
from latticekit.drafting.continuations import Continuations, best_continuations
from latticekit.drafting.drafters.auto import MAX_NGRAM_DEPTH, AutoDrafter
from latticekit.drafting.protocol import DraftInput
from latticekit.drafting.registry import register
from latticekit.lattice import SausageLattice
from latticekit.search import pbest

__all__ = ["HeadsNGramDrafter"]


@register
class HeadsNGramDrafter(AutoDrafter):
    """``auto`` over the heads' lattice united with the n-gram continuations (see the module
    docstring). Without heads it drafts like ``headsfree``."""

    method = "heads+ngram"

    @property
    def trust(self) -> str:
        return "head+cache" if self.reads_heads else "cache"

    def candidates(self, step: DraftInput) -> CandidateTree:
        if not self.reads_heads:
            return self.ngram_candidates(step)
        model = self.cache_model(step.ids)
        p = cast(int, self.config.p)  # set by DecoderConfig.__post_init__
        found = best_continuations(model, step.ids, p, MAX_NGRAM_DEPTH)
        found_paths = found.paths()
        columns: list[list[int]] = [[] for _ in range(MAX_NGRAM_DEPTH)]
        for path in found_paths:
            columns[len(path) - 1].append(path[-1])
        lattice = step.united_lattice(columns)
        paths = pbest(lattice, self.search_lm, p, self.alpha, context=step.context(self.search_lm.order))
        drafts = [path.tokens[1:] for path in paths]
        tree = CandidateTree.from_paths(drafts + found_paths, [[np.nan] * len(d) for d in drafts + found_paths])
        return self._features(tree, step, lattice, dict(zip(found_paths, range(found.size))), found)

    def _features(self, tree: CandidateTree, step: DraftInput, lattice: SausageLattice,
                  known: dict[tuple[int, ...], int], found: Continuations) -> CandidateTree:
        """Every node's head score (its lattice arc, NaN past the lattice or off it), and its
        n-gram and cache-model log-probabilities (from the search, or computed)."""
        model = self.cache_model(step.ids)
        ids = step.ids
        tail = list(ids[len(ids) - min(len(ids), model.context_size):])
        paths = tree.paths_to(range(tree.size))
        h = lattice.h
        assert tree.cache_logprob is not None  # set by CandidateTree.__post_init__
        for i, path in enumerate(paths):
            depth = len(path)
            if depth < h:
                tree.head_logprob[i] = _arc_scores_or_nan(lattice, depth, path[-1])
            j = known.get(path)
            if j is not None:
                tree.ngram_logprob[i], tree.cache_logprob[i] = found.static_logprob[j], found.logprob[j]
            else:
                mixed, static, _ = model.conditional(tail + list(path[:-1]), path[-1])
                tree.ngram_logprob[i], tree.cache_logprob[i] = static, mixed
        if self.lm is None:
            tree.ngram_logprob[:] = np.nan
        # a continuation the heads did not propose (or past their reach) is taken at the cache
        # model's word in the head's place: an absent feature would pull its estimate to 1/2
        missing = np.isnan(tree.head_logprob)
        tree.head_logprob[missing] = tree.cache_logprob[missing]
        return tree


def _arc_scores_or_nan(lattice: SausageLattice, row: int, token: int) -> float:
    """The score of ``token`` among the arcs of lattice row ``row``, or NaN."""
    width = int(lattice.widths[row])
    hit = np.nonzero(lattice.tokens[row, :width] == token)[0]
    return float(lattice.scores[row, hit[0]]) if hit.size else float("nan")
