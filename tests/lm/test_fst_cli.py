"""OpenFst interop on the golden FSTs, the OpenFst p-best baseline, and the CLI."""

from __future__ import annotations

import gzip
import json
import os
import shutil

import numpy as np
import pytest

from latticekit.lm.arpa_io import read_arpa
from latticekit.lm.build import build_katz
from latticekit.lm.cli import main
from latticekit.lm.ppl import perplexity, perplexity_of_files

pywrapfst = pytest.importorskip("pywrapfst")

from latticekit.lm.fst import OpenFstRescorer, model_from_fst, model_to_fst  # noqa: E402

DATA = os.path.join(os.path.dirname(__file__), "data")


def _unzip(src, dst):
    with gzip.open(src, "rb") as f, open(dst, "wb") as g:
        shutil.copyfileobj(f, g)
    return str(dst)


@pytest.mark.parametrize("folder", ["words-small", "tokenids-small"])
def test_from_golden_fst_scores_like_arpa(folder, tmp_path):
    fst_path = _unzip(os.path.join(DATA, folder, "katz3.fst.gz"), tmp_path / "katz3.fst")
    from_fst = model_from_fst(fst_path)
    arpa = read_arpa(os.path.join(DATA, folder, "katz3.arpa.gz"))
    assert from_fst.counts == arpa.counts
    held = os.path.join(DATA, folder, "heldout.txt")
    a = perplexity_of_files(from_fst, [held])
    b = perplexity_of_files(arpa, [held])
    assert a.oovs == b.oovs and a.logprob10 == pytest.approx(b.logprob10, abs=1e-3)


def test_to_fst_is_opengrm_shaped(tmp_path):
    model = read_arpa(os.path.join(DATA, "words-small", "katz3.arpa.gz"))
    f = model_to_fst(model)
    golden = pywrapfst.Fst.read(_unzip(os.path.join(DATA, "words-small", "katz3.fst.gz"), tmp_path / "g.fst"))
    assert f.num_states() == golden.num_states()
    assert sum(f.num_arcs(s) for s in f.states()) == sum(golden.num_arcs(s) for s in golden.states())
    assert f.properties(pywrapfst.I_LABEL_SORTED, True) == pywrapfst.I_LABEL_SORTED
    # the start state backs off (label 0) to the unigram state, which is final (</s>)
    bo = [a for a in f.arcs(f.start()) if a.ilabel == 0]
    assert len(bo) == 1 and float(f.final(bo[0].nextstate)) < 10


def test_openfst_pbest_agrees_with_exact_scores():
    model = build_katz([os.path.join(DATA, "tokenids-small", "corpus.txt")], 3, workers=1)
    rescorer = OpenFstRescorer(model)
    rng = np.random.default_rng(0)
    vocab = np.array([int(w) for w in model.words[3:60]])
    tokens = rng.choice(vocab, size=(4, 3)).astype(np.int32)
    scores = np.log(rng.dirichlet(np.ones(3), size=4)).astype(np.float32)
    paths, totals = rescorer.pbest(tokens, scores, p=5, alpha=0.5)
    assert paths.shape == (5, 4)
    assert np.all(np.diff(totals) <= 1e-9)
    # brute force: the exact score of each returned path; OpenFst's is never below it
    for path, total in zip(paths, totals):
        draft = sum(scores[i, list(tokens[i]).index(t)] for i, t in enumerate(path))
        lm = perplexity(model, [[str(t) for t in path]])
        exact_lm = (lm.logprob10 - _eos_log10(model, path)) * np.log(10)
        assert total >= draft + 0.5 * exact_lm - 1e-4
    # without the unique step: the same best score, p routes best first, each of them one
    # of the unique p best or scoring no higher than the p-th of those
    plain, plain_totals = rescorer.pbest(tokens, scores, p=5, alpha=0.5, unique=False)
    assert plain.shape == (5, 4)
    assert np.all(np.diff(plain_totals) <= 1e-9)
    assert plain_totals[0] == pytest.approx(totals[0], abs=1e-4)
    unique_paths = {tuple(x) for x in paths.tolist()}
    for path, total in zip(plain.tolist(), plain_totals):
        assert tuple(path) in unique_paths or total <= totals[-1] + 1e-4


def _eos_log10(model, path):
    from latticekit.lm.trie import EOS

    ids = np.array([model.words.index(str(t)) for t in path] + [EOS])
    logp, _ = model.score_positions(ids, np.zeros(len(ids), np.int64))
    return logp[-1]


def test_cli_build_ppl_info_json(tmp_path, capsys):
    out = tmp_path / "m.arpa"
    corpus = os.path.join(DATA, "words-small", "corpus.txt")
    assert main(["build", "--order", "3", "--output", str(out), corpus, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["ngrams"] == [8127, 21546, 24762]
    with gzip.open(os.path.join(DATA, "words-small", "katz3.arpa.gz"), "rb") as f:
        assert out.read_bytes() == f.read()
    assert main(["ppl", "--json", str(out), os.path.join(DATA, "words-small", "heldout.txt")]) == 0
    assert json.loads(capsys.readouterr().out)["perplexity"] == pytest.approx(169.448, abs=1e-3)
    assert main(["info", "--json", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["order"] == 3
    pruned = tmp_path / "p.arpa"
    assert main(["prune", "--target-ngrams", "20000", "-o", str(pruned), str(out), "--json"]) == 0
    assert sum(json.loads(capsys.readouterr().out)["ngrams_after"]) - 1 <= 20000
    assert main(["build", "--order", "2", "--output", str(out), str(tmp_path / "missing.txt"), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["error"] == "FileNotFoundError"
