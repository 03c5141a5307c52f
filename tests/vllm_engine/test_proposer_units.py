"""latticekit's vLLM proposer without an engine: the batch's chain lengths against brute force,
the step-cost fit, per-request chains, the configuration's errors, and a batch of rows driven
through ``propose`` as vLLM's runner calls it (its buffers: numpy rows of prompt and output)."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Optional

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from latticekit.drafting.arms import PROBE_BUDGET
from latticekit.drafting.calibration import AcceptanceModel
from latticekit.drafting.chains import (BatchCosts, ChainDrafter, CostFit, StepCurve, allocate, allocate_curve,
                                       allocate_prices, curve_seconds)
from latticekit.drafting.drafters.ngram import uniform_lm
from latticekit.errors import ProposerConfigError
from latticekit.lattice import SausageLattice
from latticekit.vllm import ENV, LATTICE_PROPOSER, LatticeProposer, NGramProposer, ProposerConfig, speculative_config
from latticekit.vllm.engine import attended_keys
from latticekit.vllm.lattice import hidden_rows
from latticekit.vllm.config import ARMS
from latticekit.vllm.loads import WARMUP_ORDER, Load, Turnover, closed_values, ending_rows, load_bucket
from latticekit.vllm.proposer import LEVELS, _Step
from vllm_helpers import engine_config, rss_mb

ARPA = Path(__file__).resolve().parents[1] / "data" / "words-small-katz2.arpa.gz"
#: The n-gram proposer's arms: every level of aggressiveness and plain steps (``text`` is the lattice proposer's).
LEVEL_ARMS = tuple(arm for arm in ARMS if arm != "text")


def objective(probabilities: list[np.ndarray], lengths: list[int], a: float, b: float, overhead: float,
              weights: Optional[list[float]] = None, values: Optional[list[float]] = None) -> float:
    weights = [1.0] * len(probabilities) if weights is None else weights
    values = [1.0] * len(probabilities) if values is None else values
    expected = sum(v * (1 + float(p[:n].sum())) for p, n, v in zip(probabilities, lengths, values))
    return expected / (a + overhead + b * sum(w * (1 + n) for w, n in zip(weights, lengths)))


chains = st.lists(st.lists(st.floats(0.0, 1.0), max_size=4).map(lambda xs: np.sort(np.array(xs))[::-1]),
                  min_size=1, max_size=3)


@settings(max_examples=200, deadline=None)
@given(chains, st.floats(0.01, 1.0), st.floats(0.001, 0.5), st.floats(0.0, 0.2))
def test_allocate_maximises_tokens_per_second_like_brute_force(probabilities: list[np.ndarray], a: float, b: float,
                                                               overhead: float) -> None:
    got = allocate(probabilities, a, b, overhead)
    assert all(0 <= n <= len(p) for n, p in zip(got, probabilities))
    best = max(objective(probabilities, list(lengths), a, b, overhead)
               for lengths in itertools.product(*(range(len(p) + 1) for p in probabilities)))
    assert objective(probabilities, got, a, b, overhead) == pytest.approx(best, rel=1e-9, abs=1e-12)


@settings(max_examples=300, deadline=None)
@given(chains.flatmap(lambda ps: st.tuples(st.just(ps), st.lists(st.sampled_from([0.0, 0.5, 1.0, 3.0]) |
                                                                 st.floats(0.01, 10.0),
                                                                 min_size=len(ps), max_size=len(ps)))),
       st.floats(0.01, 1.0), st.floats(0.001, 0.5), st.floats(0.0, 0.2))
def test_allocate_with_a_price_per_row_maximises_tokens_per_second_like_brute_force(
        given_rows: tuple[list[np.ndarray], list[float]], a: float, b: float, overhead: float) -> None:
    """A row's draft token costs ``b`` times its weight (its context's keys priced in): the
    lengths are the brute force's best, and each level's lengths in one pass are allocate's."""
    probabilities, weights = given_rows
    got = allocate(probabilities, a, b, overhead, weights)
    assert all(0 <= n <= len(p) for n, p in zip(got, probabilities))
    best = max(objective(probabilities, list(lengths), a, b, overhead, weights)
               for lengths in itertools.product(*(range(len(p) + 1) for p in probabilities)))
    assert objective(probabilities, got, a, b, overhead, weights) == pytest.approx(best, rel=1e-9, abs=1e-12)
    for price, lengths in zip((b, 4 * b, 0.25 * b), allocate_prices(probabilities, a, [b, 4 * b, 0.25 * b], overhead,
                                                                    weights)):
        assert lengths == allocate(probabilities, a, price, overhead, weights)
    assert allocate(probabilities, a, b, overhead, [1.0] * len(probabilities)) == allocate(probabilities, a, b,
                                                                                          overhead)
    with pytest.raises(ValueError, match="weights"):
        allocate(probabilities, a, b, overhead, [-1.0] * len(probabilities))


@settings(max_examples=300, deadline=None)
@given(chains.flatmap(lambda ps: st.tuples(
    st.just(ps), st.lists(st.sampled_from([0.0, 1.0, 3.0]) | st.floats(0.0, 5.0), min_size=len(ps), max_size=len(ps)),
    st.lists(st.floats(0.01, 1.0), min_size=sum(len(p) for p in ps) + 1, max_size=sum(len(p) for p in ps) + 1))),
    st.floats(0.0, 0.2), st.sampled_from([1.0, 0.25, 4.0]), st.booleans())
def test_allocate_on_a_curve_of_step_seconds_maximises_value_per_second_like_brute_force(
        given_rows: tuple[list[np.ndarray], list[float], list[float]], overhead: float, price: float,
        valued: bool) -> None:
    """Where a step's seconds are a curve in its draft tokens (``steps[d]``, any shape: a CPU's
    blocks make one draft token dearer than three), the lengths are the brute force's best value
    per second; on a line, the greedy allocation's."""
    probabilities, values, steps = given_rows
    worth = values if valued else [1.0] * len(probabilities)

    def rate(lengths: list[int]) -> float:
        gained = sum(v * (1 + float(p[:n].sum())) for p, n, v in zip(probabilities, lengths, worth))
        return gained / curve_seconds(steps, sum(lengths), price, overhead)

    got = allocate_curve(probabilities, steps, [price], overhead, worth if valued else None)[0]
    assert all(0 <= n <= len(p) for n, p in zip(got, probabilities))
    best = max(rate(list(lengths)) for lengths in itertools.product(*(range(len(p) + 1) for p in probabilities)))
    assert rate(got) == pytest.approx(best, rel=1e-9, abs=1e-12)
    if valued:
        # a row worth nothing drafts only where its tokens make the step cheaper than without them
        useful = sum(n for n, v in zip(got, values) if v > 0)
        assert all(n == 0 for n, v in zip(got, values) if v == 0) or steps[sum(got)] < steps[useful]
    a, b, rows = steps[0], steps[-1] / 10, len(probabilities)  # a line: the greedy allocation's value per second
    line = [a + b * d for d in range(len(steps))]
    on_line = allocate_curve(probabilities, line, [1.0], overhead, worth)[0]
    greedy = allocate(probabilities, a - b * rows, b, overhead, None, worth)
    assert objective(probabilities, on_line, a - b * rows, b, overhead, None, worth) == pytest.approx(
        objective(probabilities, greedy, a - b * rows, b, overhead, None, worth), rel=1e-9, abs=1e-12)
    with pytest.raises(ValueError, match="steps"):
        allocate_curve(probabilities, steps[:-1], [price], overhead)
    with pytest.raises(ValueError, match="values"):
        allocate_curve(probabilities, steps, [price], overhead, [-1.0] * rows)


def test_a_step_curve_is_its_steps_mean_drawn_to_the_line() -> None:
    curve = StepCurve()
    assert curve.seconds(5, 0.04) == pytest.approx(0.04)  # a count never seen: the line's
    for _ in range(200):
        curve.add(2, 0.039)
        curve.add(4, 0.031)
    curve.add(0, 1.0)
    curve.add(3, float("nan"))
    curve.add(3, -1.0)  # no step
    assert set(curve.means()) == {2, 4}
    steps = (1 - StepCurve.decay ** 200) / (1 - StepCurve.decay)  # decayed: about 50
    assert curve.seconds(2, 0.033) == pytest.approx((steps * 0.039 + 3 * 0.033) / (steps + 3))  # mostly their mean
    assert curve.seconds(4, 0.035) == pytest.approx((steps * 0.031 + 3 * 0.035) / (steps + 3))
    assert curve.means()[2][1] == pytest.approx(0.039)
    fresh = StepCurve()
    fresh.add(2, 0.05)  # one step against the line's three
    assert fresh.seconds(2, 0.03) == pytest.approx((0.05 + 3 * 0.03) / 4)
    assert fresh.between(1, 3, 0.02, 0.01) == [0.03, pytest.approx((0.05 + 3 * 0.04) / 4), pytest.approx(0.05)]


def test_a_step_curve_drafts_the_lengths_that_pay_where_a_line_does_not() -> None:
    """One request copying its prompt (with a twentieth of its tokens changed), its step 100 ms
    with no draft or two to four, 150 ms with one, and 50 ms more per token past four (a CPU's
    blocks): the curve learns which lengths pay and never drafts one token, where the line fitted
    to the same steps prices every token alike and mostly stops drafting: twice the tokens a second."""
    def seconds(tokens: int) -> float:
        return 0.15 if tokens == 2 else 0.1 + 0.05 * max(0, tokens - 5)

    rates: dict[bool, float] = {}
    lengths: dict[bool, list[int]] = {}
    for curved in (True, False):
        proposer = NGramProposer(engine_config(k=8, max_model_len=4096, vocab=1000),
                                 ProposerConfig(step_curve=curved, arms=["model"]))
        clock = proposer.clock = Clock()
        drafted: list[int] = []
        emitted: list[int] = []
        real = proposer.propose

        def logged(sampled: list[list[int]], *args: Any, **kwargs: Any) -> list[list[int]]:
            out = real(sampled, *args, **kwargs)
            drafted.append(len(out[0]))
            emitted.append(len(sampled[0]))
            return out

        proposer.propose = logged  # type: ignore[method-assign]
        rng = np.random.default_rng(0)
        copy = [int(t) for _ in range(30) for t in np.where(rng.random(60) < 0.05, rng.integers(0, 99, 60),
                                                             np.arange(100, 160))]
        drive(proposer, [copy], 70, 150, 0.0, 0.0, clock, seconds)
        # the last 100 steps: the tokens each emitted (told at the next call) over their seconds
        rates[curved] = sum(emitted[51:]) / sum(seconds(1 + n) for n in drafted[50:-1])
        lengths[curved] = drafted[50:]
    assert lengths[True].count(1) == 0 and lengths[False].count(0) > 50
    assert rates[True] > 1.5 * rates[False]


@settings(max_examples=300, deadline=None)
@given(chains.flatmap(lambda ps: st.tuples(st.just(ps), st.lists(st.sampled_from([0.0, 0.2, 1.0, 4.0]) |
                                                                 st.floats(0.0, 5.0),
                                                                 min_size=len(ps), max_size=len(ps)))),
       st.floats(0.01, 1.0), st.floats(0.001, 0.5), st.floats(0.0, 0.2), st.sampled_from([None, [0.5, 2.0, 1.0]]))
