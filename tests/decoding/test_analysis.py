"""Analyses against hand-computed examples (no model needed)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from latticekit.decoding import DecoderConfig, Decoding, StepRecord
from latticekit.eval.analysis import (
    accepted_length,
    block_efficiency,
    blocks,
    h_max,
    head_entropy,
    max_run_length,
    repetition,
    step_times,
    wins_ties_losses,
)


def step(root: int, drafts: list, vanilla: tuple, emitted: tuple, entropy=None, times=(0.0, 0.0, 0.0)) -> StepRecord:
    return StepRecord(root_token=root, drafts=[tuple(d) for d in drafts], vanilla_draft=tuple(vanilla),
                      emitted=tuple(emitted), num_accepted=len(emitted) - 1,
                      head_entropy=None if entropy is None else np.asarray(entropy, dtype=float),
                      heads_s=times[0], search_s=times[1], model_s=times[2])


FIRST = step(9, [], (), (5,))


def test_block_efficiency_pools_tokens_and_calls() -> None:
    a = Decoding(DecoderConfig("vanilla"), [1], tokens=[1, 2, 3, 4, 5, 6], steps=[FIRST] * 2)
    b = Decoding(DecoderConfig("vanilla"), [1], tokens=[1, 2], steps=[FIRST] * 2)
    assert a.block_efficiency == 3.0 and b.block_efficiency == 1.0
    assert block_efficiency([a, b]) == 8 / 4  # pooled, not the mean of 3 and 1
    assert math.isnan(block_efficiency([]))


def test_accepted_length() -> None:
    assert accepted_length((4, 5, 6), (4, 5, 7)) == 2
    assert accepted_length((1, 5, 6), (4, 5, 7)) == 0
    assert accepted_length((4, 5), (4, 5, 7)) == 2
    assert accepted_length((4, 5, 7, 8), (4, 5, 7)) == 3  # matches the bonus too: at least 3


def test_repetition_by_hand() -> None:
    assert max_run_length([1, 1, 2, 2, 2, 3]) == 3
    assert max_run_length([1, 2, 3]) == 1
    assert max_run_length([]) == 0
    rep = repetition([(1, 1, 2), (3, 4, 5)])  # 1 identical pair of 4; runs 2 and 1
    assert rep.identical_pct == 25.0 and rep.mean_max_run == 1.5 and rep.blocks == 2
    rep = repetition([(7, 7, 7, 7)])
    assert rep.identical_pct == 100.0 and rep.mean_max_run == 4.0


def test_blocks_prepend_the_root_and_skip_undrafted_steps() -> None:
    steps = [FIRST, step(3, [(4, 4)], (4, 5), (4, 9))]
    assert blocks(steps, "vanilla") == [(3, 4, 5)]
    assert blocks(steps, "rescored") == [(3, 4, 4)]
    with pytest.raises(ValueError):
        blocks(steps, "best")


def test_h_max() -> None:
    assert h_max([0.5, 1.2, 1.8, 1.7, 2.0]) == 3
    assert h_max([3.0, 2.0, 1.0]) == 1
    assert h_max([1.0, 2.0, 3.0]) == 3
    assert h_max([1.0, 1.0]) == 1  # strictly rising
    assert h_max([]) == 0


def test_head_entropy() -> None:
    steps = [FIRST, step(1, [(2,)], (2,), (2, 3), entropy=[0.0, 1.0, 3.0]),
             step(3, [(4,)], (4,), (5,), entropy=[0.0, 3.0, 1.0])]
    stats = head_entropy(steps)
    np.testing.assert_allclose(stats.mean, [0.0, 2.0, 2.0])
    assert stats.h_max == 2 and stats.steps == 2
    np.testing.assert_allclose(stats.quantiles[1, 2], 2.0)  # median of head 2
    assert head_entropy([FIRST]).steps == 0


def test_wins_ties_losses_by_hand() -> None:
    steps = [
        FIRST,
        # win: rescored accepts 2; vanilla (8, 8, 8) repeats and accepts 0 -> repaired
        step(8, [(1, 2, 6)], (8, 8, 8), (1, 2, 3)),
        # tie: both accept 1 (same draft)
        step(2, [(5, 6, 7)], (5, 6, 7), (5, 9)),
        # tie: different drafts, both accept 0
        step(2, [(1, 2, 3)], (4, 5, 6), (7,)),
        # loss: rescored (2, 2, 2) repeats and accepts 0; vanilla's 3 is the bonus: it gets >= 1
        step(2, [(2, 2, 2)], (3, 4, 6), (3,)),
        # loss without introduced repetition
        step(2, [(9, 1, 2)], (7, 8, 9), (7,)),
    ]
    wtl = wins_ties_losses(steps)
    assert (wtl.wins, wtl.ties, wtl.losses) == (1, 2, 2)
    assert wtl.repaired_pct == 100.0 and wtl.introduced_pct == 50.0
    assert wtl.differ == 4


def test_step_times_in_ms() -> None:
    steps = [FIRST, step(1, [(2,)], (2,), (2,), times=(0.001, 0.002, 0.010)),
             step(1, [(2,)], (2,), (2,), times=(0.003, 0.004, 0.030))]
    times = step_times(steps)
    assert times.steps == 2
    np.testing.assert_allclose([times.heads_ms, times.search_ms, times.model_ms], [2.0, 3.0, 20.0])


def test_records_round_trip_through_json() -> None:
    record = step(1, [(2, 3)], (2, 4), (2, 5), entropy=[0.5, 1.5, 2.5])
    record.lattice_tokens = np.array([[1, 0], [2, 4], [3, 7]], dtype=np.int32)
    record.lattice_scores = np.zeros((3, 2), dtype=np.float32)
    again = StepRecord.from_json(record.to_json())
    assert again.drafts == record.drafts and again.emitted == record.emitted
    np.testing.assert_array_equal(again.lattice_tokens, record.lattice_tokens)
    np.testing.assert_allclose(again.head_entropy, record.head_entropy)
