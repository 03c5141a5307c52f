"""Shared pieces of the torch adapter tests: tiny models, plain decoding, p-best-like drafts.

Everything is seeded; models are built from configs (no download).
"""

from __future__ import annotations

import itertools
import math
import warnings
from typing import Any, Optional

import numpy as np
import pytest
import torch
import transformers
from torch import nn
from transformers import (
    CONFIG_MAPPING,
    AutoModelForCausalLM,
    CohereConfig,
    CohereForCausalLM,
    DynamicCache,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
)

from latticekit.torch import KVCache
from latticekit.torch.target import cache_keyword

VOCAB = 64
#: Spread of the random weights: wide enough that top-2 logit gaps are rarely below 1e-3.
INIT_RANGE = 0.2


def tiny_llama(dtype: torch.dtype = torch.float32, attn: str = "sdpa", seed: int = 0) -> LlamaForCausalLM:
    """2-layer Llama with grouped-query attention and rotary positions."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        initializer_range=INIT_RANGE, bos_token_id=0, eos_token_id=1, attn_implementation=attn,
    )
    return LlamaForCausalLM(cfg).eval().to(dtype)


def tiny_gpt2(dtype: torch.dtype = torch.float32, attn: str = "sdpa", seed: int = 0) -> GPT2LMHeadModel:
    """2-layer GPT-2 with learned absolute position embeddings."""
    torch.manual_seed(seed)
    cfg = GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=256,
        initializer_range=INIT_RANGE, bos_token_id=0, eos_token_id=1, attn_implementation=attn,
    )
    return GPT2LMHeadModel(cfg).eval().to(dtype)


def tiny_cohere(dtype: torch.dtype = torch.float32, seed: int = 0) -> CohereForCausalLM:
    """2-layer Cohere: its logits are the output embeddings' times ``logit_scale``, a step after
    the head that the adapter must notice (it then projects every row in the pass)."""
    torch.manual_seed(seed)
    cfg = CohereConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, logit_scale=0.5,
        initializer_range=INIT_RANGE, bos_token_id=0, eos_token_id=1, pad_token_id=0, attn_implementation="sdpa",
    )
    return CohereForCausalLM(cfg).eval().to(dtype)


#: The fields every :func:`tiny_family` model shares: 2 layers, hidden 32, 4 query heads over
#: 2 key/value heads, vocabulary 128.
FAMILY_BASE: dict[str, Any] = dict(
    vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256, initializer_range=INIT_RANGE,
    bos_token_id=0, eos_token_id=1, pad_token_id=0, tie_word_embeddings=False,
)


def tiny_family(model_type: str, attn: str = "sdpa", seed: int = 0, **fields: Any) -> Any:
    """A tiny seeded HF causal LM of any family (``model_type`` as transformers names it),
    :data:`FAMILY_BASE` with ``fields`` over it; skips the test when this transformers does not
    ship the family."""
    if model_type not in CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no {model_type!r} model")
    config_class = CONFIG_MAPPING[model_type]
    head_dim = FAMILY_BASE["hidden_size"] // FAMILY_BASE["num_attention_heads"]
    try:  # families whose default head_dim is not hidden / heads (Gemma: 256) get that
        config = config_class(**{**FAMILY_BASE, "head_dim": head_dim, **fields})
    except AttributeError:  # head_dim is a read-only property there (Falcon)
        config = config_class(**{**FAMILY_BASE, **fields})
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # transformers' notes on tiny configs
        # GPTBigCode's module scripts a function at import (transformers' call, not latticekit's)
        warnings.filterwarnings("ignore", "`torch.jit.script` is deprecated", DeprecationWarning)
        return AutoModelForCausalLM.from_config(config, attn_implementation=attn).eval()


class TinyProtocolLM(nn.Module):
    """A plain module following ``latticekit.torch.protocol``: learned absolute positions,
    pre-norm attention + MLP blocks, a tied output head. It offers ``forward_hidden`` and
    ``logits_from_hidden``, so the adapter projects only the rows a walk reads."""

    def __init__(self, vocab_size: int = VOCAB, hidden: int = 32, heads: int = 4, layers: int = 2,
                 max_positions: int = 256, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.vocab_size = vocab_size
        self.heads = heads
        self.embed = nn.Embedding(vocab_size, hidden)
        self.pos = nn.Embedding(max_positions, hidden)
        self.norms1 = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(layers))
        self.qkv = nn.ModuleList(nn.Linear(hidden, 3 * hidden) for _ in range(layers))
        self.out = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(layers))
        self.norms2 = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(layers))
        self.mlp = nn.ModuleList(
            nn.Sequential(nn.Linear(hidden, 2 * hidden), nn.GELU(), nn.Linear(2 * hidden, hidden))
            for _ in range(layers)
        )
        self.final_norm = nn.LayerNorm(hidden)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.3)
        self.eval()

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor,
                past_key_values: KVCache) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self._hidden(input_ids, position_ids, attention_mask, past_key_values)
        return self._logits(hidden), hidden

    def forward_hidden(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor,
                       past_key_values: KVCache) -> torch.Tensor:
        return self._hidden(input_ids, position_ids, attention_mask, past_key_values)

    def logits_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._logits(hidden)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.embed.weight.T

    def _hidden(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor,
                past_key_values: KVCache) -> torch.Tensor:
        x = self.embed(input_ids) + self.pos(position_ids)
        b, n, d = x.shape
        for layer in range(len(self.qkv)):
            q, k, v = self.qkv[layer](self.norms1[layer](x)).split(d, dim=-1)
            q, k, v = (t.view(b, n, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
            k, v = past_key_values.update(layer, k, v)
            att = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask)
            x = x + self.out[layer](att.transpose(1, 2).reshape(b, n, d))
            x = x + self.mlp[layer](self.norms2[layer](x))
        return self.final_norm(x)


class TinyProtocolLMFullLogits(TinyProtocolLM):
    """The same module with only the protocol's required forward: the adapter projects every row."""

    forward_hidden = None  # type: ignore[assignment]
    logits_from_hidden = None  # type: ignore[assignment]


