"""Blockwise parallel decoders: greedy baseline, vanilla BPD, n-gram BPD, neural local
rescoring, oracle top-k.

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
from collections.abc import Mapping, Sequence
from typing import Any, Optional, Union

import numpy as np
import torch

from latticekit.bpd.errors import DecoderConfigError, HeadsError
from latticekit.bpd.records import DecoderConfig, Decoding, StepRecord
from latticekit.lattice import SausageLattice
from latticekit.ngram import NGramLM
from latticekit.search import pbest
from latticekit.torch import DraftTree, prefill, target_probs, verify
from latticekit.torch.tree import mask_from_visibility

# One uniform forward over HF models and protocol modules (mask, positions, hidden-state
# capture) already lives in the adapter; the plain one-token step reuses it rather than
# duplicating the HF / protocol split.
from latticekit.torch.verify import _Target

__all__ = ["decode", "greedy_decode", "uniform_lm"]

LMs = Union[NGramLM, Mapping[Optional[str], NGramLM], None]


def uniform_lm() -> NGramLM:
    """A unigram model that scores every token alike: ``ngram`` with it is the "0-gram" p-best."""
    words = ["<unk>", "<s>", "</s>"]
    ids = np.arange(3, dtype=np.int32)
    prob = np.array([-1.0, -99.0, -1.0], dtype=np.float32)
    return NGramLM.from_ngrams(words, [(ids, prob, np.zeros(3, dtype=np.float32))])


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


def _select_lm(config: DecoderConfig, lms: LMs) -> Optional[NGramLM]:
    if config.method != "ngram":
        return None
    if isinstance(lms, NGramLM):
        chosen: Optional[NGramLM] = lms
    elif lms is None:
        chosen = None
    elif config.lm is None and config.alpha == 0:
        chosen = None  # the 0-gram ranks by the heads alone: no model of the mapping is needed
    else:
        if config.lm is None and len(lms) == 1:
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


class _Clock:
    """Wall-clock seconds, synchronising the device first so GPU work is counted where it ran."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def __call__(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()


