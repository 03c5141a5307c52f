"""``prepare_target``: packed linears, fused sibling projections and grouped-query attention
compute what the plain model computes (up to rounding), decode exactly like the prepared
model's own greedy decoding, and leave the model's parameters and state dict alone."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from latticekit.torch import DraftTree, PackedLinear, prefill, prepare_heads, prepare_target, tree_forward
from latticekit.torch.prepare import ATTENTION, grouped_sdpa
from lk_torch_helpers import TinyProtocolLM, tiny_cohere, tiny_gpt2, tiny_llama

MODELS = {"llama": tiny_llama, "gpt2": tiny_gpt2, "cohere": tiny_cohere, "protocol": TinyProtocolLM}


def logits_of(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(ids) if not isinstance(model, TinyProtocolLM) else None
    if out is not None:
        return out.logits
    n = ids.shape[1]
    from latticekit.torch import KVCache

    mask = torch.tril(torch.ones(n, n, dtype=torch.bool))[None, None]
    with torch.no_grad():
        return model(ids, torch.arange(n)[None], mask, KVCache())[0]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_prepared_model_computes_the_same_logits(name: str) -> None:
    plain = MODELS[name]()
    prepared = prepare_target(copy.deepcopy(plain))
    ids = torch.randint(0, 64, (1, 40), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(logits_of(prepared, ids), logits_of(plain, ids), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["llama", "cohere"])
def test_tree_pass_of_a_prepared_model_matches(name: str) -> None:
    plain = MODELS[name]()
    prepared = prepare_target(copy.deepcopy(plain))
    assert prepared.config._attn_implementation == ATTENTION  # grouped-query: 4 heads over 2
    prefix = torch.tensor([3, 17, 42, 8, 25, 60, 11])
    tree = DraftTree.from_drafts([[5, 6, 7, 8], [5, 6, 9], [10, 11], [12]])
    outs = []
    for model in (plain, prepared):
        cache = prefill(model, prefix)
        outs.append(tree_forward(model, cache, prefix, tree))
    torch.testing.assert_close(outs[1].logits, outs[0].logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(outs[1].hidden_states, outs[0].hidden_states, rtol=1e-4, atol=1e-4)


def test_preparation_is_idempotent_and_keeps_parameters() -> None:
    model = tiny_llama()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params = {k: v for k, v in model.named_parameters()}
    prepare_target(model)
    layers = list(model.modules())
    prep = model.latticekit_preparation
    assert prep.packed == 2 * 7 + 1 and prep.fused == 2 * 2 and prep.attention == ATTENTION
    assert prepare_target(model) is model and list(model.modules()) == layers
    assert model.latticekit_preparation is prep
    after = model.state_dict()
    assert list(after) == list(before)
    for key in before:
        torch.testing.assert_close(after[key], before[key], rtol=0, atol=0)
    for key, param in model.named_parameters():
        assert param is params[key]  # the same tensors: nothing copied into the model
    assert isinstance(model.model.layers[0].self_attn.q_proj, PackedLinear)
    assert isinstance(model.get_output_embeddings(), PackedLinear)


def test_packed_linear_falls_back_where_it_cannot_serve() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(8, 5)
    packed = PackedLinear(linear)
    x = torch.randn(3, 4, 8)
    with torch.no_grad():
        torch.testing.assert_close(packed(x), linear(x), rtol=1e-5, atol=1e-5)
        assert packed(torch.randn(1, 8)).shape == (1, 5)
    y = torch.randn(2, 8, requires_grad=True)
    packed(y).sum().backward()  # autograd: F.linear on the original weight
    assert y.grad is not None and linear.weight.grad is not None
    for fails in (linear, packed):  # another dtype: the same error as nn.Linear's
        with pytest.raises(RuntimeError, match="dtype"):
            fails(x.double())


@pytest.mark.parametrize("change", ["load_state_dict", "in_place", "to_bfloat16", "replaced", "bias"])
def test_prepared_model_never_reads_a_stale_packed_weight(change: str) -> None:
    """Weights changed after prepare_target (loaded, written in place, converted, or a
    parameter replaced; fused siblings included) are what the prepared model then computes
    with: its logits match the plain model changed the same way."""
    torch.manual_seed(0)
    plain = tiny_llama()
    prepared = prepare_target(copy.deepcopy(plain))
    ids = torch.randint(0, 50, (1, 7))
    logits_of(prepared, ids)  # packed copies made and used before the change
    other = tiny_llama()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.05 * torch.randn_like(p))
    attention = prepared.model.layers[0].self_attn
    if change == "load_state_dict":
        prepared.load_state_dict(other.state_dict())
        plain.load_state_dict(other.state_dict())
    elif change == "in_place":  # one fused sibling and one lone linear
        with torch.no_grad():
            for model in (plain, prepared):
                model.model.layers[0].self_attn.k_proj.weight.mul_(1.5)
                model.get_output_embeddings().weight.add_(0.1)
    elif change == "to_bfloat16":
        plain, prepared = plain.to(torch.bfloat16), prepared.to(torch.bfloat16)
    elif change == "replaced":  # a fused sibling's parameter replaced: it leaves the shared GEMM
        for model in (plain, prepared):
            proj = model.model.layers[0].mlp.up_proj
            proj.weight = nn.Parameter(proj.weight.detach() * 0.5, requires_grad=False)
    else:
        with torch.no_grad():
            for model in (plain, prepared):
                v = model.model.layers[0].self_attn.v_proj
                if v.bias is None:
                    v.bias = nn.Parameter(torch.zeros(v.out_features))
                v.bias.add_(0.3)
    want, got = logits_of(plain, ids), logits_of(prepared, ids)
    tolerance = 2e-2 if change == "to_bfloat16" else 1e-4
    torch.testing.assert_close(got.float(), want.float(), rtol=tolerance, atol=tolerance)
    assert isinstance(attention.q_proj, PackedLinear)


@pytest.mark.parametrize("bfloat16_packs", [True, False])
def test_bfloat16_weights_are_packed_only_where_onednn_packs_them(monkeypatch: pytest.MonkeyPatch,
                                                                   bfloat16_packs: bool) -> None:
    """oneDNN packs bfloat16 weights only where its bfloat16 kernels run (not on an AVX2-only
    CPU, where packing raises): ``packable`` says so, a bfloat16 model prepared there keeps plain
    linears, a float32 one converted after preparing computes with ``F.linear``, and the
    candidate lattices' bfloat16 rows stay unpacked; both ways the logits and drafts are the
    plain model's. The branch this CPU does not take is forced."""
    from latticekit.decoding import lattices
    from latticekit.decoding.lattices import lattice_source
    from latticekit.heads.modules import BlockHeads
    from latticekit.torch import prepare

    assert prepare.packable(torch.float32) == torch.backends.mkldnn.is_available()
    assert not prepare.packable(torch.float16) and not prepare.packable(torch.float64)
    native = prepare.packable(torch.bfloat16)
    assert native == (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    if bfloat16_packs and not native:
        pytest.skip("oneDNN does not pack bfloat16 on this CPU")
    rule = (lambda dtype: dtype == torch.float32) if not bfloat16_packs else prepare.packable
    monkeypatch.setattr(prepare, "packable", rule)
    monkeypatch.setattr(lattices, "packable", rule)
    torch.manual_seed(0)
    plain = tiny_llama().to(torch.bfloat16)
    ids = torch.randint(0, 50, (1, 7))
    prepared = prepare_target(copy.deepcopy(plain))
    linears = [m for m in prepared.modules() if isinstance(m, (nn.Linear, PackedLinear))]
    assert linears and all(isinstance(m, PackedLinear) == bfloat16_packs for m in linears)
    converted = prepare_target(tiny_llama()).to(torch.bfloat16)  # packed in float32, then converted
    converted.load_state_dict(plain.state_dict())
    for model in (prepared, converted):
        torch.testing.assert_close(logits_of(model, ids).float(), logits_of(plain, ids).float(),
                                   rtol=2e-2, atol=2e-2)
    heads = BlockHeads.for_model(tiny_llama(), num_heads=3)
    lattices._PACKED.clear()
    source = lattice_source(heads, 4, 64, np.arange(40), "bfloat16")
    assert source._rows.dtype == torch.bfloat16 and (source._packed is not None) == bfloat16_packs
    hidden = torch.randn(heads.lm_head.weight.shape[1], generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = source(hidden, [1, 2])[0]
        want = lattice_source(heads, 4, 64, np.arange(40), "model")(hidden, [1, 2])[0]
    np.testing.assert_allclose(got.scores, want.scores, atol=0.05)
    lattices._PACKED.clear()


def test_packed_weights_made_in_inference_mode_serve() -> None:
    with torch.inference_mode():
        linear = nn.Linear(8, 5)
        x = torch.randn(3, 8)
        packed = PackedLinear(linear)
        torch.testing.assert_close(packed(x), linear(x), rtol=1e-5, atol=1e-5)


class _Attention(nn.Module):
    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups


@settings(max_examples=40, deadline=None)
@given(kv_heads=st.integers(1, 3), groups=st.integers(1, 4), n=st.integers(1, 9), cached=st.integers(0, 12),
       seed=st.integers(0, 2**16))
def test_grouped_sdpa_equals_repeated_keys(kv_heads: int, groups: int, n: int, cached: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    dim = 8
    query = torch.randn(1, kv_heads * groups, n, dim, generator=g)
    key = torch.randn(1, kv_heads, cached + n, dim, generator=g)
    value = torch.randn(1, kv_heads, cached + n, dim, generator=g)
    visible = torch.rand(1, 1, n, cached + n, generator=g) < 0.7
    visible[..., cached:] |= torch.eye(n, dtype=torch.bool)  # every query sees itself
    mask = torch.where(visible, 0.0, torch.finfo(torch.float32).min)
    out, _ = grouped_sdpa(_Attention(groups), query, key, value, mask, scaling=dim ** -0.5)
    rep_k = key.repeat_interleave(groups, dim=1)
    rep_v = value.repeat_interleave(groups, dim=1)
    want = nn.functional.scaled_dot_product_attention(query, rep_k, rep_v, attn_mask=mask).transpose(1, 2)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


class _Heads(nn.Module):
    def __init__(self, model: Any) -> None:
        super().__init__()
        self.num_heads = 3
        self.lm_head = model.get_output_embeddings()
        self.maps = nn.ModuleList(nn.Linear(32, 32) for _ in range(2))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.stack([self.lm_head(hidden)] + [self.lm_head(hidden + m(hidden)) for m in self.maps], dim=-2)


def test_heads_share_the_prepared_output_projection() -> None:
    model = tiny_llama()
    heads = _Heads(model)
    hidden = torch.randn(5, 32)
    with torch.no_grad():
        want = heads(hidden)
    with pytest.raises(ValueError, match="prepare the target first"):
        prepare_heads(heads, model)
    prepare_target(model, heads=heads)
    assert heads.lm_head is model.get_output_embeddings() and isinstance(heads.lm_head, PackedLinear)
    assert all(isinstance(m, PackedLinear) for m in heads.maps)
    with torch.no_grad():
        torch.testing.assert_close(heads(hidden), want, rtol=1e-5, atol=1e-5)
    assert prepare_heads(heads, model) is heads


def test_prepared_decoders_reproduce_the_prepared_greedy_decode() -> None:
    from latticekit.decoding import DecoderConfig, decode, greedy_decode

    model = prepare_target(tiny_llama())
    heads = _Heads(model)
    prepare_heads(heads, model)
    prompt = [3, 17, 42, 8, 25, 60, 11]
    want = greedy_decode(model, prompt, 30).tokens
    for spec in ("vanilla", "ngram:k=4,p=8,alpha=0"):
        assert decode(model, heads, prompt, DecoderConfig.parse(spec), max_new_tokens=30).tokens == want
    plain = np.array(greedy_decode(tiny_llama(), prompt, 30).tokens)
    assert (plain == np.array(want)).mean() > 0.9  # rounding may flip a near-tie, rarely


def test_weights_the_cpu_kernel_does_not_take_are_left_alone() -> None:
    # float64 here stands for any device or dtype oneDNN does not pack (a CUDA model): only the
    # grouped-query attention changes, and the model still decodes like the unprepared one
    plain = tiny_llama(dtype=torch.float64)
    prepared = prepare_target(copy.deepcopy(plain))
    prep = prepared.latticekit_preparation
    assert prep.packed == 0 and prep.fused == 0 and prep.attention == ATTENTION
    assert not any(isinstance(m, PackedLinear) for m in prepared.modules())
    prefix = torch.tensor([3, 17, 42, 8, 25, 60, 11])
    tree = DraftTree.from_drafts([[5, 6, 7], [5, 9], [10]])
    outs = [tree_forward(m, prefill(m, prefix), prefix, tree) for m in (plain, prepared)]
    torch.testing.assert_close(outs[1].logits, outs[0].logits, rtol=1e-9, atol=1e-9)
