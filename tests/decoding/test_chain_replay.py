"""Chain replay: the steps replayed from greedy streams equal real greedy verification of the same
chains on a tiny model (latticekit's chain drafter, with a memory of the earlier answer), and the
replays of vLLM's ``ngram`` and SuffixDecoding count what they should on hand-made streams."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from decoding_helpers import VOCAB, tiny_llama
from latticekit.decoding import greedy_decode
from latticekit.drafting.memory import AnswerMemory
from latticekit.eval.chain_replay import LatticekitChains, accepted_prefix, replay_chains

PROMPTS = [[3, 17, 42, 8, 25, 60, 11], [5, 9, 33, 2, 47, 19, 30], [3, 17, 42, 8, 25, 60, 12]]
NEW_TOKENS = 40
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "replay_drafters.py"


def real_decode(model: Any, prompts: Sequence[list[int]], source: Any, max_length: int) -> tuple[list[list[int]], int]:
    """Each prompt decoded by verifying ``source``'s chains with the model (one full forward pass
    a step, no cache: the plainest greedy verification); the tokens and the target calls."""
    outputs, calls = [], 0
    with torch.no_grad():
        for prompt in prompts:
            source.start(prompt)
            ids = prompt + [int(model(torch.tensor([prompt])).logits[0, -1].argmax())]
            emitted, calls = ids[-1:], calls + 1
            while len(ids) - len(prompt) < NEW_TOKENS:
                chain = list(source.propose(ids, emitted, max_length))[:max_length]
                greedy = model(torch.tensor([ids + chain])).logits[0, len(ids) - 1:].argmax(-1).tolist()
                accepted = accepted_prefix(chain, greedy, 0)
                emitted = greedy[:accepted + 1][:NEW_TOKENS - (len(ids) - len(prompt))]
                ids, calls = ids + emitted, calls + 1
            source.finish(ids)
            outputs.append(ids[len(prompt):])
    return outputs, calls


@pytest.mark.parametrize("memory", [False, True])
def test_replay_equals_real_verification(memory: bool) -> None:
    model = tiny_llama()
    streams = [(p, greedy_decode(model, p, NEW_TOKENS).tokens) for p in PROMPTS]

    def source() -> LatticekitChains:
        return LatticekitChains(VOCAB, memory=AnswerMemory(1000) if memory else None)

    outputs, calls = real_decode(model, PROMPTS, source(), 6)
    assert outputs == [list(c) for _, c in streams]
    replayed = replay_chains(streams, source(), 6)
    assert replayed.calls == calls and replayed.tokens == len(PROMPTS) * NEW_TOKENS
    assert replayed.tokens_per_call > 1.2  # the random model loops: chains are accepted


def load_benchmark() -> Any:
    spec = importlib.util.spec_from_file_location("replay_drafters", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ngram_replay_counts_a_repeating_stream() -> None:
    pytest.importorskip("vllm.v1.spec_decode.ngram_proposer")
    bench = load_benchmark()
    # the prompt holds the whole answer after "1 2": prompt lookup copies it, 4 drafts a step
    prompt, answer = [1, 2, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 9], [1, 2, 10, 11, 12, 13, 14, 15, 16, 17]
    got = replay_chains([(prompt, answer)], bench.VllmNgram(2, 4), 4)
    # prefill: "1"; then "2" matches nothing of length 2 ([9, 1] is new), one token: "2"; then
    # [1, 2] matches: 10..13 accepted and 14; then [13, 14] (a 2-gram of the prompt): 15..17, the end
    assert got.per_request == [(10, 4)] and got.drafted == 8
    # 5-grams only: one token a call until [1, 2, 10, 11, 12] matches the prompt's, then 13..16 and 17
    assert replay_chains([(prompt, answer)], bench.VllmNgram(5, 5), 4).per_request == [(10, 6)]


def test_suffix_replay_drafts_an_earlier_answer() -> None:
    pytest.importorskip("arctic_inference.suffix_decoding")
    bench = load_benchmark()
    answer = list(range(20, 40))
    first = replay_chains([([1, 2, 3], answer)], bench.Suffix(), 8)
    assert first.per_request == [(20, 20)]  # nothing to copy: one token a call
    # the second request's answer is the first's: the global tree drafts it, 8 at a time
    both = replay_chains([([1, 2, 3], answer), ([4, 5, 6], answer)], bench.Suffix(), 8)
    assert both.per_request[0] == (20, 20) and both.per_request[1][1] < 6


def test_a_tree_accepts_its_longest_path_on_the_greedy_tokens() -> None:
    class Tree:
        def start(self, prompt: Sequence[int]) -> None:
            pass

        def propose(self, ids: Sequence[int], emitted: Sequence[int], max_length: int) -> list[tuple[int, ...]]:
            return [(7,), (1, 2, 9), (1, 2, 3, 4)]  # the last path is right for three tokens and the first call

        def finish(self, ids: Sequence[int]) -> None:
            pass

    got = replay_chains([([5], [0, 1, 2, 3, 4, 5])], Tree(), 3)
    # prefill "0"; then (1, 2, 3) of (1, 2, 3, 4) cut to 3 tokens, and "4"; then nothing, "5"
    assert got.per_request == [(6, 3)] and got.drafted == 6


def test_the_proposer_replayed_drafts_the_chain_drafters_chains_when_drafts_are_free() -> None:
    """The vLLM proposer at one request, a draft token free: the chain drafter's whole chains,
    step for step; at a draft token's price above any gain, nothing."""
    from latticekit.eval.chain_replay import LatticekitChains
    from latticekit.vllm.replay import ProposerChains

    prompt = [1, 2, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 9]
    streams = [(prompt, [1, 2, 10, 11, 12, 13, 14, 15, 16, 17, 3, 1, 2, 10, 11]),
               ([4, 5, 6, 7, 8, 4, 5], [6, 7, 8, 4, 5, 6, 7, 8, 30, 31])]
    free = replay_chains(streams, ProposerChains(4, 100, step_costs=(1.0, 0.0), memory_tokens=0), 4)
    chains = replay_chains(streams, LatticekitChains(100), 4)
    assert free.per_request == chains.per_request and free.drafted == chains.drafted > 0
    assert [d for d, _ in free.drafts] == [d for d, _ in chains.drafts]
    assert sum(d for d, _ in free.drafts) == free.drafted
    dear = replay_chains(streams, ProposerChains(4, 100, step_costs=(1.0, 100.0), memory_tokens=0), 4)
    assert dear.drafted == 0 and [calls for _, calls in dear.per_request] == [15, 10]


def test_the_proposer_replayed_learns_the_simulated_engines_step_costs() -> None:
    """With a simulated engine, the proposer fits its steps' seconds as an engine's: a + b n."""
    from latticekit.vllm.replay import ProposerChains

    text = [7, 3, 9, 4, 1, 8, 2, 6, 5, 11, 12, 13, 14, 15, 16, 17]
    streams = [([100 + r] + text, (text * 3)[r % 5:][:40]) for r in range(6)]
    source = ProposerChains(8, 200, engine=(0.1, 0.004))
    got = replay_chains(streams, source, 8)
    assert got.drafted > 0 and source.proposer.stats()["errors"] == 0
    a, b, _ = source.proposer.costs.coefficients()
    assert a == pytest.approx(0.1, rel=1e-6) and b == pytest.approx(0.004, rel=1e-4)
