"""Verify a tree of drafts with one forward pass of the target model, then commit its KV cache.

The invariant between steps: for a sequence ``prefix_ids`` of length L, the cache holds the
key/values of ``prefix_ids[:-1]``; the last token (the previous step's bonus token, or the
last prompt token) is fed as the tree's root together with all draft nodes in one pass::

    cache: x_0 .. x_{L-2}  |  input: x_{L-1} (root), node_0, ..., node_{N-1}
    positions:               L-1, L + depth(node_i)
    mask: root sees the cache and itself; node i sees the cache, the root, its ancestors, itself

After acceptance the cache keeps ``x_0 .. x_{L-1}`` and the accepted nodes, so the new
sequence ``prefix_ids + accepted + [bonus]`` satisfies the invariant again.

Models with sliding-window or chunked layers (``latticekit.torch.windows``) get one mask per
layer type, each over the positions its layers hold and restricted to their window; their
sliding-window cache layers keep the whole tree during the pass and are trimmed at the commit.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Literal, Optional, Union

import numpy as np
import torch

from latticekit.errors import CacheError, DeviceMismatchError, DraftError, VocabularyError
from latticekit.torch.acceptance import (
    AcceptedPath,
    block_verify,
    greedy_accept,
    target_probs,
    token_verify,
    tree_sampling_accept,
)
from latticekit.torch.cache import cache_length, commit_accepted, keeping_tree_rows
from latticekit.torch.logits import ArgmaxRows, TreeLogits, first_block_rows
from latticekit.torch.target import HEAD_IS_LAST_STEP, Target
from latticekit.torch.tree import ROOT, DraftTree, mask_from_visibility
from latticekit.torch.windows import LayerWindow, Masks, prefill_masks, tree_pass_masks

__all__ = [
    "AcceptanceRule",
    "VerifyResult",
    "TreeOutputs",
    "verify",
    "tree_forward",
    "tree_pass_inputs",
    "prefill",
    "new_cache",
]

#: ``"greedy"``: arg-max path through the tree. ``"sampling"``: sample at each node, descend
#: while the sample is a child (deterministic drafts, any tree). ``"token"`` / ``"block"``:
#: token / block verification of one draft sampled from ``draft_probs``.
AcceptanceRule = Literal["greedy", "sampling", "token", "block"]

_RULES = ("greedy", "sampling", "token", "block")
@dataclass
class VerifyResult:
    """Outcome of one verification step.

    Attributes:
        accepted_tokens (`torch.LongTensor` of shape `(num_accepted,)`): accepted draft tokens.
        bonus_token: the token the target adds after them (always emitted).
        accepted_nodes: tree nodes of the accepted tokens, root's child first.
        accepted_drafts (`np.ndarray` of shape `(k,)`): drafts that contain the accepted path.
        logits (`torch.Tensor` of shape `(vocab,)`): the target's raw logits at the last
            accepted node (at the root when nothing was accepted): the distribution the bonus
            token came from.
        hidden_state (`torch.Tensor` of shape `(hidden,)`): the target's final hidden state at
            that node, for draft heads to propose the next lattice from the same pass.
        projected_rows: rows of the pass (root and nodes) whose logits were computed: all
            ``num_nodes + 1`` when the model cannot project rows apart (see
            ``latticekit.torch.logits``), else the root, draft 0 and the subtree the walk moved to.
    """

    accepted_tokens: torch.Tensor
    bonus_token: int
    accepted_nodes: list[int]
    accepted_drafts: np.ndarray
    logits: torch.Tensor
    hidden_state: torch.Tensor
    projected_rows: int

    @property
    def num_accepted(self) -> int:
        """Number of accepted draft tokens (the bonus token not counted)."""
        return len(self.accepted_nodes)

    @property
    def emitted_tokens(self) -> torch.Tensor:
        """Accepted tokens followed by the bonus token, `(num_accepted + 1,)`."""
        bonus = torch.tensor([self.bonus_token], dtype=torch.long, device=self.accepted_tokens.device)
        return torch.cat([self.accepted_tokens, bonus])


def _as_prefix(prefix_ids: Union[torch.Tensor, Sequence[int]], target: Target) -> torch.Tensor:
    if not isinstance(prefix_ids, torch.Tensor):
        prefix_ids = torch.tensor(list(prefix_ids), dtype=torch.long, device=target.device)
    if prefix_ids.dim() == 2 and prefix_ids.shape[0] == 1:
        prefix_ids = prefix_ids[0]
    if prefix_ids.dim() != 1 or prefix_ids.shape[0] == 0:
        raise DraftError(f"prefix_ids must be a non-empty 1-D id tensor, got shape {tuple(prefix_ids.shape)}")
    if prefix_ids.is_floating_point() or prefix_ids.dtype == torch.bool:
        raise DraftError(f"prefix_ids must hold integer ids, got {prefix_ids.dtype}")
    if prefix_ids.device != target.device:
        raise DeviceMismatchError(f"prefix_ids live on {prefix_ids.device}, the model on {target.device}")
    return prefix_ids.long()


def new_cache(model: Any) -> Any:
    """An empty cache of the kind ``model`` needs (``DynamicCache`` or :class:`KVCache`).

    Raises:
        UnsupportedModelError: the model is neither an HF causal LM nor a protocol module.
    """
    return Target(model).new_cache()


@torch.no_grad()
def prefill(model: Any, prefix_ids: Union[torch.Tensor, Sequence[int]], past_key_values: Any = None) -> Any:
    """Brings a cache up to the verify invariant: it holds all of ``prefix_ids`` but the last.

    Args:
        model: HF causal LM or a module following ``latticekit.torch.protocol``.
        prefix_ids (`torch.LongTensor` of shape `(L,)`): the prompt.
        past_key_values: a cache already holding a prefix of ``prefix_ids[:-1]``; a new one
            when None.

    Returns:
        The cache, holding ``L - 1`` positions.

    Raises:
        CacheError: the given cache already holds more than ``L - 1`` positions.
        DeviceMismatchError / VocabularyError / DraftError: bad ``prefix_ids``.
    """
    target = Target(model)
    ids = _as_prefix(prefix_ids, target)
    _check_vocab(ids, target.vocab_size, "prefix_ids")
    cache = target.new_cache() if past_key_values is None else past_key_values
    target.check_cache(cache)
    held, todo = cache_length(cache), ids.shape[0] - 1
    if held > todo:
        raise CacheError(f"the cache holds {held} positions, more than the {todo} to prefill")
    if held < todo:
        n = todo - held
        windows = target.attention_windows(cache)
        mask: Masks
        if windows is None:
            visible = np.concatenate([np.ones((n, held), dtype=bool), np.tri(n, dtype=bool)], axis=1)
            mask = mask_from_visibility(visible, target.mask_dtype, target.device)
        else:
            mask = prefill_masks(held, todo, windows, target.mask_dtype, target.device)
        positions = torch.arange(held, todo, device=target.device)[None]
        target.forward(ids[None, held:todo], positions, mask, cache)
    return cache


def _check_vocab(ids: torch.Tensor, vocab_size: int, what: str) -> None:
    outside = (ids < 0) | (ids >= vocab_size)
    if bool(outside.any()):  # one device sync; the offending id is looked up only on failure
        bad = int(ids[outside][0])
        raise VocabularyError(f"{what} holds id {bad}, outside the model's vocabulary 0..{vocab_size - 1}")


@dataclass
class TreeOutputs:
    """The target's outputs for one tree pass; row 0 is the root, row ``i + 1`` is node ``i``.

    Attributes:
        logits (`torch.Tensor` of shape `(num_nodes + 1, vocab)`): raw logits per row.
        hidden_states (`torch.Tensor` of shape `(num_nodes + 1, hidden)`): final hidden state
            per row (the input of the output projection).
        node_tokens (`torch.LongTensor` of shape `(num_nodes,)`): the tree's tokens on the
            model's device.
    """

    logits: torch.Tensor
    hidden_states: torch.Tensor
    node_tokens: torch.Tensor


def _check_rule_inputs(
    rule: str,
    tree: DraftTree,
    draft_probs: Optional[torch.Tensor],
    target: Target,
    temperature: float,
    top_p: float,
) -> None:
    """Everything the rule needs is checked before the pass, so a bad argument never leaves
    uncommitted tree nodes in the cache."""
    if rule not in _RULES:
        raise DraftError(f"unknown acceptance rule {rule!r}; expected one of {_RULES}")
    if rule == "greedy":
        return
    if not temperature > 0 or not 0 < top_p <= 1:
        raise ValueError(f"sampling needs temperature > 0 and top_p in (0, 1], got {temperature}, {top_p}")
    if rule == "sampling":
        return
    if not tree.is_chain:
        raise DraftError(
            f"rule {rule!r} verifies a single draft; the tree branches ({tree.num_nodes} nodes)"
        )
    expected = (tree.num_nodes, target.vocab_size)
    if draft_probs is None or tuple(draft_probs.shape) != expected:
        got = None if draft_probs is None else tuple(draft_probs.shape)
        raise DraftError(f"rule {rule!r} needs draft_probs of shape {expected}, got {got}")
    if draft_probs.device != target.device:
        raise DeviceMismatchError(f"draft_probs live on {draft_probs.device}, the model on {target.device}")


def tree_pass_inputs(
    tree: DraftTree,
    prefix_ids: torch.Tensor,
    node_tokens: torch.Tensor,
    mask_dtype: torch.dtype,
    windows: Optional[Sequence[LayerWindow]] = None,
) -> tuple[torch.Tensor, torch.Tensor, Masks]:
    """The inputs of one tree pass: the root ``prefix_ids[-1]`` followed by every node.

    Args:
        tree: the drafts.
        prefix_ids (`torch.LongTensor` of shape `(L,)`): the sequence; the cache holds all but
            its last token.
        node_tokens (`torch.LongTensor` of shape `(num_nodes,)`): ``tree.tokens`` on the device.
        mask_dtype: ``torch.bool`` or a floating dtype (additive mask).
        windows: the model's layer types when they are not all full attention
            (:meth:`Target.attention_windows`); None: one mask over the whole sequence.

    Returns:
        ``input_ids`` and ``position_ids`` of shape `(1, num_nodes + 1)`, and the attention mask
        of shape `(1, 1, num_nodes + 1, L + num_nodes)`: the root sees the cache and itself,
        node i the cache, the root, its ancestors and itself. With ``windows``, the mask of
        each layer type instead (:func:`latticekit.torch.windows.tree_pass_masks`).
    """
    prefix_len, device = prefix_ids.shape[0], node_tokens.device
    mask: Masks
    if windows is None:
        mask = tree.pass_mask(prefix_len, mask_dtype, device)
    else:
        mask = tree_pass_masks(tree, prefix_len, windows, mask_dtype, device)
    _, offsets = tree.pass_arrays(device)
    input_ids = torch.cat([prefix_ids[-1:], node_tokens])[None]
    position_ids = (offsets + prefix_len)[None]
    return input_ids, position_ids, mask


def _prepare(
    model: Any, prefix_ids: Union[torch.Tensor, Sequence[int]], tree: DraftTree
) -> tuple[Target, torch.Tensor]:
    """Validates the model, the prefix and the tree's type; returns the target and the prefix."""
    if not isinstance(tree, DraftTree):
        raise DraftError(f"tree must be a DraftTree (see DraftTree.from_drafts), got {type(tree).__name__}")
    target = Target(model)
    ids = _as_prefix(prefix_ids, target)
    _check_vocab(ids, target.vocab_size, "prefix_ids")
    return target, ids


