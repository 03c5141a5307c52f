"""One candidate tree from two sources: the heads' lattice and the text's own continuations.

Draft heads miss what only the text knows (the name defined three lines up, the function the
answer is copying); the text's n-grams miss what it has not said yet. :func:`united_candidates`
merges the p best paths of the heads' lattice, searched under ``draft + alpha * n-gram``
(latticekit's exact search), with the most probable continuations of the text under the n-gram
cache model (:func:`~latticekit.drafting.continuations.best_continuations`) into one trie, and
gives every node the features the acceptance estimates read (:func:`~latticekit.drafting.calibration.node_features`):
its head, n-gram and cache-model log-probabilities. ``heads+ngram`` in latticekit's own loop and
the lattice proposer inside vLLM both draft from it.

Python, numpy and the C++ core (the trie: ``UniteLatticePaths``, ``csrc/latticekit/continuations.h``);
nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import numpy as np

from latticekit import _core
from latticekit.drafting.cache_model import CacheModel
from latticekit.drafting.calibration import SOURCES, CandidateTree
from latticekit.drafting.continuations import Continuations
from latticekit.lattice import SausageLattice
from latticekit.ngram import NGramLM
from latticekit.search import pbest

__all__ = ["united_candidates"]


def united_candidates(model: CacheModel, ids: Sequence[int], found: Continuations, lattice: SausageLattice,
                      search_lm: NGramLM, p: int, alpha: float, lm: Optional[NGramLM],
                      found_sources: Optional[Sequence[int]] = None) -> CandidateTree:
    """The p best paths of ``lattice`` and the continuations ``found``, merged into one trie.

    Args:
        model: the cache model ``found`` was drafted from (it scores the lattice's paths).
        ids: the text, its last token the lattice's root (position 1).
        found: the text's continuations (``best_continuations(model, ids, ...)``).
        lattice: the heads' lattice, `(h, k)`, row 0 the root alone.
        search_lm: the n-gram model the search rescores with (a uniform one without a model).
        p: lattice paths searched.
        alpha: the n-gram weight of the search.
        lm: the static n-gram model, or None (no n-gram feature).
        found_sources: the sources of each node of ``found`` (bits of
            :data:`~latticekit.drafting.calibration.SOURCES`; default the text's).

    Returns:
        The trie, lattice paths first, with each node's head, n-gram and cache log-probabilities
        and its sources (the heads' paths, the text's continuations).
        A node the heads cannot score (a continuation off the lattice, or past its reach) takes
        the cache model's word in the head's place: an absent feature would pull its estimate
        to 1/2.
    """
    context = ids[max(0, len(ids) - search_lm.order): -1]
    paths = pbest(lattice, search_lm, p, alpha, context=context)
    # the paths' tokens below the root: every path runs through each of the lattice's positions
    drafts = np.array([path.tokens[1:] for path in paths], dtype=np.int32).reshape(len(paths), lattice.h - 1)
    sources = np.full(found.size, SOURCES["text"], dtype=np.int64) if found_sources is None \
        else np.asarray(found_sources, dtype=np.int64).reshape(-1)
    # the trie, its sources and head scores (a node at depth d is the lattice's position d, 0 the
    # root: NaN off it, or past its reach) in the C++ core; tests/drafting/test_union.py checks it
    # against CandidateTree.from_paths and SausageLattice.arc_scores
    tokens, parents, depths, sources, head = _core.unite_lattice_paths(
        drafts, SOURCES["heads"], np.ascontiguousarray(found.tokens, dtype=np.int64),
        np.ascontiguousarray(found.parents, dtype=np.int64), sources, lattice.tokens, lattice.scores,
        lattice.widths)
    # every node's conditionals in one call of the core: at the continuations' nodes exactly the
    # search's own (tests/drafting/test_drafting_reference.py)
    cache, ngram = model.trie_conditionals(ids, parents, tokens)
    if lm is None:
        ngram[:] = np.nan
    missing = np.isnan(head)
    head[missing] = cache[missing]
    return CandidateTree(tokens, parents, depths, head, ngram, cache, sources)
