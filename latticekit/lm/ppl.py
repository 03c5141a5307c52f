"""Held-out perplexity with OpenGrm's ``ngramperplexity`` convention.

Every sentence is scored from ``<s>`` and ends with ``</s>`` (scored). A word the model does
not know (OOV) is skipped and the history restarts at the unigram state after it, without
``<s>``. ``perplexity = 10 ** (-logprob10 / (words - oovs + sentences))``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, List, Sequence

import numpy as np

from latticekit.lm.model import BackoffModel
from latticekit.ngram_trie import EOS, UNK

__all__ = ["PerplexityResult", "perplexity", "perplexity_of_files"]


@dataclass(frozen=True)
class PerplexityResult:
    """Perplexity summary, the numbers ``ngramperplexity`` prints.

    Attributes:
        sentences: sentences scored.
        words: words read (OOVs included, ``</s>`` excluded).
        oovs: words skipped because the model does not know them.
        logprob10: total log10 probability (``</s>`` included).
        perplexity: ``10 ** (-logprob10 / (words - oovs + sentences))``.
    """

    sentences: int
    words: int
    oovs: int
    logprob10: float
    perplexity: float

    def report(self) -> str:
        """The summary in ``ngramperplexity``'s words."""
        return (
            f"{self.sentences} sentences, {self.words} words, {self.oovs} OOVs\n"
            f"logprob(base 10)= {self.logprob10:.6g};  perplexity = {self.perplexity:.6g}\n"
        )

    def as_dict(self) -> dict:
        """The fields as a JSON-ready dict."""
        return {
            "sentences": self.sentences,
            "words": self.words,
            "oovs": self.oovs,
            "logprob10": self.logprob10,
            "perplexity": self.perplexity,
        }


def perplexity(model: BackoffModel, sentences: Iterable[Sequence[str]]) -> PerplexityResult:
    """Held-out perplexity of word sequences (OpenGrm's convention).

    Args:
        model: the back-off model.
        sentences: each a sequence of words (strings of the model's word table; token ids as
            decimal strings).

    Returns:
        The summary; per-word scores are computed in one vectorised pass.
    """
    index = {w: i for i, w in enumerate(model.words)}
    ids: List[int] = []
    lengths: List[int] = []
    for s in sentences:
        ids.extend(index.get(w, -1) for w in s)
        lengths.append(len(s))
    return perplexity_of_ids(model, np.asarray(ids, np.int64), np.asarray(lengths, np.int64))


def perplexity_of_ids(model: BackoffModel, ids: np.ndarray, lengths: np.ndarray) -> PerplexityResult:
    """Held-out perplexity of sentences given as internal word ids (-1 or ``<unk>``: OOV).

    Args:
        model: the back-off model.
        ids: int64 word ids of all sentences back to back.
        lengths: int64 words per sentence.

    Returns:
        The summary.
    """
    ids = np.asarray(ids, np.int64)
    lengths = np.asarray(lengths, np.int64)
    n_sent = len(lengths)
    total = len(ids) + n_sent
    stream = np.empty(total, np.int64)
    ends = np.cumsum(lengths + 1) - 1  # position of each </s>
    sent_start = ends - lengths
    is_eos = np.zeros(total, bool)
    is_eos[ends] = True
    stream[is_eos] = EOS
    stream[~is_eos] = np.where(ids == UNK, -1, ids)
    starts = np.repeat(sent_start, lengths + 1)
    logp, matched = model.score_positions(stream, starts)
    oov = np.isnan(logp) & ~is_eos
    scored = ~np.isnan(logp)
    logprob = float(logp[scored].sum())
    words = int(len(ids))
    oovs = int(oov.sum())
    denom = words - oovs + n_sent
    with np.errstate(over="ignore"):
        ppl = float(np.power(10.0, -logprob / denom)) if denom > 0 else float("nan")
    return PerplexityResult(n_sent, words, oovs, logprob, ppl)


def perplexity_of_files(model: BackoffModel, paths: Sequence[str]) -> PerplexityResult:
    """Held-out perplexity of text files: one sentence per line, words split on whitespace.

    Empty lines are skipped. Token-id files work the same way when the model's words are
    decimal token ids.

    Raises:
        CorpusError: for text that is not UTF-8.
    """
    from latticekit.lm.corpus import _decode, _read_lines

    sentences: List[List[str]] = []
    for path in paths:
        line_no = 1
        for raw in _read_lines(path, 100_000):
            for line in _decode(raw, path, line_no):
                words = line.split()
                if words:
                    sentences.append(words)
            line_no += len(raw)
    return perplexity(model, sentences)
