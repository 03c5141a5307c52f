"""The drafting state's fast path (the C++ core's n-gram cache, successors and search, and the
Python around them) against the pure-Python implementation it replaced
(``reference_drafting.py``) and against a from-scratch recount of the whole text, on random token
streams that arrive in random pieces, including texts that stop extending the old one."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import latticekit as lk
from arpa_gen import arpa_models, to_arpa
from latticekit.drafting.cache_model import CacheModel
from latticekit.drafting.calibration import AcceptanceModel, CandidateTree, PendingLabels
from latticekit.drafting.chains import ChainDrafter
from latticekit.drafting.continuations import best_continuations
from latticekit.drafting.successors import KatzSuccessors
from latticekit.errors import DecoderConfigError
from reference_drafting import (
    ReferenceCacheModel,
    ReferenceChainDrafter,
    ReferenceKatzSuccessors,
    ReferencePendingLabels,
    reference_best_continuations,
    reference_update,
)

VOCAB = 7  # the random models' words are 0..5 at most; 6 is never a static token, 7 and 8 lie beyond the vocabulary


def model_of(tmp_path_factory: Any, ngrams: Any) -> lk.NGramLM:
    path: Path = tmp_path_factory.mktemp("m") / "m.arpa"
    path.write_text(to_arpa(ngrams))
    return lk.NGramLM.from_arpa(path)


@st.composite
def streams(draw: Any, max_size: int = 60) -> tuple[list[int], list[int]]:
    """A token stream that repeats itself (so that the cache matters), and where it is cut
    into the pieces that arrive."""
    alphabet = draw(st.integers(2, VOCAB + 2))
    text = draw(st.lists(st.integers(0, alphabet - 1), min_size=1, max_size=max_size))
    for _ in range(draw(st.integers(0, 3))):  # copies of earlier stretches
        a = draw(st.integers(0, len(text) - 1))
        b = draw(st.integers(a, min(len(text), a + 12)))
        text += text[a:b]
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=6)))
    return text, cuts + [len(text)]


def followers_recounted(text: list[int], max_order: int) -> dict[tuple[int, ...], Counter[int]]:
    """Every context of 1..max_order tokens of the text and what followed it, counted afresh."""
    out: dict[tuple[int, ...], Counter[int]] = {}
    for end in range(1, len(text)):
        for n in range(1, min(max_order, end) + 1):
            out.setdefault(tuple(text[end - n:end]), Counter())[text[end]] += 1
    return out


def assert_same_continuations(fast: Any, slow: Any) -> None:
    for name in ("tokens", "parents", "depths", "logprob", "static_logprob", "score"):
        np.testing.assert_array_equal(getattr(fast, name), getattr(slow, name), err_msg=name)


@settings(max_examples=300)
@given(model=st.one_of(st.none(), arpa_models(max_order=4, max_vocab=6)), stream=streams(),
       other=st.lists(st.integers(0, VOCAB), max_size=8), max_order=st.integers(1, 5), p=st.integers(1, 24),
       max_depth=st.integers(1, 5))
def test_cache_model_and_search_equal_the_reference(tmp_path_factory: Any, model: Any,
                                                   stream: tuple[list[int], list[int]], other: list[int],
                                                   max_order: int, p: int, max_depth: int) -> None:
    lm = model_of(tmp_path_factory, model[0]) if model is not None else None
    text, cuts = stream
    fast = CacheModel(lm, VOCAB, max_order=max_order, prior=(0.3, 0.5, 0.7), prior_positions=3.0)
    slow = ReferenceCacheModel(lm, VOCAB, max_order=max_order, prior=(0.3, 0.5, 0.7), prior_positions=3.0)
    pieces = [text[:cut] for cut in cuts]
    pieces.insert(len(pieces) // 2, other)  # a text that does not extend the old one: both start afresh
    pieces.append(text)
    for piece in pieces:
        fast.sync(np.asarray(piece, dtype=np.int32) if len(piece) % 2 else piece)
        slow.sync(piece)
        assert fast.ids == slow.ids == [int(t) for t in piece]
        np.testing.assert_array_equal(fast.responsibility, slow.responsibility)
        np.testing.assert_array_equal(fast.positions, slow.positions)
        for n in range(0, max_order + 2):
            assert fast.weight(n) == slow.weight(n)
        assert_same_continuations(best_continuations(fast, piece, p, max_depth),
                                  reference_best_continuations(slow, piece, p, max_depth))
    # the counts equal a recount of the whole text, context by context
    recount = followers_recounted(text, max_order)
    for context, counts in recount.items():
        assert fast.match(list(context)) == len(context)
        got, total = fast.followers(list(context), len(context))
        assert got == dict(counts) and total == sum(counts.values())
    for tail in (text[-4:], other, text[:3] + [VOCAB + 1]):
        assert fast.match(tail) == slow.match(tail)
        for token in range(VOCAB + 2):
            got_lp, got_static, got_n = fast.conditional(tail, token)
            want_lp, want_static, want_n = slow.conditional(tail, token)
            assert (got_lp, got_n) == (want_lp, want_n)
            assert got_static == want_static or (math.isnan(got_static) and math.isnan(want_static))


@st.composite
def tries(draw: Any, max_size: int = 30) -> tuple[list[int], list[int]]:
    """A token trie as (parents, tokens), parents before children; tokens beyond the vocabulary
    and beyond int32's reach as an id the models lack included."""
    parents: list[int] = []
    for i in range(draw(st.integers(0, max_size))):
        parents.append(draw(st.integers(-1, i - 1)))
    tokens = draw(st.lists(st.integers(0, VOCAB + 1), min_size=len(parents), max_size=len(parents)))
    return parents, tokens


