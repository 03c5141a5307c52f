"""bf16 on CUDA: where lk.generate and HF greedy part on mem_check's third prompt, and how near a tie it is."""
import torch, transformers
import latticekit as lk
dev = "cuda" if torch.cuda.is_available() else "cpu"
small = dev == "cpu"
cfg = transformers.LlamaConfig(hidden_size=64 if small else 576, intermediate_size=128 if small else 1536,
                               num_hidden_layers=2 if small else 30, num_attention_heads=4 if small else 9,
                               num_key_value_heads=2 if small else 3, vocab_size=256 if small else 49152,
                               tie_word_embeddings=True, max_position_embeddings=1024)
for dtype in (torch.bfloat16,):
    torch.manual_seed(0)  # as mem_check.py: the same initial weights, cast to bf16
    model = transformers.LlamaForCausalLM(cfg).to(dev, dtype).eval()
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        prompt = torch.randint(0, cfg.vocab_size, (24,), generator=g).tolist() * 2
        def hf():
            return model.generate(torch.tensor([prompt], device=dev), max_new_tokens=32, do_sample=False,
                                  attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=dev),
                                  pad_token_id=0)[0, len(prompt):].tolist()
        fresh = hf()
        gd = lk.greedy_decode(model, prompt, max_new_tokens=32).tokens
        prepared = hf()
        out = lk.generate(model, prompt, max_new_tokens=32, eos_token_id=[]).tokens
        same = dict(gd_vs_hf_fresh=gd == fresh, hf_prepared_vs_fresh=prepared == fresh, gen_vs_gd=out == gd,
                    gen_vs_hf_fresh=out == fresh)
        print("prompt", seed, same, flush=True)
        for name, other in (("hf_fresh", fresh), ("lk_greedy", gd)):
            if out != other:
                i = next(k for k in range(32) if out[k] != other[k])
                with torch.no_grad():
                    logits = model(torch.tensor([prompt + other[:i]], device=dev)).logits[0, -1].float()
                top = torch.topk(logits, 3)
                print(f"  generate vs {name}: first diff at {i}: {out[i]} vs {other[i]}; one-pass logits "
                      f"{logits[out[i]].item():.4f} vs {logits[other[i]].item():.4f}; top-3 {top.values.tolist()}",
                      flush=True)
