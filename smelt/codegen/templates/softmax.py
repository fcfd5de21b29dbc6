"""Softmax and LogSoftmax along one axis (opset 13+) or over the 2-D coercion (opset 11).

Template ``softmax``: the input is viewed as [outer, L, inner]. With inner == 1 each row is
contiguous: max (lane-parallel, NaN-propagating), then exp(x - max) stored and summed in one
pass, then a scaling by the sum's reciprocal. Float32 Softmax rows take the ISA's vector exp
(``row_expsum_vector_fn``, as attention does: a third of the cycles of the vectorizable scalar
expf, which LogSoftmax and the other types keep; both ~1 ulp). With inner > 1 the
same three passes run along the strided axis, vectorized across the inner dimension with
per-thread scratch rows for the running max and sum. Numerically stable: exp never sees a
positive argument. Kernels ask gcc for 512-bit vectors on AVX-512 targets.
"""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import BlockEmitter
from smelt.codegen.kernels.broadcast import PARALLEL_MIN_ELEMS
from smelt.codegen.kernels.int_gemm import SATURATION_COUNTERS, flush_counters, quantize_run
from smelt.codegen.kernels.isa import vector_isa
from smelt.codegen.kernels.loops import dtype_name, emit_kernel, fn_suffix, inner_chunks, work_range
from smelt.codegen.kernels.rows import exp_fn, row_expsum_fn, row_expsum_vector_fn, row_reduce_fn
from smelt.codegen.registry import register
from smelt.frontend.onnx_import import op_version
from smelt.ir.graph import PLAIN, Graph, Node
from smelt.ir.types import FLOAT_TYPES, c_type

# Hardmax stays a fallback op (tests/test_api.py uses it as the example of one); the
# [outer, L, inner] loops below would serve it with a first-index argmax per row.
OPS = ("Softmax", "LogSoftmax")
# (smelt's QDQSoftmax, the quantized attention's DequantizeLinear -> Softmax -> QuantizeLinear, at
# the end of this module)


def _view(node: Node, g: Graph) -> tuple[int, int, int]:
    """[outer, L, inner] of the normalized view."""
    shape = [int(d) for d in g.values[node.inputs[0]].shape] or [1]
    rank = len(shape)
    coerce = op_version(g, node) < 13
    axis = node.attr("axis", 1 if coerce else -1)
    axis = axis + rank if axis < 0 else axis
    prod = lambda dims: int(np.prod(dims, dtype=np.int64))  # noqa: E731
    if coerce:
        return prod(shape[:axis]), prod(shape[axis:]), 1
    return prod(shape[:axis]), shape[axis], prod(shape[axis + 1:])


def _check(node: Node, g: Graph) -> str | None:
    x = node.inputs[0]
    dt = dtype_name(g, x)
    if dt not in FLOAT_TYPES or dtype_name(g, node.outputs[0]) != dt:
        return f"{node.op} is native for float types only"
    rank = max(1, len(g.values[x].shape))
    axis = node.attr("axis", 1 if op_version(g, node) < 13 else -1)
    if not -rank <= axis < rank:
        return f"axis {axis} out of range for rank {rank}"
    if g.values[x].size == 0:
        return "empty tensor"
    return None


