"""Normalization templates: BatchNormalization (inference), LayerNormalization,
InstanceNormalization, LRN.

``batchnorm``: y = x * s[c] + t[c] with s = scale / sqrt(var + eps), t = B - mean * s folded at
compile time in float64 when the parameters are constants (else computed per run of a channel),
then the node's fused epilogue (BatchNormalization is an epilogue host). The flat element range
is split over the threads, so a batch of one with few channels still uses every core.

``layernorm`` / ``instancenorm``: per normalized row, the mean (lane-parallel sum) and the
variance as the mean of squared deviations (two passes: no cancellation), then one fused
scale-and-shift pass. ``lrn``: per chunk of positions (vectorized along it), a running sum of
squares over the channels as onnxruntime computes it (head added, tail subtracted), so NaN and
Inf reach the same outputs as there.
"""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import BlockEmitter, c_literal
from smelt.codegen.kernels.broadcast import PARALLEL_MIN_ELEMS
from smelt.codegen.kernels.epilogue import epilogue_doc, epilogue_expr
from smelt.codegen.kernels.loops import dtype_name, emit_kernel, fn_suffix, wide_vectors, work_range
from smelt.codegen.kernels.rows import LANES, row_reduce_fn
from smelt.codegen.registry import register
from smelt.ir.graph import Graph, Node
from smelt.ir.types import FLOAT_TYPES, c_type


def row_sqdev_fn(em: BlockEmitter, dtype: str) -> str:
    """``T FNAME(const T *restrict x, long n, T m)``: sum of (x - m)^2, lane-parallel."""
    t = c_type(dtype)
    lanes = LANES[dtype]
    code = f"""static {wide_vectors(em)}{t} FNAME(const {t} *restrict x, long n, {t} m) {{
    {t} acc[{lanes}] = {{0}};
    long i = 0;
    for (; i + {lanes} <= n; i += {lanes})
        for (int j = 0; j < {lanes}; ++j) {{ {t} d = x[i + j] - m; acc[j] += d * d; }}
    {t} a = 0;
    for (; i < n; ++i) {{ {t} d = x[i] - m; a += d * d; }}
    for (int w = {lanes // 2}; w >= 1; w /= 2)
        for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
    return acc[0] + a;
}}
"""
    return em.function(f"row_sqdev_{dtype}", code, "lane-parallel sum of squared deviations")


def _stats_lines(em: BlockEmitter, dt: str, xr: str, n: int, eps: float) -> list[str]:
    """C lines defining ``mean`` and ``inv`` (1 / sqrt(var + eps)) of the run ``xr[0:n]``."""
    t = c_type(dt)
    fsum, fdev = row_reduce_fn(em, "sum", dt), row_sqdev_fn(em, dt)
    sqrt = fn_suffix("sqrt", dt)
    nl = c_literal(n, dt)
    return [f"const {t} mean = {fsum}({xr}, {n}) / {nl};",
            f"const {t} var = {fdev}({xr}, {n}, mean) / {nl};",
            f"const {t} inv = {c_literal(1, dt)} / {sqrt}(var + {c_literal(eps, dt)});"]


# -- BatchNormalization ----------------------------------------------------------------------------

def _check_bn(node: Node, g: Graph) -> str | None:
    if node.attr("training_mode", 0):
        return "training_mode BatchNormalization"
    if any(node.outputs[1:]):
        return "BatchNormalization's running statistics outputs"
    if len(node.present_inputs()) != 5:
        return "BatchNormalization needs five inputs"
    x = node.inputs[0]
    dt = dtype_name(g, x)
    if dt not in FLOAT_TYPES or dtype_name(g, node.outputs[0]) != dt:
        return f"no native BatchNormalization for {dt}"
    if node.epilogue and dt != "float32":
        return "fused epilogues are float32 only"
    xs = g.values[x].shape
    if len(xs) < 2 or g.values[x].size == 0:
        return "needs a non-empty [N, C, ...] input"
    consts = [g.const(i) for i in node.inputs[1:5]]
    if any(c is None for c in consts):
        if any(dtype_name(g, i) != dt for i in node.inputs[1:5]):
            return "run-time parameters of another dtype than the input"
    for i in node.inputs[1:5]:
        if g.values[i].size != xs[1]:
            return "parameters are not per-channel vectors"
    return None