def test_allocate_with_a_value_per_row_maximises_value_per_second_like_brute_force(
        given_rows: tuple[list[np.ndarray], list[float]], a: float, b: float, overhead: float,
        weights: Optional[list[float]]) -> None:
    """A row's tokens worth ``values[i]`` each (a closed batch's rows: ``closed_values``): the
    lengths are the brute force's best for the value per second, at each price in one pass."""
    probabilities, values = given_rows
    weights = None if weights is None else weights[:len(probabilities)]
    got = allocate(probabilities, a, b, overhead, weights, values)
    best = max(objective(probabilities, list(lengths), a, b, overhead, weights, values)
               for lengths in itertools.product(*(range(len(p) + 1) for p in probabilities)))
    assert objective(probabilities, got, a, b, overhead, weights, values) == pytest.approx(best, rel=1e-9, abs=1e-12)
    assert all(n == 0 for n, v in zip(got, values) if v == 0)  # a row worth nothing drafts nothing
    for price, lengths in zip((b, 4 * b), allocate_prices(probabilities, a, [b, 4 * b], overhead, weights, values)):
        assert lengths == allocate(probabilities, a, price, overhead, weights, values)
    ones = [1.0] * len(probabilities)
    assert allocate(probabilities, a, b, overhead, weights, ones) == allocate(probabilities, a, b, overhead, weights)
    for bad in ([-1.0] * len(probabilities), [float("nan")] * len(probabilities), ones + [1.0]):
        with pytest.raises(ValueError, match="values"):
            allocate(probabilities, a, b, overhead, weights, bad)


@settings(max_examples=200, deadline=None)
@given(chains, st.floats(0.01, 1.0), st.lists(st.sampled_from([0.0, 0.001, 0.01, 0.05, 0.5]) | st.floats(0.001, 0.5),
                                              min_size=1, max_size=4), st.floats(0.0, 0.2))
def test_allocate_at_several_prices_in_one_pass_is_the_best_at_each(probabilities: list[np.ndarray], a: float,
                                                                    prices: list[float], overhead: float) -> None:
    got = allocate_prices(probabilities, a, prices, overhead)
    assert len(got) == len(prices)
    for b, lengths in zip(prices, got):
        assert lengths == allocate(probabilities, a, b, overhead)  # the levels do not disturb each other
        if b == 0:
            assert lengths == [len(p) for p in probabilities]
            continue
        best = max(objective(probabilities, list(other), a, b, overhead)
                   for other in itertools.product(*(range(len(p) + 1) for p in probabilities)))
        assert objective(probabilities, lengths, a, b, overhead) == pytest.approx(best, rel=1e-9, abs=1e-12)


def test_drafts_shrink_as_the_batch_grows() -> None:
    chain = np.array([0.9, 0.8, 0.6, 0.4, 0.2])
    a, b = 0.1, 0.015  # vLLM CPU, SmolLM2: a step ~0.1 s, a query token ~15 ms
    one = allocate([chain], a, b)[0]
    many = allocate([chain] * 16, a, b)
    assert one >= 3 and max(many) < one
    assert allocate([np.array([0.3, 0.1])] * 16, a, b) == [0] * 16
    assert allocate([chain], a, 0.0) == [5]  # drafts that cost nothing: all of them


def test_batch_costs_recover_a_linear_step_and_skip_idle_gaps() -> None:
    costs = BatchCosts()
    assert costs.coefficients() == (0.0, 0.0, 0.0)
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(1, 40))
        costs.add(n, 0.05 + 0.004 * n + rng.normal(0, 0.0005))
    costs.add(3, 30.0)  # the engine sat idle between requests: not a step's cost
    a, b, c = costs.coefficients()
    assert a == pytest.approx(0.05, rel=0.05) and b == pytest.approx(0.004, rel=0.05) and c == 0
    flat = BatchCosts(prior_ratio=0.1)
    for _ in range(20):
        flat.add(1, 0.11)  # one size only: b from the prior ratio
    assert flat.coefficients() == pytest.approx((0.1, 0.01, 0.0)) and not flat.fitted
    busy = BatchCosts()
    for n in range(16, 60):  # all per token, a little under the line through the origin at the small end
        busy.add(n, 0.015 * n - (0.01 if n < 20 else 0.0))
    assert busy.fitted and busy.coefficients() == pytest.approx((0.0, 0.0148, 0.0), abs=2e-4)  # refitted through 0


def test_batch_costs_recover_from_a_fit_that_went_wrong() -> None:
    """Four noisy first steps put the line through the origin (its intercept came out < 0), so it
    predicts a one-token step at a fifth of its cost: the steps that follow are no idle gaps
    (they are not 4 times the steps' mean), so they are learnt and the fit recovers."""
    costs = BatchCosts()
    for tokens, seconds in ((1, 0.02), (9, 0.3), (5, 0.15), (3, 0.09)):
        costs.add(tokens, seconds)
    assert costs.coefficients().a == 0 and costs.seconds(1) < 0.04
    for step in range(60):
        costs.add(1 + step % 4, 0.15 + 0.004 * (step % 4))
    assert costs.samples == 64 and costs.coefficients().a > 0.12
    assert costs.idle(1, 30.0)  # the engine sat idle: still left out


def test_steps_whose_sizes_cost_less_than_their_noise_take_the_prior_not_the_origin() -> None:
    """vLLM at one request on chat (stop 46, a step log): a step of three query tokens (34 ms)
    happened to be quicker than the one-token steps around it (34-43 ms), so a token's fitted
    price came out below 0. A fit through the origin then priced a token at 14-31 ms, a whole
    step, and the proposer drafted nothing more for the rest of the domain (0.99x no
    speculation; the same proposer that fitted otherwise ran at 1.27x). The prior's price
    (a sixteenth of the step) is taken instead, and the proposer drafts."""
    log = [(1, 35.8), (3, 33.9), (1, 38.5), (1, 40.7), (1, 42.6), (1, 42.4), (1, 34.2), (1, 38.8), (1, 41.9),
           (1, 35.3), (1, 38.8), (1, 35.6), (1, 37.6), (1, 34.0), (1, 36.2), (1, 39.9), (1, 34.3), (5, 37.4)]
    costs = BatchCosts()
    for tokens, ms in log:
        costs.add(tokens, ms / 1e3)
        a, b, _ = costs.coefficients()
        assert a > 0.03 and b == pytest.approx(a / 16)  # the prior's, never a whole step a token
    assert not costs.fitted
    proposer = NGramProposer(engine_config(k=8, max_model_len=256), ProposerConfig())
    proposer.costs = costs
    batch = Batch(1, 256)
    batch.put(0, [5, 6, 7, 8, 9] * 8)
    assert proposer.propose([[9]], batch.lengths, batch.ids)[0][:3] == [5, 6, 7]


def test_batch_costs_price_a_token_by_the_keys_it_attends_where_contexts_vary() -> None:
    """Steps of one request at contexts from 64 to 1,536 tokens, a draft token costing 2 ms plus
    3 µs a key (vLLM's CPU build measured about that, benchmarks/vllm_draft_cost.py): the fit
    finds both; at one context alone it cannot tell them apart and prices the token there."""
    rng = np.random.default_rng(1)
    costs, one = BatchCosts(), BatchCosts()
    for _ in range(400):
        context, tokens = int(rng.integers(64, 1536)), int(rng.integers(1, 9))
        keys = tokens * context
        costs.add(tokens, 0.07 + 0.002 * tokens + 3e-6 * keys + rng.normal(0, 0.002), keys)
        one.add(tokens, 0.07 + 0.002 * tokens + 3e-6 * tokens * 1000 + rng.normal(0, 0.002), tokens * 1000)
    a, b, c = costs.coefficients()
    assert a == pytest.approx(0.07, rel=0.05) and b == pytest.approx(0.002, rel=0.15) and c == pytest.approx(3e-6,
                                                                                                            rel=0.1)
    assert costs.seconds(4, 4 * 1500) == pytest.approx(0.07 + 0.008 + 0.018, rel=0.02)
    a, b, c = one.coefficients()  # one context: a token's price there, one number
    assert a == pytest.approx(0.07, rel=0.05) and (b + c * 1000) == pytest.approx(0.005, rel=0.05)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.integers(0, 3000), st.floats(0.001, 1.0)), min_size=3, max_size=30),
       st.floats(0.9, 1.0))
def test_batch_costs_are_the_least_squares_the_brute_force_finds(steps: list[tuple[int, int, float]],
                                                                 decay: float) -> None:
    """Against every subset of the columns fitted afresh from the raw steps (weighted least
    squares, numpy's lstsq): the fit is the one of lowest information criterion among those
    whose coefficients are all >= 0 (within rounding) and price a token or a key, those with
    the fixed part first (through the origin only where none of them is and none finds a token
    and a key free or cheaper), or None where the steps do not vary in size or no such fit exists."""
    costs = BatchCosts(decay=decay, idle_factor=float("inf"))
    for tokens, context, seconds in steps:
        costs.add(tokens, seconds, tokens * context)
    n = len(steps)
    weight = decay ** np.arange(n - 1, -1, -1)
    x = np.array([[1.0, t, t * ctx * 1e-3] for t, ctx, _ in steps])
    y = np.array([s for _, _, s in steps])
    w = weight.sum()
    if (weight @ x[:, 1] ** 2) / w - ((weight @ x[:, 1]) / w) ** 2 <= 0.25:
        assert costs.fit() is None
        return
    root = np.sqrt(weight)
    floor = 1e-12 * max(float(weight @ y ** 2), 1e-30)
    found: list[tuple[float, np.ndarray]] = []
    free = False
    for face in ((0, 1, 2), (0, 1), (0, 2), (1, 2), (1,), (2,)):
        if (found or free) and 0 not in face:
            break  # through the origin only where no fit with the fixed part is feasible, nor finds sizes free
        cols = x[:, list(face)]
        gram = (cols * weight[:, None]).T @ cols
        if abs(np.linalg.det(gram)) < 1e-10 * np.prod(np.diag(gram)):
            continue  # collinear columns (Hadamard's ratio): another subset fits the same
        beta = np.linalg.lstsq(cols * root[:, None], y * root, rcond=None)[0]
        share = beta * (weight @ cols) / w  # each column's share of the mean step
        tol = 1e-9 * float(weight @ y) / w
        if 0 in face and 1 in face and share[0] >= -tol and all(x <= tol for x, col in zip(share, face) if col):
            free = True  # a token and a key free, or cheaper than free: no fit through the origin
        if np.any(share < -tol) or sum(x for x, col in zip(share, face) if col) <= tol:
            continue
        beta = np.maximum(beta, 0.0)
        rss = max(float(weight @ (y - cols @ beta) ** 2), floor)
        full = np.zeros(3)
        full[list(face)] = beta
        found.append((w * np.log(rss / w) + len(face) * np.log(max(w, 2.0)), full))
    got = costs.fit()
    if not found:
        assert got is None
        return
    scores = sorted(score for score, _ in found)
    if len(scores) > 1 and scores[1] - scores[0] < 1e-6 * max(1.0, abs(scores[0])):
        return  # two fits as good: either may be taken
    best = min(found, key=lambda item: item[0])[1]
    assert got is not None
    assert np.array(got) == pytest.approx(best * np.array([1, 1, 1e-3]), rel=1e-5, abs=1e-9)


