"""Drafting for engines that verify one chain per request, a whole batch at a time.

vLLM's speculative decoding verifies, per request, one chain of draft tokens in the batch's
forward pass. Two things decide what a chain should be:

1. **Per request** (:class:`ChainDrafter`): the most probable continuations of the request's
   own text (prompt and output) under the n-gram cache model, interpolated with a Katz model
   when one is given (:class:`~latticekit.drafting.cache_model.CacheModel`,
   :func:`~latticekit.drafting.continuations.best_continuations`), in one tree with those of
   earlier answers where a memory is given (:class:`~latticekit.drafting.memory.AnswerMemory`,
   :func:`~latticekit.drafting.memory.united_with_memory`), each node's acceptance
   probability from the acceptance estimates (:class:`~latticekit.drafting.calibration.AcceptanceModel`,
   or one per candidate source, :class:`~latticekit.drafting.calibration.SourceAcceptance`,
   learnt online from every request's outcomes); the chain follows the most probable child
   down the candidate tree, with each position's probability of being accepted.
2. **Per batch** (:func:`allocate`; at several prices at once, :func:`allocate_prices`): a draft
   token is one more token in the batch's forward pass, attending its request's context. With
   the engine's step seconds ``a + b * tokens + c * keys`` (:class:`BatchCosts`, fitted online
   from the steps the engine really took; :class:`CostFit`), a request's draft token costs
   ``b + c * its context``, and the lengths maximise the batch's expected tokens per second:
   positions are added by their probability over their price, highest first, while one more
   token's probability exceeds its price times the tokens per second already expected. At one
   request a draft token costs little against the whole pass; at high concurrency the pass is
   dominated by its tokens and only near-certain drafts pay, or none; where ``c`` > 0, a long
   request's drafts are cut before a short one's (the vLLM proposer fits ``c`` only with its
   ``context_costs`` setting).

Python, numpy and the C++ core (a tree's estimates and chain: :func:`~latticekit.drafting.calibration.tree_chain`):
nothing here imports torch or an engine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import nullcontext
from typing import NamedTuple, Optional, Union, cast

import numpy as np

from latticekit import _core
from latticekit.drafting.cache_model import CacheModel
from latticekit.drafting.calibration import (SOURCES, AcceptanceModel, CandidateTree, PendingLabels, SourceAcceptance,
                                             estimate_weights, tree_chain)
from latticekit.drafting.continuations import Continuations, best_continuations
from latticekit.drafting.memory import AnswerMemory, memory_continuations, united_with_memory
from latticekit.drafting.union import united_candidates
from latticekit.errors import DecoderConfigError
from latticekit.lattice import SausageLattice
from latticekit.ngram import NGramLM

__all__ = ["ChainDrafter", "BatchCosts", "CostFit", "StepCurve", "allocate", "allocate_curve", "allocate_prices",
           "curve_seconds"]


class ChainDrafter:
    """One request's drafting state: its n-gram cache model and the candidates waiting for
    their labels.

    Args:
        lm: the static Katz model over token ids, or None (the request's own text alone).
        vocab_size: the target's vocabulary (the cache model's fallback without ``lm``).
        acceptance: the acceptance estimates it reads and teaches (shared by an engine's
            requests): one model for every node, or one per candidate source
            (:class:`~latticekit.drafting.calibration.SourceAcceptance`: the text's, the memory's,
            the heads'), each calibrated on the nodes its source proposed. An earlier answer's
            continuation that the request's own text does not back is accepted far less often
            than the memory's counts say, and a model shared with the text's nodes learns an
            average that suits neither (``benchmarks/acceptance_features.py``).
        candidates: nodes of the candidate tree searched per step.
        max_depth: the longest chain.
        start: the text starts here in the ids handed over (a long prompt's head is left out:
            the cache model reads ``ids[start:]``).
        memory: earlier answers it drafts from too (its candidates searched as the text's),
            shared with other requests; None: the request's own text alone.
        prompt_length: the prompt's tokens in the ids handed over: the answer :meth:`remember`
            adds to the memory starts there.
    """

    def __init__(self, lm: Optional[NGramLM], vocab_size: int, acceptance: Union[AcceptanceModel, SourceAcceptance],
                 candidates: int = 32, max_depth: int = 12, start: int = 0,
                 memory: Optional[AnswerMemory] = None, prompt_length: int = 0) -> None:
        if candidates < 1 or max_depth < 1 or start < 0 or prompt_length < 0:
            raise DecoderConfigError(f"candidates, max_depth must be >= 1 and start, prompt_length >= 0, got "
                                     f"{candidates}, {max_depth}, {start}, {prompt_length}")
        self.model = CacheModel(lm, vocab_size)
        self.acceptance = acceptance
        self.candidates, self.max_depth, self.start = candidates, max_depth, start
        self.memory, self.prompt_length = memory, prompt_length
        self.pending = PendingLabels()

    @property
    def length(self) -> int:
        """Tokens of the request's text the cache model holds (from ``start``)."""
        return len(self.model.ids)

    def observe(self, ids: Sequence[int]) -> None:
        """Brings the cache model up to ``ids`` and labels every candidate the text now decides."""
        self.model.sync(ids, self.start)
        features, labels = self.pending.resolve(self.model.ids)
        if isinstance(self.acceptance, SourceAcceptance):  # the features' last column: the node's sources
            if len(labels):
                self.acceptance.update(features[:, :-1], labels, features[:, -1].astype(np.int64))
        else:
            self.acceptance.update(features, labels)

    def propose(self, max_length: int, record: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """The chain after the text :meth:`observe` last saw (at most ``max_length`` tokens) and
        each position's probability of being accepted (non-increasing). Its candidates wait for
        their labels unless ``record`` is false (a look at the chain that is not drafted: its
        nodes must not be labelled twice)."""
        text = self.model.ids
        if max_length < 1 or not text:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        depth = min(self.max_depth, max_length)
        model, memory = self.model, self.memory
        tail = self._tail()
        weights, bits = estimate_weights(self.acceptance)
        successors = model.successors.core if model.successors is not None else None
        recall = memory.model if memory is not None else None
        recall_tail = tail[len(tail) - min(len(tail), recall.context_size):] if recall is not None else tail[:0]
        # what _candidates and _chain do one after the other, in one call of the core, which adds
        # the tree to the pending labels too (a source model learns from its nodes: their sources
        # are the features' last column)
        with memory.lock if memory is not None else nullcontext():
            return _core.chain_candidates(
                model.cache, tail[len(tail) - min(len(tail), model.context_size):], successors, model.vocab_size,
                recall.cache if recall is not None else None, recall_tail,
                recall.vocab_size if recall is not None else 1, self.candidates, depth, weights, bits,
                self.acceptance.max_depth, SOURCES["text"], SOURCES["memory"],
                self.pending.core if record else _core.CorePendingLabels(), len(text) - 1,
                isinstance(self.acceptance, SourceAcceptance))

    def candidate_tree(self, max_length: int) -> Continuations:
        """The candidates :meth:`propose` chooses its chain from: the text's continuations of
        at most ``max_length`` tokens, united with the memory's (``max_length`` >= 1)."""
        return self._candidates(max_length)[0]

    def _candidates(self, max_length: int) -> tuple[Continuations, np.ndarray]:
        """:meth:`candidate_tree`, and each node's sources (bits of
        :data:`~latticekit.drafting.calibration.SOURCES`)."""
        depth = min(self.max_depth, max_length)
        text = cast(Sequence[int], self._tail())
        found = best_continuations(self.model, text, self.candidates, depth)
        if self.memory is None:
            return found, np.full(found.size, SOURCES["text"], dtype=np.int64)
        return united_with_memory(found, memory_continuations(self.memory, text, self.candidates, depth))

    def _tail(self) -> np.ndarray:
        """The text's last tokens as both searches read them (the text's and the memory's), made
        once a step (the cache model's ids are int32 already)."""
        keep = self.model.context_size if self.memory is None else max(self.model.context_size,
                                                                      self.memory.model.context_size)
        return np.asarray(self.model.ids[-keep:], dtype=np.int32)

    def remember(self) -> None:
        """Adds the request's answer (its text after the prompt, as far as :meth:`observe` saw
        it) to the memory, if any, after the prompt's last tokens: call it once, when the
        request ends."""
        if self.memory is not None:
            ids, answer_start = self.model.ids, max(0, self.prompt_length - self.start)
            if len(ids) > answer_start:
                before = ids[max(0, answer_start - self.memory.context):answer_start]
                self.memory.add(ids[answer_start:], context=before)

    def propose_lattice(self, max_length: int, lattice: SausageLattice, search_lm: NGramLM, p: int,
                        alpha: float) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`propose` from the text's (and the memory's) continuations united with the p best paths of the
        heads' lattice (:func:`~latticekit.drafting.union.united_candidates`); the lattice's root
        is the text's last token and its rows past ``max_length`` drafts are not read."""
        text = self.model.ids
        if max_length < 1 or not text:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        depth = min(self.max_depth, max_length)
        found, sources = self._candidates(max_length)
        if lattice.h > depth + 1:
            lattice = SausageLattice(lattice.tokens[:depth + 1], lattice.scores[:depth + 1],
                                     lattice.widths[:depth + 1])
        tree = united_candidates(self.model, text, found, lattice, search_lm, p, alpha, self.model.static,
                                 found_sources=sources.tolist())
        return self._chain(tree, len(text) - 1)

    def _chain(self, tree: CandidateTree, root_index: int) -> tuple[np.ndarray, np.ndarray]:
        """The tree's best chain and each position's acceptance probability; its candidates wait
        for their labels."""
        features, probability, chain = tree_chain(tree, self.acceptance)
        # a source model learns from its nodes: the features' last column is their sources
        self.pending.add(root_index, tree, features if isinstance(self.acceptance, SourceAcceptance)
                         else features[:, :-1])
        return tree.tokens[chain].astype(np.int64), probability[chain]



def _solve_gram(m: list[list[float]], r: list[float]) -> Optional[list[float]]:
    """``m^-1 r`` for a small Gram matrix ``m`` (Gaussian elimination with partial pivoting);
    None where its columns are collinear within rounding (its determinant under 1e-10 of the
    product of its diagonal: Hadamard's ratio, 1 for orthogonal columns)."""
    k = len(r)
    a = [row[:] + [r[i]] for i, row in enumerate(m)]
    diagonal = math.prod(m[i][i] for i in range(k))
    det = 1.0
    for col in range(k):
        pivot = max(range(col, k), key=lambda i: abs(a[i][col]))
        if a[pivot][col] == 0:
            return None
        if pivot != col:
            a[col], a[pivot] = a[pivot], a[col]
            det = -det
        det *= a[col][col]
        for i in range(col + 1, k):
            f = a[i][col] / a[col][col]
            for j in range(col, k + 1):
                a[i][j] -= f * a[col][j]
    if diagonal <= 0 or abs(det) < 1e-10 * diagonal:
        return None
    out = [0.0] * k
    for i in range(k - 1, -1, -1):
        out[i] = (a[i][k] - sum(a[i][j] * out[j] for j in range(i + 1, k))) / a[i][i]
    return out


class CostFit(NamedTuple):
    """A step's seconds, ``a + b * tokens + c * keys``: ``tokens`` every query token of the
    batch's forward pass, ``keys`` the keys those queries attend (per row, its query tokens
    times its context), so that a row's draft token costs ``b + c * its context``."""

    a: float
    b: float
    c: float = 0.0


#: :class:`BatchCosts` keeps ``keys`` in thousands (the normal equations' entries stay comparable).
_KEYS_SCALE = 1e-3


class BatchCosts:
    """The engine's step seconds as ``a + b * tokens + c * keys`` (:class:`CostFit`), fitted
    online by least squares with forgetting from the steps it took.

    Every coefficient is at least 0 (the fit is the least-squares one under that constraint),
    and the fit keeps ``b`` and ``c`` only where the steps pay for them in the Bayesian
    information criterion: where the steps' sizes and contexts do not vary apart (one request
    at one context), a token's price is one number, ``b``. A step has a fixed part ``a``
    (reading the weights): the fit goes through the origin only where no fit with it has
    every coefficient >= 0 (the step all per token), and not where one with it finds a token
    and a key free or cheaper than free: steps whose sizes cost less than their noise (one
    request on a CPU: a draft token 0.3-0.7 ms against 35-45 ms steps) would otherwise, after
    one drafted step that happened to be quick, price every token at a whole step, draft
    nothing more, and so never see the steps that would correct it (vLLM, one request on
    chat: 0.99x no speculation where the same proposer ran at 1.27x). Until the steps seen
    tell ``a`` from the rest that way, ``b`` is taken as ``prior_ratio * a``. A step far slower
    than predicted (the engine sat idle between requests) is not a cost and is left out.
    """

    #: The columns of a fit: the indices of ``(1, tokens, keys)`` it keeps, the fullest first;
    #: those through the origin are tried only where none with the fixed part is.
    _FACES = (((0, 1, 2), (0, 1), (0, 2)), ((1, 2), (1,), (2,)))

    def __init__(self, prior_ratio: float = 1 / 16, decay: float = 0.99, idle_factor: float = 4.0) -> None:
        self.prior_ratio, self.decay, self.idle_factor = prior_ratio, decay, idle_factor
        # decayed sums (plain floats: a step's update and refit take about 0.1 ms) of x x^T, x =
        # (1, tokens, keys / 1000); of x * seconds; of seconds^2
        self.xx = [[0.0] * 3 for _ in range(3)]
        self.xy = [0.0] * 3
        self.yy = 0.0
        self.samples = 0
        self._fit: Optional[CostFit] = None
        self._stale = False

    def add(self, tokens: int, seconds: float, keys: float = 0.0) -> None:
        """One step: ``tokens`` query tokens attending ``keys`` keys took ``seconds``."""
        if tokens < 1 or not np.isfinite(seconds) or seconds <= 0 or not np.isfinite(keys) or keys < 0 \
                or self.idle(tokens, seconds, keys):
            return
        x = (1.0, float(tokens), keys * _KEYS_SCALE)
        d = self.decay
        for i in range(3):
            row = self.xx[i]
            for j in range(3):
                row[j] = d * row[j] + x[i] * x[j]
            self.xy[i] = d * self.xy[i] + x[i] * seconds
        self.yy = d * self.yy + seconds * seconds
        self.samples += 1
        self._stale = True

    def idle(self, tokens: int, seconds: float, keys: float = 0.0) -> bool:
        """Whether a step of ``tokens`` query tokens that took ``seconds`` was far slower than
        predicted, and than the steps' mean: the engine sat idle between requests (not a step's
        cost). The mean keeps a fit that went wrong from calling every step idle and never
        learning again (a fit through the origin, after a few noisy steps, predicted a tenth
        of a one-request step)."""
        if self.samples < 4:
            return False
        return seconds > self.idle_factor * max(self.seconds(tokens, keys), self.xy[0] / self.w)

    @property
    def w(self) -> float:
        """The steps' decayed count."""
        return self.xx[0][0]

    def coefficients(self) -> CostFit:
        """Seconds per step, per query token and per key attended; (0, 0, 0) before any step."""
        if self.w == 0:
            return CostFit(0.0, 0.0, 0.0)
        fit = self.fit()
        if fit is not None:
            return fit
        mean_n, mean_t = self.xx[0][1] / self.w, self.xy[0] / self.w
        a = mean_t / (1 + self.prior_ratio * mean_n)
        return CostFit(a, self.prior_ratio * a, 0.0)

    @property
    def fitted(self) -> bool:
        """Whether the steps seen tell ``a`` from the rest (the coefficients are no prior's)."""
        return self.fit() is not None

    def fit(self) -> Optional[CostFit]:
        """The least-squares coefficients, each at least 0, over the columns that pay for
        themselves (the lowest Bayesian information criterion among the constrained fits), where
        the steps vary enough in size and a token or a key costs something; else None."""
        if self._stale:
            self._fit, self._stale = self._solve(), False
        return self._fit

    def _solve(self) -> Optional[CostFit]:
        w = self.w
        if w == 0:
            return None
        mean_n = self.xx[0][1] / w
        if self.xx[1][1] / w - mean_n * mean_n <= 0.25:
            return None
        tol = 1e-9 * self.xy[0] / w
        floor = 1e-12 * max(self.yy, 1e-30)  # an exact fit's residual (the criterion's logarithm stays finite)
        best: Optional[tuple[float, list[float]]] = None
        free = False  # a fit with the fixed part and the tokens found a token (and a key) free or cheaper
        for face in (face for tier in self._FACES for face in tier):
            if 0 not in face and (best is not None or free):
                break  # a fit with the fixed part is, or says the steps' sizes cost nothing measurable
            if 2 in face and self.xx[2][2] <= 0:
                continue
            m = [[self.xx[i][j] for j in face] for i in face]
            r = [self.xy[i] for i in face]
            beta = _solve_gram(m, r)
            if beta is None:  # its columns (nearly) collinear: another face fits the same
                continue
            # each column's share of the mean step (a share within rounding of 0 is 0)
            share = [b * self.xx[0][i] / w for b, i in zip(beta, face)]
            if 0 in face and 1 in face and share[0] >= -tol and all(x <= tol for x, i in zip(share, face) if i != 0):
                free = True
            if min(share) < -tol or sum(x for x, i in zip(share, face) if i != 0) <= tol:
                continue
            beta = [max(b, 0.0) for b in beta]
            fitted = sum(b * y for b, y in zip(beta, r))
            quadratic = sum(beta[k] * m[k][q] * beta[q] for k in range(len(face)) for q in range(len(face)))
            rss = max(self.yy - 2 * fitted + quadratic, floor)
            score = w * math.log(rss / w) + len(face) * math.log(max(w, 2.0))
            if best is None or score < best[0] - 1e-9:
                full = [0.0] * 3
                for b, i in zip(beta, face):
                    full[i] = b
                best = (score, full)
        if best is None:
            return None
        a, b, c = best[1]
        return CostFit(a, b, c * _KEYS_SCALE)

    def seconds(self, tokens: int, keys: float = 0.0) -> float:
        a, b, c = self.coefficients()
        return a + b * tokens + c * keys

    def drawn_to(self, prior: CostFit, spread: float = 0.5) -> Optional[CostFit]:
        """These steps' fit of ``a + b * tokens``, its ``b`` drawn toward ``prior.b`` as far as
        they leave it uncertain, and ``a`` through their mean: a bucket of loads' own steps
        (few, of nearly one size) against the fit over every load (:meth:`coefficients`).

        ``b`` is the mean of the steps' own least-squares slope and ``prior.b``, weighted by
        their precisions: the slope's, the residual variance over the steps' decayed count
        times their sizes' variance; the prior's, ``1 / (spread * prior.b) ** 2`` (a load's
        price of a token may differ from the others' by about ``spread`` of it). Steps of
        one size, or whose slope comes out below 0 (noise: a token cheaper than free), take
        ``prior.b``. None before two steps, without a prior price, or where ``a`` comes out at
        0 or below."""
        w = self.w
        if w < 2 or prior.b <= 0:
            return None
        mean_n, mean_t = self.xx[0][1] / w, self.xy[0] / w
        var_n = self.xx[1][1] / w - mean_n * mean_n
        b = prior.b
        if var_n > 1e-9:
            cov = self.xy[1] / w - mean_n * mean_t
            own = cov / var_n
            noise = max(self.yy / w - mean_t * mean_t - cov * own, 0.0) / (w * var_n)  # the slope's variance
            trust = (spread * prior.b) ** 2
            b = (own * trust + prior.b * noise) / (trust + noise) if own >= 0 else prior.b
        a = mean_t - b * mean_n
        return CostFit(a, b, 0.0) if a > 0 else None


def _row_values(values: Optional[Sequence[float]], rows: int) -> list[float]:
    """The allocation's ``values``, checked: one finite number >= 0 per request (None: 1 each)."""
    worth = [1.0] * rows if values is None else [float(x) for x in values]
    if len(worth) != rows or any(not np.isfinite(x) or x < 0 for x in worth):
        raise ValueError(f"values must be one finite number >= 0 per request, got {values!r}")
    return worth


def allocate(probabilities: Sequence[np.ndarray], a: float, b: float, overhead: float = 0.0,
             weights: Optional[Sequence[float]] = None, values: Optional[Sequence[float]] = None) -> list[int]:
    """Each request's chain length for the most expected tokens per second of the batch.

    Args:
        probabilities: per request, each chain position's probability of being accepted
            (non-increasing along the chain).
        a, b: the step's seconds, ``a + b * query tokens``.
        overhead: seconds the step spends besides the pass (drafting itself).
        weights: per request, its query tokens' cost in units of ``b`` (a row's token costs
            ``b * weights[i]``, its own one included; by its context, :class:`CostFit`); None: 1.
        values: per request, what one of its tokens is worth, its own one included (in a
            closed batch, more for a request that may end the batch than for one that will
            not: :func:`~latticekit.vllm.loads.closed_values`); the expected tokens are the
            values' sum. None: 1.

    Returns:
        Per request, how many of its chain's tokens to verify (0: a plain step).
    """
    return allocate_prices(probabilities, a, [b], overhead, weights, values)[0]


def allocate_prices(probabilities: Sequence[np.ndarray], a: float, prices: Sequence[float],
                    overhead: float = 0.0, weights: Optional[Sequence[float]] = None,
                    values: Optional[Sequence[float]] = None) -> list[list[int]]:
    """:func:`allocate` at each of several prices ``b`` of a draft token, in one pass over the
    positions sorted once: per price, the lengths ``allocate(probabilities, a, b, overhead, weights,
    values)`` gives (a higher price stops the same greedy allocation sooner).

    Positions are taken by their probability times their row's value over its weight, highest
    first (within a row, in order), while one more token raises the batch's expected value per
    second: the greedy order of a ratio's maximum, each level's lengths the best the brute force
    finds."""
    rows = len(probabilities)
    unit = [1.0] * rows if weights is None else [float(x) for x in weights]
    if len(unit) != rows or any(not np.isfinite(x) or x < 0 for x in unit):
        raise ValueError(f"weights must be one finite number >= 0 per request, got {weights!r}")
    worth = _row_values(values, rows)
    out = [[len(p) for p in probabilities] if b <= 0 else [len(p) if unit[i] == 0 else 0
                                                            for i, p in enumerate(probabilities)] for b in prices]
    # a token that costs nothing (or nothing is known yet that says it does): all of them
    active = [k for k, b in enumerate(prices) if b > 0]
    if not active:
        return out
    expected = [sum(worth) + sum(v * float(p.sum()) for p, x, v in zip(probabilities, unit, worth) if x == 0)] \
        * len(prices)
    total = sum(unit)
    seconds = [a + overhead + b * total for b in prices]  # every request emits at least one token
    order = sorted(((float(p[j]) * worth[i], i, j) for i, p in enumerate(probabilities) if unit[i] > 0
                    for j in range(len(p))), key=lambda item: (-item[0] / unit[item[1]], item[2]))
    for gain, i, j in order:
        for k in active:
            lengths = out[k]
            if j != lengths[i]:  # a position whose parent was not taken (ties): its chain stops here
                continue
            price = prices[k] * unit[i]
            if gain * seconds[k] <= price * expected[k]:  # one more token no longer raises value per second
                active = [x for x in active if x != k]
                continue
            lengths[i] += 1
            expected[k] += gain
            seconds[k] += price
        if not active:
            break
    return out


class StepCurve:
    """The engine's step seconds per count of query tokens, where they are not one line.

    A CPU's matrix kernels work in blocks of rows: on the 2-core EPYC (vLLM's CPU build,
    SmolLM2-135M, ``benchmarks/step_curve.py``) a step of one request took 33.0 ms with no draft,
    40.0 ms with one draft token and 32.4-33.0 ms with two to five, then 37.6 ms with six; at
    four requests the third draft token alone added 7 ms where the fitted line priced a token
    at 1.8 ms (``docs/vllm.md``, stop 57). A GPU's are flat up to a tile and step there.
    A line prices every draft token alike; this keeps, per count of query tokens, the decayed
    mean of the steps that had it, and predicts a count's seconds as that mean drawn toward the
    line's by :data:`prior_steps` steps' weight (a count seen rarely, or never, costs what the
    line says). ``generate`` measures its table of a step's seconds once per device, by a probe
    (:class:`~latticekit.drafting.costs.StepCosts`); inside an engine there is no probe to run,
    and a batch's rows vary, so the vLLM proposer learns this from the steps it sees, per load.
    """

    __slots__ = ("_seen",)

    #: decay per step of the same count of query tokens (its mean weighs about 50 steps at most)
    decay = 0.98
    #: the line's prediction counts as this many steps (a count's mean takes over as its steps add up)
    prior_steps = 3.0

    def __init__(self) -> None:
        self._seen: dict[int, list[float]] = {}  # query tokens -> [decayed steps, decayed seconds]

    def add(self, tokens: int, seconds: float) -> None:
        """One step: ``tokens`` query tokens took ``seconds``."""
        if tokens < 1 or not np.isfinite(seconds) or seconds <= 0:
            return
        seen = self._seen.setdefault(int(tokens), [0.0, 0.0])
        seen[0] = self.decay * seen[0] + 1.0
        seen[1] = self.decay * seen[1] + seconds

    def seconds(self, tokens: int, line: float) -> float:
        """A step of ``tokens`` query tokens: its steps' mean drawn toward ``line`` (the fit's seconds)."""
        steps, total = self._seen.get(int(tokens), (0.0, 0.0))
        return (total + self.prior_steps * line) / (steps + self.prior_steps)

    def between(self, first: int, last: int, a: float, b: float) -> list[float]:
        """The seconds of steps of ``first`` to ``last`` query tokens (:meth:`seconds`, the line ``a + b * tokens``)."""
        return [self.seconds(n, a + b * n) for n in range(first, last + 1)]

    def means(self) -> dict[int, list[float]]:
        """Per count of query tokens seen, its decayed steps and mean seconds."""
        return {n: [round(w, 2), s / w] for n, (w, s) in sorted(self._seen.items()) if w > 0}


def curve_seconds(steps: Sequence[float], drafts: int, price: float, overhead: float = 0.0) -> float:
    """A step's seconds with ``drafts`` draft tokens, ``steps[d]`` its pass's with ``d`` of them,
    at a level that counts what drafts add ``price`` times (a cautious level more, an eager one
    less; what they save, as it is), and ``overhead`` (drafting) besides."""
    added = steps[drafts] - steps[0]
    return steps[0] + overhead + (price * added if added > 0 else added)


def allocate_curve(probabilities: Sequence[np.ndarray], steps: Sequence[float], prices: Sequence[float],
                   overhead: float = 0.0, values: Optional[Sequence[float]] = None) -> list[list[int]]:
    """:func:`allocate_prices` where the step's seconds are a curve in its draft tokens, not a
    line: ``steps[d]`` the pass's seconds with ``d`` draft tokens, for every ``d`` up to all the
    chains' (:class:`StepCurve`), each request's query tokens alike.

    The ``d`` draft tokens worth most are the ``d`` positions of the highest probability times
    their row's value (a chain's probabilities do not increase, so they are prefixes); per
    price, the lengths are those of the ``d`` with the highest expected value per second
    (:func:`curve_seconds`; ties: the fewest drafts), every ``d`` weighed, since a curve's
    ratio need not rise and then fall."""
    rows = len(probabilities)
    worth = _row_values(values, rows)
    positions = sum(len(p) for p in probabilities)
    pass_s = np.asarray(steps, dtype=np.float64)[:positions + 1]
    if len(steps) <= positions or not np.all(np.isfinite(pass_s) & (pass_s > 0)):
        raise ValueError(f"steps must be {positions + 1} finite seconds > 0 (0 to every position drafted), "
                         f"got {len(steps)}")
    order = sorted(((float(p[j]) * worth[i], j, i) for i, p in enumerate(probabilities) for j in range(len(p))),
                   key=lambda item: (-item[0], item[1]))
    gains = np.concatenate(([sum(worth)], [gain for gain, _, _ in order])).cumsum()
    added = pass_s - pass_s[0]
    out = []
    for price in prices:  # curve_seconds at every count of drafts at once
        seconds = pass_s[0] + overhead + np.where(added > 0, price * added, added)
        best = int(np.argmax(gains / np.maximum(seconds, 1e-12)))  # the first of the highest: the fewest drafts
        lengths = [0] * rows
        for _, _, i in order[:best]:
            lengths[i] += 1
        out.append(lengths)
    return out
