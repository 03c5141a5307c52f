"""The one decoding loop, over any target that verifies draft trees: a model or a trace.

Every step hands the drafter a :class:`~latticekit.drafting.DraftInput` (the decoded ids and,
built when first read, the heads' lattice), has the target verify the
:class:`~latticekit.drafting.Draft` it returns in one call (a plain one-token step for an
empty one), tells the drafter what the call emitted, and records the step. The torch decode
(:func:`latticekit.decoding.decode`) runs it over a model (:class:`~latticekit.decoding.loop.ModelTarget`),
the evaluation's replay (:func:`latticekit.eval.replay.replay`) over a greedy trace: one loop,
so what a replay measures is what a decode does.

Plain Python and numpy: nothing here imports torch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Optional, Protocol, Union

import numpy as np

from latticekit.decoding.records import Decoding, StepRecord
from latticekit.drafting.config import DecoderConfig
from latticekit.drafting.drafters.vanilla import argmax_draft
from latticekit.drafting.protocol import Drafter, DraftInput
from latticekit.drafting.tree import Draft
from latticekit.errors import DecoderConfigError
from latticekit.lattice import SausageLattice

__all__ = ["StepTarget", "run_steps", "check_max_new_tokens", "eos_set", "cut_at_eos"]


class StepTarget(Protocol):
    """What the loop verifies drafts with.

    Attributes:
        timed: its calls cost real seconds (a model), recorded per step; a trace's are not.
        lattice_s: seconds a lattice costs when fixed in advance (a trace's batched heads,
            divided per position); None: the loop times each lattice it builds.
    """

    timed: bool
    lattice_s: Optional[float]

    def first(self, ids: list[int]) -> tuple[int, ...]:
        """The first call, after the prefill: the token after ``ids`` (the prompt)."""

    def verify(self, ids: list[int], draft: Draft) -> tuple[tuple[int, ...], int]:
        """One call: verifies ``draft`` below ``ids[-1]`` (a plain step when it is empty); the
        emitted tokens (accepted draft tokens, then the target's own) and how many were drafted."""

    def lattice(self, ids: list[int], columns: Sequence[Sequence[int]],
                entropy: bool) -> tuple[SausageLattice, Optional[np.ndarray]]:
        """The heads' lattice after ``ids`` (``columns``: tokens to add to its draft rows), and
        the heads' entropies when ``entropy`` is asked and known."""


def check_max_new_tokens(max_new_tokens: object) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise DecoderConfigError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")


def eos_set(eos_token_id: Union[int, Sequence[int], None]) -> frozenset[int]:
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, (int, np.integer)) and not isinstance(eos_token_id, bool):
        return frozenset([int(eos_token_id)])
    try:
        ids = [int(t) for t in eos_token_id if not isinstance(t, bool)]  # type: ignore[union-attr]
    except TypeError as exc:
        raise DecoderConfigError(f"eos_token_id must be an id or a sequence of ids, got {eos_token_id!r}") from exc
    return frozenset(ids)


def cut_at_eos(tokens: list[int], eos: frozenset[int]) -> list[int]:
    """``tokens`` up to and including the first end-of-sequence token."""
    for i, token in enumerate(tokens):
        if token in eos:
            return tokens[: i + 1]
    return tokens


class _StepLattice:
    """The step's lattice, built when the drafter first reads it; keeps its seconds and the
    heads' entropies for the record."""

    def __init__(self, target: StepTarget, ids: list[int], entropy: bool) -> None:
        self.target, self.ids, self.entropy_wanted = target, ids, entropy
        self.seconds = 0.0
        self.entropy: Optional[np.ndarray] = None

    def __call__(self, columns: Sequence[Sequence[int]] = ()) -> SausageLattice:
        t0 = time.perf_counter()
        lattice, self.entropy = self.target.lattice(self.ids, columns, self.entropy_wanted)
        fixed = self.target.lattice_s
        self.seconds = time.perf_counter() - t0 if fixed is None else fixed
        return lattice


def run_steps(target: StepTarget, drafter: Drafter, config: DecoderConfig, prompt: list[int], max_new_tokens: int,
              eos: frozenset[int] = frozenset(), emit: Optional[Callable[[Sequence[int]], None]] = None,
              record_lattices: bool = True, clock: Callable[[], float] = time.perf_counter) -> Decoding:
    """Decodes ``max_new_tokens`` tokens after the prompt: one target call per step.

    Args:
        target: the model or trace that verifies drafts.
        drafter: the request's drafter.
        config: the decoder (kept in the result).
        prompt: the prompt ids.
        max_new_tokens: tokens to decode; the last step's surplus is cut.
        eos: stop after emitting any of these.
        emit: called with each step's emitted tokens (a streamer).
        record_lattices: keep each step's lattice, its arg-max draft and the heads' entropies
            in its record (the evaluation's analyses read them; ``generate`` does not).
        clock: seconds, synchronised with the device where that matters.
    """
    start = clock()
    ids = list(prompt)
    t0 = clock()
    first = target.first(ids)
    steps = [StepRecord(root_token=ids[-1], drafts=[], vanilla_draft=(), emitted=first, num_accepted=0,
                        model_s=clock() - t0 if target.timed else 0.0)]
    ids.extend(first)
    if emit is not None:
        emit(first)
    while len(ids) - len(prompt) < max_new_tokens and eos.isdisjoint(steps[-1].emitted):
        lattice = _StepLattice(target, ids, record_lattices)
        step = DraftInput(ids, lattice)
        t0 = clock()
        draft = drafter.draft(step)
        t1 = clock()
        emitted, num_accepted = target.verify(ids, draft)
        t2 = clock()
        drafter.observe(step, draft, emitted)
        paths = draft.paths()
        record = StepRecord(root_token=ids[-1], drafts=paths, vanilla_draft=(), emitted=emitted,
                            num_accepted=num_accepted, heads_s=lattice.seconds,
                            search_s=t1 - t0 - (lattice.seconds if target.lattice_s is None else 0.0),
                            model_s=t2 - t1 if target.timed else 0.0)
        if record_lattices and step.has_lattice:
            read = step.lattice
            record.vanilla_draft = argmax_draft(step)
            record.lattice_tokens, record.lattice_scores = read.tokens.copy(), read.scores.copy()
            record.head_entropy = lattice.entropy
        steps.append(record)
        ids.extend(emitted)
        if emit is not None:
            emit(emitted)
    tokens = cut_at_eos(ids[len(prompt):][:max_new_tokens], eos)
    return Decoding(config=config, prompt=list(prompt), tokens=tokens, steps=steps,
                    wall_s=clock() - start if target.timed else 0.0, replayed=not target.timed)
