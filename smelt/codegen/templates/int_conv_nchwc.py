"""QLinearConv on the blocked int8 layout: uint8 activations in NCHW<b>c (b = the ISA's int32
lanes), int8 weights packed at compile time, requantization and a fused ReLU in the epilogue.

Renders the ``IntConvSchedule`` the layout planner wrote (``schedule/int_conv.py``):
- **input**: read in place when it is already NCHW<b>c and unpadded; else one step first copies
  it (from plain or any block) into a buffer [N][C/ib][H + pads][W + pads][ib] whose border and
  padding hold the input zero point (channels past C hold 0; their weights are 0), so the kernel
  has no bounds checks and padded taps contribute exactly what onnxruntime's zero-point padding
  does; with ``kx_packed`` (fewer than 4 input channels) ib = C, so a buffer row is the input
  row's channels interleaved, and the kernel reads a kernel row's kw * C values as quads whose
  slots past them have zero weights (a row's last quad may read 3 bytes past it: the buffer has 4
  spare bytes);
- **padding in the kernel** (``pad_in_kernel``: a padded input already in the kernel's block, read
  in quads): no copy; per kernel row the tile reads the input row, or a row of zero-point bytes
  when it lies outside the input, and in the tiles touching a column border (``edge_tiles``: the
  first and last of a row, each its own body) the pixels at the border read a tap outside the
  input from that zero-point row too (a pointer chosen per kernel column, outside the word
  loop), so every sum is the padded copy's;
- **kernel**: per work item (image, group of nv output-channel vectors, output row, run of rw
  output pixels) an nv x rw register tile of int32 sums over (input block, ky, kx, word): for
  each word, nv weight vectors (lanes = output channels, each lane holding the word's group_k
  input channels) and one broadcast of the pixel's group_k input bytes per output pixel, then
  the ISA's dot the schedule chose: vpdpbusd (u8 x s8 quads, VNNI), vpmaddubsw + vpmaddwd (u8 x
  7-bit quads, exact on weights in [-64, 63]) or vpmaddwd (int16 pairs: the copy widens the
  input bytes to uint16 so one 32-bit broadcast is a pair; the weights are int16). Raw input bytes go in; the input zero point comes off as ``x_zero * sum(W[o])``,
  folded with the int32 bias into one per-channel constant at compile time; with
  ``prefetch_next`` each word step also prefetches one line of the next group's weights into L2
  (an item starts at its own share of them, by its index in the group, and wraps round);
- **epilogue**: ``(float)(acc + bias') * m[o]``, m[o] = (x_scale * w_scale[o]) / y_scale
  computed in float32 at compile time exactly as the scalar rule does (``requantize`` in
  kernels/int_gemm.py), rounded half to even, plus the output zero point, clamped to the type's
  range (NaN low) — and for a fused ReLU at the zero point —; clamps counted for the numeric
  debug counters; then a fused QLinearClip's rule on the code (``ClipRequant``: dequantize,
  clamp, divide by its output scale, round, add its zero point, saturate: the table's float steps
  in the same order), or a fused residual QLinearAdd's (``ResidualAdd``: the clamped code and the
  residual's byte at the same place through MLAS's ``fma(a, ra, fma(b, rb, fixed))``, rounded
  half to even, saturated); stored as bytes to NCHW<b>c, or scattered to plain NCHW.
- **depthwise** (``IntConvSchedule.depthwise``): per work item (image, channel block, output row,
  run of rw pixels) rw accumulators of one block of channels (a channel per int32 lane); per
  kernel row each input column the run spans is loaded once, its bytes zero-extended into the
  lanes (``u8_to_i32``), and multiplied into every accumulator that reads it by the pair dot with
  the tap's int16 weights in the low half of each lane (the high halves are 0 on both sides);
  with ``row_pairs`` two kernel rows at once: one row's byte in the low int16 of each lane and
  the next row's in the high one (``u8x2_to_i16_pairs``), against both rows' weights, so the
  pair dot does two taps (an odd kernel's last row alone, as before). With ``pad_in_kernel`` it
  reads a blocked input in place, unpadded: a kernel row outside the input reads a static row of
  zero-point bytes, and the tiles whose windows cross a row's ends are rendered apart with their
  first column known, a column outside the input being the zero point's vector; the same
  folded bias and epilogue.

Bit-exact with the NCHW template (int_conv.py) and so with onnxruntime's QLinearConv.
"""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import BlockEmitter, c_literal
from smelt.codegen.kernels.int_gemm import flush_counters
from smelt.codegen.registry import register
from smelt.ir.graph import PLAIN, Graph, Node, layout_block
from smelt.schedule.gemm import PARALLEL_MIN_MACS
from smelt.schedule.int_conv import (
    QUAD,
    ClipRequant,
    IntConvSchedule,
    ResidualAdd,
    edge_tiles,
    flattened,
    geometry,
    int_isa,
    int_nchwc_reason,
)


