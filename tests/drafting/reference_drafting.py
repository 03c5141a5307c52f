"""The drafting state as latticekit computed it before the C++ core took it over, kept verbatim
as the reference the fast path is tested against (tests/drafting/test_drafting_reference.py,
tests/drafting/test_union.py).

Pure Python, obviously correct and slow: the Katz successors from numpy tables
(``latticekit/drafting/successors.py`` at f1f7f19), the n-gram cache of the text as
dictionaries of tuples, each next-token distribution scored over every follower
(``cache_model.py``), the best-first search (``continuations.py``), the pending labels checked
node by node (``calibration.py``), the chain drafter's step (``chains.py``) and the union of the
heads' paths with the text's continuations (``union.py``). Only names changed (``Reference*``)
and imports.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Sequence
from typing import Any, Optional

import numpy as np

from latticekit.drafting.calibration import FEATURES, SOURCES, AcceptanceModel, CandidateTree, logit
from latticekit.drafting.continuations import Continuations
from latticekit.errors import DecoderConfigError
from latticekit.lattice import SausageLattice
from latticekit.ngram import NGramLM
from latticekit.search import pbest

LN10 = math.log(10.0)


class ReferenceKatzSuccessors:
    """The next-token index of one :class:`NGramLM` over token ids (words spelled as decimal ids).

    Use :meth:`of` to share one index per model.

    Raises:
        DecoderConfigError: the model's words are not token ids (a model read with ``vocab``).
    """

    def __init__(self, lm: NGramLM) -> None:
        words = lm.words
        token_of = lm.word_token_ids()
        if not (token_of >= 0).any():
            raise DecoderConfigError("the static n-gram model's words must be token ids (decimal)")
        self.lm = lm
        self.order = lm.order
        self.base = len(words)
        self.token_of = token_of  # word id -> token id, -1 for <unk>, <s>, </s>
        self.word_of = np.zeros(int(token_of.max()) + 1, dtype=np.int64)  # token id -> word id (0: <unk>)
        self.word_of[token_of[token_of >= 0]] = np.nonzero(token_of >= 0)[0]
        # Per order n (index n - 1): sorted keys, and the rows re-sorted by (prefix, -log10 p, token id).
        self.keys: list[np.ndarray] = []
        self.backoff: list[np.ndarray] = []
        self.log10p: list[np.ndarray] = []
        self.ranked_words: list[np.ndarray] = []
        self.ranked_log10p: list[np.ndarray] = []
        for n in range(1, self.order + 1):
            ids, log10p, backoff = lm.ngrams(n)
            ids = ids.astype(np.int64)
            if n == 1:
                keys = ids[:, 0]
            else:
                prefix = self._rows(ids[:, : n - 1])
                if (prefix < 0).any():  # the model fills missing prefixes in; a guard all the same
                    raise DecoderConfigError("the n-gram model is not prefix-closed")
                keys = prefix * self.base + ids[:, n - 1]
            rank = np.lexsort((token_of[ids[:, n - 1]], -log10p.astype(np.float64), keys // self.base))
            self.keys.append(keys)
            self.log10p.append(log10p)
            self.backoff.append(backoff)
            self.ranked_words.append(ids[rank, n - 1])
            self.ranked_log10p.append(log10p[rank])
        self._states: dict[tuple[int, ...], ReferenceKatzState] = {}

    # -- rows of the n-gram tables -------------------------------------------------------------

    def _rows(self, ngrams: np.ndarray) -> np.ndarray:
        """Row of each n-gram (word ids, `(count, n)`) in the table of its order; -1 if absent."""
        rows = np.full(ngrams.shape[0], -1, dtype=np.int64)
        found = np.ones(ngrams.shape[0], dtype=bool)
        for j in range(ngrams.shape[1]):
            key = ngrams[:, j] if j == 0 else rows * self.base + ngrams[:, j]
            keys = self.keys[j]
            at = np.minimum(np.searchsorted(keys, key), len(keys) - 1)
            found &= keys[at] == key
            rows = np.where(found, at, -1)
            rows = np.maximum(rows, 0)  # keep the arithmetic defined; `found` remembers misses
        return np.where(found, rows, -1)

    def _row(self, words: Sequence[int]) -> int:
        """Row of one n-gram (word ids) in the table of its order, or -1."""
        row = 0
        for j, word in enumerate(words):
            key = word if j == 0 else row * self.base + word
            keys = self.keys[j]
            at = int(np.searchsorted(keys, key))
            if at >= len(keys) or keys[at] != key:
                return -1
            row = at
        return row

    def has(self, n: int, row: int, word: int) -> bool:
        """Whether the state at ``row`` of order ``n - 1`` (``row`` 0 and n = 1: the root) has
        an arc for ``word``."""
        keys = self.keys[n - 1]
        key = word if n == 1 else row * self.base + word
        at = int(np.searchsorted(keys, key))
        return at < len(keys) and int(keys[at]) == key

    def arc_log10p(self, n: int, row: int, word: int) -> Optional[float]:
        """log10 P(state word) for the arc of ``word`` at a state of order ``n - 1``, or None."""
        keys = self.keys[n - 1]
        key = word if n == 1 else row * self.base + word
        at = int(np.searchsorted(keys, key))
        if at < len(keys) and int(keys[at]) == key:
            return float(self.log10p[n - 1][at])
        return None

    def span(self, n: int, row: int) -> tuple[int, int]:
        """The arcs (rows of order n) of the state at ``row`` of order ``n - 1``."""
        if n == 1:
            return 0, len(self.keys[0])
        keys = self.keys[n - 1]
        return int(np.searchsorted(keys, row * self.base)), int(np.searchsorted(keys, (row + 1) * self.base))

    # -- states ----------------------------------------------------------------------------------

    def words(self, tokens: Sequence[int]) -> list[int]:
        """Word ids of token ids (ids the model lacks are ``<unk>``, word 0)."""
        top = len(self.word_of)
        return [int(self.word_of[t]) if 0 <= t < top else 0 for t in tokens]

    def state(self, context: Sequence[int]) -> "ReferenceKatzState":
        """The state after ``context`` (token ids; only the last ``order - 1`` matter)."""
        keep = self.order - 1
        key = tuple(context[len(context) - min(len(context), keep):]) if keep else ()
        state = self._states.get(key)
        if state is None:
            if len(self._states) >= 200_000:
                self._states.clear()
            state = self._states[key] = ReferenceKatzState(self, self.words(key))
        return state


class ReferenceKatzState:
    """The model after one context: exact log-probabilities and the ranked next tokens.

    Attributes:
        levels: ``(n, row, offset)`` from the longest known suffix of the context down to the
            root: arcs of order n leave the state at ``row`` (of order n - 1), and a word found
            there scores ``offset + log10 P`` (``offset``: the back-off weights above, in log10).
    """

    __slots__ = ("index", "levels", "_ranked", "_merge")

    def __init__(self, index: ReferenceKatzSuccessors, context_words: Sequence[int]) -> None:
        self.index = index
        suffixes = []  # rows of the known suffixes of the context, longest first
        for m in range(len(context_words), 0, -1):
            row = index._row(context_words[len(context_words) - m:])
            if row >= 0:
                suffixes.append((m + 1, row))
        suffixes.append((1, 0))
        levels = []
        offset = 0.0
        for n, row in suffixes:
            levels.append((n, row, offset))
            if n > 1:
                offset += float(index.backoff[n - 2][row])  # this state's back-off weight
        self.levels = levels
        self._ranked: list[tuple[int, float]] = []
        self._merge: Optional[Iterator[tuple[int, float]]] = None

    def log10p(self, word: int) -> float:
        """log10 p(word | context), as the core computes it."""
        index = self.index
        for n, row, offset in self.levels:
            p = index.arc_log10p(n, row, word)
            if p is not None:
                return offset + p
        raise AssertionError("every word has a unigram")  # pragma: no cover

    def logprob(self, token: int) -> float:
        """Natural-log p(token | context); ids the model lacks score as ``<unk>``."""
        return self.log10p(self.index.words((token,))[0]) * LN10

    def ranked(self, r: int) -> Optional[tuple[int, float]]:
        """The r-th most probable proposable token (0-based) and its natural-log probability,
        ties by token id; None past the last."""
        while len(self._ranked) <= r:
            if self._merge is None:
                self._merge = self._ranked_tokens()
            nxt = next(self._merge, None)
            if nxt is None:
                return None
            self._ranked.append(nxt)
        return self._ranked[r]

    def _ranked_tokens(self) -> Iterator[tuple[int, float]]:
        index = self.index
        token_of = index.token_of
        heap: list[tuple[float, int, int, int, int]] = []  # (-log10 p, token, level, position, end)
        for level, (n, row, offset) in enumerate(self.levels):
            lo, hi = index.span(n, row)
            self._push(heap, level, lo, hi)
        while heap:
            neg, token, level, pos, end = heapq.heappop(heap)
            self._push(heap, level, pos + 1, end)
            word = int(index.ranked_words[self.levels[level][0] - 1][pos])
            if any(index.has(n, row, word) for n, row, _ in self.levels[:level]):
                continue  # listed by a longer context: scored there
            yield int(token_of[word]), -neg * LN10

    def _push(self, heap: list[tuple[float, int, int, int, int]], level: int, pos: int, end: int) -> None:
        """The level's next proposable arc at or after ``pos`` onto the merge heap."""
        index = self.index
        n, _, offset = self.levels[level]
        words, log10p = index.ranked_words[n - 1], index.ranked_log10p[n - 1]
        while pos < end:
            token = int(index.token_of[words[pos]])
            if token >= 0:
                heapq.heappush(heap, (-(offset + float(log10p[pos])), token, level, pos, end))
                return
            pos += 1


