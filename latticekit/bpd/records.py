"""Decoder configurations and what a decode leaves behind: per-step records.

Plain data (numpy and tuples, no torch), so the analyses in :mod:`latticekit.bpd.analysis`
run on saved records without torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Optional

import numpy as np


__all__ = ["METHODS", "DecoderConfig", "StepRecord", "Decoding"]

#: ``"greedy"``: the target alone, one token per call (the baseline). ``"vanilla"``: Stern et
#: al.'s Algorithm 1, arg-max of each head. ``"ngram"``: p best lattice paths under
#: ``draft + alpha * n-gram``. ``"neural"``: local rescoring (the reference paper's Algorithm 2),
#: each head's top-k re-ranked by ``draft + alpha * neural rescorer`` left to right.
#: ``"oracle"``: the lattice path with the longest accepted prefix. ``"auto"``: per step, the
#: draft tree (from none to a wide tree of the p best paths) with the most expected tokens per
#: second under the device's measured step costs and online acceptance estimates.
#: ``"headsfree"``: auto's chooser over the p most probable continuations of the decoded text
#: under the n-gram models alone (its own n-gram cache and the static model), no heads.
#: ``"heads+ngram"``: auto with the heads' lattice columns united with those continuations.
METHODS = ("greedy", "vanilla", "ngram", "neural", "oracle", "auto", "headsfree", "heads+ngram")
#: k and p when a config leaves them out: auto picks among more candidates than it verifies.
_DEFAULT_KP = {"auto": (16, 16), "headsfree": (1, 32), "heads+ngram": (16, 16)}
#: The cost-aware methods (auto's chooser): p candidates, alpha weighs the n-gram model.
_CHOOSERS = ("auto", "headsfree", "heads+ngram")


from latticekit.errors import DecoderConfigError
@dataclass(frozen=True)
class DecoderConfig:
    """One decoder: a method and its knobs.

    Attributes:
        method: one of :data:`METHODS`.
        k: arcs per lattice position (``ngram``, ``neural``, ``oracle``, ``auto``,
            ``heads+ngram``; ``vanilla`` only records them). Default 1; 16 for ``auto`` and
            ``heads+ngram``.
        p: drafts verified per step in one tree pass (``ngram``); candidate paths ``auto``
            chooses its tree from, candidate nodes for ``headsfree``. Default 1; 16 for ``auto``
            and ``heads+ngram``, 32 for ``headsfree``.
        alpha: n-gram weight (``ngram``, ``auto``, ``heads+ngram``) or rescorer weight
            (``neural``); 0 ranks paths by the heads alone ("0-gram"); ``headsfree``: > 0 uses the
            static n-gram model, 0 the decoded text's cache alone.
        lm: name of the n-gram model to use (a key of the ``lms`` mapping given to the
            decoder); None for the only / default one.
        temperature: 0 for greedy decoding; > 0 samples through the adapter's lossless
            tree-sampling rule.
        top_p: nucleus mass when sampling.
        name: label in reports; derived from the other fields when None.
    """

    method: str
    k: Optional[int] = None
    p: Optional[int] = None
    alpha: float = 1.0
    lm: Optional[str] = None
    temperature: float = 0.0
    top_p: float = 1.0
    name: Optional[str] = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise DecoderConfigError(f"unknown method {self.method!r}; expected one of {METHODS}")
        default_k, default_p = _DEFAULT_KP.get(self.method, (1, 1))
        if self.k is None:
            object.__setattr__(self, "k", default_k)
        if self.p is None:
            object.__setattr__(self, "p", default_p)
        for knob in ("k", "p"):
            value = getattr(self, knob)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise DecoderConfigError(f"{knob} must be an integer >= 1, got {value!r}")
        if not isinstance(self.alpha, (int, float)) or not math.isfinite(self.alpha) or self.alpha < 0:
            raise DecoderConfigError(f"alpha must be a finite number >= 0, got {self.alpha!r}")
        if not isinstance(self.temperature, (int, float)) or not math.isfinite(self.temperature) \
                or self.temperature < 0:
            raise DecoderConfigError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise DecoderConfigError(f"top_p must lie in (0, 1], got {self.top_p!r}")
        if self.method == "oracle" and self.temperature > 0:
            raise DecoderConfigError("the oracle follows the target's greedy continuation; it has no sampling mode")
        if self.method not in ("ngram",) + _CHOOSERS and self.p != 1:
            raise DecoderConfigError(f"p > 1 needs method 'ngram' or one of {_CHOOSERS}, got {self.method!r} "
                                     f"with p={self.p}")

    @property
    def label(self) -> str:
        """``name``, or a short description such as ``ngram k=16 p=16 alpha=1 lm=4gram``."""
        if self.name:
            return self.name
        parts = [self.method]
        if self.method in ("ngram", "neural", "oracle", "auto", "heads+ngram"):
            parts.append(f"k={self.k}")
        if self.method in ("ngram",) + _CHOOSERS:
            parts += [f"p={self.p}", f"alpha={self.alpha:g}"]
            if self.lm is not None and self.alpha > 0:
                parts.append(f"lm={self.lm}")
        if self.method == "neural":
            parts.append(f"alpha={self.alpha:g}")
        if self.temperature > 0:
            parts.append(f"T={self.temperature:g}")
            if self.top_p < 1:
                parts.append(f"top_p={self.top_p:g}")
        return " ".join(parts)

    @classmethod
    def parse(cls, spec: str) -> "DecoderConfig":
        """Reads ``method[:key=value,...]``, e.g. ``ngram:k=16,p=16,alpha=1,lm=4gram``.

        Raises:
            DecoderConfigError: unknown method or key, or a value of the wrong type.
        """
        method, _, rest = spec.strip().partition(":")
        kinds = {f.name: f.type for f in fields(cls)}
        values: dict[str, Any] = {}
        for item in filter(None, (part.strip() for part in rest.split(","))):
            key, eq, raw = item.partition("=")
            key = key.strip()
            if not eq or key not in kinds or key == "method":
                raise DecoderConfigError(f"bad item {item!r} in decoder spec {spec!r}; keys: "
                                         f"{[k for k in kinds if k != 'method']}")
            try:
                if key in ("k", "p"):
                    values[key] = int(raw)
                elif key in ("alpha", "temperature", "top_p"):
                    values[key] = float(raw)
                else:
                    values[key] = raw.strip()
            except ValueError as exc:
                raise DecoderConfigError(f"bad value for {key} in decoder spec {spec!r}") from exc
        return cls(method.strip(), **values)


@dataclass
class StepRecord:
    """One target call of a decode.

    The block of a step is ``(root_token,) + draft``: position 1 is the token the previous call
    emitted last (the model's own next token, head 1, fixed in the lattice), positions 2..h are
    guesses of heads 2..h, which the tree pass verifies.

    Attributes:
        root_token: the last token before the step (the tree's root, lattice position 1).
        drafts: the verified drafts (each ``h - 1`` tokens), best first; empty for a step
            without heads (the greedy baseline, and every decoder's first call).
        vanilla_draft: arg-max of heads 2..h (what vanilla BPD would verify); empty without heads.
        emitted: the tokens the call emitted: the accepted draft tokens, then the target's own.
        num_accepted: accepted draft tokens (``len(emitted) - 1`` before any truncation).
        lattice_tokens, lattice_scores (`np.ndarray` of shape `(h, k)`): the top-k lattice of the
            heads (natural-log scores; position 1 fixed to ``root_token``); None without heads.
        head_entropy (`np.ndarray` of shape `(h,)`): entropy (nats) of each head's distribution.
        heads_s: seconds in the heads' forward and the lattice's top-k.
        search_s: seconds choosing drafts from the lattice (p-best rescoring, oracle walk).
        model_s: seconds in the target call (verification or plain step), acceptance included.
    """

    root_token: int
    drafts: list[tuple[int, ...]]
    vanilla_draft: tuple[int, ...]
    emitted: tuple[int, ...]
    num_accepted: int
    lattice_tokens: Optional[np.ndarray] = None
    lattice_scores: Optional[np.ndarray] = None
    head_entropy: Optional[np.ndarray] = None
    heads_s: float = 0.0
    search_s: float = 0.0
    model_s: float = 0.0

    @property
    def tree_nodes(self) -> int:
        """Draft-tree nodes the call verified (the distinct prefixes of the drafts; 0: a plain step)."""
        return len({tuple(draft[:j]) for draft in self.drafts for j in range(1, len(draft) + 1)})

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "root_token": self.root_token,
            "drafts": [list(d) for d in self.drafts],
            "vanilla_draft": list(self.vanilla_draft),
            "emitted": list(self.emitted),
            "num_accepted": self.num_accepted,
            "heads_s": self.heads_s,
            "search_s": self.search_s,
            "model_s": self.model_s,
        }
        for key in ("lattice_tokens", "lattice_scores", "head_entropy"):
            value = getattr(self, key)
            out[key] = None if value is None else value.tolist()
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "StepRecord":
        arrays = {key: None if data.get(key) is None else np.asarray(data[key], dtype=dtype)
                  for key, dtype in (("lattice_tokens", np.int32), ("lattice_scores", np.float32),
                                     ("head_entropy", np.float64))}
        return cls(
            root_token=int(data["root_token"]),
            drafts=[tuple(d) for d in data["drafts"]],
            vanilla_draft=tuple(data["vanilla_draft"]),
            emitted=tuple(data["emitted"]),
            num_accepted=int(data["num_accepted"]),
            heads_s=float(data["heads_s"]),
            search_s=float(data["search_s"]),
            model_s=float(data["model_s"]),
            **arrays,
        )


@dataclass
class Decoding:
    """The result of one decode.

    Attributes:
        config: the decoder.
        prompt: the prompt ids.
        tokens: the new tokens, at most ``max_new_tokens`` (the last step's surplus is cut).
        steps: one record per target call, the first call (which reads the prompt's last token
            and emits the first new token) included; the prompt's prefill is not a step.
        wall_s: seconds for the whole decode, prefill included.
        replayed: the steps come from :func:`latticekit.bpd.replay.replay` (a greedy trace),
            not from target calls: no target seconds, no wall time.
    """

    config: DecoderConfig
    prompt: list[int]
    tokens: list[int]
    steps: list[StepRecord] = field(default_factory=list)
    wall_s: float = 0.0
    replayed: bool = False

    @property
    def calls(self) -> int:
        """Serial target calls after the prefill: one per step."""
        return len(self.steps)

    @property
    def block_efficiency(self) -> float:
        """Decoded tokens per serial target call (1.0 for the greedy baseline)."""
        return len(self.tokens) / max(1, self.calls)