def _checked_pass_inputs(
    target: Target, past_key_values: Any, ids: torch.Tensor, tree: DraftTree
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Masks, bool]:
    """Validates the tree and the cache; returns the node tokens, input ids, positions, mask and
    whether the model has windowed layers (the pass then runs inside ``keeping_tree_rows``)."""
    if int(tree.tokens.max()) >= target.vocab_size:  # ids are >= 0 by construction
        raise VocabularyError(
            f"the drafts hold id {int(tree.tokens.max())}, outside the model's vocabulary "
            f"0..{target.vocab_size - 1}"
        )
    node_tokens, _ = tree.pass_arrays(target.device)
    target.check_cache(past_key_values)
    prefix_len = ids.shape[0]
    held = cache_length(past_key_values)
    if held != prefix_len - 1:
        hint = "run prefill() first" if held < prefix_len - 1 else "it holds tokens beyond the prefix"
        raise CacheError(
            f"the cache holds {held} positions but a prefix of {prefix_len} tokens needs exactly "
            f"{prefix_len - 1} (all but the last token); {hint}"
        )
    windows = target.attention_windows(past_key_values)
    input_ids, positions, mask = tree_pass_inputs(tree, ids, node_tokens, target.mask_dtype, windows)
    return node_tokens, input_ids, positions, mask, windows is not None


