"""Tiny seeded target models and stand-in draft heads for the decoder tests (no download).

The stand-ins satisfy the pinned ``BlockHeads`` interface: ``num_heads`` (h, head 1 included)
and ``forward(hidden (..., d)) -> logits (..., h, vocab)`` with row 0 the model's own logits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

VOCAB = 64
INIT_RANGE = 0.2  # wide enough that fp32 top-2 logit gaps are rarely tiny
DATA = Path(__file__).resolve().parents[1] / "data"
GOLDEN = Path(__file__).resolve().parents[1] / "lm" / "data"  # OpenGrm reference models and corpora
ARPA = GOLDEN / "tokenids-small" / "katz3.arpa.gz"


def tiny_llama(seed: int = 0, attn: str = "sdpa") -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      initializer_range=INIT_RANGE, bos_token_id=0, eos_token_id=1,
                      attn_implementation=attn)
    return LlamaForCausalLM(cfg).eval()


def tiny_gpt2(seed: int = 0, attn: str = "sdpa") -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=512,
                     initializer_range=INIT_RANGE, bos_token_id=0, eos_token_id=1,
                     attn_implementation=attn)
    return GPT2LMHeadModel(cfg).eval()


class RandomHeads(nn.Module):
    """Head 1: the model's own output layer; heads 2..h: a random linear map, then that layer."""

    def __init__(self, model: Any, num_heads: int = 4, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.num_heads = num_heads
        self.lm_head = model.get_output_embeddings()
        d = self.lm_head.in_features
        self.maps = nn.ModuleList(nn.Linear(d, d) for _ in range(num_heads - 1))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        rows = [self.lm_head(hidden)] + [self.lm_head(hidden + m(hidden)) for m in self.maps]
        return torch.stack(rows, dim=-2)


def hidden_states(model: Any, ids: list[int]) -> torch.Tensor:
    """Final hidden states (the input of the output layer) of a plain causal pass, `(L, d)`."""
    captured: list[torch.Tensor] = []
    hook = model.get_output_embeddings().register_forward_pre_hook(lambda _m, args: captured.append(args[0]))
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([ids]))
    finally:
        hook.remove()
    return captured[-1][0]


class PeekingHeads(nn.Module):
    """Good, imperfect heads: they know the target's greedy sequence ``reference``.

    A query hidden state is matched to the nearest hidden state of ``reference`` (position t,
    which predicts position t + 1); head i (1-based) puts the true ``reference[t + i]`` first, except at a seeded fraction
    ``demote`` of (t, i) where a random token outranks it (so it is second: top-k lattices,
    the oracle and rescoring can still find it), and at a fraction ``miss`` where it is absent
    from the top 4. Head 1 is the model's own logits, as the interface requires.
    """

    def __init__(self, model: Any, reference: list[int], num_heads: int = 5, demote: float = 0.25,
                 miss: float = 0.1, seed: int = 0) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.lm_head = model.get_output_embeddings()
        self.register_buffer("keys", hidden_states(model, reference))
        rng = np.random.default_rng(seed)
        n, h, v = len(reference), num_heads, self.lm_head.out_features
        table = rng.normal(0.0, 1.0, size=(n, h, v)).astype(np.float32)
        for t in range(n):
            for i in range(1, h):
                if t + i + 1 >= n:
                    continue
                true, draw = reference[t + i + 1], rng.random()
                if draw < miss:
                    table[t, i, true] = -10.0
                    continue
                table[t, i, true] = 6.0
                if draw < miss + demote:
                    other = int(rng.integers(v - 1))
                    table[t, i, other + (other >= true)] = 8.0
        self.register_buffer("table", torch.from_numpy(table))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        flat = hidden.reshape(-1, hidden.shape[-1])
        nearest = torch.cdist(flat.float(), self.keys.float()).argmin(dim=-1)
        out = self.table[nearest].clone()
        out[:, 0] = self.lm_head(flat)
        return out.reshape(*hidden.shape[:-1], self.num_heads, -1)
