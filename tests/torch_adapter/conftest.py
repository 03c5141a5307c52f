"""The torch adapter tests need torch and transformers; without them the directory is skipped."""

from torch_skip import torch_or_skip

torch_or_skip(globals(), "tests/torch_adapter")
