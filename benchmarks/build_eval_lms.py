"""Build the n-gram models that `latticekit eval` rescores SmolLM2 drafts with.

Katz models over SmolLM2-135M token ids, estimated by latticekit itself from the TRAINING
files of the draft heads' split manifest (``benchmarks/results/heads/split.json``: whole
files held out by a hash of their path), so that no held-out evaluation prompt was seen by
the n-gram either. Each source file is one sequence (``<s>`` file ``</s>``), so the model sees
line breaks and indentation as tokens, as the target model does. Both domains (code and
English) go into one model per order.

    python benchmarks/build_eval_lms.py                       # 2-gram and 4-gram
    python benchmarks/build_eval_lms.py --orders 2 3 4 --out benchmarks/cache/eval_lm

Writes ``<out>/katz{N}.arpa.gz`` (and the token-id corpus ``<out>/train_ids.txt``) and prints
one JSON summary. The 4-gram keeps trigrams seen at least twice and 4-grams seen at least
four times (the reference paper's cut-offs), which also keeps it small.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def smollm2_tokenizer():
    from transformers import AutoTokenizer

    from latticekit.loading import smollm2_gguf

    folder, gguf = smollm2_gguf()
    return AutoTokenizer.from_pretrained(folder, gguf_file=gguf)


def training_files(manifest: str):
    with open(manifest) as f:
        split = json.load(f)
    for name, domain in split["domains"].items():
        root = domain["root"]
        held = set(domain["heldout_files"])
        files = sorted(glob.glob(os.path.join(root, "**", domain["pattern"]), recursive=True))
        rel = [os.path.relpath(p, root) for p in files]
        # The heads' file list: third-party packages are not part of the corpus (and some
        # vendor copies of standard-library files that are held out).
        rel = [r for r in rel if "site-packages" not in r.split(os.sep) and os.path.isfile(os.path.join(root, r))]
        yield name, [os.path.join(root, r) for r in rel if r not in held], len(held)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--manifest", default=os.path.join(ROOT, "benchmarks", "results", "heads", "split.json"))
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "cache", "eval_lm"))
    ap.add_argument("--orders", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)

    from latticekit.lm.arpa_io import write_model_arpa
    from latticekit.lm.build import build_katz

    os.makedirs(args.out, exist_ok=True)
    ids_path = os.path.join(args.out, "train_ids.txt")
    summary = {"manifest": args.manifest, "domains": {}}
    t0 = time.perf_counter()
    if not os.path.exists(ids_path):
        tok = smollm2_tokenizer()
        tmp = ids_path + ".tmp"
        with open(tmp, "w") as out:
            for name, files, n_held in training_files(args.manifest):
                n_tokens = 0
                for path in files:
                    try:
                        text = open(path, encoding="utf-8").read()
                    except (UnicodeDecodeError, OSError):
                        continue
                    ids = tok(text, add_special_tokens=False)["input_ids"]
                    if ids:
                        out.write(" ".join(map(str, ids)) + "\n")
                        n_tokens += len(ids)
                summary["domains"][name] = {"train_files": len(files), "heldout_files": n_held,
                                            "train_tokens": n_tokens}
                print(f"{name}: {len(files)} training files, {n_tokens} tokens", file=sys.stderr, flush=True)
        os.replace(tmp, ids_path)
    summary["tokenize_seconds"] = round(time.perf_counter() - t0, 1)
    vocab_size = 49152  # SmolLM2
    for order in args.orders:
        t = time.perf_counter()
        min_counts = [1, 1, 2, 4, 4, 4][:order] if order >= 3 else None
        model = build_katz([ids_path], order, tokenized=True, vocab_size=vocab_size,
                           min_counts=min_counts, workers=args.workers)
        arpa = os.path.join(args.out, f"katz{order}.arpa.gz")
        write_model_arpa(arpa, model)  # gzip by suffix, temp file + rename
        summary[f"katz{order}"] = {"path": arpa, "ngrams": list(model.counts),
                                   "min_counts": min_counts, "seconds": round(time.perf_counter() - t, 1)}
        print(f"katz{order}: {list(model.counts)} n-grams in {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
