"""What one call of latticekit's vLLM proposer costs for a whole batch, off the engine.

``latticekit.vllm.NGramProposer.propose`` is called as vLLM's runner calls it after every step:
per row, the tokens the step emitted, the row's length and the token buffer. Here ``--rows``
requests of real text (``drafting_cost.py``'s streams: ``code`` is the CPython standard library,
``english`` its language reference) are decoded greedily against their own streams: a row accepts
the longest prefix of its chain that the stream continues with, and one token more; a request
whose answer (``--answer`` tokens after a ``--prompt``-token prompt) is done is replaced by the
next stretch of the stream, its answer going into the proposer's memory of earlier answers, as
in an engine.

The proposer runs with its defaults but two: the step costs are fixed (``step_costs``
``(0.067, 0.0015)``, a 16-request step on a 2-core CPU) and its clock is frozen, so that what
it drafts depends on the text alone: two checkouts drafted the same chains iff their digests
are equal. The calls are timed with ``time.perf_counter`` around ``propose``; the first
``--warm`` calls are left out. Drafting is single-threaded. Wrap timing runs in
``flock /tmp/latticekit-timing.lock``.

    PYTHONPATH=. python benchmarks/proposer_cost.py --name after
    PYTHONPATH=/path/to/base/checkout python benchmarks/proposer_cost.py --name before
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
OUT = ROOT / "results" / "proposer_cost"


def run(domain: str, rows: int, calls: int, warm: int, prompt: int, answer: int) -> dict[str, Any]:
    import transformers

    from benchmarks.drafting_cost import VOCAB, token_stream
    from latticekit.loading import smollm2_hf_folder
    from latticekit.vllm.config import ProposerConfig
    from latticekit.vllm.proposer import NGramProposer

    per = prompt + answer + 16
    tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2_hf_folder())
    stream, sources = token_stream(domain, tokenizer, per * (rows + calls // 8 + 2))
    config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=8),
                             model_config=SimpleNamespace(max_model_len=1 << 16, get_vocab_size=lambda: VOCAB))
    proposer = NGramProposer(config, ProposerConfig(step_costs=(0.067, 0.0015)))
    proposer.clock = lambda: 0.0  # what it drafts depends on the text alone
    buffer = np.zeros((rows, per), dtype=np.int32)
    texts: list[np.ndarray] = [np.zeros(0, dtype=np.int32)] * rows
    lengths = np.zeros(rows, dtype=np.int64)
    taken = 0

    def new_request(row: int) -> None:
        nonlocal taken
        start = (taken * per) % max(1, stream.size - per)
        taken += 1
        texts[row] = stream[start:start + per]
        buffer[row, :] = texts[row]
        lengths[row] = prompt

    for row in range(rows):
        new_request(row)
    sampled = [[int(texts[row][prompt - 1])] for row in range(rows)]
    seconds: list[float] = []
    digest = hashlib.sha256()
    drafted = accepted = 0
    for _ in range(calls):
        t0 = time.perf_counter()
        out = proposer.propose(sampled, lengths.copy(), buffer)
        seconds.append(time.perf_counter() - t0)
        sampled = []
        for row, chain in enumerate(out):
            at, text = int(lengths[row]), texts[row]
            n = 0
            while n < len(chain) and chain[n] == text[at + n]:
                n += 1
            digest.update(np.asarray(chain, dtype=np.int64).tobytes() + b"|")
            drafted, accepted = drafted + len(chain), accepted + n
            sampled.append([int(t) for t in text[at:at + n + 1]])
            lengths[row] = at + n + 1
            if lengths[row] >= prompt + answer:
                new_request(row)
    timed = seconds[warm:]
    return {"domain": domain, "rows": rows, "calls": len(timed), "ms_median": 1e3 * statistics.median(timed),
            "ms_mean": 1e3 * statistics.fmean(timed), "ms_p90": 1e3 * float(np.percentile(timed, 90)),
            "drafted": drafted, "accepted": accepted, "requests": taken,
            "memory_tokens": len(proposer.memory) if proposer.memory is not None else 0,
            "digest": digest.hexdigest()[:16], "text": sources}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[4, 16])
    ap.add_argument("--domains", nargs="+", choices=("code", "english"), default=["code", "english"])
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--warm", type=int, default=20, help="calls left out of the timing")
    ap.add_argument("--prompt", type=int, default=300)
    ap.add_argument("--answer", type=int, default=64)
    ap.add_argument("--name", default="proposer_cost")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    from latticekit._machine import machine

    results = [run(d, r, args.calls, args.warm, args.prompt, args.answer) for d in args.domains for r in args.rows]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import latticekit

    report: dict[str, Any] = {"machine": machine(), "latticekit": str(Path(latticekit.__file__).parent), "args": vars(args),
              "results": results}
    (out / f"{args.name}.json").write_text(json.dumps(report, indent=1) + "\n")
    m = report["machine"]
    lines = [f"# proposer_cost: {args.name}", "", f"`{' '.join(sys.argv)}` on {m['cpu']} ({', '.join(m['isa'])}), "
             f"load average {m['load_average']}; latticekit from "
             f"{report['latticekit']}", "", "| domain | rows | ms a call (median) | mean | p90 | drafted | accepted "
             "| digest |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['domain']} | {r['rows']} | {r['ms_median']:.2f} | {r['ms_mean']:.2f} | {r['ms_p90']:.2f} "
                     f"| {r['drafted']} | {r['accepted']} | {r['digest']} |")
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
