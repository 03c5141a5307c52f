"""``heads+ngram``: lattice columns united with the n-gram continuations (scored by the heads like
their own arcs), and decodes that equal greedy decoding."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import latticekit as lk
from decoding_helpers import ARPA, PeekingHeads, RandomHeads, hidden_states, tiny_llama
from latticekit.decoding import DecoderConfig, decode, greedy_decode
from latticekit.decoding.costs import StepCosts
from latticekit.decoding.lattices import CandidateLattice, FullLattice, candidate_lattices, united
from latticekit.heads import BlockHeads

PROMPT = [3, 17, 42, 8, 25, 60, 11]
COSTS = StepCosts([0, 1, 2, 4, 8, 16, 32, 64], [0.010] + [0.010 + 0.001 * n for n in (1, 2, 4, 8, 16, 32, 64)],
                  100, draft_s=0.001)


def test_united_adds_each_columns_missing_tokens_with_their_scores() -> None:
    lattice = lk.SausageLattice(np.array([[9, 0], [4, 5], [7, 0]]), np.log([[1.0, 1.0], [0.6, 0.3], [0.5, 1.0]]),
                                np.array([1, 2, 1]))
    table = np.log(np.full((3, 12), 0.01))

    def logprobs(row: int, tokens: np.ndarray) -> np.ndarray:
        out = table[row, tokens].copy()
        out[tokens == 11] = np.nan  # a token the heads cannot score is left out
        return out

    out = united(lattice, [[5, 6, 6, 11], [1, 7]], logprobs)
    assert out.tokens[0, :out.widths[0]].tolist() == [9]
    assert out.tokens[1, :out.widths[1]].tolist() == [4, 5, 6]
    assert out.tokens[2, :out.widths[2]].tolist() == [7, 1]
    np.testing.assert_allclose(out.scores[1, :3], np.log([0.6, 0.3, 0.01]), rtol=1e-6)
    np.testing.assert_allclose(out.scores[2, :2], np.log([0.5, 0.01]), rtol=1e-6)


@pytest.mark.parametrize("kind", ["full", "candidates"])
def test_lattice_sources_score_united_tokens_as_their_own_arcs(kind: str) -> None:
    model = tiny_llama()
    heads = BlockHeads.for_model(model, num_heads=4)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in heads.blocks.parameters():
            p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    ids = PROMPT + [30, 31]
    hidden = hidden_states(model, ids)[-1]
    if kind == "full":
        source: Any = FullLattice(heads, 2, 64)
        with torch.no_grad():
            logprobs = torch.log_softmax(heads(hidden).float(), dim=-1).numpy()
        scorable = set(range(64))
    else:
        static = np.arange(0, 64, 2)  # the even ids, and the text's
        source = CandidateLattice(heads, static, 2)
        scorable = set(static.tolist()) | set(ids)
        with torch.no_grad():
            candidates = np.array(sorted(scorable))
            logits = heads(hidden).float()[:, candidates]
            logprobs = np.full((4, 64), np.nan)
            logprobs[:, candidates] = torch.log_softmax(logits, dim=-1).numpy()
    columns = [[1, 3, 60], [5, 30], [7]]
    with torch.no_grad():
        lattice, _ = source(hidden, ids, columns)
    for row in range(1, 4):
        tokens = lattice.tokens[row, :lattice.widths[row]].tolist()
        for token in columns[row - 1]:
            assert (token in tokens) == (token in scorable)
        for j, token in enumerate(tokens):
            assert lattice.scores[row, j] == pytest.approx(logprobs[row, token], abs=1e-5)
    with torch.no_grad():
        again, _ = source(hidden, ids)  # the union holds for one lattice only
    assert again.k == 2


@pytest.fixture(scope="module")
def setup() -> tuple[Any, list[int]]:
    model = tiny_llama()
    return model, PROMPT + greedy_decode(model, PROMPT, 70).tokens


@pytest.mark.parametrize("spec", ["heads+ngram", "heads+ngram:k=4,p=8,alpha=0.5", "heads+ngram:alpha=0"])
def test_heads_ngram_decodes_exactly_the_greedy_tokens(setup: Any, spec: str) -> None:
    model, reference = setup
    lm = lk.NGramLM.from_arpa(ARPA)
    for heads in (PeekingHeads(model, reference, num_heads=5), RandomHeads(model, num_heads=5)):
        out = decode(model, heads, PROMPT, DecoderConfig.parse(spec), max_new_tokens=60, lms=lm, costs=COSTS)
        assert out.tokens == reference[len(PROMPT): len(PROMPT) + 60]


def test_heads_ngram_drafts_what_the_heads_miss(setup: Any) -> None:
    model, reference = setup
    lm = lk.NGramLM.from_arpa(ARPA)
    prompt = reference[: len(PROMPT) + 30]  # the continuation repeats what the text already holds
    heads = RandomHeads(model, num_heads=5)  # heads that know nothing
    runs = {spec: decode(model, heads, prompt, DecoderConfig.parse(spec), max_new_tokens=30, lms=lm, costs=COSTS)
            for spec in ("heads", "heads+ngram")}  # the lattice alone, and united with the text
    assert runs["heads+ngram"].tokens == runs["heads"].tokens == reference[len(prompt): len(prompt) + 30]
    assert runs["heads+ngram"].block_efficiency > runs["heads"].block_efficiency
    united_steps = [s for s in runs["heads+ngram"].steps if s.lattice_tokens is not None]
    assert united_steps and max(s.lattice_tokens.shape[1] for s in united_steps) > 8  # columns grew past k


def test_heads_ngram_without_heads_drafts_like_headsfree(setup: Any) -> None:
    model, reference = setup
    lm = lk.NGramLM.from_arpa(ARPA)
    runs = [decode(model, None, PROMPT, DecoderConfig.parse(spec), max_new_tokens=50, lms=lm, costs=COSTS)
            for spec in ("heads+ngram:p=32", "headsfree")]
    assert runs[0].tokens == runs[1].tokens == reference[len(PROMPT): len(PROMPT) + 50]
    assert [s.drafts for s in runs[0].steps] == [s.drafts for s in runs[1].steps]


def _conditioned_heads(model: Any) -> BlockHeads:
    heads = BlockHeads.for_model(model, num_heads=4, token_conditioned=True)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in heads.parameters():
            if p.requires_grad:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    return heads


@pytest.mark.parametrize("kind", ["full", "candidates"])
def test_lattice_sources_give_conditioned_heads_the_emitted_token(kind: str) -> None:
    """The lattice's first token (greedy's, or a sampled one) is what token-conditioned heads read."""
    model = tiny_llama()
    heads = _conditioned_heads(model)
    hidden = hidden_states(model, PROMPT)[-1]
    source: Any = FullLattice(heads, 64, 64) if kind == "full" else CandidateLattice(heads, np.arange(64), 64)
    for emitted in (5, 33):  # neither need be head 1's arg-max
        with torch.no_grad():
            lattice, _ = source(hidden, PROMPT + [emitted])
            want = torch.log_softmax(heads(hidden, next_token=emitted).float(), dim=-1).numpy()
        assert lattice.tokens[0, 0] == emitted
        for row in range(1, 4):
            tokens = lattice.tokens[row, :lattice.widths[row]]
            np.testing.assert_allclose(lattice.scores[row, :len(tokens)], want[row, tokens], atol=1e-5)


@pytest.mark.parametrize("spec", ["vanilla:k=4", "ngram:k=4,p=8", "heads+ngram", "auto"])
def test_conditioned_heads_decode_exactly_the_greedy_tokens(setup: Any, spec: str) -> None:
    model, reference = setup
    out = decode(model, _conditioned_heads(model), PROMPT, DecoderConfig.parse(spec), max_new_tokens=50,
                 lms=lk.NGramLM.from_arpa(ARPA), costs=COSTS)
    assert out.tokens == reference[len(PROMPT): len(PROMPT) + 50]


def test_heads_that_do_not_take_a_batch_are_named_by_full_lattices() -> None:
    """Heads answer ``(..., hidden) -> (..., h, vocab)`` (``DraftHeads``); ones that return a
    single row's logits for a batch get a typed error naming the shapes."""
    from latticekit.decoding.lattices import full_lattices
    from latticekit.errors import HeadsMismatchError

    class OneRowHeads(torch.nn.Module):
        def forward(self, hidden: torch.Tensor) -> torch.Tensor:
            return torch.zeros(3, 64)

    with pytest.raises(HeadsMismatchError, match=r"\(2, h >= 2, 64\) for 2 rows, got \(3, 64\)"):
        full_lattices([FullLattice(OneRowHeads(), 4, 64)] * 2, torch.zeros(2, 8), [[1, 2], [3, 4]])


