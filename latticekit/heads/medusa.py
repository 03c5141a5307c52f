"""Medusa head checkpoints in the two formats serving engines read, to and from :class:`BlockHeads`.

Medusa (Cai et al., 2024) adds K heads to a frozen LM; Medusa head k (0-based) reads the final
hidden state at position t, applies L residual layers ``x + silu(W x + b)`` and its own vocabulary
projection, and predicts token t + k + 2: it is latticekit's head k + 2 (head 1 being the model's
own next-token head, which a Medusa checkpoint does not hold).

Two layouts are read and written, both a folder with a ``config.json`` and one weights file:

* ``"medusa"`` (FasterDecoding's reference code): config ``medusa_num_heads``,
  ``medusa_num_layers``; weights ``medusa_lm_head.safetensors`` (or ``.pt``) with tensors
  ``{k}.{l}.linear.weight`` / ``.bias`` and ``{k}.{L}.weight`` (head k's projection). That code
  builds its L layers as ``[ResBlock] * L``, one layer's weights shared by all L; a file may
  therefore name only layer 0, and heads whose layers differ cannot be written in this format.
* ``"vllm"`` (vLLM's Medusa model): config ``num_heads``, ``num_hidden_layers``, optional
  ``medusa_fc_bias``, ``truncated_vocab_size``, ``original_lm_head``, ``logit_scale``; weights
  ``model.safetensors`` (or ``.pt`` / ``.bin``) with ``blocks.{k}.layers.{l}.weight`` (``.bias``),
  ``lm_heads.{k}.weight`` (only ``lm_heads.0`` with ``original_lm_head``, shared by all heads)
  and, for a truncated vocabulary, ``token_map`` (the token ids of the projection's rows).

A ``.pt`` / ``.bin`` file is read only with ``torch.load(weights_only=True)``: no user file is
ever unpickled. Safetensors files are written.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union, cast

import torch
from torch import Tensor

from latticekit._files import atomic_write
from latticekit.errors import HeadsFormatError, HeadsMismatchError
from latticekit.heads.fingerprint import lm_head_fingerprint
from latticekit.heads.modules import BlockHeads, _model_name, _output_projection

if TYPE_CHECKING:
    from collections.abc import Iterable

    from latticekit.heads.layers import MedusaLayer


__all__ = ["MedusaCheckpoint", "read_medusa", "load_medusa", "write_medusa", "MEDUSA_FORMATS"]

MEDUSA_FORMATS = ("medusa", "vllm")
_WEIGHT_FILES = {"medusa": ("medusa_lm_head.safetensors", "medusa_lm_head.pt"),
                 "vllm": ("model.safetensors", "pytorch_model.bin", "model.pt")}
_PREFIXES = ("medusa_heads.", "medusa_head.")


@dataclass
class MedusaCheckpoint:
    """The weights of K Medusa heads, independent of the file layout.

    Attributes:
        layers: ``layers[k][l]`` = (weight `(d, d)`, bias `(d,)` or None) of head k's layer l.
        projections: head k's vocabulary projection `(V', d)`, or None for every head where the
            heads use the base model's own ``lm_head``.
        token_map: None, or the token ids `(V',)` scored by the projections' rows.
        logit_scale: multiplies the heads' logits.
        vocab_size: V, the base model's vocabulary.
        hidden_size: d.
    """

    layers: list[list[tuple[Tensor, Optional[Tensor]]]]
    projections: Optional[list[Tensor]]
    token_map: Optional[Tensor]
    logit_scale: float
    vocab_size: int
    hidden_size: int

    @property
    def num_heads(self) -> int:
        return len(self.layers)

    @property
    def num_layers(self) -> int:
        return len(self.layers[0])


def _load_tensors(path: Path) -> dict[str, Tensor]:
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            tensors = load_file(str(path))
        else:
            tensors = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # safetensors, zipfile and the unpickler's refusals all end here
        raise HeadsFormatError(f"cannot read Medusa weights {path}: {exc}") from exc
    if not isinstance(tensors, dict) or not all(isinstance(v, Tensor) for v in tensors.values()):
        raise HeadsFormatError(f"{path} is not a flat dictionary of tensors")
    out = {}
    for name, tensor in tensors.items():
        for prefix in _PREFIXES:
            name = name.removeprefix(prefix)
        out[name] = tensor
    return out


def _detect(config: dict[str, Any]) -> str:
    if "medusa_num_heads" in config:
        return "medusa"
    if "num_heads" in config and "num_hidden_layers" in config:
        return "vllm"
    raise HeadsFormatError("config.json names neither medusa_num_heads (FasterDecoding) nor num_heads and "
                           "num_hidden_layers (vLLM)")


def _positive_int(config: dict[str, Any], key: str) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise HeadsFormatError(f"config.json field {key!r} is missing or not a positive integer: {value!r}")
    return value


def read_medusa(path: Union[str, os.PathLike]) -> tuple[str, MedusaCheckpoint]:
    """The format and weights of a Medusa checkpoint.

    Args:
        path: the checkpoint folder (with ``config.json``), or its weights file.

    Returns:
        (``"medusa"`` or ``"vllm"``, the checkpoint).

    Raises:
        HeadsFormatError: the folder, config or weights are missing, damaged or inconsistent.
    """
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise HeadsFormatError(f"cannot read the Medusa config {folder / 'config.json'}: {exc}") from exc
    if not isinstance(config, dict):
        raise HeadsFormatError(f"{folder / 'config.json'} is not a JSON object")
    fmt = _detect(config)
    if path.is_dir():
        found = [folder / name for name in _WEIGHT_FILES[fmt] if (folder / name).is_file()]
        if not found:
            raise HeadsFormatError(f"{folder} has none of the weight files {', '.join(_WEIGHT_FILES[fmt])}")
        path = found[0]
    tensors = _load_tensors(path)
    try:
        checkpoint = _parse_medusa(config, tensors) if fmt == "medusa" else _parse_vllm(config, tensors)
    except KeyError as exc:
        raise HeadsFormatError(f"{path}: tensor {exc.args[0]!r} is missing") from exc
    _check_shapes(checkpoint, path)
    return fmt, checkpoint


def _parse_medusa(config: dict[str, Any], tensors: dict[str, Tensor]) -> MedusaCheckpoint:
    num_heads, num_layers = _positive_int(config, "medusa_num_heads"), _positive_int(config, "medusa_num_layers")
    layers = []
    for k in range(num_heads):
        head = []
        for layer in range(num_layers):
            name = f"{k}.{layer}.linear" if f"{k}.{layer}.linear.weight" in tensors else f"{k}.0.linear"  # shared
            head.append((tensors[f"{name}.weight"], tensors.get(f"{name}.bias")))
        layers.append(head)
    projections = [tensors[f"{k}.{num_layers}.weight"] for k in range(num_heads)]
    return MedusaCheckpoint(layers, projections, None, 1.0, int(projections[0].shape[0]),
                            int(projections[0].shape[1]))


def _parse_vllm(config: dict[str, Any], tensors: dict[str, Tensor]) -> MedusaCheckpoint:
    num_heads, num_layers = _positive_int(config, "num_heads"), _positive_int(config, "num_hidden_layers")
    layers = [[(tensors[f"blocks.{k}.layers.{j}.weight"], tensors.get(f"blocks.{k}.layers.{j}.bias"))
               for j in range(num_layers)] for k in range(num_heads)]
    hidden_size = int(layers[0][0][0].shape[1])
    vocab_size = config.get("vocab_size")
    truncated = config.get("truncated_vocab_size") or vocab_size
    token_map = tensors.get("token_map")
    if token_map is not None and vocab_size is not None and truncated is not None and truncated >= vocab_size:
        token_map = None  # vLLM ignores a token map when the vocabulary is not truncated
    if config.get("original_lm_head"):
        projections = None if "lm_heads.0.weight" not in tensors else [tensors["lm_heads.0.weight"]] * num_heads
    else:
        projections = [tensors[f"lm_heads.{k}.weight"] for k in range(num_heads)]
    if token_map is not None:
        token_map = token_map.reshape(-1).long()
        if projections is not None and projections[0].shape[0] > len(token_map):  # full rows: keep the map's
            projections = [p[token_map] for p in projections]
    elif truncated is not None and vocab_size is not None and truncated < vocab_size:
        raise HeadsFormatError(f"truncated_vocab_size {truncated} < vocab_size {vocab_size} needs a token_map tensor")
    if vocab_size is None:
        if projections is None or token_map is not None:
            raise HeadsFormatError("config.json has no vocab_size")
        vocab_size = int(projections[0].shape[0])
    return MedusaCheckpoint(layers, projections, token_map, float(config.get("logit_scale", 1.0)),
                            int(vocab_size), hidden_size)


def _check_shapes(checkpoint: MedusaCheckpoint, path: Path) -> None:
    d = checkpoint.hidden_size
    rows = None if checkpoint.token_map is None else len(checkpoint.token_map)
    for k, head in enumerate(checkpoint.layers):
        for weight, bias in head:
            if weight.shape != (d, d) or (bias is not None and bias.shape != (d,)):
                raise HeadsFormatError(f"{path}: head {k} has a layer of shape {tuple(weight.shape)}, not ({d}, {d})")
        if checkpoint.projections is not None:
            want = (rows or checkpoint.vocab_size, d)
            if tuple(checkpoint.projections[k].shape) != want:
                raise HeadsFormatError(f"{path}: head {k}'s projection has shape "
                                       f"{tuple(checkpoint.projections[k].shape)}, expected {want}")
    if checkpoint.token_map is not None and (int(checkpoint.token_map.min()) < 0
                                             or int(checkpoint.token_map.max()) >= checkpoint.vocab_size):
        raise HeadsFormatError(f"{path}: token_map holds ids outside the vocabulary of {checkpoint.vocab_size}")


def checkpoint_of(heads: BlockHeads) -> MedusaCheckpoint:
    """The Medusa weights of ``medusa``-layer heads (the model's own head 1 is not part of them).

    Raises:
        HeadsMismatchError: the heads use latticekit's ``mlp`` layers or read the next token
            (``token_conditioned``), which Medusa cannot express.
    """
    if heads.layer != "medusa":
        raise HeadsMismatchError("only heads with layer='medusa' (x + silu(W x + b)) can be written as Medusa "
                                 f"heads; these use {heads.layer!r} layers")
    if getattr(heads, "token_conditioned", False):
        raise HeadsMismatchError("Medusa heads read only the hidden state; these heads also read the next "
                                 "token (token_conditioned=True)")
    layers: list[list[tuple[Tensor, Optional[Tensor]]]] = []
    for block in heads.blocks:
        # the layers of a "medusa" head
        stack = cast("list[MedusaLayer]", list(block) if isinstance(block, torch.nn.Sequential) else [block])
        layers.append([(m.linear.weight.detach(), None if m.linear.bias is None else m.linear.bias.detach())
                       for m in stack])
    projections = None if heads.projections is None else [cast(torch.nn.Linear, p).weight.detach()
                                                           for p in heads.projections]
    return MedusaCheckpoint(layers, projections, heads.token_map, heads.logit_scale, heads.vocab_size,
                            heads.hidden_size)


def write_medusa(folder: Union[str, os.PathLike], heads: BlockHeads, format: str = "vllm",
                 dtype: Optional[torch.dtype] = None) -> None:
    """Write ``medusa``-layer heads as a Medusa checkpoint folder (see the module docstring).

    Raises:
        HeadsMismatchError: the format cannot hold these heads (``mlp`` layers; for
            ``"medusa"``: distinct layers within a head, a truncated vocabulary or a logit scale).
        ValueError: ``format`` is not ``"medusa"`` or ``"vllm"``.
    """
    from safetensors.torch import save as st_save

    if format not in MEDUSA_FORMATS:
        raise ValueError(f"format must be one of {MEDUSA_FORMATS}, got {format!r}")
    checkpoint = checkpoint_of(heads)
    own = heads.lm_head.weight.detach()
    projections = checkpoint.projections
    tensors: dict[str, Tensor] = {}
    if format == "medusa":
        if checkpoint.token_map is not None or checkpoint.logit_scale != 1.0:
            raise HeadsMismatchError("the FasterDecoding format has no truncated vocabulary or logit scale")
        for k, head in enumerate(checkpoint.layers):
            if any(not torch.equal(w, head[0][0]) or not _same(b, head[0][1]) for w, b in head):
                raise HeadsMismatchError("the FasterDecoding format shares one layer across a head's "
                                         f"{checkpoint.num_layers} layers, but head {k + 2}'s layers differ: "
                                         "use format='vllm'")
            for layer, (weight, bias) in enumerate(head):
                tensors[f"{k}.{layer}.linear.weight"] = weight
                if bias is not None:
                    tensors[f"{k}.{layer}.linear.bias"] = bias
            tensors[f"{k}.{checkpoint.num_layers}.weight"] = own if projections is None else projections[k]
        config: dict[str, Any] = {"medusa_num_heads": checkpoint.num_heads,
                                  "medusa_num_layers": checkpoint.num_layers}
    else:
        layer_bias = heads.layer_bias
        for k, head in enumerate(checkpoint.layers):
            for j, (weight, b) in enumerate(head):
                tensors[f"blocks.{k}.layers.{j}.weight"] = weight
                if layer_bias:
                    assert b is not None  # the layers have biases iff layer_bias
                    tensors[f"blocks.{k}.layers.{j}.bias"] = b
        if projections is None:
            tensors["lm_heads.0.weight"] = own
        else:
            tensors |= {f"lm_heads.{k}.weight": p for k, p in enumerate(projections)}
        if checkpoint.token_map is not None:
            tensors["token_map"] = checkpoint.token_map
        config = {"model_type": "medusa", "architectures": ["MedusaModel"], "num_heads": checkpoint.num_heads,
                  "num_hidden_layers": checkpoint.num_layers, "medusa_fc_bias": layer_bias,
                  "original_lm_head": projections is None, "logit_scale": checkpoint.logit_scale,
                  "truncated_vocab_size": checkpoint.vocab_size if checkpoint.token_map is None
                  else len(checkpoint.token_map)}
    config |= {"hidden_size": heads.hidden_size, "vocab_size": heads.vocab_size,
               "base_model_name_or_path": heads.metadata.get("base_model", "")}
    # Copies, so tied tensors (one lm_head written for several heads) are separate in the file.
    tensors = {name: t.detach().to("cpu", dtype if (dtype and t.is_floating_point()) else t.dtype).clone().contiguous()
               for name, t in tensors.items()}
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_write(folder / _WEIGHT_FILES[format][0]) as f:
        f.write(st_save(tensors))
    with atomic_write(folder / "config.json") as f:
        f.write((json.dumps(config, indent=1) + "\n").encode())


def _same(a: Optional[Tensor], b: Optional[Tensor]) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))


def load_medusa(path: Union[str, os.PathLike], model: Any) -> BlockHeads:
    """Medusa heads from a FasterDecoding or vLLM checkpoint (``latticekit.heads.medusa``).

    Medusa head k predicts token t + k + 2 and becomes head k + 2 here; head 1 is the
    model's own. A ``.pt`` / ``.bin`` file is read with ``torch.load(weights_only=True)``.

    Args:
        path: the checkpoint folder (``config.json`` and its weights file) or the weights file.
        model: the HF causal LM the heads were trained for.

    Returns:
        Heads with ``layer="medusa"``, on the model's device and dtype, in eval mode. Heads
        whose projections all equal the model's ``lm_head`` share it instead of copying it.

    Raises:
        HeadsFormatError: the checkpoint is missing, damaged or inconsistent.
        HeadsMismatchError: it was made for another hidden size or vocabulary.
    """
    fmt, checkpoint = read_medusa(path)
    lm_head = _output_projection(model)
    weight = lm_head.weight
    vocab_size, hidden_size = (int(n) for n in weight.shape)
    if (checkpoint.hidden_size, checkpoint.vocab_size) != (hidden_size, vocab_size):
        raise HeadsMismatchError(f"{path}: Medusa heads for hidden size {checkpoint.hidden_size} and vocabulary "
                                 f"{checkpoint.vocab_size}, the model has {hidden_size} and {vocab_size}")
    biases = {bias is not None for head in checkpoint.layers for _, bias in head}
    if len(biases) != 1:
        raise HeadsFormatError(f"{path}: some Medusa layers have a bias and some do not")
    projections = checkpoint.projections
    if projections is not None and checkpoint.token_map is None and all(
            torch.equal(p.to(weight.device, weight.dtype), weight.detach()) for p in projections):
        projections = None  # copies of the model's own lm_head: tie instead
    lm_head.requires_grad_(False)
    heads = BlockHeads(lm_head, checkpoint.num_heads + 1, layer="medusa", num_layers=checkpoint.num_layers,
                layer_bias=biases.pop(), projection_rows=None if projections is None else len(projections[0]),
                token_map=checkpoint.token_map, logit_scale=checkpoint.logit_scale,
                metadata={"base_model": _model_name(model), "lm_head_fingerprint": lm_head_fingerprint(weight),
                          "medusa_format": fmt, "medusa_source": os.path.basename(os.fspath(path))})
    with torch.no_grad():
        for block, layers in zip(heads.blocks, checkpoint.layers):
            medusa_layers = cast("Iterable[MedusaLayer]", block if heads.num_layers > 1 else [block])
            for layer, (w, b) in zip(medusa_layers, layers):
                layer.linear.weight.copy_(w)
                if b is not None:
                    layer.linear.bias.copy_(b)
        for projection, w in zip(heads.projections or [], projections or []):
            cast(torch.nn.Linear, projection).weight.copy_(w)
    return heads.eval()
