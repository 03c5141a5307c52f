"""``vanilla``: Stern et al.'s Algorithm 1, the arg-max of heads 2..h."""

from __future__ import annotations

from latticekit.drafting.protocol import Draft, Drafter, DraftInput
from latticekit.drafting.registry import register

__all__ = ["VanillaDrafter", "argmax_draft"]


def argmax_draft(step: DraftInput) -> tuple[int, ...]:
    """The arg-max token of every lattice position after the root."""
    return tuple(int(t) for t in step.lattice.tokens[1:, 0])


@register
class VanillaDrafter(Drafter):
    """One draft per step: each head's best token."""

    method = "vanilla"

    def draft(self, step: DraftInput) -> Draft:
        return Draft.from_paths([argmax_draft(step)])
