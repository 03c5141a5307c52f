"""``lk.generate`` gives HF greedy's exact tokens on a tiny random model of every causal-LM family
a user would bring: full attention, sliding windows (Mistral, Qwen 2, Phi-3, Starcoder 2 with
``sliding_window`` set; Gemma 2/3, GPT-OSS, Cohere 2, EXAONE 4, OLMo 3 mixing sliding and full
layers), chunked attention (Llama 4), and the models latticekit cannot verify trees for, which
decode without drafts after one warning: caches that cannot be committed (linear attention,
convolution and recurrent states) and attention that places its biases by key order (ALiBi,
GPT-Neo's local layers).

Each family is one test id; the sliding families' window (8) is shorter than every long prompt
and than prompt plus generation. A family this transformers does not ship is skipped with the
reason. The references are HF ``model.generate(do_sample=False)`` on the same prepared model.
"""

from __future__ import annotations

import warnings
from typing import Any, Optional

import pytest
import torch
from transformers import DynamicCache

import latticekit as lk
from decoding.decoding_helpers import PeekingHeads
from latticekit.decoding.costs import StepCosts
from latticekit.errors import CacheError, UnsupportedModelError
from latticekit.torch import DraftTree, prepare_target, verify
from latticekit.torch.target import Target
from lk_torch_helpers import tiny_family

WINDOW = 8
NEW_TOKENS = 12
SHORT_PROMPT = [3, 17, 42, 8, 25]  # shorter than the window
LONG_PROMPT = [(7 * i + 3) % 120 + 2 for i in range(3 * WINDOW + 5)]  # 3.6 windows
COSTS = StepCosts([0, 1, 8, 64], [0.010, 0.010, 0.011, 0.020], 50, draft_s=0.0001)
MIXED = ["sliding_attention", "full_attention"]
MOE = dict(num_local_experts=4, num_experts_per_tok=2)

