"""Bad input gets a typed error that says what is wrong: ARPA files, lattices, arguments."""

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import latticekit as lk
from arpa_gen import SMALL_ARPA as GOOD
from reference import slow_lattice_problem

GOLDEN = Path(__file__).parent / "lm" / "data"  # OpenGrm reference models and corpora



def arpa(tmp_path, text):
    path = tmp_path / "m.arpa"
    path.write_text(text)
    return path


def test_good_model_loads(tmp_path):
    assert lk.NGramLM.from_arpa(arpa(tmp_path, GOOD)).counts == (5, 2)


@pytest.mark.parametrize("text,line,pattern", [
    (GOOD.replace("ngram 1=4", "ngram 1=5"), 11, "has 4 entries but the header announces 5"),
    (GOOD.replace("ngram 2=2", "ngram 2=1"), 13, "more entries than the header announces"),
    (GOOD.replace("-0.2\t7 8", "-0.2x\t7 8"), 13, "cannot parse log-probability '-0.2x'"),
    (GOOD.replace("-0.2\t7 8", "nan\t7 8"), 13, "log-probability is NaN"),
    (GOOD.replace("-0.9\t8\t0.1", "-0.9\t8\tinf"), 9, r"back-off weight is \+inf"),
    (GOOD.replace("-0.9\t8\t0.1", "0.5\t8\t0.1"), 9, "is positive"),
    (GOOD.replace("-0.3\t<s> 7", "-0.3\t<s>"), 12, "needs a log-probability, 2 words"),
    (GOOD.replace("\\2-grams:", "\\3-grams:"), 11, "expected '\\\\2-grams:'"),
    (GOOD.replace("\\end\\", ""), 0, "missing \\\\end\\\\"),
    (GOOD.replace("\\data\\", "data"), 0, "no \\\\data\\\\ section"),
    (GOOD.replace("ngram 2=2", "ngram 3=2"), 3, "orders in the header"),
    (GOOD.replace("ngram 1=4", "ngram 1=four"), 2, "non-negative integers"),
    (GOOD.replace("-0.2\t7 8", "-0.2\t7 9"), 13, "word '9' of a 2-gram is not among the 1-grams"),
    (GOOD.replace("-0.2\t7 8", "-0.3\t<s> 7"), 13, "duplicate 2-gram '<s> 7'"),
    (GOOD.replace("-99\t<s>\t-0.5", "-99\t<x>\t-0.5").replace("<s> 7", "<x> 7"), 0, "no <s> 1-gram"),
])
def test_malformed_arpa_names_file_and_line(tmp_path, text, line, pattern):
    path = arpa(tmp_path, text)
    with pytest.raises(lk.ArpaFormatError) as info:
        lk.NGramLM.from_arpa(path)
    err = info.value
    assert isinstance(err, ValueError)
    assert err.path == str(path)
    assert err.line == line
    assert str(path) in str(err)
    if line:
        assert f":{line}:" in str(err)
    if pattern:
        assert info.match(pattern)


def test_truncated_file_at_every_cut_gives_typed_error(tmp_path):
    raw = GOOD.encode()
    for cut in range(0, len(raw) - 8, 3):
        path = tmp_path / "cut.arpa"
        path.write_bytes(raw[:cut])
        with pytest.raises(lk.ArpaFormatError):
            lk.NGramLM.from_arpa(path)


def test_corrupt_gzip(tmp_path):
    path = tmp_path / "m.arpa.gz"
    path.write_bytes(b"\x1f\x8b" + b"garbage" * 10)
    with pytest.raises(lk.ArpaFormatError, match="gzip"):
        lk.NGramLM.from_arpa(path)


def test_missing_arpa_file_is_oserror():
    with pytest.raises(OSError):
        lk.NGramLM.from_arpa("/nonexistent.arpa")


@pytest.fixture(scope="module")
def lm():
    return lk.NGramLM.from_arpa(GOLDEN / "tokenids-small" / "katz3.arpa.gz")


