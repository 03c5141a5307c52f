"""Lattices from draft heads: what a decode step turns the target's hidden state into.

Two sources, both ``source(hidden, ids) -> (lattice, entropy or None)``:

* :class:`FullLattice`: every head over the whole vocabulary, log-softmax scored, with each
  head's entropy: the exact lattice the paper's decoders, replay traces and analyses use.
* :class:`CandidateLattice`: heads 2..h over a candidate vocabulary (the n-gram model's most
  probable tokens and every token of the decoded text), scored by a log-softmax over the
  candidates. Drafts need not be exact (verification is), and on a CPU the full projection of
  seven head states onto SmolLM2's 49,152 words costs ~3.4 ms of a ~25 ms step, the candidate
  one (8,192 words plus the context) ~0.3 ms. The arcs are the candidates' top k; a token
  outside the candidates is never drafted. Measured coverage of SmolLM2's greedy tokens on
  held-out stdlib code and documentation by the shipped 4-gram's 8,192 most probable tokens and
  the context: 94-100% (median 98.7%).

Both fix lattice position 1 to the root (the token the last call emitted; head 1 is the
target's own head). Both can **unite** the next lattice's columns with other candidates
(:meth:`FullLattice.unite`: ``heads+ngram`` adds the n-gram models' continuations the heads'
top k missed), each scored by the heads like the top-k arcs (the same log-softmax), so the
search rescores them exactly as it rescores the heads' own arcs.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Optional, Union, cast

import numpy as np
import torch

from latticekit.errors import HeadsError, HeadsMismatchError
from latticekit.lattice import SausageLattice
from latticekit.torch.prepare import native_bfloat16, pack_rows, packable

if TYPE_CHECKING:
    from typing_extensions import TypeGuard

    from latticekit.heads.protocol import DraftHeads, ProjectedHeads

__all__ = ["FullLattice", "CandidateLattice", "candidate_dtype", "candidate_lattices", "full_lattices", "lattice_source", "entropy_of_logprobs", "head_logits", "united"]


def head_logits(heads: DraftHeads, hidden: torch.Tensor, vocab_size: int,
                next_token: Optional[Union[int, torch.Tensor]] = None) -> torch.Tensor:
    """``heads(hidden)``, checked: `(h >= 2, vocab)` for one hidden state, `(rows, h >= 2,
    vocab)` for a batch `(rows, hidden)`. Heads that read the token at t + 1
    (``token_conditioned``, :class:`latticekit.heads.BlockHeads`) get ``next_token`` (a tensor of
    `(rows,)` ids for a batch).

    Raises:
        HeadsMismatchError: the heads returned something else (a :class:`HeadsError`).
    """
    if next_token is not None and getattr(heads, "token_conditioned", False):
        logits = heads(hidden, next_token=next_token)
    else:
        logits = heads(hidden)
    lead = tuple(hidden.shape[:-1])
    if not isinstance(logits, torch.Tensor) or tuple(logits.shape[:-2]) != lead or logits.dim() != len(lead) + 2 \
            or logits.shape[-1] != vocab_size or logits.shape[-2] < 2:
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        rows = f"({lead[0]}, h >= 2, {vocab_size}) for {lead[0]} rows" if lead else f"(h >= 2, {vocab_size})"
        raise HeadsMismatchError(f"heads(hidden) must return logits of shape {rows}, got {shape}")
    return logits


def entropy_of_logprobs(logprobs: torch.Tensor) -> np.ndarray:
    """Entropy (nats) over the last axis of log-probabilities, as float64 numpy."""
    return (-(logprobs.exp() * logprobs).sum(dim=-1)).double().cpu().numpy()


def united(lattice: SausageLattice, columns: Sequence[Sequence[int]],
           logprobs: Callable[[int, np.ndarray], np.ndarray]) -> SausageLattice:
    """``lattice`` with the arcs of each draft position united with more tokens.

    Args:
        lattice: a single lattice, `(h, k)`.
        columns: ``columns[j]``: tokens for lattice position j + 2 (row j + 1), j < h - 1.
        logprobs: ``logprobs(row, tokens (m,)) -> (m,)``: the heads' log-probabilities of the
            tokens at that row; a token scored NaN or -inf (one the heads cannot score) is left out.

    Returns:
        The lattice with every row's new tokens after its own arcs (k grows to the widest row).
    """
    rows = []
    for i in range(lattice.h):
        width = int(lattice.widths[i])
        tokens, scores = lattice.tokens[i, :width], lattice.scores[i, :width]
        if 1 <= i <= len(columns):
            have = set(tokens.tolist())
            new = np.array([t for t in dict.fromkeys(int(t) for t in columns[i - 1]) if t not in have], dtype=np.int64)
            if new.size:
                extra = np.asarray(logprobs(i, new), dtype=np.float32)
                keep = np.isfinite(extra)
                tokens = np.concatenate([tokens, new[keep].astype(np.int32)])
                scores = np.concatenate([scores, extra[keep]])
        rows.append((tokens, scores))
    k = max(len(t) for t, _ in rows)
    tokens_out = np.zeros((lattice.h, k), dtype=np.int32)
    scores_out = np.zeros((lattice.h, k), dtype=np.float32)
    widths = np.zeros(lattice.h, dtype=np.int32)
    for i, (tokens, scores) in enumerate(rows):
        tokens_out[i, :len(tokens)], scores_out[i, :len(tokens)], widths[i] = tokens, scores, len(tokens)
    return SausageLattice(tokens_out, scores_out, widths)


class FullLattice:
    """Every head's top-k over the whole vocabulary (``SausageLattice.from_logits``), and the
    heads' entropies.

    Args:
        heads: ``heads(hidden (hidden,)) -> logits (h, vocab)``, row 0 the target's own head.
        k: arcs per position.
        vocab_size: the target's vocabulary size.
    """

    def __init__(self, heads: DraftHeads, k: int, vocab_size: int) -> None:
        self.heads, self.k, self.vocab_size = heads, k, vocab_size

    def __call__(self, hidden: torch.Tensor, ids: Sequence[int], columns: Sequence[Sequence[int]] = (),
                 entropy: bool = True) -> tuple[SausageLattice, Optional[np.ndarray]]:
        """The lattice after ``ids`` and, when ``entropy``, the heads' entropies; ``columns[j]``:
        tokens added to draft position j + 2, scored by the heads (:func:`united`)."""
        logits = head_logits(self.heads, hidden, self.vocab_size, int(ids[-1]))
        lattice = SausageLattice.from_logits(logits, self.k, fix_first=True)
        lattice.tokens[0, 0] = ids[-1]  # head 1's arg-max, or the sampled token when sampling
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        if columns:
            rows = logprobs.cpu().numpy()
            lattice = united(lattice, columns, lambda row, tokens: rows[row, tokens])
        return lattice, entropy_of_logprobs(logprobs) if entropy else None


#: Logits :func:`full_lattices` holds at once (rows x heads x vocabulary): about 64 MB in float32.
FULL_BATCH_LOGITS = 1 << 24


def full_lattices(sources: Sequence[FullLattice], hidden: torch.Tensor, ids: Sequence[Sequence[int]],
                  depth: Optional[int] = None) -> list[SausageLattice]:
    """One lattice per row of ``hidden`` (rows, hidden): row i's as ``sources[i](hidden[i],
    ids[i], entropy=False)`` makes it (the sources share their heads and k), but for the root:
    position 1 holds the token ``ids[i]`` ends with alone, scored 0, as it is given (head 1's
    logits are not computed where the heads project their states with one shared ``lm_head``,
    :class:`CandidateLattice.supports`). With ``depth``, only heads 2..depth + 1 run, and a
    lattice has depth + 1 positions: a search for chains of at most ``depth`` drafts reads no
    more (:meth:`~latticekit.drafting.chains.ChainDrafter.propose_lattice`).

    The heads run on the rows together, as many at once as keep their logits within
    :data:`FULL_BATCH_LOGITS`, and every head's top k of those rows is taken in one call: a
    batch reads the output projection once, not once per row. On the 2-core EPYC (2 threads),
    SmolLM2's shipped heads (7 draft heads over 49,152 words) at 16 rows: 79 ms with head 1 and
    ``F.linear``, 46 ms without head 1 and with the heads oneDNN-packed as the vLLM lattice
    proposer loads them, 19 ms at depth 2 (``benchmarks/heads_batch.py``).

    Raises:
        HeadsMismatchError: the heads returned something else than `(rows, h >= 2, vocab)`, or
            hold no draft head.
    """
    first = sources[0]
    heads, k = first.heads, first.k
    projected: Optional[ProjectedHeads] = heads if CandidateLattice.supports(heads) else None
    count = max(1, int(getattr(heads, "num_heads", 8)) - 1)  # draft heads, where the heads say how many
    if depth is not None:
        count = max(1, min(count, int(depth)))
    chunk = max(1, FULL_BATCH_LOGITS // ((count if projected is not None else count + 1) * first.vocab_size))
    out: list[SausageLattice] = []
    for start in range(0, hidden.shape[0], chunk):
        rows = hidden[start:start + chunk]
        roots = [int(row[-1]) for row in ids[start:start + chunk]]
        last = torch.tensor(roots, device=hidden.device)
        if projected is not None:
            logits = projected.lm_head(_draft_states(projected, rows, last, count))
        else:
            logits = head_logits(heads, rows, first.vocab_size, last)[:, 1:count + 1]
        if logits.shape[-1] != first.vocab_size or logits.shape[-2] < 1:
            raise HeadsMismatchError(f"heads' draft logits must have shape ({rows.shape[0]}, h >= 1, "
                                     f"{first.vocab_size}), got {tuple(logits.shape)}")
        drafts = SausageLattice.from_logits(logits, k)
        n, h = drafts.tokens.shape[0], drafts.tokens.shape[1] + 1
        tokens = np.full((n, h, k), -1, dtype=np.int32)  # a position's arcs past its width: -1
        scores = np.zeros((n, h, k), dtype=np.float32)
        widths = np.full((n, h), k, dtype=np.int32)
        tokens[:, 0, 0], widths[:, 0] = roots, 1  # the root: the token the last step emitted
        tokens[:, 1:], scores[:, 1:] = drafts.tokens, drafts.scores
        out.extend(SausageLattice(tokens[j], scores[j], widths[j]) for j in range(n))
    return out


#: Per class of heads, whether its ``head_states`` takes ``depth``.
_TAKES_DEPTH: "weakref.WeakKeyDictionary[type, bool]" = weakref.WeakKeyDictionary()


def _takes_depth(heads: Any) -> bool:
    """Whether ``heads.head_states`` takes ``depth`` (:meth:`latticekit.heads.BlockHeads.head_states`
    does; a user's heads following :class:`~latticekit.heads.protocol.ProjectedHeads` may not)."""
    kind = type(heads)
    if kind not in _TAKES_DEPTH:
        try:
            _TAKES_DEPTH[kind] = "depth" in inspect.signature(heads.head_states).parameters
        except (TypeError, ValueError):
            _TAKES_DEPTH[kind] = False
    return _TAKES_DEPTH[kind]


def _draft_states(heads: ProjectedHeads, hidden: torch.Tensor, last: Optional[torch.Tensor],
                  depth: Optional[int]) -> torch.Tensor:
    """Heads 2..depth + 1's states `(rows, depth, hidden)` for ``hidden`` `(rows, hidden)`
    (every draft head's without ``depth``), contiguous; heads whose ``head_states`` takes a
    ``depth`` compute no more (their other blocks' weights are not read). ``last``: the rows'
    last tokens, for token-conditioned heads."""
    kwargs = {"depth": depth} if depth is not None and _takes_depth(heads) else {}
    if last is not None and getattr(heads, "token_conditioned", False):
        states = heads.head_states(hidden, last, **kwargs)[:, 1:]
    else:
        states = heads.head_states(hidden, **kwargs)[:, 1:]
    # contiguous: a strided slice makes the product several times slower
    return (states if depth is None else states[:, :max(1, int(depth))]).contiguous()


def candidate_dtype(weight: torch.Tensor, setting: str = "auto") -> torch.dtype:
    """The dtype a :class:`CandidateLattice` projects its static candidates in, for an output
    projection's ``weight``: ``"auto"``, bfloat16 for a float32 weight on a CPU that computes
    bfloat16 products natively (AVX-512 BF16 or AMX, :func:`~latticekit.torch.prepare.native_bfloat16`),
    else the weight's own; ``"model"``, the weight's own; ``"bfloat16"``, bfloat16 (on a CPU
    where oneDNN does not pack bfloat16, AVX2 only, an unpacked emulated product: slower, the same
    drafts).

    Drafts, not outputs, change: the candidates' logits are rounded to bfloat16's 8 bits (on
    SmolLM2's shipped heads and 8,192 candidates, every head's first arc the same as in float32
    at 99-100% of draft positions and 98-99.5% of the top 8, scores within 0.3 nats; stop 63), and every
    draft is verified. The rows are half the bytes (19 MB for SmolLM2's 8,192 candidates). On the
    2-core AVX-512 EPYC from cold caches, the candidate lattices of every head took 2.8-3.3 ms
    against 3.1-3.6 for one row and 9.0-9.4 against 11.5-13.0 for sixteen
    (``benchmarks/results/heads_batch-63/``, ``benchmarks/heads_batch.py --dtypes``); inside
    vLLM the lattice proposer drafted in as many milliseconds either way (3.2-4.2 a step at one
    request), and ran as fast (``benchmarks/results/vllm_speed/candidate-dtype-63/``).

    Raises:
        ValueError: another setting.
    """
    if setting == "model":
        return weight.dtype
    if setting == "bfloat16":
        return torch.bfloat16
    if setting != "auto":
        raise ValueError(f"candidate dtype must be 'auto', 'model' or 'bfloat16', got {setting!r}")
    if weight.dtype == torch.float32 and weight.device.type == "cpu" and native_bfloat16():
        return torch.bfloat16
    return weight.dtype


#: Packed candidate rows per output projection, candidate set and dtype: built once, shared by decodes.
_PACKED: "weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple[bytes, torch.dtype], tuple[torch.Tensor, Any]]]" = \
    weakref.WeakKeyDictionary()


def _candidate_rows(projection: torch.nn.Module, static: np.ndarray, dtype: torch.dtype) -> tuple[torch.Tensor, Any]:
    """The rows of ``projection.weight`` for the ids ``static`` in ``dtype``, and their
    oneDNN-packed copy (None off the CPU or for other dtypes)."""
    weight = cast(torch.Tensor, projection.weight)  # a 2-d tensor: CandidateLattice.supports checked it
    per_weight = _PACKED.setdefault(projection, {})
    key = (static.tobytes(), dtype)
    if key not in per_weight:
        index = torch.from_numpy(static).to(weight.device)
        rows = weight.detach().index_select(0, index).to(dtype).contiguous()
        packed = None
        if rows.device.type == "cpu" and packable(rows.dtype):
            packed = pack_rows(rows)
        per_weight.clear()  # one candidate set (and dtype) per weight is kept
        per_weight[key] = (rows, packed)
    return per_weight[key]


class CandidateLattice:
    """Heads 2..h over a candidate vocabulary: ``static`` ids plus every token of the decoded text.

    Needs heads with ``head_states(hidden) -> (h, hidden)`` and a shared output projection
    ``lm_head`` (``latticekit.heads.BlockHeads``): the candidates' rows of its weight are
    projected (the static ones packed once on the CPU, the context's gathered as they appear).

    Args:
        heads: the draft heads.
        static: candidate token ids, e.g. :func:`lm_candidates`.
        k: arcs per position.
        dtype: what the static candidates are projected in (:func:`candidate_dtype`); default:
            the output projection's own dtype. The text's own tokens are projected in it always.
    """

    def __init__(self, heads: ProjectedHeads, static: np.ndarray, k: int, dtype: Optional[torch.dtype] = None) -> None:
        weight = heads.lm_head.weight.detach()
        self.heads, self.k = heads, k
        self.weight = weight
        vocab = weight.shape[0]
        static = np.unique(np.asarray(static, dtype=np.int64))
        static = static[(static >= 0) & (static < vocab)]
        self.covered = np.zeros(vocab, dtype=bool)
        self.covered[static] = True
        self._rows, self._packed = _candidate_rows(heads.lm_head, static, dtype or weight.dtype)
        self._candidate_ids = static  # column -> token id of the projection's output
        self._column = np.full(vocab, -1, dtype=np.int64)  # token id -> column, -1 if not a candidate
        self._column[static] = np.arange(len(static))
        self._extra_ids: list[int] = []
        self._extra_rows = weight.new_empty((0, weight.shape[1]))
        self._seen = 0  # tokens of the decoded text already added

    @staticmethod
    def supports(heads: DraftHeads) -> TypeGuard[ProjectedHeads]:
        """Whether ``heads`` expose ``head_states`` and project every draft head with the shared
        ``lm_head`` (no per-head projections, no logit scale)."""
        weight = getattr(getattr(heads, "lm_head", None), "weight", None)
        return (callable(getattr(heads, "head_states", None)) and isinstance(weight, torch.Tensor)
                and weight.dim() == 2 and getattr(heads, "projections", None) is None
                and float(getattr(heads, "logit_scale", 1.0)) == 1.0)

    def _add_context(self, ids: Sequence[int]) -> None:
        new = [int(t) for t in ids[self._seen:] if 0 <= int(t) < self.covered.shape[0]]
        self._seen = len(ids)
        fresh = [t for t in dict.fromkeys(new) if not self.covered[t]]
        if fresh:
            self.covered[fresh] = True
            self._extra_ids += fresh
            index = torch.tensor(fresh, dtype=torch.long, device=self.weight.device)
            self._extra_rows = torch.cat([self._extra_rows, self.weight.index_select(0, index)])
            self._column[fresh] = np.arange(len(self._candidate_ids), len(self._candidate_ids) + len(fresh))
            self._candidate_ids = np.concatenate([self._candidate_ids, np.asarray(fresh, dtype=np.int64)])

    def _project_static(self, states: torch.Tensor) -> torch.Tensor:
        """``states`` (n, hidden) projected on the static candidates' rows (in their dtype), in
        the states' dtype."""
        rows = states.to(self._rows.dtype)
        if self._packed is not None:
            out = torch.ops.mkldnn._linear_pointwise(rows, self._packed, None, "none", [], "")
        else:
            out = rows @ self._rows.T
        return out.to(states.dtype)

    def __call__(self, hidden: torch.Tensor, ids: Sequence[int], columns: Sequence[Sequence[int]] = (),
                 entropy: bool = True) -> tuple[SausageLattice, None]:
        """As :meth:`FullLattice.__call__`; a column token outside the candidate vocabulary is
        left out."""
        return candidate_lattices([self], hidden[None], [ids], columns)[0], None

    def _lattice(self, states: torch.Tensor, static: torch.Tensor, ids: Sequence[int],
                 columns: Sequence[Sequence[int]]) -> SausageLattice:
        """The lattice of heads 2..h's ``states`` (h - 1, hidden), their logits over the static
        candidates ``static`` already projected (the text's tokens projected here)."""
        self._add_context(ids)
        if self._extra_ids:
            static = torch.cat([static, states @ self._extra_rows.T], dim=1)
        logits = static.float()
        k = min(self.k, logits.shape[1])
        values, index = torch.topk(logits, k, dim=-1)
        normaliser = torch.logsumexp(logits, dim=-1, keepdim=True)
        scores = (values - normaliser).cpu().numpy()
        top = index.cpu().numpy()
        h = states.shape[0] + 1
        tokens = np.zeros((h, k), dtype=np.int32)
        out_scores = np.zeros((h, k), dtype=np.float32)
        widths = np.full(h, k, dtype=np.int32)
        tokens[0, 0], widths[0] = ids[-1], 1
        tokens[1:] = self._candidate_ids[top]
        out_scores[1:] = scores
        if not np.isfinite(out_scores).all():
            raise HeadsError("the heads' logits are not finite (NaN or inf)")
        lattice = SausageLattice(tokens, out_scores, widths)
        if columns:
            lattice = united(lattice, columns, self._scorer(logits - normaliser))
        return lattice

    def _scorer(self, logprobs: torch.Tensor) -> Callable[[int, np.ndarray], np.ndarray]:
        """``(row, tokens) -> log-probabilities`` over the candidates (NaN for other tokens);
        ``logprobs`` `(h - 1, candidates)` are heads 2..h's, so lattice row r is ``r - 1``."""
        rows = logprobs.cpu().numpy()
        column = self._column

        def score(row: int, tokens: np.ndarray) -> np.ndarray:
            inside = (tokens >= 0) & (tokens < len(column))
            at = np.where(inside, column[np.where(inside, tokens, 0)], -1)
            return np.where(at >= 0, rows[row - 1, np.maximum(at, 0)], np.nan)

        return score


def candidate_lattices(sources: Sequence[CandidateLattice], hidden: torch.Tensor, ids: Sequence[Sequence[int]],
                       columns: Sequence[Sequence[int]] = (), depth: Optional[int] = None) -> list[SausageLattice]:
    """One lattice per row of ``hidden`` (rows, hidden): row i's from ``sources[i]`` after
    ``ids[i]``, as :meth:`CandidateLattice.__call__` makes it. The heads run once on the whole
    batch and the static candidates are projected in one product (the sources share heads and
    static candidates); each row's own text tokens are projected for it alone. With ``depth``,
    only heads 2..depth + 1 are projected and a lattice has depth + 1 positions, as
    :func:`full_lattices` cuts them: a search for chains of at most ``depth`` drafts reads no
    more (a batch whose rows may draft 2 tokens projects 2 of 7 heads' states)."""
    first = sources[0]
    last = None
    if getattr(first.heads, "token_conditioned", False):
        last = torch.tensor([int(row[-1]) for row in ids], dtype=torch.long, device=hidden.device)
    states = _draft_states(first.heads, hidden, last, depth)
    rows, heads, width = states.shape
    static = first._project_static(states.reshape(rows * heads, width)).reshape(rows, heads, -1)
    return [source._lattice(states[i], static[i], ids[i], columns) for i, source in enumerate(sources)]


def lattice_source(heads: DraftHeads, k: int, vocab_size: int, vocabulary: Optional[np.ndarray] = None,
                   dtype: str = "model") -> Any:
    """Where a decode's lattices come from: ``source(hidden, ids, columns=()) -> (lattice,
    entropy)``. Over ``vocabulary`` (a drafter's :meth:`~latticekit.drafting.Drafter.lattice_vocabulary`)
    and the decoded text's tokens where the heads support it (:class:`CandidateLattice`, its
    static candidates projected in :func:`candidate_dtype`'s choice for ``dtype``), else the
    exact full-vocabulary lattice (:class:`FullLattice`). ``generate`` keeps the default,
    the model's dtype: with ``"auto"`` (bfloat16 on stop 63's AVX-512 BF16 EPYC) ``generate`` with
    the shipped heads ran at 0.979x / 0.952x ``generate`` without them on code / instruction
    prompts, against 1.011x / 1.025x at the commit before, in two runs one after the other
    (``benchmarks/results/sources/persisted-63/``, stop 63): not one run's A/B, but no gain to
    keep it for. The vLLM lattice proposer passes its ``candidate_dtype`` setting.

    Raises:
        ValueError: ``dtype`` is not a setting of :func:`candidate_dtype`.
    """
    if vocabulary is not None and len(vocabulary) and CandidateLattice.supports(heads):
        return CandidateLattice(heads, vocabulary, k, candidate_dtype(heads.lm_head.weight, dtype))
    return FullLattice(heads, k, vocab_size)
