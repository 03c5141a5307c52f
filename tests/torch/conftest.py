"""The torch adapter tests need torch and transformers; without them the directory is skipped."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

# The test models are tiny: one intra-op thread is fastest, and immune to a busy machine.
torch.set_num_threads(1)
