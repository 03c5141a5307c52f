"""Benchmark: heads-free drafting against prompt lookup decoding, side by side, on one prepared target.

Every decoder runs on the same prepared SmolLM2-135M-Instruct (``latticekit.torch.prepare_target``),
prompt by prompt in rotating order, so machine noise reaches all alike, and every decoder's
tokens are checked equal to latticekit's greedy decoding on that prompt:

* ``greedy``: latticekit's plain greedy loop (the baseline);
* ``pld:n=N,m=M``: transformers' prompt lookup decoding on the same model,
  ``model.generate(prompt_lookup_num_tokens=N, max_matching_ngram_size=M, do_sample=False)``;
  its target calls are counted with a forward hook (the prompt's forward, which also yields the
  first token, counts as a call, as latticekit's first step does);
* ``headsfree``: latticekit with no heads (the decoded text's n-gram cache and the shipped Katz
  4-gram, ``latticekit.drafting.drafters.headsfree``);
* ``heads+ngram``: the shipped heads' lattice united with those n-gram continuations;
* ``auto``: the shipped heads and 4-gram as ``latticekit.generate`` uses them, each call learning
  its arms anew (``generate(..., arms=False)``); ``auto@none``: the same without heads
  (``generate`` without heads); a name ending ``/kept`` (``auto/kept``, ``auto@none/kept``): the
  arms' outcomes kept across calls, as ``generate`` keeps them by default, in ``<out>/arms``
  (``latticekit.drafting.outcomes``; the warm-up call and every earlier chunk of the run feed
  it); ``/kept0``: kept but not aged when a call resumes from them
  (``AutoDrafter.resume(kept, gap=0)``, what latticekit did before ageing), in
  ``<out>/arms-unaged``.

Domains (nothing the heads or the n-gram model saw):

* ``code`` / ``english``: windows of ``--prompt-tokens`` tokens of the held-out files of the heads'
  split (``benchmarks/results/heads/split.json``: CPython stdlib, Python docs);
* ``instruction``: held-out requests of ``--instruction-prompts`` (the heads' held-out instruction
  prompts) through SmolLM2-Instruct's chat template, chosen as ``decode_speed.py`` chooses them;
* ``copy``: copy-heavy requests from held-out files (add type hints, add a docstring, rename a
  variable, fix an inserted typo; ``headsfree_prompts.py``), through the chat template.

Per domain and decoder: tokens per target call, tokens/s (median over ``--repeats`` passes over
the domain's prompts), its ratio to greedy's and to the best prompt-lookup variant's in the same
pass, and for latticekit's drafters the milliseconds per step spent drafting and in the target.

Timing wants a quiet machine: run every chunk with nothing else busy (the committed results ran
with every other busy process stopped for the duration). A chunk is one domain and a
range of its prompts (``--domain code --prompts 0:10``); each writes
``<out>/chunks/<domain>-<a>-<b>.json``, and ``--merge`` assembles the report
(``<out>/<name>.{json,md}``). The target's step costs are measured once (``--measure-costs``,
written to ``<out>/step_costs.json``) and read by every chunk.

Usage::

    PYTHONPATH=. python benchmarks/headsfree_speed.py --measure-costs
    PYTHONPATH=. python benchmarks/headsfree_speed.py --domain code --prompts 0:10
    ...
    PYTHONPATH=. python benchmarks/headsfree_speed.py --merge
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
PLD = tuple(f"pld:n={n},m={m}" for m in (2, 4) for n in (3, 5, 10))
DEFAULT_DECODERS = ("greedy",) + PLD + ("headsfree", "heads+ngram", "auto")
DOMAINS = ("code", "english", "instruction", "copy")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- prompts -------------------------------------------------------------------------------------

def load_prompts(args: argparse.Namespace, tokenizer: Any, domain: str) -> tuple[list[dict[str, Any]], str]:
    """The domain's prompts (``source``, ``ids``, ``max_new_tokens``, ``eos``) and where they came from."""
    from decode_speed import instruction_prompts, window_prompts
    from headsfree_prompts import copy_requests

    if domain in ("code", "english"):
        return (window_prompts(args, tokenizer, domain),
                f"{args.prompt_tokens}-token windows of held-out files ({args.manifest})")
    if domain == "instruction":
        prompts = instruction_prompts(args, tokenizer)
        return prompts, f"{args.instruction_prompts} (held-out, every other, {len(prompts)} seeded)"
    if domain == "copy":
        return ([{"source": r["id"], "ids": tokenizer.chat(r["user"]), "max_new_tokens": args.max_new_tokens_copy,
                  "eos": tokenizer.eos_token_id} for r in copy_requests(Path(args.manifest), args.num_copy)],
                "built by benchmarks/headsfree_prompts.py from held-out files")
    raise SystemExit(f"unknown domain {domain!r}")


