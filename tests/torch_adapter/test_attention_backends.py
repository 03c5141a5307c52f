"""On CUDA a prepared model's passes run SDPA without cuDNN's attention (a plan per new key
length); elsewhere torch chooses. The choice is checked for every device and attention kind
here on the CPU, and the context it makes is checked to hold during latticekit's passes (the
global SDPA flags a pass sees) and nowhere else, with the tokens unchanged. Whether flash /
memory-efficient attention then run on a GPU is for a GPU session (docs/gpu.md)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from latticekit.decoding import greedy_decode
from latticekit.torch import DraftTree, prefill, prepare_target, verify
from latticekit.torch.prepare import ATTENTION, CUDA_SDPA_BACKENDS, sdpa_backends, sdpa_context
from latticekit.torch.target import Target
from lk_torch_helpers import TinyProtocolLM, tiny_gpt2, tiny_llama


@pytest.mark.parametrize("device", ["cuda", "cuda:1", torch.device("cuda", 0)])
@pytest.mark.parametrize("attention", ["sdpa", ATTENTION])
def test_cuda_sdpa_models_run_without_cudnn(device: Any, attention: str) -> None:
    backends = sdpa_backends(device, attention)
    assert backends == CUDA_SDPA_BACKENDS and "CUDNN_ATTENTION" not in backends
    assert set(backends) == {"FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH"}


def test_torch_chooses_everywhere_else() -> None:
    assert sdpa_backends("cpu", "sdpa") is None
    assert sdpa_backends(torch.device("cpu"), ATTENTION) is None
    assert sdpa_backends("meta", "sdpa") is None
    assert sdpa_backends("cuda", "eager") is None  # no SDPA call to restrict
    assert sdpa_backends("cuda", "flash_attention_2") is None
    assert sdpa_backends("cuda", None, is_hf=False) == CUDA_SDPA_BACKENDS  # a protocol module may call SDPA
    assert sdpa_backends("cpu", None, is_hf=False) is None


def test_a_cpu_preparation_restricts_nothing() -> None:
    for model in (prepare_target(tiny_llama()), prepare_target(tiny_gpt2()), prepare_target(TinyProtocolLM())):
        assert model.latticekit_preparation.sdpa_backends is None
        assert Target(model).sdpa_backends is None
        assert "SDPA" not in model.latticekit_preparation.describe()


def test_the_context_holds_during_latticekit_passes_only() -> None:
    """A CPU model given the CUDA restriction: every pass of latticekit's (prefill, plain step,
    tree pass) sees cuDNN attention off, the flags are restored after it, and the tokens are
    those of the unrestricted model (the CPU runs math or its flash kernel either way)."""
    plain = prepare_target(tiny_llama())
    restricted = prepare_target(tiny_llama())
    restricted.latticekit_preparation.sdpa_backends = CUDA_SDPA_BACKENDS
    assert "SDPA flash/efficient/math" in restricted.latticekit_preparation.describe()
    seen: list[bool] = []
    restricted.register_forward_pre_hook(lambda _m, _a: seen.append(torch.backends.cuda.cudnn_sdp_enabled()))
    before = torch.backends.cuda.cudnn_sdp_enabled()
    prompt = [3, 17, 42, 8, 25, 60, 11]
    assert greedy_decode(restricted, prompt, 12).tokens == greedy_decode(plain, prompt, 12).tokens
    cache = prefill(restricted, prompt)
    result = verify(restricted, cache, prompt, DraftTree.from_drafts([[5, 6, 7], [9]]))
    assert result.emitted_tokens.numel() >= 1
    assert seen and not any(seen)  # every pass: cuDNN off
    assert torch.backends.cuda.cudnn_sdp_enabled() == before  # and restored after each


def test_sdpa_context_of_nothing_changes_nothing() -> None:
    flags = (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.cudnn_sdp_enabled())
    with sdpa_context(None):
        assert (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.cudnn_sdp_enabled()) == flags
    with sdpa_context(("MATH",)):
        assert not torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.math_sdp_enabled()
    assert (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.cudnn_sdp_enabled()) == flags


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_prepared_model_decodes_as_hf_greedy() -> None:
    """On a GPU: the preparation restricts SDPA, and the decode still equals HF's greedy (fp32)."""
    model = tiny_llama().to("cuda")
    prepare_target(model)
    assert model.latticekit_preparation.sdpa_backends == CUDA_SDPA_BACKENDS
    prompt = [3, 17, 42, 8, 25, 60, 11]
    ids = torch.tensor([prompt], device="cuda")
    reference = model.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False,
                               pad_token_id=0)[0, len(prompt):].tolist()
    assert greedy_decode(model, prompt, 12).tokens == reference
