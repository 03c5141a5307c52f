"""Medusa checkpoints in and out of BlockHeads, checked against a plain reimplementation of Medusa's head math."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")
torch.set_num_threads(1)

from safetensors.torch import save_file  # noqa: E402

from latticekit.heads import BlockHeads, HeadsFormatError, HeadsMismatchError  # noqa: E402
from latticekit.heads.medusa import load_medusa, write_medusa  # noqa: E402
from heads_helpers import HIDDEN, VOCAB, final_hidden, tiny_llama  # noqa: E402

K, L = 3, 2  # Medusa heads, layers per head


def medusa_logits(hidden, layers, projections, token_map=None, scale=1.0):
    """Medusa's head math written out: x <- x + silu(x W^T + b) per layer, then the head's projection."""
    out = []
    for head, projection in zip(layers, projections):
        x = hidden
        for weight, bias in head:
            x = x + torch.nn.functional.silu(x @ weight.T + (0 if bias is None else bias))
        logits = scale * (x @ projection.T)
        if token_map is not None:
            full = torch.full((*logits.shape[:-1], VOCAB), float("-inf"))
            full[..., token_map] = logits
            logits = full
        out.append(logits)
    return torch.stack(out, dim=-2)


def random_weights(seed=0, bias=True, shared=False, rows=VOCAB):
    gen = torch.Generator().manual_seed(seed)
    layers = []
    for _ in range(K):
        first = (0.2 * torch.randn(HIDDEN, HIDDEN, generator=gen), 0.1 * torch.randn(HIDDEN, generator=gen) if bias else None)
        layers.append([first] * L if shared else
                      [first] + [(0.2 * torch.randn(HIDDEN, HIDDEN, generator=gen),
                                  0.1 * torch.randn(HIDDEN, generator=gen) if bias else None) for _ in range(L - 1)])
    projections = [0.3 * torch.randn(rows, HIDDEN, generator=gen) for _ in range(K)]
    return layers, projections


def write_fasterdecoding(folder: Path, layers, projections, *, only_first_layer=False, pt=False):
    """FasterDecoding's layout: `[ResBlock] * L` shares one layer, so a file may name only layer 0."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for k, head in enumerate(layers):
        for layer, (w, b) in enumerate(head[:1] if only_first_layer else head):
            tensors[f"{k}.{layer}.linear.weight"] = w.clone()
            tensors[f"{k}.{layer}.linear.bias"] = b.clone()
        tensors[f"{k}.{L}.weight"] = projections[k].clone()
    if pt:
        torch.save({f"medusa_head.{n}": t for n, t in tensors.items()}, folder / "medusa_lm_head.pt")
    else:
        save_file(tensors, str(folder / "medusa_lm_head.safetensors"))
    (folder / "config.json").write_text(json.dumps({"medusa_num_heads": K, "medusa_num_layers": L,
                                                    "base_model_name_or_path": "tiny"}))


def write_vllm(folder: Path, layers, projections, config_extra=None, token_map=None):
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for k, head in enumerate(layers):
        for j, (w, b) in enumerate(head):
            tensors[f"blocks.{k}.layers.{j}.weight"] = w.clone()
            if b is not None:
                tensors[f"blocks.{k}.layers.{j}.bias"] = b.clone()
        tensors[f"lm_heads.{k}.weight"] = projections[k].clone()
    if token_map is not None:
        tensors["token_map"] = token_map
    save_file(tensors, str(folder / "model.safetensors"))
    config = {"model_type": "medusa", "num_heads": K, "num_hidden_layers": L, "hidden_size": HIDDEN,
              "vocab_size": VOCAB, "truncated_vocab_size": None, **(config_extra or {})}
    (folder / "config.json").write_text(json.dumps(config))


@pytest.fixture
def model():
    return tiny_llama()


@pytest.fixture
def hidden(model):
    ids = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(3))
    return final_hidden(model, ids)


def check_against_reference(heads, model, hidden, layers, projections, **kwargs):
    assert (heads.num_heads, heads.num_layers, heads.layer) == (K + 1, L, "medusa")
    with torch.no_grad():
        logits = heads(hidden)
        torch.testing.assert_close(logits[..., 0, :], model.lm_head(hidden))  # head 1 = the model's own
        torch.testing.assert_close(logits[..., 1:, :], medusa_logits(hidden, layers, projections, **kwargs))


@pytest.mark.parametrize("variant", ["safetensors", "pt", "shared-names-once"])
def test_fasterdecoding_checkpoint_matches_medusa_math(model, hidden, tmp_path, variant):
    layers, projections = random_weights(shared=True)
    write_fasterdecoding(tmp_path / "ck", layers, projections, pt=variant == "pt",
                         only_first_layer=variant == "shared-names-once")
    heads = load_medusa(tmp_path / "ck", model)
    assert heads.metadata["medusa_format"] == "medusa"
    check_against_reference(heads, model, hidden, layers, projections)


@pytest.mark.parametrize("bias", [False, True])
def test_vllm_checkpoint_matches_medusa_math(model, hidden, tmp_path, bias):
    layers, projections = random_weights(seed=1, bias=bias)
    write_vllm(tmp_path / "ck", layers, projections, {"medusa_fc_bias": bias, "logit_scale": 0.5})
    heads = load_medusa(tmp_path / "ck" / "model.safetensors", model)  # the weights file works too
    check_against_reference(heads, model, hidden, layers, projections, scale=0.5)


