"""p-best search against brute-force enumeration, batching, threads and the GIL."""

import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import latticekit as lk
from arpa_gen import arpa_models, to_arpa
from gil_probe import assert_releases_gil_on
from reference import ReferenceLM, brute_force_pbest

DATA = Path(__file__).parent / "data"
GOLDEN = Path(__file__).parent / "lm" / "data"  # OpenGrm reference models and corpora


@st.composite
def lattices(draw, max_h=4, max_k=4, max_token=9, tie_prone=False):
    h = draw(st.integers(1, max_h))
    k = draw(st.integers(1, max_k))
    tokens = np.array([draw(st.permutations(range(max_token)))[:k] for _ in range(h)], dtype=np.int32)
    if tie_prone:
        values = st.sampled_from([0.0, -1.0, -2.0])
    else:
        values = st.floats(-8.0, 0.0, allow_nan=False, width=32)
    scores = np.array([[draw(values) for _ in range(k)] for _ in range(h)], dtype=np.float32)
    widths = np.array([draw(st.integers(1, k)) for _ in range(h)], dtype=np.int32)
    return tokens, scores, widths


def assert_same_paths(got, ranked, p, tol=1e-9):
    """got is the p best of ``ranked`` (every path, as brute_force_pbest sorts them) up to
    rounding: rank by rank the same score, and a draft whose score is within rounding of
    that rank's. Paths whose scores tie only after float rounding (sums in another order)
    may come in any order, also across the p-th rank."""
    want = ranked[:p]
    assert len(got) == len(want)
    scores = np.array([w[0] for w in ranked])
    by_tokens = {w[1]: w for w in ranked}
    for g, (score, _, draft, _) in zip(got, want):
        close = tol * max(1, abs(score))
        assert g.score == pytest.approx(score, abs=close)
        assert g.tokens in {ranked[j][1] for j in np.flatnonzero(np.abs(scores - score) <= close)}
        assert g.draft_score == pytest.approx(by_tokens[g.tokens][2], abs=1e-9 * max(1, abs(draft)))
    assert len({g.tokens for g in got}) == len(got)


@settings(max_examples=80)
@given(model=arpa_models(max_order=4), lattice=lattices(), p=st.integers(1, 20),
       alpha=st.sampled_from([0.0, 0.3, 1.0, 25.0]), context=st.lists(st.integers(0, 9), max_size=4),
       bos=st.booleans())
def test_pbest_equals_brute_force(tmp_path_factory, model, lattice, p, alpha, context, bos):
    ngrams, _ = model
    path = tmp_path_factory.mktemp("m") / "m.arpa"
    path.write_text(to_arpa(ngrams))
    lm = lk.NGramLM.from_arpa(path)
    tokens, scores, widths = lattice
    got = lk.pbest(lk.SausageLattice(tokens, scores, widths), lm, p, alpha, context, bos)
    # The model stores float32 values (as KenLM does); with alpha = 25 and a positive back-off
    # weight cancelling a log-prob, float64 decimals differ by more than rounding of the sum.
    ranked = brute_force_pbest(tokens, scores, widths, ReferenceLM(ngrams, float32=True), None, alpha,
                               context, bos)
    assert_same_paths(got, ranked, p, tol=1e-6)
    for g in got:
        assert g.lm_score == pytest.approx(lm.score(g.tokens, context, bos), rel=1e-12, abs=1e-12)
        assert g.score == pytest.approx(g.draft_score + alpha * g.lm_score, rel=1e-12, abs=1e-12)


@settings(max_examples=40)
@given(seed=st.integers(0, 2**32 - 1), fan_out=st.lists(st.integers(0, 300), min_size=1, max_size=4),
       h=st.integers(1, 3), k=st.integers(1, 6), p=st.integers(1, 8), bos=st.booleans())
