"""p-best rescoring latency: latticekit vs OpenFst composition, on a real 4-gram.

The paper's grid (h in {4, 8, 16} x k in {2, 4, 8, 16} x p in {1, 2, 4, 8, 16}) plus batch
throughput, on the OpenGrm 4-gram over SmolLM2 token ids of the CPython standard library.
Lattices come from real held-out text: at a random position, each step holds the true next
token plus k - 1 distinct tokens drawn from the unigram distribution, scored by the
log-softmax of N(0, 2) logits with +2 on the true token (seeded).

Every row reports latticekit's median and p90, back to back and with the caches flushed
before each call (a 64 MB buffer read in between, as a target model's forward pass would
between two decoding steps), and two OpenFst pipelines measured in the same run, both
composing with the model (arc-sorted, its label-sorted property cached):
``shortestpath(nshortest=p)`` straight on the composition (the issue's baseline; for p > 1
a token sequence may come back once per back-off route), and projection + epsilon removal
+ ``shortestpath(nshortest=p, unique=True)`` (p distinct sequences, what latticekit
returns). Speed-ups are OpenFst's median over latticekit's back-to-back median. "OpenFst
differs" is how often the unique pipeline's p best differ from the exact ones (its
back-off arcs are epsilon transitions, an approximation).

    python benchmarks/rescore_latency.py                 # full grid (several minutes)
    python benchmarks/rescore_latency.py --quick         # 8 x 16 and 16 x 16 rows only
    python benchmarks/rescore_latency.py --device cuda   # the design card's path on a device (below)

``--device DEV`` times instead what a decoding step does with heads on that device: a top-k
sausage lattice from the heads' logits there (``SausageLattice.from_logits``: top-k and
log-softmax on the device, only the ``(h, k)`` result crosses to the host) plus the exact p
best under the shipped Katz 4-gram over SmolLM2 ids, conditioned on 64 tokens of context, for
vocabularies of 49,152 (SmolLM2) and 128,256 (Llama 3) tokens and a few (h, k, p). The logits
are seeded and peaked like trained heads' (eight strong candidates per head). Median and p99
milliseconds per call, lattice and search apart; writes ``<out>_device_<DEV>.{json,md}``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import latticekit as lk
from latticekit.demo import realistic_lattice

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT.parent / "shared" / "golden" / "stdlib-tokenids"


def machine() -> dict:
    from latticekit._machine import machine as describe

    return describe()


def read_stream(path) -> np.ndarray:
    """The held-out token ids (whitespace-separated, gzip), as one int64 array."""
    with gzip.open(path, "rt") as f:
        return np.array([int(x) for line in f for x in line.split()], dtype=np.int64)


def make_lattices(lm, stream, n, h, k, seed):
    words = lm.words
    token_of_word = np.array([int(w) if w.isdigit() else -1 for w in words])
    _, log10p, _ = lm.ngrams(1)
    prob = np.power(10.0, log10p.astype(np.float64))
    prob[token_of_word < 0] = 0.0
    prob /= prob.sum()
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        pos = int(rng.integers(16, len(stream) - h - 1))
        lattice = realistic_lattice(stream[pos:pos + h], k, token_of_word, prob, rng)
        out.append((lattice, stream[pos - 16:pos]))
    return out


def flush_caches(buffer: np.ndarray) -> None:
    """Read ``buffer`` (larger than the last-level cache) so the next call starts cold."""
    buffer.sum()


def timed(fn, repeats):
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return times


#: (h, k, p) of the device rows: the shipped heads' shape (h 5) and larger.
DEVICE_GRID = ((4, 8, 16), (5, 10, 16), (8, 10, 16), (8, 16, 32))
DEVICE_VOCABS = (49152, 128256)


def device_rows(lm, device: str, iters: int = 300, grid=DEVICE_GRID, vocabs=DEVICE_VOCABS, seed: int = 0) -> list:
    """Milliseconds of a lattice from ``device`` logits plus p-best (see the module docstring)."""
    import torch

    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    g = torch.Generator(device=device).manual_seed(seed)
    context = torch.randint(100, 40000, (64,), generator=torch.Generator().manual_seed(seed)).tolist()
    rows = []
    warm = max(2, iters // 30)
    for vocab in vocabs:
        for h, k, p in grid:
            logits = torch.randn(h, vocab, device=device, generator=g)
            top = torch.randint(100, 40000, (h, 8), device=device, generator=g)
            logits.scatter_(1, top, torch.randn(h, 8, device=device, generator=g).abs() * 4 + 6)
            lattice_ms, pbest_ms, total_ms = [], [], []
            for i in range(iters + warm):
                x = logits.roll(i % 7, dims=1) if i % 2 else logits  # inputs that change
                sync()
                t0 = time.perf_counter()
                lattice = lk.SausageLattice.from_logits(x, k=k, fix_first=True)
                t1 = time.perf_counter()
                paths = lk.pbest(lattice, lm, p=p, alpha=1.0, context=context)
                t2 = time.perf_counter()
                if i >= warm:
                    lattice_ms.append((t1 - t0) * 1e3)
                    pbest_ms.append((t2 - t1) * 1e3)
                    total_ms.append((t2 - t0) * 1e3)
            rows.append({"vocab": vocab, "h": h, "k": k, "p": p, "paths": len(paths), "calls": iters,
                         "lattice_ms_median": statistics.median(lattice_ms),
                         "pbest_ms_median": statistics.median(pbest_ms),
                         "total_ms_median": statistics.median(total_ms),
                         "total_ms_p99": float(np.percentile(total_ms, 99))})
            print(" ".join(f"{key}={val:.4g}" if isinstance(val, float) else f"{key}={val}"
                           for key, val in rows[-1].items()), flush=True)
    return rows


def device_markdown(report: dict) -> str:
    lines = [f"# Lattice from {report['device']} logits + exact p-best (shipped 4-gram)", "",
             f"- device: {report['device_name']}; torch {report['torch']}; threads {report['threads']}",
             f"- machine: {report['machine']}", f"- command: `{report['command']}`", "",
             "| vocab | h | k | p | lattice ms | p-best ms | total ms (median) | total ms (p99) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        lines.append(f"| {r['vocab']} | {r['h']} | {r['k']} | {r['p']} | {r['lattice_ms_median']:.3f} "
                     f"| {r['pbest_ms_median']:.3f} | {r['total_ms_median']:.3f} | {r['total_ms_p99']:.3f} |")
    return "\n".join(lines) + "\n"


def device_main(args) -> int:
    import torch

    from latticekit.demo import embedded_token_lm

    torch.set_num_threads(args.threads)
    device = args.device
    name = torch.cuda.get_device_name(device) if torch.device(device).type == "cuda" else "cpu"
    report = {"device": device, "device_name": name, "torch": torch.__version__, "threads": torch.get_num_threads(),
              "machine": machine(), "lm": "shipped Katz 4-gram over SmolLM2 ids (latticekit.demo.embedded_token_lm)",
              "command": "python " + " ".join(sys.argv),
              "rows": device_rows(embedded_token_lm(), device, iters=args.device_iters)}
    out = Path(f"{args.out}_device_{torch.device(device).type}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    out.with_suffix(".md").write_text(device_markdown(report))
    print(device_markdown(report))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(GOLDEN / "katz4.arpa.gz"))
    ap.add_argument("--heldout", default=str(GOLDEN / "heldout_ids.txt.gz"))
    ap.add_argument("--lattices", type=int, default=100, help="lattices per grid cell")
    ap.add_argument("--openfst-lattices", type=int, default=30, help="lattices per cell for OpenFst")
    ap.add_argument("--quick", action="store_true", help="only the 8 x 16 and 16 x 16 rows")
    ap.add_argument("--no-openfst", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "rescore_latency"))
    ap.add_argument("--device", help="time a lattice from this device's logits + p-best instead (cpu, cuda, cuda:1)")
    ap.add_argument("--device-iters", type=int, default=300, help="calls per --device row")
    ap.add_argument("--threads", type=int, default=2, help="torch threads of the --device rows")
    args = ap.parse_args(argv)
    if args.device:
        return device_main(args)

    report = {"machine": machine(), "model": args.model}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)  # the binary model goes there first
    t = time.perf_counter()
    lm = lk.NGramLM.from_arpa(args.model)
    report["arpa_to_model_s"] = time.perf_counter() - t
    binary = Path(args.out + ".lkm")
    t = time.perf_counter()
    lm.save(binary)
    report["save_s"] = time.perf_counter() - t
    loads = timed(lambda: lk.NGramLM.load(binary), 7)
    lm = lk.NGramLM.load(binary)
    report.update(ngrams=lm.num_ngrams, counts=lm.counts, binary_bytes=lm.size_bytes,
                  bytes_per_ngram=lm.size_bytes / lm.num_ngrams, load_ms_median=statistics.median(loads) * 1e3)
    binary.unlink()
    print(f"model {lm!r}: ARPA -> model {report['arpa_to_model_s']:.2f} s, "
          f"{report['bytes_per_ngram']:.2f} bytes/n-gram, load {report['load_ms_median']:.1f} ms", flush=True)

    stream = read_stream(args.heldout)

    rescorer = None
    if not args.no_openfst:
        try:
            from latticekit.openfst_baseline import OpenFstRescorer

            t = time.perf_counter()
            rescorer = OpenFstRescorer(lm, bos=True)
            report["openfst_model_build_s"] = time.perf_counter() - t
        except ImportError as exc:
            print(f"OpenFst baseline skipped: {exc}")

    evict = np.ones(8 << 20)  # 64 MB, twice this machine's L3
    grid_h = [8, 16] if args.quick else [4, 8, 16]
    grid_k = [16] if args.quick else [2, 4, 8, 16]
    grid_p = [1, 16] if args.quick else [1, 2, 4, 8, 16]
    rows = []
    for h in grid_h:
        for k in grid_k:
            lattices = make_lattices(lm, stream, args.lattices, h, k, seed=h * 100 + k)
            for p in grid_p:
                lk.pbest_batch([l for l, _ in lattices[:5]], lm, p, threads=1)  # warm-up
                ours = [timed(lambda: lk.pbest(l, lm, p, 1.0, bos=True), 1)[0] for l, _ in lattices]
                flushed = []
                for l, _ in lattices:
                    flush_caches(evict)
                    flushed.append(timed(lambda: lk.pbest(l, lm, p, 1.0, bos=True), 1)[0])
                with_ctx = [timed(lambda: lk.pbest(l, lm, p, 1.0, context=c), 1)[0] for l, c in lattices]
                res = lk.pbest_batch([l for l, _ in lattices], lm, p, 1.0, bos=True, threads=1)
                row = {"h": h, "k": k, "p": p,
                       "latticekit_ms_median": statistics.median(ours) * 1e3,
                       "latticekit_ms_p90": float(np.percentile(ours, 90)) * 1e3,
                       "latticekit_flushed_ms_median": statistics.median(flushed) * 1e3,
                       "latticekit_context_ms_median": statistics.median(with_ctx) * 1e3,
                       "pops_median": float(np.median(res.pops)),
                       "transitions_median": float(np.median(res.transitions))}
                n = min(args.openfst_lattices, len(lattices))
                if rescorer is not None and n > 0:
                    fst_times, plain_times, differ = [], [], 0
                    for i, (l, _) in enumerate(lattices[:n]):
                        t = time.perf_counter()
                        rescorer.pbest(l.tokens, l.scores, p, 1.0, l.widths, unique=False)
                        plain_times.append(time.perf_counter() - t)
                        t = time.perf_counter()
                        paths, _ = rescorer.pbest(l.tokens, l.scores, p, 1.0, l.widths)
                        fst_times.append(time.perf_counter() - t)
                        exact = {tuple(x) for x in res.tokens[i, : res.counts[i]].tolist()}
                        if {tuple(x) for x in paths.tolist()} != exact:
                            differ += 1
                    row["openfst_plain_ms_median"] = statistics.median(plain_times) * 1e3
                    row["speedup_vs_openfst_plain"] = row["openfst_plain_ms_median"] / row["latticekit_ms_median"]
                    row["openfst_ms_median"] = statistics.median(fst_times) * 1e3
                    row["speedup_vs_openfst"] = row["openfst_ms_median"] / row["latticekit_ms_median"]
                    row["openfst_disagreement"] = differ / n
                rows.append(row)
                print(" ".join(f"{key}={val:.4g}" if isinstance(val, float) else f"{key}={val}"
                               for key, val in row.items()), flush=True)
    report["grid"] = rows

    # Batch throughput: 64 lattices of 8 x 16, p = 16, on 2 threads.
    lattices = [l for l, _ in make_lattices(lm, stream, 64, 8, 16, seed=7)]
    contexts = [c for _, c in make_lattices(lm, stream, 64, 8, 16, seed=7)]
    throughput = {}
    for threads in (1, 2):
        times = timed(lambda: lk.pbest_batch(lattices, lm, 16, 1.0, contexts, threads=threads), 7)
        throughput[f"threads_{threads}_lattices_per_s"] = 64 / statistics.median(times)
    report["batch_64_8x16_p16"] = throughput
    report["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(throughput), f"peak RSS {report['peak_rss_mb']:.0f} MB", flush=True)

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".json").write_text(json.dumps(report, indent=2))
    lines = ["| h | k | p | latticekit ms (median / p90) | caches flushed ms | with context ms "
             "| OpenFst ms | speed-up | OpenFst unique ms | speed-up | OpenFst differs |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]

    def cell(r, key, fmt):
        return fmt.format(r[key]) if key in r else "-"

    for r in rows:
        lines.append(" | ".join([
            f"| {r['h']}", str(r["k"]), str(r["p"]),
            f"{r['latticekit_ms_median']:.3f} / {r['latticekit_ms_p90']:.3f}",
            f"{r['latticekit_flushed_ms_median']:.3f}", f"{r['latticekit_context_ms_median']:.3f}",
            cell(r, "openfst_plain_ms_median", "{:.3f}"), cell(r, "speedup_vs_openfst_plain", "{:.2f}x"),
            cell(r, "openfst_ms_median", "{:.3f}"), cell(r, "speedup_vs_openfst", "{:.2f}x"),
            cell(r, "openfst_disagreement", "{:.0%}")]) + " |")
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
