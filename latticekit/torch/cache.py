"""KV caches the adapter can commit: HF ``DynamicCache`` and latticekit's own :class:`KVCache`.

After a tree pass the cache holds the prefix followed by one entry per tree node, in node
order. Committing keeps the prefix and the accepted nodes' entries (which need not be
contiguous: they are gathered to the front of the tree segment) and drops the rest, so
rejected nodes never leak into later steps.

An HF cache's layers may be full attention (``DynamicLayer``, all positions) or sliding window
(``DynamicSlidingWindowLayer``, the last ``sliding_window - 1`` positions, as transformers keeps
them after every update; chunked layers share the class). During a tree pass a sliding layer
keeps every row (:func:`keeping_tree_rows`), so that the commit can gather the accepted nodes
after the prefix's last positions and then trim the layer as transformers would. Layers that
hold no per-position keys (linear attention, convolution and other recurrent states) cannot
drop a rejected node's update: they are refused.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Optional

import torch

from latticekit.errors import CacheError

__all__ = [
    "KVCache",
    "slab_cache_class",
    "cache_length",
    "cache_device",
    "check_committable",
    "commit_accepted",
    "keeping_tree_rows",
]


class KVCache:
    """A minimal per-layer key/value cache for plain ``nn.Module`` targets (see ``protocol``).

    Keys and values of layer ``l`` are `torch.Tensor` of shape `(batch, kv_heads, seq, head_dim)`.

    Attributes:
        keys: one tensor per layer that has been updated.
        values: one tensor per layer that has been updated.
    """

    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    def update(
        self, layer_idx: int, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Appends a layer's new keys and values and returns everything that layer has cached.

        Args:
            layer_idx: the layer; layers must be updated in order 0, 1, ... the first time.
            keys (`torch.Tensor` of shape `(batch, kv_heads, new, head_dim)`): new keys.
            values (`torch.Tensor` of shape `(batch, kv_heads, new, head_dim)`): new values.

        Returns:
            The layer's keys and values, `(batch, kv_heads, seq + new, head_dim)` each.

        Raises:
            CacheError: a layer is skipped.
        """
        if layer_idx == len(self.keys):
            self.keys.append(keys)
            self.values.append(values)
        elif layer_idx < len(self.keys):
            self.keys[layer_idx] = torch.cat([self.keys[layer_idx], keys], dim=-2)
            self.values[layer_idx] = torch.cat([self.values[layer_idx], values], dim=-2)
        else:
            raise CacheError(f"layer {layer_idx} updated before layer {len(self.keys)}")
        return self.keys[layer_idx], self.values[layer_idx]

    def get_seq_length(self) -> int:
        """Number of positions cached (0 when empty)."""
        return int(self.keys[0].shape[-2]) if self.keys else 0

    def __repr__(self) -> str:
        return f"KVCache(layers={len(self.keys)}, seq_length={self.get_seq_length()})"


def slab_cache_class() -> Optional[type[Any]]:
    """``latticekit.torch.slab.SlabCache`` if that module was imported (it imports transformers)."""
    module = sys.modules.get("latticekit.torch.slab")
    return None if module is None else module.SlabCache


def _slab_of(cache: Any) -> Any:
    """The slab of a :class:`SlabCache` whose layers are all its own, None for other caches."""
    slab_cls = slab_cache_class()
    if slab_cls is None or not isinstance(cache, slab_cls):
        return None
    if cache.layers != cache._own_layers:  # identity comparison, element by element
        for layer in cache.layers:
            if layer not in cache._own_layers:
                raise CacheError(
                    f"unsupported cache layer {type(layer).__name__} in a SlabCache: only its own "
                    "SlabLayers can be committed"
                )
        raise CacheError("the layers of this SlabCache were reordered; it cannot be committed")
    return cache._slab


