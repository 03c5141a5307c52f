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
   learnt online from every request's outcomes); the chain follows the most probable child
   down the candidate tree, with each position's probability of being accepted.
2. **Per batch** (:func:`allocate`; at several prices at once, :func:`allocate_prices`): a draft
   token is one more token in the batch's forward pass. With the engine's step seconds
   ``a + b * tokens`` (:class:`BatchCosts`, fitted online from the steps the engine really
   took), the lengths maximise the batch's expected tokens per second: positions are added
   most probable first while one more token's probability exceeds ``b`` times the tokens per
   second already expected. At one request a draft token costs little against the whole pass;
   at high concurrency the pass is dominated by its tokens and only near-certain drafts pay,
   or none.

Plain Python and numpy: nothing here imports torch or an engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import numpy as np

from latticekit.drafting.cache_model import CacheModel
from latticekit.drafting.calibration import AcceptanceModel, CandidateTree, PendingLabels, node_features
from latticekit.drafting.continuations import Continuations, best_continuations
from latticekit.drafting.memory import AnswerMemory, memory_continuations, united_with_memory
from latticekit.drafting.union import united_candidates
from latticekit.errors import DecoderConfigError
from latticekit.lattice import SausageLattice
from latticekit.ngram import NGramLM

__all__ = ["ChainDrafter", "BatchCosts", "allocate", "allocate_prices"]


class ChainDrafter:
    """One request's drafting state: its n-gram cache model and the candidates waiting for
    their labels.

    Args:
        lm: the static Katz model over token ids, or None (the request's own text alone).
        vocab_size: the target's vocabulary (the cache model's fallback without ``lm``).
        acceptance: the acceptance model it reads and teaches (shared by an engine's requests).
        candidates: nodes of the candidate tree searched per step.
        max_depth: the longest chain.
        start: the text starts here in the ids handed over (a long prompt's head is left out:
            the cache model reads ``ids[start:]``).
        memory: earlier answers it drafts from too (its candidates searched as the text's),
            shared with other requests; None: the request's own text alone.
        prompt_length: the prompt's tokens in the ids handed over: the answer :meth:`remember`
            adds to the memory starts there.
    """

    def __init__(self, lm: Optional[NGramLM], vocab_size: int, acceptance: AcceptanceModel,
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
        self.acceptance.update(features, labels)

    def propose(self, max_length: int) -> tuple[np.ndarray, np.ndarray]:
        """The chain after the text :meth:`observe` last saw (at most ``max_length`` tokens) and
        each position's probability of being accepted (non-increasing)."""
        text = self.model.ids
        if max_length < 1 or not text:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        found = self.candidate_tree(max_length)
        if not found.size:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        return self._chain(found.tree(), len(text) - 1)

    def candidate_tree(self, max_length: int) -> Continuations:
        """The candidates :meth:`propose` chooses its chain from: the text's continuations of
        at most ``max_length`` tokens, united with the memory's (``max_length`` >= 1)."""
        text = self.model.ids
        depth = min(self.max_depth, max_length)
        found = best_continuations(self.model, text, self.candidates, depth)
        if self.memory is None:
            return found
        return united_with_memory(found, memory_continuations(self.memory, text, self.candidates, depth))[0]

    def remember(self) -> None:
        """Adds the request's answer (its text after the prompt, as far as :meth:`observe` saw
        it) to the memory, if any: call it once, when the request ends."""
        if self.memory is not None:
            answer = self.model.ids[max(0, self.prompt_length - self.start):]
            if answer:
                self.memory.add(answer)

    def propose_lattice(self, max_length: int, lattice: SausageLattice, search_lm: NGramLM, p: int,
                        alpha: float) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`propose` from the text's (and the memory's) continuations united with the p best paths of the
        heads' lattice (:func:`~latticekit.drafting.union.united_candidates`); the lattice's root
        is the text's last token and its rows past ``max_length`` drafts are not read."""
        text = self.model.ids
        if max_length < 1 or not text:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        depth = min(self.max_depth, max_length)
        found = self.candidate_tree(max_length)
        if lattice.h > depth + 1:
            lattice = SausageLattice(lattice.tokens[:depth + 1], lattice.scores[:depth + 1],
                                     lattice.widths[:depth + 1])
        tree = united_candidates(self.model, text, found, lattice, search_lm, p, alpha, self.model.static)
        return self._chain(tree, len(text) - 1)

    def _chain(self, tree: CandidateTree, root_index: int) -> tuple[np.ndarray, np.ndarray]:
        """The tree's best chain and each position's acceptance probability; its candidates wait
        for their labels."""
        features = node_features(tree, self.acceptance.max_depth)
        probability = tree.path_probability(self.acceptance.conditional(features))
        self.pending.add(root_index, tree, features)
        chain = tree.best_chain(probability)
        return tree.tokens[chain].astype(np.int64), probability[chain]



