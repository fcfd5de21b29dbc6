"""Element-wise templates: unary math and activations, binary and ternary ops with broadcasting.

Template ``f32_eltwise_*``: one loop nest from ``codegen.broadcast`` per node; float ops use
libm (no fast-math: results stay IEEE fp32/fp64) and propagate NaN like onnxruntime (Max, Min,
Clip keep NaN; Clip's absent bounds are the type's range); the activations a fused epilogue can
hold are rendered by ``codegen.epilogue``, so standalone and fused agree. Integer Add, Sub,
Mul, Neg and Abs wrap like numpy: they compute in unsigned arithmetic, so there is no signed
overflow (undefined behaviour in C) and no promotion of uint16 to a signed int.

Integer Div and Mod are onnxruntime's: Div truncates toward zero (C's), Mod with fmod=0 takes the
divisor's sign, fmod=1 the dividend's (C's ``%``). A zero divisor makes the inference fail, as
onnxruntime's "Integer division by zero" does (SMELT_FAIL, the element written 0); INT_MIN / -1,
where onnxruntime dies of SIGFPE, wraps to INT_MIN like numpy (and INT_MIN % -1 is 0), so the C
never divides in a way that traps. Float Mod with fmod=0 is numpy's (and onnxruntime's opset-28)
floor modulo: fmod, then the divisor added when the signs differ, a zero remainder taking the
divisor's sign. BitShift (signed types from opset 28) shifts by counts outside [0, bits) to 0,
or to the sign fill when shifting right, as the ONNX reference and onnxruntime do; left shifts
run in unsigned arithmetic. The variadic Sum / Mean / Max / Min broadcast any number of inputs
and fold them left to right (Max/Min propagate NaN, as onnxruntime's).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from smelt.codegen.emitter import BlockEmitter, c_literal
from smelt.codegen.kernels import half, vtrig
from smelt.codegen.kernels.broadcast import PARALLEL_MIN_ELEMS, broadcast_strides, elementwise_loop
from smelt.codegen.kernels.epilogue import (
    ACTIVATIONS,
    scalar_binary,
    scalar_clamp,
    scalar_relu,
    unary_float_expr,
    vector_unary_expr,
)
from smelt.codegen.kernels.isa import vector_isa
from smelt.codegen.kernels.loops import work_range
from smelt.codegen.kernels.rows import exp_fn, log_fn
from smelt.codegen.registry import register, same_layout_flat
from smelt.ir.activations import activation_step, clip_default_bounds
from smelt.ir.graph import PLAIN, Graph, Node, layout_block
from smelt.ir.types import FLOAT_TYPES, INT_TYPES, c_type, has_c_type, has_storage_type

SIGNED = ("int8", "int16", "int32", "int64")
# positions per work item of a blocked op with a per-channel operand (``blocked_channel_operand``):
# 256 x 16 floats = 16 KiB of each operand, a few items per thread on a 20x20 plane
CHANNEL_RUN = 256
NUMERIC = FLOAT_TYPES + INT_TYPES


def _fn(name: str, dtype: str) -> str:
    return f"{name}f" if dtype == "float32" else name


def _lit(x: float, dtype: str) -> str:
    return c_literal(x, dtype)


def _wrap(dtype: str, expr: str) -> str:
    """``expr`` (written over operands cast with ``U``) evaluated modulo 2^n, as numpy does."""
    unsigned = "uint64_t" if np.dtype(dtype).itemsize == 8 else "uint32_t"
    return f"(({c_type(dtype)})({expr.replace('U(', f'({unsigned})(')}))"


def _nan_guard(x: str, expr: str) -> str:
    """``expr``, except NaN in gives NaN out (fmin/fmax would turn it into a number)."""
    return f"({x} != {x} ? {x} : {expr})"


def _gelu_tanh(node: Node) -> bool:
    """ONNX's Gelu with the tanh approximation (attribute approximate="tanh")."""
    approx = node.attr("approximate", "none")
    return (approx.decode() if isinstance(approx, bytes) else approx) == "tanh"


SOFTPLUS_SOURCE = """\
static inline float FNAME(float x) {
    /* log(1 + e^x) as log1p(e^x) by Goldberg's correction: u = 1 + e^x rounded, log1p(e) =
     * log(u) e / (u - 1) (u - 1 is exact), e itself once 1 + e rounds to 1; above 20, x (what
     * float holds). Branch-free on EXPF/LOGF, so a loop of it vectorizes. NaN kept. */
    const float e = EXPF(x), u = 1.0f + e;
    const float r = u == 1.0f ? e : LOGF(u) * (e / (u - 1.0f));
    return x > 20.0f ? x : r;
}
"""
MISH_SOURCE = """\
static inline float FNAME(float x) {
    /* x tanh(log(1 + e^x)) = x n / (n + 2) with n = e^x (e^x + 2): one exp, no log or tanh (a
     * loop of it vectorizes); above 20 tanh rounds to 1: x. -inf gives -inf * 0 = NaN, as
     * x * tanh(softplus(x)) does; NaN kept. */
    const float e = EXPF(x), n = e * (e + 2.0f);
    return x > 20.0f ? x : x * (n / (n + 2.0f));
}
"""


