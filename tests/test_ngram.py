"""NGramLM scores against the slow reference and KenLM, on random and golden models."""

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import latticekit as lk
from arpa_gen import arpa_models, to_arpa
from reference import LN10, ReferenceLM

kenlm = pytest.importorskip("kenlm")
DATA = Path(__file__).parent / "data"
GOLDEN = Path(__file__).parent / "lm" / "data"  # OpenGrm reference models and corpora


def kenlm_log10probs(model, words, context_words=(), bos=False):
    """KenLM's BaseScore chain from BeginSentenceWrite / NullContextWrite."""
    state, out_state = kenlm.State(), kenlm.State()
    (model.BeginSentenceWrite if bos else model.NullContextWrite)(state)
    for w in context_words:
        model.BaseScore(state, w, out_state)
        state, out_state = out_state, state
    scores = []
    for w in words:
        scores.append(model.BaseScore(state, w, out_state))
        state, out_state = out_state, state
    return scores


def write(tmp_path, text, name="model.arpa"):
    path = tmp_path / name
    path.write_text(text)
    return path


token_lists = st.lists(st.integers(0, 8), max_size=8)


def check_against_reference(tmp_path_factory, ngrams, tokens, context, bos):
    path = write(tmp_path_factory.mktemp("m"), to_arpa(ngrams))
    lm = lk.NGramLM.from_arpa(path)
    got = lm.token_logprobs(tokens, context, bos) / LN10
    want = ReferenceLM(ngrams).token_log10probs(tokens, context, bos)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)
    assert lm.score(tokens, context, bos) == pytest.approx(sum(want) * LN10, rel=1e-6, abs=1e-4)
    return path, lm, got


@given(model=arpa_models(), tokens=token_lists, context=st.lists(st.integers(0, 8), max_size=6),
       bos=st.booleans())
def test_scores_equal_reference(tmp_path_factory, model, tokens, context, bos):
    check_against_reference(tmp_path_factory, model[0], tokens, context, bos)


@settings(max_examples=40)
@given(model=arpa_models(suffix_closed=True), tokens=token_lists,
       context=st.lists(st.integers(0, 8), max_size=6), bos=st.booleans())
def test_scores_equal_kenlm(tmp_path_factory, model, tokens, context, bos):
    path, lm, got = check_against_reference(tmp_path_factory, model[0], tokens, context, bos)
    if lm.order < 2:
        return  # KenLM's models need at least a bigram; the reference covered it
    km = kenlm.Model(str(path))
    theirs = kenlm_log10probs(km, [str(t) for t in tokens], [str(t) for t in context], bos)
    # KenLM accumulates in float32: agree to its precision.
    np.testing.assert_allclose(got, theirs, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("name,vocab_from_words", [
    ("tokenids-small-katz3", False), ("tokenids-small-katz5_pruned", False),
    ("words-small-katz2", True), ("words-small-katz3", True)])
def test_golden_models_score_as_kenlm(name, vocab_from_words):
    corpus = "words-small" if name.startswith("words") else "tokenids-small"
    # the bigram is ours (tests/data); the others are OpenGrm's reference builds
    path = DATA / f"{name}.arpa.gz" if name == "words-small-katz2" else GOLDEN / corpus / f"{name[len(corpus) + 1:]}.arpa.gz"
    lines = [l.split() for l in (DATA / f"{corpus}-heldout.txt").read_text().splitlines() if l.split()]
    if vocab_from_words:
        probe = lk.NGramLM.from_arpa(path, vocab=["<unk>"])
        vocab = probe.words + sorted({w for l in lines for w in l} - set(probe.words))
        lm = lk.NGramLM.from_arpa(path, vocab=vocab)
        index = {w: i for i, w in enumerate(vocab)}
        encode = lambda words: [index[w] for w in words]
    else:
        lm = lk.NGramLM.from_arpa(path)
        encode = lambda words: [int(w) for w in words]
    import gzip, tempfile, os
    with tempfile.NamedTemporaryFile("wb", suffix=".arpa", delete=False) as f:
        f.write(gzip.decompress(path.read_bytes()))
    try:
        km = kenlm.Model(f.name)
    finally:
        os.unlink(f.name)
    total_ours, total_theirs = 0.0, 0.0
    for words in lines[:120]:
        for bos in (True, False):
            ours = lm.token_logprobs(encode(words), bos=bos) / LN10
            theirs = kenlm_log10probs(km, words, bos=bos)
            np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=2e-5)
            total_ours += ours.sum()
            total_theirs += sum(theirs)
    assert total_ours == pytest.approx(total_theirs, rel=1e-6)


def test_properties_and_counts(tmp_path):
    lm = lk.NGramLM.from_arpa(GOLDEN / "tokenids-small" / "katz3.arpa.gz")
    assert lm.order == 3
    # OpenGrm writes no <unk>: the model adds it, as KenLM does.
    assert lm.counts == (5592, 34360, 57264)
    assert lm.words[:3] == ["<unk>", "<s>", "</s>"]
    assert "3-grams=57264" in repr(lm)


def test_unknown_tokens_score_as_unk_and_kenlm_default(tmp_path):
    text = to_arpa({("<s>",): (-99.0, -0.5), ("</s>",): (-1.0, 0.0), ("5",): (-0.5, 0.25),
                    ("5", "5"): (-0.1, 0.0)})
    lm = lk.NGramLM.from_arpa(write(tmp_path, text))
    # token 7 is unknown: log10 -100 (no <unk> entry), after a back-off from "5" (+0.25).
    assert lm.score([7], context=[5]) == pytest.approx((0.25 - 100.0) * LN10)
    assert lm.score([5, 5]) == pytest.approx((-0.5 - 0.1) * LN10)
    assert lm.score([]) == 0.0


