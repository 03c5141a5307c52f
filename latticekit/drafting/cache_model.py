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

The cache lives in the C++ core (``csrc/latticekit/ngram_cache.h``): a token is counted, and the
weights' statistics updated, in O(``max_order``) whatever the text's length; the text is never
re-read. Nothing here imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np

from latticekit import _core
from latticekit._arrays import int32_ids
from latticekit.drafting.successors import KatzState, KatzSuccessors
from latticekit.errors import DecoderConfigError
from latticekit.ngram import NGramLM

__all__ = ["CacheModel", "PRIOR_WEIGHTS", "MAX_ORDER"]

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
        cache: the core's n-gram cache of ``ids`` (the search reads it).
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
        self.cache = _core.CoreNGramCache(self.max_order, self.prior, self.prior_positions)
        self.ids: list[int] = []

    def _reset(self) -> None:
        """An empty cache and the weights back at the prior."""
        self.cache.clear()
        self.ids = []

    @property
    def responsibility(self) -> np.ndarray:
        """Sum of the cache's posteriors per match length (a copy)."""
        return self.cache.responsibility

    @responsibility.setter
    def responsibility(self, values: Any) -> None:
        self.cache.responsibility = np.ascontiguousarray(values, dtype=np.float64)

    @property
    def positions(self) -> np.ndarray:
        """Positions seen per match length (a copy)."""
        return self.cache.positions

    @positions.setter
    def positions(self, values: Any) -> None:
        self.cache.positions = np.ascontiguousarray(values, dtype=np.float64)

    # -- the cache -------------------------------------------------------------------------------

    def weight(self, n: int) -> float:
        """lam(n): the cache's share for a match of ``n`` tokens (0 for no match)."""
        return float(self.cache.weight(n)) if n > 0 else 0.0

    def match(self, tail: Sequence[int], longest: Optional[int] = None) -> int:
        """The length n of the longest context ending ``tail`` that the cache has seen followed
        by a token (0: none). ``longest`` bounds it (a child's match is at most its parent's + 1)."""
        return int(self.cache.match(self._tail(tail), self.max_order if longest is None else longest))

    def followers(self, tail: Sequence[int], n: int) -> tuple[dict[int, int], int]:
        """The tokens that followed the last ``n`` tokens of ``tail``, with counts, and their sum
        (``n`` at most :meth:`match`'s)."""
        counts, total = self.cache.followers(self._tail(tail), n)
        return counts, int(total)

    def _tail(self, tail: Sequence[int]) -> np.ndarray:
        keep = min(len(tail), self.max_order)
        return _token_array(tail[len(tail) - keep:] if keep else [])

    def sync(self, ids: Sequence[int], start: int = 0) -> None:
        """Brings the cache up to ``ids[start:]`` (the same text, longer): fits the weights on
        every new position (posterior of the cache at its match length), then counts the new
        n-grams. A text that is not an extension of the cached one starts the cache afresh.
        Reads only the new tokens and the cached text's last 16 (never slices ``ids`` whole).

        Raises:
            DecoderConfigError: a token id outside int32.
        """
        have = len(self.ids)
        size = max(0, len(ids) - start)
        tail = min(have, _SYNC_CHECK)  # the cached text's last tokens must be where they were
        if size < have or (tail and _ints(ids[start + have - tail:start + have]) != self.ids[-tail:]):
            self._reset()
            have = 0
        if size == have:
            return
        new = _token_array(ids[start + have:])
        if self.static is not None:
            context = self.ids[-self.context_size:] if have else ()
            static = np.exp(self.static.token_logprobs(new, context=context))
        else:
            static = np.full(len(new), 1.0 / self.vocab_size)
        self.cache.extend(new, static)
        self.ids.extend(new.tolist())

    # -- the interpolated model ------------------------------------------------------------------

    def static_state(self, tail: Sequence[int]) -> Optional[KatzState]:
        return self.successors.state(tail) if self.successors is not None else None

    def conditional(self, tail: Sequence[int], token: int, longest: Optional[int] = None) -> tuple[float, float, int]:
        """``(log P(token | tail), log P_static(token | tail) (NaN without a static model), match
        length)``, natural logs."""
        n = self.match(tail, longest)
        state = self.static_state(tail)
        static = state.logprob(token) if state is not None else -math.log(self.vocab_size)
        reported = static if state is not None else math.nan
        if n == 0:
            return min(static, 0.0), reported, 0
        count, total = self.cache.count(self._tail(tail), n, int(token))
        lam = self.weight(n)
        return _mix(lam, count / total, static), reported, n

    def trie_conditionals(self, tail: Sequence[int], parents: Any, tokens: Any) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`conditional` at every node of a token trie after ``tail``, in one call of the
        core: ``(log P, log P_static)`` per node (natural logs; NaN for the static model without
        one), node ``i`` conditioned on ``tail`` and the path to its parent.

        Args:
            tail: the text (only its last ``context_size`` tokens matter).
            parents (`np.ndarray` of shape `(n,)`): each node's parent, an earlier node or -1.
            tokens (`np.ndarray` of shape `(n,)`): each node's token.

        Raises:
            DecoderConfigError: a token id outside int32, or a parent not an earlier node.
        """
        keep = min(len(tail), self.context_size)
        successors = self.successors.core if self.successors is not None else None
        try:
            return self.cache.trie_conditionals(_token_array(tail[len(tail) - keep:] if keep else []), successors,
                                                self.vocab_size, _token_array(parents), _token_array(tokens))
        except ValueError as exc:
            raise DecoderConfigError(str(exc)) from exc


def _ints(tokens: Any) -> list[int]:
    """Token ids as a list of ints, as ``int()`` reads each (an integer array's in one call)."""
    if isinstance(tokens, np.ndarray) and tokens.dtype.kind in "iu":
        out: list[int] = tokens.tolist()
        return out
    return [int(t) for t in tokens]


def _token_array(tokens: Any) -> np.ndarray:
    """Token ids as a contiguous int32 array (what the core's cache holds).

    Raises:
        DecoderConfigError: an id outside int32.
    """
    if isinstance(tokens, np.ndarray) and tokens.dtype == np.int32:
        return np.ascontiguousarray(tokens)
    if isinstance(tokens, np.ndarray) and tokens.dtype.kind in "iu":
        array = tokens.astype(np.int64) if tokens.dtype != np.uint64 else tokens
    else:  # a list, or floats that hold ids: as int() reads them (a NaN is a ValueError)
        array = np.asarray([int(t) for t in tokens], dtype=np.int64)
    return int32_ids(array.reshape(-1), "the token ids", negative=True, error=DecoderConfigError)


def _mix(lam: float, p_cache: float, static_logprob: float) -> float:
    """log(lam p_cache + (1 - lam) exp(static_logprob)), the static probability taken as at most
    1 (a model that is not normalised can say more; the search needs conditionals <= 1)."""
    static_logprob = min(static_logprob, 0.0)
    if p_cache == 0.0:
        return math.log1p(-lam) + static_logprob
    return math.log(lam * p_cache + (1.0 - lam) * math.exp(static_logprob))
