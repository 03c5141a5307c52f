"""The decode loop of every blockwise parallel decoder: greedy baseline, vanilla BPD, n-gram
BPD, neural local rescoring, oracle top-k and cost-aware ``auto`` (the strategies live in
:mod:`latticekit.drafting`).

Every decoder makes ONE target call per step. The call verifies the step's drafts (one tree
pass, :func:`latticekit.torch.verify`) and returns the target's final hidden state at the last
accepted node; the draft heads on that hidden state give the next step's lattice. Head 1 is
the model's own next-token head, so lattice position 1 is the token the call itself emitted
(fixed, ``fix_first``) and heads 2..h draft the tokens after it::

    prefill(prompt[:-1])                          # not a step
    step 1:  target(prompt[-1]) -> t1, hidden     # one token, like greedy
    step s:  heads(hidden) -> lattice (h, k), position 1 = last emitted token
             drafts = choose(lattice)             # (p, h - 1)
             verify(tree(drafts)) -> accepted + bonus, hidden at the last accepted node

Under greedy acceptance every decoder emits exactly the target's greedy output; with
``temperature > 0`` the adapter's tree-sampling rule keeps the target's distribution.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Optional, Union

import numpy as np
import torch

from latticekit.decoding.lattices import lattice_source
from latticekit.decoding.records import Decoding
from latticekit.decoding.steps import check_max_new_tokens, cut_at_eos, eos_set, run_steps
from latticekit.drafting.config import DecoderConfig
from latticekit.drafting.drafters.auto import AutoDrafter
from latticekit.drafting.outcomes import ArmStore, outcomes_key
from latticekit.drafting.protocol import drafter_class, make_drafter
from latticekit.drafting.tree import Draft
from latticekit.errors import DecoderConfigError, HeadsError
from latticekit.lattice import SausageLattice
from latticekit.torch import DraftTree, prefill, target_probs, verify
from latticekit.torch.target import Target

if TYPE_CHECKING:
    from latticekit.heads.protocol import DraftHeads
    from latticekit.torch.verify import AcceptanceRule

__all__ = ["decode", "greedy_decode", "ModelTarget", "arms_key", "default_arm_store"]


def _prompt_list(prompt_ids: Any) -> list[int]:
    if isinstance(prompt_ids, torch.Tensor):
        if prompt_ids.dim() == 2 and prompt_ids.shape[0] == 1:
            prompt_ids = prompt_ids[0]
        if prompt_ids.dim() != 1 or prompt_ids.is_floating_point() or prompt_ids.dtype == torch.bool:
            raise DecoderConfigError(f"prompt_ids must be a 1-D integer tensor, got {prompt_ids.dtype} "
                                     f"of shape {tuple(prompt_ids.shape)}")
        prompt = prompt_ids.tolist()
    else:
        try:
            prompt = list(prompt_ids)
        except TypeError as exc:
            raise DecoderConfigError("prompt_ids must be a 1-D tensor or a sequence of integer ids") from exc
        if any(isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)) for t in prompt):
            raise DecoderConfigError("prompt_ids must hold integer ids")
        prompt = [int(t) for t in prompt]
    if not prompt:
        raise DecoderConfigError("prompt_ids is empty: the first step needs at least one token")
    return prompt


class _Clock:
    """Wall-clock seconds, synchronising the device first so GPU work is counted where it ran."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def __call__(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()


def _next_token(logits: torch.Tensor, config: DecoderConfig, generator: Optional[torch.Generator]) -> int:
    if config.temperature == 0:
        return int(logits.argmax())
    probs = target_probs(logits, config.temperature, config.top_p).cpu()
    return int(torch.multinomial(probs, 1, generator=generator))