def test_step_costs_are_fitted_per_load_where_the_engine_is_no_one_line() -> None:
    proposer = NGramProposer(engine_config(), ProposerConfig())
    rng = np.random.default_rng(0)

    def step(rows: int, tokens: int, seconds: float) -> None:
        proposer._last_end, proposer._verify_tokens = 0.0, tokens
        proposer._learn(_Step(load_bucket(rows), "plain", 0.0, 0.0, {}), seconds, [[1]] * rows, list(range(rows)),
                        tokens=tokens)

    for _ in range(150):
        one = int(rng.integers(1, 8))
        step(1, one, 0.12 + 0.001 * one)  # one request: reading the weights dominates
        busy = int(rng.integers(16, 60))
        step(16, busy, 0.05 + 0.012 * busy)  # 16 requests: every token adds its compute
    assert proposer._coefficients(load_bucket(16)) == pytest.approx((0.05, 0.012, 0.0))  # the busy steps' own line
    assert proposer._coefficients(1) == pytest.approx((0.12, 0.001, 0.0))  # and one request's own
    a, b, _ = proposer.costs.coefficients()  # the fit over every load: neither
    assert b > 2 * 0.001 and a < 0.12 - 0.02
    for _ in range(20):  # two requests, always the same size of step: no line of their own; the price of a
        step(2, 2, 0.13)  # token over every load, through their mean step (without load_spread: the fit over all)
    assert not proposer.loads[load_bucket(2)].costs.fitted
    b = proposer.costs.coefficients().b
    assert proposer._coefficients(load_bucket(2)) == pytest.approx((0.13 - 2 * b, b, 0.0))
    assert proposer.stats()["load_step_costs"] == {"1": pytest.approx([0.12, 0.001, 0.0]),
                                                   "2": pytest.approx([0.13 - 2 * b, b, 0.0]),
                                                   "5": pytest.approx([0.05, 0.012, 0.0])}
    # three requests whose steps' seconds hide their tokens' slope in noise (a token cheaper than
    # free): the bucket has no fit of its own (before stop 46 its fit went through the origin, a
    # step all per token, ~43 ms a token); the price over every load, through their mean step
    for _ in range(60):
        tokens = int(rng.integers(3, 6))
        step(3, tokens, 0.13 + float(rng.normal(0, 0.01)) - 0.004 * (tokens - 3))
    assert proposer.loads[load_bucket(3)].costs.fit() is None
    assert proposer._coefficients(load_bucket(3))[1:] == pytest.approx((proposer.costs.coefficients().b, 0.0))
    own = NGramProposer(engine_config(), ProposerConfig(load_spread=None))  # the bucket's own fit alone
    own.loads, own.costs = proposer.loads, proposer.costs
    assert own._coefficients(load_bucket(3)) == own._coefficients(load_bucket(2)) == proposer.costs.coefficients()
    assert set(own.stats()["load_step_costs"]) == {"1", "5"}  # the stats show the fits taken


def test_a_loads_price_of_a_token_is_drawn_to_the_fit_over_every_load_as_far_as_its_steps_leave_it_open() -> None:
    rng = np.random.default_rng(1)
    prior = CostFit(0.03, 0.002)

    def costs(sizes: list[int], slope: float, noise: float) -> BatchCosts:
        fit = BatchCosts()
        for n in sizes:
            fit.add(n, 0.025 + slope * n + float(rng.normal(0, noise)))
        return fit

    wide = list(rng.integers(4, 40, 200))
    exact = costs(wide, 0.004, 0.0).drawn_to(prior)  # exact steps of many sizes: their own slope
    assert exact is not None and exact[:2] == pytest.approx((0.025, 0.004))
    fit = costs(list(rng.integers(4, 7, 200)), 0.004, 0.004).drawn_to(prior)  # noisy, of a few sizes: between
    assert fit is not None and 0.002 < fit.b < 0.004
    assert costs(wide, 0.004, 0.004).drawn_to(prior).b == pytest.approx(0.004, rel=0.15)  # many sizes: its own
    same = costs([5] * 50, 0.004, 0.0).drawn_to(prior)  # one size: the prior's price, through the mean step
    assert same is not None and same[:2] == pytest.approx((0.045 - 5 * 0.002, 0.002))
    falling = costs(wide, -0.0002, 0.0).drawn_to(CostFit(0.03, 0.0002))  # a token cheaper than free: the prior's
    assert falling is not None and falling.b == 0.0002
    assert costs([5], 0.004, 0.0).drawn_to(prior) is None  # one step
    assert costs(wide, 0.004, 0.0).drawn_to(CostFit(0.03, 0.0)) is None  # no price to be drawn to
    assert costs([40] * 50, 0.004, 0.0).drawn_to(CostFit(0.0, 0.01)) is None  # a fixed part below 0
    with pytest.raises(ProposerConfigError, match="load_spread"):
        ProposerConfig(load_spread=0)


def test_chain_drafter_follows_the_repeated_text_and_learns() -> None:
    acceptance = AcceptanceModel.prior(trust="cache")
    drafter = ChainDrafter(None, 100, acceptance, candidates=16, max_depth=6)
    text = [5, 6, 7, 8, 9] * 6 + [5, 6]
    drafter.observe(np.array(text))
    tokens, prob = drafter.propose(4)
    assert tokens.tolist() == [7, 8, 9, 5] and np.all(np.diff(prob) <= 0) and prob[0] > 0.5
    before = acceptance.weights.copy()
    drafter.observe(np.array(text + [7, 8, 9, 5, 6]))  # the candidates are labelled: the model learns
    assert not np.array_equal(before, acceptance.weights)
    assert drafter.propose(0)[0].size == 0


def test_config_errors_name_the_problem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ProposerConfigError, match="unknown keys \\['beam'\\]"):
        ProposerConfig.from_dict({"beam": 4})
    with pytest.raises(ProposerConfigError, match="candidates must be an integer"):
        ProposerConfig(candidates=0)
    with pytest.raises(ProposerConfigError, match="does not exist"):
        speculative_config(8, lm=str(tmp_path / "missing.arpa"))
    with pytest.raises(ProposerConfigError, match="step_costs"):
        ProposerConfig.from_dict({"step_costs": [0, 1]})
    for budget in (0, -0.1, 1.5, True, float("nan"), "0.02"):
        with pytest.raises(ProposerConfigError, match="probe_budget must be a number in"):
            ProposerConfig.from_dict({"probe_budget": budget})
    assert ProposerConfig.from_env({ENV: ProposerConfig(probe_budget=0.08).to_json()}).probe_budget == 0.08
    with pytest.raises(ProposerConfigError, match="context_costs must be true or false"):
        ProposerConfig.from_dict({"context_costs": "yes"})
    with pytest.raises(ProposerConfigError, match="frugal must be true or false"):
        ProposerConfig.from_dict({"frugal": 1})
    for arms in ([], ["fast"], ["model", "model"], "model", [1]):
        with pytest.raises(ProposerConfigError, match="arms must be a list of distinct names among"):
            ProposerConfig.from_dict({"arms": arms})
    assert ProposerConfig.from_dict({"arms": ["plain", "model"]}).arms == ("model", "plain")  # in ARMS' order
    assert ProposerConfig.from_env({ENV: ProposerConfig(arms=("lean", "plain")).to_json()}).arms == ("lean", "plain")
    with pytest.raises(ProposerConfigError, match="not valid JSON"):
        ProposerConfig.from_env({ENV: "{nope"})
    with pytest.raises(ProposerConfigError, match="cannot be read"):
        ProposerConfig.from_env({ENV: str(tmp_path / "none.json")})
    (tmp_path / "c.json").write_text(json.dumps({"candidates": 8, "lm": str(ARPA)}))
    assert ProposerConfig.from_env({ENV: str(tmp_path / "c.json")}) == ProposerConfig(candidates=8, lm=str(ARPA))
    monkeypatch.delenv(ENV, raising=False)
    spec = speculative_config(5, max_depth=4, step_costs=[0.1, 0.01])
    assert spec == {"method": "custom_class", "model": "latticekit.vllm.NGramProposer", "num_speculative_tokens": 5}
    import os

    assert ProposerConfig.from_env() == ProposerConfig(max_depth=4, step_costs=(0.1, 0.01))
    assert json.loads(os.environ[ENV]) == {"max_depth": 4, "step_costs": [0.1, 0.01]}


def test_plain_steps_prepare_a_step_without_drafts_without_speculation_and_leave_the_rest() -> None:
    from latticekit.vllm.engine import plain_steps

    runner, counted = Runner(), []
    assert plain_steps(runner, SimpleNamespace(is_hybrid=False), lambda: counted.append(1))
    assert not plain_steps(runner, SimpleNamespace())  # once per runner
    drafts = SimpleNamespace(scheduled_spec_decode_tokens={"a": [], "b": [5, 6]})
    none = SimpleNamespace(scheduled_spec_decode_tokens={"a": []})
    assert runner._prepare_inputs(drafts)[1] == "metadata" and runner._prepare_inputs(none)[1] is None
    assert runner.read == ["spec", None] and runner.speculative_config == "spec" and counted == [1]
    with pytest.raises(RuntimeError, match="prepare failed"):  # the runner's own error, its configuration put back
        runner._prepare_inputs(none, fail=True)
    assert runner.speculative_config == "spec" and counted == [1]
    for flag in ("is_hybrid", "has_inner_state", "is_attention_free"):  # recurrent state: vLLM's own path always
        kept = Runner()
        assert not plain_steps(kept, SimpleNamespace(**{flag: True}))
        assert kept._prepare_inputs(none)[1] == "metadata"
    assert not plain_steps(None, SimpleNamespace())
    unspeculative = Runner()
    unspeculative.speculative_config = None
    assert not plain_steps(unspeculative, SimpleNamespace())
    with pytest.raises(ProposerConfigError, match="plain_steps must be true or false"):
        ProposerConfig.from_dict({"plain_steps": "no"})


class Batch:
    """vLLM's per-row buffers: ``token_ids_cpu`` (max rows x max length) and lengths."""

    def __init__(self, rows: int = 4, max_model_len: int = 64) -> None:
        self.ids = np.zeros((rows, max_model_len), dtype=np.int32)
        self.lengths = np.zeros(rows, dtype=np.int32)

    def put(self, row: int, tokens: list[int]) -> None:
        self.ids[row, :len(tokens)] = tokens
        self.lengths[row] = len(tokens)


def test_propose_drafts_each_row_within_bounds_and_follows_rows() -> None:
    proposer = NGramProposer(engine_config(), ProposerConfig(step_costs=(0.1, 0.0)))
    batch = Batch()
    text = [5, 6, 7, 8, 9] * 5
    batch.put(0, text)
    batch.put(1, [1, 2, 3])
    out = proposer.propose([[9], [3]], batch.lengths, batch.ids)
    assert out[0] == [5, 6, 7, 8] and len(out) == 2  # K = 4 bounds the chain
    assert proposer.propose([[9], []], batch.lengths, batch.ids)[1] == []  # nothing sampled: a prefill chunk
    batch.put(0, [1, 2, 3, 1, 2])  # another request took row 0: its state starts afresh
    assert proposer.propose([[2]], batch.lengths[:1], batch.ids[:1]) == [[3, 1, 2, 3]]
    near_end = Batch(1, 64)
    near_end.put(0, ([5, 6, 7, 8, 9] * 13)[:62])
    assert len(proposer.propose([[6]], near_end.lengths, near_end.ids)[0]) <= 1  # max_model_len bounds it
    assert proposer.stats()["errors"] == 0
    assert set(proposer.acceptance.models) == {"text", "memory"}  # estimates per candidate source
    alone = NGramProposer(engine_config(), ProposerConfig(step_costs=(0.1, 0.0), memory_tokens=0))
    assert set(alone.acceptance.models) == {"text"}


def test_an_exception_becomes_empty_drafts_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    proposer = NGramProposer(engine_config(), ProposerConfig(step_costs=(0.1, 0.0)))
    batch = Batch()
    batch.put(0, [5, 6, 7] * 5)
    batch.put(1, [5, 6, 7] * 5)
    bad = np.full((2, 20), np.nan, dtype=np.float32)  # a buffer of no token ids
    with caplog.at_level("ERROR", logger="latticekit.vllm"):
        assert proposer.propose([[7], [7]], np.array([15, 15]), bad) == [[], []]
        # and it recovers at once
        recovered = [proposer.propose([[7], [7]], batch.lengths, batch.ids)[0] for _ in range(3)]
        assert proposer.propose([[7], [7]], np.array([15, 15]), bad) == [[], []]  # the same kind again
    assert recovered == [[5, 6, 7, 5]] * 3
    assert proposer.stats()["errors"] == 4 and len(caplog.records) == 1 and "row" in caplog.records[0].message