def test_heads_without_a_draft_head_are_named_by_full_lattices() -> None:
    """Heads that are the target's own head alone give ``full_lattices`` no draft logits: a
    typed error, whatever the depth."""
    from latticekit.decoding.lattices import full_lattices
    from latticekit.errors import HeadsMismatchError

    heads = BlockHeads.for_model(tiny_llama(), num_heads=1)
    for depth in (None, 2):
        with pytest.raises(HeadsMismatchError, match=r"h >= 1"):
            full_lattices([FullLattice(heads, 4, 64)] * 2, torch.zeros(2, heads.hidden_size), [[1, 2], [3, 4]],
                          depth)


class _StatesWithoutDepth(torch.nn.Module):
    """Heads of a user's (:class:`~latticekit.heads.protocol.ProjectedHeads`) whose
    ``head_states`` takes no ``depth``: every head's states, cut by the lattice."""

    def __init__(self, heads: BlockHeads) -> None:
        super().__init__()
        self.inner, self.lm_head, self.num_heads = heads, heads.lm_head, heads.num_heads
        self.token_conditioned = heads.token_conditioned

    def head_states(self, hidden: torch.Tensor, next_token: Any = None) -> torch.Tensor:
        return self.inner.head_states(hidden, next_token)

    def forward(self, hidden: torch.Tensor, next_token: Any = None) -> torch.Tensor:
        return self.inner(hidden, next_token=next_token)