@settings(max_examples=200)
@given(model=st.one_of(st.none(), arpa_models(max_order=4, max_vocab=6)), stream=streams(), trie=tries(),
       max_order=st.integers(1, 5), cut=st.integers(0, 60))
def test_trie_conditionals_equal_the_reference_node_by_node(tmp_path_factory: Any, model: Any,
                                                           stream: tuple[list[int], list[int]],
                                                           trie: tuple[list[int], list[int]], max_order: int,
                                                           cut: int) -> None:
    """One call of the core scores a whole candidate tree (the heads' paths in united_candidates)
    exactly as the reference's conditional does node by node, its context the text and the path."""
    lm = model_of(tmp_path_factory, model[0]) if model is not None else None
    text = stream[0]
    fast = CacheModel(lm, VOCAB, max_order=max_order, prior=(0.3, 0.5, 0.7), prior_positions=3.0)
    slow = ReferenceCacheModel(lm, VOCAB, max_order=max_order, prior=(0.3, 0.5, 0.7), prior_positions=3.0)
    fast.sync(text)
    slow.sync(text)
    tail = text[:min(cut, len(text))]  # a text the cache holds, or a shorter one: any tail is a context
    parents, tokens = trie
    got_lp, got_static = fast.trie_conditionals(tail, np.asarray(parents), np.asarray(tokens))
    paths: list[list[int]] = []
    for i, (parent, token) in enumerate(zip(parents, tokens)):
        above = paths[parent] if parent >= 0 else []
        want_lp, want_static, _ = slow.conditional(tail + above, token)
        assert got_lp[i] == want_lp, i
        assert got_static[i] == want_static or (math.isnan(got_static[i]) and math.isnan(want_static)), i
        paths.append(above + [token])


@settings(max_examples=100)
@given(model=st.one_of(st.none(), arpa_models(max_order=4, max_vocab=6)), stream=streams(),
       max_order=st.integers(1, 5), p=st.integers(1, 40), max_depth=st.integers(1, 8))
