"""Cache SmolLM2-135M-Instruct's final hidden states and self-distilled labels for head training.

The data half of the heads recipe (:mod:`latticekit.heads.recipe` is the training half; the
scripts ``benchmarks/heads_data.py`` and ``benchmarks/train_heads.py`` run them). Three domains:

* ``code``: CPython standard library sources;
* ``english``: the Python 3.11 and PostgreSQL 15 documentation;
* ``instruction``: the model's own greedy answers to the instruction prompts of
  :mod:`latticekit.heads.prompts`, each put through the model's chat template
  (``apply_chat_template(..., add_generation_prompt=True)``).

Whole files (and the prompts made from them) are held out, by the rule of :mod:`latticekit.heads.corpora`.

For code and English, files are taken in hash order, each contributing at most its first
``--max-file-tokens`` tokens, joined with EOS and cut into sequences of ``--seq-len`` tokens
(``--file-passes P`` adds training passes 1..P-1 that read each file's next windows of that many
tokens: more training data from the same files, the held-out positions unchanged; the passes'
shards are cached in turn, pass p's as ``p<p>-<index>.npz``); every position's final hidden
state (after the final norm) and the model's greedy next token are cached. For instruction answers, prompts are answered greedily in batches of ``--gen-batch``
(left padding, a KV cache, at most ``--max-new-tokens`` tokens), and the final hidden state of
every answer position is cached: the prompt's last position (which predicts the first answer
token) and each answer token but the last; a position's greedy token is then exactly the next
answer token.

Labels are self-distilled: head i at position t learns the greedy token at position t + i - 1
(the token greedy BPD verification accepts) within the same segment (sequence or answer).

Precision. Held-out shards run the model in float32, as ``latticekit.loading.load_target``
loads it for decoding, so every held-out figure is exact. Training shards run the transformer in
bfloat16 (``--train-dtype``) with the float32 output projection: on this machine's CPU that is
5-10x faster, and measured on 2,048 code positions its greedy token agrees with float32's at
98.8% (relative hidden-state error 1.3%), a small label noise for many more tokens.

Cache layout (git-ignored): ``benchmarks/cache/heads/v2/<split>/<domain>/<index>.npz``, each
shard written atomically with ``hidden`` (float16, `(n, d)`), ``greedy`` and ``ids`` (int32,
`(n,)`), ``segment`` (int32, `(n,)`: positions with equal values belong to one sequence or one
answer), ``key`` (what it was computed from) and its compute time. A rerun skips every shard
whose key matches, so an interrupted run resumes; the job tolerates SIGSTOP / SIGCONT at any
time (nothing depends on wall-clock time). Training shards are filled in turn, the domain
that has had the least CPU time (weighted: instruction answers 2, code and English 1) first,
so a run stopped early has data from every domain. CPU time, not wall time: a shard that was
paused or shared the machine would otherwise count as expensive and starve its domain.

Outputs besides the cache: ``benchmarks/results/heads/split_v2.json`` (the rule, every held-out
file per source in the manifest schema ``latticekit.eval.prompts`` reads, the files cached) and ``instruction_prompts.json`` (the held-out
instruction prompts as text, the training prompts by id), and ``cache_heads.json`` (tokens and
compute time per domain, written after every shard).

Usage::

    PYTHONPATH=. python benchmarks/heads_data.py [--train-tokens 1000000] [--threads 2]
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np

from latticekit.heads.corpora import HELDOUT_MOD, SOURCES, is_heldout, list_files, read_text, split_hash
from latticekit.heads.prompts import instruction_prompts
from latticekit._files import atomic_write

#: The checkout's benchmarks folder: the recipe runs from a source checkout (``--cache-dir`` and
#: ``--results-dir`` name other folders).
ROOT = Path(__file__).resolve().parents[2] / "benchmarks"
RESULTS = ROOT / "results" / "heads"
CACHE = ROOT / "cache" / "heads" / "v2"
DOMAINS = {"code": ("code",), "english": ("python-docs", "postgresql-docs"), "instruction": ()}
SHARD_SEQS = 32  # corpus sequences per shard
RECIPE_VERSION = 2
TIME_WEIGHTS = {"code": 1.0, "english": 1.0, "instruction": 2.0}  # share of the caching time per domain
LENGTH_GROUP = 8  # training prompts are grouped by length within runs of this many batches (less padding)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def write_json(path: Path, obj: Any) -> None:
    with atomic_write(path) as f:
        f.write((json.dumps(obj, indent=1) + "\n").encode())


def save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Writes the arrays atomically (a file object: np.savez would append ".npz" to a path)."""
    with atomic_write(path) as f:
        np.savez(f, **arrays)  # type: ignore[arg-type]  # numpy's stub fears a key named allow_pickle


