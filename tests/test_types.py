"""latticekit/ type-checks: mypy with the project's configuration (pyproject.toml's [tool.mypy]:
all of the package, --strict's flags on the drafting core and the public API) reports nothing.

CI runs only the test suite, so the type check is a test. mypy keeps its cache in the
repository's .mypy_cache (ignored by git): a first run takes about half a minute, later ones
about a second.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_reports_nothing() -> None:
    pytest.importorskip("mypy")
    cmd = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
           "--cache-dir", str(ROOT / ".mypy_cache")]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{' '.join(cmd[1:])} exited {done.returncode}:\n{done.stdout}{done.stderr}"
