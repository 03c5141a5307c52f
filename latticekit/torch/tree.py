"""A token tree (trie) of drafts, with the attention mask and positions to verify it in one pass.

p drafts from a p-best search share long prefixes. :class:`DraftTree` merges them into a trie
whose nodes are draft tokens; the root is implicit (it stands for the last prefix token). Node
indices follow first insertion, so a node's parent always has a smaller index and the first
draft occupies nodes ``0 .. len(drafts[0]) - 1`` in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional, Union

import numpy as np
import torch

from latticekit.errors import DraftError

__all__ = ["DraftTree", "ROOT"]

#: Parent index of the nodes that hang directly under the (implicit) root.
ROOT = -1

DraftsLike = Union[torch.Tensor, np.ndarray, Sequence[Sequence[int]]]


def _draft_array(drafts: DraftsLike, lengths: Optional[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Reads drafts of any accepted kind into a padded int64 `(p, h)` array and their lengths.

    Tensors and arrays are checked with a few vectorised operations; sequences (possibly
    ragged) are checked token by token. Entries past a draft's length are -1.
    """
    if isinstance(drafts, torch.Tensor):
        if drafts.is_floating_point() or drafts.is_complex() or drafts.dtype == torch.bool:
            raise DraftError(f"drafts must hold integer token ids, got dtype {drafts.dtype}")
        if drafts.dim() != 2:
            raise DraftError(f"drafts must be 2-D (p, h), got shape {tuple(drafts.shape)}")
        if drafts.device.type == "meta":
            raise DraftError("drafts live on the meta device and hold no ids")
        array = drafts.detach().to("cpu", torch.int64).numpy()
    elif isinstance(drafts, np.ndarray):
        if drafts.dtype.kind not in "iu":
            raise DraftError(f"drafts must hold integer token ids, got dtype {drafts.dtype}")
        if drafts.ndim != 2:
            raise DraftError(f"drafts must be 2-D (p, h), got shape {drafts.shape}")
        array = drafts.astype(np.int64, copy=False)
    else:
        try:
            rows = [list(row) for row in drafts]
        except TypeError as exc:
            raise DraftError("drafts must be a 2-D tensor/array or a sequence of id sequences") from exc
        for row in rows:
            for tok in row:
                if isinstance(tok, (bool, np.bool_)) or not isinstance(tok, (int, np.integer)):
                    raise DraftError(f"draft tokens must be integer ids, got {tok!r}")
        if not rows:
            raise DraftError("no drafts: need at least one draft of at least one token")
        row_lengths = [len(row) for row in rows]
        array = np.full((len(rows), max(row_lengths)), -1, dtype=np.int64)
        for i, row in enumerate(rows):
            array[i, : len(row)] = row
        if lengths is None:
            lengths = row_lengths
        else:
            lengths = list(lengths)
            if len(lengths) == len(rows):
                for i, n in enumerate(lengths):
                    if not 0 <= n <= row_lengths[i]:
                        raise DraftError(f"length {n} of draft {i} is outside 0..{row_lengths[i]}")

    if array.shape[0] == 0:
        raise DraftError("no drafts: need at least one draft of at least one token")
    p, h = array.shape
    if lengths is None:
        lens = np.full(p, h, dtype=np.int64)
    else:
        lens = np.asarray(list(lengths), dtype=np.int64).reshape(-1)
        if lens.shape[0] != p:
            raise DraftError(f"got {lens.shape[0]} lengths for {p} drafts")
        bad = np.flatnonzero((lens < 0) | (lens > h))
        if bad.size:
            raise DraftError(f"length {int(lens[bad[0]])} of draft {int(bad[0])} is outside 0..{h}")
    empty = np.flatnonzero(lens == 0)
    if empty.size:
        raise DraftError(f"draft {int(empty[0])} is empty: every draft needs at least one token")
    inside = np.arange(h) < lens[:, None]
    if not inside.all():
        array = np.where(inside, array, -1)
    negative = (array < 0) & inside
    if negative.any():
        d = int(np.flatnonzero(negative.any(axis=1))[0])
        raise DraftError(f"draft {d} holds a negative token id {int(array[d][inside[d]].min())}")
    return array, lens