def _tree_forward(target: Target, past_key_values: Any, ids: torch.Tensor, tree: DraftTree) -> TreeOutputs:
    """Validated inputs -> one pass of root + nodes, logits of every row; the cache gains
    ``num_nodes + 1`` positions."""
    node_tokens, input_ids, positions, mask, windowed = _checked_pass_inputs(target, past_key_values, ids, tree)
    with keeping_tree_rows(past_key_values, tree.num_nodes + 1) if windowed else nullcontext():
        logits, hidden = target.forward(input_ids, positions, mask, past_key_values)
    return TreeOutputs(logits, hidden, node_tokens)


def _tree_logits(
    target: Target, past_key_values: Any, ids: torch.Tensor, tree: DraftTree
) -> tuple[TreeLogits, torch.Tensor]:
    """Validated inputs -> one pass of root + nodes whose output projection covers the root and
    draft 0 only, the rest left to :class:`TreeLogits` (every row when the target cannot
    project rows apart or the tree is small, see :func:`first_block_rows`). Returns the logits
    and the node tokens on the device."""
    node_tokens, input_ids, positions, mask, windowed = _checked_pass_inputs(target, past_key_values, ids, tree)
    rows = first_block_rows(tree) if target.projects_rows else None
    with keeping_tree_rows(past_key_values, tree.num_nodes + 1) if windowed else nullcontext():
        if rows is not None:
            logits, hidden = target.forward_rows(input_ids, positions, mask, past_key_values, rows)
            return TreeLogits(tree, hidden, target.project, rows, logits), node_tokens
        if target.is_hf and target.body is not None and target.model not in HEAD_IS_LAST_STEP:
            logits, hidden = target.forward_probing_head(input_ids, positions, mask, past_key_values)
        else:
            logits, hidden = target.forward(input_ids, positions, mask, past_key_values)
    return TreeLogits.complete(tree, hidden, logits), node_tokens


