"""Pooling templates: MaxPool, AveragePool, LpPool (1-D to 3-D and beyond), GlobalAverage/MaxPool.

Template ``pool``: one output row (all outputs along the innermost spatial dim) per work item.
For the outer spatial dims, compile-time tables give each output index its range of in-bounds
kernel taps; along the innermost dim, every kernel tap gets the range of output columns it
reaches in bounds, so each (tap, row) is one branch-free loop ``y[o] = op(y[o], x[o*s + off])``
over the output row, which gcc vectorizes (contiguous loads at stride 1). Padding never enters a
max; average divisors are per-dim counts (in-bounds taps, or taps inside the explicit padding
with count_include_pad), multiplied exactly in integers. Output sizes follow ONNX (ceil_mode:
the last window must start inside the input or its left padding) and must agree with the
inferred shape, else the node falls back; so do windows that would hold no input element.
MaxPool's optional Indices output (flat input index of the first maximum; storage_order 1, the
column-major plane index, for 2-D only) is tracked in the same loop with a select per element.

NaN in max pooling (MaxPool, GlobalMaxPool, here and in blocked.py): a NaN never wins over a
number and a window of only NaN gives NaN (IEEE maxNum), the rule of onnxruntime's scalar
pooling code; its vector kernels keep or drop a NaN by the SIMD lane it lands in, which is not
followed. -Inf stays -Inf (onnxruntime's kernels that start from -FLT_MAX give -FLT_MAX).
"""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import BlockEmitter, c_literal
from smelt.codegen.kernels.broadcast import PARALLEL_MIN_ELEMS
from smelt.codegen.kernels.loops import dtype_name, emit_kernel, fn_suffix, work_range
from smelt.codegen.kernels.pool_geometry import geometry
from smelt.codegen.kernels.rows import row_reduce_fn
from smelt.codegen.registry import register
from smelt.ir.graph import Graph, Node
from smelt.ir.types import FLOAT_TYPES, c_type

POOL_TYPES = {"max": FLOAT_TYPES + ("int8", "uint8"), "avg": FLOAT_TYPES, "lp": FLOAT_TYPES}


def _check_pool(node: Node, g: Graph) -> str | None:
    if len(node.outputs) > 1 and node.outputs[1]:
        if dtype_name(g, node.outputs[1]) != "int64":
            return "Indices output is not int64"
        order = node.attr("storage_order", 0)
        if order not in (0, 1) or (order == 1 and len(g.values[node.inputs[0]].shape) != 4):
            return "storage_order 1 is native for 2-D pooling only"
    kind = {"MaxPool": "max", "AveragePool": "avg", "LpPool": "lp"}[node.op]
    dt = dtype_name(g, node.inputs[0])
    if dt not in POOL_TYPES[kind] or dtype_name(g, node.outputs[0]) != dt:
        return f"no native {node.op} for {dt}"
    if g.values[node.inputs[0]].size == 0 or g.values[node.outputs[0]].size == 0:
        return "empty tensor"
    geo, why = geometry(node, g)
    return None if geo is not None else why


def _c_array(ctype: str, name: str, values: list[int]) -> str:
    return f"static const {ctype} {name}[{max(1, len(values))}] = {{{', '.join(str(int(v)) for v in values) or '0'}}};"


def _p_exprs(node: Node, dt: str) -> tuple[str, str]:
    """LpPool's per-element term of {v} and final transform of {a}."""
    p = int(node.attr("p", 2))
    fabs, powf, sqrt = fn_suffix("fabs", dt), fn_suffix("pow", dt), fn_suffix("sqrt", dt)
    if p == 1:
        return f"{fabs}({{v}})", "{a}"
    if p == 2:
        return "{v} * {v}", f"{sqrt}({{a}})"
    return f"{powf}({fabs}({{v}}), {c_literal(p, dt)})", f"{powf}({{a}}, {c_literal(1.0 / p, dt)})"


@register(("MaxPool", "AveragePool", "LpPool"), versions=(10, 11, 12, 18, 19, 22), check=_check_pool,
          name="pool")
