"""Golden equality with OpenGrm NGram 1.3.11: counts, discounts, ARPA bytes, pruning, ppl."""

from __future__ import annotations

import gzip
import os
import re

import numpy as np
import pytest

from latticekit.lm.arpa_io import arpa_text, read_arpa, write_model_arpa
from latticekit.lm.build import build_katz, count_ngrams
from latticekit.lm.katz import format_discounts
from latticekit.lm.ppl import perplexity_of_files
from latticekit.lm.prune import prune_relative_entropy

DATA = os.path.join(os.path.dirname(__file__), "data")


def _path(folder: str, name: str) -> str:
    return os.path.join(DATA, folder, name)


def _read(path: str) -> str:
    if path.endswith(".gz"):
        with gzip.open(path, "rt", encoding="utf-8", newline="\n") as f:
            return f.read()
    with open(path, encoding="utf-8", newline="\n") as f:
        return f.read()


def _golden_ppl(folder: str, name: str) -> "tuple[float, float]":
    text = _read(_path(folder, name))
    m = re.search(r"logprob\(base 10\)= (\S+);\s+perplexity = (\S+)", text)
    assert m
    return float(m.group(1)), float(m.group(2))


def _discount_table(text: str) -> str:
    return "\n".join(l for l in text.splitlines() if not l.startswith(("INFO", "WARNING")))


@pytest.fixture(scope="module")
def words_model_4():
    return build_katz([_path("words-small", "corpus.txt")], 4, workers=1)


@pytest.fixture(scope="module")
def ids_model_5():
    return build_katz([_path("tokenids-small", "corpus.txt")], 5, workers=1)


def test_counts_equal_ngramcount():
    counts, words = count_ngrams([_path("words-small", "corpus.txt")], 3, workers=1)
    expected = {}
    for line in _read(_path("words-small", "counts3.txt.gz")).splitlines():
        ngram, c = line.rsplit("\t", 1)
        expected[ngram] = int(c)
    got = {}
    for k in range(1, 4):
        ids = counts.ngram_ids(k)
        for row, c in zip(ids.tolist(), counts.count[k - 1].tolist()):
            got[" ".join(words[i] for i in row)] = c
    assert got == expected


@pytest.mark.parametrize("folder,order", [("words-small", 3), ("tokenids-small", 3)])
def test_arpa_bytes_equal_ngrammake(folder, order, tmp_path):
    model = build_katz([_path(folder, "corpus.txt")], order, workers=2, chunk_tokens=20_000)
    out = tmp_path / "katz.arpa"
    write_model_arpa(str(out), model)
    assert out.read_bytes() == _read(_path(folder, f"katz{order}.arpa.gz")).encode("utf-8")


@pytest.mark.parametrize(
    "folder,orders", [("words-small", (2, 3, 4)), ("tokenids-small", (2, 3, 4, 5))]
)
def test_discount_tables(folder, orders):
    for order in orders:
        model = build_katz([_path(folder, "corpus.txt")], order, workers=1)
        expected = _discount_table(_read(_path(folder, f"katz{order}_discounts.txt")))
        assert _discount_table(format_discounts(model.discounts)) == expected


def test_words_order4_ppl(words_model_4):
    got = perplexity_of_files(words_model_4, [_path("words-small", "heldout.txt")])
    logprob, ppl = _golden_ppl("words-small", "katz4.ppl")
    assert (got.sentences, got.words, got.oovs) == (400, 2147, 529)
    assert got.logprob10 == pytest.approx(logprob, abs=0.006)
    assert f"{got.perplexity:.6g}" == f"{ppl:.6g}"


def test_ids_order5_ppl(ids_model_5):
    got = perplexity_of_files(ids_model_5, [_path("tokenids-small", "heldout.txt")])
    logprob, ppl = _golden_ppl("tokenids-small", "katz5.ppl")
    assert got.logprob10 == pytest.approx(logprob, abs=0.06)
    assert f"{got.perplexity:.6g}" == f"{ppl:.6g}"


@pytest.mark.parametrize("folder,fixture,name", [
    ("words-small", "words_model_4", "katz4_pruned"),
    ("tokenids-small", "ids_model_5", "katz5_pruned"),
])
def test_pruned_matches_ngramshrink(folder, fixture, name, request):
    model = request.getfixturevalue(fixture)
    pruned = prune_relative_entropy(model, theta=1e-6)
    golden = _read(_path(folder, f"{name}.arpa.gz"))
    # every kept n-gram and every value identical (implies Jaccard 1.0 >= 0.995)
    assert arpa_text(pruned) == golden
    got = perplexity_of_files(pruned, [_path(folder, "heldout.txt")])
    _, ppl = _golden_ppl(folder, f"{name}.ppl")
    assert abs(got.perplexity - ppl) / ppl < 0.005


def test_pure_python_reader_roundtrip():
    text = _read(_path("words-small", "katz3.arpa.gz"))
    model = read_arpa(_path("words-small", "katz3.arpa.gz"))
    assert arpa_text(model) == text
    got = perplexity_of_files(model, [_path("words-small", "heldout.txt")])
    _, ppl = _golden_ppl("words-small", "katz3.ppl")
    assert f"{got.perplexity:.6g}" == f"{ppl:.6g}"


def test_scores_equal_kenlm():
    kenlm = pytest.importorskip("kenlm")
    path = _path("words-small", "katz3.arpa.gz")
    k = kenlm.Model(path)
    model = read_arpa(path)
    lines = [l.split() for l in _read(_path("words-small", "heldout.txt")).splitlines() if l.split()]
    known = [s for s in lines if all(w in set(model.words) for w in s)][:100]
    assert known
    from latticekit.lm.ppl import perplexity

    for s in known[:50]:
        assert perplexity(model, [s]).logprob10 == pytest.approx(k.score(" ".join(s)), abs=1e-4)