MAX_ORDER = 8
PRIOR_WEIGHTS = (0.2, 0.35, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85)
PRIOR_POSITIONS = 8.0


class ReferenceCacheModel:
    """The decoded text's n-gram cache interpolated with a static model (see the module docstring).

    Args:
        static: the static Katz model over token ids, or None (uniform over ``vocab_size``).
        vocab_size: the target's vocabulary size.
        max_order: the longest context the cache matches.
        prior: lam(n) before any evidence, for n = 1, 2, ... (the last serves longer matches).
        prior_positions: how many positions the prior weighs.

    Attributes:
        ids: the text the cache holds (prompt and decoded tokens).
    """

    def __init__(self, static: Optional[NGramLM], vocab_size: int, max_order: int = MAX_ORDER,
                 prior: Sequence[float] = PRIOR_WEIGHTS, prior_positions: float = PRIOR_POSITIONS) -> None:
        if max_order < 1:
            raise DecoderConfigError(f"max_order must be >= 1, got {max_order}")
        prior = [float(x) for x in prior]
        if not prior or not all(0.0 <= x < 1.0 for x in prior):
            raise DecoderConfigError(f"prior weights must lie in [0, 1), got {prior}")
        if vocab_size < 1:
            raise DecoderConfigError(f"vocab_size must be >= 1, got {vocab_size}")
        if not (math.isfinite(prior_positions) and prior_positions > 0):
            raise DecoderConfigError(f"prior_positions must be finite and > 0, got {prior_positions!r}")
        self.static = static
        self.successors = ReferenceKatzSuccessors(static) if static is not None else None
        self.vocab_size = int(vocab_size)
        self.max_order = int(max_order)
        self.context_size = max(self.max_order, static.order - 1 if static is not None else 0)
        self.prior = np.array([prior[min(n, len(prior)) - 1] for n in range(1, self.max_order + 1)])
        self.prior_positions = float(prior_positions)
        self._reset()

    def _reset(self) -> None:
        """An empty cache and the weights back at the prior."""
        self.responsibility = np.zeros(self.max_order)  # sum of posteriors per match length
        self.positions = np.zeros(self.max_order)  # positions seen per match length
        self.ids: list[int] = []
        self._followers: dict[tuple[int, ...], dict[int, int]] = {}
        self._totals: dict[tuple[int, ...], int] = {}

    # -- the cache -------------------------------------------------------------------------------

    def weight(self, n: int) -> float:
        """lam(n): the cache's share for a match of ``n`` tokens (0 for no match)."""
        if n <= 0:
            return 0.0
        i = min(n, self.max_order) - 1
        return float((self.prior_positions * self.prior[i] + self.responsibility[i])
                     / (self.prior_positions + self.positions[i]))

    def match(self, tail: Sequence[int], longest: Optional[int] = None) -> int:
        """The length n of the longest context ending ``tail`` that the cache has seen followed
        by a token (0: none). ``longest`` bounds it (a child's match is at most its parent's + 1)."""
        n = min(self.max_order, len(tail), self.max_order if longest is None else longest)
        followers = self._followers
        size = len(tail)
        while n > 0:
            if tuple(tail[size - n:]) in followers:
                return n
            n -= 1
        return 0

    def followers(self, tail: Sequence[int], n: int) -> tuple[dict[int, int], int]:
        """The tokens that followed the last ``n`` tokens of ``tail``, with counts, and their sum."""
        key = tuple(tail[len(tail) - n:])
        return self._followers[key], self._totals[key]

    def sync(self, ids: Sequence[int]) -> None:
        """Brings the cache up to ``ids`` (the same text, longer): fits the weights on every new
        position (posterior of the cache at its match length), then counts the new n-grams.
        A text that is not an extension of the cached one starts the cache afresh."""
        have = len(self.ids)
        tail = min(have, 16)  # the cached text's last tokens must be where they were
        if len(ids) < have or (tail and [int(t) for t in ids[have - tail:have]] != self.ids[-tail:]):
            self._reset()
            have = 0
        if len(ids) == have:
            return
        new = [int(t) for t in ids[have:]]
        static = None
        if self.static is not None:
            static = np.exp(self.static.token_logprobs(new, context=self.ids[-self.context_size:] if have else ()))
        text = self.ids
        for i, token in enumerate(new):
            if text:
                n = self.match(text[-self.max_order:])
                if n:
                    counts, total = self.followers(text, n)
                    lam = self.weight(n)
                    p_cache = lam * counts.get(token, 0) / total
                    p_static = (1.0 - lam) * (static[i] if static is not None else 1.0 / self.vocab_size)
                    if p_cache + p_static > 0:
                        self.responsibility[n - 1] += p_cache / (p_cache + p_static)
                        self.positions[n - 1] += 1
            text.append(token)
            self._count(text)

    def _count(self, text: list[int]) -> None:
        """Counts the last token of ``text`` after each of its 1..max_order preceding contexts."""
        token, end = text[-1], len(text) - 1
        for n in range(1, min(self.max_order, end) + 1):
            key = tuple(text[end - n:end])
            counts = self._followers.get(key)
            if counts is None:
                counts = self._followers[key] = {}
                self._totals[key] = 0
            counts[token] = counts.get(token, 0) + 1
            self._totals[key] += 1

    # -- the interpolated model ------------------------------------------------------------------

    def static_state(self, tail: Sequence[int]) -> Optional[ReferenceKatzState]:
        return self.successors.state(tail) if self.successors is not None else None

    def children(self, tail: Sequence[int], longest: Optional[int] = None) -> "ReferenceChildren":
        """The next tokens after ``tail`` (the text's last tokens and a path after it), most
        probable first, lazily (see :class:`ReferenceChildren`)."""
        n = self.match(tail, longest)
        return ReferenceChildren(self, tail, n)

    def conditional(self, tail: Sequence[int], token: int, longest: Optional[int] = None) -> tuple[float, float, int]:
        """``(log P(token | tail), log P_static(token | tail) (NaN without a static model), match
        length)``, natural logs."""
        n = self.match(tail, longest)
        state = self.static_state(tail)
        static = state.logprob(token) if state is not None else -math.log(self.vocab_size)
        reported = static if state is not None else math.nan
        if n == 0:
            return min(static, 0.0), reported, 0
        counts, total = self.followers(tail, n)
        lam = self.weight(n)
        return _mix(lam, counts.get(token, 0) / total, static), reported, n