@pytest.mark.parametrize("rows", ["truncated", "full"])
def test_vllm_truncated_vocabulary(model, hidden, tmp_path, rows):
    token_map = torch.tensor([3, 7, 8, 20, 41, 63])
    layers, projections = random_weights(seed=2, rows=VOCAB if rows == "full" else len(token_map))
    write_vllm(tmp_path / "ck", layers, projections, {"truncated_vocab_size": len(token_map)}, token_map)
    heads = load_medusa(tmp_path / "ck", model)
    used = projections if rows == "truncated" else [p[token_map] for p in projections]
    check_against_reference(heads, model, hidden, layers, used, token_map=token_map)


def test_vllm_original_lm_head_ties_to_the_model(model, hidden, tmp_path):
    layers, _ = random_weights(seed=3, bias=False)
    own = model.lm_head.weight.detach()
    write_vllm(tmp_path / "ck", layers, [own] * K, {"original_lm_head": True})
    heads = load_medusa(tmp_path / "ck", model)
    assert heads.projections is None  # the model's lm_head, shared rather than copied
    check_against_reference(heads, model, hidden, layers, [own] * K)


def medusa_heads(model, seed=0, projections=True, token_map=None):
    rows = None if not projections else (VOCAB if token_map is None else len(token_map))
    heads = BlockHeads(model.lm_head, K + 1, layer="medusa", num_layers=L, projection_rows=rows,
                       token_map=token_map)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.blocks.parameters():
            p.copy_(0.2 * torch.randn(p.shape, generator=gen))
        for p in (heads.projections or torch.nn.ModuleList()).parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))
    return heads


@pytest.mark.parametrize("projections", [True, False])
def test_round_trip_vllm_identical_logits(model, hidden, tmp_path, projections):
    heads = medusa_heads(model, projections=projections)
    write_medusa(tmp_path / "out", heads, format="vllm")
    again = load_medusa(tmp_path / "out", model)
    assert (again.projections is None) == (not projections)
    with torch.no_grad():
        torch.testing.assert_close(again(hidden), heads(hidden), rtol=0, atol=0)


def test_round_trip_vllm_truncated_vocabulary(model, hidden, tmp_path):
    heads = medusa_heads(model, token_map=torch.tensor([1, 2, 5, 60]))
    write_medusa(tmp_path / "out", heads)
    again = load_medusa(tmp_path / "out", model)
    with torch.no_grad():
        torch.testing.assert_close(again(hidden), heads(hidden), rtol=0, atol=0)


def test_round_trip_fasterdecoding_identical_logits(model, hidden, tmp_path):
    heads = medusa_heads(model)
    with torch.no_grad():  # this format shares one layer across a head's layers
        for block in heads.blocks:
            block[1].load_state_dict(block[0].state_dict())
    write_medusa(tmp_path / "out", heads, format="medusa")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["medusa_num_heads"] == K
    again = load_medusa(tmp_path / "out", model)
    with torch.no_grad():
        torch.testing.assert_close(again(hidden), heads(hidden), rtol=0, atol=0)


def test_latticekit_file_round_trip_of_medusa_heads(model, hidden, tmp_path):
    heads = medusa_heads(model, token_map=torch.tensor([0, 9, 33]))
    heads.save(tmp_path / "m.safetensors")
    again = BlockHeads.load(tmp_path / "m.safetensors", model)
    assert (again.layer, again.num_layers, again.token_map.tolist()) == ("medusa", L, [0, 9, 33])
    with torch.no_grad():
        torch.testing.assert_close(again(hidden), heads(hidden), rtol=0, atol=0)


def test_what_medusa_cannot_hold_is_a_typed_error(model, tmp_path):
    with pytest.raises(HeadsMismatchError, match="mlp"):
        write_medusa(tmp_path / "a", BlockHeads.for_model(model, num_heads=3))
    with pytest.raises(HeadsMismatchError, match="differ"):
        write_medusa(tmp_path / "b", medusa_heads(model), format="medusa")
    with pytest.raises(ValueError):
        write_medusa(tmp_path / "c", medusa_heads(model), format="onnx")


class NotATensor:
    pass


@pytest.mark.parametrize("damage", ["no-config", "bad-config", "no-weights", "missing-tensor", "pickle",
                                    "wrong-shape", "token-map-missing"])
def test_bad_checkpoints_raise_format_error(model, tmp_path, damage):
    layers, projections = random_weights(shared=True)
    folder = tmp_path / "ck"
    write_fasterdecoding(folder, layers, projections)
    weights = folder / "medusa_lm_head.safetensors"
    if damage == "no-config":
        (folder / "config.json").unlink()
    elif damage == "bad-config":
        (folder / "config.json").write_text(json.dumps({"medusa_num_heads": "three", "medusa_num_layers": L}))
    elif damage == "no-weights":
        weights.unlink()
    elif damage == "missing-tensor":
        save_file({"0.0.linear.weight": layers[0][0][0]}, str(weights))
    elif damage == "pickle":  # weights_only=True refuses arbitrary objects: nothing is unpickled
        weights.unlink()
        torch.save({"0.0.linear.weight": layers[0][0][0], "evil": NotATensor()}, folder / "medusa_lm_head.pt")
    elif damage == "wrong-shape":
        write_fasterdecoding(folder, [[(w[:, :5], b) for w, b in head] for head in layers], projections)
    elif damage == "token-map-missing":
        write_vllm(folder, layers, projections, {"truncated_vocab_size": 10})
    with pytest.raises(HeadsFormatError):
        load_medusa(folder, model)


def test_heads_for_another_model_raise_mismatch(tmp_path):
    layers, projections = random_weights(shared=True)
    write_fasterdecoding(tmp_path / "ck", layers, projections)
    with pytest.raises(HeadsMismatchError):
        load_medusa(tmp_path / "ck", tiny_llama(hidden=16))
