"""Lane-parallel row helpers: reductions over contiguous runs (sum, max, min, ... with 32
independent partial results gcc keeps in vector registers, so the loops vectorize without
fast-math) and the exp-and-sum row of softmax. Shared by the reduce, pool, norm and softmax
templates."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from smelt.codegen.emitter import BlockEmitter, c_literal
from smelt.codegen.kernels.isa import VectorIsa
from smelt.codegen.kernels.loops import fn_suffix, unsigned_of, wide_vectors
from smelt.ir.types import FLOAT_TYPES, c_type

LANES = {"float32": 32, "float64": 16}


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


LOGF_SOURCE = """\
static inline float FNAME(float x) {
    /* Cephes' logf: x = m 2^e with m in [sqrt(1/2), sqrt(2)), log x = e ln2 + log m, log m by its
     * minimax polynomial in m - 1 and ln2 in two parts: max error ~1 ulp. Branch-free, so loops
     * calling it vectorize (glibc's logf does not without fast-math); denormals scaled by 2^23
     * first; log(+-0) = -inf, log(x < 0) = NaN, log(inf) = inf, NaN kept. */
    const int sub = x < 1.17549435e-38f;
    const float xs = sub ? x * 8388608.0f : x;
    int32_t ix;
    memcpy(&ix, &xs, 4);
    int32_t e = ((ix >> 23) & 0xff) - 126 - (sub ? 23 : 0);
    const int32_t im = (ix & 0x007fffff) | 0x3f000000; /* m in [0.5, 1) */
    float m;
    memcpy(&m, &im, 4);
    const int low = m < 0.707106781186547524f;
    e -= low;
    m = low ? m + m - 1.0f : m - 1.0f;
    const float fe = (float)e, z = m * m;
    float p = 7.0376836292e-2f;
    p = p * m - 1.1514610310e-1f;
    p = p * m + 1.1676998740e-1f;
    p = p * m - 1.2420140846e-1f;
    p = p * m + 1.4249322787e-1f;
    p = p * m - 1.6668057665e-1f;
    p = p * m + 2.0000714765e-1f;
    p = p * m - 2.4999993993e-1f;
    p = p * m + 3.3333331174e-1f;
    float y = p * m * z;
    y += fe * -2.12194440e-4f;
    y += -0.5f * z;
    float r = m + y;
    r += fe * 0.693359375f;
    r = x > 0.0f ? r : (x == 0.0f ? -INFINITY : NAN);
    r = x == INFINITY ? x : r;
    return x == x ? r : x;
}
"""


def log_fn(em: BlockEmitter, dtype: str) -> str:
    """Name of a C log for the element type: a vectorizable logf for float32, libm log else."""
    if dtype == "float32":
        return em.function("smelt_logf", LOGF_SOURCE, "vectorizable logf")
    return fn_suffix("log", dtype)


def exp_fn(em: BlockEmitter, dtype: str) -> str:
    """Name of a C exp for the element type: a vectorizable expf for float32, libm exp else."""
    if dtype == "float32":
        return em.function("smelt_expf", EXPF_SOURCE, "vectorizable expf")
    return fn_suffix("exp", dtype)


def row_expsum_vector_fn(em: BlockEmitter, v: VectorIsa) -> str:
    """``float FNAME(float *y, const float *x, long n, float m)``: y = exp(x - m), returning the
    sum, in the ISA's vector exp (csrc/smelt_vec.h) two vectors at a time, the ragged end under a
    lane mask: a softmax row whose max is ``m``. The vectorized scalar expf of
    ``row_expsum_fn`` (integer exponent steps, selects for the range ends) took ~3x the cycles
    per element: 22% of a 1500-key attention (Whisper's encoder) against ~8% now. The sum adds
    the vectors in a fixed order (two partial sums, then the lanes), so a row's result does not
    depend on the thread it runs on."""
    w = v.lanes
    code = f"""static float FNAME(float *restrict y, const float *restrict x, long n, float m) {{
    const {v.t} vm = {v.set1('m')};
    {v.t} s0 = {v.zero()}, s1 = {v.zero()};
    long i = 0;
    for (; i + {2 * w} <= n; i += {2 * w}) {{
        const {v.t} e0 = {v.exp_fn}({v.op('sub', v.loadu('x + i'), 'vm')});
        const {v.t} e1 = {v.exp_fn}({v.op('sub', v.loadu(f'x + i + {w}'), 'vm')});
        {v.storeu('y + i', 'e0')} {v.storeu(f'y + i + {w}', 'e1')}
        s0 = {v.op('add', 's0', 'e0')}; s1 = {v.op('add', 's1', 'e1')};
    }}
    for (; i < n; i += {w}) {{  /* the last one or two vectors, the ragged one masked */
        const {v.mask_type} lm = {v.lane_mask(f'SMELT_MIN({w}, n - i)')};
        const {v.t} e = {v.exp_fn}({v.op('sub', v.masked_load('x + i', 'lm'), 'vm')});
        {v.masked_store('y + i', 'e', 'lm')}
        s0 = {v.op('add', 's0', v.masked_load('y + i', 'lm'))};  /* the stored lanes, zeros past n */
    }}
    return {v.hsum(v.op('add', 's0', 's1'))};
}}
"""
    return em.function(f"row_expsum_store_{v.name}", code, "sum of exp(x - m), vector exp")


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
