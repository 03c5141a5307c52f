"""Analyses of decodes, computed afterwards from their per-step records (numpy only).

* :func:`block_efficiency`: decoded tokens per serial target call;
* :func:`repetition`: how often drafts stutter (the reference paper's Table 3);
* :func:`head_entropy`: per-head entropy and h_max (its Figure 3);
* :func:`wins_ties_losses`: rescored vs vanilla drafts step by step (its Table 5);
* :func:`step_times`: where a step's time goes (heads, rescoring search, target).

A *block* is ``(root_token,) + draft``: lattice position 1 (the token the previous call emitted)
followed by the h - 1 drafted tokens. The comparisons against the target's continuation
(:func:`accepted_length`, :func:`wins_ties_losses`) assume greedy decodes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np

# block_efficiency, drafted_steps and accepted_length live with the records (the demo reads them
# too); they are this module's names as well
from latticekit.decoding.records import StepRecord, accepted_length, block_efficiency, drafted_steps

__all__ = [
    "block_efficiency",
    "drafted_steps",
    "blocks",
    "accepted_length",
    "max_run_length",
    "Repetition",
    "repetition",
    "h_max",
    "HeadEntropy",
    "head_entropy",
    "WinsTiesLosses",
    "wins_ties_losses",
    "StepTimes",
    "step_times",
]


def blocks(steps: Iterable[StepRecord], which: Literal["vanilla", "rescored"]) -> list[tuple[int, ...]]:
    """``(root_token,) + draft`` per drafted step: the vanilla arg-max draft or the best draft
    the decoder verified (``drafts[0]``; the same as vanilla for the vanilla decoder)."""
    if which not in ("vanilla", "rescored"):
        raise ValueError(f"which must be 'vanilla' or 'rescored', got {which!r}")
    return [(step.root_token,) + (step.vanilla_draft if which == "vanilla" else step.drafts[0])
            for step in drafted_steps(steps)]


def max_run_length(tokens: Sequence[int]) -> int:
    """The longest run of one repeated token (1 when no two neighbours are equal; 0 if empty)."""
    best = run = 0
    previous = None
    for tok in tokens:
        run = run + 1 if tok == previous else 1
        best = max(best, run)
        previous = tok
    return best


def _has_repeat(block: Sequence[int]) -> bool:
    return any(a == b for a, b in zip(block, block[1:]))


@dataclass
class Repetition:
    """Attributes:
        identical_pct: % of consecutive token pairs within blocks that are identical.
        mean_max_run: the mean over blocks of the longest run of one token.
        blocks: number of blocks measured.
    """

    identical_pct: float
    mean_max_run: float
    blocks: int


def repetition(block_list: Sequence[Sequence[int]]) -> Repetition:
    """Repetition within draft blocks (see :func:`blocks`)."""
    pairs = same = 0
    runs = []
    for block in block_list:
        pairs += max(0, len(block) - 1)
        same += sum(a == b for a, b in zip(block, block[1:]))
        runs.append(max_run_length(block))
    return Repetition(
        identical_pct=100.0 * same / pairs if pairs else float("nan"),
        mean_max_run=float(np.mean(runs)) if runs else float("nan"),
        blocks=len(runs),
    )


def h_max(mean_entropy: Sequence[float]) -> int:
    """The largest head (1-based) up to which mean entropy rises strictly monotonically.

    ``[0.5, 1.2, 1.8, 1.7, 2.0]`` gives 3: heads 1 < 2 < 3, then head 4 falls.
    """
    values = list(mean_entropy)
    if not values:
        return 0
    n = 1
    while n < len(values) and values[n] > values[n - 1]:
        n += 1
    return n


@dataclass
class HeadEntropy:
    """Attributes:
        mean (`np.ndarray` of shape `(h,)`): mean entropy (nats) of each head over steps.
        quantiles (`np.ndarray` of shape `(h, 5)`): its 5th, 25th, 50th, 75th and 95th percentile.
        h_max: see :func:`h_max`.
        steps: steps measured.
    """

    mean: np.ndarray
    quantiles: np.ndarray
    h_max: int
    steps: int

    def to_json(self) -> dict:
        return {"mean": self.mean.tolist(), "quantiles": self.quantiles.tolist(), "h_max": self.h_max,
                "steps": self.steps}


def head_entropy(steps: Iterable[StepRecord]) -> HeadEntropy:
    """Per-head entropy distribution over the drafted steps."""
    rows = [step.head_entropy for step in drafted_steps(steps) if step.head_entropy is not None]
    if not rows:
        return HeadEntropy(np.zeros(0), np.zeros((0, 5)), 0, 0)
    table = np.stack(rows)
    mean = table.mean(axis=0)
    quantiles = np.percentile(table, [5, 25, 50, 75, 95], axis=0).T
    return HeadEntropy(mean, quantiles, h_max(mean), len(rows))


@dataclass
class WinsTiesLosses:
    """Rescored vs vanilla, per drafted step (greedy decodes).

    A step is a *win* when the decoder accepted more tokens than the vanilla arg-max draft
    would have on the same prefix, a *tie* when as many, a *loss* when fewer.

    Attributes:
        wins, ties, losses: step counts.
        repaired_pct: % of wins whose vanilla block repeats a token back to back and whose
            rescored block does not.
        introduced_pct: % of losses whose rescored block repeats a token and whose vanilla
            block does not.
        differ: steps where the rescored draft differs from the vanilla one.
    """

    wins: int
    ties: int
    losses: int
    repaired_pct: float
    introduced_pct: float
    differ: int

    def to_json(self) -> dict:
        return asdict(self)


def wins_ties_losses(steps: Iterable[StepRecord]) -> WinsTiesLosses:
    """Compares each drafted step's accepted length with vanilla's on the same prefix.

    Vanilla's length is :func:`accepted_length` of its draft against what the step emitted,
    which decides win/tie/loss exactly (see there).
    """
    wins = ties = losses = repaired = introduced = differ = 0
    for step in drafted_steps(steps):
        vanilla = accepted_length(step.vanilla_draft, step.emitted)
        rescored_block = (step.root_token,) + step.drafts[0]
        vanilla_block = (step.root_token,) + step.vanilla_draft
        differ += step.drafts[0] != step.vanilla_draft
        if step.num_accepted > vanilla:
            wins += 1
            repaired += _has_repeat(vanilla_block) and not _has_repeat(rescored_block)
        elif step.num_accepted == vanilla:
            ties += 1
        else:
            losses += 1
            introduced += _has_repeat(rescored_block) and not _has_repeat(vanilla_block)
    return WinsTiesLosses(
        wins=wins, ties=ties, losses=losses,
        repaired_pct=100.0 * repaired / wins if wins else float("nan"),
        introduced_pct=100.0 * introduced / losses if losses else float("nan"),
        differ=differ,
    )


@dataclass
class StepTimes:
    """Mean milliseconds per step: heads + lattice top-k, draft search (rescoring), target call."""

    heads_ms: float
    search_ms: float
    model_ms: float
    steps: int

    def to_json(self) -> dict:
        return asdict(self)


def step_times(steps: Iterable[StepRecord]) -> StepTimes:
    """Where the time of the drafted steps went (all steps for the greedy baseline)."""
    rows = list(steps)
    drafted = drafted_steps(rows) or rows
    if not drafted:
        return StepTimes(float("nan"), float("nan"), float("nan"), 0)
    mean = lambda key: 1e3 * float(np.mean([getattr(s, key) for s in drafted]))  # noqa: E731
    return StepTimes(mean("heads_s"), mean("search_s"), mean("model_s"), len(drafted))
