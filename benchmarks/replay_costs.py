"""Chain drafters replayed at one request with an engine's step costs: tokens per second, in minutes.

What a lockstep run of ``benchmarks/vllm_speed.py`` measures at one request in half an hour,
replayed without a model in a few minutes: each request's greedy stream (SmolLM2-135M-Instruct,
float32, vLLM's CPU engine without speculation, batched; cached in
``benchmarks/cache/replay_streams/``) replays every drafter exactly
(:func:`latticekit.eval.chain_replay.replay_chains`), the requests one after another as one
engine serves them, and a step of ``n`` query tokens (the row's last token and its drafts) is
charged ``a + b n`` seconds, ``(a, b)`` the engine's step costs, plus the drafter's own seconds
(measured here). A request without speculation takes ``a + b`` a token. The default costs are
vLLM 0.32's CPU engine with SmolLM2 on the 2-core EPYC at one request, as the proposer fitted
them in the lockstep runs (``benchmarks/results/vllm_speed/lockstep`` and ``heldout-lockstep``:
``load_step_costs`` of bucket 1, a = 0.080 and 0.089 s, b = 4.9 and 5.9 ms).

The prompts are ``vllm_speed.py``'s domains (``code``, ``summary`` and ``chat`` to tune on,
``heldout`` to report on), the first ``--count`` of each; ``--group`` requests make one group,
and a ratio is reported as the median of the groups' ratios and their range.

Drafters:

* ``suffix``: SuffixDecoding's cache as vLLM's ``suffix`` method calls it, with its defaults (at
  most ``--suffix-k`` tokens; ``benchmarks/replay_drafters.py``'s ``Suffix``);
* ``vllm-ngram``: vLLM's ``ngram`` function, ``prompt_lookup_min``/``max`` 2/4, k = 5 (as
  ``vllm_speed.py`` runs it);
* ``latticekit``: its vLLM proposer with its defaults, ``k`` = ``--k``, learning the step
  costs from the simulated engine's clock as it learns them from an engine's
  (:class:`latticekit.vllm.replay.ProposerChains`); ``--variant NAME=JSON`` adds one with
  other settings;
* ``latticekit-given``: the same with the step costs given (``step_costs``): what learning
  them costs;
* ``latticekit-one-model``: ``latticekit`` with one acceptance model for every candidate
  source (the proposer before per-source estimates), for the A/B.

What it leaves out: the engine's own overhead beyond ``a + b n`` (the floor of
``vllm_speed.py``: 1-2 %), the prefill, batching (one request), and the memory's last step of
each answer (:class:`~latticekit.vllm.replay.ProposerChains`).

Usage::

    PYTHONPATH=. python benchmarks/replay_costs.py [--domains code summary chat heldout] [--count 60]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")

VOCAB = 49152  # SmolLM2's


def drafters(k: int, suffix_k: int, costs: tuple[float, float], variants: list[str]) -> dict[str, tuple[Any, int]]:
    """Per drafter, its factory and its longest chain."""
    from replay_drafters import Suffix, VllmNgram

    from latticekit.drafting.calibration import AcceptanceModel
    from latticekit.vllm.replay import ProposerChains

    def one_model() -> ProposerChains:
        source = ProposerChains(k, VOCAB, engine=costs)
        source.proposer.acceptance = AcceptanceModel.prior(trust=source.proposer.trust)  # type: ignore[assignment]
        return source

    out: dict[str, tuple[Any, int]] = {
        "suffix": (Suffix, suffix_k),
        "vllm-ngram": (lambda: VllmNgram(2, 4), 5),
        "latticekit": (lambda: ProposerChains(k, VOCAB, engine=costs), k),
        "latticekit-given": (lambda: ProposerChains(k, VOCAB, step_costs=costs), k),
        "latticekit-one-model": (one_model, k),
    }
    for variant in variants:
        name, _, given = variant.partition("=")
        if not name or not given:
            raise SystemExit(f"--variant {variant!r}: NAME=JSON")
        settings = json.loads(given)
        chain = int(settings.pop("k", k))
        out[f"latticekit-{name}"] = (lambda s=settings, c=chain: ProposerChains(c, VOCAB, engine=costs, **s), chain)
    return out


def request_seconds(replay: Any, a: float, b: float) -> list[float]:
    """Each request's seconds after its prefill: its steps, ``a`` each and ``b`` per query
    token (its last token and its drafts), and its drafting."""
    return [a * (calls - 1) + b * (calls - 1 + drafted) + seconds
            for (_, calls), (drafted, seconds) in zip(replay.per_request, replay.drafts)]


def summarize(runs: dict[str, Any], group: int) -> dict[str, Any]:
    """Per domain and drafter: tokens per step, drafted per step, ms of drafting per step, and
    per group of requests tokens per second over no speculation's and over the better of
    vllm-ngram and suffix (median, lowest, highest)."""
    out: dict[str, Any] = {}
    for domain, per in runs.items():
        n = len(per["none"]["tokens"])
        cuts = [(i, min(n, i + group)) for i in range(0, n, group)]

        def rate(name: str, lo: int, hi: int) -> float:
            return sum(per[name]["tokens"][lo:hi]) / sum(per[name]["seconds"][lo:hi])

        rows = {}
        for name, r in per.items():
            steps = sum(r["steps"])
            ratios = [rate(name, lo, hi) / rate("none", lo, hi) for lo, hi in cuts]
            best = [rate(name, lo, hi) / max(rate("suffix", lo, hi), rate("vllm-ngram", lo, hi)) for lo, hi in cuts]
            rows[name] = {"tokens_per_step": sum(r["tokens"]) / max(1, steps),
                          "drafted_per_step": sum(r["drafted"]) / max(1, steps),
                          "draft_ms_per_step": 1000 * sum(r["draft_seconds"]) / max(1, steps),
                          "x_none": [float(np.median(ratios)), min(ratios), max(ratios)],
                          "x_best": [float(np.median(best)), min(best), max(best)]}
        out[domain] = {"requests": n, "groups": len(cuts), "drafters": rows}
    return out


def markdown(results: dict[str, Any]) -> str:
    a, b = results["costs"]
    lines = ["# Chain drafters at one request, replayed at an engine's step costs", "",
             f"`{results['command']}` on {results['machine'].get('cpu', '?')}; a step of n query tokens costs "
             f"{1000 * a:.1f} + {1000 * b:.2f} n ms, plus the drafter's own time measured here; streams: "
             f"{results['streams']}.", "",
             "Tokens per second over no speculation's and over the better of vllm-ngram and suffix: the median "
             "over groups of requests, the lowest and highest group in brackets.", ""]
    for domain, s in results["summary"].items():
        lines += [f"## {domain} ({s['requests']} requests, {s['groups']} groups)", "",
                  "| drafter | tokens/step | drafted/step | drafting ms/step | x none | x best of ngram, suffix |",
                  "|---|---|---|---|---|---|"]
        for name, r in s["drafters"].items():
            xn, xb = r["x_none"], r["x_best"]
            lines.append(f"| {name} | {r['tokens_per_step']:.3f} | {r['drafted_per_step']:.2f} | "
                         f"{r['draft_ms_per_step']:.2f} | {xn[0]:.3f} ({xn[1]:.2f}-{xn[2]:.2f}) | "
                         f"{xb[0]:.3f} ({xb[1]:.2f}-{xb[2]:.2f}) |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--domains", nargs="+", default=["code", "summary", "chat", "heldout"])
    p.add_argument("--count", type=int, default=60, help="requests per domain")
    p.add_argument("--group", type=int, default=10, help="requests per group")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--k", type=int, default=8, help="latticekit's num_speculative_tokens")
    p.add_argument("--suffix-k", type=int, default=24, help="suffix's longest draft (its default)")
    p.add_argument("--a", type=float, default=0.085, help="a step's fixed seconds")
    p.add_argument("--b", type=float, default=0.0055, help="a query token's seconds")
    p.add_argument("--variant", nargs="+", default=[], metavar="NAME=JSON",
                   help="another latticekit proposer with these settings (k: its num_speculative_tokens)")
    p.add_argument("--out", default=str(ROOT / "results" / "replay_costs"))
    args = p.parse_args()
    from replay_workloads import streams_of
    from vllm_speed import requests

    from latticekit._machine import machine
    from latticekit.eval.chain_replay import replay_chains

    costs = (args.a, args.b)
    factories = drafters(args.k, args.suffix_k, costs, args.variant)
    runs: dict[str, Any] = {}
    for domain, texts in requests(args.count, args.domains).items():
        streams = [(s["prompt"], s["continuation"]) for s in streams_of(f"vllm-{domain}", texts, args.max_tokens)
                   if s["continuation"]]
        tokens = [len(c) - 1 for _, c in streams]  # the steps' tokens: after the prefill's
        per: dict[str, Any] = {"none": {"tokens": tokens, "steps": tokens,
                                        "drafted": [0] * len(streams), "draft_seconds": [0.0] * len(streams),
                                        "seconds": [(args.a + args.b) * t for t in tokens]}}
        for name, (factory, chain) in factories.items():
            got = replay_chains(streams, factory(), chain)
            per[name] = {"tokens": tokens, "steps": [c - 1 for _, c in got.per_request],
                         "drafted": [d for d, _ in got.drafts], "draft_seconds": [s for _, s in got.drafts],
                         "seconds": request_seconds(got, args.a, args.b)}
            print(f"{domain} {name}: {sum(tokens) / max(1, got.steps):.3f} tokens/step, "
                  f"{got.drafted / max(1, got.steps):.2f} drafted/step", flush=True)
        runs[domain] = per
    results = {"command": "PYTHONPATH=. python benchmarks/replay_costs.py " + " ".join(sys.argv[1:]),
               "machine": machine(), "costs": costs, "k": args.k, "suffix_k": args.suffix_k,
               "streams": f"SmolLM2-135M-Instruct float32, vLLM CPU greedy, max_tokens {args.max_tokens}",
               "runs": runs}
    results["summary"] = summarize(runs, args.group)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "replay_costs.json").write_text(json.dumps(results, indent=1))
    (out / "replay_costs.md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
