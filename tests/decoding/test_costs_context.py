"""The step-cost probe fits the model's context: a 512-token prefix and 64-node trees would
index a short model's position embeddings out of range, so the probe shrinks (long prefix,
prefix, largest tree sizes) or, where even its smallest form cannot fit, says so."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import GPT2Config, GPT2LMHeadModel

import latticekit as lk
from decoding_helpers import INIT_RANGE, VOCAB, RandomHeads
from latticekit.decoding import DecoderConfigError, greedy_decode
from latticekit.decoding.costs import DEFAULT_SIZES, fit_probe, measure_step_costs, step_costs

PROMPT = [3, 17, 42, 8, 25, 60, 11]


def short_gpt2(n_positions: int) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=n_positions,
                     initializer_range=INIT_RANGE, bos_token_id=0, eos_token_id=1, attn_implementation="sdpa")
    return GPT2LMHeadModel(cfg).eval()


def test_generate_measures_a_probe_that_fits_a_64_position_model(tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no cached costs: generate measures them
    model = short_gpt2(64)
    reference = greedy_decode(model, PROMPT, 20).tokens
    out = lk.generate(model, PROMPT, heads=RandomHeads(model, num_heads=4), max_new_tokens=20, eos_token_id=[])
    assert out.tokens == reference
    costs = step_costs(model)  # what generate measured, read back from the cache
    assert "step-costs-" in costs.description["cache_file"] and str(tmp_path) in costs.description["cache_file"]
    assert costs.description["context"] == 64
    assert costs.nodes[:2] == [0, 1] and set(costs.nodes) <= set(DEFAULT_SIZES) and costs.prefix_tokens < 64
    assert costs.row_token_s >= 0


def test_a_probe_that_fits_is_left_alone() -> None:
    model = short_gpt2(256)
    costs = measure_step_costs(model, sizes=(0, 1, 4), prefix_tokens=8, long_prefix=16, repeats=1)
    assert costs.nodes == [0, 1, 4] and "context" not in costs.description
    # a call runs the pending token and up to 8 nodes over 8 cached tokens: 17 > 12 positions; the
    # prefix is cut to 6 (half the context) and the 8-node tree dropped; the long prefix to 7
    small = measure_step_costs(short_gpt2(12), sizes=(0, 1, 4, 8), prefix_tokens=8, long_prefix=30, repeats=1)
    assert small.nodes == [0, 1, 4] and small.prefix_tokens == 6 + 1 and small.description["context"] == 12


def test_a_context_too_short_for_any_probe_is_a_config_error(tmp_path: Any) -> None:
    model = short_gpt2(2)  # a 1-token prefix, its pending token and a 1-node tree need 3
    with pytest.raises(DecoderConfigError, match="context of 2 positions .* too short for the step-cost probe"):
        step_costs(model, cache_dir=tmp_path)
    with pytest.raises(DecoderConfigError, match="too short"):
        lk.generate(model, PROMPT[:3], heads=RandomHeads(model, num_heads=4), max_new_tokens=3, eos_token_id=[])


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 2000), st.lists(st.integers(1, 128), min_size=1, max_size=8, unique=True),
       st.integers(1, 600), st.one_of(st.none(), st.integers(2, 3000)))
def test_a_fitted_probe_fits_and_an_unfitted_one_is_left_alone(context: int, trees: list[int], prefix: int,
                                                               long_prefix: Any) -> None:
    """Every call of a fitted probe runs its pending token and tree over at most ``context``
    positions; a probe that fits is returned as given; one that cannot fit is refused."""
    sizes = [0] + sorted(trees)
    if long_prefix is not None and long_prefix <= prefix:
        long_prefix = prefix + long_prefix
    try:
        got_sizes, got_prefix, got_long = fit_probe(context, sizes, prefix, long_prefix)
    except DecoderConfigError:
        assert 1 + 1 + sizes[1] > context  # not even a 1-token prefix with the two smallest sizes
        return
    assert got_sizes == sizes[:len(got_sizes)] and len(got_sizes) >= 2 and got_prefix >= 1
    assert got_prefix + 1 + got_sizes[-1] <= context
    assert got_long is None or (got_prefix < got_long <= long_prefix and got_long + 1 + got_sizes[-1] <= context)
    if prefix + 1 + sizes[-1] <= context and (long_prefix is None or long_prefix + 1 + sizes[-1] <= context):
        assert (got_sizes, got_prefix, got_long) == (sizes, prefix, long_prefix)
    assert fit_probe(None, sizes, prefix, long_prefix) == (sizes, prefix, long_prefix)
