"""What the vLLM proposer keeps per load (the batch's rows, by powers of two): its arms'
outcomes, its own fit of the step costs, and what its drafting saved and took (``frugal``);
and, over every load, whether a finished request's row is taken by another and whether requests
end at their ``max_tokens`` (:class:`Turnover`), and what a token is worth in a closed batch
(:func:`closed_values`)."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from latticekit.drafting.arms import PROBE_BUDGET, ArmStats, choose_arm, probe_outcome
from latticekit.drafting.chains import BatchCosts, StepCurve
from latticekit.vllm.config import ARMS

__all__ = ["Load", "Turnover", "closed_values", "ending_rows", "load_bucket"]


def load_bucket(rows: int) -> int:
    """The load a step's outcome is kept under: its batch's rows, by powers of two (1, 2-3,
    4-7, 8-15, 16-31, ...); query tokens follow from the rows and the arm's drafts."""
    return max(1, int(rows)).bit_length()


#: ``frugal``: decay per drafted step of a load's means of the seconds drafting saved and took,
#: the drafted steps it waits for before it skips any, and the least share of steps it drafts on.
_FRUGAL_DECAY, _FRUGAL_WARM, _FRUGAL_LEAST = 0.95, 16, 1 / 8


#: The order the arms are first tried in at a new load: a drafted step is the outcome of every
#: less eager level on the same rows too (the proposer's ``_learn``), so two ``eager`` steps
#: warm ``model``, ``lean`` and ``plain`` up with them; tried in :data:`ARMS`' order, ``model``'s
#: two steps came first and ``eager`` needed two of its own (the lattice proposer's heads run in
#: each: four heads steps where two tell as much).
WARMUP_ORDER = ("eager", "model", "lean", "plain", "text")


class Load:
    """The arms' outcomes at one load bucket, its steps, its own fit of the step costs and its
    steps' seconds by their query tokens (``step_curve``), and (``frugal``) what its drafting
    saved and took."""

    __slots__ = ("arms", "steps", "costs", "curve", "saved", "spent", "drafted", "credit", "budget")

    def __init__(self, prior_ratio: float, arms: Sequence[str] = ARMS, budget: float = PROBE_BUDGET) -> None:
        self.arms = {arm: ArmStats() for arm in sorted(arms, key=WARMUP_ORDER.index)}
        # the probes of the arms that are not the best lose at most ``budget`` of the time, all
        # of them together: each arm's probes, its share
        self.budget = budget / max(1, len(self.arms) - 1)
        self.steps = 0
        self.costs = BatchCosts(prior_ratio=prior_ratio)
        self.curve = StepCurve()
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


