"""Index-driven copies: OneHot, GatherND, ReverseSequence.

``onehot``: out[a, d, b] = (index[a, b] == d ? on : off), a negative index counting from depth,
one outside [-depth, depth) (or a float index that is NaN or infinite) all ``off``, as
onnxruntime. ``gather_nd``: one slab copy per index tuple (batch_dims supported); an index
outside [-d, d) makes the inference fail (SMELT_FAIL), its slab zeroed. ``reverse_sequence``:
per (batch, time) one slab copy from the mirrored time step within the batch's length; a length
outside [0, T] fails the inference, as onnxruntime's kernel refuses it.
"""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import BlockEmitter
from smelt.codegen.kernels.broadcast import PARALLEL_MIN_ELEMS
from smelt.codegen.kernels.loops import dtype_name, emit_kernel, work_range
from smelt.codegen.registry import register
from smelt.ir.graph import Graph, Node
from smelt.ir.types import FLOAT_TYPES, INT_TYPES, c_type, has_c_type, has_storage_type


def _shape(g: Graph, name: str) -> list[int]:
    return [int(d) for d in g.values[name].shape]


def _prod(dims: list[int]) -> int:
    return int(np.prod(dims, dtype=np.int64))


# -- OneHot ----------------------------------------------------------------------------------------

def _check_onehot(node: Node, g: Graph) -> str | None:
    idx, _, values = node.inputs
    y = node.outputs[0]
    if dtype_name(g, idx) not in FLOAT_TYPES + INT_TYPES:
        return f"OneHot indices of {dtype_name(g, idx)}"
    if not has_c_type(g.values[values].dtype) or g.values[values].size != 2 or not has_c_type(g.values[y].dtype):
        return "OneHot values must be two elements of a native dtype"
    rank = len(_shape(g, y))
    if len(_shape(g, idx)) + 1 != rank or not -rank <= int(node.attr("axis", -1)) < rank:
        return "OneHot output rank / axis"
    return None


@register("OneHot", versions=(9, 11, 28), check=_check_onehot, name="onehot")
def emit_onehot(node: Node, g: Graph, em: BlockEmitter) -> None:
    idx, _, values = node.inputs
    y = node.outputs[0]
    out = _shape(g, y)
    axis = int(node.attr("axis", -1)) % len(out)
    depth = out[axis]  # the output's (static) shape holds depth
    outer, inner = _prod(out[:axis]), _prod(out[axis + 1:])
    total = outer * depth * inner
    if not total:
        return
    it = dtype_name(g, idx)
    if it in FLOAT_TYPES:  # NaN or out of range never reaches the (long) conversion
        norm = (f"double f = (double)I[a * {inner}L + b]; long j = (f > {-depth - 1}.0 && f < {depth}.0) ? "
                f"(long)f : {depth}L;")
    else:
        norm = f"long j = (long)I[a * {inner}L + b]; if (j < -{depth}L || j >= {depth}L) j = {depth}L;"
    body = "\n".join([
        f"const {c_type(it)} *restrict I = {em.ptr(idx)};",
        f"const __typeof__(*{em.ptr(values)}) *restrict V = {em.ptr(values)};",
        f"__typeof__(*{em.ptr(y)}) *restrict Y = (void *){em.ptr(y)};",
        work_range(outer * inner, total >= PARALLEL_MIN_ELEMS),
        "for (long w = wb; w < we; ++w) {",
        f"    long a = w / {inner}L, b = w % {inner}L;",
        f"    {norm}",
        f"    if (j < 0) j += {depth}L;",
        f"    for (long d = 0; d < {depth}L; ++d) Y[(a * {depth}L + d) * {inner}L + b] = d == j ? V[1] : V[0];",
        "}"])
    emit_kernel(em, f"onehot_{it}", body, f"OneHot depth {depth} axis {axis} -> {out}")


# -- GatherND --------------------------------------------------------------------------------------

def _check_gather_nd(node: Node, g: Graph) -> str | None:
    data, idx = node.inputs
    y = node.outputs[0]
    if not has_storage_type(g.values[data].dtype) or dtype_name(g, idx) != "int64":
        return "GatherND needs a native dtype and int64 indices"
    ds, js = _shape(g, data), _shape(g, idx)
    b = int(node.attr("batch_dims", 0))
    if not js or not 1 <= js[-1] <= len(ds) - b or ds[:b] != js[:b]:
        return "GatherND indices shape"
    if _shape(g, y) != ds[:b] + js[b:-1] + ds[b + js[-1]:]:
        return "GatherND output shape"
    return None


