"""The configuration of latticekit's vLLM proposer, and where the engine's processes find it.

vLLM builds the proposer from a class path alone (``speculative_config={"method":
"custom_class", "model": "latticekit.vllm.NGramProposer", ...}``) inside its worker process,
so latticekit's own settings travel in the environment, which the worker inherits:
``LATTICEKIT_VLLM_CONFIG`` holds a JSON object or the path of a JSON file.
:func:`speculative_config` checks the settings in the caller's process, sets the variable and
returns vLLM's ``speculative_config``; the worker reads and checks them again when the engine
starts, so a bad value or a missing file stops the engine there, with the key named, never at
its first step.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Optional

from latticekit.drafting.arms import PROBE_BUDGET
from latticekit.drafting.cache_model import MAX_ORDER
from latticekit.drafting.memory import DEFAULT_CONTEXT, DEFAULT_MAX_TOKENS
from latticekit.errors import ProposerConfigError

__all__ = ["ENV", "ARMS", "ProposerConfig", "speculative_config", "PROPOSER", "LATTICE_PROPOSER"]

#: The environment variable the worker reads its settings from.
ENV = "LATTICEKIT_VLLM_CONFIG"
#: vLLM's ``speculative_config["model"]`` for the n-gram proposer.
PROPOSER = "latticekit.vllm.NGramProposer"
#: ... and for the lattice proposer (draft heads, ``heads`` set).
LATTICE_PROPOSER = "latticekit.vllm.LatticeProposer"
#: The ways of drafting the proposer chooses among by their outcomes (``arms``): a draft token
#: priced at the fitted step cost (``model``), at a quarter of it (``eager``) or at four times it
#: (``lean``), no drafting at all (``plain``), or the lattice proposer's n-grams alone, its heads
#: not run (``text``, priced as ``model``).
ARMS = ("model", "eager", "lean", "plain", "text")


@dataclass(frozen=True)
class ProposerConfig:
    """What latticekit's vLLM proposer drafts with.

    Attributes:
        lm: a Katz n-gram model over the target's token ids, interpolated with each request's own
            n-grams: an ARPA file (``.arpa``, ``.arpa.gz``), a latticekit binary model, or
            ``"embedded"`` (the 4-gram over SmolLM2's tokens that ships with latticekit). None:
            each request's own text alone.
        candidates: candidate-tree nodes searched per request and step.
        max_depth: the longest chain (vLLM's ``num_speculative_tokens`` bounds it too).
        max_context: tokens of a prompt the request's cache model reads (its last ones): bounds
            the work and memory of a very long prompt.
        max_requests: request states kept at once; beyond it the least recently seen (a
            preempted request waiting to resume) is dropped and rebuilt if it comes back.
        prior_ratio: a draft token's cost as a fraction of a step's fixed cost, until the
            engine's own steps measure it.
        step_costs: ``(a, b)``: fixed step seconds ``a + b * query tokens`` instead of
            measuring them (tests, replays); None measures them as the engine runs.
        context_costs: fit the measured step seconds as ``a + b * query tokens + c * keys
            attended`` (per row, its query tokens times its context), so that a request's draft
            token costs ``b + c * its context`` (:class:`~latticekit.drafting.chains.CostFit`):
            on vLLM's CPU build a draft token after 1,536 tokens costs about three times one
            after 64. Off by default (one price per query token, ``c`` = 0): in
            ``benchmarks/vllm_speed.py`` the proposer with it ran at 0.98x the one without
            (the median of 27 groups; 0.89x at 4 requests), and at 1.05x on held-out prompts
            at one request (docs/vllm.md).
        stats: a JSON file the proposer rewrites with its counters at most every half second while
            it is called, and when it learns that requests finished, off the engine's thread
            (steps, drafted, accepted and proposed tokens, drafting seconds, errors, fitted costs);
            :func:`~latticekit.vllm.engine.engine_stats` reads it up to date.
        heads: draft heads for the lattice proposer (``LatticeProposer``): a latticekit heads
            file (``BlockHeads.save``) or a Medusa checkpoint folder (vLLM's or FasterDecoding's
            layout, :mod:`latticekit.heads.medusa`). None: the n-gram proposer.
        vocabulary: where no ``lm`` gives the heads' candidates (its 8,192 most probable
            tokens), what the lattice proposer's heads are projected on: ``"seen"``, the tokens
            the engine has seen most in the texts of the requests it drafted for (prompts and
            answers; at most 8,192) and each request's own, so that a token the engine never saw
            is not drafted by the heads; or ``"full"``, the whole vocabulary (every head's exact
            top k, a product as large as the target's logits). Heads without one shared output
            projection (``CandidateLattice.supports``) take the whole vocabulary either way.
        candidate_dtype: what the lattice proposer projects the heads' candidates in:
            ``"auto"`` (bfloat16 for float32 heads on a CPU with AVX-512 BF16 or AMX: half the
            candidates' bytes, and their lattices 10-30% faster from cold caches on the 2-core
            AVX-512 EPYC, as fast inside vLLM; else the model's dtype), ``"model"`` or
            ``"bfloat16"`` (:func:`~latticekit.decoding.lattices.candidate_dtype`). Drafts
            change by rounding, outputs never (every draft is verified).
        k: arcs per lattice position (each head's top k).
        p: lattice paths searched per request and step.
        alpha: the n-gram model's weight in the lattice search (``draft + alpha * n-gram``).
        memory_tokens: the size (tokens) of the engine's memory of earlier answers
            (:class:`~latticekit.drafting.memory.AnswerMemory`; 0: none): every finished request's
            output goes into it, and every request drafts from it beside its own text. One memory
            per engine process (its proposer), shared by all its requests. Default 2**17 tokens
            (:data:`~latticekit.drafting.memory.DEFAULT_MAX_TOKENS`, about 45 MB when full).
        memory_context: the most tokens of a request's prompt, from its end, that its answer is
            counted after in the memory (0 to 8; 0: an answer stands alone; default 2,
            :data:`~latticekit.drafting.memory.DEFAULT_CONTEXT`). With them, a new answer's first
            tokens are matched as an answer's start (the end of a chat template's turn), not
            wherever else an answer held them.
        arms: the ways of drafting the proposer chooses among by the tokens per second each
            really got, per load (of :data:`ARMS`); one alone is always taken. None: the
            proposer's own. ``NGramProposer``'s is ``["model", "plain"]``: the cost model's
            allocation (its estimates corrected by what was accepted, its step costs measured),
            and, at loads where a draft token costs at least ``plain_at_cost`` of a row's token,
            no drafting at all where that got more tokens a second. Until stop 51 it was
            ``["model"]`` alone: all four level arms (learnt per load) ran at 0.98x it in
            ``benchmarks/vllm_speed.py --lockstep`` (the geometric mean of 27 groups;
            docs/vllm.md), probing the other arms costing more than choosing among them gained,
            and ``plain`` beside it at every load lost at one request (its warm-up, stop 43).
            ``text`` is the lattice proposer's
            alone: its n-grams without the heads (the heads not run), at the cost model's
            allocation. ``LatticeProposer``'s is the same since stop 55 (its heads run at every
            drafting step); until then all five, which starved the heads at one request.
        plain_at_cost: with ``plain`` among the arms, it is chosen only at loads (load buckets)
            where the fitted cost of a draft token, ``b``, is at least this share of what a row's
            token costs in a step without drafts, ``a / rows + b`` (a draft token must then be
            accepted at least that often to pay); elsewhere the cost model decides alone. None:
            the proposer's own: 1/3 for both (on the 2-core EPYC the share was 0.02 at one
            request, 0.3-0.5 at 8-15 and 0.6-0.9 at 16; on a GPU, its pass bound by reading the
            weights, a draft token should cost a sliver of a row's; ``LatticeProposer``'s was 0
            until stop 55). 0: at every load.
        closed_at_cost: in a closed batch, no drafting at loads where a draft token costs at least
            this share of a row's token (``plain_at_cost``'s share). A batch is closed where
            requests that finished while others went on mostly left their rows empty, rather than
            a new request taking them within a few steps (:class:`~latticekit.vllm.loads.Turnover`).
            There a request that finishes sooner saves only its own later tokens, what verifying
            its accepted drafts cost, and the fixed part of a step only for the request that ends
            the batch, the least likely to be one whose drafts were accepted. Default 1/3, both
            proposers; null: off.
        closed_margin: in a closed batch whose requests have mostly ended at their ``max_tokens``
            lately (so the tokens a request has left tell which one ends the batch), an accepted
            token is worth what it saves: the fixed part of a step, shared among the requests
            within ``closed_margin`` tokens of the most left (any of them may end the batch), and
            its own verification; a token of any other request saves only its own verification,
            so those draft nothing, and no drafting work is done for them
            (:func:`~latticekit.vllm.loads.closed_values`, the allocation's ``values``). Null:
            every request's tokens alike, as in an open batch.
        load_spread: how far a load bucket's price of a query token may differ from the fit over
            every load's, as a share of it: the bucket's own slope (its steps are few, and of a few
            sizes) is drawn toward the fit over every load's by their precisions, the prior's
            ``1 / (load_spread * b) ** 2`` (:meth:`~latticekit.drafting.chains.BatchCosts.drawn_to`),
            and its fixed part goes through the bucket's mean step. Not with ``context_costs``.
            Null: the bucket's own fit alone where it has a fixed part (the lattice proposer's at
            4-7 requests, stop 55, priced a draft token at 0.38 of a row's token where the fit over
            every load said 0.23, and drafted nothing in a closed batch: 0.73x the best on code).
        step_curve: price a step by its query tokens as its steps at this load have cost (a
            curve, not a line): per load bucket, per count of query tokens, the decayed mean of
            the steps that had it, drawn toward the fit's line by 3 steps' weight
            (:class:`~latticekit.drafting.chains.StepCurve`), and the chains' lengths those of
            the count of draft tokens with the most expected tokens per second
            (:func:`~latticekit.drafting.chains.allocate_curve`). On the 2-core EPYC a step of
            one request cost the same with two to five draft tokens as with none, and 21% more
            with one; at four requests the third draft token added 7 ms where the line priced a
            token at 1.8 (docs/vllm.md, stop 57). Not with ``context_costs``. False: the line alone.
        frugal: draft on only as many steps as the drafting's own seconds are repaid on. Per
            load bucket the proposer keeps two running means over the steps it drafted on: the
            seconds its chains were expected to save (the accepted tokens its corrected
            estimates expect, at the step's seconds per row, less the seconds their draft
            tokens add to the pass) and the seconds the drafting took. Where the first is the
            smaller, only that share of steps (at least 1 in 8) runs the drafting; the others
            draft nothing and do no drafting work (as ``plain``). False: every step drafts.
        probe_budget: with more than one arm, the share of the time the probes of the arms that
            are not the best may lose against it, all of them together (each of the ``n - 1``
            others, ``probe_budget / (n - 1)``): an arm worth ``r`` tokens a second against the
            best's ``R`` waits at least ``(R / r - 1) * (n - 1) / probe_budget`` steps between
            probes (:func:`~latticekit.drafting.arms.probe_wait`), once it has been read
            :data:`~latticekit.drafting.arms.BUDGET_AFTER` times. Until stop 45 each arm had
            the whole budget, so the lattice proposer's four other arms could lose four times it.
        plain_steps: a step in which no request has a draft runs as a step without speculation:
            vLLM's sampler, not its rejection sampler and speculative metadata, which vLLM 0.32
            and 0.33 build at every step of an engine with a ``speculative_config``, drafts or
            none (:func:`~latticekit.vllm.engine.plain_steps`; not for models with recurrent
            state). On the 2-core EPYC that path cost about 1 ms a step at 1, 4 and 16 requests
            (docs/vllm.md). False: vLLM's own path at every step.
        text_first: the lattice proposer runs its heads only for the requests whose own chain
            (their text's and the memory's candidates, as ``NGramProposer`` drafts them) does not
            fill their room with an estimated probability of at least this at its last token
            (corrected as the estimates are); a request whose chain does drafts that chain, its
            heads not run: where the text is being copied, nothing the heads say can lengthen a
            chain likely accepted whole. None (the default): the heads run for every drafting
            request. Tried at stop 69 (docs/vllm.md): 0.2 ran at 1.218x the best of vLLM's own
            proposers at one request where the heads alone ran at 1.200x (tuning domains), and at
            0.99x the heads alone on held-out requests: no gain the runs could tell.
        heads_depth: the most lattice positions the lattice proposer's heads draft (heads 2..
            ``heads_depth`` + 1 run, their blocks and candidates' product cut to them); deeper chain
            positions come from the text's and the memory's candidates alone. None (the default): as
            deep as a request's chain may go (``k``, ``max_depth``). Tried at stop 69
            (docs/vllm.md): 3 ran at 0.99x all the heads at one request and 1.03x at four.
        check_hidden: the lattice proposer checks, every step, that the hidden state it takes
            for a request is the one whose logits gave the request's last token (its arg-max
            must be that token: meaningful for greedy requests), counting ``hidden_checked``
            and ``hidden_wrong`` in the stats. A full output projection per request: for tests
            and diagnosis.
    """

    lm: Optional[str] = None
    candidates: int = 32
    max_depth: int = 12
    max_context: int = 16384
    max_requests: int = 4096
    prior_ratio: float = 1 / 16
    step_costs: Optional[tuple[float, float]] = None
    context_costs: bool = False
    stats: Optional[str] = None
    heads: Optional[str] = None
    vocabulary: str = "seen"
    candidate_dtype: str = "auto"
    k: int = 8
    p: int = 16
    alpha: float = 1.0
    check_hidden: bool = False
    plain_steps: bool = True
    frugal: bool = True
    probe_budget: float = PROBE_BUDGET
    memory_tokens: int = DEFAULT_MAX_TOKENS
    memory_context: int = DEFAULT_CONTEXT
    arms: Optional[tuple[str, ...]] = None
    plain_at_cost: Optional[float] = None
    closed_at_cost: Optional[float] = 1 / 3
    closed_margin: Optional[int] = 8
    load_spread: Optional[float] = 0.5
    step_curve: bool = True
    text_first: Optional[float] = None
    heads_depth: Optional[int] = None

    def __post_init__(self) -> None:
        arms = self.arms
        if arms is not None:
            if isinstance(arms, str) or not isinstance(arms, (list, tuple)) or not arms \
                    or any(not isinstance(a, str) or a not in ARMS for a in arms) or len(set(arms)) != len(arms):
                raise ProposerConfigError(f"latticekit vLLM proposer: arms must be a list of distinct names among "
                                          f"{list(ARMS)}, got {arms!r}")
            object.__setattr__(self, "arms", tuple(a for a in ARMS if a in arms))
        if isinstance(self.memory_tokens, bool) or not isinstance(self.memory_tokens, int) or self.memory_tokens < 0:
            raise ProposerConfigError(f"latticekit vLLM proposer: memory_tokens must be an integer >= 0, "
                                      f"got {self.memory_tokens!r}")
        if isinstance(self.memory_context, bool) or not isinstance(self.memory_context, int) \
                or not 0 <= self.memory_context <= MAX_ORDER:
            raise ProposerConfigError(f"latticekit vLLM proposer: memory_context must be an integer in "
                                      f"[0, {MAX_ORDER}], got {self.memory_context!r}")
        for key in ("candidates", "max_depth", "max_context", "max_requests", "k", "p"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ProposerConfigError(f"latticekit vLLM proposer: {key} must be an integer >= 1, got {value!r}")
        if isinstance(self.prior_ratio, bool) or not isinstance(self.prior_ratio, (int, float)) \
                or not math.isfinite(self.prior_ratio) or self.prior_ratio < 0:
            raise ProposerConfigError(f"latticekit vLLM proposer: prior_ratio must be a finite number >= 0, "
                                      f"got {self.prior_ratio!r}")
        if self.step_costs is not None:
            costs = self.step_costs
            if not isinstance(costs, (list, tuple)) or len(costs) != 2 or any(
                    isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) or c < 0
                    for c in costs) or costs[0] <= 0:
                raise ProposerConfigError(f"latticekit vLLM proposer: step_costs must be [a > 0, b >= 0] seconds, "
                                          f"got {costs!r}")
            object.__setattr__(self, "step_costs", (float(costs[0]), float(costs[1])))
        if self.lm is not None:
            if not isinstance(self.lm, str) or not self.lm:
                raise ProposerConfigError(f"latticekit vLLM proposer: lm must be a file path or 'embedded', "
                                          f"got {self.lm!r}")
            if self.lm != "embedded" and not Path(self.lm).is_file():
                raise ProposerConfigError(f"latticekit vLLM proposer: lm file {self.lm!r} does not exist")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) \
                or not math.isfinite(self.alpha) or not 0 <= self.alpha <= 100:
            raise ProposerConfigError(f"latticekit vLLM proposer: alpha must be a number in [0, 100], got {self.alpha!r}")
        if not isinstance(self.context_costs, bool):
            raise ProposerConfigError(f"latticekit vLLM proposer: context_costs must be true or false, "
                                      f"got {self.context_costs!r}")
        if not isinstance(self.step_curve, bool):
            raise ProposerConfigError(f"latticekit vLLM proposer: step_curve must be true or false, "
                                      f"got {self.step_curve!r}")
        if not isinstance(self.plain_steps, bool):
            raise ProposerConfigError(f"latticekit vLLM proposer: plain_steps must be true or false, "
                                      f"got {self.plain_steps!r}")
        # the settings that may be null: a number (a bool is none) in its range, or an integer
        for key, ok, wants in (
                ("plain_at_cost", lambda v: _number(v) and 0 <= v <= 1, "a number in [0, 1]"),
                ("closed_at_cost", lambda v: _number(v) and 0 < v <= 1, "a number in (0, 1] or null"),
                ("closed_margin", lambda v: isinstance(v, int) and v >= 0, "an integer >= 0 or null"),
                ("load_spread", lambda v: _number(v) and math.isfinite(v) and v > 0, "a number > 0 or null"),
                ("text_first", lambda v: _number(v) and 0 < v <= 1, "a number in (0, 1] or null"),
                ("heads_depth", lambda v: isinstance(v, int) and v >= 1, "an integer >= 1 or null")):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not ok(value)):
                raise ProposerConfigError(f"latticekit vLLM proposer: {key} must be {wants}, got {value!r}")
        if not isinstance(self.frugal, bool):
            raise ProposerConfigError(f"latticekit vLLM proposer: frugal must be true or false, got {self.frugal!r}")
        if isinstance(self.probe_budget, bool) or not isinstance(self.probe_budget, (int, float)) \
                or not math.isfinite(self.probe_budget) or not 0 < self.probe_budget <= 1:
            raise ProposerConfigError(f"latticekit vLLM proposer: probe_budget must be a number in (0, 1], "
                                      f"got {self.probe_budget!r}")
        if not isinstance(self.check_hidden, bool):
            raise ProposerConfigError(f"latticekit vLLM proposer: check_hidden must be true or false, "
                                      f"got {self.check_hidden!r}")
        if self.vocabulary not in ("seen", "full"):
            raise ProposerConfigError(f"latticekit vLLM proposer: vocabulary must be 'seen' or 'full', "
                                      f"got {self.vocabulary!r}")
        if self.candidate_dtype not in ("auto", "model", "bfloat16"):
            raise ProposerConfigError(f"latticekit vLLM proposer: candidate_dtype must be 'auto', 'model' or "
                                      f"'bfloat16', got {self.candidate_dtype!r}")
        if self.heads is not None:
            if not isinstance(self.heads, str) or not self.heads:
                raise ProposerConfigError(f"latticekit vLLM proposer: heads must be a heads file or a Medusa "
                                          f"checkpoint folder, got {self.heads!r}")
            if not Path(self.heads).exists():
                raise ProposerConfigError(f"latticekit vLLM proposer: heads {self.heads!r} does not exist")
        if self.stats is not None and (not isinstance(self.stats, str) or not Path(self.stats).parent.is_dir()):
            raise ProposerConfigError(f"latticekit vLLM proposer: stats must be a file path in an existing "
                                      f"folder, got {self.stats!r}")

    @classmethod
    def from_dict(cls, data: Any) -> "ProposerConfig":
        """Reads a JSON object's keys; an unknown key is an error naming the known ones."""
        if not isinstance(data, dict):
            raise ProposerConfigError(f"latticekit vLLM proposer: the configuration must be a JSON object, "
                                      f"got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ProposerConfigError(f"latticekit vLLM proposer: unknown keys {unknown}; known: {sorted(known)}")
        values = dict(data)
        if isinstance(values.get("step_costs"), list):
            values["step_costs"] = tuple(values["step_costs"])
        return cls(**values)

    @classmethod
    def from_env(cls, environ: Optional[dict[str, str]] = None) -> "ProposerConfig":
        """The settings in ``LATTICEKIT_VLLM_CONFIG`` (a JSON object, or a JSON file's path);
        the defaults when it is unset or empty."""
        text = (os.environ if environ is None else environ).get(ENV, "").strip()
        if not text:
            return cls()
        if not text.startswith("{"):
            try:
                text = Path(text).read_text()
            except OSError as exc:
                raise ProposerConfigError(f"latticekit vLLM proposer: {ENV} names {text!r}, which cannot be "
                                          f"read: {exc.strerror or exc}") from exc
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ProposerConfigError(f"latticekit vLLM proposer: {ENV} is not valid JSON: {exc}") from exc
        return cls.from_dict(data)

    def to_json(self) -> str:
        data = {k: v for k, v in asdict(self).items() if v != getattr(ProposerConfig, k, None)}
        for key in ("step_costs", "arms"):
            if key in data:
                data[key] = list(data[key])
        return json.dumps(data, sort_keys=True)


def _number(value: Any) -> bool:
    """An int or a float (a bool is refused before this is asked)."""
    return isinstance(value, (int, float))


def speculative_config(num_speculative_tokens: int = 8, **settings: Any) -> dict[str, Any]:
    """vLLM's ``speculative_config`` for latticekit's proposer, its settings checked now and put
    where the engine's worker reads them (``LATTICEKIT_VLLM_CONFIG``)::

        llm = vllm.LLM(model, speculative_config=latticekit.vllm.speculative_config(8, lm="katz.arpa"))

    With ``heads`` set, the proposer is the lattice proposer (``LatticeProposer``), else the
    n-gram proposer (``NGramProposer``).

    Args:
        num_speculative_tokens: the longest chain vLLM verifies per request (K).
        settings: :class:`ProposerConfig` fields.

    Raises:
        ProposerConfigError: an unknown setting, a bad value or a missing file.
    """
    if isinstance(num_speculative_tokens, bool) or not isinstance(num_speculative_tokens, int) \
            or num_speculative_tokens < 1:
        raise ProposerConfigError(f"num_speculative_tokens must be an integer >= 1, got {num_speculative_tokens!r}")
    config = ProposerConfig.from_dict(settings)
    os.environ[ENV] = config.to_json()
    proposer = LATTICE_PROPOSER if config.heads is not None else PROPOSER
    return {"method": "custom_class", "model": proposer, "num_speculative_tokens": num_speculative_tokens}
