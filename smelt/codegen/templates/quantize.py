"""Quantize and dequantize templates: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear.

Template ``quantize_linear`` / ``dequantize_linear``: one broadcast loop nest
(``codegen.broadcast``) per node, per-tensor or per-axis scale and zero point (the 1-D operands are
indexed as if shaped ``[1, .., C, .., 1]`` along ``axis``). Integer types int8, uint8, int16,
uint16 (and int32 into DequantizeLinear); fp32 scales and fp32 data. Other element types (int4,
float8, float16 scales) and blocked quantization (``block_size`` > 0) fall back with the reason.

Arithmetic is onnxruntime's, bit for bit (checked against it in tests/kernels/test_quantize.py):
- QuantizeLinear divides (``x / scale``, not a multiply by 1/scale: they differ by one unit at
  about 4% of ties; the vector loop multiplies and divides only vectors near a tie, which gives
  the division's codes: ``int_gemm.quantize_run``), rounds half to even (``nearbyintf`` in the default rounding mode), adds the
  zero point, saturates to the type's range; NaN saturates to the range's low end as onnxruntime's
  does (a float-to-int conversion of NaN would be undefined behaviour in C).
- DequantizeLinear subtracts the zero point in int32, converts, then multiplies by the scale.

Template ``dynamic_quantize_linear``: DynamicQuantizeLinear (uint8 out) in three steps: each share
finds the minimum and maximum of its part; one share combines them into scale and zero point as
ONNX defines them (range widened to include 0; zero point rounded half to even and saturated);
then every share quantizes its part with that scale. NaN is left out of the range (onnxruntime's
range over NaN depends on the vector lane it falls in) and quantizes to 0. Steps, not a barrier inside one, so shares
can still be taken over by another thread.
"""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import BlockEmitter
from smelt.codegen.kernels.broadcast import elementwise_loop
from smelt.codegen.kernels.int_gemm import emit_dynamic_uint8, flush_counters, quantize_run
from smelt.codegen.kernels.isa import VectorIsa, vector_isa
from smelt.codegen.kernels.loops import dtype_name
from smelt.codegen.registry import register
from smelt.ir.graph import PLAIN, Graph, Node
from smelt.ir.types import c_type

QUANT_TYPES = ("int8", "uint8", "int16", "uint16")
DEQUANT_TYPES = QUANT_TYPES + ("int32",)


def _range(dtype: str) -> tuple[int, int]:
    info = np.iinfo(np.dtype(dtype))
    return int(info.min), int(info.max)


def _operand_shape(node: Node, g: Graph, name: str, data_rank: int) -> list[int] | str:
    """The shape a scale or zero point broadcasts as, or why it cannot: a scalar (or one
    element) is per tensor; a 1-D operand is per axis, along the node's ``axis``."""
    shape = list(g.values[name].shape)
    if int(np.prod(shape, dtype=np.int64)) == 1 and len(shape) <= 1:
        return [1] * len(shape) if shape else []
    if len(shape) != 1:
        return f"{name!r} of rank {len(shape)}: only per-tensor and per-axis quantization are native"
    axis = int(node.attr("axis", 1))
    axis = axis + data_rank if axis < 0 else axis
    if not 0 <= axis < data_rank:
        return f"axis {node.attr('axis', 1)} out of range for rank {data_rank}"
    return [1] * axis + shape + [1] * (data_rank - axis - 1)


def _common_reason(node: Node, g: Graph, data: str, out: str) -> str | None:
    names = [n for n in node.inputs[1:] if n]
    if any(g.values[n].layout != PLAIN for n in names):
        return f"{node.op} takes plain scales and zero points"
    if g.values[data].layout != g.values[out].layout:
        return f"{node.op} keeps its data's layout"
    if g.values[data].layout != PLAIN and any(int(np.prod(g.values[n].shape, dtype=np.int64)) != 1 for n in names):
        # per tensor, the op is element by element: any layout, as long as both sides share it
        return f"{node.op} on a blocked layout is per-tensor only"
    if int(node.attr("block_size", 0)) != 0:
        return "blocked quantization (block_size > 0) is not native"
    scale = node.inputs[1]
    if dtype_name(g, scale) != "float32":
        return f"scale of dtype {dtype_name(g, scale)}: native {node.op} takes float32 scales"
    rank = len(g.values[data].shape)
    for name in node.inputs[1:]:
        if name:
            shape = _operand_shape(node, g, name, rank)
            if isinstance(shape, str):
                return shape
    if len(node.inputs) > 2 and node.inputs[2] and (
            _operand_shape(node, g, node.inputs[2], rank) != _operand_shape(node, g, scale, rank)):
        return "zero point and scale have different shapes"
    return None