class BatchCosts:
    """The engine's step seconds as ``a + b * tokens`` (tokens: every query token of the batch's
    forward pass, prefill and drafts included), fitted online by least squares with forgetting
    from the steps it took.

    Until the steps seen vary enough in size to tell ``a`` from ``b``, ``b`` is taken as
    ``prior_ratio * a``. A step far slower than predicted (the engine sat idle between
    requests) is not a cost and is left out.
    """

    def __init__(self, prior_ratio: float = 1 / 16, decay: float = 0.99, idle_factor: float = 4.0) -> None:
        self.prior_ratio, self.decay, self.idle_factor = prior_ratio, decay, idle_factor
        self.w = self.sn = self.snn = self.st = self.snt = 0.0
        self.samples = 0

    def add(self, tokens: int, seconds: float) -> None:
        """One step: ``tokens`` query tokens took ``seconds``."""
        if tokens < 1 or not np.isfinite(seconds) or seconds <= 0 or self.idle(tokens, seconds):
            return
        d = self.decay
        self.w, self.sn, self.snn = d * self.w + 1, d * self.sn + tokens, d * self.snn + tokens * tokens
        self.st, self.snt = d * self.st + seconds, d * self.snt + tokens * seconds
        self.samples += 1

    def idle(self, tokens: int, seconds: float) -> bool:
        """Whether a step of ``tokens`` query tokens that took ``seconds`` was far slower than
        predicted: the engine sat idle between requests (not a step's cost)."""
        return self.samples >= 4 and seconds > self.idle_factor * self.seconds(tokens)

    def coefficients(self) -> tuple[float, float]:
        """``(a, b)``: seconds per step and per query token; (0, 0) before any step."""
        if self.w == 0:
            return 0.0, 0.0
        fit = self.fit()
        if fit is not None:
            return fit
        mean_n, mean_t = self.sn / self.w, self.st / self.w
        a = mean_t / (1 + self.prior_ratio * mean_n)
        return a, self.prior_ratio * a

    @property
    def fitted(self) -> bool:
        """Whether the steps seen tell ``a`` from ``b`` (the coefficients are no prior's)."""
        return self.fit() is not None

    def fit(self) -> Optional[tuple[float, float]]:
        """The least-squares ``(a, b)`` where the steps vary enough in size and ``b > 0``; a
        negative ``a`` (a step's cost all per token there: the engine is compute-bound at that
        size) is fitted again through the origin."""
        if self.w == 0:
            return None
        mean_n, mean_t = self.sn / self.w, self.st / self.w
        var_n = self.snn / self.w - mean_n * mean_n
        if var_n <= 0.25:
            return None
        b = (self.snt / self.w - mean_n * mean_t) / var_n
        if b <= 0:
            return None
        a = mean_t - b * mean_n
        if a < 0:
            return 0.0, self.snt / self.snn
        return a, b

    def seconds(self, tokens: int) -> float:
        a, b = self.coefficients()
        return a + b * tokens


def allocate(probabilities: Sequence[np.ndarray], a: float, b: float, overhead: float = 0.0) -> list[int]:
    """Each request's chain length for the most expected tokens per second of the batch.

    Args:
        probabilities: per request, each chain position's probability of being accepted
            (non-increasing along the chain).
        a, b: the step's seconds, ``a + b * query tokens``.
        overhead: seconds the step spends besides the pass (drafting itself).

    Returns:
        Per request, how many of its chain's tokens to verify (0: a plain step).
    """
    return allocate_prices(probabilities, a, [b], overhead)[0]


def allocate_prices(probabilities: Sequence[np.ndarray], a: float, prices: Sequence[float],
                    overhead: float = 0.0) -> list[list[int]]:
    """:func:`allocate` at each of several prices ``b`` of a draft token, in one pass over the
    positions sorted once: per price, the lengths ``allocate(probabilities, a, b, overhead)``
    gives (a higher price stops the same greedy allocation sooner)."""
    rows = len(probabilities)
    out = [[len(p) for p in probabilities] if b <= 0 else [0] * rows for b in prices]
    # a token that costs nothing (or nothing is known yet that says it does): all of them
    active = [k for k, b in enumerate(prices) if b > 0]
    if not active:
        return out
    expected = [float(rows)] * len(prices)  # every request emits at least one token
    seconds = [a + overhead + b * rows for b in prices]
    order = sorted(((float(p[j]), i, j) for i, p in enumerate(probabilities) for j in range(len(p))),
                   key=lambda item: (-item[0], item[2]))
    for prob, i, j in order:
        for k in active:
            lengths = out[k]
            if j != lengths[i]:  # a position whose parent was not taken (ties): its chain stops here
                continue
            b = prices[k]
            if prob * seconds[k] <= b * expected[k]:  # one more token no longer raises tokens per second
                active = [x for x in active if x != k]
                continue
            lengths[i] += 1
            expected[k] += prob
            seconds[k] += b
        if not active:
            break
    return out
