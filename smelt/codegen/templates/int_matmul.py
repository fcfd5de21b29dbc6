"""Integer matrix products: MatMulInteger (int32 out) and QLinearMatMul (requantized int8/uint8 out).

Template ``int_matmul``: per output row, an int32 accumulator row over K, each step adding
``(a - a_zero) * (b - b_zero)`` for one row of B. A constant B is stored once as int16 with its
zero point already subtracted (exact: the difference of two 8-bit values fits 9 bits), so the
inner loop is one widening multiply-add per element, which gcc vectorizes at the target's width;
a B fed at run time subtracts its zero point in the loop. The int32 sum is exact (K * 2^16 < 2^31
for K up to 32768; longer K falls back), so MatMulInteger equals onnxruntime's bit for bit.

QLinearMatMul requantizes each sum as onnxruntime does: ``nearbyintf((float)acc * m) + y_zero``
saturated, with the float multiplier ``m = a_scale * b_scale / y_scale`` (per row of A and per
column of B when those scales are 1-D), NaN and infinite results saturating as in QuantizeLinear.
float16 scales (opset 21) are widened to float first: onnxruntime's multiplier, bit for bit.

Work is split over (batch, row) pairs, or over column chunks when there are fewer rows than
threads (a matrix-vector product). A batch of B is either absent (one 2-D B for every batch of
A) or equal to A's; other broadcasts fall back. These are portable kernels: the VNNI/AMX
micro-kernels of the quantization issue replace the inner loop, not this template's contract.
"""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import BlockEmitter
from smelt.codegen.kernels import half
from smelt.codegen.kernels.int_gemm import (
    MAX_K,
    PAIR,
    QUAD,
    SATURATION_COUNTERS,
    flush_counters,
    pack_b,
    pair_word,
    quad_offsets,
    quad_shift,
    quad_sum,
    quad_weights,
    quad_word,
    requantize,
    tile_loop,
)
from smelt.codegen.kernels.isa import VectorIsa, vector_isa, with_int_dot
from smelt.codegen.kernels.loops import dtype_name
from smelt.codegen.registry import register
from smelt.ir.graph import PLAIN, Graph, Node
from smelt.ir.types import c_type
from smelt.schedule.gemm import PARALLEL_MIN_MACS, int_dot_tile, int_tiles_rows_inner

EIGHT_BIT = ("int8", "uint8")
# QLinearMatMul scales (float16 ones, opset 21, are widened exactly and multiplied in float, as
# onnxruntime does: the float32 path's multiplier)
SCALE_TYPES = ("float32", "float16")


def _per_vector(g: Graph, name: str, length: int) -> str | None:
    """'scalar', 'vector' (1-D of ``length``) or None when the shape is neither."""
    shape = tuple(g.values[name].shape)
    if int(np.prod(shape, dtype=np.int64)) == 1 and len(shape) <= 1:
        return "scalar"
    if shape == (length,):
        return "vector"
    return None


def _io(node: Node) -> dict[str, str]:
    """The node's operands by role (absent optional zero points as "")."""
    ins = list(node.inputs) + [""] * 8
    if node.op == "MatMulInteger":
        return {"a": ins[0], "b": ins[1], "az": ins[2], "bz": ins[3]}
    return {"a": ins[0], "as": ins[1], "az": ins[2], "b": ins[3], "bs": ins[4], "bz": ins[5],
            "ys": ins[6], "yz": ins[7]}


def _dims(g: Graph, io: dict[str, str]) -> tuple[int, int, int, int, bool] | str:
    """(batch, M, K, N, B has the batch) or why not native."""
    a, b = g.values[io["a"]].shape, g.values[io["b"]].shape
    if len(a) < 2 or len(b) < 2:
        return "native integer MatMul needs 2-D or batched operands (no 1-D promotion)"
    if len(b) > 2 and tuple(b[:-2]) != tuple(a[:-2]):
        return f"B's batch dims {list(b[:-2])} are not A's {list(a[:-2])} (only a shared 2-D B or equal batches)"
    if a[-1] != b[-2]:
        return f"inner dims differ: A {list(a)}, B {list(b)}"
    if a[-1] > MAX_K:
        return f"K = {a[-1]} > {MAX_K}: the int32 sum could overflow"
    batch = int(np.prod(a[:-2], dtype=np.int64))
    return batch, int(a[-2]), int(a[-1]), int(b[-1]), len(b) > 2


