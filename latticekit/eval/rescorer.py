"""The neural rescorer of local rescoring (the reference paper's Algorithm 2).

A small causal transformer language model over the target's token ids. It re-ranks each
head's top-k set: for heads j = 2..h, ``x_j = argmax over S_j of z_j + alpha * r_j``, where
``z_j`` are head j's log-probabilities and ``r_j`` the rescorer's log-probabilities after the
decoded prefix and the already chosen draft tokens ``x_2 .. x_{j-1}``.

To stay cheap to train on a CPU, the rescorer predicts a *restricted vocabulary*: the
``num_classes - 1`` most frequent training tokens get a class each, every other token id shares
one "other" class. A token of the other class is scored ``log p(other) - log(#other ids)``
(the class's mass spread evenly), so scores are log-probabilities of a proper distribution over
the full vocabulary.

Two ways to run it give the same numbers:

* :meth:`NeuralRescorer.forward`: plain causal language modelling over `(batch, T)` ids
  (training, and the obviously-correct reference);
* :meth:`NeuralRescorer.prefix_state` once over a sequence, then
  :meth:`NeuralRescorer.continuation_logprobs` for many (prefix end, draft tokens) rows at
  once: each row attends to its own prefix of the shared sequence and to its own draft tokens.
  This is what makes rescoring every position of a decode cheap.

This module needs torch.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Union, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from latticekit._files import atomic_write, check_weights, read_tagged_safetensors
from latticekit.errors import RescorerError, RescorerFormatError

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = [
    "NeuralRescorer",
    "PrefixState",
    "RescorerError",
    "RescorerFormatError",
    "check_rescorer",
    "context_window",
    "local_rescore",
    "neural_drafts",
]

FORMAT_NAME = "latticekit-neural-rescorer"
FORMAT_VERSION = 1
_CONFIG_KEYS = ("vocab_size", "num_classes", "d_model", "num_layers", "num_heads", "d_ff", "max_len")


@dataclass
class PrefixState:
    """Keys and values of every layer over a sequence, and its last layer's output.

    Attributes:
        keys, values: one `(num_heads, T, head_dim)` tensor per layer.
        hidden (`torch.Tensor` of shape `(T, d_model)`): the last layer's output at every
            position (the output layer runs only where a caller asks, see
            :meth:`NeuralRescorer.continuation_logprobs`).
    """

    keys: list[Tensor]
    values: list[Tensor]
    hidden: Tensor

    @property
    def length(self) -> int:
        return int(self.hidden.shape[0])


class _Layer(nn.Module):
    def __init__(self, d_model: int, num_heads: int, d_ff: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.norm1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.ff1 = nn.Linear(d_model, d_ff)
        self.ff2 = nn.Linear(d_ff, d_model)

    def split(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """`(..., n, d)` -> q, k, v of shape `(..., heads, n, head_dim)`."""
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        shape = x.shape[:-1] + (self.num_heads, -1)
        return tuple(t.reshape(shape).transpose(-3, -2) for t in (q, k, v))

    def finish(self, x: Tensor, attended: Tensor) -> Tensor:
        """Residual attention output then the feed-forward block; ``attended`` is `(..., heads, n, hd)`."""
        merged = attended.transpose(-3, -2).flatten(-2)
        x = x + self.out(merged)
        return x + self.ff2(F.gelu(self.ff1(self.norm2(x))))


class NeuralRescorer(nn.Module):
    """A small pre-norm causal transformer LM with learned positions and a tied output layer.

    Args:
        vocab_map (`torch.LongTensor` of shape `(vocab_size,)`): the class of every token id of
            the target's vocabulary, in ``[0, num_classes)``; class ``num_classes - 1`` is "other".
        d_model, num_layers, num_heads, d_ff: transformer sizes.
        max_len: the longest sequence (prefix plus draft) the position table covers.
        metadata: free-form JSON-able facts saved with the weights (training recipe, ...).
    """

    def __init__(self, vocab_map: Tensor, d_model: int = 256, num_layers: int = 4, num_heads: int = 4,
                 d_ff: int = 1024, max_len: int = 256, metadata: Optional[dict[str, Any]] = None) -> None:
        super().__init__()
        if vocab_map.dim() != 1 or vocab_map.dtype != torch.long or vocab_map.numel() == 0:
            raise RescorerError("vocab_map must be a non-empty 1-D LongTensor")
        num_classes = int(vocab_map.max()) + 1
        if int(vocab_map.min()) < 0:
            raise RescorerError("vocab_map holds a negative class")
        if d_model % num_heads:
            raise RescorerError(f"d_model ({d_model}) must be a multiple of num_heads ({num_heads})")
        self.config = dict(vocab_size=int(vocab_map.numel()), num_classes=num_classes, d_model=d_model,
                           num_layers=num_layers, num_heads=num_heads, d_ff=d_ff, max_len=max_len)
        self.metadata = dict(metadata or {})
        self.vocab_map: Tensor
        self.register_buffer("vocab_map", vocab_map.clone())
        other = vocab_map == num_classes - 1
        # log of how many ids share the "other" class: its mass is spread evenly over them.
        penalty = torch.zeros(num_classes)
        penalty[-1] = math.log(max(1, int(other.sum())))
        self.class_penalty: Tensor
        self.register_buffer("class_penalty", penalty)
        self.embed = nn.Embedding(num_classes, d_model)
        self.position = nn.Embedding(max_len, d_model)
        self.layers = nn.ModuleList(_Layer(d_model, num_heads, d_ff) for _ in range(num_layers))
        self.norm = nn.LayerNorm(d_model)
        nn.init.normal_(self.embed.weight, std=0.02)
        nn.init.normal_(self.position.weight, std=0.01)

    @property
    def max_len(self) -> int:
        return int(self.config["max_len"])

    @property
    def vocab_size(self) -> int:
        return int(self.config["vocab_size"])

    def classes(self, ids: Tensor) -> Tensor:
        """Token ids -> classes; ids outside the vocabulary fall into "other"."""
        ids = ids.long()
        inside = (ids >= 0) & (ids < self.vocab_size)
        other = torch.full_like(ids, int(self.config["num_classes"]) - 1)
        return torch.where(inside, self.vocab_map[ids.clamp(0, self.vocab_size - 1)], other)

    def _logprobs(self, x: Tensor) -> Tensor:
        return torch.log_softmax(self.norm(x) @ self.embed.weight.T, dim=-1)

    def forward(self, ids: Tensor) -> Tensor:
        """Class logits `(batch, T, num_classes)` of the token after each position of ids
        `(batch, T)`, T <= ``max_len`` (plain causal attention; training and reference)."""
        T = ids.shape[-1]
        if T > self.max_len:
            raise RescorerError(f"sequence of {T} tokens; the rescorer covers {self.max_len}")
        x, _, _ = self._causal(ids)
        return self.norm(x) @ self.embed.weight.T

    def token_logprobs(self, class_logprobs: Tensor, tokens: Tensor) -> Tensor:
        """Full-vocabulary log-probabilities of ``tokens`` from class log-probabilities:
        ``class_logprobs[..., class(t)] - log(#ids of that class)`` (broadcast over the last axis
        of ``tokens`` against the rows of ``class_logprobs``)."""
        cls = self.classes(tokens)
        return class_logprobs.gather(-1, cls) - self.class_penalty[cls]

    @torch.no_grad()
    def prefix_state(self, ids: Tensor) -> PrefixState:
        """Runs a `(T,)` sequence, T <= ``max_len``, and keeps every layer's keys and values."""
        if ids.dim() != 1 or not 1 <= ids.shape[0] <= self.max_len:
            raise RescorerError(f"prefix_state needs 1..{self.max_len} ids in a 1-D tensor, got shape "
                                f"{tuple(ids.shape)}")
        x, keys, values = self._causal(ids)
        return PrefixState(keys, values, x)

    def _causal(self, ids: Tensor) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        """The last layer's output for ids `(..., T)` under plain causal attention, with every
        layer's keys and values."""
        x = self.embed(self.classes(ids)) + self.position.weight[: ids.shape[-1]]
        keys, values = [], []
        for layer in cast("Iterable[_Layer]", self.layers):
            q, k, v = layer.split(x)
            keys.append(k)
            values.append(v)
            x = layer.finish(x, F.scaled_dot_product_attention(q, k, v, is_causal=True))
        return x, keys, values

    @torch.no_grad()
    def continuation_logprobs(self, state: PrefixState, ends: Tensor, drafts: Tensor) -> Tensor:
        """Class log-probabilities after ``sequence[: ends[n] + 1] + drafts[n]`` for every row n.

        Args:
            state: :meth:`prefix_state` of the shared sequence.
            ends (`torch.LongTensor` of shape `(N,)`): the last prefix position of each row.
            drafts (`torch.LongTensor` of shape `(N, m)`): each row's tokens after its prefix
                (m may be 0).

        Returns:
            `(N, num_classes)` log-probabilities of the token after each row's last token;
            equal (to float rounding) to :meth:`forward` on that row's concatenation.
        """
        return self._logprobs(self._continuation_hidden(state, ends, drafts))

    @torch.no_grad()
    def continuation_token_scores(self, state: PrefixState, ends: Tensor, drafts: Tensor,
                                  tokens: Tensor) -> Tensor:
        """:meth:`token_logprobs` of ``tokens[n]`` after row n's continuation, *less a
        constant per row* (the log of the row's softmax normaliser): what ranking a row's
        candidate tokens needs, for k output rows instead of all ``num_classes``.

        Args:
            state, ends, drafts: as in :meth:`continuation_logprobs`.
            tokens (`torch.LongTensor` of shape `(N, k)`): each row's candidates.

        Returns:
            `(N, k)`: ``token_logprobs(continuation_logprobs(...), tokens) + c[n]``.
        """
        x = self.norm(self._continuation_hidden(state, ends, drafts))  # (N, d)
        cls = self.classes(tokens)
        logits = torch.einsum("nd,nkd->nk", x, self.embed.weight[cls])
        return logits - self.class_penalty[cls]

    def _continuation_hidden(self, state: PrefixState, ends: Tensor, drafts: Tensor) -> Tensor:
        """The last layer's output `(N, d_model)` after each row's prefix and draft."""
        N, m = drafts.shape
        if N and (int(ends.min()) < 0 or int(ends.max()) >= state.length):
            raise RescorerError(f"prefix ends must lie in 0..{state.length - 1}")
        if m == 0:
            return state.hidden[ends]
        if int(ends.max()) + m >= self.max_len:
            raise RescorerError(f"a prefix ending at {int(ends.max())} plus {m} draft tokens leaves the "
                                f"rescorer's {self.max_len} positions")
        positions = ends[:, None] + 1 + torch.arange(m, device=ends.device)
        x = self.embed(self.classes(drafts)) + self.position(positions)  # (N, m, d)
        T = state.length
        hidden_prefix = torch.arange(T, device=ends.device)[None, :] > ends[:, None]  # (N, T): not visible
        future = torch.ones(m, m, dtype=torch.bool, device=ends.device).triu(1)
        for layer, k_prefix, v_prefix in zip(cast("Iterable[_Layer]", self.layers), state.keys, state.values):
            q, k, v = layer.split(x)  # (N, heads, m, hd)
            scale = q.shape[-1] ** -0.5
            # Scores against the shared prefix as one matmul per head (the prefix's keys are never
            # copied per row), then against the row's own draft tokens; one softmax over both.
            on_prefix = torch.einsum("nhmd,htd->nhmt", q, k_prefix) * scale
            on_prefix = on_prefix.masked_fill(hidden_prefix[:, None, None, :], float("-inf"))
            on_draft = (q @ k.transpose(-1, -2) * scale).masked_fill(future, float("-inf"))
            weights = torch.softmax(torch.cat([on_prefix, on_draft], dim=-1), dim=-1)
            attended = torch.einsum("nhmt,htd->nhmd", weights[..., :T], v_prefix) + weights[..., T:] @ v
            x = layer.finish(x, attended)
        return x[:, -1]

    def save(self, path: Union[str, os.PathLike], dtype: Optional[torch.dtype] = torch.float16) -> None:
        """Writes weights, vocabulary map and metadata to a safetensors file, atomically
        (temporary file in the same folder, then rename)."""
        from safetensors.torch import save as st_save

        tensors = {name: (t.detach().cpu().contiguous() if name == "vocab_map" or dtype is None
                          else t.detach().to("cpu", dtype).contiguous())
                   for name, t in self.state_dict().items() if name != "class_penalty"}
        header = {**self.metadata, **self.config, "format": FORMAT_NAME, "version": FORMAT_VERSION}
        data = st_save(tensors, metadata={"latticekit": json.dumps(header)})
        with atomic_write(path) as f:
            f.write(data)

    @classmethod
    def load(cls, path: Union[str, os.PathLike], device: Any = "cpu") -> "NeuralRescorer":
        """A rescorer written by :meth:`save`, in float32 and eval mode.

        Raises:
            RescorerFormatError: the file is missing, damaged, or its tensors do not match its header.
        """
        header, tensors = _read(path)
        vocab_map = tensors["vocab_map"]
        metadata = {k: v for k, v in header.items() if k not in _CONFIG_KEYS + ("format", "version")}
        try:
            model = cls(vocab_map.long(), header["d_model"], header["num_layers"], header["num_heads"],
                        header["d_ff"], header["max_len"], metadata=metadata)
            weights = {k: v.float() for k, v in tensors.items() if k != "vocab_map"}
            weights["vocab_map"] = vocab_map.long()
            weights["class_penalty"] = model.class_penalty
            model.load_state_dict(weights)
        except (RuntimeError, ValueError) as exc:
            raise RescorerFormatError(f"{path}: tensors do not match the header: {exc}") from exc
        return model.to(device).eval()


