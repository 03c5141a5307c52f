"""Instruction prompts built from offline material, for SmolLM2-135M-Instruct's own answers.

The draft heads need the model's answers to the kind of request a user types into a chat
model. No public benchmark's prompt set is used: every prompt is a fixed request template
("explain", "summarise", "rewrite", "what does X do", ...) around a piece of the offline
corpora of :mod:`latticekit.heads.corpora`: a function or class of the standard library, a paragraph or
a section title of the Python or PostgreSQL documentation.

A prompt is held out iff the file it was made from is held out (``latticekit.heads.corpora.is_heldout``),
so no held-out prompt quotes a training file of any domain. The builder is deterministic: the
same installed files give the same prompts in the same order (ordered by a hash of their ids).

Use from another script::

    from latticekit.heads.prompts import instruction_prompts

    prompts = instruction_prompts("heldout")   # list of dicts; prompt["user"] is the request
    messages = [{"role": "user", "content": prompts[0]["user"]}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

``benchmarks/results/heads/instruction_prompts.json`` holds the held-out set as text.
"""

from __future__ import annotations

import ast
import hashlib
import re
from functools import lru_cache
from typing import Any, Iterator, Optional

from latticekit.heads.corpora import SOURCES, Source, is_heldout, list_files, read_text, split_hash

__all__ = ["instruction_prompts", "PROMPTS_PER_FILE", "MAX_QUOTE_CHARS"]

PROMPTS_PER_FILE = 3  # at most this many prompts from one file
MAX_QUOTE_CHARS = 900  # a quoted function or paragraph is at most this long (about 220 tokens)
MIN_QUOTE_CHARS = 150

CODE_TASKS = {
    "explain": "Explain what the following Python {kind} does.\n\n```python\n{quote}\n```",
    "summarise": "Summarise this Python code in two or three sentences.\n\n```python\n{quote}\n```",
    "rewrite": "Rewrite this Python {kind} so that it is easier to read, keeping its behaviour.\n\n"
               "```python\n{quote}\n```",
    "docstring": "Write a docstring for this Python {kind}.\n\n```python\n{quote}\n```",
    "test": "Write a short unit test for this Python {kind}.\n\n```python\n{quote}\n```",
    "what-does": "What does `{name}` in Python's `{module}` module do?",
}
PROSE_TASKS = {
    "summarise": "Summarise the following passage from the {product} documentation.\n\n{quote}",
    "explain": "Explain this to a beginner in simple terms:\n\n{quote}",
    "rewrite": "Rewrite the following paragraph in plain English.\n\n{quote}",
    "questions": "Write three questions that this passage from the {product} documentation answers.\n\n{quote}",
    "key-points": "List the key points of this text.\n\n{quote}",
}
TOPIC_TASKS = {
    "explain-topic": "Explain {topic} in {product}, with a short example.",
    "what-is": "What is {topic} in {product}, and when would I use it?",
}
PRODUCTS = {"python-docs": "Python", "postgresql-docs": "PostgreSQL"}


def _hash(text: str) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest()[:12], 16)


def _pick(tasks: dict[str, str], item_key: str) -> tuple[str, str]:
    name = sorted(tasks)[_hash(item_key) % len(tasks)]
    return name, tasks[name]


def _code_items(source: Source, rel: str) -> Iterator[tuple[str, str, str]]:
    """(item key, task, prompt text) for functions and classes of one module."""
    text = read_text(source, rel)
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return
    module = rel[:-3].replace("/", ".").removesuffix(".__init__")
    lines = text.splitlines()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or node.name.startswith("_"):
            continue
        span = lines[node.lineno - 1:node.end_lineno]  # ast.get_source_segment re-splits the file per call
        if not span or sum(map(len, span)) > MAX_QUOTE_CHARS:
            continue
        indent = node.col_offset
        quote = "\n".join(line[indent:] if line[:indent].isspace() else line for line in span)
        if not MIN_QUOTE_CHARS <= len(quote) <= MAX_QUOTE_CHARS:
            continue
        item = f"{source.key(rel)}:{node.name}:{node.lineno}"
        task, template = _pick(CODE_TASKS, item)
        kind = "class" if isinstance(node, ast.ClassDef) else "function"
        yield item, task, template.format(kind=kind, quote=quote, name=node.name, module=module)