def _sliding_layer_class() -> Optional[type[Any]]:
    """``transformers.cache_utils.DynamicSlidingWindowLayer`` if transformers was imported."""
    module = sys.modules.get("transformers.cache_utils")
    return None if module is None else module.DynamicSlidingWindowLayer


def _hf_layers(cache: Any) -> list[Any]:
    """The layers of an HF cache whose entries can be gathered, or a CacheError."""
    try:
        from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer
    except ImportError as exc:  # pragma: no cover - only reached with an HF cache object
        raise CacheError(f"cannot commit a {type(cache).__name__} without transformers") from exc
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise CacheError(
            f"unsupported cache {type(cache).__name__}: expected transformers.DynamicCache, "
            "latticekit.torch.SlabCache or latticekit.torch.KVCache"
        )
    for layer in layers:
        # Other subclasses (quantised, indexed, linear attention with a recurrent state) keep
        # extra state that a gather would silently corrupt, so only these two are accepted.
        if type(layer) is not DynamicLayer and type(layer) is not DynamicSlidingWindowLayer:
            raise CacheError(
                f"unsupported cache layer {type(layer).__name__}: only full-attention and "
                "sliding-window DynamicCache layers (DynamicLayer, DynamicSlidingWindowLayer) can be committed"
            )
    return layers


@contextmanager
def keeping_tree_rows(cache: Any, new_rows: int) -> Iterator[None]:
    """Within the block, the sliding-window layers of an HF cache keep the ``new_rows`` rows a
    pass gives them (the root and every tree node) after those they hold, instead of trimming
    to their window; :func:`commit_accepted` trims them. Nothing changes for other caches and
    layers."""
    sliding = _sliding_layer_class()
    layers = [] if sliding is None else [
        layer for layer in getattr(cache, "layers", []) if type(layer) is sliding
    ]
    windows = [layer.sliding_window for layer in layers]
    try:
        for layer in layers:
            held = int(layer.keys.shape[-2]) if layer.is_initialized else 0
            # update() keeps the last sliding_window - 1 rows: here, all of them
            layer.sliding_window = max(layer.sliding_window, held + new_rows + 1)
        yield
    finally:
        for layer, window in zip(layers, windows):
            layer.sliding_window = window


def check_committable(cache: Any) -> None:
    """Raises CacheError unless :func:`commit_accepted` can commit ``cache``.

    Called before a tree pass, so an unsupported cache fails before it is written to.
    """
    if not isinstance(cache, KVCache) and _slab_of(cache) is None:
        _hf_layers(cache)


def cache_length(cache: Any) -> int:
    """Positions held by a :class:`KVCache` or an HF cache."""
    if isinstance(cache, KVCache):
        return cache.get_seq_length()
    get = getattr(cache, "get_seq_length", None)
    if get is None:
        raise CacheError(f"unsupported cache {type(cache).__name__}")
    return int(get())


def cache_device(cache: Any) -> Optional[torch.device]:
    """Device of the cached tensors, or None when nothing is cached yet."""
    if isinstance(cache, KVCache):
        return cache.keys[0].device if cache.keys else None
    for layer in getattr(cache, "layers", []):
        keys = getattr(layer, "keys", None)
        if isinstance(keys, torch.Tensor) and keys.numel():
            return keys.device
    return None


def _move_rows(tensor: torch.Tensor, dst: int, src_start: int, count: int, src: Optional[torch.Tensor]) -> None:
    """Copies ``count`` rows (dim -2) to ``dst..``, from ``src`` (an index) or ``src_start..``."""
    rows = tensor.index_select(-2, src) if src is not None else tensor.narrow(-2, src_start, count)
    tensor.narrow(-2, dst, count).copy_(rows)


