"""The C++ core's tree estimates and chain (``calibration.tree_chain``) against the numpy
reference it replaced in the chain drafter: :func:`node_features`, the estimates'
``conditional``, :meth:`CandidateTree.path_probability` and :meth:`CandidateTree.best_chain`,
one after the other."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from latticekit import _core
from latticekit.drafting.calibration import (SOURCES, AcceptanceModel, CandidateTree, SourceAcceptance, node_features,
                                             tree_chain)
from latticekit.errors import LatticeError

# a log-probability as the sources give them: NaN (no such source), -inf, 0, tiny, ordinary
logprob_st = st.one_of(st.just(math.nan), st.just(-math.inf), st.just(0.0), st.just(-1e-15),
                       st.floats(-30.0, 0.0, allow_nan=False))


@st.composite
def trees(draw: st.DrawFn) -> CandidateTree:
    n = draw(st.integers(0, 40))
    parents: list[int] = []
    depths: list[int] = []
    for i in range(n):
        parent = draw(st.integers(-1, i - 1))
        parents.append(parent)
        depths.append(depths[parent] + 1 if parent >= 0 else 1)
    column = st.lists(logprob_st, min_size=n, max_size=n)
    return CandidateTree(np.asarray(draw(st.lists(st.integers(0, 5), min_size=n, max_size=n)), dtype=np.int64),
                         np.asarray(parents, dtype=np.int64), np.asarray(depths, dtype=np.int64),
                         np.asarray(draw(column)), np.asarray(draw(column)), np.asarray(draw(column)),
                         np.asarray(draw(st.lists(st.integers(0, 7), min_size=n, max_size=n)), dtype=np.int64))


def weights_st(width: int) -> st.SearchStrategy[np.ndarray]:
    return st.lists(st.floats(-6.0, 6.0), min_size=width, max_size=width).map(np.asarray)


def reference(tree: CandidateTree, acceptance: AcceptanceModel | SourceAcceptance
              ) -> tuple[np.ndarray, np.ndarray, list[int]]:
    features = node_features(tree, acceptance.max_depth)
    if isinstance(acceptance, SourceAcceptance):
        assert tree.sources is not None
        conditional = acceptance.conditional(features, tree.sources)
    else:
        conditional = acceptance.conditional(features)
    probability = tree.path_probability(conditional)
    return features, probability, tree.best_chain(probability)


def check(tree: CandidateTree, acceptance: AcceptanceModel | SourceAcceptance) -> None:
    features, probability, chain = tree_chain(tree, acceptance)
    want_features, want_probability, want_chain = reference(tree, acceptance)
    width = acceptance.max_depth + 3
    assert features.shape == (tree.size, width + 1)
    np.testing.assert_allclose(features[:, :width], want_features, rtol=1e-12, atol=1e-15)
    assert features[:, width].tolist() == [float(s) for s in tree.sources]  # type: ignore[union-attr]
    np.testing.assert_allclose(probability, want_probability, rtol=1e-11, atol=1e-300)
    if chain.tolist() != want_chain:
        # the two may part only where siblings' probabilities tie within rounding (the
        # reference's matrix product and logarithms are numpy's, the core's its own)
        node = -1
        for got, want in zip(chain.tolist(), want_chain):
            if got != want:
                assert tree.parents[got] == tree.parents[want] == node
                assert math.isclose(want_probability[got], want_probability[want], rel_tol=1e-11, abs_tol=1e-300)
                break
            node = got
        else:
            pytest.fail(f"chains of different lengths agree on their common prefix: {chain} {want_chain}")


@settings(max_examples=300, deadline=None)
@given(tree=trees(), max_depth=st.integers(1, 9), data=st.data())
def test_source_estimates_and_chain_equal_the_reference(tree: CandidateTree, max_depth: int, data: st.DataObject
                                                        ) -> None:
    names = data.draw(st.lists(st.sampled_from(sorted(SOURCES)), min_size=1, max_size=3, unique=True))
    acceptance = SourceAcceptance({name: AcceptanceModel(data.draw(weights_st(max_depth + 3))) for name in names})
    check(tree, acceptance)


@settings(max_examples=150, deadline=None)
@given(tree=trees(), max_depth=st.integers(1, 9), data=st.data())
def test_one_model_estimates_and_chain_equal_the_reference(tree: CandidateTree, max_depth: int, data: st.DataObject
                                                           ) -> None:
    check(tree, AcceptanceModel(data.draw(weights_st(max_depth + 3))))


def test_ties_take_the_first_child_and_a_source_no_model_counts_for_estimates_nothing() -> None:
    # three children of the root with equal features: the first is the chain's; the memory's
    # node under a text-only estimate has conditional 0
    tree = CandidateTree(np.array([5, 6, 7, 8]), np.array([-1, -1, -1, 1]), np.array([1, 1, 1, 2]),
                         np.full(4, np.nan), np.full(4, -0.5), np.array([-0.1, -0.1, -0.1, -0.2]),
                         np.array([2, 2, 2, 4]))
    acceptance = SourceAcceptance.prior(("text",))
    features, probability, chain = tree_chain(tree, acceptance)
    assert chain.tolist() == [0]
    assert probability[3] == 0.0 and probability[0] == probability[1] == probability[2] > 0.5


def test_bad_trees_and_weights_are_refused_by_name() -> None:
    ok = dict(depths=np.array([1, 2]), head=np.full(2, np.nan), ngram=np.full(2, -1.0), cache=np.full(2, -1.0),
              sources=np.array([2, 2]), weights=np.zeros((1, 5)), bits=np.array([-1]), max_depth=2)
    with pytest.raises(LatticeError, match="not an earlier node"):
        _core.tree_chain(np.array([-1, 1]), **ok)
    with pytest.raises(LatticeError, match="depth below 1"):
        _core.tree_chain(np.array([-1, 0]), **{**ok, "depths": np.array([1, 0])})
    with pytest.raises(ValueError, match="weights of shape"):
        _core.tree_chain(np.array([-1, 0]), **{**ok, "weights": np.zeros((1, 4))})
    with pytest.raises(ValueError, match="2 parents, 3 depths"):
        _core.tree_chain(np.array([-1, 0]), **{**ok, "depths": np.array([1, 2, 3])})