#: family id -> (model_type, config fields over FAMILY_BASE, attention implementation)
FULL: dict[str, tuple[str, dict[str, Any], str]] = {
    "gpt2": ("gpt2", {}, "sdpa"),
    "llama": ("llama", {}, "sdpa"),
    "qwen2": ("qwen2", {}, "sdpa"),
    "qwen3": ("qwen3", {}, "sdpa"),
    "qwen3_moe": ("qwen3_moe", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32), "sdpa"),
    "mixtral": ("mixtral", MOE, "sdpa"),
    "mistral": ("mistral", dict(sliding_window=None), "sdpa"),
    "phi3": ("phi3", {}, "sdpa"),
    "opt": ("opt", dict(ffn_dim=64, word_embed_proj_dim=32), "sdpa"),
    "falcon": ("falcon", {}, "sdpa"),
    "granite": ("granite", {}, "sdpa"),
    "olmo": ("olmo", {}, "sdpa"),
    "olmo2": ("olmo2", {}, "sdpa"),
    "cohere": ("cohere", dict(logit_scale=0.5), "sdpa"),
    "gemma": ("gemma", {}, "sdpa"),
    "phi": ("phi", {}, "sdpa"),
    "starcoder2": ("starcoder2", dict(sliding_window=None), "sdpa"),
    "stablelm": ("stablelm", {}, "sdpa"),
    "gptj": ("gptj", dict(rotary_dim=4), "eager"),
    "gpt_neox": ("gpt_neox", {}, "sdpa"),
    "smollm3": ("smollm3", {}, "sdpa"),
    "glm": ("glm", {}, "sdpa"),
    "ernie4_5": ("ernie4_5", {}, "sdpa"),
    "seed_oss": ("seed_oss", {}, "sdpa"),
    "granitemoe": ("granitemoe", MOE, "sdpa"),
    "olmoe": ("olmoe", dict(num_experts=4, num_experts_per_tok=2), "sdpa"),
    "deepseek_v3": ("deepseek_v3", dict(num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2,
                                        moe_intermediate_size=32, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8,
                                        qk_nope_head_dim=8, v_head_dim=8, first_k_dense_replace=1, n_group=1,
                                        topk_group=1), "sdpa"),
    "gpt_bigcode": ("gpt_bigcode", dict(n_layer=2, n_head=4, n_embd=32), "sdpa"),
    "codegen": ("codegen", dict(n_layer=2, n_head=4, n_embd=32, rotary_dim=4), "eager"),
    "helium": ("helium", {}, "sdpa"),
}
SLIDING: dict[str, tuple[str, dict[str, Any], str]] = {
    "mistral-window": ("mistral", dict(sliding_window=WINDOW), "sdpa"),
    "mixtral-window": ("mixtral", dict(sliding_window=WINDOW, **MOE), "sdpa"),
    "qwen2-window": ("qwen2", dict(use_sliding_window=True, sliding_window=WINDOW, layer_types=MIXED), "sdpa"),
    "phi3-window": ("phi3", dict(sliding_window=WINDOW), "sdpa"),
    "starcoder2-window": ("starcoder2", dict(sliding_window=WINDOW), "sdpa"),
    "gemma2": ("gemma2", dict(sliding_window=WINDOW, layer_types=MIXED), "eager"),  # no sdpa from 5.24
    "gemma3_text": ("gemma3_text", dict(sliding_window=WINDOW, layer_types=MIXED), "sdpa"),
    "gpt_oss": ("gpt_oss", dict(sliding_window=WINDOW, layer_types=MIXED, **MOE), "eager"),
    "cohere2": ("cohere2", dict(sliding_window=WINDOW, layer_types=MIXED), "sdpa"),
    "exaone4": ("exaone4", dict(sliding_window=WINDOW, layer_types=MIXED), "sdpa"),
    "olmo3": ("olmo3", dict(sliding_window=WINDOW, layer_types=MIXED), "sdpa"),
    "ministral": ("ministral", dict(sliding_window=WINDOW, layer_types=MIXED), "sdpa"),
    "llama4_text-chunked": ("llama4_text", dict(attention_chunk_size=WINDOW, layer_types=["chunked_attention", "full_attention"],
                                                no_rope_layers=[1, 1], num_local_experts=2, intermediate_size_mlp=64), "sdpa"),
}
#: family id -> (model_type, config fields, attention, what the warning names, verify's typed error)
PLAIN: dict[str, tuple[str, dict[str, Any], str, str, type]] = {
    "lfm2": ("lfm2", dict(layer_types=["conv", "full_attention"]), "sdpa", "LinearAttentionLayer", CacheError),
    "qwen3_next": ("qwen3_next", dict(layer_types=["linear_attention", "full_attention"], num_experts=4,
                                      num_experts_per_tok=2, moe_intermediate_size=32, linear_num_value_heads=4,
                                      linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8),
                   "sdpa", "LinearAttentionLayer", CacheError),
    "jamba": ("jamba", dict(attn_layer_period=2, attn_layer_offset=1, num_experts=2, expert_layer_period=2,
                            mamba_d_state=8), "sdpa", "LinearAttentionLayer", CacheError),
    "falcon_h1": ("falcon_h1", dict(mamba_d_ssm=32, mamba_n_heads=4, mamba_d_head=8, mamba_d_state=8,
                                    mamba_n_groups=1, mamba_chunk_size=16), "sdpa",
                  "LinearAttentionAndFullAttentionLayer", CacheError),
    "mamba": ("mamba", dict(state_size=8), "eager", "LinearAttentionLayer", CacheError),
    # a cache class of its own (MiniMaxCache before 5.24): the plain decode takes the model's
    "minimax": ("minimax", dict(layer_types=["linear_attention", "full_attention"], num_local_experts=2), "sdpa",
                "LinearAttentionLayer", CacheError),
    # position biases and local windows placed by key order, not position
    "bloom": ("bloom", dict(n_layer=2, n_head=4), "eager", "ALiBi", UnsupportedModelError),
    "mpt": ("mpt", dict(d_model=32, n_heads=4, n_layers=2), "eager", "ALiBi", UnsupportedModelError),
    "falcon-alibi": ("falcon", dict(alibi=True), "eager", "ALiBi", UnsupportedModelError),
    "gpt_neo": ("gpt_neo", dict(window_size=WINDOW, attention_types=[[["global", "local"], 1]], num_layers=2),
                "eager", "local attention", UnsupportedModelError),
}


