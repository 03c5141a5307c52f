"""``LatticeProposer``: the paper's drafting inside vLLM, from draft heads' top-k lattice.

vLLM's own ``medusa`` method drafts each head's arg-max. This proposer reads the same heads (a
Medusa checkpoint, or latticekit's own heads file) and, per request and step:

1. takes the target's final hidden state at the request's last emitted token (the state whose
   logits gave that token) and runs the heads on it: head i >= 2 scores the token at t + i.
   The heads run once per step on the states of every request that drafts: the candidate
   vocabulary's rows are projected in one product for them all, for heads 2..d + 1 alone, d
   the deepest chain a row may take
   (:func:`~latticekit.decoding.lattices.candidate_lattices`), or, with ``vocabulary``
   ``"full"`` and no n-gram model, heads 2..d + 1 over the whole vocabulary for a chunk of
   rows at a time, d the deepest chain a row may take
   (:func:`~latticekit.decoding.lattices.full_lattices`; on the CPU the heads' blocks
   oneDNN-packed and their projection the engine's own product,
   :func:`~latticekit.vllm.heads.load_heads_for`: on the 2-core EPYC, 46 ms for 16 requests
   with SmolLM2's shipped heads, against 143 ms row by row; ``benchmarks/heads_batch.py``);
2. builds the sausage lattice of each head's top k tokens (log-softmax scores), its root the
   token just emitted, over a candidate vocabulary as latticekit's own loop does
   (:class:`~latticekit.decoding.lattices.CandidateLattice`: the n-gram model's 8,192 most
   probable tokens, or without one (``vocabulary`` ``"seen"``, the default) the 8,192 tokens
   the engine has seen most in the texts of the requests it drafted for, and every token of
   the request's text; a full projection of every head costs as much as the target's own
   logits, about 21 ms for SmolLM2 on one core);
3. unites the lattice's p best paths under ``draft + alpha * n-gram`` (latticekit's exact
   search, the n-gram model conditioned on the request's text) with the text's own
   continuations under the n-gram cache model
   (:func:`~latticekit.drafting.union.united_candidates`), and sends the chain the acceptance
   estimates rank first, of the length the batch's step costs choose (as :class:`NGramProposer`
   does, whose request states, cost model and safety it shares).

vLLM 0.32 hands a ``custom_class`` proposer token ids only. The hidden states come from the
target model the runner hands to ``load_model``: a forward pre-hook on its ``logits_processor``
(a ``torch.nn`` hook, no vLLM code replaced) keeps the states the step computed logits from,
one row per request plus one per verified draft token, in batch order (the first logits after
the step's forward pass whose rows add up to those: a request asking for prompt logprobs has
them computed from its prompt's states after the step's own); the row of a request's
last emitted token is its first row plus the tokens it emitted, less one (the index vLLM's own
Medusa proposer takes). The heads' cost is measured with the rest of drafting and counts in
the arms' outcomes, so where they do not repay it (a large batch on a CPU) the proposer drafts
less, or keeps to ``text`` steps (its n-grams alone, as ``NGramProposer`` drafts) or plain ones,
neither of which runs the heads; a probe of the heads then waits as long as its loss against
the best arm allows (:func:`~latticekit.drafting.arms.choose_arm`'s budget).
"""

from __future__ import annotations

import weakref
from collections import deque
from typing import Any, Optional, cast

import numpy as np

from latticekit.drafting.chains import ChainDrafter
from latticekit.drafting.drafters.auto import CANDIDATE_TOKENS, lm_candidates
from latticekit.drafting.drafters.ngram import uniform_lm
from latticekit.errors import ProposerConfigError
from latticekit.vllm.config import ProposerConfig
from latticekit.vllm.proposer import NGramProposer

__all__ = ["LatticeProposer", "hidden_rows"]

#: ``vocabulary`` "seen": the heads' candidates are taken anew when the distinct tokens seen grew
#: by this factor since they were last taken (and each time every request's source is rebuilt
#: on them, so that a batch's rows share them).
_VOCABULARY_GROWTH = 1.125
#: Logits computations kept between two calls (a step's own, then one per request whose prompt
#: logprobs it computed; more only where the engine ran steps without calling the proposer).
_HIDDEN_CALLS = 64


def hidden_rows(emitted: list[int], scheduled_drafts: list[int]) -> list[int]:
    """Per request, the row of its last emitted token's hidden state among the states a step
    computed logits from (one per request plus one per draft token it verified, in batch
    order); -1 for a request that emitted nothing (a prefill chunk).

    Args:
        emitted: tokens each request emitted in the step.
        scheduled_drafts: draft tokens each request had verified in the step.
    """
    rows, offset = [], 0
    for n, d in zip(emitted, scheduled_drafts):
        rows.append(offset + n - 1 if n > 0 else -1)
        offset += d + 1
    return rows