# -- one decode ------------------------------------------------------------------------------------

class CallCounter:
    """Counts the target's forward calls (transformers' generate)."""

    def __init__(self, model: Any) -> None:
        self.calls = 0
        model.register_forward_pre_hook(self._hook)

    def _hook(self, module: Any, args: Any) -> None:
        self.calls += 1


def run_one(name: str, model: Any, heads: Any, lm: Any, costs: Any, counter: CallCounter,
            prompt: dict[str, Any], arms: Any = None) -> dict[str, Any]:
    """One decode: tokens, wall seconds, target calls, per-step figures (latticekit's)."""
    from latticekit.decoding import DecoderConfig, decode

    ids, new, eos = prompt["ids"], prompt["max_new_tokens"], prompt["eos"]
    if name.startswith("pld:"):
        knobs = dict(item.split("=") for item in name[4:].split(","))
        before = counter.calls
        t0 = time.perf_counter()
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=new, do_sample=False, eos_token_id=eos,
                             pad_token_id=eos if eos is not None else 0,
                             prompt_lookup_num_tokens=int(knobs["n"]), max_matching_ngram_size=int(knobs["m"]))
        wall = time.perf_counter() - t0
        tokens = out[0, len(ids):].tolist()
        return {"tokens": tokens, "wall_s": wall, "calls": counter.calls - before, "steps": None}
    decoder, _, kept = name.partition("/")  # arm outcomes kept across calls: kept, or kept0 (not aged)
    spec, _, which = decoder.partition("@")  # auto@untrained: with untrained heads
    use = None if spec == "headsfree" else heads[which or "default"]
    with _unaged() if kept == "kept0" else contextlib.nullcontext():
        d = decode(model, use, ids, DecoderConfig.parse(spec), max_new_tokens=new, lms=lm, eos_token_id=eos,
                   costs=costs, arms=arms[kept] if kept else None)
    steps = [{"nodes": s.tree_nodes,
              "accepted": s.num_accepted, "draft_s": s.heads_s + s.search_s, "model_s": s.model_s}
             for s in d.steps]
    return {"tokens": d.tokens, "wall_s": d.wall_s, "calls": d.calls, "steps": steps}


@contextlib.contextmanager
def _unaged() -> Iterator[None]:
    """Within it, a call resumed from kept arm outcomes is not aged (``gap=0``: one long call)."""
    from latticekit.drafting.drafters.auto import AutoDrafter

    resume = AutoDrafter.resume
    AutoDrafter.resume = functools.partialmethod(resume, gap=0)  # type: ignore[method-assign]
    try:
        yield
    finally:
        AutoDrafter.resume = resume  # type: ignore[method-assign]


# -- a chunk -----------------------------------------------------------------------------------------

