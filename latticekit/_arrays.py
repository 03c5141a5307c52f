"""Conversion and validation of token and score arrays at the public boundary; the stamp of
the tensors a copy for inference was made from."""

from __future__ import annotations

from typing import Any

import numpy as np

from latticekit.errors import LatticeError, VocabularyError

_INT32_MAX = np.iinfo(np.int32).max
_INT32_MIN = np.iinfo(np.int32).min


def int32_ids(ids: np.ndarray, what: str = "tokens", *, negative: bool = False,
              error: type[Exception] = VocabularyError) -> np.ndarray:
    """The one rule for token ids at the core's boundary: the core holds them as int32, so an id
    outside int32 is refused, never wrapped; negative ids only where ``negative`` (padding, or
    ids the caller maps to ``<unk>``). Returns ``ids`` (any integer dtype) as contiguous int32.

    Raises:
        ``error`` (VocabularyError unless the caller names its own): an id outside the range.
    """
    if ids.size and ids.dtype != np.int32:
        low, high = int(ids.min()), int(ids.max())
        if high > _INT32_MAX or low < _INT32_MIN:
            raise error(f"{what} holds token id {high if high > _INT32_MAX else low}, which does not fit int32")
    if ids.size and not negative and int(ids.min()) < 0:
        raise error(f"{what} holds a negative token id ({int(ids.min())})")
    return np.ascontiguousarray(ids, dtype=np.int32)


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
    return int32_ids(arr, what)


def tensor_stamp(tensors: tuple[Any, ...]) -> tuple[Any, ...]:
    """What a copy of ``tensors`` (packed or stacked for inference) was made from: each one's
    data, dtype and in-place writes (``module.to`` replaces a parameter's data,
    ``load_state_dict`` writes it in place). A copy whose sources' stamp changed is stale."""
    return tuple(None if t is None else (t.data_ptr(), t.dtype, _version(t)) for t in tensors)


def _version(tensor: Any) -> int:
    try:
        return tensor._version
    except RuntimeError:  # an inference tensor keeps no version counter: its data pointer tells
        return -1