@pytest.mark.parametrize("kind", ["candidates", "candidates-no-depth", "full", "full-chunked", "full-scaled",
                                  "full-no-depth"])
@pytest.mark.parametrize("conditioned", [False, True])
@pytest.mark.parametrize("depth", [None, 1, 2, 9])
def test_a_batchs_lattices_are_each_rows_own(conditioned: bool, kind: str, depth: Any,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """``candidate_lattices`` and ``full_lattices`` run the heads once on a batch of rows (the
    vLLM lattice proposer's step; the full one a chunk of rows at a time): each row's lattice
    is the one its own source gives it alone. The full one leaves head 1 out where the heads
    project with one ``lm_head`` (its root is the row's last token alone, scored 0); with
    ``depth``, both run heads 2..depth + 1 alone (``BlockHeads.head_states(depth=)``; heads
    whose ``head_states`` takes no depth, ``*-no-depth``, run whole and are cut); heads with a
    logit scale (``full-scaled``) run whole and are cut."""
    from latticekit.decoding import lattices
    from latticekit.decoding.lattices import full_lattices

    model = tiny_llama()
    heads: Any = _conditioned_heads(model) if conditioned else BlockHeads.for_model(model, num_heads=4)
    if kind.endswith("no-depth"):
        heads = _StatesWithoutDepth(heads)
        assert CandidateLattice.supports(heads) and not lattices._takes_depth(heads)
        kind = kind[:-len("-no-depth")]
    if kind == "full-scaled":
        heads.logit_scale = 0.5
        assert not CandidateLattice.supports(heads)
    texts = [PROMPT + [30, 31], PROMPT[:5] + [60, 61, 62], [7, 8, 9, 10, 11, 12]]
    hidden = torch.stack([hidden_states(model, ids)[-1] for ids in texts])
    static = np.arange(0, 64, 2)
    if kind == "full-chunked":  # two rows' logits at a time: chunks of 2 and 1
        monkeypatch.setattr(lattices, "FULL_BATCH_LOGITS", 2 * 3 * 64)

    def source() -> Any:
        return CandidateLattice(heads, static, 4) if kind == "candidates" else FullLattice(heads, 4, 64)

    alone, batched = [source() for _ in texts], [source() for _ in texts]
    with torch.no_grad():
        want = [s(hidden[i], texts[i], entropy=False)[0] for i, s in enumerate(alone)]
        got = candidate_lattices(batched, hidden, texts, depth=depth) if kind == "candidates" \
            else full_lattices(batched, hidden, texts, depth)
    positions = 4 if depth is None else min(4, depth + 1)
    for text, w, g in zip(texts, want, got):
        assert g.h == positions
        # the root: the row's last token alone (scored 0 where full_lattices gives it)
        assert g.widths[0] == 1 and g.tokens[0, 0] == w.tokens[0, 0] == text[-1]
        assert kind == "candidates" or g.scores[0, 0] == 0
        w = lk.SausageLattice(w.tokens[1:positions], w.scores[1:positions], w.widths[1:positions])
        g = lk.SausageLattice(g.tokens[1:], g.scores[1:], g.widths[1:])
        np.testing.assert_array_equal(g.tokens, w.tokens)
        np.testing.assert_array_equal(g.widths, w.widths)
        np.testing.assert_allclose(g.scores, w.scores, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(k=st.integers(1, 12), static_size=st.integers(1, 40), rows=st.integers(1, 4), seed=st.integers(0, 2**16),
       text_length=st.integers(1, 30), depth=st.sampled_from([None, 1, 2, 3, 5]))
def test_candidate_lattices_rank_every_rows_candidates_as_one_log_softmax(k: int, static_size: int, rows: int,
                                                                          seed: int, text_length: int,
                                                                          depth: Optional[int]) -> None:
    """``candidate_lattices`` (the static candidates projected for the batch at once, each row's
    own text tokens for it alone) against brute force: per row, every head's log-softmax over
    its candidates (the static ids and its text's), ranked whole, top k; with ``depth``, heads
    2..depth + 1 alone (depth + 1 positions, 4 at most: 3 draft heads)."""
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = tiny_llama()
    heads = BlockHeads.for_model(model, num_heads=4)
    with torch.no_grad():
        for p in heads.blocks.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=gen))
    static = rng.choice(64, static_size, replace=False)
    texts = [rng.integers(0, 64, text_length).tolist() for _ in range(rows)]
    hidden = torch.randn(rows, model.config.hidden_size, generator=gen)
    with torch.no_grad():
        got = candidate_lattices([CandidateLattice(heads, static, k) for _ in texts], hidden, texts, depth=depth)
        logits = heads(hidden).float()
    positions = 4 if depth is None else min(4, depth + 1)
    for i, (text, lattice) in enumerate(zip(texts, got)):
        candidates = np.array(sorted(set(static.tolist()) | set(text)))
        logprobs = torch.log_softmax(logits[i][:, candidates], dim=-1).numpy()
        width = min(k, len(candidates))
        assert lattice.tokens[0, 0] == text[-1] and lattice.widths[0] == 1 and lattice.h == positions
        for row in range(1, positions):
            order = np.argsort(-logprobs[row], kind="stable")[:width]
            assert lattice.widths[row] == width
            np.testing.assert_allclose(lattice.scores[row, :width], logprobs[row, order], atol=1e-5)
            # distinct candidates, each scored its own log-probability (so the top k, ties in any order)
            tokens = lattice.tokens[row, :width]
            assert len(set(tokens.tolist())) == width and np.isin(tokens, candidates).all()
            np.testing.assert_allclose(logprobs[row, np.searchsorted(candidates, tokens)], lattice.scores[row, :width],
                                       atol=1e-5)