def test_drafts_nothing_where_drafts_do_not_repay_themselves() -> None:
    # a step of 0.1 s and 0.2 s per query token: only near-certain drafts would pay, and a third is not
    proposer = NGramProposer(engine_config(), ProposerConfig(step_costs=(0.1, 0.2)))
    batch = Batch()
    batch.put(0, [1, 2, 3, 1, 2, 4, 1, 2, 5, 1, 2])
    calls = [proposer.propose([[2]], batch.lengths[:1], batch.ids[:1]) for _ in range(12)]
    assert calls == [[[]]] * 12
    assert proposer.counters["proposed_tokens"] > 0  # it looked


def test_a_model_over_other_token_ids_is_refused_at_start() -> None:
    with pytest.raises(ProposerConfigError, match="outside the model's vocabulary"):
        NGramProposer(engine_config(vocab=5), ProposerConfig(lm="embedded"))  # SmolLM2's token ids


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 5)), min_size=1, max_size=12))
def test_hidden_rows_find_each_requests_last_emitted_token_like_a_plain_layout(rows: list[tuple[int, int]]) -> None:
    # a request that verified d drafts emits between 1 and d + 1 tokens (none: a prefill chunk)
    emitted = [min(n, d + 1) for n, d in rows]
    drafts = [d for _, d in rows]
    layout = [(i, j) for i, d in enumerate(drafts) for j in range(d + 1)]  # one state per logits position
    want = [layout.index((i, n - 1)) if n else -1 for i, n in enumerate(emitted)]
    assert hidden_rows(emitted, drafts) == want