# the scalar ops whose float32 loop calls them
VECTORIZABLE_FN_OPS = ("Exp", "Log", "Elu", "Selu", "Celu", "Softplus", "Mish")


def _vectorizable_fns(em: BlockEmitter, op: str, dtype: str) -> dict[str, str]:
    """float32: the branch-free exp and log of kernels/rows.py and the softplus and mish built on
    them (glibc's are scalar calls: a 3M-element Mish took 4.5x onnxruntime's time); other
    dtypes: libm."""
    if dtype != "float32" or op not in VECTORIZABLE_FN_OPS:
        return {}
    exp, log = exp_fn(em, dtype), log_fn(em, dtype)
    return {"exp": exp, "log": log,
            "softplus": em.function("smelt_softplusf", SOFTPLUS_SOURCE.replace("EXPF", exp).replace("LOGF", log),
                                    "vectorizable softplus"),
            "mish": em.function("smelt_mishf", MISH_SOURCE.replace("EXPF", exp), "vectorizable mish")}


def _unary_expr(node: Node, g: Graph, x: str, dtype: str, fns: Mapping[str, str] | None = None) -> str | None:
    """C expression of the op applied to ``x``; None when this dtype has no native form. ``fns``:
    names of vectorizable functions to call instead of libm's (``_vectorizable_fns``)."""
    op, fl = node.op, dtype in FLOAT_TYPES
    one, zero = _lit(1, dtype) if fl else "1", _lit(0, dtype) if fl else "0"
    if op == "Identity":
        return x
    if op == "Relu" and dtype in FLOAT_TYPES + SIGNED:
        return scalar_relu(x, dtype)
    if op == "Neg" and dtype in FLOAT_TYPES:
        return f"(-{x})"
    if op == "Neg" and dtype in SIGNED:
        return _wrap(dtype, f"0u - U({x})")  # -INT_MIN wraps to INT_MIN
    if op == "Abs" and dtype in FLOAT_TYPES:
        return f"{_fn('fabs', dtype)}({x})"
    if op == "Abs" and dtype in SIGNED:
        return f"({x} < 0 ? {_wrap(dtype, f'0u - U({x})')} : {x})"
    if op == "Abs" and dtype in INT_TYPES:
        return x
    if op == "Sign" and dtype in NUMERIC:
        return f"(({x} > 0) - ({x} < 0))" if not fl else f"({x} > {zero} ? {one} : ({x} < {zero} ? -{one} : {x}))"
    if op == "Not" and dtype == "bool":
        return f"(!{x})"
    if op == "BitwiseNot" and dtype in INT_TYPES:
        return f"(({c_type(dtype)})~{x})"
    if not fl:
        return None
    # rendered with the fused epilogues' semantics (NaN/Inf as onnxruntime); the activation table's
    # Gelu is the exact (erf) form, so ONNX's Gelu with approximate="tanh" takes its own below
    if op in ACTIVATIONS and not (op == "Gelu" and _gelu_tanh(node)):
        return unary_float_expr(op, x, activation_step(node).param_dict(), dtype)
    fns = fns or {}
    f = lambda name: fns.get(name) or _fn(name, dtype)  # noqa: E731
    a = lambda key, default: _lit(node.attr(key, default), dtype)  # noqa: E731
    table = {
        "Exp": f"{f('exp')}({x})",
        "Log": f"{f('log')}({x})",
        "Sqrt": f"{f('sqrt')}({x})",
        "Reciprocal": f"({one} / {x})",
        "Floor": f"{f('floor')}({x})",
        "Ceil": f"{f('ceil')}({x})",
        "Round": f"{f('nearbyint')}({x})",  # ties to even under the default rounding mode
        "Erf": f"{f('erf')}({x})",
        "Sin": f"{f('sin')}({x})",
        "Cos": f"{f('cos')}({x})",
        "Tan": f"{f('tan')}({x})",
        # inverse and hyperbolic trigonometry: libm, correctly rounded to < 1 ulp, NaN outside
        # the domain (acos(2), acosh(0.5), atanh(2)) and +-Inf at atanh(+-1), as onnxruntime
        "Acos": f"{f('acos')}({x})",
        "Asin": f"{f('asin')}({x})",
        "Atan": f"{f('atan')}({x})",
        "Acosh": f"{f('acosh')}({x})",
        "Asinh": f"{f('asinh')}({x})",
        "Atanh": f"{f('atanh')}({x})",
        "Sinh": f"{f('sinh')}({x})",
        "Cosh": f"{f('cosh')}({x})",
        "Softplus": (f"{fns['softplus']}({x})" if "softplus" in fns else
                     f"({x} > {_lit(20, dtype)} ? {x} : {f('log1p')}({f('exp')}({x})))"),
        "Softsign": f"({x} / ({one} + {f('fabs')}({x})))",
        "Elu": f"({x} >= {zero} ? {x} : {a('alpha', 1.0)} * ({f('exp')}({x}) - {one}))",
        # the NaN guard first, so max/min are plain selects (libm's fmaxf/fminf are calls)
        "Celu": _nan_guard(x, f"(SMELT_MAX({zero}, {x}) + SMELT_MIN({zero}, {a('alpha', 1.0)} * "
                              f"({f('exp')}({x} / {a('alpha', 1.0)}) - {one})))"),
        "Selu": f"({a('gamma', 1.0507009873554805)} * ({x} > {zero} ? {x} : {a('alpha', 1.6732632423543772)} * ({f('exp')}({x}) - {one})))",
        "ThresholdedRelu": f"({x} > {a('alpha', 1.0)} ? {x} : {zero})",
        "Mish": f"{fns['mish']}({x})" if "mish" in fns else f"({x} * {f('tanh')}({f('log1p')}({f('exp')}({x}))))",
    }
    if op == "Gelu":
        if _gelu_tanh(node):
            return (f"({_lit(0.5, dtype)} * {x} * ({one} + {f('tanh')}({_lit(0.7978845608028654, dtype)} * "
                    f"({x} + {_lit(0.044715, dtype)} * {x} * {x} * {x}))))")
        return f"({_lit(0.5, dtype)} * {x} * ({one} + {f('erf')}({x} * {_lit(0.7071067811865476, dtype)})))"
    return table.get(op)


