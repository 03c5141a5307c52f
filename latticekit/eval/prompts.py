"""Held-out prompts for ``latticekit eval``: seeded windows of text files or of a split
manifest's held-out files, user requests through the model's chat template, and their split
into tuning and reporting sets by whole files."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from latticekit.loading import Tokenizer
from latticekit.errors import DecoderConfigError

__all__ = ["Prompt", "prompts_from_files", "prompts_from_manifest", "prompts_from_requests", "split_by_file"]


@dataclass
class Prompt:
    """A held-out prompt: its domain, where it came from and its ids."""

    domain: str
    source: str
    ids: list[int]



def _window(ids: list[int], length: int, tail: int, rng: np.random.Generator) -> Optional[list[int]]:
    """A seeded window of ``length`` ids with ``tail`` more ids after it in the file, or None."""
    room = len(ids) - length - tail
    if room < 0:
        return None
    start = int(rng.integers(room + 1))
    return ids[start: start + length]


def _windows(ids: list[int], length: int, span: int, count: int, rng: np.random.Generator) -> list[list[int]]:
    """Up to ``count`` non-overlapping windows of ``length`` ids, each starting a seeded random
    slot of ``span`` >= length ids (so ``span - length`` ids of the file follow every window)."""
    slots = len(ids) // span
    chosen = sorted(rng.choice(slots, size=min(count, slots), replace=False).tolist()) if slots else []
    return [ids[s * span: s * span + length] for s in chosen]


def prompts_from_files(files: Mapping[str, Sequence[Any]], tokenizer: Tokenizer, prompt_tokens: int,
                       num_prompts: int, tail_tokens: int = 0, seed: int = 0,
                       windows_per_file: int = 1) -> list[Prompt]:
    """Prompts from held-out files, in file order, at most ``num_prompts`` per domain.

    With ``windows_per_file == 1`` each file gives one window of ``prompt_tokens`` tokens at a
    seeded random offset such that ``tail_tokens`` more tokens of the file follow it; with more,
    a file gives up to that many non-overlapping windows (each with its own ``tail_tokens``
    after it), at seeded random slots, taken in rounds over the files (every file's first
    window, then every file's second, ...) so that prompts spread over as many files as they
    can. Files too short are skipped.

    Args:
        files: domain -> text file paths.
    """
    if windows_per_file < 1:
        raise DecoderConfigError(f"windows_per_file must be >= 1, got {windows_per_file}")
    rng = np.random.default_rng(seed)
    out = []
    for domain, paths in files.items():
        if windows_per_file == 1:
            taken = 0
            for path in paths:
                if taken >= num_prompts:
                    break
                text = Path(path).read_text(encoding="utf-8", errors="replace")
                one = _window(tokenizer.encode(text), prompt_tokens, tail_tokens, rng)
                if one is not None:
                    out.append(Prompt(domain, str(path), one))
                    taken += 1
            continue
        # Several windows per file: taken in rounds (every file's first window, then every
        # file's second, ...), so that the prompts spread over as many files as they can.
        per_file = []
        for path in paths:
            text = Path(path).read_text(encoding="utf-8", errors="replace")
            ids = tokenizer.encode(text)
            per_file.append((path, _windows(ids, prompt_tokens, prompt_tokens + tail_tokens, windows_per_file, rng)))
        mine = [Prompt(domain, str(path), windows[r]) for r in range(windows_per_file)
                for path, windows in per_file if r < len(windows)]
        out += mine[:num_prompts]
    return out


def split_by_file(prompts: Sequence[Prompt], tune_per_domain: int, seed: int = 0) -> tuple[list[Prompt], list[Prompt]]:
    """Splits prompts into a tuning and a reporting set by WHOLE FILES: per domain, files in a
    seeded random order go to the tuning set until it holds ``tune_per_domain`` prompts (the last
    file may be cut), every other file's prompts to the reporting set."""
    rng = np.random.default_rng(seed + 1)
    tune: list[Prompt] = []
    report: list[Prompt] = []
    for domain in dict.fromkeys(p.domain for p in prompts):
        mine = [p for p in prompts if p.domain == domain]
        sources = list(dict.fromkeys(p.source for p in mine))
        order = [sources[i] for i in rng.permutation(len(sources))]
        taken, tune_files = 0, set()
        for source in order:
            if taken >= tune_per_domain:
                break
            tune_files.add(source)
            taken += sum(p.source == source for p in mine)
        chosen = [p for p in mine if p.source in tune_files][:tune_per_domain]
        tune += chosen
        report += [p for p in mine if p.source not in tune_files]
    return tune, report


def prompts_from_manifest(manifest: Any, tokenizer: Tokenizer, prompt_tokens: int, num_prompts: int,
                          tail_tokens: int = 0, seed: int = 0,
                          domains: Optional[Sequence[str]] = None, windows_per_file: int = 1) -> list[Prompt]:
    """Prompts from a split manifest: ``{"domains": {name: {"root": DIR, "heldout_files": [REL, ...]}}}``
    (``benchmarks/results/heads/split.json`` of the heads training)."""
    data = json.loads(Path(manifest).read_text())
    files = {}
    for name, entry in data["domains"].items():
        if domains is None or name in domains:
            files[name] = [Path(entry["root"]) / rel for rel in entry["heldout_files"]]
    if not files:
        raise DecoderConfigError(f"{manifest} lists no domain of {list(domains or [])}")
    return prompts_from_files(files, tokenizer, prompt_tokens, num_prompts, tail_tokens, seed, windows_per_file)


def _requests(path: Any) -> list[dict[str, Any]]:
    """The requests of a JSON file as ``{"user": text, "source": name}`` dicts (see
    :func:`prompts_from_requests` for the forms read)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DecoderConfigError(f"{path}: cannot read requests: {exc}") from exc
    if isinstance(data, dict) and isinstance(data.get("heldout"), list):
        data = data["heldout"]
    if not isinstance(data, list):
        raise DecoderConfigError(f"{path}: requests must be a JSON list (or an object with a 'heldout' list)")
    out = []
    for i, item in enumerate(data):
        if isinstance(item, str):
            item = {"user": item}
        if not isinstance(item, dict) or not isinstance(item.get("user"), str) or not item["user"].strip():
            raise DecoderConfigError(f"{path}: request {i} is neither a non-empty string nor an object "
                                     "with a non-empty 'user' string")
        # the file a request quotes names it, so that tuning splits keep whole files apart
        source = ":".join(str(item[key]) for key in ("source", "file") if key in item) or f"request {i}"
        out.append({"user": item["user"], "source": source})
    return out


def prompts_from_requests(path: Any, tokenizer: Tokenizer, num_prompts: int, seed: int = 0,
                          domain: str = "instruction") -> list[Prompt]:
    """Up to ``num_prompts`` user requests, chosen seeded at random and kept in file order, each put
    through the model's chat template (:meth:`Tokenizer.chat`): how an instruction model is
    driven. Decode them with the tokenizer's end-of-sequence token (the template's end of turn)
    as the stop token.

    Args:
        path: a JSON file: a list of request strings, or of objects with a ``user`` string (and
            optionally ``source`` and ``file``, which name the prompt, so that tuning splits whole
            files apart); or an object whose ``heldout`` key holds such a list (the held-out
            requests of ``benchmarks/results/heads/instruction_prompts.json``).

    Raises:
        DecoderConfigError: an unreadable or malformed file, or a tokenizer without a chat template.
    """
    requests = _requests(path)
    rng = np.random.default_rng(seed)
    chosen = sorted(rng.choice(len(requests), size=min(num_prompts, len(requests)), replace=False).tolist())
    return [Prompt(domain, requests[i]["source"], tokenizer.chat(requests[i]["user"])) for i in chosen]
