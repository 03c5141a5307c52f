"""Decoders: exactly the target's greedy output, one target call per step, lossless sampling.

Tiny random-weight Llama and GPT-2 (fp32, seeded), stand-in heads from ``decoding_helpers`` and the
small Katz trigram of ``tests/data``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

import latticekit as lk
from decoding_helpers import ARPA, VOCAB, PeekingHeads, RandomHeads, tiny_gpt2, tiny_llama
from latticekit.decoding import DecoderConfig, DecoderConfigError, HeadsError, decode, greedy_decode

PROMPT = [3, 17, 42, 8, 25, 60, 11]
NEW_TOKENS = 60
H = 5
SPECS = [
    "vanilla",
    "ngram:k=4,p=1,alpha=1",        # plain n-gram rescoring
    "ngram:k=4,p=8,alpha=0",        # 0-gram p-best
    "ngram:k=4,p=8,alpha=1",
    "ngram:k=8,p=16,alpha=0.5",
    "oracle:k=2",
    "oracle:k=4",
]
ARCHS = {"llama": tiny_llama, "gpt2": tiny_gpt2}
_setups: dict[str, Any] = {}


@pytest.fixture(scope="module")
def lm() -> lk.NGramLM:
    return lk.NGramLM.from_arpa(ARPA)


def setup(arch: str) -> tuple[Any, list[int], PeekingHeads]:
    """The model, its greedy sequence (prompt + NEW_TOKENS + H tokens) and peeking heads."""
    if arch not in _setups:
        model = ARCHS[arch]()
        reference = PROMPT + greedy_decode(model, PROMPT, NEW_TOKENS + H).tokens
        _setups[arch] = model, reference, PeekingHeads(model, reference, num_heads=H)
    return _setups[arch]


class CallCounter:
    """Counts the target's forward calls."""

    def __init__(self, model: Any) -> None:
        self.calls = 0
        self.handle = model.register_forward_hook(self._hook)

    def _hook(self, *_args: Any) -> None:
        self.calls += 1

    def __enter__(self) -> "CallCounter":
        return self

    def __exit__(self, *_exc: Any) -> None:
        self.handle.remove()


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_greedy_baseline_matches_generate(arch: str) -> None:
    model, reference, _ = setup(arch)
    out = model.generate(torch.tensor([PROMPT]), max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
    generated = out[0, len(PROMPT):].tolist()  # generate stops at the config's eos (id 1)
    assert generated == greedy_decode(model, PROMPT, NEW_TOKENS, eos_token_id=1).tokens
    assert generated == reference[len(PROMPT): len(PROMPT) + len(generated)]


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_greedy_baseline_one_token_per_call(arch: str) -> None:
    model, reference, _ = setup(arch)
    with CallCounter(model) as counter:
        out = greedy_decode(model, PROMPT, 20)
    assert out.tokens == reference[len(PROMPT): len(PROMPT) + 20]
    assert out.calls == 20 and out.block_efficiency == 1.0
    assert counter.calls == 1 + 20  # the prompt's prefill, then one call per token


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_decoder_emits_exactly_greedy(arch: str, spec: str, lm: lk.NGramLM) -> None:
    model, reference, heads = setup(arch)
    with CallCounter(model) as counter:
        out = decode(model, heads, PROMPT, DecoderConfig.parse(spec), max_new_tokens=NEW_TOKENS,
                     lms=lm, reference=reference)
    assert out.tokens == reference[len(PROMPT): len(PROMPT) + NEW_TOKENS]
    assert counter.calls == 1 + out.calls  # prefill + one call per step, nothing else
    assert out.block_efficiency >= 1.0
    assert out.block_efficiency > 1.2  # the peeking heads are good: many steps accept drafts
    steps = out.steps[1:]
    assert all(len(d) == H - 1 for s in steps for d in s.drafts)
    assert all(s.lattice_tokens.shape == (H, DecoderConfig.parse(spec).k) for s in steps)
    assert all(s.lattice_tokens[0, 0] == s.root_token for s in steps)
    assert sum(len(s.emitted) for s in out.steps) >= NEW_TOKENS


def test_random_heads_still_exact(lm: lk.NGramLM) -> None:
    model, reference, _ = setup("llama")
    heads = RandomHeads(model, num_heads=4)
    for spec in ("vanilla", "ngram:k=4,p=4,alpha=1"):
        out = decode(model, heads, PROMPT, DecoderConfig.parse(spec), max_new_tokens=NEW_TOKENS, lms=lm)
        assert out.tokens == reference[len(PROMPT): len(PROMPT) + NEW_TOKENS]


def test_oracle_bounds_the_lattice_decoders(lm: lk.NGramLM) -> None:
    """The oracle accepts the longest lattice path: at least any p-best over the same lattice."""
    model, reference, heads = setup("gpt2")
    kw = dict(max_new_tokens=NEW_TOKENS, lms=lm, reference=reference)
    oracle = decode(model, heads, PROMPT, DecoderConfig.parse("oracle:k=4"), **kw)
    for spec in ("vanilla", "ngram:k=4,p=8,alpha=1"):
        assert oracle.block_efficiency >= decode(model, heads, PROMPT, DecoderConfig.parse(spec), **kw).block_efficiency
    # Without a reference the oracle computes it itself, off the step count.
    assert decode(model, heads, PROMPT, DecoderConfig.parse("oracle:k=4"), max_new_tokens=NEW_TOKENS).tokens == oracle.tokens


def test_eos_stops_the_decode(lm: lk.NGramLM) -> None:
    model, reference, heads = setup("llama")
    new = reference[len(PROMPT):]
    eos = next(t for t in new[5:] if new.index(t) >= 5)  # a token first seen after 5 steps
    out = decode(model, heads, PROMPT, DecoderConfig("vanilla"), max_new_tokens=NEW_TOKENS, eos_token_id=eos)
    assert out.tokens == new[: new.index(eos) + 1]


def test_zero_gram_needs_no_lm(lm: lk.NGramLM) -> None:
    model, reference, heads = setup("llama")
    config = DecoderConfig("ngram", k=4, p=4, alpha=0.0)
    out = decode(model, heads, PROMPT, config, max_new_tokens=20)
    assert out.tokens == reference[len(PROMPT): len(PROMPT) + 20]
    # nor picks one of several named models: its drafts are the same as with none
    named = decode(model, heads, PROMPT, config, max_new_tokens=20, lms={"a": lm, "b": lm})
    assert [s.drafts for s in named.steps] == [s.drafts for s in out.steps]


# -- sampling ------------------------------------------------------------------------------


def _chi2_critical(df: int, z: float = 3.09) -> float:
    """Wilson-Hilferty upper quantile of chi-square (z = 3.09: p = 0.001)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def _chi2(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """Chi-square statistic and degrees of freedom, bins of expected count < 5 pooled."""
    expected = probs * counts.sum()
    small = expected < 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    keep = exp > 0
    return float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()), int(keep.sum()) - 1


@torch.no_grad()
def _exact_marginals(model: Any, temperature: float) -> tuple[np.ndarray, np.ndarray]:
    """P(t2) and P(t3) after PROMPT under temperature sampling, summed over all t1 (and t2)."""
    def probs(batch: torch.Tensor) -> torch.Tensor:
        return torch.softmax(model(input_ids=batch).logits[:, -1].double() / temperature, dim=-1)

    p1 = probs(torch.tensor([PROMPT]))[0]
    seq1 = torch.cat([torch.tensor([PROMPT]).repeat(VOCAB, 1), torch.arange(VOCAB)[:, None]], dim=1)
    p2 = probs(seq1)                                                       # [t1, t2]
    seq2 = torch.cat([seq1.repeat_interleave(VOCAB, 0), torch.arange(VOCAB).repeat(VOCAB)[:, None]], dim=1)
    p3 = probs(seq2).view(VOCAB, VOCAB, VOCAB)                             # [t1, t2, t3]
    joint12 = p1[:, None] * p2
    return joint12.sum(0).numpy(), (joint12[:, :, None] * p3).sum((0, 1)).numpy()


@pytest.mark.statistical
@pytest.mark.parametrize("spec", ["ngram:k=4,p=4,alpha=1,temperature=1", "vanilla:temperature=0.7"])
def test_sampling_is_lossless(spec: str, lm: lk.NGramLM) -> None:
    """Tokens 2 and 3 come out of tree-sampling verification; their marginals must match the
    target's exactly (chi-square at p = 0.001 over fixed seeds)."""
    model = tiny_llama()
    # Heads 2..h copy head 1 (the model's next-token logits): drafts hold likely tokens, so the
    # tree often accepts and token 3 is often sampled at a draft node rather than at the root.
    heads = RandomHeads(model, num_heads=3)
    for m in heads.maps:
        torch.nn.init.zeros_(m.weight)
        torch.nn.init.zeros_(m.bias)
    config = DecoderConfig.parse(spec)
    exact2, exact3 = _exact_marginals(model, config.temperature)
    samples, accepted = 600, 0
    counts2, counts3 = np.zeros(VOCAB), np.zeros(VOCAB)
    for seed in range(samples):
        out = decode(model, heads, PROMPT, config, max_new_tokens=3, lms=lm,
                     generator=torch.Generator().manual_seed(seed))
        counts2[out.tokens[1]] += 1
        counts3[out.tokens[2]] += 1
        accepted += out.steps[1].num_accepted > 0
    assert accepted > samples // 20  # the draft nodes were really used
    for counts, exact in ((counts2, exact2), (counts3, exact3)):
        stat, df = _chi2(counts, exact)
        assert stat < _chi2_critical(df), (stat, df)


# -- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs", [
    dict(method="beam"), dict(method="ngram", p=0), dict(method="ngram", k=True),
    dict(method="ngram", alpha=-1.0), dict(method="ngram", alpha=float("nan")),
    dict(method="vanilla", temperature=-1.0), dict(method="vanilla", top_p=0.0),
    dict(method="oracle", temperature=1.0), dict(method="vanilla", p=4),
])
def test_bad_configs(kwargs: dict) -> None:
    with pytest.raises(DecoderConfigError):
        DecoderConfig(**kwargs)


