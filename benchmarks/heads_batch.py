"""Benchmark: the heads' full-vocabulary lattices for a batch of requests, row by row against
together (:func:`latticekit.decoding.lattices.full_lattices`, the vLLM lattice proposer's step
without an ``lm``).

SmolLM2-135M-Instruct's shipped heads (7 draft heads over its 49,152 words) on seeded random
hidden states, ``--rows`` requests at a time; every row's lattice is checked equal to the one
its row alone gives (tokens, widths; scores within 1e-4). Median milliseconds of ``--repeats``
calls each way, interleaved, and the machine. Writes ``results/heads_batch.{json,md}``::

    PYTHONPATH=. python benchmarks/heads_batch.py [--threads 2] [--rows 1 4 16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

OUT = Path(__file__).resolve().parent / "results" / "heads_batch"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    from latticekit._machine import machine
    from latticekit.decoding.lattices import FullLattice, full_lattices
    from latticekit.loading import load_heads, load_target

    model, _, description = load_target("smollm2")
    heads = load_heads("default", model)
    source = FullLattice(heads, 8, model.config.vocab_size)
    gen = torch.Generator().manual_seed(0)
    rows_out = []
    with torch.inference_mode():
        for rows in args.rows:
            hidden = torch.randn(rows, model.config.hidden_size, generator=gen) * 3
            ids = [torch.randint(0, model.config.vocab_size, (20,), generator=gen).tolist() for _ in range(rows)]
            alone, together = [], []
            for _ in range(args.repeats + 1):  # the first of each untimed
                t0 = time.perf_counter()
                want = [source(hidden[j], ids[j], entropy=False)[0] for j in range(rows)]
                alone.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                got = full_lattices([source] * rows, hidden, ids)
                together.append(time.perf_counter() - t0)
            for w, g in zip(want, got):
                if not (np.array_equal(w.tokens, g.tokens) and np.array_equal(w.widths, g.widths)
                        and np.allclose(w.scores, g.scores, atol=1e-4)):
                    raise SystemExit(f"{rows} rows: a batched lattice differs from its row's own")
            row = {"rows": rows, "row_by_row_ms": 1e3 * statistics.median(alone[1:]),
                   "together_ms": 1e3 * statistics.median(together[1:])}
            row["speedup"] = row["row_by_row_ms"] / row["together_ms"]
            rows_out.append(row)
            print(f"{rows} rows: row by row {row['row_by_row_ms']:.1f} ms, together {row['together_ms']:.1f} ms "
                  f"({row['speedup']:.2f}x); lattices identical", file=sys.stderr)
    report = {"model": description, "heads": "default (latticekit/data/heads)", "threads": args.threads,
              "machine": machine(), "torch": torch.__version__, "command": "python benchmarks/heads_batch.py "
              + " ".join(argv if argv is not None else sys.argv[1:]), "rows": rows_out}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    lines = [f"# Heads' full-vocabulary lattices, row by row against together ({description}, "
             f"{args.threads} threads, {report['machine']['cpu']})", "",
             f"`{report['command']}`; every batched lattice equal to its row's own.", "",
             "| requests | row by row ms | together ms | speed-up |", "|---|---|---|---|"]
    lines += [f"| {r['rows']} | {r['row_by_row_ms']:.1f} | {r['together_ms']:.1f} | {r['speedup']:.2f}x |"
              for r in rows_out]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
