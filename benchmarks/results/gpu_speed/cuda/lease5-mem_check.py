"""lk.generate with an answer memory (answers counted after their prompt's end) on the device,
against HF greedy: identical tokens, and the second call drafts from the first answer."""
import sys, time, torch, transformers
import latticekit as lk
from latticekit.drafting.memory import AnswerMemory
dev = "cuda" if torch.cuda.is_available() else "cpu"
small = dev == "cpu"
cfg = transformers.LlamaConfig(hidden_size=64 if small else 576, intermediate_size=128 if small else 1536,
                               num_hidden_layers=2 if small else 30, num_attention_heads=4 if small else 9,
                               num_key_value_heads=2 if small else 3, vocab_size=256 if small else 49152,
                               tie_word_embeddings=True, max_position_embeddings=1024)
ok = True
for dtype in (torch.float32, torch.bfloat16):
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(dev, dtype).eval()
    memory = AnswerMemory(4096)
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        prompt = torch.randint(0, cfg.vocab_size, (24,), generator=g).tolist() * 2
        ref = model.generate(torch.tensor([prompt], device=dev), max_new_tokens=32, do_sample=False,
                             attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=dev),
                             pad_token_id=0)[0, len(prompt):].tolist()
        firsts = []
        for call in range(2):
            t0 = time.perf_counter()
            out = lk.generate(model, prompt, max_new_tokens=32, memory=memory, eos_token_id=[])
            firsts.append((out.tokens == ref, round(out.tokens_per_call, 2), round(time.perf_counter() - t0, 2)))
            ok = ok and out.tokens == ref
        print(str(dtype).split(".")[-1], "prompt", seed, "identical / tokens a call / s:", firsts, flush=True)
    print("memory answers", len(memory.answers), "context", memory.context)
print("ALL IDENTICAL" if ok else "MISMATCH")
sys.exit(0 if ok else 1)
