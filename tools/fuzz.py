"""Fuzzes latticekit's entries with mutated inputs, in worker subprocesses, so that a crash is
a return code and a hang a silent worker.

Three kinds of input, each derived deterministically from (seed, index):

* ``arpa``: small ARPA models, mutated (bytes, lines, numbers, header counts, gzip), read
  with ``NGramLM.from_arpa``, then scored, searched and saved/loaded when they build;
* ``binary``: small binary models, mutated byte-wise or in their value and header fields,
  half of them with the checksum recomputed (as a crafted file would be), then loaded,
  scored and searched;
* ``lattice``: odd lattices and search arguments (shapes, dtypes, ids, scores, widths,
  contexts, p, alpha, threads, logits) against models with extreme but legal values.

Every input must end in a result or a ``LatticeKitError``: any other exception is counted as
untyped, a worker that dies as a crash, one that makes no progress for ``--timeout`` seconds as
a hang. The input of a crash or hang is written under ``--out`` and the worker restarted
after it.

    python tools/fuzz.py --inputs 100000              # 100k inputs, kinds in turn
    python tools/fuzz.py --minutes 5 --kinds arpa     # 5 minutes of ARPA inputs
    python tools/fuzz.py --inputs 300000 --first 700000 --seed 18   # a later chunk

It prints one JSON line: counts per kind and outcome, and the command's arguments.
"""

from __future__ import annotations

import argparse
import gzip
import json
import mmap
import os
import random
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

KINDS = ("arpa", "binary", "lattice")
OUTCOMES = ("ok", "typed", "untyped", "wrong")  # wrong: a result that breaks a promise
# The worker's shared page: the input under way and when it started, then a count per kind
# and outcome, so that the parent knows them even after a crash.
PROGRESS = struct.Struct("<qd")
PAGE = PROGRESS.size + 8 * len(KINDS) * len(OUTCOMES)
HOSTILE_NUMBERS = ["nan", "-nan", "inf", "-inf", "+inf", "Infinity", "1e39", "-1e39", "3.4e38", "-3.4e38",
                   "1e-400", "-1e-400", "-1e999", "-" + "9" * 400, "9" * 30, "0", "-0", "1", "-99", "0x10",
                   "1e", "--1", "", "-1.5.2", "1e308", "-1e308", "-1e-45", "4e-45"]
HOSTILE_COUNTS = ["0", "1", "-1", "10000000000", "4611686018427387904", "9223372036854775807",
                  "99999999999999999999", "1e3", "", " 2", "2 "]


# ---- inputs

def random_arpa(rng: random.Random) -> str:
    """A small, valid ARPA model over decimal token ids (orders 1-4)."""
    order = rng.randint(1, 4)
    words = [str(i) for i in rng.sample(range(40), rng.randint(1, 12))]
    grams = {1: [("<s>",), ("</s>",)] + [(w,) for w in words] + ([("<unk>",)] if rng.random() < 0.5 else [])}
    for n in range(2, order + 1):
        grams[n] = []
        for prefix in grams[n - 1]:
            if prefix[-1] == "</s>":
                continue
            for w in rng.sample(words + ["</s>"], rng.randint(0, min(3, len(words) + 1))):
                grams[n].append(prefix + (w,))
        if not grams[n]:
            order = n - 1
            break
    lines = ["\\data\\"] + [f"ngram {n}={len(grams[n])}" for n in range(1, order + 1)]
    for n in range(1, order + 1):
        lines += ["", f"\\{n}-grams:"]
        for g in grams[n]:
            prob = -99 if g == ("<s>",) else round(-rng.random() * 4, 4)
            line = f"{prob}\t{' '.join(g)}"
            if n < order:
                line += f"\t{round(rng.uniform(-2, 2), 4)}"
            lines.append(line)
    return "\n".join(lines + ["", "\\end\\", ""])


