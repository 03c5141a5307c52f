"""Tree passes over sliding-window and chunked layers (``latticekit.torch.windows``).

* The masks against a brute force over each node's path under transformers' own rules
  (``causal_mask_function``, ``sliding_window_overlay``, ``chunked_overlay``).
* Verification over a tiny Mistral with a window, a Gemma 2 mixing sliding and full layers, and
  a chunked Llama 4, at prompts 3-4 windows long, greedy and sampling: every step's logits are
  the plain causal decoder's, and after every commit each layer's cache holds exactly what the
  plain decoder's holds (a sliding layer its last window - 1 positions).
* Typed errors: a sliding layer that trimmed the tree before the commit, a cache that does not
  fit the model's layer types.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers import DynamicCache
from transformers.masking_utils import causal_mask_function, chunked_overlay, sliding_window_overlay

from latticekit.errors import CacheError
from latticekit.torch import DraftTree, commit_accepted, prefill, tree_forward, verify
from latticekit.torch.target import Target
from latticekit.torch.windows import LayerWindow, prefill_masks, tree_pass_masks
from lk_torch_helpers import PlainDecoder, plain_greedy, teacher_forced_logits, tiny_family

WINDOW = 6
NO_PADDING = torch.zeros(1, dtype=torch.long)


def hf_rule(window: LayerWindow, q: int, k: int) -> bool:
    """transformers' own predicate for a query at position q and a key at position k."""
    visible = bool(causal_mask_function(0, 0, q, k))
    if window.layer_type == "sliding_attention":
        visible &= bool(sliding_window_overlay(window.size)(0, 0, q, k))
    elif window.layer_type == "chunked_attention":
        visible &= bool(chunked_overlay(window.size, NO_PADDING)(0, 0, q, k))
    return visible


def reference_tree_mask(tree: DraftTree, prefix_len: int, window: LayerWindow) -> np.ndarray:
    """Row r (the root, then node r - 1) over the columns a layer of ``window``'s type holds: its
    cached positions before the root, the root, the nodes; visible when on the row's path and
    allowed by transformers' rule."""
    cached = window.cached
    key_positions = list(range(prefix_len - 1 - cached, prefix_len)) + [prefix_len + int(d) for d in tree.depths]
    out = np.zeros((tree.num_nodes + 1, len(key_positions)), dtype=bool)
    for row in range(tree.num_nodes + 1):
        path = set(tree.path(row - 1).tolist()) if row else set()
        q = prefix_len - 1 if row == 0 else prefix_len + int(tree.depths[row - 1])
        for col, k in enumerate(key_positions):
            on_path = col <= cached or (col - cached - 1) in path
            out[row, col] = on_path and hf_rule(window, q, k)
    return out


drafts_strategy = st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=9), min_size=1, max_size=5)


@given(drafts=drafts_strategy, prefix_len=st.integers(1, 30), size=st.integers(1, 10),
       kind=st.sampled_from(["sliding_attention", "chunked_attention", "full_attention"]), data=st.data())
def test_tree_masks_follow_transformers_rules_on_each_path(drafts: list[list[int]], prefix_len: int, size: int,
                                                           kind: str, data: Any) -> None:
    tree = DraftTree.from_drafts(drafts)
    if kind == "full_attention":
        window = LayerWindow(kind, None, prefix_len - 1)
    else:
        window = LayerWindow(kind, size, data.draw(st.integers(0, prefix_len - 1)))
    mask = tree_pass_masks(tree, prefix_len, [window], torch.bool)
    assert mask.shape == (1, 1, tree.num_nodes + 1, window.cached + 1 + tree.num_nodes)
    np.testing.assert_array_equal(mask[0, 0].numpy(), reference_tree_mask(tree, prefix_len, window))
    additive = tree_pass_masks(tree, prefix_len, [window], torch.float32)
    assert torch.equal(additive[0, 0] == 0, mask[0, 0])


@given(held=st.integers(0, 20), n=st.integers(1, 12), size=st.integers(1, 10),
       kind=st.sampled_from(["sliding_attention", "chunked_attention"]), data=st.data())
def test_prefill_masks_follow_transformers_rules(held: int, n: int, size: int, kind: str, data: Any) -> None:
    window = LayerWindow(kind, size, data.draw(st.integers(0, held)))
    full = LayerWindow("full_attention", None, held)
    masks = prefill_masks(held, held + n, [full, window], torch.bool)
    assert set(masks) == {"full_attention", kind}
    for w in (full, window):
        keys = range(held - w.cached, held + n)
        expected = [[hf_rule(w, q, k) for k in keys] for q in range(held, held + n)]
        np.testing.assert_array_equal(masks[w.layer_type][0, 0].numpy(), np.array(expected, dtype=bool))


MODELS = {
    "mistral-window": lambda: tiny_family("mistral", sliding_window=WINDOW),
    "gemma2": lambda: tiny_family("gemma2", "eager", sliding_window=WINDOW,  # eager: no sdpa from 5.24
                                  layer_types=["sliding_attention", "full_attention"]),
    "llama4_text-chunked": lambda: tiny_family("llama4_text", attention_chunk_size=WINDOW, no_rope_layers=[1, 1],
                                               layer_types=["chunked_attention", "full_attention"],
                                               num_local_experts=2, intermediate_size_mlp=64),
}


