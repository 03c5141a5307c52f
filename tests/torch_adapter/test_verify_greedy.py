"""Greedy verification on real HF architectures (Llama, GPT-2) and a plain protocol module.

Lossless means: decoding by verifying draft trees emits exactly the tokens of plain greedy
decoding (one token per pass, ordinary causal cache).

bf16 policy: the reference is plain greedy decoding *in bf16*. A tree pass and a plain pass
sum in different orders, so their bf16 logits differ by a few units in the last place
(measured: <= 0.05 at logit scale ~4). A step counts as a tie when the plain pass's top-2
logits are within ``bf16_tie_tolerance`` (8 bf16 ulps of the top logit); at a tie either token
is accepted as correct. Every emitted token is checked against plain bf16 logits on the same
prefix (teacher forcing), the sequences must agree exactly up to the first tie, and tokens
that differ from the plain arg-max must stay rare (<= 10% of steps), so the band cannot hide
a real bug. (Near-ties themselves are common with a 64-token random model: ~20% of steps.)
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import numpy as np
import pytest
import torch

from transformers import DynamicCache

from latticekit.torch import DraftTree, KVCache, prefill, tree_forward, verify
from lk_torch_helpers import (
    VOCAB,
    PlainDecoder,
    TinyProtocolLM,
    TinyProtocolLMFullLogits,
    bf16_tie_tolerance,
    first_mismatch,
    pbest_drafts,
    plain_greedy,
    teacher_forced_logits,
    tiny_cohere,
    tiny_gpt2,
    tiny_llama,
)

H = 5  # draft length
NEW_TOKENS = 40
PROMPT = [3, 17, 42, 8, 25, 60, 11]

MODELS: dict[str, Callable[[torch.dtype], Any]] = {
    "llama": lambda dtype: tiny_llama(dtype),
    "gpt2": lambda dtype: tiny_gpt2(dtype),
    "protocol": lambda dtype: TinyProtocolLM().to(dtype),
    "protocol-full-logits": lambda dtype: TinyProtocolLMFullLogits().to(dtype),
    "cohere": lambda dtype: tiny_cohere(dtype),
}
_model_cache: dict[tuple[str, torch.dtype], Any] = {}
_reference_cache: dict[tuple[str, torch.dtype], tuple[list[int], torch.Tensor]] = {}


def model_and_reference(arch: str, dtype: torch.dtype) -> tuple[Any, list[int], torch.Tensor]:
    key = (arch, dtype)
    if key not in _model_cache:
        _model_cache[key] = MODELS[arch](dtype)
        # H extra tokens so perfect drafts and lattices exist at the last step.
        _reference_cache[key] = plain_greedy(_model_cache[key], PROMPT, NEW_TOKENS + H)
    return _model_cache[key], *_reference_cache[key]


def make_drafts(kind: str, p: int, ref: list[int], ref_logits: torch.Tensor, n: int,
                rng: np.random.Generator) -> list[list[int]]:
    """Drafts continuing a sequence of length n (which plain greedy continues with ref[n:])."""
    step = n - len(PROMPT)  # ref_logits[step] chose ref[n]
    if kind == "random":
        return rng.integers(0, VOCAB, (p, H)).tolist()
    if kind == "perfect":
        drafts = []
        for _ in range(p):  # near-misses branching off the true continuation at random depths
            cut = int(rng.integers(0, H))
            drafts.append(ref[n:n + cut] + rng.integers(0, VOCAB, H - cut).tolist())
        drafts[int(rng.integers(p))] = ref[n:n + H]  # the perfect one, at a random index
        return drafts
    return pbest_drafts(ref_logits[step:step + H], p, k=3, noise=0.5, generator=rng)


def speculative_greedy(model: Any, kind: str, p: int, ref: list[int], ref_logits: torch.Tensor,
                       seed: int = 0, cache: Any = None) -> tuple[list[int], list[int], Any]:
    """Decodes NEW_TOKENS tokens by tree verification.

    Returns:
        The tokens, the accepted count per step (negative where the accepted nodes were not
        contiguous in node order, so the commit had to gather), and the cache.
    """
    rng = np.random.default_rng(seed)
    ids = torch.tensor(PROMPT)
    cache = prefill(model, ids, past_key_values=cache)
    accepted = []
    while ids.shape[0] < len(PROMPT) + NEW_TOKENS:
        drafts = make_drafts(kind, p, ref, ref_logits, ids.shape[0], rng)
        result = verify(model, cache, ids, DraftTree.from_drafts(drafts))
        contiguous = result.accepted_nodes == list(range(result.num_accepted))
        accepted.append(result.num_accepted if contiguous else -result.num_accepted)
        ids = torch.cat([ids, result.emitted_tokens])
        assert cache.get_seq_length() == ids.shape[0] - 1
    return ids.tolist(), accepted, cache


def greedy_grid(test: Callable[..., None]) -> Callable[..., None]:
    """Both HF architectures x p in {1, 4, 16} x random / perfect / p-best drafts."""
    test = pytest.mark.parametrize("kind", ["random", "perfect", "pbest"])(test)
    test = pytest.mark.parametrize("p", [1, 4, 16])(test)
    return pytest.mark.parametrize("arch", ["llama", "gpt2"])(test)


@greedy_grid
def test_greedy_lossless_float32(arch: str, p: int, kind: str) -> None:
    model, ref, ref_logits = model_and_reference(arch, torch.float32)
    ids, accepted, _ = speculative_greedy(model, kind, p, ref, ref_logits)
    n = len(ids)
    assert ids == ref[:n]
    if kind == "perfect":  # every step accepts the whole perfect draft
        assert all(abs(a) == H for a in accepted[:-1])
    if kind == "pbest":  # the lattice drafts are useful, not trivially rejected
        assert sum(map(abs, accepted)) > 0


@greedy_grid
def test_greedy_lossless_bfloat16_with_tie_policy(arch: str, p: int, kind: str) -> None:
    model, ref, ref_logits = model_and_reference(arch, torch.bfloat16)
    ids, _, _ = speculative_greedy(model, kind, p, ref, ref_logits)
    start = len(PROMPT)
    plain = teacher_forced_logits(model, ids, start)  # plain bf16 logits choosing ids[start:]
    ties, differing = [], []
    for step, logits in enumerate(plain):
        top2 = logits.topk(2).values
        tol = bf16_tie_tolerance(float(top2[0]))
        chosen = ids[start + step]
        if chosen != int(logits.argmax()):
            assert float(top2[0] - logits[chosen]) <= tol, f"step {step}: not a greedy token"
            differing.append(step)
        if float(top2[0] - top2[1]) <= tol:
            ties.append(step)
    assert len(differing) <= 0.1 * len(plain), differing
    mismatch = first_mismatch(ids, ref)
    if mismatch is not None:
        assert mismatch - start in ties, f"diverged from plain bf16 greedy at a non-tie step {mismatch - start}"


@pytest.mark.parametrize("kind", ["random", "pbest"])
@pytest.mark.parametrize("arch", ["protocol", "protocol-full-logits", "cohere"])
def test_greedy_lossless_protocol_module_and_a_step_after_the_head(arch: str, kind: str) -> None:
    """Protocol modules with and without the row-projection methods; an HF model whose logits
    are scaled after its head (every row projected in the pass)."""
    model, ref, ref_logits = model_and_reference(arch, torch.float32)
    ids, accepted, _ = speculative_greedy(model, kind, 8, ref, ref_logits)
    assert ids == ref[: len(ids)]


@pytest.mark.parametrize(
    "arch, cache_kind",
    [("llama", "slab"), ("llama", "dynamic"), ("gpt2", "slab"), ("gpt2", "dynamic"), ("protocol", "kv")],
)
def test_commit_leaves_exactly_the_plain_cache(arch: str, cache_kind: str, monkeypatch: Any) -> None:
    """After many steps the cache equals a plain prefill of the sequence: nothing rejected leaks.

    ``prefill`` gives HF models a SlabCache; a plain DynamicCache is committed per layer tensor.
    The slab is made to grow every few steps (capacity rounded to 8 positions instead of 256).
    """
    import latticekit.torch.slab as slab

    monkeypatch.setattr(slab, "_SLAB_ROUND", 8)
    model, ref, ref_logits = model_and_reference(arch, torch.float32)
    given = DynamicCache(config=model.config) if cache_kind == "dynamic" else None
    ids, accepted, cache = speculative_greedy(model, "pbest", 16, ref, ref_logits, seed=3, cache=given)
    expected_type = {"slab": slab.SlabCache, "dynamic": DynamicCache, "kv": KVCache}[cache_kind]
    assert type(cache) is expected_type
    assert any(0 < abs(a) < H for a in accepted), accepted  # partial acceptance happened
    assert any(a < 0 for a in accepted), accepted  # some commits gathered non-contiguous nodes
    dec = PlainDecoder(model)
    dec.feed(ids[:-1])
    if isinstance(cache, KVCache):
        got, want = list(zip(cache.keys, cache.values)), list(zip(dec.cache.keys, dec.cache.values))
    else:
        got = [(layer.keys, layer.values) for layer in cache.layers]
        want = [(layer.keys, layer.values) for layer in dec.cache.layers]
    assert len(got) == len(want)
    for (k, v), (k_ref, v_ref) in zip(got, want):
        assert k.shape == k_ref.shape == (1, k.shape[1], len(ids) - 1, k.shape[3])
        torch.testing.assert_close(k, k_ref, atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(v, v_ref, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "arch, attn, dtype",
    [("llama", "sdpa", torch.float32), ("llama", "eager", torch.float32), ("gpt2", "sdpa", torch.float32),
     ("gpt2", "eager", torch.float32), ("protocol", None, torch.float32), ("llama", "sdpa", torch.bfloat16),
     ("gpt2", "eager", torch.bfloat16)],
)
def test_tree_pass_equals_separate_draft_passes(arch: str, attn: Any, dtype: torch.dtype) -> None:
    if arch == "llama":
        model = tiny_llama(dtype, attn=attn)
    elif arch == "gpt2":
        model = tiny_gpt2(dtype, attn=attn)
    else:
        model = TinyProtocolLM().to(dtype)
    rng = np.random.default_rng(5)
    drafts = pbest_drafts(torch.randn(H, VOCAB, generator=torch.Generator().manual_seed(2)) * 3, 12, 3, 0.5, rng)
    drafts += [drafts[0][:2], [7]]  # ragged
    tree = DraftTree.from_drafts(drafts)
    assert tree.num_nodes < sum(map(len, drafts))  # prefixes were merged
    cache = prefill(model, torch.tensor(PROMPT))
    out = tree_forward(model, cache, torch.tensor(PROMPT), tree)
    assert out.logits.shape == (tree.num_nodes + 1, VOCAB)
    for d, draft in enumerate(drafts):
        dec = PlainDecoder(model)
        dec.feed(PROMPT[:-1])
        separate = torch.cat([dec.feed([PROMPT[-1]])] + [dec.feed([t]) for t in draft]).float()
        rows = [0] + [int(i) + 1 for i in tree.draft_nodes[d, : len(draft)]]
        tree_logits = out.logits[rows].float()
        if dtype == torch.float32:
            torch.testing.assert_close(tree_logits, separate, atol=2e-5, rtol=1e-5)
        else:
            assert (tree_logits - separate).abs().max() <= bf16_tie_tolerance(float(separate.abs().max())) / 2


def test_verify_returns_outputs_at_last_accepted_node() -> None:
    model, ref, ref_logits = model_and_reference("llama", torch.float32)
    n = len(PROMPT)
    drafts = [ref[n:n + 2] + [0, 0], [ref[n], 5], [9, 9]]
    cache = prefill(model, torch.tensor(PROMPT))
    snapshot = copy.deepcopy(cache)
    result = verify(model, cache, torch.tensor(PROMPT), DraftTree.from_drafts(drafts))
    if ref[n + 2] == 0:
        pytest.skip("the draft happens to be right one token further")
    assert result.accepted_tokens.tolist() == ref[n:n + 2]
    assert result.bonus_token == ref[n + 2]
    assert result.accepted_drafts.tolist() == [0]
    out = tree_forward(model, snapshot, torch.tensor(PROMPT), DraftTree.from_drafts(drafts))
    last = result.accepted_nodes[-1] + 1
    torch.testing.assert_close(result.logits, out.logits[last])
    torch.testing.assert_close(result.hidden_state, out.hidden_states[last])
    # the hidden state is what the LM head reads: it reproduces the logits
    torch.testing.assert_close(model.lm_head(result.hidden_state), result.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(result.logits.float(), ref_logits[2], atol=2e-5, rtol=1e-5)


def test_reference_decoder_matches_hf_generate() -> None:
    """The plain reference loop is itself plain HF greedy decoding."""
    model, ref, _ = model_and_reference("llama", torch.float32)
    out = model.generate(torch.tensor([PROMPT]), max_new_tokens=NEW_TOKENS, do_sample=False,
                         pad_token_id=0, eos_token_id=None)
    assert out[0].tolist() == ref[: len(PROMPT) + NEW_TOKENS]