def test_pbest_with_long_arc_lists_equals_brute_force(tmp_path_factory, seed, fan_out, h, k, p, bos):
    # Histories with hundreds of continuations (the search finds their arcs through the
    # model's fence, a block at a time) next to short lists, and lattice words both
    # present in and missing from them.
    rng = np.random.default_rng(seed)
    words = [str(i) for i in range(300)]

    def logprob():
        return round(float(rng.uniform(-5.0, -0.01)), 4)

    def backoff():
        return round(float(rng.uniform(-2.0, 2.0)), 4)

    ngrams = {("<s>",): (-99.0, backoff()), ("</s>",): (logprob(), 0.0)}
    ngrams.update({(w,): (logprob(), backoff()) for w in words})
    heads = [words[i] for i in rng.choice(300, size=len(fan_out), replace=False)]
    for head, n in zip(heads, fan_out):
        ngrams.update({(head, words[i]): (logprob(), backoff()) for i in rng.choice(300, size=n, replace=False)})
    bigrams = [g for g in ngrams if len(g) == 2]
    if bigrams:  # a long trigram list after one bigram
        history = bigrams[int(rng.integers(len(bigrams)))]
        ngrams.update({history + (words[i],): (logprob(), 0.0)
                       for i in rng.choice(300, size=int(rng.integers(0, 200)), replace=False)})
    order = max(len(g) for g in ngrams)
    if order == 2:
        ngrams = {g: (lp, bo if len(g) < 2 else 0.0) for g, (lp, bo) in ngrams.items()}
    path = tmp_path_factory.mktemp("m") / "m.arpa"
    path.write_text(to_arpa(ngrams))
    lm = lk.NGramLM.from_arpa(path)
    # Every list's first and last words and those around the first block boundaries, so
    # that the partial blocks at both ends of a list are searched too.
    lists = {}
    for g in ngrams:
        if len(g) > 1:
            lists.setdefault(g[:-1], []).append(int(g[-1]))
    edges = sorted({w for ws in lists.values() for i in (0, 1, 6, 7, 8, 9, -1)
                    for w in [sorted(ws)[i % len(ws)]]} | {int(w) for w in heads})
    others = [int(w) for w in rng.choice(300, size=k, replace=False)]  # k distinct: full rows
    tokens = np.array([rng.permutation(np.unique(list(rng.choice(edges, size=k)) + others))[:k]
                       for _ in range(h)], dtype=np.int32)
    scores = rng.normal(-2.0, 1.5, (h, k)).astype(np.float32)
    widths = np.full(h, k, dtype=np.int32)
    context = [int(heads[0])] if rng.random() < 0.5 else []
    got = lk.pbest(lk.SausageLattice(tokens, scores), lm, p, 1.0, context, bos)
    ranked = brute_force_pbest(tokens, scores, widths, ReferenceLM(ngrams, float32=True), None, 1.0,
                               context, bos)
    assert_same_paths(got, ranked, p, tol=1e-6)


@pytest.fixture(scope="module", params=[40_000, 70_000])  # 16-bit and 32-bit word ids
def very_long_lists(tmp_path_factory, request):
    # Histories with thousands of continuations: past 2,048 arcs the search reads the upper
    # fence first (counted up to 16,384 arcs, binary-searched beyond).
    rng = np.random.default_rng(11)
    vocab = request.param
    words = [str(i) for i in range(vocab)]
    ngrams = {("<s>",): (-99.0, 0.3), ("</s>",): (-2.0, 0.0)}
    ngrams.update({(w,): (round(float(rng.uniform(-6.0, -1.0)), 4), round(float(rng.uniform(-1.0, 1.0)), 4))
                   for w in words})
    heads = {}
    for head, n in zip(rng.choice(vocab, size=4, replace=False), (2_100, 5_000, 16_500, 30_000)):
        cont = np.sort(rng.choice(vocab, size=n, replace=False))
        heads[int(head)] = cont
        ngrams.update({(words[head], words[c]): (round(float(rng.uniform(-5.0, -0.01)), 4), 0.0) for c in cont})
    path = tmp_path_factory.mktemp("long") / "long.arpa"
    path.write_text(to_arpa(ngrams))
    return lk.NGramLM.from_arpa(path), ReferenceLM(ngrams, float32=True), heads, vocab


@pytest.mark.parametrize("seed", range(12))
def test_pbest_with_very_long_arc_lists_equals_brute_force(very_long_lists, seed):
    lm, reference, heads, vocab = very_long_lists
    rng = np.random.default_rng(seed)
    head = list(heads)[seed % len(heads)]
    cont = heads[head]
    # Words at and around fence (8-arc) and upper fence (64-arc) boundaries of the list,
    # present words anywhere, and words the list lacks (between and beyond its words).
    at = [0, 1, 7, 8, 9, 63, 64, 65, 511, 512, 513, len(cont) - 2, len(cont) - 1]
    at += list(rng.integers(0, len(cont), 6))
    present = [int(cont[i]) for i in at if 0 <= i < len(cont)]
    absent = [w for w in rng.integers(0, vocab, 40).tolist() if w not in set(cont.tolist())][:6]
    absent += [int(cont[0]) - 1, int(cont[-1]) + 1] if cont[0] > 0 else [int(cont[-1]) + 1]
    pool = np.unique([w for w in present + absent if 0 <= w < vocab])
    # One column of 130 consecutive list words (every position modulo 64, so every kind of
    # boundary, wherever the list starts in the model), and two columns of mixed words.
    start = int(rng.integers(0, len(cont) - 130))
    one = np.unique(np.concatenate([cont[start:start + 130], pool]))[None]
    two = np.stack([rng.permutation(pool)[:12] for _ in range(2)])
    for tokens in (one.astype(np.int32), two.astype(np.int32)):
        h, k = tokens.shape
        scores = rng.normal(-2.0, 1.5, (h, k)).astype(np.float32)
        for p in (1, 5):
            got = lk.pbest(lk.SausageLattice(tokens, scores), lm, p, 1.0, [head])
            ranked = brute_force_pbest(tokens, scores, np.full(h, k, dtype=np.int32), reference, None, 1.0,
                                       [head], False)
            assert_same_paths(got, ranked, p, tol=1e-6)


