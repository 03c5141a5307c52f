"""The neural rescorer: the batched prefix + draft path equals plain causal LM passes, Algorithm
2 equals its obvious loop, the scores form a distribution, and bad files are typed errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from latticekit.eval.rescorer import (
    NeuralRescorer,
    RescorerError,
    RescorerFormatError,
    check_rescorer,
    context_window,
    local_rescore,
    neural_drafts,
)

VOCAB = 64


def tiny_rescorer(seed: int = 0, max_len: int = 48) -> NeuralRescorer:
    torch.manual_seed(seed)
    vocab_map = torch.full((VOCAB,), 15, dtype=torch.long)
    vocab_map[torch.randperm(VOCAB)[:15]] = torch.arange(15)
    model = NeuralRescorer(vocab_map, d_model=32, num_layers=2, num_heads=4, d_ff=64, max_len=max_len)
    for p in model.parameters():  # spread the weights so that rescoring changes choices
        p.data.normal_(0.0, 0.3)
    return model.eval()


def full_logprobs(model: NeuralRescorer, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids]))[0, -1], dim=-1)


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_continuation_equals_plain_forward(data: st.DataObject) -> None:
    model = tiny_rescorer(data.draw(st.integers(0, 3)))
    T = data.draw(st.integers(1, 30))
    seq = data.draw(st.lists(st.integers(0, VOCAB - 1), min_size=T, max_size=T))
    m = data.draw(st.integers(0, 5))
    n = data.draw(st.integers(1, 4))
    ends = data.draw(st.lists(st.integers(0, T - 1), min_size=n, max_size=n))
    drafts = data.draw(st.lists(st.lists(st.integers(0, VOCAB - 1), min_size=m, max_size=m), min_size=n, max_size=n))
    state = model.prefix_state(torch.tensor(seq))
    got = model.continuation_logprobs(state, torch.tensor(ends), torch.tensor(drafts, dtype=torch.long).reshape(n, m))
    for row in range(n):
        want = full_logprobs(model, seq[: ends[row] + 1] + drafts[row])
        torch.testing.assert_close(got[row], want, rtol=1e-5, atol=1e-5)
    # The k-candidate scores are those token log-probabilities less one constant per row.
    k = data.draw(st.integers(1, 6))
    tokens = torch.tensor(data.draw(st.lists(st.lists(st.integers(0, VOCAB + 3), min_size=k, max_size=k),
                                             min_size=n, max_size=n)))
    scores = model.continuation_token_scores(state, torch.tensor(ends),
                                             torch.tensor(drafts, dtype=torch.long).reshape(n, m), tokens)
    shift = model.token_logprobs(got, tokens) - scores
    torch.testing.assert_close(shift, shift[:, :1].expand(n, k), rtol=1e-5, atol=1e-5)


def test_token_logprobs_form_a_distribution() -> None:
    model = tiny_rescorer()
    logp = full_logprobs(model, [1, 2, 3])
    every = model.token_logprobs(logp[None], torch.arange(VOCAB)[None])[0]
    assert float(every.exp().sum()) == pytest.approx(1.0, abs=1e-5)
    # an id outside the vocabulary is scored as "other"
    assert float(model.token_logprobs(logp, torch.tensor([VOCAB + 5]))) == pytest.approx(
        float(logp[-1] - model.class_penalty[-1]))


def slow_local_rescore(model: NeuralRescorer, prefix: list[int], tokens: np.ndarray, scores: np.ndarray,
                       alpha: float) -> list[int]:
    chosen: list[int] = []
    for j in range(1, tokens.shape[0]):
        logp = full_logprobs(model, prefix + chosen)
        r = model.token_logprobs(logp, torch.from_numpy(tokens[j].astype(np.int64))).numpy()
        total = scores[j].astype(np.float32) + np.float32(alpha) * r
        chosen.append(int(tokens[j, int(np.argmax(total))]))
    return chosen


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0, 5.0])
def test_local_rescore_equals_the_obvious_loop(alpha: float) -> None:
    model = tiny_rescorer(1)
    rng = np.random.default_rng(0)
    seq = rng.integers(0, VOCAB, size=20).tolist()
    h, k, n = 5, 6, 8
    tokens = np.stack([np.stack([rng.permutation(VOCAB)[:k] for _ in range(h)]) for _ in range(n)])
    scores = np.sort(rng.normal(size=(n, h, k)).astype(np.float32), axis=-1)[..., ::-1].copy()
    ends = rng.integers(0, len(seq), size=n)
    state = model.prefix_state(torch.tensor(seq))
    got = local_rescore(model, state, torch.from_numpy(ends), torch.from_numpy(tokens), torch.from_numpy(scores), alpha)
    for row in range(n):
        assert got[row].tolist() == slow_local_rescore(model, seq[: ends[row] + 1], tokens[row], scores[row], alpha)
    if alpha == 0:
        assert got.tolist() == tokens[:, 1:, 0].tolist()  # the heads' arg-max: vanilla drafts


def test_neural_drafts_windows_long_prefixes() -> None:
    model = tiny_rescorer(2, max_len=24)
    h, k = 5, 4
    window = context_window(model, h)
    assert window == 24 - 3
    rng = np.random.default_rng(1)
    seq = rng.integers(0, VOCAB, size=60).tolist()
    ends = np.array([0, 5, window - 1, window, 40, 59])
    tokens = np.stack([np.stack([rng.permutation(VOCAB)[:k] for _ in range(h)]) for _ in ends])
    scores = rng.normal(size=tokens.shape).astype(np.float32)
    got = neural_drafts(model, torch.tensor(seq), torch.from_numpy(ends), torch.from_numpy(tokens),
                        torch.from_numpy(scores), 1.0, h)
    for row, end in enumerate(ends):
        prefix = seq[max(0, end + 1 - window): end + 1]
        assert got[row].tolist() == slow_local_rescore(model, prefix, tokens[row], scores[row], 1.0)


def test_save_load_round_trip(tmp_path: Path) -> None:
    model = tiny_rescorer(3)
    model.metadata["note"] = "test"
    path = tmp_path / "r.safetensors"
    model.save(path, dtype=None)
    back = NeuralRescorer.load(path)
    assert back.metadata["note"] == "test" and back.config == model.config
    ids = torch.tensor([[4, 8, 15, 16, 23, 42]])
    with torch.no_grad():
        torch.testing.assert_close(back(ids), model(ids), rtol=0, atol=0)
    model.save(path)  # float16 by default
    half = NeuralRescorer.load(path)
    with torch.no_grad():
        torch.testing.assert_close(half(ids), model(ids), rtol=0.05, atol=0.05)


def test_bad_files_are_typed_errors(tmp_path: Path) -> None:
    with pytest.raises(RescorerFormatError, match="cannot read"):
        NeuralRescorer.load(tmp_path / "missing.safetensors")
    path = tmp_path / "r.safetensors"
    tiny_rescorer().save(path)
    data = path.read_bytes()
    for bad in (data[: len(data) // 2], b"\x00" * 16, data[:8] + b"[" + data[9:]):
        (tmp_path / "bad").write_bytes(bad)
        with pytest.raises(RescorerFormatError):
            NeuralRescorer.load(tmp_path / "bad")
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(2)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(RescorerFormatError, match="not a latticekit rescorer"):
        NeuralRescorer.load(tmp_path / "other.safetensors")


def test_bad_arguments() -> None:
    with pytest.raises(RescorerError, match="1-D LongTensor"):
        NeuralRescorer(torch.zeros(4))
    model = tiny_rescorer(max_len=16)
    with pytest.raises(RescorerError, match="covers 16"):
        model(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(RescorerError, match="cannot rescore"):
        context_window(model, 40)
    state = model.prefix_state(torch.tensor([1, 2, 3]))
    for ends in ([-1], [3]):
        for m in (0, 2):
            with pytest.raises(RescorerError, match="prefix ends"):
                model.continuation_logprobs(state, torch.tensor(ends), torch.zeros(1, m, dtype=torch.long))
    with pytest.raises(RescorerError, match="another tokenizer"):
        check_rescorer(model, VOCAB + 1, 4)
    with pytest.raises(RescorerError, match="NeuralRescorer"):
        check_rescorer(object(), VOCAB, 4)
    assert check_rescorer(model, VOCAB, 4) is model
