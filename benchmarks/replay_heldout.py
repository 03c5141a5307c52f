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


def greedy_streams(texts: dict[str, list[str]], max_tokens: int) -> dict[str, list[tuple[list[int], list[int]]]]:
    """Per domain, each request's ``(prompt ids, greedy continuation)``: SmolLM2-135M-Instruct
    float32 on vLLM's CPU engine without speculation, the request through the chat template, at
    most ``max_tokens`` new tokens."""
    import vllm

    from latticekit.loading import smollm2_hf_folder

    llm = vllm.LLM(model=str(smollm2_hf_folder()), dtype="float32", max_model_len=4096, max_num_seqs=16,
                   enforce_eager=True, seed=0)
    tok = llm.get_tokenizer()
    out = {}
    for domain, queries in texts.items():
        prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                                      tokenize=False), add_special_tokens=False) for q in queries]
        got = llm.generate([{"prompt_token_ids": list(p)} for p in prompts],
                           vllm.SamplingParams(temperature=0, max_tokens=max_tokens), use_tqdm=False)
        out[domain] = [(list(p), list(o.outputs[0].token_ids)) for p, o in zip(prompts, got)]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=40)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--out", default=str(ROOT / "results" / "replay" / "heldout_replay.json"))
    args = p.parse_args()
    from replay_drafters import drafters
    from vllm_speed import requests

    from latticekit._machine import machine
    from latticekit.eval.chain_replay import replay_chains

    streams = greedy_streams(requests(args.count, ["heldout"]), args.max_tokens)["heldout"]
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
