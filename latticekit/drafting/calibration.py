"""Acceptance estimates: the probability that a draft-tree node is accepted, learnt online.

A node v (a token at depth j of a candidate path) is accepted when its parent is and v's token
is the target's next token there. :class:`AcceptanceModel` estimates that conditional
probability with a logistic model of the node's features (:func:`node_features`):

* the head's own log-probability of the token (the lattice arc's score), as a logit;
* the n-gram model's conditional log-probability of the token after the decoded text and the
  path before it, as a logit (0 without a model);
* the cache model's conditional log-probability (the decoded text's own n-grams interpolated
  with the n-gram model, :class:`~latticekit.drafting.cache_model.CacheModel`), as a logit (0 where
  no cache model drafted: ``auto`` with heads alone);
* the depth (one intercept per depth: heads further out know less).

A feature a tree lacks (no heads: the heads-free drafter) is 0, so it adds nothing.

A node's acceptance probability is the product of the conditionals along its path. The model
starts from weights fitted offline for the heads at hand where latticekit ships them
(:func:`shipped_acceptance`, fitted by ``benchmarks/tune_auto.py`` with :meth:`AcceptanceModel.fit`),
else from a prior that takes the drafter at its word (``AcceptanceModel.prior``: P = q, q the
head's or the cache model's probability), and takes one gradient step per labelled node as the
decode goes: every candidate node, verified or not, is labelled as soon as the decoded text
reaches its depth (:class:`PendingLabels`), so heads that do not know a domain are noticed
within a few steps, even while nothing is verified.

Plain numpy; nothing here imports torch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np

from latticekit import _core
from latticekit._files import atomic_write
from latticekit.drafting.tree import trie
from latticekit.errors import DecoderConfigError

__all__ = ["AcceptanceModel", "CandidateTree", "PendingLabels", "SourceAcceptance", "FEATURES", "SOURCES",
           "node_features", "logit", "shipped_acceptance", "tree_chain", "estimate_weights"]

#: One path's per-token values: a sequence of floats or a float array.
_Floats = Union[Sequence[float], np.ndarray]
_CLIP = 8.0  # logits are clipped to [-8, 8] (probabilities 3e-4 .. 0.9997)
_SCALE = 4.0  # features enter the model divided by this, so one learning rate suits them all

#: The candidate sources, as the bits of :attr:`CandidateTree.sources`: the heads' lattice, the
#: text's own continuations (prompt and output), the store of earlier answers.
SOURCES = {"heads": 1, "text": 2, "memory": 4}


def logit(logprob: np.ndarray) -> np.ndarray:
    """``log(q / (1 - q))`` of log-probabilities, clipped to [-8, 8]."""
    lp = np.minimum(np.asarray(logprob, dtype=np.float64), -1e-12)
    out: np.ndarray = np.maximum(np.minimum(lp - np.log(-np.expm1(lp)), _CLIP), -_CLIP)
    return out


@dataclass
class CandidateTree:
    """A trie of candidate draft tokens below a root, with each node's features.

    Attributes:
        tokens (`(n,)` int64): token per node.
        parents (`(n,)` int64): parent node, -1 under the root; ``parents[i] < i``.
        depths (`(n,)` int64): 1 for the root's children.
        head_logprob (`(n,)` float64): the head's log-probability of the node's token.
        ngram_logprob (`(n,)` float64): the n-gram model's conditional log-probability, or NaN
            without a model.
        cache_logprob (`(n,)` float64): the cache model's conditional log-probability, or NaN
            (None: NaN everywhere).
        sources (`(n,)` int64): the sources whose candidates hold the node, as bits of
            :data:`SOURCES` (None: 0 everywhere, no source named).
    """

    tokens: np.ndarray
    parents: np.ndarray
    depths: np.ndarray
    head_logprob: np.ndarray
    ngram_logprob: np.ndarray
    cache_logprob: Optional[np.ndarray] = None
    sources: Optional[np.ndarray] = None

    def __post_init__(self) -> None:
        if self.cache_logprob is None:
            self.cache_logprob = np.full(self.tokens.shape[0], np.nan)
        if self.sources is None:
            self.sources = np.zeros(self.tokens.shape[0], dtype=np.int64)

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])

    @classmethod
    def from_paths(cls, paths: Sequence[Sequence[int]], head_logprobs: Sequence[_Floats],
                   ngram_logprobs: Optional[Sequence[_Floats]] = None,
                   cache_logprobs: Optional[Sequence[_Floats]] = None,
                   path_sources: Optional[Sequence[int]] = None) -> "CandidateTree":
        """Merges candidate paths (token sequences after the root, best first) into a trie;
        each path's per-token features come along (equal prefixes have equal features), and a
        node's sources are those of every path through it (``path_sources``: bits of
        :data:`SOURCES` per path)."""
        tokens, parents, first = trie(paths)
        depths = [j + 1 for _, j in first]
        head = [float(head_logprobs[p][j]) for p, j in first]
        ngram = [float(ngram_logprobs[p][j]) if ngram_logprobs is not None else np.nan for p, j in first]
        cache = [float(cache_logprobs[p][j]) if cache_logprobs is not None else np.nan for p, j in first]
        sources = np.zeros(len(tokens), dtype=np.int64)
        if path_sources is not None:
            node_of = {(parent, token): i for i, (token, parent) in enumerate(zip(tokens, parents))}
            for path, bits in zip(paths, path_sources):
                node = -1
                for token in path:
                    node = node_of[(node, int(token))]
                    sources[node] |= int(bits)
        return cls(np.asarray(tokens, dtype=np.int64), np.asarray(parents, dtype=np.int64),
                   np.asarray(depths, dtype=np.int64), np.asarray(head, dtype=np.float64),
                   np.asarray(ngram, dtype=np.float64), np.asarray(cache, dtype=np.float64), sources)

    def path_probability(self, conditional: np.ndarray) -> np.ndarray:
        """P(node accepted): the product of the conditionals from the root down to it."""
        out: list[float] = []
        for p, parent in zip(np.asarray(conditional, dtype=np.float64).tolist(), self.parents.tolist()):
            out.append(p * out[parent] if parent >= 0 else p)
        return np.array(out, dtype=np.float64)

    def best_chain(self, probability: np.ndarray) -> list[int]:
        """The chain from the root that follows, at every node, its most probable child (the
        first of equals): the nodes, top down."""
        best: dict[int, int] = {}
        values = probability.tolist()
        for i, parent in enumerate(self.parents.tolist()):
            j = best.get(parent)
            if j is None or values[i] > values[j]:
                best[parent] = i
        chain: list[int] = []
        node = best.get(-1)
        while node is not None:
            chain.append(node)
            node = best.get(node)
        return chain

    def paths_to(self, nodes: Sequence[int]) -> list[tuple[int, ...]]:
        """The token paths from the root to each of ``nodes``."""
        out = []
        for node in nodes:
            path = []
            while node >= 0:
                path.append(int(self.tokens[node]))
                node = int(self.parents[node])
            out.append(tuple(reversed(path)))
        return out


#: The log-probability features after the depth one-hot, in this order.
FEATURES = ("head", "ngram", "cache")


def node_features(tree: CandidateTree, max_depth: int) -> np.ndarray:
    """The logistic model's inputs, `(n, max_depth + 3)`: a one-hot depth (depths beyond
    ``max_depth`` share the last), the head, n-gram and cache logits (0 where NaN), scaled."""
    n = tree.size
    x = np.zeros((n, max_depth + len(FEATURES)))
    x[np.arange(n), np.minimum(tree.depths, max_depth) - 1] = 1.0
    assert tree.cache_logprob is not None  # set by CandidateTree.__post_init__
    values = np.empty((n, len(FEATURES)))
    values[:, 0], values[:, 1], values[:, 2] = tree.head_logprob, tree.ngram_logprob, tree.cache_logprob
    missing = np.isnan(values)
    x[:, max_depth:] = np.where(missing, 0.0, logit(np.where(missing, -1.0, values))) / _SCALE
    return x


class AcceptanceModel:
    """P(node accepted | parent accepted) = sigmoid(w . features), updated online by SGD.

    Args:
        weights: `(max_depth + 3,)`: depth intercepts, the head, n-gram and cache logits'
            weights (on features scaled by 1/4).
        learning_rate: step size of the online updates (0 freezes the model).
    """

    def __init__(self, weights: np.ndarray, learning_rate: float = 0.15) -> None:
        weights = np.asarray(weights, dtype=np.float64)
        if weights.ndim != 1 or weights.shape[0] < 1 + len(FEATURES) or not np.all(np.isfinite(weights)):
            raise DecoderConfigError(f"acceptance weights must be a finite vector of >= {1 + len(FEATURES)} "
                                     f"values, got {weights!r}")
        if not np.isfinite(learning_rate) or learning_rate < 0:
            raise DecoderConfigError(f"learning_rate must be finite and >= 0, got {learning_rate!r}")
        self.weights = weights.copy()
        self.learning_rate = float(learning_rate)
        self.updates = 0

    @property
    def max_depth(self) -> int:
        return int(self.weights.shape[0]) - len(FEATURES)

    @classmethod
    def prior(cls, max_depth: int = 7, learning_rate: float = 0.15, trust: str = "head") -> "AcceptanceModel":
        """One source taken at its word (P = its probability), the others ignored, until the
        decode's own outcomes say otherwise: ``trust`` is ``"head"`` (the heads), ``"cache"``
        (the cache model: heads-free drafting) or ``"head+cache"`` (the mean of their logits)."""
        names = trust.split("+")
        if not names or any(name not in FEATURES for name in names):
            raise DecoderConfigError(f"trust must name features of {FEATURES} joined by '+', got {trust!r}")
        weights = np.zeros(max_depth + len(FEATURES))
        for name in names:
            weights[max_depth + FEATURES.index(name)] = _SCALE / len(names)
        return cls(weights, learning_rate)

    def conditional(self, features: np.ndarray) -> np.ndarray:
        """P(accepted | parent accepted) per row of :func:`node_features`."""
        out: np.ndarray = 1.0 / (1.0 + np.exp(-(features @ self.weights)))
        return out

    def update(self, features: np.ndarray, labels: np.ndarray) -> None:
        """One SGD step of the logistic loss per labelled node (in order), in the C++ core.

        Raises:
            DecoderConfigError: features that are not one row of the model's width per label.
        """
        rate = self.learning_rate
        if rate == 0 or len(labels) == 0:
            return
        x = np.ascontiguousarray(features, dtype=np.float64)
        y = np.ascontiguousarray(labels, dtype=np.float64).reshape(-1)
        if x.shape != (y.shape[0], self.weights.shape[0]):
            raise DecoderConfigError(f"features of shape {x.shape} for {y.shape[0]} labels and "
                                     f"{self.weights.shape[0]} weights")
        _core.logistic_sgd(x, y, rate, self.weights)
        self.updates += len(labels)

    @classmethod
    def fit(cls, features: np.ndarray, labels: np.ndarray, max_depth: int, l2: float = 1e-3,
            iterations: int = 200) -> "AcceptanceModel":
        """Weights fitted offline (Newton's method on the L2-regularised logistic loss), e.g. on
        the nodes of replayed decodes of tuning prompts."""
        x = np.asarray(features, dtype=np.float64)
        y = np.asarray(labels, dtype=np.float64)
        w = cls.prior(max_depth).weights
        for _ in range(iterations):
            p = 1.0 / (1.0 + np.exp(-(x @ w)))
            grad = x.T @ (p - y) / len(y) + l2 * w
            hess = (x * (p * (1 - p))[:, None]).T @ x / len(y) + l2 * np.eye(len(w))
            step = np.linalg.solve(hess, grad)
            w -= step
            if np.abs(step).max() < 1e-8:
                break
        return cls(w)

    def save(self, path: Any, description: Optional[dict[str, Any]] = None) -> None:
        """Writes the weights as JSON (atomically)."""
        data = {"format": "latticekit-acceptance", "version": 2, "weights": self.weights.tolist(),
                "learning_rate": self.learning_rate, "description": description or {}}
        with atomic_write(path) as f:
            f.write((json.dumps(data, indent=1) + "\n").encode())

    @classmethod
    def load(cls, path: Any) -> "AcceptanceModel":
        """Reads :meth:`save`'s file.

        Raises:
            DecoderConfigError: the file is missing, damaged or not an acceptance model.
        """
        try:
            data = json.loads(Path(path).read_text())
            if data.get("format") != "latticekit-acceptance" or data.get("version") not in (1, 2):
                raise ValueError("not a latticekit acceptance model (format/version)")
            weights = np.asarray(data["weights"], dtype=np.float64)
            if data["version"] == 1:  # before the cache feature: it weighs nothing
                weights = np.append(weights, 0.0)
            return cls(weights, float(data["learning_rate"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise DecoderConfigError(f"{path} is not a readable acceptance model: {exc}") from exc


class SourceAcceptance:
    """Acceptance estimates calibrated per candidate source: one :class:`AcceptanceModel` per
    source, each learnt online from the nodes its source proposed.

    Sources differ in how far their probabilities can be trusted (heads sure of the wrong
    position, a copy that the text abandons), and one model over all of them learns an average
    that suits none. A node proposed by several sources takes the most confident of their
    estimates: each source's estimate is calibrated on its own proposals, so a node one source
    knows well is not pulled down by another that does not. A node with no source named
    (``sources == 0``) counts as every source's.

    Args:
        models: source name (a key of :data:`SOURCES`) -> its model; all of one width.
    """

    def __init__(self, models: "dict[str, AcceptanceModel]") -> None:
        if not models or any(name not in SOURCES for name in models):
            raise DecoderConfigError(f"acceptance models must be keyed by sources of {tuple(SOURCES)}, "
                                     f"got {sorted(models)}")
        if len({model.weights.shape[0] for model in models.values()}) != 1:
            raise DecoderConfigError("the sources' acceptance models must have one width (max_depth)")
        self.models = dict(models)
        self._models = list(self.models.values())
        self._bits = np.array([SOURCES[name] for name in self.models], dtype=np.int64)

    @classmethod
    def prior(cls, sources: Sequence[str], trust: str = "cache") -> "SourceAcceptance":
        """One :meth:`AcceptanceModel.prior` per source, each taking ``trust`` at its word until
        its own nodes' outcomes say otherwise.

        Raises:
            DecoderConfigError: no source, a source not in :data:`SOURCES` or a bad ``trust``.
        """
        return cls({name: AcceptanceModel.prior(trust=trust) for name in sources})

    @property
    def max_depth(self) -> int:
        return next(iter(self.models.values())).max_depth

    def _members(self, sources: np.ndarray) -> np.ndarray:
        """Per node and model, whether the model is one of the node's sources', `(nodes, models)`."""
        sources = np.asarray(sources, dtype=np.int64)[:, None]
        member: np.ndarray = (sources & self._bits) != 0
        member |= sources == 0
        return member

    def conditional(self, features: np.ndarray, sources: np.ndarray) -> np.ndarray:
        """P(accepted | parent accepted) per row of :func:`node_features`: the largest estimate
        among the models of the node's sources."""
        member = self._members(sources)
        weights = np.column_stack([model.weights for model in self._models])
        estimates = 1.0 / (1.0 + np.exp(-(features @ weights)))  # every model's, as AcceptanceModel.conditional
        out: np.ndarray = np.where(member, estimates, 0.0).max(axis=1, initial=0.0)
        return out

    def update(self, features: np.ndarray, labels: np.ndarray, sources: np.ndarray) -> None:
        """Teaches each source's model the labelled nodes it proposed: one
        :meth:`AcceptanceModel.update` per model on its nodes, in the C++ core in one call.

        Raises:
            DecoderConfigError: features that are not one row of the models' width per label
                and source.
        """
        if len(labels) == 0:
            return
        x = np.ascontiguousarray(features, dtype=np.float64)
        y = np.ascontiguousarray(labels, dtype=np.float64).reshape(-1)
        bits = np.ascontiguousarray(sources, dtype=np.int64).reshape(-1)
        width = self._models[0].weights.shape[0]
        if x.shape != (y.shape[0], width) or bits.shape[0] != y.shape[0]:
            raise DecoderConfigError(f"features of shape {x.shape} for {y.shape[0]} labels, {bits.shape[0]} "
                                     f"sources and {width} weights")
        rates = np.array([model.learning_rate for model in self._models])
        counts = _core.source_sgd(x, y, bits, self._bits, rates, [model.weights for model in self._models])
        for model, count in zip(self._models, counts.tolist()):
            if model.learning_rate:
                model.updates += count


def tree_chain(tree: CandidateTree, acceptance: Union[AcceptanceModel, SourceAcceptance]
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A tree's acceptance estimates and best chain in one pass, in the C++ core (``TreeChain``,
    ``csrc/latticekit/acceptance.h``): what :func:`node_features`, the estimates'
    ``conditional``, :meth:`CandidateTree.path_probability` and :meth:`CandidateTree.best_chain`
    give one after the other (``tests/drafting/test_tree_chain.py`` checks it against them).

    Returns:
        The features, `(n, max_depth + 4)`: :func:`node_features`' columns, then the node's
        sources (what :class:`SourceAcceptance` learns from); each node's probability of
        being accepted; and the best chain's nodes, top down.
    """
    assert tree.cache_logprob is not None and tree.sources is not None  # set by CandidateTree.__post_init__
    weights, bits = estimate_weights(acceptance)
    features, probability, chain = _core.tree_chain(
        tree.parents, tree.depths, tree.head_logprob, tree.ngram_logprob, tree.cache_logprob, tree.sources,
        weights, bits, acceptance.max_depth)
    return features, probability, chain


def estimate_weights(acceptance: Union[AcceptanceModel, SourceAcceptance]) -> tuple[np.ndarray, np.ndarray]:
    """The estimates as the core reads them: each model's weights, one row per model, and the
    source bits each answers for (one model: every source's)."""
    if isinstance(acceptance, SourceAcceptance):
        return np.array([m.weights for m in acceptance._models]), acceptance._bits
    return acceptance.weights[None, :], _EVERY_SOURCE


_EVERY_SOURCE = np.array([-1], dtype=np.int64)


SHIPPED = Path(__file__).resolve().parents[1] / "data" / "acceptance"


def shipped_acceptance(heads_fingerprint: str) -> Optional[AcceptanceModel]:
    """The acceptance model fitted for the heads of this fingerprint
    (:func:`latticekit.heads.heads_fingerprint`) that ships with latticekit
    (``latticekit/data/acceptance/*.json``), or None.

    ``benchmarks/tune_auto.py`` fits them on replayed decodes of tuning prompts.
    """
    fingerprint = heads_fingerprint
    for path in sorted(SHIPPED.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if data.get("description", {}).get("heads_fingerprint") == fingerprint:
            return AcceptanceModel.load(path)
    return None


class PendingLabels:
    """Candidate trees waiting for the decoded text to reach their nodes.

    A node at depth j below a root at position r is labelled once the text holds position
    r + j and its ancestors match the text: 1 if its token is the token there, 0 if not.
    Nodes below a mismatch carry no information about their own conditional and are dropped.
    So the labelled nodes of a tree are the children of the path the text takes through it,
    which :meth:`resolve` walks from the root (at most as deep as the tree): a step costs the
    trees still open, never the text's length. In the C++ core (``PendingLabels``,
    ``csrc/latticekit/acceptance.h``); ``tests/drafting/test_drafting_reference.py`` checks it
    against a reference that labels every node afresh.
    """

    def __init__(self) -> None:
        #: the trees in the core, which a chain drafter's step adds to in the same call that
        #: builds them (:meth:`~latticekit.drafting.chains.ChainDrafter.propose`)
        self.core = _core.CorePendingLabels()

    def __len__(self) -> int:
        """The trees still waiting."""
        return len(self.core)

    def add(self, root_index: int, tree: CandidateTree, features: np.ndarray) -> None:
        """The tree below text position ``root_index``, each node's features a row of ``features``.

        Raises:
            DecoderConfigError: a root before the text's start, a parent that is not an earlier
                node, or features not one row per node of the width of the trees waiting.
        """
        if not tree.size:
            return
        try:
            self.core.add(int(root_index), np.ascontiguousarray(tree.tokens, dtype=np.int64),
                          np.ascontiguousarray(tree.parents, dtype=np.int64),
                          np.ascontiguousarray(features, dtype=np.float64))
        except ValueError as exc:
            raise DecoderConfigError(str(exc)) from exc

    def resolve(self, ids: Sequence[int], more: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray]:
        """Labels every node the text ``ids`` (prompt included), followed by ``more``, now
        decides; returns their features and labels (tree by tree, nodes in order), and forgets
        trees with nothing left to learn. Only the text's tokens from the earliest tree's root
        on are read."""
        earliest = self.core.earliest
        if earliest < 0:
            return np.zeros((0, 0)), np.zeros(0)
        first = min(earliest, len(ids))
        text = np.asarray(ids[first:], dtype=np.int64)
        if len(more):
            text = np.concatenate([text, np.asarray(more, dtype=np.int64)])
        return self.core.resolve(text, first)
