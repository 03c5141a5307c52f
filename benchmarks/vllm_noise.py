"""How much of a ratio between vLLM engines is the machine's noise: group by group against lockstep.

Three engines in this process (vLLM's in-process engine core and one-process executor, as
``benchmarks/vllm_speed.py --lockstep`` runs them): two identical engines without speculation
(``a`` and ``b``) and ``empty`` (speculative decoding with a proposer that drafts nothing:
vLLM's speculative path by itself). Each group of ``--concurrency`` chat requests (the held-out
prompts of ``vllm_speed.py``'s ``chat`` domain, greedy, ``--max-tokens`` tokens, prefix caching
off so that a group can run twice) runs twice:

* **group by group**: each engine generates the whole group in turn (the order rotating), as
  ``vllm_speed.py`` runs without ``--lockstep``;
* **lockstep**: the engines take the group together, one engine step at a time
  (``vllm_speed.run_lockstep``).

Per group and mode, ``b``'s seconds over ``a``'s (identical engines: any departure from 1 is
noise) and ``empty``'s over ``a``'s (the floor). Results: ``benchmarks/results/vllm_speed/noise/``.

Usage::

    PYTHONPATH=. python benchmarks/vllm_noise.py [--concurrency 16] [--groups 6] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--groups", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--out", default=str(ROOT / "results" / "vllm_speed" / "noise"))
    args = p.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import vllm
    import vllm.envs

    from latticekit._machine import machine
    from latticekit.loading import smollm2_hf_folder
    from vllm_speed import chat_prompt, requests, run_lockstep

    vllm.envs.disable_envs_cache()
    common = dict(model=str(smollm2_hf_folder()), dtype="float32", max_model_len=4096, max_num_seqs=args.concurrency,
                  enforce_eager=True, seed=0, enable_prefix_caching=False, distributed_executor_backend="uni")
    empty = {"method": "custom_class", "model": "benchmarks.vllm_speed.EmptyProposer", "num_speculative_tokens": 8}
    engines = {"a": vllm.LLM(**common), "b": vllm.LLM(**common), "empty": vllm.LLM(**common, speculative_config=empty)}
    tok = engines["a"].get_tokenizer()
    texts = requests(args.concurrency * args.groups + 1, ["chat"])["chat"]
    prompts = [chat_prompt(tok, q) for q in texts]
    params = vllm.SamplingParams(temperature=0, max_tokens=args.max_tokens)
    for llm in engines.values():  # warm-up on a prompt no group uses
        llm.generate([prompts[-1]], vllm.SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    names = list(engines)
    rows = []
    for g in range(args.groups):
        group = prompts[g * args.concurrency:(g + 1) * args.concurrency]
        order = names[g % len(names):] + names[:g % len(names)]
        apart, outputs = {}, {}
        for name in order:
            t0 = time.perf_counter()
            done = engines[name].generate(group, params, use_tqdm=False)
            outputs[name] = [list(o.outputs[0].token_ids) for o in done]
            apart[name] = time.perf_counter() - t0
        together = run_lockstep(engines, order, group, params, len(group), {})
        if any(outputs[n] != outputs["a"] or together[n][1] != outputs["a"] for n in names):
            raise SystemExit(f"group {g}: outputs differ between engines or modes")
        rows.append({"group_by_group": apart, "lockstep": {n: s for n, (s, _) in together.items()}})
        print(f"group {g}: " + "; ".join(f"{mode} b/a {r['b'] / r['a']:.3f} empty/a {r['empty'] / r['a']:.3f}"
                                         for mode, r in rows[-1].items()), flush=True)
    summary = {}
    for mode in ("group_by_group", "lockstep"):
        same = [r[mode]["b"] / r[mode]["a"] for r in rows]
        floor = [r[mode]["a"] / r[mode]["empty"] for r in rows]  # empty x no speculation, as a speed ratio
        summary[mode] = {"b_over_a_seconds": same, "identical_spread": [min(same), max(same)],
                         "empty_x_none": floor, "empty_x_none_median": statistics.median(floor),
                         "empty_x_none_spread": [min(floor), max(floor)]}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"command": "PYTHONPATH=. python benchmarks/vllm_noise.py " + " ".join(sys.argv[1:]),
              "machine": machine(), "vllm": vllm.__version__, "args": vars(args), "groups": rows, "summary": summary}
    (out / "vllm_noise.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
