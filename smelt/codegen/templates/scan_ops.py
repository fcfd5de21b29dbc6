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
from smelt.ir.types import FLOAT_TYPES, INT_TYPES, c_type

SCAN_TYPES = ("float32", "float64", "int32", "int64")  # onnxruntime's kernels (no unsigned)
INNER_CHUNK = 256


def _check_cumulative(node: Node, g: Graph) -> str | None:
    x, y = node.inputs[0], node.outputs[0]
    dt = dtype_name(g, x)
    if dt not in SCAN_TYPES or dtype_name(g, y) != dt:
        return f"no native {node.op} for {dt}"
    if not g.values[x].shape:
        return f"{node.op} of a scalar"
    if dtype_name(g, node.inputs[1]) not in ("int32", "int64") or g.values[node.inputs[1]].size != 1:
        return f"{node.op}'s axis must be one int32/int64"
    return None


def _scan_code(x: str, y: str, shape: list[int], axis: int, dt: str, op: str, exclusive: bool,
               reverse: bool, em: BlockEmitter) -> str:
    """The scan of ``shape`` along ``axis`` (one C block; a thread's share of the lines)."""
    t = c_type(dt)
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    n, inner = shape[axis], int(np.prod(shape[axis + 1:], dtype=np.int64))
    if outer * n * inner == 0:
        return "{ }"
    ident = c_literal(0 if op == "+" else 1, dt)
    if dt in FLOAT_TYPES:
        combine = f"(acc {op} v)"
    else:
        u = unsigned_of(dt)
        combine = f"({t})(({u})acc {op} ({u})v)"  # wraps: signed overflow is undefined in C
    chunks = -(-inner // INNER_CHUNK)
    items = outer * chunks
    step = f"-{inner}L" if reverse else f"{inner}L"
    start = f"{(n - 1) * inner}L" if reverse else "0L"
    return "\n".join([
        "{", work_range(items, outer * n * inner >= PARALLEL_MIN_ELEMS),
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
        "}", "}"])


@register(("CumSum", "CumProd"), versions=(11, 14, 26), check=_check_cumulative, name="cumulative")
def emit_cumulative(node: Node, g: Graph, em: BlockEmitter) -> None:
    """The axis may be a run-time input: one scan per possible axis, chosen by a switch (an
    axis outside [-rank, rank) makes the inference fail, as onnxruntime's)."""
    x, y = node.inputs[0], node.outputs[0]
    shape = [int(d) for d in g.values[x].shape]
    rank = len(shape)
    dt = dtype_name(g, x)
    t = c_type(dt)
    op = "+" if node.op == "CumSum" else "*"
    exclusive, reverse = bool(node.attr("exclusive", 0)), bool(node.attr("reverse", 0))
    if not g.values[y].size:
        return
    const = g.const(node.inputs[1])
    head = f"const {t} *restrict X = {em.ptr(x)};\n{t} *restrict Y = (void *){em.ptr(y)};\n"
    if const is not None:
        axis = int(np.asarray(const).reshape(-1)[0])
        if -rank <= axis < rank:
            body = head + _scan_code(x, y, shape, axis % rank, dt, op, exclusive, reverse, em)
            emit_kernel(em, f"{node.op.lower()}_{dt}", body, f"{node.op} axis {axis % rank} of {shape}")
            return
    cases = [f"case {a}: case {a - rank}: " + _scan_code(x, y, shape, a, dt, op, exclusive, reverse, em)
             + " break;" for a in range(rank)]
    body = head + "\n".join([f"switch ((long){em.ptr(node.inputs[1])}[0]) {{", *cases,
                              "default: SMELT_FAIL(); break;  /* reported */", "}"])
    emit_kernel(em, f"{node.op.lower()}_{dt}", body, f"{node.op} of {shape}, axis at run time")


# -- TopK ------------------------------------------------------------------------------------------

def _topk_k(node: Node, g: Graph) -> int | str:
    c = g.const(node.inputs[1])
    if c is None:
        return "TopK's k is computed at run time"
    return int(np.asarray(c).reshape(-1)[0])


def _check_topk(node: Node, g: Graph) -> str | None:
    x = node.inputs[0]
    dt = dtype_name(g, x)
    if dt not in FLOAT_TYPES + INT_TYPES or dtype_name(g, node.outputs[0]) != dt:
        return f"no native TopK for {dt}"
    if len(node.outputs) > 1 and node.outputs[1] and dtype_name(g, node.outputs[1]) != "int64":
        return "TopK indices must be int64"
    shape = [int(d) for d in g.values[x].shape]
    axis = int(node.attr("axis", -1))
    if not shape or not -len(shape) <= axis < len(shape):
        return "TopK axis out of range"
    k = _topk_k(node, g)
    if isinstance(k, str):
        return k
    if not 0 <= k <= shape[axis % len(shape)]:
        return f"TopK k={k} outside [0, {shape[axis % len(shape)]}]"
    if not node.attr("sorted", 1):
        return "unsorted TopK (onnxruntime's order is its own)"
    return None


@register("TopK", versions=(1, 10, 11, 24), check=_check_topk, name="topk")
def emit_topk(node: Node, g: Graph, em: BlockEmitter) -> None:
    """Per line along the axis, an insertion into the k best so far, kept sorted in the output
    itself: ties keep the lower index first (onnxruntime's order, as its comparators), so the
    result is onnxruntime's for any data without NaN. O(n k) per line, meant for the small k
    exported models ask for."""
    x = node.inputs[0]
    vals = node.outputs[0]
    idxs = node.outputs[1] if len(node.outputs) > 1 and node.outputs[1] else None
    shape = [int(d) for d in g.values[x].shape]
    axis = int(node.attr("axis", -1)) % len(shape)
    k = _topk_k(node, g)
    assert isinstance(k, int)
    dt = dtype_name(g, x)
    t = c_type(dt)
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    n, inner = shape[axis], int(np.prod(shape[axis + 1:], dtype=np.int64))
    lines = outer * inner
    if not lines or not k:
        return
    better = ">" if node.attr("largest", 1) else "<"
    at = lambda p: f"o + ({p}) * {inner}L"  # noqa: E731
    ptrs = [f"const {t} *restrict X = {em.ptr(x)};", f"{t} *restrict Y = (void *){em.ptr(vals)};"]
    move = set_i = ""
    if idxs:
        ptrs.append(f"int64_t *restrict YI = (void *){em.ptr(idxs)};")
        move, set_i = f" YI[{at('p')}] = YI[{at('p - 1')}];", f" YI[{at('p')}] = i;"
    body = "\n".join(ptrs + [
        work_range(lines, lines * n >= PARALLEL_MIN_ELEMS // 4),
        "for (long w = wb; w < we; ++w) {",
        f"    long a = w / {inner}L, b = w % {inner}L;",
        f"    const {t} *xr = X + a * {n * inner}L + b;",
        f"    long o = a * {k * inner}L + b, m = 0;",
        f"    for (long i = 0; i < {n}L; ++i) {{",
        f"        {t} v = xr[i * {inner}L];",
        f"        if (m == {k}L && !(v {better} Y[{at('m - 1')}])) continue;  /* ties: the earlier index stays */",
        f"        long p = m < {k}L ? m++ : m - 1;",
        f"        while (p > 0 && v {better} Y[{at('p - 1')}]) {{ Y[{at('p')}] = Y[{at('p - 1')}];{move} --p; }}",
        f"        Y[{at('p')}] = v;{set_i}",
        "    }",
        "}"])
    emit_kernel(em, f"topk_{dt}", body, f"TopK k={k} axis {axis} of {shape}")
