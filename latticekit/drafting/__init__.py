"""The drafting core: token ids (and, where heads exist, their lattices) in, a draft tree out.

It imports neither torch nor a decoding loop, so any loop can drive it: latticekit's own
(:mod:`latticekit.decoding`), the evaluation's replay of greedy traces (:mod:`latticekit.eval`),
or an inference engine's, one drafter per request.

* :class:`Drafter`, :class:`DraftInput`, :class:`Draft`: the protocol (:mod:`~latticekit.drafting.protocol`)
  and its result (:mod:`~latticekit.drafting.tree`);
* :func:`register`, :func:`methods`, :func:`make_drafter`: the one table of strategies
  (:mod:`~latticekit.drafting.registry`); :class:`DecoderConfig` validates through it;
* the built-in strategies (:mod:`latticekit.drafting.drafters`), registered on import;
* what they draw on: the n-gram cache model and its successors (:mod:`~latticekit.drafting.cache_model`,
  :mod:`~latticekit.drafting.successors`), its most probable continuations
  (:mod:`~latticekit.drafting.continuations`), acceptance estimates
  (:mod:`~latticekit.drafting.calibration`), step costs (:mod:`~latticekit.drafting.costs`) and
  the tree chooser (:func:`choose_nodes`).
"""

from latticekit.drafting.config import DecoderConfig
from latticekit.drafting.costs import StepCosts
from latticekit.drafting.protocol import DraftInput, Drafter, DraftResources, drafter_class, make_drafter
from latticekit.drafting.registry import lookup, methods, register, unregister
from latticekit.drafting.tree import Draft
from latticekit.drafting.calibration import AcceptanceModel, CandidateTree
from latticekit.drafting.cache_model import CacheModel
from latticekit.drafting.drafters import (
    AutoDrafter,
    GreedyDrafter,
    HeadsFreeDrafter,
    HeadsNGramDrafter,
    NGramDrafter,
    OracleDrafter,
    VanillaDrafter,
    argmax_draft,
    choose_nodes,
    oracle_draft,
    select_lm,
    uniform_lm,
)

__all__ = [
    "AcceptanceModel",
    "AutoDrafter",
    "CacheModel",
    "CandidateTree",
    "DecoderConfig",
    "Draft",
    "DraftInput",
    "DraftResources",
    "Drafter",
    "GreedyDrafter",
    "HeadsFreeDrafter",
    "HeadsNGramDrafter",
    "NGramDrafter",
    "OracleDrafter",
    "StepCosts",
    "VanillaDrafter",
    "argmax_draft",
    "choose_nodes",
    "drafter_class",
    "lookup",
    "make_drafter",
    "methods",
    "oracle_draft",
    "register",
    "select_lm",
    "unregister",
    "uniform_lm",
]