def run_chunk(args: argparse.Namespace) -> int:
    import transformers

    from latticekit.decoding.costs import StepCosts
    from latticekit.demo import embedded_token_lm
    from latticekit.loading import load_heads, load_target
    from latticekit._machine import machine
    from latticekit.torch import prepare_target

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    model, tokenizer, description = load_target("smollm2")
    from latticekit.drafting.outcomes import ArmStore

    heads = {"default": load_heads("default", model), "none": None}
    if any(name.endswith("@untrained") for name in args.decoders):
        heads["untrained"] = load_heads(f"untrained:{heads['default'].num_heads}", model)
        prepare_target(model, heads=heads["untrained"])
    prepare_target(model, heads=heads["default"])
    counter = CallCounter(model)
    lm = embedded_token_lm()
    out = Path(args.out)
    arms = {"kept": ArmStore(out / "arms"), "kept0": ArmStore(out / "arms-unaged")}
    costs_file = out / "step_costs.json"
    if args.measure_costs:
        from latticekit.decoding.costs import measure_step_costs

        with torch.inference_mode():
            costs = measure_step_costs(model)
        out.mkdir(parents=True, exist_ok=True)
        costs_file.write_text(json.dumps(costs.to_json(), indent=1) + "\n")
        log("step costs (ms): " + " ".join(f"{n}:{s * 1e3:.1f}" for n, s in zip(costs.nodes, costs.seconds)))
        return 0
    costs = StepCosts.from_json(json.loads(costs_file.read_text()))
    plist, origin = load_prompts(args, tokenizer, args.domain)
    a, b = (int(x) for x in args.prompts.split(":"))
    chosen = list(range(len(plist)))[a:b]
    names = list(args.decoders)
    if names[0] != "greedy":
        names = ["greedy"] + [n for n in names if n != "greedy"]
    record: dict[str, Any] = {
        "domain": args.domain, "prompts": chosen, "origin": origin, "decoders": names, "repeats": args.repeats,
        "sources": [plist[i]["source"] for i in chosen],
        "prompt_tokens": [len(plist[i]["ids"]) for i in chosen],
        "meta": {"model": description, "heads": "default (latticekit.heads.default_heads)", "ngram": repr(lm),
                 "prepared": model.latticekit_preparation.describe(), "torch_threads": torch.get_num_threads(),
                 "torch": torch.__version__, "transformers": transformers.__version__, "machine": machine(),
                 "step_costs_ms": {n: round(s * 1e3, 2) for n, s in zip(costs.nodes, costs.seconds)},
                 "date": time.strftime("%Y-%m-%d %H:%M")},
        "runs": {n: [[] for _ in range(args.repeats)] for n in names},
        "mismatches": [],
    }
    start = time.perf_counter()
    with torch.inference_mode():
        first = plist[chosen[0]]
        for name in names:  # warm-up: every decoder once (oneDNN kernels, caches, the n-gram index)
            run_one(name, model, heads, lm, costs, counter, dict(first, max_new_tokens=16), arms)
        for r in range(args.repeats):
            for i in chosen:
                prompt = plist[i]
                shift = (i + r) % len(names)
                order = names[shift:] + names[:shift]
                results = {name: run_one(name, model, heads, lm, costs, counter, prompt, arms) for name in order}
                want = results["greedy"]["tokens"]
                for name in names:
                    res = results[name]
                    if res["tokens"] != want:
                        at = next((j for j, (x, y) in enumerate(zip(res["tokens"], want)) if x != y),
                                  min(len(res["tokens"]), len(want)))
                        record["mismatches"].append({"decoder": name, "prompt": i, "repeat": r, "first_difference": at})
                        if not name.startswith("pld:"):
                            raise SystemExit(f"{name} differs from greedy on {args.domain} prompt {i} at token {at}")
                    record["runs"][name][r].append({k: res[k] for k in ("wall_s", "calls", "steps")}
                                                   | {"tokens": len(res["tokens"])})
            log(f"{args.domain} {args.prompts}: repeat {r + 1}/{args.repeats} ({time.perf_counter() - start:.0f} s)")
    record["seconds"] = round(time.perf_counter() - start, 1)
    (out / "chunks").mkdir(parents=True, exist_ok=True)
    path = out / "chunks" / f"{args.domain}-{a}-{b}.json"
    path.write_text(json.dumps(record) + "\n")
    log(f"wrote {path}")
    return 0


# -- the report --------------------------------------------------------------------------------------