class ModelTarget:
    """A model as the loop's target (:class:`~latticekit.decoding.steps.StepTarget`): its KV
    cache, the final hidden state of its last call (the heads read it), and its lattice source.

    ``plain``: the model's cache takes no tree pass (see :meth:`Target.tree_refusal`); the prompt
    is then fed as transformers' own causal pass and every step is one plain token, the calls
    HF ``generate`` makes (the drafter must never draft)."""

    timed = True
    lattice_s: Optional[float] = None

    def __init__(self, target: Target, config: DecoderConfig, source: Any, generator: Optional[torch.Generator],
                 plain: bool = False) -> None:
        self.model, self.target = target.model, target
        self.config, self.source, self.generator = config, source, generator
        self.rule: AcceptanceRule = "greedy" if config.temperature == 0 else "sampling"
        self.plain = plain
        self.cache: Any = None
        self.hidden: Optional[torch.Tensor] = None

    def first(self, ids: list[int]) -> tuple[int, ...]:
        if self.plain:
            prompt = torch.tensor([ids], dtype=torch.long, device=self.target.device)
            logits, self.hidden, self.cache = self.target.forward_prompt(prompt)
            return (_next_token(logits, self.config, self.generator),)
        self.cache = prefill(self.model, ids)
        logits, self.hidden = self.target.step(self.cache, ids[-1], len(ids) - 1)
        return (_next_token(logits, self.config, self.generator),)

    def verify(self, ids: list[int], draft: Draft) -> tuple[tuple[int, ...], int]:
        if not draft:
            logits, self.hidden = self.target.step(self.cache, ids[-1], len(ids) - 1)
            return (_next_token(logits, self.config, self.generator),), 0
        if self.plain:
            raise DecoderConfigError("this model's cache takes no tree pass: its decode cannot draft")
        tree = DraftTree.from_trie(draft.tokens, draft.parents)
        result = verify(self.model, self.cache, ids, tree, self.rule, temperature=self.config.temperature or 1.0,
                        top_p=self.config.top_p, generator=self.generator)
        self.hidden = result.hidden_state
        return tuple(result.emitted_tokens.tolist()), result.num_accepted

    def lattice(self, ids: list[int], columns: Sequence[Sequence[int]],
                entropy: bool) -> tuple[SausageLattice, Optional[np.ndarray]]:
        if self.source is None:
            raise HeadsError("this decode has no heads: no lattice to read")
        return self.source(self.hidden, ids, columns, entropy)


