"""Train draft heads (``latticekit.heads.BlockHeads``) for SmolLM2-135M-Instruct on the cached data.

The training half of the heads recipe (run by ``benchmarks/train_heads.py``):
:mod:`latticekit.heads.data` caches the frozen model's final hidden
states and its greedy tokens (code, English documentation, the model's own answers to
instruction prompts); this script trains heads on whatever training shards are cached and
measures them, full vocabulary, on the held-out shards.

* Labels: self-distillation. Head i at position t learns the model's greedy token at position
  t + i - 1 (the token greedy BPD verification accepts), when that position is in the same
  segment (corpus sequence or answer); other positions are ignored for that head.
* Batches: ``--batch-positions`` positions, a third from each domain (drawn uniformly within a
  domain, seeded), so every domain counts the same whatever its cached size; or shares by
  ``--domain-weights code=2 english=2 instruction=1`` (a domain left out gets none).
* Loss: the sum over heads 2..h of the mean cross-entropy, with ``--label-smoothing``. The
  softmax runs over a candidate vocabulary (the most frequent training labels covering
  ``--coverage`` of them, plus every label of the batch); the full 49k-word projection for 7 heads
  is ~1 GFLOP per position, too slow for 2 shared CPU cores.
* Optimiser: AdamW (``--lr``, no weight decay), ``--warmup`` steps then cosine decay to 0,
  gradient clipping 1.0, ``--steps`` steps, seed 0. The heads' matrix products run in bfloat16
  (autocast) where ``--bf16``; the weights stay float32.
* Architecture: ``--layer mlp`` (latticekit's ``h + W2 silu(W1 h + b1) + b2``) or ``medusa``
  (``x + silu(W x + b)``, writable as Medusa checkpoints), ``--num-layers`` per head, the model's
  tied ``lm_head`` as every head's output projection.
* ``--token-conditioned``: heads 2..h also read the model's greedy token at t + 1 (the cached
  label of head 1; at decoding time the lattice's first token), through a d x d map per head
  initialised to zero (``BlockHeads(token_conditioned=True)``; EAGLE feeds its drafter the same
  token). The drafts stay a sausage lattice: that token is fixed when the lattice is drafted.
* ``--intermediate-size`` widens the mlp layers (default: the hidden size); a narrower
  ``--init`` file is embedded exactly (``widen``: new hidden units start with zero output
  weights, so training starts from that file's predictions). ``--train-heads 2 3`` trains only
  those heads (the others keep ``--init``'s weights and cost nothing): every head has its own
  block and its own loss term, so a step on one head costs about a seventh of a step on all.
* ``--init FILE`` starts from a heads file of the same shape (a warm start: train a shipped
  file longer, or on more data, with a fresh schedule); recorded in the recipe. An
  unconditioned file may start conditioned heads: its blocks are copied, the token maps start
  at zero, so training starts from exactly that file's predictions.
* Evaluation: per-head top-1 / top-8 / top-16 against the model's greedy tokens, full
  vocabulary, on the first ``--eval-positions`` held-out positions of each domain; the same for
  any ``--compare`` heads file (e.g. the first shipped heads); and the drafting cost: the median
  time of one ``heads(hidden)`` call for a single position (all h heads' logits), 2 threads.

A run checkpoints every ``--eval-every`` steps to ``benchmarks/cache/heads/v2/runs/<name>.pt``
and resumes from it; its results go to ``benchmarks/results/heads/runs/<name>.json``.

Usage::

    PYTHONPATH=. python benchmarks/train_heads.py --name mlp1 [--layer medusa --num-layers 2] \\
        [--out latticekit/data/heads/smollm2-135m-h8-v2.safetensors]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from latticekit.heads.data import CACHE, DOMAINS, RESULTS, load_domain, log, write_json
from latticekit.heads import BlockHeads

TOPK = (1, 8, 16)
ROOT = Path(__file__).resolve().parents[2] / "benchmarks"  # the checkout's (see latticekit.heads.data)


def label_index(segment: np.ndarray, num_heads: int) -> np.ndarray:
    """`(n, num_heads)` index of each head's label position (t + i - 1), -1 where it leaves the segment."""
    n = len(segment)
    out = np.full((n, num_heads), -1, dtype=np.int64)
    t = np.arange(n)
    for i in range(num_heads):
        src = t + i
        ok = src < n
        ok[ok] &= segment[src[ok]] == segment[t[ok]]
        out[ok, i] = src[ok]
    return out


