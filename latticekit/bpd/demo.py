"""The decoding demo's names where they were first published; the demo is :mod:`latticekit.demo`
(one module for ``latticekit demo``: the decoding demo and the lattice demo)."""

from __future__ import annotations

from latticekit.demo import (  # noqa: F401  (LM_FILE, PROMPTS_FILE: module constants kept importable)
    DEMO_DECODERS,
    LM_FILE,
    PROMPTS_FILE,
    bpd_demo_available,
    demo_prompts,
    embedded_token_lm,
    run_bpd_demo,
)

__all__ = ["DEMO_DECODERS", "demo_prompts", "embedded_token_lm", "run_bpd_demo", "bpd_demo_available"]