@settings(max_examples=60)
@given(lattice=lattices(tie_prone=True), p=st.integers(1, 30))
def test_ties_break_by_tokens_ascending(tmp_path_factory, lattice, p):
    # alpha = 0 with few distinct scores: many exact ties, resolved by token sequence.
    lm = lk.NGramLM.from_arpa(GOLDEN / "tokenids-small" / "katz3.arpa.gz")
    tokens, scores, widths = lattice
    got = lk.pbest(lk.SausageLattice(tokens, scores, widths), lm, p, alpha=0.0)
    paths = brute_force_pbest(tokens, scores, widths, ReferenceLM({("x",): (0.0, 0.0)}), p, 0.0)
    assert [(g.score, g.tokens) for g in got] == [(w[0], w[1]) for w in paths]


def test_fewer_paths_than_p_returns_all():
    lm = lk.NGramLM.from_arpa(GOLDEN / "tokenids-small" / "katz3.arpa.gz")
    lat = lk.SausageLattice([[1, 2], [3, 4]], [[-0.1, -0.2], [-0.3, -0.4]])
    paths = lk.pbest(lat, lm, p=100)
    assert len(paths) == 4 == lat.num_paths
    assert len({p.tokens for p in paths}) == 4


def golden_lattices(lm, n, h, k, seed):
    rng = np.random.default_rng(seed)
    text = [int(t) for t in (DATA / "tokenids-small-heldout.txt").read_text().split()]
    ids = np.array([int(w) for w in lm.words[3:]])
    out = []
    for _ in range(n):
        pos = int(rng.integers(5, len(text) - h))
        toks = np.zeros((h, k), dtype=np.int32)
        for i in range(h):
            row = [text[pos + i]]
            while len(row) < k:
                c = int(rng.choice(ids))
                if c not in row:
                    row.append(c)
            toks[i] = rng.permutation(row)
        scores = rng.normal(-2, 1.5, (h, k)).astype(np.float32)
        out.append((lk.SausageLattice(toks, scores), text[pos - 5:pos]))
    return out


def test_batch_equals_single_calls_and_threads_agree():
    lm = lk.NGramLM.from_arpa(GOLDEN / "tokenids-small" / "katz3.arpa.gz")
    items = golden_lattices(lm, 24, 5, 6, seed=1)
    lattices_, contexts = [l for l, _ in items], [c for _, c in items]
    singles = [lk.pbest(l, lm, 8, 0.7, c) for l, c in items]
    for threads in (1, 2, 3):
        batch = lk.pbest_batch(lattices_, lm, 8, 0.7, contexts, threads=threads)
        assert list(batch) == singles
        assert batch.tokens.shape == (24, 8, 5)
    stacked = lk.SausageLattice(np.stack([l.tokens for l in lattices_]), np.stack([l.scores for l in lattices_]))
    assert list(lk.pbest_batch(stacked, lm, 8, 0.7, contexts)) == singles


def test_context_forms_agree_and_only_the_tail_is_read():
    lm = lk.NGramLM.from_arpa(GOLDEN / "tokenids-small" / "katz3.arpa.gz")
    (lat, context), = golden_lattices(lm, 1, 4, 5, seed=3)
    want = lk.pbest(lat, lm, 4, 0.7, context)
    assert want == lk.pbest(lat, lm, 4, 0.7, tuple(context))
    assert want == lk.pbest(lat, lm, 4, 0.7, np.array(context, dtype=np.int64))
    assert want == lk.pbest(lat, lm, 4, 0.7, [np.int64(t) for t in context])
    assert want == lk.pbest(lat, lm, 4, 0.7, context[-2:])  # a 3-gram reads 2 tokens
    # Tokens before the last order - 1 cannot change the result and are not checked.
    assert want == lk.pbest(lat, lm, 4, 0.7, [-5, 10**12] + context)
    assert list(lk.pbest_batch([lat], lm, 4, 0.7, [[-5] + context])) == [want]
    with pytest.raises(lk.VocabularyError, match="negative"):
        lk.pbest(lat, lm, 4, 0.7, context + [-1])
    with pytest.raises(lk.LatticeError, match="integer"):
        lk.pbest(lat, lm, 4, 0.7, context[:-1] + [1.5])
    with pytest.raises(lk.LatticeError, match="1-D"):
        lk.pbest(lat, lm, 4, 0.7, np.array([context]))