def test_the_continuation_search_scores_its_nodes_as_trie_conditionals_do(tmp_path_factory: Any, model: Any,
                                                                        stream: tuple[list[int], list[int]],
                                                                        max_order: int, p: int,
                                                                        max_depth: int) -> None:
    """What united_candidates relies on to score a united tree in one call: the search's own
    per-node log-probabilities are exactly the trie's conditionals over the same nodes."""
    lm = model_of(tmp_path_factory, model[0]) if model is not None else None
    text = stream[0]
    fast = CacheModel(lm, VOCAB, max_order=max_order, prior=(0.3, 0.5, 0.7), prior_positions=3.0)
    fast.sync(text)
    found = best_continuations(fast, text, p, max_depth)
    got_lp, got_static = fast.trie_conditionals(text, found.parents, found.tokens)
    assert got_lp.tolist() == found.logprob.tolist()
    assert np.array_equal(got_static, found.static_logprob, equal_nan=True)


def test_trie_conditionals_refuse_a_parent_that_is_not_earlier() -> None:
    model = CacheModel(None, VOCAB)
    model.sync([1, 2, 3, 1, 2])
    for parents in ([0], [-1, 1], [-2]):
        with pytest.raises(DecoderConfigError, match="is not an earlier node"):
            model.trie_conditionals([1, 2], np.asarray(parents), np.ones(len(parents), dtype=np.int64))
    with pytest.raises(DecoderConfigError, match="tokens and"):
        model.trie_conditionals([1, 2], np.asarray([-1, 0]), np.asarray([1]))
    with pytest.raises(DecoderConfigError, match="does not fit int32"):
        model.trie_conditionals([1, 2], np.asarray([-1]), np.asarray([2**40]))


@settings(max_examples=200)
@given(data=st.data(), alphabet=st.integers(1, 4))
def test_pending_labels_equal_the_reference(data: Any, alphabet: int) -> None:
    """Trees added at the text's end, labelled as the text grows, is cut back or replaced; the
    text handed over whole or in two parts (ids, then the tokens just emitted)."""
    fast, slow = PendingLabels(), ReferencePendingLabels()
    text = data.draw(st.lists(st.integers(0, alphabet), min_size=1, max_size=6))
    tokens = st.integers(0, alphabet)
    for _ in range(data.draw(st.integers(1, 12))):
        paths = data.draw(st.lists(st.lists(tokens, min_size=1, max_size=5), min_size=1, max_size=6))
        tree = CandidateTree.from_paths(paths, [[0.0] * len(path) for path in paths])
        features = np.arange(tree.size * 3, dtype=np.float64).reshape(tree.size, 3) + len(text)
        fast.add(len(text) - 1, tree, features)
        slow.add(len(text) - 1, tree, features)
        change = data.draw(st.sampled_from(["grow", "grow", "grow", "cut", "replace"]))
        if change == "grow":
            text = text + data.draw(st.lists(tokens, max_size=6))
        elif change == "cut":
            text = text[:data.draw(st.integers(1, len(text)))]
        else:
            text = data.draw(st.lists(tokens, min_size=1, max_size=12))
        split = data.draw(st.integers(0, len(text)))
        got = fast.resolve(np.asarray(text[:split]) if split % 2 else text[:split], text[split:])
        want = slow.resolve(text)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
        assert len(fast) == len(slow._pending)


def drive(drafter: Any, stream: list[int], prompt: int, steps: int, k: int, restart: Optional[int],
          as_array: bool) -> list[tuple[list[int], np.ndarray]]:
    """Greedy verification against ``stream``: each step emits the chain's longest prefix that the
    stream continues with, plus one token. At step ``restart`` the request's text is replaced by
    the stream's second half (a row reused by another request)."""
    out = []
    length, offset = prompt, 0
    for step in range(steps):
        if step == restart:
            offset, length = len(stream) // 2, max(1, prompt // 2)
        if offset + length >= len(stream):
            break
        ids = stream[offset:offset + length]
        drafter.observe(np.asarray(ids, dtype=np.int32) if as_array else ids)
        chain, probability = drafter.propose(k)
        out.append((chain.tolist(), probability))
        accepted = 0
        while accepted < len(chain) and offset + length + accepted < len(stream) \
                and chain[accepted] == stream[offset + length + accepted]:
            accepted += 1
        length += accepted + 1
    return out


