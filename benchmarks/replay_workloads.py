"""The four request workloads of the drafter replay, and their greedy streams, cached.

Built from offline material only, deterministically:

* ``chat``: the held-out instruction requests without a given text (``what-does``, ``what-is``,
  ``explain-topic``, ``explain``: questions about CPython's standard library and the Python and
  PostgreSQL documentation), from ``benchmarks/results/heads/instruction_prompts.json`` (built by
  ``latticekit.heads.prompts``; the domains of ``benchmarks/vllm_speed.py``'s ``chat``, plus
  ``explain``);
* ``summary``: summarization / RAG-style held-out requests over a given paragraph of the Python
  or PostgreSQL documentation (``summarise``, ``rewrite``, ``key-points``, ``questions``: the
  ``summary`` domain of ``vllm_speed.py``);
* ``code``: code edits whose answer copies the input: the held-out ``rewrite`` and ``docstring``
  requests, then ``benchmarks/headsfree_prompts.py``'s copy tasks (type hints, a docstring, a
  renamed variable) over public functions of the held-out standard-library files of the heads'
  split (``benchmarks/results/heads/split.json``), six per file, in hash order;
* ``repeated``: an agent-like loop: one request template (:data:`AGENT_TEMPLATE`) over many
  functions (the held-out functions the code workload did not take).

Every request goes through SmolLM2-135M-Instruct's chat template. The greedy streams (the
prompt's ids and up to ``max_tokens`` greedy tokens, ended by the model's end of sequence)
come from vLLM's CPU engine without speculation, batched, float32 (as ``vllm_speed.py``
runs it), and are cached in ``benchmarks/cache/replay_streams/`` under a key of the model,
the settings, the vLLM version and the prompts.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from headsfree_prompts import COPY_CODE_TASKS, _functions, _hash, _heldout, _local_names  # noqa: E402
from vllm_speed import DOMAINS  # noqa: E402

__all__ = ["WORKLOADS", "AGENT_TEMPLATE", "workload_requests", "greedy_streams", "streams_of"]

WORKLOADS = ("chat", "summary", "code", "repeated")
AGENT_TEMPLATE = ("You are an agent that indexes a code base. For the Python code below, reply with exactly "
                  "four lines and nothing else:\nname: <its name>\nkind: <function or class>\n"
                  "arguments: <its arguments, comma-separated>\nsummary: <what it does, in one sentence>"
                  "\n\n```python\n{quote}\n```")
STREAMS_VERSION = 1


def _functions_pool() -> list[tuple[str, Any, str]]:
    """Public functions of every held-out standard-library file, six per file, in hash order."""
    manifest = ROOT / "results" / "heads" / "split.json"
    items = []
    for half in (0, 1):
        for path in _heldout(manifest, "code", half):
            if path.name.startswith("test") or "test" in path.parent.name:
                continue
            found = sorted(_functions(path), key=lambda it: (_hash(it[0]), it[0]))
            items += found[:6]
    return sorted(items, key=lambda it: (_hash(it[0]), it[0]))


def workload_requests(workload: str, count: int) -> list[str]:
    """The first ``count`` user messages of a workload (see the module docstring)."""
    if workload in ("chat", "summary"):
        kinds = DOMAINS[workload] | ({(s, "explain") for s in ("code", "python-docs", "postgresql-docs")}
                                     if workload == "chat" else set())
        heldout = json.loads((ROOT / "results" / "heads" / "instruction_prompts.json").read_text())["heldout"]
        chosen = sorted((r for r in heldout if (r["source"], r["task"]) in kinds), key=lambda r: r["id"])
        return [r["user"] for r in chosen[:count]]
    pool = _functions_pool()
    if workload == "repeated":
        return [AGENT_TEMPLATE.format(quote=q) for _, _, q in pool[1::2][:count]]
    if workload != "code":
        raise SystemExit(f"unknown workload {workload!r}; known: {WORKLOADS}")
    heldout = json.loads((ROOT / "results" / "heads" / "instruction_prompts.json").read_text())["heldout"]
    out = [r["user"] for r in sorted((r for r in heldout if (r["source"], r["task"]) in DOMAINS["code"]),
                                     key=lambda r: r["id"])]
    tasks = sorted(COPY_CODE_TASKS)
    for i, (key, node, quote) in enumerate(pool[0::2]):
        task = tasks[i % len(tasks)]
        names = _local_names(node) if isinstance(node, ast.FunctionDef) else []
        if task == "rename" and not names:
            task = "type-hints"
        fields = {"quote": quote}
        if task == "rename":
            old = names[_hash(key) % len(names)]
            fields.update(old=old, new=f"{old}_value" if not old.endswith("value") else f"new_{old}")
        out.append(COPY_CODE_TASKS[task].format(**fields))
    return out[:count]


def greedy_streams(workload: str, count: int, max_tokens: int, batch: int = 32) -> list[dict[str, list[int]]]:
    """Per request, ``{"prompt": ids, "continuation": greedy ids}``, cached (see the module docstring)."""
    return streams_of(workload, workload_requests(workload, count), max_tokens, batch)


def streams_of(name: str, texts: list[str], max_tokens: int, batch: int = 32) -> list[dict[str, list[int]]]:
    """:func:`greedy_streams` of these user messages, cached under ``name`` and a key of them."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    import vllm

    from latticekit.loading import smollm2_hf_folder

    key = hashlib.sha256(json.dumps([STREAMS_VERSION, "SmolLM2-135M-Instruct", "float32", "greedy", max_tokens,
                                     vllm.__version__, texts]).encode()).hexdigest()[:16]
    path = ROOT / "cache" / "replay_streams" / f"{name}-{len(texts)}-{max_tokens}-{key}.json"
    if path.exists():
        return json.loads(path.read_text())["streams"]
    folder = smollm2_hf_folder()
    llm = vllm.LLM(model=str(folder), dtype="float32", max_model_len=4096, max_num_seqs=batch,
                   enforce_eager=True, seed=0)
    tok = llm.get_tokenizer()
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                                  tokenize=False), add_special_tokens=False) for q in texts]
    params = vllm.SamplingParams(temperature=0, max_tokens=max_tokens)
    got = llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
    streams = [{"prompt": list(map(int, p)), "continuation": list(map(int, o.outputs[0].token_ids))}
               for p, o in zip(prompts, got)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"model": "SmolLM2-135M-Instruct", "dtype": "float32", "max_tokens": max_tokens,
                                "vllm": vllm.__version__, "engine": "vLLM CPU, no speculation, greedy",
                                "streams": streams}))
    del llm
    return streams


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description="builds and caches the greedy streams of the replay workloads")
    p.add_argument("--count", type=int, default=200)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    args = p.parse_args()
    for w in args.workloads:
        print(w, len(workload_requests(w, args.count)), "requests", flush=True)
    for w in args.workloads:
        s = greedy_streams(w, args.count, args.max_tokens)
        print(w, len(s), "streams,", sum(len(x["continuation"]) for x in s), "tokens", flush=True)