@settings(max_examples=30, deadline=None)
@given(k=st.integers(1, 8), static_size=st.integers(1, 40), rows=st.integers(1, 4), seed=st.integers(0, 2**16),
       text_length=st.integers(1, 20), depth=st.sampled_from([None, 1, 2]))
def test_candidate_lattices_in_bfloat16_keep_the_float32_top_k_up_to_rounding(k: int, static_size: int, rows: int,
                                                                              seed: int, text_length: int,
                                                                              depth: Optional[int]) -> None:
    """Static candidates projected in bfloat16 (``candidate_dtype`` ``"auto"`` on a CPU with
    native bfloat16 products) against the float32 log-softmax over every candidate: each arc is
    a distinct candidate whose float32 log-probability is within the rounding bound of the
    score it is given, and no candidate left out beats an arc by more than twice the bound (the
    top k up to rounding). The bound: bfloat16's half-ulp (2^-9 relative) on the states, the
    rows and the product, over the sum of the products' magnitudes, doubled."""
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = tiny_llama()
    heads = BlockHeads.for_model(model, num_heads=4)
    with torch.no_grad():
        for p in heads.blocks.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=gen))
    static = rng.choice(64, static_size, replace=False)
    texts = [rng.integers(0, 64, text_length).tolist() for _ in range(rows)]
    hidden = torch.randn(rows, model.config.hidden_size, generator=gen)
    weight = heads.lm_head.weight.detach()
    with torch.no_grad():
        sources = [CandidateLattice(heads, static, k, torch.bfloat16) for _ in texts]
        assert sources[0]._rows.dtype == torch.bfloat16
        got = candidate_lattices(sources, hidden, texts, depth=depth)
        states = heads.head_states(hidden)
        logits = (states @ weight.T).float()
        magnitude = states.abs() @ weight.abs().T  # the sum of the products' magnitudes per logit
    bound = float(4 * 2.0 ** -9 * magnitude.max())  # per logit; the normaliser moves by at most as much
    positions = 4 if depth is None else min(4, depth + 1)
    for i, (text, lattice) in enumerate(zip(texts, got)):
        candidates = np.array(sorted(set(static.tolist()) | set(text)))
        logprobs = torch.log_softmax(logits[i][:, candidates], dim=-1).numpy()
        width = min(k, len(candidates))
        assert lattice.tokens[0, 0] == text[-1] and lattice.widths[0] == 1 and lattice.h == positions
        for row in range(1, positions):
            tokens = lattice.tokens[row, :width]
            assert lattice.widths[row] == width and len(set(tokens.tolist())) == width
            assert np.isin(tokens, candidates).all()
            mine = logprobs[row, np.searchsorted(candidates, tokens)]
            np.testing.assert_allclose(lattice.scores[row, :width], mine, atol=2 * bound)
            left_out = np.setdiff1d(candidates, tokens)
            if len(left_out):
                assert logprobs[row, np.searchsorted(candidates, left_out)].max() <= mine.min() + 4 * bound


