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

from smelt.ir.graph import PLAIN, Graph, Node, layout_block

if TYPE_CHECKING:
    from smelt.codegen.emitter import BlockEmitter

CheckFn = Callable[[Node, Graph], "str | None"]
EmitFn = Callable[[Node, Graph, "BlockEmitter"], None]


@dataclass(frozen=True)
class Template:
    name: str
    ops: tuple[str, ...]
    versions: frozenset[int] | None  # since-versions implemented; None = every version
    check: CheckFn
    emit: EmitFn
    # whether the template reads/writes blocked layouts (Value.layout != "plain"); templates that
    # do not are never offered a node touching one (its ``check`` sees only plain values)
    blocked: bool = False
    # whether the shares of its steps synchronize with each other (a barrier or flags inside a
    # step): such steps run one share per thread, all at once, never stolen (emit.render_block)
    shares_synchronize: bool = False


_REGISTRY: dict[str, list[Template]] = {}


def register(ops: str | Iterable[str], *, versions: Iterable[int] | None = None,
             check: CheckFn | None = None, name: str | None = None, blocked: bool = False,
             domain: str = "", shares_synchronize: bool = False) -> Callable[[EmitFn], EmitFn]:
    """Decorator registering ``emit`` as the template for ``ops`` (of ``domain``: "" is ONNX's,
    "ai.smelt" smelt's own ops such as LayoutTransform). ``blocked``: the template's ``check``
    understands blocked layouts. ``shares_synchronize``: threads meet inside its steps (see
    ``Template.shares_synchronize``)."""
    op_tuple = (ops,) if isinstance(ops, str) else tuple(ops)

    def deco(emit: EmitFn) -> EmitFn:
        tpl = Template(
            name or emit.__name__,
            op_tuple,
            frozenset(versions) if versions is not None else None,
            check or (lambda n, g: None),
            emit,
            blocked,
            shares_synchronize,
        )
        for op in op_tuple:
            _REGISTRY.setdefault(_key(domain, op), []).append(tpl)
        return emit

    return deco


def find_template(node: Node, g: Graph) -> tuple[Template | None, str]:
    """The first template that accepts ``node``, or None and the reason none does."""
    from smelt.frontend.onnx_import import op_version

    _load_all()
    domain = "" if node.domain == "ai.onnx" else node.domain
    candidates = _REGISTRY.get(_key(domain, node.op))
    if not candidates:
        if domain not in ("", SMELT_DOMAIN) and not any(k.startswith(f"{domain}::") for k in _REGISTRY):
            return None, f"domain {node.domain!r} has no native templates"
        if domain not in ("", SMELT_DOMAIN):
            return None, f"no native template for {node.domain}:{node.op}"
        return None, f"no native template for {node.op}"
    version = op_version(g, node) if domain == "" else 1
    blocked = [n for n in node.all_inputs() + [o for o in node.outputs if o]
               if n in g.values and g.values[n].layout != PLAIN]
    reasons = []
    for tpl in candidates:
        if tpl.versions is not None and version not in tpl.versions:
            reasons.append(f"{tpl.name} implements {node.op} versions {sorted(tpl.versions)}, node uses {version}")
            continue
        if blocked and not tpl.blocked:
            reasons.append(f"{tpl.name} reads plain layouts only ({blocked[0]!r} is {g.values[blocked[0]].layout})")
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


SMELT_DOMAIN = "ai.smelt"


def same_layout_flat(node: Node, g: Graph, data: list[str]) -> str | None:
    """For element-wise templates that index their operands flat: None when that is right in
    every layout, i.e. all values are plain, or all ``data`` inputs have the output's shape and
    layout (constant scalars may join in any layout)."""
    out = g.values[node.outputs[0]]
    names = [n for n in data if n] + [o for o in node.outputs if o]
    if all(g.values[n].layout == PLAIN for n in names):
        return None
    for n in data:
        v = g.values[n]
        if v.const is not None and v.size == 1:
            continue
        if v.layout != out.layout or tuple(v.shape) != tuple(out.shape):
            return (f"{node.op} on blocked layouts needs same-shape operands in one layout "
                    f"({n!r} is {v.layout} {list(v.shape)}, output {out.layout} {list(out.shape)})")
    return None


def blocked_concat_reason(node: Node, g: Graph) -> str | None:
    """Concat of NCHW<b>c values along channels is the plain concat's byte runs (each input's
    channels a multiple of b); None when that holds or nothing is blocked."""
    ins = node.present_inputs()
    out = g.values[node.outputs[0]]
    if all(g.values[n].layout == PLAIN for n in ins) and out.layout == PLAIN:
        return None
    axis = int(node.attr("axis", 0))
    rank = len(out.shape)
    if rank != 4 or axis % rank != 1:
        return "blocked Concat joins 4-D values along channels only"
    b = layout_block(out.layout)
    for n in ins:
        v = g.values[n]
        if v.layout != out.layout or v.shape[1] % b:
            return f"blocked Concat needs every input in {out.layout} ({n!r} is {v.layout}, {v.shape[1]} channels)"
    return None


def _key(domain: str, op: str) -> str:
    return op if not domain else f"{domain}::{op}"


def native_ops() -> list[str]:
    _load_all()
    return sorted(k for k in _REGISTRY if "::" not in k)


_loaded = False
TEMPLATES_PACKAGE = "smelt.codegen.templates"


def _load_all() -> None:
    """Import every template module once (each registers itself)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    import importlib
    import pkgutil

    # by name: the templates import this module (to register), never the other way round
    pkg = importlib.import_module(TEMPLATES_PACKAGE)
    for mod in pkgutil.iter_modules(pkg.__path__):
        if not mod.name.startswith("_"):
            importlib.import_module(f"{TEMPLATES_PACKAGE}.{mod.name}")
