"""``prepare_target``: ready a causal LM (and its draft heads) for decoding on its device.

Speculative decoding pays when verifying n tokens costs about what one token costs. In eager
fp32 PyTorch on a CPU it does not: a ``Linear`` with one input row runs as a matrix-vector
product, but with two or more rows as a GEMM that re-packs its weight on every call.
:func:`prepare_target` changes how the model computes, never what (up to float rounding):

* **Packed weights** (CPU, float32 / bfloat16): every ``nn.Linear`` becomes a
  :class:`PackedLinear` whose weight oneDNN packed once (``torch.ops.mkldnn``), so 1, 2 or 16
  rows read a weight laid out for the kernel.
* **Fused sibling projections** (CPU): the ``q_proj`` / ``k_proj`` / ``v_proj`` of an attention
  block and the ``gate_proj`` / ``up_proj`` of an MLP read the same input; they run as one
  packed GEMM whose output the siblings share (:class:`_SharedProjection`).
* **Grouped-query attention without copies** (CPU and CUDA, HF ``sdpa`` models with fewer
  key/value heads than query heads): under a custom mask (a tree pass) transformers repeats
  every cached key and value per query group before attention, a copy of the whole cache per
  layer and pass. The ``latticekit_sdpa`` attention stacks each group's queries instead
  (:func:`grouped_sdpa`), which is the same arithmetic on the same numbers.
* **Attention without per-length plans** (CUDA, SDPA attention): the passes run under
  ``torch.nn.attention.sdpa_kernel`` restricted to flash, memory-efficient and math attention
  (:data:`CUDA_SDPA_BACKENDS`). torch's default for bfloat16 on recent GPUs is cuDNN's, which
  builds a plan for every key length it has not seen; a decode's cache grows every step, so
  every pass paid 30-40 ms more on an H200 (10-21 ms steps; ``docs/gpu.md``).

Measured on the project's 2-core CPU (SmolLM2-135M, 200 cached tokens, one process, variants
interleaved; ``docs/speed.md``): one token 43 ms eager -> ~20 ms prepared; 9 tokens 72 -> ~25 ms.

The greedy tokens of a prepared model are its own: numerics differ from eager in the last bits
(a GEMM kernel rounds differently), so every baseline a speed-up is measured against runs on
the same prepared model. Nothing changes on other devices and dtypes but the attention.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from typing import Any, ContextManager, Optional, cast

import torch
from torch import nn

from latticekit._arrays import tensor_stamp

__all__ = ["PackedLinear", "Preparation", "native_bfloat16", "packable", "pack_linears", "fuse_heads", "prepare_target", "prepare_heads", "grouped_sdpa",
           "ATTENTION", "CUDA_SDPA_BACKENDS", "sdpa_backends", "sdpa_context"]

#: The attention implementation name prepared HF models use (registered with transformers).
ATTENTION = "latticekit_sdpa"
#: oneDNN's packing hint: the batch size the weight layout is tuned for. 16, 32 and 128 measured
#: the same for 1-32 rows of SmolLM2-135M's layers; 1 was slower for every size above one row.
_PACK_ROWS = 32
_PACKABLE = (torch.float32, torch.bfloat16)
#: Sibling projections fused into one GEMM: same input, computed back to back by the block.
_SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
#: The ``torch.nn.attention.SDPBackend`` members a prepared model's passes may use on CUDA: all
#: but cuDNN's (a plan per new key length). Flash serves the unmasked plain steps, memory-efficient
#: attention the masked tree passes, math what neither takes.
CUDA_SDPA_BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")


@dataclass
class Preparation:
    """What :func:`prepare_target` did to a model (``model.latticekit_preparation``).

    Attributes:
        device: the model's device when prepared.
        packed: ``nn.Linear`` layers turned into :class:`PackedLinear`.
        fused: groups of sibling projections sharing one GEMM.
        attention: the attention implementation after preparation (HF models).
        heads: ids of the head modules prepared along with it.
        sdpa_backends: the ``SDPBackend`` names its passes are restricted to
            (:func:`sdpa_backends`); None: torch chooses.
    """

    device: str
    packed: int = 0
    fused: int = 0
    attention: Optional[str] = None
    heads: set[int] = field(default_factory=set)
    sdpa_backends: Optional[tuple[str, ...]] = None

    def describe(self) -> str:
        parts = [f"{self.packed} packed linears", f"{self.fused} fused projection groups"]
        if self.attention:
            parts.append(f"attention {self.attention}")
        if self.sdpa_backends:
            parts.append("SDPA " + "/".join(name.split("_")[0].lower() for name in self.sdpa_backends))
        return f"prepared for {self.device}: " + ", ".join(parts)


@functools.lru_cache(maxsize=None)
def native_bfloat16() -> bool:
    """Whether this CPU computes bfloat16 products natively (AVX-512 BF16 or AMX) and oneDNN
    packs them: there a bfloat16 product reads half a float32 one's bytes, with dot-product
    instructions of its own. Without (AVX2, or AVX-512 without BF16), bfloat16 products are
    emulated and slower than float32 ones (stop 61's AVX2 EPYC: 2-10x)."""
    cpu = getattr(torch, "cpu", None)
    native = any(callable(getattr(cpu, name, None)) and getattr(cpu, name)()
                 for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))
    return bool(native and torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


@functools.lru_cache(maxsize=None)
def packable(dtype: torch.dtype) -> bool:
    """Whether oneDNN packs CPU weights of ``dtype`` (:func:`pack_rows`): float32 wherever
    oneDNN is built in; bfloat16 only where its bfloat16 kernels run (AVX-512 BW/VL/DQ or
    AVX-NE-CONVERT: on an AVX2-only CPU oneDNN refuses to pack bfloat16, and bfloat16 products
    go through ``torch.matmul``'s emulated kernel)."""
    if dtype not in _PACKABLE or not torch.backends.mkldnn.is_available():
        return False
    return dtype != torch.bfloat16 or bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def _can_pack(weight: torch.Tensor) -> bool:
    return weight.device.type == "cpu" and weight.dim() == 2 and packable(weight.dtype)


class _SharedProjection:
    """One packed GEMM for sibling projections of the same input: the first sibling called
    with an input computes every sibling's output and keeps them until another input comes.
    The siblings' weights and biases written in place since packing are packed anew."""

    def __init__(self, weights: list[torch.Tensor], biases: list[Optional[torch.Tensor]]) -> None:
        self.weights, self.biases = weights, biases
        self.sizes = [int(w.shape[0]) for w in weights]
        self._pack()

    def _pack(self) -> None:
        weights, biases = self.weights, self.biases
        with torch.no_grad():
            weight = torch.cat([w.detach() for w in weights])
            self.bias = None
            if any(b is not None for b in biases):
                self.bias = torch.cat([b.detach() if b is not None else w.new_zeros(w.shape[0])
                                       for w, b in zip(weights, biases)])
        self.packed = pack_rows(weight)
        self._stamp = tensor_stamp((*weights, *biases))
        self._input: Optional[torch.Tensor] = None
        self._outputs: tuple[torch.Tensor, ...] = ()

    def outputs(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if x is not self._input:
            if tensor_stamp((*self.weights, *self.biases)) != self._stamp:
                self._pack()
            y = _packed_linear(x, self.packed, self.bias, sum(self.sizes))
            self._outputs = y.split(self.sizes, dim=-1)
            self._input = x
        return self._outputs


def pack_rows(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` (out, in) packed by oneDNN for ``_linear_pointwise``: the one packer of the
    package (prepared targets and heads, candidate-vocabulary lattices). Only for a CPU weight
    whose dtype is :func:`packable`."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _PACK_ROWS)


def _packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: Optional[torch.Tensor], out: int) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1])
    y = torch.ops.mkldnn._linear_pointwise(rows, packed, bias, "none", [], "")
    return y.reshape(*x.shape[:-1], out)


class PackedLinear(nn.Module):
    """An ``nn.Linear`` whose weight oneDNN packed once, for inference on the CPU.

    ``weight`` and ``bias`` are the original parameters (same tensors, same ``state_dict``
    keys); the packed copy is an attribute. Inputs the packed kernel does not serve (another
    device or dtype, a dtype oneDNN does not pack on this CPU (:func:`packable`), or autograd) go through ``F.linear`` on the original weight. A weight
    changed since packing (written in place, as ``load_state_dict`` writes it, or its data
    replaced, as ``module.to`` replaces it) is packed anew before it is read; a sibling whose
    parameter was replaced leaves the shared GEMM and is packed on its own.

    Attributes:
        in_features, out_features: as ``nn.Linear``'s.
    """

    def __init__(self, linear: nn.Linear, shared: Optional[_SharedProjection] = None, index: int = 0) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self._shared = shared
        self._index = index
        self._packed: Optional[torch.Tensor] = None
        self._stamp: tuple[Any, ...] = ()
        if shared is None:
            self._packed, self._stamp = pack_rows(linear.weight), tensor_stamp((linear.weight,))

    def _serves(self, x: torch.Tensor) -> bool:
        return (x.device == self.weight.device and x.dtype == self.weight.dtype
                and x.device.type == "cpu" and packable(x.dtype)
                and not (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self._serves(x):
            return nn.functional.linear(x, self.weight, self.bias)
        shared = self._shared
        if shared is not None:
            if shared.weights[self._index] is self.weight and shared.biases[self._index] is self.bias:
                return shared.outputs(x)[self._index]
            self._shared = None  # a parameter replaced since: packed on its own from now on
        stamp = tensor_stamp((self.weight,))
        if stamp != self._stamp:  # left the shared GEMM, or the weight changed
            self._packed, self._stamp = pack_rows(self.weight), stamp
        return _packed_linear(x, cast(torch.Tensor, self._packed), self.bias, self.out_features)

    def release(self) -> None:
        """Frees this layer's own packed copy (a shared GEMM's belongs to its group and stays):
        the next forward the packed kernel serves packs the weight anew. For a layer that
        another copy computes nearly always: a fused head block (:func:`fuse_heads`)."""
        if self._shared is None:
            self._packed, self._stamp = None, ()

    @property
    def packed_bytes(self) -> int:
        """The bytes of this layer's own packed copy (0: released, or a shared GEMM's)."""
        packed = self._packed
        return 0 if packed is None else packed.numel() * packed.element_size()

    def extra_repr(self) -> str:
        shared = ", shared GEMM" if self._shared is not None else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, packed{shared}"


def _fuse_siblings(module: nn.Module) -> int:
    """Replaces each group of sibling projections of ``module`` by packed layers sharing a GEMM."""
    fused = 0
    for names in _SIBLINGS:
        layers: list[Any] = [getattr(module, name, None) for name in names]
        if not all(type(layer) is nn.Linear and _can_pack(layer.weight) for layer in layers):
            continue
        first = layers[0]
        if any(layer.in_features != first.in_features or layer.weight.dtype != first.weight.dtype
               for layer in layers):
            continue
        shared = _SharedProjection([layer.weight for layer in layers], [layer.bias for layer in layers])
        for i, (name, layer) in enumerate(zip(names, layers)):
            setattr(module, name, PackedLinear(layer, shared, i))
        fused += 1
    return fused


def pack_linears(root: nn.Module) -> None:
    """Turns every packable ``nn.Linear`` under ``root`` into a :class:`PackedLinear`; a layer
    met twice (shared by two parents) becomes one packed layer."""
    replaced: dict[int, PackedLinear] = {}
    for module in list(root.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear and _can_pack(child.weight):
                if id(child) not in replaced:
                    replaced[id(child)] = PackedLinear(child)
                setattr(module, name, replaced[id(child)])


def fuse_heads(heads: nn.Module) -> None:
    """Heads with ``fuse`` (:class:`latticekit.heads.BlockHeads`) compute every head's block in
    one product per layer, the first layer's packed where :func:`pack_linears` packs a linear.

    The blocks' own packed copies (:func:`pack_linears`') are released once fused: only a call
    the fused copy cannot serve (one that wants gradients, or weights changed since fusing)
    runs the blocks one by one, and packs a block's weight anew the first time it does. For
    SmolLM2's shipped heads in float32 that frees 18.6 MB (``PackedLinear.packed_bytes``)."""
    fuse = getattr(heads, "fuse", None)
    if not callable(fuse):
        return
    fuse(lambda linear: PackedLinear(linear) if _can_pack(linear.weight) else linear)
    blocks = getattr(heads, "blocks", None)
    if getattr(heads, "fused", None) is not None and isinstance(blocks, nn.Module):
        for module in blocks.modules():
            if isinstance(module, PackedLinear):
                module.release()


def grouped_sdpa(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: Optional[torch.Tensor], **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' sdpa attention, with grouped-query attention under a shared custom mask
    computed without repeating the keys and values.

    ``query`` (`(batch, heads, n, head_dim)`) holds ``groups`` query heads per key/value head;
    when several queries attend under one mask for all heads (a tree pass), each group's
    queries are stacked as rows, `(batch, kv_heads, groups * n, head_dim)`, against the
    unrepeated keys and values, with the mask repeated per group: the same dot products as
    transformers' ``repeat_kv`` path. Every other case goes to transformers' own function.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = int(getattr(module, "num_key_value_groups", 1))
    batch, heads, n, dim = query.shape
    if (groups == 1 or n == 1 or attention_mask is None or attention_mask.dim() != 4
            or attention_mask.shape[1] != 1 or kwargs.get("position_bias") is not None
            or kwargs.get("dropout", 0.0) or kwargs.get("softcap") is not None):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    stacked = query.reshape(batch, heads // groups, groups * n, dim)
    mask = attention_mask[:, :, :, : key.shape[2]]
    mask = mask.expand(batch, 1, n, mask.shape[-1]).repeat(1, 1, groups, 1)
    out = nn.functional.scaled_dot_product_attention(stacked, key, value, attn_mask=mask,
                                                     scale=kwargs.get("scaling"))
    return out.reshape(batch, heads, n, dim).transpose(1, 2).contiguous(), None


def sdpa_backends(device: Any, attention: Optional[str], is_hf: bool = True) -> Optional[tuple[str, ...]]:
    """The SDPA backends a model prepared on ``device`` runs its passes under:
    :data:`CUDA_SDPA_BACKENDS` on CUDA for SDPA attention (transformers' ``sdpa`` or
    :data:`ATTENTION`; a protocol module, ``is_hf`` False, may call SDPA too), else None: torch's
    own choice (the CPU has no per-length plans; eager attention calls no SDPA)."""
    if torch.device(device).type != "cuda":
        return None
    return CUDA_SDPA_BACKENDS if not is_hf or attention in ("sdpa", ATTENTION) else None


def sdpa_context(names: Optional[tuple[str, ...]]) -> ContextManager[Any]:
    """``torch.nn.attention.sdpa_kernel`` over the backends ``names`` (``SDPBackend`` members), or
    a context that changes nothing for None: what a prepared model's passes run in."""
    if not names:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([getattr(SDPBackend, name) for name in names])


_REGISTERED = False


def _register_attention() -> None:
    global _REGISTERED
    if not _REGISTERED:
        from transformers import AttentionInterface, AttentionMaskInterface
        from transformers.masking_utils import sdpa_mask

        AttentionInterface.register(ATTENTION, grouped_sdpa)
        AttentionMaskInterface.register(ATTENTION, sdpa_mask)
        _REGISTERED = True


def _grouped_query(config: Any) -> bool:
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None)
    return isinstance(heads, int) and isinstance(kv_heads, int) and 0 < kv_heads < heads


@torch.no_grad()
def prepare_heads(heads: nn.Module, model: Any) -> nn.Module:
    """Draft heads prepared like their target: their linears packed (CPU), every head's block
    computed in one product per layer (:meth:`latticekit.heads.BlockHeads.fuse`, any device),
    and an output projection shared with the target's (``heads.lm_head``) pointed at the
    target's prepared one. Idempotent; returns ``heads`` (changed in place).

    Args:
        heads: e.g. :class:`latticekit.heads.BlockHeads`.
        model: the target, already passed through :func:`prepare_target`.
    """
    prep = getattr(model, "latticekit_preparation", None)
    if prep is None:
        raise ValueError("prepare the target first: prepare_target(model, heads=heads)")
    if id(heads) in prep.heads:
        return heads
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    own = getattr(heads, "lm_head", None)
    if isinstance(head, PackedLinear) and own is not None and getattr(own, "weight", None) is head.weight:
        heads.lm_head = head
    pack_linears(heads)
    fuse_heads(heads)
    prep.heads.add(id(heads))
    return heads


@torch.no_grad()
def prepare_target(model: Any, heads: Optional[nn.Module] = None) -> Any:
    """Readies an HF causal LM (or any ``torch.nn.Module`` target) for decoding on its device.

    Changes the model in place and returns it; a second call does nothing (idempotent). On the
    CPU with float32 or bfloat16 weights: sibling projections fused and every ``nn.Linear``
    packed by oneDNN. HF models with grouped-query ``sdpa`` attention switch to
    :func:`grouped_sdpa` (any device). On CUDA, passes through ``latticekit.torch`` run their SDPA
    attention without cuDNN's (:func:`sdpa_backends`). Move the model to its device before
    preparing it.

    Args:
        model: an HF causal LM or a protocol module, in eval mode.
        heads: draft heads to prepare with it (:func:`prepare_heads`).

    Returns:
        ``model``; ``model.latticekit_preparation`` (:class:`Preparation`) says what was done.
    """
    prep = getattr(model, "latticekit_preparation", None)
    if prep is None:
        param = next(model.parameters(), None)
        prep = Preparation(device=str(param.device) if param is not None else "cpu")
        for module in list(model.modules()):
            prep.fused += _fuse_siblings(module)
        pack_linears(model)
        prep.packed = sum(1 for m in model.modules() if isinstance(m, PackedLinear))
        config = getattr(model, "config", None)
        if config is not None and getattr(config, "_attn_implementation", None) == "sdpa" and _grouped_query(config):
            _register_attention()
            model.set_attn_implementation(ATTENTION)
        prep.attention = getattr(config, "_attn_implementation", None) if config is not None else None
        prep.sdpa_backends = sdpa_backends(prep.device, prep.attention, is_hf=config is not None)
        model.latticekit_preparation = prep
    if heads is not None:
        prepare_heads(heads, model)
    return model