@pytest.mark.parametrize("spec", ["beam", "ngram:k", "ngram:q=3", "ngram:k=two", "ngram:method=vanilla"])
def test_bad_specs(spec: str) -> None:
    with pytest.raises(DecoderConfigError):
        DecoderConfig.parse(spec)


def test_spec_round_trip() -> None:
    config = DecoderConfig.parse("ngram:k=16, p=16, alpha=0.5, lm=4gram, name=mine")
    assert config == DecoderConfig("ngram", k=16, p=16, alpha=0.5, lm="4gram", name="mine")
    assert DecoderConfig.parse("ngram:k=16,p=4,alpha=1,lm=2gram").label == "ngram k=16 p=4 alpha=1 lm=2gram"


def test_bad_decode_arguments(lm: lk.NGramLM) -> None:
    model, _, heads = setup("llama")
    vanilla = DecoderConfig("vanilla")
    with pytest.raises(DecoderConfigError):
        decode(model, heads, [], vanilla, max_new_tokens=4)
    with pytest.raises(DecoderConfigError):
        decode(model, heads, [1.5, 2.0], vanilla, max_new_tokens=4)
    with pytest.raises(DecoderConfigError):
        decode(model, heads, PROMPT, vanilla, max_new_tokens=0)
    with pytest.raises(DecoderConfigError):
        decode(model, heads, PROMPT, "vanilla", max_new_tokens=4)  # type: ignore[arg-type]
    with pytest.raises(DecoderConfigError):
        decode(model, heads, PROMPT, DecoderConfig("ngram", k=4, p=2), max_new_tokens=4)  # no lm
    with pytest.raises(DecoderConfigError):
        decode(model, heads, PROMPT, DecoderConfig("ngram", k=4, lm="5gram"), max_new_tokens=4, lms={"2gram": lm})
    with pytest.raises(DecoderConfigError):
        decode(model, heads, PROMPT, DecoderConfig("ngram", k=VOCAB + 1), max_new_tokens=4, lms=lm)
    with pytest.raises(HeadsError):
        decode(model, None, PROMPT, vanilla, max_new_tokens=4)
    with pytest.raises(HeadsError):
        decode(model, lambda hidden: torch.zeros(3, VOCAB + 1), PROMPT, vanilla, max_new_tokens=4)
    with pytest.raises(HeadsError):
        decode(model, lambda hidden: torch.zeros(1, VOCAB), PROMPT, vanilla, max_new_tokens=4)
    with pytest.raises(lk.VocabularyError):
        decode(model, heads, [3, VOCAB + 5], vanilla, max_new_tokens=4)
    assert isinstance(DecoderConfigError("x"), ValueError) and isinstance(HeadsError("x"), ValueError)