def build(model_type: str, fields: dict[str, Any], attn: str) -> Any:
    """A tiny seeded model of the family, prepared as ``lk.generate`` prepares it."""
    return prepare_target(tiny_family(model_type, attn, **fields))


def hf_greedy(model: Any, prompt: list[int], new_tokens: int = NEW_TOKENS) -> list[int]:
    out = model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                         do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def check_family(model: Any, window: Optional[int]) -> None:
    for prompt in (SHORT_PROMPT, LONG_PROMPT):
        if window is not None:
            assert len(prompt) + NEW_TOKENS > window and (prompt is SHORT_PROMPT or len(prompt) > 3 * window)
        reference = hf_greedy(model, prompt)
        heads = PeekingHeads(model, prompt + reference + [0] * 8, num_heads=4)
        with_heads = lk.generate(model, prompt, heads=heads, max_new_tokens=NEW_TOKENS, eos_token_id=[], costs=COSTS)
        assert with_heads.tokens == reference
        # the heads' trees were verified: accepted nodes committed, rejected ones dropped
        assert sum(step.num_accepted for step in with_heads.steps) >= NEW_TOKENS // 4
        assert any(len(step.drafts) > 1 or step.num_accepted < len(step.drafts[0])
                   for step in with_heads.steps if step.drafts)


@pytest.mark.parametrize("family", list(FULL))
def test_full_attention_family_matches_hf_greedy(family: str) -> None:
    check_family(build(*FULL[family]), None)


@pytest.mark.parametrize("family", list(SLIDING))
def test_windowed_family_matches_hf_greedy(family: str) -> None:
    model = build(*SLIDING[family])
    windows = Target(model).attention_windows(Target(model).new_cache())
    assert windows is not None and any(w.size == WINDOW for w in windows)
    check_family(model, WINDOW)


@pytest.mark.parametrize("family", list(PLAIN))
def test_unverifiable_family_decodes_plainly_with_one_warning(family: str) -> None:
    model_type, fields, attn, named, error = PLAIN[family]
    model = build(model_type, fields, attn)
    for prompt in (SHORT_PROMPT, LONG_PROMPT):
        reference = hf_greedy(model, prompt)
        heads = PeekingHeads(model, prompt + reference + [0] * 8, num_heads=4)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = lk.generate(model, prompt, heads=heads, max_new_tokens=NEW_TOKENS, eos_token_id=[], costs=COSTS)
        ours = [w for w in caught if "latticekit.generate" in str(w.message)]
        assert len(ours) == 1 and named in str(ours[0].message) and ours[0].filename == __file__
        assert out.tokens == reference
        assert all(len(step.emitted) == 1 and not step.drafts for step in out.steps)
    # verify itself keeps its typed error, before it writes to any cache
    with pytest.raises(error, match=named):
        verify(model, DynamicCache(config=model.config), [SHORT_PROMPT[0]], DraftTree.from_drafts([[5, 6]]))


@pytest.mark.parametrize("family", ["gemma3_text", "lfm2"])
def test_sampling_over_windows_and_plainly(family: str) -> None:
    """``temperature > 0`` decodes over a mixed sliding/full model (the tree-sampling rule, whose
    per-step logits ``test_windows.py`` checks against plain decoding) and, after the warning,
    over one whose cache takes no tree; both reproducible under a seeded generator."""
    model_type, fields, attn = SLIDING[family] if family in SLIDING else PLAIN[family][:3]
    model = build(model_type, fields, attn)
    heads = PeekingHeads(model, LONG_PROMPT + hf_greedy(model, LONG_PROMPT) + [0] * 8, num_heads=4)
    runs = []
    for _ in range(2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = lk.generate(model, LONG_PROMPT, heads=heads, max_new_tokens=NEW_TOKENS, eos_token_id=[], costs=COSTS,
                              temperature=0.8, generator=torch.Generator().manual_seed(5))
        assert len([w for w in caught if "latticekit.generate" in str(w.message)]) == (family in PLAIN)
        runs.append(out.tokens)
    assert runs[0] == runs[1] and len(runs[0]) == NEW_TOKENS
