"""DraftTree against a brute-force construction from the drafts' token prefixes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from latticekit.torch import ROOT, DraftError, DraftTree

# Small vocabularies force shared prefixes and duplicate drafts.
drafts_strategy = st.lists(
    st.lists(st.integers(0, 3), min_size=1, max_size=6), min_size=1, max_size=12
)


def brute_force(drafts: list[list[int]]) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """Unique token prefixes (one per trie node) and the 'is a prefix of' relation between them."""
    prefixes = sorted({tuple(d[: j + 1]) for d in drafts for j in range(len(d))})
    visible = np.array([[b == a[: len(b)] for b in prefixes] for a in prefixes], dtype=bool)
    return prefixes, visible


def node_prefixes(tree: DraftTree) -> list[tuple[int, ...]]:
    return [tuple(int(t) for t in tree.tokens[tree.path(i)]) for i in range(tree.num_nodes)]


@settings(max_examples=150, deadline=None)
@given(drafts=drafts_strategy, prefix_len=st.integers(0, 5))
def test_tree_matches_brute_force(drafts: list[list[int]], prefix_len: int) -> None:
    tree = DraftTree.from_drafts(drafts)
    prefixes, visible = brute_force(drafts)
    mine = node_prefixes(tree)
    # One node per distinct prefix: shared prefixes and duplicates merged.
    assert sorted(mine) == prefixes
    perm = [prefixes.index(p) for p in mine]

    mask = tree.attention_mask(prefix_len)
    assert mask.shape == (1, 1, tree.num_nodes, prefix_len + tree.num_nodes)
    assert mask.dtype == torch.bool
    assert mask[0, 0, :, :prefix_len].all()
    np.testing.assert_array_equal(mask[0, 0, :, prefix_len:].numpy(), visible[np.ix_(perm, perm)])

    additive = tree.attention_mask(prefix_len, dtype=torch.float32)
    np.testing.assert_array_equal((additive == 0).numpy(), mask.numpy())
    assert float(additive.min()) == torch.finfo(torch.float32).min or bool(mask.all())

    np.testing.assert_array_equal(
        tree.position_ids(prefix_len)[0].numpy(), [prefix_len + len(p) - 1 for p in mine]
    )
    assert all(tree.parents[i] < i for i in range(tree.num_nodes))
    # Index maps: each draft's nodes spell the draft, in order.
    for d, draft in enumerate(drafts):
        nodes = tree.draft_nodes[d, : tree.draft_lengths[d]]
        assert tree.tokens[nodes].tolist() == draft
        assert (tree.draft_nodes[d, len(draft):] == -1).all()
        assert d in tree.drafts_through(int(nodes[-1]))
        np.testing.assert_array_equal(tree.path(int(nodes[-1])), nodes)
    for i in range(tree.num_nodes):
        expected = [d for d, draft in enumerate(drafts) if tuple(draft[: len(mine[i])]) == mine[i]]
        assert tree.drafts_through(i).tolist() == expected


def test_first_draft_is_contiguous_and_children_lookup() -> None:
    tree = DraftTree.from_drafts([[5, 6, 7], [5, 6, 8], [5, 9], [5, 6, 7]])
    assert tree.tokens.tolist() == [5, 6, 7, 8, 9]
    assert tree.parents.tolist() == [ROOT, 0, 1, 1, 0]
    assert tree.depths.tolist() == [0, 1, 2, 2, 1]
    assert tree.child(ROOT, 5) == 0 and tree.child(0, 9) == 4 and tree.child(1, 9) is None
    assert tree.children(1) == {7: 2, 8: 3}
    assert not tree.is_chain and DraftTree.from_drafts([[1, 2], [1, 2]]).is_chain
    assert tree.drafts_through(ROOT).tolist() == [0, 1, 2, 3]


def test_tensor_numpy_and_padded_inputs_agree() -> None:
    rows = [[3, 1, 2, 0], [3, 1, 0, 0], [4, 4, 4, 4]]
    lengths = [4, 2, 3]
    ragged = [r[:n] for r, n in zip(rows, lengths)]
    reference = DraftTree.from_drafts(ragged)
    for form in (torch.tensor(rows), np.array(rows, dtype=np.int32)):
        tree = DraftTree.from_drafts(form, lengths=lengths)
        np.testing.assert_array_equal(tree.tokens, reference.tokens)
        np.testing.assert_array_equal(tree.parents, reference.parents)
        np.testing.assert_array_equal(tree.draft_nodes, reference.draft_nodes)


@pytest.mark.parametrize(
    "drafts, message",
    [
        ([], "no drafts"),
        ([[1, 2], []], "draft 1 is empty"),
        (torch.zeros((0, 4), dtype=torch.long), "no drafts"),
        (torch.zeros((3, 0), dtype=torch.long), "draft 0 is empty"),
        ([[1, -2]], "negative"),
        (torch.ones((2, 3)), "integer"),
        (torch.ones(3, dtype=torch.long), "2-D"),
        ([[1.5, 2]], "integer"),
        ([[True]], "integer"),
        (7, "sequence"),
    ],
)
def test_bad_drafts_raise_draft_error(drafts: object, message: str) -> None:
    with pytest.raises(DraftError, match=message):
        DraftTree.from_drafts(drafts)  # type: ignore[arg-type]


def test_bad_lengths_and_prefix() -> None:
    with pytest.raises(DraftError, match="lengths"):
        DraftTree.from_drafts([[1, 2]], lengths=[1, 1])
    with pytest.raises(DraftError, match="outside"):
        DraftTree.from_drafts([[1, 2]], lengths=[3])
    tree = DraftTree.from_drafts([[1, 2]])
    with pytest.raises(DraftError):
        tree.attention_mask(-1)
    with pytest.raises(DraftError, match="dtype"):
        tree.attention_mask(2, dtype=torch.int64)
    assert isinstance(DraftError("x"), ValueError)


@settings(max_examples=40, deadline=None)
@given(drafts=drafts_strategy)
def test_constructor_round_trip(drafts: list[list[int]]) -> None:
    tree = DraftTree.from_drafts(drafts)
    again = DraftTree(tree.tokens, tree.parents, tree.draft_nodes, tree.draft_lengths)
    np.testing.assert_array_equal(again.depths, tree.depths)
    np.testing.assert_array_equal(again.ancestors(), tree.ancestors())
    for i in range(tree.num_nodes):
        assert again.children(i) == tree.children(i)


def test_constructor_rejects_inconsistent_arrays() -> None:
    tree = DraftTree.from_drafts([[1, 2], [1, 3]])  # nodes 1, 2, 3
    t, p, dn, dl = tree.tokens, tree.parents, tree.draft_nodes, tree.draft_lengths
    with pytest.raises(DraftError, match="precede"):
        DraftTree(t, np.array([-1, 2, 0]), dn, dl)
    with pytest.raises(DraftError, match="siblings"):
        DraftTree(np.array([1, 2, 2]), p, dn, dl)
    with pytest.raises(DraftError, match="parent links"):
        DraftTree(t, p, np.array([[0, 1], [1, 2]]), dl)
    with pytest.raises(DraftError, match="some draft"):
        DraftTree(t, p, dn[:1], dl[:1])
    with pytest.raises(DraftError, match="length"):
        DraftTree(t, p, dn, np.array([2, 1]))


@settings(max_examples=40, deadline=None)
@given(drafts=drafts_strategy, prefix_len=st.integers(1, 5))
def test_tree_pass_inputs_prepend_the_root(drafts: list[list[int]], prefix_len: int) -> None:
    """The pass's inputs: root row sees prefix only; node rows are the tree mask with the root visible."""
    from latticekit.torch.verify import tree_pass_inputs

    tree = DraftTree.from_drafts(drafts)
    prefix = torch.arange(10, 10 + prefix_len)
    input_ids, position_ids, mask = tree_pass_inputs(tree, prefix, torch.from_numpy(tree.tokens), torch.bool)
    n = tree.num_nodes
    assert input_ids[0].tolist() == [10 + prefix_len - 1] + tree.tokens.tolist()
    assert position_ids[0].tolist() == [prefix_len - 1] + tree.position_ids(prefix_len)[0].tolist()
    assert mask.shape == (1, 1, n + 1, prefix_len + n)
    assert mask[0, 0, 0].tolist() == [True] * prefix_len + [False] * n
    assert torch.equal(mask[0, 0, 1:], tree.attention_mask(prefix_len)[0, 0])


