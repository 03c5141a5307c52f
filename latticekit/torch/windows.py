"""Attention windows: the keys each query may see in sliding-window and chunked layers.

transformers models may mix full-attention layers with sliding-window ones (Gemma 2 and 3,
GPT-OSS, Cohere 2, OLMo 3, Mistral or Qwen 2 with ``sliding_window`` set) or chunked ones
(Llama 4). A query at position q sees, in a layer of type

* ``full_attention``: every key at a position k <= q;
* ``sliding_attention`` with window w: keys with q - w < k <= q (transformers'
  ``sliding_window_overlay``);
* ``chunked_attention`` with chunk size c: keys with k <= q in q's chunk, k // c == q // c
  (``chunked_overlay``).

The cache layers of the last two (``DynamicSlidingWindowLayer``) keep only their last
w - 1 (c - 1) positions, so in a pass their keys are fewer than a full layer's. A pass over
such a model takes one mask per layer type, each as wide as that type's keys: a dict
``{layer_type: mask}``, which transformers' models with mixed layers accept as their
``attention_mask``, or the one mask when every layer has the same type.

In a tree pass a node's keys are the ones on its own path (the prefix, the root, its
ancestors, itself), restricted by its layer type's rule at the node's position.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional, Union

import numpy as np
import torch

from latticekit.errors import CacheError
from latticekit.torch.tree import DraftTree, mask_from_visibility

__all__ = [
    "LayerWindow",
    "attention_windows",
    "index_bound_attention",
    "window_visibility",
    "tree_pass_masks",
    "prefill_masks",
]

#: Layer types -> the config attribute holding their window (None: full attention).
_WINDOW_ATTRIBUTE = {
    "full_attention": None,
    "sliding_attention": "sliding_window",
    "chunked_attention": "attention_chunk_size",
}
#: HF models -> their decoder's layer types, None when all are full attention (read from the
#: config once per model).
_LAYER_TYPES: "weakref.WeakKeyDictionary[Any, Optional[tuple[str, ...]]]" = weakref.WeakKeyDictionary()

Masks = Union[torch.Tensor, dict[str, torch.Tensor]]


@dataclass(frozen=True)
class LayerWindow:
    """How the layers of one type attend in a pass.

    Attributes:
        layer_type: transformers' name of the type (``full_attention``, ``sliding_attention``,
            ``chunked_attention``), the key of its mask.
        size: the window (sliding) or chunk size (chunked); None for full attention.
        cached: positions these layers hold before the pass: the last ``cached`` ones of the
            sequence.
    """

    layer_type: str
    size: Optional[int]
    cached: int


def _layer_types(model: Any) -> Optional[tuple[str, ...]]:
    if model not in _LAYER_TYPES:
        from transformers.cache_utils import get_layer_types_and_kwargs

        types = tuple(get_layer_types_and_kwargs(model.config.get_text_config(decoder=True))[0])
        _LAYER_TYPES[model] = None if all(t == "full_attention" for t in types) else types
    return _LAYER_TYPES[model]


def index_bound_attention(model: Any) -> Optional[str]:
    """Why an HF model's attention cannot score a tree, or None: its position biases or local
    windows follow the keys' order in the pass, not their positions (ALiBi in BLOOM, MPT and
    Falcon with ``alibi``; GPT-Neo's local layers, masked by a band over key indices), so a
    node's ancestors, which sit among other branches' nodes, get another node's bias."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type == "bloom" or (model_type == "falcon" and getattr(config, "alibi", False)) or (
        model_type == "mpt" and getattr(getattr(config, "attn_config", None), "alibi", False)
    ):
        return f"{type(model).__name__} adds ALiBi position biases by key order, not position: a tree pass would misplace them"
    if model_type == "gpt_neo" and "local" in getattr(config, "attention_layers", ()):
        return f"{type(model).__name__}'s local attention layers mask by key order, not position: a tree pass would misplace their window"
    return None


def _full_but_sliding(index: int, layer: Any) -> str:
    return (f"layer {index} is full attention but its cache layer is a {type(layer).__name__}, which drops "
            "positions the layer attends to")


def _cached_rows(layer: Any) -> int:
    """Positions a cache layer's keys hold (a sliding layer's count only its last ones)."""
    keys = getattr(layer, "keys", None)
    if not getattr(layer, "is_initialized", False) or not isinstance(keys, torch.Tensor) or keys.dim() < 2:
        return 0
    return int(keys.shape[-2])


