"""The fast paths of the adapter against their plain references.

* ``DraftTree.from_drafts`` builds small batches by comparing all drafts' prefixes at once and
  large ones by walking the trie: both must give the same tree.
* ``tree_pass_inputs`` fills the mask from a per-tree cached block: it must equal a mask built
  position by position.
* ``commit_accepted`` leaves leading nodes in place, copies one run of rows without an index,
  or gathers through an index; on a ``SlabCache``, a ``DynamicCache`` and a ``KVCache`` every
  case must equal a plain gather of the kept rows.
* ``SlabCache`` behaves as ``DynamicCache``: same logits, growth, crop, batch operations.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import DynamicCache, LlamaConfig

import latticekit.torch.slab as slab_module
from latticekit.torch import CacheError, DraftTree, KVCache, SlabCache, commit_accepted, new_cache, prefill
from latticekit.torch.target import cache_keyword
from latticekit.torch.verify import tree_pass_inputs
from lk_torch_helpers import VOCAB, PlainDecoder, tiny_gpt2, tiny_llama

drafts_strategy = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=6), min_size=1, max_size=12)


@settings(max_examples=150, deadline=None)
@given(drafts=drafts_strategy)
def test_vectorised_build_equals_trie_walk(drafts: list[list[int]]) -> None:
    lengths = np.array([len(d) for d in drafts])
    padded = np.full((len(drafts), lengths.max()), -1, dtype=np.int64)
    for i, d in enumerate(drafts):
        padded[i, : len(d)] = d
    fast = DraftTree._build_vectorised(padded, lengths)
    walk = DraftTree._build_walk(padded, lengths)
    for name in ("tokens", "parents", "depths", "draft_nodes", "draft_lengths"):
        np.testing.assert_array_equal(getattr(fast, name), getattr(walk, name), err_msg=name)
        assert getattr(fast, name).dtype == np.int64
    assert fast._child == walk._child
    np.testing.assert_array_equal(fast.ancestors(), walk.ancestors())


def test_many_drafts_take_the_walk(monkeypatch: Any) -> None:
    import latticekit.torch.tree as tree_module

    drafts = np.random.default_rng(0).integers(0, 3, (40, 5))
    reference = DraftTree.from_drafts(drafts)
    monkeypatch.setattr(tree_module, "_VECTOR_BUILD_MAX_DRAFTS", 8)
    walked = DraftTree.from_drafts(drafts)
    assert walked._child_map is not None  # built by the walk
    np.testing.assert_array_equal(walked.draft_nodes, reference.draft_nodes)


@settings(max_examples=60, deadline=None)
@given(drafts=drafts_strategy, prefix_len=st.integers(1, 6),
       dtype=st.sampled_from([torch.bool, torch.float32, torch.bfloat16, torch.float16, torch.float64]))
def test_pass_inputs_equal_a_position_by_position_mask(drafts: list[list[int]], prefix_len: int,
                                                      dtype: torch.dtype) -> None:
    tree = DraftTree.from_drafts(drafts)
    prefix = torch.arange(prefix_len) + 10
    for _ in range(2):  # the second call uses the cached block
        input_ids, positions, mask = tree_pass_inputs(tree, prefix, torch.from_numpy(tree.tokens), dtype)
        n = tree.num_nodes
        assert input_ids.tolist() == [[prefix_len + 9] + tree.tokens.tolist()]
        assert positions.tolist() == [[prefix_len - 1] + (tree.depths + prefix_len).tolist()]
        assert mask.shape == (1, 1, n + 1, prefix_len + n) and mask.dtype == dtype
        for q in range(n + 1):
            for k in range(prefix_len + n):
                if k < prefix_len:
                    visible = True
                else:
                    node = k - prefix_len
                    visible = q > 0 and node in tree.path(q - 1).tolist()
                value = mask[0, 0, q, k].item()
                if dtype == torch.bool:
                    assert value == visible
                else:
                    assert value == (0 if visible else torch.finfo(dtype).min)


LAYERS, HEADS, DIM = 3, 2, 4


def _filled(kind: str, length: int, seed: int = 0) -> tuple[Any, list[torch.Tensor]]:
    """A cache of ``kind`` holding ``length`` random positions, and a copy of its tensors."""
    gen = torch.Generator().manual_seed(seed)
    tensors = [torch.randn(1, HEADS, length, DIM, generator=gen) for _ in range(2 * LAYERS)]
    if kind == "kv":
        cache: Any = KVCache()
    elif kind == "dynamic":
        cache = DynamicCache()
    else:
        cache = SlabCache(LlamaConfig(num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                      num_key_value_heads=HEADS, hidden_size=HEADS * DIM))
    for layer in range(LAYERS):
        k, v = tensors[2 * layer].clone(), tensors[2 * layer + 1].clone()
        if kind == "kv":
            cache.update(layer, k, v)
        else:
            cache.update(k, v, layer)
    return cache, tensors


def _layer_tensors(cache: Any) -> list[torch.Tensor]:
    if isinstance(cache, KVCache):
        return [t for pair in zip(cache.keys, cache.values) for t in pair]
    return [t for layer in cache.layers for t in (layer.keys, layer.values)]


@pytest.mark.parametrize("kind", ["slab", "dynamic", "kv"])
@pytest.mark.parametrize(
    "nodes",
    [[], [0], [0, 1, 2], [3], [0, 1, 5, 6, 7], [0, 2, 3], [1, 2, 3, 4], [0, 4, 9, 11], [2, 5, 6, 12, 13]],
    ids=lambda n: "-".join(map(str, n)) or "none",
)
def test_commit_equals_a_plain_gather(kind: str, nodes: list[int]) -> None:
    """In place, one clear run ([0,1,5,6,7]), an overlapping run ([0,2,3], [1,2,3,4]), several runs."""
    prefix, num_nodes = 5, 14
    cache, tensors = _filled(kind, prefix + num_nodes)
    commit_accepted(cache, prefix, num_nodes, nodes)
    keep = list(range(prefix)) + [prefix + n for n in nodes]
    assert cache.get_seq_length() == len(keep)
    for got, original in zip(_layer_tensors(cache), tensors):
        torch.testing.assert_close(got, original[..., keep, :], rtol=0, atol=0)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_new_cache_is_a_slab_cache_with_dynamic_cache_logits(arch: str) -> None:
    model = tiny_llama() if arch == "llama" else tiny_gpt2()
    assert isinstance(new_cache(model), SlabCache) and isinstance(new_cache(model), DynamicCache)
    ids = torch.tensor([3, 17, 42, 8, 25, 60, 11, 5, 9])
    slab = prefill(model, ids[:5])
    plain = DynamicCache(config=model.config)
    prefill(model, ids[:5], past_key_values=plain)
    for cache in (slab, plain):
        cache.crop(-1)  # back to 3 positions, then one more pass of 6 tokens
    keyword = cache_keyword(type(model))
    out_slab = model(input_ids=ids[None, 3:], use_cache=True, **{keyword: slab}).logits
    out_plain = model(input_ids=ids[None, 3:], use_cache=True, **{keyword: plain}).logits
    torch.testing.assert_close(out_slab, out_plain, rtol=0, atol=1e-6)
    assert slab.get_seq_length() == plain.get_seq_length() == len(ids)
    for mine, ref in zip(slab.layers, plain.layers):
        torch.testing.assert_close(mine.keys, ref.keys, rtol=0, atol=0)


def test_slab_grows_and_supports_batch_operations(monkeypatch: Any) -> None:
    monkeypatch.setattr(slab_module, "_SLAB_ROUND", 4)
    cache, tensors = _filled("slab", 6)
    assert cache._slab.capacity == 8
    extra = [torch.randn(1, HEADS, 5, DIM) for _ in range(2 * LAYERS)]
    for layer in range(LAYERS):
        keys, values = cache.update(extra[2 * layer], extra[2 * layer + 1], layer)
        assert keys.shape == (1, HEADS, 11, DIM)
    assert cache._slab.capacity == 12 and cache.get_seq_length() == 11
    for got, first, more in zip(_layer_tensors(cache), tensors, extra):
        torch.testing.assert_close(got, torch.cat([first, more], dim=-2), rtol=0, atol=0)
    cache.batch_repeat_interleave(3)
    assert cache.layers[0].keys.shape == (3, HEADS, 11, DIM)
    cache.batch_select_indices(torch.tensor([0, 2]))
    cache.reorder_cache(torch.tensor([1, 0]))
    # Rows 0 and 2 of three copies of batch row 0, then swapped: batch row 1 is the original.
    torch.testing.assert_close(cache.layers[1].values[1], torch.cat([tensors[3], extra[3]], dim=-2)[0],
                               rtol=0, atol=0)
    cache.reset()
    assert cache.get_seq_length() == 0
    with pytest.raises(CacheError):
        cache.layers[0].keys = torch.zeros(1)
    with pytest.raises(CacheError, match="on the SlabCache"):
        cache.layers[0].batch_repeat_interleave(2)
    with pytest.raises(CacheError, match="do not fit"):
        cache.update(torch.zeros(1, HEADS + 1, 2, DIM), torch.zeros(1, HEADS + 1, 2, DIM), 0)


def test_slab_cache_refuses_sliding_window_configs() -> None:
    from transformers import MistralConfig

    config = MistralConfig(num_hidden_layers=2, hidden_size=16, num_attention_heads=2, sliding_window=4)
    assert not SlabCache.supports(config)
    with pytest.raises(CacheError, match="sliding_attention"):
        SlabCache(config)


def test_plain_decoder_reference_still_uses_dynamic_cache() -> None:
    # The losslessness tests compare against this: it must stay the ordinary HF cache.
    assert type(PlainDecoder(tiny_llama()).cache) is DynamicCache
    assert VOCAB == 64


def test_lazy_row_argmax_equals_the_batched_argmax() -> None:
    from latticekit.torch.logits import ArgmaxRows, TreeLogits

    logits = torch.randn(20, 300, generator=torch.Generator().manual_seed(1))
    logits[3, [7, 9]] = 50.0  # a tie: the first index wins in both
    tree = DraftTree.from_drafts([list(range(19))])
    lazy = ArgmaxRows(TreeLogits.complete(tree, torch.zeros(20, 4), logits))
    assert [lazy[i] for i in range(20)] == logits.argmax(dim=-1).tolist()
    assert lazy[3] == 7


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_hf_generate_with_a_slab_cache_equals_plain_generate(arch: str) -> None:
    """prefill() hands out SlabCaches: HF's own greedy and beam search must work on them."""
    model = tiny_llama() if arch == "llama" else tiny_gpt2()
    ids = torch.tensor([[3, 17, 42, 8, 25]])
    for kwargs in ({"max_new_tokens": 12}, {"max_new_tokens": 6, "num_beams": 3}):
        slab = {cache_keyword(type(model)): SlabCache(model.config)}
        mine = model.generate(ids, do_sample=False, pad_token_id=0, **slab, **kwargs)
        plain = model.generate(ids, do_sample=False, pad_token_id=0, **kwargs)
        assert mine.tolist() == plain.tolist()