@settings(max_examples=60)
@given(model=st.one_of(st.none(), arpa_models(max_order=3, max_vocab=6)), stream=streams(max_size=80),
       prompt=st.integers(1, 40), k=st.integers(1, 8), start=st.integers(0, 6), candidates=st.integers(1, 40),
       restart=st.one_of(st.none(), st.integers(1, 20)), as_array=st.booleans())
def test_chain_drafter_drafts_as_the_reference(tmp_path_factory: Any, model: Any, stream: tuple[list[int], list[int]],
                                              prompt: int, k: int, start: int, candidates: int,
                                              restart: Optional[int], as_array: bool) -> None:
    lm = model_of(tmp_path_factory, model[0]) if model is not None else None
    text = stream[0]
    fast_acceptance, slow_acceptance = AcceptanceModel.prior(trust="cache"), AcceptanceModel.prior(trust="cache")
    fast = ChainDrafter(lm, VOCAB, fast_acceptance, candidates=candidates, max_depth=12, start=start)
    slow = ReferenceChainDrafter(lm, VOCAB, slow_acceptance, candidates=candidates, max_depth=12, start=start)
    got = drive(fast, text, prompt, 30, k, restart, as_array)
    want = drive(slow, text, prompt, 30, k, restart, False)
    assert [chain for chain, _ in got] == [chain for chain, _ in want]
    for (_, p), (_, q) in zip(got, want):
        np.testing.assert_allclose(p, q, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(fast_acceptance.weights, slow_acceptance.weights, rtol=1e-12, atol=1e-15)
    assert fast_acceptance.updates == slow_acceptance.updates
    assert fast.length == slow.length


@pytest.fixture(scope="module")
def embedded() -> lk.NGramLM:
    from latticekit.demo import embedded_token_lm

    return embedded_token_lm()


@pytest.mark.parametrize("seed", [0, 1])
def test_chain_drafter_drafts_as_the_reference_with_the_shipped_model(embedded: lk.NGramLM, seed: int) -> None:
    """A long text over a real vocabulary: contexts followed by hundreds of tokens, where the
    search reads only the followers that could rank (the reference scores every one)."""
    rng = np.random.default_rng(seed)
    common = rng.integers(0, 49152, 4)  # a few frequent tokens, each followed by many others
    segments = [rng.integers(0, 49152, int(rng.integers(3, 20))) for _ in range(300)]
    pieces = []
    while sum(len(x) for x in pieces) < 6000:
        pieces.append(rng.choice(common, 1))
        pieces.append(segments[int(rng.integers(0, 300))] if rng.random() < 0.7 else rng.integers(0, 49152, 6))
    text = np.concatenate(pieces).astype(np.int32).tolist()
    fast_acceptance, slow_acceptance = AcceptanceModel.prior(trust="cache"), AcceptanceModel.prior(trust="cache")
    fast = ChainDrafter(embedded, 49152, fast_acceptance)
    slow = ReferenceChainDrafter(embedded, 49152, slow_acceptance)
    got = drive(fast, text, 4000, 120, 8, None, True)
    want = drive(slow, text, 4000, 120, 8, None, False)
    assert [chain for chain, _ in got] == [chain for chain, _ in want]
    for (_, p), (_, q) in zip(got, want):
        np.testing.assert_allclose(p, q, rtol=1e-12, atol=1e-15)
    busiest = max(len(fast.model.followers([int(t)], 1)[0]) for t in common if fast.model.match([int(t)]))
    assert busiest > 80  # the lazy path was taken: a context with that many followers


@settings(max_examples=60, deadline=None)
@given(model=arpa_models(max_order=4, max_vocab=6),
       contexts=st.lists(st.lists(st.integers(0, VOCAB + 1), max_size=5), min_size=1, max_size=6))
def test_katz_successors_equal_the_reference(tmp_path_factory: Any, model: Any, contexts: list[list[int]]) -> None:
    # the C++ states (kept between calls in the core's memo) rank and score as the Python index did
    lm = model_of(tmp_path_factory, model[0])
    fast, slow = KatzSuccessors.of(lm), ReferenceKatzSuccessors(lm)
    for context in contexts + contexts[::-1]:  # each context again, after others: the memo's reuse
        a, b = fast.state(context), slow.state(context)
        for token in range(VOCAB + 2):
            assert a.logprob(token) == pytest.approx(b.logprob(token), abs=1e-9)
        r = 0
        while True:
            want, got = b.ranked(r), a.ranked(r)
            if want is None:
                assert got is None
                break
            assert got is not None and got[0] == want[0] and got[1] == pytest.approx(want[1], abs=1e-9)
            r += 1


@settings(max_examples=200, deadline=None)
@given(data=st.data(), depth=st.integers(1, 6), rate=st.sampled_from([0.0, 0.01, 0.15, 1.0]))
def test_acceptance_update_equals_the_reference(data: Any, depth: int, rate: float) -> None:
    n = data.draw(st.integers(0, 12))
    width = depth + 3
    values = st.floats(-3, 3, allow_nan=False)
    features = np.array(data.draw(st.lists(st.lists(values, min_size=width, max_size=width), min_size=n,
                                           max_size=n)), dtype=np.float64).reshape(n, width)
    labels = np.array(data.draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=n, max_size=n)), dtype=np.float64)
    fast, slow = AcceptanceModel.prior(depth, rate), AcceptanceModel.prior(depth, rate)
    fast.update(features, labels)
    reference_update(slow, features, labels)
    np.testing.assert_allclose(fast.weights, slow.weights, rtol=1e-12, atol=1e-12)
    assert fast.updates == slow.updates


