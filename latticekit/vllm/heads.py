"""Draft heads on a vLLM model: latticekit's heads files and Medusa checkpoints, attached to the
output projection of the model vLLM loaded (not an HF model)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from latticekit.errors import HeadsError, ProposerConfigError

__all__ = ["load_heads_for"]


def _projection(weight: torch.Tensor) -> nn.Linear:
    """A vLLM model's output projection as a plain linear map over its first ``vocab_size`` rows
    (vLLM pads the vocabulary; its own LM head module is not callable)."""
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    linear.weight = nn.Parameter(weight, requires_grad=False)
    return linear


class _Target:
    """What heads loaders read of a model: its output projection and its name."""

    def __init__(self, model: Any, vocab_size: int) -> None:
        lm_head = getattr(model, "lm_head", None)
        weight = getattr(lm_head, "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[0] < vocab_size:
            raise ProposerConfigError(f"latticekit vLLM lattice proposer: {type(model).__name__} has no lm_head "
                                      f"weight of {vocab_size} rows to put draft heads on (tensor-parallel "
                                      "shards are not supported)")
        self._projection = _projection(weight.detach()[:vocab_size])
        self.config = getattr(model, "config", None)

    def get_output_embeddings(self) -> nn.Module:
        return self._projection


def load_heads_for(path: Any, model: Any, vocab_size: int) -> Any:
    """Heads from ``path`` (a latticekit heads file, or a Medusa checkpoint folder or weights
    file) on ``model``'s output projection, in eval mode.

    Raises:
        ProposerConfigError: the heads cannot be read, or were made for another model.
    """
    from latticekit.heads.medusa import _WEIGHT_FILES, load_medusa
    from latticekit.heads.modules import BlockHeads
    from latticekit.torch.prepare import pack_linears

    target = _Target(model, vocab_size)
    path = Path(os.fspath(path))
    try:
        if path.is_dir() or any(path.name in names for names in _WEIGHT_FILES.values()):
            heads = load_medusa(path, target)
        else:
            heads = BlockHeads.load(path, target)
    except HeadsError as exc:
        raise ProposerConfigError(f"latticekit vLLM lattice proposer: heads {str(path)!r}: {exc}") from exc
    if heads.num_heads < 2:
        raise ProposerConfigError(f"latticekit vLLM lattice proposer: heads {str(path)!r} hold no draft head")
    # on the CPU, oneDNN's packed copies: their product of a few rows runs at about twice the
    # speed of F.linear's, which at 2, 3 or 7 rows runs at a fifth (benchmarks/heads_batch.py);
    # the output projection's copy costs as much memory as the target's own (113 MB for SmolLM2
    # in float32)
    pack_linears(heads)
    return heads.eval()