@settings(max_examples=200, deadline=None)
@given(drafts_strategy)
def test_from_trie_is_the_tree_of_the_drafts(drafts: list[list[int]]) -> None:
    """A drafter's Draft verified as it is (from_trie) against the trie of its paths (from_drafts):
    the same nodes (each named by its path from the root), depths, drafts and attention mask."""
    from latticekit.drafting import Draft

    draft = Draft.from_paths(drafts)
    fast, slow = DraftTree.from_trie(draft.tokens, draft.parents), DraftTree.from_drafts(draft.paths())
    assert fast.tokens.tolist() == draft.tokens.tolist() and fast.parents.tolist() == draft.parents.tolist()

    def nodes(tree: DraftTree) -> dict[tuple[int, ...], int]:
        return {tuple(int(t) for t in tree.tokens[tree.path(i)]): i for i in range(tree.num_nodes)}

    def drafts_of(tree: DraftTree) -> set[tuple[int, ...]]:
        return {tuple(int(t) for t in tree.tokens[tree.draft_nodes[d, :tree.draft_lengths[d]]])
                for d in range(tree.num_drafts)}

    fast_nodes, slow_nodes = nodes(fast), nodes(slow)
    assert set(fast_nodes) == set(slow_nodes) and drafts_of(fast) == drafts_of(slow) == set(draft.paths())
    assert all(fast.depths[i] == len(path) - 1 for path, i in fast_nodes.items())
    fast_mask, slow_mask = fast.attention_mask(2)[0, 0, :, 2:], slow.attention_mask(2)[0, 0, :, 2:]
    for path, i in fast_nodes.items():
        j = slow_nodes[path]
        seen_fast = {p for p, k in fast_nodes.items() if fast_mask[i, k]}
        assert seen_fast == {p for p, k in slow_nodes.items() if slow_mask[j, k]}
