"""Katz back-off estimation, identical to OpenGrm ``ngrammake --method=katz``.

The rules (OpenGrm NGram 1.3, default flags; see ``docs/building_models.md``):

* Discount for count ``r <= bins`` (5): ``d_r = (r*/r - R) / (1 - R)`` with
  ``r* = (r + 1) n_{r+1} / n_r`` and ``R = (bins + 1) n_{bins+1} / n_1``; a ``d_r`` outside
  ``(0, 1)`` and every count above ``bins`` get ``1 - 0.001``. ``n_r`` counts the n-grams of an
  order seen exactly ``r`` times (``</s>`` n-grams included, the ``<s>`` unigram excluded).
* Unigrams are relative frequencies over ``tokens + sentences`` (no back-off from them);
  ``<s>`` gets log10 -99.
* A seen n-gram ``h w`` gets ``d_{c(hw)} c(hw) / c(h)``; ``c(h)`` sums every n-gram with
  history ``h``, ``</s>`` included.
* Back-off weights are recomputed so every state normalises:
  ``alpha(h) = (1 - sum_w p(w|h)) / (1 - sum_w p(w|h'))`` over the words seen after ``h``.
  A state that already has every word of its back-off state gives the freed mass to ``</s>``
  and gets an "infinite" back-off cost (99 in -ln).

OpenGrm keeps every weight as a float32 ``-ln`` value; the same roundings are applied here
(``_f32``) so that printed log10 values agree to all 7 digits.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np

from latticekit.lm.counting import NGramCounts
from latticekit.lm.model import LN10, BackoffModel
from latticekit.ngram_trie import BOS, EOS

__all__ = [
    "NORM_EPS",
    "INF_BACKOFF",
    "count_of_counts",
    "katz_discounts",
    "format_discounts",
    "estimate_katz",
]

#: OpenGrm's ``kNormEps``: counts above the last bin are discounted by ``1 - NORM_EPS``.
NORM_EPS = 0.001
#: OpenGrm's "infinite" back-off cost (-ln) for states that cover their back-off state.
INF_BACKOFF = 99.0


def _round_f32(x: np.ndarray) -> np.ndarray:
    """Round to float32 and back, as OpenGrm stores every weight as a float32."""
    return np.asarray(x, dtype=np.float64).astype(np.float32).astype(np.float64)


def count_of_counts(counts: NGramCounts, bins: int = 5) -> np.ndarray:
    """``n_r`` per order: how many n-grams were seen exactly ``r`` times, ``r = 1..bins+1``.

    Args:
        counts: the count tables.
        bins: number of discount bins.

    Returns:
        float64 `[order, bins + 1]`; column ``r - 1`` holds ``n_r``.
    """
    out = np.zeros((counts.order, bins + 1))
    for k in range(1, counts.order + 1):
        c = np.asarray(counts.count[k - 1])
        if k == 1:
            c = c[np.asarray(counts.word[0]) != BOS]  # <s> is no unigram event
        c = c[(c >= 1) & (c <= bins + 1)]
        out[k - 1] = np.bincount(c - 1, minlength=bins + 1)[: bins + 1]
    return out


def katz_discounts(n_r: np.ndarray) -> np.ndarray:
    """Katz discount factors from count-of-counts, with OpenGrm's guards.

    Args:
        n_r: float64 `[order, bins + 1]` from :func:`count_of_counts`.

    Returns:
        float64 `[order, bins + 1]`: column ``b`` is the factor for count ``b + 1``; the last
        column (counts above ``bins``) is ``1 - NORM_EPS``.
    """
    orders, width = n_r.shape
    bins = width - 1
    out = np.zeros((orders, width))
    with np.errstate(divide="ignore", invalid="ignore"):
        for o in range(orders):
            n = n_r[o]
            # R = (bins + 1) n_{bins+1} / (k n_k) for the lowest non-empty k (n_1 normally).
            level, denom = 0, 1.0
            while level < bins and n[level] <= 0:
                level += 1
                denom += 1
            rnorm = np.float64(bins + 1) * n[bins] / (denom * n[level])
            for b in range(width):
                d = np.nan
                if b < bins:
                    rstar = np.float64(b + 2)
                    if n[b + 1] > 0:
                        rstar *= n[b + 1]
                    if n[b] > 0:
                        rstar /= n[b]
                    d = rstar / (b + 1) - rnorm
                    if 1.0 - rnorm > 0.0:
                        d /= 1.0 - rnorm
                if b == bins or d <= 0.0 or d >= 1.0:
                    d = 1.0 - NORM_EPS
                out[o, b] = d
    return out


def format_discounts(discounts: np.ndarray) -> str:
    """The discount table as ``ngrammake --v=1`` prints it (``katzN_discounts.txt``)."""
    orders, width = discounts.shape
    head = "/".join(f"{k}-grams" for k in range(1, orders + 1))
    lines = [f"Count bin   Katz discounts Counts ({head})"]
    for b in range(width):
        label = f"Count = {b + 1}" if b < width - 1 else f"Count > {b}"
        lines.append(label + "   " + "/".join("%g" % d for d in discounts[:, b]))
    return "\n".join(lines) + "\n"


def _bin_of(count: np.ndarray, bins: int) -> np.ndarray:
    return np.minimum(count, bins + 1) - 1


def estimate_katz(
    counts: NGramCounts,
    words: Sequence[str],
    bins: int = 5,
    discounts: Optional[np.ndarray] = None,
    float32_weights: bool = True,
) -> BackoffModel:
    """Estimate a Katz back-off model from count tables, exactly as OpenGrm does.

    Args:
        counts: the (possibly min-count pruned) count tables.
        words: the word table (``words[i]`` is the word of internal id ``i``).
        bins: number of discount bins (OpenGrm's default 5).
        discounts: discount table to use instead of computing it from ``counts``
            (`[order, bins + 1]`).
        float32_weights: round every weight to float32 as OpenGrm does (default; needed to
            reproduce its files digit for digit). The rounding leaves states normalised only
            to about 1e-6; with False the weights stay float64 and states normalise to ~1e-12.

    Returns:
        The back-off model, with the discount table in ``model.discounts``.

    Raises:
        ValueError: if the tables are empty.
    """
    if counts.order < 1 or counts.total(1) == 0:
        raise ValueError("cannot estimate a model from empty counts")
    _f32 = _round_f32 if float32_weights else np.asarray
    if discounts is None:
        discounts = katz_discounts(count_of_counts(counts, bins))
    N = counts.order
    model = BackoffModel(
        counts.vocab_size,
        [np.asarray(p) for p in counts.prefix],
        [np.asarray(w) for w in counts.word],
        list(words),
    )
    neglog_prob: List[np.ndarray] = []  # float32-rounded -ln p per order
    # Unigrams: relative frequencies, <s> excluded; OpenGrm scales float32 weights by -ln N.
    c1 = np.asarray(counts.count[0])
    w1 = np.asarray(counts.word[0])
    is_bos = w1 == BOS
    neglog_c = _f32(-np.log(c1.astype(np.float64)))
    # OpenGrm sums the float32 count weights of the state (-ln domain) to normalise.
    total = float(np.exp(-neglog_c[~is_bos]).sum())
    p1 = _f32(neglog_c + _f32(np.log(total)))
    p1[is_bos] = np.inf
    neglog_prob.append(p1)
    has_all = [np.zeros(counts.total(k), bool) for k in range(1, N + 1)]
    n_unigram_events = int((~is_bos).sum())
    suffix_prev: Optional[np.ndarray] = None  # suffix rows of order k - 1, order by order
    for k in range(2, N + 1):
        c = np.asarray(counts.count[k - 1])
        hist = np.asarray(counts.prefix[k - 1])
        neglog_c = _f32(-np.log(c.astype(np.float64)))
        # c(h): sum of the counts leaving the state, which OpenGrm puts on the back-off arc:
        # the exact </s> count plus the float32-rounded counts of the word arcs.
        is_eos = np.asarray(counts.word[k - 1]) == EOS
        mass = np.where(is_eos, c.astype(np.float64), np.exp(-neglog_c))
        state_total = np.bincount(hist, weights=mass, minlength=counts.total(k - 1))
        del mass
        with np.errstate(divide="ignore"):
            neglog_state = _f32(-np.log(state_total))
        d = discounts[k - 1][_bin_of(c, bins)]
        neglog_disc = neglog_c - np.log(d)
        del neglog_c, d
        p = neglog_disc - neglog_state[hist]
        # States that already hold every word of their back-off state ("has all n-grams"):
        # the undiscounted mass goes to </s>.
        n_children = np.bincount(hist, minlength=counts.total(k - 1))
        if k == 2:
            covers = (n_children == n_unigram_events) & ~np.isin(w1, [EOS])
        else:
            suffix_prev = counts.suffix_rows(k - 1, below=suffix_prev)
            n_children_bo = np.bincount(
                np.asarray(counts.prefix[k - 2]), minlength=counts.total(k - 2)
            )
            covers = has_all[k - 3][suffix_prev] & (n_children == n_children_bo[suffix_prev])
            covers &= n_children > 0
        has_all[k - 2] = covers
        if covers.any():
            state_rows = np.flatnonzero(covers)
            in_state = covers[hist]
            disc_mass = np.bincount(
                hist[in_state], weights=np.exp(-neglog_disc[in_state]), minlength=len(covers)
            )
            freed = state_total - disc_mass  # undiscounted count mass
            eos_rows = np.flatnonzero(in_state & (np.asarray(counts.word[k - 1]) == EOS))
            h = hist[eos_rows]
            new_disc = -np.log(np.exp(-neglog_disc[eos_rows]) + freed[h])
            p[eos_rows] = new_disc - neglog_state[h]
            del state_rows
        neglog_prob.append(_f32(p))
    # Back-off weights, recomputed so that every state normalises.
    log10_backoff: List[np.ndarray] = []
    lower: Optional[np.ndarray] = None
    for j in range(1, N):
        lower = counts.suffix_rows(j + 1, below=lower)
        child_hist, _, hi_neglog, lo_neglog = state_mass_sums(counts, neglog_prob, j, lower)
        is_state = np.bincount(child_hist, minlength=counts.total(j)) > 0
        alpha = _backoff_cost(hi_neglog, lo_neglog)
        del hi_neglog, lo_neglog
        alpha[has_all[j - 1]] = INF_BACKOFF
        alpha = _f32(alpha)
        bo = -alpha / LN10
        bo[~is_state] = np.nan
        # An n-gram that opens no state still has one in OpenGrm when it does not end in
        # </s> (count tables from min-count pruning): back-off cost 0 there.
        w = np.asarray(counts.word[j - 1])
        bo[(~is_state) & (w != EOS)] = -0.0
        log10_backoff.append(bo)
    del lower
    log10_backoff.append(np.full(counts.total(N), np.nan))  # the highest order opens no state
    for p in neglog_prob:  # in place: p / -LN10 is exactly -p / LN10
        np.divide(p, -LN10, out=p)
    model.log10_prob = neglog_prob
    model.log10_prob[0][is_bos] = -99.0
    model.log10_backoff = log10_backoff
    model.discounts = discounts  # type: ignore[attr-defined]
    return model


def _neglog_add(a: np.ndarray, b: np.ndarray, kahan: np.ndarray) -> np.ndarray:
    """One step of OpenGrm's ``NegLogSum(a, b, &kahan)`` (updates ``kahan`` in place)."""
    lo = np.minimum(a, b)
    hi = np.maximum(a, b)
    with np.errstate(invalid="ignore"):
        x = np.exp(lo - hi)
    small = x < NORM_EPS
    delta = np.where(small, -x + x**2 / 2 - x**3 / 3 + x**4 / 4, -np.log(x + 1.0))
    delta -= kahan
    val = lo + delta
    finite = np.isfinite(a) & np.isfinite(b)
    out = np.where(np.isinf(a), b, np.where(np.isinf(b), a, val))
    kahan[finite] = ((val - lo) - delta)[finite]
    return out


def state_mass_sums(trie, neglog, j: int, lower: Optional[np.ndarray] = None):
    """Per history state of order ``j``: the -ln summed probability of its own (j+1)-grams
    and of the same words one order lower.

    Args:
        trie: the n-gram trie (counts or model).
        neglog: ``neglog[k-1]`` (float64 `[n_k]`) -ln probability of each k-gram.
        j: the order of the history states, ``1 <= j < order``.
        lower: ``trie.suffix_rows(j + 1)`` when the caller has it.

    Returns:
        ``(hist, lower, hi, lo)``: each (j+1)-gram's history row, the row of its back-off
        (lower-order) n-gram, and the two sums (float64 `[n_j]`).
    """
    hist = np.asarray(trie.prefix[j])
    if lower is None:
        lower = trie.suffix_rows(j + 1)
    n_states = trie.total(j)
    hi = _state_neglog_sums(hist, neglog[j], n_states)
    lo = _state_neglog_sums(hist, neglog[j - 1][lower], n_states)
    return hist, lower, hi, lo


def _state_neglog_sums(state: np.ndarray, neglog: np.ndarray, n_states: int) -> np.ndarray:
    """-ln of the summed probabilities per state, summed in row order like OpenGrm.

    OpenGrm adds ``</s>`` first and then the arcs in label order with a Kahan-compensated
    log-domain sum; the rounding of that sum shows in back-off weights close to 0, so it is
    reproduced step by step, vectorised over the states (rows grouped by ``state``).

    Args:
        state: int64 state of each row, non-decreasing.
        neglog: float64 -ln p of each row.
        n_states: number of states.

    Returns:
        float64 `[n_states]` (inf for states without rows).
    """
    fanout = np.bincount(state, minlength=n_states)
    first = np.cumsum(fanout) - fanout
    # only states with rows are summed (after min counts most history states have none)
    with_rows = np.flatnonzero(fanout)
    by_fanout = with_rows[np.argsort(-fanout[with_rows], kind="stable")]
    del with_rows
    sorted_fanout = fanout[by_fanout]
    sorted_first = first[by_fanout]
    del fanout, first
    n_summed = len(by_fanout)
    kahan = np.zeros(n_summed)
    max_fanout = int(sorted_fanout[0]) if n_summed else 0
    # active states at step j are the first `n_active` in fan-out order
    n_active_at = np.searchsorted(-sorted_fanout, -np.arange(1, max_fanout + 1), side="right")
    del sorted_fanout
    sums = np.full(n_summed, np.inf)
    for j in range(max_fanout):
        m = int(n_active_at[j])
        values = neglog[sorted_first[:m] + j]
        sums[:m] = _neglog_add(sums[:m], values, kahan[:m])
    total = np.full(n_states, np.inf)
    total[by_fanout] = sums
    return total


def _backoff_cost(hi_neglog: np.ndarray, lo_neglog: np.ndarray) -> np.ndarray:
    """OpenGrm's back-off cost ``-ln((1 - hi) / (1 - lo))`` with its guards (-ln domain).

    Args:
        hi_neglog: -ln of the summed probabilities of the words seen at each state.
        lo_neglog: -ln of the summed probabilities of the same words at the back-off state.

    Returns:
        float64 back-off costs (-ln).
    """
    # NegLogDiff(0, x) = x - ln(e^x - 1) (OpenGrm's own formula: its rounding shows in tiny
    # weights); a sum above 99 in -ln counts as zero mass. Computed in place (the same ufuncs,
    # so the same values) to keep one temporary per state array.
    num = _neglog_one_minus(hi_neglog)
    num -= _neglog_one_minus(lo_neglog)
    return num


def _neglog_one_minus(neglog: np.ndarray) -> np.ndarray:
    """``-ln(1 - exp(-x))`` as OpenGrm computes it: ``x - ln(e^x - 1)`` with ``x`` floored at
    its effective zero, and 0 above 99 (no mass)."""
    x = np.maximum(neglog, NORM_EPS * 1e-6)
    out = np.empty_like(x)
    with np.errstate(over="ignore", invalid="ignore"):
        np.exp(x, out=out)
        out -= 1.0
        np.log(out, out=out)
        np.subtract(x, out, out=out)
    out[x > 99.0] = 0.0
    return out