def _check(node: Node, g: Graph) -> str | None:
    io = _io(node)
    names = [n for n in node.inputs + node.outputs if n]
    if any(g.values[n].layout != PLAIN for n in names):
        return f"{node.op} reads plain layouts only"
    for role in ("a", "b"):
        if dtype_name(g, io[role]) not in EIGHT_BIT:
            return f"{role.upper()} of dtype {dtype_name(g, io[role])}: native {node.op} takes int8/uint8"
    for role, zp in (("a", "az"), ("b", "bz")):
        if io[zp] and dtype_name(g, io[zp]) != dtype_name(g, io[role]):
            return f"zero point {io[zp]!r} is not of its operand's dtype"
    dims = _dims(g, io)
    if isinstance(dims, str):
        return dims
    _, m, _, n, _ = dims
    for key, length in (("az", m), ("as", m), ("bz", n), ("bs", n), ("ys", 1), ("yz", 1)):
        if io.get(key) and _per_vector(g, io[key], length) is None:
            return (f"{io[key]!r} of shape {list(g.values[io[key]].shape)}: native {node.op} takes a scalar "
                    f"or a 1-D per-{'row' if key[0] == 'a' else 'column'} value")
    if node.op == "QLinearMatMul":
        for key in ("as", "bs", "ys"):
            if dtype_name(g, io[key]) not in SCALE_TYPES:
                return f"scale {io[key]!r} is {dtype_name(g, io[key])}: native QLinearMatMul takes float32/float16"
        if dtype_name(g, node.outputs[0]) not in EIGHT_BIT:
            return "QLinearMatMul output must be int8/uint8"
    elif dtype_name(g, node.outputs[0]) != "int32":
        return "MatMulInteger output must be int32"
    return None


def _requant(node: Node, g: Graph, io: dict[str, str], em: BlockEmitter) -> tuple[list[str], str]:
    """Declarations and the statement storing int32 ``ACC`` at row ``i``, column ``j`` into
    ``Y[yoff + j]``: as is (MatMulInteger) or requantized (QLinearMatMul)."""
    yt = c_type(dtype_name(g, node.outputs[0]))
    decl = [f"{yt} *restrict Y = (void *){em.ptr(node.outputs[0])};"]
    if node.op != "QLinearMatMul":
        return decl, "Y[yoff + j] = ACC;"
    for key in ("as", "bs", "ys"):
        decl.append(f"const {c_type(dtype_name(g, io[key]))} *restrict {key.upper()} = {em.ptr(io[key])};")
    if any(dtype_name(g, io[key]) == "float16" for key in ("as", "bs", "ys")):
        half.half_helpers(em)
    scale = lambda key, index: half.load(dtype_name(g, io[key]), f"{key.upper()}[{index}]")  # noqa: E731
    if io["yz"]:
        decl.append(f"const {yt} *restrict YZ = {em.ptr(io['yz'])};")
    _, m, _, n, _ = _dims(g, io)  # type: ignore[misc]
    a_scale = scale("as", "i" if _per_vector(g, io["as"], m) == "vector" else "0")
    b_scale = scale("bs", "j" if _per_vector(g, io["bs"], n) == "vector" else "0")
    y_zero = "(float)YZ[0]" if io["yz"] else "0.0f"
    decl.append(SATURATION_COUNTERS)
    return decl, requantize(f"(float)ACC * (({a_scale} * {b_scale}) / {scale('ys', '0')})", y_zero,
                            dtype_name(g, node.outputs[0]), "Y[yoff + j]")


def _zp_read(g: Graph, io: dict[str, str], key: str, index: str, length: int) -> str:
    if not io[key]:
        return "0"
    kind = _per_vector(g, io[key], length)
    return f"(int32_t){key.upper()}[{index if kind == 'vector' else '0'}]"


def _b_minus_zero(g: Graph, io: dict[str, str]) -> np.ndarray:
    """Constant B with its zero point (scalar or per column) subtracted, as int16 (exact)."""
    b = np.asarray(g.values[io["b"]].const).astype(np.int16)
    if io["bz"]:
        b = b - np.asarray(g.values[io["bz"]].const).astype(np.int16)
    return b


