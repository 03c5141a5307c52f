"""Replay: the block efficiency of many greedy decoders from one greedy pass per prompt.

Under greedy acceptance, what a BPD step accepts depends only on its drafts and the target's
greedy continuation: a draft token is accepted exactly when it and every token before it equal
the greedy tokens. And the heads at the next step read the target's final hidden state after
the last accepted token, which is the hidden state greedy decoding computes at that position.
So one greedy decode that records its hidden state at every position (a :class:`Trace`: the
continuation, every position's top-k head lattice and head entropies) determines every
greedy-mode decoder's steps: :func:`replay` walks them with no further target call.

That makes the paper's measurements (many decoders, an alpha grid, hundreds of prompts of 128
tokens) affordable on a CPU: the target runs once per prompt, batched, instead of once per
decoder and alpha. The numbers equal :func:`latticekit.decoding.decode`'s up to floating-point
rounding, which differs between a batched greedy pass and a tree pass and can flip a near-tie
of the target's arg-max; ``tests/decoding/test_replay.py`` checks that replayed steps equal decoded
ones, and ``latticekit eval --engine both`` measures the agreement on real prompts.

Wall-clock figures need real decodes (``--engine decode``); a replay times the heads and the
rescoring search only.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from latticekit._files import atomic_write
from latticekit.decoding.records import Decoding
from latticekit.decoding.steps import check_max_new_tokens, eos_set, run_steps
from latticekit.drafting.config import DecoderConfig
from latticekit.drafting.protocol import make_drafter
from latticekit.drafting.tree import Draft
from latticekit.errors import DecoderConfigError
from latticekit.eval.analysis import block_efficiency
from latticekit.lattice import SausageLattice

if TYPE_CHECKING:
    from latticekit.heads.protocol import DraftHeads

__all__ = [
    "TRACE_VERSION",
    "Trace",
    "trace_prompts",
    "replay",
    "TraceTarget",
    "replay_all",
    "tune_alpha",
]


@dataclass
class Trace:
    """One prompt's greedy continuation and the heads' lattice at every position.

    Position i is the step whose root is ``continuation[i]``: the heads read the hidden state
    that predicted it (after ``prompt + continuation[:i]``).

    Attributes:
        prompt: the prompt ids.
        continuation: ``N`` greedy tokens.
        lattice_tokens, lattice_scores, widths (`(N, h, k)`, `(N, h, k)`, `(N, h)`): the top-k
            lattices (``fix_first``: column 1 is the root alone).
        head_entropy (`(N, h)`): entropy (nats) of each head's distribution.
        heads_s: seconds of heads and top-k per position (the batched cost, divided).
    """

    prompt: list[int]
    continuation: list[int]
    lattice_tokens: np.ndarray
    lattice_scores: np.ndarray
    widths: np.ndarray
    head_entropy: np.ndarray
    heads_s: float = 0.0

    @property
    def num_heads(self) -> int:
        return int(self.lattice_tokens.shape[1])

    @property
    def k(self) -> int:
        return int(self.lattice_tokens.shape[2])

    def lattice(self, i: int, k: int) -> SausageLattice:
        """Position i's lattice cut to its best k arcs per column."""
        if k > self.k:
            raise DecoderConfigError(f"decoder k={k} exceeds the traced k={self.k}")
        return SausageLattice(self.lattice_tokens[i, :, :k], self.lattice_scores[i, :, :k],
                              np.minimum(self.widths[i], k))

    def save(self, path: Any) -> None:
        """Writes a compressed ``.npz`` atomically (temporary file in the same folder, then rename)."""
        with atomic_write(path) as f:
            np.savez_compressed(f, prompt=np.asarray(self.prompt, dtype=np.int64),
                                continuation=np.asarray(self.continuation, dtype=np.int64),
                                lattice_tokens=self.lattice_tokens, lattice_scores=self.lattice_scores,
                                widths=self.widths, head_entropy=self.head_entropy,
                                heads_s=np.float64(self.heads_s))

    @classmethod
    def load(cls, path: Any) -> "Trace":
        """Reads :meth:`save`'s file.

        Raises:
            DecoderConfigError: the file is missing, damaged or not a trace.
        """
        try:
            with np.load(path) as z:
                return cls(z["prompt"].tolist(), z["continuation"].tolist(), z["lattice_tokens"],
                           z["lattice_scores"], z["widths"], z["head_entropy"], float(z["heads_s"]))
        except Exception as exc:  # zipfile, pickle and key errors alike
            raise DecoderConfigError(f"{path} is not a readable trace: {type(exc).__name__}: {exc}") from exc


