"""Replay without a model: a chain drafter's acceptance on a target's greedy token streams.

Under greedy verification, what a step accepts depends only on the draft and the target's
greedy continuation: the longest prefix of the draft equal to the continuation's next tokens,
then the target's own next token (the bonus token). So the greedy stream of each request
(prompt and continuation, computed once) replays any drafter exactly, with no target call:
thousands of requests in minutes. :func:`replay_chains` walks the requests in order through
one :class:`ChainSource` (a drafter that sees the requests one after another, as an engine's
proposer does: its memory of earlier answers, if any, grows as it goes) and counts the target
calls a real decode would make: the prefill (the first token), then one call per step.

:class:`LatticekitChains` is latticekit's chain drafter as vLLM's proposer runs it
(:class:`~latticekit.drafting.chains.ChainDrafter`, one per request, the acceptance estimates
shared and learnt as they go, optionally an :class:`~latticekit.drafting.memory.AnswerMemory`
that every finished answer goes into), every chain at its full length (the batch-cost
allocation of the proposer left out: one request at a time, a draft token free).
:class:`LatticekitTrees` verifies the whole candidate tree the chain is chosen from instead (the
text's p best continuations, united with the memory's): what tree verification could accept,
beside the chains (not comparable with them: a tree verifies more tokens a call).
:class:`latticekit.vllm.replay.ProposerChains` is the vLLM proposer itself, its allocation of
chain lengths included, at step costs given or learnt from a simulated engine's clock: with
each request's draft tokens (:attr:`ChainReplay.drafts`), a replay then says what an engine of
those costs would take in seconds (``benchmarks/replay_costs.py``).
``benchmarks/replay_drafters.py`` adds vLLM's ``ngram`` and SuffixDecoding; the test
``tests/decoding/test_chain_replay.py`` checks a replay against real greedy verification.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol

from latticekit.drafting.calibration import SourceAcceptance
from latticekit.drafting.chains import ChainDrafter
from latticekit.drafting.memory import AnswerMemory
from latticekit.drafting.tree import Draft
from latticekit.errors import DecoderConfigError
from latticekit.ngram import NGramLM

__all__ = ["ChainSource", "ChainReplay", "LatticekitChains", "LatticekitTrees", "replay_chains", "accepted_prefix"]


class ChainSource(Protocol):
    """A chain drafter (or a tree drafter, :class:`LatticekitTrees`) that sees requests one after another."""

    def start(self, prompt: Sequence[int]) -> None:
        """A new request with this prompt."""

    def propose(self, ids: Sequence[int], emitted: Sequence[int], max_length: int) -> Sequence[Any]:
        """The chain after ``ids`` (prompt and output so far; ``emitted``: the tokens the last
        call emitted, the last of ``ids``), at most ``max_length`` tokens; or a tree, as the list
        of its paths (token tuples), each at most ``max_length`` tokens."""

    def finish(self, ids: Sequence[int]) -> None:
        """The request ended with ``ids``."""


@dataclass
class ChainReplay:
    """What a replay counted, over all its requests.

    Attributes:
        tokens: tokens emitted (every continuation's length).
        calls: target calls (per request: the prefill, then one per step).
        steps: verification steps (calls less the prefills).
        drafted: draft tokens proposed (a tree's nodes).
        draft_seconds: seconds in the drafter's ``propose`` and bookkeeping.
        per_request: each request's ``(tokens, calls)``.
        drafts: each request's ``(draft tokens, drafting seconds)``.
    """

    tokens: int = 0
    calls: int = 0
    steps: int = 0
    drafted: int = 0
    draft_seconds: float = 0.0
    per_request: list[tuple[int, int]] = field(default_factory=list)
    drafts: list[tuple[int, float]] = field(default_factory=list)

    @property
    def tokens_per_call(self) -> float:
        return self.tokens / self.calls if self.calls else 0.0

    @property
    def draft_ms_per_step(self) -> float:
        return 1000 * self.draft_seconds / self.steps if self.steps else 0.0


def accepted_prefix(chain: Sequence[int], continuation: Sequence[int], at: int) -> int:
    """How many of ``chain``'s tokens equal ``continuation[at:]``, from the first."""
    n = 0
    while n < len(chain) and at + n < len(continuation) and int(chain[n]) == continuation[at + n]:
        n += 1
    return n


def replay_chains(streams: Sequence[tuple[Sequence[int], Sequence[int]]], source: ChainSource,
                  max_length: int) -> ChainReplay:
    """Replays ``source`` on the ``(prompt, greedy continuation)`` streams, in order.

    Raises:
        DecoderConfigError: ``max_length`` below 1.
    """
    if max_length < 1:
        raise DecoderConfigError(f"max_length must be >= 1, got {max_length}")
    out = ChainReplay()
    clock = time.perf_counter
    for prompt, continuation in streams:
        prompt, continuation = [int(t) for t in prompt], [int(t) for t in continuation]
        if not continuation:
            continue
        drafted, t0 = out.drafted, clock()
        source.start(prompt)
        seconds = clock() - t0
        ids = prompt + continuation[:1]  # the prefill's token
        emitted, calls = continuation[:1], 1
        while len(ids) - len(prompt) < len(continuation):
            at = len(ids) - len(prompt)
            t0 = clock()
            draft = list(source.propose(ids, emitted, max_length))
            seconds += clock() - t0
            if draft and isinstance(draft[0], tuple):  # a tree: its longest path on the greedy tokens
                out.drafted += len(draft)
                accepted, _ = Draft.from_paths(path[:max_length] for path in draft).accepted(continuation, at)
            else:
                out.drafted += min(len(draft), max_length)
                accepted = accepted_prefix(draft[:max_length], continuation, at)
            emitted = continuation[at:at + accepted + 1]  # the accepted drafts and the target's own token
            ids += emitted
            calls += 1
        t0 = clock()
        source.finish(ids)
        seconds += clock() - t0
        out.draft_seconds += seconds
        out.tokens += len(continuation)
        out.calls += calls
        out.steps += calls - 1
        out.per_request.append((len(continuation), calls))
        out.drafts.append((out.drafted - drafted, seconds))
    return out


class LatticekitChains:
    """latticekit's chain drafter as vLLM's proposer runs it, one request at a time (see the
    module docstring).

    Args:
        vocab_size: the target's vocabulary.
        lm: the static Katz model, or None (each request's own text).
        memory: earlier answers, shared by the requests, or None.
        candidates: candidate-tree nodes per step (the proposer's ``candidates``).
    """

    def __init__(self, vocab_size: int, lm: Optional[NGramLM] = None, memory: Optional[AnswerMemory] = None,
                 candidates: int = 32) -> None:
        self.vocab_size, self.lm, self.memory, self.candidates = vocab_size, lm, memory, candidates
        self.acceptance = SourceAcceptance.prior(("text",) + ("memory",) * (memory is not None))
        self.state: Optional[ChainDrafter] = None

    def start(self, prompt: Sequence[int]) -> None:
        self.state = ChainDrafter(self.lm, self.vocab_size, self.acceptance, candidates=self.candidates,
                                  max_depth=64, memory=self.memory, prompt_length=len(prompt))

    def propose(self, ids: Sequence[int], emitted: Sequence[int], max_length: int) -> Sequence[int]:
        assert self.state is not None
        self.state.observe(ids)
        return self.state.propose(max_length)[0].tolist()

    def finish(self, ids: Sequence[int]) -> None:
        assert self.state is not None
        self.state.observe(ids)  # the last step's tokens too: the whole answer is remembered
        self.state.remember()
        self.state = None


class LatticekitTrees(LatticekitChains):
    """The candidate tree :class:`LatticekitChains` chooses its chain from, verified whole (its
    paths)."""

    def propose(self, ids: Sequence[int], emitted: Sequence[int], max_length: int) -> Sequence[Any]:
        assert self.state is not None
        self.state.observe(ids)
        return self.state.candidate_tree(max_length).paths()