def test_lattice_settings_are_checked_and_name_the_lattice_proposer(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    for bad, match in (({"k": 0}, "k must be"), ({"p": -1}, "p must be"), ({"alpha": -1}, "alpha"),
                       ({"alpha": float("nan")}, "alpha"), ({"check_hidden": "yes"}, "check_hidden"),
                       ({"heads": str(tmp_path / "missing")}, "does not exist"), ({"heads": ""}, "heads"),
                       ({"text_first": 0}, "text_first"), ({"text_first": 1.5}, "text_first"),
                       ({"text_first": True}, "text_first"), ({"text_first": "0.5"}, "text_first"),
                       ({"heads_depth": 0}, "heads_depth"), ({"heads_depth": 2.5}, "heads_depth")):
        with pytest.raises(ProposerConfigError, match=match):
            ProposerConfig.from_dict(bad)
    heads = tmp_path / "heads.safetensors"
    heads.write_bytes(b"")  # read when the engine loads its model, not here
    assert speculative_config(4, heads=str(heads))["model"] == LATTICE_PROPOSER
    with pytest.raises(ProposerConfigError, match="LatticeProposer"):
        NGramProposer(engine_config(), ProposerConfig(heads=str(heads)))
    with pytest.raises(ProposerConfigError, match="NGramProposer"):
        LatticeProposer(engine_config(), ProposerConfig())


def test_a_confident_lattice_leads_the_chain_where_the_text_knows_nothing() -> None:
    drafter = ChainDrafter(None, 100, AcceptanceModel.prior(trust="head+cache"), candidates=8, max_depth=4)
    drafter.observe([5, 17, 42, 8])  # nothing repeats: the cache model knows nothing
    tokens = np.array([[8, 0], [61, 62], [63, 64], [65, 66]], dtype=np.int32)
    scores = np.array([[0, 0], [-0.01, -5], [-0.02, -5], [-0.03, -5]], dtype=np.float32)
    lattice = SausageLattice(tokens, scores, np.array([1, 2, 2, 2], dtype=np.int32))
    chain, probability = drafter.propose_lattice(3, lattice, uniform_lm(), p=4, alpha=0.0)
    assert chain.tolist() == [61, 63, 65]
    assert np.all(np.diff(probability) <= 0) and probability[0] > 0.5
    short, _ = drafter.propose_lattice(2, lattice, uniform_lm(), p=4, alpha=0.0)
    assert short.tolist() == [61, 63]  # rows past max_length are not read


class Runner:
    """What the proposer reads of vLLM's model runner: each row's request id and the live
    requests (with their prompts); and what :func:`~latticekit.vllm.engine.plain_steps` changes
    of it: its ``speculative_config`` and ``_prepare_inputs`` (here recording the configuration
    it read, and failing where told)."""

    def __init__(self) -> None:
        self.input_batch = SimpleNamespace(req_ids=[])
        self.requests: dict[str, Any] = {}
        self.speculative_config: Any = "spec"
        self.read: list[Any] = []

    def _prepare_inputs(self, scheduler_output: Any, fail: bool = False) -> tuple[Any, ...]:
        self.read.append(self.speculative_config)
        if fail:
            raise RuntimeError("prepare failed")
        return ("logits", None if self.speculative_config is None else "metadata", 1)


def test_finished_answers_feed_the_engines_memory() -> None:
    import weakref

    proposer = NGramProposer(engine_config(), ProposerConfig(step_costs=(0.1, 0.0), memory_tokens=64))
    runner = Runner()
    proposer._runner = weakref.ref(runner)
    batch = Batch(1)
    runner.input_batch.req_ids, runner.requests = ["a"], {"a": SimpleNamespace(prompt_token_ids=[1, 2, 3])}
    batch.put(0, [1, 2, 3, 10, 11, 12, 13, 14])
    proposer.propose([[14]], batch.lengths, batch.ids)
    runner.input_batch.req_ids, runner.requests = ["b"], {"b": SimpleNamespace(prompt_token_ids=[4, 5, 6])}
    batch.put(0, [4, 5, 6, 10, 11])
    # "a"'s answer, not its prompt
    assert proposer.propose([[11]], batch.lengths, batch.ids) == [[12, 13, 14]]
    assert proposer.memory is not None and proposer.memory.answers == [(10, 11, 12, 13, 14)]
    # counted after its prompt's end: a request whose prompt ends as "a"'s matches it there
    assert proposer.memory.model.match([9, 2, 3, 10]) == 3 and proposer.memory.model.match([1, 2]) == 0
    assert proposer.stats()["memory_answers"] == 1 and proposer.stats()["errors"] == 0
    without = NGramProposer(engine_config(), ProposerConfig(step_costs=(0.1, 0.0), memory_tokens=0))
    assert without.memory is None and without.propose([[11]], batch.lengths, batch.ids) == [[]]  # b's text alone
    with pytest.raises(ProposerConfigError, match="memory_tokens"):
        ProposerConfig(memory_tokens=-1)
    for bad in (-1, 9, True, 2.0):
        with pytest.raises(ProposerConfigError, match="memory_context"):
            ProposerConfig(memory_context=bad)
    alone = NGramProposer(engine_config(), ProposerConfig(step_costs=(0.1, 0.0), memory_tokens=64, memory_context=0))
    runner.input_batch.req_ids, runner.requests = ["a"], {"a": SimpleNamespace(prompt_token_ids=[1, 2, 3])}
    alone._runner = weakref.ref(runner)
    batch.put(0, [1, 2, 3, 10, 11, 12, 13, 14])
    alone.propose([[14]], batch.lengths, batch.ids)
    runner.input_batch.req_ids, runner.requests = ["b"], {"b": SimpleNamespace(prompt_token_ids=[4, 5, 6])}
    batch.put(0, [4, 5, 6, 10, 11])
    alone.propose([[11]], batch.lengths, batch.ids)
    assert alone.memory is not None and alone.memory.answers == [(10, 11, 12, 13, 14)]
    assert alone.memory.model.match([9, 2, 3, 10]) == 1  # the answer alone, its prompt not read


def test_every_finished_answer_feeds_the_memory_whole_drafted_for_or_not() -> None:
    """The runner's state of a request holds its whole output; the proposer reads it as the
    request finishes: the answer of a request it never drafted for (no drafting at this load)
    goes in, and a drafted request's answer goes in with its last step's tokens, which no call
    showed; async scheduling's placeholders (-1) end what is known."""
    import weakref

    def request(prompt: list[int], output: list[int]) -> Any:
        return SimpleNamespace(prompt_token_ids=prompt, output_token_ids=output)

    for arms, drafted in ((["plain"], False), (["model"], True)):
        proposer = NGramProposer(engine_config(), ProposerConfig(memory_tokens=64, arms=arms))
        runner = Runner()
        proposer._runner = weakref.ref(runner)
        batch = Batch(2)
        a, b = request([1, 2, 3], [10, 11, 10, 11]), request([4, 5], [20])
        runner.input_batch.req_ids, runner.requests = ["a", "b"], {"a": a, "b": b}
        batch.put(0, [1, 2, 3, 10, 11, 10, 11])
        batch.put(1, [4, 5, 20])
        proposer.propose([[11], [20]], batch.lengths, batch.ids)
        assert bool(proposer.states) == drafted
        a.output_token_ids += [10, 99]  # the step that finished "a": shown to no call
        b.output_token_ids += [21, -1, -1]  # "b" goes on: async placeholders
        runner.input_batch.req_ids, runner.requests = ["b"], {"b": b}
        batch.put(0, [4, 5, 20, 21])
        proposer.propose([[21]], batch.lengths, batch.ids)
        assert proposer.memory is not None and proposer.memory.answers == [(10, 11, 10, 11, 10, 99)]
        runner.input_batch.req_ids, runner.requests = [], {}
        proposer.propose([], batch.lengths[:0], batch.ids[:0])
        assert proposer.memory.answers == [(10, 11, 10, 11, 10, 99), (20, 21)]
        assert proposer.memory.model.match([9, 2, 3, 10]) == 3  # counted after its prompt's end
        got = proposer.stats()
        assert got["answers_from_runner"] == 2 and got["errors"] == 0 and got["states"] == 0
        assert not proposer._held
    # an output not of token ids: that answer is left out, counted and logged, the call unharmed
    proposer = NGramProposer(engine_config(), ProposerConfig(memory_tokens=64, arms=["plain"]))
    runner = Runner()
    proposer._runner = weakref.ref(runner)
    runner.input_batch.req_ids, runner.requests = ["x"], {"x": request([1, 2], [5, "?"])}
    proposer.propose([[5]], batch.lengths[:1], batch.ids[:1])
    runner.input_batch.req_ids, runner.requests = [], {}
    assert proposer.propose([], batch.lengths[:0], batch.ids[:0]) == []
    assert proposer.stats()["errors"] == 1 and proposer.memory is not None and proposer.memory.answers == []


@settings(max_examples=60, deadline=None)
@given(st.integers(3, 12), st.integers(1, 30), st.integers(0, 12))
def test_no_draft_past_a_requests_max_tokens(prompt: int, max_tokens: int, output: int) -> None:
    import weakref

    text = ([5, 6, 7, 8, 9] * 20)[:prompt + output]
    batch = Batch(1, 128)
    batch.put(0, text)
    runner = Runner()
    runner.input_batch.req_ids = ["a"]
    runner.requests = {"a": SimpleNamespace(prompt_token_ids=text[:prompt], num_prompt_tokens=prompt,
                                            sampling_params=SimpleNamespace(max_tokens=max_tokens))}
    capped = NGramProposer(engine_config(k=8, max_model_len=128), ProposerConfig(step_costs=(0.1, 0.0)))
    capped._runner = weakref.ref(runner)
    got = capped.propose([[text[-1]]], batch.lengths, batch.ids)[0]
    left = max_tokens - output  # the step emits its accepted drafts and one token more
    assert len(got) <= max(left - 1, 0)
    # the same as an engine whose longest chain is the room the request has left
    alone = NGramProposer(engine_config(k=max(1, min(8, left - 1)), max_model_len=128),
                          ProposerConfig(step_costs=(0.1, 0.0)))
    assert got == (alone.propose([[text[-1]]], batch.lengths, batch.ids)[0] if left > 1 else [])
    assert capped.counters["rows_capped"] == (left - 1 < 8)
    del runner.requests["a"].sampling_params  # a runner that does not tell: no cap
    untold, free = (NGramProposer(engine_config(k=8, max_model_len=128), ProposerConfig(step_costs=(0.1, 0.0)))
                    for _ in range(2))
    untold._runner = weakref.ref(runner)
    assert untold.propose([[text[-1]]], batch.lengths, batch.ids) == free.propose([[text[-1]]], batch.lengths,
                                                                                  batch.ids)
    assert untold.counters["rows_capped"] == 0 and untold.counters["errors"] == 0


class Clock:
    """The proposer's clock, moved by the simulated engine: a step of n query tokens takes a + b n."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class TimedProposer(NGramProposer):
    """The n-gram proposer whose drafting takes 2 ms of the simulated clock per row drafted."""

    clock: Clock

    def _draft(self, state: ChainDrafter, index: int, room: int) -> tuple[np.ndarray, np.ndarray]:
        self.clock.now += 0.002
        return super()._draft(state, index, room)


def drive(proposer: NGramProposer, truths: list[list[int]], prompt: int, steps: int, a: float, b: float,
          clock: Clock, seconds: Optional[Callable[[int], float]] = None) -> list[str]:
    """``steps`` greedy steps of the rows whose whole texts are ``truths`` (the first ``prompt``
    tokens given), each step's seconds ``a + b * query tokens`` (or ``seconds(query tokens)``) on
    ``clock``: a step accepts the longest prefix of a row's draft that its text continues with,
    and one token more. Returns the arm of each step."""
    rows = len(truths)
    batch = Batch(rows, max(len(t) for t in truths) + 1)
    for r, text in enumerate(truths):
        batch.put(r, text[:prompt])
    drafts: list[list[int]] = [[] for _ in range(rows)]
    arms = []
    for _ in range(steps):
        tokens = rows + sum(len(d) for d in drafts)
        clock.now += seconds(tokens) if seconds is not None else a + b * tokens
        sampled = []
        for r, text in enumerate(truths):
            at = int(batch.lengths[r])
            accepted = 0
            while accepted < len(drafts[r]) and text[at + accepted] == drafts[r][accepted]:
                accepted += 1
            emitted = text[at:at + accepted + 1]
            batch.put(r, text[:at + len(emitted)])
            sampled.append(emitted)
        slots = {"layer": np.zeros(rows + sum(len(d) for d in drafts))}  # the step's query tokens
        drafts = proposer.propose(sampled, batch.lengths, batch.ids, slot_mappings=slots)
        assert proposer._pending is not None
        arms.append(proposer._pending[1])
    return arms


def test_outcomes_keep_plain_steps_under_load_probe_cheaply_and_draft_again_when_the_load_drops() -> None:
    rng = np.random.default_rng(0)
    proposer = TimedProposer(engine_config(k=6, max_model_len=4096, vocab=1000), ProposerConfig(arms=LEVEL_ARMS))
    clock = proposer.clock = Clock()
    # 16 requests whose drafts a step rarely accepts (random text), at 0.1 s + 10 ms a query token
    noise = [rng.integers(0, 40, 800).tolist() for _ in range(16)]
    busy = drive(proposer, noise, 64, 300, 0.1, 0.01, clock)
    late = busy[100:]
    assert late.count("plain") / len(late) >= 0.8  # the drafting arms are probed, not kept
    assert proposer.stats()["arms"]["5"]["plain"][1] >= 150
    # the load drops to one request copying its prompt: drafting wins within a few dozen steps
    copy = [list(range(100, 160)) * 12]
    quiet = drive(proposer, copy, 70, 60, 0.1, 0.01, clock)
    assert quiet[30:].count("plain") <= 6
    assert max(proposer.stats()["arms"]["1"][arm][0] for arm in ("model", "eager", "lean")) > \
        2 * proposer.stats()["arms"]["1"]["plain"][0]


@pytest.mark.parametrize("worse", [1, 4])
def test_the_probes_of_every_arm_that_is_not_the_best_lose_the_budget_together(worse: int) -> None:
    """One arm at three times the tokens per second of ``worse`` others (the lattice proposer's
    heads at 16 requests on a CPU: a step three times as long): after the warm-up the time the
    others' probes lose against the best's steps is at most the budget, all of them together
    (until stop 45 each arm had it: four arms lost about four times it), at the default budget
    and at another."""
    arms = ARMS if worse == 4 else ("model", "eager")
    rates = {arm: 1.0 for arm in arms}
    rates["plain" if worse == 4 else "model"] = 3.0
    for budget in (PROBE_BUDGET, 0.08):
        load = Load(1 / 16, arms, budget)
        lost = spent = 0.0
        for step in range(1, 6001):
            arm = load.choose()
            seconds = 1.0 / rates[arm]
            load.record(arm, 1, seconds)
            if step > 200:
                spent += seconds
                lost += seconds - 1.0 / max(rates.values())
        assert lost / spent <= 1.2 * budget
        assert lost / spent >= 0.5 * budget or worse == 1  # the probes do go on


def test_a_load_drafts_on_the_share_of_steps_its_drafting_repays() -> None:
    load = Load(1 / 16, ("model",))
    for _ in range(15):  # until 16 drafted steps tell, every step drafts
        assert load.drafts_now()
        load.drafted_step(0.001, 0.004)
    assert load.share == 1.0
    load.drafted_step(0.001, 0.004)
    assert load.share == pytest.approx(0.25)
    assert [load.drafts_now() for _ in range(12)] == [False, False, False, True] * 3
    for _ in range(200):
        load.drafted_step(-0.01, 0.004)  # chains expected to cost more than they save: nothing saved
    assert load.share == pytest.approx(1 / 8) and sum(load.drafts_now() for _ in range(64)) == 8
    for _ in range(200):
        load.drafted_step(0.02, 0.004)  # repaid five times over: every step
    assert load.share == 1.0 and all(load.drafts_now() for _ in range(20))


def test_frugal_skips_the_drafting_work_under_load_where_it_does_not_pay_and_not_where_it_does() -> None:
    rng = np.random.default_rng(0)
    config = engine_config(k=6, max_model_len=4096, vocab=1000)
    noise = [rng.integers(0, 40, 800).tolist() for _ in range(16)]  # drafts a step would rarely accept
    # the cost model alone (frugal's work apart from the plain arm's)
    frugal = TimedProposer(config, ProposerConfig(arms=["model"]))
    every = TimedProposer(config, ProposerConfig(arms=["model"], frugal=False))
    frugal.clock, every.clock = Clock(), Clock()
    # 16 requests at 0.1 s + 10 ms a query token, their drafting 2 ms a row: 32 ms a step
    busy = drive(frugal, noise, 64, 200, 0.1, 0.01, frugal.clock)
    assert drive(every, noise, 64, 200, 0.1, 0.01, every.clock).count("plain") == 0
    late = busy[60:]
    assert 0.8 <= late.count("plain") / len(late) <= 0.9  # one step in eight still drafts (and learns)
    assert frugal.counters["steps_frugal"] == busy.count("plain")
    share, saved_ms, spent_ms = frugal.stats()["frugal"]["5"]  # 16 rows: bucket 5
    assert share == 0.125 and saved_ms < 0.125 * spent_ms and spent_ms == pytest.approx(32.0)
    assert frugal.counters["draft_seconds"] < 0.3 * every.counters["draft_seconds"]  # the drafting work skipped
    # one request copying its prompt: its drafts pay, every step drafts
    copy = [list(range(100, 160)) * 12]
    assert drive(frugal, copy, 70, 60, 0.1, 0.01, frugal.clock).count("plain") == 0


def test_by_default_a_busy_load_whose_drafts_do_not_pay_stops_drafting_and_one_request_does_not() -> None:
    rng = np.random.default_rng(3)
    proposer = TimedProposer(engine_config(k=6, max_model_len=4096, vocab=1000), ProposerConfig(frugal=False))
    clock = proposer.clock = Clock()
    noise = [rng.integers(0, 40, 800).tolist() for _ in range(16)]  # drafts a step would rarely accept
    # 16 requests at 0.1 s + 10 ms a query token: a draft token costs 0.01 / (0.1 / 16 + 0.01) of a row's
    late = drive(proposer, noise, 64, 200, 0.1, 0.01, clock)[60:]
    assert late.count("plain") / len(late) >= 0.9
    # one request: a draft token costs 0.01 / 0.11 of its step, the cost model decides alone
    assert "plain" not in drive(proposer, noise[:1], 64, 100, 0.1, 0.01, clock)


def test_the_proposer_chooses_among_the_arms_it_is_given_alone() -> None:
    rng = np.random.default_rng(1)
    texts = [rng.integers(0, 40, 400).tolist() for _ in range(4)] + [list(range(100, 160)) * 20]
    played = {}
    for arms in (("model", "plain"), ("model",), ("eager", "lean")):
        proposer = TimedProposer(engine_config(k=6, max_model_len=4096, vocab=1000), ProposerConfig(arms=arms))
        clock = proposer.clock = Clock()
        played[arms] = set(drive(proposer, texts, 64, 120, 0.1, 0.01, clock))
        assert played[arms] <= set(arms), arms
        outcomes = proposer.stats()["arms"]["3"]  # a less eager arm's, from the steps of a more eager one too
        assert set(outcomes) == set(arms) and all(outcomes[arm][1] > 0 for arm in arms), arms
    assert played[("model",)] == {"model"}
    assert NGramProposer(engine_config(), ProposerConfig()).arms == ("model", "plain")  # its own default


def test_vllms_schedule_of_draft_tokens_by_batch_size_caps_the_chains() -> None:
    config = engine_config(k=6, max_model_len=128)
    config.speculative_config.num_speculative_tokens_per_batch_size = [(1, 1, 6), (2, 16, 2)]
    config.scheduler_config = SimpleNamespace(max_num_seqs=16)
    proposer = NGramProposer(config, ProposerConfig(step_costs=(0.1, 0.0)))
    batch = Batch(2, 128)
    batch.put(0, [5, 6, 7, 8, 9] * 8)
    batch.put(1, [5, 6, 7, 8, 9] * 8)
    assert proposer.propose([[9]], batch.lengths[:1], batch.ids[:1]) == [[5, 6, 7, 8, 9, 5]]
    assert proposer.propose([[9], [9]], batch.lengths, batch.ids) == [[5, 6], [5, 6]]


def test_estimates_are_corrected_by_what_was_accepted_against_what_was_expected() -> None:
    proposer = NGramProposer(engine_config(), ProposerConfig(arms=LEVEL_ARMS))
    proposer._last_end = 0.0
    assert proposer.correction == 1.0  # nothing drafted yet
    for _ in range(20):  # steps that expected 4 draft tokens accepted, and got 1
        proposer._learn(_Step(1, "model", 0.001, 4.0, {"model": {"r": 4}}), 1.0, [[1, 2]], ["r"], tokens=None)
    assert proposer.correction == pytest.approx(0.25)
    for _ in range(200):  # ... and then 10
        proposer._learn(_Step(1, "model", 0.001, 4.0, {"model": {"r": 10}}), 1.0, [list(range(11))], ["r"], tokens=None)
    assert proposer.correction == 2.0  # its bound
    before = proposer.correction
    proposer._learn(_Step(1, "plain", 0.0, 0.0, {}), 1.0, [[1]], ["r"], tokens=None)  # a plain step says nothing
    assert proposer.correction == before


def test_plain_is_chosen_only_where_a_draft_token_costs_the_share_set_of_a_rows_token() -> None:
    proposer = NGramProposer(engine_config(), ProposerConfig(arms=["plain", "model"], plain_at_cost=0.5))
    for n in (1, 4, 16, 20, 32):  # the engine's steps: 0.1 s + 10 ms a query token
        proposer.costs.add(n, 0.1 + 0.01 * n)
    # a draft token against a row's token: 0.01 / (0.1 + 0.01) at one row, 0.01 / (0.1 / 16 + 0.01) at 16
    for rows in (1, 16):
        load = proposer._load(load_bucket(rows))
        for step in range(1, 6):  # plain got twice model's tokens a second, at both loads
            load.arms["plain"].add(10, 1.0, step)
            load.arms["model"].add(5, 1.0, step)
        load.steps = 5
    assert {proposer._arm(1) for _ in range(200)} == {"model"}
    assert proposer._arm(16) == "plain"
    assert NGramProposer(engine_config(), ProposerConfig()).plain_at_cost == pytest.approx(1 / 3)
    assert NGramProposer(engine_config(), ProposerConfig()).arms == ("model", "plain")
    assert NGramProposer(engine_config(), ProposerConfig(plain_at_cost=0.0)).plain_at_cost == 0.0
    assert LatticeProposer.default_plain_at_cost == 1 / 3 and LatticeProposer.default_arms == ("model", "plain")
    for bad in (-0.1, 1.5, True, "half"):
        with pytest.raises(ProposerConfigError, match="plain_at_cost"):
            ProposerConfig(plain_at_cost=bad)


def test_a_batch_is_closed_where_finished_requests_rows_are_left_empty() -> None:
    # a burst: requests finish while others go on, and nobody takes their rows
    burst = Turnover()
    for call in range(40):
        burst.observe(1 if call % 3 == 0 else 0, 0, 16)
    assert burst.closed and burst.replaced == 0
    # a queue (or clients who send their next request at once): each row is taken in the same
    # call, or within the window; a row taken later than that is left empty meanwhile
    for lag in (0, 1, 3):
        queue = Turnover()
        joins = [0] * 200
        for call in range(0, 180, 3):
            joins[call + lag] += 2
            queue.observe(2, joins[call], 16)
            for later in range(call + 1, call + 3):
                queue.observe(0, joins[later], 16)
        assert not queue.closed and queue.ended > 40 and queue.replaced == pytest.approx(queue.ended), lag
    late = Turnover()
    for call in range(60):
        late.observe(1 if call % 6 == 0 else 0, 1 if call % 6 == Turnover.window else 0, 16)
    assert late.closed and late.replaced < late.ended
    # whole batches that end together and the next that joins tell nothing, either way
    waves = Turnover()
    for call in range(200):
        waves.observe(16, 16, 0) if call % 65 == 64 else waves.observe(0, 0, 16)
    assert not waves.closed and waves.ended == 0
    # a row still awaited when the batch turns over whole (or the engine ran empty) stayed empty
    tail = Turnover()
    tail.observe(2, 0, 3)
    tail.observe(0, 0, 3)
    tail.observe(3, 8, 0)
    assert tail.ended == pytest.approx(2) and tail.replaced == 0
    # fewer than ``least`` requests told: not closed; the memory follows the batch's habits
    few = Turnover()
    few.observe(3, 0, 5)
    for _ in range(8):
        few.observe(0, 0, 5)
    assert few.ended == 3 and not few.closed
    for _ in range(200):  # then every row is taken at once
        burst.observe(1, 1, 15)
    assert not burst.closed


def test_in_a_closed_batch_a_token_is_worth_what_it_saves() -> None:
    """Where freed rows stay empty and requests end at their max_tokens, the rows within ``margin``
    tokens of the most left share the step's fixed part; the others save their own tokens only."""
    a, weights = 0.1, [0.01, 0.01, 0.02, 0.01]
    ending = ending_rows([30, 27, 10, 25], margin=4)
    assert ending == [True, True, False, False]
    values = closed_values(ending, a, weights)
    unit = (a + sum(weights)) / 4  # what a token saves in an open batch: a row's share of a step
    assert values == pytest.approx([(a / 2 + 0.01) / unit, (a / 2 + 0.01) / unit, 0.02 / unit, 0.01 / unit])
    assert sum(values) == pytest.approx(4)  # the seconds saved are moved between rows, not made
    assert closed_values(ending_rows([5, 5, 5], margin=0), a, [0.01] * 3) == pytest.approx([1.0] * 3)  # all may
    assert closed_values(ending_rows([9], margin=4), a, [0.01]) == pytest.approx([1.0])
    assert ending_rows([], margin=4) == [] and closed_values([], a, []) == []
    # which requests ended at their max_tokens: told, decayed, and a majority of at least ``least``
    endings = Turnover()
    endings.endings(3, 0)
    assert not endings.by_length  # fewer than ``least`` told
    endings.endings(1, 1)
    assert endings.by_length and endings.told == pytest.approx(5, rel=0.05)
    for _ in range(100):  # then requests end before it (an end of sequence)
        endings.endings(0, 1)
    assert not endings.by_length


def test_in_a_closed_batch_by_length_only_the_requests_that_may_end_it_draft() -> None:
    import weakref

    def request(prompt: list[int]) -> Any:
        return SimpleNamespace(prompt_token_ids=prompt, num_prompt_tokens=len(prompt),
                               sampling_params=SimpleNamespace(max_tokens=40))

    text = [5, 6, 7, 8, 9] * 20  # drafts a step accepts: every row copies its text
    drafted = {}
    for margin, ended in ((8, 40), (None, 40), (8, 25)):  # ended: the tokens the six put out
        proposer = NGramProposer(engine_config(k=4, max_model_len=128), ProposerConfig(step_costs=(0.1, 0.01),
                                                                                        closed_margin=margin))
        runner = Runner()
        proposer._runner = weakref.ref(runner)
        batch = Batch(6, 128)
        done = [f"e{i}" for i in range(6)]  # six requests that end: 8 prompt tokens and ``ended`` out
        runner.requests = {key: request(text[:8]) for key in done}
        for row in range(6):
            batch.put(row, text[:8 + ended])
        while done:  # they finish one a call, their rows left empty (nothing sampled: no drafts, no outcomes)
            runner.input_batch.req_ids = list(done)
            proposer.propose([[]] * len(done), batch.lengths[:len(done)], batch.ids[:len(done)])
            runner.requests.pop(done.pop())
        # four requests: r0 has 30 tokens left, the others 10 (their drafts were accepted more)
        ids = ["r0", "r1", "r2", "r3"]
        runner.requests = {key: request(text[:8]) for key in ids}
        runner.input_batch.req_ids = ids
        for row, out in enumerate((10, 30, 30, 30)):
            batch.put(row, text[:8 + out])
        drafted[margin, ended] = proposer.propose([[text[7 + out]] for out in (10, 30, 30, 30)], batch.lengths[:4],
                                                batch.ids[:4])
        assert proposer.turnover.closed and proposer.turnover.told == pytest.approx(6, rel=0.1)  # told as the
        assert proposer.turnover.by_length == (ended == 40)  # new batch came: none took the rows the six left
        # no drafting work for the requests that will not end the batch: their states not even synced
        assert set(proposer.states) == ({"r0"} if (margin, ended) == (8, 40) else set(ids))
    assert drafted[8, 40][0] and not any(drafted[8, 40][1:])  # r0 ends the batch: only it drafts
    # every row's tokens alike (as in an open batch): every row drafts; so too where the requests
    # ended before their max_tokens (the tokens left tell nothing then)
    assert all(drafted[None, 40]) and all(drafted[8, 25])
    assert ProposerConfig().closed_margin == 8
    for bad in (-1, True, 1.5, "8"):
        with pytest.raises(ProposerConfigError, match="closed_margin"):
            ProposerConfig(closed_margin=bad)  # type: ignore[arg-type]


def test_in_a_closed_batch_no_drafting_where_a_draft_token_is_dear() -> None:
    import weakref

    for config, closes in ((ProposerConfig(), True), (ProposerConfig(arms=["model"]), True),
                           (ProposerConfig(closed_at_cost=None), False)):
        proposer = NGramProposer(engine_config(), config)
        runner = Runner()
        proposer._runner = weakref.ref(runner)
        for n in (1, 4, 16, 20, 32):  # the engine's steps: 0.1 s + 10 ms a query token
            proposer.costs.add(n, 0.1 + 0.01 * n)
        ids = [f"r{i}" for i in range(16)]
        runner.requests = {key: SimpleNamespace(prompt_token_ids=[1]) for key in ids}
        for step in range(12):  # the batch learns nothing yet: requests go on
            runner.input_batch.req_ids = list(ids)
            proposer._row_keys(len(ids))
        assert not proposer.turnover.closed
        for step in range(12):  # a request finishes every step and nobody takes its row
            runner.requests.pop(ids.pop())
            runner.input_batch.req_ids = list(ids)
            proposer._row_keys(len(ids))
        assert proposer.turnover.closed and proposer.turnover.replaced == 0
        # a draft token costs 0.01 / (0.1 / 16 + 0.01) = 0.62 of a row's token at 16 rows, 0.09 at one
        assert (proposer._arm(16) == "plain") == closes
        assert {proposer._arm(1) for _ in range(50)} == {"model"}
        assert proposer.stats()["steps_closed"] == closes and proposer.stats()["turnover"][2] is True
    assert ProposerConfig().closed_at_cost == pytest.approx(1 / 3)
    for bad in (0, -0.1, 1.5, True, "third"):
        with pytest.raises(ProposerConfigError, match="closed_at_cost"):
            ProposerConfig(closed_at_cost=bad)


def test_a_drafted_step_is_the_outcome_of_every_less_eager_arm_on_the_same_rows() -> None:
    proposer = NGramProposer(engine_config(), ProposerConfig(arms=LEVEL_ARMS))
    for n in (1, 5, 10, 20):  # the engine's steps: 0.1 s + 10 ms a query token
        proposer.costs.add(n, 0.1 + 0.01 * n)
    a, b, c = proposer.costs.coefficients()
    assert (a, b, c) == pytest.approx((0.1, 0.01, 0.0))
    proposer._last_end, proposer._verify_tokens = 0.0, 3 + 9
    # eager drafted 5 tokens for r0 and 4 for r1; the step accepted 4 of r0's and none of r1's, and
    # r2 (no draft) emitted its one token; model would have drafted 3 and 1, lean 1 and none
    chains = {"eager": {"r0": 5, "r1": 4}, "model": {"r0": 3, "r1": 1}, "lean": {"r0": 1}}
    step = 0.1 + 0.01 * 12
    proposer._learn(_Step(1, "eager", 0.002, 3.0, chains), step, [[1, 2, 3, 4, 5], [6], [7]], ["r0", "r1", "r2"],
                    tokens=12)
    arms = proposer.loads[1].arms
    assert (arms["eager"].tokens, arms["eager"].seconds) == pytest.approx((7, step + 0.002))  # what ran
    assert (arms["model"].tokens, arms["model"].seconds) == pytest.approx((3 + 3, step - 5 * b + 0.002))
    assert (arms["lean"].tokens, arms["lean"].seconds) == pytest.approx((3 + 1, step - 8 * b + 0.002))
    assert (arms["plain"].tokens, arms["plain"].seconds) == pytest.approx((3, step - 9 * b))  # no drafting
    # a less eager arm whose chains the step did not verify (its own rule drafted where the run arm
    # did not) is not scored from it
    proposer._last_end, proposer._verify_tokens = 0.0, 2
    proposer._learn(_Step(1, "model", 0.002, 0.0, {"model": {}, "lean": {"r0": 1}}), 0.12, [[1], [2]],
                    ["r0", "r1"], tokens=2)
    assert arms["lean"].steps == 1 and arms["model"].steps == 2 and arms["plain"].steps == 2
    # a step of the plain arm is its own outcome alone
    proposer._last_end, proposer._verify_tokens = 0.0, 2
    proposer._learn(_Step(1, "plain", 0.0, 0.0, {}), 0.12, [[1], [2]], ["r0", "r1"], tokens=2)
    assert arms["plain"].steps == 3 and arms["eager"].steps == 1


def test_a_new_load_warms_its_levels_up_with_the_most_eager_ones_steps() -> None:
    """Two ``eager`` steps are the outcomes of ``model``, ``lean`` and ``plain`` too, so a new
    load tries no other level before it chooses (the lattice proposer's heads run in each try)."""
    for arms in (LEVEL_ARMS, ("model", "lean", "plain"), ("lean", "plain")):
        proposer = TimedProposer(engine_config(k=6, max_model_len=4096, vocab=1000), ProposerConfig(arms=arms))
        clock = proposer.clock = Clock()
        texts = [([3, 1, 4, 1, 5, 9, 2, 6] * 40)[:300] for _ in range(2)]  # drafts that are accepted
        steps = drive(proposer, texts, 16, 6, 0.1, 0.001, clock)
        eagerest = min((a for a in arms if a != "plain"), key=LEVELS.__getitem__)
        assert steps[:2] == [eagerest, eagerest]  # no other arm tried: every one had its outcomes
        assert all(o.steps >= 2 for o in proposer.loads[2].arms.values())
    assert WARMUP_ORDER[:3] == tuple(sorted(LEVELS, key=LEVELS.__getitem__)) and set(WARMUP_ORDER) == set(ARMS)


def test_the_draft_tokens_an_arm_leaves_out_are_priced_by_their_rows_context() -> None:
    """With a key's price fitted, a less eager arm's seconds are the step's less what its left-out
    draft tokens cost at their own rows' contexts; and the next step's keys (its query tokens
    times their contexts) go into the fit."""
    proposer = NGramProposer(engine_config(), ProposerConfig(arms=LEVEL_ARMS))
    for tokens, context in itertools.product((1, 3, 6, 9), (100, 800, 2000)):
        proposer.costs.add(tokens, 0.1 + 0.002 * tokens + 4e-6 * tokens * context, tokens * context)
    _, b, c = proposer.costs.coefficients()
    assert (b, c) == pytest.approx((0.002, 4e-6))
    proposer._last_end, proposer._verify_tokens, proposer._verify_keys = 0.0, 2 + 6, 4 * 2000 + 4 * 100
    chains = {"eager": {"long": 3, "short": 3}, "model": {"long": 1, "short": 3}}
    step = 0.1 + 0.002 * 8 + 4e-6 * (4 * 2000 + 4 * 100)
    proposer._learn(_Step(1, "eager", 0.0, 2.0, chains, {"long": 2000, "short": 100}), step, [[1, 2], [3, 4, 5, 6]],
                    ["long", "short"], tokens=8)
    arms = proposer.loads[1].arms
    assert arms["model"].seconds == pytest.approx(step - 2 * (b + c * 2000))
    assert arms["plain"].seconds == pytest.approx(step - 3 * (b + c * 2000) - 3 * (b + c * 100))
    assert proposer.costs.seconds(8, 4 * 2000 + 4 * 100) == pytest.approx(step)
    assert attended_keys(np.array([2000, 100, 7]), [[1, 2, 3], [], [5]]) == 4 * 2000 + 100 + 2 * 7
    for context_costs in (True, False):  # a step through propose: its keys go into the next fit, or not
        flat = NGramProposer(engine_config(k=4, max_model_len=4096), ProposerConfig(context_costs=context_costs))
        buffer = np.zeros((2, 4096), dtype=np.int64)
        buffer[:, :300] = np.tile(np.arange(10), 30)
        out = flat.propose([[9], [9]], np.array([300, 120]), buffer)
        assert flat._verify_keys == (attended_keys(np.array([300, 120]), out) if context_costs else 0.0)
        assert flat._verify_keys > 0 or not context_costs


def test_a_step_a_request_joined_is_no_steps_cost() -> None:
    """A request of a two-token prompt joins after the engine sat idle (serving other engines, or
    nobody): its prefill step holds fewer query tokens than the last call scheduled, but it is no
    verifying step's cost, nor any arm's outcome; a step of the same rows is."""
    proposer = NGramProposer(engine_config(), ProposerConfig(arms=LEVEL_ARMS))
    proposer._last_end, proposer._verify_tokens = 0.0, 1 + 8
    proposer._learn(_Step(1, "model", 0.001, 2.0, {"model": {"r0": 8}}, {"r0": 100}, ("r0",)), 5.0, [[7]], ["r1"],
                    tokens=2)
    assert proposer.costs.samples == 0 and not proposer.loads
    proposer._last_end, proposer._verify_tokens = 0.0, 1 + 8
    proposer._learn(_Step(1, "model", 0.001, 2.0, {"model": {"r1": 8}}, {"r1": 3}, ("r1",)), 0.09, [[7, 8]], ["r1"],
                    tokens=9)
    assert proposer.costs.samples == 1 and proposer.loads[1].arms["model"].steps == 1


def test_a_long_rows_drafts_cost_more_and_are_cut_first() -> None:
    """Two requests drafting the same chain, one after 64 tokens and one after 3,000: with a key
    priced, the long request's chain is the shorter; without, both are equal."""
    from latticekit.vllm.proposer import LEVELS

    probabilities = [np.array([0.9, 0.6, 0.3, 0.15, 0.08])] * 2
    a = 0.1
    flat = allocate(probabilities, a, 0.004)
    assert flat[0] == flat[1] > 0
    priced = allocate(probabilities, a, LEVELS["model"], weights=[0.002 + 2e-6 * 64, 0.002 + 2e-6 * 3000])
    assert priced[0] > priced[1]
    assert CostFit(0.1, 0.002) == (0.1, 0.002, 0.0)
    proposer = NGramProposer(engine_config(), ProposerConfig())  # a step that costs nothing: no division by 0
    assert proposer._repaid([np.array([0.5])], [1], 0.0, 0.0) == ([1], 0.5, 0.5)


@pytest.mark.parametrize("vocabulary", ["seen", "seen:model", "seen:bfloat16", "full",
                                        "seen, heads without head_states"])
def test_the_lattice_proposer_reads_each_rows_hidden_state_and_drafts_its_lattice(tmp_path: Path,
                                                                                  vocabulary: str) -> None:
    """One step of the lattice proposer as vLLM's runner drives it: the hidden states the hook
    kept (one row per request, none verified drafts), the heads run on the batch's rows, each
    request's chain the one its own lattice gives (against the lattice built for it alone: over
    the whole vocabulary, or over the tokens seen, here the two requests' texts, projected in
    the ``candidate_dtype`` set (after the colon; default ``auto``); heads that cannot be
    projected on candidates, over the whole vocabulary whatever the setting)."""
    import weakref

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from latticekit.decoding.lattices import CandidateLattice, FullLattice, candidate_dtype
    from latticekit.heads.modules import BlockHeads

    torch.manual_seed(0)
    dtype = vocabulary.split(":")[1] if ":" in vocabulary else "auto"
    vocabulary = vocabulary.split(":")[0]
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2)).eval()
    heads = BlockHeads.for_model(model, num_heads=4).eval()
    given = tmp_path / "heads.bin"
    given.write_bytes(b"")  # the setting names a file; the heads are put in place as load_model would
    class Opaque(torch.nn.Module):  # the same heads, their states hidden: no candidate vocabulary
        def __init__(self) -> None:
            super().__init__()
            self.inner, self.lm_head, self.num_heads = heads, heads.lm_head, heads.num_heads
            self.token_conditioned = heads.token_conditioned

        def forward(self, hidden: Any, next_token: Any = None) -> Any:
            return self.inner(hidden, next_token=next_token)

    proposer = LatticeProposer(engine_config(k=3, vocab=64), ProposerConfig(heads=str(given), step_costs=(0.1, 0.0),
                                                                             k=4, p=4,
                                                                             vocabulary=vocabulary.split(",")[0],
                                                                             candidate_dtype=dtype))
    proposer.heads = heads if "," not in vocabulary else Opaque()
    runner = Runner()
    runner.input_batch = SimpleNamespace(req_ids=["a", "b"], spec_token_ids=[[], []])
    runner.requests = {"a": SimpleNamespace(prompt_token_ids=[1, 2, 3]), "b": SimpleNamespace(prompt_token_ids=[4])}
    proposer._runner = weakref.ref(runner)
    batch = Batch(2)
    texts = [[1, 2, 3, 9, 10], [4, 20, 21, 22]]
    for r, text in enumerate(texts):
        batch.put(r, text)
    hidden = torch.randn(2, 32)

    def logits(p: LatticeProposer, states: Any) -> None:  # the hook on the logits processor
        p._keep_hidden(None, (None, states), {})

    logits(proposer, hidden)  # the step's sampling logits, then one request's prompt logprobs
    logits(proposer, torch.randn(5, 32))
    out = proposer.propose([[10], [22]], batch.lengths, batch.ids)
    assert not proposer._hidden  # the next step's states are those computed after the call
    assert proposer.counters["lattice_rows"] == 2 and proposer.counters["errors"] == 0 and all(out)
    assert set(proposer.acceptance.models) == {"heads", "text", "memory"}  # estimates per candidate source
    assert proposer.counters["hidden_mismatch"] == 0
    seen = np.unique(np.concatenate(texts))
    assert proposer.counters["vocabulary_taken"] == (vocabulary == "seen")
    for r, text in enumerate(texts):
        alone = ChainDrafter(None, 64, AcceptanceModel.prior(trust="head+cache"), candidates=32, max_depth=12)
        alone.observe(text)
        source: Any = CandidateLattice(heads, seen, 4, candidate_dtype(heads.lm_head.weight, dtype)) \
            if vocabulary == "seen" else FullLattice(heads, 4, 64)
        with torch.no_grad():
            lattice, _ = source(hidden[r], text, entropy=False)
        if vocabulary == "seen":
            assert set(lattice.tokens[1:].ravel().tolist()) <= set(seen.tolist())
        chain, _ = alone.propose_lattice(3, lattice, uniform_lm(), 4, 0.0)
        assert out[r] == chain.tolist()
    logits(proposer, torch.randn(3, 32))  # rows that do not add up to the batch: n-grams alone, counted
    proposer.propose([[10], [22]], batch.lengths, batch.ids)
    assert proposer.counters["hidden_mismatch"] == 1 and proposer.counters["errors"] == 0
    # a text step runs no heads: the n-grams alone, as the n-gram proposer drafts them
    # (the arms choose where the step costs are measured, not given)
    text_only = LatticeProposer(engine_config(k=3, vocab=64), ProposerConfig(heads=str(given), k=4, p=4,
                                                                              arms=("text",)))
    text_only.heads = heads
    text_only._runner = weakref.ref(runner)
    ngram = NGramProposer(engine_config(k=3, vocab=64), ProposerConfig())
    ngram._runner = weakref.ref(runner)
    repeated = Batch(2)
    for r, text in enumerate([[1, 2, 3, 1, 2], [4, 20, 21, 4, 20]]):
        repeated.put(r, text)
    logits(text_only, hidden)
    got = text_only.propose([[2], [20]], repeated.lengths, repeated.ids)
    assert got == ngram.propose([[2], [20]], repeated.lengths, repeated.ids) and got[0][:1] == [3]
    assert text_only.counters["lattice_rows"] == 0 and text_only.counters["steps_text"] == 1
    # text_first: a request whose own chain fills its room, likely accepted whole, drafts it without
    # the heads (its tree waiting for its labels once); the others' heads run as before
    for threshold, skipped in ((1e-6, 2), (1.0, 0)):
        first = LatticeProposer(engine_config(k=3, vocab=64), ProposerConfig(heads=str(given), step_costs=(0.1, 0.0),
                                                                              k=4, p=4, text_first=threshold))
        first.heads = heads
        first._runner = weakref.ref(runner)
        logits(first, hidden)
        got = first.propose([[2], [20]], repeated.lengths, repeated.ids)
        assert first.counters["rows_text_first"] == skipped and first.counters["lattice_rows"] == 2 - skipped
        assert first.counters["errors"] == 0 and all(len(state.pending) == 1 for state in first.states.values())
        if skipped:  # draft tokens cost nothing here: each request's chain is its text's copy, whole
            assert got == [[3, 1, 2], [21, 4, 20]]
    # heads_depth: the heads draft the lattice's first positions alone (each request's chain that
    # of a lattice cut to them: the reference drafter given the same cut lattice)
    shallow = LatticeProposer(engine_config(k=3, vocab=64), ProposerConfig(heads=str(given), step_costs=(0.1, 0.0),
                                                                            k=4, p=4, heads_depth=1))
    shallow.heads = heads
    shallow._runner = weakref.ref(runner)
    logits(shallow, hidden)
    deep = LatticeProposer(engine_config(k=3, vocab=64), ProposerConfig(heads=str(given), step_costs=(0.1, 0.0),
                                                                         k=4, p=4))
    deep.heads = heads
    deep._runner = weakref.ref(runner)
    logits(deep, hidden)
    deep.propose([[10], [22]], batch.lengths, batch.ids)
    got = shallow.propose([[10], [22]], batch.lengths, batch.ids)
    assert shallow.counters["lattice_rows"] == 2 and all(lattice.h == 2 for lattice in shallow._lattices)
    for cut, whole in zip(shallow._lattices, deep._lattices):  # the same heads' first position
        assert whole.h == 4 and np.array_equal(cut.tokens, whole.tokens[:2])
        np.testing.assert_allclose(cut.scores, whole.scores[:2], atol=1e-5)
    for r, text in enumerate(texts):
        alone = ChainDrafter(None, 64, AcceptanceModel.prior(trust="head+cache"), candidates=32, max_depth=12)
        alone.observe(text)
        cut = shallow._lattices[r]
        assert got[r] == alone.propose_lattice(3, cut, uniform_lm(), 4, 0.0)[0].tolist()
    with pytest.raises(ProposerConfigError, match="'text'"):
        NGramProposer(engine_config(), ProposerConfig(arms=("model", "text")))