def _mix(lam: float, p_cache: float, static_logprob: float) -> float:
    """log(lam p_cache + (1 - lam) exp(static_logprob)), the static probability taken as at most
    1 (a model that is not normalised can say more; the search needs conditionals <= 1)."""
    static_logprob = min(static_logprob, 0.0)
    if p_cache == 0.0:
        return math.log1p(-lam) + static_logprob
    return math.log(lam * p_cache + (1.0 - lam) * math.exp(static_logprob))


class ReferenceChildren:
    """The next tokens after one context under :class:`ReferenceCacheModel`, most probable first.

    A merge of two sorted streams: the cache's followers of the longest match (each scored
    exactly, ``lam p_cache + (1 - lam) p_static``), and every other token the static model
    proposes in its own order (:meth:`ReferenceKatzState.ranked`), scored ``(1 - lam) p_static`` —
    decreasing, so the merge is exact over the whole vocabulary (the static model's words below
    the target's vocabulary size, and the cache's tokens). Ties by token id.

    Attributes:
        match: the match length n at this context (0: no match).
    """

    __slots__ = ("model", "tail", "match", "_cache", "_cached", "_state", "_weight", "_next_static",
                 "_next_cache", "_ranked", "_log_rest")

    def __init__(self, model: ReferenceCacheModel, tail: Sequence[int], match: int) -> None:
        self.model, self.tail, self.match = model, tail, match
        state = self._state = model.static_state(tail)
        cached: list[tuple[float, int, float]] = []
        lam = model.weight(match)
        if match:
            counts, total = model.followers(tail, match)
            uniform = -math.log(model.vocab_size)
            for token, count in counts.items():
                static = state.logprob(token) if state is not None else uniform
                cached.append((-_mix(lam, count / total, static), token, static if state is not None else math.nan))
            cached.sort()
        self._cache = cached
        self._cached = {token for _, token, _ in cached}
        self._log_rest = math.log1p(-lam)
        self._next_cache = 0
        self._next_static = 0
        self._ranked: list[tuple[int, float, float]] = []

    def ranked(self, r: int) -> Optional[tuple[int, float, float]]:
        """The r-th most probable next token (0-based): ``(token, log P, log P_static)`` (NaN
        without a static model), or None past the last proposable one."""
        ranked = self._ranked
        while len(ranked) <= r:
            nxt = self._advance()
            if nxt is None:
                return None
            ranked.append(nxt)
        return ranked[r]

    def _peek_static(self) -> Optional[tuple[int, float]]:
        state = self._state
        if state is None:
            return None
        vocab_size = self.model.vocab_size
        while True:
            nxt = state.ranked(self._next_static)
            if nxt is None or (nxt[0] not in self._cached and nxt[0] < vocab_size):
                return nxt
            self._next_static += 1

    def _advance(self) -> Optional[tuple[int, float, float]]:
        static = self._peek_static()
        cache = self._cache[self._next_cache] if self._next_cache < len(self._cache) else None
        if static is not None:
            score = self._log_rest + min(static[1], 0.0)
            if cache is None or (-score, static[0]) < (cache[0], cache[1]):
                self._next_static += 1
                return static[0], score, static[1]
        if cache is None:
            return None
        self._next_cache += 1
        return cache[1], -cache[0], cache[2]


