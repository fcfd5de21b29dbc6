"""The integer GEMM micro-kernel the quantized templates share (int_matmul, int_conv).

C[i, j] = sum_k A[i, k] * B[k, j] in exact int32, where A and B are 8-bit values with their zero
points already subtracted, held as int16. Both operands are packed in pairs along K: an int32
word of A holds (A[i, 2q], A[i, 2q+1]); a B panel holds, for each pair q, NR columns of
(B[2q, j], B[2q+1, j]) int16 pairs, one per int32 lane. The ISA's ``i16_dot_acc`` (vpmaddwd +
vpaddd; AVX512-VNNI's vpdpwssd) multiplies both pairs and adds them to the lane: exact, since
|a|, |b| <= 255 gives |a*b + a'*b'| < 2^17, and K <= 2^15 keeps the int32 sum below 2^31.

On VNNI hosts, when A is uint8 and B constant and 8-bit, the quad form runs instead: A raw (not
shifted) in words of four bytes along K, B as int8 quads, ``u8s8_dot_acc`` (vpdpbusd: four
exact u8 x s8 products per lane, twice the pair form's rate). B int8 of zero point 0 (symmetric
weights, what static quantizers write) is used as it is, and A's zero point comes off afterwards
as ``a_zero * colsum(B)[j]``, a compile-time column sum (``quad_colsums``). Any other constant
8-bit B (uint8, what older quantize_dynamic writes, or a nonzero zero point) is written as int8
bytes ``B8 = B - 128`` (uint8) or ``B`` (int8), exact, with ``B - b_zero == B8 + off[j]``
(``quad_weights``), and the sum is corrected by ``off[j] * (rowsum(A)[i] - K * a_zero)``
(``quad_sum`` renders the store's expression): a row sum taken while A is packed, one
multiply-add per stored element. This is the compile-time compensation oneDNN and MLAS use for
s8 x s8 and u8 x u8 on VNNI.

An MR x NR tile (``schedule.gemm.int_dot_tile``: MR rows, NV vectors of lanes) stays in
registers over all of K; rows past the end of a ragged block read the last row again (one code
path for every tile; their results are never stored). The tile is stored to a small int32
buffer and the caller's statement writes each valid element (as is, or requantized) wherever
its layout wants it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from smelt.codegen.kernels.isa import VectorIsa, vector_isa

if TYPE_CHECKING:
    from smelt.codegen.emitter import BlockEmitter

MAX_K = 1 << 15  # K * 2^16 < 2^31: the int32 sum of int16 pair products cannot overflow


PAIR, QUAD = 2, 4  # K values per int32 word: int16 pairs, or u8/s8 quads


def pack_b(b: np.ndarray, nr: int, group: int = PAIR) -> np.ndarray:
    """``b`` [groups, K, N] as [groups, N panels, K / group words, nr, group]: int16 (zero point
    subtracted) for pairs, int8 (zero point 0) for quads; K and the last panel's missing
    columns padded with zeros (they add nothing)."""
    groups, k, n = b.shape
    kw, nb = -(-k // group), -(-n // nr)
    dtype = np.int16 if group == PAIR else np.int8
    padded = np.zeros((groups, group * kw, nb * nr), dtype)
    padded[:, :k, :n] = b
    return np.ascontiguousarray(padded.reshape(groups, kw, group, nb, nr).transpose(0, 3, 1, 4, 2))


def pack_b_pairs(b: np.ndarray, nr: int) -> np.ndarray:
    return pack_b(b, nr, PAIR)


def quad_colsums(b: np.ndarray) -> np.ndarray:
    """[groups, N] int32 column sums of int8 ``b`` [groups, K, N]: what A's zero point times
    each column takes back off a quad-form sum."""
    return b.astype(np.int32).sum(axis=1).astype(np.int32)


def quad_weights(b: np.ndarray, zero: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Constant 8-bit ``b`` [groups, K, N] (uint8 or int8) with zero points ``zero`` (broadcast
    to [groups, N]) in the quad form: ``(b8, colsums, off)`` where ``b8`` is int8 (uint8 shifted
    down by 128, int8 as is), ``colsums`` its [groups, N] column sums and ``off`` [groups, N]
    int32 with ``b - zero == b8 + off``, so that
    ``sum_k (a_k - za)(b_k - zero) == sum_k a_k b8_k - za * colsums + off * (sum_k a_k - K za)``.
    ``off`` is all zero for int8 weights of zero point 0 (no row sums needed)."""
    groups, _, n = b.shape
    b8 = (b.astype(np.int16) - quad_shift(b.dtype)).astype(np.int8)
    return b8, quad_colsums(b8), quad_offsets(b.dtype, zero, groups, n)