@dataclass
class Shard:
    """One unit of caching work: corpus sequences or a batch of prompts to answer."""

    split: str
    domain: str
    index: int
    sequences: Optional[np.ndarray] = None  # int32 (n, seq_len), corpus shards
    prompts: list[dict[str, Any]] = field(default_factory=list)  # instruction shards
    file_pass: int = 0  # corpus shards: which --max-file-tokens window of every file

    @property
    def path(self) -> Path:
        name = f"{self.index:05d}.npz" if self.file_pass == 0 else f"p{self.file_pass}-{self.index:05d}.npz"
        return Path(self.split) / self.domain / name

    def key(self, recipe: dict[str, Any]) -> str:
        h = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode())
        if self.sequences is not None:
            h.update(np.ascontiguousarray(self.sequences).tobytes())
        for p in self.prompts:
            h.update(p["user"].encode() + b"\0")
        return h.hexdigest()[:24]


def corpus_sequences(domain: str, split: str, budget: int, tokenizer: Any, args: argparse.Namespace,
                     file_pass: int = 0, memo: Optional[dict[tuple[str, str], list[int]]] = None
                     ) -> tuple[np.ndarray, list[tuple[str, str]]]:
    """Token sequences `(n, seq_len)` of a corpus domain's split and the (source, file) pairs used.

    Pass p reads tokens ``[p * M, (p + 1) * M)`` of every file (M = ``--max-file-tokens``), so
    pass 0 is every file's beginning and later passes go deeper into the same files. ``memo``
    keeps every file's tokens between calls.
    """
    files = [(source, rel) for name in DOMAINS[domain] for source in [SOURCES[name]] for rel in list_files(source)]
    files.sort(key=lambda f: (split_hash(f[0].key(f[1])), f[0].key(f[1])))
    pool = [(s, rel) for s, rel in files if is_heldout(s.key(rel)) == (split == "heldout")]
    ids: list[int] = []
    used = []
    memo = {} if memo is None else memo
    window = slice(file_pass * args.max_file_tokens, (file_pass + 1) * args.max_file_tokens)
    for source, rel in pool:
        if len(ids) >= budget:
            break
        if (source.name, rel) not in memo:
            memo[source.name, rel] = tokenizer(read_text(source, rel), add_special_tokens=False)["input_ids"]
        tokens = memo[source.name, rel][window]
        if len(tokens) < 16:
            continue
        ids.extend(tokens + [tokenizer.eos_token_id])
        used.append((source.name, rel))
    n_seq = min(len(ids), budget) // args.seq_len
    return np.asarray(ids[: n_seq * args.seq_len], dtype=np.int32).reshape(n_seq, args.seq_len), used


def in_turn(queues: list[list[Shard]]) -> list[Shard]:
    """The first shard of every queue, then the second of every queue, ...: the file passes'
    shards in turn, so a run stopped at any point has data from every depth of the files."""
    return [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]


