"""Scatters: ScatterElements (and the deprecated Scatter), ScatterND, every reduction (none,
add, mul, max, min).

Two steps: a parallel copy of ``data`` into the output, then the updates applied on one thread
in index order, which is onnxruntime's order, so duplicate indices end as onnxruntime's do (the
last write wins for "none"; reductions fold in order). Negative indices count from the end; an
index outside [-d, d) makes the inference fail (SMELT_FAIL) and its update is skipped, as
onnxruntime refuses it. max/min are std::max/std::min (onnxruntime's): a NaN already in the
output stays and a NaN update is dropped, as ``a < b ? b : a`` orders them. Integer add and
mul wrap (unsigned arithmetic).
"""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import BlockEmitter
from smelt.codegen.kernels.loops import copy_step, dtype_name, emit_kernel, unsigned_of
from smelt.codegen.registry import register
from smelt.ir.graph import Graph, Node
from smelt.ir.types import FLOAT_TYPES, INT_TYPES, c_type, has_c_type

REDUCTIONS = ("none", "add", "mul", "max", "min")


def _shape(g: Graph, name: str) -> list[int]:
    return [int(d) for d in g.values[name].shape]


def _combine(reduction: str, dst: str, u: str, dt: str) -> str:
    """C statement applying update ``u`` to element ``dst``."""
    if reduction == "none":
        return f"{dst} = {u};"
    if reduction in ("max", "min"):  # std::max(a, b) = a < b ? b : a; std::min(a, b) = b < a ? b : a
        return f"if ({dst} < {u}) {dst} = {u};" if reduction == "max" else f"if ({u} < {dst}) {dst} = {u};"
    op = "+" if reduction == "add" else "*"
    if dt in FLOAT_TYPES:
        return f"{dst} = {dst} {op} {u};"
    un = unsigned_of(dt)
    return f"{dst} = ({c_type(dt)})(({un}){dst} {op} ({un}){u});"


def _check_common(node: Node, g: Graph) -> str | None:
    data, idx, upd = node.inputs[:3]
    y = node.outputs[0]
    for n in (data, upd, y):
        if not has_c_type(g.values[n].dtype):
            return f"dtype {dtype_name(g, n)} has no native {node.op}"
    if dtype_name(g, idx) not in ("int32", "int64"):
        return "indices must be int32 or int64"
    reduction = node.attr("reduction", "none")
    if reduction not in REDUCTIONS:
        return f"reduction {reduction!r}"
    if reduction != "none" and dtype_name(g, data) not in FLOAT_TYPES + INT_TYPES:
        return f"reduction {reduction} of {dtype_name(g, data)}"
    return None


def _check_scatter_elements(node: Node, g: Graph) -> str | None:
    why = _check_common(node, g)
    if why:
        return why
    data, idx, upd = node.inputs[:3]
    ds, js = _shape(g, data), _shape(g, idx)
    axis = node.attr("axis", 0)
    if not ds or len(js) != len(ds) or _shape(g, upd) != js or not -len(ds) <= axis < len(ds):
        return "ScatterElements needs indices and updates of the data's rank and shape, an axis in range"
    axis %= len(ds)
    if any(j > d for k, (j, d) in enumerate(zip(js, ds, strict=True)) if k != axis):
        return "indices larger than the data off the axis"
    return None


@register(("ScatterElements", "Scatter"), versions=(9, 11, 13, 16, 18), check=_check_scatter_elements,
          name="scatter_elements")
