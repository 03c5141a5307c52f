"""The target model behind one interface: an HF causal LM or a module following the protocol.

:class:`Target` is the one forward path of latticekit's decoders, replay tracing and the
verification adapter: a tree pass over a KV cache (mask, positions, hidden-state capture), the
same pass with the output projection applied to chosen rows only, the plain one-token step
of ordinary decoding, and the plain batched pass of replay tracing; every call of an HF model
goes through one method (hidden states captured by a hook). A prepared model's passes run in
its attention context (on CUDA, SDPA without cuDNN's per-length plans:
``latticekit.torch.prepare.sdpa_backends``).
"""

from __future__ import annotations

import inspect
import sys
import weakref
from typing import Any, Optional, cast

import numpy as np
import torch

from latticekit.errors import CacheError, DeviceMismatchError, UnsupportedModelError
from latticekit.torch.cache import KVCache, cache_device, check_committable
from latticekit.torch.prepare import sdpa_context
from latticekit.torch.tree import mask_from_visibility
from latticekit.torch.windows import LayerWindow, Masks, attention_windows, index_bound_attention

__all__ = ["Target", "keeps_logits"]

#: ``latticekit_sdpa`` is sdpa with grouped queries stacked (``latticekit.torch.prepare``).
MASKABLE_ATTENTION = ("eager", "sdpa", "latticekit_sdpa")

#: HF causal LM classes -> whether their forward takes ``logits_to_keep`` (signature read once).
KEEPS_LOGITS: dict[type, bool] = {}
#: HF causal LM classes -> the keyword their forward takes the KV cache by (signature read once):
#: ``cache`` from transformers 5.24, which deprecates ``past_key_values`` (a FutureWarning on
#: every call, removal announced for 5.40); ``past_key_values`` before, where ``cache`` would
#: silently fall into ``**kwargs`` and leave the cache unused; ``cache_params`` for Mamba-style
#: models before 5.24.
CACHE_KEYWORDS: dict[type, str] = {}
#: HF models -> whether their logits are exactly ``output_embeddings(body's last hidden state)``
#: (checked on the first tree pass; absent until then). Only then may rows be projected apart.
HEAD_IS_LAST_STEP: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()