def _check(node: Node, g: Graph) -> str | None:
    s = node.schedule
    if not isinstance(s, IntConvSchedule):
        return "not scheduled for the blocked int8 kernel (schedule/int_conv.py)"
    geo = geometry(node, g)
    if isinstance(geo, str):
        return geo
    xb = layout_block(g.values[node.inputs[0]].layout)
    yb = layout_block(g.values[node.outputs[0]].layout)
    if geo.c % xb or (not s.copy_input and xb != s.ib):
        return f"input block {xb} is not what the schedule reads"
    if yb not in (1, s.block) or geo.oc % yb:
        return f"output block {yb} (schedule block {s.block}, {geo.oc} channels)"
    if any(g.values[n].layout != PLAIN for n in node.inputs[1:9] if n):
        return "parameters must be plain"
    if s.residual is None and len(node.inputs) > 9:
        return "a residual input without its fused add (schedule/int_conv.py ResidualAdd)"
    if s.residual is not None and (len(node.inputs) != 10 or node.inputs[9] != s.residual.residual
                                   or yb == 1 or g.values[node.inputs[9]].layout != g.values[node.outputs[0]].layout):
        return "a fused residual add reads input 9 in the output's blocked layout"
    return None


def _c_float(x: float) -> str:
    return c_literal(x)  # (NaN and the infinities spelt as C names)


def _clip_constants(v, clip: ClipRequant | None) -> list[str]:
    """The fused QLinearClip's parameters as vectors (kxs, kxz, klo, khi, kys, kyz)."""
    if clip is None:
        return []
    if clip.affine is not None:
        a, b, t_lo, t_hi = clip.affine
        vals = {"kxa": a, "kxb": b, "ktl": float(t_lo), "kth": float(t_hi)}
        return [f"const {v.t} " + ", ".join(f"{k} = {v.set1(_c_float(x))}" for k, x in vals.items()) + ";"]
    vals = {"kxs": clip.x_scale, "kxz": float(clip.x_zero), "klo": clip.lo, "khi": clip.hi,
            "kys": clip.y_scale, "kyz": float(clip.y_zero)}
    return [f"const {v.t} " + ", ".join(f"{k} = {v.set1(_c_float(x))}" for k, x in vals.items()) + ";"]


def _residual_constants(v, add: ResidualAdd | None) -> list[str]:
    """The fused QLinearAdd's constants as vectors (kra, krb, kfx) and the bounds past which its
    rounded value saturates (kal: below -0.5 rounds below 0; kah: the float below 255.5, above
    which it rounds past 255), for the numeric debug counters."""
    if add is None:
        return []
    vals = {"kra": add.ra, "krb": add.rb, "kfx": add.fixed, "kal": -0.5,
            "kah": float(np.nextafter(np.float32(255.5), np.float32(0)))}
    return [f"const {v.t} " + ", ".join(f"{k} = {v.set1(_c_float(x))}" for k, x in vals.items()) + ";"]


def _fits_int32(w: np.ndarray, bias: np.ndarray, mult: np.ndarray, clip: ClipRequant | None) -> bool:
    """Every value the epilogue converts to int32 lies well inside its range: |acc| <= |bias'|
    + 255 * sum|W| per channel, times the multiplier, plus a zero point (and through the clip's
    FMA). Then a saturating pack clamps exactly what the float clamps would have."""
    acc = np.abs(bias.astype(np.float64)) + 255.0 * np.abs(w.astype(np.float64)).reshape(len(bias), -1).sum(axis=1)
    f = float((acc * np.abs(mult.astype(np.float64))).max(initial=0.0)) + 256.0
    if clip is not None and clip.affine is not None:
        f = f * abs(clip.affine[0]) + abs(clip.affine[1]) + 1.0
    elif clip is not None:
        f = 256.0 + 256.0 * clip.x_scale / clip.y_scale + abs(clip.y_zero) + 256.0  # the table's range, clamped first
    return f < 2.0**30


def _f32(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float32).reshape(-1)