@register("BatchNormalization", versions=(9, 14, 15), check=_check_bn, name="batchnorm")
def emit_batchnorm(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, y = node.inputs[0], node.outputs[0]
    xs = [int(d) for d in g.values[x].shape]
    dt = dtype_name(g, x)
    t = c_type(dt)
    n, c = xs[0], xs[1]
    spatial = int(np.prod(xs[2:], dtype=np.int64))
    eps = float(node.attr("epsilon", 1e-5))
    consts = [g.const(i) for i in node.inputs[1:5]]
    L = [f"const {t} *restrict X = {em.ptr(x)};", f"{t} *restrict Y = (void *){em.ptr(y)};"]
    if all(p is not None for p in consts):
        scale, bias, mean, var = (np.asarray(p, np.float64).reshape(-1) for p in consts)
        with np.errstate(all="ignore"):  # NaN/Inf parameters give NaN/Inf, as computed at run time
            s = scale / np.sqrt(var + eps)
            sh = bias - mean * s
        L.append(f"const {t} *restrict SC = {em.weight(s.astype(dt))};")
        L.append(f"const {t} *restrict SH = {em.weight(sh.astype(dt))};")
        coef = lambda ch: [f"const {t} sc = SC[{ch}], sh = SH[{ch}];"]  # noqa: E731
    else:
        names = ("PS", "PB", "PM", "PV")
        for nm, i in zip(names, node.inputs[1:5], strict=True):
            L.append(f"const {t} *restrict {nm} = {em.ptr(i)};")
        sqrt = fn_suffix("sqrt", dt)
        coef = lambda ch: [  # noqa: E731
            f"const {t} sc = PS[{ch}] / {sqrt}(PV[{ch}] + {c_literal(eps, dt)}), sh = PB[{ch}] - PM[{ch}] * sc;"]
    # rows of length `inner`; the channel is the row's (spatial > 1) or the column's (spatial == 1)
    rows, inner = (n * c, spatial) if spatial > 1 else (n, c)
    total = rows * inner
    L.append(work_range(total, total >= PARALLEL_MIN_ELEMS, "b", "e"))
    L.append("while (b < e) {")
    L.append(f"    const long r = b / {inner}, i0 = b % {inner}, i1 = SMELT_MIN({inner}, i0 + (e - b));")
    L.append(f"    const {t} *restrict xr = X + r * {inner}; {t} *restrict yr = Y + r * {inner};")
    if spatial > 1:
        L.append(f"    const long ch = r % {c};")
        L += ["    " + ln for ln in coef("ch")]
        expr = epilogue_expr(em, node, "v", f"(r * {inner} + i)", "ch")
        L.append(f"    for (long i = i0; i < i1; ++i) {{ const {t} v = xr[i] * sc + sh; yr[i] = {expr}; }}")
    else:
        expr = epilogue_expr(em, node, "v", f"(r * {inner} + i)", "i")
        L.append(f"    for (long i = i0; i < i1; ++i) {{ {coef('i')[0]} const {t} v = xr[i] * sc + sh; yr[i] = {expr}; }}")
    L.append("    b += i1 - i0;")
    L.append("}")
    emit_kernel(em, f"batchnorm_{dt}", "\n".join(L),
                f"BatchNormalization [{n}, {c}, {spatial}]; {epilogue_doc(node)}")


# -- LayerNormalization ----------------------------------------------------------------------------

def _ln_view(node: Node, g: Graph) -> tuple[int, int, int]:
    xs = [int(d) for d in g.values[node.inputs[0]].shape]
    axis = node.attr("axis", -1)
    axis = axis + len(xs) if axis < 0 else axis
    return axis, int(np.prod(xs[:axis], dtype=np.int64)), int(np.prod(xs[axis:], dtype=np.int64))


def _squeeze_lead(arr: np.ndarray, rank: int) -> np.ndarray:
    """Drop leading unit dims beyond ``rank``."""
    while arr.ndim > rank and arr.shape[0] == 1:
        arr = arr.reshape(arr.shape[1:])
    return arr


def _param_ok(g: Graph, name: str, norm_shape: list[int]) -> bool:
    v = g.values[name]
    if v.const is not None:
        arr = _squeeze_lead(np.asarray(v.const), len(norm_shape))
        try:
            np.broadcast_to(arr, norm_shape)
        except ValueError:
            return False
        return arr.ndim <= len(norm_shape)
    dims = [int(d) for d in v.shape]
    while dims and dims[0] == 1 and len(dims) > len(norm_shape):
        dims = dims[1:]
    return dims == norm_shape[len(norm_shape) - len(dims):] and v.size == int(np.prod(norm_shape))


def _check_ln(node: Node, g: Graph) -> str | None:
    x = node.inputs[0]
    dt = dtype_name(g, x)
    if dt != "float32" or any(dtype_name(g, o) != dt for o in node.outputs if o):
        return "LayerNormalization is native for float32 only"
    if any(dtype_name(g, i) != dt for i in node.present_inputs()):
        return "parameters of another dtype"
    if node.attr("stash_type", 1) != 1:
        return "stash_type other than float32"
    xs = [int(d) for d in g.values[x].shape]
    axis = node.attr("axis", -1)
    if not -len(xs) <= axis < len(xs) or g.values[x].size == 0:
        return "axis out of range or empty input"
    norm_shape = xs[axis + len(xs) if axis < 0 else axis:]
    for p in node.inputs[1:3]:
        if p and not _param_ok(g, p, norm_shape):
            return f"parameter {p!r} does not broadcast to the normalized shape {norm_shape}"
    return None


def _param_ptr(em: BlockEmitter, g: Graph, name: str, norm_shape: list[int]) -> str:
    v = g.values[name]
    if v.const is not None and tuple(v.const.shape) != tuple(norm_shape):
        arr = _squeeze_lead(np.asarray(v.const), len(norm_shape))
        return em.weight(np.ascontiguousarray(np.broadcast_to(arr, norm_shape)).astype(np.float32))
    return em.ptr(name)


# smelt's domain: the spelled-out normalization of exports below opset 17 (passes/fuse_layernorm.py)
@register("LayerNormalization", check=_check_ln, name="layernorm_pattern", domain="ai.smelt")
@register("LayerNormalization", versions=(17,), check=_check_ln, name="layernorm")
def emit_layernorm(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, y = node.inputs[0], node.outputs[0]
    xs = [int(d) for d in g.values[x].shape]
    axis, rows, n = _ln_view(node, g)
    norm_shape = xs[axis:]
    eps = float(node.attr("epsilon", 1e-5))
    L = [f"const float *restrict X = {em.ptr(x)};", f"float *restrict Y = (void *){em.ptr(y)};",
         f"const float *restrict G = {_param_ptr(em, g, node.inputs[1], norm_shape)};"]
    has_b = len(node.inputs) > 2 and bool(node.inputs[2])
    if has_b:
        L.append(f"const float *restrict B = {_param_ptr(em, g, node.inputs[2], norm_shape)};")
    outs = node.outputs + ["", ""]
    L.append(work_range(rows, rows * n >= PARALLEL_MIN_ELEMS))
    L.append("for (long r = wb; r < we; ++r) {")
    L.append(f"    const float *restrict xr = X + r * {n}; float *restrict yr = Y + r * {n};")
    L += ["    " + ln for ln in _stats_lines(em, "float32", "xr", n, eps)]
    shift = " + B[i]" if has_b else ""
    L.append(f"    for (long i = 0; i < {n}; ++i) yr[i] = (xr[i] - mean) * inv * G[i]{shift};")
    if outs[1]:
        L.append(f"    ((float *){em.ptr(outs[1])})[r] = mean;")
    if outs[2]:
        L.append(f"    ((float *){em.ptr(outs[2])})[r] = inv;")
    L.append("}")
    emit_kernel(em, "layernorm_f32", "\n".join(L), f"LayerNormalization [{rows}, {n}]")


# -- InstanceNormalization -------------------------------------------------------------------------

def _check_in(node: Node, g: Graph) -> str | None:
    x = node.inputs[0]
    dt = dtype_name(g, x)
    if dt not in FLOAT_TYPES or any(dtype_name(g, i) != dt for i in node.inputs + node.outputs[:1]):
        return f"no native InstanceNormalization for {dt}"
    xs = g.values[x].shape
    if len(xs) < 3 or g.values[x].size == 0:
        return "needs a non-empty [N, C, D1, ...] input"
    if g.values[node.inputs[1]].size != xs[1] or g.values[node.inputs[2]].size != xs[1]:
        return "scale and B must have C elements"
    return None


@register("InstanceNormalization", versions=(6, 22), check=_check_in, name="instancenorm")
def emit_instancenorm(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, s, b = node.inputs
    y = node.outputs[0]
    xs = [int(d) for d in g.values[x].shape]
    dt = dtype_name(g, x)
    t = c_type(dt)
    rows, n = xs[0] * xs[1], int(np.prod(xs[2:], dtype=np.int64))
    L = [f"const {t} *restrict X = {em.ptr(x)};", f"{t} *restrict Y = (void *){em.ptr(y)};",
         f"const {t} *restrict S = {em.ptr(s)};", f"const {t} *restrict B = {em.ptr(b)};",
         work_range(rows, rows * n >= PARALLEL_MIN_ELEMS),
         "for (long r = wb; r < we; ++r) {",
         f"    const {t} *restrict xr = X + r * {n}; {t} *restrict yr = Y + r * {n};"]
    L += ["    " + ln for ln in _stats_lines(em, dt, "xr", n, float(node.attr("epsilon", 1e-5)))]
    L += [f"    const {t} sc = S[r % {xs[1]}] * inv, sh = B[r % {xs[1]}] - mean * sc;",
          f"    for (long i = 0; i < {n}; ++i) yr[i] = xr[i] * sc + sh;",
          "}"]
    emit_kernel(em, f"instancenorm_{dt}", "\n".join(L), f"InstanceNormalization [{rows}, {n}]")


# -- LRN -------------------------------------------------------------------------------------------

LRN_CHUNK = 512  # positions per work item: the running sums stay in L1

def _check_lrn(node: Node, g: Graph) -> str | None:
    x = node.inputs[0]
    dt = dtype_name(g, x)
    if dt not in FLOAT_TYPES or dtype_name(g, node.outputs[0]) != dt:
        return f"no native LRN for {dt}"
    if len(g.values[x].shape) < 2 or g.values[x].size == 0 or int(node.attr("size", 0)) < 1:
        return "needs a non-empty [N, C, ...] input and size >= 1"
    return None


@register("LRN", versions=(1, 13), check=_check_lrn, name="lrn")
def emit_lrn(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, y = node.inputs[0], node.outputs[0]
    xs = [int(d) for d in g.values[x].shape]
    dt = dtype_name(g, x)
    t = c_type(dt)
    n, c, s = xs[0], xs[1], int(np.prod(xs[2:], dtype=np.int64))
    size = int(node.attr("size"))
    alpha, beta, bias = (float(node.attr(k, d)) for k, d in (("alpha", 1e-4), ("beta", 0.75), ("bias", 1.0)))
    lo, hi = (size - 1) // 2, -(-(size - 1) // 2)
    lit = lambda v: c_literal(v, dt)  # noqa: E731
    sqrt, powf = fn_suffix("sqrt", dt), fn_suffix("pow", dt)
    if beta == 0.75:
        scale = f"({lit(1)} / ({sqrt}(q) * {sqrt}({sqrt}(q))))"
    elif beta == 0.5:
        scale = f"({lit(1)} / {sqrt}(q))"
    elif beta == 1.0:
        scale = f"({lit(1)} / q)"
    else:
        scale = f"{powf}(q, {lit(-beta)})"
    # onnxruntime's algorithm, so NaN and Inf spread alike: per position, a running sum over the
    # channels (bias + a*x^2 of the window's head added, of its tail subtracted), so a NaN or Inf
    # that enters the window stays in every later channel's sum (Inf - Inf = NaN)
    chunk = min(s, LRN_CHUNK)
    chunks = -(-s // chunk)
    acc = em.scratch(em.n_threads * chunk * np.dtype(dt).itemsize, dt)
    a = lit(alpha / size)
    out = f"{{ const {t} q = A[i - i0]; yr[i] = xr[i] * {scale}; }}"
    L = [f"const {t} *restrict X = {em.ptr(x)};", f"{t} *restrict Y = (void *){em.ptr(y)};",
         f"{t} *restrict A = {acc} + (long)tid * {chunk};",
         work_range(n * chunks, n * c * s * size >= PARALLEL_MIN_ELEMS),
         "for (long w = wb; w < we; ++w) {",
         f"    const long b = w / {chunks}, i0 = (w % {chunks}) * {chunk}, i1 = SMELT_MIN({s}, i0 + {chunk});",
         f"    const {t} *restrict xb = X + b * {c * s}L; {t} *restrict yb = Y + b * {c * s}L;",
         f"    for (long i = i0; i < i1; ++i) A[i - i0] = {lit(bias)};",
         f"    for (long k = 0; k <= {min(hi, c - 1)}; ++k)",
         f"        for (long i = i0; i < i1; ++i) A[i - i0] += {a} * (xb[k * {s} + i] * xb[k * {s} + i]);",
         f"    for (long ch = 0; ch < {c}; ++ch) {{",
         "        if (ch > 0) {",
         f"            const long head = ch + {hi}, tail = ch - {lo + 1};",
         f"            if (head < {c}) for (long i = i0; i < i1; ++i) A[i - i0] += {a} * (xb[head * {s} + i] * xb[head * {s} + i]);",
         f"            if (tail >= 0) for (long i = i0; i < i1; ++i) A[i - i0] -= {a} * (xb[tail * {s} + i] * xb[tail * {s} + i]);",
         "        }",
         f"        const {t} *restrict xr = xb + ch * {s}; {t} *restrict yr = yb + ch * {s};",
         f"        for (long i = i0; i < i1; ++i) {out}",
         "    }",
         "}"]
    emit_kernel(em, f"lrn_{dt}", "\n".join(L), f"LRN size={size} over [{n}, {c}, {s}]")
