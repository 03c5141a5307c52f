"""What vLLM's CPU kernels charge for a step's tokens: its GEMMs and its attention, timed alone.

``benchmarks/vllm_draft_cost.py --profile`` says where a draft token's milliseconds go inside
the engine (GEMMs and the attention kernel, mostly); this times those two kernels outside it,
with the shapes of SmolLM2-135M-Instruct read from its config (hidden 576, MLP 1536, 9 query
and 3 key-value heads of 64, 30 layers) and vLLM's CPU block of 128 tokens, to say how they
grow:

* **GEMMs:** the four projections of every layer (qkv, o, gate-up, down) as vLLM's CPU build
  runs unquantized weights (``vllm._custom_ops.create_onednn_mm`` / ``onednn_mm``), and as
  torch's own ``linear`` (MKL) would, for a step of M tokens, M in ``--tokens``;
* **attention:** ``cpu_attention_with_kv_cache`` (its scheduler metadata built once a step, as
  vLLM does), for 16 requests of
  ``--context`` keys each decoding one token, two or three (a draft of one or two tokens per
  request), for 32 requests decoding one, and for one request of two among 15 of one.

Every variant is timed in turns, ``--rounds`` times each; the report gives the medians, in ms
per step of 30 layers. Random inputs: only the shapes matter.

Usage::

    PYTHONPATH=. python benchmarks/vllm_cpu_kernels.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

ROOT = Path(__file__).resolve().parent
#: vLLM's KV cache block on the CPU (``vllm/platforms/cpu.py``: 128 unless the user sets one)
BLOCK = 128
#: attention batches: per request, its query tokens
BATCHES = {"16 x 1": [1] * 16, "16 x 2": [2] * 16, "16 x 3": [3] * 16, "32 x 1": [1] * 32,
           "1 x 2 + 15 x 1": [2] + [1] * 15}


class Shapes(NamedTuple):
    """The target's shapes that set its kernels' sizes (from its HF ``config.json``)."""

    layers: int
    hidden: int
    mlp: int
    heads: int
    kv_heads: int
    head_dim: int

    @classmethod
    def of(cls, folder: Path) -> "Shapes":
        config = json.loads((folder / "config.json").read_text())
        heads = config["num_attention_heads"]
        return cls(config["num_hidden_layers"], config["hidden_size"], config["intermediate_size"], heads,
                   config.get("num_key_value_heads", heads), config.get("head_dim", config["hidden_size"] // heads))

    def projections(self) -> list[tuple[int, int]]:
        """(out, in) of one layer's projections: qkv, o, gate-up, down."""
        attention = self.heads * self.head_dim
        return [(attention + 2 * self.kv_heads * self.head_dim, self.hidden), (self.hidden, attention),
                (2 * self.mlp, self.hidden), (self.hidden, self.mlp)]


