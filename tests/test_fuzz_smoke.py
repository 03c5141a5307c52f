"""A short run of the fuzz harness (tools/fuzz.py; the long runs are separate commands, see
docs/design.md): every input ends in a result or a typed error, and the harness itself
records a crash and a hang as such and goes on after them."""

import json
import subprocess
import sys
from pathlib import Path

FUZZ = Path(__file__).resolve().parent.parent / "tools" / "fuzz.py"


def fuzz(tmp_path, *args):
    done = subprocess.run([sys.executable, str(FUZZ), "--out", str(tmp_path), *args],
                          capture_output=True, text=True, timeout=300)
    report = json.loads(next((tmp_path).glob("report-*.json")).read_text())
    return done.returncode, report


def test_inputs_end_in_results_or_typed_errors(tmp_path):
    rc, report = fuzz(tmp_path, "--inputs", "600", "--seed", "7")
    assert rc == 0, report["failures"][:3]
    assert set(report["outcomes"]) <= {"ok", "typed"} and sum(report["outcomes"].values()) == 600
    assert report["outcomes"]["ok"] > 60  # the inputs reach the search, not only the checks


def test_the_harness_records_crashes_and_hangs(tmp_path):
    rc, report = fuzz(tmp_path, "--inputs", "150", "--selftest-crash-at", "40", "--selftest-hang-at", "90",
                      "--timeout", "3")
    assert rc == 1
    assert [(f["index"], f["outcome"]) for f in report["failures"]] == [(40, "crash"), (90, "hang")]
    assert sum(report["outcomes"].values()) == 150
