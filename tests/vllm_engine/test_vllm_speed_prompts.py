"""``benchmarks/vllm_speed.py`` gives every phase (concurrency level) prompts of its own and warms
up on requests no phase uses, one to start and one per level for its warm-up burst: a proposer
with a memory of past answers (vLLM's ``suffix``) never drafts a request whose answer it has
already seen."""

from __future__ import annotations

import pytest

from vllm_helpers import engine_config, vllm_speed_module


def test_phases_get_distinct_prompts():
    bench = vllm_speed_module()
    counts = bench.phase_counts([1, 4, 16], groups=3)
    assert counts == [3, 12, 48]
    for domain, texts in bench.requests(sum(counts) + 1 + len(counts), list(bench.DOMAINS)).items():
        phases, warmups = bench.deal(texts, counts)
        assert [len(p) for p in phases] == counts, domain
        assert len(warmups) == 1 + len(counts), domain  # the engines' warm-up, then each level's burst
        used = [t for p in phases for t in p] + warmups
        assert len(set(used)) == len(used), domain
        assert phases[0] == texts[:3], domain  # concurrency 1 keeps the first requests in id order
    assert bench.phase_counts([1, 16], groups=3, sustained=2) == [6, 96]  # a group of 2 x 16 kept 16 in flight


def test_a_warm_up_burst_is_numbered_copies_of_its_request_through_the_chat_template():
    from transformers import AutoTokenizer

    from vllm_helpers import model_folder

    bench = vllm_speed_module()
    tok = AutoTokenizer.from_pretrained(model_folder())
    text = "Explain what a hash table is in two sentences."
    one = bench.chat_prompt(tok, text)
    assert one == tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                          tokenize=False)
    burst = bench.burst_prompts(tok, text, 16)
    assert len(burst) == len(set(burst)) == 16  # distinct prompts: no prefix cache serves one from another
    assert burst[0] == bench.chat_prompt(tok, f"Request 1. {text}") and all(text in p for p in burst)


def test_the_report_takes_every_domains_groups_at_a_level_and_like_engines_against_each_other():
    """The report's lines over every group of a level: the geometric mean of the per-group ratios,
    a bootstrap interval that holds it (and is a point where every group agrees), the groups
    ahead; a ``--replicate`` twin over its engine."""
    import math

    bench = vllm_speed_module()
    speeds = [  # per group: tokens/s of each engine
        {"none": 100.0, "none-2": 98.0, "vllm-ngram": 90.0, "suffix": 95.0, "latticekit": 110.0},
        {"none": 120.0, "none-2": 123.0, "vllm-ngram": 130.0, "suffix": 100.0, "latticekit": 117.0},
        {"none": 80.0, "none-2": 80.0, "vllm-ngram": 70.0, "suffix": 60.0, "latticekit": 84.0},
    ]
    runs = [{"concurrency": 16, "domain": domain, "group": 0, "identical": {},
             "engines": {n: {"tokens": 1000, "seconds": 1000 / s, "accepted": 0} for n, s in group.items()}}
            for domain, group in zip(("chat", "code", "summary"), speeds)]
    runs.append({**runs[0], "concurrency": 1})  # another level: its own lines
    results = {"vllm": "0", "machine": {"cpu": "cpu", "isa": []}, "args": {}, "runs": runs}
    summary = bench.summarize(results)
    levels = bench.level_ratios(summary)
    assert sorted(levels) == [1, 16]
    got = levels[16]["latticekit"]
    assert got["none"] == pytest.approx([1.1, 117 / 120, 84 / 80])
    assert got["best"] == pytest.approx([110 / 95, 117 / 130, 84 / 70])
    assert levels[16]["none"]["twin"] == pytest.approx([0.98, 123 / 120, 1.0]) and not got["twin"]
    mean, low, high = bench.geometric_interval(got["none"])
    assert math.isclose(mean, math.prod(got["none"]) ** (1 / 3)) and low <= mean <= high
    assert bench.geometric_interval([1.02] * 4) == pytest.approx((1.02, 1.02, 1.02))
    report = bench.markdown(summary, results)
    line = next(row for row in report.splitlines() if row.startswith("| 16 | latticekit | 3 |"))
    assert f"{mean:.3f} ({low:.3f}-{high:.3f}) | 2/3 |" in line
    assert any(row.startswith("| 16 | none-2 / none | 3 |") for row in report.splitlines())
    assert not any(row.startswith("| 16 | none |") for row in report.splitlines())  # the reference: no line


def test_tcmalloc_when_asked_starts_the_run_again_with_it_and_a_missing_one_stops_the_run(
        monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """``--malloc tcmalloc`` starts the benchmark again with tcmalloc preloaded, and stops,
    naming the package, where it is not installed; ``glibc`` (the default) leaves the process
    as it is. The report names the allocator a run had."""
    import os

    bench = vllm_speed_module()
    started: list[tuple[str, list[str], dict[str, str]]] = []
    monkeypatch.setattr(os, "execve", lambda path, argv, env: started.append((path, argv, env)))
    monkeypatch.setattr(bench, "allocator", lambda: "glibc")
    bench.use_malloc("glibc")
    assert started == []
    library = tmp_path / "libtcmalloc_minimal.so.4"
    library.write_bytes(b"")
    monkeypatch.setattr(bench, "TCMALLOC", (str(tmp_path / "absent.so"), str(library)))
    monkeypatch.setenv("LD_PRELOAD", "/other.so")
    bench.use_malloc("tcmalloc")
    assert len(started) == 1 and started[0][2]["LD_PRELOAD"] == f"{library}:/other.so"
    monkeypatch.setattr(bench, "TCMALLOC", (str(tmp_path / "absent.so"),))
    with pytest.raises(SystemExit, match="libtcmalloc-minimal4"):
        bench.use_malloc("tcmalloc")
    monkeypatch.setattr(bench, "allocator", lambda: str(library))  # loaded already: nothing to do
    bench.use_malloc("tcmalloc")
    assert len(started) == 1
    results = {"vllm": "0", "machine": {"cpu": "cpu", "isa": []}, "args": {}, "malloc": str(library)}
    assert f"Allocator: {library}." in bench.markdown({}, results)


def test_the_step_log_engine_writes_its_steps_beside_its_stats(tmp_path):
    """``latticekit-steps`` (``StepLogProposer``) drafts as the n-gram proposer does and logs a
    line per step it learnt from in ``.steps.json`` whenever its stats are written."""
    import json

    import numpy as np

    from latticekit.vllm.config import ProposerConfig

    bench = vllm_speed_module()
    stats = tmp_path / "stats.json"
    proposer = bench.StepLogProposer(engine_config(), ProposerConfig(step_costs=(0.1, 0.0), stats=str(stats)))
    ids = np.zeros((1, 64), dtype=np.int32)
    text = [5, 6, 7, 8, 9] * 5
    for n in range(20, 25):
        ids[0, :n] = text[:n]
        assert proposer.propose([[text[n - 1]]], np.array([n], dtype=np.int32), ids)[0] == \
            (text * 2)[n:n + 4]
    proposer._write_stats(0.0, wait=True)
    steps = json.loads(stats.with_suffix(".steps.json").read_text())
    assert len(steps) == 4 and all(step[0] == 1 and len(step) == 7 for step in steps)  # rows, ..., emitted
    assert json.loads(stats.read_text())["errors"] == 0