def quad_shift(dtype: np.dtype) -> int:
    """What the quad form takes off an 8-bit B to make it int8 bytes: 128 for uint8, else 0."""
    return 128 if np.dtype(dtype) == np.uint8 else 0


def quad_offsets(dtype: np.dtype, zero: np.ndarray, groups: int, n: int) -> np.ndarray:
    """[groups, N] int32 ``off`` with ``b - zero == b8 + off`` for a B of ``dtype`` and zero
    points ``zero`` (a scalar, per column, or per group and column): ``quad_weights``' offsets,
    which need only the zero points, not B (a B fed at run time has them at compile time)."""
    z = np.asarray(zero).astype(np.int32).reshape(-1)
    if z.size not in (1, n, groups * n):
        raise ValueError(f"zero point of shape {np.shape(zero)} for a B of {groups} x {n} columns")
    z = z.reshape(groups, n) if z.size == groups * n and z.size != n else np.broadcast_to(z, (groups, n))
    return np.ascontiguousarray(quad_shift(dtype) - z, dtype=np.int32)


def quad_sum(tile: str, a_zero: str, column: str, k: int, row: str | None = None) -> str:
    """C for the exact ``(A - a_zero)(B - b_zero)`` sum from a quad-form tile element ``tile``:
    A's zero point times the column sum ``CS[column]`` off; with ``row`` (B not int8 of zero
    point 0, ``quad_weights``' offsets) also ``OFF[column] * (RS[row] - K * a_zero)``, in int64:
    the terms may pass 2^31 where their sum does not (and it wraps to int32 as onnxruntime's)."""
    if row is None:
        return f"({tile} - {a_zero} * CS[{column}])"
    return (f"(int32_t)((int64_t){tile} - (int64_t){a_zero} * CS[{column}] + (int64_t)OFF[{column}] * "
            f"((int64_t)RS[{row}] - {k}LL * {a_zero}))")


def quad_word(values: list[str]) -> str:
    """C int32 holding four bytes (uint8 values, lowest K first: vpdpbusd's byte order)."""
    parts = [f"((uint32_t)(uint8_t)({v}) << {8 * i})" if i else f"(uint32_t)(uint8_t)({v})"
             for i, v in enumerate(values)]
    return f"(int32_t)({' | '.join(parts)})"


def pair_word(lo: str, hi: str) -> str:
    """C int32 holding int16 ``lo`` in its low half and ``hi`` in its high half (lane order of
    vpmaddwd); through uint32, so no signed shift or overflow."""
    return f"(int32_t)((uint32_t)(uint16_t)({lo}) | ((uint32_t)(uint16_t)({hi}) << 16))"


