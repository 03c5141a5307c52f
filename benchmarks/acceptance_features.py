"""Which features tell an accepted chain token from a rejected one, beyond the cache model's probability?

The question behind the per-source acceptance estimates of the vLLM proposers
(``docs/vllm.md``, "How it drafts"). Each request's greedy stream of ``vllm_speed.py``'s tuning
domains (``code``, ``summary``, ``chat``; ``benchmarks/replay_costs.py``'s cached streams)
replays latticekit's vLLM proposer with free draft tokens (its whole chains;
:class:`latticekit.vllm.replay.ProposerChains`, answer memory on: its default). Every
chain position up to the first rejected one is a labelled node (1: the greedy token, given
its parent was): its depth, its cache-model probability (as the acceptance model's
features), its sources (the request's own text, the memory of earlier answers, or both), and
its match length (the longest context of the text and the chain before it, up to 32 tokens,
that the text has seen followed by the node's token; 0: the text never has). A logistic
model of each feature set is fitted on four fifths of the requests and scored (log-loss) on
the fifth left out, in turn.

Usage::

    PYTHONPATH=. python benchmarks/acceptance_features.py [--count 60]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

VOCAB = 49152


def _text(tokens: list[int]) -> str:
    return "".join(chr(0x100 + t) for t in tokens)


def match_length(text: str, context: list[int], token: int, most: int = 32) -> int:
    """The longest k <= most such that the last k tokens of ``context`` followed by ``token`` occur in ``text``."""
    k = 0
    while k < min(most, len(context)) and text.find(_text(context[len(context) - k - 1:] + [token])) >= 0:
        k += 1
    return k


def labelled_nodes(streams: list[tuple[list[int], list[int]]]) -> dict[str, np.ndarray]:
    """Every chain position the replay decides (see the module docstring), its features and label."""
    from latticekit.drafting import chains
    from latticekit.drafting.calibration import SOURCES, node_features
    from latticekit.eval.chain_replay import accepted_prefix
    from latticekit.vllm.replay import ProposerChains

    chosen: dict[str, Any] = {}
    original = chains.ChainDrafter._chain

    def _chain(self: Any, tree: Any, root_index: int) -> Any:  # the chain's nodes, as the drafter chose them
        out = original(self, tree, root_index)
        features = node_features(tree, self.acceptance.max_depth)
        nodes = tree.best_chain(tree.path_probability(self.acceptance.conditional(features, tree.sources)))
        chosen["chain"] = (tree.tokens[nodes].tolist(), tree.cache_logprob[nodes], tree.depths[nodes],
                           tree.sources[nodes])
        return out

    chains.ChainDrafter._chain = _chain  # type: ignore[method-assign]
    rows: dict[str, list[Any]] = {k: [] for k in ("depth", "cache", "sources", "match", "label", "request")}
    try:
        source = ProposerChains(8, VOCAB, step_costs=(1.0, 0.0))
        for r, (prompt, continuation) in enumerate(streams):
            ids, emitted = prompt + continuation[:1], continuation[:1]
            while len(ids) - len(prompt) < len(continuation):
                at = len(ids) - len(prompt)
                chosen.clear()
                draft = list(source.propose(ids, emitted, 8))
                if "chain" in chosen:
                    tokens, cache, depths, sources = chosen["chain"]
                    accepted, text = accepted_prefix(tokens, continuation, at), _text(ids)
                    for i in range(min(len(tokens), accepted + 1, len(continuation) - at)):
                        rows["depth"].append(int(depths[i]))
                        rows["cache"].append(float(cache[i]))
                        rows["sources"].append(int(sources[i]))
                        rows["match"].append(match_length(text, ids + tokens[:i], tokens[i]))
                        rows["label"].append(float(i < accepted))
                        rows["request"].append(r)
                got = accepted_prefix(draft, continuation, at)
                emitted = continuation[at:at + got + 1]
                ids = ids + emitted
    finally:
        chains.ChainDrafter._chain = original  # type: ignore[method-assign]
    out = {k: np.asarray(v) for k, v in rows.items()}
    out["memory_only"] = (out["sources"] == SOURCES["memory"]).astype(float)
    return out


def fit(x: np.ndarray, y: np.ndarray, l2: float = 1e-3) -> np.ndarray:
    """L2-regularised logistic regression by Newton's method."""
    w = np.zeros(x.shape[1])
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(-(x @ w)))
        step = np.linalg.solve((x * (p * (1 - p))[:, None]).T @ x / len(y) + l2 * np.eye(len(w)),
                               x.T @ (p - y) / len(y) + l2 * w)
        w -= step
        if np.abs(step).max() < 1e-9:
            break
    return w


def held_out_log_loss(x: np.ndarray, y: np.ndarray, requests: np.ndarray, folds: int = 5) -> float:
    """Log-loss of the fits on each fold of requests left out, over every node."""
    ids = np.unique(requests)
    np.random.default_rng(0).shuffle(ids)
    total = 0.0
    for part in np.array_split(ids, folds):
        out = np.isin(requests, part)
        p = np.clip(1.0 / (1.0 + np.exp(-(x[out] @ fit(x[~out], y[~out])))), 1e-6, 1 - 1e-6)
        total -= float(np.sum(y[out] * np.log(p) + (1 - y[out]) * np.log(1 - p)))
    return total / len(y)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--domains", nargs="+", default=["code", "summary", "chat"])
    p.add_argument("--count", type=int, default=60)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--out", default=str(ROOT / "results" / "replay_costs" / "acceptance_features.json"))
    args = p.parse_args()
    from replay_workloads import streams_of
    from vllm_speed import requests

    from latticekit._machine import machine
    from latticekit.drafting.calibration import logit

    streams = [(s["prompt"], s["continuation"]) for domain, texts in requests(args.count, args.domains).items()
               for s in streams_of(f"vllm-{domain}", texts, args.max_tokens) if s["continuation"]]
    nodes = labelled_nodes(streams)
    y = nodes["label"]
    depth = np.eye(7)[np.minimum(nodes["depth"], 7) - 1]
    known = ~np.isnan(nodes["cache"])
    cache = np.where(known, logit(np.where(known, nodes["cache"], -1.0)) / 4, 0.0)[:, None]  # as node_features
    memory_only = nodes["memory_only"][:, None]
    match = nodes["match"][:, None].astype(float)
    sets = {
        "depth, cache": [depth, cache],
        "depth, cache, memory only": [depth, cache, memory_only],
        "depth, cache, log(1 + match)": [depth, cache, np.log1p(match)],
        "depth, cache, memory only, log(1 + min(match, 4))": [depth, cache, memory_only,
                                                              np.log1p(np.minimum(match, 4))],
        "depth, cache, memory only, log(1 + match)": [depth, cache, memory_only, np.log1p(match)],
    }
    results: dict[str, Any] = {
        "command": "PYTHONPATH=. python benchmarks/acceptance_features.py " + " ".join(sys.argv[1:]),
        "machine": machine(), "nodes": int(len(y)), "accepted": float(y.mean()),
        "sources": {str(int(s)): int((nodes["sources"] == s).sum()) for s in np.unique(nodes["sources"])},
        "features": {}}
    for name, parts in sets.items():
        x = np.hstack(parts)
        results["features"][name] = {"held_out_log_loss": held_out_log_loss(x, y, nodes["request"]),
                                     "weights_after_depth": fit(x, y)[7:].round(3).tolist()}
        print(f"{name}: {results['features'][name]}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
