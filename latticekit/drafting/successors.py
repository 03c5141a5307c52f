"""A Katz back-off model's next tokens after a context, most probable first, over its whole vocabulary.

A best-first search over continuations (:mod:`latticekit.drafting.continuations`) asks, at every
node, for the r-th most probable next token. :class:`KatzSuccessors` answers exactly, with the
model's own back-off semantics (:class:`~latticekit.NGramLM`, KenLM's): after a context whose
longest known suffix is the state s_0, with back-off states s_1, ..., s_L (the root),

    log10 p(w | context) = bo(s_0) + ... + bo(s_{j-1}) + log10 P(s_j w),   j the first level with s_j w,

so the tokens in decreasing probability are a merge of the levels' explicit successors (each
level sorted once, offset by the back-off weights above it), where a token is taken at the
first level that lists it and skipped at every lower one. The sums are the core's, in the same
order and precision, so ``logprob`` equals :meth:`NGramLM.token_logprobs` bit for bit
(``tests/decoding/test_headsfree.py``).

Only words that are token ids are proposed: ``<unk>`` (which stands for every id the model
lacks), ``<s>`` and ``</s>`` never are, though they are scored as the model scores them.

The index lives in the C++ core (``csrc/latticekit/successors.h``): every state's arcs ranked
once, built on first use per model (about 20 ms for the shipped 400k-n-gram model) and shared;
a state's ranked tokens are merged as far as asked.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Optional

import numpy as np

from latticekit import _core
from latticekit._arrays import _INT32_MAX
from latticekit.errors import DecoderConfigError
from latticekit.ngram import NGramLM

__all__ = ["KatzSuccessors", "KatzState"]


class KatzSuccessors:
    """The next-token index of one :class:`NGramLM` over token ids (words spelled as decimal ids).

    Use :meth:`of` to share one index per model.

    Attributes:
        token_of (`(words,)` int64): the token id each word spells, -1 for the others.
        core: the C++ index (the search reads it directly).

    Raises:
        DecoderConfigError: the model's words are not token ids (a model read with ``vocab``).
    """

    def __init__(self, lm: NGramLM) -> None:
        token_of = lm.word_token_ids()
        if not (token_of >= 0).any():
            raise DecoderConfigError("the static n-gram model's words must be token ids (decimal)")
        self.lm = lm
        self.order = lm.order
        self.token_of = np.ascontiguousarray(token_of, dtype=np.int64)
        self.core = _core.CoreKatzSuccessors(lm._core, self.token_of)

    @classmethod
    def of(cls, lm: NGramLM) -> "KatzSuccessors":
        """The index of ``lm``, built on first use and kept while the model lives."""
        index = _INDEXES.get(lm)
        if index is None:
            index = _INDEXES[lm] = cls(lm)
        return index

    def state(self, context: Sequence[int]) -> "KatzState":
        """The state after ``context`` (token ids; only the last ``order - 1`` matter)."""
        keep = min(len(context), self.order - 1)
        tail = np.asarray([int(t) for t in context[len(context) - keep:]] if keep else [], dtype=np.int64)
        return KatzState(self.core.state(_int32(tail)))


_INDEXES: "weakref.WeakKeyDictionary[NGramLM, KatzSuccessors]" = weakref.WeakKeyDictionary()


def _int32(tokens: np.ndarray) -> np.ndarray:
    """Token ids as int32 for the core, for scoring: an id outside int32 (or negative) is none a
    model knows, so it scores as ``<unk>`` (-1) rather than being refused as
    :func:`~latticekit._arrays.int32_ids` refuses ids at the boundary."""
    return np.where((tokens >= 0) & (tokens <= _INT32_MAX), tokens, -1).astype(np.int32)


class KatzState:
    """The model after one context: exact log-probabilities and the ranked next tokens."""

    __slots__ = ("_core",)

    def __init__(self, core: "_core.CoreKatzState") -> None:
        self._core = core

    def logprob(self, token: int) -> float:
        """Natural-log p(token | context); ids the model lacks score as ``<unk>``."""
        return float(self._core.logprob(int(token)))

    def ranked(self, r: int) -> Optional[tuple[int, float]]:
        """The r-th most probable proposable token (0-based) and its natural-log probability,
        ties by token id; None past the last."""
        return self._core.ranked(r) if r >= 0 else None
