"""The drafting protocol: one strategy per method, the lattice built only when read, and the
n-gram context the decode and replay loops both hand over."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import latticekit as lk
from decoding_helpers import ARPA
from latticekit.decoding import DecoderConfig, DecoderConfigError
from latticekit.drafting import Drafter, DraftInput, lookup, make_drafter, methods


def lattice() -> lk.SausageLattice:
    tokens = np.array([[9, 0, 0], [4, 5, 6], [7, 8, 9]], dtype=np.int32)
    scores = np.log(np.array([[1.0, 1.0, 1.0], [0.5, 0.3, 0.2], [0.6, 0.3, 0.1]], dtype=np.float32))
    return lk.SausageLattice(tokens, scores, np.array([1, 3, 3], dtype=np.int32))


def test_every_method_has_one_strategy() -> None:
    import latticekit.eval  # noqa: F401  (registers neural)

    assert set(methods()) >= {"greedy", "vanilla", "ngram", "neural", "oracle", "auto", "headsfree", "heads+ngram"}
    assert all(issubclass(lookup(name), Drafter) and lookup(name).method == name for name in methods())


def test_lattice_is_built_once_and_only_when_read() -> None:
    calls = []

    def build() -> lk.SausageLattice:
        calls.append(1)
        return lattice()

    step = DraftInput([1, 2, 3, 9], build)
    assert make_drafter(DecoderConfig("greedy")).draft(step) == []
    assert not step.has_lattice and not calls
    assert make_drafter(DecoderConfig("vanilla", k=3)).draft(step) == [(4, 7)]
    assert make_drafter(DecoderConfig("oracle", k=3), reference=[1, 2, 3, 9, 5, 8]).draft(step) == [(5, 8)]
    assert step.has_lattice and len(calls) == 1


@pytest.mark.parametrize("order, expected", [(1, []), (2, [15]), (3, [14, 15]), (5, [12, 13, 14, 15]),
                                             (9, [11, 12, 13, 14, 15])])
def test_context_is_the_tokens_before_the_root(order: int, expected: list[int]) -> None:
    step = DraftInput([11, 12, 13, 14, 15, 16], lattice)
    assert list(step.context(order)) == expected
    assert step.root == 16 and step.root_index == 5


def test_ngram_drafts_are_the_pbest_paths_after_the_root() -> None:
    lm = lk.NGramLM.from_arpa(ARPA)
    step = DraftInput([3, 17, 42, 9], lattice)
    drafts = make_drafter(DecoderConfig("ngram", k=3, p=4, alpha=1.0), lms=lm).draft(step)
    paths = lk.pbest(lattice(), lm, 4, 1.0, context=[17, 42])
    assert drafts == [tuple(p.tokens[1:]) for p in paths] and len(drafts) == 4


def test_missing_resources_are_config_errors() -> None:
    with pytest.raises(DecoderConfigError, match="needs an n-gram model"):
        make_drafter(DecoderConfig("ngram", k=3, alpha=1.0))
    with pytest.raises(DecoderConfigError, match="names n-gram model"):
        make_drafter(DecoderConfig("ngram", k=3, lm="4gram"), lms={"2gram": lk.NGramLM.from_arpa(ARPA)})
    with pytest.raises(DecoderConfigError, match="greedy reference"):
        make_drafter(DecoderConfig("oracle", k=3))
    with pytest.raises(DecoderConfigError, match="neural rescorer"):
        make_drafter(DecoderConfig("neural", k=3))
    with pytest.raises(DecoderConfigError, match="must be a DecoderConfig"):
        make_drafter("vanilla")  # type: ignore[arg-type]


@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=5), min_size=1, max_size=6))
def test_step_record_counts_the_nodes_its_tree_pass_verifies(drafts: list[list[int]]) -> None:
    from latticekit.decoding.records import StepRecord
    from latticekit.torch.tree import DraftTree

    step = StepRecord(root_token=0, drafts=[tuple(d) for d in drafts], vanilla_draft=(), emitted=(1,),
                      num_accepted=0)
    assert step.tree_nodes == DraftTree.from_drafts(drafts).num_nodes
    assert StepRecord(root_token=0, drafts=[], vanilla_draft=(), emitted=(1,), num_accepted=0).tree_nodes == 0
