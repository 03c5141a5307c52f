"""Writing files so that readers never see half of one."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Union


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
