"""``benchmarks/gpu_speed.py``'s CPU path end to end on a tiny random model: every part runs, the
decoders' tokens are compared with HF greedy's, and the report says what it skipped and why.
(The GPU path is the same code with ``--device cuda``; docs/gpu.md says how to run it there.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_the_cpu_path_runs_and_checks_tokens(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # generate measures its step costs here
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import gpu_speed

    import latticekit.torch.prepare as prepare

    # the preparation a CUDA device gets (SDPA without cuDNN), here on the CPU: the cost part's
    # second probe, under torch's own choice, runs as it would on a GPU
    monkeypatch.setattr(prepare, "sdpa_backends", lambda *a, **k: prepare.CUDA_SDPA_BACKENDS)

    threads = torch.get_num_threads()
    out = tmp_path / "report"
    try:
        assert gpu_speed.main(["--device", "cpu", "--threads", "1", "--model", "tiny-llama", "--prompts-per-domain", "2",
                               "--new-tokens", "12", "--groups", "2", "--shapes", "tiny", "--cost-prefix", "24",
                               "--cost-steps", "6", "--cost-repeats", "2", "--rescore-iters", "2",
                               "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    report = json.loads(out.with_suffix(".json").read_text())
    acc = report["acceptance"]
    assert acc["groups"] == 2 and acc["domains"] == {"synthetic": 2}
    assert set(acc["decoders"]) == {"hf-greedy", "hf-pld", "lk"}
    assert "CPU" in acc["skipped"]["hf-static-compile"] and "SmolLM2" in acc["skipped"]["lk+4gram / lk+heads"]
    for name, figures in acc["decoders"].items():
        assert figures["identical_to_hf_greedy"] == "4/4", (name, acc["mismatches"])
        assert len(figures["tokens_per_s_groups"]) == 2 and figures["tokens_per_s"] > 0
    assert acc["decoders"]["hf-greedy"]["vs_hf_greedy"] == 1.0
    steps = acc["decoders"]["lk"]["steps"]["synthetic"]  # where latticekit's time went
    assert steps["calls"] > 0 and steps["tokens_per_call"] >= 1.0 and steps["model_ms_per_call"] > 0
    assert "steps" not in acc["decoders"]["hf-greedy"]
    assert acc["decoders"]["lk"]["domains"]["synthetic"]["vs_hf-greedy"] > 0
    costs = report["costs"]["tiny"]
    assert set(costs["probe_ms"]) == {str(n) for n in gpu_speed.TREE_SIZES}
    assert costs["hf_plain_step_ms"]["same_lengths_again"] > 0 and costs["lk_over_hf_plain_step"] > 0
    assert "SDPA flash/efficient/math" in costs["prepared"]
    default = costs["torch_default_attention"]
    assert set(default["probe_ms"]) == set(costs["probe_ms"]) and default["probe_vs_lk_step_again"] > 0
    assert {(r["vocab"], r["h"]) for r in report["rescore"]} >= {(49152, 4), (128256, 8)}
    assert report["machine"]["device"] == "cpu" and report["machine"]["threads"] == 1
    text = out.with_suffix(".md").read_text()
    assert "| lk |" in text and "hf-static-compile: skipped" in text and "## Step costs" in text
    assert "Under torch's own SDPA choice" in text


def test_a_subset_of_decoders_runs_beside_hf_greedy(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import gpu_speed

    threads = torch.get_num_threads()
    out = tmp_path / "report"
    common = ["--device", "cpu", "--threads", "1", "--model", "tiny-llama", "--prompts-per-domain", "1",
              "--new-tokens", "6", "--groups", "2", "--parts", "acceptance", "--out", str(out)]
    try:
        with pytest.raises(SystemExit, match="no decoder"):
            gpu_speed.main(common + ["--decoders", "lk+nothing"])
        assert gpu_speed.main(common + ["--decoders", "lk"]) == 0
    finally:
        torch.set_num_threads(threads)
    acc = json.loads(out.with_suffix(".json").read_text())["acceptance"]
    assert set(acc["decoders"]) == {"hf-greedy", "lk"}  # the baseline always runs
    assert "vs_hf_pld" not in acc["decoders"]["lk"]
    assert "| lk |" in out.with_suffix(".md").read_text()


def test_a_run_cut_short_keeps_the_groups_it_finished(tmp_path: Path, monkeypatch: Any) -> None:
    """The report is written after every acceptance group: a run stopped at its time limit (a
    GPU lease's) keeps what it measured."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import gpu_speed

    def log(msg: str) -> None:
        if msg.startswith("group 2"):
            raise KeyboardInterrupt  # the limit strikes as the second group ends

    monkeypatch.setattr(gpu_speed, "log", log)
    threads = torch.get_num_threads()
    out = tmp_path / "report"
    try:
        with pytest.raises(KeyboardInterrupt):
            gpu_speed.main(["--device", "cpu", "--threads", "1", "--model", "tiny-llama", "--prompts-per-domain", "1",
                            "--new-tokens", "6", "--groups", "3", "--parts", "acceptance", "--decoders", "lk",
                            "--out", str(out)])
    finally:
        torch.set_num_threads(threads)
    acc = json.loads(out.with_suffix(".json").read_text())["acceptance"]
    assert acc["groups"] == 1 and acc["decoders"]["lk"]["identical_to_hf_greedy"] == "1/1"
    assert "| lk |" in out.with_suffix(".md").read_text()


def test_write_prompts_is_what_the_committed_file_holds() -> None:
    """The committed prompts: token ids a GPU machine decodes without a tokenizer."""
    data = json.loads((BENCHMARKS / "results" / "gpu_speed" / "prompts.json").read_text())
    assert set(data["domains"]) == {"instruction", "code"}
    for prompts in data["domains"].values():
        assert len(prompts) >= 6
        assert all(p["ids"] and all(isinstance(t, int) and 0 <= t < 49152 for t in p["ids"]) for p in prompts)
    assert all(len(p["ids"]) == 256 and p["eos"] is None for p in data["domains"]["code"])
    assert all(p["eos"] is not None for p in data["domains"]["instruction"])
