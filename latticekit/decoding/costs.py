"""What a decoding step costs on this device: the target call as a function of the draft tree.

A cost-aware drafter needs, before it drafts, the seconds a target call takes to verify n tree
nodes (n = 0: a plain one-token step). :func:`measure_step_costs` times real passes of the
(prepared) target over a synthetic prefix: a plain step and verification passes of synthetic
trees of increasing size, medians kept and made non-decreasing in the size; and the extra cost
of a longer prefix (attention reads every cached key). :func:`step_costs` caches the result per
model, device and thread count in a small JSON file, so the measurement (about 4 s for
SmolLM2-135M on a 2-core CPU) runs once.

The probe times steady state. Every call runs over the same cached prefix (the cache is cut back
to it after each call) and every size keeps one tree, so each timed call repeats a shape (key
length, rows, mask) that already ran: a first, untimed round sees every shape once. A device
that pays for the first sight of a shape (cuDNN's attention builds a plan per key length; a
kernel tuned or compiled per shape) is detected, its first calls left out (``first_pass_ratio``
in the description: the first call over the steady one), and a timed call that still runs far
above the later ones of its shape is dropped and timed again. The first probe, which timed a
cache growing by every call (a new key length each time), measured 46-55 ms for 10-21 ms steps
under cuDNN on an H200; its cached files (``COSTS_VERSION`` 2) are measured again.

The figures are the target's alone; a drafter measures its own lattice and search seconds as it
runs (they are latticekit's code, the same on every call).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import statistics
import time
from collections.abc import Sequence

from pathlib import Path
from typing import Any, Optional

from latticekit._files import atomic_write
from latticekit._machine import cpu_name
from latticekit.drafting.costs import COSTS_VERSION, StepCosts, monotone
from latticekit.errors import DecoderConfigError

__all__ = ["StepCosts", "measure_step_costs", "step_costs", "default_cache_dir", "monotone", "COSTS_VERSION",
           "FIRST_SIGHT_RATIO"]

DEFAULT_SIZES = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def _synthetic_tree(n: int, depth: int, vocab: int, rng: random.Random) -> list[list[int]]:
    """Drafts making a tree of exactly ``n`` nodes: chains of up to ``depth`` tokens hanging from
    the root with distinct first tokens (random drafts, so verification accepts little)."""
    drafts: list[list[int]] = []
    left = n
    firsts = rng.sample(range(vocab), min(vocab, n))
    while left > 0:
        length = min(depth, left)
        drafts.append([firsts[len(drafts)]] + [rng.randrange(vocab) for _ in range(length - 1)])
        left -= length
    return drafts


#: A first call of a shape costing more than this many times its steady calls paid for seeing
#: the shape (``first_pass_ratio``); a timed call this far above the later ones is timed again.
FIRST_SIGHT_RATIO = 1.5


def _time_calls(model: Any, sizes: Sequence[int], prefix_tokens: int, repeats: int, depth: int,
                seed: int) -> tuple[list[float], int, dict[int, float], dict[int, int]]:
    """Steady-state seconds per size over ``prefix_tokens`` cached tokens (see the module docstring).

    Every size's call (its one synthetic tree, the same tokens) runs once untimed, then in
    ``repeats`` shuffled timed rounds; after each call the cache is cut back to the prefix. While
    a size's earliest timed call exceeds ``FIRST_SIGHT_RATIO`` times the median of its later
    ones (at least two), it is dropped and the size timed once more (at most ``repeats`` times).

    Returns:
        The median seconds per size, the tokens a call runs over (the prefix and its pending
        token), the first (untimed) call's seconds over the median per size, and the calls timed
        again per size (sizes that needed any).
    """
    import torch

    from latticekit.torch import DraftTree, prefill, verify
    from latticekit.torch.cache import cache_length, commit_accepted
    from latticekit.torch.target import Target

    target = Target(model)
    rng = random.Random(seed)
    vocab = target.vocab_size
    ids = [rng.randrange(vocab) for _ in range(prefix_tokens + 1)]
    trees = {n: DraftTree.from_drafts(_synthetic_tree(n, depth, vocab, rng)) for n in sizes if n}
    sync = torch.cuda.synchronize if target.device.type == "cuda" else (lambda: None)

    def call(n: int) -> float:
        sync()
        t0 = time.perf_counter()
        if n == 0:
            logits, _ = target.step(cache, ids[-1], prefix_tokens)
            int(logits.argmax())  # the token a step emits, read as a decode reads it
        else:
            verify(model, cache, ids, trees[n]).emitted_tokens.tolist()
        sync()
        seconds = time.perf_counter() - t0
        held = cache_length(cache)
        commit_accepted(cache, prefix_tokens, held - prefix_tokens, [])  # back to the prefix
        return seconds

    times: dict[int, list[float]] = {n: [] for n in sizes}
    with torch.no_grad():
        cache = prefill(model, ids)
        order = list(sizes)
        rng.shuffle(order)
        first = {n: call(n) for n in order}  # every shape seen once, untimed
        for _ in range(repeats):
            rng.shuffle(order)
            for n in order:
                times[n].append(call(n))
        retimed: dict[int, int] = {}
        for n in sizes:
            ts = times[n]
            while len(ts) >= 3 and ts[0] > FIRST_SIGHT_RATIO * statistics.median(ts[1:]) \
                    and retimed.get(n, 0) < repeats:
                ts.pop(0)
                ts.append(call(n))
                retimed[n] = retimed.get(n, 0) + 1
    medians = [statistics.median(times[n]) for n in sizes]
    ratios = {n: first[n] / m for n, m in zip(sizes, medians)}
    return medians, len(ids), ratios, retimed


def measure_step_costs(model: Any, sizes: Sequence[int] = DEFAULT_SIZES, prefix_tokens: int = 128,
                       repeats: int = 5, depth: int = 7, long_prefix: Optional[int] = 512,
                       seed: int = 0) -> StepCosts:
    """Times the target's calls in steady state (see the module docstring).

    Args:
        model: the target, prepared as it will decode (``latticekit.torch.prepare_target``).
        sizes: tree sizes to time, increasing from 0.
        prefix_tokens: cached tokens of the synthetic prefix.
        repeats: timed rounds (after an untimed round that sees every shape); the medians are
            kept, made non-decreasing in the tree size (:func:`monotone`) and never below the
            plain step.
        depth: the deepest chain of the synthetic trees (the heads' h - 1).
        long_prefix: a second prefix length for the attention term (timing a plain step and the
            largest tree); None skips it.
        seed: seeds the synthetic tokens.

    Returns:
        The costs; ``description["first_pass_ratio"]`` is the largest first call over its
        steady calls, ``description["first_sight"]`` whether it exceeded ``FIRST_SIGHT_RATIO``
        (the device pays for new shapes; the decode does too, unless its attention builds no
        per-length plan: ``latticekit.torch.prepare_target`` on CUDA), ``description["retimed"]``
        the timed calls dropped and timed again.

    A model with a known context (:func:`model_context`) too short for the probe gets a smaller
    one (:func:`fit_probe`); ``description["context"]`` then records the context fitted to.

    Raises:
        DecoderConfigError: sizes not increasing from 0, ``long_prefix <= prefix_tokens``, or a
            context too short for even the smallest probe.
    """
    sizes = [int(n) for n in sizes]
    if not sizes or sizes[0] != 0 or any(b <= a for a, b in zip(sizes, sizes[1:])) or len(sizes) < 2:
        raise DecoderConfigError(f"sizes must increase from 0, got {sizes}")
    if long_prefix is not None and long_prefix <= prefix_tokens:
        raise DecoderConfigError(f"long_prefix ({long_prefix}) must exceed prefix_tokens ({prefix_tokens})")
    context = model_context(model)
    fitted = fit_probe(context, sizes, prefix_tokens, long_prefix)
    fitted_to = {"context": context} if fitted != (sizes, prefix_tokens, long_prefix) else {}
    sizes, prefix_tokens, long_prefix = fitted
    t0 = time.perf_counter()
    seconds, cached, ratios, retimed = _time_calls(model, sizes, prefix_tokens, repeats, depth, seed)
    row_token_s = 0.0
    if long_prefix is not None:
        far = [0, sizes[-1]]
        long_seconds, long_cached, long_ratios, long_retimed = _time_calls(model, far, long_prefix, repeats, depth,
                                                                           seed + 1)
        slopes = [(long_seconds[i] - seconds[sizes.index(n)]) / ((n + 1) * (long_cached - cached))
                  for i, n in enumerate(far)]
        row_token_s = max(0.0, min(slopes))
        ratios = {n: max(ratios[n], long_ratios.get(n, 0.0)) for n in sizes}
        retimed = {n: retimed.get(n, 0) + long_retimed.get(n, 0) for n in sizes if retimed.get(n) or long_retimed.get(n)}
    seconds = [seconds[0]] + [max(seconds[0], t) for t in monotone(seconds[1:])]
    first = max(ratios.values())
    seen = {"first_pass_ratio": round(first, 2), "first_sight": first > FIRST_SIGHT_RATIO,
            "retimed": {str(n): k for n, k in retimed.items()}}
    return StepCosts(sizes, seconds, cached, row_token_s, None,
                     dict(describe(model), measured_s=round(time.perf_counter() - t0, 2),
                          measured_at=time.strftime("%Y-%m-%d %H:%M:%S"), **seen, **fitted_to))


def model_context(model: Any) -> Optional[int]:
    """The positions the model takes: ``max_position_embeddings`` (or GPT-2's ``n_positions``)
    of the module itself or of its (text) config; None when it names none."""
    config = getattr(model, "config", None)
    owners = [model, config]
    if config is not None and callable(getattr(config, "get_text_config", None)):
        owners.append(config.get_text_config(decoder=True))
    for owner in owners:
        for key in ("max_position_embeddings", "n_positions"):
            value = getattr(owner, key, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def fit_probe(context: Optional[int], sizes: Sequence[int], prefix_tokens: int,
              long_prefix: Optional[int]) -> tuple[list[int], int, Optional[int]]:
    """The probe's ``(sizes, prefix_tokens, long_prefix)`` cut to fit ``context`` positions.

    A timed call runs the pending token and a tree of ``n`` nodes over ``p`` cached tokens and is
    cut back to them, so a probe over ``p`` fits when ``p + 1 + max(sizes)`` is at most
    ``context``. Unchanged when it fits (or the context is unknown); else the prefix is cut to
    at most half the context and the largest sizes are dropped (two kept) until the trees fit,
    then the prefix to what they leave; the long prefix is cut to what its largest tree leaves
    and dropped (no attention term) where it would no longer exceed the prefix.

    Raises:
        DecoderConfigError: even a 1-token prefix with the two smallest sizes does not fit.
    """
    sizes = list(sizes)
    if context is None:
        return sizes, prefix_tokens, long_prefix
    if prefix_tokens + 1 + sizes[-1] > context:
        least = 1 + 1 + sizes[1]
        if least > context:
            raise DecoderConfigError(
                f"the model's context of {context} positions is too short for the step-cost probe: even a "
                f"1-token prefix and trees of {sizes[0]} and {sizes[1]} nodes need {least}; pass measured "
                "costs (latticekit.decoding.costs.StepCosts) instead")
        prefix_tokens = min(prefix_tokens, max(1, context // 2))
        while len(sizes) > 2 and prefix_tokens + 1 + sizes[-1] > context:
            sizes.pop()
        prefix_tokens = min(prefix_tokens, context - 1 - sizes[-1])
    if long_prefix is not None:
        long_prefix = min(long_prefix, context - 1 - sizes[-1])
        if long_prefix <= prefix_tokens:
            long_prefix = None
    return sizes, prefix_tokens, long_prefix


def describe(model: Any) -> dict[str, Any]:
    """What the step costs depend on: the model's shape and dtype, its preparation, the device,
    torch's version and threads, the machine."""
    import torch

    param = next(model.parameters())
    config = getattr(model, "config", None)
    shape = {}
    if config is not None:
        for key in ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads", "num_key_value_heads", "vocab_size"):
            if hasattr(config, key):
                shape[key] = getattr(config, key)
    prep = getattr(model, "latticekit_preparation", None)
    device = param.device
    return {
        "model": type(model).__name__,
        "shape": shape,
        "parameters": sum(p.numel() for p in model.parameters()),
        "dtype": str(param.dtype),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu: {cpu_name()}",
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "prepared": prep.describe() if prep is not None else "no",
    }


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/latticekit`` (``~/.cache/latticekit`` when unset)."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "latticekit"


def step_costs(model: Any, cache_dir: Optional[Any] = None, refresh: bool = False, **measure: Any) -> StepCosts:
    """The model's :class:`StepCosts`, measured once and cached per model, device and threads.

    Args:
        model: the (prepared) target.
        cache_dir: where the JSON files live (default :func:`default_cache_dir`); ``False``
            measures without caching.
        refresh: measure again even when a cached file exists.
        measure: arguments of :func:`measure_step_costs` (part of the cache key).

    Returns:
        The costs; ``description["cache_file"]`` names the file they came from or went to.
    """
    key_data = {"version": COSTS_VERSION, **describe(model), **{k: measure[k] for k in sorted(measure)}}
    key = hashlib.sha256(json.dumps(key_data, sort_keys=True, default=str).encode()).hexdigest()[:16]
    if cache_dir is False:
        return measure_step_costs(model, **measure)
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = folder / f"step-costs-{key}.json"
    if path.exists() and not refresh:
        try:
            costs = StepCosts.from_json(json.loads(path.read_text()))
            costs.description["cache_file"] = str(path)
            return costs
        except (OSError, ValueError, KeyError, TypeError):
            pass  # a damaged or older file is measured again and replaced
    costs = measure_step_costs(model, **measure)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with atomic_write(path) as f:
            f.write((json.dumps(costs.to_json(), indent=1) + "\n").encode())
        costs.description["cache_file"] = str(path)
    except OSError as exc:  # a read-only home: the measurement still serves this process
        costs.description["cache_file"] = f"not written: {exc}"
    return costs
