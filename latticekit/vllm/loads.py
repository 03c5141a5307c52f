"""What the vLLM proposer keeps per load (the batch's rows, by powers of two): its arms'
outcomes, its own fit of the step costs, and what its drafting saved and took (``frugal``)."""

from __future__ import annotations

from collections.abc import Sequence

from latticekit.drafting.arms import PROBE_BUDGET, ArmStats, choose_arm, probe_outcome
from latticekit.drafting.chains import BatchCosts
from latticekit.vllm.config import ARMS

__all__ = ["Load", "load_bucket"]


def load_bucket(rows: int) -> int:
    """The load a step's outcome is kept under: its batch's rows, by powers of two (1, 2-3,
    4-7, 8-15, 16-31, ...); query tokens follow from the rows and the arm's drafts."""
    return max(1, int(rows)).bit_length()


#: ``frugal``: decay per drafted step of a load's means of the seconds drafting saved and took,
#: the drafted steps it waits for before it skips any, and the least share of steps it drafts on.
_FRUGAL_DECAY, _FRUGAL_WARM, _FRUGAL_LEAST = 0.95, 16, 1 / 8


class Load:
    """The arms' outcomes at one load bucket, its steps, its own fit of the step costs, and
    (``frugal``) what its drafting saved and took."""

    __slots__ = ("arms", "steps", "costs", "saved", "spent", "drafted", "credit", "budget")

    def __init__(self, prior_ratio: float, arms: Sequence[str] = ARMS, budget: float = PROBE_BUDGET) -> None:
        self.arms = {arm: ArmStats() for arm in arms}
        # the probes of the arms that are not the best lose at most ``budget`` of the time, all
        # of them together: each arm's probes, its share
        self.budget = budget / max(1, len(self.arms) - 1)
        self.steps = 0
        self.costs = BatchCosts(prior_ratio=prior_ratio)
        self.saved = self.spent = 0.0  # decayed means over drafted steps: seconds expected saved, seconds drafting
        self.drafted = 0  # steps drafted on
        self.credit = 0.0  # the share of steps drafted on, accrued

    @property
    def share(self) -> float:
        """The share of steps worth drafting on: the seconds drafting is expected to save over
        the seconds it takes (at most 1, at least :data:`_FRUGAL_LEAST`; 1 until
        :data:`_FRUGAL_WARM` drafted steps tell)."""
        if self.drafted < _FRUGAL_WARM or self.saved >= self.spent:
            return 1.0
        return max(_FRUGAL_LEAST, self.saved / self.spent)

    def drafts_now(self) -> bool:
        """Whether this step drafts: every step at a share of 1, else one in 1 / share (spread evenly)."""
        share = self.share
        if share >= 1.0:
            self.credit = 0.0
            return True
        self.credit += share
        if self.credit >= 1.0:
            self.credit -= 1.0
            return True
        return False

    def drafted_step(self, saved: float, spent: float) -> None:
        """A step that drafted: its chains were expected to save ``saved`` seconds (0 if none),
        its drafting took ``spent``."""
        d = _FRUGAL_DECAY if self.drafted else 0.0
        self.saved = d * self.saved + (1 - d) * max(saved, 0.0)
        self.spent = d * self.spent + (1 - d) * spent
        self.drafted += 1

    def worth(self, arm: str) -> float:
        return self.arms[arm].rate

    def choose(self, without: Sequence[str] = ()) -> str:
        """The arm of the next step (:func:`~latticekit.drafting.arms.choose_arm`), among the
        arms not ``without`` (all of them if that would leave none)."""
        self.steps += 1
        names = tuple(a for a in self.arms if a not in without) or tuple(self.arms)
        arm = choose_arm(names, self.arms, self.worth, self.steps, budget=self.budget)
        return arm or ("plain" if "plain" in names else names[0])

    def record(self, arm: str, tokens: int, seconds: float) -> None:
        """A step of ``arm`` emitted ``tokens`` in ``seconds`` (engine and drafting); nothing
        for an arm the proposer does not choose among."""
        stats = self.arms.get(arm)
        if stats is None:
            return
        stats.add(tokens, seconds, self.steps)
        if stats.probing:
            probe_outcome(stats, self.worth(arm) >= max((self.worth(a) for a in self.arms if a != arm), default=0.0))