class ComposedChainDrafter(ChainDrafter):
    """The chain drafter's step as it was composed in Python: the text's search and the
    memory's, their union (``_candidates``), the tree, then its estimates and chain (``_chain``),
    where :meth:`ChainDrafter.propose` makes them one call of the core."""

    def propose(self, max_length: int) -> tuple[np.ndarray, np.ndarray]:
        text = self.model.ids
        if max_length < 1 or not text:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        found, sources = self._candidates(max_length)
        if not found.size:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        return self._chain(found.tree(sources=sources), len(text) - 1)


@settings(max_examples=80, deadline=None)
@given(model=st.one_of(st.none(), arpa_models(max_order=3, max_vocab=6)), stream=streams(max_size=80),
       answers=st.lists(st.lists(st.integers(0, VOCAB + 1), min_size=1, max_size=20), max_size=4),
       with_memory=st.booleans(), per_source=st.booleans(), k=st.integers(1, 8), candidates=st.integers(1, 40),
       prompt=st.integers(1, 30), seed=st.integers(0, 2**16))
def test_a_chain_in_one_call_of_the_core_is_the_composed_one(
        tmp_path_factory: Any, model: Any, stream: tuple[list[int], list[int]], answers: list[list[int]],
        with_memory: bool, per_source: bool, k: int, candidates: int, prompt: int, seed: int) -> None:
    """:meth:`ChainDrafter.propose` (the searches, their union and the tree's chain in one call
    of the core) drafts the chains, probabilities and pending labels of the same steps composed
    in Python, with a static model or none, a memory or none, one estimate or one per source
    (random weights, learning as the text goes), step after step."""
    from latticekit.drafting.calibration import SourceAcceptance
    from latticekit.drafting.memory import AnswerMemory

    lm = model_of(tmp_path_factory, model[0]) if model is not None else None
    rng = np.random.default_rng(seed)

    def estimates() -> AcceptanceModel | SourceAcceptance:
        fresh = SourceAcceptance.prior(("text", "memory")) if per_source else AcceptanceModel.prior(trust="cache")
        r = np.random.default_rng(seed)
        for one in (fresh._models if isinstance(fresh, SourceAcceptance) else [fresh]):
            one.weights[:] = one.weights + r.normal(0.0, 1.0, one.weights.shape)
        return fresh

    drafters = []
    for cls in (ChainDrafter, ComposedChainDrafter):
        memory = None
        if with_memory:
            memory = AnswerMemory(1000, vocab_size=VOCAB + 2)
            for answer in answers:
                memory.add(answer)
        drafters.append(cls(lm, VOCAB + 2, estimates(), candidates=candidates, memory=memory))
    fast, slow = drafters
    text = stream[0]
    got = drive(fast, text, prompt, 30, k, None, bool(rng.integers(0, 2)))
    want = drive(slow, text, prompt, 30, k, None, False)
    assert [chain for chain, _ in got] == [chain for chain, _ in want]
    for (_, p), (_, q) in zip(got, want):
        np.testing.assert_array_equal(p, q)
    assert len(fast.pending) == len(slow.pending)
    for a, b in zip(fast.pending.resolve(text), slow.pending.resolve(text)):  # the labels still to come
        np.testing.assert_array_equal(a, b)
    for a, b in zip(*(d.acceptance._models if isinstance(d.acceptance, SourceAcceptance) else [d.acceptance]
                      for d in drafters)):
        np.testing.assert_array_equal(a.weights, b.weights)