class DomainData:
    """One domain's cached positions with every head's label."""

    def __init__(self, arrays: dict[str, np.ndarray], num_heads: int, limit: Optional[int] = None) -> None:
        if limit:
            arrays = {k: v[:limit] for k, v in arrays.items()}
        self.hidden = torch.from_numpy(arrays["hidden"])
        index = label_index(arrays["segment"], num_heads)
        greedy = torch.from_numpy(arrays["greedy"].astype(np.int64))
        self.labels = torch.where(torch.from_numpy(index) >= 0, greedy[torch.from_numpy(index).clamp(min=0)], -100)

    def __len__(self) -> int:
        return len(self.hidden)


def candidate_vocab(labels: torch.Tensor, coverage: float, vocab_size: int) -> tuple[torch.Tensor, float]:
    """The most frequent labels covering ``coverage`` of them, and the coverage reached."""
    counts = torch.bincount(labels[labels >= 0].reshape(-1), minlength=vocab_size)
    order = torch.argsort(counts, descending=True, stable=True)
    cum = torch.cumsum(counts[order].double(), 0) / counts.sum()
    size = int(torch.searchsorted(cum, torch.tensor([coverage], dtype=cum.dtype))[0]) + 1
    return torch.sort(order[:size]).values, float(cum[size - 1])


def restricted_loss(states: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor, candidates: torch.Tensor,
                    smoothing: float) -> torch.Tensor:
    """Per-head mean cross-entropy `(heads,)` over the candidates plus the batch's own labels.

    states `(n, heads, d)`, labels `(n, heads)` with -100 for none.
    """
    cand = torch.unique(torch.cat([candidates, labels[labels >= 0]]))
    logits = states @ weight[cand].T
    target = torch.where(labels >= 0, torch.searchsorted(cand, labels.clamp(min=0)), -100)
    ce = torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), target, reduction="none",
                                           label_smoothing=smoothing)
    valid = (target >= 0).float()
    return (ce * valid).sum(0) / valid.sum(0).clamp(min=1)


@torch.no_grad()
def evaluate(heads: BlockHeads, data: DomainData, chunk: int = 256,
             only: Optional[list[int]] = None) -> dict[str, list[Optional[float]]]:
    """Full-vocabulary per-head top-k accuracy against the model's greedy tokens (token-conditioned
    heads read the greedy token at t + 1, as they do when drafting).

    ``only``: the heads (1-based) to measure, None for every head; the others' entries are None
    (a run that trains some heads follows just those: the vocabulary projection is the cost).
    """
    chosen = list(range(1, heads.num_heads + 1)) if only is None else sorted(only)
    columns = torch.tensor([i - 1 for i in chosen])
    weight = heads.lm_head.weight
    tied = only is not None and heads.projections is None and heads.logit_scale == 1.0  # as forward() tests it
    hits = torch.zeros(len(TOPK), len(chosen), dtype=torch.float64)
    count = torch.zeros(len(chosen), dtype=torch.float64)
    for s in range(0, len(data), chunk):
        labels = data.labels[s:s + chunk, : heads.num_heads]
        hidden = data.hidden[s:s + chunk].float()
        if tied:  # the chosen heads' logits only
            logits = heads.head_states(hidden, labels[:, 0])[:, columns] @ weight.T
        else:
            logits = heads(hidden, next_token=labels[:, 0])[:, columns]  # (n, len(chosen), V)
        labels = labels[:, columns]
        top = logits.topk(max(TOPK), dim=-1).indices
        hit = top == labels.clamp(min=0)[..., None]
        valid = labels >= 0
        for j, k in enumerate(TOPK):
            hits[j] += (hit[..., :k].any(-1) & valid).sum(0).double()
        count += valid.sum(0).double()
    out: dict[str, list[Optional[float]]] = {}
    for j, k in enumerate(TOPK):
        values: list[Optional[float]] = [None] * heads.num_heads
        for c, i in enumerate(chosen):
            values[i - 1] = round(float(hits[j, c] / count[c].clamp(min=1)), 4)
        out[f"top{k}"] = values
    return out


