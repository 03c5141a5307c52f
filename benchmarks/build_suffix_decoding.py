"""Build and install SuffixDecoding's suffix tree alone, for vLLM's ``suffix`` proposer on a CPU.

What it builds: ``arctic_inference.suffix_decoding`` (``SuffixDecodingCache``, ``SuffixDecodingDraft``
and the nanobind extension ``_C`` with the C++ ``SuffixTree``) from the ``arctic-inference==0.3.0``
sdist, as one small distribution, ``arctic-inference-suffix-decoding``. That module is all vLLM
0.32's ``suffix`` method imports (``vllm/v1/spec_decode/suffix_decoding.py``: ``from
arctic_inference.suffix_decoding import SuffixDecodingCache``; ``vllm/config/speculative.py`` checks
that ``arctic_inference`` is importable).

Why not arctic's own ``setup.py``: arctic-inference has no wheel with the suffix tree for this
CPU (0.3.0 is an sdist only), and its ``setup.py`` imports torch to build, compiles .proto files
with grpcio-tools, pins torch and protobuf in its build requirements, can build CUDA ops, and
installs a ``vllm.general_plugins`` entry point (``arctic_inference.vllm.plugin``) that vLLM loads
in every process of every engine and that patches vLLM's internals for one vLLM version. A
benchmark of vLLM's own ``suffix`` proposer needs none of that, and the plugin would change the
engines it is compared with. So this script takes from the sdist only the suffix tree's C++
(``csrc/suffix_decoding``), its Python wrapper (``arctic_inference/suffix_decoding/__init__.py``,
``cache.py``: not ``simulator.py``, an offline tool that needs pandas) and the empty
``arctic_inference/__init__.py``, adds a ``pyproject.toml`` (scikit-build-core) and a top-level
``CMakeLists.txt`` that installs ``_C`` next to ``cache.py``, and ``pip install``s that folder
(pip fetches ``scikit-build-core`` and ``nanobind==2.9.2``, the version arctic pins, from PyPI
into its isolated build environment).

Idempotent: it does nothing when the same build is installed and imports (``--force`` rebuilds).
It refuses to run next to the full ``arctic-inference`` distribution (uninstall that first).
latticekit's tests never need it; ``benchmarks/vllm_speed.py`` skips its ``suffix`` engine
without it.

Usage::

    python benchmarks/build_suffix_decoding.py [--sdist arctic_inference-0.3.0.tar.gz] [--force]

Needs a C++20 compiler and CMake >= 3.18; the sdist is downloaded with ``pip download`` when
``--sdist`` is not given and the work folder has none.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent
ARCTIC_VERSION = "0.3.0"
SDIST_NAME = f"arctic_inference-{ARCTIC_VERSION}.tar.gz"
SDIST_SHA256 = "7f22e3e1b1071c6061c0d6951be17c0fb50b08d06d6e543144c8f52faba60a36"
DISTRIBUTION = "arctic-inference-suffix-decoding"
#: Files taken from the sdist, relative to its top folder.
TAKEN = ["LICENSE", "arctic_inference/__init__.py", "arctic_inference/suffix_decoding/__init__.py",
         "arctic_inference/suffix_decoding/cache.py", "csrc/suffix_decoding/CMakeLists.txt",
         "csrc/suffix_decoding/bindings.cc", "csrc/suffix_decoding/suffix_tree.cc",
         "csrc/suffix_decoding/suffix_tree.h", "csrc/suffix_decoding/int32_map.h"]

PYPROJECT = f"""\
[build-system]
requires = ["scikit-build-core>=0.10", "nanobind==2.9.2"]
build-backend = "scikit_build_core.build"

[project]
name = "{DISTRIBUTION}"
version = "{ARCTIC_VERSION}"
description = "SuffixDecoding's suffix tree (arctic_inference.suffix_decoding) alone, from the arctic-inference {ARCTIC_VERSION} sdist, without its vLLM plugin"
requires-python = ">=3.10"
dependencies = ["numpy"]
license = {{text = "Apache-2.0"}}

