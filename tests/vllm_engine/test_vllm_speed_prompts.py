"""``benchmarks/vllm_speed.py`` gives every phase (concurrency level) prompts of its own and warms
up on requests no phase uses, one to start and one per level for its warm-up burst: a proposer
with a memory of past answers (vLLM's ``suffix``) never drafts a request whose answer it has
already seen."""

from __future__ import annotations

from vllm_helpers import vllm_speed_module


def test_phases_get_distinct_prompts():
    bench = vllm_speed_module()
    counts = bench.phase_counts([1, 4, 16], groups=3)
    assert counts == [3, 12, 48]
    for domain, texts in bench.requests(sum(counts) + 1 + len(counts), list(bench.DOMAINS)).items():
        phases, warmups = bench.deal(texts, counts)
        assert [len(p) for p in phases] == counts, domain
        assert len(warmups) == 1 + len(counts), domain  # the engines' warm-up, then each level's burst
        used = [t for p in phases for t in p] + warmups
        assert len(set(used)) == len(used), domain
        assert phases[0] == texts[:3], domain  # concurrency 1 keeps the first requests in id order
    assert bench.phase_counts([1, 16], groups=3, sustained=2) == [6, 96]  # a group of 2 x 16 kept 16 in flight


def test_a_warm_up_burst_is_numbered_copies_of_its_request_through_the_chat_template():
    from transformers import AutoTokenizer

    from vllm_helpers import model_folder

    bench = vllm_speed_module()
    tok = AutoTokenizer.from_pretrained(model_folder())
    text = "Explain what a hash table is in two sentences."
    one = bench.chat_prompt(tok, text)
    assert one == tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                          tokenize=False)
    burst = bench.burst_prompts(tok, text, 16)
    assert len(burst) == len(set(burst)) == 16  # distinct prompts: no prefix cache serves one from another
    assert burst[0] == bench.chat_prompt(tok, f"Request 1. {text}") and all(text in p for p in burst)
