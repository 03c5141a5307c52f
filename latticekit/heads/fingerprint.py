"""What identifies heads and the model they belong to: content hashes, the same on every machine."""

from __future__ import annotations

import hashlib
import weakref
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

if TYPE_CHECKING:
    from latticekit.heads.protocol import DraftHeads

__all__ = ["heads_fingerprint", "lm_head_fingerprint"]

# Fixed flat indices of the output projection's weight whose values identify a base model;
# the same indices on every machine, so a file trained on one copy loads on another.
_FINGERPRINT_SIZE = 32
_FINGERPRINTS: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()


def lm_head_fingerprint(weight: Tensor) -> list[float]:
    """A few fixed entries of the output projection's weight, as floats."""
    flat = weight.detach().reshape(-1)
    index = (torch.arange(_FINGERPRINT_SIZE) * (flat.numel() - 1) // (_FINGERPRINT_SIZE - 1)).to(flat.device)
    return [float(v) for v in flat[index].float().cpu()]


def heads_fingerprint(heads: DraftHeads) -> str:
    """A hash of the heads' parameters and buffers: retrained heads at the same path miss the cache."""
    digest = hashlib.sha256()
    for name, tensor in sorted(heads.state_dict().items()):
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def cached_heads_fingerprint(heads: DraftHeads) -> str:
    """:func:`heads_fingerprint`, remembered per heads object (decodes ask it every call); heads
    that cannot be weakly referenced are hashed every time."""
    try:
        fingerprint = _FINGERPRINTS.get(heads)
        if fingerprint is None:
            fingerprint = _FINGERPRINTS[heads] = heads_fingerprint(heads)
        return fingerprint
    except TypeError:
        return heads_fingerprint(heads)