def reference_best_continuations(model: ReferenceCacheModel, ids: Sequence[int], p: int, max_depth: int) -> Continuations:
    """The ``p`` most probable continuations of ``ids`` of 1..``max_depth`` tokens (see the
    module docstring), fewer when the model proposes fewer.

    Args:
        model: the cache model, synced to ``ids`` (:meth:`ReferenceCacheModel.sync`) or not: the search
            reads its counts as they are.
        ids: the text (prompt and decoded tokens); only its last ``model.context_size`` matter.
        p: nodes wanted (>= 1).
        max_depth: the longest continuation (>= 1).
    """
    tail = tuple(int(t) for t in ids[len(ids) - min(len(ids), model.context_size):])
    keep = model.context_size
    tokens: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    logprob: list[float] = []
    static: list[float] = []
    score: list[float] = []
    paths: list[tuple[int, ...]] = []
    tails: list[tuple[int, ...]] = []
    bounds: list[int] = []  # a bound on each node's match length: its parent's plus one
    expanded: list[Optional[ReferenceChildren]] = []
    root = model.children(tail)
    # Entries: (-score, path, parent node (-1: root), rank among the parent's children); a rank
    # of -1 is the bound of a node's children (its own score), expanded when popped.
    heap: list[tuple[float, tuple[int, ...], int, int]] = []

    def push_child(parent: int, rank: int) -> None:
        children = root if parent < 0 else expanded[parent]
        assert children is not None
        child = children.ranked(rank)
        if child is not None:
            base = score[parent] if parent >= 0 else 0.0
            prefix = paths[parent] if parent >= 0 else ()
            heapq.heappush(heap, (-(base + child[1]), prefix + (child[0],), parent, rank))

    push_child(-1, 0)
    while heap and len(tokens) < p:
        neg, path, parent, rank = heapq.heappop(heap)
        if rank < 0:  # the bound of a node's children: read its distribution now
            node = parent
            expanded[node] = model.children(tails[node], bounds[node])
            push_child(node, 0)
            continue
        children = root if parent < 0 else expanded[parent]
        assert children is not None
        token, lp, lp_static = children.ranked(rank)  # type: ignore[misc]
        node = len(tokens)
        tokens.append(token)
        parents.append(parent)
        depths.append(len(path))
        logprob.append(lp)
        static.append(lp_static)
        score.append(-neg)
        paths.append(path)
        tails.append((tails[parent] if parent >= 0 else tail)[-keep + 1:] + (token,) if keep > 1
                     else (token,))
        bounds.append(children.match + 1)
        expanded.append(None)
        push_child(parent, rank + 1)
        if len(path) < max_depth:
            heapq.heappush(heap, (neg, path, node, -1))
    return Continuations(np.asarray(tokens, dtype=np.int64), np.asarray(parents, dtype=np.int64),
                         np.asarray(depths, dtype=np.int64), np.asarray(logprob, dtype=np.float64),
                         np.asarray(static, dtype=np.float64), np.asarray(score, dtype=np.float64))


