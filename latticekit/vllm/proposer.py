"""``NGramProposer``: latticekit's n-gram drafting as a vLLM speculative-decoding proposer.

vLLM 0.32 builds a ``custom_class`` proposer in its worker process with the engine's
``VllmConfig`` and, after every step that ran the model, calls
``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings)`` for the
whole batch: per row, the tokens the step emitted, the row's length, the token buffer (prompt
and output) and each scheduled token's KV slot. It returns one chain of draft ids per row
(possibly empty), which the next step verifies exactly (greedy rows accept what argmax
decoding emits; sampled rows keep the target's distribution through vLLM's rejection sampler).

Per row this proposer drafts latticekit's n-gram continuations of the request's own text
(:class:`~latticekit.drafting.chains.ChainDrafter`); per batch it chooses every chain's
length for the most expected tokens per second under the step costs it measures from the
engine's own steps (:func:`~latticekit.drafting.chains.allocate`): drafts shrink as the batch
grows, down to none. The acceptance estimates are learnt per candidate source (the text's,
the memory's, the heads'), and scaled by the draft tokens accepted over those expected. With
``arms`` of more than one (the default, the lattice proposer's too, is ``model`` and ``plain``,
``plain`` only at loads where a draft token costs at least ``plain_at_cost``, a third, of a
row's token), whether to draft, and how eagerly, is learnt
from outcomes: per load bucket (the
batch's rows, by powers of two) the arms ``plain`` (no drafting work at all), ``lean``,
``model`` and ``eager`` (a draft token priced at 4, 1 and 1/4 times the fitted cost), and the
lattice proposer's ``text`` (its n-grams alone, its heads not run) keep the tokens the engine
really emitted per second it really took (the wall time between calls, and the drafting), and
:func:`~latticekit.drafting.arms.choose_arm` keeps the best and probes the others ever more
rarely, an arm far worse than the best so rarely that the probes of all the others together
lose at most ``probe_budget`` (2%) of the time.
A drafted step is also the outcome of every less eager arm on the same rows (each would have
verified a prefix of the same chains: its accepted tokens are exact, its seconds the step's
less the fitted cost of the drafts it leaves out), so the arms are compared on the same
requests' steps. In a closed batch (finished requests' rows left empty, not taken by new
requests: :class:`~latticekit.vllm.loads.Turnover`), at loads where a draft token costs at
least ``closed_at_cost`` (a third) of a row's token, it does not draft at all: there an accepted
token saves about what verifying it cost; elsewhere, where requests end at their ``max_tokens``,
only the requests that may end the batch draft (``closed_margin``). With ``frugal`` (the default), a
load whose drafted steps were expected to save fewer seconds than their drafting took drafts on
only that share of its steps (at least 1 in 8); the others do no drafting work. A chain stops
where its request's ``max_tokens`` would (vLLM verifies a chain whole, and throws away what is
accepted past it). Request state follows the batch: it is created when a request first appears,
kept while a preempted request waits (bounded), and freed when the request finishes. With
``memory_tokens`` set, a finished request's output goes into the engine's memory of earlier
answers (:class:`~latticekit.drafting.memory.AnswerMemory`), which every request drafts from
beside its own text; vLLM calls the proposer from one thread. With ``plain_steps`` (the
default), the runner prepares a step in which no request has a draft as a step without
speculation (:func:`~latticekit.vllm.engine.plain_steps`), which vLLM itself does not.

It never takes the engine down: an exception becomes empty drafts for the rows it touched,
logged once per kind with its cause and counted.
"""

from __future__ import annotations

import json
import logging
import os
import time
import traceback
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, NamedTuple, Optional, cast

import numpy as np

from latticekit._files import LatestWriter
from latticekit.drafting.calibration import SourceAcceptance
from latticekit.drafting.chains import (BatchCosts, ChainDrafter, CostFit, allocate_curve, allocate_prices,
                                       curve_seconds)
from latticekit.drafting.memory import AnswerMemory
from latticekit.errors import ProposerConfigError
from latticekit.vllm.config import ARMS, ProposerConfig
from latticekit.vllm.engine import (attended_keys, dynamic_schedule, find_runner, load_lm, plain_steps,
                                    prompt_length, request_answer, scheduled_tokens, stats_asked, tokens_left)
