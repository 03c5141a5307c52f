"""What a request's drafting costs per engine step: ``ChainDrafter.observe`` + ``propose`` at long prompts.

vLLM's proposer (``latticekit/vllm/proposer.py``) keeps one :class:`~latticekit.drafting.chains.ChainDrafter`
per request and, every engine step, brings it up to the request's text (``observe``) and asks for
a chain (``propose``). This benchmark drives ChainDrafters the same way, off the engine:

* **Text**: real, offline text tokenized with SmolLM2's tokenizer: ``code`` is the CPython
  standard library's top-level modules (the interpreter's lib folder, in name order); ``english``
  is the Python language reference (``pydoc_data.topics``) and, where present, git's release
  notes and the licences under ``/usr/share``. Each request reads its own stretch of the domain's
  token stream (no two overlap).
* **Model**: the shipped SmolLM2 Katz 4-gram (``lm="embedded"``), an acceptance model shared by
  every request (the proposer's ``AcceptanceModel.prior(trust="cache")``), its defaults:
  32 candidates, chains of at most ``--k`` tokens (vLLM's ``num_speculative_tokens``).
* **Decoding**: the prompt is the stream's first ``L`` tokens; the first ``observe`` reads it
  (prompt ingestion, timed on its own); then each step calls ``observe`` on the text so far and
  ``propose(k)``, and the text grows by what greedy verification would emit: the chain's
  longest prefix that the stream really continues with, plus one token. ids are handed over
  as vLLM does: a view of an int32 row of the token buffer (``--ids list``: a Python list, as
  latticekit's own loop holds them).
* **Concurrency**: ``--concurrency`` requests interleaved step by step, one engine step being
  one observe + propose per request, as the proposer runs them.
* **Lattice** (``--lattice``): ``propose_lattice`` instead of ``propose``, as the lattice proposer
  drafts: the text's continuations united with the p best paths (``--p``, alpha 1, the 4-gram)
  of a heads' lattice of ``--k`` + 1 positions and 8 arcs. The lattice is made per step, seeded
  by the request and the step: each position holds the token the stream really continues with
  with probability 1/2, the other arcs random tokens, and log-softmax scores of random logits
  (the true token's raised), so every run and checkout drafts from the same lattices.

Reported per domain and prompt length: ingestion ms, a step's ms (observe, propose, both; median,
p90, mean, max) for one request, an engine step's ms for the concurrent requests, tokens per step,
and a digest of every chain proposed (two runs drafted the same iff their digests are equal).
Drafting is single-threaded (Python and the C++ core, no thread pool); the machine and command
are recorded. Wrap timing runs in ``flock /tmp/latticekit-timing.lock``.

    PYTHONPATH=. python benchmarks/drafting_cost.py --name after
    PYTHONPATH=/path/to/base/checkout python benchmarks/drafting_cost.py --name before --commit BASE
    python benchmarks/drafting_cost.py --compare before after      # the before/after table
    PYTHONPATH=. python benchmarks/drafting_cost.py --lengths 1024 --steps 50 --profile
    PYTHONPATH=. python benchmarks/drafting_cost.py --lattice --name lattice-after
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import glob
import hashlib
import io
import json
import os
import pstats
import resource
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "results" / "drafting_cost"
DOMAINS = ("code", "english")
VOCAB = 49152  # SmolLM2's


def _code_files() -> list[Path]:
    return [Path(p) for p in sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))]


def _english_texts() -> tuple[list[str], list[str]]:
    """The English texts in order, and where they came from."""
    from pydoc_data import topics  # the language reference, part of every CPython install

    texts = [topics.topics[key] for key in sorted(topics.topics)]
    sources = ["pydoc_data.topics"]
    for pattern in ("/usr/share/doc/git/RelNotes/*.txt", "/usr/share/common-licenses/*"):
        files = [f for f in sorted(glob.glob(pattern)) if os.path.isfile(f)]
        if files:
            texts += [Path(f).read_text(errors="replace") for f in files]
            sources.append(f"{pattern} ({len(files)} files)")
    return texts, sources


def token_stream(domain: str, tokenizer: Any, needed: int) -> tuple[np.ndarray, list[str]]:
    """The domain's text as one token stream (documents joined by blank lines), at least
    ``needed`` tokens where the machine has that much text."""
    if domain == "code":
        files = _code_files()
        texts = (f.read_text(errors="replace") for f in files)
        sources = [f"{sysconfig.get_paths()['stdlib']}/*.py ({len(files)} files)"]
    else:
        english, sources = _english_texts()
        texts = iter(english)
    ids: list[int] = []
    for text in texts:
        ids += tokenizer.encode(text + "\n\n", add_special_tokens=False)
        if len(ids) >= needed:
            break
    return np.asarray(ids, dtype=np.int32), sources


class Request:
    """One request's stream, its token buffer (vLLM's row) and its drafter."""

    def __init__(self, stream: np.ndarray, prompt: int, lm: Any, acceptance: Any, args: argparse.Namespace) -> None:
        from latticekit.drafting.chains import ChainDrafter

        self.stream, self.length = stream, prompt
        self.buffer = stream.copy()  # vLLM's token_ids_cpu row: the text so far, then what is to come
        self.as_list = args.ids == "list"
        start = max(0, prompt - args.max_context) if args.max_context else 0
        self.drafter = ChainDrafter(lm, VOCAB, acceptance, candidates=args.candidates, max_depth=args.max_depth,
                                    start=start)
        self.k = args.k
        self.lattice, self.p, self.lm = args.lattice, args.p, lm
        self.seed = int(stream[0]) * 7919 + prompt
        self.ids_list: list[int] = stream[:prompt].tolist() if self.as_list else []
        self.digest = hashlib.sha256()
        self.probability_sum = 0.0
        self.emitted = 0
        self.steps = 0

    def ids(self) -> Any:
        return self.ids_list if self.as_list else self.buffer[:self.length]

    def ingest(self) -> float:
        t0 = time.perf_counter()
        self.drafter.observe(self.ids())
        return time.perf_counter() - t0

    def step(self) -> tuple[float, float]:
        """One engine step: observe, propose, then greedy verification's emitted tokens."""
        lattice = self.heads_lattice() if self.lattice else None  # the heads' work: not timed
        t0 = time.perf_counter()
        self.drafter.observe(self.ids())
        t1 = time.perf_counter()
        if lattice is not None:
            chain, probability = self.drafter.propose_lattice(self.k, lattice, self.lm, self.p, 1.0)
        else:
            chain, probability = self.drafter.propose(self.k)
        t2 = time.perf_counter()
        want = self.stream[self.length:self.length + len(chain)]
        accepted = 0
        while accepted < len(want) and int(chain[accepted]) == int(want[accepted]):
            accepted += 1
        emitted = accepted + 1
        if self.as_list:
            self.ids_list.extend(self.stream[self.length:self.length + emitted].tolist())
        self.length += emitted
        self.emitted += emitted
        self.steps += 1
        self.digest.update(np.asarray(chain, dtype=np.int64).tobytes() + b"|")
        self.probability_sum += float(np.sum(probability))
        return t1 - t0, t2 - t1


    def heads_lattice(self) -> Any:
        """The step's heads' lattice (see the module docstring): position 0 the text's last token."""
        from latticekit.lattice import SausageLattice

        rng = np.random.default_rng(self.seed + self.steps)
        h, k = self.k + 1, 8
        tokens = rng.integers(0, VOCAB, size=(h, k)).astype(np.int32)
        logits = rng.normal(size=(h, k))
        truth = self.stream[self.length - 1:self.length - 1 + h]
        for j in range(h):
            row = np.unique(tokens[j])  # distinct arcs: random ones, padded with fresh ids
            tokens[j] = np.concatenate([row, VOCAB + np.arange(k - len(row))])[:k]
            if j == 0 or (j < len(truth) and rng.random() < 0.5):
                if truth[j] not in tokens[j]:
                    tokens[j, 0] = truth[j]
                logits[j, tokens[j] == truth[j]] += 2.0
        logits[0] = 0.0
        scores = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        widths = np.full(h, k, dtype=np.int32)
        widths[0] = 1
        order = np.argsort(tokens[0] != truth[0], kind="stable")  # the root first
        tokens[0], scores[0] = tokens[0][order], 0.0
        return SausageLattice(tokens, scores.astype(np.float32), widths)