def test_candidate_dtype_follows_the_cpu_and_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """``auto``: bfloat16 for float32 rows where the CPU computes bfloat16 products natively, the
    weight's own dtype elsewhere; ``model`` and ``bfloat16`` as named; another setting an error;
    a source's static rows are packed in its dtype, and sources of both dtypes on one projection
    each project in their own."""
    from latticekit.decoding import lattices
    from latticekit.decoding.lattices import candidate_dtype, lattice_source

    weight = torch.zeros(4, 3)
    for native in (True, False):
        monkeypatch.setattr(lattices, "native_bfloat16", lambda native=native: native)
        assert candidate_dtype(weight) == (torch.bfloat16 if native else torch.float32)
        assert candidate_dtype(weight.double()) == torch.float64  # only float32 weights change
        assert candidate_dtype(weight, "model") == torch.float32
        assert candidate_dtype(weight, "bfloat16") == torch.bfloat16
    with pytest.raises(ValueError, match="'auto', 'model' or 'bfloat16'"):
        candidate_dtype(weight, "half")
    model = tiny_llama()
    heads = BlockHeads.for_model(model, num_heads=3)
    hidden = torch.randn(model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        half = lattice_source(heads, 4, 64, np.arange(40), "bfloat16")
        full = lattice_source(heads, 4, 64, np.arange(40), "model")
        assert half._rows.dtype == torch.bfloat16 and full._rows.dtype == torch.float32
        again = lattice_source(heads, 4, 64, np.arange(40), "bfloat16")
        want = full(hidden, [1, 2])[0]
        for source in (half, again):
            assert source._rows.dtype == torch.bfloat16
            got = source(hidden, [1, 2])[0]
            np.testing.assert_allclose(got.scores, want.scores, atol=0.05)
        assert full._rows.dtype == torch.float32
        np.testing.assert_array_equal(full(hidden, [1, 2])[0].tokens, want.tokens)
