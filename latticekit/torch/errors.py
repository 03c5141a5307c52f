"""Typed errors of the torch verification adapter.

They live here, not in :mod:`latticekit.errors`, only until that module gains them; each derives
from :class:`latticekit.errors.LatticeKitError` and from the built-in exception a caller would
naturally catch, like every other latticekit error.
"""

from __future__ import annotations

from latticekit.errors import LatticeKitError

__all__ = [
    "DraftError",
    "CacheError",
    "DeviceMismatchError",
    "UnsupportedModelError",
]


class DraftError(LatticeKitError, ValueError):
    """The drafts handed to the adapter are empty, ragged in an unreadable way, or not ids."""


class CacheError(LatticeKitError, ValueError):
    """A KV cache does not match the prefix it is said to hold, or cannot be committed."""


class DeviceMismatchError(LatticeKitError, ValueError):
    """Tensors that must meet in one forward pass live on different devices."""


class UnsupportedModelError(LatticeKitError, TypeError):
    """The target model follows neither the HF causal-LM interface nor the plain protocol."""
