"""The transformers matrix (.ci/transformers_matrix.sh) builds its venvs over the test
environment whatever that environment is: here a venv of its own, as a user's README test
command in a venv makes it. A venv made with ``--system-site-packages`` from inside a venv sees
the base interpreter's packages, not the venv's: the matrix then found no torch (issue 33)."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / ".ci" / "transformers_matrix.sh"

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="the matrix is a bash script")


def _site_packages(prefix: Path) -> Path:
    found = sorted(prefix.glob("lib/python*/site-packages"))
    assert len(found) == 1, found
    return found[0]


def _run(python: Path, code: str) -> str:
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.fixture(scope="module")
def test_environment(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv standing in for the user's test environment: a module installed in it, one reached
    through a .pth file (as an editable install is), and one the matrix venv will shadow."""
    env = tmp_path_factory.mktemp("user") / "env"
    venv.create(env, with_pip=False)
    site = _site_packages(env)
    (site / "lk_probe_installed.py").write_text("WHERE = 'test environment'\n")
    (site / "lk_probe_shadowed.py").write_text("WHERE = 'test environment'\n")
    editable = env.parent / "editable_src"
    editable.mkdir()
    (editable / "lk_probe_editable.py").write_text("WHERE = 'editable source'\n")
    (site / "__editable__.lk_probe.pth").write_text(f"{editable}\n")
    return env


def test_the_matrix_venv_sees_a_venv_test_environment_after_its_own_packages(test_environment: Path,
                                                                             tmp_path: Path) -> None:
    matrix = tmp_path / "matrix"
    env = {**os.environ, "PYTHON": str(test_environment / "bin" / "python")}
    built = subprocess.run(["bash", str(SCRIPT), "venv", str(matrix)], env=env, capture_output=True, text=True,
                           timeout=300, cwd=ROOT)
    assert built.returncode == 0, built.stderr
    (_site_packages(matrix) / "lk_probe_shadowed.py").write_text("WHERE = 'matrix venv'\n")
    python = matrix / "bin" / "python"
    got = _run(python, "import lk_probe_installed as a, lk_probe_editable as b, lk_probe_shadowed as c; "
                       "print(a.WHERE, b.WHERE, c.WHERE, sep='|')")
    assert got.split("|") == ["test environment", "editable source", "matrix venv"]
    # the matrix venv's own site-packages come first, the test environment's after them
    paths = _run(python, "import sys; print('\\n'.join(sys.path))").splitlines()
    own, theirs = str(_site_packages(matrix)), str(_site_packages(test_environment))
    assert own in paths and theirs in paths and paths.index(own) < paths.index(theirs)


def test_a_test_environment_without_torch_is_named_not_skipped(test_environment: Path, tmp_path: Path) -> None:
    """Without torch every matrix test would be skipped and the matrix would pass having tested
    nothing: it stops with a message that says what is missing."""
    env = {**os.environ, "PYTHON": str(test_environment / "bin" / "python"), "LK_MATRIX_DIR": str(tmp_path)}
    out = subprocess.run(["bash", str(SCRIPT), "oldest"], env=env, capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    assert out.returncode == 2
    assert "lacks torch" in out.stderr and str(test_environment) in out.stderr
    assert not any(tmp_path.iterdir())  # no venv was built


def test_without_torch_the_torch_tests_say_so(tmp_path: Path) -> None:
    """An environment without torch skips the torch adapter's tests with a message naming torch.
    (Their folder was tests/torch: on pytest's path it was a namespace package named torch, so
    without the real one `import torch` found the folder, and the tests died on "module 'torch'
    has no attribute 'set_num_threads'".)"""
    blocker = tmp_path / "no_torch"
    blocker.mkdir()
    # what a missing module raises (pytest.importorskip skips on it)
    (blocker / "torch.py").write_text("raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocker), str(ROOT)])}
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only",
                          "tests/torch_adapter"], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 5, out.stdout + out.stderr  # no tests collected: every file skipped
    assert "tests/torch_adapter skipped" in out.stdout and "torch" in out.stdout
    assert "set_num_threads" not in out.stdout + out.stderr
    assert not [p for p in (ROOT / "tests").iterdir() if p.name in ("torch", "vllm", "transformers")]
