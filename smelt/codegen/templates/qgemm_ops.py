"""onnxruntime's integer GEMM contrib ops (``com.microsoft``): DynamicQuantizeMatMul,
MatMulIntegerToFloat, QGemm — on the shared integer GEMM tile (``kernels/int_gemm.py``).

All three are ``(A - a_zero) (B - b_zero)`` in exact int32 over a constant B, then an epilogue:

- DynamicQuantizeMatMul: float A is quantized to uint8 first with DynamicQuantizeLinear's rule
  (``int_gemm.emit_dynamic_uint8``: the range widened to 0, scale = range / 255, zero point
  rounded half to even; onnxruntime's ``GetQuantizationParameter`` is the same rule), then
  ``float(acc) * (a_scale * b_scale[j]) + bias[j]`` (the multiplier rounded once, as onnxruntime
  forms it; multiply and add not fused).
- MatMulIntegerToFloat: the same epilogue over 8-bit A (per-tensor a_scale and zero point,
  constants or written at run time by a DynamicQuantizeLinear: onnxruntime's dynamic
  quantization, fused by passes/matmul_integer_to_float.py).
- QGemm (transA/transB, alpha, int32 C added to the sum): float out as
  ``float(acc + C) * (alpha * a_scale * b_scale[j])``, or, with y_scale, requantized with the
  multiplier ``alpha * a_scale * b_scale[j] / y_scale`` (half to even, plus the zero point,
  saturated), both formed in onnxruntime's order at compile time.

The product: B (constant; transposed at compile time for transB) is packed per NR-column panel
at compile time, A per call, then ``int_gemm.tile_loop`` per (row block, column panel): int16
pairs with both zero points off, or on VNNI hosts for uint8 A and int8 B of zero point 0 raw byte
quads, A's zero point then taken off as ``a_zero * colsum(B)[j]``. Where the ISA has no integer
dot product (the portable build) a row loop accumulates the same int32 sums. Exact for K up to
2^15 (``int_gemm.MAX_K``); longer K falls back.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from smelt.codegen.emitter import BlockEmitter, c_float_exact
from smelt.codegen.kernels.int_gemm import (
    MAX_K,
    PAIR,
    QUAD,
    SATURATION_COUNTERS,
    emit_dynamic_uint8,
    flush_counters,
    pack_b,
    pair_word,
    quad_sum,
    quad_weights,
    quad_word,
    requantize,
    tile_loop,
)
from smelt.codegen.kernels.isa import vector_isa, with_int_dot
from smelt.codegen.kernels.loops import dtype_name
from smelt.codegen.registry import register
from smelt.ir.graph import PLAIN, Graph, Node
from smelt.ir.types import c_type
from smelt.schedule.gemm import PARALLEL_MIN_MACS, int_dot_tile, int_tiles_rows_inner

MS = "com.microsoft"
EIGHT_BIT = ("int8", "uint8")
F32 = np.float32
NO_CONTRACT = '__attribute__((optimize("fp-contract=off")))'


flit = c_float_exact  # the C literal of a float32, exact


@dataclass
class Gemm:
    """One integer product and its epilogue, as the three ops describe it."""

    m: int
    k: int
    n: int
    a: str  # C pointer expression to A's 8-bit values (row-major [M, K], or [K, M] with trans_a)
    a_type: str  # "uint8" / "int8"
    a_zero: str  # C int32 expression
    trans_a: bool
    b: np.ndarray  # [K, N] int8 or uint8, constant
    b_zero: np.ndarray  # int32, shape () or (N,)
    decl: list[str]  # declarations the epilogue needs
    store: str  # C statement storing int32 ``ACC`` of row ``i``, column ``j`` (may use nlo/nhi)
    counters: str | None  # the value whose saturation counters the store bumps


def _const(g: Graph, name: str) -> np.ndarray | None:
    if not name or name not in g.values:
        return None
    return g.values[name].const


def _vector_of(arr: np.ndarray | None, n: int) -> bool:
    return arr is not None and (arr.size == 1 or (arr.ndim == 1 and arr.size == n))


def _b_operand(g: Graph, b: str, bz: str, trans: bool) -> tuple[np.ndarray, np.ndarray] | str:
    """Constant B as [K, N] and its zero point, or why not."""
    bc = _const(g, b)
    if bc is None or bc.ndim != 2:
        return "native integer GEMM contrib ops need a constant 2-D B"
    if dtype_name(g, b) not in EIGHT_BIT:
        return f"B of {dtype_name(g, b)}: int8/uint8 only"
    bc = bc.T if trans else bc
    zc = _const(g, bz) if bz else np.zeros((), bc.dtype)
    if zc is None or not _vector_of(zc, bc.shape[1]):
        return "B's zero point must be a constant scalar or per column"
    return np.ascontiguousarray(bc), zc.astype(np.int32).reshape(-1 if zc.size > 1 else ())


def _ins(node: Node, count: int) -> list[str]:
    return (list(node.inputs) + [""] * count)[:count]


def _plain(node: Node, g: Graph) -> str | None:
    if any(g.values[n].layout != PLAIN for n in node.present_inputs() + [o for o in node.outputs if o]):
        return f"{node.op} reads plain layouts only"
    return None


def _a_dims(g: Graph, a: str, k: int) -> tuple[int, int] | str:
    shape = list(g.values[a].shape)
    if len(shape) < 2 or shape[-1] != k:
        return f"A {shape} does not end in K = {k}"
    return int(np.prod(shape[:-1], dtype=np.int64)), k


def _scale_reason(g: Graph, name: str, n: int, what: str) -> str | None:
    c = _const(g, name)
    if c is None or dtype_name(g, name) != "float32" or not _vector_of(c, n):
        return f"{what} {name!r} must be a constant float32 scalar or per column"
    return None


def _check_dqmm(node: Node, g: Graph) -> str | None:
    why = _plain(node, g)
    if why:
        return why
    a, b, bs, bz, bias = _ins(node, 5)
    if dtype_name(g, a) != "float32":
        return "DynamicQuantizeMatMul takes float32 A"
    bb = _b_operand(g, b, bz, False)
    if isinstance(bb, str):
        return bb
    k, n = bb[0].shape
    return _common(g, a, k, n, bs, bias)


def _common(g: Graph, a: str, k: int, n: int, bs: str, bias: str) -> str | None:
    if k > MAX_K:
        return f"K = {k} > {MAX_K}: the int32 sum could overflow"
    dims = _a_dims(g, a, k)
    if isinstance(dims, str):
        return dims
    why = _scale_reason(g, bs, n, "b_scale")
    if why:
        return why
    if bias and (dtype_name(g, bias) != "float32" or tuple(g.values[bias].shape) != (n,)):
        return "bias must be float32 [N]"
    return None


def _check_mmitf(node: Node, g: Graph) -> str | None:
    why = _plain(node, g)
    if why:
        return why
    a, b, as_, bs, az, bz, bias = _ins(node, 7)
    if dtype_name(g, a) not in EIGHT_BIT:
        return f"A of {dtype_name(g, a)}: int8/uint8 only"
    bb = _b_operand(g, b, bz, False)
    if isinstance(bb, str):
        return bb
    k, n = bb[0].shape
    if not _one_element(g, as_) or dtype_name(g, as_) != "float32":
        return "MatMulIntegerToFloat: a_scale must be a float32 scalar"
    if az and not _one_element(g, az):
        return "MatMulIntegerToFloat: a_zero_point must be a scalar"
    return _common(g, a, k, n, bs, bias)


def _one_element(g: Graph, name: str) -> bool:
    """A value of one element (a constant, or one a DynamicQuantizeLinear writes at run time)."""
    v = g.values[name]
    return v.shape is not None and all(isinstance(d, int) for d in v.shape) and int(np.prod(v.shape, dtype=np.int64)) == 1


def _check_qgemm(node: Node, g: Graph) -> str | None:
    why = _plain(node, g)
    if why:
        return why
    a, as_, az, b, bs, bz, c, ys, yz = _ins(node, 9)
    if dtype_name(g, a) not in EIGHT_BIT or len(g.values[a].shape) != 2:
        return "QGemm: A must be 2-D int8/uint8"
    bb = _b_operand(g, b, bz, bool(node.attr("transB", 0)))
    if isinstance(bb, str):
        return bb
    k, n = bb[0].shape
    ash = list(g.values[a].shape)
    if (ash[0] if node.attr("transA", 0) else ash[1]) != k or k > MAX_K:
        return f"QGemm: A {ash} does not match K = {k} (or K > {MAX_K})"
    for name, what in ((as_, "a_scale"), (az, "a_zero_point"), (ys, "y_scale"), (yz, "y_zero_point")):
        if name and (_const(g, name) is None or _const(g, name).size != 1):
            return f"QGemm: {what} must be a constant scalar"
    why = _scale_reason(g, bs, n, "b_scale")
    if why:
        return why
    if c:
        cv = g.values[c]
        m = ash[1] if node.attr("transA", 0) else ash[0]
        if dtype_name(g, c) != "int32" or _c_index(tuple(cv.shape), m, n) is None:
            return "QGemm: C must be int32 broadcasting to [M, N]"
    if ys and dtype_name(g, node.outputs[0]) not in EIGHT_BIT:
        return "QGemm: a requantized output must be int8/uint8"
    return None


def _c_index(shape: tuple, m: int, n: int) -> str | None:
    """C index of the bias element for output (i, j), or None when ``shape`` does not broadcast."""
    dims = [int(d) for d in shape]
    while len(dims) > 2 and dims[0] == 1:
        dims.pop(0)
    if len(dims) > 2:
        return None
    dims = [1] * (2 - len(dims)) + dims
    if dims[0] not in (1, m) or dims[1] not in (1, n):
        return None
    row = "i" if dims[0] == m and m > 1 else "0"
    col = "j" if dims[1] == n and n > 1 else "0"
    return f"{row} * {dims[1]} + {col}" if row != "0" else col


def _scales(a_scale: np.float32, b_scale: np.ndarray, alpha: float | None = None,
            y_scale: np.float32 | None = None) -> np.ndarray:
    """onnxruntime's per-column output multipliers: ``(alpha * a) * b[j]`` (without alpha
    ``a * b[j]``), divided by y_scale when requantizing; float32 at each step."""
    b = b_scale.astype(F32).reshape(-1)
    lead = F32(F32(alpha) * F32(a_scale)) if alpha is not None else F32(a_scale)
    out = (lead * b).astype(F32)
    if y_scale is not None:
        out = (out / F32(y_scale)).astype(F32)
    return out


def _float_epilogue(em: BlockEmitter, y: str, mult: str, bias: str, n_scale: int) -> tuple[list[str], str]:
    """Declarations and the store ``Y[i * N + j] = float(ACC) * mult[j] (+ bias[j])``; ``mult`` a
    C pointer to float multipliers (one, or one per column)."""
    decl = [f"float *restrict Y = (void *){em.ptr(y)};", f"const float *restrict MUL = {mult};"]
    m = "MUL[j]" if n_scale > 1 else "MUL[0]"
    value = f"(float)ACC * {m}"
    if bias:
        decl.append(f"const float *restrict BIAS = {em.ptr(bias)};")
        value = f"{value} + BIAS[j]"
    return decl, f"Y[yoff + j] = {value};"


@register("DynamicQuantizeMatMul", check=_check_dqmm, name="dynamic_quantize_matmul", domain=MS)
def emit_dynamic_quantize_matmul(node: Node, g: Graph, em: BlockEmitter) -> None:
    a, b, bs, bz, bias = _ins(node, 5)
    bmat, bzero = _b_operand(g, b, bz, False)  # type: ignore[misc]
    k, n = bmat.shape
    m, _ = _a_dims(g, a, k)  # type: ignore[misc]
    qa = em.scratch(m * k, "uint8")
    sc = emit_dynamic_uint8(em, em.ptr(a), m * k, qa, "dynamic_quantize_matmul_a")
    bscale = _const(g, bs).astype(F32).reshape(-1)
    mult = em.scratch(4 * bscale.size)
    # the multipliers a_scale * b_scale[j], formed once per call as onnxruntime forms them
    em.step(f"const float *SC = {sc};\nfloat *restrict MUL = {mult};\nconst float *restrict BS = {em.weight(bscale)};\n"
            f"if (tid == 0) for (long j = 0; j < {bscale.size}; ++j) MUL[j] = SC[0] * BS[j];",
            name="dynamic_quantize_matmul_scale")
    decl, store = _float_epilogue(em, node.outputs[0], mult, bias, bscale.size)
    _emit(node, g, em, Gemm(m, k, n, qa, "uint8", f"(int32_t){sc}[1]", False, bmat, bzero, decl, store, None))


@register("MatMulIntegerToFloat", check=_check_mmitf, name="matmul_integer_to_float", domain=MS)
def emit_matmul_integer_to_float(node: Node, g: Graph, em: BlockEmitter) -> None:
    a, b, as_, bs, az, bz, bias = _ins(node, 7)
    bmat, bzero = _b_operand(g, b, bz, False)  # type: ignore[misc]
    k, n = bmat.shape
    m, _ = _a_dims(g, a, k)  # type: ignore[misc]
    if _const(g, as_) is not None:
        mult = _scales(F32(_const(g, as_).reshape(-1)[0]), _const(g, bs))
        mult_ptr, n_scale = em.weight(mult), mult.size
    else:  # a_scale from a DynamicQuantizeLinear: the multipliers formed per call, as the Mul did
        bscale = _const(g, bs).astype(F32).reshape(-1)
        mult_ptr, n_scale = em.scratch(4 * bscale.size), bscale.size
        em.step(f"const float *restrict AS = {em.ptr(as_)};\nfloat *restrict MUL = {mult_ptr};\n"
                f"const float *restrict BS = {em.weight(bscale)};\n"
                f"if (tid == 0) for (long j = 0; j < {bscale.size}; ++j) MUL[j] = AS[0] * BS[j];",
                name="matmul_integer_to_float_scale")
    decl, store = _float_epilogue(em, node.outputs[0], mult_ptr, bias, n_scale)
    if not az:
        a_zero = "0"
    elif _const(g, az) is not None:
        a_zero = str(int(_const(g, az).reshape(-1)[0]))
    else:
        a_zero = f"(int32_t)({em.ptr(az)})[0]"
    _emit(node, g, em, Gemm(m, k, n, em.ptr(a), dtype_name(g, a), a_zero, False, bmat, bzero, decl, store, None))


@register("QGemm", check=_check_qgemm, name="qgemm", domain=MS)
def emit_qgemm(node: Node, g: Graph, em: BlockEmitter) -> None:
    a, as_, az, b, bs, bz, c, ys, yz = _ins(node, 9)
    trans_a = bool(node.attr("transA", 0))
    bmat, bzero = _b_operand(g, b, bz, bool(node.attr("transB", 0)))  # type: ignore[misc]
    k, n = bmat.shape
    ash = list(g.values[a].shape)
    m = ash[1] if trans_a else ash[0]
    y = node.outputs[0]
    alpha = float(node.attr("alpha", 1.0))
    a_scale = F32(_const(g, as_).reshape(-1)[0])
    y_scale = F32(_const(g, ys).reshape(-1)[0]) if ys else None
    mult = _scales(a_scale, _const(g, bs), alpha, y_scale)
    acc = "ACC"
    decl: list[str] = []
    if c:
        decl.append(f"const int32_t *restrict CB = {em.ptr(c)};")
        acc = f"(ACC + CB[{_c_index(tuple(g.values[c].shape), m, n)}])"
    mj = "MUL[j]" if mult.size > 1 else "MUL[0]"
    if y_scale is None:
        decl += [f"float *restrict Y = (void *){em.ptr(y)};", f"const float *restrict MUL = {em.weight(mult)};"]
        store = f"Y[yoff + j] = (float){acc} * {mj};"
        counters = None
    else:
        yt = dtype_name(g, y)
        zero = f"{float(int(_const(g, yz).reshape(-1)[0]))!r}f" if yz else "0.0f"
        decl += [f"{c_type(yt)} *restrict Y = (void *){em.ptr(y)};", f"const float *restrict MUL = {em.weight(mult)};",
                 SATURATION_COUNTERS]
        store = requantize(f"(float){acc} * {mj}", zero, yt, "Y[yoff + j]")
        counters = y
    a_zero = str(int(_const(g, az).reshape(-1)[0])) if az else "0"
    _emit(node, g, em, Gemm(m, k, n, em.ptr(a), dtype_name(g, a), a_zero, trans_a, bmat, bzero, decl, store, counters))


# -- the product --------------------------------------------------------------------------------
def _emit(node: Node, g: Graph, em: BlockEmitter, p: Gemm) -> None:
    v = with_int_dot(vector_isa(em.target), em.target)
    if v.has("i16_dot_acc"):
        _emit_tiled(node, em, p, v)
    else:
        _emit_rows(node, em, p)


def _a_elem(p: Gemm, row: str, col: str) -> str:
    return f"A[({col}) * {p.m} + ({row})]" if p.trans_a else f"A[({row}) * {p.k} + ({col})]"


def _emit_tiled(node: Node, em: BlockEmitter, p: Gemm, v) -> None:
    mr, nv = int_dot_tile(v.registers, p.m)
    nr = nv * v.lanes
    u8s8 = p.a_type == "uint8" and p.b.dtype == np.int8 and not np.any(p.b_zero)
    # the quads: VNNI's exact u8 x s8 dot for any 8-bit B (uint8 or zero-pointed weights as int8
    # bytes plus a row-sum correction, kernels/int_gemm.py); else, on 7-bit weights (what
    # quantizers write with reduce_range for hosts without VNNI), vpmaddubsw's, which cannot
    # saturate there (2 * 255 * 64 <= 32767): half the dot instructions of the int16 pairs
    # (MobileNetV2's classifier on AVX2 ~0.16 -> ~0.09 ms)
    vnni = p.a_type == "uint8" and p.b.dtype in (np.int8, np.uint8) and v.has("u8s8_dot_acc")
    seven_bit = u8s8 and p.b.size > 0 and int(p.b.min()) >= -64 and int(p.b.max()) <= 63
    dot = ("u8s8_dot_acc" if vnni else
           "u8s7_dot_acc" if seven_bit and v.has("u8s7_dot_acc") else "i16_dot_acc")
    quad = dot != "i16_dot_acc"
    group = QUAD if quad else PAIR
    kw = -(-p.k // group)
    nb = -(-p.n // nr)
    offsets = None  # B - b_zero - its int8 bytes per column, where not all zero (VNNI only)
    if quad:
        b8, colsums, offsets = quad_weights(p.b[None], p.b_zero)
        colsums, offsets = colsums[0], (offsets[0] if np.any(offsets) else None)
        packed = pack_b(b8, nr, QUAD)
    else:
        packed = pack_b((p.b.astype(np.int16) - p.b_zero.astype(np.int16))[None], nr, PAIR)
    at = c_type(p.a_type)
    ap = em.scratch(4 * p.m * kw, "int32")
    rs = em.scratch(4 * p.m, "int32") if offsets is not None else None  # A's row sums
    parallel = p.m * p.k * p.n >= PARALLEL_MIN_MACS
    split = "smelt_range({total}, tid, nt, &wb, &we);" if parallel else "wb = 0; we = tid == 0 ? {total} : 0;"
    if quad:
        word = quad_word([f"({group} * q + {b} < {p.k} ? {_a_elem(p, 'r', f'{group} * q + {b}')} : 0)"
                          for b in range(4)])
    else:
        hi = f"2 * q + 1 < {p.k} ? (int32_t){_a_elem(p, 'r', '2 * q + 1')} - za : 0"
        word = pair_word(f"(int32_t){_a_elem(p, 'r', '2 * q')} - za", hi)
    em.step("\n".join([
        f"const {at} *restrict A = (const void *){p.a};", f"int32_t *restrict Ap = {ap};",
        "long wb, we; " + split.format(total=p.m),
        f"const int32_t za = {p.a_zero}; (void)za;",
        "for (long r = wb; r < we; ++r) {",
        f"    for (long q = 0; q < {kw}; ++q) Ap[r * {kw} + q] = {word};",
        *([f"    {{ int32_t s = 0; for (long kk = 0; kk < {p.k}; ++kk) s += {_a_elem(p, 'r', 'kk')}; {rs}[r] = s; }}"]
          if rs else []),
        "}"]),
        name=f"{node.op.lower()}_pack_a",
        doc=f"A {'as raw byte quads' if quad else '- zero point as int16 pairs'}{' and row sums' if rs else ''}")
    tile = em.scratch(4 * mr * nr * max(1, em.n_threads), "int32")
    kernel = tile_loop(v, mr, nv, k2=kw, a_row=f"Ap + (i0 + SMELT_MIN({{r}}, mr - 1)) * {kw}L",
                       b_panel=f"Bp + cb * {kw * nr * group}L", tile="T", group=group, dot=dot)
    acc = f"T[r * {nr} + jj]"
    extra = []
    if quad:
        extra = [f"const int32_t *restrict CS = {em.weight(colsums)};", f"const int32_t za = {p.a_zero};"]
        if offsets is not None:
            extra += [f"const int32_t *restrict OFF = {em.weight(offsets)};", f"const int32_t *restrict RS = {rs};"]
        acc = quad_sum(f"T[r * {nr} + jj]", "za", "j", p.k, None if offsets is None else "i")
    blocks_m = -(-p.m // mr)
    lines = p.decl + extra + [
        f"const {'int8_t' if quad else 'int16_t'} *restrict Bp = {em.weight(packed)};",
        f"const int32_t *restrict Ap = {ap};",
        f"int32_t *restrict T = {tile} + (long)tid * {mr * nr};",
        "long wb, we; " + split.format(total=blocks_m * nb),
        "for (long p = wb; p < we; ++p) {",
        (f"    const long cb = p / {blocks_m}, i0 = (p % {blocks_m}) * {mr}, mr = SMELT_MIN({mr}, {p.m} - i0);"
         if int_tiles_rows_inner(blocks_m, nb, 4 * p.m * kw, packed.nbytes, em.target.l1d_bytes) else
         f"    const long cb = p % {nb}, i0 = (p / {nb}) * {mr}, mr = SMELT_MIN({mr}, {p.m} - i0);"),
        *["    " + line for line in kernel],
        f"    const long jn = SMELT_MIN({nr}, {p.n} - cb * {nr});",
        "    for (long r = 0; r < mr; ++r) {",
        f"        const long i = i0 + r, yoff = i * {p.n}; (void)i;",
        "        for (long jj = 0; jj < jn; ++jj) {",
        f"            const long j = cb * {nr} + jj;",
        f"            const int32_t ACC = {acc};",
        "            " + p.store.replace("\n", "\n            "),
        "        }",
        "    }",
        "}"]
    if p.counters:
        lines.append(flush_counters(em.saturation_counter(p.counters)))
    form = {"u8s8_dot_acc": "u8 x s8 quads", "u8s7_dot_acc": "u8 x 7-bit quads"}.get(dot, "int16 pairs")
    em.schedule(algorithm=f"{node.op}: integer GEMM tile ({form}), "
                          "epilogue as onnxruntime", kernel="int_gemm",
                micro_kernel=f"{mr}x{nr} {v.name} {v.x(dot, a='a', b='b', c='c')}", layout="plain")
    em.step("\n".join(lines), name=f"{node.op.lower()}_{mr}x{nr}_{v.name}{'_' + dot.split('_')[0] if quad else ''}",
            doc=f"M={p.m} K={p.k} N={p.n}", attributes=NO_CONTRACT)


def _emit_rows(node: Node, em: BlockEmitter, p: Gemm) -> None:
    """Portable C: per output row, an int32 accumulator row over K."""
    at = c_type(p.a_type)
    bq = (p.b.astype(np.int16) - p.b_zero.astype(np.int16)).astype(np.int16)
    acc = em.scratch(4 * p.n * max(1, em.n_threads), "int32")
    parallel = p.m * p.k * p.n >= PARALLEL_MIN_MACS
    split = (f"long wb, we; smelt_range({p.m}, tid, nt, &wb, &we);" if parallel
             else f"long wb = 0, we = tid == 0 ? {p.m} : 0;")
    lines = p.decl + [
        f"const {at} *restrict A = (const void *){p.a};",
        f"const int16_t *restrict Bq = {em.weight(bq)};",
        f"int32_t *restrict acc = {acc} + (long)tid * {p.n};",
        f"const int32_t za = {p.a_zero};",
        split,
        "for (long i = wb; i < we; ++i) {",
        f"    const long yoff = i * {p.n};",
        f"    for (long j = 0; j < {p.n}; ++j) acc[j] = 0;",
        f"    for (long kk = 0; kk < {p.k}; ++kk) {{",
        f"        const int32_t av = (int32_t){_a_elem(p, 'i', 'kk')} - za;",
        f"        const int16_t *restrict br = Bq + kk * {p.n};",
        f"        for (long j = 0; j < {p.n}; ++j) acc[j] += av * (int32_t)br[j];",
        "    }",
        f"    for (long j = 0; j < {p.n}; ++j) {{",
        "        const int32_t ACC = acc[j];",
        "        " + p.store.replace("\n", "\n        "),
        "    }",
        "}"]
    if p.counters:
        lines.append(flush_counters(em.saturation_counter(p.counters)))
    em.schedule(algorithm=f"{node.op}: int32 row accumulation, epilogue as onnxruntime", kernel="int_gemm_rows",
                layout="plain")
    em.step("\n".join(lines), name=f"{node.op.lower()}_rows", doc=f"M={p.m} K={p.k} N={p.n}",
            attributes=NO_CONTRACT)
