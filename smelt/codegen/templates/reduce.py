"""Reduction templates: ReduceSum/Mean/Max/Min/Prod/L1/L2/SumSquare/LogSum/LogSumExp, ArgMax/ArgMin.

Template ``reduce``: the input's dims are coalesced into alternating kept/reduced groups (size-1
dims dropped). When the innermost group is reduced, every output element reduces contiguous runs
with a lane-parallel helper (32 independent partial results that gcc keeps in vector registers,
so the loop vectorizes without fast-math; the order of additions differs from a sequential sum,
by the usual rounding). When the innermost group is kept, each output row is the accumulator and
the reduction streams over the input with the vector loop along that kept dimension. A reduction
to fewer outputs than threads splits each run over the threads, with a combine step after.

NaN (onnxruntime is the oracle; its vector kernels keep or drop a NaN by SIMD lane, so smelt
follows its scalar rule, which does not depend on where a NaN lands): ReduceMax/ReduceMin give
the first element if it is NaN and skip every other NaN (a std::max fold from the first
element); ArgMax/ArgMin scan from the first element with a strict compare (non-strict for
select_last_index), so a NaN first element wins and no later NaN is ever chosen. The sums and
products propagate NaN; Softmax and ReduceLogSumExp use the NaN-propagating max.

Also here: the lane-parallel row helpers (``row_reduce_fn``, ``row_expsum_fn``) the pool, norm and
softmax templates share.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from smelt.codegen.emitter import BlockEmitter, c_literal
from smelt.codegen.kernels.broadcast import PARALLEL_MIN_ELEMS
from smelt.codegen.kernels.isa import vector_isa
from smelt.codegen.registry import register
from smelt.codegen.templates.movement import copy_step
from smelt.ir.graph import Graph, Node
from smelt.ir.types import FLOAT_TYPES, c_type

LANES = {"float32": 32, "float64": 16}


def dtype_name(g: Graph, name: str) -> str:
    return np.dtype(g.values[name].dtype).name


def fn_suffix(name: str, dtype: str) -> str:
    """libm function for the element type: expf for float32, exp for float64."""
    return f"{name}f" if dtype == "float32" else name


def unsigned_of(dtype: str) -> str:
    return {"int8": "uint8_t", "int16": "uint16_t", "int32": "uint32_t", "int64": "uint64_t"}.get(
        dtype, c_type(dtype))


def work_range(total: int, parallel: bool, lo: str = "wb", hi: str = "we") -> str:
    """C declaring [lo, hi): this thread's share of ``total`` items (all of it on tid 0 if serial)."""
    if parallel:
        return f"long {lo}, {hi}; smelt_range({total}, tid, nt, &{lo}, &{hi});"
    return f"long {lo} = 0, {hi} = tid == 0 ? {total} : 0;"


def decompose(index: str, dims: list[tuple[int, int]], acc: str, indent: str = "    ") -> list[str]:
    """C lines adding to ``acc`` the offset of row-major ``index`` over (size, stride) ``dims``."""
    lines = []
    if not dims:
        return lines
    if len(dims) == 1:
        size, stride = dims[0]
        return [f"{indent}{acc} += {index} * {stride};"] if stride else []
    lines.append(f"{indent}{{ long rem_ = {index};")
    for k, (size, stride) in enumerate(reversed(dims)):
        last = k == len(dims) - 1
        ix = "rem_" if last else f"(rem_ % {size})"
        if stride:
            lines.append(f"{indent}  {acc} += {ix} * {stride};")
        if not last:
            lines.append(f"{indent}  rem_ /= {size};")
    lines.append(f"{indent}}}")
    return lines


# -- shared kernel plumbing -----------------------------------------------------------------------

def wide_vectors(em: BlockEmitter) -> str:
    """Function attribute asking gcc for 512-bit vectors on AVX-512 targets (it prefers 256)."""
    return vector_isa(em.target).fn_attributes()


def emit_kernel(em: BlockEmitter, base: str, body: str, doc: str = "", wide: bool = False) -> None:
    """Render ``body`` as the node's step, a function named for ``base`` (``BlockEmitter.step``:
    shared by every node whose body differs only in its buffers).

    Inside ``body`` the step's names are in scope (``tid``, ``nt`` and what ``em.ptr`` and
    ``em.scratch`` expressions refer to).
    """
    em.step(body, name=base, doc=doc, attributes=wide_vectors(em) if wide else "")


