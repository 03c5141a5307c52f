"""``latticekit demo``: rescore draft lattices built from real held-out text.

Uses the small model that ships inside the package (a Katz trigram over whitespace-split
words of the CPython standard library, built by OpenGrm) and its held-out lines. At random
places of the held-out text it builds the lattice a blockwise head would propose: at each
of h positions the true next word plus k - 1 distinct words drawn from the model's unigram
distribution, scored by the log-softmax of N(0, 2) logits with +2 on the true word. It then
compares the heads' arg-max draft ("vanilla") with the p best n-gram rescored drafts.
"""

from __future__ import annotations

import json
import statistics
import time
from importlib import resources
from typing import List, Sequence

import numpy as np

from latticekit.bpd.analysis import accepted_length
from latticekit.lattice import SausageLattice
from latticekit.ngram import NGramLM
from latticekit.search import pbest

__all__ = ["run_demo", "embedded_model", "heldout_sentences", "realistic_lattice"]

MODEL_FILE = "stdlib-words-katz3.arpa.gz"
HELDOUT_FILE = "stdlib-words-heldout.txt"


def embedded_model() -> NGramLM:
    """The packaged demo model, with its own word list as vocabulary (token id = index)."""
    path = resources.files("latticekit") / "data" / MODEL_FILE
    with resources.as_file(path) as p:
        probe = NGramLM.from_arpa(p, vocab=[])
        return NGramLM.from_arpa(p, vocab=probe.words)


def heldout_sentences(min_words: int = 4) -> List[List[str]]:
    text = (resources.files("latticekit") / "data" / HELDOUT_FILE).read_text(encoding="utf-8")
    return [line.split() for line in text.splitlines() if len(line.split()) >= min_words]


def realistic_lattice(truth: Sequence[int], k: int, candidates: np.ndarray, probs: np.ndarray,
                      rng: np.random.Generator, true_bonus: float = 2.0, sigma: float = 2.0) -> SausageLattice:
    """The benchmark's lattice recipe: per position the true token and k - 1 distinct
    distractors drawn from ``candidates`` with probabilities ``probs`` (the unigram
    distribution), scored by the log-softmax of N(0, sigma) logits with +true_bonus on the
    truth. Arcs are sorted best first."""
    h = len(truth)
    tokens = np.zeros((h, k), dtype=np.int32)
    for i, t in enumerate(truth):
        row = [int(t)]
        while len(row) < k:
            for c in candidates[rng.choice(len(probs), size=2 * k, p=probs)]:
                if int(c) not in row and len(row) < k:
                    row.append(int(c))
        tokens[i] = row
    logits = rng.normal(0.0, sigma, size=(h, k))
    logits[:, 0] += true_bonus
    scores = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    perm = np.argsort(-scores, axis=1, kind="stable")
    return SausageLattice(np.take_along_axis(tokens, perm, 1), np.take_along_axis(scores, perm, 1).astype(np.float32))


def run_demo(lattices: int = 200, h: int = 8, k: int = 8, p: int = 4, alpha: float = 1.0,
             seed: int = 0, show: int = 3, as_json: bool = False) -> dict:
    """Runs the demo and prints a report; returns the figures as a dict."""
    lm = embedded_model()
    words = lm.words
    index = {w: i for i, w in enumerate(words)}
    _, log10p, _ = lm.ngrams(1)
    unigram = np.power(10.0, log10p.astype(np.float64))
    unigram[[0, 1, 2]] = 0.0  # never draw <unk>, <s>, </s> as distractors
    unigram /= unigram.sum()
    rng = np.random.default_rng(seed)
    sentences = heldout_sentences(min_words=h + 2)
    if not sentences:
        raise ValueError(f"no held-out line has {h + 2} words; use a smaller h")
    vanilla_acc, best_acc, oracle_acc, times = [], [], [], []
    examples = []
    for n in range(lattices):
        sent = [index.get(w, 0) for w in sentences[int(rng.integers(len(sentences)))]]
        sent = sent + [2]  # the line ends with </s>
        start = int(rng.integers(1, len(sent) - h + 1))
        truth = sent[start:start + h]
        context = sent[:start]
        lattice = realistic_lattice(truth, k, np.arange(len(unigram)), unigram, rng)
        t0 = time.perf_counter()
        paths = pbest(lattice, lm, p, alpha, context=context, bos=True)
        times.append(time.perf_counter() - t0)
        vanilla = lattice.tokens[:, 0].tolist()
        vanilla_acc.append(accepted_length(vanilla, truth))
        best_acc.append(accepted_length(paths[0].tokens, truth))
        oracle_acc.append(max(accepted_length(path.tokens, truth) for path in paths))
        if n < show:
            examples.append({
                "context": " ".join(words[t] for t in context[-8:]),
                "truth": " ".join(words[t] for t in truth),
                "vanilla": " ".join(words[t] for t in vanilla),
                "pbest": [{"draft": " ".join(words[t] for t in path.tokens), "score": round(path.score, 3),
                           "draft_score": round(path.draft_score, 3), "lm_score": round(path.lm_score, 3)}
                          for path in paths],
            })
    report = {
        "model": f"{MODEL_FILE} ({lm!r})",
        "lattices": lattices, "h": h, "k": k, "p": p, "alpha": alpha,
        "mean_accepted_vanilla": statistics.fmean(vanilla_acc),
        "mean_accepted_rescored_top1": statistics.fmean(best_acc),
        "mean_accepted_best_of_p": statistics.fmean(oracle_acc),
        "pbest_ms_median": statistics.median(times) * 1e3,
        "pbest_ms_p90": float(np.percentile(times, 90)) * 1e3,
        "examples": examples,
    }
    if as_json:
        print(json.dumps(report, indent=2))
        return report
    print(f"latticekit demo: {lattices} lattices of {h} positions x {k} arcs from held-out Python source")
    print(f"model: {report['model']}")
    for ex in examples:
        print(f"\n  context : ... {ex['context']}")
        print(f"  truth   : {ex['truth']}")
        print(f"  vanilla : {ex['vanilla']}")
        for r, path in enumerate(ex["pbest"], start=1):
            print(f"  best #{r} : {path['draft']}   (score {path['score']:.2f} = draft {path['draft_score']:.2f}"
                  f" + {alpha:g} x lm {path['lm_score']:.2f})")
    print(f"\nwords accepted per draft (longest prefix equal to the truth, mean over {lattices}):")
    print(f"  vanilla arg-max draft       {report['mean_accepted_vanilla']:.3f}")
    print(f"  n-gram rescored, best path  {report['mean_accepted_rescored_top1']:.3f}")
    print(f"  best of the {p} best paths    {report['mean_accepted_best_of_p']:.3f}")
    print(f"p-best search time: median {report['pbest_ms_median']:.3f} ms, p90 {report['pbest_ms_p90']:.3f} ms")
    return report