def test_batch_pads_different_widths():
    lm = lk.NGramLM.from_arpa(GOLDEN / "tokenids-small" / "katz3.arpa.gz")
    a = lk.SausageLattice([[5, 6, 7], [8, 9, 10]], np.full((2, 3), -1.0))
    b = lk.SausageLattice([[5], [8]], [[-1.0], [-2.0]])
    res = lk.pbest_batch([a, b], lm, 4)
    assert res[0] == lk.pbest(a, lm, 4) and res[1] == lk.pbest(b, lm, 4)
    assert res.counts.tolist() == [4, 1]


def test_fix_first_lattice_keeps_only_the_argmax():
    lm = lk.NGramLM.from_arpa(GOLDEN / "tokenids-small" / "katz3.arpa.gz")
    logits = np.random.default_rng(0).normal(size=(4, 50)).astype(np.float32)
    lat = lk.SausageLattice.from_logits(logits, k=5, fix_first=True)
    paths = lk.pbest(lat, lm, 30)
    assert {p.tokens[0] for p in paths} == {int(np.argmax(logits[0]))}
    assert len(paths) == 30 and lat.num_paths == 125


def test_gil_is_released_during_batch_search():
    lm = lk.NGramLM.from_arpa(GOLDEN / "tokenids-small" / "katz5_pruned.arpa.gz")
    items = golden_lattices(lm, 300, 8, 12, seed=2)
    lats = [l for l, _ in items]
    ctx = [c for _, c in items]
    assert_releases_gil_on(lambda d: lk.pbest_batch(d[0], lm, 16, 1.0, d[1], threads=1),
                           (lats, ctx), lambda d: (d[0] * 2, d[1] * 2), lambda d: len(d[0]) > 100_000)


def test_concurrent_calls_on_one_model_match_serial():
    lm = lk.NGramLM.from_arpa(GOLDEN / "tokenids-small" / "katz3.arpa.gz")
    items = golden_lattices(lm, 40, 6, 8, seed=3)
    serial = [lk.pbest(l, lm, 4, 1.0, c) for l, c in items]
    results = [None] * 4
    errors = []

    def work(i):
        try:
            results[i] = [lk.pbest(l, lm, 4, 1.0, c) for l, c in items]
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert all(r == serial for r in results)


def test_search_on_golden_model_matches_brute_force():
    lm = lk.NGramLM.from_arpa(GOLDEN / "tokenids-small" / "katz3.arpa.gz")
    import gzip
    ref = ReferenceLM.from_arpa_text(gzip.decompress((GOLDEN / "tokenids-small" / "katz3.arpa.gz").read_bytes()).decode())
    for lat, ctx in golden_lattices(lm, 6, 4, 4, seed=4):
        got = lk.pbest(lat, lm, 10, 1.0, ctx)
        ranked = brute_force_pbest(lat.tokens, lat.scores, lat.widths, ref, None, 1.0, ctx)
        assert_same_paths(got, ranked, 10, tol=1e-6)


@given(lattice=lattices(), data=st.data())
def test_arc_scores_equal_a_scan_of_each_position(lattice, data):
    """A token's score at a position: the first arc within the position's width that holds it,
    NaN when none does or the position lies past the lattice."""
    lat = lk.SausageLattice(*lattice) if isinstance(lattice, tuple) else lattice
    n = data.draw(st.integers(0, 12))
    positions = data.draw(st.lists(st.integers(0, lat.h + 1), min_size=n, max_size=n))
    tokens = data.draw(st.lists(st.integers(-1, 12), min_size=n, max_size=n))
    got = lat.arc_scores(np.asarray(positions), np.asarray(tokens))
    for i, (position, token) in enumerate(zip(positions, tokens)):
        want = float("nan")
        if position < lat.h:
            for j in range(int(lat.widths[position])):
                if int(lat.tokens[position, j]) == token:
                    want = float(lat.scores[position, j])
                    break
        assert got[i] == want or (np.isnan(got[i]) and np.isnan(want)), (i, position, token)
