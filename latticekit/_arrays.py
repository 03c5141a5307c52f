"""Conversion and validation of token and score arrays at the public boundary."""

from __future__ import annotations

from typing import Any

import numpy as np

from latticekit.errors import LatticeError, VocabularyError

_INT32_MAX = np.iinfo(np.int32).max


def to_numpy(x: Any) -> np.ndarray:
    """Returns a numpy view or copy of x (numpy array, torch tensor on any device, sequence)."""
    if isinstance(x, np.ndarray):
        return x
    if type(x).__module__.startswith("torch"):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def token_array(tokens: Any, what: str = "tokens") -> np.ndarray:
    """Validates a 1-D sequence of token ids and returns it as contiguous int32.

    Raises:
        VocabularyError: negative ids or ids beyond int32.
        LatticeError: not 1-D, or not integers.
    """
    arr = to_numpy(tokens)
    if arr.ndim != 1:
        raise LatticeError(f"{what} must be a 1-D sequence of token ids, got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype=np.int32)
    if arr.dtype == object or not np.issubdtype(arr.dtype, np.integer):
        raise LatticeError(f"{what} must hold integer token ids, got dtype {arr.dtype}")
    if arr.min() < 0:
        raise VocabularyError(f"{what} holds a negative token id ({int(arr.min())})")
    if arr.max() > _INT32_MAX:
        raise VocabularyError(f"{what} holds token id {int(arr.max())}, beyond int32")
    return np.ascontiguousarray(arr, dtype=np.int32)