def attention_windows(model: Any, cache: Any) -> Optional[tuple[LayerWindow, ...]]:
    """The layer types of an HF model and what their layers of ``cache`` hold, or None when every
    layer is full attention (one mask over the whole sequence serves them all).

    Args:
        model: the HF model (its config's layer types are read once).
        cache: the HF cache a pass will run over (its layers in model order).

    Returns:
        One :class:`LayerWindow` per layer type, in order of first appearance.

    Raises:
        CacheError: a layer type with no key/value window rule (linear attention, ...), a
            window that is not a positive int, a full-attention layer whose cache drops
            positions, or layers of one type holding different numbers of positions.
    """
    from transformers.cache_utils import DynamicSlidingWindowLayer

    types = _layer_types(model)
    if types is None:
        for index, layer in enumerate(getattr(cache, "layers", [])):
            if isinstance(layer, DynamicSlidingWindowLayer):
                raise CacheError(_full_but_sliding(index, layer))
        return None
    layers = list(getattr(cache, "layers", []))
    if len(layers) < len(types) and getattr(cache, "layer_class_to_replicate", None) is not None:
        layers += [None] * (len(types) - len(layers))  # made on first update (DynamicCache()), empty now
    if len(layers) != len(types):
        raise CacheError(f"the cache has {len(layers)} layers, the model's config {len(types)}")
    text_config = model.config.get_text_config(decoder=True)
    windows: dict[str, LayerWindow] = {}
    for index, (layer_type, layer) in enumerate(zip(types, layers)):
        if layer_type not in _WINDOW_ATTRIBUTE:
            raise CacheError(
                f"unsupported attention layer type {layer_type!r} (layer {index}): only full-attention, "
                "sliding-window and chunked layers can take a tree mask"
            )
        attribute = _WINDOW_ATTRIBUTE[layer_type]
        size = None if attribute is None else getattr(text_config, attribute, None)
        if attribute is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise CacheError(f"layer type {layer_type!r} needs a positive int config.{attribute}, got {size!r}")
        if attribute is None and isinstance(layer, DynamicSlidingWindowLayer):
            raise CacheError(_full_but_sliding(index, layer))
        rows = _cached_rows(layer)
        seen = windows.setdefault(layer_type, LayerWindow(layer_type, size, rows))
        if seen.cached != rows:
            raise CacheError(
                f"layers of type {layer_type!r} hold {seen.cached} and {rows} positions; a pass needs "
                "one mask per layer type"
            )
    return tuple(windows.values())


def window_visibility(query_positions: np.ndarray, key_positions: np.ndarray, window: LayerWindow) -> np.ndarray:
    """The window rule alone (causality and the tree's paths aside): whether a query at each of
    ``query_positions`` may see a key at each of ``key_positions`` under ``window``'s type.

    Returns:
        `np.ndarray` of bool, shape `(queries, keys)`.
    """
    q = np.asarray(query_positions, dtype=np.int64)[:, None]
    k = np.asarray(key_positions, dtype=np.int64)[None, :]
    if window.size is None:
        return np.ones((q.shape[0], k.shape[1]), dtype=bool)
    if window.layer_type == "chunked_attention":
        return (q // window.size) == (k // window.size)
    return q - k < window.size


def tree_pass_masks(
    tree: DraftTree,
    prefix_len: int,
    windows: Sequence[LayerWindow],
    dtype: torch.dtype,
    device: Union[str, torch.device, None] = None,
) -> Masks:
    """The masks of one tree pass (the root, then every node) for each layer type.

    A layer type whose layers hold the whole prefix but the root and that sees everything
    (full attention) gets :meth:`DraftTree.pass_mask`; any other gets, over its ``cached`` last
    positions, the root and the nodes, what that mask allows and the window rule keeps.

    Args:
        tree: the drafts.
        prefix_len: the sequence's length L; the root is its last token, at position L - 1.
        windows: from :func:`attention_windows` over the cache before the pass.
        dtype: ``torch.bool`` or a floating dtype (additive mask).
        device: device of the masks.

    Returns:
        The one mask when there is one layer type, else ``{layer_type: mask}``; each
        `torch.Tensor` of shape `(1, 1, num_nodes + 1, cached + 1 + num_nodes)`.

    Raises:
        CacheError: a full-attention layer type does not hold the prefix but the root.
    """
    masks: dict[str, torch.Tensor] = {}
    for window in windows:
        if window.size is None:
            if window.cached != prefix_len - 1:
                raise CacheError(
                    f"{window.layer_type} layers hold {window.cached} positions, the prefix needs {prefix_len - 1}"
                )
            masks[window.layer_type] = tree.pass_mask(prefix_len, dtype, device)
            continue
        n, cached = tree.num_nodes, window.cached
        queries = prefix_len + np.concatenate([[-1], tree.depths])
        node_keys = prefix_len + tree.depths
        visible = np.zeros((n + 1, cached + 1 + n), dtype=bool)
        visible[:, : cached + 1] = window_visibility(queries, np.arange(prefix_len - 1 - cached, prefix_len), window)
        visible[1:, cached + 1 :] = tree.ancestors() & window_visibility(queries[1:], node_keys, window)
        masks[window.layer_type] = mask_from_visibility(visible, dtype, device)
    return next(iter(masks.values())) if len(masks) == 1 else masks


def prefill_masks(
    held: int,
    todo: int,
    windows: Sequence[LayerWindow],
    dtype: torch.dtype,
    device: Union[str, torch.device, None] = None,
) -> Masks:
    """The causal masks of a prefill of positions ``held .. todo - 1`` for each layer type.

    Args:
        held: positions the cache holds (its full-attention layers all of them).
        todo: the positions after the prefill.
        windows: from :func:`attention_windows` over the cache before the prefill.
        dtype: ``torch.bool`` or a floating dtype (additive mask).
        device: device of the masks.

    Returns:
        The one mask when there is one layer type, else ``{layer_type: mask}``; each
        `torch.Tensor` of shape `(1, 1, todo - held, cached + todo - held)`.

    Raises:
        CacheError: a full-attention layer type does not hold ``held`` positions.
    """
    masks: dict[str, torch.Tensor] = {}
    queries = np.arange(held, todo)
    for window in windows:
        if window.size is None and window.cached != held:
            raise CacheError(f"{window.layer_type} layers hold {window.cached} positions, the cache {held}")
        keys = np.arange(held - window.cached, todo)
        visible = (keys[None, :] <= queries[:, None]) & window_visibility(queries, keys, window)
        masks[window.layer_type] = mask_from_visibility(visible, dtype, device)
    return next(iter(masks.values())) if len(masks) == 1 else masks