from latticekit.vllm.loads import Load, Turnover, closed_values, ending_rows, load_bucket

__all__ = ["NGramProposer"]

logger = logging.getLogger("latticekit.vllm")
#: The drafting arms of :data:`~latticekit.vllm.config.ARMS`, the ways of drafting the proposer
#: chooses among by their outcomes, per load: each level prices a draft token at this multiple of
#: the fitted per-token step cost in the batch's allocation
#: (:func:`~latticekit.drafting.chains.allocate`); ``plain`` drafts nothing (no drafting work at all);
#: ``text``, the lattice proposer's, drafts its n-grams alone at ``model``'s price (its heads not run).
LEVELS = {"model": 1.0, "eager": 0.25, "lean": 4.0}


class _Step(NamedTuple):
    """What a call decided, for the outcome of the step that verifies it."""

    bucket: int  #: its load bucket
    arm: str  #: the arm that chose its chains
    draft_s: float  #: the call's own seconds
    expected: float  #: the draft tokens the estimates expected accepted
    #: per level no more eager than ``arm`` (its own included), each drafting row's chain
    #: length under that level's allocation (request key -> tokens): the shorter chains that
    #: level would have verified, whose outcome the step tells exactly (a chain's accepted
    #: prefix does not depend on how far it goes on)
    chains: dict[str, dict[Any, int]]
    #: per drafting row (request key), its context (tokens) when it drafted: a draft token's
    #: fitted cost is ``b + c * context`` (:class:`~latticekit.drafting.chains.CostFit`)
    contexts: Optional[dict[Any, int]] = None
    #: the batch's rows (request keys) when it decided: a row the next call holds and this did
    #: not is a request that joined, its prefill in that step (no verifying step's cost)
    rows: Optional[tuple[Any, ...]] = None


#: Decay per drafted step of the accepted and expected sums that correct the estimates.
_CORRECTION_DECAY = 0.95


