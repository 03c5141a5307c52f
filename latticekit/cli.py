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

    from latticekit.demo import add_parser as add_demo_parser

    add_demo_parser(sub)

    lm = sub.add_parser("lm", help="build, prune, evaluate, inspect and compile n-gram models",
                        description="Katz n-gram models identical to OpenGrm's, without OpenGrm.")
    from latticekit.lm.cli import add_subparsers

    add_subparsers(lm)

    from latticekit.eval.evaluate import add_parser as add_eval_parser

    add_eval_parser(sub)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "demo":
            from latticekit.demo import main as demo_main

            return demo_main(args)
        if args.command == "eval":
            return int(args.eval_func(args) or 0)
        return int(args.lm_func(args) or 0)
    except (LatticeKitError, OSError) as exc:
        print(f"latticekit: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
