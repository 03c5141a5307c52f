"""The binary model format: round trip, and every kind of damage gives a typed error."""

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import latticekit as lk

DATA = Path(__file__).parent / "data"
GOLDEN = Path(__file__).parent / "lm" / "data"  # OpenGrm reference models and corpora


@pytest.fixture(scope="module")
def model_and_file(tmp_path_factory):
    lm = lk.NGramLM.from_arpa(GOLDEN / "tokenids-small" / "katz3.arpa.gz")
    path = tmp_path_factory.mktemp("bin") / "model.lkm"
    lm.save(path)
    return lm, path


def test_round_trip_scores_and_ngrams_identical(model_and_file):
    lm, path = model_and_file
    loaded = lk.NGramLM.load(path)
    assert loaded.counts == lm.counts and loaded.order == lm.order and loaded.words == lm.words
    toks = [int(t) for t in (DATA / "tokenids-small-heldout.txt").read_text().split()[:500]]
    assert loaded.score(toks, bos=True) == lm.score(toks, bos=True)
    for n in range(1, lm.order + 1):
        for a, b in zip(lm.ngrams(n), loaded.ngrams(n)):
            np.testing.assert_array_equal(a, b)
    assert os.path.getsize(path) == lm.size_bytes
    assert lm.size_bytes / lm.num_ngrams < 16


def test_vocab_survives_save_and_load(tmp_path):
    lm = lk.NGramLM.from_arpa(DATA / "words-small-katz2.arpa.gz", vocab=["def", "self", "zzz-not-there"])
    lm.save(tmp_path / "w.lkm")
    loaded = lk.NGramLM.load(tmp_path / "w.lkm")
    assert loaded.score([0, 1, 2]) == lm.score([0, 1, 2])


def test_save_leaves_no_temporary_files_and_replaces_atomically(model_and_file, tmp_path):
    lm, _ = model_and_file
    target = tmp_path / "m.lkm"
    target.write_bytes(b"old contents")
    lm.save(target)
    assert sorted(os.listdir(tmp_path)) == ["m.lkm"]
    assert lk.NGramLM.load(target).counts == lm.counts


def test_save_to_missing_folder_fails_cleanly(model_and_file, tmp_path):
    lm, _ = model_and_file
    with pytest.raises(lk.errors.FileAccessError, match="cannot write") as info:
        lm.save(tmp_path / "no" / "such" / "dir" / "m.lkm")
    assert isinstance(info.value, OSError) and info.value.errno == 2


@pytest.mark.parametrize("damage", ["empty", "magic", "version", "truncate_header", "truncate_tail",
                                    "trailing", "flip_byte"])
def test_damaged_files_raise_model_format_error(model_and_file, tmp_path, damage):
    _, path = model_and_file
    data = bytearray(path.read_bytes())
    if damage == "empty":
        data = bytearray()
    elif damage == "magic":
        data[:8] = b"NOTAMODL"
    elif damage == "version":
        data[16] ^= 0x7F
    elif damage == "truncate_header":
        data = data[:40]
    elif damage == "truncate_tail":
        data = data[: len(data) - 100]
    elif damage == "trailing":
        data += b"\0" * 64
    elif damage == "flip_byte":
        data[len(data) // 2] ^= 0x01
    bad = tmp_path / "bad.lkm"
    bad.write_bytes(bytes(data))
    with pytest.raises(lk.ModelFormatError):
        lk.NGramLM.load(bad)


@settings(max_examples=40)
@given(offset=st.integers(0, 10**9), value=st.integers(1, 255))
def test_random_corruption_never_crashes(model_and_file, tmp_path_factory, offset, value):
    _, path = model_and_file
    data = bytearray(path.read_bytes())
    data[offset % len(data)] ^= value
    bad = tmp_path_factory.mktemp("c") / "bad.lkm"
    bad.write_bytes(bytes(data))
    with pytest.raises(lk.ModelFormatError):
        lk.NGramLM.load(bad)


def test_missing_file_and_directory():
    # The file system's problems are OSErrors; the content's, ModelFormatError (ValueError).
    with pytest.raises(lk.errors.FileAccessError, match="cannot open") as info:
        lk.NGramLM.load("/nonexistent/model.lkm")
    assert isinstance(info.value, OSError) and info.value.errno == 2
    with pytest.raises(lk.errors.FileAccessError, match="not a regular file"):
        lk.NGramLM.load(DATA)
