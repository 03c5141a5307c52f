"""Skip a test directory when torch or transformers is missing.

``pytest.importorskip`` raised from a conftest skips the directory when pytest collects it from
above (``pytest`` / ``pytest tests``), but is an error when the directory itself is the
argument (``pytest tests/torch_adapter``); catching it and ignoring the directory's test files covers
both, and the report header says why.
"""

from __future__ import annotations

import pytest


def torch_or_skip(namespace: dict, what: str) -> None:
    """Sets up a conftest's ``namespace``: one torch thread, or ignore its tests."""
    try:
        torch = pytest.importorskip("torch")
        pytest.importorskip("transformers")
    except pytest.skip.Exception as exc:
        missing = str(exc)
        namespace["collect_ignore_glob"] = ["test_*.py"]
        namespace["pytest_report_header"] = lambda: [f"{what} skipped: {missing}"]
    else:
        # The test models are tiny: one intra-op thread is fastest, and immune to a busy machine.
        torch.set_num_threads(1)