#: Bumped whenever what a trace holds, or how it is computed, changes: old cache files then miss.
TRACE_VERSION = 1


def _trace_key(description: str, prompt: Sequence[int], num_tokens: int, k: int) -> str:
    text = f"v{TRACE_VERSION}|{description}|{num_tokens}|{k}|{','.join(map(str, prompt))}"
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def trace_prompts(model: Any, heads: DraftHeads, prompts: Sequence[Sequence[int]], num_tokens: int, k: int,
                  batch_size: int = 8, cache_dir: Optional[Any] = None, description: str = "",
                  progress: Optional[Callable[[str], None]] = None) -> list[Trace]:
    """Greedy-decodes ``num_tokens`` tokens after each prompt (batched, KV cache) and records
    every position's head lattice. The target runs through
    :meth:`latticekit.torch.Target.forward_last`, the adapter's plain batched pass.

    Args:
        model: an HF causal LM (its output embeddings' input is the heads' hidden state).
        heads: ``heads(hidden (..., d)) -> logits (..., h, vocab)`` (``latticekit.heads.BlockHeads``).
        prompts: prompt ids; prompts of equal length share batches (no padding is ever used).
        num_tokens: greedy tokens per prompt; replaying ``max_new_tokens`` needs
            ``max_new_tokens + h - 1``.
        k: arcs per lattice column to keep (the largest k any replayed decoder uses).
        batch_size: prompts per batched greedy pass.
        cache_dir: keep traces there as ``.npz`` keyed by ``description``, prompt, N and k, and
            reuse them.
        description: names the target model (weights, dtype, device) in the cache key; the
            heads' own fingerprint (:func:`latticekit.heads.heads_fingerprint`) is added to it. Required with
            ``cache_dir``.
        progress: called with a line per batch.

    Raises:
        DecoderConfigError: an empty prompt, ``num_tokens < 1``, ``cache_dir`` without
            ``description``, a model that is not an HF causal LM, or heads whose first row
            does not reproduce the model's greedy token.
        UnsupportedModelError: an HF model without output embeddings.
    """
    import torch
    from transformers import DynamicCache, PreTrainedModel

    from latticekit.heads.fingerprint import heads_fingerprint
    from latticekit.torch.target import Target

    if num_tokens < 1:
        raise DecoderConfigError(f"num_tokens must be >= 1, got {num_tokens}")
    cache = Path(cache_dir) if cache_dir is not None else None
    if cache is not None:
        if not description:
            raise DecoderConfigError("a trace cache needs a description of the target model for its keys")
        cache.mkdir(parents=True, exist_ok=True)
        description = f"{description}|heads={heads_fingerprint(heads)}"
    out: list[Optional[Trace]] = [None] * len(prompts)
    todo: dict[int, list[int]] = {}
    for n, prompt in enumerate(prompts):
        if not prompt:
            raise DecoderConfigError("an empty prompt cannot be traced")
        path = cache / f"{_trace_key(description, prompt, num_tokens, k)}.npz" if cache is not None else None
        if path is not None and path.exists():
            try:
                out[n] = Trace.load(path)
                continue
            except DecoderConfigError:
                pass  # a damaged cache file is traced again and overwritten
        todo.setdefault(len(prompt), []).append(n)
    if not todo:
        return [t for t in out if t is not None]
    if not isinstance(model, PreTrainedModel):
        raise DecoderConfigError(f"tracing needs an HF causal LM, got {type(model).__name__}; "
                                 "use latticekit.decoding.decode for protocol modules")
    target = Target(model, tree_masks=False)  # plain batched passes: any attention will do
    device = target.head.weight.device
    done = 0
    total = sum(len(v) for v in todo.values())
    for length, members in todo.items():
        for start in range(0, len(members), batch_size):
            batch = members[start:start + batch_size]
            t0 = time.perf_counter()
            with torch.no_grad():
                kv = DynamicCache(config=model.config)  # batched rows: not the batch-1 SlabCache
                ids = torch.tensor([list(prompts[n]) for n in batch], dtype=torch.long, device=device)
                tokens, hidden = [], []
                step_ids = ids
                for _ in range(num_tokens):
                    logits, last_hidden = target.forward_last(step_ids, kv)
                    hidden.append(last_hidden)
                    step_ids = logits.argmax(dim=-1, keepdim=True)
                    tokens.append(step_ids[:, 0])
            t1 = time.perf_counter()
            hidden_t = torch.stack(hidden, dim=1)  # (B, N, d)
            conts = torch.stack(tokens, dim=1).cpu()
            for b, n in enumerate(batch):
                out[n] = trace = _lattices(heads, hidden_t[b], list(prompts[n]), conts[b].tolist(), k)
                if cache is not None:
                    trace.save(cache / f"{_trace_key(description, prompts[n], num_tokens, k)}.npz")
            done += len(batch)
            if progress:
                progress(f"traced {done}/{total} prompts (greedy {t1 - t0:.1f} s, heads "
                         f"{time.perf_counter() - t1:.1f} s for {len(batch)})")
    return [t for t in out if t is not None]