# -- shared row helpers ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Combine:
    """How partial results of a reduction combine: identity, update with an element, merge."""

    init: str
    update: str  # C expression of {a} (accumulator) and {v} (element)
    merge: str  # C expression of {a} and {b} (two partials)


def combine_for(kind: str, dtype: str) -> Combine:
    """``max``/``min`` propagate NaN (numpy); ``maxnum``/``minnum`` skip it (IEEE maxNum: a NaN
    element never replaces the running value, an all-NaN run gives the identity)."""
    fl = dtype in FLOAT_TYPES
    lit = lambda x: c_literal(x, dtype) if fl else str(x)  # noqa: E731
    if kind == "sum":
        return Combine(lit(0), "{a} + {v}", "{a} + {b}")
    if kind == "sumsq":
        return Combine(lit(0), "{a} + {v} * {v}", "{a} + {b}")
    if kind == "sumabs":
        return Combine(lit(0), f"{{a}} + {fn_suffix('fabs', dtype)}({{v}})", "{a} + {b}")
    if kind == "prod":
        return Combine(lit(1), "{a} * {v}", "{a} * {b}")
    if kind in ("max", "min", "maxnum", "minnum"):
        cmp = ">" if kind.startswith("max") else "<"
        if fl:
            init = "(-INFINITY)" if kind.startswith("max") else "INFINITY"
            if kind in ("maxnum", "minnum"):  # a NaN never replaces the running value (maxps(v, a))
                return Combine(init, f"({{v}}) {cmp} ({{a}}) ? ({{v}}) : ({{a}})", f"({{b}}) {cmp} ({{a}}) ? ({{b}}) : ({{a}})")
            # NaN propagates, as numpy's maximum.reduce
            return Combine(init, f"(({{v}}) {cmp} ({{a}}) || ({{v}}) != ({{v}})) ? ({{v}}) : ({{a}})",
                           f"(({{b}}) {cmp} ({{a}}) || ({{b}}) != ({{b}})) ? ({{b}}) : ({{a}})")
        if dtype == "bool":
            init = "0" if kind.startswith("max") else "1"
        else:
            info = np.iinfo(np.dtype(dtype))
            init = c_literal(info.min if kind.startswith("max") else info.max, dtype)
        return Combine(init, f"({{v}}) {cmp} ({{a}}) ? ({{v}}) : ({{a}})", f"({{b}}) {cmp} ({{a}}) ? ({{b}}) : ({{a}})")
    raise KeyError(kind)


def acc_ctype(kind: str, dtype: str) -> str:
    """Accumulator type: the element type; integer sums/products wrap in the unsigned type."""
    if dtype in FLOAT_TYPES or kind in ("max", "min", "maxnum", "minnum"):
        return c_type(dtype)
    return unsigned_of(dtype)


def row_reduce_fn(em: BlockEmitter, kind: str, dtype: str) -> str:
    """``acc_t FNAME(const T *restrict x, long n)``: reduce a contiguous run, lane-parallel."""
    t, acc_t = c_type(dtype), acc_ctype(kind, dtype)
    c = combine_for(kind, dtype)
    lanes = LANES.get(dtype, 16)
    upd = lambda a, v: c.update.format(a=a, v=v)  # noqa: E731
    mrg = lambda a, b: c.merge.format(a=a, b=b)  # noqa: E731
    vcast = f"({acc_t})" if acc_t != t else ""
    code = f"""static {wide_vectors(em)}{acc_t} FNAME(const {t} *restrict x, long n) {{
    {acc_t} acc[{lanes}];
    for (int j = 0; j < {lanes}; ++j) acc[j] = {c.init};
    long i = 0;
    for (; i + {lanes} <= n; i += {lanes})
        for (int j = 0; j < {lanes}; ++j) {{ {acc_t} v = {vcast}x[i + j]; acc[j] = {upd('acc[j]', 'v')}; }}
    {acc_t} a = {c.init};
    for (; i < n; ++i) {{ {acc_t} v = {vcast}x[i]; a = {upd('a', 'v')}; }}
    for (int w = {lanes // 2}; w >= 1; w /= 2)
        for (int j = 0; j < w; ++j) acc[j] = {mrg('acc[j]', 'acc[j + w]')};
    return {mrg('acc[0]', 'a')};
}}
"""
    return em.function(f"row_{kind}_{dtype}", code, f"lane-parallel {kind} of a contiguous run")


