"""Fit the heads' acceptance prior (``auto`` starts its heads' estimates from it) and choose the
lattice's knobs by replay, on prompts apart from the benchmark's.

It fits and replays ``heads``, the lattice alone: the prior is the heads' own model, which
``auto`` applies to the nodes the heads propose (the text's nodes have a model of their own).

The replay engine (``latticekit.eval.replay``) walks every greedy-mode decoder's steps from one
greedy trace per prompt; with the target's measured step costs
(``latticekit.decoding.costs.step_costs``) and a drafting overhead, a replayed decode also has a
*simulated* wall time: per step the target call for its tree size plus, when the lattice was
read, the overhead. That makes ``auto``'s knobs (k, p, alpha, the acceptance model's prior and
learning rate) cheap to compare without timing noise; the real speed is what
``benchmarks/decode_speed.py`` measures.

Prompts (none of them in ``decode_speed.py``'s sets):

* code / english: windows from held-out files of the heads' split past the first 20 of each
  domain (``decode_speed.py`` takes its windows from the first 10);
* instruction: held-out requests of ``benchmarks/results/heads/instruction_prompts.json`` at odd
  positions (``decode_speed.py`` samples the even ones), through the chat template.

Half of each domain's traces fit the acceptance model (every position's p-best candidate nodes,
labelled by the greedy continuation); the other half replays ``auto`` under each setting.
Writes ``benchmarks/results/tune_auto.{json,md}`` and the fitted prior to ``--prior-out``.

Usage::

    PYTHONPATH=. python benchmarks/tune_auto.py --threads 2 [--overhead-ms 3.3]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def tuning_prompts(args: argparse.Namespace, tokenizer: Any) -> dict[str, list[list[int]]]:
    from latticekit.eval.prompts import prompts_from_files

    manifest = json.loads(Path(args.manifest).read_text())
    out: dict[str, list[list[int]]] = {}
    for domain, entry in manifest["domains"].items():
        files = [Path(entry["root"]) / rel for rel in entry["heldout_files"][20:]]
        prompts = prompts_from_files({domain: files}, tokenizer, args.prompt_tokens, args.per_domain,
                                     0, args.seed)
        out[domain] = [p.ids for p in prompts]
    requests = json.loads(Path(args.instruction_prompts).read_text())["heldout"][1::2][: args.per_domain]
    out["instruction"] = []
    for p in requests:
        out["instruction"].append(tokenizer.chat(p["user"]))
    return out


def node_data(traces: list[Any], lm: Any, k: int, p: int, alpha: float, max_depth: int) -> tuple[np.ndarray, np.ndarray]:
    """Every trace position's candidate nodes (the p best paths of its k-wide lattice), with the
    features ``auto`` computes and their labels from the greedy continuation."""
    from latticekit.drafting.calibration import PendingLabels, node_features
    from latticekit.drafting import DraftInput, make_drafter
    from latticekit.drafting import DecoderConfig

    config = DecoderConfig("heads", k=k, p=p, alpha=alpha)  # the heads' own nodes: what their model is fitted on
    feats, labels = [], []
    for trace in traces:
        # candidates from the trace's lattices (without has_heads: heads-free ones)
        drafter = make_drafter(config, lms=lm, costs=_dummy_costs(), has_heads=True)
        pending = PendingLabels()
        sequence = trace.prompt + trace.continuation
        for i in range(len(trace.continuation) - max_depth):
            root = len(trace.prompt) + i
            step = DraftInput(sequence[: root + 1], lambda i=i: trace.lattice(i, k))
            tree = drafter.candidates(step)
            if np.isnan(tree.head_logprob).any():
                raise SystemExit("the candidates did not come from the heads' lattice")
            pending.add(root, tree, node_features(tree, max_depth))
        x, y = pending.resolve(sequence)
        feats.append(x)
        labels.append(y)
    return np.concatenate(feats), np.concatenate(labels)


def _dummy_costs() -> Any:
    from latticekit.decoding.costs import StepCosts

    return StepCosts([0, 1], [1.0, 1.0], 1, draft_s=0.0)


def simulate(traces: list[Any], config: Any, lm: Any, costs: Any, acceptance: Any, max_new_tokens: int,
             eos: Any) -> dict[str, float]:
    """Replays ``config`` over the traces; tokens per call and simulated speed against greedy."""
    from latticekit.eval.replay import replay

    tokens = calls = 0
    seconds = greedy_seconds = 0.0
    drafted = 0
    for trace in traces:
        d = replay(trace, config, max_new_tokens, lms=lm, costs=costs, acceptance=acceptance, eos_token_id=eos)
        cached = len(trace.prompt)
        for step in d.steps:
            nodes = step.tree_nodes
            seconds += costs.target_s(nodes, cached) + (costs.draft_s if step.lattice_tokens is not None else 0.0)
            drafted += step.lattice_tokens is not None
            cached += len(step.emitted)
        for j in range(len(d.tokens)):
            greedy_seconds += costs.target_s(0, len(trace.prompt) + j)
        tokens += len(d.tokens)
        calls += d.calls
    return {"tokens_per_call": tokens / calls, "simulated_speedup": greedy_seconds / seconds,
            "lattice_steps": drafted / calls}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--heads", default="default")
    p.add_argument("--manifest", default=str(ROOT / "results" / "heads" / "split.json"))
    p.add_argument("--instruction-prompts", default=str(ROOT / "results" / "heads" / "instruction_prompts.json"))
    p.add_argument("--per-domain", type=int, default=24)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--overhead-ms", type=float, default=3.3, help="lattice + search per drafting step")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--trace-cache", default=str(ROOT / "cache" / "traces"))
    p.add_argument("--prior-out", default=str(ROOT.parent / "latticekit" / "data" / "acceptance" / "smollm2-135m-h8.json"),
                   help="where the fitted acceptance model goes (the package ships it for the default heads)")
    p.add_argument("--prior-learning-rate", type=float, default=0.05, help="online learning rate stored with it")
    p.add_argument("--out", default=str(ROOT / "results"))
    args = p.parse_args()

    import transformers

    from latticekit.drafting.calibration import AcceptanceModel
    from latticekit.decoding.costs import step_costs
    from latticekit.demo import embedded_token_lm
    from latticekit.loading import load_heads, load_target
    from latticekit.drafting import DecoderConfig
    from latticekit.eval.replay import trace_prompts
    from latticekit.heads import heads_fingerprint
    from latticekit.torch import prepare_target

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    model, tokenizer, description = load_target("smollm2")
    heads = load_heads(args.heads, model)
    prepare_target(model, heads=heads)
    lm = embedded_token_lm()
    costs = step_costs(model)
    costs.draft_s = args.overhead_ms / 1e3
    h = int(heads.num_heads)
    prompts = tuning_prompts(args, tokenizer)
    traces = {}
    for domain, plist in prompts.items():
        t0 = time.perf_counter()
        traces[domain] = trace_prompts(model, heads, plist, args.max_new_tokens + h - 1, k=16,
                                       cache_dir=args.trace_cache, description=f"{description}|prepared|cpu")
        log(f"{domain}: {len(plist)} traces ({time.perf_counter() - t0:.0f} s)")
    fit_half = {d: t[0::2] for d, t in traces.items()}
    eval_half = {d: t[1::2] for d, t in traces.items()}
    max_depth = h - 1
    x, y = zip(*(node_data(fit_half[d], lm, 8, 16, 1.0, max_depth) for d in traces))
    fitted = AcceptanceModel.fit(np.concatenate(x), np.concatenate(y), max_depth)
    log(f"fitted on {sum(len(v) for v in y)} nodes: weights {np.round(fitted.weights, 3).tolist()}")
    eos = tokenizer.eos_token_id
    rows = []
    priors = {"prior": AcceptanceModel.prior(max_depth), "fitted": fitted}
    grid = itertools.product(("prior", "fitted"), (0.0, 0.05, 0.15, 0.4), (4, 8, 16), (8, 16, 32), (0.5, 1.0))
    for prior, lr, k, paths, alpha in grid:
        acceptance = AcceptanceModel(priors[prior].weights, lr)
        config = DecoderConfig("heads", k=k, p=paths, alpha=alpha)
        row = {"prior": prior, "learning_rate": lr, "k": k, "p": paths, "alpha": alpha}
        for domain, tr in eval_half.items():
            stop = eos if domain == "instruction" else None
            row[domain] = simulate(tr, config, lm, costs, acceptance, args.max_new_tokens, stop)
        rows.append(row)
        log(" ".join(f"{k}={v}" for k, v in row.items() if not isinstance(v, dict)) + " | " + " ".join(
            f"{d}: {row[d]['tokens_per_call']:.3f} tok/call {row[d]['simulated_speedup']:.3f}x" for d in eval_half))
    fitted.learning_rate = args.prior_learning_rate
    Path(args.prior_out).parent.mkdir(parents=True, exist_ok=True)
    fitted.save(args.prior_out, {"heads": args.heads, "heads_fingerprint": heads_fingerprint(heads),
                                 "lm": repr(lm), "nodes": int(sum(len(v) for v in y)),
                                 "fit_on": {d: len(t) for d, t in fit_half.items()},
                                 "features": "depth one-hot (1..7), head, n-gram and cache logits / 4 (no cache model here)"})
    out = Path(args.out)
    (out / "tune_auto.json").write_text(json.dumps({"command": " ".join(sys.argv), "costs_ms": [
        round(s * 1e3, 2) for s in costs.seconds], "overhead_ms": args.overhead_ms, "fitted_weights":
        fitted.weights.tolist(), "rows": rows}, indent=1) + "\n")
    lines = ["# auto: knobs by replay (simulated speed-up over greedy from measured step costs)", "",
             f"Command: `PYTHONPATH=. python benchmarks/tune_auto.py {' '.join(sys.argv[1:])}`", "",
             "| prior | lr | k | p | alpha | " + " | ".join(f"{d} tok/call | {d} speed-up" for d in eval_half) + " |",
             "|---|---|---|---|---|" + "---|---|" * len(eval_half)]
    for row in sorted(rows, key=lambda r: -statistics.fmean(r[d]["simulated_speedup"] for d in eval_half)):
        lines.append(f"| {row['prior']} | {row['learning_rate']} | {row['k']} | {row['p']} | {row['alpha']} | " +
                     " | ".join(f"{row[d]['tokens_per_call']:.3f} | {row[d]['simulated_speedup']:.3f}"
                                for d in eval_half) + " |")
    (out / "tune_auto.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:20]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