def drafting_ms(heads: BlockHeads, repeats: int = 200) -> float:
    """Median milliseconds of one ``heads(hidden, next_token)`` call for one position (every head's
    logits; the next token is known when drafting)."""
    hidden = torch.randn(1, heads.hidden_size)
    token = torch.zeros(1, dtype=torch.long)
    with torch.no_grad():
        for _ in range(20):
            heads(hidden, next_token=token)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            heads(hidden, next_token=token)
            times.append(time.perf_counter() - t0)
    return round(1e3 * statistics.median(times), 3)


def markdown(results: dict[str, Any]) -> str:
    """The run's held-out table (and that of every compared heads file), per domain."""
    rows = [(results["name"], results["heldout"], results["drafting_ms"], results.get("heads_file_bytes"))]
    rows += [(Path(path).name, r["heldout"], r["drafting_ms"], r["bytes"]) for path, r in results["compare"].items()]
    lines = [f"# Heads run `{results['name']}`", "", f"Command: `{results['command']}`", "",
             f"Training positions {json.dumps(results['train_positions'])}, {results['recipe']['steps']} steps, "
             f"{results['train_s'] / 60:.1f} min; held-out positions {json.dumps(results['heldout_positions'])}. "
             "Full vocabulary, labels = the model's own greedy tokens.", ""]
    for domain in results["heldout"]:
        lines += [f"## {domain}", "", "| heads | bytes | drafting ms | " + " | ".join(
            f"head {i + 1} top-1 / top-16" for i in range(1, len(results["heldout"][domain]["top1"]))) + " |",
            "|---|---:|---:|" + "---:|" * (len(results["heldout"][domain]["top1"]) - 1)]
        for name, heldout, ms, size in rows:
            r = heldout[domain]
            lines.append(f"| {name} | {size or ''} | {ms} | " + " | ".join(
                f"{a:.3f} / {b:.3f}" for a, b in zip(r["top1"][1:], r["top16"][1:])) + " |")
        lines.append("")
    return "\n".join(lines)