[tool.scikit-build]
cmake.build-type = "Release"
wheel.packages = ["arctic_inference"]
"""

CMAKELISTS = """\
cmake_minimum_required(VERSION 3.18)
project(arctic_suffix_decoding LANGUAGES CXX)
# arctic's own CMakeLists.txt builds the nanobind module _C and installs nothing
add_subdirectory(csrc/suffix_decoding)
install(TARGETS _C LIBRARY DESTINATION arctic_inference/suffix_decoding)
"""


def installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def imports() -> bool:
    """Whether a fresh interpreter imports what vLLM imports, and drafts with it."""
    probe = ("from arctic_inference.suffix_decoding import SuffixDecodingCache\n"
             "c = SuffixDecodingCache(max_tree_depth=8, max_cached_requests=4)\n"
             "c.start_request('r', [1, 2, 3, 1, 2])\n"
             "assert c.speculate('r', [1, 2], max_spec_tokens=4).token_ids[:1] == [3]\n")
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


def arctic_plugins() -> list[str]:
    return [f"{e.name} = {e.value}" for e in importlib.metadata.entry_points(group="vllm.general_plugins")
            if e.value.startswith("arctic_inference")]


def sdist(path: str | None, work: Path) -> Path:
    """The sdist, checked against its PyPI digest: the given file, or the work folder's, or downloaded."""
    found = Path(path) if path else work / SDIST_NAME
    if not found.exists():
        if path:
            raise SystemExit(f"no sdist at {found}")
        work.mkdir(parents=True, exist_ok=True)
        # pip reads the sdist's metadata with its setup.py: isolated, that build environment asks for
        # arctic's torch and protobuf pins, so it runs in this environment (torch and setuptools)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        "--no-build-isolation", f"arctic-inference=={ARCTIC_VERSION}", "-d", str(work)], check=True)
    digest = hashlib.sha256(found.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        raise SystemExit(f"{found}: sha256 {digest}, expected {SDIST_SHA256} (arctic-inference {ARCTIC_VERSION} on PyPI)")
    return found


def stage(tarball: Path, source: Path) -> None:
    """The minimal source tree: arctic's files in TAKEN, a pyproject.toml and a CMakeLists.txt."""
    if source.exists():
        shutil.rmtree(source)
    top = f"arctic_inference-{ARCTIC_VERSION}"
    with tarfile.open(tarball) as tar:
        for name in TAKEN:
            member = tar.extractfile(f"{top}/{name}")
            if member is None:
                raise SystemExit(f"{tarball} has no file {top}/{name}")
            target = source / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(member.read())
    (source / "pyproject.toml").write_text(PYPROJECT)
    (source / "CMakeLists.txt").write_text(CMAKELISTS)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sdist", help=f"the {SDIST_NAME} file (default: the work folder's, downloaded if absent)")
    p.add_argument("--work", default=str(ROOT / "cache" / "suffix_decoding"),
                   help="where the sdist and the staged source go (default: benchmarks/cache/suffix_decoding)")
    p.add_argument("--force", action="store_true", help="rebuild and reinstall even when installed")
    args = p.parse_args()

    if installed_version("arctic-inference") or installed_version("arctic_inference"):
        raise SystemExit("the full arctic-inference distribution is installed (with its vLLM plugin): "
                         "`pip uninstall arctic-inference` first")
    if not args.force and installed_version(DISTRIBUTION) == ARCTIC_VERSION and imports():
        print(f"{DISTRIBUTION} {ARCTIC_VERSION} is installed and imports; nothing to do (--force rebuilds)")
        return
    work = Path(args.work)
    tarball = sdist(args.sdist, work)
    source = work / "source"
    stage(tarball, source)
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--force-reinstall", str(source)],
                   check=True)
    if not imports():
        raise SystemExit("installed, but `from arctic_inference.suffix_decoding import SuffixDecodingCache` "
                         "fails or drafts wrongly in a fresh interpreter")
    if arctic_plugins():
        raise SystemExit(f"an arctic vLLM plugin is registered: {arctic_plugins()}")
    print(f"installed {DISTRIBUTION} {ARCTIC_VERSION}: arctic_inference.suffix_decoding imports; "
          "no arctic vLLM plugin is registered")


if __name__ == "__main__":
    main()
