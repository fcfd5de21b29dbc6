"""Integer 2-D convolutions: ConvInteger (int32 out) and QLinearConv (requantized int8/uint8 out).

Template ``int_conv``: per (image, group), an im2col step writes each output pixel's receptive
field, minus the input zero point, as int16 pair words (padding is the zero point, so it packs
as 0); then the integer GEMM tile of ``kernels/int_gemm.py`` multiplies those rows by the
weights, packed at compile time per group as int16 pairs of W - w_zero (scalar or per output
channel), and writes int32 sums straight into NCHW. Exact, so ConvInteger equals onnxruntime.

QLinearConv adds the int32 bias to the sum and requantizes like QLinearMatMul:
``nearbyintf((float)(acc + bias) * (x_scale * w_scale[oc] / y_scale)) + y_zero``, saturated,
NaN low. Portable C (the scalar ISA) runs the same im2col rows through plain int32 loops.

2-D only (4-D tensors), explicit pads or VALID; other ranks and SAME_* fall back with the reason.
"""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import BlockEmitter
from smelt.codegen.kernels.int_gemm import (
    MAX_K,
    PAIR,
    QUAD,
    SATURATION_COUNTERS,
    flush_counters,
    pack_b,
    pair_word,
    quad_sum,
    quad_weights,
    requantize,
    tile_loop,
)
from smelt.codegen.kernels.isa import vector_isa, with_int_dot
from smelt.codegen.kernels.loops import dtype_name
from smelt.codegen.registry import register
from smelt.ir.graph import PLAIN, Graph, Node
from smelt.ir.types import c_type
from smelt.schedule.gemm import PARALLEL_MIN_MACS, int_dot_tile, int_tiles_rows_inner
from smelt.schedule.int_conv import IntConvSchedule

EIGHT_BIT = ("int8", "uint8")


def _io(node: Node) -> dict[str, str]:
    ins = list(node.inputs) + [""] * 9
    if node.op == "ConvInteger":
        return {"x": ins[0], "w": ins[1], "xz": ins[2], "wz": ins[3]}
    return {"x": ins[0], "xs": ins[1], "xz": ins[2], "w": ins[3], "ws": ins[4], "wz": ins[5], "ys": ins[6],
            "yz": ins[7], "b": ins[8]}


def _const(g: Graph, name: str) -> np.ndarray | None:
    return None if not name or g.values[name].const is None else np.asarray(g.values[name].const)


