"""Vector asin, acos and atan in float32, written once over the ``VectorIsa`` spelling (so one
definition serves AVX-512 and AVX2), for the element-wise Asin / Acos / Atan.

libm's asinf/acosf/atanf are scalar calls the compiler cannot vectorize (their sqrt keeps an
errno path even when a caller could prove it unneeded), 20-40x slower than onnxruntime's Eigen
kernels on large tensors. These are Cephes' single-precision reductions and minimax
polynomials (relative error about 2e-7 over the domain), made branch-free with lane selects:

- asin: |x| <= 0.5 directly, else pi/2 - 2 asin(sqrt((1 - |x|) / 2)); sign restored;
- acos: pi/2 - asin(x) for |x| <= 0.5, else 2 asin(sqrt((1 - |x|) / 2)), from pi for x < 0;
- atan: |x| reduced by the tangents of pi/8 and 3pi/8 (to (|x| - 1)/(|x| + 1) or -1/|x|),
  pi/4 or pi/2 added back; sign restored; atan(+-Inf) = +-pi/2.

Outside [-1, 1] and at NaN, asin and acos give NaN (as libm and onnxruntime); atan keeps NaN.
Each function is ``smelt_v<op>_<isa name>(vector)``, defined once per translation unit.
"""

from __future__ import annotations

from smelt.codegen.kernels.isa import VectorIsa

ASIN_POLY = ("4.2163199048e-2f", "2.4181311049e-2f", "4.5470025998e-2f", "7.4953002686e-2f", "1.6666752422e-1f")
ATAN_POLY = ("8.05374449538e-2f", "-1.38776856032e-1f", "1.99777106478e-1f", "-3.33329491539e-1f")
PIO2, PIO4, PI = "1.5707963267948966f", "0.7853981633974483f", "3.141592653589793f"
TAN3PIO8, TANPIO8 = "2.414213562373095f", "0.4142135623730950f"


def fn_name(op: str, v: VectorIsa) -> str:
    """The C name of op ("asin", "acos", "atan") at ``v``."""
    return f"smelt_v{op}_{v.name}"


def _poly(v: VectorIsa, coeffs: tuple[str, ...], z: str) -> str:
    acc = v.set1(coeffs[0])
    for c in coeffs[1:]:
        acc = v.fmadd(acc, z, v.set1(c))
    return acc


def source(v: VectorIsa) -> str:
    """C definitions of the three functions for ``v`` (a vector ISA)."""
    t = v.vtype
    sel = v.ge_zero_select
    s1 = v.set1
    sqrt = f"{v.prefix}_sqrt_ps"
    neg = lambda a: v.op("sub", v.zero(), a)  # noqa: E731
    absx = v.op("max", neg("x"), "x")  # NaN stays NaN (max keeps its second operand then)

    def asin_core(name: str) -> list[str]:
        """Lines defining ``a``, ``big`` (lanes |x| > 1/2 as a sign), ``q`` = asin of the reduced
        argument (|x| or sqrt((1 - |x|) / 2), with x's sign in the small lanes when ``name`` is
        acos)."""
        small_arg = "x" if name == "acos" else "a"
        return [
            f"    const {t} a = {absx};",
            f"    const {t} big = {v.op('sub', 'a', s1('0.5f'))};  /* >= 0: the reduced branch */",
            f"    const {t} zb = {v.op('max', v.zero(), v.op('mul', s1('0.5f'), v.op('sub', s1('1.0f'), 'a')))};",
            f"    const {t} z = {sel('big', 'zb', v.op('mul', 'a', 'a'))};",
            f"    const {t} s = {sel('big', f'{sqrt}(zb)', small_arg)};",
            f"    const {t} q = {v.fmadd(v.op('mul', _poly(v, ASIN_POLY, 'z'), 'z'), 's', 's')};",
            f"    const {t} dom = {v.op('sub', s1('1.0f'), 'a')};  /* >= 0 inside [-1, 1]; NaN fails */",
        ]

    nan = s1("NAN")
    asin = [f"static inline {t} {fn_name('asin', v)}({t} x) {{", *asin_core("asin"),
            f"    const {t} p = {sel('big', v.fnmadd(s1('2.0f'), 'q', s1(PIO2)), 'q')};",
            f"    return {sel('dom', sel('x', 'p', neg('p')), nan)};", "}"]
    acos = [f"static inline {t} {fn_name('acos', v)}({t} x) {{", *asin_core("acos"),
            f"    const {t} twice = {v.op('add', 'q', 'q')};",
            f"    const {t} r = {sel('big', sel('x', 'twice', v.op('sub', s1(PI), 'twice')), v.op('sub', s1(PIO2), 'q'))};",
            f"    return {sel('dom', 'r', nan)};", "}"]
    atan = [
        f"static inline {t} {fn_name('atan', v)}({t} x) {{",
        f"    const {t} a = {absx};",
        f"    const {t} hi = {v.op('sub', 'a', s1(TAN3PIO8))}, mid = {v.op('sub', 'a', s1(TANPIO8))};",
        f"    const {t} tm = {v.op('div', v.op('sub', 'a', s1('1.0f')), v.op('add', 'a', s1('1.0f')))};",
        f"    const {t} th = {v.op('div', s1('-1.0f'), 'a')};",
        f"    const {t} tt = {sel('hi', 'th', sel('mid', 'tm', 'a'))};",
        f"    const {t} y0 = {sel('hi', s1(PIO2), sel('mid', s1(PIO4), v.zero()))};",
        f"    const {t} z = {v.op('mul', 'tt', 'tt')};",
        f"    const {t} p = {v.fmadd(v.op('mul', _poly(v, ATAN_POLY, 'z'), 'z'), 'tt', 'tt')};",
        f"    const {t} r = {v.op('add', 'y0', 'p')};",
        f"    return {sel('x', 'r', neg('r'))};",
        "}",
    ]
    return "\n".join(asin + acos + atan)