def emit_scatter_elements(node: Node, g: Graph, em: BlockEmitter) -> None:
    data, idx, upd = node.inputs[:3]
    y = node.outputs[0]
    ds, js = _shape(g, data), _shape(g, idx)
    axis = node.attr("axis", 0) % len(ds)
    dt = dtype_name(g, data)
    t, it = c_type(dt), c_type(dtype_name(g, idx))
    reduction = node.attr("reduction", "none")
    if g.values[y].nbytes:
        em.step(copy_step(em, em.ptr(data), em.ptr(y), g.values[y].nbytes))
    total = int(np.prod(js, dtype=np.int64))
    if not total:
        return
    strides = [int(np.prod(ds[k + 1:], dtype=np.int64)) for k in range(len(ds))]
    L = [f"const {it} *restrict I = {em.ptr(idx)};", f"const {t} *restrict U = {em.ptr(upd)};",
         f"{t} *restrict Y = (void *){em.ptr(y)};",
         "if (tid == 0) for (long o = 0; o < " + str(total) + "; ++o) {",
         "    long j = (long)I[o], rem = o, dst = 0;",
         f"    if (j < 0) j += {ds[axis]};",
         f"    if ((unsigned long)j >= {ds[axis]}ul) {{ SMELT_FAIL(); continue; }}  /* reported */"]
    for k in reversed(range(len(js))):
        term = "j" if k == axis else f"(rem % {js[k]})"
        L.append(f"    dst += {term} * {strides[k]}L; rem /= {js[k]};")
    L += ["    " + _combine(reduction, "Y[dst]", "U[o]", dt), "}"]
    emit_kernel(em, f"scatter_elements_{dt}", "\n".join(L),
                f"ScatterElements {ds} axis {axis}, indices {js}, reduction {reduction}")


def _check_scatter_nd(node: Node, g: Graph) -> str | None:
    why = _check_common(node, g)
    if why:
        return why
    data, idx, upd = node.inputs[:3]
    ds, js, us = _shape(g, data), _shape(g, idx), _shape(g, upd)
    if not ds or not js or not 1 <= js[-1] <= len(ds):
        return "ScatterND needs indices [..., q] with 1 <= q <= rank(data)"
    if us != js[:-1] + ds[js[-1]:]:
        return "ScatterND updates shape"
    return None


@register("ScatterND", versions=(11, 13, 16, 18), check=_check_scatter_nd, name="scatter_nd")
def emit_scatter_nd(node: Node, g: Graph, em: BlockEmitter) -> None:
    data, idx, upd = node.inputs[:3]
    y = node.outputs[0]
    ds, js = _shape(g, data), _shape(g, idx)
    q = js[-1]
    dt = dtype_name(g, data)
    t, it = c_type(dt), c_type(dtype_name(g, idx))
    reduction = node.attr("reduction", "none")
    if g.values[y].nbytes:
        em.step(copy_step(em, em.ptr(data), em.ptr(y), g.values[y].nbytes))
    n_idx = int(np.prod(js[:-1], dtype=np.int64))
    slab = int(np.prod(ds[q:], dtype=np.int64))
    if not n_idx or not slab:
        return
    strides = [int(np.prod(ds[k + 1:], dtype=np.int64)) for k in range(q)]
    L = [f"const {it} *restrict I = {em.ptr(idx)};", f"const {t} *restrict U = {em.ptr(upd)};",
         f"{t} *restrict Y = (void *){em.ptr(y)};",
         f"if (tid == 0) for (long o = 0; o < {n_idx}L; ++o) {{",
         "    long dst = 0; int bad = 0;"]
    for k in range(q):
        L += [f"    {{ long j = (long)I[o * {q} + {k}]; if (j < 0) j += {ds[k]};",
              f"      if ((unsigned long)j >= {ds[k]}ul) bad = 1; else dst += j * {strides[k]}L; }}"]
    L += ["    if (bad) { SMELT_FAIL(); continue; }  /* reported */",
          f"    for (long e = 0; e < {slab}L; ++e) {{ {_combine(reduction, 'Y[dst + e]', f'U[o * {slab}L + e]', dt)} }}",
          "}"]
    emit_kernel(em, f"scatter_nd_{dt}", "\n".join(L), f"ScatterND {ds}, indices {js}, reduction {reduction}")
