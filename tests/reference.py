"""Slow, obviously-correct references for the fast paths: ARPA back-off scoring straight
from the n-gram dictionary, p-best by enumerating every path, n-gram counting with a
dictionary of tuples, and the lattice input checks arc by arc."""

from __future__ import annotations

import collections
import itertools
import math
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from latticekit.errors import LatticeError, VocabularyError

LN10 = math.log(10.0)


class ReferenceLM:
    """An ARPA model as a dict ``ngram tuple -> (log10 prob, log10 backoff)``."""

    def __init__(self, ngrams: Dict[Tuple[str, ...], Tuple[float, float]], vocab: Optional[Sequence[str]] = None,
                 float32: bool = False):
        # float32: round every value to float32 first, as KenLM and latticekit store them
        # (sums stay float64); without it, values are the ARPA's decimals read as float64.
        if float32:
            ngrams = {g: (float(np.float32(p)), float(np.float32(b))) for g, (p, b) in ngrams.items()}
        self.ngrams = ngrams
        self.order = max(len(g) for g in ngrams)
        self.vocab = vocab

    @classmethod
    def from_arpa_text(cls, text: str, vocab=None) -> "ReferenceLM":
        ngrams = {}
        section = 0
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("ngram ") or line == "\\data\\":
                continue
            if line.startswith("\\") and line.endswith("-grams:"):
                section = int(line[1:].split("-")[0])
                continue
            if line == "\\end\\":
                break
            if section:
                parts = line.split()
                prob = float(parts[0])
                words = tuple(parts[1 : 1 + section])
                backoff = float(parts[1 + section]) if len(parts) > section + 1 else 0.0
                ngrams[words] = (prob, backoff)
        return cls(ngrams, vocab)

    def word(self, token: int) -> str:
        w = self.vocab[token] if self.vocab is not None and token < len(self.vocab) else (
            str(token) if self.vocab is None else "<unk>")
        return w if (w,) in self.ngrams else "<unk>"

    def log10_prob(self, history: Tuple[str, ...], w: str) -> float:
        """The ARPA back-off recursion, with history truncated to order - 1 words."""
        history = history[len(history) - min(len(history), self.order - 1):]
        total = 0.0
        while True:
            if history + (w,) in self.ngrams:
                return total + self.ngrams[history + (w,)][0]
            if not history:
                return total + (-100.0 if w == "<unk>" else self.ngrams[(w,)][0])
            total += self.ngrams.get(history, (0.0, 0.0))[1]
            history = history[1:]

    def token_log10probs(self, tokens, context=(), bos=False) -> List[float]:
        history = (("<s>",) if bos else ()) + tuple(self.word(t) for t in context)
        out = []
        for t in tokens:
            w = self.word(t)
            out.append(self.log10_prob(history, w))
            history = history + (w,)
        return out

    def score(self, tokens, context=(), bos=False) -> float:
        return sum(self.token_log10probs(tokens, context, bos)) * LN10


def brute_force_pbest(tokens, scores, widths, lm: ReferenceLM, p, alpha, context=(), bos=False):
    """Every path of the lattice, scored, sorted by (score desc, tokens asc); the first p
    (all of them when p is None)."""
    h = len(tokens)
    paths = []
    for arcs in itertools.product(*[range(int(widths[i])) for i in range(h)]):
        toks = tuple(int(tokens[i][a]) for i, a in enumerate(arcs))
        draft = sum(float(scores[i][a]) for i, a in enumerate(arcs))
        lm_score = lm.score(toks, context, bos)
        total = draft if alpha == 0 else draft + alpha * lm_score
        paths.append((total, toks, draft, lm_score))
    paths.sort(key=lambda x: (-x[0], x[1]))
    return paths if p is None else paths[:p]


def reference_ngram_counts(sentences, order: int, bos=1, eos=2) -> Dict[Tuple[int, ...], int]:
    """Every n-gram of orders 1..order of ``<s> sentence </s>``, counted in a dict.

    ``<s>`` is counted as a unigram and as a context, ``</s>`` as a word (OpenGrm's rules).
    """
    counts: Dict[Tuple[int, ...], int] = collections.Counter()
    for sentence in sentences:
        words = [bos] + [int(w) for w in sentence] + [eos]
        for i in range(len(words)):
            for k in range(1, order + 1):
                if i + k <= len(words):
                    counts[tuple(words[i : i + k])] += 1
    return dict(counts)


def count_tables_as_dict(counts) -> Dict[Tuple[int, ...], int]:
    """The n-grams of latticekit count tables as ``{word-id tuple: count}``; also checks that
    every table is sorted by (prefix, word) without duplicates."""
    out: Dict[Tuple[int, ...], int] = {}
    for k in range(1, counts.order + 1):
        keys = counts.keys(k)
        assert all(a < b for a, b in zip(keys[:-1].tolist(), keys[1:].tolist())), f"order {k} unsorted"
        for ids, c in zip(counts.ngram_ids(k).tolist(), list(counts.count[k - 1])):
            out[tuple(ids)] = int(c)
    return out


def slow_lattice_problem(tokens, scores, widths):
    """The obvious check, arc by arc: which error (if any) a lattice must raise."""
    used = [(b, i, j) for b in range(tokens.shape[0]) for i in range(tokens.shape[1])
            for j in range(int(widths[b, i]))]
    if any(tokens[u] < 0 for u in used):
        return VocabularyError
    with np.errstate(over="ignore"):  # scores are stored as float32: 1e39 becomes inf
        if any(not np.isfinite(np.float32(scores[u])) for u in used):
            return LatticeError
    for b in range(tokens.shape[0]):
        for i in range(tokens.shape[1]):
            row = tokens[b, i, : widths[b, i]].tolist()
            if len(set(row)) < len(row):
                return LatticeError
    return None