@pytest.mark.parametrize("tokens,scores,widths,error,pattern", [
    ([[1, 2]], [[0.0, np.nan]], None, lk.LatticeError, "finite"),
    ([[1, 2]], [[0.0, -np.inf]], None, lk.LatticeError, "finite"),
    ([[1, 2]], np.array([[0.0, 1e300]]), None, lk.LatticeError, "beyond float32"),
    (np.array([[[1, 2]], [[3, 3]]], dtype=np.int32), np.zeros((2, 1, 2)), None, lk.LatticeError,
     r"position \(1, 0\) lists a token twice"),
    (np.array([[1, 2], [5, 5]], dtype=np.int64), np.zeros((2, 2)), None, lk.LatticeError, r"position \(1,\) lists"),
    ([list(range(40)) + [7]], np.zeros((1, 41)), None, lk.LatticeError, "twice"),
    ([[1, 2]], [[0.0]], None, lk.LatticeError, "differs"),
    ([1, 2], [0.0, 1.0], None, lk.LatticeError, r"shape \(h, k\)"),
    ([[1.5, 2]], [[0.0, 0.0]], None, lk.LatticeError, "integers"),
    ([[1, -2]], [[0.0, 0.0]], None, lk.VocabularyError, "negative token id"),
    (np.array([[1, 2**31]], dtype=np.int64), [[0.0, 0.0]], None, lk.VocabularyError, "does not fit int32"),
    ([[1, 1]], [[0.0, 0.0]], None, lk.LatticeError, "twice"),
    ([[1, 2]], [[0.0, 0.0]], [3], lk.LatticeError, "widths"),
    ([[1, 2]], [[0.0, 0.0]], [0], lk.LatticeError, "widths"),
    (np.zeros((2, 0), dtype=np.int32), np.zeros((2, 0)), None, lk.LatticeError, "at least one"),
])
def test_bad_lattices(tokens, scores, widths, error, pattern):
    with pytest.raises(error, match=pattern):
        lk.SausageLattice(tokens, scores, widths)


def test_arcs_past_the_width_are_not_checked():
    lat = lk.SausageLattice([[4, 4]], [[0.0, np.nan]], widths=[1])
    assert lat.num_paths == 1
    for dtype in (np.int32, np.int64):  # -1 padding, whatever the dtype
        lat = lk.SausageLattice(np.array([[4, -1], [5, 6]], dtype=dtype), np.zeros((2, 2)), widths=[1, 2])
        assert lat.num_paths == 2


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_lattice_checks_equal_the_obvious_loop(data):
    batch, h = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    k = data.draw(st.sampled_from([1, 2, 5, 40]))  # 40: the sorted duplicate check
    shape = (batch, h, k)
    tokens = np.array(data.draw(st.lists(st.integers(-2, 45), min_size=batch * h * k, max_size=batch * h * k)),
                      dtype=data.draw(st.sampled_from([np.int32, np.int64]))).reshape(shape)
    values = st.one_of(st.floats(-50, 50), st.sampled_from([np.nan, np.inf, -np.inf, 1e39]))
    scores = np.array(data.draw(st.lists(values, min_size=batch * h * k, max_size=batch * h * k))).reshape(shape)
    widths = np.array(data.draw(st.lists(st.integers(1, k), min_size=batch * h, max_size=batch * h)),
                      dtype=np.int32).reshape(batch, h)
    want = slow_lattice_problem(tokens, scores, widths)
    if want is None:
        lat = lk.SausageLattice(tokens, scores, widths)
        assert np.array_equal(lat.tokens, tokens) and lat.tokens.dtype == np.int32
    else:
        with pytest.raises(want):
            lk.SausageLattice(tokens, scores, widths)


def test_bad_search_arguments(lm):
    lat = lk.SausageLattice([[1, 2]], [[0.0, -1.0]])
    for p in (0, -1, 1.5, True):
        with pytest.raises(lk.LatticeError, match="p must be"):
            lk.pbest(lat, lm, p)
    for alpha in (-0.1, float("nan"), float("inf")):
        with pytest.raises(lk.LatticeError, match="alpha"):
            lk.pbest(lat, lm, 1, alpha)
    with pytest.raises(lk.VocabularyError):
        lk.pbest(lat, lm, 1, context=[-3])
    with pytest.raises(lk.LatticeError, match="one lattice"):
        lk.pbest(lk.SausageLattice(np.ones((2, 1, 1), np.int32), np.zeros((2, 1, 1))), lm, 1)
    with pytest.raises(lk.LatticeError, match="contexts"):
        lk.pbest_batch([lat, lat], lm, 1, contexts=[[1]])
    with pytest.raises(lk.LatticeError, match="threads"):
        lk.pbest_batch([lat], lm, 1, threads=0)
    with pytest.raises(lk.LatticeError, match="same number of positions"):
        lk.pbest_batch([lat, lk.SausageLattice([[1], [2]], [[0.0], [0.0]])], lm, 1)
    with pytest.raises(lk.LatticeError, match="NGramLM"):
        lk.pbest(lat, "not a model", 1)


