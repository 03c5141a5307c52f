"""The draft-head tests need torch and transformers; without them the directory is skipped.

``pytest.importorskip`` raised from a conftest skips the directory when pytest collects it from
above (``pytest`` / ``pytest tests``), but is an error when the directory itself is the
argument (``pytest tests/heads``); catching it and ignoring this directory's test files
covers both, and the report header says why.
"""

from __future__ import annotations

import pytest

_missing = ""
try:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
except pytest.skip.Exception as exc:
    _missing = str(exc)
    collect_ignore_glob = ["test_*.py"]
else:
    # The test models are tiny: one intra-op thread is fastest, and immune to a busy machine.
    torch.set_num_threads(1)


def pytest_report_header() -> list[str]:
    return [f"tests/heads skipped: {_missing}"] if _missing else []