def _lattices(heads: DraftHeads, hidden: Any, prompt: list[int], continuation: list[int], k: int,
              chunk: int = 32) -> Trace:
    import torch

    from latticekit.decoding.lattices import entropy_of_logprobs

    t0 = time.perf_counter()
    parts = []
    entropies = []
    roots = torch.tensor(continuation, dtype=torch.long)
    gaps = []
    with torch.no_grad():
        for s in range(0, hidden.shape[0], chunk):
            if getattr(heads, "token_conditioned", False):  # they read the decoded token, as in decode()
                logits = heads(hidden[s:s + chunk], next_token=roots[s:s + chunk].to(hidden.device)).float()
            else:
                logits = heads(hidden[s:s + chunk]).float()  # (n, h, V)
            logp = torch.log_softmax(logits, dim=-1)
            entropies.append(entropy_of_logprobs(logp))
            parts.append(SausageLattice.from_logits(logits, k, fix_first=True))
            head1 = logp[:, 0]
            chunk_roots = roots[s:s + chunk, None].to(head1.device)
            gaps.append((head1.max(dim=-1).values - head1.gather(-1, chunk_roots)[:, 0]).cpu())
    tokens = np.concatenate([p.tokens for p in parts])
    scores = np.concatenate([p.scores for p in parts])
    widths = np.concatenate([p.widths for p in parts])
    # Head 1 is the model's own head, so its arg-max is the greedy token, up to ties (top-k and
    # arg-max may break them differently) and rounding (another batch shape): the lattice's
    # fixed first column is the greedy token itself, as in decode().
    worst = float(torch.cat(gaps).max())
    if worst > 1e-3:
        raise DecoderConfigError(f"heads(hidden)[0] does not reproduce the model's greedy token (log-prob "
                                 f"{worst:.3g} below the best): are these heads for this model?")
    tokens[:, 0, 0] = roots.numpy()
    return Trace(prompt, continuation, tokens, scores, widths, np.concatenate(entropies),
                 (time.perf_counter() - t0) / max(1, len(continuation)))


class TraceTarget:
    """A greedy trace as the decoding loop's target (:class:`~latticekit.decoding.steps.StepTarget`):
    a step accepts the longest prefix the draft shares with the greedy continuation, then the
    continuation's next token; the lattice at a position is the trace's."""

    timed = False

    def __init__(self, trace: Trace, k: int) -> None:
        self.trace, self.k = trace, k
        self.prompt_length = len(trace.prompt)
        self.lattice_s: Optional[float] = trace.heads_s

    def first(self, ids: list[int]) -> tuple[int, ...]:
        return (self.trace.continuation[0],)

    def verify(self, ids: list[int], draft: Draft) -> tuple[tuple[int, ...], int]:
        cont = self.trace.continuation
        i = len(ids) - 1 - self.prompt_length  # the root's position in the continuation
        # a greedy tree pass accepts the longest path of the draft on the greedy tokens
        # (drafts from the n-gram models may reach past the heads: the trace's end bounds them)
        accepted, _ = draft.accepted(cont, i + 1)
        return tuple(cont[i + 1: i + 2 + accepted]), accepted

    def lattice(self, ids: list[int], columns: Sequence[Sequence[int]],
                entropy: bool) -> tuple[SausageLattice, Optional[np.ndarray]]:
        i = len(ids) - 1 - self.prompt_length
        return self.trace.lattice(i, self.k), self.trace.head_entropy[i].copy()


