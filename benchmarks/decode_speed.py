"""Benchmark: tokens per second of latticekit's decoders against greedy decoding, one run.

Every decoder runs on the same prepared target (``latticekit.torch.prepare_target``: packed
weights, fused projections, grouped-query attention; the same threads and dtype), prompt by
prompt in rotating order, so machine noise reaches all alike. The baselines are the ones a
user would otherwise run on that prepared model: latticekit's plain greedy loop (``greedy``)
and transformers' ``model.generate(do_sample=False)`` (``hf-generate``); every other decoder's
tokens are checked equal to greedy's for every prompt (the run fails otherwise).

Domains (prompts never seen by the heads or the n-gram model):

* ``code`` / ``english``: windows of ``--prompt-tokens`` tokens from the held-out files of the
  heads' split (``benchmarks/results/heads/split.json``: CPython stdlib sources, Python docs);
* ``demo``: the prompts ``latticekit demo`` decodes;
* ``instruction``: held-out requests built from offline material ("explain this function",
  "summarise this passage", "what does X do", ...; ``--instruction-prompts``, made by
  ``benchmarks/heads_prompts.py``), put through SmolLM2-Instruct's chat template, decoded
  until the end of the answer or ``--max-new-tokens``.

Per domain and decoder: tokens per target call, tokens/s and its ratio to greedy's and to the
faster of the two baselines in the same pass (each the median over ``--repeats`` passes over
all prompts), milliseconds per step in heads / search /
target, and for ``auto`` the tree sizes it chose (a plot). Writes
``benchmarks/results/decode_speed/<name>.{json,md,png}``.

A decoder named ``SPEC@LABEL`` drafts with the heads given as ``--more-heads LABEL=PATH``
(prepared like the main ones), so two heads files are compared in one interleaved run against
the same greedy baseline.

Usage::

    PYTHONPATH=. python benchmarks/decode_speed.py --threads 2 [--heads default|untrained:8] \\
        [--domains code english demo instruction] [--num-prompts 10] [--repeats 3] \\
        [--more-heads new=heads.safetensors --decoders greedy auto auto@new]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent
DEFAULT_DECODERS = ("greedy", "hf-generate", "auto", "vanilla:k=16", "ngram:k=16,p=1,alpha=1")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def window_prompts(args: argparse.Namespace, tokenizer: Any, domain: str) -> list[dict[str, Any]]:
    """``args.num_prompts`` windows of ``args.prompt_tokens`` tokens of the domain's held-out files."""
    from latticekit.eval.prompts import prompts_from_manifest

    prompts = prompts_from_manifest(args.manifest, tokenizer, args.prompt_tokens, args.num_prompts, 0, args.seed,
                                    [domain])
    return [{"source": p.source, "ids": p.ids, "max_new_tokens": args.max_new_tokens, "eos": None} for p in prompts]


def instruction_prompts(args: argparse.Namespace, tokenizer: Any) -> list[dict[str, Any]]:
    """``args.num_instruction`` held-out requests (seeded, from the even positions; tune_auto.py
    takes the odd ones) through the chat template."""
    data = json.loads(Path(args.instruction_prompts).read_text())["heldout"][0::2]
    rng = np.random.default_rng(args.seed)
    chosen = [data[i] for i in sorted(rng.choice(len(data), size=min(args.num_instruction, len(data)),
                                                 replace=False))]
    return [{"source": f"{p['source']}:{p['task']}:{p['id']}", "ids": tokenizer.chat(p["user"]),
             "max_new_tokens": args.max_new_tokens_instruction, "eos": tokenizer.eos_token_id} for p in chosen]