def emit_pool(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, y = node.inputs[0], node.outputs[0]
    geo, _ = geometry(node, g)
    assert geo is not None
    dt = dtype_name(g, x)
    t = c_type(dt)
    k = len(geo.ins)
    ow, sw, dw, pw = geo.outs[-1], geo.strides[-1], geo.dilations[-1], geo.pads_begin[-1]
    in_plane = int(np.prod(geo.ins, dtype=np.int64))
    in_strides = [int(np.prod(geo.ins[d + 1:], dtype=np.int64)) for d in range(k)]
    outer_outs = geo.outs[:-1]
    rows = geo.n * geo.c * int(np.prod(outer_outs, dtype=np.int64))
    work = rows * ow * int(np.prod(geo.kernel, dtype=np.int64))
    include_pad = bool(node.attr("count_include_pad", 0))

    if geo.kind == "max":
        init = "(-INFINITY)" if dt in FLOAT_TYPES else c_literal(np.iinfo(np.dtype(dt)).min, dt)
        upd = "{v} > {a} ? {v} : {a}"
        final = None
    elif geo.kind == "avg":
        init, upd, final = c_literal(0, dt), "{a} + {v}", "avg"
    else:
        term, final = _p_exprs(node, dt)
        init, upd = c_literal(0, dt), "{a} + " + term

    L = []
    for d in range(k - 1):
        rng = [geo.valid_range(d, o) for o in range(geo.outs[d])]
        L.append(_c_array("int32_t", f"LO{d}", [r[0] for r in rng]))
        L.append(_c_array("int32_t", f"HI{d}", [r[1] for r in rng]))
        if final == "avg":
            cnt = [geo.padded_count(d, o) if include_pad else r[1] - r[0] for o, r in enumerate(rng)]
            L.append(_c_array("int32_t", f"CN{d}", cnt))
    # innermost dim: per tap, the output columns it reaches in bounds
    tap_lo, tap_hi, offs = [], [], []
    for kw in range(geo.kernel[-1]):
        off = kw * dw - pw
        lo = -(off // sw) if off < 0 else 0  # first o with o * sw + off >= 0
        hi = min(ow, (geo.ins[-1] - 1 - off) // sw + 1) if geo.ins[-1] - 1 - off >= 0 else 0
        tap_lo.append(min(lo, ow))
        tap_hi.append(max(min(lo, ow), hi))
        offs.append(off)
    L.append(_c_array("int32_t", "TLO", tap_lo))
    L.append(_c_array("int32_t", "THI", tap_hi))
    if final == "avg":
        cw = [geo.padded_count(k - 1, o) if include_pad else geo.valid_range(k - 1, o)[1] - geo.valid_range(k - 1, o)[0]
              for o in range(ow)]
        L.append(_c_array("int32_t", "CW", cw))
    L.append(f"const {t} *restrict X = {em.ptr(x)};")
    L.append(f"{t} *restrict Y = (void *){em.ptr(y)};")
    L.append(work_range(rows, work >= PARALLEL_MIN_ELEMS))
    L.append("for (long r = wb; r < we; ++r) {")
    L.append(f"    {t} *restrict yr = Y + r * {ow};")
    L.append("    long rem = r;")
    for d in range(k - 2, -1, -1):
        L.append(f"    const long o{d} = rem % {geo.outs[d]}; rem /= {geo.outs[d]};")
    L.append(f"    const {t} *restrict xp = X + rem * {in_plane};")
    L.append(f"    for (long i = 0; i < {ow}; ++i) yr[i] = {init};")
    # MaxPool's Indices: flat input index of the (first) maximum, row- or column-major planes
    indices = len(node.outputs) > 1 and bool(node.outputs[1])
    col_major = indices and node.attr("storage_order", 0) == 1
    if indices:
        L.append(f"    int64_t *restrict ir = (int64_t *){em.ptr(node.outputs[1])} + r * {ow};")
        L.append(f"    for (long i = 0; i < {ow}; ++i) ir[i] = -1;")
        L.append(f"    const long plane = rem * {in_plane};")
    pos = [f"i{d} * {in_strides[d]}" for d in range(k - 1)]

    def nest(stmt: str) -> list[str]:
        """The window loops running ``stmt`` (in terms of ``xr``, ``o``, ``off``) per tap."""
        out, ind = [], "    "
        for d in range(k - 1):
            out.append(f"{ind}for (long k{d} = LO{d}[o{d}]; k{d} < HI{d}[o{d}]; ++k{d}) {{")
            ind += "    "
            out.append(f"{ind}const long i{d} = o{d} * {geo.strides[d]} - {geo.pads_begin[d]} + k{d} * {geo.dilations[d]};")
        out.append(f"{ind}const {t} *restrict xr = xp{''.join(' + ' + p for p in pos)};")
        out.append(f"{ind}for (int kw = 0; kw < {geo.kernel[-1]}; ++kw) {{")
        out.append(f"{ind}    const long off = (long)kw * {dw} - {pw};")
        out.append(f"{ind}    for (long o = TLO[kw]; o < THI[kw]; ++o) {stmt}")
        out.append(f"{ind}}}")
        for _ in range(k - 1):
            ind = ind[:-4]
            out.append(f"{ind}}}")
        return out

    v = f"xr[o * {sw} + off]"
    stmt = f"yr[o] = {upd.format(a='yr[o]', v=v)};"
    if indices:
        if col_major:  # 2-D only: index = plane + w * H + h
            ib, ws = "plane + i0", str(geo.ins[0])
        else:
            ib, ws = "plane" + "".join(" + " + p for p in pos), "1"
        stmt = (f"{{ const {t} v = {v}; const int up = v > yr[o]; yr[o] = up ? v : yr[o]; "
                f"ir[o] = up ? {ib} + (o * {sw} + off) * {ws} : ir[o]; }}")
    L += nest(stmt)
    if geo.kind == "max" and dt in FLOAT_TYPES:
        # a window of only NaN gives NaN (IEEE maxNum): the rare -Inf results are set to NaN
        # and their windows scanned again, where any number replaces the NaN (max is idempotent
        # for every other output)
        L += ["    int again = 0;",
              f"    for (long o = 0; o < {ow}; ++o) if (yr[o] == -INFINITY) {{ yr[o] = NAN; again = 1; }}",
              "    if (again) {"]
        L += ["    " + line for line in nest(f"yr[o] = ({v} > yr[o] || yr[o] != yr[o]) ? {v} : yr[o];")]
        L.append("    }")
    if final == "avg":
        cnt = " * ".join([f"(long)CN{d}[o{d}]" for d in range(k - 1)] + ["(long)CW[o]"])
        L.append(f"    for (long o = 0; o < {ow}; ++o) yr[o] = yr[o] / ({t})({cnt});")
    elif final is not None:
        L.append(f"    for (long o = 0; o < {ow}; ++o) yr[o] = {final.format(a='yr[o]')};")
    L.append("}")
    doc = (f"{node.op} in={geo.ins} k={geo.kernel} s={geo.strides} d={geo.dilations} "
           f"pads={geo.pads_begin}+{geo.pads_end} out={geo.outs}")
    emit_kernel(em, f"{node.op.lower()}{k}d_{dt}", "\n".join(L), doc)


def _check_global(node: Node, g: Graph) -> str | None:
    dt = dtype_name(g, node.inputs[0])
    xs = g.values[node.inputs[0]].shape
    if dt not in FLOAT_TYPES or dtype_name(g, node.outputs[0]) != dt:
        return f"no native {node.op} for {dt}"
    if len(xs) < 2 or g.values[node.inputs[0]].size == 0:
        return "needs a non-empty [N, C, ...] input"
    return None


@register(("GlobalAveragePool", "GlobalMaxPool"), versions=(1, 22), check=_check_global, name="global_pool")
def emit_global_pool(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, y = node.inputs[0], node.outputs[0]
    xs = [int(d) for d in g.values[x].shape]
    dt = dtype_name(g, x)
    t = c_type(dt)
    rows, length = xs[0] * xs[1], int(np.prod(xs[2:], dtype=np.int64))
    avg = node.op == "GlobalAveragePool"
    fn = row_reduce_fn(em, "sum" if avg else "maxnum", dt)  # max pooling skips NaN, like MaxPool
    res = f"{fn}(X + r * {length}, {length})"
    if avg:
        res = f"{res} / {c_literal(length, dt)}"
    L = [f"const {t} *restrict X = {em.ptr(x)};", f"{t} *restrict Y = (void *){em.ptr(y)};",
         work_range(rows, rows * length >= PARALLEL_MIN_ELEMS),
         f"for (long r = wb; r < we; ++r) Y[r] = {res};"]
    if not avg:  # a plane of only NaN gives NaN (maxNum skips NaN; see the module docstring)
        L.append(f"for (long r = wb; r < we; ++r) if (Y[r] == -INFINITY) {{ int num = 0; const {t} *xr = X + r * {length}; "
                 f"for (long i = 0; i < {length}; ++i) num |= xr[i] == xr[i]; if (!num) Y[r] = NAN; }}")
    emit_kernel(em, f"{node.op}_{dt}", "\n".join(L), f"{node.op} over [{rows}, {length}]")
