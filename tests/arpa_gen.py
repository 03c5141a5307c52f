"""ARPA models for tests: a small fixed one, and hypothesis strategies for random ones."""

from __future__ import annotations

from typing import Dict, Tuple

from hypothesis import strategies as st


# A valid two-order model over the words 7 and 8, for tests that damage one line of it.
SMALL_ARPA = """\\data\\
ngram 1=4
ngram 2=2

\\1-grams:
-99\t<s>\t-0.5
-1.0\t</s>
-0.5\t7\t-0.2
-0.9\t8\t0.1

\\2-grams:
-0.3\t<s> 7
-0.2\t7 8

\\end\\
"""


@st.composite
def arpa_models(draw, max_order=5, max_vocab=6, suffix_closed=False):
    """A random, prefix-closed ARPA model over decimal token ids: any order 1..max_order,
    missing n-grams, positive and negative back-off weights, <unk> present or absent.
    With suffix_closed, every suffix of an n-gram is in the model too (as estimators
    produce; KenLM's probing tables need it)."""
    order = draw(st.integers(1, max_order))
    vocab_size = draw(st.integers(1, max_vocab))
    words = [str(i) for i in range(vocab_size)]
    with_unk = draw(st.booleans())
    logprob = st.floats(-5.0, -0.01, allow_nan=False).map(lambda x: round(x, 4))
    backoff = st.floats(-2.0, 2.0, allow_nan=False).map(lambda x: round(x, 4))
    ngrams: Dict[Tuple[str, ...], Tuple[float, float]] = {}
    unigrams = ["<s>", "</s>"] + words + (["<unk>"] if with_unk else [])
    for w in unigrams:
        ngrams[(w,)] = (-99.0 if w == "<s>" else draw(logprob), draw(backoff) if order > 1 else 0.0)
    previous = [(w,) for w in unigrams if w != "</s>"]
    for n in range(2, order + 1):
        current = []
        for prefix in previous:
            if n > 2 and prefix[-1] == "</s>":
                continue
            for w in words + ["</s>"]:
                if draw(st.integers(0, 99)) < 45:
                    g = prefix + (w,)
                    ngrams[g] = (draw(logprob), draw(backoff) if n < order else 0.0)
                    if w != "</s>":
                        current.append(g)
        previous = current
        if not previous:
            break
    if suffix_closed:
        for g in sorted(ngrams, key=len, reverse=True):
            for start in range(1, len(g)):
                suffix = g[start:]
                if suffix not in ngrams:
                    top = len(suffix) == order
                    ngrams[suffix] = (draw(logprob), 0.0 if top else draw(backoff))
    return ngrams, vocab_size


def to_arpa(ngrams) -> str:
    order = max(len(g) for g in ngrams)
    lines = ["\\data\\"]
    for n in range(1, order + 1):
        lines.append(f"ngram {n}={sum(1 for g in ngrams if len(g) == n)}")
    for n in range(1, order + 1):
        lines += ["", f"\\{n}-grams:"]
        for g, (p, b) in ngrams.items():
            if len(g) == n:
                lines.append(f"{p}\t{' '.join(g)}" + (f"\t{b}" if n < order else ""))
    lines += ["", "\\end\\", ""]
    return "\n".join(lines)
