"""Hostile models: every entry (ARPA text, gzip, binary files with a valid checksum, n-gram
tables, FST) checks values and sizes before trusting them, and the search never sees NaN or
inf. Issue 18's model reproducers, one test each, and a property test over random values."""

import gzip
import math
import struct
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import event, given, settings, strategies as st

import latticekit as lk
from arpa_gen import SMALL_ARPA as GOOD, arpa_models, to_arpa
from latticekit import _core
from latticekit.errors import LatticeKitError

DATA = Path(__file__).parent / "data"
GOLDEN = Path(__file__).parent / "lm" / "data"  # OpenGrm reference models and corpora

LATTICE = lk.SausageLattice([[7, 8], [8, 7]], np.zeros((2, 2)))


def arpa(tmp_path, text, name="m.arpa"):
    path = tmp_path / name
    path.write_bytes(gzip.compress(text.encode()) if name.endswith(".gz") else text.encode())
    return path


def assert_sane_paths(lm, lattice=LATTICE, p=4, alpha=1.0, **kw):
    paths = lk.pbest(lattice, lm, p, alpha, **kw)
    assert len(paths) == min(p, lattice.num_paths)
    for path in paths:
        assert math.isfinite(path.score) and math.isfinite(path.lm_score)
    assert [x.score for x in paths] == sorted((x.score for x in paths), reverse=True)
    return paths


# ---- -inf: probability zero, stored as -99 (the value SRILM writes)

@pytest.mark.parametrize("spelling", ["-inf", "-Infinity", "-1e999", "-1e39", "-" + "9" * 400])
def test_minus_inf_log_probability_is_stored_as_minus_99(tmp_path, spelling):
    lm = lk.NGramLM.from_arpa(arpa(tmp_path, GOOD.replace("-0.2\t7 8", f"{spelling}\t7 8")))
    assert lm.token_logprobs([8], context=[7])[0] == pytest.approx(-99 * math.log(10))
    paths = assert_sane_paths(lm)
    assert paths[-1].tokens == (7, 8)  # the zero-probability bigram ranks last
    assert lm.ngrams(2)[1].min() == -99.0


@pytest.mark.parametrize("old,new,line,pattern", [
    ("-0.2\t7 8", "nan\t7 8", 13, "log-probability is NaN in 2-gram '7 8'"),
    ("-0.2\t7 8", "inf\t7 8", 13, "log-probability inf is positive"),
    ("-0.2\t7 8", "1e-30\t7 8", 13, "is positive"),
    ("-0.9\t8\t0.1", "-0.9\t8\t1e39", 9, r"back-off weight is \+inf \(or beyond float32's range"),
    ("-0.9\t8\t0.1", "-0.9\t8\t-inf", 9, "back-off weight is -inf"),
    ("-0.9\t8\t0.1", "-0.9\t8\tnan", 9, "back-off weight is NaN"),
    ("-0.5\t7\t-0.2", "-0.5\t7\t-1e999", 8, "back-off weight is -inf"),
])
def test_bad_values_name_line_and_ngram(tmp_path, old, new, line, pattern):
    path = arpa(tmp_path, GOOD.replace(old, new))
    with pytest.raises(lk.ArpaFormatError, match=pattern) as info:
        lk.NGramLM.from_arpa(path)
    assert info.value.line == line and isinstance(info.value, ValueError)


def test_from_ngrams_checks_values_shapes_and_ids():
    words = ["<unk>", "<s>", "</s>", "5", "6"]
    ids = np.arange(5).reshape(-1, 1)
    good = np.array([-1.0, -99, -1, -1, -1], np.float32)

    def build(prob=good, backoff=np.zeros(5), ids=ids):
        return lk.NGramLM.from_ngrams(words, [(ids, prob, backoff)])

    assert build().score([5, 6]) < 0
    assert build(prob=np.where(np.arange(5) == 3, -np.inf, good)).token_logprobs([5])[0] == pytest.approx(
        -99 * math.log(10))
    for prob, backoff, pattern in [
        (np.where(np.arange(5) == 3, np.nan, good), np.zeros(5), "log-probability is NaN in 1-gram '5'"),
        (np.where(np.arange(5) == 3, np.inf, good), np.zeros(5), "is positive"),
        (good, np.array([0, 0, 0, 1e39, 0]), r"back-off weight is \+inf"),  # float64 beyond float32
        (good, np.array([0, 0, 0, np.nan, 0]), "back-off weight is NaN"),
    ]:
        with pytest.raises(lk.ArpaFormatError, match=pattern) as info:
            build(prob, backoff)
        assert info.value.path == "<tables>"
    for bad_ids, pattern in [(np.array([[0], [1], [2], [3], [2**32 + 4]]), "must index words"),
                             (np.arange(5.0).reshape(-1, 1), "must be integers"),
                             (np.arange(4).reshape(-1, 1), "same n-grams")]:
        with pytest.raises(lk.ArpaFormatError, match=pattern):
            build(ids=bad_ids)
    with pytest.raises(lk.ArpaFormatError, match="real numbers"):
        build(prob=np.array(["a"] * 5))


