"""Acceptance rules: which draft tokens the target model accepts, and which token it adds.

Every rule is lossless: the tokens it emits are distributed exactly as if the target model had
produced them alone (greedy: they *are* the target's arg-max tokens).

* :func:`greedy_accept` -- tree of drafts, greedy decoding.
* :func:`tree_sampling_accept` -- tree of deterministic drafts (e.g. p-best paths), sampling.
* :func:`token_verify` -- one sampled draft, token verification (Leviathan et al., 2023).
* :func:`block_verify` -- one sampled draft, block verification (Sun et al., 2024), which is
  optimal among valid verifiers and never accepts fewer tokens than token verification in
  expectation.

The two single-draft rules are split into a *plan* (the exact acceptance probabilities and
residual distributions, :func:`token_verification_plan` / :func:`block_verification_plan`) and
a sampler that follows the plan, so tests can enumerate the plan exactly.

Probabilities are float64 throughout. Random draws use a CPU ``torch.Generator``; rows of
probabilities are moved to the CPU one at a time, only when a draw needs them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, NamedTuple, Optional

import torch

from latticekit.errors import DraftError
from latticekit.torch.tree import ROOT, DraftTree

if TYPE_CHECKING:
    from _typeshed import SupportsGetItem

__all__ = [
    "AcceptedPath",
    "VerificationPlan",
    "target_probs",
    "greedy_accept",
    "tree_sampling_accept",
    "token_verification_plan",
    "block_verification_plan",
    "token_verify",
    "block_verify",
]


class AcceptedPath(NamedTuple):
    """What a rule decided.

    Attributes:
        nodes: the accepted nodes, root's child first (empty when nothing was accepted).
        bonus_token: the token the target adds after the accepted nodes.
    """

    nodes: list[int]
    bonus_token: int


class VerificationPlan(NamedTuple):
    """Exact decision quantities of a single-draft rule, for a draft of g tokens.

    Attributes:
        accept_probs (`torch.Tensor` of shape `(g,)`, float64): token verification: probability
            of accepting token i given tokens before it were accepted; block verification: the
            probability h_i of accepting the sub-block x_1..x_i (all g decided independently,
            tau = the largest accepted i).
        residuals (`torch.Tensor` of shape `(g + 1, vocab)`, float64): ``residuals[tau]`` is
            the distribution of the emitted token when exactly tau draft tokens are accepted
            (``residuals[g]`` is the target's distribution after the whole draft).
    """

    accept_probs: torch.Tensor
    residuals: torch.Tensor


def target_probs(logits: torch.Tensor, temperature: float = 1.0, top_p: float = 1.0) -> torch.Tensor:
    """The target's sampling distribution: temperature, then nucleus (top-p) truncation.

    Args:
        logits (`torch.Tensor` of shape `(..., vocab)`): raw logits.
        temperature: > 0; logits are divided by it.
        top_p: in (0, 1]; keeps the smallest set of most likely tokens whose mass reaches
            ``top_p`` (always at least the most likely token) and renormalises.

    Returns:
        `torch.Tensor` of shape `(..., vocab)`, float64, rows summing to 1.

    Raises:
        ValueError: temperature <= 0 or top_p outside (0, 1].
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 for sampling, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    probs = torch.softmax(logits.to(torch.float64) / temperature, dim=-1)
    if top_p < 1:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def _draw(probs: torch.Tensor, generator: Optional[torch.Generator]) -> int:
    """One token from a 1-D distribution, drawn on the CPU."""
    return int(torch.multinomial(probs.to("cpu", torch.float64), 1, generator=generator))


def _uniform(generator: Optional[torch.Generator]) -> float:
    return float(torch.rand((), dtype=torch.float64, generator=generator))


def _normalised_positive_part(diff: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """norm(max(diff, 0)) per row; rows with no positive mass get ``fallback``.

    Such rows are reached with probability 0 by both rules (see the plan docstrings); the
    fallback only keeps the plan finite.
    """
    pos = diff.clamp_min(0.0)
    mass = pos.sum(dim=-1, keepdim=True)
    return torch.where(mass > 0, pos / mass.clamp_min(torch.finfo(pos.dtype).tiny), fallback)


def greedy_accept(tree: DraftTree, argmax_tokens: SupportsGetItem[int, int]) -> AcceptedPath:
    """Greedy rule on a tree: the longest path whose tokens are the target's arg-max.

    Args:
        tree: the drafts.
        argmax_tokens: ``num_nodes + 1`` ids: the target's arg-max at the root (index 0) and at
            each node (index ``i + 1`` for node ``i``); anything indexable works, and only the
            rows on the accepted path and the bonus row are read.

    Returns:
        The accepted path and the arg-max at its last node (the bonus token).
    """
    nodes: list[int] = []
    node = ROOT
    while True:
        nxt = tree.child(node, argmax_tokens[node + 1])
        if nxt is None:
            return AcceptedPath(nodes, int(argmax_tokens[node + 1]))
        nodes.append(nxt)
        node = nxt


def tree_sampling_accept(
    tree: DraftTree,
    probs_at: Callable[[int], torch.Tensor],
    generator: Optional[torch.Generator] = None,
) -> AcceptedPath:
    """Sampling rule for deterministic drafts: sample at a node, descend if the sample is a child.

    The drafts must not depend on the target's random draws (p-best paths do not). Each emitted
    token is then a sample of the target's distribution given the tokens before it.

    Args:
        tree: the drafts.
        probs_at: maps a row (0 = root, ``i + 1`` = node ``i``) to the target's (adjusted)
            distribution there, `torch.Tensor` of shape `(vocab,)`.
        generator: CPU random generator.

    Returns:
        The accepted path and the sample that left the tree (the bonus token).
    """
    nodes: list[int] = []
    node = ROOT
    while True:
        y = _draw(probs_at(node + 1), generator)
        nxt = tree.child(node, y)
        if nxt is None:
            return AcceptedPath(nodes, y)
        nodes.append(nxt)
        node = nxt


def _check_single_draft(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
    """Validates shapes and returns q_i(x_i), shape (g,)."""
    g = draft.shape[0]
    if draft.dim() != 1 or g == 0:
        raise DraftError(f"a single draft of >= 1 token is needed, got shape {tuple(draft.shape)}")
    if q.shape != (g, p.shape[-1]) or p.shape[0] != g + 1:
        raise DraftError(
            f"need target probs (g + 1, vocab) and draft probs (g, vocab) for g = {g}, "
            f"got {tuple(p.shape)} and {tuple(q.shape)}"
        )
    q_x = q.gather(1, draft[:, None]).squeeze(1)
    if bool((q_x <= 0).any()):
        raise DraftError("a draft token has zero probability under its draft distribution")
    return q_x


def token_verification_plan(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor) -> VerificationPlan:
    """Exact quantities of token verification (Leviathan et al.).

    Accept x_i with probability min(1, p_i(x_i) / q_i(x_i)) while all earlier tokens were
    accepted; on the first rejection at i emit a sample of norm(max(p_i - q_i, 0)); when all g
    are accepted emit a sample of p_{g+1}.

    Args:
        p (`torch.Tensor` of shape `(g + 1, vocab)`): target distributions p_1..p_{g+1}.
        q (`torch.Tensor` of shape `(g, vocab)`): draft distributions q_1..q_g.
        draft (`torch.LongTensor` of shape `(g,)`): the draft x_1..x_g, x_i drawn from q_i.

    Returns:
        The plan; ``accept_probs[i]`` is the conditional acceptance probability of x_{i+1}.

    Raises:
        DraftError: shapes disagree, or q_i(x_i) == 0.
    """
    p, q = p.to(torch.float64), q.to(torch.float64)
    q_x = _check_single_draft(p, q, draft)
    p_x = p[:-1].gather(1, draft[:, None]).squeeze(1)
    accept = torch.clamp(p_x / q_x, max=1.0)
    residuals = torch.cat([_normalised_positive_part(p[:-1] - q, p[:-1]), p[-1:]])
    return VerificationPlan(accept, residuals)


def block_verification_plan(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor) -> VerificationPlan:
    """Exact quantities of block verification (Sun et al., "Block Verification Accelerates
    Speculative Decoding").

    ::

        w_0 = 1
        w_i = min(1, w_{i-1} p_i(x_i) / q_i(x_i))
        h_i = r_i / (r_i + 1 - w_i),  r_i = sum_y max(w_i p_{i+1}(y) - q_{i+1}(y), 0)   (i < g)
        h_g = w_g
        residual at tau < g: norm(max(w_tau p_{tau+1} - q_{tau+1}, 0));  at tau = g: p_{g+1}

    When ``r_i + 1 - w_i == 0`` (so w_i = 1 and r_i = 0) h_i is 1, its limit. A residual with
    no positive mass is reached with probability 0 (its tau has probability 0).

    Args:
        p (`torch.Tensor` of shape `(g + 1, vocab)`): target distributions p_1..p_{g+1}.
        q (`torch.Tensor` of shape `(g, vocab)`): draft distributions q_1..q_g.
        draft (`torch.LongTensor` of shape `(g,)`): the draft x_1..x_g, x_i drawn from q_i.

    Returns:
        The plan; ``accept_probs[i - 1]`` is h_i.

    Raises:
        DraftError: shapes disagree, or q_i(x_i) == 0.
    """
    p, q = p.to(torch.float64), q.to(torch.float64)
    q_x = _check_single_draft(p, q, draft)
    g = draft.shape[0]
    ratios = (p[:-1].gather(1, draft[:, None]).squeeze(1) / q_x).tolist()
    weights = [1.0]
    for ratio in ratios:
        weights.append(min(1.0, weights[-1] * ratio))
    w = torch.tensor(weights, dtype=torch.float64, device=p.device)  # w_0..w_g
    # Rows tau = 0..g-1 of w_tau p_{tau+1} - q_{tau+1}; their positive parts give r and residuals.
    diff = w[:-1, None] * p[:-1] - q
    pos_mass = diff.clamp_min(0.0).sum(dim=-1)  # pos_mass[i] = r_i for i = 1..g-1
    accept = torch.empty(g, dtype=torch.float64, device=p.device)
    for i in range(1, g):
        r = float(pos_mass[i])
        denominator = r + 1.0 - weights[i]
        accept[i - 1] = r / denominator if denominator > 0 else 1.0
    accept[g - 1] = weights[g]
    residuals = torch.cat([_normalised_positive_part(diff, p[:-1]), p[-1:]])
    return VerificationPlan(accept, residuals)


def _follow_plan(plan: VerificationPlan, sequential: bool, generator: Optional[torch.Generator]) -> tuple[int, int]:
    """Draws (tau, y) from a plan: tau = accepted count, y ~ residuals[tau].

    ``sequential``: token verification (stop at the first rejection); otherwise block
    verification (each sub-block decided independently, tau = the largest accepted).
    """
    accept = plan.accept_probs.cpu()
    u = torch.rand(accept.shape, dtype=torch.float64, generator=generator)
    if sequential:
        rejected = torch.nonzero(u >= accept)
        tau = int(rejected[0]) if rejected.numel() else accept.shape[0]
    else:
        accepted = torch.nonzero(u < accept)
        tau = int(accepted[-1]) + 1 if accepted.numel() else 0
    return tau, _draw(plan.residuals[tau], generator)


def token_verify(
    p: torch.Tensor,
    q: torch.Tensor,
    draft: torch.Tensor,
    generator: Optional[torch.Generator] = None,
) -> tuple[int, int]:
    """Runs token verification on one sampled draft.

    Args:
        p (`torch.Tensor` of shape `(g + 1, vocab)`): target distributions p_1..p_{g+1}.
        q (`torch.Tensor` of shape `(g, vocab)`): draft distributions q_1..q_g.
        draft (`torch.LongTensor` of shape `(g,)`): the draft.
        generator: CPU random generator.

    Returns:
        ``(tau, y)``: the number of accepted draft tokens and the emitted token after them.

    Raises:
        DraftError: shapes disagree, or q_i(x_i) == 0.
    """
    return _follow_plan(token_verification_plan(p, q, draft), True, generator)


def block_verify(
    p: torch.Tensor,
    q: torch.Tensor,
    draft: torch.Tensor,
    generator: Optional[torch.Generator] = None,
) -> tuple[int, int]:
    """Runs block verification on one sampled draft.

    Args:
        p (`torch.Tensor` of shape `(g + 1, vocab)`): target distributions p_1..p_{g+1}.
        q (`torch.Tensor` of shape `(g, vocab)`): draft distributions q_1..q_g.
        draft (`torch.LongTensor` of shape `(g,)`): the draft.
        generator: CPU random generator.

    Returns:
        ``(tau, y)``: the number of accepted draft tokens and the emitted token after them.

    Raises:
        DraftError: shapes disagree, or q_i(x_i) == 0.
    """
    return _follow_plan(block_verification_plan(p, q, draft), False, generator)