def _read(path: Union[str, os.PathLike]) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """Header and tensors of a rescorer file, with every failure as a RescorerFormatError.

    The tensors are checked against the header before anything is allocated from it: the
    vocabulary map (integers) matches the sizes, and every weight has the shape the sizes
    imply, a floating-point dtype and finite values.
    """
    header, tensors = read_tagged_safetensors(path, FORMAT_NAME, FORMAT_VERSION, "rescorer",
                                              RescorerFormatError)
    if any(not isinstance(header.get(key), int) or isinstance(header[key], bool) or header[key] < 1
           for key in _CONFIG_KEYS):
        raise RescorerFormatError(f"{path}: header lacks a valid {_CONFIG_KEYS} field")
    vocab_map = tensors.get("vocab_map")
    if vocab_map is None or vocab_map.dim() != 1 or vocab_map.dtype.is_floating_point \
            or vocab_map.dtype.is_complex or vocab_map.dtype == torch.bool \
            or vocab_map.numel() != header["vocab_size"] \
            or int(vocab_map.max()) + 1 != header["num_classes"] or int(vocab_map.min()) < 0:
        raise RescorerFormatError(f"{path}: vocab_map does not match the header")
    if header["d_model"] % header["num_heads"]:
        raise RescorerFormatError(f"{path}: d_model ({header['d_model']}) is not a multiple of "
                                  f"num_heads ({header['num_heads']})")
    num_layers = header["num_layers"]
    layers = {name.split(".")[1] for name in tensors if name.startswith("layers.")}
    if len(layers) != num_layers:
        raise RescorerFormatError(f"{path}: {len(layers)} layers of weights, the header says {num_layers}")
    try:
        with torch.device("meta"):  # shapes only, nothing allocated; one layer stands for all
            one_layer = NeuralRescorer(vocab_map.long(), header["d_model"], 1, header["num_heads"],
                                       header["d_ff"], header["max_len"]).state_dict()
    except (RuntimeError, ValueError, OverflowError) as exc:  # sizes beyond any tensor
        raise RescorerFormatError(f"{path}: the header's sizes describe no possible model: {exc}") from exc
    shapes = {}
    for name, t in one_layer.items():
        if name.startswith("layers.0."):
            shapes.update({f"layers.{i}.{name[len('layers.0.'):]}": tuple(t.shape) for i in range(num_layers)})
        elif name != "class_penalty":  # computed, not saved
            shapes[name] = tuple(t.shape)
    check_weights(path, tensors, shapes, RescorerFormatError, integer=("vocab_map",))
    return header, tensors


