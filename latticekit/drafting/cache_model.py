"""The heads-free drafting model: the decoded text's own n-gram cache interpolated with a static Katz model.

Prompt lookup decoding (transformers' ``prompt_lookup_num_tokens``, vLLM's ``ngram``) copies
what followed the longest earlier match of the text's last tokens. :class:`CacheModel` makes
that a probability distribution the p-best search can rank continuations under:

    P(w | text) = lam(n) * P_cache(w | last n tokens) + (1 - lam(n)) * P_static(w | text)

* **The cache** counts, for every context of 1..``max_order`` tokens of the prompt and the
  tokens decoded so far, the tokens that followed it; it is updated as the text grows.
  ``P_cache`` is the distribution after the **longest** context that occurred before (n, the
  match length): within the cache the longest match decides, as in prompt lookup, because a
  long match is a copy in progress and the continuations of shorter matches only blur it.
* **The static model** is a Katz back-off n-gram model (``NGramLM``, exact back-off), or, without
  one, the uniform distribution over the vocabulary (the cache alone proposes tokens). A
  probability above 1 (a model that is not normalised) is taken as 1.
* **Interpolation, not back-off, between the two**, with a weight per match length. A back-off
  from the cache to the static model would need a discount for contexts seen once or twice,
  which nothing can estimate; the weight of a match length is estimated from hundreds of
  positions. A token that both models favour is likelier than one only the cache saw, which a
  back-off (the static model reached only through the escape) cannot say. And the weight grows
  with the match length, so a long match's continuation wins over whatever the static model
  prefers (``lam`` near 1), while a one-token match only nudges it.
* **The weights** ``lam(n)`` start from a prior (:data:`PRIOR_WEIGHTS`) and are fitted online
  by expectation-maximisation on the text itself: at every position of the prompt and of the
  decoded text with a match of length n, the posterior that the cache produced the token
  there (``lam P_cache / P``) is averaged into ``lam(n)``. A prompt that repeats itself, or
  an answer that copies it, raises the weights of the match lengths involved within a few
  tokens; text the cache does not predict lowers them.

Plain Python and numpy; nothing here imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Optional

import numpy as np

from latticekit.drafting.successors import KatzState, KatzSuccessors
from latticekit.errors import DecoderConfigError
from latticekit.ngram import NGramLM

__all__ = ["CacheModel", "Children", "PRIOR_WEIGHTS", "MAX_ORDER"]

#: The longest context the cache matches (tokens).
MAX_ORDER = 8
#: lam(n) for match lengths n = 1, 2, ... before the text says otherwise (longer: the last).
PRIOR_WEIGHTS = (0.2, 0.35, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85)
#: Positions the prior counts as: how fast the fitted weights leave it.
PRIOR_POSITIONS = 8.0
#: How many of the cached text's last tokens :meth:`CacheModel.sync` checks before extending it.
_SYNC_CHECK = 16


class CacheModel:
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
        self.successors = KatzSuccessors.of(static) if static is not None else None
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
        tail = min(have, _SYNC_CHECK)  # the cached text's last tokens must be where they were
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

    def static_state(self, tail: Sequence[int]) -> Optional[KatzState]:
        return self.successors.state(tail) if self.successors is not None else None

    def children(self, tail: Sequence[int], longest: Optional[int] = None) -> "Children":
        """The next tokens after ``tail`` (the text's last tokens and a path after it), most
        probable first, lazily (see :class:`Children`)."""
        n = self.match(tail, longest)
        return Children(self, tail, n)

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


class Children:
    """The next tokens after one context under :class:`CacheModel`, most probable first.

    A merge of two sorted streams: the cache's followers of the longest match (each scored
    exactly, ``lam p_cache + (1 - lam) p_static``), and every other token the static model
    proposes in its own order (:meth:`KatzState.ranked`), scored ``(1 - lam) p_static`` —
    decreasing, so the merge is exact over the whole vocabulary (the static model's words below
    the target's vocabulary size, and the cache's tokens). Ties by token id.

    Attributes:
        match: the match length n at this context (0: no match).
    """

    __slots__ = ("model", "tail", "match", "_cache", "_cached", "_state", "_weight", "_next_static",
                 "_next_cache", "_ranked", "_log_rest")

    def __init__(self, model: CacheModel, tail: Sequence[int], match: int) -> None:
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
