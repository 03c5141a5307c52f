"""The layers of a draft head: latticekit's residual block and Medusa's layer."""

from __future__ import annotations

from typing import Callable, Optional, Sequence, cast

import torch
from torch import Tensor
from torch import nn

from latticekit._arrays import tensor_stamp

__all__ = ["ResidualBlock", "MedusaLayer", "FusedBlocks", "LAYER_KINDS"]


class ResidualBlock(nn.Module):
    """``h + W2 · silu(W1 · h + b1) + b2``: one hidden layer with a residual connection.

    ``W2`` and ``b2`` start at zero, so a fresh block is exactly the identity and a fresh head
    starts as a copy of the model's own next-token head.
    """

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.up = nn.Linear(hidden_size, intermediate_size)
        self.down = nn.Linear(intermediate_size, hidden_size)
        nn.init.zeros_(self.down.weight)
        nn.init.zeros_(self.down.bias)

    def forward(self, hidden: Tensor) -> Tensor:
        return hidden + self.down(nn.functional.silu(self.up(hidden)))


class MedusaLayer(nn.Module):
    """``x + silu(W x + b)``: Medusa's residual layer (``b`` optional, as in vLLM's format).

    ``W`` and ``b`` start at zero, so a fresh layer is the identity.
    """

    def __init__(self, hidden_size: int, bias: bool = True) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size, bias=bias)
        nn.init.zeros_(self.linear.weight)
        if bias:
            nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: Tensor) -> Tensor:
        return hidden + nn.functional.silu(self.linear(hidden))


LAYER_KINDS = ("mlp", "medusa")


def _head_block(kind: str, num_layers: int, hidden_size: int, intermediate_size: int, bias: bool) -> nn.Module:
    """One head's stack of residual layers.

    A single layer is the block itself, so one-layer heads keep the tensor names of the first
    file format (``{i}.up.weight``); deeper stacks are ``nn.Sequential`` (``{i}.{l}.up.weight``,
    ``{i}.{l}.linear.weight``).
    """
    layers = [ResidualBlock(hidden_size, intermediate_size) if kind == "mlp" else MedusaLayer(hidden_size, bias)
              for _ in range(num_layers)]
    return layers[0] if num_layers == 1 else nn.Sequential(*layers)


