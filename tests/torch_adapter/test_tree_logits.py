"""Projecting a tree pass's rows on demand (``TreeLogits``) against projecting every row.

* Any row read equals the same row of the full projection, on random trees and random walks.
* The projection policy: the root and draft 0 come with the pass; a walk leaving draft 0 makes
  one more projection, of the node it moved to and all its descendants, and no further one.
* In ``verify``: a greedy walk that switches drafts gives plain greedy decoding's tokens and the
  outputs of the all-rows pass (``tree_forward``), on Llama, GPT-2 and a protocol module; a
  model with a step after its head (Cohere's logit scale) is detected and never projected apart.
"""

from __future__ import annotations

import copy
import sys
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from latticekit.torch import DraftTree, prefill, tree_forward, verify
from latticekit.torch.acceptance import greedy_accept
from latticekit.torch.logits import TreeLogits, first_block_rows
from lk_torch_helpers import (
    VOCAB,
    TinyProtocolLM,
    TinyProtocolLMFullLogits,
    plain_greedy,
    tiny_cohere,
    tiny_gpt2,
    tiny_llama,
)

target_module = sys.modules["latticekit.torch.target"]
logits_module = sys.modules["latticekit.torch.logits"]
PROMPT = [3, 17, 42, 8, 25, 60, 11]
H = 5


def lazy_logits(tree: DraftTree, hidden: torch.Tensor, head: torch.nn.Linear) -> TreeLogits:
    rows = list(range(int(tree.draft_lengths[0]) + 1))  # root + draft 0, whatever the tree's size
    return TreeLogits(tree, hidden, head, rows, head(hidden[rows]))


@pytest.fixture
def any_tree_size(monkeypatch: Any) -> None:
    """The test trees are tiny; project lazily whatever their size."""
    monkeypatch.setattr(logits_module, "_LAZY_MIN_FACTOR", 1)


def test_small_trees_are_projected_with_the_pass() -> None:
    chain = DraftTree.from_drafts([[1, 2, 3]])
    assert first_block_rows(chain) is None
    assert first_block_rows(DraftTree.from_drafts([[1, 2, 3], [4, 5, 6]])) is None  # 7 rows < 3 x 4
    wide = DraftTree.from_drafts([[1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11, 12]])  # 13 rows >= 12
    assert first_block_rows(wide) == [0, 1, 2, 3]
    model = tiny_llama()
    ids = torch.tensor(PROMPT)
    verify(model, prefill(model, ids), ids, chain)  # the first verify checks the head: every row
    assert verify(model, prefill(model, ids), ids, chain).projected_rows == 4
    assert verify(model, prefill(model, ids), ids, DraftTree.from_drafts([[1, 2, 3], [4, 5, 6]])).projected_rows == 7
    assert verify(model, prefill(model, ids), ids, wide).projected_rows in (4, 7)  # + one subtree at most


@settings(max_examples=80, deadline=None)
@given(
    drafts=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=6), min_size=1, max_size=12),
    walk=st.lists(st.integers(0, 3), min_size=1, max_size=7),
    seed=st.integers(0, 2**16),
)
def test_rows_read_equal_the_full_projection(drafts: list[list[int]], walk: list[int], seed: int) -> None:
    tree = DraftTree.from_drafts(drafts)
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tree.num_nodes + 1, 16, generator=gen)
    head = torch.nn.Linear(16, 50, bias=False)
    torch.nn.init.normal_(head.weight, generator=gen)
    with torch.no_grad():
        full = head(hidden)
        logits = lazy_logits(tree, hidden, head)
        node = -1
        for token in walk:  # descend along arbitrary children, as any walk may
            torch.testing.assert_close(logits[node + 1], full[node + 1], atol=1e-5, rtol=1e-6)
            assert logits.argmax(node + 1) == int(logits[node + 1].argmax())
            nxt = tree.child(node, token)
            if nxt is None:
                break
            node = nxt
        assert logits.projections <= 1  # leaving draft 0 once projects everything below
        torch.testing.assert_close(logits.all(), full, atol=1e-5, rtol=1e-6)


def test_projection_policy_draft_0_then_the_subtree_moved_to() -> None:
    # node ids: draft 0 = 0 1 2; draft 1 = 0 3 4; draft 2 = 5 6 7 (8 below 6 from draft 3)
    tree = DraftTree.from_drafts([[1, 2, 3], [1, 4, 5], [6, 7, 8], [6, 7, 9]])
    hidden = torch.randn(tree.num_nodes + 1, 8)
    head = torch.nn.Linear(8, 20)
    with torch.no_grad():
        logits = lazy_logits(tree, hidden, head)
        assert logits.projected_rows.tolist() == [0, 1, 2, 3]
        for row in (0, 1, 2, 3):
            logits.argmax(row)
        assert logits.projections == 0
        logits[3 + 1]  # node 3, off draft 0: node 3 and its child node 4
        assert logits.projections == 1
        assert logits.projected_rows.tolist() == [0, 1, 2, 3, 4, 5]
        logits[5 + 1]  # node 5 (root's second child): its whole subtree 5, 6, 7, 8
        assert logits.projections == 2
        assert logits.projected_rows.tolist() == list(range(tree.num_nodes + 1))
        for row in range(tree.num_nodes + 1):
            torch.testing.assert_close(logits[row], head(hidden[row]), atol=1e-5, rtol=1e-6)
        assert logits.projections == 2
        with pytest.raises(IndexError):
            logits[tree.num_nodes + 1]


