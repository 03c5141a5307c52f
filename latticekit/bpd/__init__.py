"""Blockwise parallel decoding end to end: decoders, per-step records and their analyses.

``decode`` / ``greedy_decode`` need torch (imported on first use); the records and
:mod:`latticekit.bpd.analysis` are plain numpy, so saved records can be analysed without it.

Typical use::

    from latticekit.bpd import DecoderConfig, decode
    out = decode(model, heads, prompt_ids, DecoderConfig.parse("ngram:k=16,p=16,alpha=1"),
                 max_new_tokens=128, lms=lm)
    out.tokens, out.block_efficiency, out.steps
"""

from __future__ import annotations

from typing import Any

from latticekit.bpd.drafters import Drafter, DraftInput, make_drafter, uniform_lm
from latticekit.bpd.records import METHODS, DecoderConfig, Decoding, StepRecord
from latticekit.errors import DecoderConfigError, HeadsError

__all__ = [
    "METHODS",
    "DecoderConfig",
    "Decoding",
    "StepRecord",
    "Drafter",
    "DraftInput",
    "make_drafter",
    "decode",
    "greedy_decode",
    "uniform_lm",
    "DecoderConfigError",
    "HeadsError",
]

_NEEDS_TORCH = ("decode", "greedy_decode")


def __getattr__(name: str) -> Any:
    if name in _NEEDS_TORCH:
        from latticekit.bpd import decoders

        return getattr(decoders, name)
    raise AttributeError(f"module 'latticekit.bpd' has no attribute {name!r}")
