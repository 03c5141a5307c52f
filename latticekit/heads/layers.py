"""The layers of a draft head: latticekit's residual block and Medusa's layer."""

from __future__ import annotations

from torch import Tensor
from torch import nn

__all__ = ["ResidualBlock", "MedusaLayer", "LAYER_KINDS"]


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