class LatticeProposer(NGramProposer):
    """Drafts from the heads' lattice united with the text's n-grams (see the module docstring).

    Use::

        from latticekit.vllm import speculative_config
        llm = vllm.LLM(model, speculative_config=speculative_config(4, heads="medusa-folder", lm="embedded"))

    Raises:
        ProposerConfigError: no heads, a bad setting, or heads that do not fit the target
            (when the engine starts).
    """

    reads_heads = True
    trust = "head+cache"
    # The n-gram proposer's arms (``model``, and ``plain`` where a draft token is dear): its heads
    # run at every drafting step. Until stop 55 all five arms, ``text`` included: over the whole
    # vocabulary the heads cost 7.6 ms a step for one request, and the arms kept to ``text`` or
    # plain steps where they did not repay it; over the tokens seen (``vocabulary``) they cost
    # about 3 ms, and the five arms, starving the heads after a few early steps, ran at 0.939x
    # these two at one request (benchmarks/results/vllm_speed/lattice-arms-55/).

    def __init__(self, vllm_config: Any, config: Optional[ProposerConfig] = None) -> None:
        super().__init__(vllm_config, config)
        self.search_lm = self.lm if self.lm is not None else uniform_lm()
        self.alpha = self.config.alpha if self.lm is not None else 0.0
        self.heads: Any = None
        # the states of every logits computation since the last call: the step's own come first
        # (its prompt logprobs' after them)
        self._hidden: "deque[Any]" = deque(maxlen=_HIDDEN_CALLS)
        self._lattices: list[Any] = []  # this step's lattice per row, None where not drafting from one
        # each request's lattice source (its candidate vocabulary holds the request's own tokens)
        self._sources: "weakref.WeakKeyDictionary[ChainDrafter, Any]" = weakref.WeakKeyDictionary()
        # the heads' candidate vocabulary: the lm's, or (vocabulary "seen") the tokens seen most,
        # counted over every drafting request's text (each token once), or None: the whole vocabulary
        self._vocabulary = lm_candidates(self.lm, CANDIDATE_TOKENS) if self.lm is not None else None
        self._seen = np.zeros(self.vocab_size, dtype=np.int64) \
            if self.lm is None and self.config.vocabulary == "seen" else None
        self._counted: "weakref.WeakKeyDictionary[ChainDrafter, int]" = weakref.WeakKeyDictionary()
        self._distinct = 0  # distinct tokens seen when the vocabulary was last taken
        self.counters |= {"lattice_rows": 0, "hidden_mismatch": 0, "hidden_checked": 0, "hidden_wrong": 0,
                          "vocabulary_taken": 0, "rows_text_first": 0}

    def load_model(self, model: Any, *args: Any, **kwargs: Any) -> None:
        """Loads the heads onto the target's output projection and hooks the hidden states."""
        from latticekit.vllm.heads import load_heads_for

        self.heads = load_heads_for(self.config.heads, model, self.vocab_size)
        processor = getattr(model, "logits_processor", None)
        if processor is None or not hasattr(processor, "register_forward_pre_hook"):
            raise ProposerConfigError(f"latticekit vLLM lattice proposer: {type(model).__name__} has no "
                                      "logits_processor module to read its hidden states from")
        processor.register_forward_pre_hook(self._keep_hidden, with_kwargs=True)
        if hasattr(model, "register_forward_pre_hook"):  # a step's forward: what came before it is another step's
            model.register_forward_pre_hook(lambda *_: self._hidden.clear())

    def _keep_hidden(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        hidden = kwargs.get("hidden_states", args[1] if len(args) > 1 else None)
        if hidden is not None:
            self._hidden.append(hidden)

    def propose(self, *args: Any, **kwargs: Any) -> list[list[int]]:
        try:
            return super().propose(*args, **kwargs)
        finally:
            self._hidden.clear()  # the next step's states are those computed after this call

    # -- one step ---------------------------------------------------------------------------

    def _begin_step(self, sampled: list[list[int]], prepared: list[Optional[tuple[ChainDrafter, int]]],
                    arm: str) -> None:
        """Finds each drafting request's hidden state among the step's and builds every lattice:
        the heads run once on the batch's states (:func:`~latticekit.decoding.lattices.candidate_lattices`)."""
        calls = list(self._hidden)
        self._lattices = [None] * len(sampled)
        if not calls or self.heads is None or arm == "text":  # a text step: n-grams alone
            return
        runner = self._runner() if self._runner is not None else None
        spec = getattr(getattr(runner, "input_batch", None), "spec_token_ids", None)
        # which drafts each request verified, and the states that add up to them: the step's
        # sampling logits, computed before any request's prompt logprobs; or n-grams alone this step
        drafts = [len(spec[i]) for i in range(len(sampled))] if spec is not None and len(spec) >= len(sampled) \
            else None
        hidden = None if drafts is None else next(
            (h for h in calls if int(h.shape[0]) == sum(drafts) + len(sampled)), None)
        if drafts is None or hidden is None:
            self.counters["hidden_mismatch"] += 1
            return
        rows, states, positions, depth = [], [], [], 1
        for i, row in enumerate(hidden_rows([len(s) for s in sampled], drafts)):
            ready = prepared[i]
            if row >= 0 and ready is not None and not self._text_first(*ready):
                rows.append(i)
                states.append(ready[0])
                positions.append(row)
                depth = max(depth, min(ready[0].max_depth, ready[1]))  # the drafts its chain may hold
                if self.config.check_hidden:
                    self._check_hidden(hidden[row], sampled[i][-1])
        if not rows:
            return
        if self.config.heads_depth is not None:  # deeper positions: the text's candidates alone
            depth = min(depth, self.config.heads_depth)
        import torch

        from latticekit.decoding.lattices import CandidateLattice, FullLattice, candidate_lattices, full_lattices

        batch = hidden.index_select(0, torch.as_tensor(positions, device=hidden.device)).to(self.heads.lm_head.weight.dtype)
        if CandidateLattice.supports(self.heads):  # else every lattice is the whole vocabulary's
            self._see(states)
        sources = [self._source(state) for state in states]
        with torch.inference_mode():
            if all(isinstance(source, CandidateLattice) for source in sources):
                lattices = candidate_lattices(sources, batch, [state.model.ids for state in states], depth=depth)
            else:  # the full vocabulary's lattice: the heads run on the batch
                lattices = full_lattices(cast(list[FullLattice], sources), batch, [state.model.ids for state in states],
                                         depth)
        for i, lattice in zip(rows, lattices):
            self._lattices[i] = lattice
        self.counters["lattice_rows"] += len(rows)

    def _text_first(self, state: ChainDrafter, room: int) -> bool:
        """Whether the request drafts its own chain this step, its heads not run (``text_first``):
        that chain fills its room and is likely accepted whole (its last token's estimate, corrected,
        at least ``text_first``). Counted in ``rows_text_first``."""
        if self.config.text_first is None:
            return False
        chain, probability = state.propose(room, record=False)
        whole = len(chain) >= room and float(probability[-1]) * self.correction >= self.config.text_first
        self.counters["rows_text_first"] += whole
        return whole

    def _see(self, states: list[ChainDrafter]) -> None:
        """Vocabulary "seen": counts the tokens of these requests' texts not counted yet, and takes
        the :data:`CANDIDATE_TOKENS` seen most as the heads' candidates where the distinct tokens
        seen grew by :data:`_VOCABULARY_GROWTH` since they were last taken (every request's
        source then built anew on them)."""
        if self._seen is None:
            return
        for state in states:
            ids, counted = state.model.ids, self._counted.get(state, 0)
            if len(ids) > counted:
                tokens = np.asarray(ids[counted:], dtype=np.int64)
                np.add.at(self._seen, tokens[(tokens >= 0) & (tokens < len(self._seen))], 1)
                self._counted[state] = len(ids)
        distinct = int(np.count_nonzero(self._seen))
        if distinct and distinct >= _VOCABULARY_GROWTH * self._distinct:
            ranked = np.argsort(-self._seen, kind="stable")[:min(distinct, CANDIDATE_TOKENS)]
            self._vocabulary, self._distinct = np.sort(ranked), distinct
            self._sources = weakref.WeakKeyDictionary()  # a batch's sources share their candidates
            self.counters["vocabulary_taken"] += 1

    def _source(self, state: ChainDrafter) -> Any:
        """The request's lattice source (its candidate vocabulary holds the request's own tokens)."""
        source = self._sources.get(state)
        if source is None:
            from latticekit.decoding.lattices import lattice_source

            source = self._sources[state] = lattice_source(self.heads, self.config.k, self.vocab_size,
                                                           self._vocabulary, self.config.candidate_dtype)
        return source

    def _check_hidden(self, hidden: Any, token: int) -> None:
        import torch

        with torch.inference_mode():
            best = int(self.heads.lm_head(hidden.to(self.heads.lm_head.weight.dtype)).argmax())
        self.counters["hidden_checked"] += 1
        self.counters["hidden_wrong"] += int(best != int(token))

    def _draft(self, state: ChainDrafter, index: int, room: int) -> tuple[np.ndarray, np.ndarray]:
        lattice = self._lattices[index] if index < len(self._lattices) else None
        if lattice is None:
            return state.propose(room)
        return state.propose_lattice(room, lattice, self.search_lm, self.config.p, self.alpha)