def test_small_blocks_are_padded_but_store_only_their_rows() -> None:
    tree = DraftTree.from_drafts([[1, 2, 3, 4], [5, 6], [7]])  # node 4's subtree: 2 nodes; node 6's: 1
    hidden = torch.randn(tree.num_nodes + 1, 8)
    seen: list[int] = []

    def head(rows: torch.Tensor) -> torch.Tensor:
        seen.append(rows.shape[0])
        return rows @ torch.ones(8, 3)

    logits = lazy_logits(tree, hidden, torch.nn.Linear(8, 3))
    logits.project = head
    logits[4 + 1]
    logits[6 + 1]
    assert seen == [4, 1]  # two rows padded to four; a single row is not padded
    assert logits.projected_rows.tolist() == list(range(tree.num_nodes + 1))
    torch.testing.assert_close(logits[5 + 1], hidden[5 + 1] @ torch.ones(8, 3))


def switching_drafts(ref: list[int]) -> list[list[int]]:
    """Draft 0 is right for one token, draft 1 for none, draft 2 entirely: the greedy walk
    leaves draft 0 at its first node and finishes on draft 2."""
    n = len(PROMPT)
    wrong = (ref[n + 1] + 1) % VOCAB
    return [[ref[n], wrong] + [0] * (H - 2), [(ref[n] + 1) % VOCAB] * H, ref[n:n + H]]


@pytest.mark.usefixtures("any_tree_size")
@pytest.mark.parametrize("arch", ["llama", "gpt2", "protocol"])
def test_verify_walk_switching_drafts(arch: str, monkeypatch: Any) -> None:
    model = {"llama": tiny_llama, "gpt2": tiny_gpt2, "protocol": TinyProtocolLM}[arch]()
    ref, _ = plain_greedy(model, PROMPT, H + 1)
    drafts = switching_drafts(ref)
    tree = DraftTree.from_drafts(drafts)
    projected: list[list[int]] = []
    original = TreeLogits._project

    def spy(self: TreeLogits, rows: list[int]) -> None:
        projected.append(rows)
        original(self, rows)

    monkeypatch.setattr(TreeLogits, "_project", spy)
    ids = torch.tensor(PROMPT)
    verify(model, prefill(model, ids), ids, DraftTree.from_drafts([[1]]))  # the HF check of the head
    assert target_module.Target(model).projects_rows
    projected.clear()
    cache = prefill(model, ids)
    snapshot = copy.deepcopy(cache)
    result = verify(model, cache, ids, tree)
    assert result.emitted_tokens.tolist() == ref[len(PROMPT):len(PROMPT) + H + 1]
    assert result.accepted_drafts.tolist() == [2]
    # root + draft 0 came with the pass; the walk left it after node 0 (shared with draft 2):
    # one projection, of draft 2's other nodes (the subtree it moved to)
    assert projected == [[int(n) + 1 for n in tree.draft_nodes[2, 1:]]]
    full = tree_forward(model, snapshot, ids, tree)
    last = result.accepted_nodes[-1] + 1
    torch.testing.assert_close(result.logits, full.logits[last], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(result.hidden_state, full.hidden_states[last])
    assert greedy_accept(tree, full.logits.argmax(-1).tolist()).nodes == result.accepted_nodes


@pytest.mark.usefixtures("any_tree_size")
@pytest.mark.parametrize("rule", ["sampling", "token", "block"])
def test_sampling_rules_read_the_same_rows_as_all_rows(rule: str) -> None:
    """Same seed, same drafts: the lazy pass and a pass projecting every row emit the same
    tokens (the rows differ at most by rounding, far below any sampling threshold here)."""
    model = tiny_llama()
    ids = torch.tensor(PROMPT)
    ref, ref_logits = plain_greedy(model, PROMPT, H + 1)
    drafts = [ref[len(PROMPT):len(PROMPT) + H]] if rule != "sampling" else switching_drafts(ref)
    q = torch.softmax(ref_logits[:H] / 0.5, -1).double() if rule != "sampling" else None
    verify(model, prefill(model, ids), ids, DraftTree.from_drafts([[1]]))  # the HF check of the head
    emitted = {}
    for projects in (True, False):
        target_module.HEAD_IS_LAST_STEP[model] = projects
        out = []
        for seed in range(30):
            result = verify(model, prefill(model, ids), ids, DraftTree.from_drafts(drafts), rule,
                            temperature=0.9, draft_probs=q, generator=torch.Generator().manual_seed(seed))
            out.append(result.emitted_tokens.tolist())
        emitted[projects] = out
    assert emitted[True] == emitted[False]
    assert max(map(len, emitted[True])) > 1  # drafts were accepted


def test_a_step_after_the_head_is_detected() -> None:
    model = tiny_cohere()
    ids = torch.tensor(PROMPT)
    assert model not in target_module.HEAD_IS_LAST_STEP
    verify(model, prefill(model, ids), ids, DraftTree.from_drafts([[1, 2], [3]]))
    assert target_module.HEAD_IS_LAST_STEP[model] is False  # logits = head(hidden) * logit_scale
    assert not target_module.Target(model).projects_rows
    llama = tiny_llama()
    verify(llama, prefill(llama, ids), ids, DraftTree.from_drafts([[1, 2], [3]]))
    assert target_module.HEAD_IS_LAST_STEP[llama] is True


def test_protocol_module_without_the_split_projects_every_row() -> None:
    assert target_module.Target(TinyProtocolLM()).projects_rows
    assert not target_module.Target(TinyProtocolLMFullLogits()).projects_rows
    model = TinyProtocolLMFullLogits()
    ids = torch.tensor(PROMPT)
    result = verify(model, prefill(model, ids), ids, DraftTree.from_drafts([[1, 2], [3, 4]]))
    assert result.logits.shape == (VOCAB,)
    assert np.isfinite(result.logits.numpy()).all()
