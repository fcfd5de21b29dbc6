"""onnxruntime's quantized element-wise ops (``com.microsoft``): QLinearAdd, QLinearMul,
QLinearSigmoid, QLinearLeakyRelu, QLinearGlobalAveragePool, QLinearAveragePool, QLinearConcat,
and QLinearSoftmax (the one not bit for bit: within one code, ``emit_qlinear_softmax``).

Each answers what onnxruntime's CPU kernels answer, bit for bit (tests/kernels/test_qlinear_ops.py
compares for equality). The arithmetic was read from MLAS and pinned down against onnxruntime
1.32 on an x86-64 host with AVX2 (where its AVX2 kernels run):

- QLinearAdd: MLAS's AVX2 kernel works in float on the raw 8-bit values, with the zero points
  folded into one constant: ``r_a = s_a / s_c``, ``r_b = s_b / s_c``,
  ``fixed = z_c - fma(r_a, z_a, r_b * z_b)``, then per element ``fma(a, r_a, fma(b, r_b, fixed))``
  rounded half to even and saturated. Where one operand is one value per inner run (a broadcast
  along the last axis, or a scalar) that value is folded into the constant first, with a multiply
  and an add (not fused): ``fma(x, r_x, fixed + y * r_y)``. The float path is onnxruntime's
  choice, not the exact rational ``(s_a (a - z_a) + s_b (b - z_b)) / s_c``; on hosts without AVX2
  onnxruntime's SSE2 kernel rounds without the fma and can differ from it (and from smelt) by one
  unit. smelt renders the AVX2 formula on every ISA (``fmaf`` is exact everywhere; without FMA
  hardware it is a libm call).
- QLinearMul: ``(a - z_a) (b - z_b)`` exact in int32, times ``s_a s_b / s_c`` (float, rounded
  once each), plus ``z_c``, rounded half to even, saturated. Multiply and add are not fused.
- QLinearSigmoid / QLinearLeakyRelu / QLinearConcat (inputs whose scale or zero point differ
  from the output's), and smelt's own ``ai.smelt`` QLinearClip (``lower_qdq``'s DQ -> Clip/Relu
  -> Q): a 256-entry table built at compile time from the constant scales, as
  onnxruntime builds its own: dequantize every code (``s * (q - z)``), apply the function (the
  logistic is MLAS's rational approximation with its FMA kernel's operation order; LeakyRelu is
  ``x >= 0 ? x : x * alpha``), quantize (``y / s``, half to even, saturated). The run time is one
  byte lookup per element.
- QLinearGlobalAveragePool: the int32 sum of each channel, minus ``z_x * HW``, times
  ``s_x / (s_y * HW)``, half to even, plus ``z_y``, saturated (MLAS's requantization).
- QLinearAveragePool (1-D and 2-D, explicit pads, floor mode): onnxruntime's own loop in float:
  each window's dequantized values summed in row-major order, divided by the count, then
  ``nearbyintf(v / s_y + z_y)`` (the zero point added before the rounding, unlike
  QuantizeLinear); a window over the whole unpadded image is the global pool, as there.

Scales and zero points must be constant (what onnxruntime's quantizer and ``lower_qdq`` write):
they become literals and tables. Float steps of QLinearAdd/QLinearMul are compiled with
``-ffp-contract=off`` for that function, so gcc fuses only where the formula says ``fmaf``.

QLinearAdd/Mul/Sigmoid/LeakyRelu index their operands flat when every operand has the output's
shape, so they run on any layout their operands share (``registry.same_layout_flat``): between
blocked int8 convolutions as well as on plain tensors.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np

from smelt.codegen.emitter import BlockEmitter, c_float_exact
from smelt.codegen.kernels.broadcast import elementwise_loop
from smelt.codegen.kernels.int_gemm import SATURATION_COUNTERS, flush_counters
from smelt.codegen.kernels.loops import dtype_name, wide_vectors, work_range
from smelt.codegen.registry import register, same_layout_flat
from smelt.ir.graph import PLAIN, Graph, Node
from smelt.ir.types import c_type

MS = "com.microsoft"
EIGHT_BIT = ("int8", "uint8")
F32 = np.float32
NO_CONTRACT = '__attribute__((optimize("fp-contract=off")))'
PARALLEL_MIN = 1 << 15  # elements below which one thread does the whole op


flit = c_float_exact  # the C literal of a float32, exact


def _const_scalar(g: Graph, name: str) -> np.ndarray | None:
    if not name:
        return None
    v = g.values.get(name)
    if v is None or v.const is None or v.const.size != 1:
        return None
    return v.const.reshape(())


def _params(node: Node, g: Graph, pairs: list[tuple[int, int]]) -> list[tuple[np.float32, int]] | str:
    """(scale, zero point) of each (scale input, zero point input) index pair; constants
    required. An absent zero point is 0."""
    out = []
    ins = list(node.inputs) + [""] * 16
    for si, zi in pairs:
        s = _const_scalar(g, ins[si])
        if s is None or dtype_name(g, ins[si]) != "float32":
            return f"{node.op}: scale {ins[si]!r} is not a constant float32 scalar"
        z = 0
        if ins[zi]:
            zc = _const_scalar(g, ins[zi])
            if zc is None:
                return f"{node.op}: zero point {ins[zi]!r} is not a constant scalar"
            z = int(zc)
        out.append((F32(s), z))
    return out


def _range(dtype: str) -> tuple[int, int]:
    info = np.iinfo(np.dtype(dtype))
    return int(info.min), int(info.max)


def _typed(node: Node, g: Graph, data: list[str]) -> str | None:
    dt = dtype_name(g, node.outputs[0])
    if dt not in EIGHT_BIT:
        return f"{node.op} of {dt}: native only for int8/uint8"
    for n in data:
        if dtype_name(g, n) != dt:
            return f"{node.op}: {n!r} is {dtype_name(g, n)}, output {dt}"
    return None


def _store(value: str, dtype: str, dest: str, counters: tuple[str, str] = ("nlo", "nhi")) -> str:
    """``value`` (a float already rounded to an integer) saturated into ``dest``, each clamp
    counted (in ``counters``) for the numeric debug report. NaN saturates low, as in QuantizeLinear
    and onnxruntime's vector kernels (a NaN term from an infinite scale: its conversion's integer
    indefinite packs to the low end); a bare conversion of NaN is undefined in C."""
    lo, hi = _range(dtype)
    return (f"{{ float v = {value}; {counters[0]} += !(v >= {lo}.0f); {counters[1]} += v > {hi}.0f;"
            f" v = !(v >= {lo}.0f) ? {lo}.0f : (v > {hi}.0f ? {hi}.0f : v); {dest} = ({c_type(dtype)})v; }}")


# -- QLinearAdd / QLinearMul ----------------------------------------------------------------------
def _check_binary(node: Node, g: Graph) -> str | None:
    a, b = node.inputs[0], node.inputs[3]
    why = _typed(node, g, [a, b])
    if why:
        return why
    if len(node.inputs) < 7 or not node.inputs[6]:
        return f"{node.op} without C_scale"
    params = _params(node, g, [(1, 2), (4, 5), (6, 7)])
    if isinstance(params, str):
        return params
    return same_layout_flat(node, g, [a, b])


def add_constants(sa: float, za: int, sb: float, zb: int, sc: float, zc: int) -> tuple[np.float32, np.float32, np.float32]:
    """(r_a, r_b, fixed) of MLAS's AVX2 QLinearAdd: the scale ratios and the zero points folded
    into one float (``z_c - fma(r_a, z_a, r_b * z_b)``; the fma evaluated exactly in double:
    its product is exact there and the sum is rounded once to float). Infinite scales give
    infinite or NaN terms, as they do in onnxruntime (no warning: they are the model's)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ra, rb = F32(F32(sa) / F32(sc)), F32(F32(sb) / F32(sc))
        inner = F32(np.float64(ra) * np.float64(za) + np.float64(F32(rb * F32(zb))))
        return ra, rb, F32(F32(zc) - inner)


def _index_is_run(idx: str) -> bool:
    """Whether an operand index moves with the inner loop variable ``i`` (``elementwise_loop``
    renders a moving operand's index as ``o<k> + i * <stride>``, one fixed over the run as
    ``o<k>``; the flat loop's is ``i``)."""
    return re.search(r"\bi\b", idx) is not None


@register("QLinearAdd", check=_check_binary, name="qlinear_add", domain=MS, blocked=True)
def emit_qlinear_add(node: Node, g: Graph, em: BlockEmitter) -> None:
    _emit_binary(node, g, em, add=True)


@register("QLinearMul", check=_check_binary, name="qlinear_mul", domain=MS, blocked=True)
def emit_qlinear_mul(node: Node, g: Graph, em: BlockEmitter) -> None:
    _emit_binary(node, g, em, add=False)


def _emit_binary(node: Node, g: Graph, em: BlockEmitter, add: bool) -> None:
    a, b, y = node.inputs[0], node.inputs[3], node.outputs[0]
    (sa, za), (sb, zb), (sc, zc) = _params(node, g, [(1, 2), (4, 5), (6, 7)])  # type: ignore[misc]
    dt = dtype_name(g, y)
    ct = c_type(dt)
    shape_a, shape_b = list(g.values[a].shape), list(g.values[b].shape)
    scalar_a = int(np.prod(shape_a, dtype=np.int64)) == 1
    scalar_b = int(np.prod(shape_b, dtype=np.int64)) == 1
    if add:
        ra, rb, fixed = add_constants(sa, za, sb, zb, sc, zc)

        def body(idx: list[str], o: str, cnt: tuple[str, str] = ("nlo", "nhi")) -> str:
            ax, bx = f"(float)A[{idx[0]}]", f"(float)B[{idx[1]}]"
            run_a, run_b = _index_is_run(idx[0]) and not scalar_a, _index_is_run(idx[1]) and not scalar_b
            if run_a and not run_b:  # B one value per run: folded into the constant (mul, add)
                t = f"fmaf({ax}, {flit(ra)}, {flit(fixed)} + {bx} * {flit(rb)})"
            elif run_b and not run_a:
                t = f"fmaf({bx}, {flit(rb)}, {flit(fixed)} + {ax} * {flit(ra)})"
            else:
                t = f"fmaf({ax}, {flit(ra)}, fmaf({bx}, {flit(rb)}, {flit(fixed)}))"
            return _store(f"nearbyintf({t})", dt, f"Y[{o}]", cnt)
        formula = "fma(a, s_a/s_c, fma(b, s_b/s_c, fixed))"
    else:
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # (infinite scales: the model's)
            ratio = F32(F32(sa * sb) / sc)

        def body(idx: list[str], o: str, cnt: tuple[str, str] = ("nlo", "nhi")) -> str:
            p = f"(float)(((int32_t)A[{idx[0]}] - {za}) * ((int32_t)B[{idx[1]}] - {zb}))"
            return _store(f"nearbyintf({p} * {flit(ratio)} + {float(zc)!r}f)", dt, f"Y[{o}]", cnt)
        formula = "(a - z_a)(b - z_b) * (s_a s_b / s_c) + z_c"
    out_shape = list(g.values[y].shape)
    if g.values[y].layout != PLAIN:  # same shapes in one layout (check): flat over the stored elements
        total = int(np.prod(out_shape, dtype=np.int64))
        out_shape = [total]
        shape_a = [1] if scalar_a else out_shape  # a constant scalar joins in any layout
        shape_b = [1] if scalar_b else out_shape
    if shape_a == shape_b == out_shape:
        loop = _flat_loop(int(np.prod(out_shape, dtype=np.int64)), body)
    else:
        loop = elementwise_loop(out_shape, [shape_a, shape_b], body)
    em.schedule(algorithm=f"{'QLinearAdd' if add else 'QLinearMul'} in float as MLAS: {formula}",
                kernel="qlinear_binary", layout=g.values[y].layout)
    em.step("\n".join([
        f"const {ct} *restrict A = {em.ptr(a)};",
        f"const {ct} *restrict B = {em.ptr(b)};",
        f"{ct} *restrict Y = (void *){em.ptr(y)};",
        SATURATION_COUNTERS,
        loop,
        flush_counters(em.saturation_counter(y))]),
        name=f"qlinear_{'add' if add else 'mul'}", attributes=f"{NO_CONTRACT} {wide_vectors(em)}".strip())


FLAT_CHUNK = 1 << 20  # elements per int32 clamp count (flushed to the 64-bit counters after)


def _flat_loop(n: int, body: Callable[..., str]) -> str:
    """Same-shape operands: one flat loop, its clamp counts in int32 per chunk (64-bit counts
    per element cost gcc's vector loop a widening per add: 2.5x slower, measured)."""
    return "\n".join([
        work_range(n, n >= PARALLEL_MIN),
        f"for (long c0 = wb; c0 < we; c0 += {FLAT_CHUNK}) {{",
        f"    const long c1 = SMELT_MIN(c0 + {FLAT_CHUNK}, we);",
        "    int clo = 0, chi = 0;",
        "    for (long i = c0; i < c1; ++i) " + body(["i", "i"], "i", ("clo", "chi")),
        "    nlo += clo; nhi += chi;",
        "}"])


# -- lookup tables: QLinearSigmoid, QLinearLeakyRelu, QLinearConcat ----------------------------
LOGISTIC = [F32(c) for c in (
    -18.0, 18.0,  # input range
    4.37031012579801e-11, 1.15627324459942e-07, 6.08574864600143e-05, 8.51377133304701e-03,
    2.48287947061529e-01,  # alpha_9 .. alpha_1
    6.10247389755681e-13, 5.76102136993427e-09, 6.29106785017040e-06, 1.70198817374094e-03,
    1.16817656904453e-01, 9.93151921023180e-01)]  # beta_10 .. beta_0 (MLAS's, from Eigen)


def _fma(a: np.ndarray, b: np.ndarray | np.floating, c: np.ndarray | np.floating) -> np.ndarray:
    """float32 fma: the product is exact in double, the sum rounded there then to float (the
    double rounding can differ from one rounding only at a float tie, which these tables never
    showed against onnxruntime)."""
    return (np.float64(a) * np.float64(b) + np.float64(c)).astype(F32)


def mlas_logistic(x: np.ndarray) -> np.ndarray:
    """MLAS's logistic in its FMA3 kernel's operation order: clamp to [-18, 18], odd rational
    p(x) / q(x) + 1/2, clamped below at 0."""
    x = np.minimum(np.maximum(x.astype(F32), LOGISTIC[0]), LOGISTIC[1])
    x2 = (x * x).astype(F32)
    p = _fma(x2, LOGISTIC[2], LOGISTIC[3])
    for c in LOGISTIC[4:7]:
        p = _fma(x2, p, c)
    p = (x * p).astype(F32)
    q = _fma(x2, LOGISTIC[7], LOGISTIC[8])
    for c in LOGISTIC[9:13]:
        q = _fma(x2, q, c)
    return np.maximum((p / q).astype(F32) + F32(0.5), F32(0)).astype(F32)


def lookup_table(dtype: str, xs: np.float32, xz: int, ys: np.float32, yz: int,
                 fn: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """The 256 outputs, indexed by the input's byte: quantize(fn(x_scale * (q - x_zero)))."""
    codes = np.arange(256, dtype=np.uint8).view(np.dtype(dtype)).astype(np.int64)
    x = (F32(xs) * (codes - xz).astype(F32)).astype(F32)
    y = np.asarray(fn(x), dtype=F32)
    lo, hi = _range(dtype)
    q = np.rint((y / F32(ys)).astype(F32)).astype(np.float64) + yz
    q = np.where(np.isnan(q), lo, q)
    return np.clip(q, lo, hi).astype(np.dtype(dtype))


def _check_unary(node: Node, g: Graph) -> str | None:
    why = _typed(node, g, [node.inputs[0]])
    if why:
        return why
    params = _params(node, g, [(1, 2), (3, 4)])
    if isinstance(params, str):
        return params
    return same_layout_flat(node, g, [node.inputs[0]])


def _unary_fn(node: Node) -> Callable[[np.ndarray], np.ndarray]:
    if node.op == "QLinearSigmoid":
        return mlas_logistic
    if node.op == "QLinearClip":  # smelt's (passes/lower_qdq.py): DQ -> Clip/Relu -> Q
        lo, hi = F32(node.attr("min", -np.inf)), F32(node.attr("max", np.inf))
        return lambda x: np.minimum(np.maximum(x, lo), hi).astype(F32)
    alpha = F32(node.attr("alpha", 0.01))
    return lambda x: np.where(x >= 0, x, (x * alpha).astype(F32)).astype(F32)


@register("QLinearClip", check=_check_unary, name="qlinear_clip", domain="ai.smelt", blocked=True)
@register(("QLinearSigmoid", "QLinearLeakyRelu"), check=_check_unary, name="qlinear_lookup", domain=MS,
          blocked=True)
def emit_qlinear_lookup(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, y = node.inputs[0], node.outputs[0]
    (xs, xz), (ys, yz) = _params(node, g, [(1, 2), (3, 4)])  # type: ignore[misc]
    dt = dtype_name(g, y)
    table = lookup_table(dt, xs, xz, ys, yz, _unary_fn(node))
    n = int(np.prod(g.values[y].shape, dtype=np.int64))
    ct = c_type(dt)
    em.schedule(algorithm=f"{node.op} as a 256-entry table built at compile time", kernel="qlinear_lookup",
                layout=g.values[y].layout)
    em.step("\n".join([
        f"const uint8_t *restrict X = (const void *){em.ptr(x)};",
        f"const {ct} *restrict T = {em.weight(table)};",
        f"{ct} *restrict Y = (void *){em.ptr(y)};",
        work_range(n, n >= PARALLEL_MIN),
        "for (long i = wb; i < we; ++i) Y[i] = T[X[i]];"]), name="qlinear_lookup")


# -- QLinearConcat --------------------------------------------------------------------------------
def _concat_inputs(node: Node) -> list[tuple[int, int, int]]:
    """(tensor, scale, zero point) input indices of each concatenated input."""
    return [(i, i + 1, i + 2) for i in range(2, len(node.inputs), 3)]


def _check_concat(node: Node, g: Graph) -> str | None:
    if any(g.values[n].layout != PLAIN for n in node.present_inputs() + node.outputs):
        return "QLinearConcat reads plain layouts only"
    triples = _concat_inputs(node)
    if not triples or len(node.inputs) != 2 + 3 * len(triples):
        return "QLinearConcat needs (tensor, scale, zero point) triples"
    why = _typed(node, g, [node.inputs[t] for t, _, _ in triples])
    if why:
        return why
    params = _params(node, g, [(0, 1)] + [(s, z) for _, s, z in triples])
    return params if isinstance(params, str) else None


@register("QLinearConcat", check=_check_concat, name="qlinear_concat", domain=MS)
def emit_qlinear_concat(node: Node, g: Graph, em: BlockEmitter) -> None:
    y = node.outputs[0]
    triples = _concat_inputs(node)
    params = _params(node, g, [(0, 1)] + [(s, z) for _, s, z in triples])
    (ys, yz), ins = params[0], params[1:]  # type: ignore[index]
    dt = dtype_name(g, y)
    ct = c_type(dt)
    shape = list(g.values[y].shape)
    axis = int(node.attr("axis", 0)) % len(shape)
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
    row = shape[axis] * inner
    lines = [f"{ct} *restrict Y = (void *){em.ptr(y)};",
             work_range(outer, outer * row >= PARALLEL_MIN, "ob", "oe")]
    off = 0
    for k, ((t, _, _), (xs, xz)) in enumerate(zip(triples, ins, strict=True)):
        width = int(g.values[node.inputs[t]].shape[axis]) * inner
        src = f"(const uint8_t *){em.ptr(node.inputs[t])}"
        if (xs, xz) == (ys, yz):  # same quantization: the bytes as they are
            lines.append(f"for (long r = ob; r < oe; ++r) memcpy(Y + r * {row} + {off}, {src} + r * {width}, {width});")
        else:
            table = lookup_table(dt, xs, xz, ys, yz, lambda x: x)
            lines += [f"{{ const {ct} *restrict T{k} = {em.weight(table)}; const uint8_t *restrict X{k} = {src};",
                      f"  for (long r = ob; r < oe; ++r) for (long i = 0; i < {width}; ++i)"
                      f" Y[r * {row} + {off} + i] = T{k}[X{k}[r * {width} + i]]; }}"]
        off += width
    em.schedule(algorithm="byte copies, a requantization table per input of another scale",
                kernel="qlinear_concat", layout="plain")
    em.step("\n".join(lines), name="qlinear_concat")


# -- QLinearGlobalAveragePool ---------------------------------------------------------------------
def _check_gap(node: Node, g: Graph) -> str | None:
    if any(g.values[n].layout != PLAIN for n in node.present_inputs() + node.outputs):
        return "QLinearGlobalAveragePool reads plain layouts only"
    why = _typed(node, g, [node.inputs[0]])
    if why:
        return why
    if len(g.values[node.inputs[0]].shape) < 3:
        return "QLinearGlobalAveragePool needs N, C and spatial dims"
    params = _params(node, g, [(1, 2), (3, 4)])
    if isinstance(params, str):
        return params
    (xs, _), (ys, _) = params
    hw = int(np.prod(_spatial(node, g), dtype=np.int64))
    scale = F32(xs / F32(ys * F32(hw)))
    if not (2.0 ** -32 <= scale < 256.0):  # onnxruntime refuses these at run time
        return f"QLinearGlobalAveragePool scale ratio {scale} outside onnxruntime's [2^-32, 256)"
    return None


def _spatial(node: Node, g: Graph) -> list[int]:
    shape = list(g.values[node.inputs[0]].shape)
    return shape[1:-1] if int(node.attr("channels_last", 0)) else shape[2:]


@register("QLinearGlobalAveragePool", check=_check_gap, name="qlinear_global_average_pool", domain=MS)
def emit_qlinear_gap(node: Node, g: Graph, em: BlockEmitter) -> None:
    (xs, xz), (ys, yz) = _params(node, g, [(1, 2), (3, 4)])  # type: ignore[misc]
    _emit_global_sum(node, g, em, xs, xz, ys, yz)


# -- QLinearAveragePool ---------------------------------------------------------------------------
def avg_pool_geometry(node: Node, in_shape: list[int]) -> tuple[list[int], ...] | str:
    """(spatial input dims, kernel, strides, all pads, output spatial dims) of the explicit-pad,
    floor-mode pools onnxruntime's QLinearAveragePool computes, or why not."""
    if str(node.attr("auto_pad", "NOTSET")) not in ("NOTSET", "VALID") or int(node.attr("ceil_mode", 0)):
        return "QLinearAveragePool: only explicit pads and floor mode are native"
    spatial = in_shape[1:-1] if int(node.attr("channels_last", 0)) else in_shape[2:]
    kernel = [int(k) for k in node.attr("kernel_shape", [])]
    if len(kernel) != len(spatial) or len(kernel) not in (1, 2):
        return "QLinearAveragePool: 1-D and 2-D windows are native"
    strides = [int(s) for s in node.attr("strides", [1] * len(kernel))]
    pads = [int(p) for p in node.attr("pads", [0] * 2 * len(kernel))]
    if str(node.attr("auto_pad", "NOTSET")) == "VALID":
        pads = [0] * 2 * len(kernel)
    if any(st < 1 for st in strides) or len(pads) != 2 * len(kernel):
        return "QLinearAveragePool: bad strides or pads"
    outs = [(spatial[d] + pads[d] + pads[d + len(kernel)] - kernel[d]) // strides[d] + 1 for d in range(len(kernel))]
    if any(o < 1 for o in outs):
        return "QLinearAveragePool: empty output"
    return [int(d) for d in spatial], kernel, strides, pads, outs


def _check_avg_pool(node: Node, g: Graph) -> str | None:
    if any(g.values[n].layout != PLAIN for n in node.present_inputs() + node.outputs):
        return "QLinearAveragePool reads plain layouts only"
    why = _typed(node, g, [node.inputs[0]])
    if why:
        return why
    geo = avg_pool_geometry(node, list(g.values[node.inputs[0]].shape))
    if isinstance(geo, str):
        return geo
    params = _params(node, g, [(1, 2), (3, 4)])
    return params if isinstance(params, str) else None


@register("QLinearAveragePool", check=_check_avg_pool, name="qlinear_average_pool", domain=MS)
def emit_qlinear_average_pool(node: Node, g: Graph, em: BlockEmitter) -> None:
    """onnxruntime's arithmetic: the input dequantized (``s_x * (x - z_x)``), each window summed
    in float in row-major order, divided by its count (the clipped window, or the kernel size
    with count_include_pad), then ``nearbyintf(v / s_y + z_y)`` saturated. A window covering the
    whole unpadded image is the global pool (onnxruntime switches to it too)."""
    x, y = node.inputs[0], node.outputs[0]
    (xs, xz), (ys, yz) = _params(node, g, [(1, 2), (3, 4)])  # type: ignore[misc]
    shape = list(g.values[x].shape)
    spatial, kernel, strides, pads, outs = avg_pool_geometry(node, shape)  # type: ignore[misc]
    dt = dtype_name(g, y)
    ct = c_type(dt)
    last = int(node.attr("channels_last", 0))
    if spatial == kernel and not any(pads):
        _emit_global_sum(node, g, em, xs, xz, ys, yz)
        return
    if len(kernel) == 1:  # a 1-D pool is the 2-D one with a width of 1
        spatial, kernel, strides, pads, outs = spatial + [1], kernel + [1], strides + [1], [pads[0], 0], outs + [1]
    n, c = shape[0], shape[-1] if last else shape[1]
    h, w = spatial
    oh, ow = outs
    include_pad = int(node.attr("count_include_pad", 0))
    # element offset of pixel (hh, ww) of channel cc in image b, and of output (ph, pw)
    x_at = f"(b * {h * w * c} + (hh * {w} + ww) * {c} + cc)" if last else f"((b * {c} + cc) * {h * w} + hh * {w} + ww)"
    y_at = f"(b * {oh * ow * c} + (ph * {ow} + pw) * {c} + cc)" if last else f"((b * {c} + cc) * {oh * ow} + ph * {ow} + pw)"
    count = f"{float(kernel[0] * kernel[1])!r}f" if include_pad else "(float)((he - hs) * (we - ws))"
    body = [
        f"const {ct} *restrict X = {em.ptr(x)};",
        f"{ct} *restrict Y = (void *){em.ptr(y)};",
        SATURATION_COUNTERS,
        work_range(n * c * oh, n * c * oh * ow * kernel[0] * kernel[1] >= PARALLEL_MIN),
        "for (long t = wb; t < we; ++t) {",
        f"    const long ph = t % {oh}, cc = (t / {oh}) % {c}, b = t / {oh * c};",
        f"    long hs = ph * {strides[0]} - {pads[0]}, he = SMELT_MIN(hs + {kernel[0]}, {h});",
        "    hs = hs < 0 ? 0 : hs;",
        f"    for (long pw = 0; pw < {ow}; ++pw) {{",
        f"        long ws = pw * {strides[1]} - {pads[1]}, we = SMELT_MIN(ws + {kernel[1]}, {w});",
        "        ws = ws < 0 ? 0 : ws;",
        "        float acc = 0.0f;",
        "        for (long hh = hs; hh < he; ++hh)",
        "            for (long ww = ws; ww < we; ++ww)",
        f"                acc += {flit(xs)} * (float)((int32_t)X[{x_at}] - {xz});",
        f"        acc /= {count};",
        "        " + _store(f"nearbyintf(acc / {flit(ys)} + {float(yz)!r}f)", dt, f"Y[{y_at}]"),
        "    }",
        "}",
        flush_counters(em.saturation_counter(y))]
    em.schedule(algorithm="dequantized float window sums in onnxruntime's order", kernel="qlinear_average_pool",
                layout="NHWC" if last else "NCHW")
    em.step("\n".join(body), name="qlinear_average_pool", attributes=NO_CONTRACT)


def _emit_global_sum(node: Node, g: Graph, em: BlockEmitter, xs: np.float32, xz: int, ys: np.float32,
                     yz: int) -> None:
    """The whole image per channel (NCHW, or NHWC with channels_last): int32 sums, minus
    ``z_x * HW``, times ``s_x / (s_y * HW)``, half to even, plus ``z_y``, saturated."""
    x, y = node.inputs[0], node.outputs[0]
    last = int(node.attr("channels_last", 0))
    dt = dtype_name(g, y)
    ct = c_type(dt)
    shape = list(g.values[x].shape)
    n, c = shape[0], shape[-1] if last else shape[1]
    hw = int(np.prod(shape[1:-1] if last else shape[2:], dtype=np.int64))
    scale = F32(xs / F32(ys * F32(hw)))
    base, step = (f"(r / {c}) * {hw * c} + r % {c}", str(c)) if last else (f"r * {hw}", "1")
    em.schedule(algorithm="int32 channel sums, MLAS's requantization", kernel="qlinear_global_average_pool",
                layout="NHWC" if last else "NCHW")
    em.step("\n".join([
        f"const {ct} *restrict X = {em.ptr(x)};",
        f"{ct} *restrict Y = (void *){em.ptr(y)};",
        SATURATION_COUNTERS,
        work_range(n * c, n * c * hw >= PARALLEL_MIN),
        "for (long r = wb; r < we; ++r) {",
        f"    const {ct} *restrict xr = X + {base};",
        "    int32_t acc = 0;",
        f"    for (long i = 0; i < {hw}; ++i) acc += xr[i * {step}];",
        f"    acc -= {xz * hw};",
        "    " + _store(f"nearbyintf((float)acc * {flit(scale)}) + {float(yz)!r}f", dt, "Y[r]"),
        "}",
        flush_counters(em.saturation_counter(y))]), name="qlinear_global_average_pool")


# -- QLinearSoftmax -------------------------------------------------------------------------------
def _softmax_rows(node: Node, g: Graph) -> tuple[int, int] | str:
    """(rows, row length) of the node's contiguous view, or why it has none: opset < 13
    coerces to 2-D at ``axis`` (default 1); opset 13 normalizes one axis (default -1), native
    when it is the last."""
    shape = [int(d) for d in g.values[node.inputs[0]].shape]
    rank = len(shape)
    if not rank:
        return "QLinearSoftmax of a scalar"
    opset = int(node.attr("opset", 13))
    axis = int(node.attr("axis", 1 if opset < 13 else -1))
    if not -rank <= axis < rank:
        return f"QLinearSoftmax axis {axis} out of range for rank {rank}"
    axis %= rank
    if opset >= 13 and axis != rank - 1:
        return "QLinearSoftmax over an axis other than the last is not native"
    length = int(np.prod(shape[axis:], dtype=np.int64))
    return int(np.prod(shape, dtype=np.int64)) // max(1, length), length


def _check_qlinear_softmax(node: Node, g: Graph) -> str | None:
    why = _typed(node, g, [node.inputs[0]])
    if why:
        return why
    if any(g.values[n].layout != PLAIN for n in (node.inputs[0], node.outputs[0])):
        return "QLinearSoftmax reads plain layouts only"
    params = _params(node, g, [(1, 2), (3, 4)])
    if isinstance(params, str):
        return params
    if not params[0][0] > 0 or not 0 < params[1][0] < np.inf:
        return "QLinearSoftmax: x_scale must be positive and y_scale positive and finite"
    rows = _softmax_rows(node, g)
    if isinstance(rows, str):
        return rows
    return "empty tensor" if rows[0] * rows[1] == 0 else None


def qsoftmax_table(x_scale: np.float32, length: int) -> np.ndarray:
    """onnxruntime's exp table for QLinearSoftmax over rows of ``length``: entry ``d`` (the code
    minus the row's largest, plus 255) is ``exp((d - 255 + shift) * x_scale)`` in double, rounded
    to float32, where ``shift = max(0, log(FLT_MAX / length) - 5) / x_scale`` keeps a row's sum of
    up to ``length`` entries finite. (onnxruntime's ``log`` of the float quotient may be the
    float overload; either moves every entry by the same factor, which the normalization
    cancels but for rounding.)"""
    quotient = float(np.float32(np.finfo(np.float32).max) / np.float32(length))
    shift = max(0.0, float(np.log(quotient)) - 5.0) / float(x_scale)
    d = np.arange(256, dtype=np.float64)
    with np.errstate(invalid="ignore"):  # an infinite x_scale (a -inf attention mask): 0 * inf is NaN
        return np.exp((d - 255.0 + shift) * float(x_scale)).astype(np.float32)


@register("QLinearSoftmax", check=_check_qlinear_softmax, name="qlinear_softmax", domain=MS)
def emit_qlinear_softmax(node: Node, g: Graph, em: BlockEmitter) -> None:
    """onnxruntime's QLinearSoftmax (MLAS's lookup kernels): per row the largest code, each
    element's table entry at ``code - largest + 255`` (``qsoftmax_table``; x's zero point cancels),
    their float sum, then ``code = round(e * ((1 / sum) * floor(1 / y_scale)) + y_zero)`` half to
    even (a multiply and an add, not fused), saturated. onnxruntime sums in its vector kernel's
    lane order; smelt sums in 16 lanes, so a code can differ by one where ``e * scale + y_zero``
    lies within the sums' last-bit difference of a half-integer. An infinite x_scale (what
    onnxruntime's quantizer gives a -inf attention mask) makes the largest code's entry NaN, and
    every code of such a row the low end, as in onnxruntime's vector blocks (its scalar tail casts
    the NaN to an int8 0)."""
    x, y = node.inputs[0], node.outputs[0]
    (xs, _), (ys, yz) = _params(node, g, [(1, 2), (3, 4)])  # type: ignore[misc]
    rows, length = _softmax_rows(node, g)  # type: ignore[misc]
    dt = dtype_name(g, y)
    ct = c_type(dt)
    y_floor = np.float32(np.floor(np.float32(1.0) / np.float32(ys)))
    table = em.weight(qsoftmax_table(np.float32(xs), length))
    scratch = em.scratch(em.n_threads * length * 4, "float32")
    em.schedule(algorithm="onnxruntime's QLinearSoftmax: a 256-entry exp table per compile-time x_scale",
                kernel="qlinear_softmax")
    em.step("\n".join([
        f"const {ct} *restrict X = (const void *){em.ptr(x)};",
        f"{ct} *restrict Y = (void *){em.ptr(y)};",
        f"const float *restrict T = {table};",
        f"float *restrict E = {scratch} + (long)tid * {length};",
        SATURATION_COUNTERS,
        work_range(rows, rows * length >= PARALLEL_MIN),
        "for (long r = wb; r < we; ++r) {",
        f"    const {ct} *restrict xr = X + r * {length}; {ct} *restrict yr = Y + r * {length};",
        "    int m = xr[0];",
        f"    for (long l = 1; l < {length}; ++l) m = xr[l] > m ? xr[l] : m;",
        "    float acc[16] = {0};",
        "    long l = 0;",
        f"    for (; l + 16 <= {length}; l += 16)",
        "        for (int j = 0; j < 16; ++j) { const float e = T[xr[l + j] - m + 255]; E[l + j] = e; acc[j] += e; }",
        "    float sum = 0.0f;",
        f"    for (; l < {length}; ++l) {{ const float e = T[xr[l] - m + 255]; E[l] = e; sum += e; }}",
        "    for (int j = 0; j < 16; ++j) sum += acc[j];",
        f"    const float scale = (1.0f / sum) * {flit(y_floor)};",
        f"    for (long k = 0; k < {length}; ++k)",
        "        " + _store(f"nearbyintf(E[k] * scale + {flit(np.float32(yz))})", dt, "yr[k]"),
        "}",
        flush_counters(em.saturation_counter(y))]), name=f"qlinear_softmax_{dt}",
        attributes=f"{NO_CONTRACT} {wide_vectors(em)}".strip())
