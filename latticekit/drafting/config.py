"""``DecoderConfig``: one decoder, a method and its knobs, checked against the method's drafter.

Which knobs a method reads, and their defaults, are declared by its drafter class
(:class:`~latticekit.drafting.protocol.Drafter`: ``method``, ``default_k``, ``default_p``,
``knobs``, ``samples``) and looked up in the registry (:mod:`latticekit.drafting.registry`):
a config of a method no drafter registered is refused, and a new drafter needs no edit here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Optional

import numpy as np

from latticekit.drafting import registry
from latticekit.errors import DecoderConfigError

__all__ = ["DecoderConfig"]


@dataclass(frozen=True)
class DecoderConfig:
    """One decoder: a method and its knobs.

    Attributes:
        method: a registered drafter's method (:func:`latticekit.drafting.methods`): ``greedy``,
            ``vanilla``, ``ngram``, ``neural``, ``oracle``, ``auto``, ``headsfree``,
            ``heads+ngram``, or one registered by the user.
        k: arcs per lattice position (``ngram``, ``neural``, ``oracle``, ``auto``,
            ``heads+ngram``; ``vanilla`` only records them). Default: the drafter's
            ``default_k`` (1; 16 for ``auto`` and ``heads+ngram``).
        p: drafts verified per step in one tree pass (``ngram``); candidate paths ``auto``
            chooses its tree from, candidate nodes for ``headsfree``. Only methods whose drafter
            reads it may set it above 1. Default: the drafter's ``default_p`` (1; 16 for
            ``auto`` and ``heads+ngram``, 32 for ``headsfree``).
        alpha: n-gram weight (``ngram``, ``auto``, ``heads+ngram``) or rescorer weight
            (``neural``); 0 ranks paths by the heads alone ("0-gram"); ``headsfree``: > 0 uses the
            static n-gram model, 0 the decoded text's cache alone.
        lm: name of the n-gram model to use (a key of the ``lms`` mapping given to the
            decoder); None for the only / default one.
        temperature: 0 for greedy decoding; > 0 samples through the adapter's lossless
            tree-sampling rule (refused for a drafter that cannot sample, the oracle).
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
        strategy = registry.lookup(self.method)
        if self.k is None:
            object.__setattr__(self, "k", strategy.default_k)
        if self.p is None:
            object.__setattr__(self, "p", strategy.default_p)
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
        if self.temperature > 0 and not strategy.samples:
            raise DecoderConfigError(f"{self.method!r} follows the target's greedy continuation; "
                                     "it has no sampling mode")
        if "p" not in strategy.knobs and self.p != 1:
            takers = tuple(name for name in registry.methods() if "p" in registry.lookup(name).knobs)
            raise DecoderConfigError(f"p > 1 needs one of the methods {takers}, got {self.method!r} "
                                     f"with p={self.p}")

    @property
    def label(self) -> str:
        """``name``, or a short description such as ``ngram k=16 p=16 alpha=1 lm=4gram``: the
        method and the knobs its drafter reads."""
        if self.name:
            return self.name
        knobs = registry.lookup(self.method).knobs
        parts = [self.method]
        if "k" in knobs:
            parts.append(f"k={self.k}")
        if "p" in knobs:
            parts.append(f"p={self.p}")
        if "alpha" in knobs:
            parts.append(f"alpha={self.alpha:g}")
        if "lm" in knobs and self.lm is not None and self.alpha > 0:
            parts.append(f"lm={self.lm}")
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
