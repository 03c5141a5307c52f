"""The C++ core's own unit tests (csrc/tests/*.cc, one program whose main is test_core.cc's),
compiled with the system C++ compiler from the core's sources as setup.py lists them, and
run."""

import ast
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEST_DIR = ROOT / "csrc" / "tests"


def core_sources():
    """setup.py's CORE_SOURCES, read without running setup.py."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "CORE_SOURCES" for target in node.targets
        ):
            return [ROOT / source for source in ast.literal_eval(node.value)]
    raise AssertionError("setup.py has no CORE_SOURCES list")


def cpp_test_sources():
    """The test program's sources: every .cc file in csrc/tests."""
    sources = sorted(TEST_DIR.glob("*.cc"))
    assert TEST_DIR / "test_core.cc" in sources, "csrc/tests/test_core.cc (the main) is missing"
    return sources


def cxx_compiler():
    """The C++ compiler Python was built with when it is installed, else c++ or g++; None
    when there is none."""
    configured = (sysconfig.get_config_var("CXX") or "").split()
    for candidate in [configured[0] if configured else None, "c++", "g++", "clang++"]:
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    return None


def test_core_units(tmp_path):
    compiler = cxx_compiler()
    if compiler is None:
        pytest.skip("no C++ compiler (c++, g++ or clang++) on PATH to build csrc/tests")
    binary = tmp_path / "test_core"
    command = [compiler, "-std=c++17", "-O1", "-pthread", "-Wall", f"-I{ROOT / 'csrc'}",
               *map(str, cpp_test_sources()), *map(str, core_sources()), "-o", str(binary)]
    build = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, f"{' '.join(command)}\n{build.stdout}{build.stderr}"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    run = subprocess.run([str(binary), str(scratch)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"test_core failed (rc {run.returncode}):\n{run.stdout}{run.stderr}"
    assert " 0 failed" in run.stdout, run.stdout
