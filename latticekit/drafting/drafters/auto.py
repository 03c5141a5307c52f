"""``auto``: one drafter for every case, the draft tree with the most expected tokens per second.

Every step the drafter weighs what a tree costs against what it is expected to bring:

1. **Candidates, from every source available.** The text's own continuations (prompt and
   output) under the n-gram cache model, interpolated with the static Katz model
   (:func:`~latticekit.drafting.continuations.best_continuations`, what ``headsfree`` drafts);
   with heads, the p best paths of the heads' lattice under ``draft + alpha * n-gram``
   (latticekit's exact search), the lattice's columns united with the continuations' tokens,
   all merged into one trie (:func:`~latticekit.drafting.union.united_candidates`, what
   ``heads+ngram`` drafts); given an :class:`~latticekit.drafting.memory.AnswerMemory`, the
   continuations of earlier answers join the text's. Every node knows which sources proposed it.
2. **Acceptance estimates, calibrated per source.** Each node's probability of being accepted
   is the product along its path of conditionals; each source has its own
   :class:`~latticekit.drafting.calibration.AcceptanceModel` (head, n-gram and cache
   log-probabilities, depth), learnt online from the decode's own text on the nodes that
   source proposed (:class:`~latticekit.drafting.calibration.SourceAcceptance`); a node
   several sources proposed takes the most confident. The heads' model starts from the one
   fitted for them where latticekit ships it.
3. **Costs.** :class:`~latticekit.decoding.costs.StepCosts`: the seconds of a target call verifying
   n nodes, measured on this device.
4. **The tree.** Nodes sorted by acceptance probability form, for every n, the prefix-closed
   set of n nodes with the most expected accepted tokens (a child is never likelier than its
   parent); the step verifies the n maximising ``(1 + expected accepted) / target seconds(n)``.
   n = 0 is a plain greedy step.

**Which sources to read** is decided by outcomes, not estimates. Reading the heads costs a
heads forward, a projection and the lattice search every step, and estimates can be wrong in
ways only outcomes show (untrained heads are sure of the wrong position). So each way of
drafting (an *arm*: with heads, the union of heads and text, and the text alone; without, the
text alone) keeps the tokens it really emitted per second it really cost (the verified tree's
target seconds and its drafting seconds, heads included), decayed over the arm's recent steps.
Each step takes the arm worth the most, or a plain step when none beats a plain step's one
token in its seconds. A step that reads the union also weighs the tree the text alone would
have verified there (its candidates are among the union's): once the decoded text reaches it,
the tokens it would have accepted, for its target and search seconds, count for the text's arm
(the decode's tokens do not depend on the drafts; under sampling this is the greedy match, an
estimate). The union is worth the text's rate times its advantage over the text on those
paired steps (decayed over the last ~10): compared on the same positions, not on whichever
steps each happened to draft, where a copy in progress flatters whichever arm read it. Every
arm is tried twice first; an arm that is not the best is probed after 2 steps, then 4, 8, ...
up to 32 while it keeps losing, and its probe's outcome outweighs its stale history. So heads that do not pay (an unknown domain, untrained heads, a machine
where their projection is dear) stop being read within a few steps, their cost counted, and
are read again when a probe finds them paying; and the union is read where heads and text
complement each other (heads know what the text does not; the text knows what is being
copied). Every tree's nodes, verified or not, teach their sources' models once the text
reaches them. The arm choice's state can outlive the call (:meth:`AutoDrafter.arm_outcomes`,
:meth:`AutoDrafter.resume`, :mod:`latticekit.drafting.outcomes`): ``generate`` can start a call
where the last one with the same model, device and heads stopped, so a short request does not
pay the warm-up; the kept outcomes are aged first (their sums weigh about one step), so in a
call unlike the last ones an arm's next outcome outweighs them.

The single-source drafters are the same class with one arm: ``heads`` (the heads' lattice
alone), ``headsfree`` (the text alone) and ``heads+ngram`` (the union always).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence
from typing import Optional, cast

import numpy as np

from latticekit.drafting.arms import ARM_DECAY, KEPT_GAP, ArmStats, choose_arm, probe_outcome
from latticekit.drafting.cache_model import CacheModel
from latticekit.drafting.calibration import (
    SOURCES,
    AcceptanceModel,
    CandidateTree,
    PendingLabels,
    SourceAcceptance,
    shipped_acceptance,
    tree_chain,
)
from latticekit.drafting.continuations import Continuations, best_continuations
from latticekit.drafting.costs import StepCosts
from latticekit.drafting.config import DecoderConfig
from latticekit.drafting.memory import AnswerMemory, memory_continuations, united_with_memory
from latticekit.drafting.outcomes import ArmOutcomes
from latticekit.drafting.protocol import Draft, Drafter, DraftInput, DraftResources
from latticekit.drafting.registry import register
from latticekit.drafting.drafters.ngram import select_lm, uniform_lm
from latticekit.drafting.union import united_candidates
from latticekit.errors import DecoderConfigError
from latticekit.lattice import SausageLattice
from latticekit.ngram import NGramLM
from latticekit.search import pbest

__all__ = ["AutoDrafter", "choose_nodes", "lm_candidates"]

#: Static candidate vocabulary of the heads' lattice: the n-gram model's most probable tokens.
CANDIDATE_TOKENS = 8192
#: The longest continuation the n-gram models draft (heads-free candidates).
MAX_NGRAM_DEPTH = 12
#: Continuations of the text searched per step by drafters whose ``p`` counts lattice paths.
_TEXT_CANDIDATES = 32


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
    """Cost-aware drafting from every source available: see the module docstring.

    Args:
        config: the config (k arcs per lattice column, p lattice paths, alpha).
        lm: the n-gram model (token-id words), or None: candidates ranked by the heads and the
            decoded text's cache alone, no n-gram feature.
        costs: the target's measured step costs.
        acceptance: the acceptance model to start the first source from (copied: the heads'
            when they are read, else the text's); default the one shipped for the heads
            (``heads_fingerprint``), else :meth:`AcceptanceModel.prior` trusting the source.
        max_nodes: the largest tree considered.
        vocab_size: the target's vocabulary (the cache model's uniform fallback without ``lm``).
        reads_heads: the heads' lattice is there to read (heads were given, or a replay's trace
            holds their lattices); otherwise the text alone drafts.
        heads_fingerprint: the heads' :func:`~latticekit.heads.heads_fingerprint`, to start from
            the acceptance model shipped for them.
        memory: earlier answers to draft from beside the text (an
            :class:`~latticekit.drafting.memory.AnswerMemory`, read wherever the text is), or None.
    """

    method = "auto"
    default_k = 16
    default_p = 16
    knobs = frozenset({"k", "p", "alpha", "lm"})
    needs_heads = False  # without heads it drafts from the text (see the module docstring)
    needs_costs = True

    def __init__(self, config: DecoderConfig, lm: Optional[NGramLM], costs: StepCosts,
                 acceptance: Optional[AcceptanceModel] = None, max_nodes: int = 64,
                 vocab_size: Optional[int] = None, reads_heads: bool = False,
                 heads_fingerprint: Optional[str] = None, memory: Optional[AnswerMemory] = None) -> None:
        super().__init__(config)
        self.memory = memory
        self.lm = lm
        self.search_lm = lm if lm is not None else uniform_lm()
        self.alpha = config.alpha if lm is not None else 0.0
        self.costs = costs
        self.vocab_size = vocab_size
        self.given_acceptance = acceptance
        self._acceptance: Optional[SourceAcceptance] = None
        self._cache_model: Optional[CacheModel] = None
        self.reads_heads = self.reads_lattice = reads_heads
        self.heads_fingerprint = heads_fingerprint
        self.max_nodes = int(max_nodes)
        self.pending = PendingLabels()
        self.arms = self.arms_for(reads_heads)
        self.arm_stats = {arm: ArmStats() for arm in self.arms}
        read = {"heads", "text"} if "union" in self.arms else set()
        read |= set(self.arms) - {"union"}
        if "text" in read and memory is not None:
            read.add("memory")  # read with the text
        #: the candidate sources its arms read (keys of :data:`SOURCES`)
        self.sources = tuple(name for name in SOURCES if name in read)
        self.steps = 0
        self._outcome: Optional[tuple[str, float]] = None  # (arm, seconds it cost), until observed
        self._text_alone: Optional[tuple[Continuations, np.ndarray, float]] = None  # a union step's text
        self.unread: list[_Unread] = []  # trees of the text alone on union steps, until the text decides them
        self.paired = _Paired()  # the union against the text alone, on the union's steps

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
                   reads_heads=cls.drafts_from_heads(resources), heads_fingerprint=resources.heads_fingerprint,
                   memory=resources.memory)

    @classmethod
    def drafts_from_heads(cls, resources: DraftResources) -> bool:
        """Whether its candidates may come from the heads' lattice: the loop has heads."""
        return resources.has_heads

    @classmethod
    def arms_for(cls, reads_heads: bool) -> tuple[str, ...]:
        """The ways of drafting it chooses among (see the module docstring): with heads the
        union of heads and text, and the text alone; without, the text alone."""
        return ("union", "text") if reads_heads else ("text",)

    @property
    def text_candidates(self) -> int:
        """Continuations of the text searched per step (``headsfree``'s default; ``p`` counts
        the lattice's paths)."""
        return _TEXT_CANDIDATES

    def lattice_vocabulary(self) -> Optional[np.ndarray]:
        """The n-gram model's :data:`CANDIDATE_TOKENS` most probable tokens, when it has one over
        token ids: the heads' lattice need not project the rest of the vocabulary."""
        if self.lm is None:
            return None
        static = lm_candidates(self.lm, CANDIDATE_TOKENS)
        return static if len(static) else None

    @property
    def acceptance(self) -> SourceAcceptance:
        """The online acceptance estimates, one model per source: the heads' starts from the
        model given, else the one shipped for them, else the prior taking the heads at their
        word; the text's from the model given when the heads are not read, else the prior
        taking the cache model at its word."""
        if self._acceptance is None:
            first = "heads" if "heads" in self.sources else "text"
            given = self.given_acceptance
            if given is None and first == "heads" and self.heads_fingerprint is not None:
                given = shipped_acceptance(self.heads_fingerprint)
            depth = given.max_depth if given is not None else AcceptanceModel.prior().max_depth
            models = {}
            for name in self.sources:
                base = given if name == first and given is not None else \
                    AcceptanceModel.prior(depth, trust="head" if name == "heads" else "cache")  # memory: its cache
                models[name] = AcceptanceModel(base.weights, base.learning_rate)
            self._acceptance = SourceAcceptance(models)
        return self._acceptance

    def cache_model(self, ids: Sequence[int]) -> CacheModel:
        """The n-gram cache model (:mod:`latticekit.drafting.cache_model`), synced to ``ids``."""
        if self._cache_model is None:
            vocab = self.vocab_size if self.vocab_size is not None else max(ids) + 1
            self._cache_model = CacheModel(self.lm, vocab)
        self._cache_model.sync(ids)
        return self._cache_model

    # -- candidates, per arm ------------------------------------------------------------------

    def candidates(self, step: DraftInput, arm: Optional[str] = None) -> CandidateTree:
        """The candidate trie of an arm (default its first): ``heads`` the p best lattice paths,
        ``text`` the text's continuations, ``union`` both."""
        arm = self.arms[0] if arm is None else arm
        if arm == "heads":
            return self.lattice_candidates(step)
        if arm == "union":
            return self.union_candidates(step)
        return self.ngram_candidates(step)

    def lattice_candidates(self, step: DraftInput) -> CandidateTree:
        """The trie of the p best lattice paths, with each node's head and n-gram log-probabilities."""
        lattice = step.lattice
        p = cast(int, self.config.p)  # set by DecoderConfig.__post_init__
        paths = pbest(lattice, self.search_lm, p, self.alpha,
                      context=step.context(self.search_lm.order))
        drafts = [path.tokens[1:] for path in paths]
        head = [lattice.arc_scores(np.arange(1, 1 + len(draft)), draft) for draft in drafts]
        ngram = None
        if self.lm is not None:
            context = step.context(self.lm.order)
            ngram = [self.lm.token_logprobs(path.tokens, context=context)[1:] for path in paths]
        return CandidateTree.from_paths(drafts, head, ngram, path_sources=[SOURCES["heads"]] * len(drafts))

    def ngram_candidates(self, step: DraftInput) -> CandidateTree:
        """The most probable continuations of the decoded text under the cache model
        (:func:`~latticekit.drafting.continuations.best_continuations`), with each node's n-gram and
        cache log-probabilities."""
        found, sources = self.text_continuations(step)
        return found.tree(sources=sources)

    def text_continuations(self, step: DraftInput) -> tuple[Continuations, np.ndarray]:
        """The text's most probable continuations under the cache model, with the memory's of
        earlier answers (:func:`~latticekit.drafting.memory.memory_continuations`) where there
        is one, in one tree (a node both hold takes the larger conditional), and each node's
        sources."""
        found = best_continuations(self.cache_model(step.ids), step.ids, self.text_candidates, MAX_NGRAM_DEPTH)
        text = np.full(found.size, SOURCES["text"], dtype=np.int64)
        if self.memory is None:
            return found, text
        recalled = memory_continuations(self.memory, step.ids, self.text_candidates, MAX_NGRAM_DEPTH)
        if not recalled.size:
            return found, text
        return united_with_memory(found, recalled)

    def union_candidates(self, step: DraftInput) -> CandidateTree:
        """The text's continuations and the p best paths of the heads' lattice, its columns
        united with the continuations' tokens (scored by the heads like their own arcs), in one
        trie (:func:`~latticekit.drafting.union.united_candidates`)."""
        p = cast(int, self.config.p)  # set by DecoderConfig.__post_init__
        t0 = time.perf_counter()
        found, sources = self.text_continuations(step)
        if "text" in self.arms:  # what the text alone would have drafted, weighed once verified
            self._text_alone = (found, sources, time.perf_counter() - t0)
        columns: list[list[int]] = [[] for _ in range(MAX_NGRAM_DEPTH)]
        for path in found.paths():
            columns[len(path) - 1].append(path[-1])
        lattice = step.united_lattice(columns)
        return united_candidates(self.cache_model(step.ids), step.ids, found, lattice, self.search_lm, p, self.alpha,
                                 self.lm, found_sources=sources.tolist())

    # -- one step --------------------------------------------------------------------------

    def choose_arm(self, plain_s: float) -> Optional[str]:
        """This step's arm, or None for a plain step (see the module docstring)."""
        return choose_arm(self.arms, self.arm_stats, self.worth, self.steps, 1.0 / plain_s)

    def worth(self, arm: str) -> float:
        """An arm's tokens per second. The union's, where it was weighed against the text alone
        on the same positions: the text's own rate times the union's advantage there (paired
        positions cancel what the text happened to hold: a copy is easy for both)."""
        if arm == "union" and self.paired.seconds > 0:
            return self.arm_stats["text"].rate * self.paired.advantage
        return self.arm_stats[arm].rate

    def draft(self, step: DraftInput) -> Draft:
        if self._cache_model is None and "text" in self.sources:
            # the first sync reads the whole prompt once: not a per-step cost of drafting
            self.cache_model(step.ids)
        t0 = time.perf_counter()
        self.steps += 1
        cached = step.root_index
        arm = self.choose_arm(self.costs.target_s(0, cached))
        if arm is None:
            return Draft.none()
        tree = self.candidates(step, arm)
        estimates = self.acceptance
        # the features (their last column the node's sources) and each node's probability, in the core
        features, probability, _ = tree_chain(tree, estimates)
        chosen, _, target_s = choose_nodes(probability, tree.depths, self.costs, cached, self.max_nodes)
        self.pending.add(step.root_index, tree, features)
        if self._text_alone is not None:
            self._weigh_text_alone(step, estimates)
        heads_s = step.lattice_s if self.costs.heads_s is None or not step.has_lattice else self.costs.heads_s
        search_s = self.costs.draft_s if self.costs.draft_s is not None else time.perf_counter() - t0 - step.lattice_s
        drafting_s = search_s + heads_s
        self._outcome = (arm, target_s + drafting_s)  # what the arm was worth is known once verified
        return _draft_of(tree, chosen)

    def _weigh_text_alone(self, step: DraftInput, estimates: SourceAcceptance) -> None:
        """The tree the text alone would have verified at this union step (its candidates are
        the union's own), kept until the text says how many of its tokens it would have accepted."""
        assert self._text_alone is not None
        found, sources, search_s = self._text_alone
        self._text_alone = None
        tree = found.tree(sources=sources)
        _, probability, _ = tree_chain(tree, estimates)
        chosen, _, target_s = choose_nodes(probability, tree.depths, self.costs, step.root_index, self.max_nodes)
        drafting_s = self.costs.draft_s if self.costs.draft_s is not None else search_s
        self.unread.append(_Unread(step.root_index, _draft_of(tree, chosen), target_s + drafting_s))

    def observe(self, step: DraftInput, draft: Draft, emitted: Sequence[int]) -> None:
        labelled, labels = self.pending.resolve(step.ids, emitted)
        if len(labels):
            self.acceptance.update(labelled[:, :-1], labels, labelled[:, -1].astype(np.int64))
        plain_s = self.costs.target_s(0, step.root_index)
        if self._outcome is not None:
            arm, seconds = self._outcome
            self._outcome = None
            if self.unread and self.unread[-1].root_index == step.root_index:
                self.unread[-1].union = (len(emitted), seconds)  # weighed once the text alone's is known
            else:
                self.record(arm, len(emitted), seconds, plain_s)
        if self.unread:  # the text alone, weighed on the union's steps: the same positions, paired
            still = []
            for tree in self.unread:
                accepted, decided = tree.draft.accepted(step.ids, tree.root_index + 1, emitted)
                if not decided:
                    still.append(tree)
                    continue
                self.arm_stats["text"].add(accepted + 1, tree.seconds, self.steps)
                self.paired.add(tree.union[0], tree.union[1], accepted + 1, tree.seconds)
                self.record("union", tree.union[0], tree.union[1], plain_s)
            self.unread = still

    def arm_outcomes(self) -> ArmOutcomes:
        """The arm choice's state (:mod:`latticekit.drafting.outcomes`), for the next call to
        start from (:meth:`resume`)."""
        arms = {name: s.record(self.steps) for name, s in self.arm_stats.items()}
        p = self.paired
        return ArmOutcomes(arms, (p.union_tokens, p.union_seconds, p.tokens, p.seconds))

    def resume(self, kept: ArmOutcomes, gap: int = KEPT_GAP) -> None:
        """Starts the arm choice from an earlier call's :meth:`arm_outcomes`, as one long call
        would go on (a call that stopped ``since`` steps after reading an arm is that many steps
        before this one's first: the same probe schedule), with the kept sums aged by ``gap``
        steps (:meth:`age`): they skip the warm-up but weigh little against this call's own
        outcomes, so in a call unlike the last ones (another domain, another kind of request)
        an arm's next outcome outweighs them. ``gap=0``: exactly one long call. Outcomes of
        other arms are ignored."""
        if set(kept.arms) != set(self.arms) or self.steps:
            return
        self.arm_stats.update({name: ArmStats.from_record(r, 0) for name, r in kept.arms.items()})
        p = self.paired
        p.union_tokens, p.union_seconds, p.tokens, p.seconds = kept.paired
        self.age(gap)

    def age(self, steps: int) -> None:
        """Every outcome sum decayed as over ``steps`` more steps (each arm's,
        :meth:`ArmStats.age`) and pairs (the union's against the text alone): what the arms are
        worth is unchanged, but the next outcomes weigh more against it. The probe schedule is
        left as it was."""
        for stats in self.arm_stats.values():
            stats.age(steps)
        self.paired.age(steps)

    def record(self, arm: str, tokens: int, seconds: float, plain_s: float) -> None:
        """What a step of ``arm`` brought: ``tokens`` emitted for ``seconds`` (its tree's target
        seconds and its drafting's); ``plain_s``: a plain step's seconds at that point. A probe
        that wins is read again soon; one that loses, half as often as before."""
        stats = self.arm_stats[arm]
        stats.add(tokens, seconds, self.steps)
        if stats.probing:
            others = [self.worth(a) for a in self.arms if a != arm]
            probe_outcome(stats, self.worth(arm) > max(others + [1.0 / plain_s]))


