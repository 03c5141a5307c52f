"""The C++ counting, the k-way merge, memory-bounded counting with spilled runs, and the
ARPA line formatter, each against a slow, obviously-correct reference."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from gil_probe import assert_releases_gil_on
from latticekit import _core
from latticekit.lm.build import count_ngrams
from latticekit.lm.corpus import lines_to_stream
from latticekit.lm.counting import NGramCounts, count_corpus, count_stream, merge_counts
from latticekit.lm.trie import EOS
from reference import count_tables_as_dict, reference_ngram_counts

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True)


def corpora(max_word: int = 9):
    return st.lists(
        st.lists(st.integers(3, max_word), min_size=1, max_size=12), min_size=1, max_size=30
    )


def _stream(sents):
    ids = np.concatenate([np.asarray(s) for s in sents])
    return lines_to_stream(ids, [len(s) for s in sents])


@SETTINGS
@given(corpora(), st.integers(1, 5))
def test_count_stream_equals_dictionary_count(sents, order):
    counts = count_stream(_stream(sents), order, 10)
    assert count_tables_as_dict(counts) == reference_ngram_counts(sents, order)
    assert counts.sentences == len(sents) and counts.tokens == sum(map(len, sents))


def test_count_stream_large_vocabulary():
    # word ids near 2^20 make (prefix row * vocab_size + word) keys of more than 32 bits
    rng = np.random.default_rng(1)
    sents = [rng.integers(3, 1 << 20, rng.integers(1, 20)).tolist() for _ in range(300)]
    sents += [[5, 6, 7, 5, 6, 7]] * 20
    counts = count_stream(_stream(sents), 4, 1 << 20)
    assert count_tables_as_dict(counts) == reference_ngram_counts(sents, 4)


def test_count_stream_rejects_ids_outside_vocabulary():
    with pytest.raises(ValueError, match="outside"):
        count_stream(np.array([1, 3, 12, 2], np.int32), 2, 10)


@SETTINGS
@given(st.lists(corpora(), min_size=1, max_size=5), st.integers(1, 4))
def test_merge_equals_counting_the_concatenation(shards, order):
    merged = merge_counts([count_stream(_stream(s), order, 10) for s in shards])
    whole = [sent for shard in shards for sent in shard]
    assert count_tables_as_dict(merged) == reference_ngram_counts(whole, order)


@SETTINGS
@given(st.lists(corpora(5), min_size=1, max_size=4), st.lists(st.integers(1, 4), min_size=1, max_size=4))
def test_merge_with_min_counts_equals_pruning_afterwards(shards, mins):
    runs = [count_stream(_stream(s), 4, 6) for s in shards]
    pruned_in_merge = merge_counts(runs, min_counts=mins)
    pruned_after = merge_counts(runs).prune_min_counts(mins)
    assert count_tables_as_dict(pruned_in_merge) == count_tables_as_dict(pruned_after)


def _random_corpus(seed: int, sentences: int = 3000, vocab: int = 40):
    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab, rng.integers(1, 30)).tolist() for _ in range(sentences)]


@pytest.mark.parametrize("workers", [1, 2])
def test_spilled_runs_equal_in_memory_count(tmp_path, workers):
    sents = _random_corpus(0)
    chunks = [_stream(sents[i : i + 100]) for i in range(0, len(sents), 100)]  # 30 chunks
    in_memory = count_stream(np.concatenate(chunks), 4, 40)
    # a 1-byte budget spills every chunk; fan-in 3 makes spilled runs merge on disk too
    spilled = count_corpus(
        chunks, 4, 40, workers=workers, spill_dir=str(tmp_path), merge_fan_in=3, run_memory=1
    )
    assert count_tables_as_dict(spilled) == count_tables_as_dict(in_memory)
    assert (spilled.sentences, spilled.tokens) == (in_memory.sentences, in_memory.tokens)
    pruned = count_corpus(chunks, 4, 40, workers=workers, spill_dir=str(tmp_path),
                          merge_fan_in=3, run_memory=1, min_counts=[1, 1, 2, 4])
    expected = in_memory.prune_min_counts([1, 1, 2, 4])
    assert count_tables_as_dict(pruned) == count_tables_as_dict(expected)


def test_concurrent_counts_sharing_a_spill_dir(tmp_path):
    # Each count keeps its runs in its own folder inside spill_dir, removed at the end.
    corpora = [_random_corpus(seed) for seed in (3, 4, 5)]
    results = [None] * len(corpora)

    def count(i):
        chunks = [_stream(corpora[i][j : j + 100]) for j in range(0, len(corpora[i]), 100)]
        results[i] = count_corpus(chunks, 4, 40, spill_dir=str(tmp_path / "shared"),
                                  merge_fan_in=2, run_memory=1)

    threads = [threading.Thread(target=count, args=(i,)) for i in range(len(corpora))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for sents, got in zip(corpora, results):
        assert count_tables_as_dict(got) == count_tables_as_dict(count_stream(_stream(sents), 4, 40))
    assert os.listdir(tmp_path / "shared") == []


def test_spilled_run_round_trip(tmp_path):
    counts = count_stream(_stream(_random_corpus(2, 200)), 3, 40)
    counts.save(str(tmp_path / "run"))
    loaded = NGramCounts.load(str(tmp_path / "run"))
    assert count_tables_as_dict(loaded) == count_tables_as_dict(counts)
    assert (loaded.sentences, loaded.tokens, loaded.vocab_size) == (counts.sentences, counts.tokens, 40)


def test_build_memory_option_gives_the_same_counts(tmp_path):
    path = tmp_path / "ids.txt"
    path.write_text("\n".join(" ".join(map(str, s)) for s in _random_corpus(3)) + "\n")
    small, _ = count_ngrams([str(path)], 4, tokenized=True, chunk_tokens=2000, run_memory=1)
    large, _ = count_ngrams([str(path)], 4, tokenized=True)
    assert count_tables_as_dict(small) == count_tables_as_dict(large)


def _python_lines(words, ids, prob, backoff, show):
    lines = []
    for row, p, b, s in zip(ids.tolist(), prob.tolist(), backoff.tolist(), show.tolist()):
        text = "%.7g\t" % p + " ".join(words[i] for i in row)
        lines.append(text + ("\t%.7g" % b if s else "") + "\n")
    return "".join(lines)


def test_arpa_lines_print_like_python():
    rng = np.random.default_rng(4)
    words = ["<unk>", "<s>", "</s>", "x", "ä€", "word"]
    values = np.concatenate([
        -rng.exponential(3, 2000), rng.normal(0, 1e-5, 200), 10.0 ** rng.uniform(-40, 40, 200),
        [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-300, 5e-324, 0.1, 123456.75, -99.0],
    ])
    n = len(values)
    ids = rng.integers(0, len(words), (n, 3)).astype(np.int32)
    backoff = rng.permutation(values)
    show = rng.random(n) < 0.5
    blob = "".join(words).encode("utf-8")
    offsets = np.cumsum([0] + [len(w.encode("utf-8")) for w in words]).astype(np.int64)
    got = _core.format_arpa_lines(blob, offsets, ids, values, backoff, show.view(np.uint8))
    assert got.decode("utf-8") == _python_lines(words, ids, values, backoff, show)
    with pytest.raises(ValueError):
        _core.format_arpa_lines(blob, offsets, np.full((1, 3), 9, np.int32), values[:1], values[:1],
                                show[:1].view(np.uint8))


def test_cli_memory_option_writes_the_same_model(tmp_path):
    from latticekit.lm.cli import main

    path = tmp_path / "ids.txt"
    path.write_text("\n".join(" ".join(map(str, s)) for s in _random_corpus(6, 2000)) + "\n")
    common = ["build", "--order", "3", "--tokenized", "--min-count", "1,1,2", "--json", str(path)]
    assert main(common + ["--output", str(tmp_path / "a.arpa")]) == 0
    spill = tmp_path / "runs"
    assert main(common + ["--output", str(tmp_path / "b.arpa"), "--memory", "0",
                          "--chunk-tokens", "3000", "--spill-dir", str(spill)]) == 0
    assert (tmp_path / "a.arpa").read_bytes() == (tmp_path / "b.arpa").read_bytes()
    assert list(spill.iterdir()) == []  # spilled runs are removed once merged


@SETTINGS
@given(corpora(), st.integers(1, 4), st.integers(0, 2**32 - 1))
def test_lookup_finds_every_row_and_nothing_else(sents, order, seed):
    counts = count_stream(_stream(sents), order, 10)
    rng = np.random.default_rng(seed)
    for k in range(1, counts.order + 1):
        prefix = np.asarray(counts.prefix[k - 1])
        word = np.asarray(counts.word[k - 1])
        row_of = {(int(p), int(w)): r for r, (p, w) in enumerate(zip(prefix, word))}
        n_parents = counts.total(k - 1) if k > 1 else 1
        queries_p = np.concatenate([prefix, rng.integers(-2, n_parents + 2, 50)])
        queries_w = np.concatenate([word, rng.integers(-2, 13, 50)])
        got = counts.lookup(k, queries_p, queries_w)
        expected = [row_of.get((int(p) if k > 1 else 0, int(w)), -1) if k == 1 or p >= 0 else -1
                    for p, w in zip(queries_p, queries_w)]
        assert got.tolist() == expected


def test_spilled_runs_larger_than_a_read_block(tmp_path):
    # spilled tables of more than 2^16 rows: the merge reads runs and row maps in blocks
    sents = _random_corpus(7, sentences=24_000)
    chunks = [_stream(sents[i : i + 6000]) for i in range(0, len(sents), 6000)]
    whole = count_stream(np.concatenate(chunks), 4, 40)
    assert whole.total(4) > 3 * (1 << 16)
    spilled = count_corpus(chunks, 4, 40, spill_dir=str(tmp_path), merge_fan_in=2, run_memory=1,
                           min_counts=[1, 1, 1, 2])
    expected = whole.prune_min_counts([1, 1, 1, 2])
    for k in range(1, 5):
        assert np.array_equal(spilled.keys(k), expected.keys(k))
        assert np.array_equal(spilled.count[k - 1], expected.count[k - 1])
    assert os.listdir(tmp_path) == []


def test_gil_is_released_while_counting():
    rng = np.random.default_rng(8)
    sents = [rng.integers(3, 5000, 20).tolist() for _ in range(20_000)]
    assert_releases_gil_on(lambda stream: _core.count_stream(stream, 4, 5000, EOS), _stream(sents),
                           lambda stream: np.concatenate([stream, stream]),
                           lambda stream: len(stream) > 50_000_000)