class NGramProposer:
    """latticekit's drafting in vLLM: see the module docstring.

    Use::

        from latticekit.vllm import speculative_config
        llm = vllm.LLM(model, speculative_config=speculative_config(8, lm="embedded"))

    or ``speculative_config={"method": "custom_class", "model": "latticekit.vllm.NGramProposer",
    "num_speculative_tokens": 8}`` with ``LATTICEKIT_VLLM_CONFIG`` set (:mod:`latticekit.vllm.config`).

    Raises:
        ProposerConfigError: a bad setting or model file (when the engine starts).
    """

    #: Whether the proposer drafts from heads (``heads`` is its setting).
    reads_heads = False
    #: What the acceptance estimates' priors take at their word (``AcceptanceModel.prior``'s ``trust``).
    trust = "cache"
    #: The clock steps are timed with (seconds).
    clock = staticmethod(time.perf_counter)
    #: The arms it chooses among where ``arms`` is not set: the cost model, or no drafting at all
    #: where a draft token is dear (``plain_at_cost``).
    default_arms: tuple[str, ...] = ("model", "plain")
    #: ``plain_at_cost`` where it is not set.
    default_plain_at_cost = 1 / 3

    def __init__(self, vllm_config: Any, config: Optional[ProposerConfig] = None) -> None:
        self.config = config if config is not None else ProposerConfig.from_env()
        if (self.config.heads is not None) != self.reads_heads:
            raise ProposerConfigError(
                "latticekit vLLM proposer: heads are drafted by latticekit.vllm.LatticeProposer, n-grams alone by "
                f"latticekit.vllm.NGramProposer; {type(self).__name__} was given heads={self.config.heads!r}")
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        self._schedule = dynamic_schedule(vllm_config)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.vocab_size = int(vllm_config.model_config.get_vocab_size())
        self.lm = load_lm(self.config.lm)
        if self.lm is not None:
            largest = int(np.max(self.lm.word_token_ids(), initial=-1))
            if largest >= self.vocab_size:
                raise ProposerConfigError(f"latticekit vLLM proposer: lm {self.config.lm!r} holds token id {largest}, "
                                          f"outside the model's vocabulary of {self.vocab_size}")
        self.arms = self.config.arms if self.config.arms is not None else self.default_arms
        self.plain_at_cost = self.config.plain_at_cost if self.config.plain_at_cost is not None \
            else self.default_plain_at_cost
        if "text" in self.arms and not self.reads_heads:  # n-grams without heads: what this proposer does anyway
            raise ProposerConfigError("latticekit vLLM proposer: arm 'text' is latticekit.vllm.LatticeProposer's")
        self.memory = AnswerMemory(self.config.memory_tokens, vocab_size=self.vocab_size,
                                   context=self.config.memory_context) if self.config.memory_tokens else None
        # one model per candidate source: an earlier answer is trusted as far as answers proved right
        self.acceptance = SourceAcceptance.prior(("heads",) * self.reads_heads + ("text",)
                                                 + ("memory",) * (self.memory is not None), trust=self.trust)
        self.costs = BatchCosts(prior_ratio=self.config.prior_ratio)
        runner = find_runner()
        self._runner = weakref.ref(runner) if runner is not None else None
        if self.config.plain_steps:  # its steps without drafts prepared without speculation
            plain_steps(runner, vllm_config.model_config, self._unspeculated)
        self.states: "OrderedDict[Any, ChainDrafter]" = OrderedDict()
        self._last_end: Optional[float] = None
        self._verify_tokens: Optional[int] = None  # query tokens the next step holds if no request prefills
        self._verify_keys = 0.0  # ... and the keys they attend (per row, its query tokens times its context)
        self._draft_s = 0.0  # running mean of a drafting call's own seconds
        #: per load bucket, the arms' outcomes (learnt where the step costs are measured, not given)
        self.loads: dict[int, Load] = {}
        self._pending: Optional[_Step] = None  # what the last call decided, for the next step's outcome
        self._accepted = self._expected = 0.0  # decayed: draft tokens accepted, and expected, on drafted steps
        self._saved = 0.0  # the seconds the last call's chains were expected to save (frugal)
        self._logged: set[str] = set()
        self._stats_written, self._stats_writer = 0.0, cast(Optional[LatestWriter], None)
        self._finished_now = False  # this call learnt that requests finished (the stats are rewritten then)
        self._stats_asked = False  # this call's batch holds engine_stats' request (the rewrite is waited for)
        self._last_ids: list[Any] = []  # the last call's request ids
        #: per request of the batch (memory on), the runner's state of it, read for its answer when it finishes
        self._held: "OrderedDict[Any, Any]" = OrderedDict()
        self.turnover = Turnover()  # whether finished requests' rows are taken, and how they ended (closed_*)
        self._left: dict[Any, int] = {}  # per request of the last call, the tokens it had left
        self.counters = {"calls": 0, "rows": 0, "drafted_rows": 0, "draft_tokens": 0, "accepted_tokens": 0,
                         "proposed_tokens": 0, "draft_seconds": 0.0, "errors": 0, "requests_started": 0,
                         "requests_finished": 0, "states_evicted": 0, "rows_capped": 0, "answers_from_runner": 0,
                         "steps_frugal": 0, "steps_unspeculated": 0, "steps_closed": 0,
                         **{f"steps_{arm}": 0 for arm in ARMS}}

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """vLLM's CPU runner hands the target model over; n-gram drafting needs none of it."""

    def _unspeculated(self) -> None:
        """The runner prepares a step without drafts as a step without speculation (``plain_steps``)."""
        self.counters["steps_unspeculated"] += 1

    # -- one step ---------------------------------------------------------------------------

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings: Any = None, **_: Any) -> list[list[int]]:
        """One chain per batch row (see the module docstring); empty chains when anything fails."""
        start = self.clock()
        rows = len(sampled_token_ids)
        pending, self._pending = self._pending, None
        self._finished_now = self._stats_asked = False
        keys: list[Any] = list(range(rows))
        try:
            emitted = sum(len(s) for s in sampled_token_ids)
            accepted = emitted - sum(1 for s in sampled_token_ids if s)  # a row emits its accepted drafts and one
            keys = self._row_keys(rows)
            left = ((key, tokens_left(self._request(key), int(n))) for key, n in zip(keys, num_tokens_no_spec[:rows]))
            self._left = {key: n for key, n in left if n is not None}
            self._learn(pending, start, sampled_token_ids, keys, scheduled_tokens(slot_mappings))
            out, arm, expected, chains, contexts = self._propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu,
                                                                 keys)
        except Exception as exc:  # never the engine's problem
            self._failed("propose", exc)
            out, arm, expected, accepted, chains, contexts = [[] for _ in range(rows)], "plain", 0.0, 0, {}, None
        end = self.clock()
        spent = end - start
        if arm != "plain":
            self._draft_s = spent if self._draft_s == 0 else 0.9 * self._draft_s + 0.1 * spent
            if self.config.frugal:
                self._load(load_bucket(rows)).drafted_step(self._saved, spent)
        drafts = sum(len(chain) for chain in out)
        self._verify_tokens = rows + drafts
        self._verify_keys = attended_keys(num_tokens_no_spec, out) if self.config.context_costs else 0.0
        self._pending = _Step(load_bucket(rows), arm, spent, expected, chains, contexts, tuple(keys))
        self.counters["calls"] += 1
        self.counters["rows"] += rows
        self.counters[f"steps_{arm}"] += 1
        self.counters["accepted_tokens"] += accepted
        self.counters["draft_seconds"] += spent
        self.counters["drafted_rows"] += sum(1 for chain in out if chain)
        self.counters["draft_tokens"] += drafts
        if self.config.stats is not None and (end - self._stats_written > 0.5 or self._finished_now
                                              or self._stats_asked):
            self._write_stats(end, wait=self._stats_asked)
        self._last_end = self.clock()
        return out

    def _learn(self, pending: Optional[_Step], start: float, sampled: list[list[int]], keys: list[Any],
               tokens: Optional[int]) -> None:
        """What the step just run says: its seconds (the engine's, between the last call's end
        and this one's start, and the last call's drafting) for the step-cost fit and, per load
        bucket, the arms' outcomes; the draft tokens it accepted against those the estimates
        expected. Steps that prefilled a prompt (more query tokens than the last call scheduled)
        and idle gaps are no arm's outcome, nor are steps a request joined (its prefill, however
        short its prompt, after the engine sat idle, maybe).

        A drafted step is the outcome of its arm and, on the same rows, of every arm less eager
        (``plain`` included): each would have verified a prefix of the same chains, and a
        chain's accepted prefix does not depend on how far it goes on, so its tokens are exact,
        and its seconds are the step's less the fitted cost of the draft tokens it leaves out.
        Arms compared on the same requests' steps are not swayed by which requests those were."""
        if pending is None or self._last_end is None:
            return
        emitted = sum(len(s) for s in sampled)
        rows_emitting = sum(1 for s in sampled if s)
        if pending.expected > 0:
            d = _CORRECTION_DECAY
            self._accepted = d * self._accepted + emitted - rows_emitting
            self._expected = d * self._expected + pending.expected
        engine_s = start - self._last_end
        if tokens is None or self._verify_tokens is None or tokens > self._verify_tokens:
            return
        if pending.rows is not None and not set(keys) <= set(pending.rows):
            return  # a request joined: its prefill ran in the step (after the engine sat idle, maybe)
        attended = self._verify_keys
        if self.costs.idle(tokens, engine_s, attended):
            return
        self.costs.add(tokens, engine_s, attended)
        if self.config.step_costs is not None:
            return
        load = self._load(pending.bucket)
        load.costs.add(tokens, engine_s, attended)
        load.curve.add(tokens, engine_s)
        if pending.chains:
            accepted = {key: len(s) - 1 for key, s in zip(keys, sampled) if s}
            _, b, c = self._coefficients(pending.bucket)
            contexts = pending.contexts or {}
            run = pending.chains[pending.arm]

            def cost(chains: dict[Any, int]) -> float:  # the fitted seconds of these draft tokens
                return sum(n * (b + c * contexts.get(key, 0)) for key, n in chains.items())

            drafted = cost(run)
            for arm, chains in pending.chains.items():  # the arms less eager than the one run
                if arm != pending.arm and all(n <= run.get(key, 0) for key, n in chains.items()):
                    got = rows_emitting + sum(min(n, accepted.get(key, 0)) for key, n in chains.items())
                    saved = drafted - cost(chains)
                    load.record(arm, got, max(engine_s - saved, 0.5 * engine_s) + pending.draft_s)
            if pending.arm != "plain":
                load.record("plain", rows_emitting, max(engine_s - drafted, 0.5 * engine_s))
        load.record(pending.arm, emitted, engine_s + pending.draft_s)

    @property
    def correction(self) -> float:
        """Draft tokens accepted over the tokens the estimates expected, lately (1 until there are
        enough to tell; within [0.2, 2]): the chains' probabilities are scaled by it."""
        if self._expected < 4:
            return 1.0
        return min(2.0, max(0.2, self._accepted / self._expected))

    def _arm(self, rows: int) -> str:
        """The next step's arm: ``plain`` in a closed batch where a draft token costs at least
        ``closed_at_cost`` of a row's token (:class:`~latticekit.vllm.loads.Turnover`); else learnt
        per load bucket from the outcomes where the step costs are measured; with step costs given
        (tests, replays), the cost model's allocation always."""
        if self.config.step_costs is not None:
            return "model"
        bucket = load_bucket(rows)
        a, b, _ = self._coefficients(bucket)
        share = b / (a / max(rows, 1) + b) if b > 0 else 0.0  # of a row's token, a draft token's cost
        closed = self.config.closed_at_cost
        if closed is not None and share >= closed and self.turnover.closed:
            self.counters["steps_closed"] += 1
            return "plain"  # an accepted token saves about what verifying it cost (Turnover)
        without: tuple[str, ...] = ()
        if self.plain_at_cost > 0 and "plain" in self.arms and share < self.plain_at_cost:
            without = ("plain",)  # a draft token is cheap here: the cost model decides alone
        return self._load(bucket).choose(without)

    def _load(self, bucket: int) -> Load:
        load = self.loads.get(bucket)
        if load is None:
            load = self.loads[bucket] = Load(self.config.prior_ratio, self.arms, self.config.probe_budget)
        return load

    def _coefficients(self, bucket: int) -> CostFit:
        """The step costs ``(a, b, c)`` at a load bucket: its own fit where its steps tell ``a``
        from the rest, else the fit over every load. An engine's step need not be one line across
        loads (a pass of a few query tokens may be bound by reading the weights, a busy one by its
        tokens' compute): on vLLM's CPU build with SmolLM2 the fixed part grew from 129 ms at one
        request to 177 ms at 16. A bucket's fit through the origin is not taken: within a bucket
        the steps vary by a few tokens, and where noise steepens their slope until the fixed part
        comes out below 0 the fit puts the whole step on its tokens (at 2-3 requests: nine times
        the fit over every load), drafts nothing there, and never sees the larger steps that would
        correct it. With ``load_spread`` (the default), a bucket's price of a token is drawn toward
        the fit over every load's as far as its own steps leave it uncertain
        (:meth:`~latticekit.drafting.chains.BatchCosts.drawn_to`)."""
        fit = self._own_fit(bucket)
        return fit if fit is not None else self.costs.coefficients()

    def _ending(self, keys: list[Any]) -> Optional[list[bool]]:
        """Per row, whether it may end a closed batch (:func:`~latticekit.vllm.loads.ending_rows`), or None."""
        if self.config.closed_margin is None or not (self.turnover.closed and self.turnover.by_length) \
                or any(key not in self._left for key in keys):
            return None
        return ending_rows([self._left[key] for key in keys], self.config.closed_margin)

    def _own_fit(self, bucket: int) -> Optional[CostFit]:
        """The load bucket's own fit where :meth:`_coefficients` takes it (with a fixed part), else None."""
        load, spread = self.loads.get(bucket), self.config.load_spread
        if load is not None and spread is not None and not self.config.context_costs and self.costs.fitted:
            return load.costs.drawn_to(self.costs.coefficients(), spread)
        fit = load.costs.fit() if load is not None else None
        return fit if fit is not None and fit.a > 0 else None

    def _propose(self, sampled: list[list[int]], lengths: np.ndarray, buffer: np.ndarray,
                 keys: list[Any]) -> tuple[list[list[int]], str, float, dict[str, dict[Any, int]],
                                           Optional[dict[Any, int]]]:
        """The chains, the arm that chose them, the accepted tokens the estimates expect, per
        arm no more eager the chain lengths it would have chosen, and the drafting rows'
        contexts (:class:`_Step`)."""
        rows = len(sampled)
        arm = self._arm(rows)
        self._saved = 0.0
        if arm != "plain" and self.config.frugal and not self._load(load_bucket(rows)).drafts_now():
            arm = "plain"  # drafting would not repay its own seconds at this load (frugal)
            self.counters["steps_frugal"] += 1
        if arm == "plain":  # no drafting work at all (the states catch up when drafting resumes)
            return [[] for _ in range(rows)], arm, 0.0, {}, None
        cap = self._schedule[min(rows, len(self._schedule) - 1)] if self._schedule is not None else None
        prepared: list[Optional[tuple[ChainDrafter, int]]] = [None] * rows
        ending = self._ending(keys)  # in a closed batch, the rows that may end it (the others draft nothing)
        for i in range(rows):  # nothing sampled: a prefill chunk or a discarded row
            if sampled[i] and cap != 0 and (ending is None or ending[i]):
                try:
                    prepared[i] = self._row_state(keys[i], int(lengths[i]), buffer[i], len(sampled[i]), cap)
                except Exception as exc:
                    self._failed("row", exc)
                    self.states.pop(keys[i], None)
        self._begin_step(sampled, prepared, arm)
        chains: list[np.ndarray] = []
        probabilities: list[np.ndarray] = []
        correction = self.correction
        for i, ready in enumerate(prepared):
            chain, prob = np.zeros(0, dtype=np.int64), np.zeros(0)
            if ready is not None:
                try:
                    chain, prob = self._draft(ready[0], i, ready[1])
                except Exception as exc:
                    self._failed("row", exc)
                    self.states.pop(keys[i], None)
            chains.append(chain)
            probabilities.append(np.minimum(prob * correction, 1.0))
        if self.config.step_costs is not None:
            a, b, c = (*self.config.step_costs, 0.0)
        else:
            a, b, c = self._coefficients(load_bucket(rows))
        if a == 0 and b == 0 and c == 0:  # no step measured yet: a token at the prior's price
            a, b = 1.0, self.config.prior_ratio
        context = [int(lengths[i]) for i in range(rows)]
        # a row's query token costs b + c * its context (the keys it attends): the allocation's
        # weights, in seconds, with each level's price a multiple of them
        weights = [b + c * n for n in context]
        values = closed_values(ending, a, weights) if ending is not None else None
        self.counters["proposed_tokens"] += sum(len(c) for c in chains)
        lengths_by_arm: dict[str, dict[Any, int]] = {}
        # a heads step is the outcome of the heads' less eager levels too; a text step, of none but plain
        levels = (arm,) if arm == "text" else (arm, *(o for o in LEVELS if o in self.arms and LEVELS[o] > LEVELS[arm]))
        prices = [LEVELS["model"] if level == "text" else LEVELS[level] for level in levels]
        load = self.loads.get(load_bucket(rows))  # the step's seconds by its tokens (step_curve), else the line
        steps = load.curve.between(rows, rows + sum(len(x) for x in chains), a, b) if load is not None and c == 0 \
            and self.config.step_curve and self.config.step_costs is None else None
        allocations = allocate_curve(probabilities, steps, prices, self._draft_s, values) if steps is not None \
            else allocate_prices(probabilities, a, prices, self._draft_s, weights, values)
        for level, price, allocated in zip(levels, prices, allocations):
            if steps is not None:  # the plain step's seconds, and those the drafts add
                plain, added = steps[0], curve_seconds(steps, sum(allocated), price) - steps[0]
            else:
                plain, added = a + price * sum(weights), price * sum(w * n for w, n in zip(weights, allocated))
            chosen, expected, worth = self._repaid(probabilities, allocated, plain, added, values)
            lengths_by_arm[level] = {keys[i]: n for i, n in enumerate(chosen) if n}
            if level == arm:
                out = [chain[:n].tolist() for chain, n in zip(chains, chosen)]
                arm_expected = expected
                # the seconds these chains are expected to save: their accepted tokens (by their rows'
                # values) at the plain step's seconds per row, less the seconds their draft tokens add
                self._saved = worth * plain / max(rows, 1) - (added if any(chosen) else 0.0)
        drafting = {keys[i]: context[i] for i, chain in enumerate(chains) if len(chain)}
        return out, arm, arm_expected, lengths_by_arm, drafting

    def _repaid(self, probabilities: list[np.ndarray], chosen: list[int], plain: float, added: float,
                values: Optional[list[float]] = None) -> tuple[list[int], float, float]:
        """The chain lengths allocated (``chosen``), or none unless the drafts repay the drafting
        too, against a step that drafts nothing at all (``plain`` seconds; the drafts add
        ``added``); the accepted tokens they expect, and those by the rows' ``values``."""
        rows = len(probabilities)
        expected = [float(p[:n].sum()) for p, n in zip(probabilities, chosen)]
        worth = sum(v * e for v, e in zip(values or [1.0] * rows, expected))
        if not any(chosen) or plain > 0 and (rows + worth) / (plain + self._draft_s + added) <= rows / plain:
            return [0] * rows, 0.0, 0.0
        return chosen, sum(expected), worth

    def _begin_step(self, sampled: list[list[int]], prepared: list[Optional[tuple[ChainDrafter, int]]],
                    arm: str) -> None:
        """What a step's drafting needs for the whole batch, its rows' states up to date
        (``prepared``: per row, its state and room, or None where it does not draft; ``arm``: the
        step's): nothing here."""

    def _draft(self, state: ChainDrafter, index: int, room: int) -> tuple[np.ndarray, np.ndarray]:
        """Row ``index``'s chain, its state up to date."""
        return state.propose(room)

    def _row_state(self, key: Any, length: int, row: np.ndarray, emitted: int,
                   cap: Optional[int] = None) -> Optional[tuple[ChainDrafter, int]]:
        """The row's request state, synced to its text, and the room for its chain; None where
        there is no room."""
        room = min(self.k, self.config.max_depth, self.max_model_len - length - 1)
        if cap is not None:  # vLLM's own schedule of speculative tokens by batch size
            room = min(room, cap)
        left = self._left.get(key)  # read from the runner at this call (propose)
        if left is not None and left - 1 < room:  # drafts past the request's max_tokens are never emitted
            room = left - 1
            self.counters["rows_capped"] += 1
        if length < 1 or room < 1:
            return None
        ids = cast(Sequence[int], row[:length])  # an int array: indexed and sliced as the drafter reads ids
        state = self.states.get(key)
        if state is not None and state.length and (length - state.start < state.length or int(
                ids[state.start + state.length - 1]) != state.model.ids[-1]):
            self.states.pop(key).remember()  # the row holds another text now (a row index key, reused)
            state = None
        if state is None:
            prompt = prompt_length(self._request(key), length - emitted)
            state = ChainDrafter(self.lm, self.vocab_size, self.acceptance, candidates=self.config.candidates,
                                 max_depth=self.config.max_depth, start=max(0, prompt - self.config.max_context),
                                 memory=self.memory, prompt_length=prompt)
            self.states[key] = state
            self.counters["requests_started"] += 1
            while len(self.states) > self.config.max_requests:
                self.states.popitem(last=False)
                self.counters["states_evicted"] += 1
        else:
            self.states.move_to_end(key)
        state.observe(ids)
        return state, room

    # -- which request a row is ---------------------------------------------------------------

    def _row_keys(self, rows: int) -> list[Any]:
        """Each row's request id where the runner tells it (states then follow requests that move
        rows, pause and resume), else the row index (a state whose text a row no longer extends
        starts afresh). Frees the states of requests that finished; sets ``_finished_now`` and ``_stats_asked``."""
        runner = self._runner() if self._runner is not None else None
        batch = getattr(runner, "input_batch", None)
        req_ids = list(getattr(batch, "req_ids", []) or [])[:rows]
        if len(req_ids) != rows or any(r is None for r in req_ids):
            return list(range(rows))
        live = getattr(runner, "requests", None)
        if isinstance(live, dict):
            # requests of the last call that finished (drafted for or not)
            finished = sum(1 for key in self._last_ids if key not in live)
            self._finished_now = finished > 0
            if finished:  # the requests held that finished (a preempted request stays in runner.requests)
                for key in [k for k in {**self._held, **self.states} if not isinstance(k, int) and k not in live]:
                    self._finish(key)
            ended = [self._left[k] <= 0 for k in self._last_ids if k not in live and k in self._left]
            self.turnover.endings(sum(ended), len(ended) - sum(ended))  # at max_tokens: none left at the end
            joined = set(req_ids).difference(self._last_ids)
            going_on, self._stats_asked = len(req_ids) - len(joined), any(stats_asked(live.get(k)) for k in joined)
            self.turnover.observe(finished, len(req_ids) - going_on, going_on)
            if self.memory is not None:  # the runner's state of each request, for its answer when it finishes
                for key in req_ids:  # (an id the engine reuses is a new request: its new state)
                    request = live.get(key)
                    if request is not None and self._held.get(key) is not request:
                        self._held[key] = request
                while len(self._held) > self.config.max_requests:
                    del self._held[next(iter(self._held))]
        self._last_ids = req_ids
        return req_ids

    def _finish(self, key: Any) -> None:
        """Request ``key`` finished (gone from the runner's ``requests``): its state is freed, and
        its answer goes into the memory of answers: the whole output the runner holds for it, all
        its steps' tokens whether the proposer drafted for it or not, else its state's text as
        far as the proposer saw it (:meth:`~latticekit.drafting.chains.ChainDrafter.remember`)."""
        held, state = self._held.pop(key, None), self.states.pop(key, None)
        if state is not None:
            self.counters["requests_finished"] += 1
        if self.memory is None:
            return
        try:
            read = request_answer(held)
            if read is not None:
                self.memory.add(read[0], context=read[1])
                self.counters["answers_from_runner"] += 1
            elif state is not None:
                state.remember()
        except Exception as exc:  # ids not as vLLM's: this answer is not remembered
            self._failed("memory", exc)

    def _request(self, key: Any) -> Any:
        """The runner's state of request ``key`` (``CachedRequestState``), or None."""
        runner = self._runner() if self._runner is not None else None
        return getattr(runner, "requests", {}).get(key) if runner is not None and not isinstance(key, int) else None

    # -- never the engine's problem -------------------------------------------------------------

    def _failed(self, where: str, exc: BaseException) -> None:
        self.counters["errors"] += 1
        kind = f"{where}:{type(exc).__name__}"
        if kind not in self._logged:
            self._logged.add(kind)
            logger.error("latticekit vLLM proposer: %s failed, drafting nothing for it (logged once per kind):\n%s",
                         where, "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))

    def stats(self) -> dict[str, Any]:
        """The counters, the fitted step costs and the request states held."""
        a, b, c = self.costs.coefficients()
        memory = {} if self.memory is None else {"memory_tokens": len(self.memory), "memory_answers": self.memory.added}
        arms = {str(bucket): {arm: [round(o.rate, 3), o.steps] for arm, o in load.arms.items()}
                for bucket, load in sorted(self.loads.items())}
        # the load buckets' own fits where taken (:meth:`_coefficients`; elsewhere ``step_costs``)
        fits = {bucket: self._own_fit(bucket) for bucket in sorted(self.loads)}
        load_costs = {str(bucket): list(fit) for bucket, fit in fits.items() if fit is not None}
        # per load bucket (frugal): the share of steps drafted on, and the means (ms) it comes from
        frugal = {str(bucket): [round(load.share, 3), round(1e3 * load.saved, 3), round(1e3 * load.spent, 3)]
                  for bucket, load in sorted(self.loads.items()) if load.drafted}
        # per load bucket, per count of query tokens: its steps (decayed) and their mean ms (step_curve)
        curves = {str(bucket): {str(n): [w, round(1e3 * s, 2)] for n, (w, s) in load.curve.means().items()}
                  for bucket, load in sorted(self.loads.items())}
        return {**self.counters, "step_costs": [a, b, c], "load_step_costs": load_costs, "curves": curves,
                "frugal": frugal, "states": len(self.states), "pid": os.getpid(), "correction": self.correction,
                "arms": arms, **memory,
                "turnover": [round(self.turnover.replaced, 3), round(self.turnover.ended, 3), self.turnover.closed,
                             self.turnover.by_length]}

    def _write_stats(self, now: float, wait: bool = False) -> None:
        """The stats file, rewritten off the engine's thread; waited for (5 s at most) only where ``wait`` (the
        call's batch holds :func:`~latticekit.vllm.engine.engine_stats`' request): until stop 60 a call that learnt
        that requests finished waited, and stalled its engine for as long as the write took (2-19 ms, once 311 ms,
        in the benchmark's lockstep). Failed writes are counted here, at the call that waits or the next."""
        self._stats_written = now
        try:
            self._stats_writer = writer = self._stats_writer or LatestWriter(cast(str, self.config.stats))
            writer.put(json.dumps(self.stats()).encode(), wait=5.0 if wait else None)
            for exc in writer.failures():
                self._failed("stats", exc)
        except Exception as exc:
            self._failed("stats", exc)