def summarise(runs: dict[str, list[list[dict[str, Any]]]], repeats: int, versus: tuple[str, ...] = ()) -> dict[str, Any]:
    """decoder -> figures, from runs[decoder][repeat] = one result per prompt; ``versus``:
    decoders every other is also compared with, repeat by repeat."""
    def rate(rows: list[dict[str, Any]]) -> float:
        return sum(x["tokens"] for x in rows) / sum(x["wall_s"] for x in rows)

    greedy = [rate(runs["greedy"][r]) for r in range(repeats)]
    pld = [max(rate(runs[n][r]) for n in runs if n.startswith("pld:")) if any(n.startswith("pld:") for n in runs)
           else float("nan") for r in range(repeats)]
    out = {}
    for name, per_repeat in runs.items():
        rates = [rate(per_repeat[r]) for r in range(repeats)]
        rows = per_repeat[0]
        tokens, calls = sum(x["tokens"] for x in rows), sum(x["calls"] for x in rows)
        figures: dict[str, Any] = {
            "tokens": tokens, "calls": calls, "tokens_per_call": tokens / calls,
            "tokens_per_s": statistics.median(rates), "tokens_per_s_all": rates,
            "vs_greedy": statistics.median(x / g for x, g in zip(rates, greedy)),
            "vs_best_pld": statistics.median(x / p for x, p in zip(rates, pld)),
        }
        for other in versus:
            if other in runs and other != name:
                each = [x / rate(runs[other][r]) for r, x in enumerate(rates)]
                figures.setdefault("versus", {})[other] = {"median": statistics.median(each), "each": each}
        steps = [s for rows in per_repeat for x in rows if x["steps"] for s in x["steps"][1:]]
        if steps:
            figures.update({
                "draft_ms": 1e3 * statistics.fmean(s["draft_s"] for s in steps),
                "target_ms": 1e3 * statistics.fmean(s["model_s"] for s in steps),
                "drafting_steps": sum(s["nodes"] > 0 for s in steps) / len(steps),
                "tree_sizes": dict(sorted(Counter(s["nodes"] for s in steps).items())),
            })
        out[name] = figures
    return out