def plan(tokenizer: Any, args: argparse.Namespace) -> tuple[list[Shard], dict[str, list[Shard]], dict[str, Any]]:
    """Held-out shards, training shards per domain (in order), and the split manifest.

    The manifest has one entry per source under ``domains`` in the schema that
    ``latticekit.eval.prompts.prompts_from_manifest`` reads (``root``, ``pattern``, ``heldout_files``
    relative to the root), so held-out prompts can be drawn from it directly; ``training_domains``
    says which sources make up each training domain.
    """
    manifest: dict[str, Any] = {
        "rule": f"a file is held out iff int(sha256(key)[:8], 16) % {HELDOUT_MOD} == 0, key = key_prefix + "
                "relpath; an instruction prompt is held out iff the file it quotes is",
        "training_domains": {d: list(sources) for d, sources in DOMAINS.items()},
        "domains": {},
    }
    for name, source in SOURCES.items():
        files = list_files(source)
        manifest["domains"][name] = {"root": str(source.root), "pattern": source.pattern,
                                     "key_prefix": source.key_prefix, "num_files": len(files),
                                     "heldout_files": [rel for rel in files if is_heldout(source.key(rel))]}
    heldout: list[Shard] = []
    train: dict[str, list[Shard]] = {}
    for domain in ("code", "english"):
        seqs, used = corpus_sequences(domain, "heldout", args.heldout_tokens, tokenizer, args)
        for name in DOMAINS[domain]:
            manifest["domains"][name]["heldout_files_cached"] = [rel for src, rel in used if src == name]
        heldout += [Shard("heldout", domain, i, sequences=seqs[i * SHARD_SEQS:(i + 1) * SHARD_SEQS])
                    for i in range(math.ceil(len(seqs) / SHARD_SEQS))]
        log(f"{domain}/heldout: {len(used)} files, {len(seqs)} sequences x {args.seq_len} tokens")
        passes: list[list[Shard]] = []
        memo: dict[tuple[str, str], list[int]] = {}
        for file_pass in range(args.file_passes):  # each pass may fill the whole budget; interleave() stops at it
            seqs, used = corpus_sequences(domain, "train", args.train_tokens, tokenizer, args, file_pass, memo)
            if file_pass == 0:
                for name in DOMAINS[domain]:
                    manifest["domains"][name]["train_files_cached"] = [rel for src, rel in used if src == name]
            passes.append([Shard("train", domain, i, sequences=seqs[i * SHARD_SEQS:(i + 1) * SHARD_SEQS],
                                 file_pass=file_pass) for i in range(math.ceil(len(seqs) / SHARD_SEQS))])
            log(f"{domain}/train pass {file_pass}: {len(used)} files, {len(seqs)} sequences x {args.seq_len} tokens")
        train[domain] = in_turn(passes)
    prompts = {split: instruction_prompts(split) for split in ("heldout", "train")}
    held = prompts["heldout"][: args.heldout_prompts]
    heldout += [Shard("heldout", "instruction", i, prompts=held[i * args.gen_batch:(i + 1) * args.gen_batch])
                for i in range(math.ceil(len(held) / args.gen_batch))]
    run = LENGTH_GROUP * args.gen_batch
    ordered = [p for i in range(0, len(prompts["train"]), run)
               for p in sorted(prompts["train"][i:i + run], key=lambda p: (len(p["user"]), p["id"]))]
    train["instruction"] = [Shard("train", "instruction", i, prompts=ordered[i * args.gen_batch:(i + 1) * args.gen_batch])
                            for i in range(math.ceil(len(ordered) / args.gen_batch))]
    manifest["instruction"] = {
        "prompts": {split: len(p) for split, p in prompts.items()},
        "heldout_prompts_cached": [p["id"] for p in held],
        "note": "instruction_prompts.json holds the prompts; training prompts are answered in order until the "
                "token budget, cache_heads.json says how many were",
    }
    return heldout, train, manifest


def prompt_sets(args: argparse.Namespace) -> dict[str, Any]:
    """instruction_prompts.json: every held-out prompt as text, the training prompts by id."""
    keep = ("id", "source", "file", "task", "user")
    return {
        "builder": "latticekit/heads/prompts.py: instruction_prompts(split)",
        "rule": "a prompt is held out iff the file it quotes is held out (latticekit/heads/corpora.py)",
        "chat_template": "tokenizer.apply_chat_template([{'role': 'user', 'content': user}], "
                         "add_generation_prompt=True)",
        "heldout_answered_in_cache": args.heldout_prompts,
        "heldout": [{k: p[k] for k in keep} for p in instruction_prompts("heldout")],
        "train": [{k: p[k] for k in ("id", "source", "file", "task")} for p in instruction_prompts("train")],
    }


