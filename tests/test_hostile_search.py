"""Hostile search arguments (issue 18): an alpha that would overflow the scores, thread
limits and thread-creation failures, p beyond the number of paths, odd logits. Each is a
typed error or an exact answer, never an abort, a hang or a silent short answer."""

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import latticekit as lk

LM_PATH = Path(__file__).parent / "lm" / "data" / "tokenids-small" / "katz3.arpa.gz"


@pytest.fixture(scope="module")
def lm():
    return lk.NGramLM.from_arpa(LM_PATH)


LATTICE = lk.SausageLattice([[18, 29], [85, 1002]], np.zeros((2, 2)))


@pytest.mark.parametrize("context", [(), [18, 29]])
def test_alpha_that_would_overflow_is_refused(lm, context):
    # alpha = 1e308 passed "finite and >= 0", then alpha * lm_score overflowed: [] without a
    # context, a 2^32-entry zero fill with one.
    with pytest.raises(lk.LatticeError, match=r"alpha=1e\+308 would overflow the path scores") as info:
        lk.pbest(LATTICE, lm, 4, alpha=1e308, context=context)
    limit = float(str(info.value).rsplit("at most ", 1)[1])
    for alpha in (limit * (1 - 1e-5), limit / 10):  # up to the limit (printed to 6 digits), all paths
        paths = lk.pbest(LATTICE, lm, 4, alpha=alpha, context=context)
        assert len(paths) == 4 and all(np.isfinite([p.score for p in paths]))
    with pytest.raises(lk.LatticeError, match="would overflow"):
        lk.pbest_batch([LATTICE], lm, 4, alpha=1e308, threads=1)


@pytest.mark.parametrize("alpha", [10**400, -(10**400), float("inf"), True, "1"])
def test_alpha_of_any_type_is_a_typed_error(lm, alpha):
    with pytest.raises(lk.LatticeError, match="alpha must be a finite number"):
        lk.pbest(LATTICE, lm, 1, alpha=alpha)


@pytest.mark.parametrize("threads", [0, 1025, 2**31, 2**70, 1.5, True])
def test_threads_are_bounded(lm, threads):
    with pytest.raises(lk.LatticeError, match=r"threads must be an integer in 1\.\.1024"):
        lk.pbest_batch([LATTICE], lm, 1, threads=threads)
    assert lk.pbest_batch([LATTICE] * 3, lm, 1, threads=1024).counts.tolist() == [1, 1, 1]


def test_thread_creation_failure_is_typed_and_joins_every_thread():
    # Under a memory limit the 8th thread or so cannot start: the process used to abort
    # (std::terminate on a joinable thread, exit 134).
    script = textwrap.dedent(f"""
        import resource
        import latticekit as lk
        lm = lk.NGramLM.from_arpa({str(LM_PATH)!r})
        lats = [lk.SausageLattice([[1, 2], [3, 4]], [[0.0, -1.0], [0.0, -1.0]])] * 2000
        lk.pbest_batch(lats[:4], lm, 2, threads=2)
        size = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (size + (48 << 20), resource.RLIM_INFINITY))
        try:
            lk.pbest_batch(lats, lm, 2, threads=1000)
        except lk.errors.ThreadStartError as exc:
            assert isinstance(exc, OSError) and "use fewer threads" in str(exc), exc
            print("typed", exc.errno)
        resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        assert lk.pbest_batch(lats, lm, 2, threads=4).counts.sum() == 4000
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    if "typed" not in done.stdout:
        pytest.skip("this system started 1000 threads under the memory limit")


def test_pbest_batch_output_rows_are_capped_by_the_paths(lm):
    # p = 2^20 on 64 one-path lattices used to allocate (64, 2^20, h) outputs: 3.5 GiB.
    one = lk.SausageLattice([[5]], [[0.0]])
    start = time.perf_counter()
    result = lk.pbest_batch([one] * 64, lm, 2**20, threads=1)
    assert result.tokens.shape == (64, 1, 1) and result.scores.shape == (64, 1)
    assert result.counts.tolist() == [1] * 64 and time.perf_counter() - start < 1.0
    mixed = lk.pbest_batch([lk.SausageLattice([[5], [6]], [[0.0], [0.0]]),
                            lk.SausageLattice([[5, 6], [7, 8]], np.zeros((2, 2)))], lm, 100)
    assert mixed.tokens.shape == (2, 4, 2) and mixed.counts.tolist() == [1, 4]
    wide = lk.SausageLattice(np.arange(64 * 4).reshape(64, 4), np.zeros((64, 4)))  # 4^64 paths
    assert lk.pbest_batch([wide], lm, 3).tokens.shape == (1, 3, 64)


@pytest.mark.parametrize("logits,pattern", [
    (np.zeros((0, 3)), "at least one head"),
    (np.zeros((2, 0, 3)), "at least one head"),
    ([[1.0, 2.0], [3.0]], "array of real numbers"),
    ([["a", "b"]], "real numbers"),
    (np.zeros((2, 3), dtype=complex), "real numbers"),
    (np.zeros((2, 3), dtype=bool), "real numbers"),
    (np.zeros(3), "shape"),
])
def test_from_logits_odd_input_is_a_lattice_error(logits, pattern):
    with pytest.raises(lk.LatticeError, match=pattern):
        lk.SausageLattice.from_logits(logits, k=1, fix_first=True)


def test_from_logits_takes_lists_and_odd_torch_dtypes():
    assert lk.SausageLattice.from_logits([[0.0, 3.0, 1.0]], k=2).tokens.tolist() == [[1, 2]]
    torch = pytest.importorskip("torch")
    with pytest.raises(lk.LatticeError, match="real numbers"):
        lk.SausageLattice.from_logits(torch.zeros(2, 3, dtype=torch.bool), k=1)
    with pytest.raises(lk.LatticeError, match="at least one head"):
        lk.SausageLattice.from_logits(torch.zeros(0, 3), k=1)
    assert lk.SausageLattice.from_logits(torch.tensor([[0, 3, 1]]), k=1).tokens.tolist() == [[1]]