def tile_loop(v: VectorIsa, mr: int, nv: int, *, k2: int, a_row: str, b_panel: str, tile: str,
              group: int = PAIR, dot: str | None = None) -> list[str]:
    """C lines computing one MR x (nv * lanes) tile into int32 ``tile`` (row-major, nr wide).

    ``k2``: the K words; ``a_row(r)`` is a format string with ``{r}``: a pointer to the packed A
    words of tile row r (already clamped to a valid row); ``b_panel`` a pointer to the panel's
    packed words (int16 pairs, or int8 quads with ``group`` QUAD). ``dot``: the quads' dot when
    not VNNI's u8s8_dot_acc (u8s7_dot_acc: the caller checked every B value is in [-64, 63])."""
    it = v.x("itype")
    lanes = v.lanes
    nr = nv * lanes
    dot = dot or ("i16_dot_acc" if group == PAIR else "u8s8_dot_acc")
    elem = 2 if group == PAIR else 4  # B elements per int32 lane and word
    lines = [f"const int32_t *restrict a{r} = {a_row.format(r=r)};" for r in range(mr)]
    lines.append(f"const {'int16_t' if group == PAIR else 'int8_t'} *restrict bp = {b_panel};")
    lines.append(" ".join(f"{it} c{r}_{c} = {v.x('i32_set1', a='0')};" for r in range(mr) for c in range(nv)))
    lines.append(f"for (long q = 0; q < {k2}; ++q) {{")
    lines += [f"    const {it} b{c} = {v.x('i32_loadu', p=f'bp + q * {nr * elem} + {c * lanes * elem}')};"
              for c in range(nv)]
    for r in range(mr):
        lines.append(f"    {{ const {it} av = {v.x('i32_set1', a=f'a{r}[q]')};")
        lines += [f"      c{r}_{c} = {v.x(dot, a='av', b=f'b{c}', c=f'c{r}_{c}')};" for c in range(nv)]
        lines.append("    }")
    lines.append("}")
    lines += [v.x("i32_storeu", p=f"{tile} + {r * nr + c * lanes}", a=f"c{r}_{c}") for r in range(mr) for c in range(nv)]
    return lines


# -- requantization ---------------------------------------------------------------------------
SATURATION_COUNTERS = "long nlo = 0, nhi = 0;  /* the numeric debug counters: elements clamped */"


def requantize(value: str, zero: str, dtype: str, dest: str) -> str:
    """C statement storing float ``value`` (the int32 sum times its scale) into ``dest`` of 8-bit
    ``dtype`` as onnxruntime requantizes: rounded half to even, plus the (whole) zero point
    ``zero``, saturated to the type's range, NaN to its low end; each clamp counted in
    ``nlo``/``nhi`` (``SATURATION_COUNTERS``)."""
    info = np.iinfo(np.dtype(dtype))
    lo, hi = int(info.min), int(info.max)
    return (f"{{ float v = nearbyintf({value}) + {zero};\n"
            f"  nlo += !(v >= {lo}.0f); nhi += v > {hi}.0f;\n"
            f"  if (!(v >= {lo}.0f)) v = {lo}.0f;  /* NaN saturates low, as in onnxruntime */\n"
            f"  if (v > {hi}.0f) v = {hi}.0f;\n"
            f"  {dest} = ({'int8_t' if info.min < 0 else 'uint8_t'})v; }}")


def flush_counters(counter: str) -> str:
    """C statement adding this share's clamp counts to ``counter``
    (``BlockEmitter.saturation_counter``); nothing for "" (a build that does not count)."""
    if not counter:
        return "(void)nlo; (void)nhi;"
    return f"{{ int64_t *sat = {counter}; sat[0] += nlo; sat[1] += nhi; }}"


# -- dynamic uint8 quantization (DynamicQuantizeLinear, and DynamicQuantizeLSTM's activations) ---
def uint8_params(lo: str, hi: str, scale: str, zero: str) -> str:
    """C statements setting floats ``scale`` and ``zero`` from the range [``lo``, ``hi``] (already
    widened to include 0) as ONNX's DynamicQuantizeLinear defines them: scale = range / 255, zero
    point = saturate(round(0 - lo / scale)); an all-zero range gets scale 1, as in onnxruntime
    (ONNX leaves 0 / 0 undefined)."""
    return (f"{scale} = ({hi} - {lo}) / 255.0f;\n"
            f"if ({scale} == 0.0f) {scale} = 1.0f;\n"
            f"{zero} = nearbyintf(0.0f - {lo} / {scale});\n"
            f"{zero} = {zero} < 0.0f ? 0.0f : ({zero} > 255.0f ? 255.0f : {zero});")


def uint8_quantize(x: str, scale: str, zero: str, dest: str) -> str:
    """C statement storing ``x`` quantized with ``scale`` and ``zero`` into uint8 ``dest``:
    rounded half to even, saturated to [0, 255], NaN to 0."""
    return (f"{{ float v = nearbyintf({x} / {scale}) + {zero}; if (!(v >= 0.0f)) v = 0.0f; "
            f"if (v > 255.0f) v = 255.0f; {dest} = (uint8_t)v; }}")