def test_the_one_call_refuses_estimates_of_another_width() -> None:
    from latticekit import _core

    cache = CacheModel(None, 8)
    cache.sync([1, 2, 3, 1, 2])
    tail = np.asarray([1, 2], dtype=np.int32)
    with pytest.raises(ValueError, match="weights of shape"):
        _core.chain_candidates(cache.cache, tail, None, 8, None, tail[:0], 1, 4, 3, np.zeros((1, 5)),
                               np.array([-1], dtype=np.int64), 3, 2, 4, PendingLabels().core, 4, True)


def test_pending_labels_refuse_what_they_cannot_label() -> None:
    pending = PendingLabels()
    rows = np.zeros((2, 3))

    def tree(*parents: int) -> CandidateTree:
        n = len(parents)
        return CandidateTree(np.arange(5, 5 + n), np.array(parents), np.ones(n, dtype=np.int64), np.zeros(n),
                             np.zeros(n))

    with pytest.raises(DecoderConfigError, match="not an earlier node"):
        pending.add(2, tree(-1, 1), rows)
    with pytest.raises(DecoderConfigError, match="root must be"):
        pending.add(-1, tree(-1, 0), rows)
    with pytest.raises(DecoderConfigError, match="3 parents"):  # two tokens
        pending.add(2, CandidateTree(np.array([5, 6]), np.array([-1, 0, 0]), np.ones(3, dtype=np.int64),
                                     np.zeros(3), np.zeros(3)), rows)
    pending.add(2, tree(-1, 0), rows)
    with pytest.raises(DecoderConfigError, match="width 4 beside trees of width 3"):
        pending.add(3, tree(-1, 0), np.zeros((2, 4)))
    assert len(pending) == 1
    features, labels = pending.resolve([1, 2, 3, 5, 7])  # 5 at position 3 matches, 7 at 4 does not
    assert labels.tolist() == [1.0, 0.0] and features.shape == (2, 3) and len(pending) == 0
    pending.add(0, tree(-1, 0), np.zeros((2, 0)))  # nodes without features
    features, labels = pending.resolve([1, 5, 6])
    assert labels.tolist() == [1.0, 1.0] and features.shape == (2, 0) and len(pending) == 0