@torch.no_grad()
def tree_forward(
    model: Any,
    past_key_values: Any,
    prefix_ids: Union[torch.Tensor, Sequence[int]],
    tree: DraftTree,
) -> TreeOutputs:
    """Runs the target once on the root (``prefix_ids[-1]``) and every node of ``tree``.

    This is the pass :func:`verify` makes, without acceptance or commit: afterwards the cache
    holds ``prefix_ids`` followed by one position per node, in node order (commit it with
    :func:`latticekit.torch.commit_accepted`).

    Args:
        model: HF causal LM (eager or sdpa attention) or a module following the protocol.
        past_key_values: cache holding ``prefix_ids[:-1]``.
        prefix_ids (`torch.LongTensor` of shape `(L,)`): every token so far.
        tree: drafts continuing ``prefix_ids``.

    Returns:
        Logits and hidden states for the root and every node.

    Raises:
        UnsupportedModelError, CacheError, DeviceMismatchError, VocabularyError, DraftError:
            as for :func:`verify`.
    """
    target, ids = _prepare(model, prefix_ids, tree)
    return _tree_forward(target, past_key_values, ids, tree)


@torch.no_grad()
def verify(
    model: Any,
    past_key_values: Any,
    prefix_ids: Union[torch.Tensor, Sequence[int]],
    tree: DraftTree,
    rule: AcceptanceRule = "greedy",
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    draft_probs: Optional[torch.Tensor] = None,
    generator: Optional[torch.Generator] = None,
) -> VerifyResult:
    """Verifies all drafts of ``tree`` in one forward pass and commits the accepted path.

    The output projection is applied to the rows the acceptance rule reads: the root and draft 0
    with the pass, and the subtree the walk moves to if it leaves draft 0 (every row for small
    trees and for models that cannot project rows apart; see ``latticekit.torch.logits``).

    Args:
        model: an HF transformers causal LM (eager or sdpa attention) or a ``torch.nn.Module``
            following ``latticekit.torch.protocol``. Put it in eval mode: dropout makes any
            verification lossy.
        past_key_values: ``transformers.DynamicCache`` (HF) or :class:`KVCache` (plain module)
            holding ``prefix_ids[:-1]``; see :func:`prefill`. Updated in place: afterwards it
            holds ``prefix_ids`` and the accepted tokens.
        prefix_ids (`torch.LongTensor` of shape `(L,)`): every token so far, on the model's device.
        tree: the drafts to verify, continuing ``prefix_ids``.
        rule: the acceptance rule, see :data:`AcceptanceRule`.
        temperature: sampling rules only: the target's temperature.
        top_p: sampling rules only: the target's nucleus mass.
        draft_probs (`torch.Tensor` of shape `(g, vocab)`): rules ``"token"``/``"block"`` only:
            the distributions q_1..q_g the single draft was sampled from.
        generator: sampling rules only: CPU random generator.

    Returns:
        The accepted tokens, the bonus token and the target's outputs at the last accepted node.

    Raises:
        UnsupportedModelError: the model is neither kind, or uses flash attention.
        CacheError: the cache is not of the model's kind or does not hold exactly L - 1 positions.
        DeviceMismatchError: ``prefix_ids``, the cache or ``draft_probs`` is not on the model's device.
        VocabularyError: a prefix or draft id is outside the model's vocabulary.
        DraftError: bad ``prefix_ids``, an unknown rule, or ``"token"``/``"block"`` with more
            than one distinct draft or without matching ``draft_probs``.
        ValueError: a sampling rule with temperature <= 0 or top_p outside (0, 1].
    """
    target, ids = _prepare(model, prefix_ids, tree)
    _check_rule_inputs(rule, tree, draft_probs, target, temperature, top_p)
    logits, node_tokens = _tree_logits(target, past_key_values, ids, tree)

    if rule == "greedy":
        path = greedy_accept(tree, ArgmaxRows(logits))
    elif rule == "sampling":
        path = tree_sampling_accept(tree, lambda row: target_probs(logits[row], temperature, top_p), generator)
    else:
        p = target_probs(logits.all(), temperature, top_p)  # a chain: draft 0 holds every node
        verifier = token_verify if rule == "token" else block_verify
        assert draft_probs is not None  # _check_rule_inputs refuses "token" / "block" without them
        tau, bonus = verifier(p, draft_probs, node_tokens, generator)
        path = AcceptedPath(list(range(tau)), bonus)

    commit_accepted(past_key_values, ids.shape[0], tree.num_nodes, path.nodes)
    last = path.nodes[-1] if path.nodes else ROOT
    return VerifyResult(
        accepted_tokens=node_tokens[path.nodes],
        bonus_token=path.bonus_token,
        accepted_nodes=path.nodes,
        accepted_drafts=tree.drafts_through(last),
        logits=logits[last + 1],
        hidden_state=logits.hidden_states[last + 1],
        projected_rows=len(logits.projected_rows),
    )
