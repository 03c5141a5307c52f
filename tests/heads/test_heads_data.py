"""The data half of the heads recipe (:mod:`latticekit.heads.data`, run by ``benchmarks/heads_data.py``): which tokens of which files
become training and held-out sequences (``--file-passes`` reads deeper windows of the same
training files, never held-out ones), where each pass's shards are cached, and how the caching
order shares a domain's budget between the passes."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest


from latticekit.heads import data as heads_data  # noqa: E402
from latticekit.heads.corpora import Source, is_heldout, split_hash  # noqa: E402
from latticekit.heads.data import Shard, corpus_sequences, in_turn, interleave  # noqa: E402

EOS = 0
M = 40  # --max-file-tokens
SEQ = 8  # --seq-len


class CharTokenizer:
    """One token per character (its code point), EOS 0: a file's tokens are its text."""

    eos_token_id = EOS

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) for c in text]}


@pytest.fixture
def corpus(tmp_path, monkeypatch):
    """A source of 60 files of lengths 0..179 characters; character j of file i is chr(256 + 200 i + j),
    so every token says which file and position it came from."""
    texts = {}
    for i in range(60):
        rel = f"pkg/m{i:02d}.py"
        text = "".join(chr(256 + 200 * i + j) for j in range((i * 37) % 180))
        (tmp_path / "pkg").mkdir(exist_ok=True)
        (tmp_path / rel).write_text(text)
        texts[rel] = text
    source = Source("fake", tmp_path, "*.py", "fake/", "nothing to install")
    monkeypatch.setitem(heads_data.SOURCES, "fake", source)
    monkeypatch.setitem(heads_data.DOMAINS, "code", ("fake",))
    return source, texts


def args(**kw) -> argparse.Namespace:
    return argparse.Namespace(max_file_tokens=M, seq_len=SEQ, **kw)


def expected(source: Source, texts: dict[str, str], split: str, file_pass: int, budget: int) -> list[int]:
    """The plain rule: training (or held-out) files in hash order, each one's window ``file_pass``
    of M tokens when it holds 16 or more, followed by EOS, until the budget; whole rows only."""
    ids: list[int] = []
    for rel in sorted(texts, key=lambda r: (split_hash(source.key(r)), source.key(r))):
        if is_heldout(source.key(rel)) != (split == "heldout") or len(ids) >= budget:
            continue
        window = [ord(c) for c in texts[rel][file_pass * M:(file_pass + 1) * M]]
        if len(window) >= 16:
            ids += window + [EOS]
    ids = ids[: min(len(ids), budget) // SEQ * SEQ]
    return ids


@pytest.mark.parametrize("split", ["train", "heldout"])
@pytest.mark.parametrize("file_pass", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("budget", [10**6, 200, 17])
def test_each_pass_reads_one_window_of_every_file(corpus, split, file_pass, budget):
    source, texts = corpus
    seqs, used = corpus_sequences("code", split, budget, CharTokenizer(), args(), file_pass, {})
    assert seqs.dtype == np.int32 and seqs.shape[1] == SEQ
    assert seqs.reshape(-1).tolist() == expected(source, texts, split, file_pass, budget)
    assert all(is_heldout(source.key(rel)) == (split == "heldout") for _, rel in used)
    assert all(len(texts[rel][file_pass * M:(file_pass + 1) * M]) >= 16 for _, rel in used)


def test_later_passes_read_deeper_tokens_of_the_same_training_files(corpus):
    source, texts = corpus
    memo: dict = {}
    _, first = corpus_sequences("code", "train", 10**6, CharTokenizer(), args(), 0, memo)
    seqs, deeper = corpus_sequences("code", "train", 10**6, CharTokenizer(), args(), 1, memo)
    assert deeper and set(deeper) <= set(first)
    # every training file tokenised once (the first pass), kept for the next
    assert set(memo) == {("fake", rel) for rel in texts if not is_heldout(source.key(rel))}
    positions = [(t - 256) % 200 for t in seqs.reshape(-1) if t != EOS]
    assert positions and min(positions) == M and max(positions) < 2 * M  # window 1 of each file, nothing else


def test_shard_paths_keep_pass_zero_names():
    seqs = np.zeros((2, SEQ), dtype=np.int32)
    assert Shard("train", "code", 7, sequences=seqs).path == Path("train/code/00007.npz")
    assert Shard("train", "code", 7, sequences=seqs, file_pass=2).path == Path("train/code/p2-00007.npz")


def test_in_turn_takes_the_passes_in_turn():
    seqs = np.zeros((1, SEQ), dtype=np.int32)
    passes = [[Shard("train", "code", i, sequences=seqs, file_pass=p) for i in range(n)]
              for p, n in enumerate((4, 2, 3))]
    assert [(s.file_pass, s.index) for s in in_turn(passes)] == \
        [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1), (0, 2), (2, 2), (0, 3)]
    assert in_turn([]) == [] and in_turn([[]]) == []


def test_interleave_stops_each_domain_at_its_budget_whatever_the_passes():
    seqs = np.zeros((1, 10), dtype=np.int32)
    train = {"code": [Shard("train", "code", i, sequences=seqs, file_pass=p) for i in range(5) for p in range(3)],
             "english": [Shard("train", "english", i, sequences=seqs) for i in range(3)]}
    spent = {d: {"tokens": 0, "cpu_s": 0.0} for d in train}
    order = []
    for shard in interleave(train, spent, 45, {"code": 1.0, "english": 1.0}):
        order.append((shard.domain, shard.file_pass))
        spent[shard.domain]["tokens"] += 10
        spent[shard.domain]["cpu_s"] += 1.0
    assert spent["code"]["tokens"] == 50 and spent["english"]["tokens"] == 30  # 45 -> 5 shards; 3 shards is all
    assert [p for d, p in order if d == "code"] == [0, 1, 2, 0, 1]  # the queue's order: the passes in turn
