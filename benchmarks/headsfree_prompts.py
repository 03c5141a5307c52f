"""Copy-heavy held-out requests for the heads-free benchmark.

Built deterministically from the held-out files of the heads' split
(``benchmarks/results/heads/split.json``: CPython stdlib sources, the Python documentation's
reST sources), which neither the shipped heads nor the shipped n-gram model saw: requests whose
answer reuses the prompt: add type hints to a function, add a docstring to it, rename one of
its variables, fix a typo inserted into a paragraph (two adjacent letters of one word swapped),
each asking for the whole text back. (The instruction requests are the heads' held-out ones,
``benchmarks/results/heads/instruction_prompts.json``, built by ``benchmarks/heads_prompts.py``.)

Items are ordered by a hash of their key (file and position) and taken in that order, at most
one per file, so the same files give the same prompts; they come from every other held-out file
in hash order (the 2nd, 4th, ...).
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from pathlib import Path
from typing import Any, Iterator

__all__ = ["copy_requests"]

MIN_CHARS, MAX_CHARS = 150, 900

COPY_CODE_TASKS = {
    "type-hints": "Add type hints to this Python function. Reply with the whole function.\n\n```python\n{quote}\n```",
    "add-docstring": "Add a docstring to this Python function. Reply with the whole function, docstring "
                     "included.\n\n```python\n{quote}\n```",
    "rename": "Rename the variable `{old}` to `{new}` in this Python function. Reply with the whole "
              "function.\n\n```python\n{quote}\n```",
}
COPY_PROSE_TASK = "Fix the typo in this paragraph. Reply with the corrected paragraph only.\n\n{quote}"


def _hash(text: str) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest()[:12], 16)


def _heldout(manifest: Path, domain: str, half: int) -> list[Path]:
    """Half of a domain's held-out files (0: the 1st, 3rd, ... in hash order; 1: the others)."""
    entry = json.loads(Path(manifest).read_text())["domains"][domain]
    rels = sorted(entry["heldout_files"], key=lambda rel: (_hash(rel), rel))[half::2]
    return [Path(entry["root"]) / rel for rel in rels]


def _functions(path: Path) -> Iterator[tuple[str, ast.AST, str]]:
    """(key, node, source) of the public functions and classes of one module, 150-900 chars."""
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return
    lines = text.splitlines()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) or node.name.startswith("_"):
            continue
        span = lines[node.lineno - 1:node.end_lineno]
        indent = node.col_offset
        quote = "\n".join(line[indent:] if line[:indent].isspace() else line for line in span)
        if MIN_CHARS <= len(quote) <= MAX_CHARS:
            yield f"{path.parent.name}/{path.name}:{node.name}:{node.lineno}", node, quote


def _paragraphs(path: Path) -> Iterator[tuple[str, str]]:
    """(key, paragraph) of the prose paragraphs of one reST page, 150-900 chars."""
    text = path.read_text(encoding="utf-8", errors="replace")
    for n, para in enumerate(re.split(r"\n\s*\n", text)):
        para = " ".join(line.strip() for line in para.strip().splitlines())
        letters = sum(c.isalpha() or c == " " for c in para)
        if (MIN_CHARS <= len(para) <= MAX_CHARS and letters >= 0.85 * len(para)
                and not para.startswith(("..", ":", "|", "+", "*", "=", "-", ">>>"))):
            yield f"{path.parent.name}/{path.name}#p{n}", para


def _one_per_file(items: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The hash-first item of every file, the files in hash order too."""
    best: dict[str, tuple[str, Any]] = {}
    for key, value in sorted(items, key=lambda it: (_hash(it[0]), it[0])):
        best.setdefault(key.split(":")[0].split("#")[0], (key, value))
    return sorted(best.values(), key=lambda it: (_hash(it[0]), it[0]))


def _insert_typo(para: str, key: str) -> str:
    """Swaps two adjacent letters inside one word of 6+ letters (chosen by the key's hash)."""
    words = [m for m in re.finditer(r"[A-Za-z]{6,}", para)]
    if not words:
        return para
    m = words[_hash(key) % len(words)]
    i = m.start() + 1 + _hash(key + "/at") % (len(m.group()) - 3)
    if para[i] == para[i + 1]:
        i += 1
    return para[:i] + para[i + 1] + para[i] + para[i + 2:]


def _local_names(node: ast.FunctionDef) -> list[str]:
    names = {a.arg for a in node.args.args + node.args.kwonlyargs if a.arg not in ("self", "cls")}
    names |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return sorted(n for n in names if len(n) >= 3)


def copy_requests(manifest: Path, count: int) -> list[dict[str, str]]:
    """``count`` copy-heavy requests (three code tasks in turn, and typo fixes, half each)."""
    code = []
    for path in _heldout(manifest, "code", 1):
        if "test" in path.parts[-2:][0] or path.name.startswith("test"):
            continue
        for key, node, quote in _functions(path):
            if isinstance(node, ast.FunctionDef) and node.returns is None \
                    and not any(a.annotation for a in node.args.args):
                code.append((key, (node, quote)))
    prose = []
    for path in _heldout(manifest, "english", 1):
        prose += list(_paragraphs(path))
    out = []
    tasks = sorted(COPY_CODE_TASKS)
    for i, (key, (node, quote)) in enumerate(_one_per_file(code)[: (count + 1) // 2]):
        task = tasks[i % len(tasks)]
        names = _local_names(node)
        if (task == "rename" and not names) or (task == "add-docstring" and ast.get_docstring(node)):
            task = "type-hints"
        fields: dict[str, str] = {"quote": quote}
        if task == "rename":
            old = names[_hash(key) % len(names)]
            fields.update(old=old, new=f"{old}_value" if not old.endswith("value") else f"new_{old}")
        out.append({"id": key, "source": "code", "task": task, "user": COPY_CODE_TASKS[task].format(**fields)})
    for key, para in _one_per_file(prose)[: count // 2]:
        out.append({"id": key, "source": "english", "task": "fix-typo",
                    "user": COPY_PROSE_TASK.format(quote=_insert_typo(para, key))})
    return out


if __name__ == "__main__":
    root = Path(__file__).resolve().parent / "results" / "heads" / "split.json"
    made = copy_requests(root, 24)
    print("copy", len(made), sorted({(p["source"], p["task"]) for p in made}))
    for p in made[:3]:
        print("----", p["id"], p["task"])
        print(p["user"][:300])