@register(OPS, versions=(11, 13), check=_check, name="softmax")
def emit_softmax(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, y = node.inputs[0], node.outputs[0]
    dt = dtype_name(g, x)
    t = c_type(dt)
    outer, length, inner = _view(node, g)
    parallel = g.values[x].size >= PARALLEL_MIN_ELEMS
    log = fn_suffix("log", dt)
    lines = [f"const {t} *restrict X = {em.ptr(x)};", f"{t} *restrict Y = (void *){em.ptr(y)};"]
    if inner == 1:
        fmax = row_reduce_fn(em, "max", dt)
        lines.append(work_range(outer, parallel))
        lines.append("for (long o = wb; o < we; ++o) {")
        lines.append(f"    const {t} *restrict xr = X + o * {length}; {t} *restrict yr = Y + o * {length};")
        if node.op == "Softmax":
            v_isa = vector_isa(em.target)
            fexp = row_expsum_vector_fn(em, v_isa) if dt == "float32" and v_isa.vector else \
                row_expsum_fn(em, dt, store=True)
            lines += [f"    {t} m = {fmax}(xr, {length});",
                      f"    const {t} r = 1 / {fexp}(yr, xr, {length}, m);",
                      f"    for (long l = 0; l < {length}; ++l) yr[l] *= r;"]
        else:
            fexp = row_expsum_fn(em, dt, store=False)
            lines += [f"    {t} m = {fmax}(xr, {length});",
                      f"    {t} ls = {log}({fexp}(xr, {length}, m));",
                      f"    for (long l = 0; l < {length}; ++l) yr[l] = (xr[l] - m) - ls;"]
        lines.append("}")
    else:
        nch = inner_chunks(outer, inner, em.n_threads) if parallel else 1
        cs = -(-inner // nch)
        scratch = em.scratch(em.n_threads * 2 * inner * np.dtype(dt).itemsize, dt)
        exp = exp_fn(em, dt)
        lines.append(work_range(outer * nch, parallel))
        lines.append(f"{t} *restrict M = {scratch} + (long)tid * {2 * inner}; {t} *restrict S = M + {inner};")
        lines.append("for (long w = wb; w < we; ++w) {")
        lines.append(f"    long o = w / {nch}, i0 = (w % {nch}) * {cs}, i1 = SMELT_MIN({inner}, i0 + {cs});")
        lines.append(f"    const {t} *restrict xo = X + o * {length * inner}; {t} *restrict yo = Y + o * {length * inner};")
        lines.append("    for (long i = i0; i < i1; ++i) { M[i] = xo[i]; S[i] = 0; }")
        lines.append(f"    for (long l = 1; l < {length}; ++l) {{ const {t} *restrict xr = xo + l * {inner};")
        lines.append("        for (long i = i0; i < i1; ++i) "
                     "M[i] = (xr[i] > M[i] || xr[i] != xr[i]) ? xr[i] : M[i]; }")
        lines.append(f"    for (long l = 0; l < {length}; ++l) {{ const {t} *restrict xr = xo + l * {inner}; "
                     f"{t} *restrict yr = yo + l * {inner};")
        if node.op == "Softmax":
            lines.append(f"        for (long i = i0; i < i1; ++i) {{ {t} e = {exp}(xr[i] - M[i]); yr[i] = e; S[i] += e; }} }}")
            lines.append("    for (long i = i0; i < i1; ++i) S[i] = 1 / S[i];")
            lines.append(f"    for (long l = 0; l < {length}; ++l) {{ {t} *restrict yr = yo + l * {inner};")
            lines.append("        for (long i = i0; i < i1; ++i) yr[i] *= S[i]; }")
        else:
            lines.append(f"        for (long i = i0; i < i1; ++i) S[i] += {exp}(xr[i] - M[i]); }}")
            lines.append(f"    for (long i = i0; i < i1; ++i) S[i] = {log}(S[i]);")
            lines.append(f"    for (long l = 0; l < {length}; ++l) {{ const {t} *restrict xr = xo + l * {inner}; "
                         f"{t} *restrict yr = yo + l * {inner};")
            lines.append("        for (long i = i0; i < i1; ++i) yr[i] = (xr[i] - M[i]) - S[i]; }")
        lines.append("}")
    emit_kernel(em, f"{node.op.lower()}_{dt}", "\n".join(lines),
                f"{node.op} over [{outer}, {length}, {inner}]", wide=True)


# -- smelt's QDQSoftmax (passes/lower_qdq.py): DequantizeLinear -> Softmax -> QuantizeLinear ------
QDQ_TYPES = {"uint8": "uint8_t", "int8": "int8_t"}


def _check_qdq_softmax(node: Node, g: Graph) -> str | None:
    x, y = node.inputs[0], node.outputs[0]
    if dtype_name(g, x) not in QDQ_TYPES or dtype_name(g, y) not in QDQ_TYPES:
        return "QDQSoftmax takes and writes 8-bit codes"
    if any(g.values[n].layout != PLAIN for n in (x, y)):
        return "QDQSoftmax reads plain layouts only"
    if any(int(np.prod(g.values[n].shape, dtype=np.int64)) != 1 for n in node.inputs[1:5]):
        return "QDQSoftmax takes per-tensor scales and zero points"
    if g.values[x].size == 0:
        return "empty tensor"
    return None


@register("QDQSoftmax", check=_check_qdq_softmax, name="qdq_softmax", domain="ai.smelt")
def emit_qdq_softmax(node: Node, g: Graph, em: BlockEmitter) -> None:
    """Each row of codes dequantized into a per-thread float row (``(float)(q - zx) * sx``, as
    DequantizeLinear), then Softmax's row steps (max, the vector exp and sum into a second row,
    the scaling by the sum's reciprocal), then QuantizeLinear's rule (``int_gemm.quantize_run``)
    into the output codes: every value is the three kernels', in cache, in one pass."""
    x, xs, xz, ys, yz = node.inputs[:5]
    y = node.outputs[0]
    xt, yt = QDQ_TYPES[dtype_name(g, x)], QDQ_TYPES[dtype_name(g, y)]
    shape = [int(d) for d in g.values[x].shape]
    length = shape[-1]
    outer = int(np.prod(shape[:-1], dtype=np.int64))
    parallel = g.values[x].size >= PARALLEL_MIN_ELEMS
    v = vector_isa(em.target)
    fexp = row_expsum_vector_fn(em, v) if v.vector else row_expsum_fn(em, "float32", store=True)
    fmax = row_reduce_fn(em, "max", "float32")
    rows = em.scratch(em.n_threads * 2 * length * 4, "float32")
    counter = em.saturation_counter(y)
    vq = v if v.vector and all(
        v.has(f) for f in ("f32_round_even", "i32_store_u8" if yt == "uint8_t" else "i32_store_i8")) else None
    # the numeric debug build (``counter``): QuantizeLinear's scalar statement, counting its clamps
    quant = ["{ long i = 0, e = " + str(length) + ";",
             *quantize_run(vq, "E", "yr", dtype_name(g, y), count=bool(counter)), "}"]
    lines = [f"const {xt} *restrict X = {em.ptr(x)};", f"{yt} *restrict Y = (void *){em.ptr(y)};",
             f"const float sx = ({em.ptr(xs)})[0]; const int32_t zx = (int32_t)({em.ptr(xz)})[0];",
             f"const float s = ({em.ptr(ys)})[0], z = (float)({em.ptr(yz)})[0];",
             f"float *restrict D = {rows} + (long)tid * {2 * length}; float *restrict E = D + {length};",
             SATURATION_COUNTERS,
             work_range(outer, parallel),
             "for (long o = wb; o < we; ++o) {",
             f"    const {xt} *restrict xr = X + o * {length}; {yt} *restrict yr = Y + o * {length};",
             f"    for (long l = 0; l < {length}; ++l) D[l] = (float)((int32_t)xr[l] - zx) * sx;",
             f"    const float r = 1 / {fexp}(E, D, {length}, {fmax}(D, {length}));",
             f"    for (long l = 0; l < {length}; ++l) E[l] *= r;",
             *("    " + ln for ln in quant),
             "}",
             flush_counters(counter)]
    emit_kernel(em, f"qdq_softmax_{dtype_name(g, x)}_{dtype_name(g, y)}", "\n".join(lines),
                f"DequantizeLinear -> Softmax -> QuantizeLinear over [{outer}, {length}]", wide=True)