def test_the_lattice_proposers_vocabulary_is_the_tokens_it_has_seen_most(tmp_path: Path) -> None:
    """``vocabulary`` "seen" (no ``lm``): each drafting request's text is counted once, as it
    grows; the vocabulary is taken anew where the distinct tokens seen grew by an eighth (every
    request's lattice source then built anew, so that a batch's share it), at most
    ``CANDIDATE_TOKENS`` tokens, those seen most; ids outside the vocabulary are not counted.
    ``"full"`` and an ``lm`` count nothing."""
    from latticekit.drafting.drafters.auto import CANDIDATE_TOKENS
    from latticekit.vllm.lattice import _VOCABULARY_GROWTH

    given = tmp_path / "heads.bin"
    given.write_bytes(b"")
    vocab = 20000
    proposer = LatticeProposer(engine_config(k=3, vocab=vocab), ProposerConfig(heads=str(given)))

    def request(text: list[int]) -> ChainDrafter:
        state = ChainDrafter(None, vocab, AcceptanceModel.prior(), candidates=4, max_depth=4)
        state.observe(text)
        return state

    a = request([1, 2, 3, 3])
    proposer._see([a])
    assert proposer._vocabulary is not None and proposer._vocabulary.tolist() == [1, 2, 3]
    assert proposer._seen is not None and proposer._seen[3] == 2 and proposer.counters["vocabulary_taken"] == 1
    a.observe([1, 2, 3, 3, 4])
    proposer._see([a])  # 4 distinct >= 3 * 1.125: taken anew; the text's first tokens not counted again
    assert proposer._vocabulary.tolist() == [1, 2, 3, 4] and proposer._seen[3] == 2
    proposer._sources[a] = "a source"
    proposer._see([a])  # nothing new: kept, and the sources with it
    assert proposer.counters["vocabulary_taken"] == 2 and a in proposer._sources
    b = request([5, vocab + 7])  # an id outside the vocabulary is not counted
    proposer._see([b])  # 5 distinct >= 4 * 1.125
    assert proposer._vocabulary.tolist() == [1, 2, 3, 4, 5] and a not in proposer._sources
    assert _VOCABULARY_GROWTH * 5 > 5
    many = list(range(100, 10100))
    proposer._see([request(many + many[:CANDIDATE_TOKENS] * 2)])  # 8,192 tokens seen three times, the rest once
    assert proposer._vocabulary.tolist() == many[:CANDIDATE_TOKENS]
    for settings in ({"vocabulary": "full"}, {"lm": "embedded"}):
        other = LatticeProposer(engine_config(k=3, vocab=49152), ProposerConfig(heads=str(given), **settings))
        other._see([request([1, 2, 3])])
        assert other._seen is None and other.counters["vocabulary_taken"] == 0
        assert (other._vocabulary is None) == ("vocabulary" in settings)
    with pytest.raises(ProposerConfigError, match="vocabulary must be 'seen' or 'full'"):
        ProposerConfig(vocabulary="all")
    with pytest.raises(ProposerConfigError, match="candidate_dtype must be 'auto', 'model' or 'bfloat16'"):
        ProposerConfig(candidate_dtype="float16")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc/self/status (Linux)")