def replay(trace: Trace, config: DecoderConfig, max_new_tokens: int, lms: Any = None,
           rescorer: Any = None, eos_token_id: Optional[int] = None, costs: Any = None,
           acceptance: Any = None, memory: Any = None) -> Decoding:
    """The steps :func:`latticekit.decoding.decode` takes with ``config`` (greedy mode), from a trace.

    The same :class:`~latticekit.drafting.Drafter` as a real decode drafts every step; the
    trace stands in for the target: a step accepts the longest prefix any draft shares with the
    greedy continuation, and the next lattice is the trace's at the new root.

    Args:
        trace: from :func:`trace_prompts`, with at least ``max_new_tokens + h - 1`` tokens.
        config: a greedy-mode decoder (``temperature == 0``); ``greedy`` gives one token a step.
        max_new_tokens: tokens to decode.
        lms: the n-gram model(s), as for ``decode``.
        rescorer: the :class:`~latticekit.eval.rescorer.NeuralRescorer` (``neural``).
        eos_token_id: stop after emitting it.
        costs, acceptance: ``auto`` only: the target's step costs (required: a trace has no
            target to time) and the acceptance model to start from. A replayed ``auto`` drafts
            from the trace's full-vocabulary lattices; a decode from candidate-vocabulary ones
            (:class:`~latticekit.decoding.lattices.CandidateLattice`) when it has an n-gram model.
        memory: earlier answers, as for ``decode``: read while drafting, the replayed tokens
            added at the end.

    Returns:
        A :class:`Decoding` with ``replayed = True``: its steps (drafts, accepted tokens,
        lattices, entropies, heads and search seconds; no target seconds) and tokens. Heads
        seconds, and a neural rescorer's, are the batched cost over the trace divided per
        position; an n-gram search is timed step by step.

    Raises:
        DecoderConfigError: a sampling config, ``max_new_tokens`` beyond the trace, k beyond
            the traced k, a missing n-gram model or rescorer.
        latticekit.eval.rescorer.RescorerError: a rescorer with too few positions for the heads,
            or one whose vocabulary misses a token id of the trace.
    """
    if config.temperature > 0:
        raise DecoderConfigError("replay covers greedy decoding only; sampling needs real decodes")
    check_max_new_tokens(max_new_tokens)
    h = trace.num_heads
    cont = trace.continuation
    if max_new_tokens + h - 1 > len(cont):
        raise DecoderConfigError(f"replaying {max_new_tokens} tokens needs a trace of at least "
                                 f"{max_new_tokens + h - 1} tokens, this one has {len(cont)}")
    prompt = list(trace.prompt)
    # A trace does not record the target's vocabulary size: every id it holds must fit.
    largest = max(max(prompt, default=0), max(cont), int(trace.lattice_tokens.max(initial=0)))
    drafter = make_drafter(config, lms=lms, rescorer=rescorer, reference=prompt + list(cont), num_heads=h,
                           has_heads=True, largest_id=largest, costs=costs, acceptance=acceptance, memory=memory)
    if drafter.k > trace.k:
        raise DecoderConfigError(f"decoder k={drafter.k} exceeds the traced k={trace.k}")
    out = run_steps(TraceTarget(trace, drafter.k), drafter, config, prompt, max_new_tokens, eos_set(eos_token_id))
    if memory is not None:
        memory.add(out.tokens, context=prompt)
    return out


def replay_all(traces: Sequence[Trace], configs: Sequence[DecoderConfig], max_new_tokens: int,
               lms: Any = None, rescorer: Any = None, eos_token_id: Optional[int] = None,
               costs: Any = None) -> dict[str, list[Decoding]]:
    """:func:`replay` of every config (and the greedy baseline first) over traces: decoder
    label -> one decoding per trace. ``costs``: the target's step costs (``auto``)."""
    greedy = DecoderConfig("greedy")
    per: dict[str, list[Decoding]] = {"greedy": []}
    for trace in traces:
        per["greedy"].append(replay(trace, greedy, max_new_tokens, eos_token_id=eos_token_id))
        for config in configs:
            per.setdefault(config.label, []).append(
                replay(trace, config, max_new_tokens, lms, rescorer, eos_token_id, costs=costs))
    return per


def tune_alpha(traces: Sequence[Trace], config: DecoderConfig, alphas: Sequence[float], max_new_tokens: int,
               lms: Any = None, rescorer: Any = None, eos_token_id: Optional[int] = None,
               costs: Any = None) -> dict[float, float]:
    """Block efficiency of ``config`` at every alpha over ``traces`` (the tuning prompts)."""
    from dataclasses import replace

    table = {}
    for alpha in alphas:
        tuned = replace(config, alpha=float(alpha), name=None)
        table[float(alpha)] = block_efficiency(
            replay(t, tuned, max_new_tokens, lms, rescorer, eos_token_id, costs=costs) for t in traces)
    return table
