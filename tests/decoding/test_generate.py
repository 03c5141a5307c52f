"""``latticekit.generate``: the prepared model's greedy tokens, HF-like inputs and outputs, a
streamer that sees what the decode emits, typed errors for bad arguments."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import latticekit as lk
from decoding_helpers import ARPA, PeekingHeads, tiny_llama
from latticekit.decoding import DecoderConfigError, greedy_decode
from latticekit.decoding.costs import StepCosts
from latticekit.torch import prepare_target

PROMPT = [3, 17, 42, 8, 25, 60, 11]
COSTS = StepCosts([0, 1, 8, 64], [0.010, 0.011, 0.012, 0.030], 50, draft_s=0.001)


class RecordingStreamer:
    def __init__(self) -> None:
        self.puts: list[list[int]] = []
        self.ended = False

    def put(self, value: torch.Tensor) -> None:
        assert value.dim() == 1 and value.dtype == torch.long
        self.puts.append(value.tolist())

    def end(self) -> None:
        self.ended = True


@pytest.fixture(scope="module")
def setup() -> tuple[Any, Any, list[int]]:
    model = prepare_target(tiny_llama())
    reference = PROMPT + greedy_decode(model, PROMPT, 60).tokens
    return model, PeekingHeads(model, reference, num_heads=5), reference


def test_generate_gives_the_prepared_greedy_tokens(setup: Any) -> None:
    model, heads, reference = setup
    lm = lk.NGramLM.from_arpa(ARPA)
    for kwargs in ({}, {"heads": heads}, {"heads": heads, "lm": lm}):
        out = lk.generate(model, torch.tensor([PROMPT]), max_new_tokens=40, eos_token_id=[], costs=COSTS, **kwargs)
        assert out.tokens == reference[len(PROMPT): len(PROMPT) + 40]
        assert out.sequences.tolist() == [reference[: len(PROMPT) + 40]]
        assert out.steps[0].emitted == (reference[len(PROMPT)],)
    assert out.tokens_per_call > 1.2  # the peeking heads draft well


def test_generate_stops_at_the_models_eos_and_streams_what_it_keeps(setup: Any) -> None:
    model, heads, reference = setup
    new = reference[len(PROMPT):]
    eos = new[12]
    model.generation_config.eos_token_id = eos
    try:
        streamer = RecordingStreamer()
        out = lk.generate(model, PROMPT, heads=heads, max_new_tokens=40, costs=COSTS, streamer=streamer)
    finally:
        model.generation_config.eos_token_id = 1
    assert out.tokens == new[: new.index(eos) + 1]
    assert streamer.puts[0] == PROMPT and streamer.ended
    assert [t for put in streamer.puts[1:] for t in put] == out.tokens
    streamer = RecordingStreamer()
    out = lk.generate(model, PROMPT, heads=heads, max_new_tokens=7, eos_token_id=[], costs=COSTS, streamer=streamer)
    assert [t for put in streamer.puts[1:] for t in put] == out.tokens == new[:7]


def test_generate_samples_reproducibly(setup: Any) -> None:
    model, heads, _ = setup
    runs = [lk.generate(model, PROMPT, heads=heads, max_new_tokens=15, temperature=0.9, costs=COSTS,
                        eos_token_id=[], generator=torch.Generator().manual_seed(3)).tokens for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0]) == 15


@pytest.mark.parametrize("bad, match", [
    (torch.tensor([[1, 2], [3, 4]]), "one sequence at a time"),
    ("hello", "tokenize the text first"),
    (torch.tensor([1.0, 2.0]), "integer ids"),
    ([1, None], "sequence of integer ids"),
])
def test_bad_inputs_are_typed_errors(setup: Any, bad: Any, match: str) -> None:
    model, heads, _ = setup
    with pytest.raises(DecoderConfigError, match=match):
        lk.generate(model, bad, heads=heads, max_new_tokens=3, costs=COSTS)
    with pytest.raises(DecoderConfigError, match="max_new_tokens"):
        lk.generate(model, PROMPT, heads=heads, max_new_tokens=0, costs=COSTS)
    with pytest.raises(DecoderConfigError, match="temperature"):
        lk.generate(model, PROMPT, heads=heads, max_new_tokens=3, temperature=-1.0, costs=COSTS)
