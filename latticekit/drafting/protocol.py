"""The drafting protocol: what a decoding loop asks of a strategy each step.

Every loop does the same thing at every step (HF transformers' ``CandidateGenerator`` is the
model): it hands the drafter a :class:`DraftInput` (the decoded ids and, on demand, the heads'
lattice), verifies the :class:`~latticekit.drafting.tree.Draft` that :meth:`Drafter.draft`
returns in one target call (or, for an empty one, takes a plain one-token step), and tells the
drafter what the call emitted (:meth:`Drafter.observe`). The torch decode loop
(:mod:`latticekit.decoding.loop`) and the evaluation's replay of a greedy trace
(:mod:`latticekit.eval.replay`) are one loop over two targets; neither knows which strategy it
runs. Adding one is one :class:`Drafter` subclass that declares its method, defaults and knobs
and is registered (:func:`~latticekit.drafting.registry.register`), in any module.

A drafter is per request: it keeps that request's state (its n-gram cache, its acceptance
estimates), and nothing is global, so an engine can drive many requests at once, one drafter
each. Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Optional, cast

import numpy as np

from latticekit.drafting import registry
from latticekit.drafting.config import DecoderConfig
from latticekit.drafting.tree import Draft
from latticekit.errors import DecoderConfigError
from latticekit.lattice import SausageLattice

__all__ = ["Draft", "DraftInput", "DraftResources", "Drafter", "LatticeBuilder", "drafter_class", "make_drafter"]

#: Builds a step's lattice: ``build(columns)``, ``columns[j]`` tokens added to lattice row j + 1
#: (scored by the heads like their own arcs; a source that cannot score them ignores them).
LatticeBuilder = Callable[[Sequence[Sequence[int]]], SausageLattice]


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

    def __init__(self, ids: Sequence[int], lattice: Callable[..., SausageLattice]) -> None:
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

    def united_lattice(self, columns: Sequence[Sequence[int]]) -> SausageLattice:
        """The step's lattice with ``columns[j]`` added to row j + 1, scored by the heads like
        their own arcs (a trace's lattices, which hold the heads' top k alone, stay as they are).
        It becomes :attr:`lattice`; it must be the first read of the step."""
        if self._lattice is not None:
            raise DecoderConfigError("united_lattice() must be the step's first lattice read")
        self._lattice = self._make_lattice(columns)
        return self._lattice

    @property
    def lattice_s(self) -> float:
        """Seconds this step's lattice cost (0 while unread): what the loop measured, or a
        trace's fixed heads seconds."""
        return float(getattr(self._make_lattice, "seconds", 0.0)) if self._lattice is not None else 0.0

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
        rescorer: the :class:`~latticekit.eval.rescorer.NeuralRescorer` (``neural``).
        reference: the target's greedy sequence, prompt included (``oracle``).
        vocab_size: the target's vocabulary size; None where unknown (a replayed trace).
        num_heads: h, the heads' positions (lattice rows), where known.
        has_heads: the loop has the heads' lattices to give (heads, or a trace of theirs).
        largest_id: the largest token id the drafter will read, where ``vocab_size`` is unknown.
        costs: the target's :class:`~latticekit.decoding.costs.StepCosts` (``auto``).
        acceptance: an :class:`~latticekit.drafting.calibration.AcceptanceModel` to start from (``auto``).
        heads_fingerprint: the heads' :func:`~latticekit.heads.heads_fingerprint`, where known
            (``auto`` looks up the acceptance model shipped for them).
        memory: an :class:`~latticekit.drafting.memory.AnswerMemory` of earlier answers to draft
            from too (``auto`` and the drafters built on it), or None.
    """

    lms: Any = None
    rescorer: Any = None
    reference: Optional[Sequence[int]] = None
    vocab_size: Optional[int] = None
    num_heads: Optional[int] = None
    has_heads: bool = False
    largest_id: Optional[int] = None
    costs: Any = None
    acceptance: Any = None
    heads_fingerprint: Optional[str] = None
    memory: Any = None


class Drafter:
    """A drafting strategy, and one request's drafting state.

    Class attributes (the declaration :class:`~latticekit.drafting.config.DecoderConfig` and
    the loops read; :func:`~latticekit.drafting.registry.register` checks it):
        method: the ``DecoderConfig.method`` it implements.
        default_k, default_p: ``k`` and ``p`` when a config leaves them out.
        knobs: the config fields beyond the method it reads, of ``k``, ``p``, ``alpha`` and ``lm``
            (they name it in reports; ``p > 1`` is refused for a drafter that does not read p).
        samples: it drafts for sampling too (``temperature > 0``); the oracle does not.
        needs_heads: it reads the heads' lattice (a decode without heads is refused up front).
        needs_reference: it follows the target's greedy continuation (the oracle): the decode
            loop computes one first when the caller gives none.
        needs_costs: it weighs the target's step costs (``auto``): the decode loop measures them
            (cached, :func:`~latticekit.decoding.costs.step_costs`) when the caller gives none.

    Attributes:
        config: the decoder configuration.
        k: arcs per lattice column the drafter reads (the loop builds lattices this wide).
        reads_lattice: the loop gives it the heads' lattice (a drafter that drafts with or
            without heads, ``auto``, decides at construction from what it was given).
    """

    method: ClassVar[str] = ""
    default_k: ClassVar[int] = 1
    default_p: ClassVar[int] = 1
    knobs: ClassVar[frozenset[str]] = frozenset()
    samples: ClassVar[bool] = True
    needs_heads: ClassVar[bool] = True
    needs_reference: ClassVar[bool] = False
    needs_costs: ClassVar[bool] = False

    def __init__(self, config: DecoderConfig) -> None:
        self.config = config
        self.k = int(cast(int, config.k))  # set by DecoderConfig.__post_init__
        self.reads_lattice = self.needs_heads

    @classmethod
    def from_config(cls, config: DecoderConfig, resources: "DraftResources") -> "Drafter":
        """The drafter for ``config``, with what it needs taken from ``resources``.

        Raises:
            DecoderConfigError: a resource the strategy needs is missing or does not fit.
        """
        return cls(config)

    def draft(self, step: DraftInput) -> Draft:
        """The draft tree to verify this step; an empty one (:meth:`Draft.none`) for a plain step."""
        raise NotImplementedError

    def lattice_vocabulary(self) -> Optional[np.ndarray]:
        """Token ids the heads' lattice may be restricted to (the loop adds the decoded text's
        own tokens), or None for the full vocabulary (the default)."""
        return None

    def observe(self, step: DraftInput, draft: Draft, emitted: Sequence[int]) -> None:
        """Called after every step with what the target call emitted (accepted draft tokens,
        then the target's own). Strategies that adapt (acceptance estimates) learn here."""


def drafter_class(config: DecoderConfig) -> type[Drafter]:
    """The strategy class of ``config.method``."""
    if not isinstance(config, DecoderConfig):
        raise DecoderConfigError(f"config must be a DecoderConfig, got {type(config).__name__}")
    strategy = registry.lookup(config.method)
    if not (isinstance(strategy, type) and issubclass(strategy, Drafter)):
        raise DecoderConfigError(f"method {config.method!r} is registered to {strategy!r}, which is not a Drafter")
    return strategy


def make_drafter(config: DecoderConfig, **resources: Any) -> Drafter:
    """The drafter of ``config``; ``resources`` are :class:`DraftResources` fields.

    Raises:
        DecoderConfigError: not a DecoderConfig, or a resource the strategy needs is missing.
    """
    return drafter_class(config).from_config(config, DraftResources(**resources))
