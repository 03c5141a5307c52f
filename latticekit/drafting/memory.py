"""Memory across requests: a bounded store of earlier answers that drafting reads.

An agent's loop, templated answers, the same question over new documents: a request's answer
often repeats what earlier answers said, which its own text (prompt and output) cannot know.
SuffixDecoding (Oliaro et al., 2024; Snowflake's ``arctic-inference``) drafts from a global
suffix tree of past answers for that reason. :class:`AnswerMemory` is latticekit's: the
n-gram cache of the heads-free model (:class:`~latticekit.drafting.cache_model.CacheModel`,
the C++ ``csrc/latticekit/ngram_cache.h``) over earlier answers (or any texts: a corpus is
added the same way), each its own segment, so that no context reaches from one answer into the
next, and each counted after the last tokens of the turn that led to it (its ``context``: the
prompt's last :data:`DEFAULT_CONTEXT` tokens, the end of a chat template's
``<|im_start|>assistant\n``), which are not counted themselves. An answer's first tokens,
drafted where the request's text is its prompt and a token, are then matched as an answer's
start, not wherever else an answer held them (a code answer's opening fence goes on with
``python``; without the turn it matched earlier answers' closing fences, which prose follows);
and :func:`memory_continuations` searches it for the most probable
continuations of a request's text, matched on the request's own last tokens, as the same
:class:`~latticekit.drafting.continuations.Continuations` that
:func:`~latticekit.drafting.continuations.best_continuations` gives for the request's text: one
more candidate source for a drafter.

* **Scope is the caller's**: a memory is an object; one passed to several drafters (a session,
  an engine's requests) is shared by them; :func:`default_memory` is the process's own.
* **Bounded**: it never holds more than ``max_tokens`` answer tokens (and before each answer
  at most ``context`` tokens of its context, :data:`DEFAULT_CONTEXT`). An answer that would
  pass the limit first evicts the oldest answers, down to half the limit, and the cache is
  rebuilt from the answers kept: O(``max_order``) per token, amortised (a rebuild re-reads at most
  ``max_tokens / 2`` tokens, and follows at least as many new ones). A longer answer than the
  limit keeps its last ``max_tokens`` tokens.
* **The weights** ``lam(n)`` are fitted on the answers as they come (how well the earlier
  answers predicted each new one), as a request's cache model fits them on its own text.
* **Threads**: adding and searching hold the memory's lock (the search runs in C++ without the
  GIL), so threads may share a memory. vLLM's proposer calls it from one thread.

Nothing here imports torch.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from typing import Optional

import numpy as np

from latticekit import _core
from latticekit.drafting.cache_model import MAX_ORDER, CacheModel, _token_array
from latticekit.drafting.calibration import SOURCES
from latticekit.drafting.continuations import Continuations, best_continuations
from latticekit.errors import DecoderConfigError

__all__ = ["AnswerMemory", "memory_continuations", "united_with_memory", "default_memory", "DEFAULT_MAX_TOKENS",
           "DEFAULT_CONTEXT"]

#: The process-wide memory's size (tokens): about 45 MB (some 360 bytes a token in the cache).
DEFAULT_MAX_TOKENS = 1 << 17
#: The tokens before an answer it is counted after, unless told: enough to tell an answer's start
#: (the end of a chat template's turn), not so many that a template every answer shares passes for
#: a long match, which the memory's weights trust as though the request's text matched that far
#: (replayed, 1 to 8 tokens drafted within 0.3% of each other, 0 up to 3.8% less; in vLLM, 8 let a
#: template-long match of an unrelated earlier answer outbid the request's own text).
DEFAULT_CONTEXT = 2
#: The vocabulary of the memory's uniform fallback when none is given: only the share of a
#: probability outside the memory's followers depends on it (the memory proposes its followers only).
DEFAULT_VOCAB_SIZE = 1 << 16


class AnswerMemory:
    """Earlier answers, for drafting (see the module docstring).

    Args:
        max_tokens: the most tokens it holds at any time (>= 1).
        max_order: the longest context matched (tokens).
        vocab_size: the target's vocabulary (the uniform fallback's; see :data:`DEFAULT_VOCAB_SIZE`).
        context: the most tokens before an answer (its ``context`` in :meth:`add`) it counts the
            answer after, 0 to ``max_order`` (:data:`DEFAULT_CONTEXT`; 0: an answer stands alone).

    Raises:
        DecoderConfigError: a bad argument.
    """

    def __init__(self, max_tokens: int, max_order: int = MAX_ORDER, vocab_size: int = DEFAULT_VOCAB_SIZE,
                 context: int = DEFAULT_CONTEXT) -> None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, (int, np.integer)) or max_tokens < 1:
            raise DecoderConfigError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
        if isinstance(context, bool) or not isinstance(context, (int, np.integer)) or not 0 <= context <= max_order:
            raise DecoderConfigError(f"context must be an integer in [0, max_order = {max_order}], got {context!r}")
        self.max_tokens = int(max_tokens)
        self.context = int(context)
        # the cache model's search reads its cache; its own text (``ids``) stays empty: the
        # memory's text is its answers, each a segment of the cache
        self.model = CacheModel(None, vocab_size, max_order=max_order)
        self._answers: deque[tuple[np.ndarray, np.ndarray]] = deque()  # (context, answer)
        self._tokens = 0
        self.lock = threading.Lock()
        self.added = self.evicted = 0  # answers, ever

    def __len__(self) -> int:
        """Answer tokens held (at most ``max_tokens``; their contexts not counted)."""
        return self._tokens

    @property
    def answers(self) -> list[tuple[int, ...]]:
        """The answers held, oldest first."""
        with self.lock:
            return [tuple(a.tolist()) for _, a in self._answers]

    def add(self, tokens: Sequence[int], context: Sequence[int] = ()) -> None:
        """Remembers one answer (or a document of a corpus): its n-grams, none reaching into
        another's, each counted after the tokens before it, ``context``'s last ones first (at
        most :attr:`context` of them: the prompt that led to the answer; they are not counted
        themselves). Evicts the oldest answers first where it would pass ``max_tokens``.

        Raises:
            DecoderConfigError: a token id outside int32, or a negative one (of the context, among
                the tokens it reads).
        """
        if len(context) > self.context:  # a whole prompt may come: only its end is read
            context = context[len(context) - self.context:]
        answer, before = _token_array(tokens), _token_array(context)
        for ids in (answer, before):
            if ids.size and int(ids.min()) < 0:
                raise DecoderConfigError(f"token ids must be >= 0, got {int(ids.min())}")
        if not answer.size:
            return
        if answer.size > self.max_tokens:  # its kept tail follows its cut, not the context
            before = before[:0]
        before, answer = before.copy(), answer[-self.max_tokens:].copy()
        with self.lock:
            self.added += 1
            if self._tokens + answer.size > self.max_tokens:
                self._evict(before, answer)
            else:
                self._count(before, answer)
            self._answers.append((before, answer))
            self._tokens += answer.size

    def clear(self) -> None:
        """Forgets every answer."""
        with self.lock:
            self.model.cache.clear()
            self._answers.clear()
            self._tokens = 0

    def _evict(self, before: np.ndarray, newcomer: np.ndarray) -> None:
        """Keeps the newest answers that fit half the limit with ``newcomer`` (or none), and
        rebuilds the cache from them."""
        budget = max(self.max_tokens // 2, newcomer.size) - newcomer.size
        kept: list[tuple[np.ndarray, np.ndarray]] = []
        for context, answer in reversed(self._answers):
            if answer.size > budget:
                break
            kept.append((context, answer))
            budget -= answer.size
        self.evicted += len(self._answers) - len(kept)
        self._answers = deque(reversed(kept))
        self._tokens = sum(a.size for _, a in kept)
        self.model.cache.clear()
        for context, answer in self._answers:
            self._count(context, answer)
        self._count(before, newcomer)

    def _count(self, context: np.ndarray, answer: np.ndarray) -> None:
        cache = self.model.cache
        cache.prime(context)
        cache.extend(answer, np.full(answer.size, 1.0 / self.model.vocab_size))


def memory_continuations(memory: AnswerMemory, ids: Sequence[int], p: int, max_depth: int) -> Continuations:
    """The ``p`` most probable continuations of ``ids`` of 1..``max_depth`` tokens under the
    memory's answers, matched on the last tokens of ``ids`` (as
    :func:`~latticekit.drafting.continuations.best_continuations`; nodes only where an answer
    continues the match: none when no answer holds the text's last token).

    Raises:
        DecoderConfigError: ``max_depth`` below 1.
    """
    with memory.lock:
        return best_continuations(memory.model, ids, p, max_depth)


def united_with_memory(found: Continuations, recalled: Continuations) -> tuple[Continuations, np.ndarray]:
    """The text's continuations and the memory's in one tree: ``found``'s nodes first, then the
    memory's others (parents before children). A node both hold takes the larger of its two
    conditionals (the stronger evidence); a node only the memory holds has no static
    log-probability (NaN). Scores are the sums of the conditionals down each path.

    In the C++ core (``UniteContinuations``, ``csrc/latticekit/continuations.h``);
    ``tests/drafting/test_memory.py`` checks it against the union written out in Python.

    Returns:
        The tree, and each node's sources (bits of
        :data:`~latticekit.drafting.calibration.SOURCES`: the text's, the memory's, or both).
    """
    if not recalled.size:
        return found, np.full(found.size, SOURCES["text"], dtype=np.int64)
    *nodes, sources = _core.unite_continuations(_arrays(found), _arrays(recalled), SOURCES["text"], SOURCES["memory"])
    return Continuations(*nodes), sources


def _arrays(nodes: Continuations) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The nodes' tokens, parents, depths (int64), conditionals and static log-probabilities
    (float64), as the core reads them."""
    return (np.ascontiguousarray(nodes.tokens, dtype=np.int64), np.ascontiguousarray(nodes.parents, dtype=np.int64),
            np.ascontiguousarray(nodes.depths, dtype=np.int64), np.ascontiguousarray(nodes.logprob, dtype=np.float64),
            np.ascontiguousarray(nodes.static_logprob, dtype=np.float64))


_default: Optional[AnswerMemory] = None
_default_lock = threading.Lock()


def default_memory() -> AnswerMemory:
    """The process's own memory (:data:`DEFAULT_MAX_TOKENS` tokens), made on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = AnswerMemory(DEFAULT_MAX_TOKENS)
        return _default
