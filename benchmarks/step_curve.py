"""A vLLM engine step's seconds against the draft tokens it verifies, per batch size.

vLLM's CPU build with SmolLM2-135M-Instruct (float32, ``enforce_eager``), one engine in this
process whose ``custom_class`` proposer (:class:`FixedProposer`) drafts exactly ``d`` tokens a
step, spread over the batch's rows (any tokens: the step verifies them whatever they are). ``d``
is cycled step by step (0 to ``--most``, in a stride that visits every value), so that machine
noise hits every ``d`` alike, and each step is timed under the ``d`` whose drafts it verified
(those the last step's call made). Every row keeps going (``ignore_eos``) until the level has
its steps. The median step per ``d`` and batch size is what
:class:`latticekit.drafting.chains.StepCurve` learns in the proposer (``step_curve``): where it
is not one line, a line prices the draft tokens wrongly.

    python benchmarks/step_curve.py --rows 1 4 16 --most 16 --out benchmarks/results/step_curve/NAME
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
#: the drafts each call makes (set before every step)
DRAFTS = {"d": 0}


class FixedProposer:
    """A ``custom_class`` proposer that drafts ``DRAFTS["d"]`` tokens a step, row after row (each
    row's last token repeated)."""

    def __init__(self, vllm_config: Any) -> None:
        pass

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        pass

    def propose(self, sampled_token_ids: list[list[int]], *args: Any, **kwargs: Any) -> list[list[int]]:
        rows = len(sampled_token_ids)
        out: list[list[int]] = [[] for _ in range(rows)]
        for j in range(DRAFTS["d"]):
            row = sampled_token_ids[j % rows]
            if row:
                out[j % rows].append(row[-1])
        return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--most", type=int, default=16, help="the most draft tokens a step (0 to this many)")
    p.add_argument("--k", type=int, default=8, help="num_speculative_tokens (a row's longest chain)")
    p.add_argument("--steps", type=int, default=40, help="timed steps per count of draft tokens and batch size")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process: its step is timed here
    sys.path.insert(0, str(ROOT.parent))
    import vllm
    import vllm.envs
    from vllm.sampling_params import RequestOutputKind

    from benchmarks import step_curve  # the module vLLM imports the proposer from (not this __main__)
    from benchmarks.vllm_speed import chat_prompt, requests
    from latticekit._machine import machine
    from latticekit.loading import smollm2_hf_folder

    vllm.envs.disable_envs_cache()
    llm = vllm.LLM(model=str(smollm2_hf_folder()), dtype="float32", max_model_len=4096, max_num_seqs=max(args.rows),
                   enforce_eager=True, seed=0, distributed_executor_backend="uni",
                   speculative_config={"method": "custom_class", "model": "benchmarks.step_curve.FixedProposer",
                                       "num_speculative_tokens": args.k})
    tok = llm.get_tokenizer()
    prompts = [chat_prompt(tok, q) for q in requests(max(args.rows), ["chat"])["chat"]]
    counts = list(range(args.most + 1))
    stride = next(s for s in range(7, 100) if math.gcd(s, len(counts)) == 1)
    engine = llm.llm_engine
    results: dict[str, Any] = {"machine": machine(), "args": vars(args), "vllm": vllm.__version__, "median_ms": {}}
    for rows in args.rows:
        params = vllm.SamplingParams(temperature=0, max_tokens=args.steps * len(counts) + 8, ignore_eos=True)
        params.output_kind = RequestOutputKind.FINAL_ONLY
        ids = [f"rows{rows}-{i}" for i in range(rows)]
        drafts = step_curve.DRAFTS
        drafts["d"] = 0
        for i, request in enumerate(ids):
            engine.add_request(request, prompts[i], params)
        for _ in range(3):  # the prompts' prefill
            engine.step()
        times: dict[int, list[float]] = {d: [] for d in counts}
        made: list[int] = []
        for n in range(args.steps * len(counts) + 1):
            drafts["d"] = counts[(n * stride) % len(counts)]
            t0 = time.perf_counter()
            engine.step()
            seconds = time.perf_counter() - t0
            if made:  # this step verified the drafts the last step's call made
                times[made[-1]].append(seconds)
            made.append(drafts["d"])
        engine.abort_request(ids)
        while engine.has_unfinished_requests():
            engine.step()
        results["median_ms"][str(rows)] = {str(d): round(1e3 * statistics.median(v), 2) for d, v in times.items()}
        print(f"rows {rows}: " + ", ".join(f"{d}: {ms}" for d, ms in results["median_ms"][str(rows)].items()),
              flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "step_curve.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
