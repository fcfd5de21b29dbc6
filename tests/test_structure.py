"""The code's shape, checked: data flows one way (no import circle), templates are independent
(a template never imports another; only the registry loads them), and the ISA is data (no ISA
name is compared outside the vector-ISA layer). docs/architecture.md draws the stages."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import smelt

ROOT = Path(smelt.__file__).resolve().parent
TEMPLATES = "smelt.codegen.templates"


def _modules() -> dict[str, Path]:
    mods = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = path
    return mods


def _annotation_only(tree: ast.Module) -> set[int]:
    """ids of import statements under ``if TYPE_CHECKING:`` (erased at run time: a template's
    emit function typed with the emitter it receives is not a dependency on it)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            out.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return out


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """Every smelt module ``name`` imports at run time, at module level or inside a function (a
    function-local import is still a dependency). ``from pkg import x`` counts as pkg.x when that
    is a module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    tree = ast.parse(path.read_text())
    skip = _annotation_only(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in mods else module for a in node.names]
        else:
            continue
        found.update(t for t in targets if t in mods and t != name)
    return found


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imports(name, path, mods) for name, path in mods.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _package_edges_ignored(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Importing smelt.x.y runs smelt/__init__ first; that is Python's package mechanics, not a
    dependency of smelt.x.y on what smelt/__init__ re-exports, so edges *to* ``smelt`` itself
    are left out (``import smelt`` in a submodule would still be caught through its other uses)."""
    return {k: {t for t in v if t != "smelt"} for k, v in graph.items()}


def test_no_import_circle():
    cycles = _cycles(_package_edges_ignored(_graph()))
    assert not cycles, "import circles (each line one circle):\n" + "\n".join(" <-> ".join(c) for c in cycles)


def _template_of(module: str) -> str | None:
    """The template a module belongs to (a package template's submodules belong to it)."""
    if not module.startswith(TEMPLATES + "."):
        return None
    return module[len(TEMPLATES) + 1:].split(".")[0]


def test_templates_are_independent():
    """A template imports the emitter API, the registry, the kernel library, the IR, the schedule
    types; never another template. Only the registry loads templates (by name)."""
    bad = []
    for module, deps in _graph().items():
        mine = _template_of(module)
        for dep in deps:
            theirs = _template_of(dep)
            if theirs is None or theirs == mine:
                continue
            bad.append(f"{module} imports {dep}")
    assert not bad, "\n".join(sorted(bad))


# Where an ISA may be named: the ISA layer (its descriptions and C headers), CPU detection, and
# the peak-FLOPS benchmark (which measures each ISA the host runs).
ISA_LAYER = ("codegen/kernels/isa.py", "target.py", "bench/peak.py")
_ISA_COMPARE = re.compile(r"""isa\s*(==|!=|\bin\b|\bnot in\b)|["'](avx512|avx2|avx|sse|neon)["']""")


def test_isa_is_data():
    """No ISA name is compared (and no intrinsic spelled) outside the ISA layer: a template asks
    the target's vector-ISA description instead."""
    bad = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in ISA_LAYER:
            continue
        for k, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if _ISA_COMPARE.search(code):
                bad.append(f"smelt/{rel}:{k}: {line.strip()[:100]}")
    assert not bad, f"{len(bad)} lines name an ISA outside {ISA_LAYER}:\n" + "\n".join(bad[:60])
