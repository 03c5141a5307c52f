"""Chain drafters replayed on greedy streams of held-out instruction prompts nobody tuned on.

The prompts are ``benchmarks/vllm_speed.py``'s ``heldout`` domain (the tasks no other domain
holds: ``explain`` over code and documentation, ``summarise`` over code), the first ``--count``
in id order, through SmolLM2's chat template; each greedy stream (SmolLM2-135M-Instruct float32,
vLLM's CPU engine without speculation, ``--max-tokens`` tokens) replays each drafter exactly
(:func:`latticekit.eval.chain_replay.replay_chains`, the requests one after another):
SuffixDecoding with its defaults (at most 24 tokens, as vLLM's ``suffix`` method without
``num_speculative_tokens``) and at 8, vLLM ``ngram`` (2-4, k = 5), latticekit's chain (N = 8)
without and with its answer memory (the proposer's default). Tokens per target call and
drafting ms per step: ``benchmarks/results/replay/heldout_replay.json``.

Usage::

    PYTHONPATH=. python benchmarks/replay_heldout.py [--count 40] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=40)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--out", default=str(ROOT / "results" / "replay" / "heldout_replay.json"))
    args = p.parse_args()
    from replay_drafters import drafters
    from replay_workloads import streams_of
    from vllm_speed import requests

    from latticekit._machine import machine
    from latticekit.eval.chain_replay import replay_chains

    streams = [(s["prompt"], s["continuation"])
               for s in streams_of("heldout", requests(args.count, ["heldout"])["heldout"], args.max_tokens, batch=16)]
    factories = drafters()
    rows = []
    for name, n in [("suffix", 24), ("suffix", 8), ("vllm-ngram-2-4", 5), ("latticekit-chain", 8),
                    ("latticekit-chain+memory", 8)]:
        r = replay_chains(streams, factories[name](), n)
        rows.append({"drafter": name, "n": n, "tokens_per_call": r.tokens_per_call,
                     "draft_ms_per_step": r.draft_ms_per_step})
        print(f"{name} N={n}: {r.tokens_per_call:.3f} tokens/call, {r.draft_ms_per_step:.3f} ms/step", flush=True)
    Path(args.out).write_text(json.dumps({"command": "PYTHONPATH=. python benchmarks/replay_heldout.py "
                                          + " ".join(sys.argv[1:]), "machine": machine(), "requests": len(streams),
                                          "max_tokens": args.max_tokens, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