_RST_HEADING = re.compile(r"^([^\n]{4,80})\n([=\-~^*#\"])\2{3,}\s*$", re.M)


def _prose_items(source: Source, rel: str) -> Iterator[tuple[str, str, str]]:
    """(item key, task, prompt text) for paragraphs and the section titles of one page."""
    text = read_text(source, rel)
    product = PRODUCTS[source.name]
    if source.name == "postgresql-docs":
        first = text.split("\n\n", 1)[0]
        titles = [re.sub(r"^[\dA-Z]+(\.\d+)*\.\s+", "", first).strip()]
    else:
        titles = [m.group(1).strip() for m in _RST_HEADING.finditer(text)]
    for title in titles:
        if 4 <= len(title) <= 80 and not re.search(r"[`:<>|]|^\W", title) and not title.lower().startswith(
                ("chapter", "appendix", "index", "table of contents")):
            item = f"{source.key(rel)}#title:{title}"
            task, template = _pick(TOPIC_TASKS, item)
            yield item, task, template.format(topic=title, product=product)
    for n, para in enumerate(re.split(r"\n\s*\n", text)):
        para = para.strip()
        letters = sum(c.isalpha() or c == " " for c in para)
        if (not MIN_QUOTE_CHARS <= len(para) <= MAX_QUOTE_CHARS or letters < 0.8 * len(para)
                or para.startswith(("..", ":", "|", "+", "*", "=", "-"))):
            continue
        item = f"{source.key(rel)}#p{n}"
        task, template = _pick(PROSE_TASKS, item)
        yield item, task, template.format(quote=para, product=product)


@lru_cache(maxsize=2)
def _all_prompts() -> tuple[dict[str, Any], ...]:
    prompts = []
    for name, source in SOURCES.items():
        items_of = _code_items if name == "code" else _prose_items
        for rel in list_files(source):
            if name == "code" and ("test" in rel.split("/")[0] or "/test" in rel or "idle_test" in rel):
                continue  # test suites: thousands of near-identical test methods nobody asks about
            items = sorted(items_of(source, rel), key=lambda it: (_hash(it[0]), it[0]))[:PROMPTS_PER_FILE]
            for item, task, user in items:
                prompts.append({"id": hashlib.sha256(item.encode()).hexdigest()[:16], "source": name, "file": rel,
                                "item": item, "task": task, "split": "heldout" if is_heldout(source.key(rel)) else "train",
                                "user": user})
    prompts.sort(key=lambda p: (split_hash(p["id"]), p["id"]))
    return tuple(prompts)


def instruction_prompts(split: Optional[str] = None) -> list[dict[str, Any]]:
    """Every instruction prompt the offline corpora give, in a fixed hash order.

    Args:
        split: ``"train"``, ``"heldout"`` or None for both.

    Returns:
        A list of dicts with ``id`` (16 hex digits), ``source`` (``code``, ``python-docs``,
        ``postgresql-docs``), ``file`` (relative path in the source), ``item`` (what was
        quoted), ``task`` (the template's name), ``split`` and ``user`` (the request, to be put
        through the model's chat template as the user's message).

    Raises:
        SystemExit: a corpus folder is missing.
    """
    if split not in (None, "train", "heldout"):
        raise ValueError(f"split must be 'train', 'heldout' or None, got {split!r}")
    return [dict(p) for p in _all_prompts() if split is None or p["split"] == split]


if __name__ == "__main__":
    import collections

    everything = instruction_prompts()
    print(len(everything), collections.Counter((p["split"], p["source"]) for p in everything))
    print(collections.Counter(p["task"] for p in everything))
    for p in everything[:6]:
        print("----", p["source"], p["task"], p["split"], p["item"])
        print(p["user"][:400])