@register("GatherND", versions=(11, 12, 13), check=_check_gather_nd, name="gather_nd")
def emit_gather_nd(node: Node, g: Graph, em: BlockEmitter) -> None:
    data, idx = node.inputs
    y = node.outputs[0]
    ds, js = _shape(g, data), _shape(g, idx)
    b = int(node.attr("batch_dims", 0))
    q = js[-1]
    batches, per = _prod(ds[:b]), _prod(js[b:-1])
    slab = _prod(ds[b + q:])
    item = np.dtype(g.values[data].dtype).itemsize
    if not batches * per * slab:
        return
    batch_stride = _prod(ds[b:])
    strides = [_prod(ds[k + 1:]) for k in range(b, b + q)]
    L = [f"const char *restrict X = (const char *){em.ptr(data)};", f"const int64_t *restrict I = {em.ptr(idx)};",
         f"char *restrict Y = (char *){em.ptr(y)};",
         work_range(batches * per, batches * per * slab >= PARALLEL_MIN_ELEMS // 4),
         "for (long w = wb; w < we; ++w) {",
         f"    long src = (w / {per}L) * {batch_stride}L; int bad = 0;"]
    for k in range(q):
        d = ds[b + k]
        L.append(f"    {{ long j = (long)I[w * {q}L + {k}]; if (j < 0) j += {d}L; "
                 f"if ((unsigned long)j >= {d}ul) bad = 1; else src += j * {strides[k]}L; }}")
    L += [f"    if (bad) {{ memset(Y + w * {slab * item}L, 0, {slab * item}); SMELT_FAIL(); continue; }}  /* reported */",
          f"    memcpy(Y + w * {slab * item}L, X + src * {item}L, {slab * item});",
          "}"]
    emit_kernel(em, "gather_nd", "\n".join(L), f"GatherND {ds} by {js}, batch_dims {b}")


# -- ReverseSequence -------------------------------------------------------------------------------

def _check_reverse_sequence(node: Node, g: Graph) -> str | None:
    x, lens = node.inputs
    if not has_storage_type(g.values[x].dtype) or dtype_name(g, lens) != "int64":
        return "ReverseSequence needs a native dtype and int64 lengths"
    shape = _shape(g, x)
    ta, ba = int(node.attr("time_axis", 0)), int(node.attr("batch_axis", 1))
    if len(shape) < 2 or {ta, ba} != {0, 1} or _shape(g, lens) != [shape[ba]]:
        return "ReverseSequence axes / lengths shape"
    return None


@register("ReverseSequence", versions=(10, 28), check=_check_reverse_sequence, name="reverse_sequence")
def emit_reverse_sequence(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, lens = node.inputs
    y = node.outputs[0]
    shape = _shape(g, x)
    ta = int(node.attr("time_axis", 0))
    T, B = (shape[0], shape[1]) if ta == 0 else (shape[1], shape[0])
    inner = _prod(shape[2:])
    item = np.dtype(g.values[x].dtype).itemsize
    if not T * B * inner:
        return
    # element offset of (t, b)
    off = (lambda t, b: f"(({t}) * {B}L + ({b})) * {inner}L") if ta == 0 else \
        (lambda t, b: f"(({b}) * {T}L + ({t})) * {inner}L")
    body = "\n".join([
        f"const char *restrict X = (const char *){em.ptr(x)};", f"const int64_t *restrict L = {em.ptr(lens)};",
        f"char *restrict Y = (char *){em.ptr(y)};",
        work_range(T * B, T * B * inner >= PARALLEL_MIN_ELEMS // 4),
        "for (long w = wb; w < we; ++w) {",
        f"    long b = w / {T}L, t = w % {T}L, n = (long)L[b], s = t;",
        f"    if (n < 0 || n > {T}L) {{ if (t == 0) SMELT_FAIL(); n = 0; }}  /* reported */",
        "    if (t < n) s = n - 1 - t;",
        f"    memcpy(Y + {off('t', 'b')} * {item}L, X + {off('s', 'b')} * {item}L, {inner * item});",
        "}"])
    emit_kernel(em, "reverse_sequence", body, f"ReverseSequence {shape} time_axis {ta}")