def quantize_run(v: VectorIsa | None, x: str, q: str, dtype: str, count: bool = False) -> list[str]:
    """C lines quantizing floats ``x[i..e)`` to 8-bit ``q`` (``dtype`` uint8 or int8) with the
    float locals ``s`` and ``z`` by QuantizeLinear's rule: ``x / s`` rounded half to even, plus
    ``z``, saturated, NaN to the low end. With ``v`` (a vector ISA with ``f32_round_even`` and
    the narrowing store ``i32_store_u8`` / ``i32_store_i8``) a vector at a time, the scalar rule's
    operations in its order in every lane (``max(f, low)`` sends NaN low as ``!(q >= low)``
    does), the tail by the scalar statement; without, the scalar statement throughout.

    The vector loop multiplies by ``r = 1/s`` where the ISA has ``f32_abs`` and ``f32_any_le``
    and both ``s`` and ``r`` are normal floats, and divides only a vector with a lane near a
    rounding boundary: the division was the loop's bound (vdivps: one vector in ~10 cycles on
    Intel's cores, against a multiply every half cycle). Why the codes are the division's: with
    ``r = RN(1/s)`` and ``t = RN(x * r)``, ``|t - x/s| <= 2^-23 |x/s|`` (two roundings of relative
    2^-24 each), and ``RN(x / s)`` is within ``2^-24 |x/s|`` of ``x/s``; so ``t`` and the
    division's quotient lie within ``2^-22 |t|`` of each other, and they round to different
    integers only if a half-integer lies between them or on one of them. A lane whose distance
    ``0.5 - |t - round(t)|`` to the nearest half-integer is at most ``2^-21 |t|`` sends its
    vector through the division (``t - round(t)`` is exact: Sterbenz). NaN and infinities give
    the division's NaN and infinities (an ordered compare passes them); beyond 2^22 every lane
    is flagged (and saturates either way).

    ``count``: the scalar statement throughout, adding its clamps to the locals ``nlo`` / ``nhi``
    (``SATURATION_COUNTERS``: the numeric debug build)."""
    info = np.iinfo(np.dtype(dtype))
    lo, hi, ct = f"{int(info.min)}.0f", f"{int(info.max)}.0f", "uint8_t" if info.min == 0 else "int8_t"
    lines = []
    if v is not None and not count:
        store = "i32_store_u8" if info.min == 0 else "i32_store_i8"
        quotient = v.op("div", "xv", "sv")
        if v.has("f32_abs") and v.has("f32_any_le"):
            gap = v.op("sub", "kh", v.x("f32_abs", a=v.op("sub", "t", v.x("f32_round_even", a="t"))))
            near = v.x("f32_any_le", a=gap, b=v.op("mul", v.x("f32_abs", a="t"), "kt"))
            recip = ["  const float r_ = 1.0f / s; const int by_r = isnormal(s) && isnormal(r_);",
                     f"  const {v.t} rv = {v.set1('r_')}, kh = {v.set1('0.5f')}, kt = {v.set1('0x1p-21f')};"]
            quot = [f"    {v.t} t = {v.op('mul', 'xv', 'rv')};",
                    f"    if (!by_r || {near}) t = {quotient};"]
        else:
            recip, quot = [], [f"    const {v.t} t = {quotient};"]
        lines = [f"{{ const {v.t} sv = {v.set1('s')}, zv = {v.set1('z')}, klo = {v.set1(lo)}, khi = {v.set1(hi)};",
                 *recip,
                 f"  for (; i + {v.lanes} <= e; i += {v.lanes}) {{",
                 f"    const {v.t} xv = {v.loadu(f'{x} + i')};",
                 *quot,
                 f"    {v.t} f = {v.op('add', v.x('f32_round_even', a='t'), 'zv')};",
                 f"    f = {v.op('min', v.op('max', 'f', 'klo'), 'khi')};  /* NaN: max gives the low end */",
                 f"    {v.x(store, p=f'{q} + i', a=v.x('f32_to_i32', a='f'))}",
                 "  } }"]
    tally = f"nlo += !(qv >= {lo}); nhi += qv > {hi}; " if count else ""
    return lines + [f"for (; i < e; ++i) {{ float qv = nearbyintf({x}[i] / s) + z; {tally}if (!(qv >= {lo})) qv = {lo}; "
                    f"if (qv > {hi}) qv = {hi}; {q}[i] = ({ct})qv; }}"]


