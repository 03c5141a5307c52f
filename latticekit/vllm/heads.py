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


class _EngineProjection(nn.Module):
    """A vLLM model's output projection over its first ``vocab_size`` rows (vLLM pads the
    vocabulary), computed by the engine's own kernel for it (``lm_head.quant_method.apply``, as
    vLLM's logits processor computes the target's logits: oneDNN's product, packed when the
    model loaded, on vLLM's CPU build). No copy of the weight is made."""

    def __init__(self, lm_head: nn.Module, weight: torch.Tensor, vocab_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.detach()[:vocab_size], requires_grad=False)
        self._lm_head: list[Any] = [lm_head]  # not a submodule: the engine's, not the heads' state
        self.vocab_size = vocab_size

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        lm_head = self._lm_head[0]
        if hidden.dtype != self.weight.dtype or hidden.device != self.weight.device:
            return nn.functional.linear(hidden, self.weight)
        rows = hidden.reshape(-1, hidden.shape[-1])
        logits = lm_head.quant_method.apply(lm_head, rows)[:, :self.vocab_size]
        return logits.reshape(*hidden.shape[:-1], self.vocab_size)


def _projection(lm_head: Any, weight: torch.Tensor, vocab_size: int) -> nn.Module:
    """The model's output projection for the heads: the engine's own kernel where the model is
    vLLM's (its ``lm_head`` has a ``quant_method``), else a linear map over the weight's first
    ``vocab_size`` rows (oneDNN-packed on the CPU by :func:`load_heads_for`)."""
    if callable(getattr(getattr(lm_head, "quant_method", None), "apply", None)):
        return _EngineProjection(lm_head, weight, vocab_size)
    linear = nn.Linear(weight.shape[1], vocab_size, bias=False, device="meta")
    linear.weight = nn.Parameter(weight.detach()[:vocab_size], requires_grad=False)
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
        self._projection = _projection(lm_head, weight, vocab_size)
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
    from latticekit.torch.prepare import fuse_heads, pack_linears

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
    # on the CPU, the heads' own linears oneDNN-packed (and the projection, where it is not the
    # engine's): a product of a few rows runs at about twice the speed of F.linear's, which at
    # 2, 3 or 7 rows runs at a fifth (benchmarks/heads_batch.py); and every head's block in one
    # product per layer (BlockHeads.fuse; one row from cold caches 3.2 against 4.9 ms)
    pack_linears(heads)
    fuse_heads(heads)
    return heads.eval()
