"""Cast / CastLike from a float type (float16, float32, float64) to a signed or narrow integer
type: int8, uint8, int16, uint16, int32, int64.

C leaves a float-to-integer conversion undefined when the value does not fit (or is NaN), which
is why the movement template's Cast refuses it. onnxruntime's answer is x86's truncating
conversion, measured on every position of an array (its vector body and scalar tail agree):
int32 and int64 truncate toward zero, and a value outside the type's range, +-Inf or NaN becomes
the type's minimum ("integer indefinite"); the 8- and 16-bit types convert to int32 that way
first and keep its low bits (300.7 -> uint8 44, -1.5 -> uint8 255, 3e9 -> 0). Spelled out here
with range tests, so the C is defined and the same at every ISA. Not here: uint32 and uint64,
where onnxruntime's out-of-range results differ between its vector body and scalar tail.
"""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import BlockEmitter
from smelt.codegen.kernels import half
from smelt.codegen.kernels.broadcast import elementwise_loop
from smelt.codegen.registry import register
from smelt.ir.graph import PLAIN, Graph, Node
from smelt.ir.types import c_type

SOURCES = ("float16", "float32", "float64")
TARGETS = ("int8", "uint8", "int16", "uint16", "int32", "int64")

HELPERS = """\
static inline int32_t smelt_cvt_i32(double v) {
    return (v > -2147483649.0 && v < 2147483648.0) ? (int32_t)v : INT32_MIN;
}
static inline int64_t smelt_cvt_i64(double v) {
    return (v >= -9223372036854775808.0 && v < 9223372036854775808.0) ? (int64_t)v : INT64_MIN;
}"""


def _dtype(g: Graph, name: str) -> str:
    return np.dtype(g.values[name].dtype).name


def _check(node: Node, g: Graph) -> str | None:
    x, y = node.inputs[0], node.outputs[0]
    src, dst = _dtype(g, x), _dtype(g, y)
    if src not in SOURCES or dst not in TARGETS:
        return "not a float-to-integer cast"
    if g.values[x].size == 0:
        return "empty tensor"
    if g.values[x].layout != PLAIN or g.values[y].layout != PLAIN:
        return "cast_float_int reads plain layouts only"
    return None


def convert_expr(src: str, dst: str, v: str) -> str:
    """C expression of ``v`` (of dtype ``src``) converted to ``dst`` as onnxruntime does."""
    d = f"(double){half.load(src, v)}"
    if dst == "int64":
        return f"smelt_cvt_i64({d})"
    if dst == "int32":
        return f"smelt_cvt_i32({d})"
    # the low bits of the int32 conversion (gcc converts to a narrower signed type modulo 2^n)
    return f"({c_type(dst)})(uint32_t)smelt_cvt_i32({d})"


@register(("Cast", "CastLike"), versions=(6, 9, 13, 15, 19, 21, 23, 24, 25, 28), check=_check,
          name="cast_float_int")
def emit_cast_float_int(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, y = node.inputs[0], node.outputs[0]
    src, dst = _dtype(g, x), _dtype(g, y)
    em.function("float_int_conversions", HELPERS)
    if src == "float16":
        half.half_helpers(em)
    shape = g.values[y].shape
    loop = elementwise_loop(shape, [shape], lambda idx, o: f"Y[{o}] = {convert_expr(src, dst, f'X[{idx[0]}]')};")
    em.step(f"const {c_type(src)} *restrict X = {em.ptr(x)};\n{c_type(dst)} *restrict Y = {em.ptr(y)};\n{loop}",
            name=f"cast_{src}_{dst}", doc=f"Cast {src} -> {dst}, out-of-range values as x86 converts them")