def load_prompts(args: argparse.Namespace, tokenizer: Any, heads_num: int) -> dict[str, list[dict[str, Any]]]:
    """domain -> prompts, each ``{"source", "ids", "max_new_tokens", "eos"}``."""
    from latticekit.demo import demo_prompts

    out: dict[str, list[dict[str, Any]]] = {}
    for domain in args.domains:
        if domain in ("code", "english"):
            out[domain] = window_prompts(args, tokenizer, domain)
        elif domain == "demo":
            out[domain] = [{"source": p["source"], "ids": tokenizer.encode(p["text"]),
                            "max_new_tokens": args.max_new_tokens, "eos": tokenizer.eos_token_id}
                           for p in demo_prompts()]
        elif domain == "instruction":
            out[domain] = instruction_prompts(args, tokenizer)
        else:
            raise SystemExit(f"unknown domain {domain!r}")
    return out


def run_one(name: str, model: Any, heads: Any, lm: Any, costs: Any, prompt: dict[str, Any]) -> dict[str, Any]:
    """One decode: tokens, wall seconds, steps. ``heads``: label -> heads ("" the main ones)."""
    from latticekit.decoding import DecoderConfig, decode

    name, _, label = name.partition("@")
    heads = heads[label]
    ids, new, eos = prompt["ids"], prompt["max_new_tokens"], prompt["eos"]
    if name == "hf-generate":
        t0 = time.perf_counter()
        out = model.generate(torch.tensor([ids]), max_new_tokens=new, do_sample=False, eos_token_id=eos,
                             pad_token_id=eos if eos is not None else 0)
        wall = time.perf_counter() - t0
        tokens = out[0, len(ids):].tolist()
        return {"tokens": tokens, "wall_s": wall, "calls": len(tokens), "steps": None}
    config = DecoderConfig.parse(name)
    d = decode(model, heads, ids, config, max_new_tokens=new, lms=lm, eos_token_id=eos, costs=costs)
    steps = [{"nodes": s.tree_nodes,
              "accepted": s.num_accepted, "heads_s": s.heads_s, "search_s": s.search_s, "model_s": s.model_s}
             for s in d.steps]
    return {"tokens": d.tokens, "wall_s": d.wall_s, "calls": d.calls, "steps": steps}


def summarise(runs: dict[str, list[list[dict[str, Any]]]], repeats: int) -> dict[str, Any]:
    """decoder -> figures, from runs[decoder][repeat] = one result per prompt."""
    greedy_rates = []
    for r in range(repeats):
        rows = runs["greedy"][r]
        greedy_rates.append(sum(len(x["tokens"]) for x in rows) / sum(x["wall_s"] for x in rows))
    best_rates = list(greedy_rates)  # the faster baseline of each repeat: greedy or hf-generate
    for r, rows in enumerate(runs.get("hf-generate", [])):
        best_rates[r] = max(best_rates[r], sum(len(x["tokens"]) for x in rows) / sum(x["wall_s"] for x in rows))
    out = {}
    for name, per_repeat in runs.items():
        rates, ratios, best_ratios = [], [], []
        for r, rows in enumerate(per_repeat):
            rate = sum(len(x["tokens"]) for x in rows) / sum(x["wall_s"] for x in rows)
            rates.append(rate)
            ratios.append(rate / greedy_rates[r])
            best_ratios.append(rate / best_rates[r])
        rows = per_repeat[0]
        tokens = sum(len(x["tokens"]) for x in rows)
        calls = sum(x["calls"] for x in rows)
        figures: dict[str, Any] = {
            "tokens": tokens, "calls": calls, "tokens_per_call": tokens / calls,
            "tokens_per_s": statistics.median(rates), "tokens_per_s_all": rates,
            "vs_greedy": statistics.median(ratios), "vs_greedy_all": ratios,
            "vs_best_baseline": statistics.median(best_ratios), "vs_best_baseline_all": best_ratios,
        }
        steps = [s for rows in per_repeat for x in rows if x["steps"] for s in x["steps"][1:]]
        if steps:
            figures.update({
                "heads_ms": 1e3 * statistics.fmean(s["heads_s"] for s in steps),
                "search_ms": 1e3 * statistics.fmean(s["search_s"] for s in steps),
                "target_ms": 1e3 * statistics.fmean(s["model_s"] for s in steps),
                "tree_sizes": dict(sorted(Counter(s["nodes"] for s in steps).items())),
                "drafting_steps": sum(s["nodes"] > 0 for s in steps) / len(steps),
            })
        out[name] = figures
    return out


