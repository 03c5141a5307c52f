"""Replay: the steps replayed from one greedy trace equal the steps real decoders take.

Tiny random-weight Llama and GPT-2 (fp32, seeded), peeking stand-in heads (good drafts, so that
steps accept several tokens), the small Katz trigram of ``tests/data`` and a tiny random neural
rescorer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import latticekit as lk
from decoding_helpers import ARPA, VOCAB, PeekingHeads, tiny_gpt2, tiny_llama
from latticekit.decoding import DecoderConfig, DecoderConfigError, decode, greedy_decode
from latticekit.eval.replay import Trace, replay, trace_prompts, tune_alpha
from latticekit.eval.rescorer import NeuralRescorer, RescorerError
from test_rescorer import tiny_rescorer

PROMPTS = [[3, 17, 42, 8, 25, 60, 11], [5, 9, 33, 2, 47, 19, 30], [7, 7, 7]]
NEW_TOKENS = 40
H = 5
SPECS = [
    "vanilla",
    "ngram:k=4,p=1,alpha=1",
    "ngram:k=4,p=8,alpha=0",
    "ngram:k=8,p=16,alpha=0.5",
    "neural:k=4,alpha=1",
    "neural:k=4,alpha=0",
    "oracle:k=2",
    "oracle:k=4",
]
_setups: dict[str, Any] = {}


def setup(arch: str) -> tuple[Any, PeekingHeads, list[Trace]]:
    if arch not in _setups:
        model = (tiny_llama if arch == "llama" else tiny_gpt2)()
        reference = PROMPTS[0] + greedy_decode(model, PROMPTS[0], NEW_TOKENS + H).tokens
        heads = PeekingHeads(model, reference, num_heads=H)
        traces = trace_prompts(model, heads, PROMPTS, NEW_TOKENS + H - 1, k=8, batch_size=2)
        _setups[arch] = model, heads, traces
    return _setups[arch]


@pytest.fixture(scope="module")
def lm() -> lk.NGramLM:
    return lk.NGramLM.from_arpa(ARPA)


@pytest.fixture(scope="module")
def rescorer() -> NeuralRescorer:
    return tiny_rescorer(0, max_len=128)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_trace_is_the_greedy_decode(arch: str) -> None:
    model, heads, traces = setup(arch)
    for prompt, trace in zip(PROMPTS, traces):
        assert trace.prompt == prompt
        assert trace.continuation == greedy_decode(model, prompt, NEW_TOKENS + H - 1).tokens
        assert trace.lattice_tokens.shape == (NEW_TOKENS + H - 1, H, 8)
        assert (trace.widths[:, 0] == 1).all() and (trace.widths[:, 1:] == 8).all()
        assert np.all(np.diff(trace.lattice_scores[:, 1:], axis=-1) <= 0)  # arcs best first


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("spec", SPECS)
def test_replay_equals_decode(arch: str, spec: str, lm: lk.NGramLM, rescorer: NeuralRescorer) -> None:
    model, heads, traces = setup(arch)
    config = DecoderConfig.parse(spec)
    for prompt, trace in zip(PROMPTS, traces):
        real = decode(model, heads, prompt, config, max_new_tokens=NEW_TOKENS, lms=lm, rescorer=rescorer)
        again = replay(trace, config, NEW_TOKENS, lms=lm, rescorer=rescorer)
        assert again.replayed and again.tokens == real.tokens
        assert [s.emitted for s in again.steps] == [s.emitted for s in real.steps]
        assert [s.drafts for s in again.steps] == [s.drafts for s in real.steps]
        assert [s.num_accepted for s in again.steps] == [s.num_accepted for s in real.steps]
        for a, b in zip(again.steps[1:], real.steps[1:]):
            np.testing.assert_array_equal(a.lattice_tokens[1:], b.lattice_tokens[1:])
            np.testing.assert_allclose(a.head_entropy, b.head_entropy, rtol=1e-4, atol=1e-4)
    accepted = sum(s.num_accepted for t in traces for s in replay(t, config, NEW_TOKENS, lm, rescorer).steps)
    assert accepted > 0  # the peeking heads make steps accept drafts: the walk is exercised


def test_replay_stops_at_eos(lm: lk.NGramLM) -> None:
    model, heads, traces = setup("llama")
    trace = traces[0]
    eos = trace.continuation[10]
    first = trace.continuation.index(eos)
    real = decode(model, heads, PROMPTS[0], DecoderConfig("vanilla", k=4), max_new_tokens=NEW_TOKENS, eos_token_id=eos)
    again = replay(trace, DecoderConfig("vanilla", k=4), NEW_TOKENS, eos_token_id=eos)
    assert again.tokens == real.tokens == trace.continuation[: first + 1]
    assert [s.emitted for s in again.steps] == [s.emitted for s in real.steps]


def test_trace_cache_and_round_trip(tmp_path: Path) -> None:
    model, heads, traces = setup("llama")
    cached = trace_prompts(model, heads, PROMPTS[:2], NEW_TOKENS + H - 1, k=8, cache_dir=tmp_path, description="x")
    assert len(list(tmp_path.glob("*.npz"))) == 2
    # everything cached: the model is not even consulted
    again = trace_prompts(None, heads, PROMPTS[:2], NEW_TOKENS + H - 1, k=8, cache_dir=tmp_path, description="x")
    for a, b in zip(cached, again):
        assert a.continuation == b.continuation
        np.testing.assert_array_equal(a.lattice_scores, b.lattice_scores)
    np.testing.assert_array_equal(cached[0].lattice_tokens, traces[0].lattice_tokens)
    # other heads (same class, other weights) miss the cache
    other = PeekingHeads(model, traces[0].prompt + traces[0].continuation, num_heads=H, seed=5)
    trace_prompts(model, other, PROMPTS[:1], NEW_TOKENS + H - 1, k=8, cache_dir=tmp_path, description="x")
    assert len(list(tmp_path.glob("*.npz"))) == 3
    # a damaged cache file is traced again, not a crash
    victim = sorted(tmp_path.glob("*.npz"))[0]
    victim.write_bytes(victim.read_bytes()[:100])
    with pytest.raises(DecoderConfigError, match="not a readable trace"):
        Trace.load(victim)
    redone = trace_prompts(model, heads, PROMPTS[:2], NEW_TOKENS + H - 1, k=8, cache_dir=tmp_path, description="x")
    assert [t.continuation for t in redone] == [t.continuation for t in cached]
    with pytest.raises(DecoderConfigError, match="needs a description"):
        trace_prompts(model, heads, PROMPTS[:1], 4, 4, cache_dir=tmp_path)


def test_tune_alpha_is_block_efficiency_per_alpha(lm: lk.NGramLM) -> None:
    _, _, traces = setup("llama")
    config = DecoderConfig.parse("ngram:k=4,p=4,alpha=1")
    table = tune_alpha(traces, config, [0.0, 1.0, 5.0], NEW_TOKENS, lms=lm)
    for alpha, be in table.items():
        runs = [replay(t, DecoderConfig("ngram", k=4, p=4, alpha=alpha), NEW_TOKENS, lms=lm) for t in traces]
        assert be == sum(len(r.tokens) for r in runs) / sum(r.calls for r in runs)


def test_bad_arguments(lm: lk.NGramLM) -> None:
    _, _, traces = setup("llama")
    with pytest.raises(DecoderConfigError, match="needs a trace of at least"):
        replay(traces[0], DecoderConfig("vanilla"), NEW_TOKENS + 1)
    with pytest.raises(DecoderConfigError, match="greedy decoding only"):
        replay(traces[0], DecoderConfig("vanilla", temperature=1.0), 10)
    with pytest.raises(DecoderConfigError, match="exceeds the traced k"):
        replay(traces[0], DecoderConfig("oracle", k=16), 10)
    with pytest.raises(DecoderConfigError, match="neural rescorer"):
        replay(traces[0], DecoderConfig("neural", k=4), 10)
    small = NeuralRescorer(torch.zeros(VOCAB // 2, dtype=torch.long), d_model=8, num_layers=1, num_heads=2,
                           d_ff=8, max_len=16)
    with pytest.raises(RescorerError, match="token id .* another tokenizer"):
        replay(traces[0], DecoderConfig("neural", k=4), 10, rescorer=small)
    model, heads, _ = setup("llama")
    with pytest.raises(DecoderConfigError, match="neural rescorer"):  # the same error as replay's
        decode(model, heads, PROMPTS[0], DecoderConfig("neural", k=4), max_new_tokens=4)
    with pytest.raises(RescorerError, match="NeuralRescorer"):
        decode(model, heads, PROMPTS[0], DecoderConfig("neural", k=4), max_new_tokens=4, rescorer=object())
    with pytest.raises(DecoderConfigError, match="empty prompt"):
        trace_prompts(model, heads, [[]], 4, 4)


def test_neural_replay_equals_decode_past_the_rescorer_window() -> None:
    model, heads, traces = setup("llama")
    short = tiny_rescorer(0, max_len=24)  # reads the last 21 tokens: prompts of 7 + 40 tokens exceed it
    config = DecoderConfig.parse("neural:k=4,alpha=2")
    for prompt, trace in zip(PROMPTS, traces):
        real = decode(model, heads, prompt, config, max_new_tokens=NEW_TOKENS, rescorer=short)
        again = replay(trace, config, NEW_TOKENS, rescorer=short)
        assert [s.drafts for s in again.steps] == [s.drafts for s in real.steps]
        assert [s.emitted for s in again.steps] == [s.emitted for s in real.steps]


class TiedHeads(torch.nn.Module):
    """Head 1 ties token 3 with token 7 (arg-max says 3; top-k may say 7); or, with ``wrong``,
    puts the greedy token far below the best."""

    num_heads = 2

    def __init__(self, wrong: bool = False) -> None:
        super().__init__()
        self.wrong = wrong

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(hidden.shape[0], 2, VOCAB)
        out[:, 0, 3] = out[:, 0, 7] = 5.0
        if self.wrong:
            out[:, 0, 9] = 9.0
        out[:, 1] = torch.arange(VOCAB, dtype=torch.float32)
        return out


def test_lattices_take_the_greedy_token_on_a_tie() -> None:
    from latticekit.eval.replay import _lattices

    hidden = torch.zeros(4, 8)
    trace = _lattices(TiedHeads(), hidden, [1], [3, 3, 3, 3], k=2)
    assert (trace.lattice_tokens[:, 0, 0] == 3).all()
    with pytest.raises(DecoderConfigError, match="heads for this model"):
        _lattices(TiedHeads(wrong=True), hidden, [1], [3, 3, 3, 3], k=2)


@pytest.mark.parametrize("spec", ["vanilla", "ngram:k=4,p=8,alpha=0.5"])
def test_replay_equals_decode_with_token_conditioned_heads(spec: str, lm: lk.NGramLM) -> None:
    """Heads that read the token at t + 1 see the decoded token in a replay, as in decode()."""
    from latticekit.heads import BlockHeads

    model = tiny_llama()
    heads = BlockHeads.for_model(model, num_heads=H, token_conditioned=True)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in heads.parameters():
            if p.requires_grad:
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
    config = DecoderConfig.parse(spec)
    for prompt, trace in zip(PROMPTS, trace_prompts(model, heads, PROMPTS, NEW_TOKENS + H - 1, k=8, batch_size=2)):
        real = decode(model, heads, prompt, config, max_new_tokens=NEW_TOKENS, lms=lm)
        again = replay(trace, config, NEW_TOKENS, lms=lm)
        assert again.tokens == real.tokens
        assert [s.drafts for s in again.steps] == [s.drafts for s in real.steps]
        for a, b in zip(again.steps[1:], real.steps[1:]):
            np.testing.assert_array_equal(a.lattice_tokens[1:], b.lattice_tokens[1:])
