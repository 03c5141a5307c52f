"""Benchmark: build a Katz 4-gram from the CPython stdlib encoded with SmolLM2 token ids.

Reproduces ``../shared/golden/stdlib-tokenids`` (every non-empty line of every ``.py`` file of
the CPython 3.11 standard library, encoded separately; every 50th file held out) and times
latticekit end to end (read ids, count, estimate, write ARPA), with peak RSS, then checks
held-out perplexity. Prints one JSON object: per phase (count = read ids + count + merge;
estimate; write ARPA) the wall and CPU seconds (median, min, max over --repeat builds), the
peak RSS after the phase and the throughput; then end to end.

    python benchmarks/build_lm.py --make-ids /tmp/stdlib_ids.txt       # once (~30 s)
    python benchmarks/build_lm.py --ids /tmp/stdlib_ids.txt --order 4 --repeat 5

The held-out perplexity is measured on the files --make-ids held out (``IDS.heldout``). The
golden ``heldout_ids.txt.gz`` only fits a training set made from the same stdlib listing as
OpenGrm's (48.03 there); on another CPython build the held-out files land in training.

OpenGrm on this kind of machine: 13.5 s counting + 9.9 s estimating (README of the golden data).
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time

import numpy as np

GOLDEN = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "golden", "stdlib-tokenids")
STDLIB = os.path.dirname(os.__file__)  # the running CPython 3.11 stdlib (with Lib/test)


def make_ids(out_train: str, stdlib: str = STDLIB) -> None:
    """Encode the stdlib with the SmolLM2 tokenizer (from its GGUF file, offline)."""
    from transformers import AutoTokenizer

    from latticekit.loading import smollm2_gguf

    folder, gguf = smollm2_gguf()
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    files = sorted(glob.glob(os.path.join(stdlib, "**", "*.py"), recursive=True))
    files = [f for f in files if "site-packages" not in f and "dist-packages" not in f]
    with open(out_train, "w") as train, open(out_train + ".heldout", "w") as held:
        for i, path in enumerate(files):
            try:
                lines = [l for l in open(path, encoding="utf-8").read().split("\n") if l.strip()]
            except (UnicodeDecodeError, OSError):
                continue
            if not lines:
                continue
            ids = tok(lines, add_special_tokens=False)["input_ids"]
            out = held if i % 50 == 49 else train
            out.write("".join(" ".join(map(str, x)) + "\n" for x in ids if x))


def _phase(name: str, phases: dict, fn, *args, **kwargs):
    """Run one phase, recording its wall and CPU seconds and the peak RSS so far."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    out = fn(*args, **kwargs)
    phases[name] = {
        "wall_s": time.perf_counter() - wall0,
        "cpu_s": time.process_time() - cpu0,  # all threads of the process
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    return out


def build_once(ids: str, order: int, workers: int, chunk_tokens: int, memory_mb: int, out: str):
    """One end-to-end build (read ids, count, estimate, write ARPA), timed per phase."""
    from latticekit.lm.arpa_io import write_model_arpa
    from latticekit.lm.build import count_ngrams
    from latticekit.lm.katz import estimate_katz

    phases: dict = {}
    counts, words = _phase("count", phases, count_ngrams, [ids], order, tokenized=True,
                           workers=workers, chunk_tokens=chunk_tokens, run_memory=memory_mb << 20)
    model = _phase("estimate", phases, estimate_katz, counts, words)
    _phase("write_arpa", phases, write_model_arpa, out, model)
    return counts, model, phases


def _summary(values: list) -> dict:
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2),
            "max": round(max(values), 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ids", help="training token-id file (one sentence per line)")
    ap.add_argument("--make-ids", help="write the stdlib token ids here and exit")
    ap.add_argument("--order", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2, help="counting threads")
    ap.add_argument("--chunk-tokens", type=int, default=2_000_000)
    ap.add_argument("--memory", type=int, default=512, help="MB of count runs held before spilling")
    ap.add_argument("--repeat", type=int, default=1, help="builds to time (medians reported)")
    ap.add_argument("--heldout", help="held-out ids (default: IDS.heldout written by --make-ids, "
                    "else the golden heldout_ids.txt.gz)")
    ap.add_argument("--output", help="ARPA output (default: a temporary file)")
    args = ap.parse_args()
    if args.make_ids:
        make_ids(args.make_ids)
        return
    golden_heldout = os.path.join(GOLDEN, "heldout_ids.txt.gz")
    ids = args.ids
    if ids is None:  # smoke test on the held-out file
        ids = tempfile.mktemp(suffix=".txt")
        with gzip.open(golden_heldout, "rt") as f, open(ids, "w") as g:
            g.write(f.read())
    heldout = args.heldout
    if heldout is None:
        heldout = ids + ".heldout" if os.path.exists(ids + ".heldout") else golden_heldout

    from latticekit.lm.ppl import perplexity_of_files

    out = args.output or tempfile.mktemp(suffix=".arpa")
    runs = []
    counts = model = None
    for _ in range(args.repeat):
        counts = model = None  # free the previous build: the peak RSS is one build's
        counts, model, phases = build_once(ids, args.order, args.workers, args.chunk_tokens, args.memory, out)
        runs.append(phases)
    held = heldout
    if heldout.endswith(".gz"):
        held = tempfile.mktemp(suffix=".txt")
        with gzip.open(heldout, "rt") as f, open(held, "w") as g:
            g.write(f.read())
    ppl = perplexity_of_files(model, [held])
    names = ["count", "estimate", "write_arpa"]
    end_to_end = [sum(r[n]["wall_s"] for n in names) for r in runs]
    result = {
        "tokens": counts.tokens,
        "sentences": counts.sentences,
        "order": args.order,
        "ngrams": list(model.counts),
        "repeats": args.repeat,
        "phases": {
            n: {
                "wall_s": _summary([r[n]["wall_s"] for r in runs]),
                "cpu_s": _summary([r[n]["cpu_s"] for r in runs]),
                "peak_rss_mb_after": round(max(r[n]["peak_rss_mb"] for r in runs)),
                "tokens_per_s": round(counts.tokens / statistics.median([r[n]["wall_s"] for r in runs])),
            }
            for n in names
        },
        "end_to_end_s": _summary(end_to_end),
        "tokens_per_s": round(counts.tokens / statistics.median(end_to_end)),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "peak_rss_mb_children": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024),
        "heldout": heldout,
        "heldout_ppl": round(ppl.perplexity, 4),
        "heldout_oovs": ppl.oovs,
        "opengrm_reference": {"count_s": 13.5, "estimate_s": 9.9, "heldout_ppl": 48.03},
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpus, Python {sys.version.split()[0]}",
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
