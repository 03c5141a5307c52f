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
    "FileAccessError",
    "ThreadStartError",
    "OutOfMemoryError",
]


class LatticeKitError(Exception):
    """Base class of every error latticekit raises on purpose."""


class ArpaFormatError(LatticeKitError, ValueError):
    """An ARPA file (or the n-gram tables given to ``NGramLM.from_ngrams``, path
    ``"<tables>"``) is malformed or holds values a model may not have. The message names the
    file and the line.

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


class _SystemRefusal(LatticeKitError, OSError):
    """An OSError of latticekit's own, built from a message and an errno (0: none)."""

    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(code or None, message)

    def __str__(self) -> str:
        return str(self.strerror)


class FileAccessError(_SystemRefusal):
    """A file cannot be opened, read, written or replaced, or its path cannot name a file (a
    folder, a NUL byte): a problem of the file system, not of the file's content.

    Attributes:
        errno: the operating system's error number, or None.
        path: the file.
    """

    def __init__(self, message: str, path: str = "", code: int = 0) -> None:
        super().__init__(message, code)
        self.path = path


class ThreadStartError(_SystemRefusal):
    """The operating system refused a worker thread (a memory, thread or pids limit); every
    thread that had started was joined. Use fewer threads.

    Attributes:
        errno: the operating system's error number, or None.
    """


class OutOfMemoryError(LatticeKitError, MemoryError):
    """An allocation failed: the model, lattice batch or output asked for is too large for
    the memory available."""