def emit_dynamic_uint8(em: BlockEmitter, x: str, n: int, q: str | None, name: str) -> str:
    """Three steps quantizing the ``n`` floats at ``x`` to uint8 at ``q`` (None: only the
    parameters) with DynamicQuantizeLinear's rule: each share finds its part's range, one share
    combines them into scale and zero point, every share quantizes its part. Steps, not a
    barrier inside one, so shares can still be taken over by another thread. NaN is left out of
    the range (onnxruntime's range over NaN depends on the vector lane it falls in) and
    quantizes to 0. Returns the C pointer to the two floats [scale, zero point].

    Both passes run a vector at a time where the ISA has the conversions (the scalar statements
    for the tail): ``min(x, lo)`` keeps ``lo`` for a NaN ``x`` exactly as ``x < lo ? x : lo``
    does, and ``max(f, 0)`` sends NaN to 0 as ``!(v >= 0)`` does, so every byte is the scalar
    rule's. gcc left both loops scalar (a float min/max reduction it may not reorder, and a
    scale read through a pointer the uint8 stores might alias): 4.5x onnxruntime's time."""
    v = vector_isa(em.target)
    wide = v.vector and v.has("f32_round_even") and v.has("i32_store_u8")
    lanes = v.lanes if wide else 1
    part = em.scratch(2 * 4 * max(1, em.n_threads))  # per share: its minimum and maximum
    sc = em.scratch(2 * 4)
    scalar_range = "for (; i < e; ++i) { float v = X[i]; lo = v < lo ? v : lo; hi = v > hi ? v : hi; }"
    if wide:
        range_loop = [
            f"{v.t} vlo = {v.zero()}, vhi = vlo;",
            f"for (; i + {lanes} <= e; i += {lanes}) {{ const {v.t} xv = {v.loadu('X + i')}; "
            f"vlo = {v.op('min', 'xv', 'vlo')}; vhi = {v.op('max', 'xv', 'vhi')}; }}",
            f"float tl[{lanes}], th[{lanes}]; {v.storeu('tl', 'vlo')}; {v.storeu('th', 'vhi')};",
            f"for (int l = 0; l < {lanes}; ++l) {{ lo = tl[l] < lo ? tl[l] : lo; hi = th[l] > hi ? th[l] : hi; }}"]
    else:
        range_loop = []
    em.step("\n".join([f"const float *restrict X = {x};", f"float *P = {part};",
                       f"long b, e; smelt_range({n}, tid, nt, &b, &e);",
                       "float lo = 0.0f, hi = 0.0f; long i = b;", *range_loop, scalar_range,
                       "P[2 * tid] = lo; P[2 * tid + 1] = hi;"]), name=f"{name}_range")
    em.step(f"const float *P = {part};\nfloat *SC = {sc};\n"
            "if (tid == 0) {\n"
            "    float lo = P[0], hi = P[1];\n"
            "    for (int t = 1; t < nt; ++t) { lo = P[2 * t] < lo ? P[2 * t] : lo; hi = P[2 * t + 1] > hi ? P[2 * t + 1] : hi; }\n"
            "    " + uint8_params("lo", "hi", "SC[0]", "SC[1]").replace("\n", "\n    ") + "\n"
            "}", name=f"{name}_scale")
    if q is not None:
        em.step("\n".join([f"const float *restrict X = {x};", f"uint8_t *restrict Q = {q};",
                           # the parameters in locals: a uint8 store may alias what SC points at
                           f"const float s = ({sc})[0], z = ({sc})[1];",
                           f"long i, e; smelt_range({n}, tid, nt, &i, &e);",
                           *quantize_run(v if wide else None, "X", "Q", "uint8")]),
                name=f"{name}_quantize")
    return sc
