"""Scans along one axis: CumSum, CumProd (attributes exclusive, reverse).

``cumulative``: the tensor is [outer, n, inner] around the axis; each work item is one outer
index and a chunk of the inner dimension, walked along the axis in order (so the inner loop is
contiguous and vectorizes, and every element is accumulated in onnxruntime's order whatever the
thread split). Floats accumulate in their own type, as onnxruntime's; integers wrap (unsigned
arithmetic, no signed overflow).
"""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import BlockEmitter, c_literal
from smelt.codegen.kernels.broadcast import PARALLEL_MIN_ELEMS
from smelt.codegen.kernels.loops import dtype_name, emit_kernel, unsigned_of, work_range
from smelt.codegen.registry import register
from smelt.ir.graph import Graph, Node
from smelt.ir.types import FLOAT_TYPES, c_type

SCAN_TYPES = ("float32", "float64", "int32", "int64")  # onnxruntime's kernels (no unsigned)
INNER_CHUNK = 256


def _axis(node: Node, g: Graph) -> int | str:
    c = g.const(node.inputs[1])
    if c is None:
        return f"{node.op}'s axis is computed at run time"
    rank = len(g.values[node.inputs[0]].shape)
    axis = int(np.asarray(c).reshape(-1)[0])
    if not -rank <= axis < max(rank, 1):
        return f"{node.op} axis {axis} out of range"
    return axis % max(rank, 1)


def _check_cumulative(node: Node, g: Graph) -> str | None:
    x, y = node.inputs[0], node.outputs[0]
    dt = dtype_name(g, x)
    if dt not in SCAN_TYPES or dtype_name(g, y) != dt:
        return f"no native {node.op} for {dt}"
    if not g.values[x].shape:
        return f"{node.op} of a scalar"
    axis = _axis(node, g)
    return axis if isinstance(axis, str) else None


@register(("CumSum", "CumProd"), versions=(11, 14, 26), check=_check_cumulative, name="cumulative")
def emit_cumulative(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, y = node.inputs[0], node.outputs[0]
    shape = [int(d) for d in g.values[x].shape]
    axis = _axis(node, g)
    assert isinstance(axis, int)
    dt = dtype_name(g, x)
    t = c_type(dt)
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    n, inner = shape[axis], int(np.prod(shape[axis + 1:], dtype=np.int64))
    if outer * n * inner == 0:
        return
    op = "+" if node.op == "CumSum" else "*"
    ident = c_literal(0 if op == "+" else 1, dt)
    if dt in FLOAT_TYPES:
        combine = f"(acc {op} v)"
    else:
        u = unsigned_of(dt)
        combine = f"({t})(({u})acc {op} ({u})v)"  # wraps: signed overflow is undefined in C
    exclusive, reverse = bool(node.attr("exclusive", 0)), bool(node.attr("reverse", 0))
    chunks = -(-inner // INNER_CHUNK)
    items = outer * chunks
    step = f"-{inner}L" if reverse else f"{inner}L"
    start = f"{(n - 1) * inner}L" if reverse else "0L"
    body = "\n".join([
        f"const {t} *restrict X = {em.ptr(x)};", f"{t} *restrict Y = (void *){em.ptr(y)};",
        work_range(items, outer * n * inner >= PARALLEL_MIN_ELEMS),
        "for (long w = wb; w < we; ++w) {",
        f"    long o = w / {chunks}, j0 = (w % {chunks}) * {INNER_CHUNK}L, j1 = SMELT_MIN(j0 + {INNER_CHUNK}L, {inner}L);",
        f"    long base = o * {n * inner}L + {start};",
        f"    for (long j = j0; j < j1; ++j) Y[base + j] = {ident if exclusive else 'X[base + j]'};",
        f"    for (long k = 1; k < {n}L; ++k) {{",
        f"        long cur = base + k * ({step}), prev = cur - ({step});",
        "        for (long j = j0; j < j1; ++j) {",
        f"            {t} acc = Y[prev + j], v = X[{'prev' if exclusive else 'cur'} + j];",
        f"            Y[cur + j] = {combine};",
        "        }",
        "    }",
        "}"])
    emit_kernel(em, f"{node.op.lower()}_{dt}", body,
                f"{node.op} axis {axis} of {shape}{' exclusive' if exclusive else ''}{' reverse' if reverse else ''}")