@torch.no_grad()
def decode(
    model: Any,
    heads: Optional[DraftHeads],
    prompt_ids: Any,
    config: DecoderConfig,
    *,
    max_new_tokens: int,
    lms: Any = None,
    reference: Optional[Sequence[int]] = None,
    eos_token_id: Union[int, Sequence[int], None] = None,
    generator: Optional[torch.Generator] = None,
    rescorer: Any = None,
    costs: Any = None,
    acceptance: Any = None,
    streamer: Any = None,
    record_lattices: bool = True,
    memory: Any = None,
    plain: bool = False,
    arms: Any = None,
) -> Decoding:
    """Decodes ``max_new_tokens`` tokens after a prompt with one decoder.

    Every step hands the config's :class:`~latticekit.drafting.Drafter` the decoded ids
    (and, when it asks, the heads' lattice), verifies its drafts in one tree pass, or takes a
    plain one-token step when it returns none.

    Args:
        model: an HF causal LM (eager or sdpa attention) or a module following
            ``latticekit.torch.protocol``, in eval mode.
        heads: draft heads: ``heads(hidden (hidden,)) -> logits (h, vocab)``, row 0 the model's
            own next-token logits (``latticekit.heads.BlockHeads``); unused by ``greedy``.
        prompt_ids (`torch.LongTensor` of shape `(L,)` or a list of ids): the prompt, L >= 1.
        config: the decoder.
        max_new_tokens: tokens to decode (>= 1); the last step's surplus is cut.
        lms: the n-gram model, or a mapping from ``config.lm`` names to models (``ngram``).
            None with ``alpha == 0`` uses :func:`~latticekit.drafting.uniform_lm`.
        reference: ``oracle`` only: the target's greedy sequence (prompt included) at least
            ``max_new_tokens + h`` tokens past the prompt; computed with :func:`greedy_decode`
            (not counted as steps) when None.
        eos_token_id: stop after emitting it (or any of several).
        generator: CPU random generator for sampling (``temperature > 0``).
        rescorer: ``neural`` only: the :class:`~latticekit.eval.rescorer.NeuralRescorer`; it reads
            the last :func:`~latticekit.eval.rescorer.context_window` decoded tokens.
        costs: ``auto`` only: the target's :class:`~latticekit.decoding.costs.StepCosts`; measured
            (and cached per model and device, :func:`~latticekit.decoding.costs.step_costs`) when None.
        acceptance: ``auto`` only: the :class:`~latticekit.drafting.calibration.AcceptanceModel` to
            start from (default: the one shipped for these heads, else its prior).
        streamer: a ``transformers`` streamer (``TextStreamer``, ``TextIteratorStreamer``, ...):
            it gets the prompt, then the tokens of every step as they are decoded.
        record_lattices: keep every step's lattice, arg-max draft and head entropies in its
            record (the evaluation's analyses; :func:`latticekit.generate` does not ask them).
        memory: an :class:`~latticekit.drafting.memory.AnswerMemory` of earlier answers: ``auto``
            (and the drafters built on it) drafts from it too, and the decode's new tokens are
            added to it at the end. None: no memory.
        plain: feed the prompt as transformers' own causal pass and decode one plain token per
            call, as HF ``generate`` does, for a model whose cache takes no tree pass
            (:func:`latticekit.generate` falls back to it); only the ``greedy`` decoder.
        arms: ``auto`` (and the drafters built on it) only: an
            :class:`~latticekit.drafting.outcomes.ArmStore`: the drafter starts its choice of
            sources from the outcomes kept there for this model, device, heads and drafter
            (:func:`arms_key`), and keeps its own there at the end. None: it learns anew.

    Returns:
        The new tokens and one :class:`StepRecord` per target call.

    Raises:
        DecoderConfigError: bad prompt, ``max_new_tokens`` or a missing n-gram model.
        latticekit.eval.rescorer.RescorerError: ``neural`` without a fitting rescorer.
        HeadsError: heads missing, or their logits not `(h >= 2, vocab)`.
        latticekit.torch errors: an unsupported model (see :func:`latticekit.torch.verify`).
    """
    strategy = drafter_class(config)
    if plain and config.method != "greedy":
        raise DecoderConfigError(f"plain decoding takes no drafts: decoder {config.label!r} drafts")
    check_max_new_tokens(max_new_tokens)
    prompt = _prompt_list(prompt_ids)
    if strategy.needs_heads and heads is None:
        raise HeadsError(f"decoder {config.label!r} needs draft heads")
    target = Target(model, tree_masks=not plain)
    num_heads = getattr(heads, "num_heads", None)
    num_heads = num_heads if isinstance(num_heads, int) else None
    if strategy.needs_reference and reference is None:
        if num_heads is None:
            raise HeadsError(f"decoder {config.label!r} without a reference needs heads.num_heads "
                             "to know how far to look ahead")
        reference = prompt + greedy_decode(model, prompt, max_new_tokens + num_heads).tokens
    if strategy.needs_costs and costs is None:
        from latticekit.decoding.costs import step_costs

        costs = step_costs(model)
    fingerprint = None
    if heads is not None and hasattr(heads, "state_dict"):
        from latticekit.heads.fingerprint import cached_heads_fingerprint

        fingerprint = cached_heads_fingerprint(heads)
    drafter = make_drafter(config, lms=lms, rescorer=rescorer, reference=reference, vocab_size=target.vocab_size,
                           num_heads=num_heads, has_heads=heads is not None, costs=costs, acceptance=acceptance,
                           heads_fingerprint=fingerprint, memory=memory)
    key = None  # heads with no fingerprint cannot be told apart: their outcomes are not kept
    if arms is not None and isinstance(drafter, AutoDrafter) and (heads is None or fingerprint is not None):
        key = arms_key(model, fingerprint, drafter)
        kept = arms.get(key)
        if kept is not None:
            drafter.resume(kept)
    if drafter.k > target.vocab_size:
        raise DecoderConfigError(f"k={drafter.k} exceeds the vocabulary ({target.vocab_size})")
    source = None
    if heads is not None and drafter.reads_lattice:
        source = lattice_source(heads, drafter.k, target.vocab_size, drafter.lattice_vocabulary())
    clock = _Clock(target.device)
    eos = eos_set(eos_token_id)
    stream = _Stream(streamer, prompt, max_new_tokens, eos)
    out = run_steps(ModelTarget(target, config, source, generator, plain), drafter, config, prompt, max_new_tokens,
                    eos, emit=stream.put, record_lattices=record_lattices, clock=clock)
    stream.end()
    if key is not None and isinstance(drafter, AutoDrafter):
        arms.put(key, drafter.arm_outcomes())
    if memory is not None:
        memory.add(out.tokens, context=prompt)
    return out


