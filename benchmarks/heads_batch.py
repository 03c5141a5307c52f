"""Benchmark: the heads' full-vocabulary lattices for a batch of requests, row by row against
together (:func:`latticekit.decoding.lattices.full_lattices`, the vLLM lattice proposer's step
without an ``lm``).

SmolLM2-135M-Instruct's shipped heads (7 draft heads over its 49,152 words) on seeded random
hidden states, ``--rows`` requests at a time, every head and (``--depths``) heads 2..d + 1
alone; every row's lattice is checked equal to the one its row alone gives, but for the root
(the row's last token alone, scored 0) and cut to d + 1 positions (tokens, widths; scores within
1e-4); and (``--candidates``) every head over that many candidate tokens and each row's own
(the vLLM lattice proposer's vocabulary ``"seen"``), each row's lattice checked equal to its own
alone, and timed again from cold caches with every head and heads 2..d + 1 alone (``--depths``);
and (``--blocks``) the heads' blocks fused (``BlockHeads.fuse``, as the vLLM lattice
proposer and ``prepare_heads`` run them) against one by one, from cold caches. Median
milliseconds of ``--repeats`` calls each way (the full ones interleaved, the candidate ones after
them, ``--blocks``' interleaved, 4 x ``--repeats`` each), (``--dtypes``) the static candidates
projected in each dtype from cold caches, interleaved, and their lattices' agreement with the
float32 ones, and the machine. Writes
``results/heads_batch.{json,md}``::

    PYTHONPATH=. python benchmarks/heads_batch.py [--threads 2] [--rows 1 4 16] [--depths 1 2 4] [--candidates 8192] [--blocks] [--dtypes float32 bfloat16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

OUT = Path(__file__).resolve().parent / "results" / "heads_batch"


def same(want: Any, got: Any, root: int, depth: Optional[int]) -> bool:
    """``got`` (``full_lattices``) is the row's own lattice ``want``: its root the row's last
    token alone, scored 0, then ``want``'s positions up to ``depth`` drafts (tokens, widths;
    scores within 1e-4)."""
    h = got.h
    return (h == (want.h if depth is None else min(want.h, depth + 1)) and got.tokens[0, 0] == root
            and got.widths[0] == 1 and got.scores[0, 0] == 0 and np.array_equal(want.tokens[1:h], got.tokens[1:])
            and np.array_equal(want.widths[1:h], got.widths[1:])
            and np.allclose(want.scores[1:h], got.scores[1:], atol=1e-4))


def agreement(want: list[Any], got: list[Any]) -> dict[str, float]:
    """How far lattices ``got`` keep ``want``'s (the float32 ones): the share of draft positions
    whose first arc is the same, the share of top-k arcs kept, the largest score difference."""
    first = [float(np.mean(w.tokens[1:, 0] == g.tokens[1:, 0])) for w, g in zip(want, got)]
    kept = [np.mean([len(set(w.tokens[r]) & set(g.tokens[r])) / len(set(w.tokens[r])) for r in range(1, w.h)])
            for w, g in zip(want, got)]
    return {"first_arc": float(np.mean(first)), "top_k_kept": float(np.mean(kept)),
            "largest_score_difference": float(max(np.abs(w.scores - g.scores).max() for w, g in zip(want, got)))}


def blocks_cold(heads: Any, hidden: torch.Tensor, ids: list[list[int]], vocab: int, candidates: int,
                repeats: int) -> dict[str, float]:
    """Median ms of ``head_states`` and of the candidate lattices with the heads' blocks fused
    and one by one, interleaved, each call after a 256 MB buffer was written (cold caches)."""
    from latticekit.decoding.lattices import CandidateLattice, candidate_lattices

    static = np.sort(np.random.default_rng(0).choice(vocab, min(candidates, vocab), replace=False))
    sources = [CandidateLattice(heads, static, 8) for _ in range(len(hidden))]
    candidate_lattices(sources, hidden, ids)  # each row's own tokens gathered once
    flush = torch.zeros(64 * 2**20)
    fused = heads.fuse().fused
    times: dict[str, list[float]] = {}
    for i in range(repeats + 1):  # the first of each untimed
        for way in ("blocks", "fused"):
            heads.fused = fused if way == "fused" else None
            for what, call in (("states", lambda: heads.head_states(hidden)),
                               ("lattices", lambda: candidate_lattices(sources, hidden, ids))):
                flush.add_(1.0)
                t0 = time.perf_counter()
                call()
                if i:
                    times.setdefault(f"{what}_{way}_ms", []).append(1e3 * (time.perf_counter() - t0))
    heads.fused = None
    alone = heads.head_states(hidden)
    heads.fused = fused
    difference = float((heads.head_states(hidden) - alone).abs().max())
    return {name: statistics.median(values) for name, values in times.items()} | {"fused_difference": difference}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--depths", type=int, nargs="*", default=[1, 2, 4], help="draft heads run (besides every one)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--unpacked", action="store_true", help="the heads' linears as torch runs them (F.linear)")
    p.add_argument("--candidates", type=int, default=8192,
                   help="also every head over this many candidate tokens and each row's own (candidate_lattices: "
                        "the vLLM lattice proposer's vocabulary 'seen'); 0: not")
    p.add_argument("--blocks", action="store_true",
                   help="also the heads' blocks fused (BlockHeads.fuse, as the lattice proposer and prepare_heads "
                        "run them) against one by one, from cold caches: head_states, and the candidate lattices")
    p.add_argument("--dtypes", nargs="*", default=[],
                   help="also the candidate lattices with the static candidates projected in each of these dtypes "
                        "(float32, bfloat16: CandidateLattice's dtype), from cold caches, at every depth")
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    from latticekit._machine import machine
    from latticekit.decoding.lattices import CandidateLattice, FullLattice, candidate_lattices, full_lattices
    from latticekit.loading import load_heads, load_target

    model, _, description = load_target("smollm2")
    if args.unpacked:
        heads = load_heads("default", model)
    else:  # as the vLLM lattice proposer loads them: on the CPU, packed by oneDNN
        from latticekit.heads import DEFAULT_HEADS_PATH
        from latticekit.vllm.heads import load_heads_for

        heads = load_heads_for(DEFAULT_HEADS_PATH, model, model.config.vocab_size)
    source = FullLattice(heads, 8, model.config.vocab_size)
    gen = torch.Generator().manual_seed(0)
    rows_out = []
    with torch.inference_mode():
        for rows in args.rows:
            hidden = torch.randn(rows, model.config.hidden_size, generator=gen) * 3
            ids = [torch.randint(0, model.config.vocab_size, (20,), generator=gen).tolist() for _ in range(rows)]
            depths = [None, *args.depths]
            alone: list[float] = []
            together: dict = {d: [] for d in depths}
            for _ in range(args.repeats + 1):  # the first of each untimed
                t0 = time.perf_counter()
                want = [source(hidden[j], ids[j], entropy=False)[0] for j in range(rows)]
                alone.append(time.perf_counter() - t0)
                for depth in depths:
                    t0 = time.perf_counter()
                    got = full_lattices([source] * rows, hidden, ids, depth)
                    together[depth].append(time.perf_counter() - t0)
                    if not all(same(w, g, row[-1], depth) for w, g, row in zip(want, got, ids)):
                        raise SystemExit(f"{rows} rows, depth {depth}: a batched lattice differs from its row's own")
            row = {"rows": rows, "row_by_row_ms": 1e3 * statistics.median(alone[1:]),
                   "together_ms": 1e3 * statistics.median(together[None][1:]),
                   "depth_ms": {str(d): 1e3 * statistics.median(together[d][1:]) for d in args.depths}}
            row["speedup"] = row["row_by_row_ms"] / row["together_ms"]
            if args.candidates:  # seeded candidates: the product's size is what the time depends on
                vocab = model.config.vocab_size
                static = np.sort(np.random.default_rng(0).choice(vocab, min(args.candidates, vocab), replace=False))
                sources = [CandidateLattice(heads, static, 8) for _ in range(rows)]
                timed = []
                for _ in range(args.repeats + 1):  # the first untimed (it gathers each row's own tokens)
                    t0 = time.perf_counter()
                    got = candidate_lattices(sources, hidden, ids)
                    timed.append(time.perf_counter() - t0)
                for j, lattice in enumerate(got):
                    alone_lattice = CandidateLattice(heads, static, 8)(hidden[j], ids[j])[0]
                    if not (np.array_equal(alone_lattice.tokens, lattice.tokens)
                            and np.allclose(alone_lattice.scores, lattice.scores, atol=1e-4)):
                        raise SystemExit(f"{rows} rows: a batched candidate lattice differs from its row's own")
                row["candidates_ms"] = 1e3 * statistics.median(timed[1:])
                # heads 2..d + 1 alone (the vLLM lattice proposer's cut to the batch's deepest chain),
                # each call after a 256 MB write (cold caches, as after the target's forward)
                flush, cut = torch.zeros(64 * 2**20), {}
                for i in range(args.repeats + 1):
                    for depth in [None, *args.depths]:
                        flush.add_(1.0)
                        t0 = time.perf_counter()
                        candidate_lattices(sources, hidden, ids, depth=depth)
                        if i:
                            cut.setdefault(str(depth), []).append(1e3 * (time.perf_counter() - t0))
                row["candidates_cold_ms"] = {d: statistics.median(v) for d, v in cut.items()}
                if args.dtypes:  # the static candidates projected in each dtype, interleaved, from cold caches
                    by_dtype = {name: [CandidateLattice(heads, static, 8, getattr(torch, name)) for _ in range(rows)]
                                for name in args.dtypes}
                    for name, each in by_dtype.items():
                        candidate_lattices(each, hidden, ids)  # each row's own tokens gathered once
                        row.setdefault("dtype_agreement", {})[name] = agreement(got, candidate_lattices(each, hidden, ids))
                    timed_dtype: dict[str, list[float]] = {}
                    for i in range(args.repeats + 1):
                        for name, each in by_dtype.items():
                            for depth in [None, *args.depths]:
                                flush.add_(1.0)
                                t0 = time.perf_counter()
                                candidate_lattices(each, hidden, ids, depth=depth)
                                if i:
                                    timed_dtype.setdefault(f"{name}@{depth}", []).append(1e3 * (time.perf_counter() - t0))
                    row["dtype_cold_ms"] = {key: statistics.median(v) for key, v in timed_dtype.items()}
            if args.blocks:
                row |= blocks_cold(heads, hidden, ids, model.config.vocab_size, args.candidates or 8192,
                                   4 * args.repeats)
            rows_out.append(row)
            print(f"{rows} rows: row by row {row['row_by_row_ms']:.1f} ms, together {row['together_ms']:.1f} ms "
                  f"({row['speedup']:.2f}x), at depths {row['depth_ms']}; lattices identical", file=sys.stderr)
    report = {"model": description, "heads": "default (latticekit/data/heads)",
              "packed": not args.unpacked, "threads": args.threads,
              "machine": machine(), "torch": torch.__version__, "command": "python benchmarks/heads_batch.py "
              + " ".join(argv if argv is not None else sys.argv[1:]), "rows": rows_out}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    lines = [f"# Heads' full-vocabulary lattices, row by row against together ({description}, "
             f"{args.threads} threads, {report['machine']['cpu']})", "",
             f"`{report['command']}`; every batched lattice equal to its row's own (but for the root, given: "
             "the row's last token, scored 0).", "",
             "| requests | row by row ms | together ms | speed-up | "
             + " | ".join(f"{d} draft heads ms" for d in args.depths) + " |",
             "|---|---|---|---|" + "---|" * len(args.depths)]
    lines += [f"| {r['rows']} | {r['row_by_row_ms']:.1f} | {r['together_ms']:.1f} | {r['speedup']:.2f}x | "
              + " | ".join(f"{r['depth_ms'][str(d)]:.1f}" for d in args.depths) + " |" for r in rows_out]
    if args.blocks:
        lines += ["", "The heads' blocks fused (`BlockHeads.fuse`: one product per layer for every head) against "
                  "one by one, each call after 256 MB were written (the caches cold, as after the target's forward); "
                  "median ms, `head_states` and the candidate lattices (over 8,192 candidates); the states agree "
                  "to float rounding (largest difference in the last column):", "",
                  "| requests | states one by one | states fused | lattices one by one | lattices fused | "
                  "largest difference |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['rows']} | {r['states_blocks_ms']:.2f} | {r['states_fused_ms']:.2f} | "
                  f"{r['lattices_blocks_ms']:.2f} | {r['lattices_fused_ms']:.2f} | {r['fused_difference']:.1e} |"
                  for r in rows_out]
    if args.candidates:
        lines += ["", f"Every head over {args.candidates} candidate tokens and each row's own (`candidate_lattices`, "
                  "the vLLM lattice proposer's vocabulary `seen`; each row's lattice equal to its own alone):", "",
                  "| requests | candidates ms | from cold caches: every head | "
                  + " | ".join(f"{d} draft heads" for d in args.depths) + " |", "|---|---|---|" + "---|" * len(args.depths)]
        lines += [f"| {r['rows']} | {r['candidates_ms']:.1f} | {r['candidates_cold_ms']['None']:.2f} | "
                  + " | ".join(f"{r['candidates_cold_ms'][str(d)]:.2f}" for d in args.depths) + " |" for r in rows_out]
    if args.candidates and args.dtypes:
        lines += ["", "The static candidates projected in each dtype (`CandidateLattice(dtype=)`; bfloat16 is "
                  "`candidate_dtype`'s `auto` on a CPU with AVX-512 BF16 or AMX), each call after 256 MB were written, "
                  "interleaved; median ms, at every head and heads 2..d + 1 alone; agreement with the float32 lattices: "
                  "first arcs the same, top-k arcs kept, largest score difference (nats):", "",
                  "| requests | dtype | every head | " + " | ".join(f"{d} draft heads" for d in args.depths)
                  + " | first arc | top k kept | largest score difference |",
                  "|---|---|---|" + "---|" * len(args.depths) + "---|---|---|"]
        for r in rows_out:
            for name in args.dtypes:
                a = r["dtype_agreement"][name]
                lines.append(f"| {r['rows']} | {name} | {r['dtype_cold_ms'][f'{name}@None']:.2f} | "
                             + " | ".join(f"{r['dtype_cold_ms'][f'{name}@{d}']:.2f}" for d in args.depths)
                             + f" | {a['first_arc']:.3f} | {a['top_k_kept']:.3f} | {a['largest_score_difference']:.3f} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
