"""``auto``: the draft tree with the most expected tokens per second, chosen every step.

Every step the drafter weighs what a tree costs against what it is expected to bring:

1. **Candidates.** The p best paths of the heads' lattice under ``draft + alpha * n-gram``
   (latticekit's exact search), merged into a trie (:class:`~latticekit.drafting.calibration.CandidateTree`).
2. **Acceptance estimates.** Each node's probability of being accepted, the product along its
   path of :class:`~latticekit.drafting.calibration.AcceptanceModel`'s conditionals (head and n-gram
   log-probabilities, depth), learnt online from the decode's own text.
3. **Costs.** :class:`~latticekit.decoding.costs.StepCosts`: the seconds of a target call verifying
   n nodes, measured on this device.
4. **The tree.** Nodes sorted by acceptance probability form, for every n, the prefix-closed
   set of n nodes with the most expected accepted tokens (a child is never likelier than its
   parent); the step verifies the n maximising ``(1 + expected accepted) / target seconds(n)``.
   n = 0 is a plain greedy step.

The heads' lattice and the search cost time of their own (measured as the decode runs). The
drafter keeps a running estimate of what drafting gains: per step that read the lattice, the
chosen tree's expected tokens over its cost (the tree's target seconds and the drafting
seconds), against a plain step's one token in a plain step's seconds. Where recent trees
bore out less than half their estimates (accepted over expected tokens, decayed), the expected
accepted tokens are scaled down accordingly (by twice that ratio), so that heads confidently
wrong (untrained ones copy head 1: sure of the wrong position) are found out by their outcomes
within a few trees, before the acceptance model has learnt why. When even the best tree does
not repay them (untrained heads, a domain the heads do not know), the drafter stops reading the
lattice and decodes plainly, probing now and then (every 2, 4, ..., 32 steps) whether drafting
pays again; a probe's outcome alone decides whether drafting resumes, and every probe's
candidates still teach the acceptance model once the text reaches them.

**Without heads** (a decode given none, so the drafter is built without them and reads no
lattice) the candidates are the heads-free drafter's (``headsfree``,
:mod:`latticekit.drafting.drafters.headsfree`): the most probable continuations of the decoded text
under the n-gram cache model, steps 2-4 unchanged.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence
from typing import Optional, cast

import numpy as np

from latticekit.drafting.cache_model import CacheModel
from latticekit.drafting.calibration import (
    AcceptanceModel,
    CandidateTree,
    PendingLabels,
    node_features,
    shipped_acceptance,
)
from latticekit.drafting.continuations import best_continuations
from latticekit.drafting.costs import StepCosts
from latticekit.drafting.config import DecoderConfig
from latticekit.drafting.protocol import Draft, Drafter, DraftInput, DraftResources
from latticekit.drafting.registry import register
from latticekit.drafting.drafters.ngram import select_lm, uniform_lm
from latticekit.errors import DecoderConfigError
from latticekit.lattice import SausageLattice
from latticekit.ngram import NGramLM
from latticekit.search import pbest

__all__ = ["AutoDrafter", "choose_nodes", "lm_candidates"]

#: Static candidate vocabulary of the heads' lattice: the n-gram model's most probable tokens.
CANDIDATE_TOKENS = 8192
#: Probing while drafting does not pay: after 2 plain steps, then 4, ... up to this many.
MAX_PROBE_INTERVAL = 32
#: Weight of the newest step in the running estimate of what drafting gains.
_GAIN_SMOOTHING = 0.3
#: Decay per verified tree of the sums behind :attr:`AutoDrafter.realisation` (a memory of ~20 trees).
_REALISED_DECAY = 0.95
#: The longest continuation the n-gram models draft (heads-free candidates).
MAX_NGRAM_DEPTH = 12


_RANKED: "weakref.WeakKeyDictionary[NGramLM, np.ndarray]" = weakref.WeakKeyDictionary()


def lm_candidates(lm: NGramLM, size: int) -> np.ndarray:
    """The ``size`` most probable unigrams of a model over token ids (words spelled as decimal
    ids), as int64 token ids; empty when its words are not ids. The ranking is kept per model."""
    ranked = _RANKED.get(lm)
    if ranked is None:
        ids, log10p, _ = lm.ngrams(1)
        tokens = lm.word_token_ids()[ids[:, 0]]
        ranked = tokens[np.argsort(-log10p, kind="stable")]
        ranked = _RANKED[lm] = ranked[ranked >= 0]
    return ranked[:size]



def choose_nodes(probability: np.ndarray, depths: np.ndarray, costs: StepCosts, cached: int,
                 max_nodes: int) -> tuple[np.ndarray, float, float]:
    """The nodes to verify: the first n of ``probability`` order (parents before children),
    n maximising ``(1 + sum of their probabilities) / costs.target_s(n, cached)``.

    Returns:
        The chosen node indices (most probable first), the expected tokens of the step and
        its predicted target seconds.
    """
    order = np.lexsort((depths, -probability))[:max_nodes]
    expected = 1.0 + np.concatenate([[0.0], np.cumsum(probability[order])])
    seconds = np.array([costs.target_s(n, cached) for n in range(len(order) + 1)])
    best = int(np.argmax(expected / seconds))
    return order[:best], float(expected[best]), float(seconds[best])


@register
class AutoDrafter(Drafter):
    """Cost-aware drafting: see the module docstring.

    Args:
        config: an ``auto`` config (k arcs per lattice column, p candidate paths, alpha).
        lm: the n-gram model (token-id words), or None: candidates ranked by the heads alone,
            no n-gram feature (without heads: the decoded text's cache alone).
        costs: the target's measured step costs.
        acceptance: the acceptance model to start from (copied); default
            :meth:`AcceptanceModel.prior` trusting what drafts (the heads, or the cache model);
            ``from_config`` first looks for one shipped for the heads (used when the heads draft
            alone, ``auto`` with heads).
        max_nodes: the largest tree considered.
        vocab_size: the target's vocabulary (the cache model's uniform fallback without ``lm``).
        reads_heads: candidates come from the heads' lattice (heads were given, or a replay's
            trace holds their lattices); otherwise from the n-gram models alone.
        heads_fingerprint: the heads' :func:`~latticekit.heads.heads_fingerprint`, to start from
            the acceptance model shipped for them.
    """

    method = "auto"
    default_k = 16
    default_p = 16
    knobs = frozenset({"k", "p", "alpha", "lm"})
    needs_heads = False  # without heads it drafts from the n-gram models (see the module docstring)
    needs_costs = True

    def __init__(self, config: DecoderConfig, lm: Optional[NGramLM], costs: StepCosts,
                 acceptance: Optional[AcceptanceModel] = None, max_nodes: int = 64,
                 vocab_size: Optional[int] = None, reads_heads: bool = False,
                 heads_fingerprint: Optional[str] = None) -> None:
        super().__init__(config)
        self.lm = lm
        self.search_lm = lm if lm is not None else uniform_lm()
        self.alpha = config.alpha if lm is not None else 0.0
        self.costs = costs
        self.vocab_size = vocab_size
        self.given_acceptance = acceptance
        self._acceptance: Optional[AcceptanceModel] = None
        self._cache_model: Optional[CacheModel] = None
        self.reads_heads = self.reads_lattice = reads_heads
        self.heads_fingerprint = heads_fingerprint
        self.max_nodes = int(max_nodes)
        self.pending = PendingLabels()
        self.gain = 1.0  # running estimate: drafting's tokens/s over plain steps' (1: break even)
        self.overhead_s = 0.0  # running mean of a drafting step's lattice + search seconds
        self.probe_interval = 2
        self.plain_run = 0
        self._outcome: Optional[tuple[float, float, float, bool]] = None  # (expected, plain s, step s, probing)
        self.realised = self.promised = 1.0  # decayed sums of accepted and expected accepted tokens

    @classmethod
    def from_config(cls, config: DecoderConfig, resources: DraftResources) -> "AutoDrafter":
        if resources.costs is None:
            raise DecoderConfigError(f"decoder {config.label!r} needs the target's step costs "
                                     "(latticekit.decoding.costs.step_costs)")
        lm = None
        if resources.lms is not None and (config.lm is not None or config.alpha > 0):
            lm = select_lm(config, resources.lms)
        vocab_size = resources.vocab_size
        if vocab_size is None and resources.largest_id is not None:
            vocab_size = resources.largest_id + 1
        return cls(config, lm, resources.costs, resources.acceptance, vocab_size=vocab_size,
                   reads_heads=cls.drafts_from_heads(resources), heads_fingerprint=resources.heads_fingerprint)

    @classmethod
    def drafts_from_heads(cls, resources: DraftResources) -> bool:
        """Whether its candidates come from the heads' lattice: the loop has heads."""
        return resources.has_heads

    def lattice_vocabulary(self) -> Optional[np.ndarray]:
        """The n-gram model's :data:`CANDIDATE_TOKENS` most probable tokens, when it has one over
        token ids: the heads' lattice need not project the rest of the vocabulary."""
        if self.lm is None:
            return None
        static = lm_candidates(self.lm, CANDIDATE_TOKENS)
        return static if len(static) else None

    @property
    def trust(self) -> str:
        """What the acceptance prior takes at its word (:meth:`AcceptanceModel.prior`)."""
        return "head" if self.reads_heads else "cache"

    @property
    def acceptance(self) -> AcceptanceModel:
        """The online acceptance model (a copy of the one given, or the prior of :attr:`trust`)."""
        if self._acceptance is None:
            base = self.given_acceptance
            if base is None and self.trust == "head" and self.heads_fingerprint is not None:
                base = shipped_acceptance(self.heads_fingerprint)  # fitted for the heads drafting alone
            if base is None:
                base = AcceptanceModel.prior(trust=self.trust)
            self._acceptance = AcceptanceModel(base.weights, base.learning_rate)
        return self._acceptance

    def cache_model(self, ids: Sequence[int]) -> CacheModel:
        """The n-gram cache model (:mod:`latticekit.drafting.cache_model`), synced to ``ids``."""
        if self._cache_model is None:
            vocab = self.vocab_size if self.vocab_size is not None else max(ids) + 1
            self._cache_model = CacheModel(self.lm, vocab)
        self._cache_model.sync(ids)
        return self._cache_model

    # -- one step --------------------------------------------------------------------------

    def _wants_lattice(self) -> bool:
        if self.gain >= 1.0:
            return True
        self.plain_run += 1
        return self.plain_run >= self.probe_interval

    def candidates(self, step: DraftInput) -> CandidateTree:
        """The trie of the p best lattice paths, with each node's head and n-gram log-probabilities;
        without heads, :meth:`ngram_candidates`."""
        if not self.reads_heads:
            return self.ngram_candidates(step)
        lattice = step.lattice
        p = cast(int, self.config.p)  # set by DecoderConfig.__post_init__
        paths = pbest(lattice, self.search_lm, p, self.alpha,
                      context=step.context(self.search_lm.order))
        drafts = [path.tokens[1:] for path in paths]
        head = _arc_scores(lattice, drafts)
        ngram = None
        if self.lm is not None:
            context = step.context(self.lm.order)
            ngram = [self.lm.token_logprobs(path.tokens, context=context)[1:] for path in paths]
        return CandidateTree.from_paths(drafts, head, ngram)

    def ngram_candidates(self, step: DraftInput) -> CandidateTree:
        """The p most probable continuations of the decoded text under the cache model
        (:func:`~latticekit.drafting.continuations.best_continuations`), with each node's n-gram and
        cache log-probabilities."""
        model = self.cache_model(step.ids)
        p = cast(int, self.config.p)  # set by DecoderConfig.__post_init__
        return best_continuations(model, step.ids, p, MAX_NGRAM_DEPTH).tree()

    def draft(self, step: DraftInput) -> Draft:
        if self._cache_model is None and self.trust != "head":
            # the first sync reads the whole prompt once: not a per-step cost of drafting
            self.cache_model(step.ids)
        t0 = time.perf_counter()
        if not self._wants_lattice():
            return Draft.none()
        probing = self.gain < 1.0
        self.plain_run = 0
        tree = self.candidates(step)
        features = node_features(tree, self.acceptance.max_depth)
        probability = tree.path_probability(self.acceptance.conditional(features))
        cached = step.root_index
        chosen, expected, target_s = choose_nodes(probability, tree.depths, self.costs, cached, self.max_nodes)
        self.pending.add(step.root_index, tree, features)
        if self.costs.draft_s is not None:
            self.overhead_s = self.costs.draft_s
        else:
            overhead = time.perf_counter() - t0
            self.overhead_s = overhead if self.overhead_s == 0 else 0.8 * self.overhead_s + 0.2 * overhead
        # what the step is worth is weighed once it is verified (observe)
        self._outcome = (expected, self.costs.target_s(0, cached), target_s + self.overhead_s, probing)
        # most probable first, so parents precede children: the chosen nodes are the draft's trie
        position = np.full(tree.size, -1, dtype=np.int64)
        position[chosen] = np.arange(len(chosen))
        parents = tree.parents[chosen]
        return Draft(tree.tokens[chosen], np.where(parents >= 0, position[np.maximum(parents, 0)], -1))

    @property
    def realisation(self) -> float:
        """Recently accepted tokens over the tokens the acceptance estimates expected (1: as
        expected): the gain's correction for estimates the outcomes do not bear out."""
        return self.realised / self.promised

    def observe(self, step: DraftInput, draft: Draft, emitted: Sequence[int]) -> None:
        features, labels = self.pending.resolve(step.ids, emitted)
        self.acceptance.update(features, labels)
        if self._outcome is not None:  # a step that read the lattice: what drafting gains
            expected, plain_s, spent_s, probing = self._outcome
            self._outcome = None
            if expected > 1.0:  # a tree was verified: do accepted tokens keep up with expectations?
                self.realised = _REALISED_DECAY * self.realised + (len(emitted) - 1)
                self.promised = _REALISED_DECAY * self.promised + (expected - 1)
            # estimates off by more than half are wrong about these heads: outcomes correct them
            correction = min(1.0, 2.0 * self.realisation)
            gain = (1.0 + correction * (expected - 1.0)) * plain_s / spent_s
            # a probe's outcome decides alone: the estimate it replaces is stale by many steps
            self.gain = gain if probing else (1 - _GAIN_SMOOTHING) * self.gain + _GAIN_SMOOTHING * gain
            if probing:
                self.probe_interval = 2 if self.gain >= 1.0 else min(2 * self.probe_interval, MAX_PROBE_INTERVAL)


def _arc_scores(lattice: SausageLattice, drafts: Sequence[Sequence[int]]) -> list[np.ndarray]:
    """The lattice score of each draft token at its column (column j + 1 for token j)."""
    out = []
    for draft in drafts:
        tokens = np.asarray(draft, dtype=np.int32)
        columns = lattice.tokens[1:1 + len(tokens)]
        hit = columns == tokens[:, None]
        out.append(lattice.scores[1:1 + len(tokens)][np.arange(len(tokens)), hit.argmax(axis=1)].astype(np.float64))
    return out
