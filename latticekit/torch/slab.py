"""``SlabCache``: an HF ``DynamicCache`` that keeps every layer's keys/values in two tensors.

Importing this module imports transformers; ``latticekit.torch`` loads it only when an HF
model or cache is in play.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

from latticekit.errors import CacheError

__all__ = ["SlabCache", "SlabLayer"]
_SLAB_ROUND = 256  # capacities are multiples of this many positions


class _Slab:
    """The storage of a :class:`SlabCache`: keys and values of every layer in two tensors.

    ``keys`` and ``values`` have shape `(layers, batch, kv_heads, capacity, head_dim)`; layer
    ``l`` holds its ``lengths[l]`` positions in ``[l, :, :, :lengths[l]]``.
    """

    def __init__(self, num_layers: int) -> None:
        self.num_layers = num_layers
        self.lengths = [0] * num_layers
        self.keys: Optional[torch.Tensor] = None
        self.values: Optional[torch.Tensor] = None

    @property
    def capacity(self) -> int:
        return 0 if self.keys is None else int(self.keys.shape[-2])

    def allocate(self, keys: torch.Tensor, values: torch.Tensor, needed: int) -> None:
        """First write: shapes, dtype and device come from the first layer's new states."""
        cap = -(-max(needed, 1) // _SLAB_ROUND) * _SLAB_ROUND
        b, h, _, dk = keys.shape
        self.keys = keys.new_empty((self.num_layers, b, h, cap, dk))
        self.values = values.new_empty((self.num_layers, b, values.shape[1], cap, values.shape[-1]))

    def grow(self, needed: int) -> None:
        """Reallocates to hold ``needed`` positions (1.5x growth), keeping every layer's entries."""
        used = max(self.lengths)
        cap = max(needed, self.capacity * 3 // 2)
        cap = -(-cap // _SLAB_ROUND) * _SLAB_ROUND
        for name in ("keys", "values"):
            old = getattr(self, name)
            shape = list(old.shape)
            shape[-2] = cap
            new = old.new_empty(shape)
            new.narrow(-2, 0, used).copy_(old.narrow(-2, 0, used))
            setattr(self, name, new)


class SlabLayer(DynamicLayer):
    """A full-attention cache layer whose keys and values are views into its cache's slab.

    Reads of ``keys`` / ``values`` give `(batch, kv_heads, seq, head_dim)` views; ``update``
    writes the new states in place (no concatenation of the whole history per step).
    """

    is_croppable = True

    def __init__(self, slab: _Slab, index: int) -> None:  # noqa: D107 - no super().__init__: keys are properties
        self.is_initialized = False
        self._slab = slab
        self._index = index

    @property
    def _length(self) -> int:
        return self._slab.lengths[self._index]

    @_length.setter
    def _length(self, value: int) -> None:
        self._slab.lengths[self._index] = value

    @property
    def keys(self) -> Optional[torch.Tensor]:
        if self._slab.keys is None:
            return None
        return self._slab.keys[self._index].narrow(-2, 0, self._length)

    @keys.setter
    def keys(self, value: Any) -> None:
        raise CacheError("SlabLayer keys live in the cache's slab and cannot be reassigned")

    @property
    def values(self) -> Optional[torch.Tensor]:
        if self._slab.values is None:
            return None
        return self._slab.values[self._index].narrow(-2, 0, self._length)

    @values.setter
    def values(self, value: Any) -> None:
        raise CacheError("SlabLayer values live in the cache's slab and cannot be reassigned")

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Writes the new states after the layer's cached ones; returns all of them (views)."""
        slab = self._slab
        start, n = self._length, key_states.shape[-2]
        end = start + n
        if slab.keys is None or slab.values is None:  # never allocated (both are, together)
            slab.allocate(key_states, value_states, end)
        elif (
            key_states.shape[:2] != slab.keys.shape[1:3]
            or key_states.shape[-1] != slab.keys.shape[-1]
            or value_states.shape[1] != slab.values.shape[2]
            or value_states.shape[-1] != slab.values.shape[-1]
            or key_states.dtype != slab.keys.dtype
            or key_states.device != slab.keys.device
        ):
            raise CacheError(
                f"layer {self._index}: new states {tuple(key_states.shape)} {key_states.dtype} on "
                f"{key_states.device} do not fit the SlabCache's {tuple(slab.keys.shape[1:])} "
                f"{slab.keys.dtype} on {slab.keys.device}; use a DynamicCache for models whose "
                "layers differ in shape"
            )
        if end > slab.capacity:
            slab.grow(end)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        assert slab.keys is not None and slab.values is not None  # allocated above
        keys = slab.keys[self._index]
        values = slab.values[self._index]
        keys.narrow(-2, start, n).copy_(key_states)
        values.narrow(-2, start, n).copy_(value_states)
        self._length = end
        return keys.narrow(-2, 0, end), values.narrow(-2, 0, end)

    def get_seq_length(self) -> int:
        return self._length

    def crop(self, tokens_to_remove: int) -> None:
        """Removes ``-tokens_to_remove`` positions (a negative count, as in DynamicLayer)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of positions to remove, got {tokens_to_remove}")
        self._length = max(0, self._length + tokens_to_remove)

    def reset(self) -> None:
        self._length = 0

    def offload(self) -> None:
        raise CacheError("a SlabCache cannot be offloaded")

    def _whole_slab(self, what: str) -> None:
        raise CacheError(f"{what} changes the whole slab: call it on the SlabCache, not on one layer")

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._whole_slab("batch_repeat_interleave")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._whole_slab("batch_select_indices")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._whole_slab("reorder_cache")


class SlabCache(DynamicCache):
    """A ``transformers.DynamicCache`` whose layers keep their keys/values in two shared tensors.

    Same behaviour as ``DynamicCache(config=config)`` for models whose layers are all full
    attention with one key/value shape; what changes is the storage. All layers' keys live in
    one `(layers, batch, kv_heads, capacity, head_dim)` tensor (values in another) that grows
    by 1.5x when full, so an update writes the new positions in place instead of concatenating
    the whole history, and :func:`commit_accepted` moves the accepted tree nodes of every layer
    with one gather and one copy per tensor (two gathers in all, not one per layer tensor).

    ``layer.keys`` / ``layer.values`` are read-only views. :func:`latticekit.torch.new_cache`
    and :func:`latticekit.torch.prefill` make one for every HF model whose layers allow it.

    Raises:
        CacheError: the config has a layer that is not plain full attention (sliding window,
            linear attention, shared KV, ...).
    """

    def __init__(self, config: Any) -> None:
        from transformers.cache_utils import get_layer_types_and_kwargs

        layer_types, _ = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
        other = sorted({t for t in layer_types if t != "full_attention"})
        if other or not layer_types:
            raise CacheError(f"a SlabCache needs full-attention layers only, the config has {other or 'none'}")
        self._slab = _Slab(len(layer_types))
        Cache.__init__(self, layers=[SlabLayer(self._slab, i) for i in range(len(layer_types))])
        self._own_layers = list(self.layers)

    @classmethod
    def supports(cls, config: Any) -> bool:
        """Whether ``SlabCache(config)`` can be built."""
        try:
            cls(config)
        except CacheError:
            return False
        return True

    def _set_lengths(self, length: int) -> None:
        """Every layer holds ``length`` positions (one list assignment)."""
        self._slab.lengths[:] = [length] * self._slab.num_layers

    def batch_repeat_interleave(self, repeats: int) -> None:
        slab = self._slab
        if slab.keys is not None and slab.values is not None:
            slab.keys = slab.keys.repeat_interleave(repeats, dim=1)
            slab.values = slab.values.repeat_interleave(repeats, dim=1)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        slab = self._slab
        if slab.keys is not None and slab.values is not None:
            slab.keys = slab.keys[:, indices]
            slab.values = slab.values[:, indices]

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        slab = self._slab
        if slab.keys is not None and slab.values is not None:
            slab.keys = slab.keys.index_select(1, beam_idx.to(slab.keys.device))
            slab.values = slab.values.index_select(1, beam_idx.to(slab.values.device))

    def __repr__(self) -> str:
        return f"SlabCache(layers={len(self.layers)}, seq_length={self.get_seq_length()}, capacity={self._slab.capacity})"