class FusedBlocks:
    """Every head's block as one batched product per layer, for inference.

    Head by head, ``h`` draft heads of one row cost ``2 h`` products of one row each (an ``mlp``
    layer's up and down): each reads its weight from memory and pays its own call. Fused, the
    first layer's products of every head (one input, the hidden state, unless the heads read
    the next token) are one product over the heads' stacked weights (oneDNN-packed on the CPU
    by ``prepare_heads``), and each later product one ``baddbmm`` over the heads. The stacked
    copies hold as many bytes again as the blocks, and the packed copy as many as the first
    layer's (for SmolLM2's shipped heads in float32, 18.6 and 9.3 MB; ``prepare_heads`` then
    frees the blocks' own packed copies, another 18.6 MB). On the 2-core EPYC,
    SmolLM2's shipped heads (7 one-layer ``mlp`` blocks, 576 wide) took 3.2 ms for one row from
    cold caches against 4.9 ms head by head, 4.0 against 5.6 for four rows, 5.5 against 7.9 for
    sixteen; the lattices over 8,192 candidates, 7.5 against 9.1 ms for one row
    (``benchmarks/heads_batch.py --blocks``, stop 61). The same arithmetic, its sums in another
    order: outputs agree to float rounding (3.8e-6 there).

    The weights are copied (stacked) when fused; :meth:`serves` says whether the copy still
    holds the blocks' weights (the same tensors, not changed in place nor moved since), so heads
    trained on or moved after fusing fall back to their blocks rather than use stale weights.

    Args:
        blocks: the heads' blocks (one per draft head): each a layer of kind ``layer``, or an
            ``nn.Sequential`` of them, all alike.
        layer: ``"mlp"`` or ``"medusa"``.
        wrap: turns the first layer's fused ``nn.Linear`` into the module that computes it
            (``latticekit.torch.prepare`` passes its oneDNN packing on the CPU); None: as it is.
    """

    def __init__(self, blocks: Sequence[nn.Module], layer: str,
                 wrap: Optional[Callable[[nn.Linear], nn.Module]] = None) -> None:
        if layer not in LAYER_KINDS or not blocks:
            raise ValueError(f"cannot fuse {len(blocks)} blocks of kind {layer!r}")
        stacks = [list(block) if isinstance(block, nn.Sequential) else [block] for block in blocks]
        names = ("up", "down") if layer == "mlp" else ("linear",)
        self.layer = layer
        self._sources: list[tuple[nn.Module, str, torch.Tensor]] = []
        # per layer, per product: the heads' weights transposed and stacked (heads, in, out) and
        # their biases (heads, 1, out)
        self._products: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
        with torch.inference_mode(False), torch.no_grad():
            for depth in range(len(stacks[0])):
                products = []
                for name in names:
                    linears = [getattr(stack[depth], name) for stack in stacks]
                    weights = [self._source(linear, "weight") for linear in linears]
                    biases = [self._source(linear, "bias") if linear.bias is not None
                              else weights[0].new_zeros(weights[0].shape[0]) for linear in linears]
                    products.append((torch.stack([w.t() for w in weights]).contiguous(),
                                     torch.stack(biases)[:, None, :].contiguous()))
                self._products.append(products)
            first, bias = self._products[0][0]
            heads, width, out = first.shape
            self.heads = heads
            # the first product of every head over one shared input, as one linear layer
            shared = nn.Linear(width, heads * out, device=first.device, dtype=first.dtype)
            shared.weight.copy_(first.transpose(1, 2).reshape(heads * out, width))
            shared.bias.copy_(bias.reshape(heads * out))
            shared.requires_grad_(False)
            # the first layer's stacked weights, for heads that read the next token: a view of it
            self._products[0][0] = (shared.weight.view(heads, out, width).transpose(1, 2), bias)
            self._shared = wrap(shared) if wrap is not None else shared
        self.dtype, self.device = first.dtype, first.device
        self._tensors = tuple(source[2] for source in self._sources)  # the weights fused, in order
        self._stamp = tensor_stamp(self._tensors)

    def _source(self, module: nn.Module, name: str) -> Tensor:
        tensor = getattr(module, name)
        self._sources.append((module, name, tensor))
        return tensor.detach()

    def serves(self, hidden: Tensor) -> bool:
        """Whether these fused weights may compute the blocks on ``hidden``: its dtype and device
        are theirs, no gradient is wanted of the weights, and the blocks still hold the weights
        fused (same tensors, unchanged)."""
        if hidden.dtype != self.dtype or hidden.device != self.device or not self.current():
            return False
        return not torch.is_grad_enabled() or not (hidden.requires_grad
                                                   or any(tensor.requires_grad for tensor in self._tensors))

    def current(self) -> bool:
        """Whether the blocks still hold the weights fused: the same tensors, unchanged since
        (not written in place, their data not replaced, as ``module.to`` replaces it)."""
        return (all(getattr(module, name) is tensor for module, name, tensor in self._sources)
                and tensor_stamp(self._tensors) == self._stamp)

    def __call__(self, hidden: Tensor, offsets: Optional[Tensor] = None, count: Optional[int] = None) -> Tensor:
        """The first ``count`` heads' blocks (default: every head's) on ``hidden`` `(n, d)`:
        `(n, count, d)`. ``offsets`` `(heads, n, d)` (or its first ``count``): head i's block reads
        ``hidden + offsets[i]`` (token-conditioned heads), else ``hidden``.

        Fewer heads read fewer weights: each later product, and a first one for at most half the
        heads, is a ``baddbmm`` over those heads' slices of the stacked weights; a first product
        for more heads is the packed one over every head, its output cut. On the 2-core EPYC
        (AVX-512, float32, SmolLM2's 7 heads over 8,192 candidates, from cold caches), the
        candidate lattices for one draft head took 4.8 ms for sixteen rows against 5.9-6.2 when
        every head's block ran, 2.5-2.8 against 2.9-3.0 for one row
        (``benchmarks/results/heads_batch-63/``, two runs each way, stop 63)."""
        n = hidden.shape[0]
        count = self.heads if count is None else max(1, min(int(count), self.heads))
        x: Optional[Tensor] = None  # (count, n, d): each head's input
        for depth, products in enumerate(self._products):
            (weight, bias) = products[0]
            if depth == 0 and offsets is None and 2 * count > self.heads:  # one product for every head
                y = self._shared(hidden).reshape(n, self.heads, -1)[:, :count].transpose(0, 1)
                inputs = hidden.unsqueeze(0)
            else:
                inputs = x if x is not None else hidden.unsqueeze(0) if offsets is None \
                    else hidden.unsqueeze(0) + offsets[:count]
                y = torch.baddbmm(bias[:count], inputs.expand(count, n, -1), weight[:count])
            if self.layer == "mlp":
                down, down_bias = products[1]
                x = inputs + torch.baddbmm(down_bias[:count], nn.functional.silu(y), down[:count])
            else:
                x = inputs + nn.functional.silu(y)
        return cast(Tensor, x).transpose(0, 1)
