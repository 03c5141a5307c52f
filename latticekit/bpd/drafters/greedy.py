"""``greedy``: no drafts; every step is one plain target call (the baseline)."""

from __future__ import annotations

from latticekit.bpd.drafters.base import Draft, Drafter, DraftInput

__all__ = ["GreedyDrafter"]


class GreedyDrafter(Drafter):
    """Plain greedy (or sampled) decoding: one token per target call, no heads read."""

    method = "greedy"
    needs_heads = False

    def draft(self, step: DraftInput) -> Draft:
        return []
