"""Heads-free drafting: the static model's ranked successors, the cache model and the best-first
search against slow references (the core's scores, brute-force enumeration), and decodes that
equal greedy decoding."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import latticekit as lk
from arpa_gen import arpa_models, to_arpa
from decoding_helpers import ARPA, tiny_gpt2, tiny_llama
from latticekit.decoding import DecoderConfig, DecoderConfigError, decode, greedy_decode
from latticekit.drafting.cache_model import CacheModel
from latticekit.drafting.continuations import best_continuations
from latticekit.decoding.costs import StepCosts
from latticekit.drafting.successors import KatzSuccessors

VOCAB = 7  # the target's ids in the search tests: the random models' words are 0..4, 5 and 6 are not
COSTS = StepCosts([0, 1, 2, 4, 8, 16, 32, 64], [0.010] + [0.010 + 0.001 * n for n in (1, 2, 4, 8, 16, 32, 64)],
                  100, draft_s=0.001)


def model_of(tmp_path_factory: Any, ngrams: Any) -> lk.NGramLM:
    path = tmp_path_factory.mktemp("m") / "m.arpa"
    path.write_text(to_arpa(ngrams))
    return lk.NGramLM.from_arpa(path)


texts = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=24)


# -- the static model's successors -------------------------------------------------------------

@given(model=arpa_models(max_order=4, max_vocab=5), context=st.lists(st.integers(0, VOCAB - 1), max_size=5))
def test_katz_successors_score_as_the_core_and_rank_the_whole_vocabulary(tmp_path_factory: Any, model: Any,
                                                                       context: list[int]) -> None:
    lm = model_of(tmp_path_factory, model[0])
    state = KatzSuccessors.of(lm).state(context)
    want = {t: float(lm.token_logprobs([t], context=context)[0]) for t in range(VOCAB)}
    for t in range(VOCAB):
        assert state.logprob(t) == want[t]  # bit for bit: the same sums in the same order
    proposable = sorted((-want[t], t) for t in range(VOCAB) if str(t) in lm.words)
    ranked = []
    while state.ranked(len(ranked)) is not None:
        ranked.append(state.ranked(len(ranked)))
    assert [t for t, _ in ranked] == [t for _, t in proposable]
    assert [lp for _, lp in ranked] == [-s for s, _ in proposable]


def test_katz_successors_refuse_a_model_of_words(tmp_path: Path) -> None:
    path = tmp_path / "w.arpa"
    path.write_text(to_arpa({("<s>",): (-99.0, 0.0), ("</s>",): (-1.0, 0.0), ("cat",): (-0.5, 0.0)}))
    with pytest.raises(DecoderConfigError, match="token ids"):
        KatzSuccessors(lk.NGramLM.from_arpa(path))


# -- the cache model ---------------------------------------------------------------------------

def reference_match(text: list[int], full: list[int], max_order: int) -> tuple[int, list[int]]:
    """The longest context ending ``full`` that ``text`` holds followed by a token, and the tokens
    that followed it (one per occurrence)."""
    for n in range(min(max_order, len(full)), 0, -1):
        ctx = full[len(full) - n:]
        follow = [text[j + n] for j in range(len(text) - n) if text[j:j + n] == ctx]
        if follow:
            return n, follow
    return 0, []


def reference_logprob(model: CacheModel, lm: Optional[lk.NGramLM], text: list[int], full: list[int],
                      token: int) -> Optional[float]:
    """log P(token | full) under the cache model's definition, or None where the token is not
    proposed there (neither a follower of the match nor a static word below the vocabulary)."""
    n, follow = reference_match(text, full, model.max_order)
    in_static = lm is not None and str(token) in lm.words and token < model.vocab_size
    if token not in follow and not in_static:
        return None
    static = float(lm.token_logprobs([token], context=full)[0]) if lm is not None else -math.log(model.vocab_size)
    static = min(static, 0.0)  # random models are not normalised: a probability above 1 counts as 1
    if n == 0:
        return static
    lam = model.weight(n)
    return math.log(lam * follow.count(token) / len(follow) + (1 - lam) * math.exp(static))


@settings(max_examples=80)
@given(model=st.one_of(st.none(), arpa_models(max_order=3, max_vocab=5)), text=texts, p=st.integers(1, 25),
       max_depth=st.integers(1, 3), max_order=st.integers(1, 4))
def test_best_continuations_are_the_brute_force_best(tmp_path_factory: Any, model: Any, text: list[int], p: int,
                                                    max_depth: int, max_order: int) -> None:
    lm = model_of(tmp_path_factory, model[0]) if model is not None else None
    cache = CacheModel(lm, VOCAB, max_order=max_order)
    cache.sync(text)
    found = best_continuations(cache, text, p, max_depth)
    # every sequence of 1..max_depth proposable tokens, scored token by token
    everything: list[tuple[float, tuple[int, ...]]] = []
    frontier: list[tuple[float, tuple[int, ...]]] = [(0.0, ())]
    for _ in range(max_depth):
        nxt = []
        for score, path in frontier:
            for token in range(VOCAB):
                lp = reference_logprob(cache, lm, text, text + list(path), token)
                if lp is not None:
                    nxt.append((score + lp, path + (token,)))
        everything += nxt
        frontier = nxt
    want = sorted(everything, key=lambda sp: (-sp[0], sp[1]))[:p]
    got = list(zip(found.score.tolist(), found.paths()))
    assert len(got) == len(want)
    np.testing.assert_allclose([s for s, _ in got], [s for s, _ in want], rtol=1e-9, atol=1e-9)
    for (s, path), (t, other) in zip(got, want):  # equal, or a tie that rounding may order either way
        assert path == other or abs(s - t) < 1e-9
    if len(got) == len(everything):
        assert {path for _, path in got} == {path for _, path in everything}
    assert all(found.parents[i] < i for i in range(found.size))
    paths = found.paths()
    for i in range(found.size):  # parents are prefixes, conditionals and scores add up
        parent = found.parents[i]
        assert paths[i][:-1] == (paths[parent] if parent >= 0 else ())
        base = found.score[parent] if parent >= 0 else 0.0
        assert found.score[i] == pytest.approx(base + found.logprob[i], abs=1e-12)
        if lm is not None:
            context = text + list(paths[i][:-1])
            assert found.static_logprob[i] == lm.token_logprobs([paths[i][-1]], context=context)[0]


@settings(max_examples=60)
@given(text=texts, split=st.integers(0, 24), max_order=st.integers(1, 5))
def test_cache_weights_are_the_mean_posterior_of_the_cache(tmp_path_factory: Any, text: list[int], split: int,
                                                          max_order: int) -> None:
    lm = lk.NGramLM.from_arpa(ARPA)
    cache = CacheModel(lm, 4096, max_order=max_order, prior=(0.3, 0.6), prior_positions=2.0)
    cache.sync(text[:split])  # the text arrives in two parts
    cache.sync(text)
    responsibility, positions = np.zeros(max_order), np.zeros(max_order)
    fresh = CacheModel(lm, 4096, max_order=max_order, prior=(0.3, 0.6), prior_positions=2.0)
    for t in range(1, len(text)):
        n, follow = reference_match(text[:t], text[:t], max_order)
        if n:
            lam = fresh.weight(n)  # the weights as they stood before position t
            p_cache = lam * follow.count(text[t]) / len(follow)
            p_static = (1 - lam) * math.exp(lm.token_logprobs([text[t]], context=text[:t])[0])
            responsibility[n - 1] += p_cache / (p_cache + p_static)
            positions[n - 1] += 1
        fresh.responsibility, fresh.positions = responsibility.copy(), positions.copy()
    np.testing.assert_allclose(cache.responsibility, responsibility, rtol=1e-9)
    np.testing.assert_array_equal(cache.positions, positions)
    for n in range(1, max_order + 1):
        prior = 0.3 if n == 1 else 0.6
        assert cache.weight(n) == pytest.approx((2.0 * prior + responsibility[n - 1]) / (2.0 + positions[n - 1]))
    assert cache.ids == text


def test_cache_learns_that_the_text_repeats_and_starts_afresh_on_another_text() -> None:
    rng = np.random.default_rng(0)
    chunk = rng.integers(3, 3000, 60).tolist()
    cache = CacheModel(lk.NGramLM.from_arpa(ARPA), 4096)
    prior = [cache.weight(n) for n in range(1, 9)]
    cache.sync(chunk + chunk + chunk[:20])
    assert all(cache.weight(n) > w for n, w in zip(range(2, 9), prior[1:]))  # copying: the long matches win
    found = best_continuations(cache, cache.ids, 12, 8)
    assert found.paths()[:8] == [tuple(chunk[20:20 + j]) for j in range(1, 9)]  # the copy first, in full
    cache.sync([5, 6, 7])
    assert cache.ids == [5, 6, 7] and cache.positions.sum() <= 2


def test_cache_model_refuses_bad_arguments() -> None:
    with pytest.raises(DecoderConfigError):
        CacheModel(None, 10, max_order=0)
    with pytest.raises(DecoderConfigError):
        CacheModel(None, 10, prior=(1.0,))
    with pytest.raises(DecoderConfigError):
        CacheModel(None, 0)


# -- decoding ----------------------------------------------------------------------------------

PROMPT = [3, 17, 42, 8, 25, 60, 11, 3, 17, 42, 8, 25]


@pytest.mark.parametrize("make", [tiny_llama, tiny_gpt2])
@pytest.mark.parametrize("spec", ["headsfree", "headsfree:alpha=0", "headsfree:p=4", "auto"])
def test_headsfree_decodes_exactly_the_greedy_tokens(make: Any, spec: str) -> None:
    lm = lk.NGramLM.from_arpa(ARPA)
    for seed in range(2):
        model = make(seed)
        want = greedy_decode(model, PROMPT, 60).tokens
        out = decode(model, None, PROMPT, DecoderConfig.parse(spec), max_new_tokens=60, lms=lm, costs=COSTS)
        assert out.tokens == want
        assert all(s.lattice_tokens is None for s in out.steps)  # no heads read
        assert all(len(d) <= 12 for s in out.steps for d in s.drafts)


def test_headsfree_drafts_what_the_text_repeats() -> None:
    model = tiny_llama()
    want = greedy_decode(model, PROMPT, 80).tokens
    out = decode(model, None, PROMPT + want[:40], DecoderConfig.parse("headsfree:alpha=0"), max_new_tokens=40,
                 costs=COSTS)
    assert out.tokens == want[40:80]
    assert out.block_efficiency > 2  # tiny random models settle into loops: the cache copies them


def test_headsfree_with_heads_given_still_reads_none() -> None:
    from decoding_helpers import RandomHeads

    model = tiny_llama()
    out = decode(model, RandomHeads(model), PROMPT, DecoderConfig.parse("headsfree"), max_new_tokens=30,
                 lms=lk.NGramLM.from_arpa(ARPA), costs=COSTS)
    assert out.tokens == greedy_decode(model, PROMPT, 30).tokens
    assert all(s.lattice_tokens is None for s in out.steps)


def test_headsfree_samples_reproducibly() -> None:
    model = tiny_llama()
    config = DecoderConfig.parse("headsfree:temperature=0.8")
    runs = [decode(model, None, PROMPT, config, max_new_tokens=25, costs=COSTS,
                   generator=torch.Generator().manual_seed(1)).tokens for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0]) == 25


def test_headsfree_config_and_label() -> None:
    config = DecoderConfig.parse("headsfree")
    assert (config.k, config.p) == (1, 32) and config.label == "headsfree p=32 alpha=1"
    assert DecoderConfig.parse("headsfree:p=8,alpha=0").label == "headsfree p=8 alpha=0"


# -- review follow-ups: ties, spellings, bad arguments, acceptance priors --------------------------

def test_katz_successors_break_ties_by_token_id_whatever_the_file_order(tmp_path: Path) -> None:
    path = tmp_path / "t.arpa"  # equal unigrams listed out of numeric order: word ids 3 < 1 < 2 in the core
    path.write_text(to_arpa({("<s>",): (-99.0, 0.0), ("</s>",): (-1.0, 0.0), ("3",): (-0.7, 0.0),
                             ("1",): (-0.7, 0.0), ("2",): (-0.7, 0.0)}))
    state = KatzSuccessors.of(lk.NGramLM.from_arpa(path)).state([])
    assert [state.ranked(r)[0] for r in range(3)] == [1, 2, 3] and state.ranked(3) is None


def test_katz_successors_take_only_canonical_token_ids(tmp_path: Path) -> None:
    path = tmp_path / "s.arpa"  # "007" and "²" are words, not token ids: never proposed
    path.write_text(to_arpa({("<s>",): (-99.0, 0.0), ("</s>",): (-1.0, 0.0), ("007",): (-0.2, 0.0),
                             ("²",): (-0.3, 0.0), ("5",): (-0.9, 0.0)}))
    index = KatzSuccessors.of(lk.NGramLM.from_arpa(path))
    assert sorted(int(t) for t in index.token_of if t >= 0) == [5]
    assert index.state([]).ranked(0)[0] == 5 and index.state([]).ranked(1) is None


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_cache_model_refuses_bad_prior_positions(bad: float) -> None:
    with pytest.raises(DecoderConfigError, match="prior_positions"):
        CacheModel(None, 10, prior_positions=bad)


def test_cache_model_starts_afresh_on_a_text_that_only_shares_the_last_token() -> None:
    cache = CacheModel(None, 50)
    cache.sync([1, 2, 3, 4, 9])
    cache.sync([7, 7, 7, 7, 9, 10])  # longer, with the same token where the cached text ended: another text
    assert cache.ids == [7, 7, 7, 7, 9, 10]
    assert cache.match([7, 7, 7]) == 3 and cache.match([2, 3]) == 0


def test_acceptance_priors_trust_what_drafts() -> None:
    from latticekit.drafting.calibration import FEATURES, AcceptanceModel

    depth = 7
    for trust in ("head", "cache", "head+cache"):
        w = AcceptanceModel.prior(depth, trust=trust).weights
        names = trust.split("+")
        for j, name in enumerate(FEATURES):
            assert w[depth + j] == (4.0 / len(names) if name in names else 0.0)
    with pytest.raises(DecoderConfigError):
        AcceptanceModel.prior(depth, trust="heads")


def test_shipped_version_1_acceptance_loads_with_no_cache_weight() -> None:
    import json

    from latticekit.drafting.calibration import SHIPPED, AcceptanceModel

    for path in sorted(SHIPPED.glob("*.json")):
        data = json.loads(path.read_text())
        model = AcceptanceModel.load(path)
        if data["version"] == 1:
            assert len(model.weights) == len(data["weights"]) + 1 and model.weights[-1] == 0.0
            assert model.weights[:-1].tolist() == data["weights"]


def test_generate_without_heads_drafts_from_the_text_and_keeps_the_greedy_tokens() -> None:
    model = tiny_llama()
    want = greedy_decode(model, PROMPT, 80).tokens
    prompt = PROMPT + want[:40]
    out = lk.generate(model, prompt, lm=lk.NGramLM.from_arpa(ARPA), max_new_tokens=40, eos_token_id=[],
                      costs=COSTS, prepare=False)
    assert out.tokens == want[40:80]
    assert out.tokens_per_call > 1.5  # the text repeats itself: the cache drafts it