@torch.no_grad()
def local_rescore(rescorer: NeuralRescorer, state: PrefixState, ends: Tensor, lattice_tokens: Tensor,
                  lattice_scores: Tensor, alpha: float) -> Tensor:
    """Algorithm 2 for N lattices at once: for heads j = 2..h, pick
    ``argmax over the arcs of column j of score + alpha * r_j`` greedily, left to right.

    Args:
        rescorer: the rescoring LM.
        state: :meth:`NeuralRescorer.prefix_state` of a sequence holding every row's prefix.
        ends (`torch.LongTensor` of shape `(N,)`): position of each row's last prefix token (the
            lattice's fixed first token, the root).
        lattice_tokens, lattice_scores (`(N, h, k)`): the rows' lattices (column 1 is the root).
        alpha: rescorer weight; 0 gives the heads' arg-max (vanilla) drafts.

    Returns:
        `torch.LongTensor` of shape `(N, h - 1)`: each row's draft for positions 2..h. Ties go to
        the earlier (better-ranked) arc.

    Raises:
        RescorerError: a row's prefix plus draft leaves the rescorer's positions.
    """
    N, h, _ = lattice_tokens.shape
    tokens = lattice_tokens.long()
    chosen = torch.empty(N, 0, dtype=torch.long, device=tokens.device)
    rows = torch.arange(N, device=tokens.device)
    for j in range(1, h):
        arcs = tokens[:, j]
        if alpha == 0:
            best = lattice_scores[:, j].argmax(dim=-1)
        else:
            # Token log-probabilities up to a constant per row, which cannot change the row's
            # arg-max: the output layer runs for the k arcs only, not for every class.
            r = rescorer.continuation_token_scores(state, ends, chosen, arcs)
            best = (lattice_scores[:, j].to(r.dtype) + alpha * r).argmax(dim=-1)
        chosen = torch.cat([chosen, arcs[rows, best][:, None]], dim=1)
    return chosen


