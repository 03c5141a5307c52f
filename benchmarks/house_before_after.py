"""Decode outputs and per-step accepted lengths, before and after the move of bpd/ into drafting/,
decoding/ and eval/ (issue "A house for the next drafter"): SmolLM2-135M-Instruct prepared, the
shipped heads and 4-gram, the first four demo prompts, 48 new tokens, fixed step costs (so
auto's choices do not depend on measured drafting time), 1 thread. Runs against either layout.

Usage::

    PYTHONPATH=<checkout> python benchmarks/house_before_after.py OUT.json
"""
import hashlib, json, sys
import torch
torch.set_num_threads(1)
try:
    from latticekit.decoding import DecoderConfig, decode
    from latticekit.drafting.costs import StepCosts
    from latticekit.loading import load_target
except ImportError:
    from latticekit.bpd import DecoderConfig, decode
    from latticekit.bpd.costs import StepCosts
    from latticekit.bpd.loading import load_target
from latticekit.demo import embedded_token_lm, demo_prompts
from latticekit.heads import default_heads
from latticekit.torch import prepare_target

model, tok, _ = load_target("smollm2")
heads = default_heads(model)
prepare_target(model, heads=heads)
lm = embedded_token_lm()
costs = StepCosts([0, 4, 16, 64], [0.02, 0.024, 0.036, 0.08], 128, 0.0, 0.002)
prompts = demo_prompts()[:4]
out = {}
for spec in ["greedy", "vanilla", "ngram:k=16,p=16,alpha=1", "auto", "headsfree", "heads+ngram"]:
    config = DecoderConfig.parse(spec)
    rows = []
    for p in prompts:
        ids = tok.encode(p["text"])
        d = decode(model, heads if spec != "headsfree" else None, ids, config, max_new_tokens=48, lms=lm, costs=costs)
        rows.append([hashlib.sha1(str(d.tokens).encode()).hexdigest()[:10], [len(s.emitted) for s in d.steps]])
    out[spec] = rows
    print(spec, "tokens/call", round(sum(len(r[1]) and sum(r[1]) for r in rows) / sum(len(r[1]) for r in rows), 3), flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=0)
