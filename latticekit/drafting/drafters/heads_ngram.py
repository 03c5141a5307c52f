"""``heads+ngram``: ``auto``'s union of the heads' lattice and the text's continuations, always read.

Every step this drafter

1. finds the p most probable continuations of the decoded text under the n-gram cache model
   (as ``headsfree`` does: :func:`~latticekit.drafting.continuations.best_continuations`);
2. unites each column of the heads' lattice with the tokens those continuations hold at that
   depth (:func:`~latticekit.decoding.lattices.united`: each scored by the heads like their own
   top-k arcs), and takes the p best paths of the united lattice under
   ``draft + alpha * n-gram`` (the exact search, as ``auto`` does);
3. merges both sets of paths into one candidate trie, every node with its head, n-gram and
   cache-model log-probabilities and its sources, and lets ``auto``'s chooser pick the tree
   (acceptance estimates calibrated per source).

``auto`` reads this union too, and the text alone where the heads do not pay; this drafter
never stops reading the heads (the union as a fixed strategy, for comparisons). Without heads
it drafts like ``headsfree``.

A replay (:mod:`latticekit.eval.replay`) reads the trace's lattices, which hold the heads' top k
alone: its columns are not united (the n-gram continuations still join the trie, without a
head score).
"""

from __future__ import annotations

from typing import cast

from latticekit.drafting.drafters.auto import AutoDrafter
from latticekit.drafting.registry import register

__all__ = ["HeadsNGramDrafter"]


@register
class HeadsNGramDrafter(AutoDrafter):
    """``auto``'s union arm alone (see the module docstring); ``p`` lattice paths and ``p``
    continuations. Without heads it drafts like ``headsfree``."""

    method = "heads+ngram"

    @classmethod
    def arms_for(cls, reads_heads: bool) -> tuple[str, ...]:
        return ("union",) if reads_heads else ("text",)

    @property
    def text_candidates(self) -> int:
        return cast(int, self.config.p)  # set by DecoderConfig.__post_init__


@register
class HeadsDrafter(AutoDrafter):
    """``heads``: ``auto``'s chooser over the heads' lattice alone, the p best paths under
    ``draft + alpha * n-gram`` (what ``auto`` drafted before it read the text too: the heads
    as the only source, for comparisons)."""

    method = "heads"
    needs_heads = True

    @classmethod
    def arms_for(cls, reads_heads: bool) -> tuple[str, ...]:
        return ("heads",)
