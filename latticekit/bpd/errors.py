"""Typed errors of the blockwise parallel decoders.

Each derives from :class:`latticekit.errors.LatticeKitError` and from the built-in exception a
caller would naturally catch, like every other latticekit error.
"""

from __future__ import annotations

from latticekit.errors import LatticeKitError

__all__ = ["DecoderConfigError", "HeadsError"]


class DecoderConfigError(LatticeKitError, ValueError):
    """A decoder configuration, a prompt or a decoding argument is invalid."""


class HeadsError(LatticeKitError, ValueError):
    """Draft heads returned logits of the wrong shape, or do not fit the target model."""
