"""The step-cost probe times steady state on a target whose first pass at each key length is slow.

On a GPU, cuDNN's attention builds a plan for every key length it has not seen, and a decode's
cache grows every step: the first probe, which timed a growing cache, measured 2-5x the true
steps there. The target here is a real tiny Llama with a forward pre-hook: every pass sleeps
``STEADY_S`` (so the steady cost is known and dominates the tiny model's compute), and
``FIRST_S`` more the first time the model sees a key length. The probe must come within a sixth
of that penalty of the same probe on the same model without the first-sight sleep, and report
what it saw.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from decoding_helpers import tiny_llama
from latticekit.decoding.costs import FIRST_SIGHT_RATIO, COSTS_VERSION, measure_step_costs, step_costs
from latticekit.decoding import greedy_decode
from latticekit.torch import prepare_target

STEADY_S = 0.1
FIRST_S = 0.3
SIZES = (0, 1, 4)


class SlowFirstSight:
    """A forward pre-hook: ``STEADY_S`` a pass, and ``FIRST_S`` more for the first ``slow_sights``
    passes over each key length (cached positions plus the pass's tokens)."""

    def __init__(self, model: Any, slow_sights: int = 1) -> None:
        self.sights: dict[int, int] = {}
        self.slow_sights = slow_sights
        self.first_s = FIRST_S
        model.register_forward_pre_hook(self, with_kwargs=True)

    def __call__(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        held = cache.get_seq_length() if cache is not None else 0
        keys = held + int(ids.shape[1])
        seen = self.sights.get(keys, 0)
        self.sights[keys] = seen + 1
        time.sleep(STEADY_S + (self.first_s if seen < self.slow_sights else 0.0))


def slow_model(slow_sights: int = 1) -> tuple[Any, SlowFirstSight]:
    model = prepare_target(tiny_llama())
    return model, SlowFirstSight(model, slow_sights)


def test_the_trap_is_real() -> None:
    """A decode (a growing cache) pays the first sight every step: what the first probe timed."""
    model, hook = slow_model()
    t0 = time.perf_counter()
    greedy_decode(model, [3, 17, 42, 8, 25], 4)
    assert time.perf_counter() - t0 >= 5 * FIRST_S  # the prefill and 4 steps, each a new length
    assert all(count == 1 for count in hook.sights.values())


@pytest.mark.parametrize("slow_sights", [1, 2])
def test_the_probe_times_steady_state(slow_sights: int) -> None:
    """1: every shape's first pass is slow (the untimed round takes it); 2: its first two are,
    so the first timed call of each shape is slow too, detected, dropped and timed again."""
    model, hook = slow_model(slow_sights)
    probe = dict(sizes=SIZES, prefix_tokens=24, long_prefix=None, repeats=3)
    trapped = measure_step_costs(model, **probe)
    hook.first_s = 0.0
    steady = measure_step_costs(model, **probe)
    # within a sixth of the first-sight penalty: a probe that timed one slow pass in its
    # repeats is off by a third of it or more, while a loaded machine (the suite runs in
    # parallel) may stretch a 0.1 s sleep by more than the 10% this once allowed
    for n, got, want in zip(trapped.nodes, trapped.seconds, steady.seconds):
        assert got == pytest.approx(want, abs=FIRST_S / 6), f"{n} nodes: {got * 1e3:.1f} ms, steady {want * 1e3:.1f} ms"
    assert all(s < STEADY_S + FIRST_S / 2 for s in trapped.seconds)
    trapped_ratio = trapped.description["first_pass_ratio"]
    assert trapped.description["first_sight"] and trapped_ratio > FIRST_SIGHT_RATIO
    # without the penalty the first passes come far nearer the steady ones: a first pass there
    # is (STEADY_S + FIRST_S) / STEADY_S = 4 times a steady one, here about 1, but a loaded
    # machine stretched one untimed sleep past FIRST_SIGHT_RATIO once (stop 57's 2-worker
    # suite), so the bound is halfway between, not the absolute ratio
    assert steady.description["first_pass_ratio"] < (1 + trapped_ratio) / 2
    retimed = trapped.description["retimed"]
    if slow_sights == 2:  # each shape's first timed call slept 4 times a steady one: all found
        assert set(retimed) == {str(n) for n in SIZES}
    # with one slow sight a steady call is retimed only where a loaded machine stretched its
    # sleep by half (stop 46's fresh-clone suite once did): harmless, and the accuracy above holds
    assert trapped.prefix_tokens == steady.prefix_tokens == 25  # the prefix and its pending token


def test_the_attention_term_is_steady_too() -> None:
    model, hook = slow_model()
    costs = measure_step_costs(model, sizes=(0, 4), prefix_tokens=16, long_prefix=48, repeats=3)
    # the sleeps do not depend on the length, and the tiny model's attention is all but free: the
    # long prefix's calls were timed steady too (a first sight would add FIRST_S to them)
    assert costs.target_s(0, cached=49) == pytest.approx(costs.target_s(0), rel=0.10)
    assert costs.description["first_sight"]


def test_costs_cached_by_an_older_probe_are_measured_again(tmp_path: Path) -> None:
    model = tiny_llama()
    measure = dict(sizes=(0, 1, 4), repeats=1, prefix_tokens=8, long_prefix=16)
    first = step_costs(model, cache_dir=tmp_path, **measure)
    path = Path(first.description["cache_file"])
    old = json.loads(path.read_text())
    assert old["version"] == COSTS_VERSION == 3
    old.update(version=2, seconds=[9.0, 9.0, 9.0])  # what the growing-cache probe left behind
    path.write_text(json.dumps(old))
    again = step_costs(model, cache_dir=tmp_path, **measure)
    assert again.seconds != [9.0, 9.0, 9.0] and all(s < 9.0 for s in again.seconds)
    rewritten = json.loads(path.read_text())
    assert rewritten["version"] == 3 and rewritten["seconds"] == again.seconds
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # written whole (temp file, renamed)
