"""``neural``: local rescoring (the reference paper's Algorithm 2) with a small neural LM.

Registered when :mod:`latticekit.eval` is imported (the rescorer it needs lives there too);
torch is imported on first use, so saved records can be analysed without it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from latticekit.drafting.config import DecoderConfig
from latticekit.drafting.protocol import Draft, Drafter, DraftInput, DraftResources
from latticekit.drafting.registry import register
from latticekit.errors import DecoderConfigError

__all__ = ["NeuralDrafter"]


@register
class NeuralDrafter(Drafter):
    """For heads j = 2..h, left to right, the arc of head j's top-k maximising
    ``log p_head + alpha * log p_rescorer(x | prefix, x_2..x_{j-1})``; one draft per step."""

    method = "neural"
    knobs = frozenset({"k", "alpha"})

    def __init__(self, config: DecoderConfig, rescorer: Any) -> None:
        super().__init__(config)
        self.rescorer = rescorer

    @classmethod
    def from_config(cls, config: DecoderConfig, resources: DraftResources) -> "NeuralDrafter":
        from latticekit.eval.rescorer import check_rescorer

        if resources.rescorer is None:
            raise DecoderConfigError(f"decoder {config.label!r} needs a neural rescorer")
        num_heads = resources.num_heads if resources.num_heads is not None else 2
        return cls(config, check_rescorer(resources.rescorer, resources.vocab_size, num_heads,
                                          largest_id=resources.largest_id))

    def draft(self, step: DraftInput) -> Draft:
        import torch

        from latticekit.eval.rescorer import neural_drafts

        lattice = step.lattice
        draft = neural_drafts(self.rescorer, torch.tensor(list(step.ids)), torch.tensor([step.root_index]),
                              torch.from_numpy(lattice.tokens[None].astype(np.int64)),
                              torch.from_numpy(lattice.scores[None]), self.config.alpha, lattice.h)[0]
        return Draft.from_paths([tuple(int(t) for t in draft)])
