"""The module map of docs/design.md holds: imports point one way (lazy imports included)."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "latticekit"

CORE = {"ngram", "lattice", "search", "ngram_trie", "arpa_writer", "fst", "openfst_baseline", "errors",
        "_files", "_arrays", "_version", "_core"}
# what each part may import of the package, besides the core and itself
ALLOWED = {
    "core": set(),
    "lm": set(),
    "torch": set(),
    "medusa": {"heads"},  # type checking only (checked below)
    "heads": {"medusa"},
    "bpd": {"torch", "heads", "medusa", "demo"},  # demo: bpd/demo.py re-exports the demo's names
    "generation": {"bpd", "torch", "heads", "medusa", "demo"},
    "demo": {"bpd", "torch", "heads", "medusa"},
    "cli": {"demo", "bpd", "lm"},
}


def part(module: str) -> str:
    head = module.split(".")[1] if "." in module else ""
    return "core" if head in CORE or head in ("", "__init__") else head


def imports(path: Path):
    """(imported latticekit module, under `if TYPE_CHECKING`) for every import in the file."""
    tree = ast.parse(path.read_text())
    typing_only = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only |= {id(n) for n in ast.walk(node)}
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            if name.startswith("latticekit."):
                yield name, id(node) in typing_only


def modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        yield ".".join(rel.parts).removesuffix(".__init__"), path


def test_imports_point_one_way():
    wrong = []
    for module, path in modules():
        source = part(module)
        for name, typing_only in imports(path):
            target = part(name)
            if target in (source, "core") or target in ALLOWED[source]:
                if source == "medusa" and target == "heads" and not typing_only:
                    wrong.append(f"{module} imports {name} at run time")
                continue
            if module == "latticekit" and target == "generation":
                continue  # latticekit.generate, loaded on first use
            wrong.append(f"{module} ({source}) imports {name} ({target})")
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_lazy_imports(tmp_path):
    bad = tmp_path / "m.py"
    bad.write_text("def f():\n    from latticekit.lm.fst import model_to_fst\n")
    assert [n for n, _ in imports(bad)][0] == "latticekit.lm.fst"
