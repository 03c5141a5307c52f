"""The decode loop of every blockwise parallel decoder: greedy baseline, vanilla BPD, n-gram
BPD, neural local rescoring, oracle top-k and cost-aware ``auto`` (the strategies live in
:mod:`latticekit.bpd.drafters`).

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
from typing import Any, Optional, Union

import numpy as np
import torch

from latticekit.bpd.drafters import Draft, DraftInput, drafter_class, make_drafter
from latticekit.bpd.drafters.vanilla import argmax_draft
from latticekit.bpd.records import DecoderConfig, Decoding, StepRecord
from latticekit.errors import DecoderConfigError, HeadsError
from latticekit.lattice import SausageLattice
from latticekit.torch import DraftTree, prefill, target_probs, verify
from latticekit.torch.target import Target

__all__ = ["decode", "greedy_decode"]


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


def _check_max_new_tokens(max_new_tokens: Any) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise DecoderConfigError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")


class _TimedLattice:
    """The step's lattice from a lattice source, built when a drafter first reads it; keeps the
    seconds it took and the heads' entropies (None where the source has none) for the record."""

    def __init__(self, source: Any, hidden: torch.Tensor, ids: list[int], clock: _Clock) -> None:
        self.source, self.hidden, self.ids, self.clock = source, hidden, ids, clock
        self.seconds = 0.0
        self.entropy: Optional[np.ndarray] = None

    def __call__(self) -> SausageLattice:
        t0 = self.clock()
        lattice, self.entropy = self.source(self.hidden, self.ids)
        self.seconds = self.clock() - t0
        return lattice


def _record(step: DraftInput, drafts: Draft, emitted: tuple[int, ...], num_accepted: int,
            entropy: Optional[np.ndarray], heads_s: float, search_s: float, model_s: float) -> StepRecord:
    """The step's record; lattice fields only when the drafter read the lattice."""
    if not step.has_lattice:
        return StepRecord(root_token=step.root, drafts=drafts, vanilla_draft=(), emitted=emitted,
                          num_accepted=num_accepted, search_s=search_s, model_s=model_s)
    lattice = step.lattice
    return StepRecord(root_token=step.root, drafts=drafts, vanilla_draft=argmax_draft(step), emitted=emitted,
                      num_accepted=num_accepted, lattice_tokens=lattice.tokens.copy(),
                      lattice_scores=lattice.scores.copy(), head_entropy=entropy,
                      heads_s=heads_s, search_s=search_s, model_s=model_s)


