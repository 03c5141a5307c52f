"""Drafting from several sources: which sources hold each node of a merged trie, the acceptance
estimates calibrated per source, and ``auto``'s choice of which sources to read, each against a
plain reference (brute force over the paths, one model at a time, a hand-worked schedule)."""

from __future__ import annotations

from typing import Optional

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from latticekit.drafting import DecoderConfig
from latticekit.drafting.calibration import SOURCES, AcceptanceModel, CandidateTree, SourceAcceptance
from latticekit.drafting.costs import StepCosts
from latticekit.drafting.arms import MAX_PROBE_INTERVAL
from latticekit.drafting.drafters.auto import AutoDrafter
from latticekit.errors import DecoderConfigError

paths_and_bits = st.lists(st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=4),
                                    st.sampled_from([1, 2, 4, 3, 6])), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(paths_and_bits)
def test_a_nodes_sources_are_those_of_every_path_through_it(items: list[tuple[list[int], int]]) -> None:
    paths = [p for p, _ in items]
    tree = CandidateTree.from_paths(paths, [[0.0] * len(p) for p in paths], path_sources=[b for _, b in items])
    assert tree.sources is not None
    for node, prefix in enumerate(tree.paths_to(range(tree.size))):
        want = 0
        for path, bits in items:
            if tuple(path[:len(prefix)]) == prefix:
                want |= bits
        assert tree.sources[node] == want
    unnamed = CandidateTree.from_paths(paths, [[0.0] * len(p) for p in paths])
    assert unnamed.sources is not None and not unnamed.sources.any()


def _models(seed: int, names: tuple[str, ...]) -> dict[str, AcceptanceModel]:
    rng = np.random.default_rng(seed)
    return {name: AcceptanceModel(rng.normal(size=7 + 3), learning_rate=0.1) for name in names}


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 30),
       st.sampled_from([("heads", "text"), ("text",), ("heads", "text", "memory")]))
def test_per_source_estimates_against_one_model_at_a_time(seed: int, n: int, names: tuple[str, ...]) -> None:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 10))
    sources = rng.integers(0, 8, size=n)
    labels = rng.integers(0, 2, size=n).astype(float)
    estimates = SourceAcceptance(_models(seed, names))
    reference = _models(seed, names)
    got = estimates.conditional(x, sources)
    for i in range(n):
        members = [m for name, m in reference.items() if sources[i] == 0 or sources[i] & SOURCES[name]]
        want = max((float(m.conditional(x[i:i + 1])[0]) for m in members), default=0.0)
        assert got[i] == pytest.approx(want, rel=1e-12, abs=1e-15)
    estimates.models[names[0]].learning_rate = reference[names[0]].learning_rate = 0.0  # one model frozen
    estimates.update(x, labels, sources)
    for name, model in reference.items():
        member = (sources == 0) | ((sources & SOURCES[name]) != 0)
        model.update(x[member], labels[member])
        # the core's one call (SourceSgd) runs each model's steps as AcceptanceModel.update does: exactly
        np.testing.assert_array_equal(estimates.models[name].weights, model.weights)
        assert estimates.models[name].updates == model.updates
    with pytest.raises(DecoderConfigError, match="features of shape"):
        estimates.update(x[:, :-1], labels, sources)
    with pytest.raises(DecoderConfigError, match="sources"):
        estimates.update(x, labels, sources[:-1])


def test_per_source_estimates_refuse_unknown_sources_and_mixed_widths() -> None:
    with pytest.raises(DecoderConfigError, match="sources"):
        SourceAcceptance({"lattice": AcceptanceModel.prior()})
    with pytest.raises(DecoderConfigError, match="width"):
        SourceAcceptance({"heads": AcceptanceModel.prior(7), "text": AcceptanceModel.prior(5)})


# -- which sources auto reads --------------------------------------------------------------------

PLAIN_S = 0.010


def _drafter(reads_heads: bool = True) -> AutoDrafter:
    costs = StepCosts([0, 64], [PLAIN_S, 0.074], 100)
    return AutoDrafter(DecoderConfig.parse("auto"), None, costs, vocab_size=50, reads_heads=reads_heads)


def _run(drafter: AutoDrafter, worth: dict[Optional[str], float], steps: int) -> list[Optional[str]]:
    """Drives the arm choice for ``steps`` steps, each arm bringing ``worth[arm]`` tokens per
    step of ``PLAIN_S``; returns the arm of each step (None: plain)."""
    out = []
    for _ in range(steps):
        drafter.steps += 1
        arm = drafter.choose_arm(PLAIN_S)
        out.append(arm)
        if arm is not None:
            drafter.record(arm, round(worth[arm]), PLAIN_S, PLAIN_S)
    return out


def test_auto_tries_every_arm_then_reads_the_best_and_probes_the_rest_less_and_less() -> None:
    drafter = _drafter()
    assert drafter.arms == ("union", "text") and drafter.sources == ("heads", "text")
    arms = _run(drafter, {"union": 2, "text": 3}, 80)
    assert arms[:4] == ["union", "union", "text", "text"]
    probes = [i for i, arm in enumerate(arms) if arm == "union"][2:]
    gaps = np.diff(probes).tolist()
    assert gaps == sorted(gaps) and gaps[-1] >= MAX_PROBE_INTERVAL  # doubling, up to the cap
    assert all(arm == "text" for i, arm in enumerate(arms[4:], 4) if i not in probes)


def test_auto_goes_plain_when_no_arm_beats_a_plain_step_and_follows_a_winning_probe() -> None:
    drafter = _drafter(reads_heads=False)
    assert drafter.arms == ("text",) and drafter.sources == ("text",)
    worth: dict[Optional[str], float] = {"text": 0.6}  # under one token per plain step: drafting loses
    arms = _run(drafter, worth, 40)
    assert arms.count("text") <= 2 + 5 and arms[-1] is None
    worth["text"] = 3.0  # the text starts paying: the next probe finds it, and it is read from then on
    arms = _run(drafter, worth, 40)
    first = arms.index("text")
    assert first <= MAX_PROBE_INTERVAL and all(arm == "text" for arm in arms[first + 3:])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=4), max_size=8),
       st.lists(st.integers(0, 2), max_size=6), st.integers(0, 3))
def test_what_greedy_verification_accepts_of_a_draft(
        paths: list[list[int]], text: list[int], root: int) -> None:
    from latticekit.drafting.tree import Draft

    draft = Draft.from_paths(paths)
    full = [9] * (root + 1) + text
    accepted, decided = draft.accepted(full, root + 1)
    got = accepted if decided else None
    for cut in range(len(full) + 1):  # the text in two pieces: the decoded ids, the step's tokens
        assert draft.accepted(full[:cut], root + 1, full[cut:]) == (accepted, decided)
    # brute force: the longest path of the tree that the text after the root begins with
    after = tuple(text)
    def common(p: tuple[int, ...]) -> int:
        return next((i for i, (a, b) in enumerate(zip(p, after)) if a != b), min(len(p), len(after)))

    longest = max((common(tuple(p)) for p in paths), default=0)
    extends = any(len(p) > len(after) and p[:len(after)] == after for p in map(tuple, paths))
    assert got == (None if extends else longest)