def _geometry(node: Node, g: Graph, io: dict[str, str]) -> dict | str:
    x, w, y = g.values[io["x"]].shape, g.values[io["w"]].shape, g.values[node.outputs[0]].shape
    if x is None or w is None or y is None or len(x) != 4 or len(w) != 4 or len(y) != 4:
        return "native integer Conv is 2-D (4-D tensors of known shape)"
    auto_pad = node.attr("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad not in ("NOTSET", "VALID"):
        return f"auto_pad {auto_pad} is not native"
    group = int(node.attr("group", 1))
    pads = list(node.attr("pads", [0, 0, 0, 0])) if auto_pad == "NOTSET" else [0, 0, 0, 0]
    geo = dict(n=x[0], c=x[1], h=x[2], w=x[3], oc=w[0], cg=w[1], kh=w[2], kw=w[3], oh=y[2], ow=y[3],
               group=group, strides=list(node.attr("strides", [1, 1])), dil=list(node.attr("dilations", [1, 1])),
               pads=pads)
    if group < 1 or x[1] != w[1] * group or w[0] % group:
        return f"channels {x[1]} / weights {list(w)} do not fit group {group}"
    if w[1] * w[2] * w[3] > MAX_K:
        return f"receptive field of {w[1] * w[2] * w[3]} > {MAX_K}: the int32 sum could overflow"
    return geo


def _check(node: Node, g: Graph) -> str | None:
    if isinstance(node.schedule, IntConvSchedule):  # the layout planner gave it to int_conv_nchwc
        return "scheduled for the blocked int8 kernel (int_conv_nchwc)"
    io = _io(node)
    names = [n for n in node.inputs + node.outputs if n]
    if any(g.values[n].layout != PLAIN for n in names):
        return f"{node.op} reads plain layouts only"
    for role in ("x", "w"):
        if dtype_name(g, io[role]) not in EIGHT_BIT:
            return f"{role} of dtype {dtype_name(g, io[role])}: native {node.op} takes int8/uint8"
    geo = _geometry(node, g, io)
    if isinstance(geo, str):
        return geo
    if _const(g, io["w"]) is None or (io["wz"] and _const(g, io["wz"]) is None):
        return "weights and their zero point must be constants (packed at compile time)"
    if io["xz"] and int(np.prod(g.values[io["xz"]].shape, dtype=np.int64)) != 1:
        return "the input zero point must be a scalar"
    if io["wz"] and _const(g, io["wz"]).size not in (1, geo["oc"]):
        return "the weight zero point must be a scalar or one per output channel"
    if node.op == "QLinearConv":
        for key in ("xs", "ws", "ys"):
            if dtype_name(g, io[key]) != "float32":
                return f"scale {io[key]!r} is {dtype_name(g, io[key])}: native QLinearConv takes float32"
        if int(np.prod(g.values[io["ws"]].shape, dtype=np.int64)) not in (1, geo["oc"]):
            return "the weight scale must be a scalar or one per output channel"
        if io["b"] and (_const(g, io["b"]) is None or dtype_name(g, io["b"]) != "int32"):
            return "the bias must be a constant int32"
        if dtype_name(g, node.outputs[0]) not in EIGHT_BIT:
            return "QLinearConv output must be int8/uint8"
    elif dtype_name(g, node.outputs[0]) != "int32":
        return "ConvInteger output must be int32"
    return None


def _store(node: Node, g: Graph, io: dict[str, str], em: BlockEmitter, oc: int) -> tuple[list[str], str]:
    """Declarations and the statement writing int32 ``ACC`` of channel ``o`` to ``Y[yi]``."""
    yt = c_type(dtype_name(g, node.outputs[0]))
    decl = [f"{yt} *restrict Y = (void *){em.ptr(node.outputs[0])};"]
    if node.op != "QLinearConv":
        return decl, "Y[yi] = ACC;"
    decl += [f"const float *restrict XS = {em.ptr(io['xs'])};", f"const float *restrict WS = {em.ptr(io['ws'])};",
             f"const float *restrict YS = {em.ptr(io['ys'])};"]
    if io["yz"]:
        decl.append(f"const {yt} *restrict YZ = {em.ptr(io['yz'])};")
    bias = "0"
    if io["b"]:
        decl.append(f"const int32_t *restrict BI = {em.ptr(io['b'])};")
        bias = "BI[o]"
    w_scale = "WS[o]" if int(np.prod(g.values[io["ws"]].shape, dtype=np.int64)) == oc and oc > 1 else "WS[0]"
    y_zero = "(float)YZ[0]" if io["yz"] else "0.0f"
    decl.append(SATURATION_COUNTERS)
    return decl, requantize(f"(float)(ACC + {bias}) * ((XS[0] * {w_scale}) / YS[0])", y_zero,
                            dtype_name(g, node.outputs[0]), "Y[yi]")


@register(("ConvInteger", "QLinearConv"), check=_check, name="int_conv")
def emit_int_conv(node: Node, g: Graph, em: BlockEmitter) -> None:
    io = _io(node)
    geo = _geometry(node, g, io)
    n, c, h, w, oc, cg, kh, kw, oh, ow, group = (geo[k] for k in ("n", "c", "h", "w", "oc", "cg", "kh", "kw", "oh",
                                                                  "ow", "group"))
    (sh, sw), (dh, dw), (pt, pl) = geo["strides"], geo["dil"], geo["pads"][:2]
    ocg, k, p_count = oc // group, cg * kh * kw, oh * ow
    xt = c_type(dtype_name(g, io["x"]))
    w_raw = _const(g, io["w"])
    wz = _const(g, io["wz"]) if io["wz"] else np.zeros(1, np.int16)
    wz = np.broadcast_to(wz.astype(np.int16).reshape(-1), (oc,)) if wz.size in (1, oc) else wz
    wsub = (w_raw.astype(np.int16).reshape(oc, k) - wz[:, None]).astype(np.int16)  # [OC, CK], zero point off
    bmat = np.ascontiguousarray(wsub.reshape(group, ocg, k).transpose(0, 2, 1))  # [G, CK, OCg]
    v = with_int_dot(vector_isa(em.target), em.target)
    # the quad form (vpdpbusd) where the host has it: uint8 input, 8-bit weights; uint8 weights
    # or a nonzero zero point as int8 bytes plus a row-sum correction (kernels/int_gemm.py)
    quad = (v.has("u8s8_dot_acc") and dtype_name(g, io["x"]) == "uint8"
            and dtype_name(g, io["w"]) in ("int8", "uint8"))
    group_k = QUAD if quad else PAIR
    kwords = -(-k // group_k)
    rows = n * group * p_count
    offsets = None  # W - w_zero - its int8 bytes, per output channel, where not all zero
    if quad:
        w8, w_colsums, offsets = quad_weights(np.ascontiguousarray(w_raw.reshape(group, ocg, k).transpose(0, 2, 1)), wz)
        offsets = offsets if np.any(offsets) else None
    ap = em.scratch(4 * rows * kwords, "int32")
    rs = em.scratch(4 * rows, "int32") if offsets is not None else None  # receptive-field sums
    col = None if quad else em.scratch(group_k * kwords * 2 * max(1, em.n_threads), "int16")  # the pairs' field
    macs = rows * k * ocg
    split = ("smelt_range({total}, tid, nt, &wb, &we);" if macs >= PARALLEL_MIN_MACS
             else "wb = 0; we = tid == 0 ? {total} : 0;")
    xz = f"(int32_t){em.ptr(io['xz'])}[0]" if io["xz"] else "0"
    if quad:  # raw bytes, padding at the zero point; the zero point comes off after the sum
        ctype, inside, outside = "uint8_t", f"xc[iy * {w} + ix]", "(uint8_t)xz"
    else:  # bytes minus the zero point as int16 (padding is the zero point: 0)
        ctype, inside, outside = "int16_t", f"(int16_t)((int32_t)xc[iy * {w} + ix] - xz)", "0"
        word = pair_word("col[2 * j]", "col[2 * j + 1]")
    # im2col: row (image, group, pixel) -> its receptive field as K words. A field wholly inside
    # the input copies without bounds checks (ddddocr's 3x3 ConvIntegers spent 3/4 of their time
    # in the checked copy). Quads are bytes in vpdpbusd's order, lowest K first: written straight
    # into the row's words (little-endian, as every target smelt renders for), no word packing.
    def field(checked: bool) -> list[str]:
        value = f"(iy >= 0 && iy < {h} && ix >= 0 && ix < {w}) ? {inside} : {outside}" if checked else inside
        return [f"for (long ci = 0; ci < {cg}; ++ci) {{",
                f"    const {xt} *restrict xc = X + (ni * {c} + gi * {cg} + ci) * {h * w}L;",
                f"    for (long ky = 0; ky < {kh}; ++ky) {{",
                f"        const long iy = iy0 + ky * {dh};",
                f"        for (long kx = 0; kx < {kw}; ++kx) {{",
                f"            const long ix = ix0 + kx * {dw};",
                f"            col[q++] = {value};",
                "        }",
                "    }",
                "}"]
    interior = (f"iy0 >= 0 && iy0 + {(kh - 1) * dh} < {h} && ix0 >= 0 && ix0 + {(kw - 1) * dw} < {w}")
    row = (f"{ctype} *restrict col = (uint8_t *)(Ap + r * {kwords});" if quad
           else f"{ctype} *restrict col = {col} + (long)tid * {group_k * kwords};")
    em.step("\n".join([
        f"const {xt} *restrict X = {em.ptr(io['x'])};", f"int32_t *restrict Ap = {ap};",
        f"const int32_t xz = {xz}; (void)xz;",
        "long wb, we; " + split.format(total=rows),
        "for (long r = wb; r < we; ++r) {",
        f"    const long pix = r % {p_count}, gi = (r / {p_count}) % {group}, ni = r / {p_count * group};",
        f"    const long oy = pix / {ow}, ox = pix % {ow};",
        f"    const long iy0 = oy * {sh} - {pt}, ix0 = ox * {sw} - {pl};",
        f"    {row}",
        "    long q = 0;",
        f"    if ({interior}) {{",
        *["        " + line for line in field(False)],
        "    } else {",
        *["        " + line for line in field(True)],
        "    }",
        f"    while (q < {group_k * kwords}) col[q++] = 0;  /* the weights there are 0 */",
        *([] if quad else [f"    for (long j = 0; j < {kwords}; ++j) Ap[r * {kwords} + j] = {word};"]),
        *([f"    {{ int32_t s = 0; for (long j = 0; j < {k}; ++j) s += col[j]; {rs}[r] = s; }}"] if rs else []),
        "}"]), name="int_conv_im2col",
        doc=f"receptive field {cg}x{kh}x{kw} as {'u8 quads' if quad else 'int16 pairs'}{' and its sum' if rs else ''}")
    decl, store = _store(node, g, io, em, oc)
    if v.has("i16_dot_acc"):
        mr, nv = int_dot_tile(v.registers, columns=ocg, lanes=v.lanes)
        nr = nv * v.lanes
    else:  # portable: one row at a time against every output channel of the group
        mr, nv, nr = 1, 0, ocg
    nb = -(-ocg // nr)
    blocks_m = -(-p_count // mr)
    tile = em.scratch(4 * mr * nr * max(1, em.n_threads), "int32")
    head = decl + [f"const int32_t *restrict Ap = {ap};", f"int32_t *restrict T = {tile} + (long)tid * {mr * nr};",
                   "long wb, we; " + split.format(total=n * group * blocks_m * nb),
                   "for (long p = wb; p < we; ++p) {",
                   (f"    const long mb = p % {blocks_m}, cb = (p / {blocks_m}) % {nb}, bg = p / {nb * blocks_m};"
                    if int_tiles_rows_inner(blocks_m, nb, 4 * p_count * kwords, 4 * kwords * nb * nr, em.target.l1d_bytes)  # (4-byte words)
                    else f"    const long cb = p % {nb}, mb = (p / {nb}) % {blocks_m}, bg = p / {nb * blocks_m};"),
                   f"    const long gi = bg % {group}, ni = bg / {group};",
                   f"    const long i0 = mb * {mr}, mr = SMELT_MIN({mr}, {p_count} - i0);"]
    acc = f"T[r * {nr} + jj]"
    if nv:
        bq = w8 if quad else bmat
        packed = pack_b(np.ascontiguousarray(bq), nr, group_k)
        elem = "int8_t" if quad else "int16_t"
        body = tile_loop(v, mr, nv, k2=kwords,
                         a_row=f"Ap + (bg * {p_count} + i0 + SMELT_MIN({{r}}, mr - 1)) * {kwords}L",
                         b_panel=f"Bp + (gi * {nb} + cb) * {kwords * nr * group_k}L", tile="T", group=group_k)
        head.insert(0, f"const {elem} *restrict Bp = {em.weight(packed)};")
        if quad:  # A's zero point times each column's weight sum comes off the raw-byte sum
            head.insert(0, f"const int32_t *restrict CS = {em.weight(w_colsums)};")
            head.insert(0, f"const int32_t xz = {xz};")
            if offsets is not None:
                head[:0] = [f"const int32_t *restrict OFF = {em.weight(offsets)};", f"const int32_t *restrict RS = {rs};"]
            acc = quad_sum(f"T[r * {nr} + jj]", "xz", f"gi * {ocg} + cb * {nr} + jj", k,
                           None if offsets is None else f"bg * {p_count} + i0 + r")
        kernel_name = f"int_conv_{mr}x{nr}_{v.name}{'_u8s8' if quad else ''}"
    else:
        wpairs = np.zeros((group, 2 * kwords, ocg), np.int16)
        wpairs[:, :k, :] = bmat
        head.insert(0, f"const int16_t *restrict Wt = {em.weight(wpairs)};")
        body = [f"const int32_t *restrict a = Ap + (bg * {p_count} + i0) * {kwords}L;",
                f"const int16_t *restrict wg = Wt + gi * {2 * kwords * ocg}L;",
                f"for (long j = 0; j < {ocg}; ++j) T[j] = 0;",
                f"for (long q = 0; q < {kwords}; ++q) {{",
                "    const int32_t lo = (int16_t)(a[q] & 0xffff), hi = (int16_t)((uint32_t)a[q] >> 16);",
                f"    const int16_t *restrict w0 = wg + 2 * q * {ocg}, *restrict w1 = w0 + {ocg};",
                f"    for (long j = 0; j < {ocg}; ++j) T[j] += lo * (int32_t)w0[j] + hi * (int32_t)w1[j];",
                "}"]
        kernel_name = "int_conv_rows"
    tail = [f"const long jn = SMELT_MIN({nr}, {ocg} - cb * {nr});",
            "for (long r = 0; r < mr; ++r) {",
            "    for (long jj = 0; jj < jn; ++jj) {",
            f"        const long o = gi * {ocg} + cb * {nr} + jj, yi = (ni * {oc} + o) * {p_count}L + i0 + r;",
            f"        const int32_t ACC = {acc}; (void)o;",
            "        " + store.replace("\n", "\n        "),
            "    }",
            "}"]
    lines = head + ["    " + line for line in body + tail] + ["}"]
    if node.op == "QLinearConv":
        lines.append(flush_counters(em.saturation_counter(node.outputs[0])))
    dot = "u8s8_dot_acc" if quad else "i16_dot_acc"
    form = "u8 quads (zero point off after the sum" + (", weights as int8 bytes)" if offsets is not None else ")")
    em.schedule(algorithm=f"im2col as {form if quad else 'int16 pairs'}, "
                "W packed per group, int32 sums into NCHW",
                kernel="int_conv", layout="NCHW",
                micro_kernel=f"{mr}x{nr} {v.name}" + (f" {v.x(dot, a='a', b='b', c='c')}" if nv else ""))
    em.step("\n".join(lines), name=kernel_name,
            doc=f"{node.op} {cg * group}->{oc} {kh}x{kw} group {group}, {oh}x{ow} out")
