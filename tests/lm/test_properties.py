"""Hypothesis properties of counting, estimation, pruning and the FST round trip."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from latticekit.lm.counting import count_stream, merge_counts
from latticekit.lm.corpus import lines_to_stream
from latticekit.lm.katz import estimate_katz
from latticekit.lm.model import LN10
from latticekit.lm.prune import prune_relative_entropy
from latticekit.lm.trie import BOS, EOS, SPECIAL_WORDS

sentences = st.lists(st.lists(st.integers(3, 9), min_size=1, max_size=8), min_size=1, max_size=25)
SETTINGS = settings(max_examples=40, deadline=None, derandomize=True)


def _stream(sents):
    ids = np.concatenate([np.asarray(s) for s in sents])
    return lines_to_stream(ids, [len(s) for s in sents])


def _words(n=10):
    return list(SPECIAL_WORDS) + [f"w{i}" for i in range(3, n)]


def _state_sums(model):
    """Sum over all words (</s> included) of p(w|h) for every history state h."""
    vocab = [w for w in range(len(model.words)) if w != BOS and model.lookup(1, np.zeros(1), [w])[0] >= 0]
    sums = []
    for k in range(1, model.order):
        states = np.flatnonzero(model.child_counts(k) > 0)
        hist_ids = model.ngram_ids(k)[states]
        for h in hist_ids:
            h = list(h)
            start = 1 if h[0] == BOS else 0
            total = 0.0
            for w in vocab:
                stream = np.array(h[start:] + [w], np.int64)
                logp, _ = model.score_positions(stream, np.zeros(len(stream), np.int64), np.full(len(stream), start == 1))
                total += 10 ** logp[-1]
            sums.append(total)
    return np.array(sums)


@SETTINGS
@given(sentences)
def test_every_state_normalises(sents):
    counts = count_stream(_stream(sents), 3, 10)
    exact = estimate_katz(counts, _words(), float32_weights=False)
    assert np.all(np.abs(_state_sums(exact) - 1.0) < 1e-6)
    # OpenGrm's float32 weights (the default, digit-identical to its files): ~1e-6 looser
    opengrm = estimate_katz(counts, _words())
    assert np.all(np.abs(_state_sums(opengrm) - 1.0) < 1e-5)


@SETTINGS
@given(sentences, sentences)
def test_merge_equals_concatenation(a, b):
    merged = merge_counts([count_stream(_stream(a), 3, 10), count_stream(_stream(b), 3, 10)])
    whole = count_stream(np.concatenate([_stream(a), _stream(b)]), 3, 10)
    for k in range(1, 4):
        assert np.array_equal(merged.ngram_ids(k), whole.ngram_ids(k))
        assert np.array_equal(merged.count[k - 1], whole.count[k - 1])
    assert (merged.sentences, merged.tokens) == (whole.sentences, whole.tokens)


@SETTINGS
@given(sentences, st.floats(0, 1e-2))
def test_pruning_never_adds(sents, theta):
    model = estimate_katz(count_stream(_stream(sents), 3, 10), _words())
    pruned = prune_relative_entropy(model, theta=theta)
    assert all(p <= m for p, m in zip(pruned.counts, model.counts))
    assert pruned.counts[0] == model.counts[0]
    # what is kept keeps its probability
    for k in range(1, 4):
        rows = model.lookup_ngrams(pruned.ngram_ids(k))
        assert np.all(rows >= 0)
        assert np.array_equal(model.log10_prob[k - 1][rows], pruned.log10_prob[k - 1])


@SETTINGS
@given(sentences, st.integers(0, 60))
def test_target_ngrams_bound(sents, target):
    model = estimate_katz(count_stream(_stream(sents), 3, 10), _words())
    pruned = prune_relative_entropy(model, target_ngrams=target)
    n_unigrams = model.counts[0] - 1  # <s> not counted, as OpenGrm
    kept = sum(pruned.counts) - 1
    assert kept <= max(target, n_unigrams)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(sentences)
def test_arpa_fst_arpa_round_trip(sents):
    pytest.importorskip("pywrapfst")
    from latticekit.lm.fst import model_from_fst, model_to_fst

    model = estimate_katz(count_stream(_stream(sents), 3, 10), _words())
    back = model_from_fst(model_to_fst(model), words=model.words)
    for k in range(1, 4):
        rows = back.lookup_ngrams(model.ngram_ids(k))
        assert np.all(rows >= 0) and back.total(k) == model.total(k)
        assert np.allclose(back.log10_prob[k - 1][rows], model.log10_prob[k - 1], rtol=1e-6, atol=1e-7)
        a = back.log10_backoff[k - 1][rows]
        b = model.log10_backoff[k - 1]
        assert np.array_equal(np.isnan(a), np.isnan(b))
        assert np.allclose(a[~np.isnan(a)], b[~np.isnan(b)], rtol=1e-6, atol=1e-7)
