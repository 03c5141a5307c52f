"""Writing files so that readers never see half of one, and reading latticekit's tagged
safetensors files with every failure as one typed error."""

from __future__ import annotations

import errno
import json
import os
import secrets
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Optional, Union, cast

from latticekit.errors import FileAccessError, LatticeKitError


def checked_path(path: Union[str, bytes, os.PathLike]) -> str:
    """``path`` as a str, refused when it cannot name a file.

    Raises:
        FileAccessError: the path holds a NUL byte (the system would cut it there).
        TypeError: not a str, bytes or path-like object.
    """
    text = os.fsdecode(os.fspath(path))
    if "\0" in text:
        raise FileAccessError(f"{text!r}: a file path cannot hold a NUL byte", text, errno.EINVAL)
    return text


def file_error(exc: OSError, action: str, path: str) -> FileAccessError:
    """The typed error for an OSError met while doing ``action`` ("read", "write") on path."""
    return FileAccessError(f"cannot {action} {path}: {exc.strerror or exc}", path, exc.errno or 0)


def read_bytes(path: Union[str, os.PathLike]) -> bytes:
    """The contents of a file.

    Raises:
        FileAccessError: it cannot be read (missing, a folder, no permission, ...).
    """
    path = checked_path(path)
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise file_error(exc, "read", path) from exc


def _temp_prefix(name: str) -> str:
    """Temporary files for the destination ``name`` are ``.{name}.lk-{host}-{pid}-{random}.tmp``."""
    return f".{name}.lk-"


def _remove_dead_writers_temps(folder: str, name: str) -> None:
    """Removes the temporary files that writers of ``name`` on this machine left behind when
    they were killed: those whose process no longer exists."""
    prefix, host = _temp_prefix(name), os.uname().nodename
    try:
        entries = [e for e in os.listdir(folder) if e.startswith(prefix) and e.endswith(".tmp")]
    except OSError:
        return
    for entry in entries:
        parts = entry[len(prefix):-len(".tmp")].rsplit("-", 2)
        if len(parts) != 3 or parts[0] != host or not parts[1].isdigit():
            continue
        try:
            os.kill(int(parts[1]), 0)
        except ProcessLookupError:  # its writer is gone
            try:
                os.unlink(os.path.join(folder, entry))
            except OSError:
                pass
        except OSError:  # alive, another user's
            pass


@contextmanager
def atomic_write(path: Union[str, os.PathLike]) -> Iterator[IO[bytes]]:
    """A binary file to write in place of ``path``.

    The data goes to a temporary file in the destination's folder; when the block ends
    without an error the file is flushed, synced, given the destination's permission bits
    (or, for a new destination, those of any new file: 0666 less the umask) and renamed over
    the destination in one step. A symlink at ``path`` stays: the file it points to is
    replaced. On any error the temporary file is removed and the destination is untouched;
    a temporary file left by a writer that was killed is removed by the next write to the
    same destination on the same machine.

    Raises:
        FileAccessError: the file cannot be written (an ``OSError``).
    """
    path = checked_path(path)
    target = os.path.realpath(path)
    folder, name = os.path.split(target)
    temp = os.path.join(folder, f"{_temp_prefix(name)}{os.uname().nodename}-{os.getpid()}-"
                                f"{secrets.token_hex(6)}.tmp")
    created = False
    try:
        _remove_dead_writers_temps(folder, name)
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        created = True
        with os.fdopen(fd, "wb") as f:
            try:
                os.fchmod(f.fileno(), os.stat(target).st_mode & 0o7777)
            except FileNotFoundError:
                pass
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, target)
    except BaseException as exc:
        if created:
            try:
                os.unlink(temp)
            except OSError:
                pass
        if isinstance(exc, OSError) and not isinstance(exc, LatticeKitError):
            raise file_error(exc, "write", path) from exc
        raise


