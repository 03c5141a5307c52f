"""A decode through the current transformers API warns about nothing: no deprecated argument
(transformers 5.24 deprecates ``past_key_values`` for ``cache`` with a FutureWarning on every
pass), nothing else. Whatever the filters in pyproject.toml, every warning is recorded here,
and so are transformers' own logged warnings (its ``warning_once`` deprecation notices, which
its logger keeps from propagating to pytest's handler)."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

import latticekit as lk
from decoding_helpers import ARPA, RandomHeads, tiny_gpt2, tiny_llama
from latticekit.drafting.costs import StepCosts
from latticekit.eval.replay import trace_prompts

PROMPT = [3, 17, 42, 8, 25, 60, 11]
COSTS = StepCosts([0, 1, 8, 64], [0.010, 0.011, 0.012, 0.030], 50, draft_s=0.001)


@contextmanager
def transformers_log(caplog: Any) -> Iterator[None]:
    """caplog sees transformers' warnings once each: its logger usually does not propagate to the
    root's handler, but whether it does depends on what ran before (vLLM's import turns it on), so
    propagation is off while caplog's handler sits on the logger itself."""
    logger = logging.getLogger("transformers")
    propagate = logger.propagate
    logger.propagate = False
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING, logger="transformers"):
            yield
    finally:
        logger.removeHandler(caplog.handler)
        logger.propagate = propagate


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_a_decode_warns_about_nothing(arch: str, caplog: Any) -> None:
    model = tiny_llama() if arch == "llama" else tiny_gpt2()
    heads = RandomHeads(model, num_heads=4)
    lm = lk.NGramLM.from_arpa(ARPA)
    with warnings.catch_warnings(record=True) as caught, transformers_log(caplog):
        warnings.simplefilter("always")
        lk.generate(model, torch.tensor([PROMPT]), heads=heads, lm=lm, max_new_tokens=12, eos_token_id=[],
                    costs=COSTS)  # tree passes, rows projected apart, plain steps
        lk.generate(model, PROMPT, max_new_tokens=6, eos_token_id=[], costs=COSTS)  # headsfree
        lk.generate(model, PROMPT, heads=heads, max_new_tokens=6, eos_token_id=[], costs=COSTS,
                    temperature=0.8, generator=torch.Generator().manual_seed(0))  # tree sampling
        trace_prompts(model, heads, [PROMPT, PROMPT[::-1]], num_tokens=4, k=2)  # forward_last, batched
    assert [f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})" for w in caught] == []
    assert [r.getMessage() for r in caplog.records if r.name.startswith("transformers")] == []


def test_transformers_log_warnings_would_be_seen(caplog: Any) -> None:
    with transformers_log(caplog):
        logging.getLogger("transformers.models.llama").warning("a notice")
    assert [r.getMessage() for r in caplog.records] == ["a notice"]
