"""Lossless verification of draft trees with torch target models.

Importing :mod:`latticekit` never needs torch; this subpackage does. It turns p drafts
(e.g. the p-best paths of a rescored lattice) into one token tree, verifies the tree with a
single forward pass of the target model over its KV cache, accepts the longest valid path
under a greedy or sampling rule, and commits only that path to the cache.

Typical loop::

    cache = prefill(model, prompt_ids)
    ids = prompt_ids
    while ...:
        tree = DraftTree.from_drafts(drafts)          # (p, h) ids continuing ids
        result = verify(model, cache, ids, tree)      # one target call
        ids = torch.cat([ids, result.emitted_tokens])
"""

from latticekit.errors import CacheError, DeviceMismatchError, DraftError, UnsupportedModelError
from latticekit.torch.acceptance import (
    block_verification_plan,
    block_verify,
    target_probs,
    token_verification_plan,
    token_verify,
)
from latticekit.torch.cache import KVCache, commit_accepted
from latticekit.torch.prepare import PackedLinear, Preparation, prepare_heads, prepare_target
from latticekit.torch.protocol import TreeVerifiableModule
from latticekit.torch.target import Target
from latticekit.torch.tree import ROOT, DraftTree
from latticekit.torch.verify import (
    AcceptanceRule,
    TreeOutputs,
    VerifyResult,
    new_cache,
    prefill,
    tree_forward,
    verify,
)

__all__ = [
    "prepare_target",
    "prepare_heads",
    "Preparation",
    "PackedLinear",
    "Target",
    "DraftTree",
    "ROOT",
    "verify",
    "tree_forward",
    "TreeOutputs",
    "prefill",
    "new_cache",
    "VerifyResult",
    "AcceptanceRule",
    "KVCache",
    "SlabCache",
    "commit_accepted",
    "TreeVerifiableModule",
    "target_probs",
    "token_verification_plan",
    "block_verification_plan",
    "token_verify",
    "block_verify",
    "DraftError",
    "CacheError",
    "DeviceMismatchError",
    "UnsupportedModelError",
]


def __getattr__(name: str):  # SlabCache imports transformers, so it loads on first use
    if name == "SlabCache":
        from latticekit.torch.slab import SlabCache

        return SlabCache
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
