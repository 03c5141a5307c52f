"""Ways of drafting chosen by their outcomes: the arms ``auto`` and the vLLM proposer choose among.

An *arm* is one way of drafting (``auto``: reading the heads' lattice with the text, or the text
alone; the vLLM proposer: drafting at one level of aggressiveness, or not drafting). Each keeps
the tokens it really emitted per second it really cost (:class:`ArmStats`; between calls,
:class:`~latticekit.drafting.outcomes.ArmOutcomes` holds them as plain data), decayed over its
recent steps. :func:`choose_arm` takes the arm worth the most, or a plain step when none beats
a plain step's rate; every arm is tried :data:`WARMUP_STEPS` times first, and an arm that is not
the best is probed after :data:`FIRST_PROBE` steps, then twice as long while it keeps losing
(:func:`probe_outcome`), up to :data:`MAX_PROBE_INTERVAL`; its probe's outcome outweighs its
stale history (the decay counts the steps since it was last read). A probe of an arm far worse
than the best costs more than a step: one at a fifth of the best's rate costs four steps' time
more. So, given a budget (the vLLM proposer's is :data:`PROBE_BUDGET`), an arm worth ``r``
against the best's ``R`` waits at least ``(R / r - 1) / budget`` steps between probes, whatever
its doubling says, once it has been read :data:`BUDGET_AFTER` times (its first outcomes may be
chance): its probes lose at most that share of the time. (The vLLM lattice proposer
at 16 requests on the CPU, its heads costing five steps, spent 21% of its steps probing them
under the doubling alone and ran at 0.77-0.81x no speculation.) ``auto`` takes none: its arms'
rates come from two steps each at first, and a union that loses them by chance would then wait
a hundred steps. Outcomes kept from an earlier
call are aged by :data:`KEPT_GAP` steps when a call resumes from them (:meth:`ArmStats.age`).

Plain Python: nothing here imports torch or an engine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Optional

from latticekit.drafting.outcomes import ArmRecord

__all__ = ["ArmStats", "choose_arm", "probe_outcome", "probe_wait", "WARMUP_STEPS", "FIRST_PROBE",
           "MAX_PROBE_INTERVAL", "PROBE_BUDGET", "BUDGET_AFTER", "ARM_DECAY", "KEPT_GAP"]

#: Steps every arm is read before the outcomes choose.
WARMUP_STEPS = 2
#: An arm that is not the best is probed after this many steps, then twice as many while it keeps losing...
FIRST_PROBE = 2
#: ... up to this many, unless a budget is given: ...
MAX_PROBE_INTERVAL = 32
#: ... the vLLM proposer's: an arm's probes lose at most this share of the time (an arm far
#: worse than the best waits longer; the module docstring).
PROBE_BUDGET = 0.02
#: The reads of an arm before a budget holds its probes back (the warm-up's and two probes'):
#: two outcomes may be chance, and an arm a budget then sends far off may never be read again
#: (the vLLM lattice proposer's ``text`` at 2-3 requests, stop 54: its two warm-up steps at half
#: the best's rate, then a wait of 180 steps, longer than the benchmark's run).
BUDGET_AFTER = 4
#: Decay per step of an arm's outcome sums (a memory of ~10 of its steps).
ARM_DECAY = 0.9
#: The steps of decay kept outcomes take when a call resumes from them: the kept sums (at most
#: ~10 steps' worth) then weigh about one step (``ARM_DECAY ** 22`` is 0.1), so an arm's next
#: outcome, in a call unlike the last ones, outweighs them. The probe schedule goes on as kept:
#: probing every arm at a call's start as well cost 1-4% on code windows.
KEPT_GAP = 22


class ArmStats:
    """One way of drafting's outcomes: tokens emitted and seconds spent, each decayed by
    :data:`ARM_DECAY` per step since the arm was last read (a probe after a long pause
    outweighs the stale history), and when to probe it next."""

    __slots__ = ("tokens", "seconds", "steps", "last", "interval", "probing")

    def __init__(self) -> None:
        self.tokens = self.seconds = 0.0
        self.steps = self.last = 0
        self.interval = FIRST_PROBE
        self.probing = False

    @property
    def rate(self) -> float:
        """Tokens per second (0 before any outcome)."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def record(self, step: int) -> ArmRecord:
        """Its outcomes as plain data at decode step ``step`` (what is kept between calls)."""
        return ArmRecord(self.tokens, self.seconds, self.steps, step - self.last, self.interval)

    @classmethod
    def from_record(cls, record: ArmRecord, step: int) -> "ArmStats":
        """The arm :meth:`record` described, ``record.since`` steps before decode step ``step``."""
        stats = cls()
        stats.tokens, stats.seconds, stats.steps = record.tokens, record.seconds, record.steps
        stats.last, stats.interval = step - record.since, record.interval
        return stats

    def age(self, steps: int) -> None:
        """Its sums decayed as over ``steps`` more steps without reading it (its rate, and when
        it is probed next, are left as they were)."""
        decay = ARM_DECAY ** max(steps, 0)
        self.tokens *= decay
        self.seconds *= decay

    def add(self, tokens: float, seconds: float, step: int) -> None:
        decay = ARM_DECAY ** (step - self.last) if self.steps else 0.0
        self.tokens = decay * self.tokens + tokens
        self.seconds = decay * self.seconds + seconds
        self.steps += 1
        self.last = step


def choose_arm(arms: Sequence[str], stats: Mapping[str, ArmStats], worth: Callable[[str], float], step: int,
               plain_rate: float = 0.0, budget: Optional[float] = None) -> Optional[str]:
    """This step's arm, or None for a plain step: the first arm read fewer than
    :data:`WARMUP_STEPS` times; else an arm due for its probe (``step - last >= interval``, and
    with a ``budget``, once it was read :data:`BUDGET_AFTER` times, at least :func:`probe_wait`
    steps; marked ``probing``); else the arm
    ``worth`` the most if it beats ``plain_rate`` (a plain step's tokens per second; 0 where a
    plain step is itself an arm)."""
    for arm in arms:  # every arm tried first
        if stats[arm].steps < WARMUP_STEPS:
            return arm
    top = max(arms, key=worth)
    best: Optional[str] = top if worth(top) > plain_rate else None
    rate = max(worth(top), plain_rate)
    for arm in arms:
        wait = probe_wait(worth(arm), rate, budget) if budget is not None and stats[arm].steps >= BUDGET_AFTER \
            else 0.0
        if arm != best and step - stats[arm].last >= max(stats[arm].interval, wait):
            stats[arm].probing = True
            return arm
    return best


def probe_wait(rate: float, best: float, budget: float = PROBE_BUDGET) -> float:
    """The fewest steps between probes of an arm worth ``rate`` where the best is worth
    ``best`` (tokens per second): its probes then lose at most ``budget`` of the time."""
    if rate <= 0 or best <= rate:
        return 0.0
    return (best / rate - 1.0) / budget


def probe_outcome(stats: ArmStats, wins: bool) -> None:
    """After an arm's outcome is recorded: a probe that won is read again soon; one that lost,
    half as often as before."""
    if stats.probing:
        stats.probing = False
        stats.interval = FIRST_PROBE if wins else min(2 * stats.interval, MAX_PROBE_INTERVAL)