@torch.no_grad()
def decode(
    model: Any,
    heads: Any,
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
) -> Decoding:
    """Decodes ``max_new_tokens`` tokens after a prompt with one decoder.

    Every step hands the config's :class:`~latticekit.bpd.drafters.Drafter` the decoded ids
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
            None with ``alpha == 0`` uses :func:`~latticekit.bpd.drafters.uniform_lm`.
        reference: ``oracle`` only: the target's greedy sequence (prompt included) at least
            ``max_new_tokens + h`` tokens past the prompt; computed with :func:`greedy_decode`
            (not counted as steps) when None.
        eos_token_id: stop after emitting it (or any of several).
        generator: CPU random generator for sampling (``temperature > 0``).
        rescorer: ``neural`` only: the :class:`~latticekit.bpd.rescorer.NeuralRescorer`; it reads
            the last :func:`~latticekit.bpd.rescorer.context_window` decoded tokens.
        costs: ``auto`` only: the target's :class:`~latticekit.bpd.costs.StepCosts`; measured
            (and cached per model and device, :func:`~latticekit.bpd.costs.step_costs`) when None.
        acceptance: ``auto`` only: the :class:`~latticekit.bpd.calibration.AcceptanceModel` to
            start from (default: the one shipped for these heads, else its prior).
        streamer: a ``transformers`` streamer (``TextStreamer``, ``TextIteratorStreamer``, ...):
            it gets the prompt, then the tokens of every step as they are decoded.

    Returns:
        The new tokens and one :class:`StepRecord` per target call.

    Raises:
        DecoderConfigError: bad prompt, ``max_new_tokens`` or a missing n-gram model.
        latticekit.bpd.rescorer.RescorerError: ``neural`` without a fitting rescorer.
        HeadsError: heads missing, or their logits not `(h >= 2, vocab)`.
        latticekit.torch errors: an unsupported model (see :func:`latticekit.torch.verify`).
    """
    strategy = drafter_class(config)
    _check_max_new_tokens(max_new_tokens)
    prompt = _prompt_list(prompt_ids)
    if strategy.needs_heads and heads is None:
        raise HeadsError(f"decoder {config.label!r} needs draft heads")
    target = Target(model)
    num_heads = getattr(heads, "num_heads", None)
    num_heads = num_heads if isinstance(num_heads, int) else None
    if strategy.needs_reference and reference is None:
        if num_heads is None:
            raise HeadsError(f"decoder {config.label!r} without a reference needs heads.num_heads "
                             "to know how far to look ahead")
        reference = prompt + greedy_decode(model, prompt, max_new_tokens + num_heads).tokens
    if strategy.needs_costs and costs is None:
        from latticekit.bpd.costs import step_costs

        costs = step_costs(model)
    drafter = make_drafter(config, lms=lms, rescorer=rescorer, reference=reference,
                           vocab_size=target.vocab_size, num_heads=num_heads, costs=costs, acceptance=acceptance,
                           heads=heads)
    if drafter.k > target.vocab_size:
        raise DecoderConfigError(f"k={drafter.k} exceeds the vocabulary ({target.vocab_size})")
    source = drafter.lattice_source(heads, target.vocab_size) if heads is not None else None
    clock = _Clock(target.device)
    rule = "greedy" if config.temperature == 0 else "sampling"

    start = clock()
    eos = _eos_set(eos_token_id)
    stream = _Stream(streamer, prompt, max_new_tokens, eos)
    cache = prefill(model, prompt)
    ids = list(prompt)
    steps: list[StepRecord] = []
    t0 = clock()
    logits, hidden = target.step(cache, ids[-1], len(ids) - 1)
    ids.append(_next_token(logits, config, generator))
    steps.append(StepRecord(root_token=ids[-2], drafts=[], vanilla_draft=(), emitted=(ids[-1],),
                            num_accepted=0, model_s=clock() - t0))
    stream.put(steps[-1].emitted)

    while len(ids) - len(prompt) < max_new_tokens and eos.isdisjoint(steps[-1].emitted):
        heads_lattice = _TimedLattice(source, hidden, ids, clock)
        step = DraftInput(ids, heads_lattice)
        t0 = clock()
        drafts = drafter.draft(step)
        tree = DraftTree.from_drafts(drafts) if drafts else None
        t1 = clock()
        if tree is not None:
            result = verify(model, cache, ids, tree, rule,
                            temperature=config.temperature or 1.0, top_p=config.top_p, generator=generator)
            emitted = tuple(result.emitted_tokens.tolist())
            num_accepted = result.num_accepted
            hidden = result.hidden_state
        else:
            logits, hidden = target.step(cache, ids[-1], len(ids) - 1)
            emitted = (_next_token(logits, config, generator),)
            num_accepted = 0
        t2 = clock()
        drafter.observe(step, drafts, emitted)
        steps.append(_record(step, drafts, emitted, num_accepted, heads_lattice.entropy, heads_lattice.seconds,
                             t1 - t0 - heads_lattice.seconds, t2 - t1))
        ids.extend(emitted)
        stream.put(emitted)

    stream.end()
    tokens = _cut_at_eos(ids[len(prompt):][:max_new_tokens], eos)
    return Decoding(config=config, prompt=prompt, tokens=tokens, steps=steps, wall_s=clock() - start)


def _eos_set(eos_token_id: Union[int, Sequence[int], None]) -> frozenset[int]:
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, (int, np.integer)) and not isinstance(eos_token_id, bool):
        return frozenset([int(eos_token_id)])
    try:
        ids = [int(t) for t in eos_token_id if not isinstance(t, bool)]  # type: ignore[union-attr]
    except TypeError as exc:
        raise DecoderConfigError(f"eos_token_id must be an id or a sequence of ids, got {eos_token_id!r}") from exc
    return frozenset(ids)


def _cut_at_eos(tokens: list[int], eos: frozenset[int]) -> list[int]:
    """``tokens`` up to and including the first end-of-sequence token."""
    for i, token in enumerate(tokens):
        if token in eos:
            return tokens[: i + 1]
    return tokens


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
        out = _cut_at_eos(list(tokens[: self.left]), self.eos)
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
