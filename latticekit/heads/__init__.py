"""Blockwise-parallel draft heads: the modules (:mod:`latticekit.heads.modules`), their layers,
the identity of heads and base models (:mod:`latticekit.heads.fingerprint`), Medusa checkpoints
in and out (:mod:`latticekit.heads.medusa`), and the recipe that trained the shipped heads
(:mod:`latticekit.heads.recipe`, :mod:`latticekit.heads.data`).

Needs torch; ``import latticekit`` does not import it.

Typical use::

    from latticekit.heads import BlockHeads, default_heads

    heads = default_heads(model)            # shipped SmolLM2-135M-Instruct heads, h = 8
    logits = heads(hidden)                  # hidden [..., d] -> logits [..., 8, V]
"""

from latticekit.errors import HeadsFormatError, HeadsMismatchError
from latticekit.heads.fingerprint import heads_fingerprint
from latticekit.heads.modules import DEFAULT_HEADS_PATH, FIRST_HEADS_PATH, BlockHeads, default_heads
from latticekit.heads.protocol import DraftHeads

__all__ = [
    "BlockHeads",
    "DraftHeads",
    "default_heads",
    "heads_fingerprint",
    "HeadsFormatError",
    "HeadsMismatchError",
    "DEFAULT_HEADS_PATH",
    "FIRST_HEADS_PATH",
]
