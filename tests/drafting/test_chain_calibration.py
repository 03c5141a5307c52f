"""The chains' estimates recalibrated by the drafted positions' outcomes
(:class:`~latticekit.drafting.calibration.ChainCalibration`), against a plain reference: its
objective and gradient written out term by term, and a fit afresh on the positions the window
holds."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from latticekit.drafting.calibration import ChainCalibration
from latticekit.errors import DecoderConfigError


def reference_logit(p: float) -> float:
    """``log(p / (1 - p))`` within [-8, 8]."""
    low = 1.0 / (1.0 + math.exp(8.0))
    p = min(max(p, low), 1.0 - low)
    return math.log(p / (1.0 - p))


def objective(alpha: float, beta: float, xs: list[float], ys: list[float], ridge: float) -> float:
    total = 0.5 * ridge * (alpha ** 2 + (beta - 1.0) ** 2)
    for x, y in zip(xs, ys):
        z = alpha + beta * x
        total += max(z, 0.0) + math.log1p(math.exp(-abs(z))) - y * z
    return total


def gradient(alpha: float, beta: float, xs: list[float], ys: list[float], ridge: float) -> tuple[float, float]:
    g0, g1 = ridge * alpha, ridge * (beta - 1.0)
    for x, y in zip(xs, ys):
        p = 1.0 / (1.0 + math.exp(-(alpha + beta * x)))
        g0 += p - y
        g1 += (p - y) * x
    return g0, g1


positions = st.lists(st.tuples(st.floats(0.0, 1.0), st.booleans()), min_size=1, max_size=80)


@settings(max_examples=150, deadline=None)
@given(st.lists(positions, min_size=1, max_size=5), st.integers(1, 120), st.sampled_from([0.5, 4.0, 20.0]))
def test_the_fit_is_the_penalised_likelihoods_minimum_over_the_positions_the_window_holds(
        chunks: list[list[tuple[float, bool]]], window: int, ridge: float) -> None:
    calibration = ChainCalibration(window=window, ridge=ridge)
    held: list[tuple[float, bool]] = []
    for chunk in chunks:
        calibration.add(np.array([p for p, _ in chunk]), np.array([y for _, y in chunk]))
        held = (held + chunk)[-window:]
    assert calibration.positions == len(held)
    xs, ys = [reference_logit(p) for p, _ in held], [float(y) for _, y in held]
    alpha, beta = calibration.alpha, calibration.beta
    g0, g1 = gradient(alpha, beta, xs, ys, ridge)
    scale = 1.0 + len(xs)
    assert beta >= 0.0
    assert abs(g0) < 1e-6 * scale
    if beta > 1e-9:
        assert abs(g1) < 1e-6 * scale
    else:  # on the bound: the objective must not fall into beta > 0
        assert g1 > -1e-6 * scale
    best = objective(alpha, beta, xs, ys, ridge)
    rng = np.random.default_rng(len(xs))
    for d0, d1 in rng.normal(0.0, 0.3, size=(20, 2)):
        assert objective(alpha + d0, max(0.0, beta + d1), xs, ys, ridge) >= best - 1e-9 * scale
    afresh = ChainCalibration(window=window, ridge=ridge)
    afresh.add(np.array([p for p, _ in held]), np.array([y for _, y in held]))
    assert (afresh.alpha, afresh.beta) == pytest.approx((alpha, beta), abs=1e-7)


@settings(max_examples=100, deadline=None)
@given(positions, st.lists(st.floats(0.0, 1.0), min_size=2, max_size=20))
def test_the_map_keeps_the_estimates_order_and_stays_a_probability(
        data: list[tuple[float, bool]], estimates: list[float]) -> None:
    calibration = ChainCalibration()
    probe = np.array(sorted(estimates))
    assert np.array_equal(calibration(probe), probe)  # nothing learnt: the identity
    calibration.add(np.array([p for p, _ in data]), np.array([y for _, y in data]))
    out = calibration(probe)
    assert np.all(np.diff(out) >= -1e-12) and np.all((out >= 0) & (out <= 1))
    want = [1.0 / (1.0 + math.exp(-(calibration.alpha + calibration.beta * reference_logit(p)))) for p in probe]
    assert out == pytest.approx(want, abs=1e-12)


def test_it_learns_a_known_miscalibration() -> None:
    rng = np.random.default_rng(7)
    estimates = rng.uniform(0.01, 0.99, size=20000)
    truth = 1.0 / (1.0 + np.exp(-(0.5 + 0.6 * np.log(estimates / (1 - estimates)))))
    calibration = ChainCalibration(window=20000)
    for start in range(0, estimates.size, 1000):  # in steps, as a proposer adds them
        chunk = slice(start, start + 1000)
        calibration.add(estimates[chunk], rng.random(1000) < truth[chunk])
    assert calibration.alpha == pytest.approx(0.5, abs=0.06)
    assert calibration.beta == pytest.approx(0.6, abs=0.04)


def test_estimates_that_fall_as_acceptance_rises_give_a_flat_map() -> None:
    calibration = ChainCalibration()
    calibration.add(np.array([0.99] * 50 + [0.01] * 50), np.array([False] * 50 + [True] * 50))
    assert calibration.beta == 0.0
    out = calibration(np.array([0.01, 0.5, 0.99]))
    assert out[0] == out[1] == out[2]


def test_bad_arguments_are_typed_errors() -> None:
    with pytest.raises(DecoderConfigError, match="window"):
        ChainCalibration(window=0)
    with pytest.raises(DecoderConfigError, match="ridge"):
        ChainCalibration(ridge=0.0)
    with pytest.raises(DecoderConfigError, match="2 estimates and 3 outcomes"):
        ChainCalibration().add(np.array([0.5, 0.5]), np.array([True, False, True]))
