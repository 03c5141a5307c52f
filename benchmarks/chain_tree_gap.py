"""What latticekit's text-only chain leaves in the candidate tree it is chosen from, step by step.

On greedy streams of ``benchmarks/vllm_speed.py``'s domains (the first ``--count`` requests in
id order, :func:`replay_workloads.streams_of`, cached), latticekit's chain drafter with its answer
memory (as its vLLM proposer runs it; every chain at full length, at most ``--n`` tokens) walks
each stream as :func:`latticekit.eval.chain_replay.replay_chains` does. At every step it is
asked for its chain and for the whole candidate tree the chain was chosen from (the text's and
the memory's continuations, :meth:`~latticekit.drafting.chains.ChainDrafter.candidate_tree`),
and SuffixDecoding (``replay_drafters.Suffix``, its defaults, 24 tokens) for its chain at the
same position. Per domain:

* tokens accepted a step by the chain, by the best path of its tree (what a chain drafter
  that chose perfectly among the same candidates would get), and by SuffixDecoding there;
* the tokens the chain leaves to its tree's best path, split by where the chain went wrong:
  its **first** token (another first token of the tree was right; with the first tokens the
  tree held there, on average) or a **later** one;
* two plain rules of the request's own text at the same steps, against the chain's first
  token: the follower of the *most recent* occurrence of the longest earlier match of the
  text's last 1-8 tokens (within its last 400), and that match's *most frequent* follower
  (steps with such a match and a chain; how often each first token was right);
* the vLLM proposer's allocation replayed on the same streams
  (:class:`latticekit.vllm.replay.ProposerChains`, a simulated engine of ``a`` seconds a step
  and ``b`` a query token, for each ``--engine-b``), against the full chains, in tokens a call.

Usage::

    PYTHONPATH=. python benchmarks/chain_tree_gap.py [--domains chat summary code] [--count 40] \\
        [--max-tokens 96] [--n 8] [--out benchmarks/results/replay/chain_tree_gap.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))


def match_followers(ids: Sequence[int], longest: int = 8, window: int = 400) -> list[int]:
    """The tokens that followed each earlier occurrence of the longest run of ``ids``' last
    1..``longest`` tokens that occurred before (within the last ``window`` tokens), oldest first."""
    text = list(ids[-window:])
    end = len(text)
    for n in range(min(longest, end - 1), 0, -1):
        context = text[end - n:]
        found = [text[i + n] for i in range(end - n) if text[i:i + n] == context]
        if found:
            return found
    return []


def walk(prompt: list[int], continuation: list[int], chains: Any, n: int) -> Iterator[dict[str, Any]]:
    """One request's steps as :func:`latticekit.eval.chain_replay.replay_chains` takes them, every
    chain at full length (``n`` tokens at most), one at a time: where the chain starts (``at``),
    the text and the tokens just emitted it was drafted after (``ids``, ``emitted``), the chain,
    its candidate tree's paths and the tokens it accepted (``got``); the text then grows by those
    and one more. ``chains`` (a :class:`~latticekit.eval.chain_replay.LatticekitChains`) is
    started on the prompt and finished on the whole text."""
    from latticekit.eval.chain_replay import accepted_prefix

    chains.start(prompt)
    ids, emitted = prompt + continuation[:1], continuation[:1]
    while len(ids) - len(prompt) < len(continuation):
        at = len(ids) - len(prompt)
        chain = list(chains.propose(ids, emitted, n))
        assert chains.state is not None
        paths = [list(path) for path in chains.state.candidate_tree(n).paths()]
        got = accepted_prefix(chain, continuation, at)
        yield {"at": at, "ids": ids, "emitted": emitted, "chain": chain, "paths": paths, "got": got}
        emitted = continuation[at:at + got + 1]
        ids = ids + emitted
    chains.finish(ids)


def tree_gap(streams: Sequence[tuple[Sequence[int], Sequence[int]]], n: int) -> dict[str, Any]:
    """One domain's step-by-step counts (see the module docstring)."""
    from replay_drafters import MEMORY_TOKENS, VOCAB, Suffix

    from latticekit.drafting.memory import AnswerMemory
    from latticekit.eval.chain_replay import LatticekitChains, accepted_prefix

    chains = LatticekitChains(VOCAB, memory=AnswerMemory(MEMORY_TOKENS, vocab_size=VOCAB))
    suffix = Suffix()
    c: Counter[str] = Counter()
    for prompt, continuation in streams:
        prompt, continuation = [int(t) for t in prompt], [int(t) for t in continuation]
        if not continuation:
            continue
        c["requests"] += 1
        c["tokens"] += len(continuation)
        suffix.start(prompt)
        for step in walk(prompt, continuation, chains, n):
            at, ids, chain, paths, got = step["at"], step["ids"], step["chain"], step["paths"], step["got"]
            best = max((accepted_prefix(path, continuation, at) for path in paths), default=0)
            c["steps"] += 1
            c["chain"] += got
            c["tree"] += best
            c["suffix"] += accepted_prefix(list(suffix.propose(ids, step["emitted"], 24)), continuation, at)
            found = match_followers(ids)
            if found and chain:
                truth = continuation[at]
                c["rule_steps"] += 1
                c["rule_chain_right"] += chain[0] == truth
                c["rule_recent_right"] += found[-1] == truth
                c["rule_frequent_right"] += Counter(found).most_common(1)[0][0] == truth
            if best > got:
                where = "first" if got == 0 else "later"
                c[f"lost_{where}_steps"] += 1
                c[f"lost_{where}_tokens"] += best - got
                if where == "first":
                    c["first_tokens_held"] += len({path[0] for path in paths if path})
        suffix.finish(prompt + continuation)  # the whole text, as the walk's end leaves it
    steps = max(c["steps"], 1)
    lost = max(c["lost_first_tokens"] + c["lost_later_tokens"], 1)
    return {"requests": c["requests"], "steps": c["steps"],
            "tokens_per_call": {"full": c["tokens"] / max(c["steps"] + c["requests"], 1)},  # a prefill and the steps
            "accepted_per_step": {k: c[k] / steps for k in ("chain", "tree", "suffix")},
            "lost_first_share": c["lost_first_tokens"] / lost,
            "first_tokens_held": c["first_tokens_held"] / max(c["lost_first_steps"], 1),
            "first_token_right": {k: c[f"rule_{k}_right"] / max(c["rule_steps"], 1) for k in ("chain", "recent", "frequent")},
            "counts": dict(c)}


