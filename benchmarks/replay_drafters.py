"""Chain drafters replayed on a target's greedy streams: latticekit against vLLM ``ngram`` and SuffixDecoding.

No model runs here: each request's greedy stream (SmolLM2-135M-Instruct, float32, vLLM's CPU
engine without speculation, up to ``--max-tokens`` tokens; ``benchmarks/replay_workloads.py``
builds the four workloads from offline material and caches the streams in
``benchmarks/cache/replay_streams/``) replays every drafter exactly
(:func:`latticekit.eval.chain_replay.replay_chains`: a step accepts the draft's longest prefix
equal to the greedy tokens, then the target's own token). The requests of a workload go through
each drafter in one fixed order, one at a time, as one engine serving them in turn: a drafter
with a memory of past answers sees every earlier answer of the workload, never the current one.

Drafters (every chain at most ``N`` tokens, ``N`` in ``--n``):

* ``vllm-ngram-2-4`` / ``vllm-ngram-5``: vLLM's ``ngram`` proposer, its own numba function
  (``vllm.v1.spec_decode.ngram_proposer._find_longest_matched_ngram_and_propose_tokens``) with
  ``prompt_lookup_min``/``max`` 2/4 (``benchmarks/vllm_speed.py``'s) and 5/5 (vLLM's default
  when neither is set), ``k = N``;
* ``suffix``: SuffixDecoding's ``SuffixDecodingCache`` from ``arctic_inference.suffix_decoding``
  standalone, called as vLLM 0.32's ``suffix`` proposer calls it, with its defaults (tree depth 24,
  ``max_spec_factor`` 1.0, ``min_token_prob`` 0.1, 10,000 cached requests: its global tree of
  past answers), ``max_spec_tokens = N``;
* ``latticekit-chain``: latticekit's ``ChainDrafter`` as its vLLM proposer runs it (no Katz
  model: the proposer's default), every chain at its full length;
* ``latticekit-chain+memory``: the same with an ``AnswerMemory`` (2**17 tokens) of the earlier
  answers (the proposer's ``memory_tokens``);
* ``latticekit-chain+memory/ctx0``: the same with each answer counted alone in the memory,
  not after its prompt's end (the proposer's ``memory_context=0``, latticekit before stop 49);
* ``latticekit-chain+memory+lm``: and the shipped Katz 4-gram over SmolLM2's token ids
  interpolated with each request's n-grams (the proposer's ``lm="embedded"``);
* ``latticekit-tree`` / ``latticekit-tree+memory``: beside the chains, not comparable with them:
  the whole candidate tree the chain drafter chooses from (the text's 32 most probable
  continuations, united with the memory's 32), verified whole: what a tree verifier could
  accept (``drafted`` counts its nodes; latticekit's own loop sizes its trees by cost instead).

Per workload and drafter: tokens per target call (emitted tokens over calls: the prefill, then
one per verification step) and drafting ms per step (the drafter's own calls, this machine,
warmed up), in ``benchmarks/results/replay/``.

Usage::

    PYTHONPATH=. python benchmarks/replay_drafters.py [--n 5 12] [--count 200] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

VOCAB = 49152  # SmolLM2's
SUFFIX_DEPTH, SUFFIX_FACTOR, SUFFIX_MIN_PROB, SUFFIX_CACHED = 24, 1.0, 0.1, 10_000
MEMORY_TOKENS = 1 << 17
STREAMS = 200  # requests per workload whose streams are built and cached (fewer where a workload has fewer)


class VllmNgram:
    """vLLM's ``ngram`` proposer's own function, per request (it keeps no state)."""

    def __init__(self, min_n: int, max_n: int) -> None:
        from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens

        self.find, self.min_n, self.max_n = _find_longest_matched_ngram_and_propose_tokens, min_n, max_n
        self.find(np.arange(8, dtype=np.int32), min_n, max_n, 1 << 20, 4)  # numba compiles here, not in a step

    def start(self, prompt: Sequence[int]) -> None:
        pass

    def propose(self, ids: Sequence[int], emitted: Sequence[int], max_length: int) -> Sequence[int]:
        return self.find(np.asarray(ids, dtype=np.int32), self.min_n, self.max_n, 1 << 20, max_length).tolist()

    def finish(self, ids: Sequence[int]) -> None:
        pass


class Suffix:
    """SuffixDecoding's cache, called as vLLM's ``suffix`` proposer calls it; a finished
    request's answer stays in its global tree (the last step's tokens included)."""

    def __init__(self) -> None:
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.cache = SuffixDecodingCache(max_tree_depth=SUFFIX_DEPTH, max_cached_requests=SUFFIX_CACHED)
        self.next_id, self.id, self.prompt, self.added = 0, 0, 0, 0

    def start(self, prompt: Sequence[int]) -> None:
        self.id, self.next_id = self.next_id, self.next_id + 1
        if self.id in self.cache.cached_requests:
            self.cache.evict_cached_response(self.id)
        self.cache.start_request(self.id, np.asarray(prompt, dtype=np.int32))
        self.prompt, self.added = len(prompt), 0

    def _add(self, ids: Sequence[int]) -> None:
        new = list(ids[self.prompt + self.added:])
        if new:
            self.cache.add_active_response(self.id, new)
            self.added += len(new)

    def propose(self, ids: Sequence[int], emitted: Sequence[int], max_length: int) -> Sequence[int]:
        self._add(ids)
        pattern = np.asarray(ids[max(0, len(ids) - SUFFIX_DEPTH):], dtype=np.int32)
        draft = self.cache.speculate(self.id, pattern, max_spec_tokens=max_length, max_spec_factor=SUFFIX_FACTOR,
                                     min_token_prob=SUFFIX_MIN_PROB)
        return list(draft.token_ids)

    def finish(self, ids: Sequence[int]) -> None:
        self._add(ids)
        self.cache.stop_request(self.id)


def drafters() -> dict[str, Any]:
    """Each drafter's factory (a fresh one per workload and N)."""
    from latticekit.demo import embedded_token_lm
    from latticekit.drafting.memory import AnswerMemory
    from latticekit.eval.chain_replay import LatticekitChains, LatticekitTrees

    return {
        "vllm-ngram-2-4": lambda: VllmNgram(2, 4),
        "vllm-ngram-5": lambda: VllmNgram(5, 5),
        "suffix": Suffix,
        "latticekit-chain": lambda: LatticekitChains(VOCAB),
        "latticekit-chain+memory": lambda: LatticekitChains(VOCAB, memory=AnswerMemory(MEMORY_TOKENS, vocab_size=VOCAB)),
        "latticekit-chain+memory/ctx0": lambda: LatticekitChains(
            VOCAB, memory=AnswerMemory(MEMORY_TOKENS, vocab_size=VOCAB, context=0)),
        "latticekit-chain+memory+lm": lambda: LatticekitChains(VOCAB, lm=embedded_token_lm(),
                                                               memory=AnswerMemory(MEMORY_TOKENS, vocab_size=VOCAB)),
        "latticekit-tree": lambda: LatticekitTrees(VOCAB),
        "latticekit-tree+memory": lambda: LatticekitTrees(VOCAB, memory=AnswerMemory(MEMORY_TOKENS, vocab_size=VOCAB)),
    }


