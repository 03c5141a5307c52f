"""Relative-entropy (Stolcke) pruning, as OpenGrm ``ngramshrink --method=relative_entropy``.

For every n-gram ``h w`` of order >= 2 (``</s>`` included) the score is the weighted
relative entropy between the model with and without it (Stolcke 1998, OpenGrm's form):

``D = -p(h) * [ p(w|h) (ln p'(w|h) - ln p(w|h)) + (1 - sum_hi) (ln alpha'(h) - ln alpha(h)) ]``

where ``p(h)`` is the product of the ascending n-gram probabilities of ``h``,
``p'(w|h) = alpha'(h) p(w|h')`` and ``alpha'`` the back-off weight after removing ``h w``
alone. Like OpenGrm 1.3.11 (checked on the golden files: same kept set, same values), n-grams
still needed as a history state or as the back-off of a kept
higher-order n-gram are never pruned, the n-gram probabilities that stay are unchanged, and
the back-off weights are recomputed afterwards so every state normalises. An n-gram is pruned
when its score is below ``ln(1 + theta)``.
"""

from __future__ import annotations

from typing import List, Optional

import numpy as np

from latticekit.lm.katz import INF_BACKOFF, _backoff_cost, _round_f32, state_mass_sums
from latticekit.lm.model import LN10, BackoffModel
from latticekit.ngram_trie import BOS, EOS

__all__ = ["relative_entropy_scores", "prune_relative_entropy", "theta_for_target"]


def _neglog(model: BackoffModel, k: int) -> np.ndarray:
    return -np.asarray(model.log10_prob[k - 1], np.float64) * LN10


def relative_entropy_scores(model: BackoffModel) -> List[np.ndarray]:
    """OpenGrm's shrink score of every n-gram (each scored as if pruned alone).

    Args:
        model: a normalised back-off model.

    Returns:
        ``scores[k-1]`` (float64 `[n_k]`) for orders ``k >= 2``; ``scores[0]`` is all zeros
        (unigrams are never pruned).
    """
    N = model.order
    neglog = [_neglog(model, k) for k in range(1, N + 1)]
    # p(h): product of the ascending probabilities; p(<s>) = p(</s>) as in OpenGrm.
    w1 = np.asarray(model.word[0])
    log_state = [-neglog[0]]
    eos_row = np.flatnonzero(w1 == EOS)
    log_state[0][w1 == BOS] = -neglog[0][eos_row[0]] if len(eos_row) else 0.0
    for k in range(2, N + 1):
        prefix = np.asarray(model.prefix[k - 1])
        log_state.append(log_state[k - 2][prefix] - neglog[k - 1])
    own: List[np.ndarray] = [np.zeros(model.total(1))]
    for k in range(2, N + 1):
        hist, lower, hi, lo = state_mass_sums(model, neglog, k - 1)
        lp = -neglog[k - 1]
        lbp = -neglog[k - 2][lower]
        num, den = _backoff_factors(hi, lo)
        num_h, den_h = num[hist], den[hist]
        # new back-off if this n-gram alone is removed: ln((1-sum_hi+p) / (1-sum_lo+p_lo))
        new_log_bo = np.logaddexp(-num_h, lp) - np.logaddexp(-den_h, lbp)
        score = (lbp + new_log_bo - lp) * np.exp(lp)
        score += (new_log_bo + (num_h - den_h)) * np.exp(-num_h)
        score *= -np.exp(log_state[k - 2][hist])
        score[~np.isfinite(lp) | ~np.isfinite(log_state[k - 2][hist])] = np.inf
        own.append(score)
    return own


def _backoff_factors(hi_neglog: np.ndarray, lo_neglog: np.ndarray) -> "tuple[np.ndarray, np.ndarray]":
    """OpenGrm's ``CalculateBackoffFactors``: -ln(1 - sum_hi), -ln(1 - sum_lo)."""
    eff = 1e-9
    hi_neglog = np.maximum(hi_neglog, eff)
    lo_neglog = np.maximum(lo_neglog, eff)
    with np.errstate(over="ignore", invalid="ignore"):
        num = np.where(hi_neglog > 99.0, 0.0, hi_neglog - np.log(np.exp(hi_neglog) - 1.0))
        den = np.where(lo_neglog > 99.0, 0.0, lo_neglog - np.log(np.exp(lo_neglog) - 1.0))
    return num, den


def theta_for_target(model: BackoffModel, target_ngrams: int, scores: Optional[List[np.ndarray]] = None) -> float:
    """The pruning threshold (log domain) that leaves at most ``target_ngrams`` n-grams.

    As OpenGrm's ``ThetaForMaxNGrams``: unigrams (``<s>`` excluded) always stay; the
    threshold sits midway between the last score kept and the first pruned.

    Args:
        model: the model to prune.
        target_ngrams: the most n-grams to keep (``<s>`` not counted).
        scores: precomputed :func:`relative_entropy_scores`.

    Returns:
        The log-domain threshold ``ln(1 + theta)``.
    """
    if scores is None:
        scores = relative_entropy_scores(model)
    flat = np.sort(np.concatenate([scores[k] for k in range(1, model.order)] or [np.zeros(0)]))
    if len(flat) == 0:
        return 0.0
    n_unigrams = int(np.count_nonzero(np.asarray(model.word[0]) != BOS))
    target = max(target_ngrams - n_unigrams, 0)
    index = len(flat) - target - 1
    if index < 0:
        return float(flat[0] - 1.0)
    theta = flat[index]
    nxt = np.searchsorted(flat, theta, side="right")
    if nxt >= len(flat):
        return float(theta + 1.0)
    return float((theta + flat[nxt]) / 2.0)


