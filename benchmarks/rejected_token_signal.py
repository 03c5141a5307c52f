"""Whether the target's prediction after a rejected draft token chooses the next chain's first
token better than latticekit's chain does (tried at stop 68, docs/vllm.md: it does not).

When a step rejects draft token r at position q (the bonus token goes there), the engine has
already computed the target's hidden state at r's row: its logits predict position q + 1, where
the next chain starts, in a text with r at q. On the greedy streams of
:func:`replay_workloads.streams_of` (as ``benchmarks/chain_tree_gap.py`` reads them), latticekit's
chain drafter with its answer memory walks each stream as
:func:`latticekit.eval.chain_replay.replay_chains` does, every chain at full length; the target's
logits after ``text[:q] + [r]`` for every rejection of a request come from one forward pass of
SmolLM2 (transformers, float32) under a 4-D mask, checked against a plain forward for the first
requests. Per domain, at the steps after a rejection: how often the chain's first token, the
prediction's arg-max (and its top 4) and the tree's first tokens re-ranked by the prediction
are right; the tokens accepted a step by the chain, by the re-ranked tree's first path under its
pick, and by the tree's best path; and the same shares where the prediction is confident. Beside
it, a signal of the text alone: the rejected chain's rest, realigned after the bonus token as if
the target had substituted, inserted or deleted a token (how often right, what it accepts, what
knowing when to take it over the chain would accept, and what it accepts where there is no chain).

Usage::

    PYTHONPATH=. python benchmarks/rejected_token_signal.py [--domains chat code summary heldout] \\
        [--count 40] [--max-tokens 96] [--n 8] [--out benchmarks/results/replay/rejected_token_signal.json]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

#: A prediction is confident where its arg-max's probability is above this.
CONFIDENT = 0.5


def counterfactual_logits(model: Any, text: Sequence[int], queries: Sequence[tuple[int, int]]) -> Any:
    """The target's logits after ``text[:q] + [token]`` for each ``(q, token)``, in one forward
    pass: ``text`` causally, then each query token attending ``text[:q]`` and itself at position q."""
    import torch

    length, count = len(text), len(queries)
    tokens = torch.tensor([list(text) + [t for _, t in queries]])
    positions = torch.tensor([list(range(length)) + [q for q, _ in queries]])
    allowed = torch.zeros(length + count, length + count, dtype=torch.bool)
    allowed[:length, :length] = torch.tril(torch.ones(length, length, dtype=torch.bool))
    for i, (q, _) in enumerate(queries):
        allowed[length + i, :q] = True
        allowed[length + i, length + i] = True
    mask = torch.zeros(1, 1, length + count, length + count).masked_fill_(~allowed, torch.finfo(torch.float32).min)
    with torch.no_grad():
        return model(input_ids=tokens, position_ids=positions, attention_mask=mask).logits[0, length:]


def domain_counts(model: Any, streams: Sequence[tuple[Sequence[int], Sequence[int]]], n: int,
                  check: int = 3) -> dict[str, Any]:
    """One domain's counts (see the module docstring)."""
    import torch
    from chain_tree_gap import walk
    from replay_drafters import MEMORY_TOKENS, VOCAB

    from latticekit.drafting.memory import AnswerMemory
    from latticekit.eval.chain_replay import LatticekitChains, accepted_prefix

    chains = LatticekitChains(VOCAB, memory=AnswerMemory(MEMORY_TOKENS, vocab_size=VOCAB))
    c: Counter[str] = Counter()
    for prompt, continuation in streams:
        prompt, continuation = [int(t) for t in prompt], [int(t) for t in continuation]
        if not continuation:
            continue
        steps = list(walk(prompt, continuation, chains, n))
        c["all_steps"] += len(steps)
        text = prompt + continuation
        queries, after = [], []
        for prev, cur in zip(steps, steps[1:]):
            if prev["got"] < len(prev["chain"]):  # it drafted and a token was rejected
                queries.append((len(prompt) + prev["at"] + prev["got"], prev["chain"][prev["got"]]))
                after.append((prev, cur))
        if not queries:
            continue
        logits = counterfactual_logits(model, text, queries)
        if check > 0:  # the mask against a plain forward of the same text
            check -= 1
            q, token = queries[0]
            with torch.no_grad():
                plain = model(input_ids=torch.tensor([text[:q] + [token]])).logits[0, -1]
            if not torch.allclose(plain, logits[0], atol=1e-3):
                raise AssertionError(f"4-D mask's logits differ from a plain forward by {(plain - logits[0]).abs().max()}")
        for row, (prev, cur) in zip(logits, after):
            at, chain = cur["at"], cur["chain"]
            truth = continuation[at]
            chain_right = bool(chain) and chain[0] == truth
            best = int(row.argmax())
            confident = "confident" if float(torch.softmax(row, -1)[best]) > CONFIDENT else "unsure"
            firsts = sorted({p[0] for p in cur["paths"] if p})
            c["steps"] += 1
            c["chain_right"] += chain_right
            c["prediction_right"] += best == truth
            c["prediction_top4"] += truth in row.topk(4).indices.tolist()
            c["tree_holds_truth"] += truth in firsts
            c["chain_accepted"] += cur["got"]
            c["tree_best_accepted"] += max((accepted_prefix(p, continuation, at) for p in cur["paths"]), default=0)
            c[f"{confident}_steps"] += 1
            c[f"{confident}_prediction_right"] += best == truth
            c[f"{confident}_chain_right"] += chain_right
            if firsts:
                pick = firsts[int(row[torch.tensor(firsts)].argmax())]
                c["reranked_right"] += pick == truth
                first_path = chain if chain and chain[0] == pick else next(p for p in cur["paths"] if p and p[0] == pick)
                c["reranked_accepted"] += accepted_prefix(first_path, continuation, at)
            # the rejected chain's rest, realigned: the bonus token in the rejected one's place
            # (substitution), before it (insertion), or in the place of it and the next (deletion)
            rest = prev["chain"][prev["got"]:]
            for kind, repair in (("substitution", rest[1:]), ("insertion", rest), ("deletion", rest[2:])):
                got = accepted_prefix(repair[:n], continuation, at) if repair else 0
                c[f"{kind}_right"] += got > 0
                c[f"{kind}_accepted"] += got
                c[f"{kind}_or_chain_best_accepted"] += max(got, cur["got"])  # knowing which to take
                c[f"{kind}_where_no_chain_accepted"] += got if not chain else 0
    steps = max(c["steps"], 1)
    repairs = ("substitution", "insertion", "deletion")
    share = {k: c[k] / steps for k in ("chain_right", "prediction_right", "prediction_top4", "tree_holds_truth",
                                       "reranked_right") + tuple(f"{kind}_right" for kind in repairs)}
    accepted = {k: c[f"{k}_accepted"] / steps for k in ("chain", "reranked", "tree_best") + repairs
                + tuple(f"{kind}_{what}" for kind in repairs for what in ("or_chain_best", "where_no_chain"))}
    confident = {f"{kind}_{k}": c[f"{kind}_{k}_right"] / max(c[f"{kind}_steps"], 1)
                 for kind in ("confident", "unsure") for k in ("prediction", "chain")}
    return {"all_steps": c["all_steps"], "steps_after_rejection": c["steps"], "right": share,
            "accepted_per_step": accepted, "right_by_confidence": confident,
            "confident_steps": c["confident_steps"], "counts": dict(c)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--domains", nargs="+", default=["chat", "code", "summary", "heldout"])
    p.add_argument("--count", type=int, default=40)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--out", default=str(ROOT / "results" / "replay" / "rejected_token_signal.json"))
    args = p.parse_args()
    import torch
    from chain_tree_gap import replay_domains
    from transformers import AutoModelForCausalLM

    from latticekit.loading import smollm2_hf_folder

    model = AutoModelForCausalLM.from_pretrained(str(smollm2_hf_folder()), dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    replay_domains("rejected_token_signal.py", args, lambda got: domain_counts(model, got, args.n))


if __name__ == "__main__":
    main()
