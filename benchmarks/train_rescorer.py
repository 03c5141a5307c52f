"""Train the neural rescorer of local rescoring (``latticekit.eval.rescorer.NeuralRescorer``).

The fixed recipe (every number is a command-line default, recorded in the results):

* Data: the n-gram models' training corpus, ``benchmarks/cache/eval_lm/train_ids.txt`` (made
  by ``benchmarks/build_eval_lms.py``): SmolLM2 token ids of the TRAINING files of both domains
  of the heads' split (``benchmarks/results/heads/split.json``), one file per line, 10.7M
  tokens. Files are joined with SmolLM2's end-of-text id (0) and cut into random windows of
  ``--seq-len`` (256) tokens, so that the model also sees prefixes that start mid-file, as
  decoding prompts do.
* Vocabulary: the ``--classes - 1`` (8,191) most frequent training tokens get a class each
  (98.2% of training tokens); all other ids share the "other" class.
* Model: 4 layers, d = 256, 4 attention heads, feed-forward 1024, learned positions (256),
  tied output layer; 5.3M parameters.
* Optimiser: AdamW (lr 2e-3, weight decay 0.01, betas 0.9/0.98), 50 warm-up steps then cosine
  decay to 10%, gradient clipping at 1.0, batches of 16 windows, ``--steps`` steps, seed 0.
* Held-out: per domain, the first ``--heldout-tokens`` (16,384) tokens of the held-out files (whole
  files, never trained on; the evaluation prompts come from them), scored in windows of
  ``--seq-len`` tokens; reported as full-vocabulary perplexity of the saved (float16) file next
  to the Katz 4-gram's (``benchmarks/cache/eval_lm/katz4.arpa.gz``) on the same tokens; the
  curves are the float32 model's during training.

Outputs: ``benchmarks/results/rescorer/rescorer.safetensors`` (float16, ~11 MB),
``train_rescorer.{json,md}`` and ``curves.png`` beside it. Re-running resumes from the last
checkpoint in ``benchmarks/cache/rescorer/``.

    PYTHONPATH=. python benchmarks/train_rescorer.py [--steps 600] [--threads 1] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

from latticekit.eval.rescorer import NeuralRescorer

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results" / "rescorer"
CACHE = ROOT / "cache" / "rescorer"
EOT = 0  # SmolLM2's <|endoftext|>


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def read_corpus(path: Path) -> np.ndarray:
    lines = path.read_text().splitlines()
    parts = []
    for line in lines:
        parts.append(np.array(line.split(), dtype=np.int32))
        parts.append(np.array([EOT], dtype=np.int32))
    return np.concatenate(parts)


def heldout_ids(manifest: Path, limit: int) -> dict[str, np.ndarray]:
    sys.path.insert(0, str(ROOT))
    from build_eval_lms import smollm2_tokenizer

    tokenizer = smollm2_tokenizer()
    split = json.loads(manifest.read_text())
    out = {}
    for name, entry in split["domains"].items():
        ids: list[int] = []
        for rel in entry["heldout_files"]:
            path = Path(entry["root"]) / rel
            if path.is_file() and len(ids) < limit:
                ids += tokenizer(path.read_text(errors="replace"), add_special_tokens=False)["input_ids"] + [EOT]
        out[name] = np.array(ids[:limit], dtype=np.int64)
    return out


@torch.no_grad()
def heldout_nats(model: NeuralRescorer, ids: np.ndarray, seq_len: int, device: str) -> float:
    """Mean full-vocabulary negative log-likelihood (nats/token) over non-overlapping windows."""
    model.eval()
    total, count = 0.0, 0
    usable = (len(ids) - 1) // seq_len * seq_len
    x = torch.from_numpy(ids[:usable + 1]).to(device)
    windows = x[:usable].view(-1, seq_len)
    targets = x[1:usable + 1].view(-1, seq_len)
    for start in range(0, windows.shape[0], 16):
        logp = torch.log_softmax(model(windows[start:start + 16]).float(), dim=-1)
        total -= float(model.token_logprobs(logp, targets[start:start + 16, :, None]).sum())
        count += targets[start:start + 16].numel()
    model.train()
    return total / count


def ngram_nats(arpa: Path, ids: np.ndarray, seq_len: int) -> float:
    """The Katz 4-gram's nats/token on the same windows (each window starts without context)."""
    from latticekit import NGramLM

    lm = NGramLM.from_arpa(arpa)
    usable = (len(ids) - 1) // seq_len * seq_len
    total = 0.0
    for start in range(0, usable, seq_len):
        window = ids[start:start + seq_len + 1].tolist()
        # the rescorer predicts tokens 1..seq_len of each window from the ones before it
        total -= lm.score(window[1:], context=window[:1])
    return total / usable


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, default=ROOT / "cache" / "eval_lm" / "train_ids.txt")
    ap.add_argument("--manifest", type=Path, default=ROOT / "results" / "heads" / "split.json")
    ap.add_argument("--ngram", type=Path, default=ROOT / "cache" / "eval_lm" / "katz4.arpa.gz")
    ap.add_argument("--classes", type=int, default=8192)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--d-ff", type=int, default=1024)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--heldout-tokens", type=int, default=16384)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS / "rescorer.safetensors")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    RESULTS.mkdir(parents=True, exist_ok=True)
    CACHE.mkdir(parents=True, exist_ok=True)

    corpus = read_corpus(args.corpus)
    vocab_size = max(49152, int(corpus.max()) + 1)
    counts = np.bincount(corpus, minlength=vocab_size)
    top = np.argsort(-counts, kind="stable")[: args.classes - 1]
    vocab_map = np.full(vocab_size, args.classes - 1, dtype=np.int64)
    vocab_map[top] = np.arange(args.classes - 1)
    coverage = float(counts[top].sum() / counts.sum())
    log(f"corpus {len(corpus):,} tokens; {args.classes - 1} classes cover {coverage:.2%}")

    recipe = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    model = NeuralRescorer(torch.from_numpy(vocab_map), args.d_model, args.layers, args.heads, args.d_ff,
                           args.seq_len, metadata={"recipe": recipe, "class_coverage": coverage}).to(args.device)
    params = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.98))

    def lr_at(step: int) -> float:
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        t = (step - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))

    held = heldout_ids(args.manifest, args.heldout_tokens)
    ckpt = CACHE / "checkpoint.pt"
    step, curve, train_s = 0, [], 0.0
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        if state["recipe"] == recipe:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            step, curve, train_s = state["step"], state["curve"], state["train_s"]
            log(f"resumed at step {step}")
    rng = np.random.default_rng(args.seed)
    if step and "rng" in state:
        rng.bit_generator.state = state["rng"]  # the same batches as an uninterrupted run
    data = torch.from_numpy(corpus.astype(np.int64))
    model.train()
    last_loss = float("nan")
    while step < args.steps:
        t0 = time.perf_counter()
        starts = torch.from_numpy(rng.integers(0, len(corpus) - args.seq_len - 1, size=args.batch))
        window = data[starts[:, None] + torch.arange(args.seq_len + 1)].to(args.device)
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        logits = model(window[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), model.classes(window[:, 1:]).flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        train_s += time.perf_counter() - t0
        last_loss = float(loss)
        if step % args.eval_every == 0 or step == args.steps:
            point = {"step": step, "train_class_ce": last_loss, "seconds": round(train_s, 1)}
            for name, ids in held.items():
                point[f"{name}_nats"] = heldout_nats(model, ids, args.seq_len, args.device)
            curve.append(point)
            log(f"step {step}/{args.steps}: train class CE {last_loss:.3f}, held-out nats "
                + ", ".join(f"{n} {point[f'{n}_nats']:.3f}" for n in held) + f" ({train_s / step:.2f} s/step)")
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "curve": curve,
                        "train_s": train_s, "recipe": recipe, "rng": rng.bit_generator.state},
                       CACHE / "checkpoint.tmp")
            os.replace(CACHE / "checkpoint.tmp", ckpt)

    model.eval()
    model.save(args.out)
    shipped = NeuralRescorer.load(args.out, args.device)  # the float16 file, as evaluations load it
    final = {name: heldout_nats(shipped, ids, args.seq_len, args.device) for name, ids in held.items()}
    ngram = {name: ngram_nats(args.ngram, ids, args.seq_len) for name, ids in held.items()} if args.ngram.exists() else {}
    result = {
        "recipe": recipe, "parameters": params, "class_coverage": coverage, "steps": step,
        "train_seconds": round(train_s, 1), "tokens_seen": step * args.batch * args.seq_len,
        "heldout_tokens": {n: int(len(ids)) for n, ids in held.items()},
        "heldout_ppl": {n: math.exp(v) for n, v in final.items()},
        "katz4_ppl_same_tokens": {n: math.exp(v) for n, v in ngram.items()},
        "curve": curve, "machine": f"{platform.machine()} {os.cpu_count()} cpus, torch {torch.__version__}",
    }
    (RESULTS / "train_rescorer.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = ["# Neural rescorer: training and held-out perplexity", "",
             f"Command: `PYTHONPATH=. python benchmarks/train_rescorer.py --steps {args.steps} --threads {args.threads}`", "",
             f"{params / 1e6:.2f}M parameters, {step} steps x {args.batch} x {args.seq_len} tokens "
             f"({result['tokens_seen'] / 1e6:.2f}M tokens seen), {train_s / 60:.1f} min on {args.device}. "
             f"{args.classes - 1} classes cover {coverage:.1%} of training tokens.", "",
             "| domain | held-out tokens | rescorer ppl | Katz 4-gram ppl (same tokens) |", "|---|---|---|---|"]
    for n in held:
        kz = result["katz4_ppl_same_tokens"].get(n)
        lines.append(f"| {n} | {len(held[n])} | {result['heldout_ppl'][n]:.2f} | {'-' if kz is None else f'{kz:.2f}'} |")
    (RESULTS / "train_rescorer.md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5, 3.4))
        for n in held:
            ax.plot([c["step"] for c in curve], [math.exp(c[f"{n}_nats"]) for c in curve], marker=".", label=f"{n} rescorer")
            if n in ngram:
                ax.axhline(math.exp(ngram[n]), ls="--", lw=1, color=ax.lines[-1].get_color(), label=f"{n} Katz 4-gram")
        ax.set(xlabel="step", ylabel="held-out perplexity", yscale="log", title="Neural rescorer")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(RESULTS / "curves.png", dpi=120)
    except ImportError:
        pass
    print(json.dumps({k: v for k, v in result.items() if k != "curve"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