class ReferencePendingLabels:
    """Candidate trees waiting for the decoded text to reach their nodes.

    A node at depth j below a root at position r is labelled once the text holds position
    r + j and its ancestors match the text: 1 if its token is the token there, 0 if not.
    Nodes below a mismatch carry no information about their own conditional and are dropped.
    """

    def __init__(self) -> None:
        self._pending: list[tuple[int, CandidateTree, np.ndarray, np.ndarray]] = []

    def add(self, root_index: int, tree: CandidateTree, features: np.ndarray) -> None:
        if tree.size:
            self._pending.append((root_index, tree, features, np.zeros(tree.size, dtype=bool)))

    def resolve(self, ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Labels every node the text ``ids`` (prompt included) now decides; returns their
        features and labels, and forgets trees with nothing left to learn."""
        feats, labels, keep = [], [], []
        for root_index, tree, features, done in self._pending:
            known = len(ids) - 1 - root_index  # text positions after the root
            possible = np.zeros(tree.size, dtype=bool)  # ancestors on the text, or not known yet
            matched = np.zeros(tree.size, dtype=bool)
            for i in range(tree.size):
                parent, depth = tree.parents[i], tree.depths[i]
                possible[i] = parent < 0 or (possible[parent] and (tree.depths[parent] > known or matched[parent]))
                if not possible[i] or depth > known:
                    continue
                matched[i] = tree.tokens[i] == ids[root_index + depth]
                reachable = parent < 0 or matched[parent]
                if reachable and not done[i]:
                    done[i] = True
                    feats.append(features[i])
                    labels.append(float(matched[i]))
            if (possible & ~done).any():
                keep.append((root_index, tree, features, done))
        self._pending = keep
        if not labels:
            return np.zeros((0, 0)), np.zeros(0)
        return np.asarray(feats), np.asarray(labels)


def reference_node_features(tree: CandidateTree, max_depth: int) -> np.ndarray:
    """``node_features``: a one-hot depth, the head, n-gram and cache logits (0 where NaN), scaled."""
    n = tree.size
    x = np.zeros((n, max_depth + len(FEATURES)))
    x[np.arange(n), np.minimum(tree.depths, max_depth) - 1] = 1.0
    assert tree.cache_logprob is not None
    for j, values in enumerate((tree.head_logprob, tree.ngram_logprob, tree.cache_logprob)):
        x[:, max_depth + j] = np.where(np.isnan(values), 0.0, logit(np.nan_to_num(values, nan=-1.0))) / 4.0
    return x


def reference_path_probability(tree: CandidateTree, conditional: np.ndarray) -> np.ndarray:
    """``CandidateTree.path_probability``: the product of the conditionals from the root down."""
    out = np.empty(tree.size)
    for i in range(tree.size):
        parent = tree.parents[i]
        out[i] = conditional[i] * (out[parent] if parent >= 0 else 1.0)
    return out


def reference_update(acceptance: AcceptanceModel, features: np.ndarray, labels: np.ndarray) -> None:
    """``AcceptanceModel.update``: one SGD step of the logistic loss per labelled node (in order)."""
    rate = acceptance.learning_rate
    if rate == 0 or len(labels) == 0:
        return
    for x, y in zip(features, labels):
        p = 1.0 / (1.0 + np.exp(-float(x @ acceptance.weights)))
        acceptance.weights += rate * (float(y) - p) * x
    acceptance.updates += len(labels)


class ReferenceChainDrafter:
    """One request's drafting state: its n-gram cache model and the candidates waiting for
    their labels.

    Args:
        lm: the static Katz model over token ids, or None (the request's own text alone).
        vocab_size: the target's vocabulary (the cache model's fallback without ``lm``).
        acceptance: the acceptance model it reads and teaches (shared by an engine's requests).
        candidates: nodes of the candidate tree searched per step.
        max_depth: the longest chain.
        start: the text starts here in the ids handed over (a long prompt's head is left out:
            the cache model reads ``ids[start:]``).
    """

    def __init__(self, lm: Optional[NGramLM], vocab_size: int, acceptance: AcceptanceModel,
                 candidates: int = 32, max_depth: int = 12, start: int = 0) -> None:
        if candidates < 1 or max_depth < 1 or start < 0:
            raise DecoderConfigError(f"candidates, max_depth must be >= 1 and start >= 0, got "
                                     f"{candidates}, {max_depth}, {start}")
        self.model = ReferenceCacheModel(lm, vocab_size)
        self.acceptance = acceptance
        self.candidates, self.max_depth, self.start = candidates, max_depth, start
        self.pending = ReferencePendingLabels()

    @property
    def length(self) -> int:
        """Tokens of the request's text the cache model holds (from ``start``)."""
        return len(self.model.ids)

    def observe(self, ids: Sequence[int]) -> None:
        """Brings the cache model up to ``ids`` and labels every candidate the text now decides."""
        text = ids[self.start:]
        self.model.sync(text)
        features, labels = self.pending.resolve(self.model.ids)
        reference_update(self.acceptance, features, labels)

    def propose(self, max_length: int) -> tuple[np.ndarray, np.ndarray]:
        """The chain after the text :meth:`observe` last saw (at most ``max_length`` tokens) and
        each position's probability of being accepted (non-increasing)."""
        text = self.model.ids
        if max_length < 1 or not text:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        found = reference_best_continuations(self.model, text, self.candidates, min(self.max_depth, max_length))
        if not found.size:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        tree = found.tree()
        features = reference_node_features(tree, self.acceptance.max_depth)
        conditional = 1.0 / (1.0 + np.exp(-(features @ self.acceptance.weights)))
        probability = reference_path_probability(tree, conditional)
        self.pending.add(len(text) - 1, tree, features)
        chain: list[int] = []
        node = -1
        while True:
            children = np.flatnonzero(tree.parents == node)
            if not len(children):
                break
            node = int(children[np.argmax(probability[children])])
            chain.append(node)
        return tree.tokens[chain].astype(np.int64), probability[chain]


def reference_united_candidates(model: Any, ids: Sequence[int], found: Continuations, lattice: SausageLattice,
                                search_lm: NGramLM, p: int, alpha: float, lm: Optional[NGramLM],
                                found_sources: Optional[Sequence[int]] = None) -> CandidateTree:
    """``latticekit/drafting/union.py``'s ``united_candidates`` before its trie went to the C++ core
    (at 2dd0ef0): the paths merged by ``CandidateTree.from_paths``, the head scores read by
    ``SausageLattice.arc_scores``."""
    context = ids[max(0, len(ids) - search_lm.order): -1]
    paths = pbest(lattice, search_lm, p, alpha, context=context)
    drafts = [tuple(int(t) for t in path.tokens[1:]) for path in paths]
    found_paths = found.paths()
    everything = drafts + found_paths
    if found_sources is None:
        found_sources = [SOURCES["text"]] * len(found_paths)
    tree = CandidateTree.from_paths(everything, [[np.nan] * len(d) for d in everything],
                                    path_sources=[SOURCES["heads"]] * len(drafts) + list(found_sources))
    assert tree.cache_logprob is not None
    tree.head_logprob[:] = lattice.arc_scores(tree.depths, tree.tokens)
    tree.cache_logprob[:], tree.ngram_logprob[:] = model.trie_conditionals(ids, tree.parents, tree.tokens)
    if lm is None:
        tree.ngram_logprob[:] = np.nan
    missing = np.isnan(tree.head_logprob)
    tree.head_logprob[missing] = tree.cache_logprob[missing]
    return tree