def _forward_one(target: _Target, cache: Any, token: int, position: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One ordinary decoding step: ``token`` at ``position`` over a cache holding ``position``
    tokens. Returns logits `(vocab,)` and the final hidden state `(hidden,)`."""
    mask = mask_from_visibility(np.ones((1, position + 1), dtype=bool), target.mask_dtype, target.device)
    ids = torch.tensor([[token]], dtype=torch.long, device=target.device)
    positions = torch.tensor([[position]], dtype=torch.long, device=target.device)
    logits, hidden = target.forward(ids, positions, mask, cache)
    return logits[0], hidden[0]


def _next_token(logits: torch.Tensor, config: DecoderConfig, generator: Optional[torch.Generator]) -> int:
    if config.temperature == 0:
        return int(logits.argmax())
    probs = target_probs(logits, config.temperature, config.top_p).cpu()
    return int(torch.multinomial(probs, 1, generator=generator))


def _head_logits(heads: Any, hidden: torch.Tensor, vocab_size: int) -> torch.Tensor:
    logits = heads(hidden)
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.shape[1] != vocab_size \
            or logits.shape[0] < 2:
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise HeadsError(f"heads(hidden) must return logits of shape (h >= 2, {vocab_size}), got {shape}")
    return logits


def _entropy_of_logprobs(logprobs: torch.Tensor) -> np.ndarray:
    """Entropy (nats) over the last axis of log-probabilities, as float64 numpy."""
    return (-(logprobs.exp() * logprobs).sum(dim=-1)).double().cpu().numpy()


def _entropy(head_logits: torch.Tensor) -> np.ndarray:
    return _entropy_of_logprobs(torch.log_softmax(head_logits.float(), dim=-1))


def _check_max_new_tokens(max_new_tokens: Any) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise DecoderConfigError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")


def _oracle_draft(lattice: SausageLattice, reference: Sequence[int], root_index: int) -> tuple[int, ...]:
    """Follows the reference (the target's greedy continuation) through the lattice while it can;
    arg-max arcs after the first position where the reference token is not among the top k."""
    draft = []
    on_track = True
    for j in range(1, lattice.h):
        arcs = lattice.tokens[j, : lattice.widths[j]]
        want = reference[root_index + j] if root_index + j < len(reference) else -1
        on_track = on_track and bool(np.any(arcs == want))
        draft.append(int(want) if on_track else int(arcs[0]))
    return tuple(draft)


@torch.no_grad()
def decode(
    model: Any,
    heads: Any,
    prompt_ids: Any,
    config: DecoderConfig,
    *,
    max_new_tokens: int,
    lms: LMs = None,
    reference: Optional[Sequence[int]] = None,
    eos_token_id: Optional[int] = None,
    generator: Optional[torch.Generator] = None,
    rescorer: Any = None,
) -> Decoding:
    """Decodes ``max_new_tokens`` tokens after a prompt with one decoder.

    Args:
        model: an HF causal LM (eager or sdpa attention) or a module following
            ``latticekit.torch.protocol``, in eval mode.
        heads: draft heads: ``heads(hidden (hidden,)) -> logits (h, vocab)``, row 0 the model's
            own next-token logits (``latticekit.heads.BlockHeads``); unused by ``greedy``.
        prompt_ids (`torch.LongTensor` of shape `(L,)` or a list of ids): the prompt, L >= 1.
        config: the decoder.
        max_new_tokens: tokens to decode (>= 1); the last step's surplus is cut.
        lms: the n-gram model, or a mapping from ``config.lm`` names to models (``ngram``).
            None with ``alpha == 0`` uses :func:`uniform_lm`.
        reference: ``oracle`` only: the target's greedy sequence (prompt included) at least
            ``max_new_tokens + h`` tokens past the prompt; computed with :func:`greedy_decode`
            (not counted as steps) when None.
        eos_token_id: stop after emitting it.
        generator: CPU random generator for sampling (``temperature > 0``).
        rescorer: ``neural`` only: the :class:`~latticekit.bpd.rescorer.NeuralRescorer`; it reads
            the last :func:`~latticekit.bpd.rescorer.context_window` decoded tokens.

    Returns:
        The new tokens and one :class:`StepRecord` per target call.

    Raises:
        DecoderConfigError: bad prompt, ``max_new_tokens`` or a missing n-gram model.
        latticekit.bpd.rescorer.RescorerError: ``neural`` without a fitting rescorer.
        HeadsError: heads missing, or their logits not `(h >= 2, vocab)`.
        latticekit.torch errors: an unsupported model (see :func:`latticekit.torch.verify`).
    """
    if not isinstance(config, DecoderConfig):
        raise DecoderConfigError(f"config must be a DecoderConfig, got {type(config).__name__}")
    _check_max_new_tokens(max_new_tokens)
    prompt = _prompt_list(prompt_ids)
    lm = _select_lm(config, lms)
    if config.method != "greedy" and heads is None:
        raise HeadsError(f"decoder {config.label!r} needs draft heads")
    target = _Target(model)
    if config.method == "neural":
        from latticekit.bpd.rescorer import check_rescorer, neural_drafts

        num_heads = getattr(heads, "num_heads", None)
        check_rescorer(rescorer, target.vocab_size, num_heads if isinstance(num_heads, int) else 2)
    if config.method == "oracle" and reference is None:
        num_heads = getattr(heads, "num_heads", None)
        if not isinstance(num_heads, int):
            raise HeadsError("the oracle without a reference needs heads.num_heads to know how far to look ahead")
        reference = prompt + greedy_decode(model, prompt, max_new_tokens + num_heads).tokens
    if config.k > target.vocab_size:
        raise DecoderConfigError(f"k={config.k} exceeds the vocabulary ({target.vocab_size})")
    clock = _Clock(target.device)
    rule = "greedy" if config.temperature == 0 else "sampling"

    start = clock()
    cache = prefill(model, prompt)
    ids = list(prompt)
    steps: list[StepRecord] = []
    t0 = clock()
    logits, hidden = _forward_one(target, cache, ids[-1], len(ids) - 1)
    ids.append(_next_token(logits, config, generator))
    steps.append(StepRecord(root_token=ids[-2], drafts=[], vanilla_draft=(), emitted=(ids[-1],),
                            num_accepted=0, model_s=clock() - t0))

    while len(ids) - len(prompt) < max_new_tokens and eos_token_id not in steps[-1].emitted:
        if config.method == "greedy":
            t0 = clock()
            logits, hidden = _forward_one(target, cache, ids[-1], len(ids) - 1)
            ids.append(_next_token(logits, config, generator))
            steps.append(StepRecord(root_token=ids[-2], drafts=[], vanilla_draft=(), emitted=(ids[-1],),
                                    num_accepted=0, model_s=clock() - t0))
            continue

        root = ids[-1]
        t0 = clock()
        head_logits = _head_logits(heads, hidden, target.vocab_size)
        lattice = SausageLattice.from_logits(head_logits, config.k, fix_first=True)
        lattice.tokens[0, 0] = root  # head 1's arg-max, or the sampled token when sampling
        t1 = clock()
        vanilla = tuple(int(t) for t in lattice.tokens[1:, 0])
        if config.method == "vanilla":
            drafts = [vanilla]
        elif config.method == "oracle":
            assert reference is not None
            drafts = [_oracle_draft(lattice, reference, len(ids) - 1)]
        elif config.method == "neural":
            draft = neural_drafts(rescorer, torch.tensor(ids), torch.tensor([len(ids) - 1]),
                                  torch.from_numpy(lattice.tokens[None].astype(np.int64)),
                                  torch.from_numpy(lattice.scores[None]), config.alpha, lattice.h)[0]
            drafts = [tuple(int(t) for t in draft)]
        else:
            assert lm is not None
            context = ids[max(0, len(ids) - lm.order): -1]
            paths = pbest(lattice, lm, config.p, config.alpha, context=context)
            drafts = [tuple(path.tokens[1:]) for path in paths]
        tree = DraftTree.from_drafts(drafts)
        t2 = clock()
        result = verify(model, cache, ids, tree, rule, temperature=config.temperature or 1.0,
                        top_p=config.top_p, generator=generator)
        emitted = tuple(result.emitted_tokens.tolist())
        t3 = clock()
        ids.extend(emitted)
        hidden = result.hidden_state
        steps.append(StepRecord(
            root_token=root, drafts=drafts, vanilla_draft=vanilla, emitted=emitted,
            num_accepted=result.num_accepted, lattice_tokens=lattice.tokens.copy(),
            lattice_scores=lattice.scores.copy(), head_entropy=_entropy(head_logits),
            heads_s=t1 - t0, search_s=t2 - t1, model_s=t3 - t2,
        ))

    tokens = ids[len(prompt):][:max_new_tokens]
    if eos_token_id is not None and eos_token_id in tokens:
        tokens = tokens[: tokens.index(eos_token_id) + 1]
    return Decoding(config=config, prompt=prompt, tokens=tokens, steps=steps, wall_s=clock() - start)


def greedy_decode(model: Any, prompt_ids: Any, max_new_tokens: int, eos_token_id: Optional[int] = None) -> Decoding:
    """Plain greedy decoding with a KV cache, one token per target call: the baseline."""
    return decode(model, None, prompt_ids, DecoderConfig("greedy"), max_new_tokens=max_new_tokens,
                  eos_token_id=eos_token_id)
