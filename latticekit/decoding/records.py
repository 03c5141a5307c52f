"""What a decode leaves behind: per-step records.

Plain data (numpy and tuples, no torch), so the analyses in :mod:`latticekit.eval.analysis`
run on saved records without torch. The few figures the demo reads too (:func:`block_efficiency`,
:func:`drafted_steps`, :func:`accepted_length`) are here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from latticekit.drafting.config import DecoderConfig

__all__ = ["StepRecord", "Decoding", "block_efficiency", "drafted_steps", "accepted_length"]


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
        replayed: the steps come from :func:`latticekit.eval.replay.replay` (a greedy trace),
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


def block_efficiency(decodings: Iterable[Decoding]) -> float:
    """Decoded tokens / serial target calls, pooled over decodes (not a mean of ratios)."""
    tokens = calls = 0
    for decoding in decodings:
        tokens += len(decoding.tokens)
        calls += decoding.calls
    return tokens / calls if calls else float("nan")


def drafted_steps(steps: Iterable[StepRecord]) -> list[StepRecord]:
    """The steps that verified drafts (every step but the greedy baseline's and the first)."""
    return [step for step in steps if step.drafts]


def accepted_length(draft: Sequence[int], emitted: Sequence[int]) -> int:
    """Tokens of ``draft`` greedy verification accepts, given what the step emitted.

    ``emitted`` (accepted tokens + the target's own) is the target's greedy continuation, so
    the answer is their common prefix length. It is exact up to ``len(emitted) - 1``; a draft
    that also matches the last emitted token would have been accepted further (at least
    ``len(emitted)``, the value returned).
    """
    n = 0
    for a, b in zip(draft, emitted):
        if a != b:
            break
        n += 1
    return n