def _check_quantize(node: Node, g: Graph) -> str | None:
    x, y = node.inputs[0], node.outputs[0]
    if dtype_name(g, x) != "float32":
        return f"input of dtype {dtype_name(g, x)}: native QuantizeLinear takes float32"
    if dtype_name(g, y) not in QUANT_TYPES:
        return f"output dtype {dtype_name(g, y)} is not native (native: {', '.join(QUANT_TYPES)})"
    if int(node.attr("precision", 0)) not in (0, 1):  # 1 = FLOAT: the computation is fp32 anyway
        return "a precision other than float32 is not native"
    return _common_reason(node, g, x, y)


def _check_dequantize(node: Node, g: Graph) -> str | None:
    x, y = node.inputs[0], node.outputs[0]
    if dtype_name(g, x) not in DEQUANT_TYPES:
        return f"input dtype {dtype_name(g, x)} is not native (native: {', '.join(DEQUANT_TYPES)})"
    if dtype_name(g, y) != "float32":
        return f"output dtype {dtype_name(g, y)}: native DequantizeLinear writes float32"
    return _common_reason(node, g, x, y)


def _operands(node: Node, g: Graph) -> tuple[list[list[int]], str, str]:
    """Broadcast shapes of (x, scale[, zero point]) and the C reads of scale and zero point."""
    x = node.inputs[0]
    rank = len(g.values[x].shape)
    shapes = [list(g.values[x].shape), _operand_shape(node, g, node.inputs[1], rank)]
    has_zp = len(node.inputs) > 2 and bool(node.inputs[2])
    if has_zp:
        shapes.append(_operand_shape(node, g, node.inputs[2], rank))
    return shapes, "S[{1}]", "(int32_t)Z[{2}]" if has_zp else "0"  # type: ignore[return-value]


# the 8-bit types a whole-buffer loop takes: (C type, the ISA's narrowing store, its widening load)
FLAT_TYPES = {"uint8": ("uint8_t", "i32_store_u8", "u8_to_i32"), "int8": ("int8_t", "i32_store_i8", "i8_to_i32")}


def _flat_isa(node: Node, g: Graph, em: BlockEmitter, data: str, codes: str) -> VectorIsa | None:
    """The vector ISA for a whole-buffer loop over 8-bit ``codes`` per tensor (plain layouts, one
    scale and zero point, the ISA's rounding, narrowing and widening forms), else None: the
    broadcast loop. Not in a build that counts clamps (the numeric debug: the scalar statements
    count them)."""
    v = vector_isa(em.target)
    kind = FLAT_TYPES.get(dtype_name(g, codes) or "")
    if (kind is None or not v.vector or not all(v.has(f) for f in ("f32_round_even", "i32_sub", *kind[1:]))
            or em.count_saturation or any(g.values[n].layout != PLAIN for n in (data, codes))):
        return None
    if any(n and int(np.prod(g.values[n].shape, dtype=np.int64)) != 1 for n in node.inputs[1:3]):
        return None
    return v


def _emit_quantize_flat(node: Node, g: Graph, em: BlockEmitter, v: VectorIsa) -> None:
    """QuantizeLinear to 8 bits per tensor a vector at a time (``int_gemm.quantize_run``, as
    DynamicQuantizeLinear quantizes): gcc's vectorization of the broadcast loop ran at ~2
    elements a ns; a QDQ transformer has one per activation (smart-turn: 41)."""
    x, s, y = node.inputs[0], node.inputs[1], node.outputs[0]
    zp = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else ""
    ct = FLAT_TYPES[dtype_name(g, y)][0]
    n = int(np.prod(g.values[x].shape, dtype=np.int64))
    lines = [f"const float *restrict X = {em.ptr(x)};", f"{ct} *restrict Y = (void *){em.ptr(y)};",
             f"const float s = ({em.ptr(s)})[0], z = {f'(float)({em.ptr(zp)})[0]' if zp else '0.0f'};",
             f"long i, e; smelt_range({n}, tid, nt, &i, &e);", *quantize_run(v, "X", "Y", dtype_name(g, y))]
    em.step("\n".join(lines), name=f"quantize_linear_{dtype_name(g, y)}",
            doc=f"QuantizeLinear to {dtype_name(g, y)} per tensor, {n} values")


def _emit_dequantize_flat(node: Node, g: Graph, em: BlockEmitter, v: VectorIsa) -> None:
    """DequantizeLinear of 8 bits per tensor a vector at a time: ``(float)(q - z) * s`` in every
    lane, as the scalar statement (the difference in int32, converted, then multiplied)."""
    x, s, y = node.inputs[0], node.inputs[1], node.outputs[0]
    zp = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else ""
    ct, _, widen = FLAT_TYPES[dtype_name(g, x)]
    n, lanes = int(np.prod(g.values[x].shape, dtype=np.int64)), v.lanes
    diff = v.x("i32_sub", a=v.x(widen, p="X + i"), b="zv")
    lines = [f"const {ct} *restrict X = {em.ptr(x)};", f"float *restrict Y = (void *){em.ptr(y)};",
             f"const float s = ({em.ptr(s)})[0]; const int32_t z = {f'(int32_t)({em.ptr(zp)})[0]' if zp else '0'};",
             f"const {v.t} sv = {v.set1('s')}; const {v.x('itype')} zv = {v.x('i32_set1', a='z')};",
             f"long i, e; smelt_range({n}, tid, nt, &i, &e);",
             f"for (; i + {lanes} <= e; i += {lanes}) {v.storeu('Y + i', v.op('mul', v.x('i32_to_f32', a=diff), 'sv'))};",
             "for (; i < e; ++i) Y[i] = (float)((int32_t)X[i] - z) * s;"]
    em.step("\n".join(lines), name=f"dequantize_linear_{dtype_name(g, x)}",
            doc=f"DequantizeLinear of {dtype_name(g, x)} per tensor, {n} values")


