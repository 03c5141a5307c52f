"""``auto``'s arm outcomes kept across calls: a call resumed from the last one's outcomes chooses
exactly as one long call would (the reference) whose outcome sums decay at the cut as over
:data:`KEPT_GAP` steps (the ageing), the store keeps them per key in memory and on disk, and a
damaged, foreign or older file is ignored."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from latticekit.drafting import DecoderConfig
from latticekit.drafting.arms import ARM_DECAY, KEPT_GAP, MAX_PROBE_INTERVAL
from latticekit.drafting.costs import StepCosts
from latticekit.drafting.drafters.auto import AutoDrafter
from latticekit.drafting.outcomes import OUTCOMES_VERSION, ArmOutcomes, ArmRecord, ArmStore, outcomes_key

PLAIN_S = 0.010


def _drafter(reads_heads: bool = True) -> AutoDrafter:
    costs = StepCosts([0, 64], [PLAIN_S, 0.074], 100)
    return AutoDrafter(DecoderConfig.parse("auto"), None, costs, vocab_size=50, reads_heads=reads_heads)


def _step(drafter: AutoDrafter, worth: dict[str, int], text_there: int) -> Optional[str]:
    """One step of the arm choice: the chosen arm brings ``worth[arm]`` tokens in a plain step's
    seconds; a union step also weighs the text alone there (``text_there`` tokens), paired."""
    drafter.steps += 1
    arm = drafter.choose_arm(PLAIN_S)
    if arm == "union" and "text" in drafter.arms:
        drafter.arm_stats["text"].add(text_there, PLAIN_S, drafter.steps)
        drafter.paired.add(worth["union"], PLAIN_S, text_there, PLAIN_S)
    if arm is not None:
        drafter.record(arm, worth[arm], PLAIN_S, PLAIN_S)
    return arm


worths = st.lists(st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4)), min_size=2, max_size=90)


@settings(max_examples=150, deadline=None)
@given(worths, st.data(), st.booleans())
def test_a_call_resumed_from_the_last_ones_outcomes_chooses_as_one_long_call(
        steps: list[tuple[int, int, int]], data: st.DataObject, heads: bool) -> None:
    cut = data.draw(st.integers(0, len(steps)))
    whole, first = _drafter(heads), _drafter(heads)
    for union, text, there in steps[:cut]:
        assert _step(whole, {"union": union, "text": text}, there) == _step(first, {"union": union, "text": text}, there)
    kept = ArmOutcomes.from_json(json.loads(json.dumps(first.arm_outcomes().to_json())))  # through a file's JSON
    gap = data.draw(st.sampled_from([0, 1, KEPT_GAP, 40]))
    second = _drafter(heads)
    if gap == KEPT_GAP:
        second.resume(kept)  # the default
    else:
        second.resume(kept, gap)
    _gap(whole, gap)
    for union, text, there in steps[cut:]:
        assert _step(second, {"union": union, "text": text}, there) == _step(whole, {"union": union, "text": text}, there)
    assert second.arm_outcomes() == whole.arm_outcomes()  # ``since`` counts from the last read: the same


def _gap(drafter: AutoDrafter, steps: int) -> None:
    """The reference of ageing, in one long call: at the cut, every outcome sum (each arm's and
    the union's paired ones) decays as over ``steps`` more steps; nothing else changes."""
    decay = ARM_DECAY ** steps
    for stats in drafter.arm_stats.values():
        stats.tokens, stats.seconds = stats.tokens * decay, stats.seconds * decay
    p = drafter.paired
    p.union_tokens, p.union_seconds, p.tokens, p.seconds = (decay * p.union_tokens, decay * p.union_seconds,
                                                            decay * p.tokens, decay * p.seconds)


def test_ageing_keeps_what_the_arms_are_worth_and_their_schedule() -> None:
    drafter = _drafter()
    for _ in range(12):
        _step(drafter, {"union": 3, "text": 2}, 2)
    aged = _drafter()
    aged.resume(drafter.arm_outcomes(), 0)
    before = {name: (s.tokens, s.rate, s.last, s.interval) for name, s in aged.arm_stats.items()}
    worth, paired = {arm: aged.worth(arm) for arm in aged.arms}, aged.paired.union_tokens
    aged.age(10)
    assert aged.paired.union_tokens == pytest.approx(paired * ARM_DECAY ** 10)
    assert {arm: aged.worth(arm) for arm in aged.arms} == pytest.approx(worth)
    for name, stats in aged.arm_stats.items():
        tokens, rate, last, interval = before[name]
        assert stats.tokens == pytest.approx(tokens * ARM_DECAY ** 10) and stats.rate == pytest.approx(rate)
        assert (stats.last, stats.interval) == (last, interval)
    aged.age(0)  # no gap: nothing changes
    assert aged.paired.union_tokens == pytest.approx(paired * ARM_DECAY ** 10)


def test_a_resumed_call_skips_the_warm_up_and_keeps_the_probe_schedule() -> None:
    first = _drafter()
    for _ in range(40):  # the union loses: probed less and less often
        _step(first, {"union": 1, "text": 3}, 3)
    kept = first.arm_outcomes()
    assert kept.arms["union"].interval > 2 and kept.arms["text"].steps > 2
    fresh, resumed = _drafter(), _drafter()
    resumed.resume(kept)
    arms = [_step(resumed, {"union": 1, "text": 3}, 3) for _ in range(8)]
    assert [_step(fresh, {"union": 1, "text": 3}, 3) for _ in range(2)] == ["union", "union"]  # the warm-up
    assert arms.count("union") <= 1 and arms[0] == "text"
    other = _drafter(reads_heads=False)  # outcomes of other arms: ignored
    other.resume(kept)
    assert other.arm_stats["text"].steps == 0


def test_a_call_unlike_the_kept_ones_turns_at_its_first_probe() -> None:
    """Outcomes kept where the union lost, then a call where it wins: aged, the union's first
    probe outweighs the kept history and it is read from then on; not aged (one long call),
    the stale paired history outweighs the probe and the union waits another interval."""
    first = _drafter()
    for _ in range(60):
        _step(first, {"union": 1, "text": 3}, 3)
    kept = first.arm_outcomes()
    assert kept.arms["union"].interval == MAX_PROBE_INTERVAL
    read = {}
    for gap in (0, KEPT_GAP):
        resumed = _drafter()
        resumed.resume(kept, gap)
        arms = [_step(resumed, {"union": 5, "text": 2}, 2) for _ in range(MAX_PROBE_INTERVAL + 10)]
        assert "union" in arms[:MAX_PROBE_INTERVAL]  # probed on its schedule
        read[gap] = arms[-10:].count("union")
    assert read[KEPT_GAP] >= 9
    assert read[0] <= 2


outcomes = st.builds(
    lambda arms, paired: ArmOutcomes(arms, paired),
    st.dictionaries(st.sampled_from(["union", "text", "heads"]),
                    st.builds(ArmRecord, st.floats(0, 1e6), st.floats(0, 1e3), st.integers(0, 10**6),
                              st.integers(0, 10**6), st.integers(1, 64)), min_size=1),
    st.tuples(*[st.floats(0, 1e6)] * 4))


@settings(max_examples=100, deadline=None)
@given(outcomes)
def test_the_store_keeps_outcomes_in_memory_and_on_disk(tmp_path_factory: pytest.TempPathFactory,
                                                        kept: ArmOutcomes) -> None:
    folder = tmp_path_factory.mktemp("arms")
    store = ArmStore(folder)
    assert store.get("k") is None
    store.put("k", kept)
    assert store.get("k") == kept
    assert ArmStore(folder).get("k") == kept  # another process: from the file
    assert ArmStore(folder).get("other") is None and ArmStore().get("k") is None
    assert [p.name for p in folder.iterdir()] == ["arms-k.json"]  # written whole: no temporary file left


def test_a_damaged_foreign_or_older_file_is_ignored_and_replaced(tmp_path: Path) -> None:
    good = ArmOutcomes({"text": ArmRecord(3.0, 0.01, 5, 1, 2)})
    bad = [b"", b"{", b"[]", b"\xff\xfe", json.dumps({**good.to_json(), "version": OUTCOMES_VERSION + 1}).encode()]
    row = good.to_json()["arms"]["text"]
    for broken in ([-1.0] + row[1:], row[:4] + [0], row[:2] + [2.5] + row[3:], [float("nan")] + row[1:], row[:3]):
        bad.append(json.dumps({**good.to_json(), "arms": {"text": broken}}).encode())
    bad.append(json.dumps({**good.to_json(), "paired": [0, 0, 0]}).encode())
    for data in bad:
        store = ArmStore(tmp_path)
        (tmp_path / "arms-k.json").write_bytes(data)
        assert store.get("k") is None, data
        store.put("k", good)
        assert ArmStore(tmp_path).get("k") == good


def test_the_store_is_cleared_and_survives_a_folder_it_cannot_write(tmp_path: Path) -> None:
    kept = ArmOutcomes({"text": ArmRecord(3.0, 0.01, 5, 1, 2)})
    store = ArmStore(tmp_path)
    store.put("a", kept)
    store.put("b", kept)
    (tmp_path / "step-costs-x.json").write_text("{}")  # not an arm file: left alone
    store.clear()
    assert store.get("a") is None and ArmStore(tmp_path).get("b") is None
    assert [p.name for p in tmp_path.iterdir()] == ["step-costs-x.json"]
    blocked = tmp_path / "file"
    blocked.write_text("")
    unwritable = ArmStore(blocked / "sub")  # its folder cannot be made
    unwritable.put("a", kept)
    assert unwritable.get("a") == kept  # kept in this process


def test_keys_differ_with_what_the_outcomes_depend_on() -> None:
    base = dict(model={"device": "cpu", "threads": 2}, heads="abc", arms=("union", "text"))
    keys = {outcomes_key(**base), outcomes_key(**{**base, "model": {"device": "cpu", "threads": 1}}),
            outcomes_key(**{**base, "heads": None}), outcomes_key(**{**base, "arms": ("text",)})}
    assert len(keys) == 4 and outcomes_key(**base) == outcomes_key(**dict(reversed(list(base.items()))))
    assert all(len(k) == 16 and os.path.basename(k) == k for k in keys)
