"""``neural``: local rescoring (the reference paper's Algorithm 2) with a small neural LM."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from latticekit.bpd.drafters.base import Draft, Drafter, DraftInput, DraftResources
from latticekit.bpd.records import DecoderConfig
from latticekit.errors import DecoderConfigError

__all__ = ["NeuralDrafter"]


class NeuralDrafter(Drafter):
    """For heads j = 2..h, left to right, the arc of head j's top-k maximising
    ``log p_head + alpha * log p_rescorer(x | prefix, x_2..x_{j-1})``; one draft per step.

    A replay computes every position's draft of a trace in one batched call
    (:meth:`prepare_replay`); a decode computes one per step.
    """

    method = "neural"

    def __init__(self, config: DecoderConfig, rescorer: Any) -> None:
        super().__init__(config)
        self.rescorer = rescorer
        self._replayed: Optional[tuple[Any, np.ndarray]] = None  # (trace, its drafts)

    @classmethod
    def from_config(cls, config: DecoderConfig, resources: DraftResources) -> "NeuralDrafter":
        from latticekit.bpd.rescorer import check_rescorer

        if resources.rescorer is None:
            raise DecoderConfigError(f"decoder {config.label!r} needs a neural rescorer")
        num_heads = resources.num_heads if resources.num_heads is not None else 2
        return cls(config, check_rescorer(resources.rescorer, resources.vocab_size, num_heads,
                                          largest_id=resources.largest_id))

    def prepare_replay(self, trace: Any) -> None:
        import torch

        from latticekit.bpd.rescorer import neural_drafts

        k = self.k
        drafts = neural_drafts(self.rescorer, torch.tensor(trace.prompt + trace.continuation),
                               torch.arange(len(trace.continuation)) + len(trace.prompt),
                               torch.from_numpy(trace.lattice_tokens[:, :, :k].astype(np.int64)),
                               torch.from_numpy(trace.lattice_scores[:, :, :k]), self.config.alpha,
                               trace.num_heads).numpy()
        self._replayed = (trace, drafts)

    def draft(self, step: DraftInput) -> Draft:
        lattice = step.lattice  # read in both modes: the step's record keeps the lattice drafted from
        if self._replayed is not None:
            trace, drafts = self._replayed
            return [tuple(int(t) for t in drafts[step.root_index - len(trace.prompt)])]
        import torch

        from latticekit.bpd.rescorer import neural_drafts

        draft = neural_drafts(self.rescorer, torch.tensor(list(step.ids)), torch.tensor([step.root_index]),
                              torch.from_numpy(lattice.tokens[None].astype(np.int64)),
                              torch.from_numpy(lattice.scores[None]), self.config.alpha, lattice.h)[0]
        return [tuple(int(t) for t in draft)]