_ARM_STORES: dict[str, ArmStore] = {}


def default_arm_store() -> ArmStore:
    """The process's :class:`~latticekit.drafting.outcomes.ArmStore` (what
    :func:`~latticekit.generate` keeps arm outcomes in by default): its files beside the step
    costs' (:func:`~latticekit.decoding.costs.default_cache_dir`, ``arms-<key>.json``).
    ``default_arm_store().clear()`` forgets them all."""
    from latticekit.decoding.costs import default_cache_dir

    folder = str(default_cache_dir())
    return _ARM_STORES.setdefault(folder, ArmStore(folder))


def arms_key(model: Any, heads_fingerprint: Optional[str], drafter: AutoDrafter) -> str:
    """What ``auto``'s arm outcomes depend on, as a key of
    :class:`~latticekit.drafting.outcomes.ArmStore`: the model (its name, and what its step
    costs are keyed on: shape, dtype, preparation, device, threads, torch), the heads'
    fingerprint, the drafter (its config, arms, whether it has an n-gram model and a memory)."""
    from latticekit.decoding.costs import describe

    config = getattr(model, "config", None)
    return outcomes_key(model=describe(model), name=getattr(config, "name_or_path", None), heads=heads_fingerprint,
                        drafter=drafter.config.label, arms=drafter.arms, lm=repr(drafter.lm),
                        memory=drafter.memory is not None)


class _Stream:
    """Hands the decode's tokens to a ``transformers`` streamer (``put(tensor)``, ``end()``) as
    HF ``generate`` does: the prompt first, then each step's tokens, none past
    ``max_new_tokens`` or the end-of-sequence token."""

    def __init__(self, streamer: Any, prompt: list[int], max_new_tokens: int, eos: frozenset[int]) -> None:
        self.streamer, self.left, self.eos = streamer, max_new_tokens, eos
        if streamer is not None:
            streamer.put(torch.tensor(prompt, dtype=torch.long))

    def put(self, tokens: Sequence[int]) -> None:
        if self.streamer is None or self.left <= 0:
            return
        out = cut_at_eos(list(tokens[: self.left]), self.eos)
        self.left = 0 if not self.eos.isdisjoint(out) else self.left - len(out)
        if out:
            self.streamer.put(torch.tensor(out, dtype=torch.long))

    def end(self) -> None:
        if self.streamer is not None:
            self.streamer.end()


def greedy_decode(model: Any, prompt_ids: Any, max_new_tokens: int,
                  eos_token_id: Union[int, Sequence[int], None] = None) -> Decoding:
    """Plain greedy decoding with a KV cache, one token per target call: the baseline."""
    return decode(model, None, prompt_ids, DecoderConfig("greedy"), max_new_tokens=max_new_tokens,
                  eos_token_id=eos_token_id)
