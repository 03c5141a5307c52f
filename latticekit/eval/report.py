"""The report of ``latticekit eval``: the paper's measurements from decodings, as markdown,
JSON and PNG figures (matplotlib).

Per domain:

* block efficiency per decoder with the relative change vs vanilla (the paper's Table 4),
  rescoring and target milliseconds per step, wall-clock tokens/s, and whether the output
  equalled greedy decoding;
* repetition of vanilla vs rescored drafts (Table 3);
* per-head entropy and h_max (Figure 3);
* wins / ties / losses of rescored vs vanilla drafts (Table 5);
* block efficiency against p (Figure 7) and one real lattice with its accepted path (Figure 4);
* with the replay engine, the alpha tuning tables and the agreement of replayed and real decodes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

import numpy as np

from latticekit.eval import analysis
from latticekit.loading import Tokenizer
from latticekit.decoding.records import Decoding

__all__ = ["summarize", "agreement", "write_report"]


def _exact(runs: list[Decoding], greedy: list[Decoding]) -> Optional[bool]:
    if runs[0].config.temperature > 0 or runs[0].replayed:
        return None
    return all(a.tokens == b.tokens for a, b in zip(runs, greedy))


def summarize(results: Mapping[str, Mapping[str, list[Decoding]]]) -> dict[str, Any]:
    """The figures of the report as plain JSON-able data (see the module docstring)."""
    summary: dict[str, Any] = {}
    for domain, per in results.items():
        greedy = per["greedy"]
        vanilla_be = analysis.block_efficiency(per["vanilla"]) if "vanilla" in per else None
        rows = []
        for label, runs in per.items():
            be = analysis.block_efficiency(runs)
            steps = [s for run in runs for s in run.steps]
            times = analysis.step_times(steps)
            tokens = sum(len(r.tokens) for r in runs)
            wall = sum(r.wall_s for r in runs)
            config = runs[0].config
            replayed = runs[0].replayed
            rows.append({
                "decoder": label, "method": config.method, "k": config.k, "p": config.p,
                "alpha": config.alpha, "lm": config.lm, "temperature": config.temperature,
                "prompts": len(runs), "tokens": tokens, "calls": sum(r.calls for r in runs),
                "block_efficiency": be,
                "vs_vanilla_pct": None if not vanilla_be else 100.0 * (be / vanilla_be - 1.0),
                # a replay's heads and neural-rescorer seconds are batched costs divided per
                # position, not what a step costs: left out
                "heads_ms": None if replayed else times.heads_ms,
                "search_ms": None if replayed and config.method == "neural" else times.search_ms,
                "model_ms": None if replayed else times.model_ms,
                "tokens_per_s": tokens / wall if wall and not replayed else None,
                "exact": _exact(runs, greedy), "replayed": replayed,
            })
        block: dict[str, Any] = {"decoders": rows}
        drafted = {label: [s for r in runs for s in r.steps]
                   for label, runs in per.items() if runs[0].config.method != "greedy"}
        if drafted:
            # Entropy depends only on the heads and the prefix: any greedy-mode decoder's steps do.
            first = next(iter(drafted.values()))
            block["head_entropy"] = analysis.head_entropy(first).to_json()
        block["repetition"] = {
            label: {which: vars(analysis.repetition(analysis.blocks(steps, which)))
                    for which in ("vanilla", "rescored")}
            for label, steps in drafted.items()
        }
        block["wins_ties_losses"] = {
            label: analysis.wins_ties_losses(steps).to_json()
            for label, steps in drafted.items()
            if per[label][0].config.method == "ngram" and per[label][0].config.temperature == 0
        }
        summary[domain] = block
    return summary


def _fmt(value: Any, spec: str = ".3f") -> str:
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return "-"
    return format(value, spec)


def _markdown(summary: Mapping[str, Any], meta: Mapping[str, Any]) -> str:
    lines = ["# Blockwise parallel decoding: evaluation", ""]
    lines += [f"- {key}: {value}" for key, value in meta.items()]
    for domain, block in summary.items():
        lines += ["", f"## {domain}", "", "### Block efficiency (decoded tokens / serial target calls)", "",
                  "| decoder | block eff. | vs vanilla | heads ms/step | rescoring ms/step | target ms/step "
                  "| tokens/s | = greedy |", "|---|---|---|---|---|---|---|---|"]
        for r in block["decoders"]:
            exact = "replay" if r.get("replayed") else {True: "yes", False: "**NO**", None: "n/a (sampling)"}[r["exact"]]
            lines.append(f"| {r['decoder']} | {_fmt(r['block_efficiency'])} | {_fmt(r['vs_vanilla_pct'], '+.1f')}% "
                         f"| {_fmt(r['heads_ms'], '.2f')} | {_fmt(r['search_ms'], '.2f')} | {_fmt(r['model_ms'], '.2f')} "
                         f"| {_fmt(r['tokens_per_s'], '.1f')} | {exact} |")
        if block["repetition"]:
            lines += ["", "### Repetition within draft blocks (before / after rescoring)", "",
                      "| decoder | identical neighbours, vanilla % | rescored % | mean max run, vanilla | rescored |",
                      "|---|---|---|---|---|"]
            for label, rep in block["repetition"].items():
                v, r = rep["vanilla"], rep["rescored"]
                lines.append(f"| {label} | {_fmt(v['identical_pct'], '.2f')} | {_fmt(r['identical_pct'], '.2f')} "
                             f"| {_fmt(v['mean_max_run'], '.3f')} | {_fmt(r['mean_max_run'], '.3f')} |")
        if block["wins_ties_losses"]:
            lines += ["", "### Rescored vs vanilla drafts per step", "",
                      "| decoder | wins | ties | losses | drafts differ | wins that repaired a repetition % "
                      "| losses that introduced one % |", "|---|---|---|---|---|---|---|"]
            for label, w in block["wins_ties_losses"].items():
                lines.append(f"| {label} | {w['wins']} | {w['ties']} | {w['losses']} | {w['differ']} "
                             f"| {_fmt(w['repaired_pct'], '.1f')} | {_fmt(w['introduced_pct'], '.1f')} |")
        if block.get("alpha_tuning"):
            lines += ["", "### Alpha tuned on held-out tuning prompts (block efficiency; chosen alpha in bold)", ""]
            for label, tuned in block["alpha_tuning"].items():
                alphas = list(tuned["table"])
                lines += [f"{label} ({tuned['prompts']} tuning prompts from other files than the reported ones):", "",
                          "| alpha | " + " | ".join(alphas) + " |", "|---|" + "---|" * len(alphas),
                          "| block eff. | " + " | ".join(
                              (f"**{tuned['table'][a]:.3f}**" if float(a) == tuned["chosen"] else f"{tuned['table'][a]:.3f}")
                              for a in alphas) + " |", ""]
        if block.get("replay_vs_decode"):
            lines += ["", "### Replay vs real decoding (same prompts)", "",
                      "| decoder | prompts | identical steps | block eff. replayed | block eff. decoded |",
                      "|---|---|---|---|---|"]
            for label, agree in block["replay_vs_decode"].items():
                lines.append(f"| {label} | {agree['prompts']} | {agree['identical']} | "
                             f"{_fmt(agree['replayed_be'])} | {_fmt(agree['decoded_be'])} |")
        if "head_entropy" in block and block["head_entropy"]["steps"]:
            ent = block["head_entropy"]
            lines += ["", f"### Head entropy (nats; h_max = {ent['h_max']})", "",
                      "| head | mean | p5 | p25 | median | p75 | p95 |", "|---|---|---|---|---|---|---|"]
            for i, (mean, q) in enumerate(zip(ent["mean"], ent["quantiles"]), start=1):
                lines.append(f"| {i} | {mean:.3f} | " + " | ".join(f"{x:.3f}" for x in q) + " |")
    return "\n".join(lines) + "\n"


def _sweeps(block: Mapping[str, Any]) -> dict[str, list[tuple[int, float]]]:
    """n-gram decoders differing only in p: (k, alpha, lm) -> [(p, block efficiency)]."""
    groups: dict[str, list[tuple[int, float]]] = {}
    for r in block["decoders"]:
        if r["method"] == "ngram" and r["temperature"] == 0:
            key = f"k={r['k']} alpha={r['alpha']:g}" + (f" lm={r['lm']}" if r["alpha"] > 0 else " (0-gram)")
            groups.setdefault(key, []).append((r["p"], r["block_efficiency"]))
    return {key: sorted(points) for key, points in groups.items() if len(points) > 1}


def _plots(summary: Mapping[str, Any], out_dir: Path) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    domains = list(summary)
    fig, axes = plt.subplots(1, len(domains), figsize=(5 * len(domains), 3.6), squeeze=False)
    drew = False
    for ax, domain in zip(axes[0], domains):
        block = summary[domain]
        for key, points in _sweeps(block).items():
            ps, bes = zip(*points)
            ax.plot(ps, bes, marker="o", label=key)
            drew = True
        for r in block["decoders"]:
            if r["method"] in ("vanilla", "oracle") and r["temperature"] == 0:
                ax.axhline(r["block_efficiency"], ls="--" if r["method"] == "vanilla" else ":", lw=1,
                           color="gray" if r["method"] == "vanilla" else "green")
                ax.annotate(r["decoder"], (1, r["block_efficiency"]), fontsize=7)
        ax.set_xscale("log", base=2)
        ax.set(title=domain, xlabel="p (drafts verified per step)", ylabel="block efficiency")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    if drew:
        fig.tight_layout()
        fig.savefig(out_dir / "block_efficiency_vs_p.png", dpi=120)
        written.append("block_efficiency_vs_p.png")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5, 3.6))
    drew = False
    for domain in domains:
        ent = summary[domain].get("head_entropy")
        if ent and ent["steps"]:
            heads = np.arange(1, len(ent["mean"]) + 1)
            q = np.asarray(ent["quantiles"])
            ax.plot(heads, ent["mean"], marker="o", label=f"{domain} (h_max={ent['h_max']})")
            ax.fill_between(heads, q[:, 1], q[:, 3], alpha=0.2)
            drew = True
    if drew:
        ax.set(xlabel="head", ylabel="entropy (nats)", title="Head entropy: mean and 25-75%")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out_dir / "head_entropy.png", dpi=120)
        written.append("head_entropy.png")
    plt.close(fig)
    return written


def _draw_lattice(results: Mapping[str, Mapping[str, list[Decoding]]], tokenizer: Tokenizer, path: Path) -> bool:
    """One real lattice (Figure 4): the step of a greedy n-gram decoder with the most accepted
    tokens among those whose best draft differs from vanilla's; arcs best first, the accepted
    path filled green, the vanilla arg-max path outlined red."""
    import matplotlib.pyplot as plt

    best = None
    for per in results.values():
        for runs in per.values():
            if runs[0].config.method != "ngram" or runs[0].config.temperature > 0:
                continue
            for run in runs:
                for step in run.steps:
                    if step.drafts and step.drafts[0] != step.vanilla_draft and \
                            (best is None or step.num_accepted > best[0].num_accepted):
                        best = (step, runs[0].config.label)
    if best is None:
        return False
    step, label = best
    tokens, scores = step.lattice_tokens, step.lattice_scores
    assert tokens is not None and scores is not None  # the evaluation's decodes record their lattices
    h, k = tokens.shape
    rows = min(k, 6)
    accepted = (step.root_token,) + tuple(step.emitted[: step.num_accepted])
    vanilla = (step.root_token,) + step.vanilla_draft
    fig, ax = plt.subplots(figsize=(1.3 * h + 1, 0.55 * rows + 1.2))
    for j in range(h):
        for r in range(rows if j else 1):
            tok = int(tokens[j, r])
            on_path = j < len(accepted) and accepted[j] == tok
            ax.add_patch(plt.Rectangle((j - 0.45, -r - 0.4), 0.9, 0.8, fill=on_path, color="#8fd18f",
                                       ec="red" if vanilla[j] == tok else "gray", lw=1.5 if vanilla[j] == tok else 0.5))
            text = tokenizer.decode([tok]).replace("\n", "\\n")[:10]
            ax.text(j, -r, f"{text!r}\n{scores[j, r]:.2f}", ha="center", va="center", fontsize=7)
    ax.set_xlim(-0.6, h - 0.4)
    ax.set_ylim(-rows + 0.4, 0.6)
    ax.set_xticks(range(h), [f"head {j + 1}" for j in range(h)], fontsize=7)
    ax.set_yticks([])
    ax.set_title(f"{label}: {step.num_accepted} accepted (green), vanilla path outlined red", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _alpha_plot(summary: Mapping[str, Any], out_dir: Path) -> list[str]:
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    tuned = [(domain, label, t) for domain, block in summary.items()
             for label, t in (block.get("alpha_tuning") or {}).items()]
    if not tuned:
        return []
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for domain, label, t in tuned:
        alphas = [float(a) for a in t["table"]]
        ax.plot(alphas, list(t["table"].values()), marker="o", label=f"{domain}: {label}")
    ax.set_xscale("log")
    ax.set(xlabel="alpha", ylabel="block efficiency (tuning prompts)", title="Alpha tuning")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out_dir / "alpha_tuning.png", dpi=120)
    plt.close(fig)
    return ["alpha_tuning.png"]


def agreement(replayed: Mapping[str, Mapping[str, list[Decoding]]],
              decoded: Mapping[str, Mapping[str, list[Decoding]]]) -> dict[str, dict[str, Any]]:
    """Per domain and decoder, on the prompts both cover: how many replayed decodes took the very
    same steps (tokens emitted per call) as real ones, and both block efficiencies."""
    out: dict[str, dict[str, Any]] = {}
    for domain, per in decoded.items():
        for label, runs in per.items():
            mine = list(replayed.get(domain, {}).get(label, []))
            pairs = []
            for d in runs:  # each replayed decode pairs with at most one real one
                match = next((r for r in mine if r.prompt == d.prompt), None)
                if match is not None:
                    mine.remove(match)
                    pairs.append((match, d))
            if not pairs:
                continue
            out.setdefault(domain, {})[label] = {
                "prompts": len(pairs),
                "identical": sum([s.emitted for s in r.steps] == [s.emitted for s in d.steps] for r, d in pairs),
                "replayed_be": analysis.block_efficiency(r for r, _ in pairs),
                "decoded_be": analysis.block_efficiency(d for _, d in pairs),
            }
    return out


def write_report(results: Mapping[str, Mapping[str, list[Decoding]]], out_dir: Any, meta: Mapping[str, Any],
                 records: bool = False, tokenizer: Optional[Tokenizer] = None,
                 tuning: Optional[Mapping[str, Any]] = None,
                 replay_vs_decode: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    """Writes ``eval.md``, ``eval.json`` (and ``records.json`` with every step when asked) and
    the figures into ``out_dir``; returns the summary. ``tokenizer`` spells the lattice drawing;
    ``tuning`` (domain -> decoder -> alpha table, see
    :func:`latticekit.eval.evaluate.run_replay_eval`) and
    ``replay_vs_decode`` (:func:`agreement`) add their sections."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(results)
    for domain, block in summary.items():
        block["alpha_tuning"] = dict((tuning or {}).get(domain, {}))
        block["replay_vs_decode"] = dict((replay_vs_decode or {}).get(domain, {}))
    figures = _plots(summary, out)
    figures += _alpha_plot(summary, out)
    if figures and _draw_lattice(results, tokenizer or Tokenizer(), out / "lattice.png"):
        figures.append("lattice.png")
    meta = dict(meta, figures=", ".join(figures) or "none (matplotlib missing or nothing to draw)")
    (out / "eval.json").write_text(json.dumps({"meta": meta, "summary": summary}, indent=1) + "\n")
    (out / "eval.md").write_text(_markdown(summary, meta))
    if records:
        dump = {domain: {label: [{"prompt": r.prompt, "tokens": r.tokens,
                                  "steps": [s.to_json() for s in r.steps]} for r in runs]
                         for label, runs in per.items()}
                for domain, per in results.items()}
        (out / "records.json").write_text(json.dumps(dump) + "\n")
    return summary
