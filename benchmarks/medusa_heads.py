"""Medusa heads for SmolLM2-135M-Instruct, distilled from latticekit's shipped heads.

vLLM's ``medusa`` method reads Medusa checkpoints: per head, residual layers ``x + silu(W x +
b)`` and a vocabulary projection. latticekit's shipped heads use wider ``mlp`` layers
(``h + W2 silu(W1 h + b1) + b2``), which that format cannot hold. To compare vLLM's Medusa
drafting (each head's arg-max) with latticekit's lattice drafting on the *same* heads, this
script fits ``medusa``-layer heads (one layer each, the model's tied output projection) to the
shipped heads' distributions (the KL divergence from the shipped head's softmax over the
``--vocabulary`` most probable tokens of latticekit's SmolLM2 4-gram, where most of both heads'
mass lies; Adam), on the final hidden states of SmolLM2
over offline text: windows of the standard library's training-split files and the training
split's instruction prompts through the chat template (latticekit.heads.corpora / prompts).
It reports, on held-out files and prompts, each head's top-1 agreement with the shipped head
and both heads' top-1 accuracy on the text, then writes the heads in vLLM's Medusa layout
(``latticekit.heads.medusa.write_medusa``), loadable by ``speculative_config={"method":
"medusa", "model": OUT, "num_speculative_tokens": HEADS}`` and by latticekit's
``LatticeProposer`` (``heads=OUT``).

    PYTHONPATH=. python benchmarks/medusa_heads.py --out benchmarks/cache/medusa-smollm2-h4
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch

from latticekit.heads.corpora import SOURCES, is_heldout, list_files, read_text
from latticekit.heads.medusa import write_medusa
from latticekit.heads.modules import DEFAULT_HEADS_PATH, BlockHeads
from latticekit.heads.prompts import instruction_prompts


def token_windows(tokenizer, heldout: bool, budget: int, window: int, seed: int) -> list[list[int]]:
    """Windows of stdlib code and chat-templated instruction prompts, about half each."""
    rng = random.Random(seed)
    code = SOURCES["code"]
    files = [f for f in list_files(code) if is_heldout(code.key(f)) == heldout]
    rng.shuffle(files)
    prompts = instruction_prompts("heldout" if heldout else "train")
    rng.shuffle(prompts)
    out: list[list[int]] = []
    spent = {"code": 0, "prompts": 0}
    for rel in files:
        if spent["code"] >= budget // 2:
            break
        ids = tokenizer(read_text(code, rel))["input_ids"][:window]
        if len(ids) >= 64:
            out.append(ids)
            spent["code"] += len(ids)
    for prompt in prompts:
        if spent["prompts"] >= budget - budget // 2:
            break
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt["user"]}], add_generation_prompt=True,
                                            tokenize=True, return_dict=False)[:window]
        out.append(list(ids))
        spent["prompts"] += len(ids)
    return out


@torch.inference_mode()
def hidden_states(model, windows: list[list[int]]) -> torch.Tensor:
    """Final hidden states `(n, d)` of every window's positions, windows one after another."""
    return torch.cat([model.model(input_ids=torch.tensor([ids])).last_hidden_state[0] for ids in windows])


def future_tokens(windows: list[list[int]], depth: int) -> torch.Tensor:
    """`(n, depth)`: the token at t + 1 + j for head j + 2 (-1 past a window's end)."""
    rows = []
    for ids in windows:
        t = torch.tensor(ids + [-1] * (depth + 1))
        rows.append(torch.stack([t[1 + j + 1: 1 + j + 1 + len(ids)] for j in range(depth)], dim=1))
    return torch.cat(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="the Medusa checkpoint folder to write (vLLM's layout)")
    ap.add_argument("--heads", type=int, default=4, help="Medusa heads (latticekit heads 2 .. heads + 1)")
    ap.add_argument("--train-tokens", type=int, default=24000)
    ap.add_argument("--heldout-tokens", type=int, default=4000)
    ap.add_argument("--window", type=int, default=384)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--vocabulary", type=int, default=4096, help="tokens the distillation's KL divergence spans")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from latticekit.loading import smollm2_hf_folder

    folder = smollm2_hf_folder()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    teacher = BlockHeads.load(DEFAULT_HEADS_PATH, model)
    started = time.time()
    train_windows = token_windows(tokenizer, False, args.train_tokens, args.window, args.seed)
    held_windows = token_windows(tokenizer, True, args.heldout_tokens, args.window, args.seed)
    # the states, kept for reruns with the same windows (named by what chose them)
    key = f"{args.train_tokens}-{args.heldout_tokens}-{args.window}-{args.seed}"
    cached = Path(args.out).with_name(f"{Path(args.out).name}-hidden-{key}.pt")
    if cached.exists():
        x_train, x_held = torch.load(cached, weights_only=True)
    else:
        x_train, x_held = hidden_states(model, train_windows), hidden_states(model, held_windows)
        torch.save((x_train, x_held), cached)
    y_held = future_tokens(held_windows, args.heads)
    print(f"hidden states: {len(x_train)} train, {len(x_held)} held out, {time.time() - started:.0f} s", flush=True)
    with torch.inference_mode():
        target_train = teacher.head_states(x_train)[:, 1:args.heads + 1].clone()
        target_held = teacher.head_states(x_held)[:, 1:args.heads + 1].clone()
    from latticekit.demo import embedded_token_lm
    from latticekit.drafting.drafters.auto import lm_candidates

    rows = model.lm_head.weight.detach()[torch.as_tensor(lm_candidates(embedded_token_lm(), args.vocabulary))]
    student = BlockHeads.for_model(model, args.heads + 1, layer="medusa")
    params = [p for p in student.blocks.parameters()]
    optimiser = torch.optim.Adam(params, lr=args.lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, args.steps)
    for step in range(args.steps):
        index = torch.randint(0, len(x_train), (args.batch,))
        states = student.head_states(x_train[index])[:, 1:]
        with torch.no_grad():
            teacher_logprobs = torch.log_softmax(target_train[index] @ rows.T, dim=-1)
        loss = torch.nn.functional.kl_div(torch.log_softmax(states @ rows.T, dim=-1), teacher_logprobs,
                                          log_target=True, reduction="batchmean") / args.heads
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        schedule.step()
        if step % 100 == 0 or step == args.steps - 1:
            print(f"step {step}: train KL {loss.item():.4f}", flush=True)
    report: dict[str, object] = {"command": "benchmarks/medusa_heads.py", "args": vars(args),
                                 "train_positions": len(x_train), "heldout_positions": len(x_held), "heads": []}
    with torch.inference_mode():
        weight = model.lm_head.weight
        mine = student.head_states(x_held)[:, 1:] @ weight.T
        theirs = target_held @ weight.T
        for j in range(args.heads):
            a, b = mine[:, j].argmax(-1), theirs[:, j].argmax(-1)
            valid = y_held[:, j] >= 0
            entry = {"head": j + 2, "agreement_with_shipped": float((a == b).float().mean()),
                     "medusa_top1": float((a[valid] == y_held[valid, j]).float().mean()),
                     "shipped_top1": float((b[valid] == y_held[valid, j]).float().mean())}
            report["heads"].append(entry)  # type: ignore[union-attr]
            print(entry, flush=True)
    student.metadata["recipe"] = "benchmarks/medusa_heads.py: distilled from " + DEFAULT_HEADS_PATH.name
    write_medusa(args.out, student)
    (Path(args.out) / "distillation.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out} in {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
