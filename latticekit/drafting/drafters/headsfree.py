"""``headsfree``: drafting with no heads, from the n-gram models alone, as a tree.

Prompt lookup decoding (transformers' ``prompt_lookup_num_tokens``, vLLM's ``ngram``, SGLang's
``NGRAM``) speeds up any model with no training: it copies what followed the longest earlier
match of the text's last tokens, as one chain. This drafter drafts from a model instead of a
string match, and as a tree:

1. **The model** (:class:`~latticekit.drafting.cache_model.CacheModel`): the prompt's and the decoded
   text's own n-grams (the cache, updated every step; its longest match decides) interpolated
   with the static Katz model (``lms``; without one, the cache alone), with a weight per match
   length fitted on the text itself, so a long match's continuation wins as in prompt lookup.
2. **The candidates** (:func:`~latticekit.drafting.continuations.best_continuations`): the p most
   probable continuations of the decoded text under that model, 1 to 12 tokens long, found by
   an exact best-first search: a prefix-closed tree.
3. **The tree verified**: ``auto``'s chooser (:mod:`latticekit.drafting.drafters.auto`): online
   acceptance estimates (the cache model's and the static model's probabilities, the depth;
   learnt from the decode's own text) and the target's measured step costs give the subtree
   with the most expected tokens per second; a plain step when none pays.

It reads no heads (``needs_heads = False``): any HF causal LM, untouched. ``auto`` without heads
and :func:`latticekit.generate` without heads draft this way.
"""

from __future__ import annotations

from typing import cast

from latticekit.drafting.drafters.auto import AutoDrafter
from latticekit.drafting.protocol import DraftResources
from latticekit.drafting.registry import register

__all__ = ["HeadsFreeDrafter"]


@register
class HeadsFreeDrafter(AutoDrafter):
    """``auto``'s chooser over the n-gram models' continuations (see the module docstring).

    Config: ``p`` candidate nodes (default 32), ``alpha > 0`` with an n-gram model given
    (``lms``) includes the static model, ``alpha = 0`` drafts from the decoded text's cache
    alone; ``k`` is unused.
    """

    method = "headsfree"
    default_k = 1
    default_p = 32
    knobs = frozenset({"p", "alpha", "lm"})

    @classmethod
    def drafts_from_heads(cls, resources: DraftResources) -> bool:
        return False  # this drafter reads no heads' lattice

    @classmethod
    def arms_for(cls, reads_heads: bool) -> tuple[str, ...]:
        return ("text",)

    @property
    def text_candidates(self) -> int:
        return cast(int, self.config.p)  # set by DecoderConfig.__post_init__
