"""AnswerMemory against a brute-force reference: which answers it keeps (the size limit at every
moment, the oldest evicted first), the followers and match it counts over the kept answers
(no context reaching from one answer into the next, but into the tokens given before it, which
are not counted themselves), and the search over it."""

from __future__ import annotations

import math
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from latticekit.drafting.memory import (DEFAULT_CONTEXT, AnswerMemory, default_memory, memory_continuations,
                                        united_with_memory)
from latticekit.drafting.continuations import Continuations
from latticekit.errors import DecoderConfigError, LatticeError

ORDER = 3
answers_st = st.lists(st.lists(st.integers(0, 4), min_size=0, max_size=12), min_size=1, max_size=14)
#: (context, answer): the tokens before an answer (a prompt's end), often none
contexts_st = st.lists(st.tuples(st.lists(st.integers(0, 5), max_size=5) | st.just([]),
                                 st.lists(st.integers(0, 4), min_size=0, max_size=12)), min_size=1, max_size=14)

Kept = list[tuple[tuple[int, ...], tuple[int, ...]]]


def reference_kept(added: list[tuple[list[int], list[int]]], max_tokens: int, order: int) -> Kept:
    """The (context, answer) pairs kept after each add, as the module docstring says: an answer
    that would pass the limit evicts the oldest, down to half the limit with it (a longer one
    keeps its tail, and no context); an answer keeps its context's last ``order`` tokens (the
    memory's ``context``)."""
    kept: Kept = []
    for context, answer in added:
        if not answer:
            continue
        new = tuple(answer[-max_tokens:])
        before = tuple(context[max(0, len(context) - order):]) if len(answer) <= max_tokens else ()
        if sum(len(a) for _, a in kept) + len(new) > max_tokens:
            budget, keep = max(max_tokens // 2, len(new)) - len(new), []
            for old in reversed(kept):
                if len(old[1]) > budget:
                    break
                keep.append(old)
                budget -= len(old[1])
            kept = list(reversed(keep))
        kept.append((before, new))
    return kept


def reference_followers(kept: Kept, context: tuple[int, ...]) -> Counter[int]:
    """Tokens of an answer that followed ``context`` (within the answer and the tokens before
    it), counted over every kept answer."""
    n, out = len(context), Counter[int]()
    for before, answer in kept:
        text = before + answer
        for i in range(max(n, len(before)), len(text)):
            if text[i - n:i] == context:
                out[text[i]] += 1
    return out


def reference_match(kept: Kept, tail: list[int], order: int) -> int:
    n = 0
    while n < min(order, len(tail)) and reference_followers(kept, tuple(tail[len(tail) - n - 1:])):
        n += 1
    return n


@settings(max_examples=150)
@given(added=contexts_st, max_tokens=st.integers(1, 40), tails=st.lists(st.lists(st.integers(0, 5), max_size=5),
                                                                          min_size=1, max_size=6),
       kept_context=st.integers(0, ORDER))
def test_memory_equals_brute_force(added: list[tuple[list[int], list[int]]], max_tokens: int,
                                   tails: list[list[int]], kept_context: int) -> None:
    memory = AnswerMemory(max_tokens, max_order=ORDER, context=kept_context)
    for i, (context, answer) in enumerate(added):
        memory.add(answer, context=context)
        assert len(memory) <= max_tokens  # the limit holds at every moment
        assert memory.answers == [a for _, a in reference_kept(added[:i + 1], max_tokens, kept_context)]
    kept = reference_kept(added, max_tokens, kept_context)
    assert len(memory) == sum(len(a) for _, a in kept)
    assert len(memory.model.cache) == sum(len(b) + len(a) for b, a in kept)  # the contexts held, uncounted
    for tail in tails:
        n = memory.model.match(tail)
        assert n == reference_match(kept, tail, ORDER)
        for m in range(1, n + 1):
            counts, total = memory.model.followers(tail, m)
            want = reference_followers(kept, tuple(tail[len(tail) - m:]))
            assert counts == dict(want) and total == sum(want.values())


@settings(max_examples=60)
@given(added=answers_st, tail=st.lists(st.integers(0, 4), min_size=1, max_size=5))
def test_search_drafts_only_what_an_answer_continues(added: list[list[int]], tail: list[int]) -> None:
    memory = AnswerMemory(1000, max_order=ORDER)
    for answer in added:
        memory.add(answer)
    found = memory_continuations(memory, tail, 16, 4)
    kept = [((), a) for a in memory.answers]
    for path in found.paths():  # every node continues the matched tail inside one answer
        text = tail + list(path)
        n = reference_match(kept, text[:-1], ORDER)
        assert n >= 1 and reference_followers(kept, tuple(text[len(text) - 1 - n:-1]))[path[-1]] > 0
    assert np.all(np.diff(found.score) <= 1e-12)  # best first
    if reference_match(kept, tail, ORDER) == 0:
        assert found.size == 0


def test_answers_do_not_run_into_each_other() -> None:
    memory = AnswerMemory(100, max_order=4)
    memory.add([1, 2, 3])
    memory.add([4, 5, 6])
    # the end of one answer followed by the start of the next was never a text
    assert memory.model.match([3, 4]) == 1 and memory.model.match([2, 3]) == 0  # 3 ends an answer
    assert memory_continuations(memory, [9, 3], 8, 3).size == 0
    assert memory_continuations(memory, [9, 2], 8, 3).paths() == [(3,)]
    assert memory_continuations(memory, [4], 8, 3).paths() == [(5,), (5, 6)]


def test_an_answer_is_counted_after_its_context() -> None:
    """The prompt's end before an answer: the answer's first tokens follow it (a chat turn's
    opening matched on the whole turn), its own tokens are followers of nothing."""
    memory = AnswerMemory(100, max_order=4, context=4)
    memory.add([7, 8, 9], context=[1, 2, 3, 4, 5, 6])  # its last 4 tokens kept
    memory.add([7, 1, 1], context=[])
    assert memory.model.match([4, 5, 6]) == 3 and memory.model.followers([4, 5, 6], 3) == ({7: 1}, 1)
    assert memory.model.match([2, 3]) == 0  # a context token follows it: not counted
    assert memory.model.match([9, 3, 4]) == 0  # nor [3, 4] nor [4]: 5, a context token, follows them
    assert memory_continuations(memory, [5, 6], 8, 3).paths() == [(7,), (7, 8), (7, 8, 9)]
    assert memory.model.followers([7], 1) == ({8: 1, 1: 1}, 2) and len(memory) == 6
    with pytest.raises(DecoderConfigError):
        memory.add([1], context=[-1])
    assert len(memory) == 6
    assert AnswerMemory(100).context == DEFAULT_CONTEXT == 2
    shorter = AnswerMemory(100, max_order=4, context=2)  # at most 2 tokens of a context
    shorter.add([7, 8, 9], context=[1, 2, 3, 4, 5, 6])
    assert shorter.model.match([4, 5, 6, 7]) == 3 and len(shorter.model.cache) == 5  # "4" not kept
    for bad in (-1, 5, True, 1.5):
        with pytest.raises(DecoderConfigError):
            AnswerMemory(100, max_order=4, context=bad)  # type: ignore[arg-type]


def test_eviction_is_oldest_first_and_the_limit_holds() -> None:
    memory = AnswerMemory(10)
    for k in range(6):
        memory.add([k] * 3)
        assert len(memory) <= 10
        if k == 3:  # 9 + 3 > 10: down to half the limit (5 tokens) with the newcomer: itself alone
            assert memory.answers == [(3, 3, 3)]
    assert memory.answers == [(3, 3, 3), (4, 4, 4), (5, 5, 5)]
    assert memory.model.match([0]) == 0 and memory.model.match([5]) == 1
    memory.add(list(range(20)))  # longer than the limit: its last 10 tokens
    assert memory.answers == [tuple(range(10, 20))] and len(memory) == 10
    memory.clear()
    assert len(memory) == 0 and memory.answers == [] and memory_continuations(memory, [11], 4, 2).size == 0


def test_bad_arguments_are_typed_errors() -> None:
    for bad in (0, -3, 2.5, True, "8"):
        with pytest.raises(DecoderConfigError):
            AnswerMemory(bad)  # type: ignore[arg-type]
    with pytest.raises(DecoderConfigError):
        AnswerMemory(8, max_order=0)
    memory = AnswerMemory(8)
    with pytest.raises(DecoderConfigError):
        memory.add([1, -2])
    with pytest.raises(DecoderConfigError):
        memory.add([2**40])
    with pytest.raises(DecoderConfigError):
        memory_continuations(memory, [1], 4, 0)
    assert len(memory) == 0


def test_default_memory_is_one_per_process() -> None:
    assert default_memory() is default_memory()


def test_threads_share_a_memory() -> None:
    memory = AnswerMemory(500, max_order=4)

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(200):
            memory.add(rng.integers(0, 6, rng.integers(1, 30)).tolist())
            memory_continuations(memory, rng.integers(0, 6, 4).tolist(), 8, 4)
            assert len(memory) <= 500

    with ThreadPoolExecutor(3) as pool:
        list(pool.map(work, range(3)))  # a thread's exception is raised here
    assert len(memory) == sum(map(len, memory.answers)) == len(memory.model.cache)
    assert math.isfinite(memory.model.weight(1))



@settings(max_examples=60)
@given(text=st.lists(st.integers(0, 4), min_size=1, max_size=30), added=answers_st)
def test_united_tree_holds_both_sources(text: list[int], added: list[list[int]]) -> None:
    from latticekit.drafting.cache_model import CacheModel
    from latticekit.drafting.continuations import best_continuations

    memory = AnswerMemory(1000, max_order=ORDER)
    for answer in added:
        memory.add(answer)
    model = CacheModel(None, 5, max_order=ORDER)
    model.sync(text)
    found, recalled = best_continuations(model, text, 12, 4), memory_continuations(memory, text, 12, 4)
    united, sources = united_with_memory(found, recalled)
    paths = united.paths()
    text, held = set(found.paths()), set(recalled.paths())
    assert sources.tolist() == [(2 if p in text else 0) | (4 if p in held else 0) for p in paths]  # SOURCES' bits
    assert len(set(paths)) == len(paths) and set(paths) == set(found.paths()) | set(recalled.paths())
    assert paths[:found.size] == found.paths()
    best = {p: lp for p, lp in zip(found.paths(), found.logprob)}
    for p, lp in zip(recalled.paths(), recalled.logprob):
        best[p] = max(best.get(p, -math.inf), lp)
    for i, p in enumerate(paths):
        assert united.logprob[i] == best[p] and united.depths[i] == len(p)
        parent = int(united.parents[i])
        assert parent < i and united.score[i] == pytest.approx((united.score[parent] if parent >= 0 else 0) + best[p])


def united_reference(found: Continuations, recalled: Continuations) -> tuple[Continuations, np.ndarray]:
    """united_with_memory written out in Python (what the C++ core's UniteContinuations replaced)."""
    if not recalled.size:
        return found, np.full(found.size, 2, dtype=np.int64)
    tokens, parents, depths = found.tokens.tolist(), found.parents.tolist(), found.depths.tolist()
    logprob, static = found.logprob.tolist(), found.static_logprob.tolist()
    sources = [2] * len(tokens)
    index = {(parent, token): i for i, (parent, token) in enumerate(zip(parents, tokens))}
    placed: list[int] = []
    for token, parent, depth, lp in zip(recalled.tokens.tolist(), recalled.parents.tolist(),
                                        recalled.depths.tolist(), recalled.logprob.tolist()):
        key = (placed[parent] if parent >= 0 else -1, token)
        i = index.get(key)
        if i is None:
            i = index[key] = len(tokens)
            sources.append(4)
            tokens.append(token)
            parents.append(key[0])
            depths.append(depth)
            logprob.append(lp)
            static.append(float("nan"))
        else:
            logprob[i] = max(logprob[i], lp)
            sources[i] |= 4
        placed.append(i)
    score: list[float] = []
    for parent, lp in zip(parents, logprob):
        score.append((score[parent] if parent >= 0 else 0.0) + lp)
    return (Continuations(*(np.asarray(a, dtype=np.int64) for a in (tokens, parents, depths)),
                          *(np.asarray(a, dtype=np.float64) for a in (logprob, static, score))),
            np.asarray(sources, dtype=np.int64))


@st.composite
def continuation_trees(draw: st.DrawFn) -> Continuations:
    """A trie over a small alphabet (its nodes' paths distinct, as a search's are), parents first."""
    n = draw(st.integers(0, 24))
    tokens: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    for _ in range(n):
        parent = draw(st.integers(-1, len(tokens) - 1))
        taken = {t for t, q in zip(tokens, parents) if q == parent}
        free = [t for t in range(4) if t not in taken]
        if not free:
            continue
        tokens.append(draw(st.sampled_from(free)))
        parents.append(parent)
        depths.append(depths[parent] + 1 if parent >= 0 else 1)
    m = len(tokens)
    lp = st.lists(st.one_of(st.sampled_from([-1.0, -0.5, 0.0, -math.inf]), st.floats(-20.0, 0.0)), min_size=m,
                  max_size=m)
    static = st.lists(st.one_of(st.just(math.nan), st.floats(-20.0, 0.0)), min_size=m, max_size=m)
    return Continuations(np.asarray(tokens, dtype=np.int64), np.asarray(parents, dtype=np.int64),
                         np.asarray(depths, dtype=np.int64), np.asarray(draw(lp), dtype=np.float64),
                         np.asarray(draw(static), dtype=np.float64), np.zeros(m))


@settings(max_examples=300, deadline=None)
@given(found=continuation_trees(), recalled=continuation_trees())
def test_the_core_unites_two_trees_as_the_python_reference(found: Continuations, recalled: Continuations) -> None:
    united, sources = united_with_memory(found, recalled)
    want, want_sources = united_reference(found, recalled)
    assert sources.tolist() == want_sources.tolist()
    for name in ("tokens", "parents", "depths"):
        assert getattr(united, name).tolist() == getattr(want, name).tolist(), name
    for name in ("logprob", "static_logprob", "score"):  # the same operations in the same order: exact
        np.testing.assert_array_equal(getattr(united, name), getattr(want, name), err_msg=name)


def test_a_tree_out_of_order_is_refused_by_name() -> None:
    good = Continuations(np.array([1]), np.array([-1]), np.array([1]), np.zeros(1), np.zeros(1), np.zeros(1))
    bad = Continuations(np.array([1, 2]), np.array([-1, 1]), np.array([1, 2]), np.zeros(2), np.zeros(2), np.zeros(2))
    with pytest.raises(LatticeError, match="memory node 1 has parent 1"):
        united_with_memory(good, bad)
    with pytest.raises(LatticeError, match="text node 1 has parent 1"):
        united_with_memory(bad, good)


def test_chain_drafter_drafts_from_an_earlier_answer() -> None:
    from latticekit.drafting.calibration import AcceptanceModel
    from latticekit.drafting.chains import ChainDrafter

    memory, acceptance = AnswerMemory(1000), AcceptanceModel.prior(trust="cache")
    first = ChainDrafter(None, 100, acceptance, memory=memory, prompt_length=3)
    first.observe([1, 2, 3, 10, 11, 12, 13, 14])
    first.remember()
    assert memory.answers == [(10, 11, 12, 13, 14)]  # the answer, not the prompt
    second = ChainDrafter(None, 100, acceptance, memory=memory, prompt_length=3)
    second.observe([4, 5, 6, 10, 11])
    assert second.propose(5)[0].tolist() == [12, 13, 14]
    alone = ChainDrafter(None, 100, acceptance, prompt_length=3)
    alone.observe([4, 5, 6, 10, 11])
    assert alone.propose(5)[0].size == 0


def test_chain_drafter_learns_each_sources_estimates_from_its_own_nodes() -> None:
    """Earlier answers that every new request contradicts teach the memory's estimates alone:
    per source, the text's copy keeps its confidence and the memory's miss loses it, where one
    model shared by both sources learns an average that suits neither."""
    from latticekit.drafting.calibration import AcceptanceModel, SourceAcceptance
    from latticekit.drafting.chains import ChainDrafter

    def first_probabilities(acceptance: "AcceptanceModel | SourceAcceptance") -> tuple[float, float]:
        memory = AnswerMemory(1000)
        for _ in range(5):
            memory.add([20, 21, 30, 31, 32])  # after 20 the answers said 21: never so again
        for r in range(12):
            prompt = [50 + r % 5, 1, 2, 3, 4, 5, 6]
            text = prompt + [1, 2, 3, 4, 5, 6, 20, 60 + r, 70 + r, 80 + r]  # copies its prompt, then new
            drafter = ChainDrafter(None, 100, acceptance, memory=memory, prompt_length=len(prompt))
            for t in range(len(prompt), len(text) + 1):
                drafter.observe(text[:t])
                chain, probability = drafter.propose(4)
                assert len(chain) == len(probability) and np.all(np.diff(probability) <= 1e-12)
        drafter = ChainDrafter(None, 100, acceptance, memory=memory, prompt_length=7)
        drafter.observe([55, 1, 2, 3, 4, 5, 6, 1, 2])
        copy, copy_p = drafter.propose(3)
        drafter.observe([55, 1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 20])
        recalled, recalled_p = drafter.propose(3)
        assert copy.tolist() == [3, 4, 5] and recalled.tolist() == [21, 30, 31]
        return float(copy_p[0]), float(recalled_p[0])

    text_p, memory_p = first_probabilities(SourceAcceptance.prior(("text", "memory")))
    shared_text_p, shared_memory_p = first_probabilities(AcceptanceModel.prior(trust="cache"))
    assert memory_p < 0.5 < text_p
    assert text_p > shared_text_p and memory_p < shared_memory_p - 0.2


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 7), min_size=1, max_size=60), st.lists(st.lists(st.integers(0, 7), min_size=1,
                                                                            max_size=30), max_size=4),
       st.integers(1, 6), st.integers(1, 12))
def test_a_drafters_candidates_are_the_searches_over_its_whole_text(text: list[int], answers: list[list[int]],
                                                                     depth: int, p: int) -> None:
    """The chain drafter hands both searches one int32 copy of its text's last tokens: its
    candidates are those the text's and the memory's searches find over the whole text, as a
    list of ids, united."""
    from latticekit.drafting.calibration import SourceAcceptance
    from latticekit.drafting.chains import ChainDrafter
    from latticekit.drafting.continuations import best_continuations

    memory = AnswerMemory(1000, vocab_size=8)
    for answer in answers:
        memory.add(answer)
    for store in (memory, None):
        drafter = ChainDrafter(None, 8, SourceAcceptance.prior(("text", "memory")), candidates=p, memory=store)
        drafter.observe(text)
        found = best_continuations(drafter.model, list(text), p, depth)
        if store is not None:
            found, _ = united_with_memory(found, memory_continuations(store, list(text), p, depth))
        got = drafter.candidate_tree(depth)
        for name in ("tokens", "parents", "depths", "logprob", "static_logprob", "score"):
            np.testing.assert_array_equal(getattr(got, name), getattr(found, name))
