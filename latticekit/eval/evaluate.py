"""``latticekit eval``: run decoders over held-out prompts and report the paper's measurements.

For each domain and prompt the greedy baseline runs first (its tokens are the reference every
greedy-mode decoder must reproduce, and the oracle's guide), then every decoder config
(:func:`run_eval`); or one greedy trace per prompt gives every greedy decoder's steps
(:func:`run_replay_eval`, with alpha tuned per domain on prompts of other files). The report
(:mod:`latticekit.eval.report`) gives block efficiency, repetition, head entropy and wins / ties /
losses per domain as markdown, JSON and figures.

The model, heads and n-gram models (:mod:`latticekit.loading`) and the prompts
(:mod:`latticekit.eval.prompts`) are arguments, so a tiny random model serves as a smoke test
(``--model tiny-llama --heads untrained:4``). This module re-exports the names of those modules
that it always has.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, cast

import numpy as np

from latticekit.loading import TINY_MODELS, Tokenizer, load_heads, load_lms, load_target  # noqa: F401
from latticekit.eval.prompts import (Prompt, prompts_from_files, prompts_from_manifest, prompts_from_requests,
                                   split_by_file)
from latticekit.decoding.records import Decoding
from latticekit.drafting.config import DecoderConfig
from latticekit._machine import machine
from latticekit.eval.report import _fmt, agreement, summarize, write_report
from latticekit.errors import DecoderConfigError
from latticekit.ngram import NGramLM

if TYPE_CHECKING:
    from latticekit.heads.protocol import CountedHeads

__all__ = [
    "DEFAULT_DECODERS",
    "Tokenizer",
    "Prompt",
    "load_target",
    "load_heads",
    "load_lms",
    "prompts_from_files",
    "prompts_from_manifest",
    "prompts_from_requests",
    "split_by_file",
    "run_eval",
    "run_replay_eval",
    "agreement",
    "summarize",
    "write_report",
]

#: The paper's Table 4 rows (neural rescoring aside) and the p sweep of its Figure 7; the
#: n-gram models are named ``2gram`` and ``4gram``.
DEFAULT_DECODERS = (
    "vanilla",
    "ngram:k=16,p=1,alpha=1,lm=2gram",
    "ngram:k=16,p=1,alpha=1,lm=4gram",
    "ngram:k=16,p=16,alpha=0",
    "ngram:k=16,p=2,alpha=1,lm=4gram",
    "ngram:k=16,p=4,alpha=1,lm=4gram",
    "ngram:k=16,p=8,alpha=1,lm=4gram",
    "ngram:k=16,p=16,alpha=1,lm=4gram",
    "oracle:k=2",
    "oracle:k=16",
)


def run_eval(model: Any, heads: CountedHeads, lms: Mapping[Optional[str], NGramLM], prompts: Sequence[Prompt],
             configs: Sequence[DecoderConfig], max_new_tokens: int, eos_token_id: Optional[int] = None,
             seed: int = 0, progress: Optional[Callable[[str], None]] = None,
             rescorer: Any = None) -> dict[str, dict[str, list[Decoding]]]:
    """Decodes every prompt with the greedy baseline and every config (``rescorer`` for
    ``neural`` decoders).

    Returns:
        domain -> decoder label -> one :class:`Decoding` per prompt; label ``greedy`` first.
    """
    import torch

    from latticekit.decoding.loop import decode, greedy_decode

    h = int(heads.num_heads)
    results: dict[str, dict[str, list[Decoding]]] = {}
    for i, prompt in enumerate(prompts):
        per = results.setdefault(prompt.domain, {"greedy": []})
        # h more tokens than reported: the oracle's look-ahead at the last step.
        ref = greedy_decode(model, prompt.ids, max_new_tokens + h, eos_token_id)
        reference = prompt.ids + ref.tokens
        cut = min(max_new_tokens, len(ref.tokens))
        # Report the first max_new_tokens greedy steps; its wall time pro rata (one token per step).
        per["greedy"].append(Decoding(ref.config, prompt.ids, ref.tokens[:cut], ref.steps[:cut],
                                      ref.wall_s * cut / max(1, len(ref.steps))))
        for config in configs:
            generator = torch.Generator().manual_seed(seed + i) if config.temperature > 0 else None
            out = decode(model, heads, prompt.ids, config, max_new_tokens=max_new_tokens, lms=lms,
                         reference=reference, eos_token_id=eos_token_id, generator=generator, rescorer=rescorer)
            per.setdefault(config.label, []).append(out)
        if progress:
            progress(f"prompt {i + 1}/{len(prompts)} ({prompt.domain}) done")
    return results


def _tuned_label(config: DecoderConfig, alpha: str) -> str:
    """``ngram k=16 p=16 alpha=<alpha> lm=4gram``: the label with the alpha part spelled out and
    the n-gram model always named (a plain label drops it at alpha 0)."""
    parts = [config.method, f"k={config.k}"]
    if config.method == "ngram":
        parts.append(f"p={config.p}")
    parts.append(f"alpha={alpha}")
    if config.method == "ngram" and config.lm is not None:
        parts.append(f"lm={config.lm}")
    return " ".join(parts)


def _check_tunable(tune: Sequence[DecoderConfig]) -> None:
    for config in tune:
        if config.method not in ("ngram", "neural"):
            raise DecoderConfigError(f"only ngram and neural decoders have an alpha to tune, got {config.method!r}")


def _by_domain(items: Sequence[Any], domains: Sequence[str]) -> dict[str, list[Any]]:
    """Items grouped by their domain, domains in first-seen order."""
    out: dict[str, list[Any]] = {}
    for item, domain in zip(items, domains):
        out.setdefault(domain, []).append(item)
    return out


def run_replay_eval(model: Any, heads: CountedHeads, lms: Mapping[Optional[str], NGramLM], prompts: Sequence[Prompt],
                    configs: Sequence[DecoderConfig], max_new_tokens: int, eos_token_id: Optional[int] = None, *,
                    rescorer: Any = None, tune: Sequence[DecoderConfig] = (), alphas: Sequence[float] = (),
                    tune_prompts: int = 0, seed: int = 0, trace_batch: int = 8, trace_cache: Optional[Any] = None,
                    description: str = "", progress: Optional[Callable[[str], None]] = None,
                    ) -> tuple[dict[str, dict[str, list[Decoding]]], dict[str, Any], list[Prompt]]:
    """The replay engine (:mod:`latticekit.eval.replay`): traces every prompt once, tunes alpha
    of each ``tune`` decoder per domain on ``tune_prompts`` prompts of files apart from the
    reported ones (the value with the best block efficiency; ties to the smaller alpha), and
    replays ``configs`` plus each tuned decoder on the reporting prompts.

    Returns:
        The results (domain -> label -> decodings), the tuning tables (domain -> label ->
        ``{"table": {alpha: block efficiency}, "chosen": alpha, "prompts": n}``) and the
        reporting prompts.
    """
    from dataclasses import replace as dc_replace

    from latticekit.eval import replay as rp
    from latticekit.drafting import drafter_class

    h = int(heads.num_heads)
    k = max([cast(int, c.k) for c in list(configs) + list(tune)] or [1])  # k: set by DecoderConfig
    if tune and not tune_prompts:
        raise DecoderConfigError("tuning alpha needs tuning prompts (--tune-prompts)")
    _check_tunable(tune)
    tune_set, report = split_by_file(prompts, tune_prompts, seed) if tune else ([], list(prompts))
    missing = sorted(set(p.domain for p in tune_set) - set(p.domain for p in report))
    if missing:
        raise DecoderConfigError(f"domain(s) {missing}: every file went to tuning; give more prompts "
                                 "(--num-prompts, --windows-per-file) or fewer --tune-prompts")
    everything = tune_set + report
    costs = None
    if any(drafter_class(c).needs_costs for c in list(configs) + list(tune)):
        from latticekit.decoding.costs import step_costs

        costs = step_costs(model)
    traces = rp.trace_prompts(model, heads, [p.ids for p in everything], max_new_tokens + h - 1, k,
                              batch_size=trace_batch, cache_dir=trace_cache, description=description,
                              progress=progress)
    tune_traces = _by_domain(traces[: len(tune_set)], [p.domain for p in tune_set])
    tables: dict[str, Any] = {}
    extra: dict[str, list[DecoderConfig]] = {}
    for domain, mine in tune_traces.items():
        for config in tune:
            table = rp.tune_alpha(mine, config, alphas, max_new_tokens, lms, rescorer, eos_token_id, costs)
            chosen = max(table, key=lambda a: (table[a], -a))
            tables.setdefault(domain, {})[_tuned_label(config, "tuned")] = {
                "table": {f"{a:g}": be for a, be in table.items()}, "chosen": chosen, "prompts": len(mine)}
            extra.setdefault(domain, []).append(
                dc_replace(config, alpha=chosen, name=_tuned_label(config, f"tuned:{chosen:g}")))
            if progress:
                progress(f"{domain}: {config.label}: alpha {chosen:g} (" +
                         ", ".join(f"{a:g}: {be:.3f}" for a, be in table.items()) + ")")
    report_traces = traces[len(tune_set):]
    results: dict[str, dict[str, list[Decoding]]] = {}
    for domain, mine in _by_domain(report_traces, [p.domain for p in report]).items():
        labels = [c.label for c in list(configs) + extra.get(domain, [])]
        repeated = sorted({label for label in labels if labels.count(label) > 1})
        if repeated:
            raise DecoderConfigError(f"decoders {repeated} are listed twice; give them distinct name= values")
        results[domain] = rp.replay_all(mine, list(configs) + extra.get(domain, []), max_new_tokens,
                                        lms, rescorer, eos_token_id, costs)
    return results, tables, report


def main(args: Any) -> int:
    """The ``latticekit eval`` command (arguments from :func:`add_parser`)."""
    import torch

    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    configs = [DecoderConfig.parse(spec) for spec in (args.decoders or DEFAULT_DECODERS)]
    tune = [DecoderConfig.parse(spec) for spec in args.tune]
    try:
        alphas = [float(a) for a in args.alphas.split(",")]
    except ValueError as exc:
        raise DecoderConfigError(f"--alphas must be comma-separated numbers, got {args.alphas!r}") from exc
    if any(not np.isfinite(a) or a < 0 for a in alphas):
        raise DecoderConfigError(f"--alphas must be finite and >= 0, got {args.alphas!r}")
    if args.engine == "decode" and (tune or args.tune_prompts):
        raise DecoderConfigError("--tune / --tune-prompts need --engine replay or both")
    _check_tunable(tune)
    lms = load_lms(args.lm)
    if args.engine != "decode" and any(c.temperature > 0 for c in configs + tune):
        raise DecoderConfigError("the replay engine covers greedy decoders only; use --engine decode for sampling")
    rescorer = None
    if args.rescorer:
        from latticekit.eval.rescorer import NeuralRescorer

        rescorer = NeuralRescorer.load(args.rescorer, args.device)
    from latticekit.decoding.costs import StepCosts
    from latticekit.drafting import make_drafter

    unmeasured = StepCosts([0, 1], [1.0, 1.0], 1)  # the real costs are measured once the model is loaded
    for config in configs + tune:  # a missing n-gram model or rescorer fails now, not after the model loads
        try:
            make_drafter(config, lms=lms, rescorer=rescorer, reference=(), costs=unmeasured)
        except DecoderConfigError as exc:
            raise DecoderConfigError(f"{exc} (models: --lm NAME=PATH, rescorer: --rescorer)") from exc
    model, tokenizer, description = load_target(args.model, args.device)
    heads = load_heads(args.heads, model)
    if not args.no_prepare:
        from latticekit.torch import prepare_target

        prepare_target(model, heads=heads)
        description += " (prepared)"
    # Windows are followed by the tokens a decode could read past them (the replay engine always
    # asks for it, so that --engine decode --need-continuation picks the same prompts).
    need = args.need_continuation or args.engine != "decode"
    tail = args.max_new_tokens + int(heads.num_heads) - 1 if need else 0
    if not (args.manifest or args.prompts or args.requests):
        raise DecoderConfigError("give --manifest, --prompts or --requests")
    prompts = []
    if args.manifest:
        prompts += prompts_from_manifest(args.manifest, tokenizer, args.prompt_tokens, args.num_prompts, tail,
                                         args.seed, args.domain, args.windows_per_file)
    if args.prompts:
        prompts += prompts_from_files({"prompts": args.prompts}, tokenizer, args.prompt_tokens,
                                      args.num_prompts, tail, args.seed, args.windows_per_file)
    if args.requests:
        prompts += prompts_from_requests(args.requests, tokenizer, args.num_prompts, args.seed)
    if not prompts:
        raise DecoderConfigError("no prompt: every file is shorter than --prompt-tokens")
    start = time.perf_counter()
    log = (lambda msg: print(msg, flush=True)) if args.verbose else None
    eos = None if args.no_eos else tokenizer.eos_token_id
    tables: dict[str, Any] = {}
    agree = None
    reported = list(prompts)
    if args.engine == "decode":
        results = run_eval(model, heads, lms, prompts, configs, args.max_new_tokens, eos, args.seed, log,
                           rescorer=rescorer)
    else:
        results, tables, reported = run_replay_eval(
            model, heads, lms, prompts, configs, args.max_new_tokens, eos, rescorer=rescorer, tune=tune,
            alphas=alphas, tune_prompts=args.tune_prompts, seed=args.seed, trace_batch=args.trace_batch,
            trace_cache=args.trace_cache, description=f"{description}|{args.device}", progress=log)
        if args.engine == "both":
            check = [p for d in dict.fromkeys(p.domain for p in reported)
                     for p in [q for q in reported if q.domain == d][: args.decode_prompts]]
            t0 = time.perf_counter()
            decoded = run_eval(model, heads, lms, check, configs, args.max_new_tokens, eos, args.seed, log,
                               rescorer=rescorer)
            agree = agreement(results, decoded)
            # the real decodes' own report: wall-clock figures, which a replay cannot give
            write_report(decoded, Path(args.out) / "decoded", {
                "engine": "decode (the real decodes of --engine both)",
                "prompts": dict(Counter(p.domain for p in check)),
                "max_new_tokens": args.max_new_tokens, "device": args.device,
                "torch_threads": torch.get_num_threads(), "machine": machine(),
                "seconds": round(time.perf_counter() - t0, 1)}, tokenizer=tokenizer)
    counts = dict(Counter(p.domain for p in reported))
    meta = {
        "model": description, "heads": args.heads, "heads_num": int(heads.num_heads),
        "prepared": model.latticekit_preparation.describe() if not args.no_prepare else "no",
        "lms": {str(k): f"order {v.order}, {v.num_ngrams} n-grams" for k, v in lms.items()},
        "rescorer": args.rescorer or "none",
        "engine": args.engine + (" (block efficiency from one greedy trace per prompt, see latticekit.eval.replay; "
                                 "no target timings)" if args.engine != "decode" else ""),
        "prompts": counts, "tuning_prompts": args.tune_prompts if tune else 0,
        "windows_per_file": args.windows_per_file,
        "prompt_tokens": args.prompt_tokens, "max_new_tokens": args.max_new_tokens,
        "device": args.device, "torch_threads": torch.get_num_threads(), "machine": machine(),
        "seconds": round(time.perf_counter() - start, 1),
    }
    summary = write_report(results, args.out, meta, records=args.records, tokenizer=tokenizer,
                           tuning=tables, replay_vs_decode=agree)
    for domain, block in summary.items():
        print(f"{domain}:")
        for r in block["decoders"]:
            print(f"  {r['decoder']:<40} block efficiency {r['block_efficiency']:.3f}"
                  f"  ({_fmt(r['vs_vanilla_pct'], '+.1f')}% vs vanilla)")
    print(f"wrote {Path(args.out) / 'eval.md'}")
    return 0


def add_parser(sub: Any) -> None:
    """Adds the ``eval`` subcommand to an argparse subparsers object."""
    p = sub.add_parser("eval", help="run BPD decoders over held-out prompts; markdown + JSON + plots",
                       description="Runs the greedy baseline and a list of decoders over held-out prompts "
                                   "and reports block efficiency, repetition, head entropy, wins/ties/losses.")
    p.add_argument("--model", default="smollm2", help="smollm2 | tiny-llama | tiny-gpt2 | HF folder")
    p.add_argument("--heads", default="default", help="default (v2) | v1 | untrained:H | a BlockHeads file")
    p.add_argument("--lm", action="append", default=[], metavar="NAME=PATH",
                   help="n-gram model (ARPA or binary), repeatable; decoders name it with lm=NAME")
    p.add_argument("--decoders", nargs="+", metavar="SPEC",
                   help="method[:key=value,...], e.g. ngram:k=16,p=16,alpha=1,lm=4gram "
                        f"(default: {' '.join(DEFAULT_DECODERS)})")
    p.add_argument("--manifest", help="split manifest JSON listing held-out files per domain")
    p.add_argument("--domain", action="append", help="manifest domains to use (default all)")
    p.add_argument("--prompts", nargs="+", metavar="FILE", help="text files, one prompt each (domain 'prompts')")
    p.add_argument("--requests", metavar="JSON",
                   help="user requests put through the model's chat template (domain 'instruction'): a JSON "
                        "list of strings or of {\"user\": ...} objects, or an object with a 'heldout' list "
                        "(benchmarks/results/heads/instruction_prompts.json); decodes stop at the end of turn")
    p.add_argument("--num-prompts", type=int, default=100, help="per domain (default 100)")
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--need-continuation", action="store_true",
                   help="only take windows with --max-new-tokens + h - 1 more tokens of the file after them "
                        "(always on with the replay engine)")
    p.add_argument("--windows-per-file", type=int, default=1,
                   help="up to this many non-overlapping prompts per held-out file (default 1)")
    p.add_argument("--engine", choices=("decode", "replay", "both"), default="decode",
                   help="decode: run every decoder (wall-clock figures); replay: one greedy trace per prompt "
                        "gives every greedy decoder's steps (block efficiency only, fast); both: replay, plus "
                        "real decodes of --decode-prompts prompts per domain to check they agree (their own "
                        "report, with wall-clock figures, goes to OUT/decoded)")
    p.add_argument("--decode-prompts", type=int, default=4, help="--engine both: prompts per domain decoded for real")
    p.add_argument("--tune", nargs="*", default=[], metavar="SPEC",
                   help="replay engine: decoders whose alpha is tuned per domain on --tune-prompts prompts "
                        "(files apart from the reported ones) over --alphas; each is reported with its chosen alpha")
    p.add_argument("--alphas", default="0.1,0.5,0.75,0.9,1,1.1,1.5,2,5,10",
                   help="comma-separated alpha grid for --tune (default: the reference paper's)")
    p.add_argument("--tune-prompts", type=int, default=0, help="tuning prompts per domain (default 0)")
    p.add_argument("--rescorer", help="neural rescorer file (NeuralRescorer.save) for 'neural' decoders")
    p.add_argument("--trace-cache", help="replay engine: keep greedy traces in this folder and reuse them")
    p.add_argument("--trace-batch", type=int, default=8, help="prompts per batched greedy pass (replay)")
    p.add_argument("--no-eos", action="store_true", help="do not stop at the tokenizer's end-of-sequence token")
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-prepare", action="store_true",
                   help="decode the model as loaded, not prepared (latticekit.torch.prepare_target: packed "
                        "weights on the CPU); every decoder, the greedy baseline included, runs on the same model")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1; 0 = torch's default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--records", action="store_true", help="also write every step record (records.json)")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--out", default="bpd-eval", help="output folder (default ./bpd-eval)")
    p.set_defaults(eval_func=main)