def allocation(streams: Sequence[tuple[Sequence[int], Sequence[int]]], n: int, a: float,
               bs: Sequence[float]) -> dict[str, float]:
    """Tokens a call of the vLLM proposer's allocation at each ``b``."""
    from replay_drafters import VOCAB

    from latticekit.eval.chain_replay import replay_chains
    from latticekit.vllm.replay import ProposerChains

    return {f"proposer b={b}": replay_chains(streams, ProposerChains(n, VOCAB, engine=(a, b)), n).tokens_per_call
            for b in bs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--domains", nargs="+", default=["chat", "summary", "code"])
    p.add_argument("--count", type=int, default=40)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--engine-a", type=float, default=0.044, help="the simulated engine's seconds a step")
    p.add_argument("--engine-b", type=float, nargs="+", default=[0.0002, 0.001, 0.003],
                   help="the simulated engine's seconds a query token")
    p.add_argument("--out", default=str(ROOT / "results" / "replay" / "chain_tree_gap.json"))
    args = p.parse_args()

    def row_of(got: Sequence[tuple[Sequence[int], Sequence[int]]]) -> dict[str, Any]:
        row = tree_gap(got, args.n)
        row["tokens_per_call"].update(allocation(got, args.n, args.engine_a, args.engine_b))
        return row

    replay_domains("chain_tree_gap.py", args, row_of)


def replay_domains(script: str, args: argparse.Namespace,
                   row_of: Callable[[Sequence[tuple[Sequence[int], Sequence[int]]]], dict[str, Any]]) -> None:
    """Runs ``row_of`` on each of ``args.domains``' greedy streams (its first ``args.count``
    requests, ``args.max_tokens`` tokens), prints each row (less its ``counts``) and writes them
    all, with the command, the machine, ``args.n`` and ``args.max_tokens``, to ``args.out``."""
    from replay_workloads import streams_of
    from vllm_speed import requests

    from latticekit._files import atomic_write
    from latticekit._machine import machine

    streams = {domain: [(s["prompt"], s["continuation"]) for s in streams_of(domain, texts, args.max_tokens, batch=16)]
               for domain, texts in requests(args.count, args.domains).items()}
    results: dict[str, Any] = {"command": f"PYTHONPATH=. python benchmarks/{script} " + " ".join(sys.argv[1:]),
                               "machine": machine(), "n": args.n, "max_tokens": args.max_tokens, "domains": {}}
    for domain, got in streams.items():
        row = row_of(got)
        results["domains"][domain] = row
        print(domain, json.dumps({k: v for k, v in row.items() if k != "counts"}), flush=True)
    with atomic_write(args.out) as f:
        f.write(json.dumps(results, indent=1).encode())


if __name__ == "__main__":
    main()
