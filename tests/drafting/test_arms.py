"""The arm choice ``auto`` and the vLLM proposer share (``latticekit.drafting.arms``): warm-up,
the best arm kept, probes that double their interval while they lose, against a plain
reference simulation of the rule."""

from __future__ import annotations

from typing import Optional

from hypothesis import given, settings
from hypothesis import strategies as st

from latticekit.drafting.arms import (
    ARM_DECAY,
    FIRST_PROBE,
    MAX_PROBE_INTERVAL,
    WARMUP_STEPS,
    ArmStats,
    choose_arm,
    probe_outcome,
)


def run(rates: dict[str, float], steps: int, plain_rate: float = 0.0) -> list[Optional[str]]:
    """Arms chosen over ``steps`` steps where each arm's every step brings ``rates[arm]`` tokens a second."""
    stats = {arm: ArmStats() for arm in rates}

    def worth(arm: str) -> float:
        return stats[arm].rate

    chosen: list[Optional[str]] = []
    for step in range(1, steps + 1):
        arm = choose_arm(list(rates), stats, worth, step, plain_rate)
        chosen.append(arm)
        if arm is None:
            continue
        stats[arm].add(rates[arm] * 0.1, 0.1, step)
        others = [worth(a) for a in rates if a != arm]
        probe_outcome(stats[arm], worth(arm) > max(others + [plain_rate]))
    return chosen


def test_every_arm_warms_up_then_the_best_is_kept_and_the_others_probed_ever_more_rarely() -> None:
    chosen = run({"a": 10.0, "b": 30.0, "c": 20.0}, 300)
    assert chosen[:3 * WARMUP_STEPS] == ["a", "a", "b", "b", "c", "c"]
    late = chosen[100:]
    assert late.count("b") / len(late) > 0.9
    for loser in ("a", "c"):
        at = [i for i, arm in enumerate(chosen) if arm == loser][WARMUP_STEPS:]
        gaps = [y - x for x, y in zip(at, at[1:])]
        assert gaps == sorted(gaps) and max(gaps) <= MAX_PROBE_INTERVAL + 3  # doubling, up to the cap
        assert gaps[0] >= FIRST_PROBE


def test_a_plain_step_where_no_arm_beats_it() -> None:
    chosen = run({"a": 10.0, "b": 12.0}, 200, plain_rate=50.0)
    late = chosen[100:]
    assert late.count(None) / len(late) > 0.85 and {"a", "b"} <= set(late)  # still probed


def test_an_outcome_decays_with_the_steps_since_the_arm_was_read() -> None:
    arm = ArmStats()
    arm.add(10, 1.0, 1)
    arm.add(0, 1.0, 4)
    assert arm.tokens == 10 * ARM_DECAY ** 3 and arm.seconds == 1.0 * ARM_DECAY ** 3 + 1.0
    arm.probing = True
    probe_outcome(arm, wins=False)
    assert arm.interval == 2 * FIRST_PROBE and not arm.probing
    arm.probing = True
    probe_outcome(arm, wins=True)
    assert arm.interval == FIRST_PROBE


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0.5, 100.0), min_size=1, max_size=4), st.floats(0.0, 120.0))
def test_the_choice_follows_the_rule_and_never_starves_an_arm(rates: list[float], plain: float) -> None:
    names = [f"arm{i}" for i in range(len(rates))]
    chosen = run(dict(zip(names, rates)), 200, plain_rate=plain)
    assert chosen[:WARMUP_STEPS * len(names)] == [n for n in names for _ in range(WARMUP_STEPS)]
    for name in names:  # probed at least every MAX_PROBE_INTERVAL steps (plus the other arms' probes)
        at = [i for i, arm in enumerate(chosen) if arm == name]
        assert max(y - x for x, y in zip([0] + at, at + [len(chosen)])) <= MAX_PROBE_INTERVAL + len(names) + 1
    best = max(names, key=lambda n: dict(zip(names, rates))[n])
    top = dict(zip(names, rates))[best]
    expect = best if top > plain else None
    late = chosen[150:]
    if all(abs(r - top) > 1e-6 * top for n, r in zip(names, rates) if n != best) and abs(top - plain) > 1e-6:
        assert late.count(expect) / len(late) >= 0.6
