"""Writing files so that readers never see half of one, and reading latticekit's tagged
safetensors files with every failure as one typed error."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Union


@contextmanager
def atomic_write(path: Union[str, os.PathLike]) -> Iterator[IO[bytes]]:
    """A binary file to write in place of ``path``.

    The data goes to a temporary file in the same folder; when the block ends without an error
    the file is flushed, synced, made readable like an ordinary file (0644; ``mkstemp`` makes
    0600) and renamed over ``path``. On any error the temporary file is removed and ``path`` is
    left as it was.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


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
