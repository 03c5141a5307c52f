"""The torch adapter tests need torch and transformers; without them the directory is skipped."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
