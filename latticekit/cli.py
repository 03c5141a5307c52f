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

    demo = sub.add_parser("demo", help="rescore lattices from real held-out text with the embedded model",
                          description="Builds draft lattices from held-out Python source and prints the "
                                      "p best n-gram rescored drafts, their scores and the search time.")
    demo.add_argument("--lattices", type=int, default=200, help="number of lattices (default 200)")
    demo.add_argument("--h", type=int, default=8, help="positions per lattice (default 8)")
    demo.add_argument("--k", type=int, default=8, help="arcs per position (default 8)")
    demo.add_argument("--p", type=int, default=4, help="paths kept (default 4)")
    demo.add_argument("--alpha", type=float, default=1.0, help="n-gram weight (default 1.0)")
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
            from latticekit.demo import run_demo

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
