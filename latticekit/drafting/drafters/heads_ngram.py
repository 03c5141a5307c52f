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

from latticekit.drafting.calibration import CandidateTree
from latticekit.drafting.continuations import best_continuations
from latticekit.drafting.drafters.auto import MAX_NGRAM_DEPTH, AutoDrafter
from latticekit.drafting.protocol import DraftInput
from latticekit.drafting.registry import register
from latticekit.drafting.union import united_candidates

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
        columns: list[list[int]] = [[] for _ in range(MAX_NGRAM_DEPTH)]
        for path in found.paths():
            columns[len(path) - 1].append(path[-1])
        lattice = step.united_lattice(columns)
        return united_candidates(model, step.ids, found, lattice, self.search_lm, p, self.alpha, self.lm)
