"""What latticekit's vLLM proposer reads from its engine: the model runner that builds it (which
request each batch row is), vLLM's own schedule of speculative tokens by batch size, the query
tokens of the step just run, and the proposer's counters after an engine's requests; and the
n-gram model its settings name."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any, Optional, cast

from latticekit.errors import ProposerConfigError
from latticekit.ngram import NGramLM

__all__ = ["find_runner", "load_lm", "dynamic_schedule", "scheduled_tokens", "engine_stats"]


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


def engine_stats(llm: Any, path: Any) -> dict[str, Any]:
    """The counters of the proposer of ``llm`` (a ``vllm.LLM`` whose proposer writes ``stats``
    to ``path``) after the requests it has run: the proposer rewrites the file at most every
    half second, and whenever it learns that requests finished (at its next call), so one
    request of one token brings the file up to date (that request's step counted too)."""
    import vllm

    llm.generate([{"prompt_token_ids": [1, 2]}], vllm.SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)
    return cast(dict[str, Any], json.loads(Path(path).read_text(encoding="utf-8")))
