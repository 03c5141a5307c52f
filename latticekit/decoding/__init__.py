"""Decoding with a torch target: the loop (:func:`decode`, :func:`greedy_decode`), per-step
records, step costs, the heads' lattice sources and :func:`~latticekit.decoding.generation.generate`.

``decode`` / ``greedy_decode`` need torch (imported on first use); the records are plain numpy,
so saved records can be analysed without it (:mod:`latticekit.eval.analysis`).

Typical use::

    from latticekit.decoding import DecoderConfig, decode
    out = decode(model, heads, prompt_ids, DecoderConfig.parse("ngram:k=16,p=16,alpha=1"),
                 max_new_tokens=128, lms=lm)
    out.tokens, out.block_efficiency, out.steps
"""

from __future__ import annotations

from typing import Any

from latticekit.decoding.records import Decoding, StepRecord
from latticekit.drafting.config import DecoderConfig
from latticekit.errors import DecoderConfigError, HeadsError

__all__ = [
    "DecoderConfig",
    "Decoding",
    "StepRecord",
    "decode",
    "greedy_decode",
    "generate",
    "DecoderConfigError",
    "HeadsError",
]


def __getattr__(name: str) -> Any:
    if name in ("decode", "greedy_decode"):
        from latticekit.decoding import loop

        return getattr(loop, name)
    if name == "generate":
        from latticekit.decoding.generation import generate

        return generate
    raise AttributeError(f"module 'latticekit.decoding' has no attribute {name!r}")