def commit_accepted(cache: Any, prefix_len: int, num_nodes: int, accepted_nodes: Sequence[int]) -> None:
    """Keeps the prefix and the accepted nodes' entries; drops every other tree node, in place.

    Accepted nodes already in their final slots (a leading run ``0, 1, ..., j - 1``, e.g. any
    prefix of draft 0, the best p-best path) are not touched; the rest are moved right after
    them, and the cache is truncated. A :class:`SlabCache` moves the rows of all layers with
    one copy per tensor (two in all) and truncates by setting lengths; other caches take one
    or two indexing operations per layer tensor. A sliding-window layer (which kept the whole
    tree, :func:`keeping_tree_rows`) holds only the prefix's last positions before the tree: its
    accepted rows move the same way after those, then it keeps its last ``sliding_window - 1``
    positions, as transformers' own update does.

    Args:
        cache: a :class:`KVCache`, a :class:`SlabCache` or an HF ``DynamicCache`` holding
            ``prefix_len + num_nodes`` positions: the prefix, then one per tree node in node order.
        prefix_len: positions before the tree.
        num_nodes: tree nodes in the cache.
        accepted_nodes: accepted node indices, root's child first (increasing, as on any path).

    Raises:
        CacheError: the cache kind is unsupported or does not hold ``prefix_len + num_nodes``,
            or a sliding-window layer trimmed the tree's rows before the commit.
    """
    held = cache_length(cache)
    if held != prefix_len + num_nodes:
        raise CacheError(f"cache holds {held} positions, expected prefix {prefix_len} + tree {num_nodes}")
    nodes = [int(n) for n in accepted_nodes]
    count = len(nodes)
    kept = prefix_len + count
    in_place = 0
    while in_place < count and nodes[in_place] == in_place:
        in_place += 1
    move = count - in_place
    dst = prefix_len + in_place
    src_start = prefix_len + nodes[in_place] if move else 0
    src: Optional[torch.Tensor] = None
    if move and (nodes[-1] - nodes[in_place] != move - 1 or src_start - dst < move):
        # Not one run of rows clear of its destination: gather through an index.
        src = torch.tensor(nodes[in_place:], dtype=torch.long).add_(prefix_len).to(cache_device(cache))

    slab = _slab_of(cache)
    if slab is not None:
        if move:
            for tensor in (slab.keys, slab.values):
                _move_rows(tensor, dst, src_start, move, src)
        cache._set_lengths(kept)
        return
    if isinstance(cache, KVCache):
        for store in (cache.keys, cache.values):
            for i, tensor in enumerate(store):
                if move:
                    _move_rows(tensor, dst, src_start, move, src)
                store[i] = tensor.narrow(-2, 0, kept)
        return
    sliding = _sliding_layer_class()
    for layer in _hf_layers(cache):
        if not layer.is_initialized:
            continue
        if type(layer) is not sliding:
            if move:
                _move_rows(layer.keys, dst, src_start, move, src)
                _move_rows(layer.values, dst, src_start, move, src)
            layer.keys = layer.keys.narrow(-2, 0, kept)
            layer.values = layer.values.narrow(-2, 0, kept)
            continue
        # A sliding layer holds the prefix's last positions, then the tree (keeping_tree_rows).
        held_prefix = int(layer.keys.shape[-2]) - num_nodes
        if held_prefix < min(prefix_len, layer.sliding_window - 1):
            raise CacheError(
                f"a sliding-window layer holds {held_prefix} prefix positions after the tree, fewer than its "
                "window needs: it trimmed the pass's rows (run the pass inside keeping_tree_rows, as "
                "verify and tree_forward do)"
            )
        shift = prefix_len - held_prefix
        if move:
            layer_src = None if src is None else src - shift
            _move_rows(layer.keys, dst - shift, src_start - shift, move, layer_src)
            _move_rows(layer.values, dst - shift, src_start - shift, move, layer_src)
        # then the window transformers keeps after an update
        layer.keys = layer.keys.narrow(-2, 0, kept - shift)[:, :, -layer.sliding_window + 1 :, :]
        layer.values = layer.values.narrow(-2, 0, kept - shift)[:, :, -layer.sliding_window + 1 :, :]
        layer.cumulative_length = kept