_TRIL: dict[int, tuple[np.ndarray, np.ndarray]] = {}


def _tril_indices(h: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.tril_indices(h)``, cached (it costs more than the scatter it feeds)."""
    if h not in _TRIL:
        _TRIL[h] = np.tril_indices(h)
    return _TRIL[h]


# Above this many drafts the all-pairs prefix comparison of the vectorised build (p * p * h
# booleans) costs more than walking the trie in Python.
_VECTOR_BUILD_MAX_DRAFTS = 256


class DraftTree:
    """p drafts merged into a trie of draft tokens, shared prefixes and duplicates merged.

    Attributes:
        tokens (`np.ndarray` of shape `(num_nodes,)`): the token id at each node.
        parents (`np.ndarray` of shape `(num_nodes,)`): index of each node's parent, ``ROOT``
            (-1) for nodes right under the root. ``parents[i] < i``.
        depths (`np.ndarray` of shape `(num_nodes,)`): 0 for the first draft token, 1 for the
            second, ... (the number of draft tokens before the node on its path).
        draft_nodes (`np.ndarray` of shape `(num_drafts, max_draft_len)`): ``draft_nodes[d, j]``
            is the node holding token ``j`` of draft ``d``; -1 past the end of a shorter draft.
        draft_lengths (`np.ndarray` of shape `(num_drafts,)`): length of each draft.
    """

    def __init__(
        self,
        tokens: np.ndarray,
        parents: np.ndarray,
        draft_nodes: np.ndarray,
        draft_lengths: np.ndarray,
    ) -> None:
        """Builds a tree from its arrays; use :meth:`from_drafts` unless you hold them already.

        Args:
            tokens (`np.ndarray` of shape `(num_nodes,)`): token id per node.
            parents (`np.ndarray` of shape `(num_nodes,)`): parent per node, -1 for root's children;
                every parent must precede its child.
            draft_nodes (`np.ndarray` of shape `(num_drafts, max_draft_len)`): node per draft token,
                -1 past a draft's end; each draft must follow parent links from the root.
            draft_lengths (`np.ndarray` of shape `(num_drafts,)`): length per draft.

        Raises:
            DraftError: the arrays disagree, a parent does not precede its child, two siblings
                hold one token, a draft does not follow parent links, or a node is on no draft.
        """
        tokens = np.asarray(tokens, dtype=np.int64)
        parents = np.asarray(parents, dtype=np.int64)
        draft_nodes = np.asarray(draft_nodes, dtype=np.int64)
        draft_lengths = np.asarray(draft_lengths, dtype=np.int64)
        n = tokens.shape[0]
        if n == 0 or tokens.ndim != 1 or parents.shape != (n,):
            raise DraftError(f"need 1-D tokens and parents of one non-zero length, got {tokens.shape}, {parents.shape}")
        if np.any(parents >= np.arange(n)) or np.any(parents < ROOT):
            raise DraftError("every node's parent must precede it (or be ROOT)")
        if draft_nodes.ndim != 2 or draft_lengths.shape != (draft_nodes.shape[0],) or draft_nodes.shape[0] == 0:
            raise DraftError(f"draft_nodes {draft_nodes.shape} and draft_lengths {draft_lengths.shape} disagree")
        depths = np.zeros(n, dtype=np.int64)
        child: dict[tuple[int, int], int] = {}
        for i in range(n):
            parent, tok = int(parents[i]), int(tokens[i])
            depths[i] = 0 if parent == ROOT else depths[parent] + 1
            if (parent, tok) in child:
                raise DraftError(f"nodes {child[parent, tok]} and {i} are siblings with one token {tok}")
            child[parent, tok] = i
        columns = np.arange(draft_nodes.shape[1])
        inside = columns < draft_lengths[:, None]
        if np.any((draft_nodes >= 0) != inside) or np.any(draft_nodes >= n):
            raise DraftError("draft_nodes must hold node ids exactly up to each draft's length")
        expected_parents = np.concatenate([np.full((draft_nodes.shape[0], 1), ROOT), draft_nodes[:, :-1]], axis=1)
        if np.any(parents[draft_nodes[inside]] != expected_parents[inside]):
            raise DraftError("a draft's nodes do not follow parent links from the root")
        if np.unique(draft_nodes[inside]).shape[0] != n:
            raise DraftError("every node must lie on some draft")
        self._set(tokens, parents, depths, draft_nodes, draft_lengths, child)

    def _set(
        self,
        tokens: np.ndarray,
        parents: np.ndarray,
        depths: np.ndarray,
        draft_nodes: np.ndarray,
        draft_lengths: np.ndarray,
        child: Optional[dict[tuple[int, int], int]],
    ) -> None:
        self.tokens = tokens
        self.parents = parents
        self.depths = depths
        self.draft_nodes = draft_nodes
        self.draft_lengths = draft_lengths
        self._child_map = child
        self._ancestors: Optional[np.ndarray] = None
        # Per-tree caches of what a tree pass needs, keyed by (dtype, device).
        self._pass_blocks: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}
        self._device_arrays: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def _child(self) -> dict[tuple[int, int], int]:
        """(parent, token) -> node, built on first use."""
        if self._child_map is None:
            keys = zip(self.parents.tolist(), self.tokens.tolist())
            self._child_map = dict(zip(keys, range(self.num_nodes)))
        return self._child_map

    @classmethod
    def from_drafts(cls, drafts: DraftsLike, lengths: Optional[Sequence[int]] = None) -> "DraftTree":
        """Merges p drafts into a trie.

        Args:
            drafts: `torch.Tensor` or `np.ndarray` of shape `(p, h)` with integer ids, or a
                sequence of p id sequences of any lengths (ragged drafts).
            lengths: optional length of each row of a padded `(p, h)` input; tokens past a
                row's length are ignored.

        Returns:
            The trie. Identical drafts and shared prefixes become shared nodes.

        Raises:
            DraftError: no drafts, an empty draft, non-integer or negative ids, wrong rank.
        """
        array, lens = _draft_array(drafts, lengths)
        if array.shape[0] <= _VECTOR_BUILD_MAX_DRAFTS:
            return cls._build_vectorised(array, lens)
        return cls._build_walk(array, lens)

    @classmethod
    def from_trie(cls, tokens: np.ndarray, parents: np.ndarray) -> "DraftTree":
        """The tree of a prefix-closed trie as a drafter returns it
        (:class:`latticekit.drafting.Draft`): node i holds ``tokens[i]`` below ``parents[i]``
        (-1: the root), parents first; one draft per leaf, node order kept.

        Raises:
            DraftError: an empty trie, or arrays that are not one (see the constructor).
        """
        tokens = np.asarray(tokens, dtype=np.int64)
        parents = np.asarray(parents, dtype=np.int64)
        n = tokens.shape[0]
        if n == 0 or parents.shape != (n,) or np.any(parents >= np.arange(n)) or np.any(parents < ROOT):
            raise DraftError("a draft trie needs one parent per node, each before its child (or ROOT)")
        depths = np.zeros(n, dtype=np.int64)
        for i, parent in enumerate(parents.tolist()):
            depths[i] = 0 if parent == ROOT else depths[parent] + 1
        has_child = np.zeros(n, dtype=bool)
        has_child[parents[parents >= 0]] = True
        leaves = np.flatnonzero(~has_child)
        lengths = depths[leaves] + 1
        draft_nodes = np.full((len(leaves), int(lengths.max())), -1, dtype=np.int64)
        for d, leaf in enumerate(leaves.tolist()):
            node = leaf
            for j in range(int(lengths[d]) - 1, -1, -1):
                draft_nodes[d, j] = node
                node = int(parents[node])
        return cls(tokens, parents, draft_nodes, lengths)

    @classmethod
    def _build_vectorised(cls, array: np.ndarray, lens: np.ndarray) -> "DraftTree":
        """Trie of a padded `(p, h)` array by comparing all pairs of drafts' prefixes at once.

        Token ``j`` of draft ``d`` opens a new node exactly when no earlier draft shares the
        prefix ``0..j`` with it; numbering the new (d, j) cells row-major gives first-insertion
        order, and every other cell takes the node of the first draft sharing its prefix.
        """
        p, h = array.shape
        padded = bool(lens.min() < h)
        same = array[:, None, :] == array[None, :, :]
        if padded:
            inside = array >= 0
            same &= inside[None, :, :]
        np.logical_and.accumulate(same, axis=2, out=same)
        first = same.argmax(axis=0)  # (p, h): the first draft sharing draft d's prefix 0..j
        is_new = first == np.arange(p)[:, None]
        if padded:
            is_new &= inside
        numbered = np.cumsum(is_new.ravel()).reshape(p, h) - 1
        draft_nodes = numbered[first, np.arange(h)]
        if padded:
            draft_nodes = np.where(inside, draft_nodes, -1)
        parent_grid = np.empty_like(draft_nodes)
        parent_grid[:, 0] = ROOT
        parent_grid[:, 1:] = draft_nodes[:, :-1]
        tree = cls.__new__(cls)
        tree._set(
            array[is_new],
            parent_grid[is_new],
            np.nonzero(is_new)[1].astype(np.int64),
            draft_nodes[:, : int(lens.max())],
            lens,
            None,
        )
        return tree

    @classmethod
    def _build_walk(cls, array: np.ndarray, lens: np.ndarray) -> "DraftTree":
        """Trie of a padded `(p, h)` array by walking it draft by draft (for very many drafts)."""
        child: dict[tuple[int, int], int] = {}
        tokens: list[int] = []
        parents: list[int] = []
        depths: list[int] = []
        max_len = int(lens.max())
        draft_nodes = np.full((array.shape[0], max_len), -1, dtype=np.int64)
        for d, (row, n) in enumerate(zip(array.tolist(), lens.tolist())):
            node = ROOT
            for j, tok in enumerate(row[:n]):
                nxt = child.get((node, tok))
                if nxt is None:
                    nxt = child[node, tok] = len(tokens)
                    tokens.append(tok)
                    parents.append(node)
                    depths.append(j)
                node = nxt
                draft_nodes[d, j] = node
        tree = cls.__new__(cls)
        tree._set(
            np.array(tokens, dtype=np.int64),
            np.array(parents, dtype=np.int64),
            np.array(depths, dtype=np.int64),
            draft_nodes,
            lens,
            child,
        )
        return tree

    @property
    def num_nodes(self) -> int:
        """Number of nodes after merging (not counting the implicit root)."""
        return int(self.tokens.shape[0])

    @property
    def num_drafts(self) -> int:
        """Number of drafts the tree was built from (p), duplicates included."""
        return int(self.draft_lengths.shape[0])

    @property
    def max_depth(self) -> int:
        """Length of the longest draft."""
        return int(self.depths.max()) + 1

    @property
    def is_chain(self) -> bool:
        """True when the tree is a single path (one draft, or p identical drafts)."""
        return bool(np.all(self.parents == np.arange(self.num_nodes) - 1))

    def child(self, node: int, token: int) -> Optional[int]:
        """The child of ``node`` (``ROOT`` for the root) holding ``token``, or None."""
        return self._child.get((node, token))

    def children(self, node: int) -> dict[int, int]:
        """Map token -> child node for the children of ``node`` (``ROOT`` for the root)."""
        return {tok: c for (parent, tok), c in self._child.items() if parent == node}

    def path(self, node: int) -> np.ndarray:
        """Node indices from the root's child down to ``node`` (empty for ``ROOT``).

        Returns:
            `np.ndarray` of shape `(depth + 1,)`.
        """
        out: list[int] = []
        while node != ROOT:
            out.append(node)
            node = int(self.parents[node])
        return np.array(out[::-1], dtype=np.int64)

    def drafts_through(self, node: int) -> np.ndarray:
        """Indices of the drafts whose path passes through ``node`` (all drafts for ``ROOT``)."""
        if node == ROOT:
            return np.arange(self.num_drafts)
        depth = int(self.depths[node])
        return np.flatnonzero(self.draft_nodes[:, depth] == node)

    def ancestors(self) -> np.ndarray:
        """Ancestor-or-self relation of the nodes.

        Returns:
            `np.ndarray` of bool, shape `(num_nodes, num_nodes)`: ``[i, j]`` is True when node
            ``j`` lies on the path from the root to node ``i`` (``i`` included).
        """
        if self._ancestors is None:
            # Every node lies on a draft, and along a draft node j's ancestors are nodes 0..j:
            # one scatter over all (draft, j, i <= j) triples.
            later, earlier = _tril_indices(self.draft_nodes.shape[1])
            rows, cols = self.draft_nodes[:, later], self.draft_nodes[:, earlier]
            anc = np.zeros((self.num_nodes, self.num_nodes), dtype=bool)
            if bool(self.draft_lengths.min() == self.draft_nodes.shape[1]):
                anc[rows, cols] = True  # no padding
            else:
                valid = rows >= 0
                anc[rows[valid], cols[valid]] = True
            self._ancestors = anc
        return self._ancestors

    def attention_mask(
        self,
        prefix_len: int,
        dtype: torch.dtype = torch.bool,
        device: Union[str, torch.device, None] = None,
    ) -> torch.Tensor:
        """The 4-D mask that lets each node see the prefix, its ancestors and itself.

        Args:
            prefix_len: number of tokens before the first draft token (all visible to all nodes).
            dtype: ``torch.bool`` for a boolean mask (True = may attend), or a floating dtype for
                an additive mask (0 where visible, the dtype's most negative finite value elsewhere).
            device: device of the result.

        Returns:
            `torch.Tensor` of shape `(1, 1, num_nodes, prefix_len + num_nodes)`.

        Raises:
            DraftError: ``prefix_len`` is negative or ``dtype`` is neither bool nor floating.
        """
        if prefix_len < 0:
            raise DraftError(f"prefix_len must be >= 0, got {prefix_len}")
        return self.pass_mask(prefix_len, dtype, device)[:, :, 1:].clone()  # the node rows

    def position_ids(self, prefix_len: int, device: Union[str, torch.device, None] = None) -> torch.Tensor:
        """Positions of the nodes: ``prefix_len + depth``.

        Returns:
            `torch.LongTensor` of shape `(1, num_nodes)`.
        """
        if prefix_len < 0:
            raise DraftError(f"prefix_len must be >= 0, got {prefix_len}")
        _, offsets = self.pass_arrays(device)
        return (offsets[1:] + prefix_len)[None]  # a pass's positions without the root's

    def pass_arrays(self, device: Union[str, torch.device, None] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The node tokens and the pass's position offsets on ``device``, cached per tree.

        Returns:
            ``tokens`` (`torch.LongTensor` of shape `(num_nodes,)`) and ``offsets``
            (`torch.LongTensor` of shape `(num_nodes + 1,)`): -1 for the root, then each node's
            depth; the positions of a pass over a prefix of length L are ``L + offsets``.
        """
        device = torch.device("cpu") if device is None else torch.device(device)
        arrays = self._device_arrays.get(device)
        if arrays is None:
            offsets = np.empty(self.num_nodes + 1, dtype=np.int64)
            offsets[0] = -1
            offsets[1:] = self.depths
            arrays = (torch.from_numpy(self.tokens).to(device), torch.from_numpy(offsets).to(device))
            self._device_arrays[device] = arrays
        return arrays

    def pass_mask_block(self, dtype: torch.dtype, device: Union[str, torch.device, None] = None) -> torch.Tensor:
        """The tree part of a pass's mask (root row, then node rows), cached per tree.

        Args:
            dtype: ``torch.bool`` (True = may attend) or a floating dtype (additive: 0 where
                visible, the dtype's most negative finite value elsewhere).
            device: device of the result.

        Returns:
            `torch.Tensor` of shape `(num_nodes + 1, num_nodes)`: row 0 (the root) sees no node,
            row ``i + 1`` sees node ``i``'s ancestors and itself.

        Raises:
            DraftError: ``dtype`` is neither bool nor floating.
        """
        device = torch.device("cpu") if device is None else torch.device(device)
        block = self._pass_blocks.get((dtype, device))
        if block is None:
            visible = np.zeros((self.num_nodes + 1, self.num_nodes), dtype=bool)
            visible[1:] = self.ancestors()
            block = mask_from_visibility(visible, dtype, device)[0, 0]
            self._pass_blocks[dtype, device] = block
        return block

    def pass_mask(
        self, prefix_len: int, dtype: torch.dtype, device: Union[str, torch.device, None] = None
    ) -> torch.Tensor:
        """The mask of one pass over the root and every node: ``prefix_len`` columns that every
        row sees (the cached tokens and the root, the last of them), then :meth:`pass_mask_block`.

        Args:
            prefix_len: tokens up to and including the root.
            dtype: ``torch.bool`` (True = may attend) or a floating dtype (additive: 0 where
                visible, the dtype's most negative finite value elsewhere).
            device: device of the result.

        Returns:
            `torch.Tensor` of shape `(1, 1, num_nodes + 1, prefix_len + num_nodes)`: row 0 is the
            root's, row ``i + 1`` node ``i``'s.

        Raises:
            DraftError: ``dtype`` is neither bool nor floating.
        """
        block = self.pass_mask_block(dtype, device)  # cached per tree
        n = self.num_nodes
        mask = torch.empty((1, 1, n + 1, prefix_len + n), dtype=dtype, device=block.device)
        mask[0, 0].narrow(1, 0, prefix_len).fill_(True if dtype == torch.bool else 0)
        mask[0, 0].narrow(1, prefix_len, n).copy_(block)
        return mask

    def __repr__(self) -> str:
        return (
            f"DraftTree(num_drafts={self.num_drafts}, num_nodes={self.num_nodes}, "
            f"max_depth={self.max_depth})"
        )


def mask_from_visibility(
    visible: np.ndarray, dtype: torch.dtype, device: Union[str, torch.device, None]
) -> torch.Tensor:
    """Turns a 2-D visibility matrix into a 4-D boolean or additive attention mask.

    Args:
        visible (`np.ndarray` of bool, shape `(queries, keys)`): True where a query may attend.
        dtype: ``torch.bool`` or a floating dtype (additive mask).
        device: device of the result.

    Returns:
        `torch.Tensor` of shape `(1, 1, queries, keys)`.

    Raises:
        DraftError: ``dtype`` is neither bool nor floating.
    """
    if dtype == torch.bool:
        return torch.from_numpy(visible).to(device)[None, None]
    if not dtype.is_floating_point:
        raise DraftError(f"mask dtype must be torch.bool or floating, got {dtype}")
    # Built on the host in a dtype that holds finfo(dtype).min exactly, converted in one copy.
    host = np.float64 if dtype == torch.float64 else np.float32
    additive = np.where(visible, host(0), host(torch.finfo(dtype).min))
    return torch.from_numpy(additive).to(device=device, dtype=dtype)[None, None]