def test_context_longer_than_order_only_last_tokens_matter(tmp_path):
    lm = lk.NGramLM.from_arpa(GOLDEN / "tokenids-small" / "katz3.arpa.gz")
    toks = [int(t) for t in (DATA / "tokenids-small-heldout.txt").read_text().split()[:40]]
    long_ctx, tail = toks[:30], toks[28:30]
    assert lm.score(toks[30:], long_ctx) == lm.score(toks[30:], tail)
    assert lm.score(toks[30:], long_ctx, bos=True) == lm.score(toks[30:], tail)


def test_missing_prefixes_keep_backoff_semantics(tmp_path):
    # "1 2 3" exists but "1 2" does not: "1 2" must score by back-off, as the reference does.
    ngrams = {("<s>",): (-99.0, 0.0), ("</s>",): (-1.0, 0.0), ("1",): (-0.7, 0.3), ("2",): (-0.6, -0.2),
              ("3",): (-0.9, 0.0), ("2", "3"): (-0.2, 0.4), ("1", "2", "3"): (-0.05, 0.0)}
    lines = ["\\data\\", "ngram 1=5", "ngram 2=1", "ngram 3=1", "", "\\1-grams:"]
    lines += [f"{p}\t{g[0]}\t{b}" for g, (p, b) in ngrams.items() if len(g) == 1]
    lines += ["", "\\2-grams:", "-0.2\t2 3\t0.4", "", "\\3-grams:", "-0.05\t1 2 3", "", "\\end\\"]
    lm = lk.NGramLM.from_arpa(write(tmp_path, "\n".join(lines)))
    ref = ReferenceLM(ngrams)
    for tokens in ([1, 2, 3], [1, 2], [2, 3, 1, 2, 3], [3, 1, 2, 2, 3]):
        assert lm.score(tokens) == pytest.approx(ref.score(tokens), abs=1e-5)


def test_vocab_maps_words_and_unknowns(tmp_path):
    text = to_arpa({("<s>",): (-99.0, -0.3), ("</s>",): (-1.0, 0.0), ("the",): (-0.5, -0.1),
                    ("cat",): (-1.5, 0.0), ("the", "cat"): (-0.2, 0.0)})
    vocab = ["the", "cat", "dog", "</s>"]
    lm = lk.NGramLM.from_arpa(write(tmp_path, text), vocab=vocab)
    assert lm.score([0, 1]) == pytest.approx((-0.5 - 0.2) * LN10)
    assert lm.score([2]) == pytest.approx(-100.0 * LN10)  # "dog" is not in the model
    assert lm.score([3], context=[1]) == pytest.approx(-1.0 * LN10)  # the tokenizer's EOS maps to </s>
    assert lm.score([9]) == pytest.approx(-100.0 * LN10)  # beyond the vocab


def test_from_ngrams_round_trips_ngrams():
    lm = lk.NGramLM.from_arpa(DATA / "words-small-katz2.arpa.gz", vocab=["<unk>"])
    tables = [lm.ngrams(n) for n in range(1, lm.order + 1)]
    again = lk.NGramLM.from_ngrams(lm.words, tables, vocab=lm.words)
    for n in range(1, lm.order + 1):
        for a, b in zip(tables[n - 1], again.ngrams(n)):
            np.testing.assert_array_equal(a, b)


def test_gzip_and_plain_agree(tmp_path):
    import gzip
    raw = gzip.decompress((GOLDEN / "tokenids-small" / "katz3.arpa.gz").read_bytes())
    plain = tmp_path / "m.arpa"
    plain.write_bytes(raw)
    a = lk.NGramLM.from_arpa(plain)
    b = lk.NGramLM.from_arpa(GOLDEN / "tokenids-small" / "katz3.arpa.gz")
    toks = [int(t) for t in (DATA / "tokenids-small-heldout.txt").read_text().split()[:200]]
    assert a.score(toks, bos=True) == b.score(toks, bos=True)


def test_scoring_accepts_numpy_and_torch():
    lm = lk.NGramLM.from_arpa(GOLDEN / "tokenids-small" / "katz3.arpa.gz")
    toks = [int(t) for t in (DATA / "tokenids-small-heldout.txt").read_text().split()[:20]]
    expected = lm.score(toks)
    assert lm.score(np.array(toks, dtype=np.int64)) == expected
    torch = pytest.importorskip("torch")
    assert lm.score(torch.tensor(toks)) == expected


def test_word_token_ids_follow_the_cores_reading_of_decimal_words(tmp_path: Path) -> None:
    path = tmp_path / "d.arpa"
    path.write_text(to_arpa({("<s>",): (-99.0, 0.0), ("</s>",): (-1.0, 0.0), ("7",): (-0.5, 0.0),
                             ("007",): (-0.6, 0.0), ("²",): (-0.7, 0.0), ("0",): (-0.8, 0.0)}))
    lm = lk.NGramLM.from_arpa(path)
    got = dict(zip(lm.words, lm.word_token_ids().tolist()))
    assert got == {"<unk>": -1, "<s>": -1, "</s>": -1, "7": 7, "007": -1, "²": -1, "0": 0}
    # the core agrees: token 7 scores as the word "7", and "007" is no token of its own
    assert lm.token_logprobs([7])[0] == pytest.approx(-0.5 * math.log(10))
    assert lm.token_logprobs([0])[0] == pytest.approx(-0.8 * math.log(10))
