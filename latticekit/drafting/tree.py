"""What a drafter returns: a token trie below the root, to verify in one pass.

Plain numpy. The torch adapter verifies it as it is
(:meth:`latticekit.torch.DraftTree.from_trie`); no loop flattens it into paths and merges
them again.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from latticekit.errors import DraftError

__all__ = ["Draft", "trie"]


def trie(paths: Iterable[Sequence[int]]) -> tuple[list[int], list[int], list[tuple[int, int]]]:
    """Token sequences merged into a trie: each node's token and parent (-1: the root), nodes in
    order of first appearance, and where each node first appeared (path index, position)."""
    tokens: list[int] = []
    parents: list[int] = []
    first: list[tuple[int, int]] = []
    child: dict[tuple[int, int], int] = {}
    for p, path in enumerate(paths):
        node = -1
        for j, token in enumerate(path):
            key = (node, int(token))
            found = child.get(key)
            if found is None:
                found = child[key] = len(tokens)
                tokens.append(int(token))
                parents.append(node)
                first.append((p, j))
            node = found
    return tokens, parents, first


class Draft:
    """A prefix-closed token trie below the root (the last decoded token).

    Attributes:
        tokens (`(n,)` int64): token per node.
        parents (`(n,)` int64): parent per node, -1 under the root; ``parents[i] < i``, and no
            two children of one parent hold the same token.

    An empty draft (``n == 0``, :meth:`none`) asks for a plain one-token step.
    """

    __slots__ = ("tokens", "parents")

    def __init__(self, tokens: Sequence[int] | np.ndarray, parents: Sequence[int] | np.ndarray) -> None:
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        parents = np.asarray(parents, dtype=np.int64).reshape(-1)
        n = tokens.shape[0]
        if parents.shape != (n,):
            raise DraftError(f"a draft needs one parent per token, got {n} tokens and {parents.shape[0]} parents")
        if n and (np.any(parents >= np.arange(n)) or np.any(parents < -1)):
            raise DraftError("every draft node's parent must precede it (or be -1, the root)")
        if n and tokens.min() < 0:
            raise DraftError(f"a draft holds a negative token id {int(tokens.min())}")
        if len(set(zip(parents.tolist(), tokens.tolist()))) != n:
            raise DraftError("two draft nodes under one parent hold the same token")
        self.tokens = tokens
        self.parents = parents

    @classmethod
    def none(cls) -> "Draft":
        """No draft: a plain one-token step."""
        return cls(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))

    @classmethod
    def from_paths(cls, paths: Iterable[Sequence[int]]) -> "Draft":
        """The trie of token sequences continuing the root (shared prefixes merged, empty ones
        ignored); nodes in order of first appearance, so the first path is nodes ``0 .. len - 1``."""
        tokens, parents, _ = trie(paths)
        return cls(tokens, parents)

    @property
    def num_nodes(self) -> int:
        return int(self.tokens.shape[0])

    def __len__(self) -> int:
        """The number of drafts: root-to-leaf paths."""
        return int(self.leaves().shape[0])

    def __bool__(self) -> bool:
        return self.num_nodes > 0

    def leaves(self) -> np.ndarray:
        """The nodes without children, in node order."""
        has_child = np.zeros(self.num_nodes, dtype=bool)
        has_child[self.parents[self.parents >= 0]] = True
        return np.flatnonzero(~has_child)

    def accepted(self, text: Sequence[int], start: int, more: Sequence[int] = ()) -> tuple[int, bool]:
        """What greedy verification accepts of the draft when the target's tokens after the root
        are ``text[start:]`` followed by ``more``: the length of the longest path they begin
        with; and whether the text decides it (False: it ends where that path could go on).
        Reads only the positions from ``start``."""
        child = {(p, t): n for n, (p, t) in enumerate(zip(self.parents.tolist(), self.tokens.tolist()))}
        inner = set(self.parents.tolist())  # the nodes with children (-1: the root)
        node, depth, size = -1, 0, len(text)
        while True:
            at = start + depth
            if at >= size + len(more):
                return depth, node not in inner
            below = child.get((node, int(text[at] if at < size else more[at - size])))
            if below is None:
                return depth, True
            node, depth = below, depth + 1

    def paths(self) -> list[tuple[int, ...]]:
        """The token sequence from the root to every leaf, leaves in node order."""
        parents, tokens = self.parents.tolist(), self.tokens.tolist()
        out = []
        for leaf in self.leaves().tolist():
            path = []
            node = leaf
            while node >= 0:
                path.append(tokens[node])
                node = parents[node]
            out.append(tuple(reversed(path)))
        return out

    def __eq__(self, other: object) -> bool:
        """Equal to a draft with the same nodes, or to the list of its :meth:`paths`."""
        if isinstance(other, Draft):
            return np.array_equal(self.tokens, other.tokens) and np.array_equal(self.parents, other.parents)
        if isinstance(other, (list, tuple)):
            return self.paths() == [tuple(path) for path in other]
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # unhashable: mutable arrays

    def __repr__(self) -> str:
        return f"Draft({self.paths()!r})"