EXPF_SOURCE = """\
static inline float FNAME(float x) {
    /* Cody-Waite reduction, Cephes' minimax polynomial, 2^k in two steps (reaches denormals):
     * max error ~1.0 ulp over the normal range; inf, -inf, NaN and underflow to 0 exact.
     * Branch-free, so loops calling it vectorize (glibc's expf does not without fast-math). */
    float xc = x > -103.972084f ? x : -103.972084f; /* maxps, then minps */
    xc = xc < 88.7228394f ? xc : 88.7228394f;
    float k = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = xc - k * 0.693359375f;
    r = r - k * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * r * r + r + 1.0f;
    int32_t ki = (int32_t)k, k1 = ki >> 1, k2 = ki - k1;
    int32_t b1 = (k1 + 127) << 23, b2 = (k2 + 127) << 23;
    float s1, s2;
    memcpy(&s1, &b1, 4);
    memcpy(&s2, &b2, 4);
    y = y * s1 * s2;
    y = x > -103.972084f ? y : 0.0f;
    y = x < 88.7228394f ? y : INFINITY;
    return x == x ? y : x;
}
"""


def exp_fn(em: BlockEmitter, dtype: str) -> str:
    """Name of a C exp for the element type: a vectorizable expf for float32, libm exp else."""
    if dtype == "float32":
        return em.function("smelt_expf", EXPF_SOURCE, "vectorizable expf")
    return fn_suffix("exp", dtype)


def row_expsum_fn(em: BlockEmitter, dtype: str, store: bool) -> str:
    """``T FNAME([T *y,] const T *x, long n, T m)``: sum of exp(x - m) (stored to y if ``store``)."""
    t = c_type(dtype)
    exp = exp_fn(em, dtype)
    lanes = LANES.get(dtype, 16) // 2
    sig = f"{t} *restrict y, const {t} *restrict x, long n, {t} m" if store else \
        f"const {t} *restrict x, long n, {t} m"
    st = "y[i + j] = e; " if store else ""
    st1 = "y[i] = e; " if store else ""
    code = f"""static {wide_vectors(em)}{t} FNAME({sig}) {{
    {t} acc[{lanes}] = {{0}};
    long i = 0;
    for (; i + {lanes} <= n; i += {lanes})
        for (int j = 0; j < {lanes}; ++j) {{ {t} e = {exp}(x[i + j] - m); {st}acc[j] += e; }}
    {t} a = 0;
    for (; i < n; ++i) {{ {t} e = {exp}(x[i] - m); {st1}a += e; }}
    for (int w = {lanes // 2}; w >= 1; w /= 2)
        for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
    return acc[0] + a;
}}
"""
    return em.function(f"row_expsum_{dtype}{'_store' if store else ''}", code, "sum of exp(x - m)")


# -- Reduce* ---------------------------------------------------------------------------------------

# op -> (combine kind, final expression of {a} (accumulator) and {n} (count), float only)
REDUCE_OPS: dict[str, tuple[str, str, bool]] = {
    "ReduceSum": ("sum", "{a}", False),
    "ReduceMean": ("sum", "{a} / {n}", True),
    # onnxruntime's rule: a NaN first element is the result, any other NaN is skipped
    # (``_first_nan``), i.e. a sequential std::max from the first element
    "ReduceMax": ("maxnum", "{a}", False),
    "ReduceMin": ("minnum", "{a}", False),
    "ReduceProd": ("prod", "{a}", False),
    "ReduceSumSquare": ("sumsq", "{a}", True),
    "ReduceL1": ("sumabs", "{a}", True),
    "ReduceL2": ("sumsq", "SQRT({a})", True),
    "ReduceLogSum": ("sum", "LOG({a})", True),
    "ReduceLogSumExp": ("lse", "", True),
}
# since-versions per op (opset 11 is the oldest smelt loads)
_V_MAXMIN = (11, 12, 13, 18, 20)
_V_COMMON = (11, 13, 18)
REDUCE_VERSIONS = {op: _V_COMMON for op in REDUCE_OPS}
REDUCE_VERSIONS.update(ReduceSum=(11, 13), ReduceMax=_V_MAXMIN, ReduceMin=_V_MAXMIN,
                       ReduceLogSum=_V_COMMON + (28,), ReduceLogSumExp=_V_COMMON + (28,))
