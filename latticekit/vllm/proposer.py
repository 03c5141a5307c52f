"""``NGramProposer``: latticekit's n-gram drafting as a vLLM speculative-decoding proposer.

vLLM 0.32 builds a ``custom_class`` proposer in its worker process with the engine's
``VllmConfig`` and, after every step that ran the model, calls
``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings)`` for the
whole batch: per row, the tokens the step emitted, the row's length, the token buffer (prompt
and output) and each scheduled token's KV slot. It returns one chain of draft ids per row
(possibly empty), which the next step verifies exactly (greedy rows accept what argmax
decoding emits; sampled rows keep the target's distribution through vLLM's rejection sampler).

Per row this proposer drafts latticekit's n-gram continuations of the request's own text
(:class:`~latticekit.drafting.chains.ChainDrafter`); per batch it chooses every chain's
length for the most expected tokens per second under the step costs it measures from the
engine's own steps (:func:`~latticekit.drafting.chains.allocate`): drafts shrink as the batch
grows, down to none. Request state follows the batch: it is created when a request first
appears, kept while a preempted request waits (bounded), and freed when the request finishes.
With ``memory_tokens`` set, a finished request's output goes into the engine's memory of
earlier answers (:class:`~latticekit.drafting.memory.AnswerMemory`), which every request drafts
from beside its own text; vLLM calls the proposer from one thread.

It never takes the engine down: an exception becomes empty drafts for the rows it touched,
logged once per kind with its cause and counted.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import time
import traceback
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Optional, cast

import numpy as np

from latticekit.drafting.calibration import AcceptanceModel
from latticekit.drafting.chains import BatchCosts, ChainDrafter, allocate
from latticekit.drafting.memory import AnswerMemory
from latticekit.errors import ProposerConfigError
from latticekit.ngram import NGramLM
from latticekit.vllm.config import ProposerConfig

__all__ = ["NGramProposer"]

logger = logging.getLogger("latticekit.vllm")
#: After a step whose drafts would not repay their cost, drafting pauses 2, 4, ... up to this many steps.
MAX_SKIP = 32


def _find_runner() -> Any:
    """The model runner building this proposer (vLLM constructs it inside the runner's
    ``__init__``): it knows which request each batch row is. None when not found."""
    frame = inspect.currentframe()
    while frame is not None:
        owner = frame.f_locals.get("self")
        if owner is not None and type(owner).__name__.endswith("ModelRunner"):
            return owner
        frame = frame.f_back
    return None


def _load_lm(name: Optional[str]) -> Optional[NGramLM]:
    if name is None:
        return None
    if name == "embedded":
        from latticekit.demo import embedded_token_lm

        return embedded_token_lm()
    try:
        if name.endswith((".arpa", ".arpa.gz", ".gz")):
            return NGramLM.from_arpa(name)
        return NGramLM.load(name)
    except Exception as exc:  # every reader's error, named with the file
        raise ProposerConfigError(f"latticekit vLLM proposer: lm {name!r} is not a readable n-gram model: "
                                  f"{type(exc).__name__}: {exc}") from exc


def _scheduled_tokens(slot_mappings: Any) -> Optional[int]:
    """Query tokens of the step just run: the length of any layer's slot mapping."""
    if isinstance(slot_mappings, (list, tuple)):
        slot_mappings = slot_mappings[0] if slot_mappings else None
    if isinstance(slot_mappings, dict) and slot_mappings:
        first = next(iter(slot_mappings.values()))
        shape = getattr(first, "shape", None)
        if shape is not None and len(shape) >= 1:
            return int(shape[0])
    return None


