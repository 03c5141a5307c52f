"""Typed errors raised by latticekit: every class of the package, in one place.

Every error derives from :class:`LatticeKitError` and from the built-in exception a caller
would naturally catch (``ValueError`` for bad input, ``OSError`` for file problems,
``MemoryError`` for a failed allocation), so code that knows nothing about latticekit still
handles them sensibly. The modules that raise them re-export the ones their users catch
(``latticekit.heads.HeadsFormatError``, ``latticekit.torch.CacheError``, ...); the classes are
these.

The C++ core throws its own exception types (``csrc/latticekit/errors.h``); the binding
translates each ``ErrorInfo::Kind`` into one class below, in one place (``raise_core_error``,
``latticekit/_cpp.pxd``).

::

    LatticeKitError
    ├── ArpaFormatError        (ValueError)   n-gram model text or tables
    ├── ModelFormatError       (ValueError)   binary n-gram model files
    ├── LatticeError           (ValueError)   lattices, search arguments, arrays
    ├── VocabularyError        (ValueError)   token ids and vocabularies
    ├── CorpusError            (ValueError)   corpora to count (latticekit.lm)
    ├── DecoderConfigError     (ValueError)   decoders, prompts, decoding arguments (latticekit.decoding)
    │   └── ProposerConfigError                the vLLM proposer's configuration (latticekit.vllm)
    ├── HeadsError             (ValueError)   draft heads
    │   ├── HeadsFormatError                  a heads file (latticekit.heads, Medusa checkpoints)
    │   └── HeadsMismatchError                heads that do not fit the model or tensors
    ├── RescorerError          (ValueError)   the neural rescorer's arguments
    │   └── RescorerFormatError               a rescorer file
    ├── DraftError             (ValueError)   drafts handed to latticekit.torch
    ├── CacheError             (ValueError)   KV caches
    ├── DeviceMismatchError    (ValueError)   tensors on different devices
    ├── UnsupportedModelError  (TypeError)    a target model latticekit.torch cannot drive
    ├── FileAccessError        (OSError)      the file system refused
    ├── ThreadStartError       (OSError)      the system refused a worker thread
    └── OutOfMemoryError       (MemoryError)  an allocation failed
"""

from __future__ import annotations

__all__ = [
    "LatticeKitError",
    "ArpaFormatError",
    "ModelFormatError",
    "LatticeError",
    "VocabularyError",
    "CorpusError",
    "DecoderConfigError",
    "ProposerConfigError",
    "HeadsError",
    "HeadsFormatError",
    "HeadsMismatchError",
    "RescorerError",
    "RescorerFormatError",
    "DraftError",
    "CacheError",
    "DeviceMismatchError",
    "UnsupportedModelError",
    "FileAccessError",
    "ThreadStartError",
    "OutOfMemoryError",
]


class LatticeKitError(Exception):
    """Base class of every error latticekit raises on purpose."""


class _InputLineError(LatticeKitError, ValueError):
    """Bad input that a file and a line locate (``path``, ``line``: see the subclasses)."""

    def __init__(self, message: str, path: str = "", line: int = 0) -> None:
        super().__init__(message)
        self.path = path
        self.line = line


class ArpaFormatError(_InputLineError):
    """An ARPA file (or the n-gram tables given to ``NGramLM.from_ngrams``, path
    ``"<tables>"``) is malformed or holds values a model may not have. The message names the
    file and the line.

    Attributes:
        path: the file that was being read.
        line: 1-based line number of the offending line (0 when the whole file is at fault,
            e.g. it ends early).
    """


class ModelFormatError(LatticeKitError, ValueError):
    """A binary model file is corrupted, truncated, or of another format or version."""


class LatticeError(LatticeKitError, ValueError):
    """A lattice, a search argument or a tensor handed to latticekit is invalid."""


class VocabularyError(LatticeKitError, ValueError):
    """A vocabulary or token id does not fit the model."""


class CorpusError(_InputLineError):
    """A corpus cannot be counted: it is empty, undecodable, or has ids out of range.

    Attributes:
        path: the file being read ("" for in-memory input).
        line: 1-based line number of the offending line (0 when the whole input is at fault).
    """


class DecoderConfigError(LatticeKitError, ValueError):
    """A decoder configuration, a prompt or a decoding argument is invalid."""


class ProposerConfigError(DecoderConfigError):
    """latticekit's vLLM proposer is configured wrongly: an unknown key, a bad value or a
    missing file (raised when the engine starts, not at its first step)."""


class HeadsError(LatticeKitError, ValueError):
    """Draft heads are missing, or cannot be read or used; the subclasses say which."""


class HeadsFormatError(HeadsError):
    """A heads file (latticekit's or a Medusa checkpoint) is missing, truncated, damaged, or
    not a heads file."""


class HeadsMismatchError(HeadsError):
    """Heads do not fit the model or the tensors they are given (hidden size, vocabulary,
    model), or return logits of another shape than the decoder needs."""


class RescorerError(LatticeKitError, ValueError):
    """A rescorer was built or called with arguments that do not fit it (sizes, positions,
    vocabulary)."""


class RescorerFormatError(RescorerError):
    """A rescorer file is missing, damaged, or not a latticekit rescorer file."""


class DraftError(LatticeKitError, ValueError):
    """The drafts handed to the torch adapter are empty, ragged in an unreadable way, or not ids."""


class CacheError(LatticeKitError, ValueError):
    """A KV cache does not match the prefix it is said to hold, or cannot be committed."""


class DeviceMismatchError(LatticeKitError, ValueError):
    """Tensors that must meet in one forward pass live on different devices."""


class UnsupportedModelError(LatticeKitError, TypeError):
    """The target model follows neither the HF causal-LM interface nor the plain protocol."""


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