INT_SUMS = ("int32", "int64", "uint32", "uint64")
INT_MAXMIN = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool")


def reduce_axes(node: Node, g: Graph) -> tuple[list[int] | None, str | None]:
    """Normalized sorted axes ([] = no axes given), or None and a reason."""
    rank = len(g.values[node.inputs[0]].shape)
    if node.attr("axes") is not None:
        axes = list(node.attr("axes"))
    elif len(node.inputs) > 1 and node.inputs[1]:
        c = g.const(node.inputs[1])
        if c is None:
            return None, "axes are computed at run time"
        axes = [int(a) for a in np.asarray(c).reshape(-1)]
    else:
        axes = []
    norm = []
    for a in axes:
        if not -rank <= a < max(rank, 1):
            return None, f"axis {a} out of range for rank {rank}"
        norm.append(a + rank if a < 0 else a)
    if len(set(norm)) != len(norm):
        return None, "repeated axes"
    return sorted(norm), None


def _check_reduce(node: Node, g: Graph) -> str | None:
    x, y = node.inputs[0], node.outputs[0]
    dt = dtype_name(g, x)
    kind, _, float_only = REDUCE_OPS[node.op]
    if dtype_name(g, y) != dt:
        return "output dtype differs from the input's"
    if dt not in FLOAT_TYPES:
        if float_only:
            return f"{node.op} is native for float types only"
        if kind in ("sum", "prod") and dt not in INT_SUMS:
            return f"no native {node.op} for {dt}"
        if kind in ("maxnum", "minnum") and dt not in INT_MAXMIN:
            return f"no native {node.op} for {dt}"
    if g.values[x].size == 0 or g.values[y].size == 0:
        return "empty tensor"
    axes, why = reduce_axes(node, g)
    if axes is None:
        return why
    if not axes and node.attr("noop_with_empty_axes", 0) and node.op not in (
            "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd"):
        return "noop_with_empty_axes on an op that transforms elements"
    return None


def groups(shape: tuple[int, ...], axes: list[int]) -> list[list[int]]:
    """Coalesced [size, reduced, stride] groups of ``shape`` (size-1 dims dropped)."""
    merged: list[list[int]] = []
    for d, size in enumerate(shape):
        if size == 1:
            continue
        red = int(d in axes)
        if merged and merged[-1][1] == red:
            merged[-1][0] *= size
        else:
            merged.append([int(size), red, 0])
    stride = 1
    for grp in reversed(merged):
        grp[2] = stride
        stride *= grp[0]
    return merged