def _stats(seconds: list[float]) -> dict[str, float]:
    ms = np.asarray(seconds) * 1e3
    return {"median": float(np.median(ms)), "p90": float(np.percentile(ms, 90)), "mean": float(ms.mean()),
            "max": float(ms.max())}


def _rss_mb() -> float:
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return float("nan")


def run_case(streams: list[np.ndarray], length: int, concurrency: int, lm: Any, args: argparse.Namespace
             ) -> dict[str, Any]:
    from latticekit.drafting.calibration import AcceptanceModel

    acceptance = AcceptanceModel.prior(trust="cache")  # shared by the engine's requests
    gc.collect()
    rss = _rss_mb()
    requests = [Request(streams[i], length, lm, acceptance, args) for i in range(concurrency)]
    ingest = [r.ingest() for r in requests]
    rss_after = _rss_mb()
    observe: list[float] = []
    propose: list[float] = []
    engine: list[float] = []
    for _ in range(args.steps):
        total = 0.0
        for r in requests:
            o, p = r.step()
            observe.append(o)
            propose.append(p)
            total += o + p
        engine.append(total)
    digest = hashlib.sha256(b"".join(r.digest.digest() for r in requests)).hexdigest()[:16]
    out = {"length": length, "concurrency": concurrency, "steps": args.steps,
           "ingest_ms": _stats(ingest), "observe_ms": _stats(observe), "propose_ms": _stats(propose),
           "step_ms": _stats([o + p for o, p in zip(observe, propose)]),
           "tokens_per_step": sum(r.emitted for r in requests) / sum(r.steps for r in requests),
           "chains_digest": digest, "probability_sum": sum(r.probability_sum for r in requests),
           "rss_growth_mb_per_request": (rss_after - rss) / concurrency}
    if concurrency > 1:
        out["engine_step_ms"] = _stats(engine)
    return out


