"""The built-in drafting strategies, one module each; importing this package registers them.

===========  ================================================================================
method       drafts per step
===========  ================================================================================
greedy       none: one plain target call per token (the baseline)
vanilla      the arg-max of heads 2..h (Stern et al.'s Algorithm 1)
ngram        the p best lattice paths under ``draft + alpha * n-gram``
oracle       the lattice path with the longest accepted prefix (an upper bound)
auto         per step, the tree with the most expected tokens per second from every source
             available (the text's continuations, the heads' lattice united with them), the
             sources read chosen by their outcomes (the default of ``generate``)
headsfree    auto's chooser over the n-gram models' most probable continuations, no heads
heads+ngram  auto's chooser over the heads' lattice united with those continuations, always
heads        auto's chooser over the p best paths of the heads' lattice alone
===========  ================================================================================

``neural`` (local rescoring with a small neural LM) registers with the evaluation harness,
where its rescorer lives (:mod:`latticekit.eval.neural`).
"""

from latticekit.drafting.drafters.auto import AutoDrafter, choose_nodes, lm_candidates
from latticekit.drafting.drafters.greedy import GreedyDrafter
from latticekit.drafting.drafters.heads_ngram import HeadsDrafter, HeadsNGramDrafter
from latticekit.drafting.drafters.headsfree import HeadsFreeDrafter
from latticekit.drafting.drafters.ngram import NGramDrafter, select_lm, uniform_lm
from latticekit.drafting.drafters.oracle import OracleDrafter, oracle_draft
from latticekit.drafting.drafters.vanilla import VanillaDrafter, argmax_draft

__all__ = [
    "AutoDrafter",
    "GreedyDrafter",
    "HeadsDrafter",
    "HeadsFreeDrafter",
    "HeadsNGramDrafter",
    "NGramDrafter",
    "OracleDrafter",
    "VanillaDrafter",
    "argmax_draft",
    "choose_nodes",
    "lm_candidates",
    "oracle_draft",
    "select_lm",
    "uniform_lm",
]