def emit_reduce(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, y = node.inputs[0], node.outputs[0]
    xv = g.values[x]
    dt = dtype_name(g, x)
    axes, _ = reduce_axes(node, g)
    if not axes:
        if node.attr("noop_with_empty_axes", 0):
            emit_kernel(em, "reduce_noop_copy", copy_step(em, em.ptr(x), em.ptr(y), g.values[y].nbytes))
            return
        axes = list(range(len(xv.shape)))
    kind, final, _ = REDUCE_OPS[node.op]
    grps = groups(tuple(xv.shape), axes)
    n_red = int(np.prod([xv.shape[a] for a in axes], dtype=np.int64))
    t = c_type(dt)
    head = (f"const {t} *restrict X = {em.ptr(x)};\n"
            f"{t} *restrict Y = (void *){em.ptr(y)};\n")
    fl = dt in FLOAT_TYPES
    fin = (final.replace("SQRT", fn_suffix("sqrt", dt)).replace("LOG", fn_suffix("log", dt))
           .replace("{n}", c_literal(n_red, dt) if fl else str(n_red)))
    if not any(r for _, r, _ in grps):
        grps.append([1, 1, 1])  # nothing to reduce: each output reduces one element
    parallel = xv.size >= PARALLEL_MIN_ELEMS
    if grps[-1][1]:
        emit_kernel(em, f"{node.op}_{dt}_inner", head + _reduce_inner(em, head, kind, fin, dt, grps, parallel),
                    f"{node.op} over contiguous runs, groups {grps}")
    else:
        emit_kernel(em, f"{node.op}_{dt}_outer", head + _reduce_outer(em, kind, fin, dt, grps, parallel),
                    f"{node.op} along a kept inner dim, groups {grps}")


for _op in REDUCE_OPS:
    register(_op, versions=REDUCE_VERSIONS[_op], check=_check_reduce, name="reduce")(emit_reduce)


def _first_nan(kind: str, dt: str, first: str, result: str) -> str:
    """``result``, or the reduction's first element when that is NaN (ReduceMax/Min: onnxruntime
    folds std::max from the first element, which keeps a NaN there and skips any later one)."""
    if kind in ("maxnum", "minnum") and dt in FLOAT_TYPES:
        return f"({first} != {first} ? {first} : {result})"
    return result


def _reduce_inner(em: BlockEmitter, head: str, kind: str, fin: str, dt: str,
                  grps: list[list[int]], parallel: bool) -> str:
    """The innermost group is reduced: each output reduces contiguous runs of length L."""
    t = c_type(dt)
    length = grps[-1][0]
    kept = [(s, st) for s, r, st in grps if not r]
    others = [(s, st) for s, r, st in grps[:-1] if r]
    n_out = int(np.prod([s for s, _ in kept], dtype=np.int64)) if kept else 1
    n_q = int(np.prod([s for s, _ in others], dtype=np.int64)) if others else 1
    lines = []
    if kind == "lse":
        fmax, fexp = row_reduce_fn(em, "max", dt), row_expsum_fn(em, dt, store=False)
        cmax = combine_for("max", dt)
        log = fn_suffix("log", dt)
        lines.append(work_range(n_out, parallel and n_out > 1))
        lines.append("for (long o = wb; o < we; ++o) {")
        lines.append("    long base = 0;")
        lines += decompose("o", kept, "base")
        lines.append(f"    {t} m = {cmax.init}, s = 0;")
        lines.append(f"    for (long q = 0; q < {n_q}; ++q) {{ long off = base;")
        lines += decompose("q", others, "off", "        ")
        lines.append(f"        {t} p = {fmax}(X + off, {length}); m = {cmax.merge.format(a='m', b='p')}; }}")
        lines.append("    if (isinf(m)) { Y[o] = m; continue; }")
        lines.append(f"    for (long q = 0; q < {n_q}; ++q) {{ long off = base;")
        lines += decompose("q", others, "off", "        ")
        lines.append(f"        s += {fexp}(X + off, {length}, m); }}")
        lines.append(f"    Y[o] = m + {log}(s);")
        lines.append("}")
        return "\n".join(lines)
    fn = row_reduce_fn(em, kind, dt)
    c = combine_for(kind, dt)
    acc_t = acc_ctype(kind, dt)
    final = fin.format(a="a")
    if parallel and n_out < 2 * em.n_threads and n_q == 1 and length >= PARALLEL_MIN_ELEMS:
        # few long runs: every thread reduces a slice of each run, then tid 0 combines
        parts = em.scratch(n_out * em.n_threads * np.dtype(np.float64).itemsize, "uint8")
        lines.append(f"{acc_t} *P = ({acc_t} *){parts};")
        lines.append("long lb, le;")
        lines.append(f"smelt_range({length}, tid, nt, &lb, &le);")
        lines.append(f"for (long o = 0; o < {n_out}; ++o) {{")
        lines.append("    long base = 0;")
        lines += decompose("o", kept, "base")
        lines.append(f"    P[o * {em.n_threads} + tid] = {fn}(X + base + lb, le - lb);")
        lines.append("}")
        emit_kernel(em, f"reduce_{kind}_{dt}_split", head + "\n".join(lines), "per-thread partials")
        lines = [f"{acc_t} *P = ({acc_t} *){parts};",
                 f"if (tid == 0) for (long o = 0; o < {n_out}; ++o) {{",
                 "    long base = 0;", *decompose("o", kept, "base"),
                 f"    {acc_t} a = {c.init};",
                 f"    for (int p = 0; p < nt; ++p) a = {c.merge.format(a='a', b=f'P[o * {em.n_threads} + p]')};",
                 f"    Y[o] = ({t})({_first_nan(kind, dt, 'X[base]', final)});",
                 "}"]
        return "\n".join(lines)
    lines.append(work_range(n_out, parallel and n_out > 1))
    lines.append("for (long o = wb; o < we; ++o) {")
    lines.append("    long base = 0;")
    lines += decompose("o", kept, "base")
    if n_q == 1:
        lines.append(f"    {acc_t} a = {fn}(X + base, {length});")
    else:
        lines.append(f"    {acc_t} a = {c.init};")
        lines.append(f"    for (long q = 0; q < {n_q}; ++q) {{ long off = base;")
        lines += decompose("q", others, "off", "        ")
        lines.append(f"        {acc_t} p = {fn}(X + off, {length}); a = {c.merge.format(a='a', b='p')}; }}")
    lines.append(f"    Y[o] = ({t})({_first_nan(kind, dt, 'X[base]', final)});")
    lines.append("}")
    return "\n".join(lines)


def inner_chunks(rows: int, inner: int, n_threads: int) -> int:
    """How many chunks to cut each row of ``inner`` elements into, so all threads get work."""
    if rows >= 4 * n_threads or inner < 64:
        return 1
    return max(1, min(-(-inner // 32), -(-4 * n_threads // rows)))


def _reduce_outer(em: BlockEmitter, kind: str, fin: str, dt: str, grps: list[list[int]],
                  parallel: bool) -> str:
    """The innermost group is kept: accumulate output rows while streaming over the input."""
    t = c_type(dt)
    inner = grps[-1][0]
    kept = [(s, st) for s, r, st in grps[:-1] if not r]
    red = [(s, st) for s, r, st in grps if r]
    rows = int(np.prod([s for s, _ in kept], dtype=np.int64)) if kept else 1
    n_q = int(np.prod([s for s, _ in red], dtype=np.int64))
    nch = inner_chunks(rows, inner, em.n_threads) if parallel else 1
    cs = -(-inner // nch)
    lines = [work_range(rows * nch, parallel)]
    lines.append("for (long w = wb; w < we; ++w) {")
    lines.append(f"    long row = w / {nch}, i0 = (w % {nch}) * {cs}, i1 = SMELT_MIN({inner}, i0 + {cs});")
    lines.append("    long base = 0;")
    lines += decompose("row", kept, "base")
    lines.append(f"    {t} *restrict Yr = Y + row * {inner};")
    if kind == "lse":
        cmax = combine_for("max", dt)
        scratch = em.scratch(em.n_threads * inner * np.dtype(dt).itemsize, dt)
        exp, log = exp_fn(em, dt), fn_suffix("log", dt)
        lines.append(f"    {t} *restrict S = {scratch} + (long)tid * {inner};")
        lines.append(f"    for (long i = i0; i < i1; ++i) {{ Yr[i] = {cmax.init}; S[i] = 0; }}")
        lines.append(f"    for (long q = 0; q < {n_q}; ++q) {{ long off = base;")
        lines += decompose("q", red, "off", "        ")
        lines.append(f"        const {t} *restrict xr = X + off;")
        lines.append(f"        for (long i = i0; i < i1; ++i) Yr[i] = {cmax.update.format(a='Yr[i]', v='xr[i]')}; }}")
        lines.append(f"    for (long q = 0; q < {n_q}; ++q) {{ long off = base;")
        lines += decompose("q", red, "off", "        ")
        lines.append(f"        const {t} *restrict xr = X + off;")
        lines.append(f"        for (long i = i0; i < i1; ++i) S[i] += {exp}(xr[i] - Yr[i]); }}")
        lines.append(f"    for (long i = i0; i < i1; ++i) if (!isinf(Yr[i])) Yr[i] += {log}(S[i]);")
        lines.append("}")
        return "\n".join(lines)
    c = combine_for(kind, dt)
    acc_t = acc_ctype(kind, dt)
    lines.append(f"    {acc_t} *restrict A = ({acc_t} *)Yr;")
    lines.append(f"    for (long i = i0; i < i1; ++i) A[i] = {c.init};")
    lines.append(f"    for (long q = 0; q < {n_q}; ++q) {{ long off = base;")
    lines += decompose("q", red, "off", "        ")
    lines.append(f"        const {t} *restrict xr = X + off;")
    cast = f"({acc_t})" if acc_t != t else ""
    lines.append(f"        for (long i = i0; i < i1; ++i) A[i] = {c.update.format(a='A[i]', v=cast + 'xr[i]')}; }}")
    if _first_nan(kind, dt, "f", "a") != "a":
        lines.append(f"    for (long i = i0; i < i1; ++i) {{ const {t} f = X[base + i]; "
                     f"Yr[i] = {_first_nan(kind, dt, 'f', 'Yr[i]')}; }}")
    if fin != "{a}":
        lines.append(f"    for (long i = i0; i < i1; ++i) Yr[i] = {fin.format(a='Yr[i]')};")
    lines.append("}")
    return "\n".join(lines)


# -- ArgMax / ArgMin -------------------------------------------------------------------------------

ARG_TYPES = ("float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")


def _check_arg(node: Node, g: Graph) -> str | None:
    x = node.inputs[0]
    dt = dtype_name(g, x)
    if dt not in ARG_TYPES:
        return f"no native {node.op} for {dt}"
    if g.values[x].size == 0 or dtype_name(g, node.outputs[0]) != "int64":
        return "empty tensor or non-int64 output"
    rank = len(g.values[x].shape)
    axis = node.attr("axis", 0)
    if not -max(rank, 1) <= axis < max(rank, 1):
        return f"axis {axis} out of range"
    return None


def arg_better(op: str, dt: str, last: bool, v: str, best: str) -> str:
    """C condition: element ``v`` replaces the running ``best``. onnxruntime's rule (the oracle):
    scan from the first element with a strict compare (non-strict for select_last_index), so a
    NaN first element is never replaced and any later NaN never replaces anything."""
    cmp = ">" if op == "ArgMax" else "<"
    return f"{v} {cmp}= {best}" if last else f"{v} {cmp} {best}"


@register(("ArgMax", "ArgMin"), versions=(11, 12, 13), check=_check_arg, name="argminmax")
def emit_arg(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, y = node.inputs[0], node.outputs[0]
    shape = list(g.values[x].shape) or [1]
    dt = dtype_name(g, x)
    t = c_type(dt)
    axis = node.attr("axis", 0)
    axis = axis + len(shape) if axis < 0 else axis
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    length = int(shape[axis])
    inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
    last = bool(node.attr("select_last_index", 0))
    parallel = g.values[x].size >= PARALLEL_MIN_ELEMS
    lines = [f"const {t} *restrict X = {em.ptr(x)};", f"int64_t *restrict Y = (void *){em.ptr(y)};"]
    if inner == 1:
        # two vectorizable passes: the extreme value (NaN skipped), then its first/last index; a
        # NaN first element wins (see arg_better)
        fext = row_reduce_fn(em, "maxnum" if node.op == "ArgMax" else "minnum", dt)
        scan = (f"for (long l = {length - 1}; l >= 0; --l)" if last else f"for (long l = 0; l < {length}; ++l)")
        lines.append(work_range(outer, parallel))
        lines.append("for (long o = wb; o < we; ++o) {")
        lines.append(f"    const {t} *restrict xr = X + o * {length};")
        lines.append(f"    const {t} m = {fext}(xr, {length}); long bi = 0;")
        if dt in FLOAT_TYPES:
            lines.append(f"    if (xr[0] == xr[0]) {scan} if (xr[l] == m) {{ bi = l; break; }}")
        else:
            lines.append(f"    {scan} if (xr[l] == m) {{ bi = l; break; }}")
        lines.append("    Y[o] = bi;")
        lines.append("}")
    else:
        nch = inner_chunks(outer, inner, em.n_threads) if parallel else 1
        cs = -(-inner // nch)
        scratch = em.scratch(em.n_threads * inner * np.dtype(dt).itemsize, dt)
        lines.append(work_range(outer * nch, parallel))
        lines.append(f"{t} *restrict B = {scratch} + (long)tid * {inner};")
        lines.append("for (long w = wb; w < we; ++w) {")
        lines.append(f"    long o = w / {nch}, i0 = (w % {nch}) * {cs}, i1 = SMELT_MIN({inner}, i0 + {cs});")
        lines.append(f"    const {t} *restrict xo = X + o * {length * inner};")
        lines.append(f"    int64_t *restrict yr = Y + o * {inner};")
        lines.append("    for (long i = i0; i < i1; ++i) { B[i] = xo[i]; yr[i] = 0; }")
        lines.append(f"    for (long l = 1; l < {length}; ++l) {{")
        lines.append(f"        const {t} *restrict xr = xo + l * {inner};")
        lines.append(f"        for (long i = i0; i < i1; ++i) {{ {t} v = xr[i]; "
                     f"int up = {arg_better(node.op, dt, last, 'v', 'B[i]')}; "
                     "B[i] = up ? v : B[i]; yr[i] = up ? l : yr[i]; }")
        lines.append("    }")
        lines.append("}")
    emit_kernel(em, f"{node.op}_{dt}", "\n".join(lines), f"{node.op} over [{outer}, {length}, {inner}]")
