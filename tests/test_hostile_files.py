"""Hostile paths and files (issue 18): NUL bytes, failed saves, permission bits, symlinks,
writers killed mid-write."""

import os
import signal
import stat
import subprocess
import sys
import textwrap
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import latticekit as lk
from latticekit.errors import FileAccessError

GOLDEN = Path(__file__).parent / "lm" / "data"  # OpenGrm reference models and corpora


@pytest.fixture(scope="module")
def lm():
    return lk.NGramLM.from_arpa(GOLDEN / "tokenids-small" / "katz3.arpa.gz")


def test_paths_with_a_nul_byte_are_refused(lm, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for call in (lambda: lm.save("a\0b"), lambda: lk.NGramLM.load("a\0b"),
                 lambda: lk.NGramLM.from_arpa("a\0b"), lambda: lm.write_arpa("a\0b")):
        with pytest.raises(FileAccessError, match="NUL byte") as info:
            call()
        assert isinstance(info.value, OSError)
    assert os.listdir(tmp_path) == []  # "a\0b" used to write "a"


def test_failed_save_is_an_oserror(lm, tmp_path):
    (tmp_path / "dir").mkdir()
    for target in (tmp_path / "dir", tmp_path / "missing" / "m.lkm"):
        with pytest.raises(FileAccessError, match="cannot write") as info:
            lm.save(target)
        assert isinstance(info.value, OSError) and info.value.errno
    assert sorted(os.listdir(tmp_path)) == ["dir"] and os.listdir(tmp_path / "dir") == []


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_new_files_follow_the_umask(lm, tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        lm.save(tmp_path / "m.lkm")
        lm.write_arpa(tmp_path / "m.arpa")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "m.lkm").stat().st_mode) == mode
    assert stat.S_IMODE((tmp_path / "m.arpa").stat().st_mode) == mode


def test_replaced_files_keep_their_mode(lm, tmp_path):
    target = tmp_path / "m.lkm"
    target.write_bytes(b"old")
    target.chmod(0o600)
    lm.save(target)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert lk.NGramLM.load(target).counts == lm.counts


def test_a_symlink_stays_and_its_target_is_replaced(lm, tmp_path):
    (tmp_path / "real").mkdir()
    real = tmp_path / "real" / "m.lkm"
    real.write_bytes(b"old")
    link = tmp_path / "link.lkm"
    link.symlink_to(real)
    lm.save(link)
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert lk.NGramLM.load(real).counts == lm.counts
    dangling = tmp_path / "dangling.lkm"
    dangling.symlink_to(tmp_path / "real" / "new.lkm")
    lm.save(dangling)  # as open() would: the link's target is created
    assert dangling.is_symlink() and lk.NGramLM.load(tmp_path / "real" / "new.lkm").order == 3
    assert sorted(os.listdir(tmp_path / "real")) == ["m.lkm", "new.lkm"]


def test_a_killed_writers_temporary_file_is_removed_by_the_next_write(lm, tmp_path):
    target = tmp_path / "m.lkm"
    writer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from latticekit._files import atomic_write
        with atomic_write({str(target)!r}) as f:
            f.write(b"x" * (8 << 20))
            f.flush()
            print("writing", flush=True)
            time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert writer.stdout.readline().strip() == "writing"
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    left = os.listdir(tmp_path)
    assert len(left) == 1 and left[0].startswith(".m.lkm.lk-") and (tmp_path / left[0]).stat().st_size == 8 << 20
    alive = tmp_path / f".m.lkm.lk-{os.uname().nodename}-{os.getppid()}-0.tmp"  # a live writer's
    alive.write_bytes(b"")
    lm.save(target)
    assert sorted(os.listdir(tmp_path)) == sorted(["m.lkm", alive.name])


def test_latest_writer_writes_the_newest_off_the_callers_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``LatestWriter`` (the vLLM proposer's stats file): ``put`` does not wait for the disk;
    contents handed while a write runs replace one another, only the newest is written next;
    ``put(wait=...)`` returns once it is on disk; a failed write's error is kept for the
    caller's thread (``failures``, taken once) and the writer goes on."""
    import threading

    from latticekit import _files
    from latticekit._files import LatestWriter

    path, written = tmp_path / "stats.json", []
    entered, release = threading.Event(), threading.Event()
    real = _files.atomic_write

    @contextmanager
    def slow(target: Any) -> Any:  # the writes wait for the test
        entered.set()
        release.wait(10)
        with real(target) as f:
            yield f
        written.append(Path(target).read_bytes())

    monkeypatch.setattr(_files, "atomic_write", slow)
    writer = LatestWriter(path)
    assert writer.put(b"first") is False  # handed, not waited for: the write is blocked
    assert entered.wait(10)
    assert writer.put(b"second", wait=0.05) is False  # the writer is still on "first"
    writer.put(b"third")
    release.set()
    assert writer.put(b"fourth", wait=10) is True and path.read_bytes() == b"fourth"
    # "second" was replaced by "third" while the writer was blocked; "third" may or may not have
    # been written before "fourth" came
    assert written[0] == b"first" and b"second" not in written and written[-1] == b"fourth"
    assert writer.failures() == []

    monkeypatch.setattr(_files, "atomic_write", real)
    blocked = tmp_path / "folder"
    blocked.write_bytes(b"a file where the folder should be")
    writer = LatestWriter(blocked / "stats.json")
    assert writer.put(b"x", wait=10) is True
    failed = writer.failures()
    assert len(failed) == 1 and isinstance(failed[0], FileAccessError) and writer.failures() == []  # taken once
    blocked.unlink()
    blocked.mkdir()
    assert writer.put(b"y", wait=10) is True and (blocked / "stats.json").read_bytes() == b"y"
    assert writer.failures() == []
