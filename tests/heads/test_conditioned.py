"""Token-conditioned heads (``BlockHeads(token_conditioned=True)``): heads 2..h also read the token
at t + 1. Checked against a plain reimplementation of their math, on save / load, bad inputs and
files, and in a small training problem only the next token can solve."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
torch.set_num_threads(1)

from heads_helpers import HIDDEN, VOCAB, final_hidden, tiny_llama  # noqa: E402
from latticekit.heads import BlockHeads, HeadsFormatError, HeadsMismatchError  # noqa: E402
from latticekit.heads.medusa import write_medusa  # noqa: E402


def randomize(heads: BlockHeads, seed: int = 1) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            if p.requires_grad:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))


@pytest.fixture
def model():
    return tiny_llama()


@pytest.fixture
def hidden(model):
    ids = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(0))
    return final_hidden(model, ids)


def plain_logits(heads: BlockHeads, hidden: torch.Tensor, next_token: torch.Tensor) -> torch.Tensor:
    """Head 1 = lm_head(h); head i = lm_head(block_i(h + C_i E[x])), each ``mlp`` block written out."""
    weight = heads.lm_head.weight
    embedded = weight[next_token]
    rows = [hidden @ weight.T]
    d = heads.hidden_size
    for i, block in enumerate(heads.blocks):
        x = hidden + embedded @ heads.token_input.weight[i * d:(i + 1) * d].T
        x = x + torch.nn.functional.silu(x @ block.up.weight.T + block.up.bias) @ block.down.weight.T + block.down.bias
        rows.append(x @ weight.T)
    return torch.stack(rows, dim=-2)


def test_logits_equal_a_plain_reimplementation(model, hidden):
    heads = BlockHeads.for_model(model, num_heads=4, token_conditioned=True)
    randomize(heads)
    token = torch.randint(0, VOCAB, hidden.shape[:-1], generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(heads(hidden, next_token=token), plain_logits(heads, hidden, token))
        default = heads(hidden)  # head 1's arg-max
        torch.testing.assert_close(default, plain_logits(heads, hidden, (hidden @ heads.lm_head.weight.T).argmax(-1)))
        assert heads(hidden[0, 0], next_token=int(token[0, 0])).shape == (4, VOCAB)
        torch.testing.assert_close(heads(hidden[0, 0], next_token=int(token[0, 0])),
                                   heads(hidden, next_token=token)[0, 0])
        states = heads.head_states(hidden, token)
        torch.testing.assert_close(heads.lm_head(states), heads(hidden, next_token=token))


def test_the_next_token_moves_only_the_draft_heads(model, hidden):
    heads = BlockHeads.for_model(model, num_heads=3, token_conditioned=True)
    randomize(heads)
    with torch.no_grad():
        a = heads(hidden[0, 0], next_token=3)
        b = heads(hidden[0, 0], next_token=4)
    torch.testing.assert_close(a[0], b[0], rtol=0, atol=0)
    assert (a[1:] - b[1:]).abs().max() > 1e-3


def test_fresh_conditioned_heads_compute_what_their_blocks_alone_do(model, hidden):
    heads = BlockHeads.for_model(model, num_heads=4, token_conditioned=True)
    plain = BlockHeads.for_model(model, num_heads=4)
    randomize(plain)
    state = plain.trainable_state()
    state |= {k: v for k, v in heads.trainable_state().items() if k.startswith("token_inputs.")}
    heads.load_weights(state)
    assert float(heads.token_input.weight.detach().abs().max()) == 0
    with torch.no_grad():
        torch.testing.assert_close(heads(hidden, next_token=torch.zeros(hidden.shape[:-1], dtype=torch.long)),
                                   plain(hidden), rtol=0, atol=0)
    assert heads.token_input.weight.requires_grad
    assert not heads.lm_head.weight.requires_grad


@pytest.mark.parametrize("token", [-1, VOCAB, 2.0, "shape", True])
def test_bad_next_token_is_a_typed_error(model, hidden, token):
    heads = BlockHeads.for_model(model, num_heads=3, token_conditioned=True)
    bad = torch.zeros(3, dtype=torch.long) if token == "shape" else token
    with pytest.raises(HeadsMismatchError, match="next_token"):
        heads(hidden[0, 0], next_token=bad)


def test_round_trip_and_header(model, hidden, tmp_path):
    heads = BlockHeads.for_model(model, num_heads=5, token_conditioned=True)
    randomize(heads)
    path = tmp_path / "c.safetensors"
    heads.save(path)
    loaded = BlockHeads.load(path, model)
    assert loaded.token_conditioned and BlockHeads.read_metadata(path)["token_conditioned"] is True
    token = torch.randint(0, VOCAB, hidden.shape[:-1], generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(loaded(hidden, next_token=token), heads(hidden, next_token=token), rtol=0, atol=0)
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        assert {k for k in f.keys() if k.startswith("token_inputs.")} == {f"token_inputs.{i}.weight" for i in range(4)}


def _rewrite_header(path, change) -> None:
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    meta = json.loads(header["__metadata__"]["latticekit"])
    change(meta)
    header["__metadata__"]["latticekit"] = json.dumps(meta)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data[8 + n:])


@pytest.mark.parametrize("damage", ["flag_without_tensors", "tensors_without_flag", "not_a_bool"])
def test_files_that_contradict_their_header_are_format_errors(model, tmp_path, damage):
    path = tmp_path / "h.safetensors"
    BlockHeads.for_model(model, num_heads=3, token_conditioned=damage != "flag_without_tensors").save(path)
    if damage == "flag_without_tensors":
        _rewrite_header(path, lambda m: m.update(token_conditioned=True))
    elif damage == "tensors_without_flag":
        _rewrite_header(path, lambda m: m.update(token_conditioned=False))
    else:
        _rewrite_header(path, lambda m: m.update(token_conditioned="yes"))
    with pytest.raises(HeadsFormatError):
        BlockHeads.load(path, model)


def test_medusa_formats_refuse_conditioned_heads(model, tmp_path):
    heads = BlockHeads.for_model(model, num_heads=3, layer="medusa", token_conditioned=True)
    for fmt in ("vllm", "medusa"):
        with pytest.raises(HeadsMismatchError, match="next token"):
            write_medusa(tmp_path / fmt, heads, format=fmt)


def test_the_next_token_is_learnt_where_the_hidden_state_cannot_say_it(model):
    """Token t + 2 is a function of token t + 1, which is random given the text before it: head 2
    learns the sequence only when it reads token t + 1, as conditioned heads do."""
    gen = torch.Generator().manual_seed(0)
    successor = torch.randperm(VOCAB, generator=gen)
    first = torch.randint(0, VOCAB, (48, 12), generator=gen)
    ids = torch.stack([first, successor[first]], dim=-1).reshape(48, 24)  # pairs (x, f(x))
    hidden = final_hidden(model, ids)
    at = torch.arange(0, 24, 2)[:-1] + 1  # position t = the second of a pair: t + 1 random, t + 2 = f(t + 1)
    h_t, nxt, target = hidden[:, at], ids[:, at + 1], ids[:, at + 2]
    losses = {}
    for conditioned in (False, True):
        torch.manual_seed(0)
        heads = BlockHeads.for_model(model, num_heads=2, token_conditioned=conditioned)
        params = [p for p in heads.parameters() if p.requires_grad]
        optimizer = torch.optim.Adam(params, lr=2e-2)
        for _ in range(150):
            optimizer.zero_grad()
            logits = heads(h_t, next_token=nxt)[..., 1, :]
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1))
            loss.backward()
            optimizer.step()
        losses[conditioned] = float(loss.detach())
    assert losses[True] < 0.5 * losses[False], losses
