"""Pow with integer or mixed operand types (the element-wise template runs float^float of one type).

ONNX's Pow takes the base type T (float16, float, double, int32, int64) and any numeric exponent
type T1; the output has the base's type. onnxruntime (CPU, T and T1 in float/double/int32/int64)
computes ``static_cast<T>(std::pow(x, y))``: C++'s overloads make that ``powf`` when both are
float and the double ``pow`` otherwise, so an int base or exponent is computed in double and
converted. The same here, with two details of onnxruntime's kernel kept:

- a single-element exponent equal to 2 or 3 is computed as ``x * x`` (``x * x * x``) in the
  base's type (onnxruntime's fast path); integers multiply modulo 2^n, as that path wraps;
- a double result outside the integer type's range (or NaN, e.g. 0^-1 = Inf) converts to the
  type's minimum, which is what x86's truncating conversion gives onnxruntime; C would leave it
  undefined, so the conversion is spelled out.
"""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import BlockEmitter
from smelt.codegen.kernels.broadcast import broadcast_strides, elementwise_loop
from smelt.codegen.registry import register
from smelt.ir.graph import PLAIN, Graph, Node
from smelt.ir.types import c_type

BASES = ("float32", "float64", "int32", "int64")
EXPONENTS = ("float32", "float64", "int32", "int64")
_INT_RANGE = {"int32": ("-2147483649.0", "2147483648.0", "INT32_MIN"),
              "int64": ("-9223372036854775808.0", "9223372036854775808.0", "INT64_MIN")}


def _dtype(g: Graph, name: str) -> str:
    return np.dtype(g.values[name].dtype).name


def _check(node: Node, g: Graph) -> str | None:
    x, e = node.inputs
    y = node.outputs[0]
    dx, de = _dtype(g, x), _dtype(g, e)
    if dx not in BASES or de not in EXPONENTS or _dtype(g, y) != dx:
        return f"native Pow takes {BASES} bases and {EXPONENTS} exponents (given {dx}, {de})"
    if dx == de and dx.startswith("float"):
        return "float Pow of one type is the element-wise template's"
    if any(g.values[n].layout != PLAIN for n in (x, e, y)):
        return "mixed-type Pow reads plain layouts only"
    out_shape = g.values[y].shape
    for n in (x, e):
        try:
            broadcast_strides(g.values[n].shape, out_shape)
        except ValueError as exc:
            return str(exc)
        if len(g.values[n].shape) > len(out_shape):
            return f"input {n!r} has a higher rank than the output"
    return None


def _helpers(dx: str) -> str:
    """``smelt_pow_to_<T>(double)``: the conversion of the double result to the base type."""
    if dx not in _INT_RANGE:
        return ""
    lo, hi, low = _INT_RANGE[dx]
    t = c_type(dx)
    return (f"static inline {t} smelt_pow_to_{dx}(double d) {{\n"
            f"    return (d > {lo} && d < {hi}) ? ({t})d : {low};\n}}")


def _square_expr(dx: str, x: str, cube: bool) -> str:
    if dx.startswith("float"):
        return f"({x} * {x} * {x})" if cube else f"({x} * {x})"
    u = "uint64_t" if dx == "int64" else "uint32_t"
    prod = f"({u}){x} * ({u}){x}" + (f" * ({u}){x}" if cube else "")
    return f"(({c_type(dx)})({prod}))"


@register("Pow", check=_check, name="pow_mixed")
def emit_pow_mixed(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, e = node.inputs
    y = node.outputs[0]
    dx, de = _dtype(g, x), _dtype(g, e)
    if dx in _INT_RANGE:
        em.function(f"pow_to_{dx}", _helpers(dx))
    # std::pow of two different types (or two integers) is the double pow
    general = "pow((double)X[IX], (double)E[IE])"
    if dx in _INT_RANGE:
        general = f"smelt_pow_to_{dx}({general})"
    elif dx == "float32":
        general = f"(float){general}"
    # onnxruntime's fast path: a broadcast single exponent of 2 or 3 over a base of several elements
    single = (int(np.prod(g.values[e].shape, dtype=np.int64)) == 1
              and int(np.prod(g.values[x].shape, dtype=np.int64)) > 1)
    if single:
        expr = (f"(e0 == 2 ? {_square_expr(dx, 'X[IX]', False)} : "
                f"e0 == 3 ? {_square_expr(dx, 'X[IX]', True)} : {general})")
    else:
        expr = general
    loop = elementwise_loop(
        g.values[y].shape, [g.values[x].shape, g.values[e].shape],
        lambda idx, o: f"Y[{o}] = {expr.replace('X[IX]', f'X[{idx[0]}]').replace('E[IE]', f'E[{idx[1]}]')};")
    head = [f"const {c_type(dx)} *restrict X = {em.ptr(x)};",
            f"const {c_type(de)} *restrict E = {em.ptr(e)};",
            f"{c_type(dx)} *restrict Y = {em.ptr(y)};"]
    if single:
        head.append(f"const {c_type(de)} e0 = E[0];")
    em.step("\n".join(head) + "\n" + loop, name=f"pow_{dx}_{de}",
            doc="Pow with an integer or mixed-type operand, as onnxruntime's std::pow")