def test_from_fst_checks_values(tmp_path):
    pytest.importorskip("pywrapfst")
    from latticekit.lm.arpa_io import read_arpa
    from latticekit.lm.fst import model_from_fst, model_to_fst

    fst = model_to_fst(read_arpa(str(arpa(tmp_path, GOOD))))
    assert lk.NGramLM.from_fst(fst).order == 2
    model = model_from_fst(fst)
    model.log10_prob[0][3] = -np.inf  # probability zero: -99
    assert (lk.NGramLM.from_ngrams(model.words, model.tables()).ngrams(1)[1] == -99.0).sum() == 2  # and <s>
    model.log10_prob[0][3] = np.nan
    with pytest.raises(lk.ArpaFormatError, match="NaN"):
        lk.NGramLM.from_ngrams(model.words, model.tables())


def test_header_counts_are_checked_before_allocating(tmp_path):
    for count in ("10000000000", "4611686018427387904", "9223372036854775807"):
        text = f"\\data\\\nngram 1={count}\n\n\\1-grams:\n-1\t<s>\n\\end\\\n"
        start = time.perf_counter()
        with pytest.raises(lk.ArpaFormatError, match="more than the rest of the file") as info:
            lk.NGramLM.from_arpa(arpa(tmp_path, text))
        assert info.value.line == 2 and time.perf_counter() - start < 1.0


def test_corrupt_and_truncated_gzip(tmp_path):
    for data, pattern in [(b"\x1f\x8b" + b"garbage" * 10, "corrupt gzip"),
                          (gzip.compress(GOOD.encode())[:-12], "ends early"),
                          (gzip.compress(GOOD.encode()) + b"junk", "not gzip data"),
                          (b"", "ends early")]:
        path = tmp_path / "m.arpa.gz"
        path.write_bytes(data)
        with pytest.raises(lk.ArpaFormatError, match=pattern):
            lk.NGramLM.from_arpa(path)
    path.write_bytes(gzip.compress(GOOD[:60].encode()) + gzip.compress(GOOD[60:].encode()))
    assert lk.NGramLM.from_arpa(path).counts == (5, 2)  # members are concatenated


def test_gzip_is_inflated_only_as_far_as_its_header_allows(tmp_path):
    # 200 MB of blank lines after a header announcing 6 n-grams, in a file of ~200 KB (gzip
    # members concatenate): refused after a few MB.
    blank = gzip.compress(b"\n" * (1 << 20), compresslevel=9)
    head = GOOD.split("\\end\\")[0]
    path = tmp_path / "bomb.arpa.gz"
    path.write_bytes(gzip.compress(head.encode()) + blank * 200 + gzip.compress(b"\\end\\\n"))
    assert path.stat().st_size < 400_000
    start = time.perf_counter()
    with pytest.raises(lk.ArpaFormatError, match="decompresses to more than"):
        lk.NGramLM.from_arpa(path)
    assert time.perf_counter() - start < 2.0
    # Without a header, at most 64 MiB are inflated looking for one.
    path.write_bytes(blank * 200)
    with pytest.raises(lk.ArpaFormatError, match="no complete"):
        lk.NGramLM.from_arpa(path)


# ---- binary files: the checksum is no guard against a crafted file

STATES_OFFSET, ARCS_OFFSET, FLAGS, CHECKSUM, HEADER = 80, 88, 28, 128, 192


def craft(data: bytearray, offset: int, value: float) -> bytes:
    """data with a float32 written at offset and the checksum recomputed, as an attacker would."""
    data[offset:offset + 4] = struct.pack("<f", value)
    data[CHECKSUM:CHECKSUM + 8] = struct.pack("<Q", _core.checksum64(bytes(data[HEADER:])))
    return bytes(data)


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("bin") / "m.lkm"
    lm = lk.NGramLM.from_arpa(GOLDEN / "tokenids-small" / "katz3.arpa.gz")
    lm.save(path)
    return lm, path


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("where", ["backoff", "logprob"])
def test_crafted_binary_with_valid_checksum_is_refused(saved_model, tmp_path, where, value):
    _, path = saved_model
    data = bytearray(path.read_bytes())
    assert struct.unpack_from("<I", data, FLAGS)[0] & 2 == 0  # 16-bit words: 6-byte arc records
    states, arcs = struct.unpack_from("<QQ", data, STATES_OFFSET)
    offset = states + 12 * 5 + 4 if where == "backoff" else arcs + 6 * 40 + 2
    bad = tmp_path / "bad.lkm"
    bad.write_bytes(craft(data, offset, value))
    with pytest.raises(lk.ModelFormatError, match="must be finite"):
        lk.NGramLM.load(bad)
    bad.write_bytes(craft(data, offset, -3.0))  # a finite value in the same place loads
    assert lk.NGramLM.load(bad).order == 3


# ---- the property: whatever the values and alpha, min(p, paths) finite paths or a typed error

# Values a model may hold (extremes, -inf) more often than values it may not (NaN, +inf,
# positive log-probabilities, infinite back-off weights), so that most examples search.
HOSTILE_PROB = st.one_of(
    st.sampled_from(["-inf", "-1e39", "-1e999", "-3.4e38", "-1e-45", "0", "-99", "-1e30", "-3e38"]),
    st.sampled_from(["-inf", "-3.4e38", "0", "-1e30"]),
    st.sampled_from(["nan", "inf", "1e39", "3e38", "1"]))
