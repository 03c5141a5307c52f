"""``benchmarks/decode_speed.py`` refuses malformed ``--more-heads`` values and decoders that name
heads no ``--more-heads`` gives: usage errors (exit 2), before any model is loaded."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "decode_speed.py"


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("value", ["v1", "=heads.safetensors", "v1="])
def test_more_heads_needs_label_and_path(value):
    out = run("--more-heads", value, "--decoders", "greedy")
    assert out.returncode == 2
    assert "expected LABEL=PATH" in out.stderr and "Traceback" not in out.stderr


def test_decoders_must_name_given_heads():
    out = run("--more-heads", "v1=some.safetensors", "--decoders", "greedy", "auto@v1", "auto@v3")
    assert out.returncode == 2
    assert "['v3']" in out.stderr and "no --more-heads gives" in out.stderr and "Traceback" not in out.stderr