class Target:
    """Uniform access to an HF causal LM or a plain module following the protocol.

    Args:
        model: the HF causal LM or protocol module.
        tree_masks: whether passes will carry a 4-D mask (tree passes, and a protocol module's
            every pass), so that an HF model's attention must take one; ``False`` for the plain
            batched passes of :meth:`forward_last` alone.

    Raises:
        UnsupportedModelError: a model that is neither, an HF model without output embeddings
            or (with ``tree_masks``) whose attention cannot take a 4-D mask or places its biases by
            key order (ALiBi, GPT-Neo's local layers), or one without parameters.
    """

    def __init__(self, model: Any, *, tree_masks: bool = True) -> None:
        self.model = model
        transformers = sys.modules.get("transformers")
        self.is_hf = transformers is not None and isinstance(model, transformers.PreTrainedModel)
        if self.is_hf:
            attn = getattr(model.config, "_attn_implementation", None)
            if tree_masks and attn not in MASKABLE_ATTENTION:
                raise UnsupportedModelError(
                    f"attention implementation {attn!r} cannot take a custom 4-D tree mask; "
                    f"load the model with attn_implementation in {MASKABLE_ATTENTION}"
                )
            reason = index_bound_attention(model) if tree_masks else None
            if reason is not None:
                raise UnsupportedModelError(reason)
            head = model.get_output_embeddings()
            if head is None:
                raise UnsupportedModelError(f"{type(model).__name__} has no output embeddings (not a causal LM?)")
            self.head = head
            self.vocab_size = int(model.config.vocab_size)
            body = model.base_model
            self.body = body if body is not model and keeps_logits(type(model)) else None
            self.cache_keyword = cache_keyword(type(model))
        elif isinstance(model, torch.nn.Module) and isinstance(getattr(model, "vocab_size", None), int):
            # an int (checked above); Module.__getattr__ is typed for submodules and tensors
            self.vocab_size = int(cast(int, model.vocab_size))
            self.body = None
        else:
            raise UnsupportedModelError(
                f"{type(model).__name__} is neither a transformers PreTrainedModel nor a "
                "torch.nn.Module with an int vocab_size following latticekit.torch.protocol"
            )
        param = next(model.parameters(), None)
        if param is None:
            raise UnsupportedModelError(f"{type(model).__name__} has no parameters")
        self.device = param.device
        self.dtype = param.dtype
        prep = getattr(model, "latticekit_preparation", None)
        #: the SDPA backends the passes run under (``Preparation.sdpa_backends``), None: torch's choice
        self.sdpa_backends: Optional[tuple[str, ...]] = getattr(prep, "sdpa_backends", None)

    def new_cache(self) -> Any:
        if self.is_hf:
            from transformers import DynamicCache

            from latticekit.torch.slab import SlabCache

            try:
                return SlabCache(self.model.config)
            except CacheError:  # sliding-window, linear or shared-KV layers
                return DynamicCache(config=self.model.config)
        return KVCache()

    def tree_refusal(self) -> Optional[str]:
        """Why tree passes cannot run over this model's cache, naming the layer type that
        cannot be committed or masked (linear attention, a recurrent or convolution state, ...),
        or None when they can. Builds an empty cache; runs nothing."""
        try:
            cache = self.new_cache()
            check_committable(cache)
            self.attention_windows(cache)
        except CacheError as exc:
            return str(exc)
        return None

    def check_cache(self, cache: Any) -> None:
        if self.is_hf:
            from transformers import Cache

            if not isinstance(cache, Cache):
                raise CacheError(f"an HF model needs a transformers Cache, got {type(cache).__name__}")
        elif not isinstance(cache, KVCache):
            raise CacheError(f"a plain module needs a latticekit.torch.KVCache, got {type(cache).__name__}")
        check_committable(cache)
        device = cache_device(cache)
        if device is not None and device != self.device:
            raise DeviceMismatchError(f"the KV cache lives on {device}, the model on {self.device}")

    def attention_windows(self, cache: Any) -> Optional[tuple[LayerWindow, ...]]:
        """The layer types of an HF model whose layers are not all full attention, with what
        ``cache`` holds for each (:func:`latticekit.torch.windows.attention_windows`); None for
        full-attention models and protocol modules (one mask serves every layer).

        Raises:
            CacheError: a layer type that takes no tree mask, or a cache that does not fit it.
        """
        return attention_windows(self.model, cache) if self.is_hf else None

    @property
    def mask_dtype(self) -> torch.dtype:
        """Boolean masks for protocol modules; additive masks in the model's dtype for HF models,
        which both eager and sdpa attention understand."""
        return self.dtype if self.is_hf else torch.bool

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: Optional[Masks], cache: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Runs `(1, n)` tokens over the cache with a `(1, 1, n, cached + n)` mask of ``mask_dtype``
        (an HF model with windowed layers: ``{layer_type: mask}``, see ``latticekit.torch.windows``).

        Returns:
            Logits `(n, vocab)` and final hidden states `(n, hidden)`.
        """
        if not self.is_hf:
            with sdpa_context(self.sdpa_backends):
                logits, hidden = self.model(input_ids, position_ids, mask, cache)
            return logits[0], hidden[0]
        captured: list[torch.Tensor] = []
        hook = self.head.register_forward_pre_hook(lambda _module, args: captured.append(args[0]))
        logits, hidden = self._hf_forward(
            hook, captured, cache, input_ids=input_ids, position_ids=position_ids, attention_mask=mask
        )
        return logits[0], hidden[0]

    def forward_last(self, input_ids: torch.Tensor, cache: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The plain causal pass of an HF model over ``B`` rows of equal length, as transformers
        decodes (no mask, no positions given), with the output projection of the last position
        only where the model allows it (``logits_to_keep``): what replay tracing runs.

        Args:
            input_ids (`torch.LongTensor` of shape `(B, n)`): the tokens after the cache's.
            cache: a transformers ``Cache`` holding ``B`` rows of equal length, which gains them.

        Returns:
            Logits `(B, vocab)` and final hidden states `(B, hidden)` of each row's last position.

        Raises:
            UnsupportedModelError: a protocol module (its passes take a mask).
        """
        if not self.is_hf:
            raise UnsupportedModelError("forward_last needs an HF causal LM; a protocol module's passes take a mask")
        captured: list[torch.Tensor] = []
        hook = self.head.register_forward_pre_hook(lambda _module, args: captured.append(args[0][:, -1]))
        keep = {"logits_to_keep": 1} if keeps_logits(type(self.model)) else {}
        logits, hidden = self._hf_forward(hook, captured, cache, input_ids=input_ids, **keep)
        return logits[:, -1], hidden

    def forward_prompt(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """transformers' own causal pass over a prompt with no cache given, so the model makes the
        cache it makes under HF ``generate`` (a model with a cache class of its own included):
        the decoding of a model whose cache takes no tree pass.

        Args:
            input_ids (`torch.LongTensor` of shape `(1, L)`): the prompt.

        Returns:
            The last position's logits `(vocab,)` and final hidden state `(hidden,)`, and the
            cache the model returned (pass it to :meth:`step`).

        Raises:
            UnsupportedModelError: a protocol module, or a model that returns no cache.
        """
        if not self.is_hf:
            raise UnsupportedModelError("forward_prompt needs an HF causal LM")
        captured: list[torch.Tensor] = []
        hook = self.head.register_forward_pre_hook(lambda _module, args: captured.append(args[0][:, -1]))
        keep = {"logits_to_keep": 1} if keeps_logits(type(self.model)) else {}
        try:
            out = self.model(input_ids=input_ids, use_cache=True, **keep)
        finally:
            hook.remove()
        cache = getattr(out, self.cache_keyword, None)
        if cache is None:
            raise UnsupportedModelError(f"{type(self.model).__name__} returned no cache as {self.cache_keyword!r}")
        return out.logits[0, -1], captured[-1][0], cache

    def _hf_forward(
        self, hook: Any, captured: list[torch.Tensor], cache: Any, **inputs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Calls the HF model on ``inputs`` and ``cache`` (passed by :attr:`cache_keyword`, in use)
        with ``hook`` (which appends the hidden states to ``captured``) registered; removes the
        hook and returns the logits and the last captured hidden states, batch dimension kept."""
        inputs[self.cache_keyword] = cache
        try:
            with sdpa_context(self.sdpa_backends):
                out = self.model(use_cache=True, **inputs)
        finally:
            hook.remove()
        return out.logits, captured[-1]

    def step(self, cache: Any, token: int, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One plain decoding step: ``token`` at ``position`` over a cache holding ``position``
        tokens, which gains it.

        An HF model gets no mask (one query sees every cached key: transformers' own decoding
        step, the fastest it has); a protocol module gets the all-visible row it requires.

        Returns:
            Logits `(vocab,)` and the final hidden state `(hidden,)`.
        """
        mask = None if self.is_hf else mask_from_visibility(np.ones((1, position + 1), dtype=bool),
                                                            self.mask_dtype, self.device)
        ids = torch.tensor([[token]], dtype=torch.long, device=self.device)
        positions = torch.tensor([[position]], dtype=torch.long, device=self.device)
        logits, hidden = self.forward(ids, positions, mask, cache)
        return logits[-1], hidden[-1]

    @property
    def projects_rows(self) -> bool:
        """Whether a pass can leave the output projection to :class:`TreeLogits`: an HF model
        whose forward takes ``logits_to_keep`` and whose logits were found to be exactly its
        output embeddings applied to its body's output, or a protocol module with
        ``forward_hidden`` and ``logits_from_hidden``."""
        if self.is_hf:
            return self.body is not None and HEAD_IS_LAST_STEP.get(self.model, False)
        return callable(getattr(self.model, "forward_hidden", None)) and callable(
            getattr(self.model, "logits_from_hidden", None)
        )

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits `(m, vocab)` of final hidden states `(m, hidden)`; only when ``projects_rows``."""
        if self.is_hf:
            return self.head(hidden[None])[0]
        return self.model.logits_from_hidden(hidden)

    def forward_rows(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: Masks, cache: Any, rows: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As :meth:`forward`, but the logits of ``rows`` only; needs ``projects_rows``.

        Returns:
            Logits `(len(rows), vocab)` and final hidden states `(n, hidden)` of every row.
        """
        if not self.is_hf:
            with sdpa_context(self.sdpa_backends):
                hidden = self.model.forward_hidden(input_ids, position_ids, mask, cache)[0]
            index = torch.tensor(rows, dtype=torch.long, device=hidden.device)
            return self.model.logits_from_hidden(hidden.index_select(0, index)), hidden
        assert self.body is not None
        captured: list[torch.Tensor] = []
        hook = self.body.register_forward_hook(lambda _module, _args, out: captured.append(out[0]))
        keep = torch.tensor(rows, dtype=torch.long, device=input_ids.device)
        logits, hidden = self._hf_forward(
            hook,
            captured,
            cache,
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=mask,
            logits_to_keep=keep,
        )
        return logits[0], hidden[0]

    def forward_probing_head(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: Masks, cache: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`forward` for an HF model not checked yet: also records whether its logits are
        bit for bit the output embeddings applied to its body's output (no soft-capping, logit
        scale or other step after the head), which :meth:`project` relies on."""
        assert self.is_hf and self.body is not None
        captured: list[torch.Tensor] = []
        hook = self.body.register_forward_hook(lambda _module, _args, out: captured.append(out[0]))
        try:
            logits, hidden = self.forward(input_ids, position_ids, mask, cache)
        finally:
            hook.remove()
        HEAD_IS_LAST_STEP[self.model] = bool(
            captured and captured[-1].shape[1] == logits.shape[0] and torch.equal(self.head(captured[-1])[0], logits)
        )
        return logits, hidden


def keeps_logits(model_class: type[torch.nn.Module]) -> bool:
    """Whether an HF model class's forward takes ``logits_to_keep`` (transformers >= 4.50)."""
    keeps = KEEPS_LOGITS.get(model_class)
    if keeps is None:
        keeps = KEEPS_LOGITS[model_class] = "logits_to_keep" in inspect.signature(model_class.forward).parameters
    return keeps




def cache_keyword(model_class: type[torch.nn.Module]) -> str:
    """The keyword an HF model class's forward takes its KV cache by: ``cache`` where its
    signature names it (transformers >= 5.24), else ``past_key_values``, else ``cache_params``
    (Mamba-style models before 5.24)."""
    keyword = CACHE_KEYWORDS.get(model_class)
    if keyword is None:
        params = inspect.signature(model_class.forward).parameters
        named = [name for name in ("cache", "past_key_values", "cache_params") if name in params]
        keyword = CACHE_KEYWORDS[model_class] = named[0] if named else "past_key_values"
    return keyword