@register("QLinearConv", check=_check, name="int_conv_nchwc", blocked=True)
def emit_int_conv_nchwc(node: Node, g: Graph, em: BlockEmitter) -> None:
    s: IntConvSchedule = node.schedule
    geo = geometry(node, g)
    assert not isinstance(geo, str) and int_nchwc_reason(node, g, em.target) is None
    if s.flat:  # one row of H * W pixels
        geo = flattened(geo)
    v = int_isa(em.target)
    it, L, gk, ib, nv, rw = v.x("itype"), s.block, s.group_k, s.ib, s.nv, s.rw
    ins = list(node.inputs) + [""] * 9
    x, y = ins[0], node.outputs[0]
    c, oc, kh, kw = geo.c, geo.oc, geo.kh, geo.kw
    cb = -(-c // ib)
    q_words = ib // gk
    kwl = kw  # kernel columns the reduction loops over (kx_packed: one run of kw * C values per row)
    if s.kx_packed:
        q_words, kwl = -(-kw * c // gk), 1
    ocg = cb if s.depthwise else -(-oc // (nv * L))
    ocp, cp = ocg * nv * L, cb * ib

    # -- compile-time constants --------------------------------------------------------------
    w = np.asarray(g.values[ins[3]].const).astype(np.int8)
    dw_slots = -(-kh // 2) if s.row_pairs else kh  # weight rows per channel block (depthwise)
    if s.depthwise:
        # [channel block][ky][kx][lane] int32 words, the weight as int16 in the low half, 0 above;
        # row_pairs: [channel block][row pair][kx][lane], rows 2p and 2p + 1 in the low and high
        # halves (an odd kernel's last row alone, 0 above)
        w16 = w.reshape(oc, kh, kw).astype(np.int16).view(np.uint16).astype(np.uint32)
        wpad = np.zeros((cp, dw_slots, kw), np.uint32)
        if s.row_pairs:
            wpad[:oc, :] = w16[:, 0::2]
            wpad[:oc, :kh // 2] |= w16[:, 1::2] << 16
        else:
            wpad[:oc] = w16
        packed = np.ascontiguousarray(wpad.view(np.int32).reshape(cb, L, dw_slots, kw).transpose(0, 2, 3, 1))
    elif s.kx_packed:
        # [ocg][ky][word][vector][lane][4]: a kernel row's (kx, channel) values in input order,
        # zeros past kw * C
        wpad = np.zeros((ocp, kh, q_words * gk), np.int8)
        wpad[:oc, :, :kw * c] = w.transpose(0, 2, 3, 1).reshape(oc, kh, kw * c)
        packed = wpad.reshape(ocg, nv, L, kh, q_words, gk).transpose(0, 3, 4, 1, 2, 5)
        packed = np.ascontiguousarray(packed).astype(np.int8)
    else:
        wpad = np.zeros((ocp, cp, kh, kw), np.int8)
        wpad[:oc, :c] = w
        # [ocg][icb][ky][kx][word][vector][lane][group_k]: one vector per (word, vector)
        packed = wpad.reshape(ocg, nv, L, cb, q_words, gk, kh, kw).transpose(0, 3, 6, 7, 4, 1, 2, 5)
        packed = np.ascontiguousarray(packed).astype(np.int8 if gk == QUAD else np.int16)
    xz = int(np.asarray(g.values[ins[2]].const).reshape(-1)[0]) if ins[2] else 0
    bias = np.zeros(ocp, np.int64)
    if ins[8]:
        bias[:oc] = np.asarray(g.values[ins[8]].const).astype(np.int64).reshape(-1)
    bias[:oc] -= xz * w.astype(np.int64).reshape(oc, -1).sum(axis=1)  # the zero point's share
    assert np.all(np.abs(bias) < 2**31)
    ws = _f32(g.values[ins[4]].const)
    mult = np.zeros(ocp, np.float32)
    # the scalar rule's (x_scale * w_scale[o]) / y_scale, in float32 step by step
    mult[:oc] = (_f32(g.values[ins[1]].const)[0] * np.broadcast_to(ws, (oc,))) / _f32(g.values[ins[6]].const)[0]
    ydt = np.dtype(g.values[y].dtype).name
    info = np.iinfo(np.dtype(ydt))
    yz = int(np.asarray(g.values[ins[7]].const).reshape(-1)[0]) if ins[7] else 0
    lo_clamp = max(int(info.min), yz) if s.relu else int(info.min)
    yt = "uint8_t"
    # the affine clip compares r = round(acc * m) (before the zero point) with the range
    shift = yz if s.clip is not None and s.clip.affine is not None else 0
    # what the kernel reads: bytes for quads; for pairs each byte widened to uint16 by the copy
    bytes_in = gk != 2  # quads and the depthwise kernel read bytes
    st, esize = ("uint8_t", 1) if bytes_in else ("uint16_t", 2)
    wt = "int32_t" if s.depthwise else "int8_t" if gk == QUAD else "int16_t"

    # -- the input the kernel reads ----------------------------------------------------------
    xb = layout_block(g.values[x].layout)
    if s.copy_input:
        hs = max(geo.h + geo.pt + geo.pb, (geo.oh - 1) * geo.sh + (kh - 1) * geo.dh + 1)
        wsz = max(geo.w + geo.pl + geo.pr, (geo.ow - 1) * geo.sw + (kw - 1) * geo.dw + 1)
        # (kx_packed: a row's last quad reads up to 3 bytes past it, times zero weights)
        src = em.scratch(geo.n * cb * hs * wsz * ib * esize + (4 if s.kx_packed else 0), "uint8" if bytes_in else "uint16")
        rows = geo.n * cb * hs
        xin = (f"X[(((ni * {c // xb} + ch / {xb}) * {geo.h} + iy) * {geo.w}L + ix) * {xb} + ch % {xb}]"
               if xb > 1 else f"X[((ni * {c} + ch) * {geo.h} + iy) * {geo.w}L + ix]")
        em.step("\n".join([
            f"const uint8_t *restrict X = {em.ptr(x)}; {st} *restrict P = {src};",
            *([f"static const uint8_t ZR[{geo.w}];  /* a row of channels past C */"]
              if xb == 1 and bytes_in and ib % 4 == 0 else []),
            f"long lo, hi; smelt_range({rows}, tid, nt, &lo, &hi);",
            "for (long r = lo; r < hi; ++r) {",
            f"    const long yp = r % {hs}, bi = (r / {hs}) % {cb}, ni = r / {hs * cb}, iy = yp - {geo.pt};",
            f"    {st} *restrict d = P + r * {wsz * ib}L;",
            f"    if (iy < 0 || iy >= {geo.h}) {{",
            f"        for (long j = 0; j < {wsz * ib}; ++j) d[j] = (bi * {ib} + j % {ib}) < {c} ? {xz} : 0;",
            "        continue;",
            "    }",
            f"    for (long xp = 0; xp < {geo.pl}; ++xp) for (long l = 0; l < {ib}; ++l) "
            f"d[xp * {ib} + l] = (bi * {ib} + l) < {c} ? {xz} : 0;",
            f"    for (long xp = {geo.pl + geo.w}; xp < {wsz}; ++xp) for (long l = 0; l < {ib}; ++l) "
            f"d[xp * {ib} + l] = (bi * {ib} + l) < {c} ? {xz} : 0;",
            *([f"    __builtin_memcpy(d + {geo.pl * ib}, X + ((ni * {c // xb} + bi) * {geo.h} + iy) * {geo.w * ib}L, "
               f"{geo.w * ib});  /* same block: one row copy */",
               "    continue;"] if xb == ib and bytes_in else []),
            *([f"    {{ const uint8_t *restrict xr = X + ((ni * {c // xb} + bi) * {geo.h} + iy) * {geo.w * ib}L;",
               f"      for (long j = 0; j < {geo.w * ib}; ++j) d[{geo.pl * ib} + j] = xr[j]; }}  /* widened */",
               "    continue;"] if xb == ib and not bytes_in else []),
            # plain bytes into quads: four channel rows packed into each 32-bit word (channels
            # past C read a zero row), so the store is one word per pixel, not four bytes
            *([f"    for (long q = 0; q < {ib // 4}; ++q) {{",
               "        const uint8_t *restrict xp[4];",
               f"        for (int t = 0; t < 4; ++t) {{ const long ch = bi * {ib} + 4 * q + t; "
               f"xp[t] = ch < {c} ? X + ((ni * {c} + ch) * {geo.h} + iy) * {geo.w}L : ZR; }}",
               f"        uint32_t *restrict dq = (uint32_t *)(d + {geo.pl * ib}) + q;",
               f"        for (long ix = 0; ix < {geo.w}; ++ix) dq[ix * {ib // 4}] = (uint32_t)xp[0][ix] | "
               "((uint32_t)xp[1][ix] << 8) | ((uint32_t)xp[2][ix] << 16) | ((uint32_t)xp[3][ix] << 24);",
               "    }",
               "    continue;"] if xb == 1 and bytes_in and ib % 4 == 0 else []),
            # a plain input of a few channels (the stem's 3, read as (kx, channel) quads): one
            # pass over the pixels writing each pixel's channels together, which gcc vectorizes
            # as an interleaving store; channel by channel it was a stride-ib byte scatter
            # (ResNet-50's 224x224x3 input: ~52 -> ~3 us at 1 thread)
            *([f"    {{ {st} *restrict dd = d + {geo.pl * ib};",
               *[f"      const uint8_t *restrict x{ch} = X + ((ni * {c} + bi * {ib} + {ch}) * {geo.h} + iy) * {geo.w}L;"
                 for ch in range(ib) if ch < c],
               f"      for (long ix = 0; ix < {geo.w}; ++ix) {{ "
               + " ".join(f"dd[ix * {ib} + {ch}] = {f'x{ch}[ix]' if ch < c else '0'};" for ch in range(ib)) + " }",
               "    }",
               "    continue;"] if xb == 1 and ib <= 4 and cb == 1 and not (bytes_in and ib % 4 == 0) else []),
            f"    for (long l = 0; l < {ib}; ++l) {{",
            f"        const long ch = bi * {ib} + l;",
            f"        {st} *restrict dl = d + {geo.pl * ib} + l;",
            f"        if (ch >= {c}) {{ for (long ix = 0; ix < {geo.w}; ++ix) dl[ix * {ib}] = 0; continue; }}",
            f"        for (long ix = 0; ix < {geo.w}; ++ix) dl[ix * {ib}] = {xin};",
            "    }",
            "}"]), name=f"int_conv_pad_{ib}c",
            doc=f"input {'plain' if xb == 1 else f'NCHW{xb}c'} -> zero-point padded NCHW{ib}c {st}")
        hs_, ws_, sptr = hs, wsz, src
    else:
        hs_, ws_, sptr = geo.h, geo.w, em.ptr(x)
    inpad = s.pad_in_kernel
    edges = edge_tiles(geo, rw) if inpad else []

    # -- the kernel ----------------------------------------------------------------------------
    word = L * gk  # weight elements per vector
    steps = cb * kh * kwl * q_words  # word steps of an item's reduction
    panel = steps * nv * word  # weights of an output-channel group (elements)
    panel_bytes = panel * (1 if gk == QUAD else 2)
    owt = -(-geo.ow // rw)
    full, rem = divmod(geo.ow, rw)
    total = geo.n * ocg * geo.oh * owt
    macs = geo.n * oc * geo.oh * geo.ow * (c // geo.group) * kh * kw
    # row_bands: each thread a band of the (row, tile) pairs, every group and image over it
    pixels = geo.oh * owt
    # (nested loops, not one item index: dividing by the band's run-time length cost more than
    # a small tile's dots)
    bands = (f"long pb, pe; smelt_range({pixels}, tid, nt, &pb, &pe);" if macs >= PARALLEL_MIN_MACS else
             f"long pb = 0, pe = tid == 0 ? {pixels} : 0;") + f" wb = 0; we = {geo.n * ocg};"
    split = (f"smelt_range({total}, tid, nt, &wb, &we);" if macs >= PARALLEL_MIN_MACS
             else f"wb = 0; we = tid == 0 ? {total} : 0;")
    yb = layout_block(g.values[y].layout)
    dot = s.dot
    store = "i32_store_u8"

    affine = s.clip is not None and s.clip.affine is not None
    add = s.residual
    # four vectors of consecutive pixels of a blocked output are 4 * L contiguous bytes: stored
    # by one saturating pack (``i32x4_store_u8``), which is itself the clamp to [0, 255], so
    # those vectors skip it; only where every value converts exactly (|f| < 2^30, bounded at
    # compile time from the weights, the folded bias and the multipliers)
    grouped = yb > 1 and v.has("i32x4_store_u8") and (
        add is not None or _fits_int32(w, bias[:oc], mult[:oc], s.clip))  # (the add's range: checked by its schedule)
    low_keep = {  # the clamps a saturating pack does not make: ReLU's at the zero point, the clip's extremes
        "f": (lo_clamp > info.min and not affine) or (affine and s.clip.affine[2] > 0),
        "h": affine and s.clip.affine[3] < 255}

    def epilogue(width: int, j: int) -> list[str]:
        """Requantize accumulators c<r>_<j> of the output-channel vector og * nv + j and store them."""
        out = [f"if (og * {nv} + {j} < {-(-oc // L)}) {{",
               f"  const {v.t} mv = {v.loadu(f'MU + (og * {nv} + {j}) * {L}')};"]
        packed = 4 * (width // 4) if grouped else 0
        # then two pixels' vectors by one pack (``i32x2_store_u8``): a tile of 6 or 14 pixels
        # stored its last two through the per-vector clamp, conversion and narrowing store
        paired = packed + 2 * ((width - packed) // 2) if grouped and v.has("i32x2_store_u8") else packed

        def pack_store(r: int) -> list[str]:
            """The saturating pack of the group that pixel r closes (none where it does not)."""
            if r < packed and r % 4 == 3:
                dst = f"Y + (((ni * {oc // L} + og * {nv} + {j}) * {geo.oh} + oy) * {geo.ow}L + ox0 + {r - 3}) * {L}"
                return ["  " + v.x("i32x4_store_u8", p=dst, a="q0", b="q1", c="q2", d="q3")]
            if packed <= r < paired and (r - packed) % 2 == 1:
                dst = f"Y + (((ni * {oc // L} + og * {nv} + {j}) * {geo.oh} + oy) * {geo.ow}L + ox0 + {r - 1}) * {L}"
                return ["  " + v.x("i32x2_store_u8", p=dst, a="q0", b="q1")]
            return []

        for r in range(width):
            in_pack = r < paired
            slot = r % 4 if r < packed else (r - packed) % 2
            if in_pack and not affine and s.clip is None and add is None:
                # the conversion rounds half to even and the zero point is an integer add: one
                # op fewer than rounding in float (the saturating pack is the clamp); a fused
                # ReLU is max(x, 0) before rounding (round(max(x, 0)) = max(round(x), 0))
                out += [f"  {{ {v.t} f = {v.op('mul', v.x('i32_to_f32', a=f'c{r}_{j}'), 'mv')};",
                        f"    {{ const {v.t} fc = {v.op('add', v.x('f32_round_even', a='f'), 'yzv')};",
                        f"      vlo = {v.x('f32_nge_count', a='fc', b='lov', c='vlo')}; "
                        f"vhi = {v.x('f32_gt_count', a='fc', b='hiv', c='vhi')}; }}"]
                if low_keep["f"]:
                    out.append(f"    f = {v.op('max', 'f', 'kz0')};")
                out.append(f"    q{slot} = {v.x('i32_add', a=v.x('f32_to_i32_even', a='f'), b='yzi')}; }}")
                out += pack_store(r)
                continue
            out += [f"  {{ {v.t} f = {v.x('i32_to_f32', a=f'c{r}_{j}')};",
                    f"    f = {v.x('f32_round_even', a=v.op('mul', 'f', 'mv'))};"]
            if affine:
                # r = round(acc * m): the clamps counted against the range less the zero point;
                # the conv's clamps, its ReLU and the clip are the checked FMA and one clamp
                out += [f"    vlo = {v.x('f32_nge_count', a='f', b='lov', c='vlo')}; "
                        f"vhi = {v.x('f32_gt_count', a='f', b='hiv', c='vhi')};",
                        f"    f = {v.fmadd('f', 'kxa', 'kxb')};"]
                # integer bounds: clamping before the conversion's rounding is the same
                if not in_pack or low_keep["f"]:
                    out.append(f"    f = {v.op('max', 'f', 'ktl')};")
                if not in_pack or low_keep["h"]:
                    out.append(f"    f = {v.op('min', 'f', 'kth')};")
            else:
                out += [f"    f = {v.op('add', 'f', 'yzv')};",
                        f"    vlo = {v.x('f32_nge_count', a='f', b='lov', c='vlo')}; "
                        f"vhi = {v.x('f32_gt_count', a='f', b='hiv', c='vhi')};"]
                if not in_pack or s.clip is not None or add is not None:  # (a clip or add reads the clamped code)
                    out.append(f"    f = {v.op('min', v.op('max', 'f', 'clv'), 'hiv')};  /* NaN: max gives the low clamp */")
                elif low_keep["f"]:
                    out.append(f"    f = {v.op('max', 'f', 'clv')};")
            if s.clip is not None and not affine:  # the fused QLinearClip, its table's float steps in order
                out.append(f"    f = {v.op('mul', v.op('sub', 'f', 'kxz'), 'kxs')};")
                if s.clip.lo != -np.inf:
                    out.append(f"    f = {v.op('max', 'f', 'klo')};")
                if s.clip.hi != np.inf:
                    out.append(f"    f = {v.op('min', 'f', 'khi')};")
                out.append(f"    f = {v.op('add', v.x('f32_round_even', a=v.op('div', 'f', 'kys')), 'kyz')};")
                if not in_pack:
                    out.append(f"    f = {v.op('min', v.op('max', 'f', 'lov'), 'hiv')};")
            if add is not None:  # the fused QLinearAdd on the code and the residual's byte (MLAS's formula)
                rsrc = f"R + (((ni * {oc // L} + og * {nv} + {j}) * {geo.oh} + oy) * {geo.ow}L + ox0 + {r}) * {L}"
                out.append(f"    {{ const {v.t} rv = {v.x('i32_to_f32', a=v.x('u8_to_i32', p=rsrc))};")
                a_, b_ = ("f", "rv") if add.conv_is_a else ("rv", "f")
                out.append(f"      f = {v.fmadd(a_, 'kra', v.fmadd(b_, 'krb', 'kfx'))}; }}")
                out.append(f"    vlo = {v.x('f32_nge_count', a='f', b='kal', c='vlo')}; "
                           f"vhi = {v.x('f32_gt_count', a='f', b='kah', c='vhi')};")
                if not in_pack:  # rounded, then clamped before the truncating store
                    out.append(f"    f = {v.op('min', v.op('max', v.x('f32_round_even', a='f'), 'lov'), 'hiv')};")
            cvt = "f32_to_i32_even" if affine or (add is not None and in_pack) else "f32_to_i32"  # (else already rounded)
            if in_pack:
                out.append(f"    q{slot} = {v.x(cvt, a='f')}; }}")
                out += pack_store(r)
            elif yb > 1:
                dst = f"Y + (((ni * {oc // L} + og * {nv} + {j}) * {geo.oh} + oy) * {geo.ow}L + ox0 + {r}) * {L}"
                out.append(f"    {v.x(store, p=dst, a=v.x(cvt, a='f'))} }}")
            else:
                out += [f"    {yt} tb[{L}]; {v.x(store, p='tb', a=v.x(cvt, a='f'))}",
                        f"    const long o0 = (og * {nv} + {j}) * {L}, on = SMELT_MIN({L}, {oc} - o0);",
                        f"    for (long l = 0; l < on; ++l) Y[((ni * {oc} + o0 + l) * {geo.oh} + oy) * {geo.ow}L + ox0 + {r}] = tb[l]; }}"]
        if paired:
            out.insert(2, f"  {it} q0, q1, q2, q3;")
        out.append("}")
        return out

    def tile(width: int, edge: int | None = None, nvt: int = nv) -> list[str]:
        """One register tile of ``width`` pixels and ``nvt`` output-channel vectors (fewer than nv
        in a last group that the channels do not fill); ``edge``: the index of a tile touching a
        column border (``pad_in_kernel``), whose pixels there read a tap outside the input from
        the zero-point row instead."""
        # the accumulators start at the folded bias (bias - x_zero * sum(W)): no add afterwards
        out = [f"const {it} bv{j} = {v.x('i32_loadu', p=f'BI + (og * {nv} + {j}) * {L}')};" for j in range(nvt)]
        out += [f"{it} " + ", ".join(f"c{r}_{j} = bv{j}" for r in range(width) for j in range(nvt)) + ";"]
        if s.prefetch_next:  # the item's share of the next group's weights: from its index in the group
            out += [f"const char *const wn = (const char *)(w0 + (og + 1 < {ocg} ? {panel}L : 0));",
                    f"long pf = ((oy * {owt} + t) * {steps * 64}L) % {panel_bytes}L;  /* a byte of wn's panel */"]
        out += [f"for (long bi = 0; bi < {cb}; ++bi) {{",
                f"  const {st} *restrict sc = s0 + bi * {hs_ * ws_ * ib}L;",
                f"  const {wt} *restrict wc = w0 + bi * {kh * kwl * q_words * nv * word}L;",
                f"  for (long ky = 0; ky < {kh}; ++ky) {{"]
        if inpad:  # the input row, or a row of zero-point bytes above and below the input
            out += [f"    const long iy = oy * {geo.sh} + ky * {geo.dh} - {geo.pt};",
                    f"    const {st} *sr = (unsigned long)iy < {geo.h}UL ? "
                    f"sc + (iy * {geo.w}L + ox0 * {geo.sw} - {geo.pl}) * {ib} : ZB;"]
        else:
            out.append(f"    const {st} *sr = sc + ky * {geo.dh * ws_ * ib}L;")

        # an edge tile's pixels with a tap outside the input: column (t * rw + r) * sw + kx * dw - pl
        border = {} if edge is None else {
            r: (edge * rw + r) * geo.sw - geo.pl for r in range(width)
            if not all(0 <= (edge * rw + r) * geo.sw + kx * geo.dw - geo.pl < geo.w for kx in range(kw))}
        out += [f"    for (long kx = 0; kx < {kwl}; ++kx) {{",
                f"      const {st} *restrict sp = sr + kx * {geo.dw * ib}L;",
                f"      const {wt} *restrict wq = wc + (ky * {kwl} + kx) * {q_words * nv * word}L;"]
        # (per kernel column, outside the word loop: the zero-point row where the tap is outside)
        out += [f"      const {st} *restrict p{r} = (unsigned long)({c0} + kx * {geo.dw}) < {geo.w}UL ? "
                f"sp + {r * geo.sw * ib} : ZB;" for r, c0 in border.items()]
        # not unrolled where the whole reduction is one or two such loops (a 1x1 conv on
        # 16 or 32 channels): gcc then unrolled everything, hoisted every word's broadcasts
        # and spilled most of the register tile (MobileNetV2's first expand: 256 -> 215 us);
        # elsewhere its unrolling of the word loop is the faster code (ResNet-50's 1x1
        # stride-2 downsample: 452 us unrolled, 770 us not)
        out += [*(["      _Pragma(\"GCC unroll 1\")"] if cb * kh * kwl <= 2 else []),
                f"      for (long q = 0; q < {q_words}; ++q) {{"]
        out += [f"        const {it} b{j} = {v.x('i32_loadu', p=f'wq + q * {nv * word} + {j * word}')};"
                for j in range(nvt)]
        if s.prefetch_next:  # a line of the next group's weights into L2, wrapping round them
            out.append(f"        __builtin_prefetch(wn + pf, 0, 2); pf += 64; if (pf >= {panel_bytes}L) pf -= {panel_bytes}L;")
        for r in range(width):
            src = f"p{r} + q * {gk}" if r in border else f"sp + {r * geo.sw * ib} + q * {gk}"
            out.append(f"        {{ const {it} a = {v.x('word_set1', p=src)};")
            out += [f"          c{r}_{j} = {v.x(dot, a='a', b=f'b{j}', c=f'c{r}_{j}')};" for j in range(nvt)]
            out.append("        }")
        out += ["      }", "    }"]
        out += ["  }", "}"]
        for j in range(nvt):
            out += epilogue(width, j)
        return out

    def dw_tile(width: int, edge: int | None = None) -> list[str]:
        # one channel block; per kernel row every input column the run spans is loaded once and
        # feeds each accumulator whose window covers it. pad_in_kernel: the unpadded input, a row
        # outside it read from ZR (the zero point's bytes), and in a tile touching a column border
        # (``edge``: its index, so its first column is known) a column outside the input is the
        # zero point's vector instead of a load
        at = None if edge is None else edge * rw
        out = [f"const {it} bv0 = {v.x('i32_loadu', p=f'BI + og * {L}')};",
               f"{it} " + ", ".join(f"c{r}_0 = bv0" for r in range(width)) + ";"]
        row = geo.dh * ws_ * L  # bytes from one kernel row's input to the next

        def row_ptr(name: str, iy: str) -> str:
            return (f"  const uint8_t *restrict {name} = (unsigned long)({iy}) < {geo.h} ? "
                    f"S + ((ni * {cb} + og) * {geo.h} + ({iy})) * {geo.w * L}L : ZR;")

        def kernel_row(slot: str, first: str, pair: bool) -> list[str]:
            # one kernel row (or, paired, two): the input columns the run spans, each loaded once
            # and fed to every accumulator whose window covers it
            if not s.pad_in_kernel:
                rows = [f"  const uint8_t *restrict sp = s0 + og * {hs_ * ws_ * L}L + ({first}) * {row}L;",
                        "  const uint8_t *restrict sq = sp + " + str(row) + ";" if pair else ""]
                col0 = 0
            else:
                iy = f"oy * {geo.sh} - {geo.pt} + ({first}) * {geo.dh}"
                rows = [row_ptr("sp", iy), row_ptr("sq", f"{iy} + {geo.dh}") if pair else ""]
                col0 = (at * geo.sw - geo.pl) if at is not None else None
                if at is None:  # every column inside: both rows from the tile's first input column
                    rows += [f"  sp += (ox0 * {geo.sw} - {geo.pl}) * {L}L;" ,
                             f"  sq += (ox0 * {geo.sw} - {geo.pl}) * {L}L;" if pair else ""]
                    col0 = 0
            rows = [r for r in rows if r]
            rows.append(f"  const int32_t *restrict wq = w0 + ({slot}) * {kw * L};")
            rows += [f"  const {it} k{kx} = {v.x('i32_loadu', p=f'wq + {kx * L}')};" for kx in range(kw)]
            for col in range((width - 1) * geo.sw + (kw - 1) * geo.dw + 1):
                uses = [(r, (col - r * geo.sw) // geo.dw) for r in range(width)
                        if col >= r * geo.sw and (col - r * geo.sw) % geo.dw == 0 and (col - r * geo.sw) // geo.dw < kw]
                if not uses:
                    continue
                ix = col0 + col
                if s.pad_in_kernel and at is not None and not 0 <= ix < geo.w:
                    load = "zp2" if pair else "zp1"  # a padded column
                elif pair:
                    load = v.x("u8x2_to_i16_pairs", p=f"sp + {ix * L}", q=f"sq + {ix * L}")
                else:
                    load = v.x("u8_to_i32", p=f"sp + {ix * L}")
                rows.append(f"  {{ const {it} a = {load};")
                rows += [f"    c{r}_0 = {v.x(dot, a='a', b=f'k{kx}', c=f'c{r}_0')};" for r, kx in uses]
                rows.append("  }")
            return rows

        if not s.row_pairs:
            out += [f"for (long ky = 0; ky < {kh}; ++ky) {{", *kernel_row("ky", "ky", False), "}"]
            return out + epilogue(width, 0)
        out += [f"for (long kp = 0; kp < {kh // 2}; ++kp) {{", *kernel_row("kp", "2 * kp", True), "}"]
        if kh % 2:  # the last row alone
            out += ["{", *kernel_row(str(kh // 2), str(kh - 1), False), "}"]
        return out + epilogue(width, 0)

    pad_consts = []
    if inpad and not s.depthwise:  # (the depthwise kernel's zero-point row and vectors: below)
        # a row of zero-point bytes as wide as a tile's columns (x_zero * W: what the folded bias takes off)
        span = (rw - 1) * geo.sw + (kw - 1) * geo.dw + 1
        pad_consts.append(f"const uint8_t *restrict ZB = {em.weight(np.full(span * ib, xz, np.uint8))};")
    lines = [*pad_consts,
             f"const {wt} *restrict Wp = {em.weight(packed)};",
             f"const int32_t *restrict BI = {em.weight(bias.astype(np.int32))};",
             f"const float *restrict MU = {em.weight(mult)};",
             f"const {st} *restrict S = {sptr};",
             # no restrict where the output may be written over the residual it reads (each
             # vector read just before the store that overwrites it: codegen/inplace.py)
             f"{yt} *{'' if add is not None else 'restrict '}Y = (void *){em.ptr(y)};",
             *([f"const uint8_t *R = {em.ptr(add.residual)};"] if add is not None else []),
             f"const {v.t} yzv = {v.set1(f'{float(yz)!r}f')}, lov = {v.set1(f'{float(info.min - shift)!r}f')}, "
             f"hiv = {v.set1(f'{float(info.max - shift)!r}f')}, clv = {v.set1(f'{float(lo_clamp)!r}f')};",
             f"{it} vlo = {v.x('i32_set1', a='0')}, vhi = vlo;  /* clamps per lane (numeric debug counters) */",
             f"const {it} yzi = {v.x('i32_set1', a=str(yz))}; const {v.t} kz0 = {v.set1('0.0f')};",
             *_clip_constants(v, s.clip),
             *_residual_constants(v, add),
             "long wb, we; " + (bands if s.row_bands else split),
             "for (long item = wb; item < we; ++item)" + (" for (long p = pb; p < pe; ++p) {" if s.row_bands else " {"),
             (f"  const long og = item % {ocg}, ni = item / {ocg}, t = p % {owt}, oy = p / {owt};" if s.row_bands else
              f"  const long t = item % {owt}, oy = (item / {owt}) % {geo.oh}, og = (item / {owt * geo.oh}) % {ocg},"
              f" ni = item / {owt * geo.oh * ocg};"),
             f"  const long ox0 = t * {rw};",
             (f"  const {st} *restrict s0 = S + ni * {cb * hs_ * ws_ * ib}L;" if inpad else
              f"  const {st} *restrict s0 = S + ((ni * {cb} * {hs_} + oy * {geo.sh}) * {ws_}L + ox0 * {geo.sw}) * {ib};"),
             f"  const {wt} *restrict w0 = Wp + og * {dw_slots * kw * L if s.depthwise else panel}L;"]
    if inpad and s.depthwise:
        # rows outside the input: a row of zero-point bytes as wide as the input's (an interior
        # tile reads it from its own first column); columns outside it: the zero point's vector
        loop = next(i for i, ln in enumerate(lines) if ln.startswith("for (long item"))  # (before the loop)
        lines[loop:loop] = [
            f"static const uint8_t ZR[{geo.w * L}] = {{[0 ... {geo.w * L - 1}] = {xz}}};  /* a padded row */",
            # the zero point in the low int16 of each lane (one row) or in both halves (a row pair)
            f"const {it} zp1 = {v.x('i32_set1', a=str(xz))}, zp2 = {v.x('i32_set1', a=str(xz | xz << 16))};"]
        lines.append("  (void)s0;")

    def chain(nvt: int) -> list[str]:
        """The item's tile: the edge tiles' own bodies, the full tiles', the ragged last one's."""
        def one(width: int, edge: int | None) -> list[str]:
            return dw_tile(width, edge) if s.depthwise else tile(width, edge, nvt)

        interior = [t for t in range(owt) if t not in edges]
        cases = [(f"t == {t}", one(rw if t < full else rem, t)) for t in edges]
        if any(t < full for t in interior):
            cases.append((f"t < {full}", one(rw, None)))
        if rem and owt - 1 in interior:
            cases.append(("1", one(rem, None)))
        if len(cases) == 1:
            return cases[0][1]
        out = []
        for k, (cond, code) in enumerate(cases):
            head = "if" if k == 0 else "} else if"
            out += [f"{head} ({cond}) {{" if k < len(cases) - 1 else "} else {"] + ["  " + ln for ln in code]
        return out + ["}"]

    # a last output-channel group the channels do not fill runs only its vectors (ResNet-50's
    # 512-channel 3x3 convs: 11 groups of 3 vectors, the last 2; it computed 528 channels)
    nv_last = -(-oc // L) - (ocg - 1) * nv
    if s.depthwise or nv_last == nv:
        lines += ["  " + ln for ln in chain(nv)]
    else:
        lines += [f"  if (og == {ocg - 1}) {{"] + ["    " + ln for ln in chain(nv_last)] + ["  } else {"]
        lines += ["    " + ln for ln in chain(nv)] + ["  }"]
    lines.append("}")
    lines += [f"int32_t cl[{L}], ch[{L}]; {v.x('i32_storeu', p='cl', a='vlo')} {v.x('i32_storeu', p='ch', a='vhi')}",
              "long nlo = 0, nhi = 0;",
              f"for (int l = 0; l < {L}; ++l) {{ nlo += cl[l]; nhi += ch[l]; }}"]
    lines.append(flush_counters(em.saturation_counter(y)))
    em.schedule(algorithm=f"direct NCHW{L}c int8 {'depthwise ' if s.depthwise else ''}conv ({s.describe()})", kernel="int_conv_nchwc",
                layout=f"in {'plain' if xb == 1 else f'NCHW{xb}c'} -> out {'plain' if yb == 1 else f'NCHW{yb}c'}",
                micro_kernel=f"{rw}x{nv * L} {v.name} {v.x(dot, a='a', b='b', c='c')}")
    em.step("\n".join(lines), name=f"int_{'dw' if s.depthwise else ''}conv_nchwc_{rw}x{nv * L}_{v.name}_{dot.split('_')[0]}",
            doc=f"QLinearConv {c}->{oc} {kh}x{kw} s{geo.sh}, {geo.oh}x{geo.ow} out, {s.describe()}")