def prune_relative_entropy(
    model: BackoffModel, theta: Optional[float] = None, target_ngrams: Optional[int] = None
) -> BackoffModel:
    """Prune a back-off model by relative entropy, like OpenGrm ``ngramshrink``.

    Args:
        model: a normalised back-off model (e.g. from :func:`estimate_katz`).
        theta: prune n-grams whose score is below ``ln(1 + theta)`` (OpenGrm's ``--theta``).
        target_ngrams: instead, keep at most this many n-grams (OpenGrm's
            ``--target_number_of_ngrams``; ``<s>`` not counted). OpenGrm's threshold is tried
            first; where the n-grams that must stay make it overshoot, the threshold is raised
            to the lowest score level that fits (unigrams are never pruned, so a target below
            their number keeps only the unigrams).

    Returns:
        The pruned model (a new object); kept probabilities are unchanged, back-off weights
        recomputed.

    Raises:
        ValueError: unless exactly one of ``theta`` and ``target_ngrams`` is given, or if
            ``theta`` < 0.
    """
    if (theta is None) == (target_ngrams is None):
        raise ValueError("give exactly one of theta and target_ngrams")
    scores = relative_entropy_scores(model)
    if theta is not None:
        if theta < 0:
            raise ValueError(f"theta must be >= 0, got {theta}")
        log_theta = float(np.log1p(theta))
    else:
        if target_ngrams is None or target_ngrams < 0:
            raise ValueError(f"target_ngrams must be >= 0, got {target_ngrams}")
        log_theta = theta_for_target(model, target_ngrams, scores)
    keep = _keep_masks(model, scores, log_theta)
    if target_ngrams is not None and _n_kept(model, keep) > target_ngrams:
        # OpenGrm's threshold ignores n-grams that must stay (histories, back-offs of kept
        # n-grams), so it can overshoot: raise it to the smallest score level that fits.
        levels = np.unique(np.concatenate([scores[k] for k in range(1, model.order)]))
        levels = levels[levels > log_theta]
        lo, hi = 0, len(levels) - 1
        best = None
        while lo <= hi:
            mid = (lo + hi) // 2
            trial = _keep_masks(model, scores, float(np.nextafter(levels[mid], np.inf)))
            if _n_kept(model, trial) <= target_ngrams:
                best, hi = trial, mid - 1
            else:
                lo = mid + 1
        keep = best if best is not None else _keep_masks(model, scores, np.inf)
    out = model.copy()
    masks = out.select(keep)
    out.log10_prob = [np.asarray(p)[m] for p, m in zip(model.log10_prob, masks)]
    out.log10_backoff = [np.asarray(b)[m] for b, m in zip(model.log10_backoff, masks)]
    recompute_backoffs(out)
    if hasattr(model, "discounts"):
        out.discounts = model.discounts  # type: ignore[attr-defined]
    return out


def _n_kept(model: BackoffModel, keep: List[np.ndarray]) -> int:
    """N-grams kept, ``<s>`` not counted (OpenGrm's count)."""
    return int(sum(int(m.sum()) for m in keep)) - int(np.count_nonzero(np.asarray(model.word[0]) == BOS))


def _keep_masks(model: BackoffModel, scores: List[np.ndarray], log_theta: float) -> List[np.ndarray]:
    """Which n-grams stay at threshold ``log_theta``, deciding from the highest order down."""
    N = model.order
    keep = [np.ones(model.total(k), bool) for k in range(1, N + 1)]
    alive_state = [np.zeros(model.total(k), bool) for k in range(1, N + 1)]
    for k in range(N, 1, -1):
        needed = np.zeros(model.total(k), bool)
        if k < N:
            # a history state with kept n-grams, or the back-off of a kept n-gram
            needed |= alive_state[k - 1]
            needed[model.suffix_rows(k + 1)[keep[k]]] = True
        keep[k - 1] = needed | (scores[k - 1] >= log_theta)
        alive_state[k - 2] |= np.bincount(
            np.asarray(model.prefix[k - 1])[keep[k - 1]], minlength=model.total(k - 1)
        ) > 0
    return keep


def recompute_backoffs(model: BackoffModel) -> None:
    """Recompute every back-off weight so each state normalises (in place).

    N-grams that open no state (no n-gram extends them) get NaN, as OpenGrm prints no back-off
    for them; ``</s>`` n-grams never open one.
    """
    N = model.order
    neglog = [_neglog(model, k) for k in range(1, N + 1)]
    unigram_events = int(np.count_nonzero(np.asarray(model.word[0]) != BOS))
    for j in range(1, N):
        hist, _, hi, lo = state_mass_sums(model, neglog, j)
        fanout = np.bincount(hist, minlength=model.total(j))
        alpha = _backoff_cost(hi, lo)
        alpha[fanout == unigram_events] = INF_BACKOFF
        bo = -_round_f32(alpha) / LN10
        bo[fanout == 0] = np.nan
        bo[np.asarray(model.word[j - 1]) == EOS] = np.nan
        model.log10_backoff[j - 1] = bo
    model.log10_backoff[N - 1] = np.full(model.total(N), np.nan)
