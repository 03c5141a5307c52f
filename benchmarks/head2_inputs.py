"""What head 2 gains from reading more than the final hidden state h_t: an ablation on the cache.

Every variant starts exactly from the shipped v2 heads' head 2 (``block``: ``h + W2 silu(W1 h +
b1) + b2``, the tied ``lm_head``) and trains it on the cached code and English positions
(``heads_data.py``), a half of every batch from each, with ``train_heads.py``'s loss
(candidate vocabulary), optimiser and schedule; the other heads play no part. Variants:

* ``none``: head 2 alone, more steps on the cache (the control: same batches as the others);
* ``prev``: ``h + W2 silu(W1 (h + A h_{t-1}) + b1) + b2``: also the previous position's final
  hidden state (zero at a segment's first position);
* ``tok``: the same with ``C e`` for ``A h_{t-1}``, ``e`` the output projection's row of the
  model's greedy token at t + 1 (what ``BlockHeads(token_conditioned=True)`` reads, here with
  the residual kept on h);
* ``proj``: head 2's own vocabulary projection ``W + D`` (``D`` trained, all 49,152 rows)
  instead of the tied ``lm_head`` (Medusa's per-head projection initialised from ``lm_head``).

``A``, ``C`` and ``D`` start at zero, so every variant starts from v2's predictions.

Measured on every cached held-out position, full vocabulary, labels the model's greedy tokens:
head-2 top-1 per domain, and on code and English split by whether the corpus token at t + 1 is
the model's own greedy token at t ("on-policy": what greedy decoding always has) or not (a
teacher-forced position decoding never meets, where head 2's label depends on a token h_t does
not know).

Usage::

    PYTHONPATH=. python benchmarks/head2_inputs.py --variant tok [--steps 1500] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from latticekit.heads.data import CACHE, RESULTS, load_domain, log, write_json
from latticekit.heads.recipe import DomainData, candidate_vocab, label_index, lr_at, restricted_loss
from latticekit.heads import DEFAULT_HEADS_PATH, BlockHeads

VARIANTS = ("none", "prev", "tok", "proj")


class Head2Data(DomainData):
    """A domain's positions with each position's predecessor in its segment (-1: none) and
    whether the corpus token at t + 1 is the model's greedy token at t."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        super().__init__(arrays, 8)  # every head's labels: the candidate vocabulary counts heads 2..8's
        seg, ids, greedy = arrays["segment"], arrays["ids"], arrays["greedy"]
        prev = np.arange(len(seg)) - 1
        ok = prev >= 0
        ok[ok] &= seg[prev[ok]] == seg[ok]
        self.prev = torch.from_numpy(np.where(ok, prev, -1))
        nxt = label_index(seg, 2)[:, 1]  # t + 1 in the same segment, -1 where there is none
        self.on_policy = torch.from_numpy((nxt >= 0) & (ids[nxt.clip(min=0)] == greedy))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", choices=VARIANTS, required=True)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch-positions", type=int, default=3072, help="half code, half English")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--eval-every", type=int, default=500)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cache-dir", type=Path, default=CACHE)
    parser.add_argument("--out", type=Path, default=RESULTS / "runs" / "head2_inputs")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    from latticekit.loading import load_target

    model, _, description = load_target("smollm2")
    W = model.lm_head.weight.detach()
    block = BlockHeads.load(DEFAULT_HEADS_PATH, model).blocks[0].float()
    block.requires_grad_(True)
    d = W.shape[1]
    A = torch.nn.Linear(d, d, bias=False)
    C = torch.nn.Linear(d, d, bias=False)
    torch.nn.init.zeros_(A.weight)
    torch.nn.init.zeros_(C.weight)
    D = torch.zeros_like(W, requires_grad=True)
    v = args.variant
    train = {dom: Head2Data(load_domain("train", dom, args.cache_dir)) for dom in ("code", "english")}
    held = {dom: Head2Data(load_domain("heldout", dom, args.cache_dir)) for dom in ("code", "english", "instruction")}

    def states(data: Head2Data, i: torch.Tensor) -> torch.Tensor:
        h = data.hidden[i].float()
        x = h
        if v == "prev":
            p = data.prev[i]
            x = x + A(torch.where((p >= 0)[:, None], data.hidden[p.clamp(min=0)].float(), torch.zeros_like(h)))
        if v == "tok":
            x = x + C(W[data.labels[i, 0]])
        return block(x) - x + h  # the block's residual adds to h, as the heads' does

    def projection() -> torch.Tensor:
        return W + D if v == "proj" else W

    @torch.no_grad()
    def evaluate() -> dict[str, dict[str, float]]:
        out = {}
        w = projection()
        for dom, data in held.items():
            hit = torch.zeros(len(data), dtype=torch.bool)
            for s in range(0, len(data), 1024):
                i = torch.arange(s, min(s + 1024, len(data)))
                hit[i] = (states(data, i) @ w.T).argmax(-1) == data.labels[i, 1]
            valid = data.labels[:, 1] >= 0
            out[dom] = {"top1": round(float(hit[valid].float().mean()), 4), "positions": int(valid.sum())}
            if dom != "instruction":
                for name, m in (("on_policy", valid & data.on_policy), ("off_policy", valid & ~data.on_policy)):
                    out[dom][name] = round(float(hit[m].float().mean()), 4)
                    out[dom][name + "_positions"] = int(m.sum())
        return out

    candidates, _ = candidate_vocab(torch.cat([t.labels[:, 1:] for t in train.values()]), 0.97, W.shape[0])
    params = list(block.parameters()) + {"none": [], "prev": [A.weight], "tok": [C.weight], "proj": [D]}[v]
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(0)
    curve = [{"step": 0, "heldout": evaluate()}]
    log(f"{v} step 0: {json.dumps(curve[-1]['heldout'])}")
    t0 = time.perf_counter()
    for step in range(args.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, args)  # train_heads.py's schedule
        hs, labels = [], []
        for data in train.values():
            i = torch.randint(len(data), (args.batch_positions // 2,), generator=gen)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                hs.append(states(data, i))
            labels.append(data.labels[i, 1])
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = restricted_loss(torch.cat(hs)[:, None], torch.cat(labels)[:, None], projection(), candidates,
                                   0.0).sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            curve.append({"step": step + 1, "loss": round(float(loss.detach()), 4), "heldout": evaluate()})
            log(f"{v} step {step + 1}: {json.dumps(curve[-1]['heldout'])}")
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / f"{v}.json", {
        "variant": v, "command": "PYTHONPATH=. python benchmarks/head2_inputs.py " + " ".join(sys.argv[1:]),
        "model": description, "train_positions": {dom: len(t) for dom, t in train.items()},
        "train_s": round(time.perf_counter() - t0, 1), "threads": args.threads, "curve": curve})


if __name__ == "__main__":
    main()