class Runner:
    """The frozen model at one precision: a transformer trunk and the float32 output projection."""

    def __init__(self, model: Any, dtype: Any) -> None:
        import torch

        self.torch = torch
        self.lm_head = model.lm_head
        self.trunk = model.model if dtype == torch.float32 else copy.deepcopy(model.model).to(dtype)
        self.dtype = dtype

    def forward(self, seqs: np.ndarray, batch: int) -> dict[str, np.ndarray]:
        """Hidden states and greedy tokens of corpus sequences (each its own segment)."""
        torch = self.torch
        hidden, greedy = [], []
        for b in range(0, len(seqs), batch):
            h = self.trunk(input_ids=torch.from_numpy(seqs[b:b + batch]).long()).last_hidden_state.float()
            hidden.append(h.half().reshape(-1, h.shape[-1]).numpy())
            greedy.append(self.lm_head(h).argmax(-1).int().reshape(-1).numpy())
        n, L = seqs.shape
        return {"hidden": np.concatenate(hidden), "greedy": np.concatenate(greedy), "ids": seqs.reshape(-1),
                "segment": np.repeat(np.arange(n, dtype=np.int32), L)}

    def answer(self, tokenizer: Any, prompts: list[dict[str, Any]], max_new_tokens: int) -> dict[str, np.ndarray]:
        """Greedy answers to a batch of prompts, with the hidden state of every answer position.

        The prompts are left-padded into one batch; positions count from each prompt's first
        real token. Each prompt is one segment.
        """
        from transformers import DynamicCache

        torch = self.torch
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": p["user"]}],
                                               add_generation_prompt=True, tokenize=False) for p in prompts]
        tokenizer.padding_side = "left"
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        ids, mask = enc["input_ids"], enc["attention_mask"]
        stop = torch.tensor(sorted({tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|endoftext|>")}))
        position = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.trunk(input_ids=ids, attention_mask=mask, position_ids=position,
                         past_key_values=DynamicCache(), use_cache=True)
        fed = ids[:, -1]
        running = torch.ones(len(prompts), dtype=torch.bool)
        rows: list[list[tuple[Any, int, int]]] = [[] for _ in prompts]
        for _ in range(max_new_tokens):
            h = out.last_hidden_state[:, -1].float()
            nxt = self.lm_head(h).argmax(-1)
            for r in torch.nonzero(running)[:, 0].tolist():
                rows[r].append((h[r].half(), int(fed[r]), int(nxt[r])))
            running &= ~torch.isin(nxt, stop)
            if not running.any():
                break
            fed = torch.where(running, nxt, stop[0])
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
            position = position[:, -1:] + 1
            out = self.trunk(input_ids=fed[:, None], attention_mask=mask, position_ids=position,
                             past_key_values=out.past_key_values, use_cache=True)
        flat = [x for row in rows for x in row]
        return {"hidden": torch.stack([x[0] for x in flat]).numpy(),
                "ids": np.asarray([x[1] for x in flat], dtype=np.int32),
                "greedy": np.asarray([x[2] for x in flat], dtype=np.int32),
                "segment": np.repeat(np.arange(len(rows), dtype=np.int32), [len(r) for r in rows])}


def shard_key_on_disk(path: Path) -> Optional[str]:
    if not path.exists():
        return None
    try:
        with np.load(path) as z:
            return str(z["key"])
    except (OSError, ValueError, KeyError):
        return None


def read_shard(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def load_domain(split: str, domain: str, cache_dir: Path = CACHE) -> dict[str, np.ndarray]:
    """Every complete shard of one split and domain, concatenated, segments kept apart.

    Returns:
        ``hidden`` (float16 `(n, d)`), ``greedy``, ``ids`` and ``segment`` (int32 `(n,)`);
        segment numbers are unique across shards.
    """
    paths = sorted((cache_dir / split / domain).glob("*.npz"))
    if not paths:
        raise SystemExit(f"no cached shards in {cache_dir / split / domain}: run benchmarks/heads_data.py first")
    parts = [read_shard(p) for p in paths]
    offset, segments = 0, []
    for part in parts:
        segments.append(part["segment"] + offset)
        offset += int(part["segment"].max()) + 1
    return {"hidden": np.concatenate([p["hidden"] for p in parts]),
            "greedy": np.concatenate([p["greedy"] for p in parts]),
            "ids": np.concatenate([p["ids"] for p in parts]),
            "segment": np.concatenate(segments)}


def interleave(train: dict[str, list[Shard]], spent: dict[str, dict[str, float]], budget: int,
               weights: dict[str, float]) -> Iterator[Shard]:
    """Training shards, always from the open domain that has had the least CPU time per weight.

    A domain stays open until it has ``budget`` tokens or no shards left. ``spent`` is read
    afresh before every choice (the caller updates it), so a run stopped at any point has spent
    its time on the domains in proportion to ``weights``: corpus tokens cost several times less
    than generated answers, so balancing tokens instead would starve the corpus domains.
    """
    queues = {d: list(shards) for d, shards in train.items()}
    while True:
        open_domains = [d for d, q in queues.items() if q and spent[d]["tokens"] < budget]
        if not open_domains:
            return
        yield queues[min(open_domains, key=lambda d: (spent[d]["cpu_s"] / weights[d], d))].pop(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--max-file-tokens", type=int, default=1024)
    parser.add_argument("--file-passes", type=int, default=1,
                        help="training sequences of code and English read this many --max-file-tokens windows of "
                             "every file (pass p: tokens [p M, (p + 1) M)); held-out ones read the first")
    parser.add_argument("--train-tokens", type=int, default=1_000_000,
                        help="per domain (with --file-passes: all the passes together, cached in turn)")
    parser.add_argument("--heldout-tokens", type=int, default=16_384, help="per corpus domain")
    parser.add_argument("--heldout-prompts", type=int, default=64, help="held-out prompts answered and cached")
    parser.add_argument("--gen-batch", type=int, default=64, help="prompts answered together")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--forward-batch", type=int, default=8, help="corpus sequences per forward")
    parser.add_argument("--train-dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--cache-dir", type=Path, default=CACHE)
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    parser.add_argument("--plan-only", action="store_true", help="write split.json and the prompt sets, cache nothing")
    parser.add_argument("--domains", nargs="+", choices=tuple(DOMAINS), default=list(DOMAINS),
                        help="cache training shards of these domains only (every held-out shard is cached)")
    args = parser.parse_args()

    import torch

    from latticekit.loading import load_target

    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    model, tok, description = load_target("smollm2")
    tokenizer = tok.hf
    heldout, train, manifest = plan(tokenizer, args)
    recipe = {k: v for k, v in vars(args).items()
              if k not in ("threads", "cache_dir", "results_dir", "plan_only", "domains")}
    manifest["recipe"] = {"command": "PYTHONPATH=. python benchmarks/heads_data.py " + " ".join(sys.argv[1:]),
                          "model": description, "version": RECIPE_VERSION, **recipe}
    args.results_dir.mkdir(parents=True, exist_ok=True)
    write_json(args.results_dir / "split_v2.json", manifest)
    write_json(args.results_dir / "instruction_prompts.json", prompt_sets(args))
    if args.plan_only:
        return

    runners = {"heldout": Runner(model, torch.float32), "train": Runner(model, getattr(torch, args.train_dtype))}
    progress_path = args.results_dir / "cache_heads.json"
    shard_recipe = {k: recipe[k] for k in ("max_new_tokens",)} | {"model": description, "version": RECIPE_VERSION}
    done: dict[str, dict[str, dict[str, float]]] = {s: {d: {"tokens": 0, "segments": 0, "wall_s": 0.0, "cpu_s": 0.0}
                                                         for d in DOMAINS} for s in ("heldout", "train")}

    def account(split: str, domain: str, shard: dict[str, np.ndarray]) -> None:
        entry = done[split][domain]
        entry["tokens"] += int(len(shard["ids"]))
        entry["segments"] += int(shard["segment"].max()) + 1
        entry["wall_s"] += float(shard["wall_s"])
        entry["cpu_s"] += float(shard["cpu_s"])

    def report(current: str) -> None:
        totals = {s: sum(d["tokens"] for d in v.values()) for s, v in done.items()}
        write_json(progress_path, {"recipe": manifest["recipe"], "status": current, "tokens": totals,
                                   "per_domain": done, "budget_per_domain": args.train_tokens,
                                   "compute_wall_s": round(sum(d["wall_s"] for v in done.values() for d in v.values()), 1),
                                   "compute_cpu_s": round(sum(d["cpu_s"] for v in done.values() for d in v.values()), 1),
                                   "this_run_elapsed_s": round(time.perf_counter() - t_start, 1)})

    def run(shard: Shard, compute: bool = True) -> None:
        """Count the shard if it is cached, else compute it (where ``compute``)."""
        path = args.cache_dir / shard.path
        key = shard.key(shard_recipe | {"dtype": "float32" if shard.split == "heldout" else args.train_dtype,
                                        "seq_len": args.seq_len})
        if shard_key_on_disk(path) == key:
            account(shard.split, shard.domain, read_shard(path))
            return
        if not compute:
            return
        runner = runners[shard.split]
        t0, c0 = time.perf_counter(), time.process_time()
        with torch.inference_mode():
            if shard.sequences is not None:
                arrays = runner.forward(shard.sequences, args.forward_batch)
            else:
                arrays = runner.answer(tokenizer, shard.prompts, args.max_new_tokens)
        arrays |= {"key": np.asarray(key), "wall_s": np.asarray(time.perf_counter() - t0),
                   "cpu_s": np.asarray(time.process_time() - c0)}
        path.parent.mkdir(parents=True, exist_ok=True)
        save_npz(path, arrays)
        account(shard.split, shard.domain, arrays)
        log(f"{shard.path}: {len(arrays['ids'])} tokens in {float(arrays['wall_s']):.0f} s "
            f"({len(arrays['ids']) / float(arrays['wall_s']):.0f} tokens/s); "
            f"train tokens so far {json.dumps({d: v['tokens'] for d, v in done['train'].items()})}")
        report(f"running: {shard.path}")

    for shard in heldout:
        run(shard)
    for shard in (s for d in DOMAINS if d not in args.domains for s in train[d]):  # counted, not computed
        run(shard, compute=False)
    chosen = {d: shards for d, shards in train.items() if d in args.domains}
    for shard in interleave(chosen, done["train"], args.train_tokens, TIME_WEIGHTS):
        run(shard)
    report("done")
    log(f"done: {json.dumps({s: {d: v['tokens'] for d, v in x.items()} for s, x in done.items()})}")


if __name__ == "__main__":
    main()