def test_request_churn_leaves_the_proposers_memory_flat() -> None:
    """Thousands of requests start, draft and finish, as vLLM's runner shows them: the states
    of finished requests are freed, the memory of answers stays within its size, and the
    process's memory (the proposer's Python and C++ state alike; no engine here, whose own
    caches grow as it meets new shapes) is flat after a warm-up that fills that memory."""
    import gc
    import weakref

    rows, vocab = 8, 49152
    proposer = NGramProposer(engine_config(k=6, max_model_len=1024, vocab=vocab),
                             ProposerConfig(lm="embedded", step_costs=(1.0, 0.0), memory_tokens=4096))
    runner = Runner()
    proposer._runner = weakref.ref(runner)
    batch = Batch(rows, 1024)
    rng = np.random.default_rng(0)
    live: list[Any] = [None] * rows  # per row: [request id, whole text, tokens shown]
    started = 0

    def new_request(row: int) -> None:
        nonlocal started
        started += 1
        kind = started % 3
        if kind == 0:  # repetitive: drafts everywhere
            text = (rng.integers(0, vocab, size=int(rng.integers(2, 8))).tolist() * 200)[:int(rng.integers(60, 500))]
        elif kind == 1:
            text = rng.integers(0, vocab, size=int(rng.integers(2, 300))).tolist()
        else:  # ids at the vocabulary's edges
            text = ([vocab - 1, 0] * 100)[:int(rng.integers(2, 120))]
        prompt = max(1, len(text) - int(rng.integers(1, 40)))
        live[row] = [f"r{started}", text, prompt]
        # its whole output as the runner holds it when the request finishes (read then)
        runner.requests[f"r{started}"] = SimpleNamespace(prompt_token_ids=text[:prompt], output_token_ids=text[prompt:])

    def steps(n: int) -> None:
        for _ in range(n):
            sampled: list[list[int]] = []
            for row in range(rows):
                if live[row] is None or live[row][2] >= len(live[row][1]):
                    if live[row] is not None:
                        del runner.requests[live[row][0]]
                    new_request(row)
                    sampled.append([])  # the prefill step
                else:
                    live[row][2] += 1
                    sampled.append([live[row][1][live[row][2] - 1]])
                batch.put(row, live[row][1][:live[row][2]])
            runner.input_batch.req_ids = [r[0] for r in live]
            proposer.propose(sampled, batch.lengths, batch.ids)

    steps(800)  # warm-up: the memory of answers fills and evicts
    assert proposer.memory is not None and proposer.memory.evicted > 0
    gc.collect()
    before, requests = rss_mb(os.getpid()), proposer.counters["requests_started"]
    steps(2000)
    gc.collect()
    after = rss_mb(os.getpid())
    stats = proposer.stats()
    assert stats["errors"] == 0 and stats["requests_started"] - requests >= 500
    assert stats["states"] <= rows and stats["requests_finished"] >= stats["requests_started"] - rows
    assert stats["memory_tokens"] <= 4096
    # every finished request's answer read from the runner, and none of its states kept after
    assert stats["answers_from_runner"] >= stats["requests_finished"] and len(proposer._held) <= rows
    assert after - before < 8, f"{after - before:.1f} MiB over {stats['requests_started'] - requests} requests"


