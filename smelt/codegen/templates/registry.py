"""The template registry: which ops render to native C, and under which conditions.

A template declares the ONNX ops and operator versions (schema since-versions) whose semantics
it implements, a ``check`` that returns None when it can handle a given node (or a reason why
not), and an ``emit`` that renders the node into a block being generated. A node whose template
check fails runs through the reported fallback instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from smelt.ir.graph import Graph, Node

if TYPE_CHECKING:
    from smelt.codegen.emit import BlockEmitter

CheckFn = Callable[[Node, Graph], "str | None"]
EmitFn = Callable[[Node, Graph, "BlockEmitter"], None]


@dataclass(frozen=True)
class Template:
    name: str
    ops: tuple[str, ...]
    versions: frozenset[int] | None  # since-versions implemented; None = every version
    check: CheckFn
    emit: EmitFn


_REGISTRY: dict[str, list[Template]] = {}


def register(ops: str | Iterable[str], *, versions: Iterable[int] | None = None,
             check: CheckFn | None = None, name: str | None = None) -> Callable[[EmitFn], EmitFn]:
    """Decorator registering ``emit`` as the template for ``ops``."""
    op_tuple = (ops,) if isinstance(ops, str) else tuple(ops)

    def deco(emit: EmitFn) -> EmitFn:
        tpl = Template(
            name or emit.__name__,
            op_tuple,
            frozenset(versions) if versions is not None else None,
            check or (lambda n, g: None),
            emit,
        )
        for op in op_tuple:
            _REGISTRY.setdefault(op, []).append(tpl)
        return emit

    return deco


def find_template(node: Node, g: Graph) -> tuple[Template | None, str]:
    """The first template that accepts ``node``, or None and the reason none does."""
    from smelt.frontend.onnx_import import op_version

    _load_all()
    if node.domain not in ("", "ai.onnx"):
        return None, f"domain {node.domain!r} has no native templates"
    candidates = _REGISTRY.get(node.op)
    if not candidates:
        return None, f"no native template for {node.op}"
    version = op_version(g, node)
    reasons = []
    for tpl in candidates:
        if tpl.versions is not None and version not in tpl.versions:
            reasons.append(f"{tpl.name} implements {node.op} versions {sorted(tpl.versions)}, node uses {version}")
            continue
        for name in node.present_inputs() + [o for o in node.outputs if o]:
            v = g.values[name]
            if not v.is_static or v.dtype is None:
                reasons.append(f"value {name!r} has no static shape")
                break
        else:
            why = tpl.check(node, g)
            if why is None:
                return tpl, ""
            reasons.append(why)
    return None, "; ".join(reasons)


def native_ops() -> list[str]:
    _load_all()
    return sorted(_REGISTRY)


_loaded = False


def _load_all() -> None:
    """Import every template module once (each registers itself)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    import importlib
    import pkgutil

    import smelt.codegen.templates as pkg

    for mod in pkgutil.iter_modules(pkg.__path__):
        if mod.name != "registry" and not mod.name.startswith("_"):
            importlib.import_module(f"{pkg.__name__}.{mod.name}")
