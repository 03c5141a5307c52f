"""Bad input to the adapter raises typed, descriptive errors and leaves the cache untouched."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import DynamicCache

from latticekit.errors import LatticeKitError, VocabularyError
from latticekit.torch import (
    CacheError,
    DeviceMismatchError,
    DraftError,
    DraftTree,
    KVCache,
    UnsupportedModelError,
    commit_accepted,
    prefill,
    tree_forward,
    verify,
)
from lk_torch_helpers import VOCAB, TinyProtocolLM, tiny_llama

PROMPT = [3, 17, 42, 8, 25]


@pytest.fixture(scope="module")
def llama() -> Any:
    return tiny_llama(torch.float32)


@pytest.fixture
def cache(llama: Any) -> Any:
    return prefill(llama, torch.tensor(PROMPT))


def test_empty_drafts() -> None:
    with pytest.raises(DraftError, match="no drafts"):
        DraftTree.from_drafts(torch.empty((0, 8), dtype=torch.long))
    with pytest.raises(DraftError, match="empty"):
        DraftTree.from_drafts([[]])


@pytest.mark.parametrize("bad_id", [VOCAB, 10_000])
def test_draft_ids_outside_vocabulary(llama: Any, cache: Any, bad_id: int) -> None:
    tree = DraftTree.from_drafts([[1, 2], [1, bad_id]])
    with pytest.raises(VocabularyError, match=f"id {bad_id}.*0..{VOCAB - 1}"):
        verify(llama, cache, torch.tensor(PROMPT), tree)
    assert cache.get_seq_length() == len(PROMPT) - 1  # nothing ran


def test_prefix_ids_outside_vocabulary(llama: Any, cache: Any) -> None:
    with pytest.raises(VocabularyError):
        verify(llama, cache, torch.tensor(PROMPT[:-1] + [VOCAB]), DraftTree.from_drafts([[1]]))
    with pytest.raises(VocabularyError):
        prefill(llama, torch.tensor([-1, 2, 3]))


def test_mismatched_devices(llama: Any, cache: Any) -> None:
    tree = DraftTree.from_drafts([[1, 2]])
    with pytest.raises(DeviceMismatchError, match="meta"):
        verify(llama, cache, torch.tensor(PROMPT, device="meta"), tree)
    with pytest.raises(DeviceMismatchError, match="draft_probs"):
        verify(llama, cache, torch.tensor(PROMPT), tree, "block",
               draft_probs=torch.full((2, VOCAB), 1 / VOCAB, device="meta"))
    meta_cache = DynamicCache(config=llama.config)
    for layer in range(llama.config.num_hidden_layers):
        meta_cache.update(torch.zeros(1, 2, len(PROMPT) - 1, 8, device="meta"),
                          torch.zeros(1, 2, len(PROMPT) - 1, 8, device="meta"), layer)
    with pytest.raises(DeviceMismatchError, match="cache"):
        verify(llama, meta_cache, torch.tensor(PROMPT), tree)
    assert cache.get_seq_length() == len(PROMPT) - 1


def test_cache_shorter_or_longer_than_prefix(llama: Any) -> None:
    tree = DraftTree.from_drafts([[1, 2]])
    short = prefill(llama, torch.tensor(PROMPT[:-2]))
    with pytest.raises(CacheError, match=r"holds 2 positions.*needs exactly 4.*prefill"):
        verify(llama, short, torch.tensor(PROMPT), tree)
    long = prefill(llama, torch.tensor(PROMPT + [1, 2]))
    with pytest.raises(CacheError, match="beyond the prefix"):
        tree_forward(llama, long, torch.tensor(PROMPT), tree)
    with pytest.raises(CacheError, match="more than"):
        prefill(llama, torch.tensor(PROMPT), past_key_values=long)


def test_cache_of_the_wrong_kind(llama: Any) -> None:
    tree = DraftTree.from_drafts([[1]])
    with pytest.raises(CacheError, match="transformers Cache"):
        verify(llama, KVCache(), torch.tensor([5]), tree)
    with pytest.raises(CacheError, match="KVCache"):
        verify(TinyProtocolLM(), DynamicCache(), torch.tensor([5]), tree)
    with pytest.raises(CacheError):
        commit_accepted(object(), 0, 0, [])


def test_commit_refuses_a_cache_of_the_wrong_length() -> None:
    cache = KVCache()
    cache.update(0, torch.zeros(1, 1, 5, 2), torch.zeros(1, 1, 5, 2))
    with pytest.raises(CacheError, match="holds 5 positions, expected prefix 2 \\+ tree 2"):
        commit_accepted(cache, 2, 2, [0])


def test_commit_gathers_non_contiguous_nodes_exactly() -> None:
    cache = KVCache()
    keys = torch.arange(8.0).view(1, 1, 8, 1)
    cache.update(0, keys.clone(), -keys.clone())
    commit_accepted(cache, 3, 5, [1, 3])  # positions 4 and 6 follow the prefix 0, 1, 2
    assert cache.keys[0].flatten().tolist() == [0, 1, 2, 4, 6]
    assert cache.values[0].flatten().tolist() == [0, -1, -2, -4, -6]


def test_unsupported_models_and_rules(llama: Any, cache: Any) -> None:
    tree = DraftTree.from_drafts([[1, 2], [1, 3]])
    with pytest.raises(UnsupportedModelError):
        verify(torch.nn.Linear(2, 2), KVCache(), torch.tensor([1]), tree)
    with pytest.raises(DraftError, match="unknown acceptance rule"):
        verify(llama, cache, torch.tensor(PROMPT), tree, "beam")  # type: ignore[arg-type]
    with pytest.raises(DraftError, match="single draft"):
        verify(llama, cache, torch.tensor(PROMPT), tree, "token",
               draft_probs=torch.full((3, VOCAB), 1 / VOCAB))
    with pytest.raises(DraftError, match="draft_probs of shape"):
        verify(llama, cache, torch.tensor(PROMPT), DraftTree.from_drafts([[1, 2]]), "block")
    with pytest.raises(ValueError, match="temperature"):
        verify(llama, cache, torch.tensor(PROMPT), tree, "sampling", temperature=0.0)
    with pytest.raises(DraftError, match="DraftTree"):
        verify(llama, cache, torch.tensor(PROMPT), [[1, 2]])  # type: ignore[arg-type]
    with pytest.raises(DraftError, match="non-empty"):
        verify(llama, cache, torch.tensor([], dtype=torch.long), tree)
    flash = tiny_llama(torch.float32)
    flash.config._attn_implementation = "flash_attention_2"
    with pytest.raises(UnsupportedModelError, match="4-D tree mask"):
        verify(flash, DynamicCache(config=flash.config), torch.tensor([1]), tree)
    assert cache.get_seq_length() == len(PROMPT) - 1


def test_errors_are_latticekit_and_builtin() -> None:
    for cls, builtin in ((DraftError, ValueError), (CacheError, ValueError),
                         (DeviceMismatchError, ValueError), (UnsupportedModelError, TypeError)):
        assert issubclass(cls, LatticeKitError) and issubclass(cls, builtin)


def test_import_latticekit_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = "import sys, latticekit, latticekit.errors; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_uncommittable_cache_fails_before_the_pass(llama: Any, cache: Any) -> None:
    from transformers.cache_utils import DynamicSlidingWindowLayer

    sliding = DynamicSlidingWindowLayer(sliding_window=4)
    sliding.lazy_initialization(cache.layers[1].keys, cache.layers[1].values)
    sliding.keys, sliding.values = cache.layers[1].keys, cache.layers[1].values
    cache.layers[1] = sliding
    with pytest.raises(CacheError, match="DynamicSlidingWindowLayer"):
        verify(llama, cache, torch.tensor(PROMPT), DraftTree.from_drafts([[1, 2]]))
    assert cache.layers[0].keys.shape[-2] == len(PROMPT) - 1  # nothing was written
