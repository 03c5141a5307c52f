"""``latticekit.generate``: decode faster than greedy decoding, with the same tokens.

In the spirit of HF ``model.generate``: one call prepares the target for its device
(:func:`latticekit.torch.prepare_target`, idempotent), measures what its steps cost (once per
model and device, cached), and decodes with the ``auto`` drafter, which chooses every step the
draft tree with the most expected tokens per second, down to no draft at all, from every source
it has: the prompt's and the decoded text's own n-grams (and the static model when one is
given), so any causal LM speeds up with no training where the text repeats itself or the
prompt; and with draft heads, their lattice united with those n-grams, read only while the
heads pay for themselves. Under greedy
decoding the tokens are exactly the prepared model's own greedy tokens; with ``temperature > 0``
they are distributed exactly like its samples (lossless tree sampling).

Models whose cache cannot be committed after a tree pass (linear attention, recurrent or
convolution states: a rejected node's update cannot be taken back), and those whose attention
places its biases by key order (ALiBi, GPT-Neo's local layers), decode without drafts:
transformers' own causal pass over the prompt, then one plain step per token, the calls HF
``generate`` makes, after one warning naming the layer type or the reason.

Needs torch; ``import latticekit`` does not import it.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch

from latticekit.decoding.records import Decoding, StepRecord
from latticekit.drafting.config import DecoderConfig
from latticekit.errors import DecoderConfigError
from latticekit.ngram import NGramLM

__all__ = ["generate", "GenerateOutput"]


@dataclass
class GenerateOutput:
    """What :func:`generate` returns.

    Attributes:
        sequences (`torch.LongTensor` of shape `(1, prompt + new)`): the prompt and the new
            tokens, on the model's device (like HF ``generate``'s output).
        decoding: the decode's :class:`~latticekit.decoding.records.Decoding`: the new tokens, one
            :class:`~latticekit.decoding.records.StepRecord` per target call, wall seconds.
    """

    sequences: torch.Tensor
    decoding: Decoding

    @property
    def tokens(self) -> list[int]:
        """The new tokens."""
        return self.decoding.tokens

    @property
    def steps(self) -> list[StepRecord]:
        """One record per target call (drafts, accepted tokens, seconds in heads / search / target)."""
        return self.decoding.steps

    @property
    def tokens_per_call(self) -> float:
        """New tokens per target call."""
        return self.decoding.block_efficiency


def _prompt_ids(input_ids: Any) -> list[int]:
    if isinstance(input_ids, torch.Tensor) and input_ids.dim() == 2:
        if input_ids.shape[0] != 1:
            raise DecoderConfigError(f"latticekit decodes one sequence at a time; input_ids has batch "
                                     f"size {input_ids.shape[0]}")
        input_ids = input_ids[0]
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() != 1 or input_ids.is_floating_point() or input_ids.dtype == torch.bool:
            raise DecoderConfigError(f"input_ids must hold integer ids of shape (L,) or (1, L), got "
                                     f"{input_ids.dtype} of shape {tuple(input_ids.shape)}")
        return [int(t) for t in input_ids.tolist()]
    if isinstance(input_ids, (str, bytes)):
        raise DecoderConfigError("input_ids must be token ids; tokenize the text first")
    try:
        return [int(t) for t in input_ids]
    except (TypeError, ValueError) as exc:
        raise DecoderConfigError("input_ids must be a tensor or a sequence of integer ids") from exc


def _default_eos(model: Any) -> Union[int, Sequence[int], None]:
    config = getattr(model, "generation_config", None) or getattr(model, "config", None)
    return getattr(config, "eos_token_id", None)


@torch.no_grad()
def generate(
    model: Any,
    input_ids: Any,
    *,
    heads: Optional[torch.nn.Module] = None,
    lm: Optional[NGramLM] = None,
    max_new_tokens: int,
    eos_token_id: Union[int, Sequence[int], None] = None,
    temperature: float = 0.0,
    top_p: float = 1.0,
    streamer: Any = None,
    generator: Optional[torch.Generator] = None,
    prepare: bool = True,
    costs: Any = None,
    acceptance: Any = None,
    memory: Any = None,
    arms: Any = True,
) -> GenerateOutput:
    """Decodes ``max_new_tokens`` tokens after ``input_ids``, drafting where it pays.

    Args:
        model: an HF causal LM (eager or sdpa attention) or a module following
            ``latticekit.torch.protocol``, in eval mode, on its device.
        input_ids (`torch.LongTensor` of shape `(1, L)` or `(L,)`, or a list of ids): the prompt
            (for an instruction model, its chat template applied).
        heads: draft heads (``latticekit.heads.BlockHeads``, e.g. ``default_heads(model)``):
            their lattice joins the text's candidates where it pays. None drafts from the text
            alone (continuations of the decoded text under its own n-gram cache and ``lm``).
        lm: a Katz n-gram model over the model's token ids (e.g.
            ``latticekit.demo.embedded_token_lm()`` for SmolLM2): rescores the heads'
            candidates, or drafts with the cache when there are no heads, and feeds the
            acceptance estimates. Optional.
        max_new_tokens: how many tokens to decode at most (>= 1).
        eos_token_id: stop after emitting it (or any of several); default the model's
            ``generation_config.eos_token_id``.
        temperature: 0 for greedy decoding; > 0 samples (lossless tree sampling).
        top_p: nucleus mass when sampling.
        streamer: a ``transformers`` streamer (``TextStreamer``, ...): gets the prompt, then
            every step's tokens as they come.
        generator: CPU random generator for sampling.
        prepare: prepare the target and heads first (``latticekit.torch.prepare_target``);
            False decodes the model as it is.
        costs: the model's :class:`~latticekit.decoding.costs.StepCosts`; default measured once and
            cached (``~/.cache/latticekit``).
        acceptance: the :class:`~latticekit.drafting.calibration.AcceptanceModel` to start the
            heads' estimates from (without heads, the text's).
        memory: an :class:`~latticekit.drafting.memory.AnswerMemory` of earlier answers (e.g.
            ``latticekit.drafting.memory.default_memory()``, the process's, or one per session):
            drafting reads it beside the text, and the new tokens are added to it. None (the
            default): no memory across calls.
        arms: where the drafter's choice of sources starts from and keeps its outcomes (what
            each way of drafting brought, when to probe the others): True (the default) the
            process's store, kept on disk beside the step costs
            (:func:`~latticekit.decoding.loop.default_arm_store`), so a call starts where the
            last one with this model, device and heads stopped, without the warm-up, its kept
            outcomes aged so that a call unlike the last ones soon outweighs them; an
            :class:`~latticekit.drafting.outcomes.ArmStore`: that one; False (or None): every
            call learns anew (docs/speed.md measures both).

    Returns:
        The sequences (prompt + new tokens) and the decode's per-step records.

    Raises:
        DecoderConfigError: bad ``input_ids``, ``max_new_tokens``, ``temperature`` or ``top_p``.
        latticekit.torch errors: an unsupported model (see :func:`latticekit.torch.verify`).

    Warns:
        UserWarning: once, when no tree pass can run over the model (a cache layer that cannot be
            committed, named, or attention biased by key order, e.g. ALiBi); the decode then
            drafts nothing and makes HF ``generate``'s calls.
    """
    from latticekit.decoding.loop import decode, default_arm_store
    from latticekit.torch import prepare_target
    from latticekit.torch.target import Target
    from latticekit.torch.windows import index_bound_attention

    prompt = _prompt_ids(input_ids)
    if prepare:
        prepare_target(model, heads=heads)
    if eos_token_id is None:
        eos_token_id = _default_eos(model)
    refusal = index_bound_attention(model) or Target(model).tree_refusal()
    if refusal is not None:
        warnings.warn(f"latticekit.generate decodes {type(model).__name__} without drafts, one token per call: "
                      f"{refusal}", UserWarning, stacklevel=3)
        config = DecoderConfig("greedy", temperature=temperature, top_p=top_p)
        decoding = decode(model, None, prompt, config, max_new_tokens=max_new_tokens, eos_token_id=eos_token_id,
                          generator=generator, streamer=streamer, record_lattices=False, memory=memory, plain=True)
    else:
        config = DecoderConfig("auto", alpha=1.0 if lm is not None else 0.0, temperature=temperature, top_p=top_p)
        decoding = decode(model, heads, prompt, config, max_new_tokens=max_new_tokens, lms=lm,
                          eos_token_id=eos_token_id, generator=generator, costs=costs, acceptance=acceptance,
                          streamer=streamer, record_lattices=False, memory=memory,
                          arms=default_arm_store() if arms is True else arms or None)
    device = next(model.parameters()).device
    sequences = torch.tensor([decoding.prompt + decoding.tokens], dtype=torch.long, device=device)
    return GenerateOutput(sequences, decoding)
