"""The drafting protocol: what the decode loop and the replay loop ask of a strategy each step.

Both loops do the same thing at every step (HF transformers' ``CandidateGenerator`` is the
model): they hand the drafter a :class:`DraftInput` (the decoded ids and, on demand, the heads'
lattice), verify what :meth:`Drafter.draft` returns in one target call (or, for an empty list,
take a plain one-token step), and tell the drafter what the call emitted
(:meth:`Drafter.observe`). Neither loop knows which strategy it runs: adding one is one new
module with a :class:`Drafter` subclass, registered in :mod:`latticekit.bpd.drafters`.

Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Optional

from latticekit.bpd.records import DecoderConfig
from latticekit.lattice import SausageLattice

__all__ = ["Draft", "DraftInput", "DraftResources", "Drafter"]

#: The drafts of one step: token sequences continuing the root, best first. They may differ in
#: length; an empty list asks for a plain one-token step (no tree pass).
Draft = list[tuple[int, ...]]


class DraftInput:
    """What a drafter sees at one step.

    The heads' lattice costs a heads forward and a top-k; it is built on first access to
    :attr:`lattice`, so a drafter that does not read it (greedy, or a cost-aware drafter that
    decides not to draft) does not pay for it.

    Attributes:
        ids: the decoded sequence so far, prompt included; ``ids[-1]`` is the root (the token
            the last target call emitted, lattice position 1).
    """

    __slots__ = ("ids", "_make_lattice", "_lattice")

    def __init__(self, ids: Sequence[int], lattice: Callable[[], SausageLattice]) -> None:
        self.ids = ids
        self._make_lattice = lattice
        self._lattice: Optional[SausageLattice] = None

    @property
    def root(self) -> int:
        """The last decoded token (lattice position 1)."""
        return int(self.ids[-1])

    @property
    def root_index(self) -> int:
        """Position of the root in the full sequence (prompt included)."""
        return len(self.ids) - 1

    @property
    def lattice(self) -> SausageLattice:
        """The heads' top-k lattice of this step, `(h, k)`, position 1 fixed to the root."""
        if self._lattice is None:
            self._lattice = self._make_lattice()
        return self._lattice

    @property
    def has_lattice(self) -> bool:
        """Whether :attr:`lattice` was built (read) this step."""
        return self._lattice is not None

    def context(self, order: int) -> Sequence[int]:
        """The n-gram context of the lattice: the ``order - 1`` tokens before the root."""
        return self.ids[max(0, len(self.ids) - order): -1]


@dataclass
class DraftResources:
    """What a strategy may need besides its config; each drafter takes what it uses.

    Attributes:
        lms: an :class:`~latticekit.NGramLM`, or a mapping from ``config.lm`` names to models.
        rescorer: the :class:`~latticekit.bpd.rescorer.NeuralRescorer` (``neural``).
        reference: the target's greedy sequence, prompt included (``oracle``).
        vocab_size: the target's vocabulary size; None where unknown (a replayed trace).
        num_heads: h, the heads' positions (lattice rows), where known.
        largest_id: the largest token id the drafter will read, where ``vocab_size`` is unknown.
        costs: the target's :class:`~latticekit.bpd.costs.StepCosts` (``auto``).
        acceptance: an :class:`~latticekit.bpd.calibration.AcceptanceModel` to start from (``auto``).
        heads: the draft heads, where known (``auto`` looks up a shipped acceptance model for them).
    """

    lms: Any = None
    rescorer: Any = None
    reference: Optional[Sequence[int]] = None
    vocab_size: Optional[int] = None
    num_heads: Optional[int] = None
    largest_id: Optional[int] = None
    costs: Any = None
    acceptance: Any = None
    heads: Any = None


class Drafter:
    """A drafting strategy: one subclass per :data:`~latticekit.bpd.records.METHODS` entry.

    Class attributes:
        method: the ``DecoderConfig.method`` it implements.
        needs_heads: it reads the heads' lattice (a decode without heads is refused up front).
        needs_reference: it follows the target's greedy continuation (the oracle): the decode
            loop computes one first when the caller gives none.
        needs_costs: it weighs the target's step costs (``auto``): the decode loop measures them
            (cached, :func:`~latticekit.bpd.costs.step_costs`) when the caller gives none.

    Attributes:
        config: the decoder configuration.
        k: arcs per lattice column the drafter reads (the loop builds lattices this wide).
    """

    method: ClassVar[str] = ""
    needs_heads: ClassVar[bool] = True
    needs_reference: ClassVar[bool] = False
    needs_costs: ClassVar[bool] = False

    def __init__(self, config: DecoderConfig) -> None:
        self.config = config
        self.k = int(config.k)

    @classmethod
    def from_config(cls, config: DecoderConfig, resources: DraftResources) -> "Drafter":
        """The drafter for ``config``, with what it needs taken from ``resources``.

        Raises:
            DecoderConfigError: a resource the strategy needs is missing or does not fit.
        """
        return cls(config)

    def draft(self, step: DraftInput) -> Draft:
        """The drafts to verify this step, best first (see :data:`Draft`)."""
        raise NotImplementedError

    def lattice_source(self, heads: Any, vocab_size: int) -> Any:
        """Where a decode's lattices come from: ``source(hidden, ids) -> (lattice, entropy)``
        (:mod:`latticekit.bpd.lattices`). The exact full-vocabulary lattice by default; a replay
        reads its trace's lattices instead; None for a strategy that reads no lattice (the
        decode loop then builds none)."""
        from latticekit.bpd.lattices import FullLattice

        return FullLattice(heads, self.k, vocab_size)

    def observe(self, step: DraftInput, drafts: Draft, emitted: Sequence[int]) -> None:
        """Called after every step with what the target call emitted (accepted draft tokens,
        then the target's own). Strategies that adapt (acceptance estimates) learn here."""

    def prepare_replay(self, trace: Any) -> None:
        """Called once before a replay walks ``trace`` (:mod:`latticekit.bpd.replay`), for
        strategies whose per-step work batches over a whole trace."""
