"""Bad input gives typed errors that name the file and line."""

from __future__ import annotations

import numpy as np

import latticekit as lk
import pytest

from latticekit.errors import ArpaFormatError, LatticeKitError, VocabularyError
from latticekit.lm.arpa_io import read_arpa
from latticekit.lm.build import build_katz, count_ngrams
from latticekit.lm.counting import CorpusError, count_stream
from latticekit.lm.ppl import perplexity


def test_empty_corpus(tmp_path):
    path = tmp_path / "empty.txt"
    path.write_text("\n\n   \n")
    with pytest.raises(CorpusError, match="no sentence"):
        build_katz([str(path)], 3, workers=1)


def test_order_below_one(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("a b\n")
    with pytest.raises(ValueError, match="order"):
        build_katz([str(path)], 0)
    with pytest.raises(ValueError, match="order"):
        count_stream(np.array([1, 3, 2], np.int32), 0, 4)


def test_non_utf8_text_names_line(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"fine line\nalso fine\nbroken \xff\xfe here\n")
    with pytest.raises(CorpusError) as info:
        build_katz([str(path)], 2, workers=1)
    assert info.value.line == 3 and str(path) in str(info.value)
    assert isinstance(info.value, (LatticeKitError, ValueError))


def test_ids_beyond_vocabulary(tmp_path):
    path = tmp_path / "ids.txt"
    path.write_text("1 2 3\n4 99 5\n")
    with pytest.raises(VocabularyError, match=r":2: token id 99"):
        build_katz([str(path)], 2, tokenized=True, vocab_size=50, workers=1)


def test_ids_beyond_int32_without_a_vocabulary_size(tmp_path):
    path = tmp_path / "ids.txt"
    path.write_text("1 2 3\n4 2147483648 5\n")
    with pytest.raises(VocabularyError, match=r":2: token id 2147483648 does not fit int32"):
        build_katz([str(path)], 2, tokenized=True, workers=1)
    path.write_text("1 2 3\n\n4 5 99999999999999999999999\n")
    with pytest.raises(VocabularyError, match=r":3: token id with 19 digits or more does not fit"):
        build_katz([str(path)], 2, tokenized=True, workers=1)


@pytest.mark.parametrize("compile_", [False, True])
def test_sparse_huge_ids_count_like_small_ones(tmp_path, compile_):
    # Ids far apart (up to int32's maximum) must not allocate a table up to the largest id,
    # and must count exactly like the same corpus with the ids renamed to small ones.
    # (A compiled model takes token ids below 2**26 without a vocab; counting takes any int32.)
    big = [5, 2**26 - 1, 4194304, 70, 50_000_000] if compile_ else [5, 2**31 - 1, 4194304, 70, 2 * 10**9]
    rename = {b: i + 10 for i, b in enumerate(big)}
    rng = np.random.default_rng(2)
    lines = [[big[i] for i in rng.integers(0, len(big), rng.integers(1, 9))] for _ in range(200)]
    (tmp_path / "big.txt").write_text("".join(" ".join(map(str, l)) + "\n" for l in lines))
    (tmp_path / "small.txt").write_text("".join(" ".join(str(rename[t]) for t in l) + "\n" for l in lines))
    a = build_katz([str(tmp_path / "big.txt")], 3, tokenized=True, workers=1)
    b = build_katz([str(tmp_path / "small.txt")], 3, tokenized=True, workers=1)
    assert a.counts == b.counts
    assert [np.array_equal(x[1], y[1]) for x, y in zip(a.tables(), b.tables())] == [True] * 3
    if not compile_:
        return
    lm_a, lm_b = (lk.NGramLM.from_ngrams(m.words, m.tables()) for m in (a, b))
    sentence = [big[i] for i in (0, 1, 2, 1, 4, 3)]
    assert lm_a.score(sentence, bos=True) == lm_b.score([rename[t] for t in sentence], bos=True)


def test_not_decimal_ids(tmp_path):
    path = tmp_path / "ids.txt"
    path.write_text("1 2 3\n4 x5\n")
    with pytest.raises(CorpusError, match=r":2: 'x5'"):
        build_katz([str(path)], 2, tokenized=True, workers=1)


def test_sentence_longer_than_any_buffer(tmp_path):
    rng = np.random.default_rng(0)
    long_line = " ".join(map(str, rng.integers(0, 30, 300_000)))
    path = tmp_path / "long.txt"
    path.write_text(long_line + "\n1 2 3\n")
    model = build_katz([str(path)], 3, tokenized=True, workers=1, chunk_tokens=1000)
    assert model.counts[0] == 30 + 2  # 30 ids, <s>, </s>
    counts, _ = count_ngrams([str(path)], 1, tokenized=True, workers=1)
    assert counts.tokens == 300_003 and counts.sentences == 2


def test_add_vocabulary(tmp_path):
    path = tmp_path / "ids.txt"
    path.write_text("1 2 3\n3 2 1 1\n")
    model = build_katz([str(path)], 2, tokenized=True, vocab_size=10, add_vocabulary=True, workers=1)
    unigrams = {model.words[i]: p for i, p in zip(model.word[0], model.log10_prob[0])}
    assert set(unigrams) == {"<s>", "</s>"} | {str(i) for i in range(10)}
    assert unigrams["7"] == -1000.0 and unigrams["1"] > -2
    res = perplexity(model, [["7", "1"]])
    assert res.oovs == 0 and np.isfinite(res.logprob10)


def test_min_counts(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("a b c\na b c\na b d\n")
    full = build_katz([str(path)], 3, workers=1)
    cut = build_katz([str(path)], 3, min_counts=[1, 1, 2], workers=1)
    assert cut.counts[2] < full.counts[2]
    assert all(" ".join(cut.words[i] for i in row) != "a b d" for row in cut.ngram_ids(3))


@pytest.mark.parametrize(
    "text,match",
    [
        ("no data section\n", "no \\\\data"),
        ("\\data\\\nngram 1=2\n\n\\1-grams:\n-1\ta\n\\end\\\n", "header says 2"),
        ("\\data\\\nngram 1=1\n\n\\1-grams:\n-1 a\n\\end\\\n", ":5: expected"),
        ("\\data\\\nngram 1=1\nngram 2=1\n\n\\1-grams:\n-1\ta\n\n\\2-grams:\n-1\tb c\n\\end\\\n", "prefix"),
    ],
)
def test_bad_arpa(tmp_path, text, match):
    path = tmp_path / "bad.arpa"
    path.write_text(text)
    with pytest.raises(ArpaFormatError, match=match):
        read_arpa(str(path))


@pytest.mark.parametrize("chunk_tokens", [1, 1_000_000])
def test_token_id_errors_name_the_line_in_any_block(tmp_path, chunk_tokens):
    # chunk_tokens=1 reads blocks of a few lines, so the bad line sits in a later block
    good = "".join(f"{i} {i + 1} {i + 2}\n" for i in range(3, 2000))
    path = tmp_path / "ids.txt"
    path.write_bytes(good.encode() + b"4 5 \xff 6\n7 8\n")
    with pytest.raises(CorpusError, match=r":1998: not UTF-8") as info:
        count_ngrams([str(path)], 2, tokenized=True, chunk_tokens=chunk_tokens)
    assert info.value.line == 1998
    path.write_text(good + "4 5\n\n9 70000 9\n")
    with pytest.raises(VocabularyError, match=r":2000: token id 70000"):
        count_ngrams([str(path)], 2, tokenized=True, vocab_size=50_000, chunk_tokens=chunk_tokens)
    path.write_text(good + "4 5 99999999999999999999999 6\n")
    with pytest.raises(VocabularyError, match=r":1998: token id"):
        count_ngrams([str(path)], 2, tokenized=True, vocab_size=50_000, chunk_tokens=chunk_tokens)


def test_token_id_blocks_count_like_one_block(tmp_path):
    rng = np.random.default_rng(5)
    lines = [" ".join(map(str, rng.integers(0, 60, rng.integers(0, 12)))) for _ in range(3000)]
    path = tmp_path / "ids.txt"
    path.write_text("\n".join(lines))  # no final newline, blank lines included
    small, _ = count_ngrams([str(path)], 3, tokenized=True, chunk_tokens=1)
    large, _ = count_ngrams([str(path)], 3, tokenized=True)
    assert small.sentences == large.sentences == sum(1 for l in lines if l)
    for k in (1, 2, 3):
        assert np.array_equal(small.keys(k), large.keys(k))
        assert np.array_equal(small.count[k - 1], large.count[k - 1])