def markdown(results: dict[str, Any]) -> str:
    lines = ["# Chain drafters replayed on greedy streams", "",
             f"`{results['command']}` on {results['machine'].get('cpu', '?')}; streams: {results['streams']}.", "",
             "Tokens per target call (drafting ms per step). Ratios: latticekit-chain+memory over the best vLLM "
             "ngram setting and over SuffixDecoding, at the same N.", ""]
    for n in results["n"]:
        names = [k for k in next(iter(results["runs"].values()))[str(n)] if "tree" not in k]
        lines += [f"## N = {n} draft tokens", "", "| workload | requests | " + " | ".join(names)
                  + " | lk+mem / ngram | lk+mem / suffix |", "|" + "---|" * (len(names) + 4)]
        for workload, per_n in results["runs"].items():
            row = {k: v for k, v in per_n[str(n)].items() if k in names}
            tpc = {k: v["tokens_per_call"] for k, v in row.items()}
            ngram = max(tpc["vllm-ngram-2-4"], tpc["vllm-ngram-5"])
            best = tpc["latticekit-chain+memory"]
            lines.append(f"| {workload} | {results['requests'][workload]} | "
                         + " | ".join(f"{v['tokens_per_call']:.3f} ({v['draft_ms_per_step']:.3f})" for v in row.values())
                         + f" | {best / ngram:.2f}x | {best / tpc['suffix']:.2f}x |")
        lines.append("")
    trees = [k for k in next(iter(results["runs"].values()))[str(results["n"][0])] if "tree" in k]
    if trees:
        lines += ["## Beside the chains: the candidate tree verified whole (not comparable with a chain)", "",
                  "Tokens per target call, (draft nodes per step).", "",
                  "| workload | N | " + " | ".join(trees) + " |", "|" + "---|" * (len(trees) + 2)]
        for workload, per_n in results["runs"].items():
            for n in results["n"]:
                row = per_n[str(n)]
                steps = {k: max(1, row[k]["calls"] - results["requests"][workload]) for k in trees}
                lines.append(f"| {workload} | {n} | " + " | ".join(
                    f"{row[k]['tokens_per_call']:.3f} ({row[k]['drafted'] / steps[k]:.1f})" for k in trees) + " |")
        lines.append("")
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    workloads = list(results["runs"])
    fig, axes = plt.subplots(1, len(workloads), figsize=(4 * len(workloads), 3.6), squeeze=False)
    for ax, workload in zip(axes[0], workloads):
        per_n = results["runs"][workload]
        names = list(per_n[str(results["n"][0])])
        width = 0.8 / len(results["n"])
        for j, n in enumerate(results["n"]):
            ax.bar(np.arange(len(names)) + j * width, [per_n[str(n)][k]["tokens_per_call"] for k in names], width,
                   label=f"N = {n}")
        ax.set_xticks(np.arange(len(names)) + width * (len(results["n"]) - 1) / 2)
        ax.set_xticklabels([k.replace("latticekit", "lk") for k in names], rotation=40, ha="right", fontsize=7)
        ax.set_title(workload)
        ax.set_ylabel("tokens per target call")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, nargs="+", default=[5, 12], help="the longest chain (draft tokens)")
    p.add_argument("--count", type=int, default=STREAMS, help="requests per workload (at most)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--workloads", nargs="+", default=None)
    p.add_argument("--drafters", nargs="+", default=None)
    p.add_argument("--out", default=str(ROOT / "results" / "replay"))
    args = p.parse_args()
    from replay_workloads import WORKLOADS, greedy_streams

    from latticekit._machine import machine
    from latticekit.eval.chain_replay import replay_chains

    workloads = args.workloads or list(WORKLOADS)
    factories = drafters()
    names = args.drafters or list(factories)
    results: dict[str, Any] = {
        "command": "PYTHONPATH=. python benchmarks/replay_drafters.py " + " ".join(sys.argv[1:]),
        "machine": machine(), "n": args.n, "streams": "SmolLM2-135M-Instruct float32, vLLM CPU greedy, "
        f"max_tokens {args.max_tokens}", "settings": {"suffix": {"max_tree_depth": SUFFIX_DEPTH,
        "max_spec_factor": SUFFIX_FACTOR, "min_token_prob": SUFFIX_MIN_PROB, "max_cached_requests": SUFFIX_CACHED},
        "memory_tokens": MEMORY_TOKENS}, "requests": {}, "runs": {}}
    for workload in workloads:
        cached = greedy_streams(workload, STREAMS, args.max_tokens)  # the cached streams, whatever --count
        streams = [(s["prompt"], s["continuation"]) for s in cached[:args.count]]
        results["requests"][workload] = len(streams)
        results["runs"][workload] = {}
        for n in args.n:
            row = results["runs"][workload][str(n)] = {}
            for name in names:
                t0 = time.perf_counter()
                got = replay_chains(streams, factories[name](), n)
                row[name] = {"tokens_per_call": got.tokens_per_call, "draft_ms_per_step": got.draft_ms_per_step,
                             "tokens": got.tokens, "calls": got.calls, "drafted": got.drafted}
                print(f"{workload} N={n} {name}: {got.tokens_per_call:.3f} tokens/call, "
                      f"{got.draft_ms_per_step:.3f} ms/step ({time.perf_counter() - t0:.0f} s)", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "replay_drafters.json").write_text(json.dumps(results, indent=1))
    (out / "replay_drafters.md").write_text(markdown(results))
    plot(results, out / "replay_drafters.png")
    print(markdown(results))


if __name__ == "__main__":
    main()