def widen(state: dict[str, torch.Tensor], template: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` (trainable tensors of mlp heads) embedded in ``template``'s (those of wider ones).

    Net2Net-style and exact: the old hidden units keep their weights; the new units keep the
    template's fresh input weights and get zero output weights, so the wider heads compute
    exactly what the narrower ones did and training starts from their predictions. Tensors of
    equal shapes are taken as they are.
    """
    out = {}
    for name, fresh in template.items():
        old = state[name]
        if old.shape == fresh.shape:
            out[name] = old
            continue
        new = fresh.detach().clone()
        if old.dim() != new.dim() or any(a > b for a, b in zip(old.shape, new.shape)):
            raise ValueError(f"cannot widen {name}: {tuple(old.shape)} -> {tuple(fresh.shape)}")
        if name.endswith(("up.weight", "up.bias")):
            new[: old.shape[0]] = old
        elif name.endswith("down.weight"):
            new.zero_()
            new[:, : old.shape[1]] = old
        else:
            raise ValueError(f"cannot widen {name}: {tuple(old.shape)} -> {tuple(fresh.shape)}")
        out[name] = new
    return out


def trained_states(heads: BlockHeads, hidden: torch.Tensor, next_token: torch.Tensor,
                   trained: list[int]) -> torch.Tensor:
    """The output projection's inputs `(n, len(trained), d)` of the heads being trained, only theirs
    computed where the heads do not read the token (the stacked token map serves every head)."""
    if heads.token_input is None:
        return torch.stack([heads.blocks[i - 2](hidden) for i in trained], dim=1)
    return heads.head_states(hidden, next_token)[:, [i - 1 for i in trained]]


def domain_weight(text: str) -> tuple[str, float]:
    """``--domain-weights`` values: ``DOMAIN=W`` with a known domain and a weight >= 0."""
    name, sep, value = text.partition("=")
    try:
        weight = float(value)
    except ValueError:
        weight = -1.0
    if not sep or name not in DOMAINS or not weight >= 0 or math.isinf(weight):
        raise argparse.ArgumentTypeError(f"{text!r}: expected DOMAIN=WEIGHT, DOMAIN one of {', '.join(DOMAINS)}, "
                                         "WEIGHT a number >= 0")
    return name, weight


def batch_shares(batch: int, weights: dict[str, float]) -> dict[str, int]:
    """Positions per domain in a batch of ``batch``: proportional to ``weights`` (largest
    remainders), summing to ``batch`` exactly."""
    total = sum(weights.values())
    exact = {d: batch * w / total for d, w in weights.items()}
    shares = {d: int(v) for d, v in exact.items()}
    for d in sorted(exact, key=lambda d: (shares[d] - exact[d], d))[: batch - sum(shares.values())]:
        shares[d] += 1
    return shares


def lr_at(step: int, args: argparse.Namespace) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    return args.lr * 0.5 * (1 + math.cos(math.pi * (step - args.warmup) / max(1, args.steps - args.warmup)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", required=True, help="names the run's checkpoint and results")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--num-heads", type=int, default=8)
    parser.add_argument("--layer", choices=("mlp", "medusa"), default="mlp")
    parser.add_argument("--num-layers", type=int, default=1)
    parser.add_argument("--intermediate-size", type=int,
                        help="width of each mlp layer's hidden layer (default: the hidden size); a narrower --init "
                             "file is widened exactly (see widen())")
    parser.add_argument("--train-heads", type=int, nargs="+", metavar="I",
                        help="train only these heads (2..h); the others keep --init's weights and cost nothing")
    parser.add_argument("--label-smoothing", type=float, default=0.0)
    parser.add_argument("--token-conditioned", action="store_true",
                        help="heads 2..h also read the greedy token at t + 1")
    parser.add_argument("--coverage", type=float, default=0.97)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-positions", type=int, default=3072)
    parser.add_argument("--domain-weights", type=domain_weight, nargs="+", metavar="DOMAIN=W",
                        help=f"each batch's share per domain (default: equal shares of {', '.join(DOMAINS)})")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--max-train-positions", type=int, default=0, help="per domain; 0 = every cached one")
    parser.add_argument("--eval-positions", type=int, default=4096, help="per domain; 0 = every held-out one")
    parser.add_argument("--eval-every", type=int, default=200)
    parser.add_argument("--compare", type=Path, action="append", default=[], help="heads files to measure alongside")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--init", type=Path, help="start from this heads file's blocks (a warm start: more steps on more data)")
    parser.add_argument("--out", type=Path, help="write the trained heads here (float16)")
    parser.add_argument("--cache-dir", type=Path, default=CACHE)
    parser.add_argument("--results-dir", type=Path, default=RESULTS / "runs")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    command = " ".join(["PYTHONPATH=. python benchmarks/train_heads.py", *sys.argv[1:]])

    from latticekit.loading import load_target

    model, _, description = load_target("smollm2")
    h = args.num_heads
    weights = {d: 1.0 for d in DOMAINS} if args.domain_weights is None else \
        {d: dict(args.domain_weights).get(d, 0.0) for d in DOMAINS}
    if sum(weights.values()) <= 0:
        parser.error("--domain-weights: every weight is zero")
    trained = sorted(set(args.train_heads or range(2, h + 1)))
    if trained[0] < 2 or trained[-1] > h:
        parser.error(f"--train-heads: heads are numbered 2..{h} (head 1 is the model's own)")
    if len(trained) < h - 1 and args.init is None:
        parser.error("--train-heads without --init would ship the other heads untrained")
    if args.intermediate_size is not None and (args.layer != "mlp" or args.intermediate_size < 1):
        parser.error("--intermediate-size needs --layer mlp and a positive width")
    train = {d: DomainData(load_domain("train", d, args.cache_dir), h, args.max_train_positions)
             for d in DOMAINS if weights[d] > 0}  # a domain of weight 0 needs no training shards
    heldout = {d: DomainData(load_domain("heldout", d, args.cache_dir), h, args.eval_positions) for d in DOMAINS}
    log("training positions " + json.dumps({d: len(v) for d, v in train.items()})
        + ", held-out " + json.dumps({d: len(v) for d, v in heldout.items()}))

    schedule = {k: v for k, v in vars(args).items()
                if k not in ("threads", "eval_every", "eval_positions", "compare", "out", "cache_dir", "results_dir")}
    schedule = {k: str(v) if isinstance(v, Path) else v for k, v in schedule.items()}
    schedule["domain_weights"] = args.domain_weights and dict(args.domain_weights)  # JSON round-trips it
    heads = BlockHeads.for_model(model, h, layer=args.layer, num_layers=args.num_layers,
                                 token_conditioned=args.token_conditioned, intermediate_size=args.intermediate_size)
    if args.init is not None:
        start = BlockHeads.load(args.init, model)
        if (start.num_heads, start.layer, start.num_layers) != (h, args.layer, args.num_layers) \
                or (start.token_conditioned and not args.token_conditioned) \
                or start.intermediate_size > heads.intermediate_size:
            parser.error(f"--init {args.init}: {start.num_heads} heads of {start.num_layers} {start.layer} layer(s)"
                         f" of width {start.intermediate_size}"
                         f"{' (token-conditioned)' if start.token_conditioned else ''}, not {h} of "
                         f"{args.num_layers} {args.layer} of width {heads.intermediate_size} or less")
        state = widen(start.trainable_state(), heads.trainable_state())
        if args.token_conditioned and not start.token_conditioned:  # the token maps stay at zero
            state |= {k: v for k, v in heads.trainable_state().items() if k.startswith("token_inputs.")}
        heads.load_weights(state)  # copied into the float32 weights
    heads.metadata.update({"base_model": "SmolLM2-135M-Instruct", "base_model_file": description,
                           "recipe": schedule, "command": command})
    weight = model.lm_head.weight.detach()
    candidates, coverage = candidate_vocab(torch.cat([t.labels[:, 1:] for t in train.values()]), args.coverage,
                                           heads.vocab_size)
    log(f"candidate vocabulary {len(candidates)} words, covering {coverage:.4f} of the training labels")
    heads.requires_grad_(False)  # the frozen lm_head, and the heads not in --train-heads
    for i in trained:
        heads.blocks[i - 2].requires_grad_(True)
        if heads.projections is not None:
            heads.projections[i - 2].requires_grad_(True)
    if heads.token_input is not None:  # one stacked map: the rows of untrained heads get no gradient
        heads.token_input.requires_grad_(True)
    params = [p for p in heads.parameters() if p.requires_grad]
    columns = [i - 2 for i in trained]  # of the labels of heads 2..h
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    ckpt_path = args.cache_dir / "runs" / f"{args.name}.pt"
    ckpt_path.parent.mkdir(parents=True, exist_ok=True)
    step, train_s, curve = 0, 0.0, []
    if ckpt_path.exists():
        ckpt = torch.load(ckpt_path, weights_only=True)
        if json.loads(ckpt["schedule"]) == schedule:
            heads.load_weights(ckpt["blocks"])
            optimizer.load_state_dict(ckpt["optimizer"])
            step, train_s, curve = int(ckpt["step"]), float(ckpt["train_s"]), json.loads(ckpt["curve"])
            log(f"resumed {args.name} at step {step}")

    gen = torch.Generator().manual_seed(args.seed + step)
    shares = batch_shares(args.batch_positions if args.domain_weights else
                          args.batch_positions // len(DOMAINS) * len(DOMAINS), weights)  # the first recipe's thirds
    window: list[torch.Tensor] = []
    heads.train()
    while step < args.steps:
        t0 = time.perf_counter()
        picks = [(d, torch.randint(len(t), (shares[d],), generator=gen)) for d, t in train.items() if shares[d]]
        hidden = torch.cat([train[d].hidden[i] for d, i in picks]).float()
        labels = torch.cat([train[d].labels[i, 1:] for d, i in picks])[:, columns]
        next_token = torch.cat([train[d].labels[i, 0] for d, i in picks])  # head 1's: the greedy token
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, args)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            states = trained_states(heads, hidden, next_token, trained)  # (n, len(trained), d)
            per_head = restricted_loss(states, labels, weight, candidates, args.label_smoothing)
        optimizer.zero_grad(set_to_none=True)
        per_head.sum().backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        train_s += time.perf_counter() - t0
        window.append(per_head.detach())
        step += 1
        if step % 20 == 0:
            mean = torch.stack(window).mean(0)
            window = []
            log(f"step {step}/{args.steps} loss {float(mean.sum()):.3f} [{' '.join(f'{v:.2f}' for v in mean)}] "
                f"{train_s / step:.2f} s/step")
        if step % args.eval_every == 0 or step == args.steps:
            heads.eval()
            curve.append({"step": step, "top1": {d: evaluate(heads, v, only=None if len(trained) == h - 1 else trained)
                                                  ["top1"] for d, v in heldout.items()}})
            heads.train()
            log(f"step {step}: held-out top-1 of heads {trained} "
                + json.dumps({d: [c[i - 1] for i in trained] for d, c in curve[-1]["top1"].items()}))
            torch.save({"blocks": heads.trainable_state(), "optimizer": optimizer.state_dict(), "step": step,
                        "train_s": train_s, "curve": json.dumps(curve), "schedule": json.dumps(schedule)},
                       ckpt_path.with_suffix(".tmp"))
            os.replace(ckpt_path.with_suffix(".tmp"), ckpt_path)

    heads.eval()
    results: dict[str, Any] = {
        "name": args.name, "command": command, "recipe": schedule, "base_model": description,
        "train_positions": {d: len(v) for d, v in train.items()},
        "heldout_positions": {d: len(v) for d, v in heldout.items()},
        "candidate_vocab": int(len(candidates)), "candidate_coverage": round(coverage, 4),
        "train_s": round(train_s, 1), "curve": curve,
        "heldout": {d: evaluate(heads, v) for d, v in heldout.items()},
        "drafting_ms": drafting_ms(heads),
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "torch": torch.__version__},
    }
    heads.metadata["heldout_top1_model_labels"] = {d: r["top1"] for d, r in results["heldout"].items()}
    if args.out:
        heads.save(args.out, dtype=torch.float16)
        results["heads_file"] = str(args.out.resolve().relative_to(ROOT.parent)) if args.out.resolve().is_relative_to(ROOT.parent) else str(args.out)
        results["heads_file_bytes"] = args.out.stat().st_size
    results["compare"] = {}
    for path in args.compare:
        other = BlockHeads.load(path, model)
        results["compare"][str(path)] = {"heldout": {d: evaluate(other, v) for d, v in heldout.items()},
                                         "drafting_ms": drafting_ms(other), "bytes": path.stat().st_size}
    args.results_dir.mkdir(parents=True, exist_ok=True)
    write_json(args.results_dir / f"{args.name}.json", results)
    (args.results_dir / f"{args.name}.md").write_text(markdown(results))
    log(f"{args.name}: head-2 top-1 " + json.dumps({d: r["top1"][1] for d, r in results["heldout"].items()})
        + f", drafting {results['drafting_ms']} ms")


if __name__ == "__main__":
    main()
