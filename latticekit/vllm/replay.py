"""The vLLM proposer in a replay: :class:`ProposerChains`, a chain source for
:func:`latticekit.eval.chain_replay.replay_chains` that drives :class:`NGramProposer` as vLLM's
runner does, one request at a time, at step costs given or learnt from a simulated engine's
clock (``benchmarks/replay_costs.py``). No engine runs here, nor torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any, Optional

import numpy as np

from latticekit.vllm.config import ProposerConfig
from latticekit.vllm.proposer import NGramProposer

__all__ = ["ProposerChains"]


class ProposerChains:
    """latticekit's vLLM proposer (:class:`~latticekit.vllm.NGramProposer`: the chain drafter
    with the per-batch allocation of chain lengths) driven as vLLM's runner drives it, a batch of
    one request at a time: what it drafts at one request. A finished answer goes into its memory
    when the next request takes the row (the proposer's own way without a runner to tell it;
    the last step's tokens are left out).

    Its step costs are either given (the ``step_costs`` setting) or, with ``engine`` ``(a, b)``,
    learnt as in an engine: the proposer's clock is simulated, each step taking ``a + b n``
    seconds for its ``n`` query tokens (the row's last token and its drafts), the step's query
    tokens handed over as vLLM's slot mappings tell them, and its own drafting taking no time on
    that clock (a replay charges it apart).

    Args:
        k: the engine's ``num_speculative_tokens``.
        vocab_size: the target's vocabulary.
        engine: the simulated engine's step costs ``(a, b)``, or None (``step_costs`` given).
        settings: the proposer's other settings (:class:`~latticekit.vllm.ProposerConfig`).
    """

    def __init__(self, k: int, vocab_size: int, engine: Optional[tuple[float, float]] = None,
                 **settings: Any) -> None:
        config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k),
                                 model_config=SimpleNamespace(max_model_len=1 << 16, get_vocab_size=lambda: vocab_size))
        self.proposer = NGramProposer(config, ProposerConfig(**settings))
        self.engine = engine
        self.now = 0.0
        self._drafts = 0  # the last call's draft tokens: the next step's query tokens are they and one
        if engine is not None:
            self.proposer.clock = lambda: self.now
        self._buffer = np.zeros((1, 0), dtype=np.int32)

    def start(self, prompt: Sequence[int]) -> None:
        self._drafts = 0  # the last request's last chain is never verified

    def propose(self, ids: Sequence[int], emitted: Sequence[int], max_length: int) -> Sequence[int]:
        if self._buffer.shape[1] < len(ids):
            self._buffer = np.zeros((1, 2 * len(ids)), dtype=np.int32)
        self._buffer[0, :len(ids)] = ids
        slots = None
        if self.engine is not None:
            a, b = self.engine
            self.now += a + b * (1 + self._drafts)
            slots = {"layer": np.zeros(1 + self._drafts)}
        out = self.proposer.propose([list(emitted)], np.array([len(ids)]), self._buffer, slot_mappings=slots)[0]
        self._drafts = len(out)
        return out

    def finish(self, ids: Sequence[int]) -> None:
        pass
