"""Benchmark at scale: a Katz 4-gram of the Linux kernel source under a memory cap.

Two steps, each printing one JSON object with its throughput and peak RSS:

1. Token ids: every non-empty line of every ``.c`` and ``.h`` file of Debian's
   ``linux-source-6.1`` tarball (``apt-get install linux-source-6.1``), encoded separately with
   the SmolLM2 tokenizer (read offline from its GGUF file, as ``build_lm.py`` does), one line
   of decimal ids per source line. ``--prefix`` keeps the files under some folders only.

       python benchmarks/build_lm_kernel.py --make-ids /tmp/kernel_ids.txt      # ~23 min

2. The build, as ``latticekit lm build --tokenized --order 4 --min-count 1,1,2,4 --memory MB``
   does it (count with spilled runs, min counts applied while merging, estimate, write ARPA),
   timed per phase, with the peak RSS after each phase:

       python benchmarks/build_lm_kernel.py --ids /tmp/kernel_ids.txt --memory 512 \\
           --spill-dir /tmp/kernel_runs --output /tmp/kernel4.arpa

``--max-tokens`` stops either step after about that many tokens (a documented subset).
Measured figures: ``docs/benchmarks.md`` (505M tokens, 60 s, 1.7 GB peak RSS on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import tarfile
import time


TARBALL = "/usr/src/linux-source-6.1.tar.xz"
SMOLLM2_VOCAB_SIZE = 49152  # token ids are checked against it


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _machine() -> str:
    from latticekit._machine import cpu_name

    return f"{cpu_name()}, Python {platform.python_version()}"


def load_smollm2_tokenizer():
    """The SmolLM2 tokenizer's fast (Rust) backend, converted from the GGUF file offline."""
    from transformers import AutoTokenizer

    from latticekit.loading import smollm2_gguf

    folder, gguf = smollm2_gguf()
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    return tok.backend_tokenizer


def make_ids(out_path: str, prefixes: list, max_tokens: int, batch_lines: int = 20_000) -> dict:
    """Encode the kernel's C sources into one file of token-id lines; returns the figures."""
    tok = load_smollm2_tokenizer()
    t0 = time.perf_counter()
    files = lines = tokens = text_bytes = skipped = 0
    batch: list = []

    def flush(out) -> int:
        encoded = tok.encode_batch(batch, add_special_tokens=False)
        out.write("".join(" ".join(map(str, e.ids)) + "\n" for e in encoded if e.ids))
        n = sum(len(e.ids) for e in encoded)
        batch.clear()
        return n

    with tarfile.open(TARBALL, "r|xz") as tar, open(out_path, "w") as out:
        for member in tar:
            if not member.isfile() or not member.name.endswith((".c", ".h")):
                continue
            relative = member.name.split("/", 1)[-1]
            if prefixes and not relative.startswith(tuple(prefixes)):
                continue
            data = tar.extractfile(member).read()  # type: ignore[union-attr]
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                skipped += 1
                continue
            files += 1
            text_bytes += len(data)
            for line in text.split("\n"):
                if not line.strip():
                    continue
                batch.append(line)
                if len(batch) >= batch_lines:  # also inside a file: some headers have 1M lines
                    lines += len(batch)
                    tokens += flush(out)
            if max_tokens and tokens >= max_tokens:
                break
        if batch:
            lines += len(batch)
            tokens += flush(out)
    seconds = time.perf_counter() - t0
    return {
        "step": "make_ids",
        "tarball": TARBALL,
        "prefixes": prefixes,
        "files": files,
        "files_not_utf8": skipped,
        "text_mb": round(text_bytes / 1e6, 1),
        "lines": lines,
        "tokens": tokens,
        "seconds": round(seconds, 1),
        "tokens_per_s": round(tokens / seconds),
        "peak_rss_mb": round(_peak_rss_mb()),
        "machine": _machine(),
    }


def _head_lines(path: str, max_tokens: int, out_path: str) -> str:
    """Copy whole lines of ``path`` until about ``max_tokens`` ids; returns the copy's path."""
    n = 0
    with open(path) as f, open(out_path, "w") as g:
        for line in f:
            g.write(line)
            n += line.count(" ") + 1
            if n >= max_tokens:
                break
    return out_path


def build(args: argparse.Namespace) -> dict:
    from latticekit.lm.arpa_io import write_model_arpa
    from latticekit.lm.build import count_ngrams
    from latticekit.lm.katz import estimate_katz

    ids = args.ids
    if args.max_tokens:
        ids = _head_lines(ids, args.max_tokens, args.ids + f".first{args.max_tokens}")
    out = args.output or os.path.join(args.spill_dir or "/tmp", "kernel4.arpa")
    t0 = time.perf_counter()
    counts, words = count_ngrams(
        [ids],
        args.order,
        tokenized=True,
        vocab_size=SMOLLM2_VOCAB_SIZE,
        workers=args.workers,
        chunk_tokens=args.chunk_tokens,
        spill_dir=args.spill_dir,
        run_memory=args.memory << 20,
        min_counts=args.min_count,
    )
    t1 = time.perf_counter()
    rss_count = _peak_rss_mb()
    tokens, sentences = counts.tokens, counts.sentences
    model = estimate_katz(counts, words)
    t2 = time.perf_counter()
    rss_estimate = _peak_rss_mb()
    del counts
    write_model_arpa(out, model)
    t3 = time.perf_counter()
    result = {
        "step": "build",
        "ids": ids,
        "tokens": tokens,
        "sentences": sentences,
        "order": args.order,
        "min_counts": args.min_count,
        "memory_mb_option": args.memory,
        "chunk_tokens": args.chunk_tokens,
        "workers": args.workers,
        "ngrams": list(model.counts),
        "count_s": round(t1 - t0, 1),
        "estimate_s": round(t2 - t1, 1),
        "write_arpa_s": round(t3 - t2, 1),
        "end_to_end_s": round(t3 - t0, 1),
        "count_tokens_per_s": round(tokens / (t1 - t0)),
        "estimate_tokens_per_s": round(tokens / (t2 - t1)),
        "end_to_end_tokens_per_s": round(tokens / (t3 - t0)),
        "peak_rss_mb_after_count": round(rss_count),
        "peak_rss_mb_after_estimate": round(rss_estimate),
        "peak_rss_mb": round(_peak_rss_mb()),
        "arpa_mb": round(os.path.getsize(out) / 1e6, 1),
        "machine": _machine(),
    }
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--make-ids", help="write the kernel's token ids here and exit")
    ap.add_argument("--prefix", action="append", default=[], help="only files under this folder (e.g. drivers/); repeatable")
    ap.add_argument("--ids", help="token-id file to build from")
    ap.add_argument("--max-tokens", type=int, default=0, help="stop after about this many tokens")
    ap.add_argument("--order", type=int, default=4)
    ap.add_argument("--min-count", type=lambda s: [int(v) for v in s.split(",")], default=[1, 1, 2, 4])
    ap.add_argument("--memory", type=int, default=512, help="MB of count runs held before spilling")
    ap.add_argument("--chunk-tokens", type=int, default=2_000_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--spill-dir", help="where count runs are spilled")
    ap.add_argument("--output", help="ARPA output")
    args = ap.parse_args()
    if args.make_ids:
        print(json.dumps(make_ids(args.make_ids, args.prefix, args.max_tokens)), flush=True)
        return
    if not args.ids:
        ap.error("give --make-ids or --ids")
    result = build(args)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