# -- the drafts are the ones the method promises --------------------------------------------


def _prefixes(out: Any) -> list[list[int]]:
    """The sequence before each step (prompt + everything emitted earlier)."""
    seq, prefixes = list(out.prompt), []
    for record in out.steps:
        prefixes.append(list(seq))
        seq += list(record.emitted)
    return prefixes


@pytest.mark.parametrize("spec", ["ngram:k=4,p=1,alpha=1", "ngram:k=4,p=8,alpha=0.5"])
def test_ngram_drafts_are_the_p_best_paths(spec: str, lm: lk.NGramLM) -> None:
    model, reference, heads = setup("llama")
    config = DecoderConfig.parse(spec)
    out = decode(model, heads, PROMPT, config, max_new_tokens=30, lms=lm)
    for prefix, record in list(zip(_prefixes(out), out.steps))[1:]:
        assert record.root_token == prefix[-1]
        widths = np.full(H, config.k, dtype=np.int32)
        widths[0] = 1
        lattice = lk.SausageLattice(record.lattice_tokens, record.lattice_scores, widths)
        paths = lk.pbest(lattice, lm, config.p, config.alpha, context=prefix[:-1])
        assert record.drafts == [p.tokens[1:] for p in paths]
        assert record.vanilla_draft == tuple(record.lattice_tokens[1:, 0])


def test_oracle_accepts_the_longest_lattice_prefix() -> None:
    model, reference, heads = setup("gpt2")
    out = decode(model, heads, PROMPT, DecoderConfig("oracle", k=2), max_new_tokens=30, reference=reference)
    for prefix, record in list(zip(_prefixes(out), out.steps))[1:]:
        truth = reference[len(prefix): len(prefix) + H - 1]
        longest = 0
        while longest < len(truth) and truth[longest] in record.lattice_tokens[longest + 1]:
            longest += 1
        assert record.num_accepted == longest
