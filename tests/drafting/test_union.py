"""The candidate tree of the heads' lattice and the text's continuations
(``latticekit.drafting.union.united_candidates``, its trie in the C++ core) against the Python it
replaced (``reference_drafting.reference_united_candidates``: ``CandidateTree.from_paths`` and
``SausageLattice.arc_scores``), on random texts, models, lattices and candidate sources; and
the vLLM lattice proposer's drafter (``ChainDrafter.propose_lattice``) against the chain of the
reference's tree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import latticekit as lk
from arpa_gen import arpa_models, to_arpa
from latticekit import _core
from latticekit.drafting.cache_model import CacheModel
from latticekit.drafting.calibration import SOURCES, AcceptanceModel, CandidateTree, SourceAcceptance, tree_chain
from latticekit.drafting.chains import ChainDrafter
from latticekit.drafting.continuations import best_continuations
from latticekit.drafting.drafters.ngram import uniform_lm
from latticekit.drafting.memory import AnswerMemory
from latticekit.drafting.union import united_candidates
from latticekit.errors import LatticeError
from latticekit.lattice import SausageLattice
from reference_drafting import reference_united_candidates

VOCAB = 7  # the random models' words are 0..5 at most; the lattices' tokens reach 8, beyond the vocabulary


def model_of(tmp_path_factory: Any, ngrams: Any) -> lk.NGramLM:
    path: Path = tmp_path_factory.mktemp("m") / "m.arpa"
    path.write_text(to_arpa(ngrams))
    return lk.NGramLM.from_arpa(path)


@st.composite
def texts(draw: st.DrawFn) -> list[int]:
    """A text over a small alphabet that repeats itself (so that its continuations are long)."""
    alphabet = draw(st.integers(2, VOCAB))
    text = draw(st.lists(st.integers(0, alphabet - 1), min_size=1, max_size=40))
    for _ in range(draw(st.integers(0, 3))):
        a = draw(st.integers(0, len(text) - 1))
        text += text[a:a + draw(st.integers(0, 10))]
    return text


@st.composite
def lattices(draw: st.DrawFn, root: int) -> SausageLattice:
    """A lattice of 1..5 positions of 1..4 arcs over the text's alphabet and beyond, its root ``root``."""
    h, k = draw(st.integers(1, 5)), draw(st.integers(1, 4))
    tokens = np.array([draw(st.permutations(range(VOCAB + 2)))[:k] for _ in range(h)], dtype=np.int32)
    tokens[0, 0] = root
    if k > 1:  # the root's position holds it once
        tokens[0, 1:] = [t for t in range(VOCAB + 2) if t != root][:k - 1]
    values = st.one_of(st.sampled_from([0.0, -1.0, -2.0]), st.floats(-8.0, 0.0, allow_nan=False, width=32))
    scores = np.array([[draw(values) for _ in range(k)] for _ in range(h)], dtype=np.float32)
    widths = np.array([1] + [draw(st.integers(1, k)) for _ in range(h - 1)], dtype=np.int32)
    return SausageLattice(tokens, scores, widths)


def assert_same_tree(got: CandidateTree, want: CandidateTree) -> None:
    for name in ("tokens", "parents", "depths", "sources"):
        assert getattr(got, name).tolist() == getattr(want, name).tolist(), name
    for name in ("head_logprob", "ngram_logprob", "cache_logprob"):  # the same numbers, copied: exact
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), model=st.one_of(st.none(), arpa_models(max_order=4, max_vocab=6)), text=texts(),
       found_p=st.integers(0, 30), depth=st.integers(1, 6), p=st.integers(1, 20),
       alpha=st.sampled_from([0.0, 0.5, 1.0]), sources=st.sampled_from(["text", "drawn", "none"]))