class NGramProposer:
    """latticekit's drafting in vLLM: see the module docstring.

    Use::

        from latticekit.vllm import speculative_config
        llm = vllm.LLM(model, speculative_config=speculative_config(8, lm="embedded"))

    or ``speculative_config={"method": "custom_class", "model": "latticekit.vllm.NGramProposer",
    "num_speculative_tokens": 8}`` with ``LATTICEKIT_VLLM_CONFIG`` set (:mod:`latticekit.vllm.config`).

    Raises:
        ProposerConfigError: a bad setting or model file (when the engine starts).
    """

    #: Whether the proposer drafts from heads (``heads`` is its setting).
    reads_heads = False
    #: What the acceptance estimates' prior takes at its word (:meth:`AcceptanceModel.prior`).
    trust = "cache"

    def __init__(self, vllm_config: Any, config: Optional[ProposerConfig] = None) -> None:
        self.config = config if config is not None else ProposerConfig.from_env()
        if (self.config.heads is not None) != self.reads_heads:
            raise ProposerConfigError(
                "latticekit vLLM proposer: heads are drafted by latticekit.vllm.LatticeProposer, n-grams alone by "
                f"latticekit.vllm.NGramProposer; {type(self).__name__} was given heads={self.config.heads!r}")
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.vocab_size = int(vllm_config.model_config.get_vocab_size())
        self.lm = _load_lm(self.config.lm)
        if self.lm is not None:
            largest = int(np.max(self.lm.word_token_ids(), initial=-1))
            if largest >= self.vocab_size:
                raise ProposerConfigError(f"latticekit vLLM proposer: lm {self.config.lm!r} holds token id {largest}, "
                                          f"outside the model's vocabulary of {self.vocab_size}")
        self.acceptance = AcceptanceModel.prior(trust=self.trust)
        self.memory = AnswerMemory(self.config.memory_tokens, vocab_size=self.vocab_size) \
            if self.config.memory_tokens else None
        self.costs = BatchCosts(prior_ratio=self.config.prior_ratio)
        runner = _find_runner()
        self._runner = weakref.ref(runner) if runner is not None else None
        self.states: "OrderedDict[Any, ChainDrafter]" = OrderedDict()
        self._last_end: Optional[float] = None
        self._verify_tokens: Optional[int] = None  # query tokens the next step holds if no request prefills
        self._draft_s = 0.0  # running mean of a drafting call's own seconds
        self._skip = 0  # steps left without drafting (drafting did not pay)
        self._probe = 2  # steps skipped after the next step that does not pay
        self._logged: set[str] = set()
        self._stats_written = 0.0
        self.counters = {"calls": 0, "rows": 0, "drafted_rows": 0, "draft_tokens": 0, "accepted_tokens": 0,
                         "proposed_tokens": 0,
                         "draft_seconds": 0.0, "errors": 0, "requests_started": 0, "requests_finished": 0,
                         "states_evicted": 0}

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """vLLM's CPU runner hands the target model over; n-gram drafting needs none of it."""

    # -- one step ---------------------------------------------------------------------------

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings: Any = None, **_: Any) -> list[list[int]]:
        """One chain per batch row (see the module docstring); empty chains when anything fails."""
        start = time.perf_counter()
        rows = len(sampled_token_ids)
        try:
            tokens = _scheduled_tokens(slot_mappings)
            # a step's cost as drafts make it: decode and verification steps, not prefill (a long
            # prompt's tokens go through the pass far cheaper per token than a batch's few)
            if self._last_end is not None and tokens is not None and self._verify_tokens is not None \
                    and tokens <= self._verify_tokens:
                self.costs.add(tokens, start - self._last_end)
            drafted = self._skip == 0
            out = self._propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
        except Exception as exc:  # never the engine's problem
            self._failed("propose", exc)
            out = [[] for _ in range(rows)]
            drafted = False
        end = time.perf_counter()
        spent = end - start
        if drafted:
            self._draft_s = spent if self._draft_s == 0 else 0.9 * self._draft_s + 0.1 * spent
        self._verify_tokens = rows + sum(len(chain) for chain in out)
        self.counters["calls"] += 1
        self.counters["rows"] += rows
        # a row emits its accepted draft tokens and one of the target's own
        self.counters["accepted_tokens"] += sum(max(0, len(emitted) - 1) for emitted in sampled_token_ids)
        self.counters["draft_seconds"] += spent
        self.counters["drafted_rows"] += sum(1 for chain in out if chain)
        self.counters["draft_tokens"] += sum(len(chain) for chain in out)
        if self.config.stats is not None and end - self._stats_written > 0.5:
            self._write_stats(end)
        self._last_end = time.perf_counter()
        return out

    def _propose(self, sampled: list[list[int]], lengths: np.ndarray, buffer: np.ndarray) -> list[list[int]]:
        rows = len(sampled)
        keys = self._row_keys(rows)
        if self._skip > 0:  # drafting did not pay lately: not even its own work (the states catch up later)
            self._skip -= 1
            return [[] for _ in range(rows)]
        self._begin_step(sampled)
        chains: list[np.ndarray] = []
        probabilities: list[np.ndarray] = []
        for i in range(rows):
            chain, prob = np.zeros(0, dtype=np.int64), np.zeros(0)
            if sampled[i]:  # nothing sampled: a prefill chunk or a discarded row
                try:
                    chain, prob = self._draft_row(i, keys[i], int(lengths[i]), buffer[i], len(sampled[i]))
                except Exception as exc:
                    self._failed("row", exc)
                    self.states.pop(keys[i], None)
            chains.append(chain)
            probabilities.append(prob)
        if self.config.step_costs is not None:
            a, b = self.config.step_costs
        else:
            a, b = self.costs.coefficients()
        if a == 0 and b == 0:  # no step measured yet: a token at the prior's price
            a, b = 1.0, self.config.prior_ratio
        chosen = allocate(probabilities, a, b, overhead=self._draft_s)
        self.counters["proposed_tokens"] += sum(len(c) for c in chains)
        expected = rows + sum(float(p[:n].sum()) for p, n in zip(probabilities, chosen))
        drafts = sum(chosen)
        # the drafts must repay the drafting too, against a step that drafts nothing at all
        if not drafts or expected / (a + self._draft_s + b * (rows + drafts)) <= rows / (a + b * rows):
            self._skip, self._probe = self._probe, min(2 * self._probe, MAX_SKIP)
            return [[] for _ in range(rows)]
        self._probe = 2
        return [chain[:n].tolist() for chain, n in zip(chains, chosen)]

    def _begin_step(self, sampled: list[list[int]]) -> None:
        """What a step's drafting needs for the whole batch before its rows (nothing here)."""

    def _draft(self, state: ChainDrafter, index: int, room: int) -> tuple[np.ndarray, np.ndarray]:
        """Row ``index``'s chain, its state up to date."""
        return state.propose(room)

    def _draft_row(self, index: int, key: Any, length: int, row: np.ndarray,
                   emitted: int) -> tuple[np.ndarray, np.ndarray]:
        room = min(self.k, self.config.max_depth, self.max_model_len - length - 1)
        if length < 1 or room < 1:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        ids = cast(Sequence[int], row[:length])  # an int array: indexed and sliced as the drafter reads ids
        state = self.states.get(key)
        if state is not None and state.length and (length - state.start < state.length or int(
                ids[state.start + state.length - 1]) != state.model.ids[-1]):
            self.states.pop(key).remember()  # the row holds another text now (a row index key, reused)
            state = None
        if state is None:
            prompt = self._prompt_length(key, length - emitted)
            state = ChainDrafter(self.lm, self.vocab_size, self.acceptance, candidates=self.config.candidates,
                                 max_depth=self.config.max_depth, start=max(0, prompt - self.config.max_context),
                                 memory=self.memory, prompt_length=prompt)
            self.states[key] = state
            self.counters["requests_started"] += 1
            while len(self.states) > self.config.max_requests:
                self.states.popitem(last=False)
                self.counters["states_evicted"] += 1
        else:
            self.states.move_to_end(key)
        state.observe(ids)
        return self._draft(state, index, room)

    # -- which request a row is ---------------------------------------------------------------

    def _row_keys(self, rows: int) -> list[Any]:
        """Each row's request id where the runner tells it (states then follow requests that move
        rows, pause and resume), else the row index (a state whose text a row no longer extends
        starts afresh). Frees the states of requests that finished."""
        runner = self._runner() if self._runner is not None else None
        batch = getattr(runner, "input_batch", None)
        req_ids = list(getattr(batch, "req_ids", []) or [])[:rows]
        if len(req_ids) != rows or any(r is None for r in req_ids):
            return list(range(rows))
        live = getattr(runner, "requests", None)
        if isinstance(live, dict):
            for key in [k for k in self.states if not isinstance(k, int) and k not in live]:
                self.states.pop(key).remember()  # finished: a preempted request stays in runner.requests
                self.counters["requests_finished"] += 1
        return req_ids

    def _prompt_length(self, key: Any, fallback: int) -> int:
        runner = self._runner() if self._runner is not None else None
        state = getattr(runner, "requests", {}).get(key) if runner is not None and not isinstance(key, int) else None
        prompt = getattr(state, "prompt_token_ids", None)
        return len(prompt) if prompt is not None else max(0, fallback)

    # -- never the engine's problem -------------------------------------------------------------

    def _failed(self, where: str, exc: BaseException) -> None:
        self.counters["errors"] += 1
        kind = f"{where}:{type(exc).__name__}"
        if kind not in self._logged:
            self._logged.add(kind)
            logger.error("latticekit vLLM proposer: %s failed, drafting nothing for it (logged once per kind):\n%s",
                         where, "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))

    def stats(self) -> dict[str, Any]:
        """The counters, the fitted step costs and the request states held."""
        a, b = self.costs.coefficients()
        memory = {"memory_tokens": len(self.memory), "memory_answers": self.memory.added} if self.memory is not None \
            else {}
        return {**self.counters, "step_costs": [a, b], "states": len(self.states), "pid": os.getpid(), **memory}

    def _write_stats(self, now: float) -> None:
        self._stats_written = now
        path = self.config.stats
        assert path is not None
        try:
            from latticekit._files import atomic_write

            with atomic_write(path) as f:
                f.write(json.dumps(self.stats()).encode())
        except Exception as exc:
            self._failed("stats", exc)