def context_window(rescorer: NeuralRescorer, num_heads: int) -> int:
    """The most prefix tokens the rescorer reads: its position table must also hold the
    ``num_heads - 2`` draft tokens after them."""
    window = rescorer.max_len - max(0, num_heads - 2)
    if window < 1:
        raise RescorerError(f"a rescorer of {rescorer.max_len} positions cannot rescore {num_heads} heads")
    return window


def check_rescorer(rescorer: Any, vocab_size: Optional[int], num_heads: int,
                   largest_id: Optional[int] = None) -> "NeuralRescorer":
    """The rescorer, checked against the target's vocabulary and the heads.

    Args:
        vocab_size: the target's vocabulary size, or None where it is not known (a trace).
        largest_id: the largest token id the rescorer will read, where the vocabulary size is
            not known.

    Raises:
        RescorerError: not a :class:`NeuralRescorer`, made for another vocabulary size (or one
            without ``largest_id``), or too few positions for ``num_heads`` heads.
    """
    if not isinstance(rescorer, NeuralRescorer):
        raise RescorerError(f"neural decoders need a NeuralRescorer, got {type(rescorer).__name__}")
    if vocab_size is not None and rescorer.vocab_size != vocab_size:
        raise RescorerError(f"the rescorer covers a vocabulary of {rescorer.vocab_size} ids, the target has "
                            f"{vocab_size}: it was trained for another tokenizer")
    if largest_id is not None and largest_id >= rescorer.vocab_size:
        raise RescorerError(f"token id {largest_id} lies outside the rescorer's vocabulary of "
                            f"{rescorer.vocab_size} ids: it was trained for another tokenizer")
    context_window(rescorer, num_heads)
    return rescorer


