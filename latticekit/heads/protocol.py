"""What the decoding loop, the lattice sources and the evaluation ask of draft heads.

:class:`~latticekit.heads.BlockHeads` follows it; so may any module of the user's. Only the
call is required; the optional attributes (``num_heads``, ``token_conditioned``, and the
``head_states`` / ``lm_head`` pair that lets a lattice project a candidate vocabulary alone)
are read with ``getattr`` where they exist.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["DraftHeads", "CountedHeads", "ProjectedHeads"]


@runtime_checkable
class DraftHeads(Protocol):
    """Draft heads: the target's final hidden state in, every head's logits out.

    ``heads(hidden (..., d)) -> logits (..., h, vocab)``, row 0 the target's own next-token
    logits; heads that read the token at t + 1 (``token_conditioned``) take it as
    ``next_token=``. ``state_dict()`` identifies them (:func:`latticekit.heads.heads_fingerprint`).
    """

    def __call__(self, hidden: "Tensor", *args: Any, **kwargs: Any) -> "Tensor": ...

    def state_dict(self, *args: Any, **kwargs: Any) -> Any: ...


class CountedHeads(DraftHeads, Protocol):
    """Draft heads that state their number h (``num_heads``, the target's own head counted):
    what the evaluation reads to know how far past a prompt its references and traces reach."""

    num_heads: int


class ProjectedHeads(DraftHeads, Protocol):
    """Draft heads whose logits are their ``head_states`` projected by one shared ``lm_head``
    (:class:`~latticekit.heads.BlockHeads` without projections of their own or a logit scale):
    what :class:`~latticekit.decoding.lattices.CandidateLattice` reads to project a candidate
    vocabulary alone (:meth:`~latticekit.decoding.lattices.CandidateLattice.supports` checks it).
    """

    lm_head: Any  # the output projection: a module with a `(vocab, hidden)` weight

    # `(..., h, hidden)` for `hidden` `(..., hidden)`; heads whose method takes a `depth` keyword
    # compute heads 1..depth + 1 alone when a lattice needs no more (BlockHeads.head_states)
    def head_states(self, hidden: "Tensor", *args: Any, **kwargs: Any) -> "Tensor": ...
