"""The decoder tests need torch and transformers; without them the directory is skipped
(see tests/torch/conftest.py for why the skip is caught rather than raised)."""

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
    torch.set_num_threads(1)  # tiny models: one thread is fastest and immune to a busy machine


def pytest_report_header() -> list[str]:
    return [f"tests/bpd skipped: {_missing}"] if _missing else []