def test_the_stats_file_is_written_off_the_engines_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``stats``, a call hands the file to a writer thread of its own and never waits for
    the disk (``LatestWriter``), not even where it learnt that requests finished; only a call
    whose batch holds ``engine_stats``' marked request waits for its rewrite, so that that
    request brings the file up to date. A failed write is counted on the engine's thread."""
    import threading
    import time
    import weakref
    from contextlib import contextmanager

    from latticekit import _files
    from latticekit.vllm.engine import STATS_REQUEST

    path = tmp_path / "stats.json"
    proposer = NGramProposer(engine_config(), ProposerConfig(step_costs=(0.1, 0.0), stats=str(path)))
    runner = Runner()
    proposer._runner = weakref.ref(runner)
    batch = Batch(1)
    marked = SimpleNamespace(prompt_token_ids=[1, 2], sampling_params=SimpleNamespace(extra_args={STATS_REQUEST: True}))
    plain = SimpleNamespace(prompt_token_ids=[1, 2], sampling_params=SimpleNamespace(extra_args=None))

    def call(key: str, request: Any) -> None:
        runner.input_batch.req_ids, runner.requests = [key], {key: request}
        batch.put(0, [1, 2, 7])
        proposer.propose([[7]], batch.lengths, batch.ids)

    call("s0", marked)  # the first call: written, and waited for (the marked request)
    assert json.loads(path.read_text())["calls"] == 1
    release, real = threading.Event(), _files.atomic_write

    @contextmanager
    def slow(target: Any) -> Any:  # a disk that does not answer until the test says so
        release.wait(10)
        with real(target) as f:
            yield f

    monkeypatch.setattr(_files, "atomic_write", slow)
    start = time.perf_counter()
    call("a", plain)  # learns that s0 finished: rewritten, not waited for
    call("b", plain)  # ... and a
    assert time.perf_counter() - start < 1 and json.loads(path.read_text())["calls"] == 1  # handed, not written
    release.set()
    call("s1", marked)  # learns that b finished, and waits for its own rewrite
    assert json.loads(path.read_text())["calls"] == 4 and proposer.stats()["errors"] == 0
    # a write that fails is counted by the engine's thread, at the call that waits for it or the next
    monkeypatch.setattr(_files, "atomic_write", real)
    path.unlink()
    path.mkdir()  # a folder where the file should be
    call("s2", marked)
    assert proposer.stats()["errors"] == 1 and path.is_dir()