@torch.no_grad()
def neural_drafts(rescorer: NeuralRescorer, sequence: Tensor, ends: Tensor, lattice_tokens: Tensor,
                  lattice_scores: Tensor, alpha: float, num_heads: int) -> Tensor:
    """:func:`local_rescore` for rows whose prefixes are ``sequence[: ends[n] + 1]``, each read
    through the last :func:`context_window` tokens (positions restart at 0 in the window, as in
    training). Rows whose whole prefix fits share one prefix pass; longer ones get their own.

    Returns:
        `torch.LongTensor` of shape `(N, h - 1)`: the drafts for positions 2..h.

    Raises:
        RescorerError: the rescorer has too few positions for ``num_heads`` heads.
    """
    window = context_window(rescorer, num_heads)
    sequence = sequence.to(rescorer.vocab_map.device).long()
    ends = ends.to(sequence.device).long()
    lattice_tokens = lattice_tokens.to(sequence.device)
    lattice_scores = lattice_scores.to(sequence.device)
    out = torch.empty(ends.shape[0], lattice_tokens.shape[1] - 1, dtype=torch.long, device=sequence.device)
    short = ends < window
    if bool(short.any()):
        rows = short.nonzero()[:, 0]
        state = rescorer.prefix_state(sequence[: min(int(ends[rows].max()) + 1, window)])
        out[rows] = local_rescore(rescorer, state, ends[rows], lattice_tokens[rows], lattice_scores[rows], alpha)
    for row in (~short).nonzero()[:, 0].tolist():
        end = int(ends[row])
        state = rescorer.prefix_state(sequence[end + 1 - window: end + 1])
        out[row] = local_rescore(rescorer, state, torch.tensor([window - 1], device=sequence.device),
                                 lattice_tokens[row:row + 1], lattice_scores[row:row + 1], alpha)[0]
    return out
