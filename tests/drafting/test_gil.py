"""The drafting core's C++ calls release the GIL: a heartbeat thread keeps ticking through a
long cache update and a long search."""

from __future__ import annotations

import numpy as np

from gil_probe import assert_releases_gil_on
from latticekit.drafting.cache_model import CacheModel
from latticekit.drafting.continuations import best_continuations


def test_a_cache_update_releases_the_gil() -> None:
    def run(tokens: np.ndarray) -> None:
        CacheModel(None, 1000).cache.extend(tokens, np.full(tokens.size, 1e-3))

    tokens = np.random.default_rng(0).integers(0, 1000, 100_000).astype(np.int32)
    assert_releases_gil_on(run, tokens, lambda t: np.concatenate([t, t]), lambda t: t.size > 20_000_000)


def test_a_search_releases_the_gil() -> None:
    model = CacheModel(None, 4, max_order=2)  # every context followed by every token: continuations galore
    model.sync(np.random.default_rng(1).integers(0, 4, 20_000).astype(np.int32))
    assert_releases_gil_on(lambda p: best_continuations(model, model.ids, p, 12), 20_000, lambda p: 2 * p,
                           lambda p: p > 5_000_000)