UNARY_OPS = ("Identity", "Relu", "Neg", "Abs", "Sign", "Not", "BitwiseNot", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt",
             "Reciprocal", "Floor", "Ceil", "Round", "Erf", "Sin", "Cos", "Tan", "Acos", "Asin",
             "Atan", "Acosh", "Asinh", "Atanh", "Sinh", "Cosh", "Softplus", "Softsign",
             "LeakyRelu", "Elu", "Celu", "Selu", "ThresholdedRelu", "HardSigmoid", "HardSwish", "Mish", "Gelu")


def _dtype(g: Graph, name: str) -> str:
    return np.dtype(g.values[name].dtype).name


def _check_unary(node: Node, g: Graph) -> str | None:
    why = same_layout_flat(node, g, node.inputs[:1])
    if why:
        return why
    dt = _dtype(g, node.inputs[0])
    if not (has_c_type(dt) or dt == "float16") or _dtype(g, node.outputs[0]) != dt:
        return f"dtype {dt} has no native {node.op}"
    if _unary_expr(node, g, "x", half.compute_dtype(dt)) is None:
        return f"no native {node.op} for {dt}"
    return None


# float32 activations computed with the target's vector math (csrc/smelt_vec.h, the functions
# the fused epilogues and the RNN call): glibc's tanhf costs ~95 ns an element against ~3 for
# a vector lane, which was a quarter of a file-type classifier's time (magika)
VECTOR_MATH_OPS = ("Sigmoid", "Tanh", "Exp", "Erf", "Gelu", "Asin", "Acos", "Atan")
# inverse trigonometry: kernels/vtrig.py (libm's were 20-40x slower than onnxruntime's Eigen ones)
VTRIG_OPS = {"Asin": "asin", "Acos": "acos", "Atan": "atan"}


def _vector_math(node: Node, g: Graph, em: BlockEmitter) -> str | None:
    """The vector expression of ``node`` over vector ``xv`` where the target has vector math
    for it; None otherwise (the scalar loop)."""
    v = vector_isa(em.target)
    if node.op not in VECTOR_MATH_OPS or _dtype(g, node.inputs[0]) != "float32" or not v.vector:
        return None
    if node.op == "Gelu" and _gelu_tanh(node):
        return None
    if node.op == "Exp":
        return f"{v.exp_fn}(xv)"
    if node.op == "Erf":  # a standalone Erf (an unmatched GELU spelling): libm's erff was ~60x slower
        return f"{v.erf_fn}(xv)"
    if node.op in VTRIG_OPS:
        em.function(f"vtrig_{v.name}", vtrig.source(v))
        return f"{vtrig.fn_name(VTRIG_OPS[node.op], v)}(xv)"
    return vector_unary_expr(v, activation_step(node), "xv")


