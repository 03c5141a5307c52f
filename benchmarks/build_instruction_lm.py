"""Build a Katz 4-gram over SmolLM2-135M-Instruct's own answers to the training instruction prompts.

The shipped n-gram (``latticekit/data/smollm2-katz4-400k.arpa.gz``) was estimated on code and
documentation; a chat model's answers read differently ("Here's a simple example:", Markdown
lists, fenced code). This model is estimated, by latticekit itself, on the answers that
``heads_data.py`` cached for the *training* instruction prompts (the token ids of each answer
are one sentence, the closing ``<|im_end|>`` dropped), with the cut-offs of
``build_eval_lms.py`` (trigrams seen twice, 4-grams four times). It reports the held-out
perplexity of the cached answers to held-out prompts under this model and under the shipped one.

    PYTHONPATH=. python benchmarks/build_instruction_lm.py [--order 4] [--out benchmarks/cache/instruction_lm]

Writes ``<out>/katz<order>.arpa.gz``, the id corpora, and ``benchmarks/results/heads/instruction_lm.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from latticekit.heads.data import CACHE, RESULTS, load_domain, log, write_json

ROOT = Path(__file__).resolve().parent
SHIPPED = ROOT.parent / "latticekit" / "data" / "smollm2-katz4-400k.arpa.gz"
IM_END = 2  # SmolLM2's <|im_end|>, the end of an answer
VOCAB_SIZE = 49152


def write_answers(split: str, cache_dir: Path, path: Path) -> dict[str, int]:
    """One answer per line (its greedy tokens, end-of-answer dropped); how many answers and tokens."""
    data = load_domain(split, "instruction", cache_dir)
    bounds = np.flatnonzero(np.diff(data["segment"])) + 1
    answers = 0
    tokens = 0
    with open(path.with_suffix(".tmp"), "w") as out:
        for answer in np.split(data["greedy"], bounds):
            ids = answer[:-1] if len(answer) and answer[-1] == IM_END else answer
            if len(ids):
                out.write(" ".join(map(str, ids.tolist())) + "\n")
                answers += 1
                tokens += len(ids)
    path.with_suffix(".tmp").replace(path)
    return {"answers": answers, "tokens": tokens}


def _ppl(result: Any) -> dict[str, float]:
    return {"perplexity": round(result.perplexity, 2), "oov_rate": round(result.oovs / max(1, result.words), 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--order", type=int, default=4)
    parser.add_argument("--cache-dir", type=Path, default=CACHE)
    parser.add_argument("--out", type=Path, default=ROOT / "cache" / "instruction_lm")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    from latticekit.lm import build_katz, perplexity_of_files, read_arpa, write_model_arpa

    args.out.mkdir(parents=True, exist_ok=True)
    corpora = {split: args.out / f"{split}_ids.txt" for split in ("train", "heldout")}
    sizes = {split: write_answers(split, args.cache_dir, path) for split, path in corpora.items()}
    log(f"answers: {json.dumps(sizes)}")
    t0 = time.perf_counter()
    min_counts = [1, 1, 2, 4, 4, 4][: args.order] if args.order >= 3 else None
    model = build_katz([str(corpora["train"])], args.order, tokenized=True, vocab_size=VOCAB_SIZE,
                       min_counts=min_counts, workers=args.workers)
    arpa = args.out / f"katz{args.order}.arpa.gz"
    write_model_arpa(str(arpa), model)
    build_s = time.perf_counter() - t0
    heldout = [str(corpora["heldout"])]
    result = {
        "command": "PYTHONPATH=. python benchmarks/build_instruction_lm.py",
        "arpa": str(arpa.relative_to(ROOT.parent)) if arpa.is_relative_to(ROOT.parent) else str(arpa),
        "corpora": sizes, "order": args.order, "min_counts": min_counts, "ngrams": list(model.counts),
        "build_s": round(build_s, 1),
        "heldout": {name: _ppl(perplexity_of_files(lm, heldout))
                    for name, lm in (("instruction_lm", model), ("shipped_code_docs_lm", read_arpa(str(SHIPPED))))},
        "note": "perplexity skips OOVs, as ngramperplexity does: compare it together with the OOV rate",
    }
    write_json(RESULTS / "instruction_lm.json", result)
    log(json.dumps(result))


if __name__ == "__main__":
    main()