class PlainDecoder:
    """Feeds tokens one at a time through a model with an ordinary causal cache: the reference."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.is_plain = isinstance(model, TinyProtocolLM)
        self.cache: Any = KVCache() if self.is_plain else DynamicCache(config=model.config)
        self.length = 0

    @torch.no_grad()
    def feed(self, tokens: list[int]) -> torch.Tensor:
        """Feeds tokens causally; returns the logits after each, `(len(tokens), vocab)`."""
        n = len(tokens)
        ids = torch.tensor([tokens])
        positions = torch.arange(self.length, self.length + n)[None]
        if self.is_plain:
            mask = torch.ones(n, self.length + n, dtype=torch.bool)
            mask[:, self.length:] = torch.tril(torch.ones(n, n, dtype=torch.bool))
            logits, _ = self.model(ids, positions, mask[None, None], self.cache)
        else:
            cache = {cache_keyword(type(self.model)): self.cache}
            logits = self.model(input_ids=ids, position_ids=positions, use_cache=True, **cache).logits
        self.length += n
        return logits[0]


def plain_greedy(model: Any, prompt: list[int], new_tokens: int) -> tuple[list[int], torch.Tensor]:
    """Plain greedy decoding, one token per pass.

    Returns:
        The prompt plus ``new_tokens`` tokens, and the logits that chose each new token,
        `(new_tokens, vocab)` in float32.
    """
    dec = PlainDecoder(model)
    logits = dec.feed(prompt)[-1]
    ids, steps = list(prompt), []
    for _ in range(new_tokens):
        steps.append(logits.float())
        ids.append(int(logits.argmax()))
        logits = dec.feed([ids[-1]])[-1]
    return ids, torch.stack(steps)


def teacher_forced_logits(model: Any, ids: list[int], start: int) -> torch.Tensor:
    """Plain incremental logits predicting ``ids[start:]``, `(len(ids) - start, vocab)` float32."""
    dec = PlainDecoder(model)
    first = dec.feed(ids[:start])[-1:]
    rest = [dec.feed([t])[-1:] for t in ids[start:-1]]
    return torch.cat([first] + rest).float()


def pbest_drafts(step_logits: torch.Tensor, p: int, k: int, noise: float,
                 generator: np.random.Generator) -> list[list[int]]:
    """The p best paths of a top-k sausage lattice built from (noisy) target log-probabilities.

    Brute-force enumeration of all k**h paths, best total score first (``latticekit.pbest``
    with alpha = 0, without needing the core here). The paths overlap heavily, like real
    p-best output.

    Args:
        step_logits (`torch.Tensor` of shape `(h, vocab)`): the target's logits at h positions.
        p: number of paths (at most k**h).
        k: arcs per lattice slot.
        noise: std of Gaussian noise added to the log-probabilities (imperfect draft heads).
        generator: numpy random generator.
    """
    logp = torch.log_softmax(step_logits.double(), dim=-1).numpy()
    logp = logp + noise * generator.standard_normal(logp.shape)
    top = np.argsort(-logp, axis=-1)[:, :k]
    scores = np.take_along_axis(logp, top, axis=-1)
    combos = np.array(list(itertools.product(range(k), repeat=top.shape[0])))
    totals = scores[np.arange(top.shape[0]), combos].sum(axis=1)
    best = np.argsort(-totals, kind="stable")[:p]
    return [[int(top[j, combos[c, j]]) for j in range(top.shape[0])] for c in best]


def chi_square_pvalue(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> float:
    """Pearson chi-square goodness-of-fit p-value; bins with expected count < min_expected are pooled."""
    impossible = probs <= 0
    if np.any(counts[impossible] > 0):
        raise AssertionError(f"tokens {np.flatnonzero(impossible & (counts > 0))} have probability 0 but were drawn")
    total = counts.sum()
    expected = probs * total
    order = [i for i in np.argsort(-expected) if not impossible[i]]
    big = [i for i in order if expected[i] >= min_expected]
    small = [i for i in order if expected[i] < min_expected]
    obs = [counts[i] for i in big]
    exp = [expected[i] for i in big]
    if small:
        obs.append(counts[small].sum())
        exp.append(expected[small].sum())
    obs_a, exp_a = np.array(obs, dtype=float), np.array(exp, dtype=float)
    stat = float(((obs_a - exp_a) ** 2 / exp_a).sum())
    dof = len(obs_a) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def bf16_tie_tolerance(top_logit: float) -> float:
    """Logit gap under which two bf16 candidates count as tied (the documented bf16 policy).

    A tree pass and a plain pass add the same terms in different orders and block shapes;
    in bf16 (8 significant bits, eps = 2**-7) their logits can differ by a few units in the
    last place of the largest logit. Eight such units is the tie band.
    """
    eps = 2.0 ** -7
    return 8 * eps * 2.0 ** math.floor(math.log2(max(1.0, abs(top_logit))))


def first_mismatch(a: list[int], b: list[int]) -> Optional[int]:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