@register("QuantizeLinear", check=_check_quantize, name="quantize_linear", blocked=True)
def emit_quantize(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, s, y = node.inputs[0], node.inputs[1], node.outputs[0]
    v = _flat_isa(node, g, em, x, y)
    if v is not None:
        _emit_quantize_flat(node, g, em, v)
        return
    lo, hi = _range(dtype_name(g, y))
    shapes, scale, zp = _operands(node, g)

    def body(idx: list[str], o: str) -> str:
        z = zp.format(*idx)
        return (f"{{ float v = nearbyintf(X[{idx[0]}] / {scale.format(*idx)}) + (float){z};\n"
                f"          nlo += !(v >= {lo}.0f); nhi += v > {hi}.0f;  /* the numeric debug counters */\n"
                f"          if (!(v >= {lo}.0f)) v = {lo}.0f;  /* NaN saturates low, as in onnxruntime */\n"
                f"          if (v > {hi}.0f) v = {hi}.0f;\n"
                f"          Y[{o}] = ({c_type(dtype_name(g, y))})v; }}")

    decl = f"const float *restrict X = {em.ptr(x)};\nconst float *restrict S = {em.ptr(s)};\n"
    if len(node.inputs) > 2 and node.inputs[2]:
        decl += f"const {c_type(dtype_name(g, node.inputs[2]))} *restrict Z = {em.ptr(node.inputs[2])};\n"
    loop = elementwise_loop(g.values[y].shape, shapes, body)
    counter = em.saturation_counter(y)
    em.step(f"{decl}{c_type(dtype_name(g, y))} *restrict Y = (void *){em.ptr(y)};\nlong nlo = 0, nhi = 0;\n{loop}\n"
            f"{flush_counters(counter)}")


@register("DequantizeLinear", check=_check_dequantize, name="dequantize_linear", blocked=True)
def emit_dequantize(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, s, y = node.inputs[0], node.inputs[1], node.outputs[0]
    v = _flat_isa(node, g, em, y, x)
    if v is not None:
        _emit_dequantize_flat(node, g, em, v)
        return
    shapes, scale, zp = _operands(node, g)
    xt = c_type(dtype_name(g, x))

    def body(idx: list[str], o: str) -> str:
        # int32 input: x - zp as onnxruntime computes it (in int32; its zero point must be 0)
        diff = f"((int32_t)X[{idx[0]}] - {zp.format(*idx)})" if zp != "0" else f"(int32_t)X[{idx[0]}]"
        return f"Y[{o}] = (float){diff} * {scale.format(*idx)};"

    decl = f"const {xt} *restrict X = {em.ptr(x)};\nconst float *restrict S = {em.ptr(s)};\n"
    if len(node.inputs) > 2 and node.inputs[2]:
        decl += f"const {xt} *restrict Z = {em.ptr(node.inputs[2])};\n"
    loop = elementwise_loop(g.values[y].shape, shapes, body)
    em.step(f"{decl}float *restrict Y = (void *){em.ptr(y)};\n{loop}")


def _check_dynamic(node: Node, g: Graph) -> str | None:
    names = [n for n in node.inputs + node.outputs if n]
    if any(g.values[n].layout != PLAIN for n in names):
        return "DynamicQuantizeLinear reads plain layouts only"
    if dtype_name(g, node.inputs[0]) != "float32":
        return "DynamicQuantizeLinear takes float32"
    return None


@register("DynamicQuantizeLinear", check=_check_dynamic, name="dynamic_quantize_linear")
def emit_dynamic_quantize(node: Node, g: Graph, em: BlockEmitter) -> None:
    x = node.inputs[0]
    y, ys, yz = (node.outputs + ["", "", ""])[:3]
    n = int(np.prod(g.values[x].shape, dtype=np.int64))
    sc = emit_dynamic_uint8(em, em.ptr(x), n, em.ptr(y) if y else None, "dynamic_quantize_linear")
    tail = ""
    if ys:
        tail += f"{em.ptr(ys)}[0] = SC[0];\n"
    if yz:
        tail += f"{em.ptr(yz)}[0] = (uint8_t)SC[1];\n"
    if tail:
        em.step(f"const float *SC = {sc};\nif (tid == 0) {{\n{tail}}}", name="dynamic_quantize_linear_params")
