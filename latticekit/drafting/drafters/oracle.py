"""``oracle``: the lattice path with the longest accepted prefix (an upper bound, not a decoder)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from latticekit.drafting.protocol import Draft, Drafter, DraftInput, DraftResources
from latticekit.drafting.registry import register
from latticekit.drafting.config import DecoderConfig
from latticekit.errors import DecoderConfigError
from latticekit.lattice import SausageLattice

__all__ = ["OracleDrafter", "oracle_draft"]


def oracle_draft(lattice: SausageLattice, reference: Sequence[int], root_index: int) -> tuple[int, ...]:
    """Follows the reference (the target's greedy continuation) through the lattice while it can;
    arg-max arcs after the first position where the reference token is not among the top k.

    Args:
        lattice: the step's lattice, position 1 the root.
        reference: the target's greedy sequence, prompt included.
        root_index: the root's position in ``reference``.
    """
    draft = []
    on_track = True
    for j in range(1, lattice.h):
        arcs = lattice.tokens[j, : lattice.widths[j]]
        want = reference[root_index + j] if root_index + j < len(reference) else -1
        on_track = on_track and bool(np.any(arcs == want))
        draft.append(int(want) if on_track else int(arcs[0]))
    return tuple(draft)


@register
class OracleDrafter(Drafter):
    """The path through the top-k lattice that follows the target's greedy tokens longest."""

    method = "oracle"
    knobs = frozenset({"k"})
    samples = False
    needs_reference = True

    def __init__(self, config: DecoderConfig, reference: Sequence[int]) -> None:
        super().__init__(config)
        self.reference = reference

    @classmethod
    def from_config(cls, config: DecoderConfig, resources: DraftResources) -> "OracleDrafter":
        if resources.reference is None:
            raise DecoderConfigError(f"decoder {config.label!r} needs the target's greedy reference")
        return cls(config, resources.reference)

    def draft(self, step: DraftInput) -> Draft:
        return Draft.from_paths([oracle_draft(step.lattice, self.reference, step.root_index)])
