"""An engine's first burst at a level: what its prefill costs before and after a warm-up burst.

Three engines in this process (vLLM's CPU build, SmolLM2-135M-Instruct float32,
``enforce_eager``, greedy): two without speculation (``A``, ``B``) and latticekit's n-gram
proposer (``L``), each warmed up on one request as ``benchmarks/vllm_speed.py`` does. Then groups
of ``--concurrency`` summary requests, each group through every engine in a rotating order, and
per engine the seconds of the step that prefills the group (the requests are added, the step
timed, the rest of the group run out untimed). With ``--warm`` every engine first takes a burst
of ``--concurrency`` numbered copies of another request, as ``vllm_speed.py`` now does before
each level's groups. Without it, the first group's prefill tells what an engine's first burst
larger than any before it costs, and whether that lands on every engine alike.

    python benchmarks/first_burst.py [--warm] --out benchmarks/results/vllm_speed/first-burst-58/cold.json  (and --warm: warm.json)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
ORDERS = [["A", "B", "L"], ["B", "L", "A"], ["L", "A", "B"], ["A", "L", "B"], ["L", "B", "A"], ["B", "A", "L"]]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--warm", action="store_true", help="a burst at the level through every engine first")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engines in this process: their steps timed here
    sys.path.insert(0, str(ROOT.parent))
    import vllm
    import vllm.envs
    from vllm.sampling_params import RequestOutputKind

    from benchmarks.vllm_speed import burst_prompts, chat_prompt, requests
    from latticekit._machine import machine
    from latticekit.loading import smollm2_hf_folder

    vllm.envs.disable_envs_cache()
    common = dict(model=str(smollm2_hf_folder()), dtype="float32", max_model_len=4096,
                  max_num_seqs=args.concurrency, enforce_eager=True, seed=0, distributed_executor_backend="uni")
    engines = {"A": vllm.LLM(**common), "B": vllm.LLM(**common),
               "L": vllm.LLM(**common, speculative_config={"method": "custom_class", "num_speculative_tokens": 8,
                                                           "model": "latticekit.vllm.NGramProposer"})}
    tok = engines["A"].get_tokenizer()
    n = args.concurrency
    texts = requests(n * len(ORDERS) + 2, ["summary"])["summary"]
    warm = vllm.SamplingParams(temperature=0, max_tokens=8)
    for llm in engines.values():
        llm.generate([chat_prompt(tok, texts[-1])], warm, use_tqdm=False)
    if args.warm:  # the burst vllm_speed.py runs before a level's groups
        burst = burst_prompts(tok, texts[-2], n)
        for llm in engines.values():
            llm.generate(burst, warm, use_tqdm=False)
    params = vllm.SamplingParams(temperature=0, max_tokens=2)
    params.output_kind = RequestOutputKind.FINAL_ONLY
    groups = []
    for g, order in enumerate(ORDERS):
        prefill: dict[str, float] = {}
        for name in order:
            engine = engines[name].llm_engine
            for i in range(n):
                engine.add_request(f"{name}-{g}-{i}", chat_prompt(tok, texts[g * n + i]), params)
            t0 = time.perf_counter()
            engine.step()
            prefill[name] = round(time.perf_counter() - t0, 3)
            while engine.has_unfinished_requests():
                engine.step()
        groups.append({"order": order, "prefill_s": prefill})
        print(f"group {g}, order {' '.join(order)}: " + ", ".join(f"{k} {v:.2f} s" for k, v in prefill.items()),
              flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": machine(), "args": vars(args), "vllm": vllm.__version__,
                               "groups": groups}, indent=1))


if __name__ == "__main__":
    main()
