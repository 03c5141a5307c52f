"""Where an engine's seconds go in lockstep: per engine, its steps' seconds, its proposer's
``propose`` seconds (and its calls over 2 ms), the parts of vLLM's step (``PARTS``: the
scheduler, the model's forward, sampling with the proposer's call, the scheduler's update) with
the process's minor page faults in each, and the garbage collector's pauses while it stepped.

The engines (``benchmarks/vllm_speed.py``'s: vLLM's CPU build, SmolLM2-135M-Instruct float32,
``enforce_eager``, greedy) run in this process, each group of ``--concurrency`` prompts of one
domain (``--domain``, chat by default) through all of them one step at a time in a shuffled
order (``vllm_speed.py``'s ``run_lockstep``).
An engine name ending in ``-2`` is a second engine of the same kind: two engines that do the
same work tell how far engines differ by themselves (where their memory lies, say), which is
the spread any comparison of two engines carries. ``latticekit-plain``: latticekit's n-gram
proposer with ``arms`` ``["plain"]`` (its bookkeeping every step, never a draft). Every
engine's outputs are checked identical to the first's.

    python benchmarks/engine_seconds.py --engines empty-plain latticekit latticekit-plain empty-plain-2 \\
        --concurrency 16 --groups 3 [--domain code] [--stats FOLDER] [--malloc tcmalloc]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
#: The parts of a step timed: (where, method) on vLLM 0.32's in-process engine core
#: (``EngineCore.step``), the proposer's call within ``sample_tokens``.
PARTS = {"schedule": ("scheduler", "schedule"), "execute": ("model_executor", "execute_model"),
         "sample": ("model_executor", "sample_tokens"), "update": ("scheduler", "update_from_output"),
         "drafts": ("model_executor", "take_draft_token_ids")}
#: A ``propose`` call slower than this is counted apart (seconds).
SLOW_CALL = 0.002


def time_parts(core: Any, name: str, stepping: list[str], parts: dict[str, dict[str, float]],
               faults: dict[str, dict[str, int]]) -> None:
    """Wraps ``core``'s (an in-process ``EngineCore``) :data:`PARTS` so that their seconds add to
    ``parts[name]``, and the process's minor page faults in them to ``faults[name]``, while
    ``name`` steps."""
    for part, (owner, method) in PARTS.items():
        obj = getattr(core, owner)

        def timed(*a: Any, _f: Any = getattr(obj, method), _part: str = part, **k: Any) -> Any:
            t0, f0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            try:
                return _f(*a, **k)
            finally:
                if stepping == [name]:
                    parts[name][_part] += time.perf_counter() - t0
                    faults[name][_part] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
        setattr(obj, method, timed)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engines", nargs="+", required=True)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--groups", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--domain", default="chat", help="vllm_speed.py's domain of the prompts (chat: short ones)")
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--out", help="a JSON file of the figures")
    p.add_argument("--malloc", choices=("glibc", "tcmalloc"), default="glibc",
                   help="the engines' allocator, as in vllm_speed.py (glibc's by default, or tcmalloc preloaded)")
    p.add_argument("--stats", help="a folder: each latticekit engine writes its stats file there, as in "
                   "vllm_speed.py (none by default)")
    args = p.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    sys.path.insert(0, str(ROOT.parent))
    from benchmarks.vllm_speed import allocator, use_malloc

    use_malloc(args.malloc)
    import vllm
    import vllm.envs

    from benchmarks.vllm_speed import EngineClock, chat_prompt, in_process_drafter, requests, run_lockstep
    from latticekit._machine import machine
    from latticekit.loading import smollm2_hf_folder
    from latticekit.vllm import speculative_config

    vllm.envs.disable_envs_cache()
    specs: dict[str, Any] = {"none": None,
                             "empty-plain": {"method": "custom_class",
                                             "model": "benchmarks.vllm_speed.EmptyPlainProposer",
                                             "num_speculative_tokens": args.k}}
    settings: dict[str, dict[str, Any]] = {"latticekit": {}, "latticekit-plain": {"arms": ["plain"]}}
    names = args.engines
    for name in names:
        if name.removesuffix("-2") not in {**specs, **settings}:
            raise SystemExit(f"engine {name!r}: one of {sorted({**specs, **settings})}, or one of them with -2")
    engines = {}
    for name in names:
        kind = name.removesuffix("-2")
        spec = specs.get(kind)
        if kind in settings:  # latticekit's, with a stats file of its own where asked
            stats = {"stats": str(Path(args.stats) / f"proposer_stats-{name}.json")} if args.stats else {}
            spec = speculative_config(args.k, **settings[kind], **stats)
        engines[name] = vllm.LLM(model=str(smollm2_hf_folder()), dtype="float32", max_model_len=4096,
                                 max_num_seqs=args.concurrency, enforce_eager=True, seed=0,
                                 distributed_executor_backend="uni", **({"speculative_config": spec} if spec else {}))
    stepping: list[str] = []  # the engine stepping now, if any
    collected = {name: [0, 0.0] for name in names}  # collections while it stepped, and their seconds
    started = [0.0]

    def on_collect(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        elif stepping:
            collected[stepping[0]][0] += 1
            collected[stepping[0]][1] += time.perf_counter() - started[0]

    gc.callbacks.append(on_collect)
    proposing = dict.fromkeys(names, 0.0)
    slow: dict[str, list[float]] = {name: [] for name in names}  # propose calls over SLOW_CALL
    parts = {name: dict.fromkeys(PARTS, 0.0) for name in names}
    faults = {name: dict.fromkeys(PARTS, 0) for name in names}
    for name in names:
        time_parts(engines[name].llm_engine.engine_core.engine_core, name, stepping, parts, faults)
        drafter = in_process_drafter(engines[name])
        if drafter is not None:
            def timed(*a: Any, _propose: Any = drafter.propose, _name: str = name, **k: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return _propose(*a, **k)
                finally:
                    spent = time.perf_counter() - t0
                    proposing[_name] += spent
                    if spent > SLOW_CALL:
                        slow[_name].append(spent)
            drafter.propose = timed
    tok = engines[names[0]].get_tokenizer()
    texts = requests(args.concurrency * args.groups + 1, [args.domain])[args.domain]
    prompts = [chat_prompt(tok, q) for q in texts]
    for llm in engines.values():  # warm-up on the prompt no group takes
        llm.generate([prompts[-1]], vllm.SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    params = vllm.SamplingParams(temperature=0, max_tokens=args.max_tokens)
    class Stepping(EngineClock):
        """An engine's clock in :func:`~benchmarks.vllm_speed.run_lockstep`, resumed as the engine
        steps and paused after: it also marks the engine stepping (the collector's pauses are put
        on it) and counts its steps."""

        def __init__(self, name: str) -> None:
            super().__init__()
            self.name, self.steps = name, 0

        def resume(self) -> None:
            super().resume()
            stepping[:] = [self.name]
            self.steps += 1

        def pause(self) -> None:
            super().pause()
            stepping.clear()

    steppers = {name: Stepping(name) for name in names}
    clocks: dict[str, EngineClock] = dict(steppers)
    seconds = dict.fromkeys(names, 0.0)
    outputs: dict[str, list[list[int]]] = {name: [] for name in names}
    for g in range(args.groups):
        group = prompts[g * args.concurrency:(g + 1) * args.concurrency]
        for name, (secs, outs) in run_lockstep(engines, names, group, params, len(group), clocks).items():
            seconds[name] += secs
            outputs[name] += outs
        for stepper in steppers.values():  # run_lockstep resumes every clock as it returns: no step of theirs
            stepper.steps -= 1
        stepping.clear()
    steps = {name: stepper.steps for name, stepper in steppers.items()}
    figures: dict[str, dict[str, Any]] = {name: {"steps": steps[name], "step_s": round(seconds[name], 4), "propose_s": round(proposing[name], 4),
                      "engine_s": round(seconds[name] - proposing[name], 4), "gc": collected[name],
                      "parts_s": {part: round(v, 4) for part, v in parts[name].items()}, "faults": faults[name],
                      "slow_calls": [len(slow[name]), round(sum(slow[name]), 4),
                                     round(max(slow[name], default=0.0), 4)],
                      "identical": outputs[name] == outputs[names[0]]} for name in names}
    for name, f in figures.items():
        print(f"{name}: {f['steps']} steps, {f['step_s']:.3f} s stepping, {f['propose_s']:.3f} s proposing, "
              f"{f['engine_s']:.3f} s besides, {f['gc'][0]} collections ({1e3 * f['gc'][1]:.1f} ms), "
              f"identical {f['identical']}; parts (s) {f['parts_s']}, their minor page faults {f['faults']}; "
              f"propose calls over {1e3 * SLOW_CALL:.0f} ms: {f['slow_calls'][0]}, {f['slow_calls'][1]:.3f} s, "
              f"the longest {1e3 * f['slow_calls'][2]:.1f} ms", flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"machine": machine(), "args": vars(args), "vllm": vllm.__version__,
                                              "malloc": allocator(),
                                              "engines": figures}, indent=1))


if __name__ == "__main__":
    main()
