"""``ngram``: the p best lattice paths under ``draft score + alpha * n-gram score``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional, cast

import numpy as np

from latticekit.drafting.protocol import Draft, Drafter, DraftInput, DraftResources
from latticekit.drafting.registry import register
from latticekit.drafting.config import DecoderConfig
from latticekit.errors import DecoderConfigError
from latticekit.ngram import NGramLM
from latticekit.search import pbest

__all__ = ["NGramDrafter", "select_lm", "uniform_lm"]


def uniform_lm() -> NGramLM:
    """A unigram model that scores every token alike: ``ngram`` with it is the "0-gram" p-best."""
    words = ["<unk>", "<s>", "</s>"]
    ids = np.arange(3, dtype=np.int32)
    prob = np.array([-1.0, -99.0, -1.0], dtype=np.float32)
    return NGramLM.from_ngrams(words, [(ids, prob, np.zeros(3, dtype=np.float32))])


def select_lm(config: DecoderConfig, lms: Any) -> NGramLM:
    """The n-gram model ``config`` names among ``lms``.

    Args:
        config: an ``ngram`` decoder.
        lms: an :class:`NGramLM`, a mapping from names (``config.lm``) to models, or None.
            With ``alpha == 0`` no model is needed (:func:`uniform_lm` serves).

    Raises:
        DecoderConfigError: the named model is missing, or none is given with ``alpha > 0``.
    """
    chosen: Optional[NGramLM]
    if isinstance(lms, NGramLM):
        chosen = lms
    elif lms is None:
        chosen = None
    elif not isinstance(lms, Mapping):
        raise DecoderConfigError(f"lms must be an NGramLM or a mapping of them, got {type(lms).__name__}")
    elif config.lm is None and config.alpha == 0:
        chosen = None  # the 0-gram ranks by the heads alone: no model of the mapping is needed
    elif config.lm is None and len(lms) == 1:
        chosen = next(iter(lms.values()))
    elif config.lm not in lms:
        raise DecoderConfigError(f"decoder {config.label!r} names n-gram model {config.lm!r}; "
                                 f"given: {sorted(map(str, lms))}")
    else:
        chosen = lms[config.lm]
    if chosen is None:
        if config.alpha == 0:
            return uniform_lm()
        raise DecoderConfigError(f"decoder {config.label!r} needs an n-gram model (lms=...)")
    if not isinstance(chosen, NGramLM):
        raise DecoderConfigError(f"n-gram models must be NGramLM, got {type(chosen).__name__}")
    return chosen


@register
class NGramDrafter(Drafter):
    """The ``p`` best paths of the top-``k`` lattice, the decoded text as n-gram context, all
    verified in one tree pass. ``p = 1`` is plain rescoring; ``alpha = 0`` the "0-gram" p-best."""

    method = "ngram"
    knobs = frozenset({"k", "p", "alpha", "lm"})

    def __init__(self, config: DecoderConfig, lm: NGramLM) -> None:
        super().__init__(config)
        self.lm = lm

    @classmethod
    def from_config(cls, config: DecoderConfig, resources: DraftResources) -> "NGramDrafter":
        return cls(config, select_lm(config, resources.lms))

    def draft(self, step: DraftInput) -> Draft:
        p = cast(int, self.config.p)  # set by DecoderConfig.__post_init__
        paths = pbest(step.lattice, self.lm, p, self.config.alpha, context=step.context(self.lm.order))
        return Draft.from_paths(path.tokens[1:] for path in paths)
