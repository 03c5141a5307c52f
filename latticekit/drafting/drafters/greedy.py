"""``greedy``: no drafts; every step is one plain target call (the baseline)."""

from __future__ import annotations

from latticekit.drafting.protocol import Draft, Drafter, DraftInput
from latticekit.drafting.registry import register

__all__ = ["GreedyDrafter"]


@register
class GreedyDrafter(Drafter):
    """Plain greedy (or sampled) decoding: one token per target call, no heads read."""

    method = "greedy"
    needs_heads = False

    def draft(self, step: DraftInput) -> Draft:
        return Draft.none()
