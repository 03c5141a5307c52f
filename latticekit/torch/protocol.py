"""The protocol a plain ``torch.nn.Module`` follows to be verified by :func:`latticekit.torch.verify`.

HF transformers causal LMs work as they are. Any other target model works when it is a
``torch.nn.Module`` with:

* an integer attribute ``vocab_size``;
* a forward ``module(input_ids, position_ids, attention_mask, past_key_values)`` where

  - ``input_ids`` (`torch.LongTensor` of shape `(1, n)`) are the new tokens;
  - ``position_ids`` (`torch.LongTensor` of shape `(1, n)`) are their positions. They are
    **not** ``cached + arange(n)``: tree nodes at the same depth share a position, and the
    module must use these ids (rotary or absolute embeddings) rather than count positions;
  - ``attention_mask`` (`torch.BoolTensor` of shape `(1, 1, n, cached + n)`) is True where
    query ``i`` may attend key ``j``; keys ``0 .. cached - 1`` are the cache, the rest are the
    new tokens in order. The module must apply it as given (no extra causal mask: a node may
    not see an earlier sibling branch even though it comes before it);
  - ``past_key_values`` is a :class:`latticekit.torch.KVCache`; each attention layer ``l``
    calls ``past_key_values.update(l, keys, values)`` once with the new tokens' keys and
    values `(1, kv_heads, n, head_dim)` and attends over the tensors it returns;

  and returning ``(logits, hidden_states)``: `torch.Tensor` of shapes `(1, n, vocab)` and
  `(1, n, hidden)`, the hidden state being the one the output projection reads (what a
  draft-head model consumes).

The adapter commits the cache in place after each pass (see ``latticekit.torch.cache``).

Optional, for speed: a module that also offers

* ``module.forward_hidden(input_ids, position_ids, attention_mask, past_key_values)``, the same
  pass returning only the hidden states `(1, n, hidden)`, and
* ``module.logits_from_hidden(hidden)``, the output projection: hidden states `(m, hidden)` ->
  logits `(m, vocab)`, such that ``forward``'s logits are ``logits_from_hidden`` of its hidden
  states row by row,

lets :func:`latticekit.torch.verify` project only the rows its acceptance walk reads (the root
and the first draft, plus the subtree a walk moves to; see ``latticekit.torch.logits``). Without
them every row is projected, as ``forward`` does.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from latticekit.torch.cache import KVCache

__all__ = ["TreeVerifiableModule"]


@runtime_checkable
class TreeVerifiableModule(Protocol):
    """Structural type of a plain target model; see the module docstring for the contract."""

    vocab_size: int

    def __call__(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        past_key_values: KVCache,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Runs the new tokens over the cache; returns logits `(1, n, vocab)` and hidden `(1, n, hidden)`."""
        ...
