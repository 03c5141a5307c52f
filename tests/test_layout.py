"""The module map of docs/design.md holds: imports point one way and never in a circle (imports
inside functions included), the drafting core imports neither torch nor a decoding loop, and
no source file is over 600 lines."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "latticekit"
MAX_LINES = 600

CORE = {"ngram", "lattice", "search", "ngram_trie", "arpa_writer", "fst", "openfst_baseline", "errors",
        "_files", "_arrays", "_machine", "_version", "_core"}
# what each part may import of the package, besides the core and itself
ALLOWED = {
    "core": set(),
    "lm": set(),
    "torch": set(),
    "drafting": set(),
    "heads": set(),
    "decoding": {"drafting", "torch", "heads"},
    "loading": {"heads", "decoding"},  # the target, heads and n-gram models a run decodes with
    "eval": {"decoding", "drafting", "torch", "heads", "loading"},
    "demo": {"decoding", "drafting", "torch", "heads", "loading"},
    "cli": {"demo", "eval", "lm"},  # the entry point: the only importer of the harness besides eval/
    "recipe": {"heads", "loading", "torch"},
    # demo: the shipped 4-gram; heads, decoding: the lattice proposer; torch: its heads packed as prepare_target packs
    "vllm": {"drafting", "demo", "heads", "decoding", "loading", "torch"},
}
# the modules of the heads' training recipe: above the heads and the harness
RECIPE = {"latticekit.heads.data", "latticekit.heads.recipe", "latticekit.heads.prompts", "latticekit.heads.corpora"}
# latticekit/__init__.py exports DecoderConfig and, loaded on first use, generate / decode
TOP_LEVEL = {"drafting", "decoding"}


def part(module: str) -> str:
    if module in RECIPE:
        return "recipe"
    head = module.split(".")[1] if "." in module else ""
    return "core" if head in CORE or head in ("", "__init__") else head


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    found = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    found.update({module_name(p): p for p in PACKAGE.rglob("*.pyx")})  # the binding: a leaf (cimports only)
    return found


def _type_checking_only(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def imported(tree: ast.AST, known: set[str], here: str, is_package: bool, type_checking: bool = False) -> set[str]:
    """Every module ``tree`` imports, at any depth (functions included), except under
    ``if TYPE_CHECKING:`` (never run) unless ``type_checking``; names resolved to the module that
    defines them."""
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if _type_checking_only(node) and not type_checking:
            for child in getattr(node, "orelse", []):
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = here if is_package else here.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}".rstrip(".")
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.add(full if full in known else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


def import_graph(type_checking: bool = False) -> dict[str, set[str]]:
    """Module -> the package's modules it imports; with ``type_checking``, the imports for type
    checkers only as well (a circle there still ties the modules together for a reader)."""
    mods = modules()
    known = set(mods)
    graph = {}
    for name, path in mods.items():
        if path.suffix == ".pyx":
            graph[name] = set()
            continue
        tree = ast.parse(path.read_text(), str(path))
        targets = imported(tree, known, name, path.stem == "__init__", type_checking)
        graph[name] = {t for t in targets if t in known and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        v = todo.pop()
        for w in graph.get(v, ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def test_the_graph_reader_sees_imports_inside_functions_and_skips_type_checking_blocks() -> None:
    source = ("from typing import TYPE_CHECKING\nimport latticekit.a\nif TYPE_CHECKING:\n    import latticekit.b\n"
              "def f():\n    from latticekit.c import thing\n    from . import d\n")
    known = {"latticekit.a", "latticekit.b", "latticekit.c", "latticekit.pkg.d", "latticekit.pkg"}
    got = imported(ast.parse(source), known, "latticekit.pkg.mod", False)
    assert {"latticekit.a", "latticekit.c", "latticekit.pkg.d"} <= got and "latticekit.b" not in got
    assert "latticekit.b" in imported(ast.parse(source), known, "latticekit.pkg.mod", False, type_checking=True)
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle() -> None:
    """Not even through imports for type checkers only."""
    assert cycles(import_graph(type_checking=True)) == []


def test_imports_point_one_way() -> None:
    wrong = []
    for module, targets in sorted(import_graph().items()):
        source = part(module)
        for name in sorted(targets):
            target = part(name)
            if target in (source, "core") or target in ALLOWED[source]:
                continue
            if module == "latticekit" and target in TOP_LEVEL:
                continue
            wrong.append(f"{module} ({source}) imports {name} ({target})")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("core", ["latticekit.drafting", "latticekit.decoding.steps", "latticekit.decoding.records"])
def test_the_drafting_core_imports_neither_torch_nor_a_loop(core: str) -> None:
    """No module of the core imports torch, even lazily, nor reaches the torch side of the
    package (the shared core it uses, ``lattice`` and ``_files``, accepts torch tensors where
    a caller hands them in); and importing it loads no torch."""
    graph = import_graph()
    mods = modules()
    members = [m for m in graph if m == core or m.startswith(core + ".")]
    for m in members:
        tree = ast.parse(mods[m].read_text())
        third_party = {name.partition(".")[0] for name in imported(tree, set(mods), m, mods[m].stem == "__init__")}
        assert not third_party & {"torch", "transformers"}, m
    reached = set(members).union(*(reachable(graph, m) for m in members))
    assert not {m for m in reached if m.startswith(("latticekit.decoding.loop", "latticekit.eval", "latticekit.heads",
                                                    "latticekit.torch", "latticekit.decoding.lattices"))}
    code = f"import sys, {core}; print('torch' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "False", run.stdout + run.stderr


def test_no_source_file_over_600_lines() -> None:
    sources = [p for p in PACKAGE.rglob("*") if p.suffix in (".py", ".pyx", ".pxd")]
    sources += [p for p in (ROOT / "csrc").rglob("*") if p.suffix in (".cc", ".h")]
    long = {str(p.relative_to(ROOT)): n for p in sources if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}
