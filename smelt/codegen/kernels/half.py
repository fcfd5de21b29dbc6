"""float16 in generated C: the bits live in a uint16_t (``ir.types.STORAGE_TYPES``); a template
that computes converts each operand to float, computes in float and rounds the result back to
nearest-even, which is what onnxruntime's CPU kernels do for MLFloat16 element-wise ops (so one
op's result is bit-identical, not just close). The conversions are plain integer C, the same on
every ISA (no F16C dependence), and exact: every half is a float, and the rounding back is
IEEE's round-to-nearest-even with overflow to infinity and NaN kept NaN.
"""

from __future__ import annotations

from smelt.codegen.emitter import BlockEmitter

HALF_C = r"""
static inline float smelt_h2f(uint16_t h) {
    uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, bits;
    if (e == 0x1fu) bits = s | 0x7f800000u | (m << 13);          /* inf, NaN (payload kept) */
    else if (e) bits = s | ((e + 112u) << 23) | (m << 13);        /* normal: rebias 15 -> 127 */
    else { float f = (float)m * 0x1p-24f; return s ? -f : f; }    /* zero, subnormal: exact */
    float f; memcpy(&f, &bits, 4); return f;
}
static inline uint16_t smelt_f2h(float f) {
    uint32_t x; memcpy(&x, &f, 4);
    uint32_t s = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(s | 0x7e00u | ((a >> 13) & 0x3ffu));  /* NaN stays NaN */
    if (a >= 0x477ff000u) return (uint16_t)(s | 0x7c00u);       /* >= 65520 rounds to infinity */
    if (a >= 0x38800000u) {                                        /* a normal half */
        uint32_t r = a - 0x38000000u;
        r += 0xfffu + ((r >> 13) & 1u);                            /* to nearest, ties to even */
        return (uint16_t)(s | (r >> 13));
    }
    float v; memcpy(&v, &a, 4);                                    /* a subnormal half (or 0): */
    return (uint16_t)(s | (uint32_t)nearbyintf(v * 0x1p24f));      /* exact scaling, then RNE */
}
"""


def half_helpers(em: BlockEmitter) -> None:
    """Define smelt_h2f / smelt_f2h in the translation unit (once)."""
    em.function("half_conversions", HALF_C)


def load(dtype: str, expr: str) -> str:
    """``expr`` read as its compute type (float16 widened to float)."""
    return f"smelt_h2f({expr})" if dtype == "float16" else expr


def store(dtype: str, expr: str) -> str:
    """``expr`` (of the compute type) narrowed to ``dtype``'s storage."""
    return f"smelt_f2h({expr})" if dtype == "float16" else expr


def compute_dtype(dtype: str) -> str:
    """The dtype a kernel computes ``dtype`` in."""
    return "float32" if dtype == "float16" else dtype