HOSTILE_BACKOFF = st.one_of(
    st.sampled_from(["3.4e38", "-3.4e38", "1e30", "0", "-1e-45", "38", "-1e30", "-3e38"]),
    st.sampled_from(["3.4e38", "-3.4e38", "1e30", "-1e30"]),
    st.sampled_from(["nan", "inf", "-inf", "1e39", "-1e39"]))
ALPHAS = st.one_of(st.floats(0, 1e308), st.sampled_from([0.0, 1e-300, 1.0, 1e30, 1e290, 1e296, 1e300,
                                                         1e308, 10**400, -1.0, math.nan, math.inf]))


@st.composite
def hostile_models(draw):
    ngrams, _ = draw(arpa_models(max_order=3, max_vocab=4))
    order = max(len(g) for g in ngrams)
    for g in list(ngrams):
        p, b = ngrams[g]
        if draw(st.integers(0, 9)) == 0:
            p = draw(HOSTILE_PROB)
        if len(g) < order and draw(st.integers(0, 9)) == 0:
            b = draw(HOSTILE_BACKOFF)
        ngrams[g] = (p, b)
    return ngrams


@settings(max_examples=300, deadline=None)
@given(ngrams=hostile_models(), alpha=ALPHAS, p=st.integers(1, 30), h=st.integers(1, 4),
       k=st.integers(1, 4), seed=st.integers(0, 2**16), context=st.lists(st.integers(0, 5), max_size=3),
       entry=st.sampled_from(["arpa", "tables", "binary"]))
def test_hostile_values_never_give_nan_or_fewer_paths(tmp_path_factory, ngrams, alpha, p, h, k, seed,
                                                      context, entry):
    folder = tmp_path_factory.mktemp("h")
    path = folder / "m.arpa"
    path.write_text(to_arpa(ngrams))
    try:
        lm = lk.NGramLM.from_arpa(path)
    except lk.ArpaFormatError as exc:  # refused: a NaN, a positive log-probability, an inf back-off
        assert any(word in str(exc) for word in ("NaN", "positive", "inf", "beyond float32"))
        event("model refused")
        return
    if entry == "tables":
        lm = lk.NGramLM.from_ngrams(lm.words, [lm.ngrams(n) for n in range(1, lm.order + 1)])
    elif entry == "binary":
        lm.save(folder / "m.lkm")
        lm = lk.NGramLM.load(folder / "m.lkm")
    rng = np.random.default_rng(seed)
    tokens = np.array([rng.permutation(8)[:k] for _ in range(h)], dtype=np.int32)
    scores = rng.normal(0, 3, (h, k)).astype(np.float32)
    lattice = lk.SausageLattice(tokens, scores)
    assert all(math.isfinite(x) for x in lm.token_logprobs(tokens[:, 0], context))
    try:
        paths = lk.pbest(lattice, lm, p, alpha, context)
        batch = lk.pbest_batch([lattice, lattice], lm, p, alpha, [context, ()], threads=2)
    except lk.LatticeError as exc:
        assert "alpha" in str(exc)
        event("alpha refused")
        return
    event("searched")
    assert len(paths) == min(p, lattice.num_paths) == int(batch.counts[0])
    assert batch[0] == paths
    for x in paths:
        assert math.isfinite(x.score) and math.isfinite(x.lm_score) and not math.isnan(x.draft_score)
    # Best first, up to the rounding of sums in another order (scaled by the largest terms:
    # with huge values and alpha, draft scores are below it).
    values = [float(np.abs(lm.ngrams(n)[i]).max()) for n in range(1, lm.order + 1) for i in (1, 2)]
    scale = alpha * math.log(10) * (h + 2 * lm.order) * 2 * max(values) + h * float(np.abs(scores).max())
    assert all(a.score >= b.score - 1e-12 * scale for a, b in zip(paths, paths[1:]))


def test_every_error_is_typed():
    # The hierarchy: each class is a LatticeKitError and the built-in a caller would catch.
    from latticekit import errors

    assert issubclass(errors.FileAccessError, OSError) and issubclass(errors.ThreadStartError, OSError)
    assert issubclass(errors.OutOfMemoryError, MemoryError)
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), LatticeKitError)


def test_pure_python_reader_and_ngrams_errors_are_typed(tmp_path):
    from latticekit.lm.arpa_io import read_arpa

    path = tmp_path / "m.arpa.gz"
    path.write_bytes(b"\x1f\x8b" + b"garbage" * 10)
    with pytest.raises(lk.ArpaFormatError, match="corrupt gzip"):
        read_arpa(str(path))
    with pytest.raises(lk.errors.FileAccessError):
        read_arpa(str(tmp_path / "missing.arpa"))
    lm = lk.NGramLM.from_arpa(arpa(tmp_path, GOOD))
    for order in (0, 3, 1.5):
        with pytest.raises(lk.LatticeError, match="order must be in 1..2"):
            lm.ngrams(order)
