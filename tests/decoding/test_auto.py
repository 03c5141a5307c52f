"""``auto``: step costs, acceptance estimates and the tree chooser against slow references, and
decodes that equal greedy decoding whatever the drafter chooses."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import latticekit as lk
from decoding_helpers import ARPA, PeekingHeads, RandomHeads, tiny_llama
from latticekit.decoding import DecoderConfig, DecoderConfigError, decode, greedy_decode
from latticekit.drafting.calibration import AcceptanceModel, CandidateTree, PendingLabels, logit, node_features
from latticekit.decoding.costs import StepCosts, monotone, step_costs
from latticekit.drafting.drafters.auto import choose_nodes
from latticekit.eval.replay import replay, trace_prompts

PROMPT = [3, 17, 42, 8, 25, 60, 11]
H = 5
NEW = 40


def flat_costs(plain: float = 0.010, per_node: float = 0.001, draft_s: float = 0.001,
               heads_s: float = 0.001) -> StepCosts:
    """A made-up device: a tree pass costs a plain step plus ``per_node`` seconds per node; a
    drafting step ``draft_s``, and ``heads_s`` more when it reads the heads."""
    nodes = [0, 1, 2, 4, 8, 16, 32, 64]
    return StepCosts(nodes, [plain] + [plain + per_node * n for n in nodes[1:]], 100, draft_s=draft_s,
                     heads_s=heads_s)


# -- step costs --------------------------------------------------------------------------------

def test_costs_interpolate_and_extrapolate() -> None:
    costs = StepCosts([0, 2, 6], [1.0, 2.0, 4.0], 50, row_token_s=0.01)
    assert costs.target_s(0) == 1.0 and costs.target_s(2) == 2.0
    assert costs.target_s(1) == pytest.approx(1.5) and costs.target_s(4) == pytest.approx(3.0)
    assert costs.target_s(10) == pytest.approx(6.0)  # the last segment's slope
    assert costs.target_s(2, cached=60) == pytest.approx(2.0 + 0.01 * 3 * 10)
    again = StepCosts.from_json(json.loads(json.dumps(costs.to_json())))
    assert again == costs
    for bad in ([1, 2], [0]), ([0, 0], [1.0, 1.0]):
        with pytest.raises(DecoderConfigError):
            StepCosts(list(bad[0]), list(bad[1]) + [0.0] * (len(bad[0]) - len(bad[1])), 1)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 10, allow_nan=False), min_size=1, max_size=12))
def test_monotone_is_the_closest_non_decreasing_sequence(values: list[float]) -> None:
    out = monotone(values)
    assert all(b >= a - 1e-12 for a, b in zip(out, out[1:]))
    assert sum(out) == pytest.approx(sum(values))  # pooling keeps block sums
    if all(b >= a for a, b in zip(values, values[1:])):
        assert out == pytest.approx(values)


def test_step_costs_are_measured_once_and_cached(tmp_path: Path) -> None:
    model = tiny_llama()
    measure = dict(sizes=(0, 1, 4), repeats=1, prefix_tokens=8, long_prefix=16)
    first = step_costs(model, cache_dir=tmp_path, **measure)
    files = list(tmp_path.glob("step-costs-*.json"))
    assert len(files) == 1 and first.description["cache_file"] == str(files[0])
    assert first.nodes == [0, 1, 4] and all(s > 0 for s in first.seconds)
    assert first.seconds[1:] == sorted(first.seconds[1:]) and min(first.seconds) == first.seconds[0]
    again = step_costs(model, cache_dir=tmp_path, **measure)
    assert again.seconds == first.seconds  # read back, not measured again
    files[0].write_text("{not json")
    redone = step_costs(model, cache_dir=tmp_path, **measure)
    assert json.loads(files[0].read_text())["seconds"] == redone.seconds
    with pytest.raises(DecoderConfigError, match="increase from 0"):
        step_costs(model, cache_dir=False, sizes=(1, 2))


# -- acceptance estimates ----------------------------------------------------------------------

paths_strategy = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=4), min_size=1, max_size=6)


@settings(max_examples=80, deadline=None)
@given(paths_strategy)
def test_candidate_tree_is_the_trie_of_the_paths(paths: list[list[int]]) -> None:
    head = [[-0.1 * (j + 1) - 0.01 * t for j, t in enumerate(path)] for path in paths]
    tree = CandidateTree.from_paths(paths, head)
    prefixes = {tuple(path[:j + 1]) for path in paths for j in range(len(path))}
    assert tree.size == len(prefixes)
    assert set(tree.paths_to(range(tree.size))) == prefixes
    assert all(tree.parents[i] < i for i in range(tree.size))
    for i, prefix in enumerate(tree.paths_to(range(tree.size))):
        assert tree.depths[i] == len(prefix)
        assert tree.head_logprob[i] == pytest.approx(-0.1 * len(prefix) - 0.01 * prefix[-1])
    conditional = np.linspace(0.9, 0.1, tree.size)
    probability = tree.path_probability(conditional)
    for i, prefix in enumerate(tree.paths_to(range(tree.size))):
        ancestors = [tree.paths_to(range(tree.size)).index(prefix[:j + 1]) for j in range(len(prefix))]
        assert probability[i] == pytest.approx(np.prod(conditional[ancestors]))


@settings(max_examples=80, deadline=None)
@given(paths_strategy, st.lists(st.integers(0, 3), min_size=0, max_size=6), st.integers(0, 5))
def test_pending_labels_equal_the_obvious_labelling(paths: list[list[int]], text: list[int], split: int) -> None:
    tree = CandidateTree.from_paths(paths, [[-1.0] * len(p) for p in paths])
    features = np.arange(tree.size, dtype=float)[:, None]  # a node's index, to find it again
    ids = [9, 9, 9] + text  # the root is ids[2]
    pending = PendingLabels()
    pending.add(2, tree, features)
    got: dict[int, float] = {}
    for end in sorted({min(split, len(text)), len(text)}):  # the text arrives in two parts
        feats, labels = pending.resolve(ids[: 3 + end])
        for f, y in zip(feats, labels):
            assert int(f[0]) not in got  # each node is labelled once
            got[int(f[0])] = y
    want = {}
    for i, prefix in enumerate(tree.paths_to(range(tree.size))):
        depth = len(prefix)
        if depth <= len(text) and list(prefix[:-1]) == text[: depth - 1]:
            want[i] = float(prefix[-1] == text[depth - 1])
    assert got == want


def test_acceptance_prior_trusts_the_heads_and_learns_from_labels() -> None:
    tree = CandidateTree.from_paths([[1, 2], [3]], [[np.log(0.8), np.log(0.3)], [np.log(0.05)]])
    model = AcceptanceModel.prior(max_depth=3)
    x = node_features(tree, 3)
    np.testing.assert_allclose(model.conditional(x), [0.8, 0.3, 0.05], rtol=1e-6)
    for _ in range(30):  # a head that is always wrong
        model.update(x, np.zeros(tree.size))
    assert model.conditional(x).max() < 0.3 and model.updates == 90
    np.testing.assert_allclose(logit(np.log([0.5, 1.0])), [0.0, 8.0], atol=1e-9)


def test_acceptance_fit_and_round_trip(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    depths = rng.integers(1, 4, 3000)
    head = np.log(rng.uniform(0.01, 0.99, 3000))
    truth = 1 / (1 + np.exp(-(0.5 * logit(head) - 0.7 * depths)))
    tree = CandidateTree(np.zeros(3000, dtype=np.int64), -np.ones(3000, dtype=np.int64), depths, head,
                         np.full(3000, np.nan))
    x = node_features(tree, 3)
    y = (rng.uniform(size=3000) < truth).astype(float)
    fitted = AcceptanceModel.fit(x, y, 3)
    assert np.abs(fitted.conditional(x) - truth).mean() < 0.05
    fitted.save(tmp_path / "acc.json", {"what": "test"})
    loaded = AcceptanceModel.load(tmp_path / "acc.json")
    np.testing.assert_array_equal(loaded.weights, fitted.weights)
    (tmp_path / "bad.json").write_text('{"format": "other"}')
    with pytest.raises(DecoderConfigError, match="not a readable acceptance model"):
        AcceptanceModel.load(tmp_path / "bad.json")
    with pytest.raises(DecoderConfigError):
        AcceptanceModel(np.array([np.nan, 1.0, 0.0]))


# -- the tree chooser --------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(paths_strategy, st.integers(0, 2**16), st.floats(0.0001, 0.01), st.floats(0.0, 0.3))
def test_chosen_tree_is_the_best_prefix_closed_set(paths: list[list[int]], seed: int, per_node: float,
                                                  jump: float) -> None:
    tree = CandidateTree.from_paths(paths, [[-1.0] * len(p) for p in paths])
    rng = np.random.default_rng(seed)
    probability = tree.path_probability(rng.uniform(0, 1, tree.size))
    nodes = list(range(0, 40))
    costs = StepCosts(nodes, [0.01] + [0.01 * (1 + jump) + per_node * n for n in nodes[1:]], 10)
    chosen, expected, seconds = choose_nodes(probability, tree.depths, costs, 10, max_nodes=64)
    chosen_set = set(chosen.tolist())
    assert all(tree.parents[i] < 0 or tree.parents[i] in chosen_set for i in chosen_set)  # prefix-closed
    assert expected == pytest.approx(1 + probability[list(chosen_set)].sum())
    best = 0.0
    for size in range(tree.size + 1):  # every prefix-closed subset, by brute force
        for subset in itertools.combinations(range(tree.size), size):
            members = set(subset)
            if all(tree.parents[i] < 0 or tree.parents[i] in members for i in members):
                best = max(best, (1 + probability[list(members)].sum()) / costs.target_s(size, 10))
    assert expected / seconds == pytest.approx(best, rel=1e-9)


# -- decoding ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def lm() -> lk.NGramLM:
    return lk.NGramLM.from_arpa(ARPA)


@pytest.fixture(scope="module")
def setup() -> tuple[Any, list[int], PeekingHeads]:
    model = tiny_llama()
    reference = PROMPT + greedy_decode(model, PROMPT, NEW + H).tokens
    return model, reference, PeekingHeads(model, reference, num_heads=H)


def test_auto_defaults_and_label() -> None:
    config = DecoderConfig.parse("auto")
    assert (config.k, config.p) == (16, 16) and config.label == "auto k=16 p=16 alpha=1"
    assert DecoderConfig("vanilla").k == 1 and DecoderConfig.parse("auto:k=4,p=2").p == 2


@pytest.mark.parametrize("spec", ["auto", "auto:k=4,p=8,alpha=0.5", "auto:alpha=0"])
def test_auto_decodes_exactly_the_greedy_tokens(setup: Any, lm: lk.NGramLM, spec: str) -> None:
    model, reference, heads = setup
    out = decode(model, heads, PROMPT, DecoderConfig.parse(spec), max_new_tokens=NEW, lms=lm, costs=flat_costs())
    assert out.tokens == reference[len(PROMPT): len(PROMPT) + NEW]
    assert sum(s.num_accepted for s in out.steps) > 5  # good heads: it drafts and drafts pay
    assert out.block_efficiency > 1.2


def test_auto_stops_reading_heads_that_do_not_pay(setup: Any, lm: lk.NGramLM) -> None:
    model, reference, _ = setup
    bad = RandomHeads(model, num_heads=H)
    out = decode(model, bad, PROMPT, DecoderConfig.parse("auto"), max_new_tokens=60, lms=lm,
                 costs=flat_costs(per_node=0.002, draft_s=0.001, heads_s=0.003))
    assert out.tokens == greedy_decode(model, PROMPT, 60).tokens
    read = [i for i, s in enumerate(out.steps) if s.lattice_tokens is not None]
    assert len(read) <= len(out.steps) // 3  # it stops reading them ...
    assert read[-1] > 20 and read[-1] - read[-2] >= 8  # ... and probes them less and less often
    assert sum(1 for s in out.steps if s.drafts and s.lattice_tokens is None) >= 8  # the text drafts on


def test_auto_reads_heads_that_pay(setup: Any, lm: lk.NGramLM) -> None:
    model, _, heads = setup  # heads that know the continuation: the union's candidates
    out = decode(model, heads, PROMPT, DecoderConfig.parse("auto"), max_new_tokens=NEW, lms=lm,
                 costs=flat_costs(per_node=0.002, draft_s=0.001, heads_s=0.003))
    read = [i for i, s in enumerate(out.steps) if s.lattice_tokens is not None]
    assert len(read) >= len(out.steps) * 2 // 3


def test_auto_samples_losslessly_enough_to_run(setup: Any, lm: lk.NGramLM) -> None:
    model, _, heads = setup
    config = DecoderConfig.parse("auto:temperature=0.8")
    out = decode(model, heads, PROMPT, config, max_new_tokens=20, lms=lm, costs=flat_costs(),
                 generator=torch.Generator().manual_seed(0))
    assert len(out.tokens) == 20


@pytest.mark.parametrize("method", ["heads", "headsfree"])
def test_replayed_cost_aware_drafting_takes_the_decoded_steps(setup: Any, lm: lk.NGramLM, method: str) -> None:
    # (auto and heads+ngram unite the lattice's columns with the text's tokens, scored by the
    # heads, which a trace's top-k lattices cannot: their replay is close, not exact)
    model, _, heads = setup
    config = DecoderConfig.parse(f"{method}:k=4,p=8")
    trace = trace_prompts(model, heads, [PROMPT], NEW + H - 1, k=4)[0]
    real = decode(model, heads, PROMPT, config, max_new_tokens=NEW, lms=lm, costs=flat_costs())
    again = replay(trace, config, NEW, lms=lm, costs=flat_costs())
    assert [s.drafts for s in again.steps] == [s.drafts for s in real.steps]
    assert [s.emitted for s in again.steps] == [s.emitted for s in real.steps]
    with pytest.raises(DecoderConfigError, match="step costs"):
        replay(trace, config, NEW, lms=lm)


def test_shipped_acceptance_models_match_their_heads(setup: Any, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from latticekit.drafting import calibration
    from latticekit.heads import heads_fingerprint

    model, _, heads = setup
    monkeypatch.setattr(calibration, "SHIPPED", tmp_path)
    assert calibration.shipped_acceptance(heads_fingerprint(heads)) is None
    fitted = AcceptanceModel(np.arange(9, dtype=float) / 10, learning_rate=0.01)
    fitted.save(tmp_path / "these-heads.json", {"heads_fingerprint": heads_fingerprint(heads)})
    (tmp_path / "broken.json").write_text("{")
    found = calibration.shipped_acceptance(heads_fingerprint(heads))
    assert found is not None and found.learning_rate == 0.01
    np.testing.assert_array_equal(found.weights, fitted.weights)
    assert calibration.shipped_acceptance(RandomHeads(model, num_heads=H)) is None
    assert calibration.shipped_acceptance(None) is None


def test_the_heads_estimates_start_from_the_acceptance_shipped_for_them(
        setup: Any, lm: lk.NGramLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from latticekit.drafting import calibration, make_drafter
    from latticekit.heads import heads_fingerprint

    model, _, heads = setup
    monkeypatch.setattr(calibration, "SHIPPED", tmp_path)
    fitted = AcceptanceModel(np.linspace(-1, 1, H - 1 + 3), learning_rate=0.01)
    fitted.save(tmp_path / "these-heads.json", {"heads_fingerprint": heads_fingerprint(heads)})
    fingerprint = heads_fingerprint(heads)
    for spec in ("auto", "heads", "heads+ngram"):  # what a decode with heads builds
        drafter = make_drafter(DecoderConfig.parse(spec), lms=lm, has_heads=True, heads_fingerprint=fingerprint,
                               costs=flat_costs())
        models = drafter.acceptance.models
        np.testing.assert_array_equal(models["heads"].weights, fitted.weights)  # the heads' own nodes
        assert set(models) == ({"heads"} if spec == "heads" else {"heads", "text"})
        if "text" in models:  # the text's nodes: the cache model at its word
            assert models["text"].weights[-1] > 0 and not np.array_equal(models["text"].weights, fitted.weights)
    for spec in ("auto", "headsfree"):  # no heads: no heads' model
        plain = make_drafter(DecoderConfig.parse(spec), lms=lm, heads_fingerprint=fingerprint, costs=flat_costs())
        assert set(plain.acceptance.models) == {"text"} and plain.acceptance.models["text"].weights[-1] > 0


# -- earlier answers ------------------------------------------------------------------------------

def test_auto_drafts_from_earlier_answers_and_remembers_its_own(setup: Any, lm: lk.NGramLM) -> None:
    from latticekit.drafting import make_drafter
    from latticekit.drafting.calibration import SOURCES
    from latticekit.drafting.memory import AnswerMemory
    from latticekit.drafting.protocol import DraftInput

    model, reference, heads = setup
    memory = AnswerMemory(10_000)
    config = DecoderConfig.parse("auto:alpha=0")  # the text's cache alone: what it cannot know, memory must
    first = decode(model, None, PROMPT, config, max_new_tokens=NEW, costs=flat_costs(), memory=memory)
    assert memory.answers == [tuple(first.tokens)]
    assert memory.model.match(list(PROMPT[-2:]) + list(first.tokens[:1])) == 3  # counted after the prompt's end
    again = decode(model, None, PROMPT, config, max_new_tokens=NEW, costs=flat_costs(), memory=memory)
    assert again.tokens == first.tokens == reference[len(PROMPT): len(PROMPT) + NEW]
    assert again.block_efficiency > first.block_efficiency + 1  # the second copies the first answer
    assert len(memory.answers) == 2
    # every node names its sources: the text's continuations, the memory's, both
    drafter = make_drafter(config, costs=flat_costs(), vocab_size=64, memory=memory)
    assert drafter.sources == ("text", "memory")
    ids = PROMPT + first.tokens[:3]
    tree = drafter.candidates(DraftInput(ids, lambda *a: None), "text")
    from latticekit.drafting.continuations import best_continuations
    from latticekit.drafting.memory import memory_continuations

    text = set(best_continuations(drafter.cache_model(ids), ids, 32, 12).paths())
    held = set(memory_continuations(memory, ids, 32, 12).paths())
    assert tree.sources is not None and held - text  # the memory proposes what the text cannot
    for path, bits in zip(tree.paths_to(range(tree.size)), tree.sources.tolist()):
        assert bits == (SOURCES["text"] if path in text else 0) | (SOURCES["memory"] if path in held else 0)


# -- arm outcomes kept across calls -----------------------------------------------------------------

def _lattice_reads(out: Any) -> list[int]:
    return [i for i, s in enumerate(out.steps) if s.lattice_tokens is not None]


def test_a_second_call_starts_from_the_first_calls_arm_outcomes(setup: Any, lm: lk.NGramLM, tmp_path: Path) -> None:
    from latticekit.decoding.loop import arms_key
    from latticekit.drafting import make_drafter
    from latticekit.drafting.outcomes import ArmStore
    from latticekit.heads.fingerprint import cached_heads_fingerprint

    model, _, _ = setup
    bad = RandomHeads(model, num_heads=H)  # heads that never pay: a fresh call reads them to learn that
    costs = flat_costs(per_node=0.002, draft_s=0.001, heads_s=0.003)  # fixed seconds: deterministic choices
    want = greedy_decode(model, PROMPT, 60).tokens
    store = ArmStore(tmp_path)
    run = lambda arms: decode(model, bad, PROMPT, DecoderConfig.parse("auto"), max_new_tokens=60, lms=lm,  # noqa: E731
                              costs=costs, arms=arms)
    fresh = run(None)
    first, second = run(store), run(store)
    assert fresh.tokens == first.tokens == second.tokens == want
    assert _lattice_reads(first) == _lattice_reads(fresh)  # an empty store: a fresh call
    assert _lattice_reads(fresh)[:2] == [1, 2]  # the warm-up reads the heads (step 0: the prompt's) ...
    assert len(_lattice_reads(second)) < len(_lattice_reads(first)) and _lattice_reads(second)[0] > 2  # ... once
    # what the first call kept, read back from its file in another process, starts the same second call
    fingerprint = cached_heads_fingerprint(bad)
    drafter = make_drafter(DecoderConfig.parse("auto"), lms=lm, vocab_size=64, has_heads=True, costs=costs,
                           heads_fingerprint=fingerprint)
    key = arms_key(model, fingerprint, drafter)
    elsewhere = ArmStore(tmp_path / "elsewhere")
    first_only = ArmStore(tmp_path / "first")
    run(first_only)
    kept = ArmStore(tmp_path / "first").get(key)
    assert kept is not None and kept.arms["union"].interval > 2
    elsewhere.put(key, kept)
    assert _lattice_reads(run(elsewhere)) == _lattice_reads(second)
    store.clear()  # forgotten: the next call is fresh again
    assert store.get(key) is None and _lattice_reads(run(store)) == _lattice_reads(fresh)


def test_arm_outcomes_are_not_shared_across_models_heads_or_threads(setup: Any, lm: lk.NGramLM, tmp_path: Path) -> None:
    from latticekit.decoding.loop import arms_key
    from latticekit.drafting import make_drafter
    from latticekit.drafting.outcomes import ArmStore

    model, _, _ = setup
    other = tiny_llama(seed=1)
    other.config.num_hidden_layers = 2  # same shape: told apart by its name
    other.config.name_or_path = "another/model"
    costs = flat_costs(per_node=0.002, draft_s=0.001, heads_s=0.003)
    store = ArmStore(tmp_path)
    for target in (model, other):
        bad = RandomHeads(target, num_heads=H)
        fresh = decode(target, bad, PROMPT, DecoderConfig.parse("auto"), max_new_tokens=40, lms=lm, costs=costs)
        kept = decode(target, bad, PROMPT, DecoderConfig.parse("auto"), max_new_tokens=40, lms=lm, costs=costs,
                      arms=store)
        assert _lattice_reads(kept) == _lattice_reads(fresh)  # the other model's outcomes are not its own
        assert kept.tokens == greedy_decode(target, PROMPT, 40).tokens
    assert len(list(tmp_path.glob("arms-*.json"))) == 2
    drafter = make_drafter(DecoderConfig.parse("auto"), lms=lm, vocab_size=64, has_heads=True, costs=costs)
    plain = make_drafter(DecoderConfig.parse("auto"), lms=lm, vocab_size=64, costs=costs)
    keys = {arms_key(model, "a", drafter), arms_key(model, "b", drafter), arms_key(model, None, plain),
            arms_key(other, "a", drafter)}
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        keys.add(arms_key(model, "a", drafter))
    finally:
        torch.set_num_threads(threads)
    assert len(keys) == 5


def test_generate_keeps_arm_outcomes_by_default_and_not_when_told_not_to(setup: Any, lm: lk.NGramLM, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from latticekit.decoding.loop import default_arm_store

    model, reference, heads = setup
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = tmp_path / "latticekit"
    for arms in (False, None):  # None: no store either
        out = lk.generate(model, PROMPT, heads=heads, lm=lm, max_new_tokens=NEW, eos_token_id=[], costs=flat_costs(),
                          arms=arms)
        assert out.tokens == reference[len(PROMPT): len(PROMPT) + NEW] and not folder.exists()
    for more in ({}, {"arms": True}):  # {}: generate's default
        out = lk.generate(model, PROMPT, heads=heads, lm=lm, max_new_tokens=NEW, eos_token_id=[], costs=flat_costs(),
                          **more)
        assert out.tokens == reference[len(PROMPT): len(PROMPT) + NEW]
        assert len(list(folder.glob("arms-*.json"))) == 1 and default_arm_store().folder == folder
    default_arm_store().clear()
    assert not list(folder.glob("arms-*.json"))