def turns(cases: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
    """Each case's median seconds, the cases timed in turns (after one untimed call each)."""
    for run in cases.values():
        run()
    seconds: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, run in cases.items():
            t0 = time.perf_counter()
            run()
            seconds[name].append(time.perf_counter() - t0)
    return {name: statistics.median(s) for name, s in seconds.items()}


def gemm_cases(shapes: Shapes, tokens: list[int]) -> dict[str, Callable[[], Any]]:
    import torch
    from vllm import _custom_ops as ops

    projections = shapes.projections()
    weights = [torch.randn(n, k) for n, k in projections]
    handles = [ops.create_onednn_mm(w.t(), 32) for w in weights]
    cases: dict[str, Callable[[], Any]] = {}
    for m in tokens:
        inputs = [torch.randn(m, k) for _, k in projections]

        def onednn(inputs: list[Any] = inputs) -> None:
            for _ in range(shapes.layers):
                for handle, x in zip(handles, inputs):
                    ops.onednn_mm(handle, x, None)

        def mkl(inputs: list[Any] = inputs) -> None:
            for _ in range(shapes.layers):
                for w, x in zip(weights, inputs):
                    torch.nn.functional.linear(x, w)

        cases[f"onednn {m}"], cases[f"torch {m}"] = onednn, mkl
    return cases


def attention_cases(shapes: Shapes, context: int) -> dict[str, Callable[[], Any]]:
    import torch
    from vllm import _custom_ops as ops
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    heads, kv_heads, head_dim = shapes.heads, shapes.kv_heads, shapes.head_dim
    isa = _get_attn_isa(torch.float32, BLOCK, head_dim, "auto")
    cases: dict[str, Callable[[], Any]] = {}
    for name, queries in BATCHES.items():
        n = len(queries)
        seq_lens = torch.tensor([context + q for q in queries], dtype=torch.int32)
        starts = torch.zeros(n + 1, dtype=torch.int32)
        starts[1:] = torch.cumsum(torch.tensor(queries, dtype=torch.int32), 0)
        blocks = (context + max(queries) + BLOCK - 1) // BLOCK
        cache = torch.randn(n * blocks, kv_heads, 2 * BLOCK, head_dim)  # vLLM's layout: keys, then values
        keys, values = cache.chunk(2, dim=2)
        table = torch.arange(n * blocks, dtype=torch.int32).view(n, blocks)
        query = torch.randn(int(starts[-1]), heads, head_dim)
        out = torch.empty_like(query)

        def attend(n: int = n, seq_lens: Any = seq_lens, starts: Any = starts, keys: Any = keys, values: Any = values,
                   table: Any = table, query: Any = query, out: Any = out) -> None:
            # the metadata once a step (vLLM builds it once per step and layer group), the kernel per layer
            metadata = ops.cpu_attn_get_scheduler_metadata(n, heads, kv_heads, head_dim, seq_lens, torch.float32,
                                                           starts, True, -1, isa, False, None, "auto")
            for _ in range(shapes.layers):
                ops.cpu_attention_with_kv_cache(query, keys, values, out, starts, seq_lens, head_dim ** -0.5, True,
                                                None, -1, table, 0.0, metadata, None, None, 1.0, 1.0, "auto")

        cases[name] = attend
    return cases


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 8, 15, 16, 17, 18, 20, 24, 32, 48, 64])
    p.add_argument("--context", type=int, default=512, help="keys each request attends")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=21)
    p.add_argument("--out", default=str(ROOT / "results" / "vllm_speed" / "draft-cost-profile"))
    args = p.parse_args()
    import torch
    import vllm

    from latticekit._machine import machine
    from latticekit.loading import smollm2_hf_folder

    shapes = Shapes.of(smollm2_hf_folder())
    torch.set_num_threads(args.threads)
    gemm = turns(gemm_cases(shapes, args.tokens), args.rounds)
    attention = turns(attention_cases(shapes, args.context), args.rounds)
    report = {"args": vars(args), "vllm": vllm.__version__, "torch": torch.__version__, "machine": machine(),
              "shapes": shapes._asdict(),
              "gemm_ms": {k: round(v * 1e3, 2) for k, v in gemm.items()},
              "attention_ms": {k: round(v * 1e3, 2) for k, v in attention.items()}}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels.json").write_text(json.dumps(report, indent=1) + "\n")
    lines = [f"# vLLM {vllm.__version__}'s CPU kernels alone, SmolLM2-135M's shapes ({report['machine']['cpu']}, "
             f"{args.threads} threads)", "", f"`{json.dumps(vars(args))}`", "",
             f"ms per step of {shapes.layers} layers ({shapes._asdict()}), the median of {args.rounds} turns.", "",
             "| tokens in the step | GEMMs, oneDNN (vLLM's) | GEMMs, torch linear (MKL) |", "|---|---|---|"]
    lines += [f"| {m} | {report['gemm_ms'][f'onednn {m}']} | {report['gemm_ms'][f'torch {m}']} |" for m in args.tokens]
    lines += ["", f"| requests x query tokens ({args.context} keys each) | attention |", "|---|---|"]
    lines += [f"| {name} | {ms} |" for name, ms in report["attention_ms"].items()]
    (out / "kernels.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
