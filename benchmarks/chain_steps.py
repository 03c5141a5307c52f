"""Where a chain drafter's chains stop too early or go on too long, step by step, on greedy streams.

Replays chain drafters (``benchmarks/replay_drafters.py``'s: vLLM ``ngram``, SuffixDecoding,
latticekit's chain) on the cached greedy streams of ``benchmarks/replay_workloads.py`` one step
at a time, as :func:`latticekit.eval.chain_replay.replay_chains` does, and classifies each step
against the *copy oracle*: the longest run of the greedy continuation from that step (at most
N tokens) that occurs earlier in the request's text (prompt and output so far), the most a
drafter that copies the text could have had accepted there.

* **whole**: the chain was accepted whole; **early** among them when it was shorter than both
  N and the oracle (tokens lost: the oracle's length, capped at N, less the chain's);
* **over**: the chain went past what was accepted (tokens wasted: those verified and rejected);
* **missed**: no chain where the oracle had two tokens or more.

Then, on the same positions (every position of every greedy stream, so that neither drafter's
own trajectory decides where it is asked), each pair of drafters named in ``--pairs``: the
tokens each would have had accepted there, where one got two or more and the other none
(split into the other's empty and wrong chains), and whether the wrong chain's first token was
the text's more frequent follower of the context (at context lengths 1-8) than the truth.

Usage::

    PYTHONPATH=. python benchmarks/chain_steps.py [--workload code] [--count 60] [--n 8]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))


def copy_oracle(text: Sequence[int], continuation: Sequence[int], at: int, n: int) -> int:
    """The longest prefix of ``continuation[at:]`` (at most ``n`` tokens) found in ``text``."""
    want = list(continuation[at:at + n])
    best = 0
    for start in range(len(text)):
        length = 0
        while length < len(want) and start + length < len(text) and text[start + length] == want[length]:
            length += 1
        best = max(best, length)
        if best == len(want):
            break
    return best


def classify(streams: Sequence[tuple[Sequence[int], Sequence[int]]], source: Any, n: int) -> dict[str, Any]:
    """Per step, the chain against the copy oracle (see the module docstring), summed."""
    from latticekit.eval.chain_replay import accepted_prefix

    out = {"steps": 0, "tokens": 0, "calls": 0, "chain_tokens": 0, "accepted": 0, "whole": 0, "early": 0,
           "early_lost": 0, "over": 0, "over_wasted": 0, "missed": 0, "missed_lost": 0, "by_length": {}}
    for prompt, continuation in streams:
        prompt, continuation = [int(t) for t in prompt], [int(t) for t in continuation]
        source.start(prompt)
        ids = prompt + continuation[:1]
        emitted, calls = continuation[:1], 1
        while len(ids) - len(prompt) < len(continuation):
            at = len(ids) - len(prompt)
            chain = list(source.propose(ids, emitted, n))[:n]
            accepted = accepted_prefix(chain, continuation, at)
            oracle = min(n, copy_oracle(ids, continuation, at, n), len(continuation) - at)
            out["steps"] += 1
            out["chain_tokens"] += len(chain)
            out["accepted"] += accepted
            length = out["by_length"].setdefault(len(chain), [0, 0])  # steps, accepted tokens
            length[0] += 1
            length[1] += accepted
            if chain and accepted == len(chain):
                out["whole"] += 1
                if len(chain) < oracle:
                    out["early"] += 1
                    out["early_lost"] += oracle - len(chain)
            elif chain:
                out["over"] += 1
                out["over_wasted"] += len(chain) - accepted
            elif oracle >= 2:
                out["missed"] += 1
                out["missed_lost"] += oracle
            emitted = continuation[at:at + accepted + 1]
            ids += emitted
            calls += 1
        source.finish(ids)
        out["tokens"] += len(continuation)
        out["calls"] += calls
    out["tokens_per_call"] = out["tokens"] / out["calls"]
    return out


def follower_count(text: Sequence[int], context: int, token: int) -> int:
    """How often ``token`` follows the last ``context`` tokens of ``text`` earlier in it."""
    tail = list(text[-context:])
    return sum(1 for i in range(len(text) - context) if list(text[i:i + context]) == tail
               and text[i + context] == token)


def same_positions(streams: Sequence[tuple[Sequence[int], Sequence[int]]], first: Any, second: Any,
                   n: int) -> dict[str, Any]:
    """Both drafters asked at every position of the greedy streams (see the module docstring)."""
    from latticekit.eval.chain_replay import accepted_prefix

    out: dict[str, Any] = {"positions": 0, "accepted": [0, 0], "drafted": [0, 0], "more": [0, 0],
                           "only": [0, 0], "other_empty": [0, 0], "other_wrong": [0, 0],
                           "wrong_was_more_frequent": [0, 0]}
    for prompt, continuation in streams:
        prompt, continuation = [int(t) for t in prompt], [int(t) for t in continuation]
        first.start(prompt)
        second.start(prompt)
        for t in range(1, len(continuation)):
            ids = prompt + continuation[:t]
            chains = [list(first.propose(ids, continuation[t - 1:t], n))[:n],
                      list(second.propose(ids, continuation[t - 1:t], n))[:n]]
            got = [accepted_prefix(c, continuation, t) for c in chains]
            out["positions"] += 1
            for i in (0, 1):
                out["accepted"][i] += got[i]
                out["drafted"][i] += len(chains[i])
                out["more"][i] += max(0, got[i] - got[1 - i])
                if got[i] >= 2 and got[1 - i] == 0:
                    out["only"][i] += 1
                    other = chains[1 - i]
                    out["other_empty" if not other else "other_wrong"][i] += 1
                    if other and all(follower_count(ids, k, other[0]) >= follower_count(ids, k, continuation[t])
                                     for k in (1, 2, 4, 8)):
                        out["wrong_was_more_frequent"][i] += 1
        first.finish(prompt + continuation)
        second.finish(prompt + continuation)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", default="code")
    p.add_argument("--count", type=int, default=60)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--drafters", nargs="+", default=["vllm-ngram-2-4", "suffix", "latticekit-chain",
                                                     "latticekit-chain+memory"])
    p.add_argument("--pairs", nargs="+", default=["latticekit-chain:suffix", "latticekit-chain+memory:suffix"],
                   help="drafters compared on the same positions (first:second)")
    p.add_argument("--out", default=None, help="a JSON file for the counts")
    args = p.parse_args()
    from replay_drafters import STREAMS, drafters
    from replay_workloads import greedy_streams

    cached = greedy_streams(args.workload, STREAMS, args.max_tokens)
    streams = [(s["prompt"], s["continuation"]) for s in cached[:args.count]]
    factories = drafters()
    results = {}
    for name in args.drafters:
        got = results[name] = classify(streams, factories[name](), args.n)
        steps = got["steps"]
        print(f"{name}: {got['tokens_per_call']:.3f} tokens/call; per step: chain {got['chain_tokens'] / steps:.2f}, "
              f"accepted {got['accepted'] / steps:.2f}; whole {got['whole']} (early {got['early']}, "
              f"{got['early_lost']} tokens lost), over {got['over']} ({got['over_wasted']} wasted), "
              f"missed {got['missed']} ({got['missed_lost']} lost) of {steps} steps", flush=True)
    pairs = {}
    for pair in args.pairs:
        a, b = pair.split(":")
        got = pairs[pair] = same_positions(streams, factories[a](), factories[b](), args.n)
        print(f"{a} vs {b} on the same {got['positions']} positions: accepted {got['accepted'][0]} / "
              f"{got['accepted'][1]}, drafted {got['drafted'][0]} / {got['drafted'][1]}; two or more where the "
              f"other had none: {got['only'][0]} / {got['only'][1]} (the other's chain empty "
              f"{got['other_empty'][0]} / {got['other_empty'][1]}, wrong {got['other_wrong'][0]} / "
              f"{got['other_wrong'][1]}, its wrong first token the text's more frequent follower "
              f"{got['wrong_was_more_frequent'][0]} / {got['wrong_was_more_frequent'][1]})", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "results": results, "same_positions": pairs},
                                              indent=1))


if __name__ == "__main__":
    main()