def test_bad_scoring_input(lm):
    with pytest.raises(lk.VocabularyError, match="negative"):
        lm.score([1, -1])
    with pytest.raises(lk.VocabularyError, match="int32"):
        lm.score([2**40])
    with pytest.raises(lk.LatticeError, match="integer"):
        lm.score([1.5])
    with pytest.raises(lk.LatticeError, match="1-D"):
        lm.score([[1, 2]])


def test_from_logits_numpy_matches_manual_top_k():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 40))
    lat = lk.SausageLattice.from_logits(logits, k=5)
    logprobs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    expected = np.argsort(-logprobs, axis=-1)[:, :5]
    np.testing.assert_array_equal(lat.tokens, expected)
    np.testing.assert_allclose(lat.scores, np.take_along_axis(logprobs, expected, -1), rtol=1e-6)
    batch = lk.SausageLattice.from_logits(np.stack([logits, logits]), k=5, fix_first=True)
    assert batch.batch_size == 2 and batch.widths[:, 0].tolist() == [1, 1]
    with pytest.raises(lk.LatticeError, match="k=41"):
        lk.SausageLattice.from_logits(logits, k=41)
    with pytest.raises(lk.LatticeError, match="k=0"):
        lk.SausageLattice.from_logits(logits, k=0)
    with pytest.raises(lk.LatticeError, match="finite"):
        lk.SausageLattice.from_logits(np.full((2, 4), np.nan), k=2)
    with pytest.raises(lk.LatticeError, match="shape"):
        lk.SausageLattice.from_logits(np.zeros(5), k=2)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_from_logits_torch_refuses_a_single_non_finite_logit(bad: float) -> None:
    """The torch path's check reads the logits' two ends (NaN reaches both): one bad logit
    anywhere in a batch is refused, as the NumPy path refuses it; an empty batch is no error."""
    torch = pytest.importorskip("torch")
    logits = torch.randn(2, 3, 30, generator=torch.Generator().manual_seed(1))
    logits[1, 2, 17] = bad
    with pytest.raises(lk.LatticeError, match="finite"):
        lk.SausageLattice.from_logits(logits, k=4)
    with pytest.raises(lk.LatticeError, match="finite"):
        lk.SausageLattice.from_logits(logits.numpy(), k=4)
    assert lk.SausageLattice.from_logits(torch.zeros(0, 3, 30), k=4).tokens.shape == (0, 3, 4)


def test_from_logits_torch_matches_numpy():
    torch = pytest.importorskip("torch")
    logits = torch.randn(2, 4, 30, generator=torch.Generator().manual_seed(0))
    a = lk.SausageLattice.from_logits(logits, k=6, fix_first=True)
    b = lk.SausageLattice.from_logits(logits.numpy(), k=6, fix_first=True)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_allclose(a.scores, b.scores, rtol=1e-5, atol=1e-6)
    assert lk.SausageLattice(torch.tensor([[3, 4]]), torch.tensor([[0.0, -1.0]])).k == 2


def _latticekit_modules():
    """Every module of the package that imports here (torch's only where torch is installed)."""
    import importlib
    import pkgutil

    for info in pkgutil.walk_packages(lk.__path__, "latticekit."):
        try:
            yield importlib.import_module(info.name)
        except ImportError as exc:  # an optional dependency (torch, pynini, matplotlib) is missing
            if not exc.name or exc.name.split(".")[0] == "latticekit":
                raise


def test_every_error_class_is_defined_in_latticekit_errors():
    import inspect

    import latticekit.errors as errors

    seen = {}
    for module in _latticekit_modules():
        for name, value in vars(module).items():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__.startswith("latticekit"):
                seen[f"{module.__name__}.{name}"] = value
    assert seen, "no error class found"
    for where, cls in seen.items():
        assert cls.__module__ == "latticekit.errors", f"{where} is defined in {cls.__module__}"
        assert getattr(errors, cls.__name__) is cls, where
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.LatticeKitError)
        assert cls is errors.LatticeKitError or any(
            issubclass(cls, builtin) for builtin in (ValueError, TypeError, OSError, MemoryError)), name


def test_heads_errors_are_one_family():
    from latticekit.errors import HeadsError, HeadsFormatError, HeadsMismatchError

    assert issubclass(HeadsFormatError, HeadsError) and issubclass(HeadsMismatchError, HeadsError)
    assert not issubclass(HeadsFormatError, HeadsMismatchError) and not issubclass(HeadsMismatchError, HeadsFormatError)