def machine_info(args: argparse.Namespace) -> dict[str, Any]:
    import latticekit
    from latticekit._machine import machine

    package = Path(latticekit.__file__).resolve().parent
    commit = args.commit
    if commit is None:
        try:
            commit = subprocess.run(["git", "-C", str(package), "rev-parse", "--short", "HEAD"],
                                    capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            commit = ""
    return {**machine(), "threads": 1, "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count(), "latticekit": str(package), "commit": commit,
            "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import transformers

    from latticekit.demo import embedded_token_lm
    try:
        from latticekit.loading import smollm2_hf_folder
    except ImportError:  # a checkout from before the loaders left eval/ (a "before" run)
        from latticekit.eval.loading import smollm2_hf_folder  # type: ignore[no-redef]

    tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2_hf_folder())
    lm = embedded_token_lm()
    per_request = max(args.lengths) + args.steps * (args.k + 1) + 1
    most = max([1] + list(args.concurrency))
    results: list[dict[str, Any]] = []
    sources: dict[str, list[str]] = {}
    for domain in args.domains:
        stream, sources[domain] = token_stream(domain, tokenizer, per_request * most)
        for length in args.lengths:
            need = length + args.steps * (args.k + 1) + 1
            count = min(most, len(stream) // need)
            if count < 1:
                print(f"{domain}: {len(stream)} tokens, too few for {length}-token prompts", flush=True)
                continue
            streams = [stream[i * need:(i + 1) * need] for i in range(count)]
            if not results:  # warm-up: the model's indexes, first calls (load time, not drafting)
                warm = argparse.Namespace(**{**vars(args), "steps": 20})
                run_case([streams[0][:min(len(streams[0]), 2048 + 200)]], 1024, 1, lm, warm)
            for concurrency in sorted(set([1] + [c for c in args.concurrency if c <= count])):
                case = run_case(streams, length, concurrency, lm, args)
                case["domain"] = domain
                results.append(case)
                print(_line(case), flush=True)
    return {"machine": machine_info(args), "settings": {k: v for k, v in vars(args).items()
                                                        if k not in ("compare", "profile", "out", "commit")},
            "sources": sources, "results": results}


def _line(case: dict[str, Any]) -> str:
    s = case["step_ms"]
    line = (f"{case['domain']:8s} L={case['length']:6d} c={case['concurrency']:2d}  ingest "
            f"{case['ingest_ms']['median']:8.1f} ms  step median {s['median']:6.3f} p90 {s['p90']:6.3f} ms "
            f"(observe {case['observe_ms']['median']:.3f}, propose {case['propose_ms']['median']:.3f})")
    if "engine_step_ms" in case:
        e = case["engine_step_ms"]
        line += f"  engine step median {e['median']:6.2f} p90 {e['p90']:6.2f} ms"
    return line + f"  tokens/step {case['tokens_per_step']:.2f}  digest {case['chains_digest']}"


def markdown(report: dict[str, Any], name: str) -> str:
    m = report["machine"]
    lines = [f"# Drafting cost per engine step: {name}", "",
             f"{m['cpu']} ({', '.join(m['isa'])}), Python {m['python']}, {m['threads']} drafting thread, "
             f"latticekit {m['commit']} ({m['latticekit']}), load average {m.get('load_average')}", "",
             f"`{m['command']}`", "",
             "Sources: " + "; ".join(f"{d}: {', '.join(s)}" for d, s in report["sources"].items()), "",
             "ms per step of one request (observe + propose) and per engine step of all requests; ingestion: "
             "the first observe, reading the prompt.", "",
             "| domain | prompt | requests | ingest ms | step ms median | step p90 | observe median | "
             "propose median | engine step ms median | engine p90 | tokens/step | chains digest |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in report["results"]:
        e = c.get("engine_step_ms")
        lines.append(f"| {c['domain']} | {c['length']} | {c['concurrency']} | {c['ingest_ms']['median']:.1f} | "
                     f"{c['step_ms']['median']:.3f} | {c['step_ms']['p90']:.3f} | {c['observe_ms']['median']:.3f} | "
                     f"{c['propose_ms']['median']:.3f} | {e['median'] if e else float('nan'):.2f} | "
                     f"{e['p90'] if e else float('nan'):.2f} | {c['tokens_per_step']:.2f} | "
                     f"`{c['chains_digest']}` |")
    return "\n".join(lines) + "\n"


def compare(before: dict[str, Any], after: dict[str, Any], names: tuple[str, str]) -> str:
    key = lambda c: (c["domain"], c["length"], c["concurrency"])  # noqa: E731
    old = {key(c): c for c in before["results"]}
    lines = [f"# Drafting cost: {names[0]} against {names[1]}", "",
             f"{names[0]}: latticekit {before['machine']['commit']}, `{before['machine']['command']}`  ",
             f"{names[1]}: latticekit {after['machine']['commit']}, `{after['machine']['command']}`  ",
             f"Machine: {after['machine']['cpu']} ({', '.join(after['machine']['isa'])}), "
             f"{after['machine']['threads']} drafting thread.", "",
             "ms; `x` is before / after (how many times faster). RSS MB/request: the process's resident memory "
             "after the requests read their prompts, less before, per request (rough: the allocator reuses freed "
             "memory). Same chains: the digests of every chain proposed are equal.", "",
             "| domain | prompt | requests | ingest before | ingest after | x | step median before | after | x | "
             "step p90 before | after | engine step median before | after | x | RSS MB/request before | after | "
             "same chains |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in after["results"]:
        b = old.get(key(c))
        if b is None:
            continue
        eb, ea = b.get("engine_step_ms"), c.get("engine_step_ms")
        engine = (f"{eb['median']:.2f} | {ea['median']:.2f} | {eb['median'] / ea['median']:.1f}" if eb and ea
                  else "- | - | -")
        lines.append(
            f"| {c['domain']} | {c['length']} | {c['concurrency']} | {b['ingest_ms']['median']:.1f} | "
            f"{c['ingest_ms']['median']:.1f} | {b['ingest_ms']['median'] / c['ingest_ms']['median']:.0f} | "
            f"{b['step_ms']['median']:.3f} | {c['step_ms']['median']:.3f} | "
            f"{b['step_ms']['median'] / c['step_ms']['median']:.1f} | {b['step_ms']['p90']:.3f} | "
            f"{c['step_ms']['p90']:.3f} | {engine} | {b['rss_growth_mb_per_request']:.1f} | "
            f"{c['rss_growth_mb_per_request']:.1f} | {b['chains_digest'] == c['chains_digest']} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 8192, 32768], help="prompt tokens")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[16], help="requests interleaved (1 always runs)")
    ap.add_argument("--steps", type=int, default=200, help="engine steps per case")
    ap.add_argument("--domains", nargs="+", choices=DOMAINS, default=list(DOMAINS))
    ap.add_argument("--k", type=int, default=8, help="longest chain proposed (vLLM's num_speculative_tokens)")
    ap.add_argument("--candidates", type=int, default=32)
    ap.add_argument("--lattice", action="store_true", help="propose_lattice, as the lattice proposer drafts")
    ap.add_argument("--p", type=int, default=16, help="lattice paths searched (--lattice)")
    ap.add_argument("--max-depth", type=int, default=12)
    ap.add_argument("--max-context", type=int, default=0,
                    help="the proposer's max_context: a prompt's last tokens read (0: all of it)")
    ap.add_argument("--ids", choices=("array", "list"), default="array",
                    help="ids as a view of an int32 buffer row (vLLM) or a Python list")
    ap.add_argument("--name", default="drafting_cost", help="results file stem under --out")
    ap.add_argument("--commit", help="the latticekit commit measured, for a checkout that is not a git work tree "
                                     "(default: git rev-parse of the imported package's folder)")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--profile", action="store_true", help="print cProfile's top functions (no files written)")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"),
                    help="write BEFORE_vs_AFTER.md from two results' stems under --out")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.compare:
        reports = [json.loads((out / f"{name}.json").read_text()) for name in args.compare]
        text = compare(reports[0], reports[1], tuple(args.compare))
        (out / f"{args.compare[0]}_vs_{args.compare[1]}.md").write_text(text)
        print(text)
        return 0
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        measure(args)
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
        print(text.getvalue())
        return 0
    report = measure(args)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / f"{args.name}.md").write_text(markdown(report, args.name))
    print(f"wrote {out / args.name}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