def cache_matches_plain(cache: Any, model: Any, ids: list[int]) -> None:
    """Each layer holds what a plain causal decoder fed ``ids[:-1]`` holds: same positions, same
    keys and values (a sliding layer: its last window - 1), same length."""
    plain = PlainDecoder(model)
    plain.feed(ids[:-1])
    assert cache.get_seq_length() == plain.cache.get_seq_length() == len(ids) - 1
    for ours, theirs in zip(cache.layers, plain.cache.layers):
        assert type(ours) is type(theirs)
        assert ours.keys.shape == theirs.keys.shape
        torch.testing.assert_close(ours.keys, theirs.keys, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(ours.values, theirs.values, atol=1e-5, rtol=1e-4)
        if hasattr(theirs, "cumulative_length"):
            assert ours.cumulative_length == theirs.cumulative_length


@pytest.mark.parametrize("rule", ["greedy", "sampling"])
@pytest.mark.parametrize("family", list(MODELS))
def test_verify_over_windows_is_the_plain_decoder(family: str, rule: str) -> None:
    model = MODELS[family]()
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(2, 128, size=3 * WINDOW + 2)]
    reference, _ = plain_greedy(model, prompt, 40)
    cache = prefill(model, prompt)
    ids = list(prompt)
    generator = torch.Generator().manual_seed(1)
    steps: list[tuple[int, int, torch.Tensor]] = []
    while len(ids) < len(prompt) + 24:
        # draft 0 follows the greedy continuation for a while, then goes astray; the others
        # branch off it
        start = len(ids)
        true = reference[start: start + 7] if ids == reference[:start] else plain_greedy(model, ids, 7)[0][start:]
        cut = int(rng.integers(1, 8))
        first = true[:cut] + [int(t) for t in rng.integers(2, 128, 7 - cut)]
        drafts = [first] + [first[: int(rng.integers(0, 6))] + [int(t) for t in rng.integers(2, 128, 3)]
                            for _ in range(3)]
        tree = DraftTree.from_drafts(drafts)
        result = verify(model, cache, ids, tree, rule, temperature=0.3, generator=generator)
        steps.append((len(ids), result.num_accepted, result.logits.float()))
        ids += result.emitted_tokens.tolist()
        cache_matches_plain(cache, model, ids)
    if rule == "greedy":
        assert ids == reference[: len(ids)]
    assert sum(n for _, n, _ in steps) >= 3  # the trees were accepted into, not only rejected
    forced = teacher_forced_logits(model, ids, len(prompt))
    for length, accepted, logits in steps:
        torch.testing.assert_close(logits, forced[length + accepted - len(prompt)], atol=1e-4, rtol=1e-4)


def test_a_sliding_layer_that_trimmed_the_tree_is_a_typed_error() -> None:
    model = MODELS["mistral-window"]()
    prompt = list(range(2, 2 + 3 * WINDOW))
    cache = prefill(model, prompt)
    tree = DraftTree.from_drafts([[5, 6, 7, 8], [5, 9, 10, 11, 12]])
    tree_forward(model, cache, prompt, tree)  # keeps the tree: committable
    commit_accepted(cache, len(prompt), tree.num_nodes, [0, 1])
    ids = prompt + [5, 6, 7]
    cache_matches_plain(cache, model, ids)
    # the same pass made outside tree_forward: the layers trim to their window as they go
    target = Target(model)
    from latticekit.torch.verify import tree_pass_inputs

    node_tokens, _ = tree.pass_arrays()
    input_ids, positions, mask = tree_pass_inputs(tree, torch.tensor(ids), node_tokens, target.mask_dtype,
                                                  target.attention_windows(cache))
    target.forward(input_ids, positions, mask, cache)
    with pytest.raises(CacheError, match="trimmed"):
        commit_accepted(cache, len(ids), tree.num_nodes, [0])


def test_a_cache_that_does_not_fit_the_layer_types_is_a_typed_error() -> None:
    model = MODELS["gemma2"]()
    prompt = list(range(2, 12))
    all_sliding = tiny_family("gemma2", "eager", sliding_window=WINDOW, layer_types=["sliding_attention"] * 2)
    with pytest.raises(CacheError, match="full attention but its cache layer is a DynamicSlidingWindowLayer"):
        prefill(model, prompt, DynamicCache(config=all_sliding.config))
    # a cache without the model's config (every layer full) still verifies exactly: the sliding
    # layers' rule comes from the model, the keys from the cache
    cache = prefill(model, prompt, DynamicCache())
    result = verify(model, cache, prompt, DraftTree.from_drafts([[5, 6, 7]]))
    ids = prompt + result.emitted_tokens.tolist()
    forced = teacher_forced_logits(model, ids, len(prompt))
    torch.testing.assert_close(result.logits.float(), forced[result.num_accepted], atol=1e-4, rtol=1e-4)
