"""What a draft token costs a vLLM step, by the request's context length.

latticekit's vLLM proposer priced a draft token at the slope of its fit of the engine's step
seconds, ``a + b * query tokens``: one price per load, whatever the requests' lengths. This
measured that it is not so (it now fits ``a + b * tokens + c * keys``,
``latticekit.drafting.chains.BatchCosts``). One engine (vLLM's CPU
build, SmolLM2-135M-Instruct float32, in this process) with a ``custom_class`` proposer that
drafts K copies of one token per request at every step (:class:`FixedProposer`; the drafts are
rejected, so every step emits one token and the steps are as many as the tokens), decoding
``--new`` tokens after a prompt of L tokens (windows of docs/speed.md), for K in
``--drafts`` and L in ``--contexts``; the K values rotate within each round, ``--rounds``
rounds. Per (L, K): the median milliseconds per step and the spread over rounds. With
``--drafting-rows``, only the batch's first M rows draft, for each M given: whether a step in
which a few rows draft pays more than those rows' tokens (a batch of decodes and
multi-token queries may take another path through the engine than decodes alone). With
``--profile``, every case then runs ``--profile`` more times under ``cProfile`` (after the timed
rounds, which it never slows), and the report adds, per drafting case, the functions and kernels
whose own time per step grew most over the case that drafts nothing (where a draft token's
milliseconds go; ``cProfile`` slows the Python around the kernels, not the kernels).

Usage::

    PYTHONPATH=. python benchmarks/vllm_draft_cost.py [--concurrency 1] [--out DIR]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.vllm_speed import EmptyProposer

ROOT = Path(__file__).resolve().parent
#: Draft tokens per drafting request at the next step, and the rows that draft (the batch's
#: first; None: every row). Set between generate calls; the engine runs here.
DRAFT: list[Any] = [0, None]


class FixedProposer(EmptyProposer):
    """A ``custom_class`` proposer that drafts :data:`DRAFT` copies of one token per drafting request."""

    def propose(self, sampled_token_ids: list[list[int]], *args: Any, **kwargs: Any) -> list[list[int]]:
        k, rows = DRAFT
        return [[17] * k if rows is None or i < rows else [] for i in range(len(sampled_token_ids))]


def own_time_growth(profile: cProfile.Profile, base: cProfile.Profile, steps: int,
                    top: int = 12) -> list[tuple[str, float]]:
    """The ``top`` functions and kernels whose own time (``tottime``) per step grew most from
    ``base`` to ``profile``, both over ``steps`` engine steps: ``(name, ms per step)``."""
    def own(p: cProfile.Profile) -> dict[str, float]:
        return {f"{f.split('site-packages/')[-1]}:{line}:{name}": row[2]
                for (f, line, name), row in pstats.Stats(p).stats.items()}  # type: ignore[attr-defined]
    ours, theirs = own(profile), own(base)
    grown = sorted(((ours.get(k, 0.0) - theirs.get(k, 0.0)) / steps * 1e3, k) for k in set(ours) | set(theirs))
    return [(name, round(ms, 3)) for ms, name in grown[::-1][:top]]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--contexts", type=int, nargs="+", default=[64, 512, 1536])
    p.add_argument("--drafts", type=int, nargs="+", default=[0, 1, 2, 4, 8])
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--drafting-rows", type=int, nargs="+", default=None,
                   help="only the batch's first M rows draft, for each M (default: every row)")
    p.add_argument("--new", type=int, default=48)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="after the timed rounds, N more per case under cProfile: where each case's extra "
                        "milliseconds go")
    p.add_argument("--out", default=str(ROOT / "results" / "vllm_speed" / "draft-token-cost"))
    args = p.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process: DRAFT reaches its proposer
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB (unset: most of the machine's memory)
    import vllm

    from benchmarks import vllm_draft_cost as engine_side  # the module vLLM imports the proposer from
    from latticekit._machine import machine
    from latticekit.loading import smollm2_hf_folder

    llm = vllm.LLM(model=str(smollm2_hf_folder()), dtype="float32", max_model_len=4096,
                   max_num_seqs=max(16, args.concurrency), enforce_eager=True, seed=0,
                   distributed_executor_backend="uni",
                   speculative_config={"method": "custom_class", "model": "benchmarks.vllm_draft_cost.FixedProposer",
                                       "num_speculative_tokens": max(args.drafts)})
    ids = llm.get_tokenizer()((ROOT.parent / "docs" / "speed.md").read_text())["input_ids"]
    if len(ids) < max(args.contexts) + 7 * args.concurrency:
        raise SystemExit(f"docs/speed.md holds {len(ids)} tokens: too few for these contexts")
    params = vllm.SamplingParams(max_tokens=args.new, ignore_eos=True, temperature=0)
    rows: list[dict[str, Any]] = []
    profiled: list[dict[str, Any]] = []
    drafting = args.drafting_rows or [args.concurrency]
    cases = [(0, 0)] + [(k, m) for m in drafting for k in args.drafts if k]
    for context in args.contexts:
        prompts = [{"prompt_token_ids": ids[7 * i: 7 * i + context]} for i in range(args.concurrency)]
        llm.generate(prompts, params, use_tqdm=False)  # warm-up: the prompts' prefix cache and shapes
        ms: dict[tuple[int, int], list[float]] = {case: [] for case in cases}
        for _ in range(args.rounds):
            for k, m in cases:
                engine_side.DRAFT[:] = [k, m]
                t0 = time.perf_counter()
                llm.generate(prompts, params, use_tqdm=False)
                ms[k, m].append((time.perf_counter() - t0) / args.new * 1e3)
        if args.profile:
            profiles = {case: cProfile.Profile() for case in cases}
            for _ in range(args.profile):
                for k, m in cases:
                    engine_side.DRAFT[:] = [k, m]
                    profiles[k, m].enable()
                    llm.generate(prompts, params, use_tqdm=False)
                    profiles[k, m].disable()
            steps = args.profile * args.new
            for k, m in cases[1:]:
                grown = own_time_growth(profiles[k, m], profiles[0, 0], steps)
                profiled.append({"context": context, "draft": k, "drafting_rows": min(m, args.concurrency),
                                 "ms_per_step_grown": grown})
                print(json.dumps(profiled[-1]), flush=True)
        base = statistics.median(ms[0, 0])
        for k, m in cases:
            median = statistics.median(ms[k, m])
            row = {"context": context, "draft": k, "drafting_rows": min(m, args.concurrency) if k else 0,
                   "ms_per_step": round(median, 2), "spread": [round(min(ms[k, m]), 2), round(max(ms[k, m]), 2)],
                   "ms_per_draft_token": round((median - base) / (k * min(m, args.concurrency)), 2) if k else None}
            rows.append(row)
            print(json.dumps(row), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"args": vars(args), "vllm": vllm.__version__, "machine": machine(), "rows": rows,
              "profiled": profiled}
    (out / "draft_cost.json").write_text(json.dumps(report, indent=1) + "\n")
    title = f"# What a draft token costs a vLLM step, by context (vLLM {vllm.__version__}, {report['machine']['cpu']})"
    lines = [title,
             "", f"`{json.dumps(vars(args))}`", "",
             f"{args.concurrency} request(s), every draft rejected; ms per step: median over {args.rounds} rounds "
             "(lowest-highest); ms per draft token: over the step with no draft.", "",
             "| context tokens | draft tokens a drafting row | drafting rows | ms/step | spread | ms per draft token |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['context']} | {r['draft']} | {r['drafting_rows']} | {r['ms_per_step']} | "
              f"{r['spread'][0]}-{r['spread'][1]} | "
              f"{'-' if r['ms_per_draft_token'] is None else r['ms_per_draft_token']} |" for r in rows]
    for case in profiled:
        lines += ["", f"Context {case['context']}, {case['draft']} draft token(s) on {case['drafting_rows']} row(s): "
                  "own time per step grown over no draft (ms, under cProfile)", "",
                  "| ms per step | function or kernel |", "|---|---|"]
        lines += [f"| {ms_grown} | `{name}` |" for name, ms_grown in case["ms_per_step_grown"]]
    (out / "draft_cost.md").write_text("\n".join(lines) + "\n")
    llm.llm_engine.engine_core.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