def merge(args: argparse.Namespace) -> int:
    out = Path(args.out)
    chunks = [json.loads(p.read_text()) for p in sorted((out / "chunks").glob("*.json"))]
    if not chunks:
        raise SystemExit(f"no chunks in {out / 'chunks'}")
    report: dict[str, Any] = {"title": args.title, "command": args.command,
                              "meta": chunks[0]["meta"], "domains": {}, "chunks": []}
    for domain in DOMAINS:
        mine = [c for c in chunks if c["domain"] == domain]
        if not mine:
            continue
        names, repeats = mine[0]["decoders"], mine[0]["repeats"]
        if any(c["decoders"] != names or c["repeats"] != repeats or c["meta"]["step_costs_ms"]
               != mine[0]["meta"]["step_costs_ms"] for c in mine):
            raise SystemExit(f"{domain}: chunks with different decoders, repeats or step costs")
        runs = {n: [[row for c in mine for row in c["runs"][n][r]] for r in range(repeats)] for n in names}
        report["domains"][domain] = {
            "prompts": sum(len(c["prompts"]) for c in mine), "origin": mine[0]["origin"],
            "prompt_tokens_median": statistics.median(t for c in mine for t in c["prompt_tokens"]),
            "repeats": repeats, "mismatches": [m for c in mine for m in c["mismatches"]],
            "decoders": summarise(runs, repeats, tuple(args.versus))}
        report["chunks"] += [{"domain": domain, "prompts": [c["prompts"][0], c["prompts"][-1] + 1],
                              "seconds": c["seconds"], "date": c["meta"]["date"]} for c in mine]
    (out / f"{args.name}.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / f"{args.name}.md").write_text(markdown(report))
    for domain in report["domains"]:
        plot(report, domain, out / f"{args.name}-{domain}.png")
    print(markdown(report))
    return 0


def plot(report: dict[str, Any], domain: str, path: Path) -> bool:
    """Tokens per call and tokens/s (median, with every repeat's) of each decoder on one domain;
    False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    figures = report["domains"][domain]["decoders"]
    names = list(figures)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    axes[0].bar(names, [figures[n]["tokens_per_call"] for n in names], color="tab:blue")
    axes[0].set(ylabel="tokens per target call", title=f"{domain}: tokens per call")
    axes[1].bar(names, [figures[n]["tokens_per_s"] for n in names], color="tab:green")
    for i, n in enumerate(names):
        axes[1].plot([i] * len(figures[n]["tokens_per_s_all"]), figures[n]["tokens_per_s_all"], "k.", ms=3)
    axes[1].set(ylabel="tokens/s (median; dots: repeats)", title=f"{domain}: tokens per second")
    for ax in axes:
        ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def markdown(report: dict[str, Any]) -> str:
    lines = [f"# {report.get('title', 'Heads-free drafting against prompt lookup decoding')}", ""]
    lines += [f"- {k}: {v}" for k, v in report["meta"].items() if k != "date"]
    lines += ["", "Command: `" + report["command"] + "`", ""]
    for domain, block in report["domains"].items():
        lines += [f"## {domain} ({block['prompts']} prompts, median {block['prompt_tokens_median']:.0f} prompt "
                  f"tokens; {block['origin']})", "",
                  "| decoder | tokens/call | tokens/s | vs greedy | vs best PLD | (tokens/s per repeat) "
                  "| draft ms/step | target ms/step | drafting steps |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for name, f in block["decoders"].items():
            per = ", ".join(f"{x:.1f}" for x in f["tokens_per_s_all"])
            extra = ("| {:.2f} | {:.1f} | {:.0%} |".format(f["draft_ms"], f["target_ms"], f["drafting_steps"])
                     if "draft_ms" in f else "| - | - | - |")
            lines.append(f"| {name} | {f['tokens_per_call']:.3f} | {f['tokens_per_s']:.1f} | {f['vs_greedy']:.3f}x "
                         f"| {f['vs_best_pld']:.3f}x | {per} {extra}")
        versus = sorted({o for f in block["decoders"].values() for o in f.get("versus", {})})
        for other in versus:
            lines += ["", f"Against `{other}`, repeat by repeat (median; each repeat's ratio):", "",
                      "| decoder | median | each repeat |", "|---|---|---|"]
            lines += [f"| {name} | {f['versus'][other]['median']:.3f}x | "
                      + ", ".join(f"{x:.3f}" for x in f["versus"][other]["each"]) + " |"
                      for name, f in block["decoders"].items() if other in f.get("versus", {})]
        if block["mismatches"]:
            lines += ["", "Outputs that differed from greedy's: " + ", ".join(
                f"{m['decoder']} on prompt {m['prompt']} (repeat {m['repeat']}, token {m['first_difference']})"
                for m in block["mismatches"])]
        lines.append("")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--domain", choices=DOMAINS)
    p.add_argument("--prompts", default="0:1000", help="A:B, the chunk's prompts of the domain")
    p.add_argument("--decoders", nargs="+", default=list(DEFAULT_DECODERS))
    p.add_argument("--measure-costs", action="store_true", help="measure the target's step costs and stop")
    p.add_argument("--merge", action="store_true", help="assemble the report from the chunks")
    p.add_argument("--manifest", default=str(ROOT / "results" / "heads" / "split.json"))
    p.add_argument("--instruction-prompts", default=str(ROOT / "results" / "heads" / "instruction_prompts.json"))
    p.add_argument("--num-prompts", type=int, default=10, help="per domain (code, english)")
    p.add_argument("--num-instruction", type=int, default=30)
    p.add_argument("--num-copy", type=int, default=24)
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--max-new-tokens-instruction", type=int, default=128)
    p.add_argument("--max-new-tokens-copy", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--versus", nargs="*", default=[], help="--merge: decoders to compare every other with")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--name", default="headsfree")
    p.add_argument("--title", default="Heads-free drafting against prompt lookup decoding")
    p.add_argument("--command", default="PYTHONPATH=. python benchmarks/headsfree_speed.py --domain D --prompts A:B "
                   "(per chunk), then --merge", help="the commands that made the chunks (for the report)")
    p.add_argument("--out", default=str(ROOT / "results" / "headsfree"))
    args = p.parse_args()
    if args.merge:
        return merge(args)
    if not args.measure_costs and args.domain is None:
        p.error("--domain is needed (or --measure-costs, --merge)")
    return run_chunk(args)


if __name__ == "__main__":
    sys.exit(main())
