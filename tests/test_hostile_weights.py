"""Weights files whose header or tensors lie (issue 18): heads and rescorer files are
checked against their header, before anything is allocated from it."""

import json
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")


class _Model:
    """What BlockHeads.load needs of a causal LM: an output projection."""

    def __init__(self):
        self.lm_head = torch.nn.Linear(8, 16, bias=False)

    def get_output_embeddings(self):
        return self.lm_head


def _rewrite(path: Path, header_edit=None, tensor_edit=None) -> None:
    """Rewrites a latticekit safetensors file: its latticekit header and/or its tensors."""
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    meta = json.loads(json.loads(data[8:8 + n])["__metadata__"]["latticekit"])
    tensors = safetensors_torch.load(data)
    if header_edit:
        header_edit(meta)
    if tensor_edit:
        tensor_edit(tensors)
    path.write_bytes(safetensors_torch.save(tensors, metadata={"latticekit": json.dumps(meta)}))


def _float8(t):
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this torch has no float8")
    return t.to(torch.float8_e4m3fn)


TENSOR_DAMAGE = {
    "int": lambda t: t.to(torch.int32),
    "bool": lambda t: t != 0,
    "float8": _float8,
    "nan": lambda t: t.float().fill_(float("nan")),
    "inf": lambda t: t.float().fill_(float("-inf")),
    "shape": lambda t: t.float()[:1],
}


@pytest.fixture
def heads_file(tmp_path):
    from latticekit.heads import BlockHeads

    model = _Model()
    path = tmp_path / "h.safetensors"
    BlockHeads.for_model(model, num_heads=3).save(path)
    return model, path


@pytest.mark.parametrize("damage", sorted(TENSOR_DAMAGE))
def test_heads_with_bad_tensors_are_refused(heads_file, damage):
    from latticekit.heads import BlockHeads, HeadsFormatError

    model, path = heads_file
    assert BlockHeads.load(path, model).num_heads == 3
    _rewrite(path, tensor_edit=lambda ts: ts.update({"1.up.weight": TENSOR_DAMAGE[damage](ts["1.up.weight"])}))
    with pytest.raises(HeadsFormatError, match="1.up.weight"):
        BlockHeads.load(path, model)


@pytest.mark.parametrize("field,value", [("num_heads", 10**5), ("intermediate_size", 10**9),
                                         ("hidden_size", 10**12), ("hidden_size", 2**62), ("num_heads", True)])
def test_heads_header_sizes_are_checked_before_allocating(heads_file, field, value):
    from latticekit.heads import BlockHeads, HeadsFormatError

    model, path = heads_file
    _rewrite(path, header_edit=lambda m: m.update({field: value}))
    start = time.perf_counter()
    with pytest.raises(HeadsFormatError):
        BlockHeads.read_metadata(path)
    assert time.perf_counter() - start < 2.0


@pytest.fixture
def rescorer_file(tmp_path):
    from latticekit.eval.rescorer import NeuralRescorer

    vocab_map = torch.arange(20) % 6
    path = tmp_path / "r.safetensors"
    NeuralRescorer(vocab_map, d_model=8, num_layers=2, num_heads=2, d_ff=16, max_len=12).save(path)
    return path


@pytest.mark.parametrize("name", ["embed.weight", "layers.1.ff1.weight"])
@pytest.mark.parametrize("damage", sorted(TENSOR_DAMAGE))
def test_rescorer_with_bad_tensors_is_refused(rescorer_file, damage, name):
    from latticekit.eval.rescorer import NeuralRescorer, RescorerFormatError

    assert NeuralRescorer.load(rescorer_file).config["num_layers"] == 2
    _rewrite(rescorer_file, tensor_edit=lambda ts: ts.update({name: TENSOR_DAMAGE[damage](ts[name])}))
    with pytest.raises(RescorerFormatError, match=name):
        NeuralRescorer.load(rescorer_file)


@pytest.mark.parametrize("edit", [
    lambda m: m.update(num_layers=10**5), lambda m: m.update(d_model=10**9, num_heads=1),
    lambda m: m.update(max_len=10**10), lambda m: m.update(d_ff=False), lambda m: m.update(num_heads=3)])
def test_rescorer_header_sizes_are_checked_before_allocating(rescorer_file, edit):
    from latticekit.eval.rescorer import NeuralRescorer, RescorerFormatError

    _rewrite(rescorer_file, header_edit=edit)
    start = time.perf_counter()
    with pytest.raises(RescorerFormatError):
        NeuralRescorer.load(rescorer_file)
    assert time.perf_counter() - start < 2.0


def test_rescorer_vocab_map_must_be_integers(rescorer_file):
    from latticekit.eval.rescorer import NeuralRescorer, RescorerFormatError

    _rewrite(rescorer_file, tensor_edit=lambda ts: ts.update(vocab_map=ts["vocab_map"].float()))
    with pytest.raises(RescorerFormatError, match="vocab_map"):
        NeuralRescorer.load(rescorer_file)
