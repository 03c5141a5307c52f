"""A drafter defined here alone, registered, and run through ``decode``, the replay of
``latticekit eval`` and the command line: adding a strategy needs no edit in latticekit."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from decoding_helpers import PeekingHeads, tiny_llama
from latticekit.cli import main
from latticekit.decoding import DecoderConfig, DecoderConfigError, decode, greedy_decode
from latticekit.drafting import Draft, Drafter, DraftInput, lookup, register, unregister
from latticekit.eval.replay import replay, trace_prompts

ROOT = Path(__file__).resolve().parents[2]


class RepeatLast(Drafter):
    """Drafts up to two chains of k tokens, the last token repeated and half of it repeated:
    two branches of the root (a tree, not a list); reads no heads; keeps what it saw."""

    method = "repeat-last"
    default_k = 3
    default_p = 2
    knobs = frozenset({"k", "p"})
    needs_heads = False

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__(config)
        self.emitted: list[int] = []

    def draft(self, step: DraftInput) -> Draft:
        last = step.root
        chains = [(last,) * self.k, (last // 2,) * self.k][: int(self.config.p)]  # type: ignore[arg-type]
        return Draft.from_paths(chains)

    def observe(self, step: DraftInput, draft: Draft, emitted: Sequence[int]) -> None:
        self.emitted.extend(emitted)


@pytest.fixture
def registered() -> Iterator[type[RepeatLast]]:
    register(RepeatLast)
    yield RepeatLast
    unregister(RepeatLast.method)


def test_a_new_drafter_is_configured_through_the_registry(registered: type[RepeatLast]) -> None:
    config = DecoderConfig.parse("repeat-last:p=2")
    assert lookup("repeat-last") is RepeatLast
    assert (config.k, config.p, config.label) == (3, 2, "repeat-last k=3 p=2")
    with pytest.raises(DecoderConfigError, match="p > 1"):
        DecoderConfig("vanilla", p=2)
    with pytest.raises(DecoderConfigError, match="taken"):
        register(type("Other", (Drafter,), {"method": "repeat-last"}))
    with pytest.raises(DecoderConfigError, match="unknown knobs"):
        register(type("Bad", (Drafter,), {"method": "bad", "knobs": frozenset({"beam"})}))


def test_unregistered_methods_are_refused() -> None:
    with pytest.raises(DecoderConfigError, match="unknown method 'repeat-last'"):
        DecoderConfig("repeat-last")


def test_a_new_drafter_decodes_exactly_greedy(registered: type[RepeatLast]) -> None:
    model = tiny_llama()
    prompt = [5, 9, 9, 9, 3, 3, 3, 3]
    want = greedy_decode(model, prompt, 24).tokens
    got = decode(model, None, prompt, DecoderConfig("repeat-last", k=3, p=2), max_new_tokens=24)
    assert got.tokens == want
    assert all(len(step.drafts) == 2 for step in got.steps[1:])  # both branches verified each step
    assert got.block_efficiency > 1.0  # the repeated tokens are accepted somewhere


def test_a_new_drafter_replays_as_it_decodes(registered: type[RepeatLast]) -> None:
    model = tiny_llama()
    prompt = [5, 9, 9, 9, 3, 3, 3, 3]
    heads = PeekingHeads(model, prompt + greedy_decode(model, prompt, 30).tokens, num_heads=3)
    config = DecoderConfig("repeat-last", k=2, p=2)
    trace = trace_prompts(model, heads, [prompt], num_tokens=24, k=2)[0]
    replayed = replay(trace, config, max_new_tokens=20)
    decoded = decode(model, heads, prompt, config, max_new_tokens=20)
    assert replayed.tokens == decoded.tokens
    assert [s.emitted for s in replayed.steps] == [s.emitted for s in decoded.steps]


def test_a_new_drafter_runs_through_the_command_line(registered: type[RepeatLast], tmp_path: Path,
                                                     capsys: pytest.CaptureFixture) -> None:
    sources = sorted((ROOT / "latticekit").glob("*.py"))[:2]
    argv = ["eval", "--model", "tiny-llama", "--heads", "untrained:3", "--prompts", *map(str, sources),
            "--num-prompts", "2", "--prompt-tokens", "16", "--max-new-tokens", "8",
            "--decoders", "repeat-last:k=2,p=2", "--out", str(tmp_path)]
    assert main(argv) == 0
    data = json.loads((tmp_path / "eval.json").read_text())
    rows = {r["decoder"]: r for r in data["summary"]["prompts"]["decoders"]}
    assert set(rows) == {"greedy", "repeat-last k=2 p=2"}
    assert rows["repeat-last k=2 p=2"]["block_efficiency"] >= 1.0
    assert "block efficiency" in capsys.readouterr().out