class _Unread:
    """The tree the text alone would have verified at a union step, until the text decides how
    many of its tokens greedy verification would have accepted (the decode's tokens do not
    depend on the drafts)."""

    __slots__ = ("root_index", "draft", "seconds", "union")

    def __init__(self, root_index: int, draft: Draft, seconds: float) -> None:
        self.root_index, self.draft, self.seconds = root_index, draft, seconds
        self.union = (0, 0.0)  # what the union's tree brought at this step: tokens, seconds


def _draft_of(tree: CandidateTree, chosen: np.ndarray) -> Draft:
    """The chosen nodes of a candidate tree as a draft (most probable first, so parents precede
    children)."""
    position = np.full(tree.size, -1, dtype=np.int64)
    position[chosen] = np.arange(len(chosen))
    parents = tree.parents[chosen]
    return Draft(tree.tokens[chosen], np.where(parents >= 0, position[np.maximum(parents, 0)], -1))


class _Paired:
    """The union's and the text alone's tokens and seconds on the same steps (the union's),
    decayed by :data:`~latticekit.drafting.arms.ARM_DECAY` per pair (a memory of ~10 pairs)."""

    __slots__ = ("union_tokens", "union_seconds", "tokens", "seconds")

    def __init__(self) -> None:
        self.union_tokens = self.union_seconds = self.tokens = self.seconds = 0.0

    @property
    def advantage(self) -> float:
        """The union's tokens per second over the text alone's, on the same steps."""
        return (self.union_tokens / self.union_seconds) / (self.tokens / self.seconds)

    def add(self, union_tokens: int, union_seconds: float, tokens: int, seconds: float) -> None:
        self.union_tokens = ARM_DECAY * self.union_tokens + union_tokens
        self.union_seconds = ARM_DECAY * self.union_seconds + union_seconds
        self.tokens = ARM_DECAY * self.tokens + tokens
        self.seconds = ARM_DECAY * self.seconds + seconds

    def age(self, steps: int) -> None:
        """The sums decayed as over ``steps`` more pairs (none for ``steps <= 0``)."""
        decay = ARM_DECAY ** max(steps, 0)
        self.union_tokens, self.union_seconds = decay * self.union_tokens, decay * self.union_seconds
        self.tokens, self.seconds = decay * self.tokens, decay * self.seconds