def test_the_core_unites_the_heads_paths_and_the_continuations_as_the_reference(
        tmp_path_factory: Any, data: Any, model: Any, text: list[int], found_p: int, depth: int, p: int,
        alpha: float, sources: str) -> None:
    lm = model_of(tmp_path_factory, model[0]) if model is not None else None
    cache = CacheModel(lm, VOCAB)
    cache.sync(text)
    found = best_continuations(cache, text, found_p, depth)
    # the candidates' sources as a memory's union names them (text, memory, both), or any bits
    found_sources = None if sources == "none" else [SOURCES["text"]] * found.size if sources == "text" else \
        data.draw(st.lists(st.sampled_from([2, 4, 6, 1, 7]), min_size=found.size, max_size=found.size))
    lattice = data.draw(lattices(text[-1]))
    search_lm = lm if lm is not None and alpha > 0 else uniform_lm()
    got = united_candidates(cache, text, found, lattice, search_lm, p, alpha if lm is not None else 0.0, lm,
                            found_sources=found_sources)
    want = reference_united_candidates(cache, text, found, lattice, search_lm, p, alpha if lm is not None else 0.0,
                                       lm, found_sources=found_sources)
    assert_same_tree(got, want)


@settings(max_examples=100, deadline=None)
@given(data=st.data(), text=texts(), answers=st.lists(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12),
                                                      max_size=3),
       max_length=st.integers(1, 6), per_source=st.booleans())
def test_the_lattice_drafters_chain_is_the_reference_trees(data: Any, text: list[int], answers: list[list[int]],
                                                           max_length: int, per_source: bool) -> None:
    """ChainDrafter.propose_lattice (the vLLM lattice proposer's step: the text's and the memory's
    candidates united with the lattice's paths) drafts the chain of the reference's tree, and
    leaves that tree's nodes waiting for their labels."""
    memory = AnswerMemory(max_tokens=200) if answers else None
    for answer in answers:
        assert memory is not None
        memory.add(answer)
    acceptance = SourceAcceptance.prior(("text", "memory", "heads"), trust="head+cache") if per_source \
        else AcceptanceModel.prior(trust="head+cache")
    drafter = ChainDrafter(None, VOCAB, acceptance, candidates=12, max_depth=6, memory=memory)
    drafter.observe(text)
    lattice = data.draw(lattices(text[-1]))
    depth = min(drafter.max_depth, max_length)
    if lattice.h > depth + 1:  # as propose_lattice cuts it
        cut = SausageLattice(lattice.tokens[:depth + 1], lattice.scores[:depth + 1], lattice.widths[:depth + 1])
    else:
        cut = lattice
    found, sources = drafter._candidates(max_length)
    want = reference_united_candidates(drafter.model, drafter.model.ids, found, cut, uniform_lm(), 8, 0.0, None,
                                       found_sources=sources.tolist())
    _, probability, chain = tree_chain(want, acceptance)
    tokens, estimates = drafter.propose_lattice(max_length, lattice, uniform_lm(), 8, 0.0)
    assert tokens.tolist() == want.tokens[chain].tolist()
    np.testing.assert_array_equal(estimates, probability[chain])
    assert len(drafter.pending) == (1 if want.size else 0)


def test_a_continuation_tree_out_of_order_is_refused_by_name() -> None:
    lattice = SausageLattice(np.array([[1], [2]]), np.zeros((2, 1)))
    with pytest.raises(LatticeError, match="text node 1 has parent 1"):
        _core.unite_lattice_paths(np.array([[2]], dtype=np.int32), 1, np.array([3, 4]), np.array([-1, 1]),
                                  np.array([2, 2]), lattice.tokens, lattice.scores, lattice.widths)
    with pytest.raises(ValueError, match="2 tokens, 1 parents and 2 sources"):
        _core.unite_lattice_paths(np.array([[2]], dtype=np.int32), 1, np.array([3, 4]), np.array([-1]),
                                  np.array([2, 2]), lattice.tokens, lattice.scores, lattice.widths)
    with pytest.raises(ValueError, match="width 0 at position 1"):
        _core.unite_lattice_paths(np.array([[2]], dtype=np.int32), 1, np.array([3]), np.array([-1]),
                                  np.array([2]), lattice.tokens, lattice.scores, np.array([1, 0], dtype=np.int32))
