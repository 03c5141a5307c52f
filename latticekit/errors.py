"""Typed errors raised by latticekit.

Every error derives from :class:`LatticeKitError` and from the built-in exception a caller
would naturally catch (``ValueError`` for bad input, ``OSError`` for file problems), so code
that knows nothing about latticekit still handles them sensibly.
"""

from __future__ import annotations

__all__ = [
    "LatticeKitError",
    "ArpaFormatError",
    "ModelFormatError",
    "LatticeError",
    "VocabularyError",
]


class LatticeKitError(Exception):
    """Base class of every error latticekit raises on purpose."""


class ArpaFormatError(LatticeKitError, ValueError):
    """An ARPA file is malformed. The message names the file and the line.

    Attributes:
        path: the file that was being read.
        line: 1-based line number of the offending line (0 when the whole file is at fault,
            e.g. it ends early).
    """

    def __init__(self, message: str, path: str = "", line: int = 0) -> None:
        super().__init__(message)
        self.path = path
        self.line = line


class ModelFormatError(LatticeKitError, ValueError):
    """A binary model file is corrupted, truncated, or of another format or version."""


class LatticeError(LatticeKitError, ValueError):
    """A lattice, a search argument or a tensor handed to latticekit is invalid."""


class VocabularyError(LatticeKitError, ValueError):
    """A vocabulary or token id does not fit the model."""