@register(("MatMulInteger", "QLinearMatMul"), check=_check, name="int_matmul")
def emit_int_matmul(node: Node, g: Graph, em: BlockEmitter) -> None:
    io = _io(node)
    b_const = g.values[io["b"]].const is not None and (not io["bz"] or g.values[io["bz"]].const is not None)
    v = with_int_dot(vector_isa(em.target), em.target)
    if v.has("i16_dot_acc"):
        _emit_register_tiled(node, g, em, io, v, b_const)
    else:
        _emit_rows(node, g, em, io, b_const)


def _emit_register_tiled(node: Node, g: Graph, em: BlockEmitter, io: dict[str, str], v: VectorIsa,
                         b_const: bool = True) -> None:
    """A constant B packed per NR-column panel at compile time (a run-time B, attention's
    ``Q K^T`` in a QDQ transformer: packed per call, in a step of its own), A packed per call,
    then the shared register tile (``kernels/int_gemm.py``) per (batch, row block, column
    panel; row blocks innermost where that streams fewer bytes: ``int_tiles_rows_inner``):
    int16 pairs with both zero points subtracted, or, on VNNI hosts for uint8 A and an 8-bit B
    of constant zero point (constant, or at run time where the vector requantization applies),
    raw byte quads (vpdpbusd) with A's zero point times B's column sums taken off and B's
    offsets times A's row sums added."""
    batch, m, k, n, b_batched = _dims(g, io)  # type: ignore[misc]
    mr, nv = int_dot_tile(v.registers, m)
    nr = nv * v.lanes
    bz_const = not io["bz"] or g.const(io["bz"]) is not None
    bz = g.const(io["bz"]) if io["bz"] and bz_const else None
    # the quad form (vpdpbusd) on VNNI hosts for uint8 A and any 8-bit B of constant zero point:
    # uint8 B or a nonzero zero point through int8 bytes and a row-sum correction
    # (kernels/int_gemm.py). A constant B is packed at compile time; a run-time B (attention's
    # Q K^T and P V in a QDQ transformer, uint8 on both sides) per call, with its column sums,
    # where the vector requantization takes them (else int16 pairs)
    quad = (v.has("u8s8_dot_acc") and dtype_name(g, io["a"]) == "uint8" and dtype_name(g, io["b"]) in EIGHT_BIT
            and bz_const and (b_const or _vector_requant_applies(node, g, io, v, quad=True)))
    group = QUAD if quad else PAIR
    kw = -(-k // group)
    nb = -(-n // nr)
    groups = batch if b_batched else 1
    offsets = None  # B - b_zero - int8 bytes per column, where not all zero
    colsums = runtime_nz = None
    zero = bz if bz is not None else np.zeros(1, np.int32)
    if quad and b_const:
        b_int8, colsums, offsets = quad_weights(np.asarray(g.values[io["b"]].const).reshape(-1, k, n), zero)
        packed = pack_b(b_int8, nr, QUAD)
    elif quad:
        offsets = quad_offsets(np.dtype(dtype_name(g, io["b"])), zero, groups, n)
        b_panels = em.scratch(groups * nb * kw * nr * QUAD, "int8")
        runtime_nz = em.scratch(4 * groups * nb * nr, "int32")
        _emit_pack_b_quads(g, em, io, b_panels, runtime_nz, groups=groups, k=k, n=n, nr=nr, kw=kw)
    elif b_const:
        packed = pack_b(_b_minus_zero(g, io).reshape(-1, k, n), nr, PAIR)
    else:
        b_panels = em.scratch(2 * groups * nb * kw * nr * PAIR, "int16")
        _emit_pack_b(g, em, io, b_panels, groups=groups, k=k, n=n, nr=nr, kw=kw)
    if offsets is not None and not np.any(offsets):
        offsets = None
    at = c_type(dtype_name(g, io["a"]))
    rows = batch * m
    ap = em.scratch(4 * rows * kw, "int32")
    rs = em.scratch(4 * rows, "int32") if offsets is not None else None  # A's row sums
    decl_a = [f"const {at} *restrict A = {em.ptr(io['a'])};", f"int32_t *restrict Ap = {ap};"]
    row_sum = []
    if rs is not None:
        decl_a.append(f"int32_t *restrict RS = {rs};")
        row_sum = [f"    {{ int32_t s = 0; for (long kk = 0; kk < {k}; ++kk) s += ar[kk]; RS[r] = s; }}"]
    if io["az"]:
        decl_a.append(f"const {at} *restrict AZ = {em.ptr(io['az'])};")
    parallel = rows * k * n >= PARALLEL_MIN_MACS
    split = "smelt_range({total}, tid, nt, &wb, &we);" if parallel else "wb = 0; we = tid == 0 ? {total} : 0;"
    if quad:  # raw bytes, K padded with zeros (B is 0 there)
        byte = lambda b: f"({group} * q + {b} < {k} ? ar[{group} * q + {b}] : 0)"  # noqa: E731
        word = quad_word([byte(b) for b in range(4)])
    else:
        hi = f"2 * q + 1 < {k} ? (int32_t)ar[2 * q + 1] - za : 0"
        word = pair_word("(int32_t)ar[2 * q] - za", hi)
    em.step("\n".join(decl_a + [
        "long wb, we; " + split.format(total=rows),
        "for (long r = wb; r < we; ++r) {",
        f"    const int32_t za = {_zp_read(g, io, 'az', f'(r % {m})', m)}; (void)za;",
        f"    const {at} *restrict ar = A + r * {k};",
        f"    for (long q = 0; q < {kw}; ++q) Ap[r * {kw} + q] = {word};",
        *row_sum,
        "}"]), name="int_matmul_pack_a",
        doc=f"A {'as raw byte quads' if quad else '- zero point as int16 pairs'}{' and row sums' if row_sum else ''}, K={k}")
    tile = em.scratch(4 * mr * nr * max(1, em.n_threads), "int32")
    decl, store = _requant(node, g, io, em)
    blocks_m = -(-m // mr)
    panel = f"Bp + ({'bi * ' + str(nb) + ' + ' if b_batched else ''}cb) * {kw * nr * group}L"
    kernel = tile_loop(v, mr, nv, k2=kw, a_row=f"Ap + (bi * {m} + i0 + SMELT_MIN({{r}}, mr - 1)) * {kw}L",
                       b_panel=panel, tile="T", group=group)
    acc = f"T[r * {nr} + jj]"
    vreq = _vector_requant(node, g, em, io, v, colsums=colsums, groups=groups, n=n, nb=nb,
                           nr=nr, m=m, offsets=offsets, k=k, row_sums=rs, runtime_nz=runtime_nz)
    assert vreq is not None or runtime_nz is None  # (the run-time quad form only where it applies)
    if quad and vreq is None:  # the scalar store takes A's zero point times the column sums off
        decl = decl + [f"const int32_t *restrict CS = {em.weight(colsums)};"]
        if io["az"]:
            decl.append(f"const {at} *restrict AZ = {em.ptr(io['az'])};")
        if offsets is not None:
            decl += [f"const int32_t *restrict OFF = {em.weight(offsets)};", f"const int32_t *restrict RS = {rs};"]
        acc = quad_sum(f"T[r * {nr} + jj]", _zp_read(g, io, "az", "i", m),
                       f"{'bi * ' + str(n) + ' + ' if b_batched else ''}j", k,
                       None if offsets is None else f"bi * {m} + i")
    b_ptr = em.weight(packed) if b_const else b_panels
    lines = decl + [
        f"const {'int8_t' if quad else 'int16_t'} *restrict Bp = {b_ptr};",
        f"const int32_t *restrict Ap = {ap};",
        f"int32_t *restrict T = {tile} + (long)tid * {mr * nr};",
        "long wb, we; " + split.format(total=batch * blocks_m * nb),
        "for (long p = wb; p < we; ++p) {",
        (f"    const long mb = p % {blocks_m}, cb = (p / {blocks_m}) % {nb}, bi = p / {nb * blocks_m};"
         if int_tiles_rows_inner(blocks_m, nb, 4 * m * kw, 4 * kw * nb * nr, em.target.l1d_bytes) else  # (4-byte words)
         f"    const long cb = p % {nb}, mb = (p / {nb}) % {blocks_m}, bi = p / {nb * blocks_m};"),
        f"    const long i0 = mb * {mr}, mr = SMELT_MIN({mr}, {m} - i0);",
        *["    " + line for line in kernel],
        f"    const long jn = SMELT_MIN({nr}, {n} - cb * {nr});"]
    if vreq is not None:
        vdecl, vstore = vreq
        lines[len(decl):len(decl)] = vdecl
        lines += ["    " + line for line in vstore]
    else:
        lines += [
            "    for (long r = 0; r < mr; ++r) {",
            f"        const long i = i0 + r, yoff = (bi * {m} + i) * {n} + cb * {nr};",
            "        for (long jj = 0; jj < jn; ++jj) {",
            f"            const long j = cb * {nr} + jj; (void)j; (void)i;",
            f"            const int32_t ACC = {acc};",
            "            " + store.replace("Y[yoff + j]", "Y[yoff + jj]").replace("\n", "\n            "),
            "        }",
            "    }"]
    lines.append("}")
    if vreq is not None:
        lines += [f"{{ int32_t cl[{v.lanes}], ch[{v.lanes}]; {v.x('i32_storeu', p='cl', a='vlo')} "
                  f"{v.x('i32_storeu', p='ch', a='vhi')}",
                  f"  for (int l = 0; l < {v.lanes}; ++l) {{ nlo += cl[l]; nhi += ch[l]; }} }}"]
    if node.op == "QLinearMatMul":
        lines.append(flush_counters(em.saturation_counter(node.outputs[0])))
    dot = "u8s8_dot_acc" if quad else "i16_dot_acc"
    em.schedule(algorithm=(("u8 x s8 quad dot products, A's zero point times B's column sums off after"
                            + (", B as int8 bytes with A's row sums times its offset" if offsets is not None else "")
                           + ("" if b_const else ", B's bytes and column sums packed per call"))
                           if quad
                           else "int16 pair dot products into int32, B - zero point packed per panel"
                           + (", A packed per call" if b_const else ", A and B packed per call")),
                kernel="int_matmul", micro_kernel=f"{mr}x{nr} {v.name} {v.x(dot, a='a', b='b', c='c')}",
                layout="NCHW")
    em.step("\n".join(lines), name=f"int_matmul_{mr}x{nr}_{v.name}{'_u8s8' if quad else ''}",
            doc=f"M={m} K={k} N={n} batch={batch}, {node.op}, packed B, {mr}x{nr} register tile")


def _vector_requant_applies(node: Node, g: Graph, io: dict[str, str], v: VectorIsa, *, quad: bool) -> bool:
    """Whether ``_vector_requant`` renders this node (its docstring says when it does not); for
    the quad form, also where B's offsets need A's row sums (``i32_mullo``)."""
    if node.op != "QLinearMatMul" or not v.vector or not v.has("f32_round_even"):
        return False
    if any(dtype_name(g, io[key]) != "float32" for key in ("as", "bs", "ys")):
        return False  # float16 scales (opset 21): the scalar path widens them
    if _per_vector(g, io["bs"], _dims(g, io)[3]) == "vector" and g.const(io["bs"]) is None:  # type: ignore[index]
        return False
    az = g.const(io["az"]) if io["az"] else np.zeros(1, np.int32)
    return not quad or (az is not None and az.size == 1 and v.has("i32_mullo"))


def _vector_requant(node: Node, g: Graph, em: BlockEmitter, io: dict[str, str], v: VectorIsa, *,
                    colsums: np.ndarray | None, groups: int, n: int, nb: int, nr: int, m: int,
                    offsets: np.ndarray | None = None, k: int = 0,
                    row_sums: str | None = None, runtime_nz: str | None = None) -> tuple[list[str], list[str]] | None:
    """Declarations and the per-tile C storing a QLinearMatMul tile ``T`` requantized a vector
    at a time: the scalar statement's operations in the same order in every lane (the
    multiplier ``(a_scale * b_scale) / y_scale``, the product with the float sum, rounding half
    to even, the zero point, the clamps with NaN to the low end, the clamp counters), so the
    bytes are the scalar path's; each vector goes through an int32 buffer into its valid
    columns. None where the scalar path must run: not QLinearMatMul, no vector integer
    conversions, float16 scales, B's scales given at run time per column, or (the quad form) a zero point of A
    that is not a compile-time scalar. At ~3 ns an element the scalar requantization cost as
    much as the products of a K = 384 MatMul (a QDQ transformer's projections). ``runtime_nz``:
    the quad form of a run-time B, whose negated column sums times A's zero point the packing
    step wrote there (``_emit_pack_b_quads``)."""
    quad = colsums is not None or runtime_nz is not None
    if not _vector_requant_applies(node, g, io, v, quad=False):
        return None
    bs = g.const(io["bs"])
    az = g.const(io["az"]) if io["az"] else np.zeros(1, np.int32)
    if quad and (az is None or az.size != 1):
        return None
    if offsets is not None and not v.has("i32_mullo"):
        return None
    y_type = dtype_name(g, node.outputs[0])
    info = np.iinfo(np.dtype(y_type))
    it, lanes = v.x("itype"), v.lanes
    decl = [f"const {v.t} lov = {v.set1(f'{float(info.min)!r}f')}, hiv = {v.set1(f'{float(info.max)!r}f')};",
            f"{it} vlo = {v.x('i32_set1', a='0')}, vhi = vlo;  /* clamps per lane (numeric debug counters) */"]
    if _per_vector(g, io["bs"], n) == "vector":  # per column: padded to whole panels
        padded = np.zeros(nb * nr, np.float32)
        padded[:n] = bs.astype(np.float32).reshape(-1)
        decl.append(f"const float *restrict BSV = {em.weight(padded)};")
        b_scale = lambda j0: v.loadu(f"BSV + cb * {nr} + {j0}")  # noqa: E731
    else:
        b_scale = lambda j0: v.set1("BS[0]")  # noqa: E731
    if runtime_nz is not None:  # the same, written per call by B's packing step
        decl.append(f"const int32_t *restrict NZ = {runtime_nz};")
    elif quad:  # A's zero point times B's column sums, negated, per group and padded column
        neg = np.zeros((colsums.shape[0], nb * nr), np.int64)
        neg[:, :n] = -int(az.reshape(-1)[0]) * colsums.astype(np.int64)
        decl.append(f"const int32_t *restrict NZ = {em.weight(neg.astype(np.int32))};")
    if offsets is not None:  # B's offset from its int8 bytes times (A's row sum - K a_zero)
        off = np.zeros((offsets.shape[0], nb * nr), np.int32)
        off[:, :n] = offsets
        decl += [f"const int32_t *restrict OFF = {em.weight(off)};", f"const int32_t *restrict RS = {row_sums};"]
    a_scale = "AS[i]" if _per_vector(g, io["as"], m) == "vector" else "AS[0]"
    y_zero = v.set1("(float)YZ[0]") if io["yz"] else v.zero()
    yt = c_type(y_type)
    body = [f"const long i = i0 + r, yoff = (bi * {m} + i) * {n} + cb * {nr};",
            f"const {v.t} asv = {v.set1(a_scale)}, ysv = {v.set1('YS[0]')}, yzv = {y_zero};",
            f"for (long j0 = 0; j0 < jn; j0 += {lanes}) {{",
            f"    {it} acc = {v.x('i32_loadu', p=f'T + r * {nr} + j0')};"]
    if quad:
        nz = f"NZ + {'bi' if groups > 1 else '0'} * {nb * nr}L + cb * {nr} + j0"
        body.append(f"    acc = {v.x('i32_add', a='acc', b=v.x('i32_loadu', p=nz))};")
    if offsets is not None:
        body.insert(2, f"const {it} rtv = {v.x('i32_set1', a=f'RS[bi * {m} + i] - {k} * {int(az.reshape(-1)[0])}')};")
        offp = f"OFF + {'bi' if groups > 1 else '0'} * {nb * nr}L + cb * {nr} + j0"
        body.append(f"    acc = {v.x('i32_add', a='acc', b=v.x('i32_mullo', a='rtv', b=v.x('i32_loadu', p=offp)))};")
    body += [f"    const {v.t} mv = {v.op('div', v.op('mul', 'asv', b_scale('j0')), 'ysv')};",
             f"    {v.t} f = {v.x('f32_round_even', a=v.op('mul', v.x('i32_to_f32', a='acc'), 'mv'))};",
             f"    f = {v.op('add', 'f', 'yzv')};",
             f"    vlo = {v.x('f32_nge_count', a='f', b='lov', c='vlo')}; vhi = {v.x('f32_gt_count', a='f', b='hiv', c='vhi')};",
             f"    f = {v.op('min', v.op('max', 'f', 'lov'), 'hiv')};  /* NaN: max gives the low end */"]
    # a whole vector of uint8 codes by one narrowing store (the lanes are in [0, 255] already);
    # element by element the stores cost as much as a short-K product's dots (attention's Q K^T)
    whole = ([f"    if (j0 + {lanes} <= jn) {{ {v.x('i32_store_u8', p='Y + yoff + j0', a=v.x('f32_to_i32', a='f'))} continue; }}"]
             if y_type == "uint8" and v.has("i32_store_u8") else [])
    body += whole + [
             f"    int32_t qt[{lanes}]; {v.x('i32_storeu', p='qt', a=v.x('f32_to_i32', a='f'))}",
             f"    const long cnt = SMELT_MIN({lanes}, jn - j0);",
             f"    for (long l = 0; l < cnt; ++l) Y[yoff + j0 + l] = ({yt})qt[l];",
             "}"]
    return decl, ["for (long r = 0; r < mr; ++r) {"] + ["    " + b for b in body] + ["}"]


def _emit_pack_b(g: Graph, em: BlockEmitter, io: dict[str, str], dest: str, *, groups: int, k: int, n: int,
                 nr: int, kw: int) -> None:
    """A run-time B [groups, K, N] into ``dest`` as ``pack_b`` lays a constant one out (int16
    pairs along K, zero point subtracted, per NR-column panel, K and N padded with zeros); the
    panels split between threads."""
    nb = -(-n // nr)
    bt = c_type(dtype_name(g, io["b"]))
    zp = _zp_read(g, io, "bz", "j", n)
    lines = [f"const {bt} *restrict B = {em.ptr(io['b'])};", f"int16_t *restrict P = {dest};"]
    if io["bz"]:
        lines.append(f"const {bt} *restrict BZ = {em.ptr(io['bz'])};")
    lines += [
        f"long wb, we; smelt_range({groups * nb}, tid, nt, &wb, &we);",
        "for (long p = wb; p < we; ++p) {",
        f"    const long gi = p / {nb}, cb = p % {nb};",
        f"    const {bt} *restrict Bg = B + gi * {k * n}L;",
        f"    int16_t *restrict out = P + p * {kw * nr * PAIR}L;",
        f"    for (long q = 0; q < {kw}; ++q) {{",
        f"        for (long jj = 0; jj < {nr}; ++jj) {{",
        f"            const long j = cb * {nr} + jj;",
        "            int16_t lo = 0, hi = 0;",
        f"            if (j < {n}) {{",
        f"                const int32_t z = {zp};",
        f"                lo = (int16_t)((int32_t)Bg[2 * q * {n}L + j] - z);",
        f"                if (2 * q + 1 < {k}) hi = (int16_t)((int32_t)Bg[(2 * q + 1) * {n}L + j] - z);",
        "            }",
        f"            out[(q * {nr} + jj) * 2] = lo; out[(q * {nr} + jj) * 2 + 1] = hi;",
        "        }",
        "    }",
        "}"]
    em.step("\n".join(lines), name="int_matmul_pack_b",
            doc=f"run-time B - zero point as int16 pairs, {groups} x K={k} x N={n}, {nr}-column panels")


def _emit_pack_b_quads(g: Graph, em: BlockEmitter, io: dict[str, str], dest: str, nz: str, *, groups: int, k: int,
                       n: int, nr: int, kw: int) -> None:
    """A run-time 8-bit B [groups, K, N] into ``dest`` as ``pack_b`` lays out a constant one in
    the quad form (int8 bytes: uint8 shifted down by 128, K and the last panel's columns padded
    with zeros), and into ``nz`` [groups][panels * nr] each column's byte sum times minus A's
    (compile-time) zero point: what ``_vector_requant`` adds back; the panels split between
    threads. B's zero point is in the offsets, known at compile time (``quad_offsets``)."""
    nb = -(-n // nr)
    bt = c_type(dtype_name(g, io["b"]))
    shift = quad_shift(np.dtype(dtype_name(g, io["b"])))
    az = int(np.asarray(g.const(io["az"])).reshape(-1)[0]) if io["az"] else 0
    lines = [f"const {bt} *restrict B = {em.ptr(io['b'])};", f"int8_t *restrict P = {dest};",
             f"int32_t *restrict NZ = {nz};",
             f"long wb, we; smelt_range({groups * nb}, tid, nt, &wb, &we);",
             "for (long p = wb; p < we; ++p) {",
             f"    const long gi = p / {nb}, cb = p % {nb}, jn = SMELT_MIN({nr}, {n} - cb * {nr});",
             f"    const {bt} *restrict Bg = B + gi * {k * n}L + cb * {nr};",
             f"    int8_t *restrict out = P + p * {kw * nr * QUAD}L;",
             f"    int32_t s[{nr}] = {{0}};",
             f"    for (long q = 0; q < {kw}; ++q)",
             f"        for (long t = 0; t < {QUAD}; ++t) {{",
             f"            const long kk = {QUAD} * q + t;",
             f"            for (long jj = 0; jj < {nr}; ++jj) {{",
             f"                const int8_t b = kk < {k} && jj < jn ? (int8_t)((int32_t)Bg[kk * {n}L + jj] - {shift}) : 0;",
             f"                out[(q * {nr} + jj) * {QUAD} + t] = b;",
             "                s[jj] += b;",
             "            }",
             "        }",
             f"    for (long jj = 0; jj < {nr}; ++jj) NZ[p * {nr} + jj] = -{az} * s[jj];",
             "}"]
    em.step("\n".join(lines), name="int_matmul_pack_b_quads",
            doc=f"run-time B as int8 quad bytes and column sums, {groups} x K={k} x N={n}, {nr}-column panels")


def _emit_rows(node: Node, g: Graph, em: BlockEmitter, io: dict[str, str], b_const: bool) -> None:
    """Portable C (or a run-time B): per output row, an int32 accumulator row over K."""
    batch, m, k, n, b_batched = _dims(g, io)  # type: ignore[misc]
    at, bt = c_type(dtype_name(g, io["a"])), c_type(dtype_name(g, io["b"]))
    decl = [f"const {at} *restrict A = {em.ptr(io['a'])};"]
    for key in ("az", "bz") if not b_const else ("az",):
        if io[key]:
            decl.append(f"const {c_type(dtype_name(g, io[key]))} *restrict {key.upper()} = {em.ptr(io[key])};")
    if b_const:  # B - b_zero once, as int16, at compile time
        decl.append(f"const int16_t *restrict Bq = {em.weight(_b_minus_zero(g, io))};")
        b_elem = "(int32_t)Bq[boff + j]"
    else:
        decl.append(f"const {bt} *restrict B = {em.ptr(io['b'])};")
        b_elem = f"((int32_t)B[boff + j] - {_zp_read(g, io, 'bz', 'j', n)})"
    ydecl, store = _requant(node, g, io, em)
    # split rows when there are enough of them, else columns (a matrix-vector product)
    rows = batch * m
    col_chunks = 1 if rows >= 2 * em.n_threads else max(1, min(-(-n // 64), 2 * em.n_threads))
    chunk = -(-n // col_chunks)
    parallel = rows * k * n >= PARALLEL_MIN_MACS
    acc = em.scratch(4 * chunk * max(1, em.n_threads), "int32")
    items = rows * col_chunks
    split = (f"long wb, we; smelt_range({items}, tid, nt, &wb, &we);" if parallel
             else f"long wb = 0, we = tid == 0 ? {items} : 0;")
    body = "\n".join(decl + ydecl + [
        f"int32_t *restrict acc = {acc} + (long)tid * {chunk};",
        split,
        "for (long p = wb; p < we; ++p) {",
        f"    const long r = p / {col_chunks}, i = r % {m}, bi = r / {m};",
        f"    const long jb = (p % {col_chunks}) * {chunk}, je = SMELT_MIN(jb + {chunk}, {n});",
        f"    const long aoff = r * {k}, yoff = r * {n};",
        f"    const long bbase = {f'bi * {k * n}' if b_batched else '0'};",
        "    (void)bi;",
        "    for (long j = jb; j < je; ++j) acc[j - jb] = 0;",
        f"    for (long kk = 0; kk < {k}; ++kk) {{",
        f"        const int32_t av = (int32_t)A[aoff + kk] - {_zp_read(g, io, 'az', 'i', m)};",
        f"        const long boff = bbase + kk * {n};",
        f"        for (long j = jb; j < je; ++j) acc[j - jb] += av * {b_elem};",
        "    }",
        "    for (long j = jb; j < je; ++j) {",
        "        const int32_t ACC = acc[j - jb];",
        "        " + store.replace("\n", "\n        "),
        "    }",
        "}"] + ([flush_counters(em.saturation_counter(node.outputs[0]))] if node.op == "QLinearMatMul" else []))
    em.schedule(algorithm="int32 row accumulation, B - zero point packed as int16 when constant",
                kernel="int_matmul", layout="NCHW")
    em.step(body, name="int_matmul_rows",
            doc=f"M={m} K={k} N={n} batch={batch}, {node.op}, {'packed' if b_const else 'run-time'} B")