class Turnover:
    """Whether the engine's batch is *closed*: whether the rows of requests that finish while
    others go on are taken by new requests (a queue, or clients that send their next request as
    soon as one returns) or left empty.

    It matters to what an accepted draft token saves. Where a freed row is taken at once, a
    request that finishes a step sooner lets the next one in a step sooner: the batch keeps its
    rows, and each accepted token saves a row's share of a step, ``a / rows + b`` of a step
    costing ``a + b * tokens`` (what the allocation prices). Where it is left empty, the batch
    ends with its last request: a request that finishes sooner saves only its own later tokens,
    ``b`` each, what verifying its accepted drafts cost, and the fixed part ``a`` of a step is
    saved only by the steps of the request that ends the batch; the requests whose drafts are
    accepted are the ones least likely to be that one.

    Per call it is told the request ids of the batch, the last call's, and which of the last
    call's requests finished (gone from the runner's requests; a preempted one stays there).
    A request that finished while others went on is *replaced* if a request joins, while
    others go on, in the same call or the :data:`window` - 1 after (matched oldest first), else
    *unreplaced*, as are the rows still awaited when the batch turns over whole (no request of
    the last call goes on) or the engine ran empty. The requests that finish as the batch turns
    over whole tell nothing: a burst of requests that all ended together, followed by the
    next, looks the same from here as clients whose requests all ended together and who sent
    their next at once.
    The counts are decayed per request (:data:`decay`); the batch is closed where the decayed
    unreplaced requests are at least :data:`least` and more than half of all. It is also told
    how the finished requests ended (:meth:`endings`): at their ``max_tokens`` or before."""

    __slots__ = ("replaced", "ended", "at_length", "told", "_awaiting", "_calls")

    #: a finished request's row counts as taken if a request joins in the same call or the next 3
    window = 4
    #: decay per request told (about 50 requests' memory)
    decay = 0.98
    #: the decayed requests told before the batch can be called closed
    least = 4.0

    def __init__(self) -> None:
        self.replaced = 0.0  # decayed: finished requests whose row was taken
        self.ended = 0.0  # decayed: finished requests told (replaced or not)
        self._awaiting: deque[list[int]] = deque()  # [call, requests] finished, their rows not yet taken
        self._calls = 0
        self.at_length = 0.0  # decayed: finished requests that ended at their max_tokens ...
        self.told = 0.0  # ... and those whose ending is known (:meth:`endings`)

    def observe(self, finished: int, joined: int, going_on: int) -> None:
        """One call: ``finished`` of the last call's requests finished, ``joined`` requests are
        new to this call, ``going_on`` were in both."""
        self._calls += 1
        if going_on == 0:  # the batch turned over whole, or had run empty: the rows still awaited
            while self._awaiting:  # stayed empty; the requests that finished now tell nothing
                self._tell(self._awaiting.popleft()[1], False)
            return
        while self._awaiting and self._calls - self._awaiting[0][0] >= self.window:
            self._tell(self._awaiting.popleft()[1], False)
        if finished:
            self._awaiting.append([self._calls, finished])
        while joined and self._awaiting:
            take = min(joined, self._awaiting[0][1])
            self._tell(take, True)
            joined -= take
            self._awaiting[0][1] -= take
            if not self._awaiting[0][1]:
                self._awaiting.popleft()

    def _tell(self, requests: int, replaced: bool) -> None:
        self.replaced, self.ended = self._count(self.replaced, self.ended, requests, replaced)

    def _count(self, part: float, whole: float, requests: int, counted: bool) -> tuple[float, float]:
        """Decayed counts, ``part`` of ``whole``, after ``requests`` more (in ``part`` too if ``counted``)."""
        d = self.decay ** requests
        return d * part + (requests if counted else 0), d * whole + requests

    @property
    def closed(self) -> bool:
        """Whether finished requests' rows have mostly been left empty lately."""
        unreplaced = self.ended - self.replaced
        return unreplaced >= self.least and unreplaced > self.replaced

    def endings(self, at_length: int, other: int) -> None:
        """Finished requests: ``at_length`` ended at their ``max_tokens``, ``other`` before it
        (an end of sequence, a stop string)."""
        for n, long in ((at_length, True), (other, False)):
            self.at_length, self.told = self._count(self.at_length, self.told, n, long)

    @property
    def by_length(self) -> bool:
        """Whether requests have mostly ended at their ``max_tokens`` lately: the tokens a
        request has left then tell which request ends the batch (:func:`closed_values`)."""
        return self.told >= self.least and self.at_length > self.told / 2


def ending_rows(left: Sequence[int], margin: int) -> list[bool]:
    """Per row, whether its request may end a closed batch whose requests end at their
    ``max_tokens``: it has ``left`` tokens within ``margin`` of the most any request has."""
    most = max(left, default=0)
    return [n >= most - margin for n in left]


def closed_values(ending: Sequence[bool], a: float, weights: Sequence[float]) -> list[float]:
    """In a closed batch whose requests end at their ``max_tokens``: per row, what one of its
    accepted tokens saves, over what it saves in an open batch (:func:`~latticekit.drafting.chains.allocate`'s
    ``values``). A step costs ``a`` plus ``weights[i]`` per query token of row ``i``; ``ending``
    tells the rows that may end the batch (:func:`ending_rows`).

    Where a freed row is taken at once, an accepted token saves a row's share of a step,
    ``a / rows + weights[i]`` (:class:`Turnover`). Where freed rows are left empty, the batch
    ends with the request that has the most tokens left: a token accepted for a request that
    will not end it saves only its own later token, ``weights[i]`` (so those draft nothing, and
    the proposer does no drafting work for them), and one accepted for each of the ``m``
    requests that may end it saves ``a / m + weights[i]``: when all ``m`` have one, the batch
    ends a step sooner. The values add up to the rows' count, as in an open batch: the seconds
    saved are moved, not made."""
    rows, m = len(ending), sum(ending)
    unit = (a + sum(weights)) / max(rows, 1)
    if not rows or not m or unit <= 0:
        return [1.0] * rows
    return [((a / m if end else 0.0) + w) / unit for end, w in zip(ending, weights)]