def mutate_bytes(rng: random.Random, data: bytes, rounds: int) -> bytes:
    out = bytearray(data)
    for _ in range(rounds):
        op = rng.randrange(6)
        at = rng.randrange(len(out) + 1)
        if op == 0 and out:
            out[min(at, len(out) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1 and out:
            out[min(at, len(out) - 1)] = rng.randrange(256)
        elif op == 2:
            out[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op == 3:
            del out[at:at + rng.randint(1, 16)]
        elif op == 4 and out:  # duplicate a piece
            start = rng.randrange(len(out))
            out[at:at] = out[start:start + rng.randint(1, 64)]
        else:
            del out[at:]
    return bytes(out)


def mutate_arpa(rng: random.Random, text: str) -> bytes:
    lines = text.split("\n")
    for _ in range(1 if rng.random() < 0.6 else rng.randint(2, 4)):
        op = rng.randrange(8)
        i = rng.randrange(len(lines))
        fields = lines[i].split("\t")
        if op == 0 and lines[i].startswith("ngram "):  # a header count
            lines[i] = lines[i].split("=")[0] + "=" + rng.choice(HOSTILE_COUNTS)
        elif op in (1, 2) and len(fields) >= 2:  # a log-probability or a back-off weight
            fields[0 if op == 1 or len(fields) == 2 else -1] = rng.choice(HOSTILE_NUMBERS)
            lines[i] = "\t".join(fields)
        elif op == 3:
            del lines[i]
        elif op == 4:
            lines.insert(i, lines[rng.randrange(len(lines))])
        elif op == 5 and len(fields) >= 2:  # a word
            words = fields[1].split(" ")
            words[rng.randrange(len(words))] = rng.choice(["<s>", "</s>", "<unk>", "", "\\end\\", "-1",
                                                           "4294967296", "99999999999", "\u00e9", "\r", "7"])
            fields[1] = " ".join(words)
            lines[i] = "\t".join(fields)
        elif op == 6:
            lines[i] = lines[i].replace("\t", rng.choice([" ", "  ", "\t\t", "\r\t", "\v"]))
        else:
            lines.insert(i, rng.choice(["\\data\\", "\\1-grams:", "\\end\\", "ngram 5=1", "\\3-grams:", ""]))
    data = "\n".join(lines).encode("utf-8", "surrogateescape")
    if rng.random() < 0.2:
        data = mutate_bytes(rng, data, rng.randint(1, 3))
    if rng.random() < 0.15:
        data = gzip.compress(data, compresslevel=1)
        if rng.random() < 0.5:
            data = mutate_bytes(rng, data, 1)
    return data


def random_lattice_args(rng: random.Random):
    """Odd but mostly well-typed lattice and search arguments; about one in ten is invalid."""
    import numpy as np

    def odd(usual, unusual, rate=0.1):
        return rng.choice(unusual) if rng.random() < rate else usual

    h, k = rng.randint(1, 10), rng.randint(1, 12)
    shape = odd((h, k), [(rng.randint(0, 3), h, k), (rng.randint(0, 3), h, k), (0, k), (h, 0), (h,), (1, 2, 3, 4)])
    n = int(np.prod(shape))
    token_pool = [-1, 2**31 - 1, 2**31, 2**40, 0, 1, 2, 3]
    rows = [rng.sample(range(60), shape[-1]) if shape[-1] <= 60 else [0] * shape[-1]
            for _ in range(n // max(1, shape[-1]))]  # distinct arcs per position, mostly
    tokens = np.array([odd(t, token_pool, 0.005) for row in rows for t in row], dtype=np.int64)
    tokens = tokens.astype(odd(np.int32, [np.int64, np.int16, np.uint32, np.float32, np.bool_]))  # may wrap
    values = [0.0, -1.0, float("nan"), float("inf"), -float("inf"), 1e39, -1e300, 3e38, 5e-324, -0.0]
    scores = np.array([odd(rng.gauss(0, 3), values, 0.005) for _ in range(n)])
    with np.errstate(over="ignore"):
        scores = scores.astype(odd(np.float32, [np.float64, np.float16]))
    tokens, scores = tokens.reshape(shape), scores.reshape(shape)
    widths = None
    if rng.random() < 0.5 and len(shape) >= 2:
        width = max(1, shape[-1])
        widths = np.array([odd(rng.randint(1, width), [0, -1, width + 1], 0.02)
                           for _ in range(int(np.prod(shape[:-1])))], dtype=np.int64).reshape(shape[:-1])
    big = [2**20] if len(shape) >= 2 and shape[-1] ** shape[-2] <= 4096 else []  # the largest p, where the paths are few
    p = odd(rng.choice([1, 1, 2, 4, 16, rng.randint(1, 300)]), [0, -1, 2**20 + 1, 2**40, True, 1.5] + big)
    alpha = odd(rng.choice([0.0, 0.5, 1.0, 3.0, rng.uniform(0, 20)]),
                [1e-300, 1e30, 1e290, 1e296, 1e300, 1e308, -1.0, float("nan"), float("inf"), 10**400], 0.2)
    context = [odd(rng.randrange(60), token_pool, 0.05) for _ in range(rng.randint(0, 6))]
    threads = odd(rng.choice([None, 1, 2]), [3, 0, -1, 1024, 1025, 2**31, 2**64])
    return tokens, scores, widths, p, alpha, context, bool(rng.random() < 0.5), threads


# ---- running one input (in the worker)

class Worker:
    def __init__(self, folder: str) -> None:
        import numpy as np

        import latticekit as lk

        self.lk, self.np = lk, np
        self.folder = folder
        rng = random.Random(1)
        self.arpa_seeds = [random_arpa(rng) for _ in range(24)]
        self.binary_seeds = []
        for i, text in enumerate(self.arpa_seeds[:12]):
            path = os.path.join(folder, f"seed{i}.lkm")
            arpa = os.path.join(folder, f"seed{i}.arpa")
            Path(arpa).write_text(text)
            lk.NGramLM.from_arpa(arpa).save(path)
            self.binary_seeds.append(Path(path).read_bytes())
        extreme = self.arpa_seeds[0]
        for old, new in (("-99\t<s>", "-inf\t<s>"),):
            extreme = extreme.replace(old, new)
        lines = extreme.split("\n")
        for i, line in enumerate(lines):  # extreme legal values: -3.4e38, back-offs +-3e38
            f = line.split("\t")
            if len(f) == 3 and i % 3 == 0:
                lines[i] = "\t".join(["-3.4e38", f[1], rng.choice(["3e38", "-3e38", "1e30"])])
        path = os.path.join(folder, "extreme.arpa")
        Path(path).write_text("\n".join(lines))
        self.models = [lk.NGramLM.from_arpa(os.path.join(folder, f"seed{i}.arpa")) for i in range(4)]
        self.models.append(lk.NGramLM.from_arpa(path))

    def use(self, lm, rng: random.Random) -> None:
        """Scores and searches with a model that loaded."""
        lk, np = self.lk, self.np
        tokens = [rng.randrange(45) for _ in range(rng.randint(0, 6))]
        assert all(np.isfinite(lm.token_logprobs(tokens, context=[rng.randrange(45)])))
        h, k = rng.randint(1, 5), rng.randint(1, 5)
        lattice = lk.SausageLattice(np.array([rng.sample(range(45), k) for _ in range(h)]),
                                    np.array([[rng.gauss(0, 3) for _ in range(k)] for _ in range(h)]))
        p = rng.randint(1, 12)
        alpha = rng.choice([0.0, 1.0, 7.5, 1e30, 1e290])
        try:
            paths = lk.pbest(lattice, lm, p, alpha, context=tokens, bos=rng.random() < 0.5)
        except lk.LatticeError as exc:
            assert "alpha" in str(exc), exc
            return
        assert len(paths) == min(p, lattice.num_paths), (len(paths), p)
        assert all(np.isfinite(x.score) and np.isfinite(x.lm_score) for x in paths)

    def run(self, kind: str, seed: int, index: int) -> None:
        rng = random.Random(seed * 1_000_003 + index * 7919 + KINDS.index(kind))
        getattr(self, "run_" + kind)(rng)

    def run_arpa(self, rng: random.Random) -> None:
        data = mutate_arpa(rng, rng.choice(self.arpa_seeds))
        path = os.path.join(self.folder, "in.arpa.gz" if data[:2] == b"\x1f\x8b" else "in.arpa")
        Path(path).write_bytes(data)
        lm = self.lk.NGramLM.from_arpa(path)
        self.use(lm, rng)
        if rng.random() < 0.1:
            lm.save(os.path.join(self.folder, "out.lkm"))
            self.use(self.lk.NGramLM.load(os.path.join(self.folder, "out.lkm")), rng)

    def run_binary(self, rng: random.Random) -> None:
        data = bytearray(rng.choice(self.binary_seeds))
        op = rng.randrange(4)
        if op == 0:
            data = bytearray(mutate_bytes(rng, bytes(data), rng.randint(1, 4)))
        elif op == 1:  # a value field: a float anywhere past the header
            at = rng.randrange(192, max(193, len(data) - 4))
            data[at:at + 4] = struct.pack("<f", rng.choice([float("nan"), float("inf"), -float("inf"),
                                                            3e38, -3e38, 1e-45, 0.0, 1.0]))
        elif op == 2:  # a header field: a size, an offset, the order or the flags
            at = rng.choice([16, 20, 24, 28] + list(range(32, 128, 8)))
            width = 4 if at < 32 else 8
            value = rng.choice([0, 1, 2, 3, 255, 256, 2**31, 2**32 - 1, 2**32, 2**63, 2**64 - 1,
                                int.from_bytes(data[at:at + width], "little") + rng.choice([-1, 1, 8, 64])])
            data[at:at + width] = (value % 2 ** (8 * width)).to_bytes(width, "little")
        else:  # a word or a state record
            for _ in range(rng.randint(1, 3)):
                at = rng.randrange(192, len(data))
                data[at] = rng.randrange(256)
        if rng.random() < 0.75 and len(data) >= 192:  # as a crafted file would be
            data[128:136] = struct.pack("<Q", self.lk._core.checksum64(bytes(data[192:])))
        path = os.path.join(self.folder, "in.lkm")
        Path(path).write_bytes(bytes(data))
        self.use(self.lk.NGramLM.load(path), rng)

    def run_lattice(self, rng: random.Random) -> None:
        lk, np = self.lk, self.np
        lm = rng.choice(self.models)
        tokens, scores, widths, p, alpha, context, bos, threads = random_lattice_args(rng)
        if rng.random() < 0.1:
            logits = scores if scores.ndim in (2, 3) else np.zeros((2, 3))
            lattice = lk.SausageLattice.from_logits(logits.astype(np.float64) if rng.random() < 0.5 else logits.tolist(),
                                                    k=rng.choice([1, 2, 5, 0, 100]), fix_first=rng.random() < 0.5)
        else:
            lattice = lk.SausageLattice(tokens, scores, widths)
        if lattice.is_batch or rng.random() < 0.3:
            contexts = None if rng.random() < 0.5 else [context] * (lattice.batch_size or 1)
            result = lk.pbest_batch(lattice, lm, p, alpha, contexts, bos, threads)
            for b in range(len(result)):
                paths = result[b]
                single = lattice[b] if lattice.is_batch else lattice
                assert len(paths) == min(p, single.num_paths), (len(paths), p)
                assert all(np.isfinite(x.score) for x in paths)
        else:
            paths = lk.pbest(lattice, lm, p, alpha, context, bos)
            assert len(paths) == min(p, lattice.num_paths), (len(paths), p)
            assert all(np.isfinite(x.score) for x in paths)


def worker_main(args) -> int:
    page = mmap.mmap(os.open(args.progress, os.O_RDWR), PAGE)
    folder = tempfile.mkdtemp(prefix="lk-fuzz-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    worker = Worker(folder)
    lk = worker.lk
    kinds = args.kinds.split(",")
    for index in range(args.first, args.first + args.count):
        kind = kinds[index % len(kinds)]
        PROGRESS.pack_into(page, 0, index, time.monotonic())
        if index == args.selftest_crash_at:  # the harness's own tests: a crash and a hang
            os.abort()
        if index == args.selftest_hang_at:
            time.sleep(3600)
        try:
            worker.run(kind, args.seed, index)
            outcome = "ok"
        except lk.LatticeKitError:
            outcome = "typed"
        except Exception as exc:  # noqa: BLE001 - what the fuzzer looks for
            outcome = "wrong" if isinstance(exc, AssertionError) else "untyped"
            print(json.dumps({"index": index, "kind": kind, "outcome": outcome, "error": type(exc).__name__,
                              "message": str(exc)[:300], "trace": traceback.format_exc()[-1500:]}), flush=True)
        at = PROGRESS.size + 8 * (KINDS.index(kind) * len(OUTCOMES) + OUTCOMES.index(outcome))
        struct.pack_into("<q", page, at, struct.unpack_from("<q", page, at)[0] + 1)
    return 0


# ---- the parent: workers in subprocesses, crashes and hangs recorded

def run_chunk(args, first: int, count: int, out: Path, report: dict) -> None:
    """Runs inputs first .. first + count - 1 in a worker, restarting it after a crash or hang."""
    page_path = out / f"progress-{os.getpid()}"
    kinds = args.kinds.split(",")
    while count > 0:
        page_path.write_bytes(b"\0" * PAGE)
        page = mmap.mmap(os.open(page_path, os.O_RDWR), PAGE)
        PROGRESS.pack_into(page, 0, first - 1, time.monotonic())
        cmd = [sys.executable, __file__, "--worker", "--seed", str(args.seed), "--first", str(first),
               "--count", str(count), "--kinds", args.kinds, "--progress", str(page_path),
               "--selftest-crash-at", str(args.selftest_crash_at), "--selftest-hang-at", str(args.selftest_hang_at)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        reader = _LineReader(proc.stdout)
        lines, hung = [], False
        while proc.poll() is None:
            lines += reader.read(0.5)
            index, started = PROGRESS.unpack_from(page, 0)
            if index >= first and time.monotonic() - started > args.timeout:
                hung = True
                proc.kill()
                proc.wait()
        lines += reader.read(0.0, final=True)
        report["failures"] += [json.loads(line) for line in lines]
        for k, kind in enumerate(KINDS):
            for o, outcome in enumerate(OUTCOMES):
                n = struct.unpack_from("<q", page, PROGRESS.size + 8 * (k * len(OUTCOMES) + o))[0]
                if n:
                    report["counts"][f"{kind}:{outcome}"] = report["counts"].get(f"{kind}:{outcome}", 0) + n
        index = PROGRESS.unpack_from(page, 0)[0]
        page.close()
        if proc.returncode == 0 and not hung:
            return
        # The worker died or hung on input `index`: record it and go on after it.
        kind = kinds[index % len(kinds)]
        outcome = "hang" if hung else "crash"
        report["failures"].append({"index": index, "kind": kind, "outcome": outcome, "returncode": proc.returncode})
        report["counts"][f"{kind}:{outcome}"] = report["counts"].get(f"{kind}:{outcome}", 0) + 1
        count -= index + 1 - first
        first = index + 1


class _LineReader:
    """Lines of a pipe, read without blocking longer than a timeout."""

    def __init__(self, stream) -> None:
        self.stream, self.buffer = stream, ""

    def read(self, timeout: float, final: bool = False) -> list:
        import select

        lines = []
        while True:
            ready, _, _ = select.select([self.stream], [], [], timeout)
            if not ready:
                break
            chunk = os.read(self.stream.fileno(), 1 << 16).decode()
            if not chunk:
                break
            self.buffer += chunk
            timeout = 0.0
        *complete, self.buffer = self.buffer.split("\n")
        lines += [line for line in complete if line.strip()]
        if final and self.buffer.strip():
            lines.append(self.buffer)
            self.buffer = ""
        return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", type=int, help="how many inputs (default: as many as --minutes allow)")
    ap.add_argument("--minutes", type=float, help="stop starting chunks after this long")
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated, from " + ", ".join(KINDS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--first", type=int, default=0, help="index of the first input (to continue a run)")
    ap.add_argument("--chunk", type=int, default=20_000, help="inputs per worker run")
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds one input may take (a hang)")
    ap.add_argument("--out", default="fuzz-out", help="folder for the progress file and failing inputs")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--progress", help=argparse.SUPPRESS)
    ap.add_argument("--selftest-crash-at", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("--selftest-hang-at", type=int, default=-1, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker_main(args)
    if args.inputs is None and args.minutes is None:
        ap.error("give --inputs or --minutes")
    if any(kind not in KINDS for kind in args.kinds.split(",")):
        ap.error(f"--kinds: choose from {KINDS}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"args": vars(args), "counts": {}, "failures": []}
    start = time.monotonic()
    first, left = args.first, args.inputs if args.inputs is not None else float("inf")
    while left > 0 and (args.minutes is None or time.monotonic() - start < 60 * args.minutes):
        n = int(min(args.chunk, left))
        run_chunk(args, first, n, out, report)
        first += n
        left -= n
    report["inputs"] = first - args.first
    report["next_first"] = first
    report["seconds"] = round(time.monotonic() - start, 1)
    outcomes = {}
    for key, n in report["counts"].items():
        outcome = key.split(":")[-1]
        outcomes[outcome] = outcomes.get(outcome, 0) + n
    report["outcomes"] = outcomes
    for failure in report["failures"]:  # keep what it takes to rerun each failing input
        failure["rerun"] = (f"python tools/fuzz.py --inputs 1 --first {failure['index']} --seed {args.seed} "
                            f"--kinds {args.kinds} --chunk 1")
    (out / f"report-{args.seed}-{args.first}.json").write_text(json.dumps(report, indent=1))
    print(json.dumps({k: report[k] for k in ("inputs", "next_first", "seconds", "outcomes", "counts")}))
    bad = sum(outcomes.get(k, 0) for k in ("untyped", "wrong", "crash", "hang"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