def markdown(report: dict[str, Any]) -> str:
    lines = ["# Decoding speed: latticekit's decoders against greedy decoding", ""]
    lines += [f"- {k}: {v}" for k, v in report["meta"].items()]
    lines += ["", "Command: `" + report["command"] + "`", ""]
    for domain, block in report["domains"].items():
        lines += [f"## {domain} ({block['prompts']} prompts)", "",
                  "| decoder | tokens/call | tokens/s | vs greedy | (per repeat) | vs best baseline | heads ms/step "
                  "| search ms/step | target ms/step | drafting steps |", "|---|---|---|---|---|---|---|---|---|---|"]
        for name, f in block["decoders"].items():
            per = ", ".join(f"{x:.3f}" for x in f["vs_greedy_all"])
            extra = ("| {:.2f} | {:.2f} | {:.2f} | {:.0%} |".format(f["heads_ms"], f["search_ms"], f["target_ms"],
                                                                   f["drafting_steps"])
                     if "heads_ms" in f else "| - | - | - | - |")
            lines.append(f"| {name} | {f['tokens_per_call']:.3f} | {f['tokens_per_s']:.1f} | {f['vs_greedy']:.3f}x "
                         f"| {per} | {f['vs_best_baseline']:.3f}x {extra}")
        lines.append("")
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    domains = [d for d, b in report["domains"].items() if "auto" in b["decoders"]]
    if not domains:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for domain in domains:
        sizes = report["domains"][domain]["decoders"]["auto"]["tree_sizes"]
        total = sum(sizes.values())
        xs = sorted(int(k) for k in sizes)
        axes[0].plot(xs, [sizes[k if k in sizes else str(k)] / total for k in xs], marker="o", label=domain)
    axes[0].set(xlabel="tree nodes verified per step (0 = plain greedy step)", ylabel="share of steps",
                title="auto: tree sizes chosen")
    axes[0].legend(fontsize=8)
    names = list(next(iter(report["domains"].values()))["decoders"])
    width = 0.8 / len(domains)
    for i, domain in enumerate(domains):
        ratios = [report["domains"][domain]["decoders"].get(n, {}).get("vs_greedy", np.nan) for n in names]
        axes[1].bar(np.arange(len(names)) + i * width, ratios, width, label=domain)
    axes[1].axhline(1.0, color="gray", lw=1)
    axes[1].set_xticks(np.arange(len(names)) + 0.4 - width / 2, names, rotation=20, fontsize=7, ha="right")
    axes[1].set(ylabel="tokens/s vs greedy", title="speed (median over repeats)")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def label_and_path(text: str) -> tuple[str, str]:
    """``--more-heads`` values: ``LABEL=PATH`` with a non-empty label and path."""
    label, sep, path = text.partition("=")
    if not (sep and label and path):
        raise argparse.ArgumentTypeError(f"expected LABEL=PATH, got {text!r}")
    return label, path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--heads", default="default")
    p.add_argument("--more-heads", action="append", default=[], metavar="LABEL=PATH", type=label_and_path,
                   help="more heads, for decoders named SPEC@LABEL")
    p.add_argument("--decoders", nargs="+", default=list(DEFAULT_DECODERS))
    p.add_argument("--domains", nargs="+", default=["code", "english", "demo", "instruction"])
    p.add_argument("--manifest", default=str(ROOT / "results" / "heads" / "split.json"))
    p.add_argument("--instruction-prompts", default=str(ROOT / "results" / "heads" / "instruction_prompts.json"))
    p.add_argument("--num-prompts", type=int, default=10, help="per domain (code, english)")
    p.add_argument("--num-instruction", type=int, default=30)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--max-new-tokens-instruction", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-prepare", action="store_true", help="decode the eager model (not the baseline to cite)")
    p.add_argument("--name", default=None, help="results file stem (default: from the heads)")
    p.add_argument("--out", default=str(ROOT / "results" / "decode_speed"))
    args = p.parse_args()
    more = dict(args.more_heads)
    unknown = {n.partition("@")[2] for n in args.decoders} - {""} - set(more)
    if unknown:
        p.error(f"decoders name heads {sorted(unknown)} that no --more-heads gives")

    import transformers

    from latticekit.decoding.costs import step_costs
    from latticekit.demo import embedded_token_lm
    from latticekit.loading import load_heads, load_target
    from latticekit._machine import machine
    from latticekit.torch import prepare_heads, prepare_target

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    model, tokenizer, description = load_target("smollm2")
    heads = load_heads(args.heads, model)
    heads_by_label = {"": heads} | {label: load_heads(path, model) for label, path in more.items()}
    if not args.no_prepare:
        prepare_target(model, heads=heads)
        for extra in list(heads_by_label.values())[1:]:
            prepare_heads(extra, model)
    lm = embedded_token_lm()
    t0 = time.perf_counter()
    costs = step_costs(model)
    log(f"step costs ({time.perf_counter() - t0:.1f} s, {costs.description.get('cache_file')}): "
        + " ".join(f"{n}:{s * 1e3:.1f}" for n, s in zip(costs.nodes, costs.seconds)))
    prompts = load_prompts(args, tokenizer, int(heads.num_heads))
    report: dict[str, Any] = {
        "command": "PYTHONPATH=. python benchmarks/decode_speed.py " + " ".join(sys.argv[1:]),
        "meta": {"model": description, "heads": args.heads, "more_heads": more, "ngram": repr(lm),
                 "prepared": getattr(model, "latticekit_preparation", None) and model.latticekit_preparation.describe(),
                 "torch_threads": torch.get_num_threads(), "torch": torch.__version__, "machine": machine(),
                 "repeats": args.repeats, "decoders interleaved": "per prompt, order rotating",
                 "step_costs_ms": {n: round(s * 1e3, 2) for n, s in zip(costs.nodes, costs.seconds)},
                 "date": time.strftime("%Y-%m-%d %H:%M")},
        "domains": {},
    }
    start = time.perf_counter()
    names = list(args.decoders)
    if names[0] != "greedy":
        names = ["greedy"] + [n for n in names if n != "greedy"]
    with torch.inference_mode():
        # warm-up: every decoder once on the first prompt (oneDNN kernels, caches)
        first = next(iter(prompts.values()))[0]
        for name in names:
            run_one(name, model, heads_by_label, lm, costs, dict(first, max_new_tokens=16))
        for domain, plist in prompts.items():
            runs: dict[str, list[list[dict[str, Any]]]] = {n: [[] for _ in range(args.repeats)] for n in names}
            for r in range(args.repeats):
                for i, prompt in enumerate(plist):
                    shift = (i + r) % len(names)
                    order = names[shift:] + names[:shift]
                    results = {name: run_one(name, model, heads_by_label, lm, costs, prompt) for name in order}
                    want = results["greedy"]["tokens"]
                    for name, res in results.items():
                        if res["tokens"] != want:
                            raise SystemExit(f"{name} differs from greedy on {domain} prompt {i} ({prompt['source']})")
                        runs[name][r].append(res)
                log(f"{domain}: repeat {r + 1}/{args.repeats} done ({time.perf_counter() - start:.0f} s)")
            report["domains"][domain] = {"prompts": len(plist), "decoders": summarise(runs, args.repeats)}
            for name, f in report["domains"][domain]["decoders"].items():
                log(f"  {domain:12} {name:28} {f['tokens_per_call']:.3f} tok/call {f['tokens_per_s']:6.1f} tok/s "
                    f"{f['vs_greedy']:.3f}x")
    report["meta"]["seconds"] = round(time.perf_counter() - start, 1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = args.name or ("untrained" if args.heads.startswith("untrained") else "default")
    (out / f"{stem}.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / f"{stem}.md").write_text(markdown(report))
    if plot(report, out / f"{stem}.png"):
        log(f"wrote {out / (stem + '.png')}")
    log(f"wrote {out / (stem + '.md')}")
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
