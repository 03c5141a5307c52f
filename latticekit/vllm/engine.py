"""What latticekit's vLLM proposer reads from its engine: the model runner that builds it (which
request each batch row is), vLLM's own schedule of speculative tokens by batch size, the query
tokens of the step just run, a finished request's answer, and the proposer's counters after an
engine's requests; the n-gram model its settings name; and the one thing it changes in the
runner, on its own: a step without drafts prepared as a step without speculation
(:func:`plain_steps`)."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional, cast

import numpy as np

from latticekit.errors import ProposerConfigError
from latticekit.ngram import NGramLM

__all__ = ["find_runner", "load_lm", "dynamic_schedule", "scheduled_tokens", "request_answer", "engine_stats",
           "stats_asked", "STATS_REQUEST", "plain_steps", "attended_keys", "prompt_length", "tokens_left"]


def find_runner() -> Any:
    """The model runner building this proposer (vLLM constructs it inside the runner's
    ``__init__``): it knows which request each batch row is. None when not found."""
    frame = inspect.currentframe()
    while frame is not None:
        owner = frame.f_locals.get("self")
        if owner is not None and type(owner).__name__.endswith("ModelRunner"):
            return owner
        frame = frame.f_back
    return None


def plain_steps(runner: Any, model_config: Any, on_plain: Optional[Callable[[], None]] = None) -> bool:
    """Makes ``runner`` (vLLM's model runner) prepare a step in which no request has a draft as
    a step without speculation: vLLM's sampler instead of its rejection sampler, and no
    speculative metadata. vLLM 0.32 and 0.33 take the speculative path at every step of an
    engine with a ``speculative_config``, drafts or none (``GPUModelRunner._prepare_inputs``,
    so that a recurrent model's backend reads its state at the speculative offsets); for a step
    without drafts both paths sample each request's next token from the same logits. Left alone
    for models with recurrent state or without attention (vLLM's ``is_hybrid``,
    ``has_inner_state``, ``is_attention_free``). Wraps this runner's ``_prepare_inputs`` alone
    (``on_plain`` is called for every step it prepares without speculation); returns whether it
    did.
    """
    if runner is None or getattr(runner, "speculative_config", None) is None or any(
            bool(getattr(model_config, name, False)) for name in ("is_hybrid", "has_inner_state", "is_attention_free")):
        return False
    prepare = getattr(runner, "_prepare_inputs", None)
    if prepare is None or getattr(prepare, "latticekit_plain_steps", False):
        return False

    def _prepare_inputs(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        if any(getattr(scheduler_output, "scheduled_spec_decode_tokens", {0: [0]}).values()):
            return prepare(scheduler_output, *args, **kwargs)
        spec = runner.speculative_config
        runner.speculative_config = None  # what _prepare_inputs reads it for: whether to take the speculative path
        try:
            out = prepare(scheduler_output, *args, **kwargs)
        finally:
            runner.speculative_config = spec
        if on_plain is not None:
            on_plain()
        return out

    _prepare_inputs.latticekit_plain_steps = True  # type: ignore[attr-defined]
    runner._prepare_inputs = _prepare_inputs
    return True


def load_lm(name: Optional[str]) -> Optional[NGramLM]:
    """The n-gram model the ``lm`` setting names (a file, or ``"embedded"``); None for none."""
    if name is None:
        return None
    if name == "embedded":
        from latticekit.demo import embedded_token_lm

        return embedded_token_lm()
    try:
        if name.endswith((".arpa", ".arpa.gz", ".gz")):
            return NGramLM.from_arpa(name)
        return NGramLM.load(name)
    except Exception as exc:  # every reader's error, named with the file
        raise ProposerConfigError(f"latticekit vLLM proposer: lm {name!r} is not a readable n-gram model: "
                                  f"{type(exc).__name__}: {exc}") from exc


def dynamic_schedule(vllm_config: Any) -> Optional[list[int]]:
    """vLLM's dynamic speculative decoding schedule (``num_speculative_tokens_per_batch_size``)
    as vLLM's scheduler expands it: index = the batch's requests, value = the most draft tokens
    it schedules per request; None when the engine has no schedule. vLLM computes it for its
    own proposers and does not hand it to a ``custom_class`` one, so the proposer reads it here."""
    spec = vllm_config.speculative_config
    schedule = getattr(spec, "num_speculative_tokens_per_batch_size", None)
    if not schedule:
        return None
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    return list(build_dynamic_sd_schedule_lookup(schedule, vllm_max_batch_size=int(
        vllm_config.scheduler_config.max_num_seqs), vllm_num_speculative_tokens=int(spec.num_speculative_tokens)))


def scheduled_tokens(slot_mappings: Any) -> Optional[int]:
    """Query tokens of the step just run: the length of any layer's slot mapping."""
    if isinstance(slot_mappings, (list, tuple)):
        slot_mappings = slot_mappings[0] if slot_mappings else None
    if isinstance(slot_mappings, dict) and slot_mappings:
        first = next(iter(slot_mappings.values()))
        shape = getattr(first, "shape", None)
        if shape is not None and len(shape) >= 1:
            return int(shape[0])
    return None


def attended_keys(lengths: Any, chains: list[list[int]]) -> float:
    """The keys the next step's queries attend: per row, its query tokens (its last token and
    its drafts) times its context (``lengths``, the rows' tokens)."""
    try:
        context = np.asarray(lengths[:len(chains)], dtype=np.float64)
        return float(context @ np.array([1 + len(chain) for chain in chains], dtype=np.float64))
    except Exception:  # a buffer not as vLLM hands it: the step's keys are not known
        return 0.0


def request_answer(request: Any) -> Optional[tuple[list[int], list[int]]]:
    """The answer and the prompt the runner's state of a request holds (``CachedRequestState``'s
    ``output_token_ids``, every step's sampled tokens, and ``prompt_token_ids``; an empty prompt
    where it has none, as with prompt embeddings), the answer up to async scheduling's
    placeholders (-1) where they are; None where it holds no output list.

    Raises:
        TypeError: an output whose ids are not numbers.
    """
    output = getattr(request, "output_token_ids", None)
    if not isinstance(output, list):
        return None
    if output and min(output) < 0:
        output = output[:next(i for i, token in enumerate(output) if token < 0)]
    prompt = getattr(request, "prompt_token_ids", None)
    return output, prompt if isinstance(prompt, list) else []


def prompt_length(request: Any, fallback: int) -> int:
    """The prompt's tokens of the runner's state of a request (``CachedRequestState``), else ``fallback``."""
    prompt = getattr(request, "prompt_token_ids", None)
    return len(prompt) if prompt is not None else max(0, fallback)


def tokens_left(request: Any, length: int) -> Optional[int]:
    """The tokens a request whose runner state is ``request``, ``length`` tokens long, may still
    emit (its ``max_tokens`` less its output so far), or None. A step emits its accepted drafts
    and one token more, and vLLM 0.32 verifies a chain whole (it cuts drafts at ``max_model_len``
    alone): a draft past ``left - 1`` is a query token thrown away."""
    most = getattr(getattr(request, "sampling_params", None), "max_tokens", None)
    prompt = getattr(request, "num_prompt_tokens", None)
    if not isinstance(most, int) or not isinstance(prompt, int):
        return None
    return most - (length - prompt)


#: The ``extra_args`` key of :func:`engine_stats`' request: a call whose batch holds a request
#: with it waits for its stats file's rewrite (no other call waits for the disk).
STATS_REQUEST = "latticekit_stats"


def engine_stats(llm: Any, path: Any) -> dict[str, Any]:
    """The counters of the proposer of ``llm`` (a ``vllm.LLM`` whose proposer writes ``stats``
    to ``path``) after the requests it has run. It sends one request of one token, marked
    (:data:`STATS_REQUEST` in its ``extra_args``): the proposer's call for its step learns that
    the earlier requests finished, is counted itself, and waits for that rewrite of the file,
    which no other call does (the file is rewritten off the engine's thread)."""
    import vllm

    params = vllm.SamplingParams(temperature=0, max_tokens=1, extra_args={STATS_REQUEST: True})
    llm.generate([{"prompt_token_ids": [1, 2]}], params, use_tqdm=False)
    return cast(dict[str, Any], json.loads(Path(path).read_text(encoding="utf-8")))


def stats_asked(request: Any) -> bool:
    """Whether ``request`` (the runner's state of a request) is :func:`engine_stats`' request."""
    extra = getattr(getattr(request, "sampling_params", None), "extra_args", None)
    return isinstance(extra, dict) and bool(extra.get(STATS_REQUEST))
