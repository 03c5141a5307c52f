"""Drafting strategies behind one protocol (:class:`Drafter`), one module each.

===========  ================================================================================
method       drafts per step
===========  ================================================================================
greedy       none: one plain target call per token (the baseline)
vanilla      the arg-max of heads 2..h (Stern et al.'s Algorithm 1)
ngram        the p best lattice paths under ``draft + alpha * n-gram``
neural       local rescoring with a small neural LM (the reference paper's Algorithm 2)
oracle       the lattice path with the longest accepted prefix (an upper bound)
auto         per step, the tree of p-best nodes with the most expected tokens per second
headsfree    auto's chooser over the n-gram models' most probable continuations, no heads
heads+ngram  auto over the heads' lattice united with those continuations
===========  ================================================================================

:func:`make_drafter` is the one place that maps a ``DecoderConfig.method`` to its class.
"""

from __future__ import annotations

from typing import Any

from latticekit.bpd.drafters.auto import AutoDrafter
from latticekit.bpd.drafters.base import Draft, Drafter, DraftInput, DraftResources
from latticekit.bpd.drafters.greedy import GreedyDrafter
from latticekit.bpd.drafters.heads_ngram import HeadsNGramDrafter
from latticekit.bpd.drafters.headsfree import HeadsFreeDrafter
from latticekit.bpd.drafters.neural import NeuralDrafter
from latticekit.bpd.drafters.ngram import NGramDrafter, select_lm, uniform_lm
from latticekit.bpd.drafters.oracle import OracleDrafter, oracle_draft
from latticekit.bpd.drafters.vanilla import VanillaDrafter, argmax_draft
from latticekit.bpd.records import DecoderConfig
from latticekit.errors import DecoderConfigError

__all__ = [
    "DRAFTERS",
    "Draft",
    "DraftInput",
    "DraftResources",
    "Drafter",
    "GreedyDrafter",
    "VanillaDrafter",
    "NGramDrafter",
    "NeuralDrafter",
    "OracleDrafter",
    "AutoDrafter",
    "HeadsFreeDrafter",
    "HeadsNGramDrafter",
    "argmax_draft",
    "oracle_draft",
    "drafter_class",
    "make_drafter",
    "select_lm",
    "uniform_lm",
]

#: ``DecoderConfig.method`` -> its strategy.
DRAFTERS: dict[str, type[Drafter]] = {
    cls.method: cls for cls in (GreedyDrafter, VanillaDrafter, NGramDrafter, NeuralDrafter, OracleDrafter,
                                AutoDrafter, HeadsFreeDrafter, HeadsNGramDrafter)
}


def drafter_class(config: DecoderConfig) -> type[Drafter]:
    """The strategy class of ``config.method``."""
    if not isinstance(config, DecoderConfig):
        raise DecoderConfigError(f"config must be a DecoderConfig, got {type(config).__name__}")
    return DRAFTERS[config.method]


def make_drafter(config: DecoderConfig, **resources: Any) -> Drafter:
    """The drafter of ``config``; ``resources`` are :class:`DraftResources` fields.

    Raises:
        DecoderConfigError: not a DecoderConfig, or a resource the strategy needs is missing.
    """
    return drafter_class(config).from_config(config, DraftResources(**resources))