class LatestWriter:
    """Writes the newest of the contents it is handed to ``path`` (:func:`atomic_write`) on a
    thread of its own, so that the caller does not wait for the disk: an atomic write, its
    fsync included, took 0.9-1.2 ms on the 2-core EPYC, and the vLLM proposer's stats file,
    written in its engine's step about once a step in ``benchmarks/vllm_speed.py --lockstep``,
    cost it 2.8% at 16 requests. Contents handed while a write runs replace one another: only
    the newest is written next. A failed write's error is kept, and the thread goes on: the
    caller takes the errors on its own thread (:meth:`failures`), where it counts them.

    Args:
        path: the file.
    """

    def __init__(self, path: Union[str, os.PathLike]) -> None:
        self.path = path
        self._changed = threading.Condition()
        self._failures: list[BaseException] = []
        self._data: Optional[bytes] = None
        self._handed = self._written = 0  # the newest contents handed, and written (or failed), by number
        self._thread: Optional[threading.Thread] = None

    def put(self, data: bytes, wait: Optional[float] = None) -> bool:
        """Hands ``data`` to the writer; with ``wait``, waits at most that many seconds for the
        writer to be done with it or with newer contents (written, or its error kept for
        :meth:`failures`). Returns whether it was, or False without ``wait``."""
        with self._changed:
            self._handed += 1
            self._data, handed = data, self._handed
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="latticekit-writer", daemon=True)
                self._thread.start()
            self._changed.notify_all()
            return wait is not None and self._changed.wait_for(lambda: self._written >= handed, wait)

    def failures(self) -> list[BaseException]:
        """The errors of the writes that failed since the last call, oldest first (taken:
        the next call returns only newer ones)."""
        with self._changed:
            failures, self._failures = self._failures, []
        return failures

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._data is not None)
                data, handed, self._data = cast(bytes, self._data), self._handed, None
            failure: Optional[BaseException] = None
            try:
                with atomic_write(self.path) as f:
                    f.write(data)
            except Exception as exc:  # the caller's to count, on its thread; this one goes on
                failure = exc
            with self._changed:
                if failure is not None:
                    self._failures.append(failure)
                self._written = handed
                self._changed.notify_all()


def read_tagged_safetensors(path: Union[str, os.PathLike], format_name: str, version: int, what: str,
                            error: type[Exception]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The header and tensors of a safetensors file that latticekit wrote with its JSON header
    under the metadata key ``"latticekit"`` (heads, rescorers).

    Args:
        path: the file.
        format_name, version: what the header's ``format`` and ``version`` must say.
        what: the kind of file, for messages ("heads", "rescorer").
        error: the exception type every failure is raised as.

    Raises:
        error: the file is missing, unreadable, damaged, not of this format or of another version.
    """
    from safetensors.torch import load as st_load

    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise error(f"cannot read {what} file {path}: {exc}") from exc
    try:
        tensors = st_load(data)
        # safetensors.torch.load drops the metadata; it is JSON in the 8-byte-length-prefixed header.
        header_len = int.from_bytes(data[:8], "little")
        ours = (json.loads(data[8:8 + header_len]).get("__metadata__") or {}).get("latticekit")
        header = None if ours is None else json.loads(ours)
    except Exception as exc:  # safetensors raises its own error types (and OverflowError, ...)
        raise error(f"{path} is not a readable {what} file: {type(exc).__name__}: {exc}") from exc
    if not isinstance(header, dict) or header.get("format") != format_name:
        raise error(f"{path} is not a latticekit {what} file")
    if header.get("version") != version:
        raise error(f"{path} has {what} format version {header.get('version')}, this latticekit reads {version}")
    return header, tensors


def check_weights(path: Union[str, os.PathLike], tensors: Mapping[str, Any],
                  shapes: Mapping[str, tuple[int, ...]], error: type[Exception],
                  integer: tuple[str, ...] = ()) -> None:
    """Checks the tensors of a weights file against what its header implies, before anything
    is allocated from the header: exactly the names of ``shapes``, each of that shape, and of
    a floating-point dtype of at least 16 bits with only finite values (the names in
    ``integer``: a plain integer dtype instead).

    Raises:
        error: a tensor is missing, extra, of another shape or dtype, or holds NaN or inf.
    """
    import torch

    names, expected = set(tensors), set(shapes)
    if names != expected:
        missing, extra = sorted(expected - names)[:3], sorted(names - expected)[:3]
        raise error(f"{path}: tensors do not match the header (missing {missing}, unexpected {extra})")
    floats = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    integers = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
    for name, tensor in tensors.items():
        if tuple(tensor.shape) != tuple(shapes[name]):
            raise error(f"{path}: tensor {name!r} has shape {tuple(tensor.shape)}, the header implies "
                        f"{tuple(shapes[name])}")
        allowed = integers if name in integer else floats
        if tensor.dtype not in allowed:
            raise error(f"{path}: tensor {name!r} has dtype {tensor.dtype}, expected one of "
                        f"{', '.join(str(d) for d in allowed)}")
        if tensor.dtype in floats and not bool(torch.isfinite(tensor).all()):
            raise error(f"{path}: tensor {name!r} holds NaN or infinite values")
