"""``latticekit lm``: build, prune, score and inspect n-gram models from the command line.

Examples::

    latticekit lm build --order 4 --output lm.arpa corpus.txt
    latticekit lm build --order 4 --tokenized --min-count 1,1,2,4 --output lm.arpa ids.txt
    latticekit lm build --order 4 --tokenized --min-count 1,1,2,4 --memory 1024 --spill-dir /scratch --output lm.arpa big_ids.txt
    latticekit lm build --order 4 --tokenizer tokenizer.json --add-vocabulary --output lm.arpa *.py
    latticekit lm prune --theta 1e-6 --output small.arpa lm.arpa
    latticekit lm ppl lm.arpa heldout.txt
    latticekit lm info --json lm.arpa
    latticekit lm compile lm.arpa lm.bin

Every subcommand accepts ``--json`` to print one JSON object for scripts.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

from latticekit.lm.counting import DEFAULT_RUN_MEMORY

__all__ = ["main", "add_subparsers", "build_parser"]


def _min_counts(text: str) -> List[int]:
    try:
        values = [int(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--min-count wants integers like 1,1,2,4, got {text!r}") from exc
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError("--min-count values must be >= 1")
    return values


def add_subparsers(parser: argparse.ArgumentParser) -> None:
    """Add the ``build``, ``prune``, ``ppl``, ``info`` and ``compile`` subcommands.

    The top-level ``latticekit`` CLI calls this on its ``lm`` subparser and dispatches with
    ``args.lm_func(args)``.
    """
    sub = parser.add_subparsers(dest="lm_command", metavar="COMMAND", required=True)

    b = sub.add_parser(
        "build",
        help="estimate a Katz back-off model from text (as OpenGrm ngrammake --method=katz)",
        description=(
            "Count n-grams of FILEs (one sentence per line) and estimate a Katz back-off model "
            "identical to OpenGrm's. Input is raw text split on whitespace (default), decimal "
            "token ids (--tokenized) or raw text encoded by --tokenizer."
        ),
    )
    b.add_argument("files", nargs="+", metavar="FILE", help="training text, one sentence per line")
    b.add_argument("--order", type=int, required=True, help="highest n-gram order, e.g. 4")
    b.add_argument("--output", "-o", required=True, help="output ARPA file (.gz to compress)")
    b.add_argument("--tokenized", action="store_true", help="FILEs hold decimal token ids")
    b.add_argument("--tokenizer", help="tokenizer.json or a transformers tokenizer directory")
    b.add_argument("--vocab-size", type=int, help="token ids must be below this")
    b.add_argument(
        "--min-count",
        type=_min_counts,
        help="per-order minimum counts, comma separated (e.g. 1,1,2,4: trigrams seen twice, 4-grams 4 times)",
    )
    g = b.add_mutually_exclusive_group()
    g.add_argument("--theta", type=float, help="relative-entropy pruning threshold (e.g. 1e-6)")
    g.add_argument("--target-ngrams", type=int, help="prune to at most this many n-grams")
    b.add_argument(
        "--add-vocabulary",
        action="store_true",
        help="add every token id of the vocabulary the corpus lacks as a unigram (log10 p = -1000)",
    )
    b.add_argument("--workers", type=int, default=2, help="counting threads (default 2)")
    b.add_argument(
        "--chunk-tokens",
        type=int,
        default=2_000_000,
        help="words per counted chunk (default 2000000); each chunk being counted takes about 40 bytes a word",
    )
    b.add_argument(
        "--memory",
        type=int,
        default=DEFAULT_RUN_MEMORY >> 20,
        metavar="MB",
        help=(
            f"MB of count runs held in memory before they are merged and spilled to --spill-dir "
            f"(default {DEFAULT_RUN_MEMORY >> 20}). Peak memory is about this, plus --workers chunks "
            "being counted, plus the final count tables (which grow with the distinct n-grams kept: "
            "use --min-count on large corpora) and the model estimated from them"
        ),
    )
    b.add_argument("--spill-dir", help="directory for sorted count runs (default: temporary)")
    b.add_argument("--discounts", help="also write the Katz discount table to this file")
    b.add_argument("--no-progress", action="store_true", help="no progress bar")
    b.add_argument("--json", action="store_true", help="print a JSON summary")
    b.set_defaults(lm_func=_cmd_build)

    p = sub.add_parser(
        "prune",
        help="relative-entropy pruning of an ARPA model (as OpenGrm ngramshrink)",
        description="Prune MODEL by relative entropy, by --theta or to --target-ngrams.",
    )
    p.add_argument("model", metavar="MODEL", help="input ARPA file")
    p.add_argument("--output", "-o", required=True, help="output ARPA file")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--theta", type=float, help="pruning threshold (e.g. 1e-6)")
    g.add_argument("--target-ngrams", type=int, help="keep at most this many n-grams")
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    p.set_defaults(lm_func=_cmd_prune)

    q = sub.add_parser(
        "ppl",
        help="held-out perplexity (OpenGrm convention: OOVs skipped, </s> scored)",
        description="Perplexity of FILEs (one sentence per line) under MODEL.",
    )
    q.add_argument("model", metavar="MODEL", help="ARPA file")
    q.add_argument("files", nargs="+", metavar="FILE", help="held-out text or token-id files")
    q.add_argument("--json", action="store_true", help="print a JSON summary")
    q.set_defaults(lm_func=_cmd_ppl)

    i = sub.add_parser("info", help="orders and n-gram counts of an ARPA model")
    i.add_argument("model", metavar="MODEL", help="ARPA file")
    i.add_argument("--json", action="store_true", help="print JSON")
    i.set_defaults(lm_func=_cmd_info)

    c = sub.add_parser("compile", help="convert an ARPA model to latticekit's binary format")
    c.add_argument("model", metavar="MODEL", help="ARPA file")
    c.add_argument("output", metavar="OUTPUT", help="binary model file")
    c.add_argument("--json", action="store_true", help="print a JSON summary")
    c.set_defaults(lm_func=_cmd_compile)


def build_parser() -> argparse.ArgumentParser:
    """A stand-alone parser for ``latticekit lm`` (used by :func:`main`)."""
    parser = argparse.ArgumentParser(
        prog="latticekit lm",
        description="Build n-gram models (Katz back-off, identical to OpenGrm) and work with them.",
    )
    add_subparsers(parser)
    return parser


def _emit(args: argparse.Namespace, summary: Dict[str, Any], text: str) -> None:
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        print(text)


def _cmd_build(args: argparse.Namespace) -> int:
    from latticekit.lm.arpa_io import write_model_arpa
    from latticekit.lm.build import build_katz
    from latticekit.lm.katz import format_discounts

    bar = None
    if not args.no_progress and not args.json and sys.stderr.isatty():
        try:
            from tqdm import tqdm

            bar = tqdm(unit="tok", unit_scale=True, desc="counting", file=sys.stderr)
        except ImportError:
            bar = None
    t0 = time.perf_counter()
    model = build_katz(
        args.files,
        args.order,
        tokenized=args.tokenized,
        tokenizer=args.tokenizer,
        vocab_size=args.vocab_size,
        min_counts=args.min_count,
        theta=args.theta,
        target_ngrams=args.target_ngrams,
        add_vocabulary=args.add_vocabulary,
        workers=args.workers,
        chunk_tokens=args.chunk_tokens,
        spill_dir=args.spill_dir,
        progress=bar,
        run_memory=args.memory << 20,
    )
    if bar is not None:
        bar.close()
    t1 = time.perf_counter()
    write_model_arpa(args.output, model)
    t2 = time.perf_counter()
    if args.discounts:
        with open(args.discounts, "w", encoding="utf-8") as f:
            f.write(format_discounts(model.discounts))  # type: ignore[attr-defined]
    counts = list(model.counts)
    summary = {
        "output": args.output,
        "order": model.order,
        "ngrams": counts,
        "build_seconds": round(t1 - t0, 3),
        "write_seconds": round(t2 - t1, 3),
    }
    _emit(args, summary, f"wrote {args.output}: order {model.order}, n-grams {counts} "
          f"(built in {t1 - t0:.1f} s, written in {t2 - t1:.1f} s)")
    return 0


def _cmd_prune(args: argparse.Namespace) -> int:
    from latticekit.lm.arpa_io import read_arpa, write_model_arpa
    from latticekit.lm.prune import prune_relative_entropy

    model = read_arpa(args.model)
    before = list(model.counts)
    pruned = prune_relative_entropy(model, theta=args.theta, target_ngrams=args.target_ngrams)
    write_model_arpa(args.output, pruned)
    after = list(pruned.counts)
    _emit(args, {"output": args.output, "ngrams_before": before, "ngrams_after": after},
          f"wrote {args.output}: n-grams {before} -> {after}")
    return 0


def _cmd_ppl(args: argparse.Namespace) -> int:
    from latticekit.lm.arpa_io import read_arpa
    from latticekit.lm.ppl import perplexity_of_files

    result = perplexity_of_files(read_arpa(args.model), args.files)
    _emit(args, result.as_dict(), result.report().rstrip("\n"))
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    from latticekit.lm.arpa_io import read_arpa

    model = read_arpa(args.model)
    counts = list(model.counts)
    summary = {"model": args.model, "order": model.order, "ngrams": counts, "words": len(model.words)}
    lines = [f"{args.model}: order {model.order}"] + [f"  {k}-grams: {n}" for k, n in enumerate(counts, 1)]
    _emit(args, summary, "\n".join(lines))
    return 0


def _cmd_compile(args: argparse.Namespace) -> int:
    from latticekit.ngram import NGramLM

    lm = NGramLM.from_arpa(args.model)
    lm.save(args.output)
    _emit(args, {"model": args.model, "output": args.output, "ngrams": list(lm.counts)},
          f"wrote {args.output}")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``latticekit lm`` with ``argv`` (default: ``sys.argv[1:]``).

    Returns:
        The process exit status (0 on success, 1 on a latticekit error, 2 on usage errors).
    """
    from latticekit.errors import LatticeKitError

    args = build_parser().parse_args(argv)
    try:
        return int(args.lm_func(args))
    except (LatticeKitError, ValueError, OSError) as exc:
        if getattr(args, "json", False):
            print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
        else:
            print(f"latticekit lm {args.lm_command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