def _emit_vector_unary(node: Node, g: Graph, em: BlockEmitter, expr: str) -> None:
    """Whole vectors of the flat data split between threads, the last one under a lane mask."""
    v = vector_isa(em.target)
    x, y = node.inputs[0], node.outputs[0]
    n = int(np.prod(g.values[y].shape, dtype=np.int64))
    nvec = -(-n // v.lanes)
    em.step("\n".join([
        f"const float *restrict X = {em.ptr(x)};",
        f"float *restrict Y = {em.ptr(y)};",
        work_range(nvec, n >= PARALLEL_MIN_ELEMS),
        "for (long i = wb; i < we; ++i) {",
        f"    const long o = i * {v.lanes};",
        f"    if (o + {v.lanes} <= {n}) {{",
        f"        const {v.vtype} xv = {v.loadu('X + o')};",
        f"        {v.storeu('Y + o', expr)}",
        "    } else {",
        f"        const {v.mask_type} m = {v.lane_mask(f'{n} - o')};",
        f"        const {v.vtype} xv = {v.masked_load('X + o', 'm')};",
        f"        {v.masked_store('Y + o', expr, 'm')}",
        "    }",
        "}"]), name=f"f32_{node.op.lower()}_{v.name}", doc=f"{node.op} with the vector math, {v.lanes} lanes")


@register(UNARY_OPS, check=_check_unary, name="eltwise_unary", blocked=True)
def emit_unary(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, y = node.inputs[0], node.outputs[0]
    dt = _dtype(g, x)
    vexpr = _vector_math(node, g, em)
    if vexpr is not None:
        _emit_vector_unary(node, g, em, vexpr)
        return
    expr = half.store(dt, _unary_expr(node, g, "X[I0]", half.compute_dtype(dt),
                                      _vectorizable_fns(em, node.op, half.compute_dtype(dt))))
    if dt == "float16":
        half.half_helpers(em)
    shape = g.values[y].shape
    loop = elementwise_loop(shape, [g.values[x].shape],
                            lambda idx, o: f"{bind_loads({'X[I0]': half.load(dt, f'X[{idx[0]}]')})} "
                                           f"Y[{o}] = {expr.replace('X[I0]', 'x_')}; }}")
    em.step(f"const __typeof__(*{em.ptr(x)}) *restrict X = {em.ptr(x)};\n"
            f"__typeof__(*{em.ptr(y)}) *restrict Y = (void *){em.ptr(y)};\n{loop}")


def _check_float_test(node: Node, g: Graph) -> str | None:
    why = same_layout_flat(node, g, node.inputs[:1])
    if why:
        return why
    dt = _dtype(g, node.inputs[0])
    if dt not in FLOAT_TYPES + ("float16",) or _dtype(g, node.outputs[0]) != "bool":
        return f"no native {node.op} for {dt}"
    return None


@register(("IsNaN", "IsInf"), check=_check_float_test, name="eltwise_float_test", blocked=True)
def emit_float_test(node: Node, g: Graph, em: BlockEmitter) -> None:
    """IsNaN / IsInf (detect_positive, detect_negative): a float class test, bool out. Exported
    attention masks use them (``Where(IsNaN(scores), 0, scores)``)."""
    x, y = node.inputs[0], node.outputs[0]
    if node.op == "IsNaN":
        expr = "(X[I0] != X[I0])"
    else:
        tests = [t for t, on in (("X[I0] == INFINITY", node.attr("detect_positive", 1)),
                                 ("X[I0] == -INFINITY", node.attr("detect_negative", 1))) if on]
        expr = "(" + " || ".join(tests) + ")" if tests else "0"
    dt = _dtype(g, x)
    if dt == "float16":
        half.half_helpers(em)
    loop = elementwise_loop(g.values[y].shape, [g.values[x].shape],
                            lambda idx, o: f"Y[{o}] = {expr.replace('X[I0]', half.load(dt, f'X[{idx[0]}]'))};")
    em.step(f"const __typeof__(*{em.ptr(x)}) *restrict X = {em.ptr(x)};\n"
            f"__typeof__(*{em.ptr(y)}) *restrict Y = (void *){em.ptr(y)};\n{loop}")


def _clip_bounds(node: Node, g: Graph) -> tuple[str | None, str | None] | None:
    dt = _dtype(g, node.inputs[0])
    lo, hi = node.attr("min"), node.attr("max")
    exprs = []
    for pos, attr_val in ((1, lo), (2, hi)):
        if len(node.inputs) > pos and node.inputs[pos]:
            exprs.append(("ptr", node.inputs[pos]))
        elif attr_val is not None:
            exprs.append(("lit", attr_val))
        else:
            exprs.append(None)
    del dt
    return exprs  # type: ignore[return-value]


def _check_clip(node: Node, g: Graph) -> str | None:
    why = same_layout_flat(node, g, node.inputs[:1])
    if why:
        return why
    dt = _dtype(g, node.inputs[0])
    return None if dt in NUMERIC and _dtype(g, node.outputs[0]) == dt else f"dtype {dt} has no native Clip"


@register("Clip", check=_check_clip, name="eltwise_clip", blocked=True)
def emit_clip(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, y = node.inputs[0], node.outputs[0]
    dt = _dtype(g, x)
    # an absent float bound is ONNX's default, the type's range (Clip() maps +-Inf to +-FLT_MAX)
    defaults = clip_default_bounds(dt) if dt in FLOAT_TYPES else (None, None)
    bounds, decl = [], []
    for i, (b, default) in enumerate(zip(_clip_bounds(node, g), defaults, strict=True)):
        mode, val = b if b else (None, default)
        if mode == "ptr":  # read once: through the pointer, every store to Y could change it (no vectorizing)
            decl.append(f"const __typeof__(*{em.ptr(val)}) B{i} = {em.ptr(val)}[0];\n")
        bounds.append(f"B{i}" if mode == "ptr" else None if val is None else c_literal(val, dt))
    expr = scalar_clamp("X[I0]", *bounds)
    loop = elementwise_loop(g.values[y].shape, [g.values[x].shape],
                            lambda idx, o: f"{bind_loads({'X': f'X[{idx[0]}]'})} Y[{o}] = {expr.replace('X[I0]', 'x_')}; }}")
    em.step(f"const __typeof__(*{em.ptr(x)}) *restrict X = {em.ptr(x)};\n"
            f"__typeof__(*{em.ptr(y)}) *restrict Y = (void *){em.ptr(y)};\n{''.join(decl)}{loop}")


ARITH = {"Add": "+", "Sub": "-", "Mul": "*", "Div": "/"}
COMPARE = {"Equal": "==", "Less": "<", "Greater": ">", "LessOrEqual": "<=", "GreaterOrEqual": ">="}
LOGIC = {"And": "&&", "Or": "||", "Xor": "!="}


BITWISE = {"BitwiseAnd": "&", "BitwiseOr": "|", "BitwiseXor": "^"}


def _zero_divisor(b: str, expr: str) -> str:
    """``expr``, except a zero divisor reports the failure (onnxruntime's error) and gives 0."""
    return f"({b} == 0 ? (SMELT_FAIL(), 0) : {expr})"


def _int_div_expr(op: str, a: str, b: str, dt: str, fmod: int) -> str:
    """Integer Div / Mod without a trapping division: b == 0 fails, b == -1 never divides."""
    t = c_type(dt)
    if op == "Div":
        if dt in SIGNED:  # a / -1 is -a, wrapping at INT_MIN
            return _zero_divisor(b, f"({b} == -1 ? {_wrap(dt, f'0u - U({a})')} : ({t})({a} / {b}))")
        return _zero_divisor(b, f"({t})({a} / {b})")
    if dt not in SIGNED:
        return _zero_divisor(b, f"({t})({a} % {b})")
    rem = f"({b} == -1 ? 0 : {a} % {b})"
    if fmod:
        return _zero_divisor(b, f"({t}){rem}")
    # the remainder takes the divisor's sign: |r| < |b| and opposite signs, so r + b cannot overflow
    return _zero_divisor(b, f"({t})smelt_floor_mod_{dt}({a}, {b})")


FLOOR_MOD_HELPERS = "\n".join(
    f"static inline {c_type(d)} smelt_floor_mod_{d}({c_type(d)} a, {c_type(d)} b) {{ "
    f"{c_type(d)} r = b == -1 ? 0 : ({c_type(d)})(a % b); "
    f"return ((r < 0 && b > 0) || (r > 0 && b < 0)) ? ({c_type(d)})(r + b) : r; }}" for d in SIGNED)


def _float_mod_expr(a: str, b: str, dt: str, fmod: int) -> str:
    f = _fn("fmod", dt)
    if fmod:
        return f"{f}({a}, {b})"
    return f"smelt_floor_mod_{dt}({a}, {b})"


FLOAT_MOD_HELPERS = "\n".join(
    f"static inline {c_type(d)} smelt_floor_mod_{d}({c_type(d)} a, {c_type(d)} b) {{ "
    f"{c_type(d)} r = {_fn('fmod', d)}(a, b); "
    f"if (r != 0) {{ if ((b < 0) != (r < 0)) r += b; }} else r = {_fn('copysign', d)}(0, b); return r; }}"
    for d in FLOAT_TYPES)


def _shift_expr(a: str, b: str, dt: str, left: bool) -> str:
    bits = 8 * np.dtype(dt).itemsize
    t = c_type(dt)
    out = f"{b} >= {bits}" if dt not in SIGNED else f"({b} < 0 || {b} >= {bits})"
    if left:  # in unsigned arithmetic: shifting a negative value left is undefined in C
        return f"({out} ? ({t})0 : {_wrap(dt, f'U({a}) << {b}')})"
    fill = f"({t})({a} < 0 ? -1 : 0)" if dt in SIGNED else f"({t})0"
    return f"({out} ? {fill} : ({t})({a} >> {b}))"  # gcc's >> of a negative value is arithmetic


def bind_loads(loads: dict[str, str]) -> str:
    """Opens a C block binding each operand load to a local (``A[IA]`` -> ``a_``: the key's first
    letter, lower case, and "_"), closed by the caller with "}". An expression that names an
    operand only under a condition (Max's NaN test, Where's arms) would otherwise load it
    conditionally, which gcc does not vectorize (the load might fault); loaded up front, the
    condition is a lane select."""
    return "{ " + " ".join(f"const __typeof__({load}) {key[0].lower()}_ = {load};" for key, load in loads.items())


def _binary_expr(op: str, a: str, b: str, dt: str, attrs: dict | None = None) -> str | None:
    fl = dt in FLOAT_TYPES
    attrs = attrs or {}
    if op == "Mod" and dt in NUMERIC:
        fmod = int(attrs.get("fmod", 0))
        return _float_mod_expr(a, b, dt, fmod) if fl else _int_div_expr(op, a, b, dt, fmod)
    if op == "BitShift" and dt in INT_TYPES:
        return _shift_expr(a, b, dt, attrs.get("direction") == "LEFT")
    if op in BITWISE and dt in INT_TYPES:
        return f"(({c_type(dt)})({a} {BITWISE[op]} {b}))"
    if op in ARITH:
        if dt == "bool":
            return None
        if op == "Div" and not fl:
            return _int_div_expr(op, a, b, dt, 0)
        if not fl:  # wrap around like numpy; signed overflow would be undefined in C
            return _wrap(dt, f"U({a}) {ARITH[op]} U({b})")
        return f"({a} {ARITH[op]} {b})"
    if op in COMPARE and dt in NUMERIC + ("bool",):
        return f"({a} {COMPARE[op]} {b})"
    if op in LOGIC and dt == "bool":
        return f"(({a} != 0) {LOGIC[op]} ({b} != 0))"
    if op in ("Max", "Min") and dt in NUMERIC:
        if fl:  # ONNX propagates NaN; fmax/fmin would drop it
            cmp = ">" if op == "Max" else "<"
            return f"(({a} != {a}) ? {a} : (({b} != {b}) ? {b} : ({a} {cmp} {b} ? {a} : {b})))"
        return f"SMELT_MAX({a}, {b})" if op == "Max" else f"SMELT_MIN({a}, {b})"
    if op == "Pow" and fl:
        return f"{_fn('pow', dt)}({a}, {b})"
    if op == "PRelu" and fl:
        return scalar_binary(op, a, b, dt)
    return None


BINARY_OPS = tuple(ARITH) + tuple(COMPARE) + tuple(LOGIC) + tuple(BITWISE) + ("Max", "Min", "Pow", "PRelu", "Mod",
                                                                             "BitShift")


def _attrs(node: Node) -> dict:
    return {"fmod": node.attr("fmod", 0), "direction": node.attr("direction", "")}


def _broadcast_error(g: Graph, inputs: list[str], out: str) -> str | None:
    """Why the inputs do not broadcast to the output's (inferred) shape, or None."""
    out_shape = g.values[out].shape
    for name in inputs:
        try:
            broadcast_strides(g.values[name].shape, out_shape)
        except ValueError as exc:
            return str(exc)
        if len(g.values[name].shape) > len(out_shape):
            return f"input {name!r} has a higher rank than the output"
    return None


def blocked_channel_operand(node: Node, g: Graph) -> int | None:
    """The index of the input that is one value per channel, [N or 1, C, 1, 1] (an SE block's
    gate, a per-channel scale), when the other input and the output are the same NCHW<b>c value
    shape and layout, C is whole blocks and all are float32; else None. Its C floats per image are
    the blocked layout's lanes in order, so block cb reads floats cb*b .. cb*b + b - 1 of them
    (plain, or blocked in whole blocks of its own: for a 1x1 plane the two are the same bytes;
    a padded last block would put the next image's gate C' > C floats on)."""
    ins = node.present_inputs()
    out = g.values[node.outputs[0]]
    b = layout_block(out.layout) if out.layout != PLAIN else 0
    if len(ins) != 2 or not b or len(out.shape) != 4 or out.shape[1] % b:
        return None
    for k in (0, 1):
        full, chan = g.values[ins[1 - k]], g.values[ins[k]]
        if (full.layout == out.layout and tuple(full.shape) == tuple(out.shape) and len(chan.shape) == 4
                and tuple(chan.shape[1:]) == (out.shape[1], 1, 1) and chan.shape[0] in (1, out.shape[0])
                and (chan.layout == PLAIN or out.shape[1] % layout_block(chan.layout) == 0)
                and all(_dtype(g, n) == "float32" for n in (*ins, node.outputs[0]))):
            return k
    return None


def _check_binary(node: Node, g: Graph) -> str | None:
    ins = node.present_inputs()
    if len(ins) != 2 or len(node.inputs) != 2:
        return f"native {node.op} takes exactly two inputs"
    why = same_layout_flat(node, g, ins)
    if why and blocked_channel_operand(node, g) is None:
        return why + "; or one operand [N, C, 1, 1] of float32 and C whole blocks"
    why = _broadcast_error(g, ins, node.outputs[0])
    if why:
        return why
    da, db = _dtype(g, ins[0]), _dtype(g, ins[1])
    if da != db or not (has_c_type(da) or da == "float16"):
        return f"native {node.op} needs equal native dtypes (given {da}, {db})"
    if node.op == "Pow" and _dtype(g, node.outputs[0]) != da:
        return "mixed-type Pow"
    if _binary_expr(node.op, "a", "b", half.compute_dtype(da), _attrs(node)) is None:
        return f"no native {node.op} for {da}"
    return None


def _small_integer_power(g: Graph, exponent: str) -> int | None:
    """2 or 3 when ``exponent`` is a constant scalar (any rank, one element) equal to it."""
    c = g.values[exponent].const
    if c is None or c.size != 1:
        return None
    e = float(c.reshape(()))
    return int(e) if e in (2.0, 3.0) else None


@register(BINARY_OPS, check=_check_binary, name="eltwise_binary", blocked=True)
def emit_binary(node: Node, g: Graph, em: BlockEmitter) -> None:
    a, b = node.inputs
    y = node.outputs[0]
    dt = _dtype(g, a)
    expr = _binary_expr(node.op, "A[IA]", "B[IB]", half.compute_dtype(dt), _attrs(node))
    if node.op == "Pow" and dt in ("float32", "float64") and (p := _small_integer_power(g, b)) is not None:
        # onnxruntime's Pow takes x*x and x*x*x for a scalar exponent of 2 or 3 (not powf):
        # the same products, and a loop gcc vectorizes
        expr = " * ".join(["A[IA]"] * p)
    if _dtype(g, y) == "float16":  # float16 in, float16 out: computed in float, rounded back
        expr = half.store("float16", expr)
    if dt == "float16":
        half.half_helpers(em)
    if node.op == "Mod":
        em.function("floor_mod", FLOAT_MOD_HELPERS + "\n" + FLOOR_MOD_HELPERS)
    chan = blocked_channel_operand(node, g) if g.values[y].layout != PLAIN else None
    if chan is not None:
        _emit_blocked_channel_binary(node, g, em, expr, chan)
        return
    loop = elementwise_loop(
        g.values[y].shape, [g.values[a].shape, g.values[b].shape],
        lambda idx, o: f"{bind_loads({'A[IA]': half.load(dt, f'A[{idx[0]}]'), 'B[IB]': half.load(dt, f'B[{idx[1]}]')})} "
                       f"Y[{o}] = {expr.replace('A[IA]', 'a_').replace('B[IB]', 'b_')}; }}")
    em.step(f"const __typeof__(*{em.ptr(a)}) *restrict A = {em.ptr(a)};\n"
            f"const __typeof__(*{em.ptr(b)}) *restrict B = {em.ptr(b)};\n"
            f"__typeof__(*{em.ptr(y)}) *restrict Y = (void *){em.ptr(y)};\n{loop}")


def _emit_blocked_channel_binary(node: Node, g: Graph, em: BlockEmitter, expr: str, chan: int) -> None:
    """A binary op of an NCHW<b>c value and one value per channel (``blocked_channel_operand``):
    work items are (image, channel block, run of positions); each loads its block's b channel
    values once and runs the op over the run's vectors (a b-lane inner loop gcc vectorizes)."""
    a, b_in = node.inputs
    y = node.outputs[0]
    n, c, h, w = (int(d) for d in g.values[y].shape)
    blk = layout_block(g.values[y].layout)
    cb, hw = c // blk, h * w
    per_image = g.values[node.inputs[chan]].shape[0] != 1
    run = min(hw, CHANNEL_RUN)
    runs = -(-hw // run)
    items = n * cb * runs
    # A and B as the op names them: the block's channel values (Gc) and the run's floats (Ff)
    loads = {"A[IA]": "Gc[l]", "B[IB]": f"Ff[q * {blk} + l]"} if chan == 0 else \
        {"A[IA]": f"Ff[q * {blk} + l]", "B[IB]": "Gc[l]"}
    body = f"{bind_loads(loads)} Yf[q * {blk} + l] = {expr.replace('A[IA]', 'a_').replace('B[IB]', 'b_')}; }}"
    full_ptr, chan_ptr = (em.ptr(b_in), em.ptr(a)) if chan == 0 else (em.ptr(a), em.ptr(b_in))
    gate = f"(nb / {cb}) * {c} + " if per_image else ""
    em.step("\n".join([
        # F and Y may be one buffer (an in-place step: element for element), so not restrict
        f"const float *F = {full_ptr};",
        f"const float *restrict G = {chan_ptr};",
        f"float *Y = (void *){em.ptr(y)};",
        work_range(items, items * run * blk >= PARALLEL_MIN_ELEMS),
        "for (long it = wb; it < we; ++it) {",
        f"    const long nb = it / {runs}, q0 = (it % {runs}) * {run}, q1 = q0 + {run} < {hw} ? q0 + {run} : {hw};",
        f"    const float *restrict Gc = G + {gate}(nb % {cb}) * {blk};",
        f"    const float *Ff = F + nb * {hw * blk}L;",
        f"    float *Yf = Y + nb * {hw * blk}L;",
        "    for (long q = q0; q < q1; ++q)",
        f"        for (int l = 0; l < {blk}; ++l) {body}",
        "}"]), name="f32_eltwise_channel_nchwc")


def _check_where(node: Node, g: Graph) -> str | None:
    c, a, b = node.inputs
    if _dtype(g, c) != "bool" or _dtype(g, a) != _dtype(g, b) or not has_storage_type(_dtype(g, a)):
        return "native Where needs a bool condition and equal native value dtypes"
    if _dtype(g, node.outputs[0]) != _dtype(g, a):
        return "Where output dtype differs from its inputs'"
    return _broadcast_error(g, [c, a, b], node.outputs[0])


@register("Where", check=_check_where, name="eltwise_where")
def emit_where(node: Node, g: Graph, em: BlockEmitter) -> None:
    c, a, b = node.inputs
    y = node.outputs[0]
    loop = elementwise_loop(
        g.values[y].shape, [g.values[c].shape, g.values[a].shape, g.values[b].shape],
        lambda idx, o: f"{bind_loads({'C': f'C[{idx[0]}]', 'A': f'A[{idx[1]}]', 'B': f'B[{idx[2]}]'})} "
                       f"Y[{o}] = c_ ? a_ : b_; }}")
    em.step(f"const uint8_t *restrict C = {em.ptr(c)};\n"
            f"const __typeof__(*{em.ptr(a)}) *restrict A = {em.ptr(a)};\n"
            f"const __typeof__(*{em.ptr(b)}) *restrict B = {em.ptr(b)};\n"
            f"__typeof__(*{em.ptr(y)}) *restrict Y = (void *){em.ptr(y)};\n{loop}")


VARIADIC = ("Sum", "Mean", "Max", "Min")


def _check_variadic(node: Node, g: Graph) -> str | None:
    ins = node.present_inputs()
    if not ins or len(ins) != len(node.inputs):
        return f"native {node.op} needs its inputs present"
    dts = {_dtype(g, i) for i in ins}
    dt = _dtype(g, ins[0])
    if len(dts) != 1 or not (has_c_type(dt) or dt == "float16") or _dtype(g, node.outputs[0]) != dt:
        return f"native {node.op} needs equal native dtypes (given {sorted(dts)})"
    if half.compute_dtype(dt) not in (FLOAT_TYPES if node.op in ("Sum", "Mean") else NUMERIC):
        return f"no native {node.op} for {dt}"
    return _broadcast_error(g, ins, node.outputs[0])


@register(VARIADIC, check=_check_variadic, name="eltwise_variadic")
def emit_variadic(node: Node, g: Graph, em: BlockEmitter) -> None:
    """Sum / Mean / Max / Min of any number of broadcast inputs, folded left to right as
    onnxruntime does (the two-input Max/Min take ``eltwise_binary`` first)."""
    ins, y = node.inputs, node.outputs[0]
    dt = _dtype(g, ins[0])
    cdt = half.compute_dtype(dt)  # float16: accumulated in float, rounded once, as onnxruntime does
    op = "Add" if node.op in ("Sum", "Mean") else node.op
    if dt == "float16":
        half.half_helpers(em)

    def body(idx: list[str], o: str) -> str:
        lines = [f"{c_type(cdt)} acc = {half.load(dt, f'X0[{idx[0]}]')};"]
        for k in range(1, len(ins)):
            step = _binary_expr(op, "acc", half.load(dt, f"X{k}[{idx[k]}]"), cdt)
            lines.append(f"acc = {step};")
        if node.op == "Mean":
            lines.append(f"acc = acc / {c_literal(len(ins), cdt)};")
        lines.append(f"Y[{o}] = {half.store(dt, 'acc')};")
        return " ".join(lines)

    loop = elementwise_loop(g.values[y].shape, [g.values[i].shape for i in ins], body)
    ptrs = "".join(f"const __typeof__(*{em.ptr(x)}) *restrict X{k} = {em.ptr(x)};\n" for k, x in enumerate(ins))
    em.step(ptrs + f"__typeof__(*{em.ptr(y)}) *restrict Y = (void *){em.ptr(y)};\n{loop}")
