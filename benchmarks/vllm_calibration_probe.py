"""How well the vLLM proposer's drafted chain positions are calibrated, untimed.

Runs latticekit's n-gram proposer in vLLM (SmolLM2-135M-Instruct, float32, greedy; the
requests of ``vllm_speed.py``'s domains through the chat template) with a subclass that logs,
for every chain position it drafted, the batch's rows, the position's probability of being
accepted as the allocation weighed it (the estimate after the proposer's correction), the
correction itself, and whether the engine accepted it. ``--summarize`` bins them by load and by
estimate: the accepted share against the estimated one. Stop 51 read it to see whether one
correction factor for every position fits (it does not: ``docs/vllm.md``, stop 51, Platt
scaling tried).

Usage::

    PYTHONPATH=.:benchmarks python benchmarks/vllm_calibration_probe.py --concurrency 16 --groups 2 \\
        --sustained 2 --domains chat summary --settings '{"arms": ["model"]}' --out probe-16.json
    PYTHONPATH=.:benchmarks python benchmarks/vllm_calibration_probe.py --summarize probe-16.json
"""

from __future__ import annotations

import argparse
import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any, Optional

from latticekit.vllm.proposer import NGramProposer

#: Per drafted position: rows, its estimate (corrected), the correction, accepted (0/1), its
#: index in the chain; filled by :class:`ProbeProposer` in this process.
POSITIONS: list[tuple[int, float, float, int, int]] = []


class ProbeProposer(NGramProposer):
    """latticekit's n-gram proposer that logs its drafted positions' estimates and outcomes
    (:data:`POSITIONS`)."""

    def __init__(self, vllm_config: Any, config: Any = None) -> None:
        super().__init__(vllm_config, config)
        self._weighed: Optional[list[Any]] = None  # the probabilities the allocation weighed this call
        self._drafted: Optional[tuple[list[Any], list[Any], list[int], float, int]] = None

    def _repaid(self, probabilities: list[Any], *args: Any) -> Any:
        self._weighed = [p.copy() for p in probabilities]
        return super()._repaid(probabilities, *args)

    def _learn(self, pending: Any, start: float, sampled: list[list[int]], keys: list[Any],
               tokens: Optional[int]) -> None:
        if self._drafted is not None:
            rows_keys, weighed, lengths, correction, rows = self._drafted
            accepted = {key: len(s) - 1 for key, s in zip(keys, sampled) if s}
            for key, p, n in zip(rows_keys, weighed, lengths):
                if n and key in accepted:
                    POSITIONS.extend((rows, float(p[i]), correction, int(i < accepted[key]), i) for i in range(n))
        self._drafted = None
        super()._learn(pending, start, sampled, keys, tokens)

    def propose(self, sampled_token_ids: list[list[int]], *args: Any, **kwargs: Any) -> list[list[int]]:
        self._weighed = None
        correction = self.correction
        out = super().propose(sampled_token_ids, *args, **kwargs)
        if self._weighed is not None and any(out) and self._pending is not None and self._pending.rows:
            self._drafted = (list(self._pending.rows), self._weighed, [len(c) for c in out], correction,
                             len(sampled_token_ids))
        return out


def summarize(path: Path) -> None:
    """The accepted share against the estimated one, per domain, load and estimate bin."""
    data = json.loads(path.read_text())
    print(f"{path}: {json.dumps(data['args'])}")
    for domain, group, first, end in data["marks"]:
        print(f"  {domain} group {group}: {end - first} drafted positions")
    bins: dict[tuple[str, str, float], list[float]] = defaultdict(lambda: [0, 0.0, 0])
    corrections = []
    for domain, _, first, end in data["marks"]:
        for rows, p, correction, accepted, _ in data["positions"][first:end]:
            load = "16+" if rows >= 16 else "8-15" if rows >= 8 else "4-7" if rows >= 4 else "1-3"
            b = bins[(domain, load, min(int(p * 5), 4) / 5)]
            b[0] += 1
            b[1] += p
            b[2] += accepted
            corrections.append(correction)
    print("| domain | rows | estimate bin | positions | estimated | accepted |\n|---|---|---|---|---|---|")
    for (domain, load, low), (n, estimated, accepted) in sorted(bins.items()):
        print(f"| {domain} | {load} | {low:.1f}-{low + 0.2:.1f} | {int(n)} | {estimated / n:.2f} | {accepted / n:.2f} |")
    if corrections:
        print(f"correction: {min(corrections):.2f}-{max(corrections):.2f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--summarize", metavar="JSON")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--groups", type=int, default=2)
    p.add_argument("--sustained", type=int, default=0, help="as vllm_speed.py's (0: a group is one burst)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--domains", nargs="+", default=["chat", "summary"])
    p.add_argument("--settings", default="{}", help="latticekit's settings (JSON)")
    p.add_argument("--out", default="vllm_calibration_probe.json")
    args = p.parse_args()
    if args.summarize:
        summarize(Path(args.summarize))
        return
    import vllm
    import vllm.envs

    import vllm_calibration_probe as probe  # the module vLLM loads the proposer from: its POSITIONS
    import vllm_speed as vs
    from latticekit.loading import smollm2_hf_folder
    from latticekit.vllm import speculative_config

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the proposer in this process
    vllm.envs.disable_envs_cache()
    spec = speculative_config(args.k, **json.loads(args.settings))
    spec["model"] = "vllm_calibration_probe.ProbeProposer"
    llm = vllm.LLM(model=str(smollm2_hf_folder()), dtype="float32", max_model_len=4096,
                   max_num_seqs=args.concurrency, enforce_eager=True, seed=0, distributed_executor_backend="uni",
                   speculative_config=spec)
    tok = llm.get_tokenizer()
    counts = vs.phase_counts([args.concurrency], args.groups, args.sustained)
    params = vllm.SamplingParams(temperature=0, max_tokens=args.max_tokens)
    per_group = args.concurrency * max(1, args.sustained)
    marks = []
    for domain, texts in vs.requests(sum(counts) + 1, args.domains).items():
        phases, _ = vs.deal([vs.chat_prompt(tok, q) for q in texts], counts)
        for g in range(args.groups):
            first = len(probe.POSITIONS)
            vs.run_lockstep({"e": llm}, ["e"], phases[0][g * per_group:(g + 1) * per_group], params,
                            args.concurrency, {})
            marks.append((domain, g, first, len(probe.POSITIONS)))
            print(f"{domain} group {g}: {len(probe.POSITIONS) - first} drafted positions", flush=True)
    Path(args.out).write_text(json.dumps({"args": vars(args), "marks": marks, "positions": probe.POSITIONS}))


if __name__ == "__main__":
    main()
