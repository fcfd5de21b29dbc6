"""A depthwise conv fused into the 1x1 conv that reads it (``DwPwConv``, made by
``schedule/dwpw.py``), float32, on NCHW<b>c layouts, AVX-512 and AVX2.

Kernel ``f32_dw_pw_conv_nchw<ib>c_<ob>c__<isa>``: work items are (image, band of ``band_rows``
output rows, output-channel part), band-major, split statically over threads. For a new band a
thread computes the depthwise rows of the band, every channel block, into its own buffer
[C/ib][band_rows x OW][ib] (scratch, ``band_rows`` chosen so it stays in L2), with the depthwise
bias and activation applied in registers; then the 1x1 runs over the band as one flat row of
``rows x OW`` positions, in J x R register tiles (J output blocks x R positions; the 1x1's own
conv schedule's tile), reading the buffer instead of a memory-sized tensor. Consecutive items of
a thread share a band, so the depthwise part is computed once per band and thread.

Depthwise row: columns whose every tap is inside the image run in tiles of ``dw_cols`` columns
(one weight vector per tap, one input vector per column, no bounds checks), the rest of the body
in tiles of 2^k columns, and the columns at the left/right padding one at a time with each kernel
column tested. Kernel rows outside the image are skipped by the row's loop bounds.

Weights are re-laid out at compile time: depthwise [C/ib][KH][KW][ib], 1x1 per output tile
[C][J x ob].
"""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import BlockEmitter
from smelt.codegen.kernels.conv_geometry import ConvGeometry
from smelt.codegen.kernels.epilogue import epilogue_doc
from smelt.codegen.kernels.gemm import (
    Blocking,
    TileEpilogue,
    TileOperand,
    define,
    kernel_param_epilogue,
    vector_epilogue_stmts,
)
from smelt.codegen.kernels.isa import with_lanes
from smelt.codegen.kernels.tile import RegisterTile
from smelt.codegen.registry import SMELT_DOMAIN, register
from smelt.ir.graph import PLAIN, Graph, Node, layout_block
from smelt.schedule.dwpw import FUSED_OP, DwPwSchedule


def _blocking(lanes: int) -> Blocking:
    vx = with_lanes(lanes)
    assert vx.lanes == lanes, lanes
    return Blocking(vx.name, lanes, 1, lanes, 1, 1, 1, fma=True)


def dw_geometry(node: Node, g: Graph) -> ConvGeometry:
    """The depthwise conv's geometry (its attributes are kept on the fused node)."""
    return ConvGeometry(Node("Conv", node.name, [node.inputs[0], node.inputs[1]], [node.outputs[0]],
                             attrs=dict(node.attr("dw_attrs") or {})), g)


class _Gen:
    def __init__(self, em: BlockEmitter, node: Node, g: Graph, s: DwPwSchedule, pw_ep: TileEpilogue,
                 n_eps: int) -> None:
        self.em, self.node, self.s = em, node, s
        geo = dw_geometry(node, g)
        self.geo = geo
        self.N, self.C = geo.batch, geo.c
        self.IH, self.IW = geo.ins
        self.OH, self.OW = geo.outs
        self.KH, self.KW = geo.ks
        self.SH, self.SW = geo.strides
        self.PT, self.PL = geo.pb
        self.OC = int(g.values[node.outputs[0]].shape[1])
        self.ib, self.ob = s.ib, s.ob
        self.CB, self.OCB = self.C // s.ib, self.OC // s.ob
        self.bi, self.bo = _blocking(s.ib), _blocking(s.ob)
        self.vi, self.vo = self.bi.vx, self.bo.vx
        self.pw_ep = pw_ep
        ops = [TileOperand("Add", "bd", "col")] if node.inputs[2] else []
        self.dw_ep = TileEpilogue(ops + list(node.attr("dw_epilogue") or []))
        self.eparams = "".join(f", const float *e{k}" for k in range(n_eps))
        self.eargs = "".join(f", e{k}" for k in range(n_eps))
        self.bstride = s.band_rows * self.OW * s.ib  # floats between channel blocks in the buffer
        self.tiles = -(-self.OCB // s.pw_blocks)
        self.ragged = self.OCB % s.pw_blocks

    # -- depthwise ------------------------------------------------------------------------
    def body_range(self) -> tuple[int, int]:
        lo = -(-self.PL // self.SW)
        hi = (self.IW - 1 + self.PL - (self.KW - 1)) // self.SW + 1
        return min(max(0, lo), self.OW), max(min(self.OW, hi), 0)

    def dw_tile(self, width: int, checked: bool) -> str:
        """``width`` output columns from column ``c0`` of one row of one channel block;
        ``checked``: each kernel column tested against the image (padding columns)."""
        v, ib = self.vi, self.ib
        L = ["static inline __attribute__((always_inline)) void FNAME(const float *restrict xp, "
             "const float *restrict wk, const float *restrict bd, long ch, long ih0, int kh_lo, int kh_hi, "
             "long c0, float *restrict out) {",
             f"    {v.t} " + ", ".join(f"a{r} = {v.zero()}" for r in range(width)) + ";",
             f"    const long iw0 = c0 * {self.SW} - {self.PL};",
             "    for (int kh = kh_lo; kh < kh_hi; ++kh) {",
             f"        const float *xr = xp + ((ih0 + kh) * {self.IW} + iw0) * {ib};",
             f"        const float *wr = wk + (long)kh * {self.KW * ib};"]
        for kw in range(self.KW):
            cond = f"if ((unsigned long)(iw0 + {kw}) < (unsigned long){self.IW}) " if checked else ""
            L.append(f"        {cond}{{ const {v.t} wv = {v.load(f'wr + {kw * ib}')};")
            for r in range(width):
                L.append(f"          a{r} = {v.fmadd(v.loadu(f'xr + {(r * self.SW + kw) * ib}'), 'wv', f'a{r}')};")
            L.append("        }")
        L.append("    }")
        for r in range(width):
            if not self.dw_ep.empty():
                stmts = vector_epilogue_stmts(self.dw_ep, self.em, self.bi, f"a{r}", None, "0", "0", "ch")
                assert stmts is not None, "schedule/dwpw.py fuses vector epilogues only"
                L += ["    " + x for x in stmts]
            L.append(f"    {v.storeu(f'out + (c0 + {r}) * {ib}', f'a{r}')}")
        L.append("}")
        doc = f"depthwise {width} columns of block {ib}{', taps checked' if checked else ''}"
        return define(self.em, f"f32_dwpw_dw_tile_{width}__{self.bi.isa}", "\n".join(L), doc)

    def dw_row(self) -> str:
        """One output row ``oh`` of one channel block into ``out`` ([OW][ib])."""
        lo, hi = self.body_range()
        R = self.s.dw_cols
        checked = self.dw_tile(1, True)
        L = ["static inline __attribute__((always_inline)) void FNAME(const float *restrict xp, "
             "const float *restrict wk, const float *restrict bd, long ch, long oh, float *restrict out) {",
             f"    const long ih0 = oh * {self.SH} - {self.PT};",
             "    const int kh_lo = ih0 < 0 ? (int)-ih0 : 0;",
             f"    const int kh_hi = {self.IH} - ih0 < {self.KH} ? (int)({self.IH} - ih0) : {self.KH};"]
        if hi <= lo:  # no column without padding taps
            L.append(f"    for (long c0 = 0; c0 < {self.OW}; ++c0) {checked}(xp, wk, bd, ch, ih0, kh_lo, kh_hi, c0, out);")
        else:
            if lo > 0:
                L.append(f"    for (long c0 = 0; c0 < {lo}; ++c0) {checked}(xp, wk, bd, ch, ih0, kh_lo, kh_hi, c0, out);")
            end = lo + (hi - lo) // R * R
            if end > lo:
                L.append(f"    for (long c0 = {lo}; c0 < {end}; c0 += {R}) "
                         f"{self.dw_tile(R, False)}(xp, wk, bd, ch, ih0, kh_lo, kh_hi, c0, out);")
            c0, rem = end, hi - end
            w = 1 << max(0, rem.bit_length() - 1) if rem else 0
            while rem:  # the body's last columns: tiles of 2^k (compile-time widths)
                if rem >= w:
                    L.append(f"    {self.dw_tile(w, False)}(xp, wk, bd, ch, ih0, kh_lo, kh_hi, {c0}, out);")
                    c0, rem = c0 + w, rem - w
                w //= 2
            if hi < self.OW:
                L.append(f"    for (long c0 = {hi}; c0 < {self.OW}; ++c0) "
                         f"{checked}(xp, wk, bd, ch, ih0, kh_lo, kh_hi, c0, out);")
        L.append("}")
        doc = (f"depthwise row C={self.C} in={self.geo.ins} out={self.geo.outs} k={self.geo.ks} "
               f"s={self.geo.strides} pads={self.geo.pads} block {self.ib}, body tiles of {R}")
        return define(self.em, f"f32_dwpw_dw_row__{self.bi.isa}", "\n".join(L), doc)

    # -- 1x1 ------------------------------------------------------------------------------
    def pw_tile(self, jt: int, width: int) -> str:
        """J x ``width`` positions of the band from the buffer at ``b`` into y at ``yo``."""
        v, ob, ib = self.vo, self.ob, self.ib
        tile = RegisterTile(v, jt, width)
        L = ["static inline __attribute__((always_inline)) void FNAME(const float *restrict b, "
             f"const float *restrict w, float *restrict y, long yo, long ch{self.eparams}) {{"]
        L += ["    " + x for x in tile.declare()]
        L.append(f"    for (int cb = 0; cb < {self.CB}; ++cb) {{")
        L.append(f"        const float *br = b + (long)cb * {self.bstride};")
        L.append(f"        const float *wr = w + (long)cb * {ib * jt * ob};")
        L.append(f"        for (int i = 0; i < {ib}; ++i) {{")
        L += tile.fma_step(lambda j: v.load(f"wr + i * {jt * ob} + {j * ob}"),
                           lambda r: v.set1(f"br[{r * ib} + i]"), list(range(width)), indent="            ")
        L.append("        }")
        L.append("    }")
        for j in range(jt):
            for r in range(width):
                acc, flat = f"a{j}_{r}", f"yo + {j * self.OH * self.OW * ob + r * ob}"
                if not self.pw_ep.empty():
                    stmts = vector_epilogue_stmts(self.pw_ep, self.em, self.bo, acc, None, flat, "0", f"ch + {j * ob}")
                    assert stmts is not None, "schedule/dwpw.py fuses vector epilogues only"
                    L += ["    " + x for x in stmts]
                L.append(f"    {v.store(f'y + {flat}', acc)}")
        L.append("}")
        doc = f"1x1 tile {jt}x{width} of oc_bn={ob} over a band buffer of block {ib}"
        return define(self.em, f"f32_dwpw_pw_tile_{jt}x{width}__{self.bo.isa}", "\n".join(L), doc)

    def pw_band(self, jt: int, ind: str) -> list[str]:
        """The 1x1 over the band's ``P`` positions: full tiles, then tiles of 2^k positions."""
        R = self.s.pw_cols
        call = f"(buf + p0 * {self.ib}, wt, y, yo + p0 * {self.ob}, ch{self.eargs});"
        L = [f"{ind}long p0 = 0;",
             f"{ind}for (; p0 + {R} <= P; p0 += {R}) {self.pw_tile(jt, R)}{call}"]
        w = 1 << max(0, (R - 1).bit_length() - 1) if R > 1 else 0
        while w:
            L.append(f"{ind}if ((P - p0) & {w}) {{ {self.pw_tile(jt, w)}{call} p0 += {w}; }}")
            w //= 2
        return L

    def kernel(self) -> str:
        s = self.s
        nbands = -(-self.OH // s.band_rows)
        J = s.pw_blocks
        row = self.dw_row()
        L = ["static void FNAME(const float *restrict x, const float *restrict wd, const float *restrict bd, "
             f"const float *restrict wp, float *restrict y, float *restrict scratch{self.eparams}, int tid, int nt) {{",
             f"    float *restrict buf = scratch + (long)tid * {s.band_rows * self.OW * self.C};",
             f"    const long total = {self.N * nbands * s.oc_parts}L;",
             "    const long lo = total * tid / nt, hi = total * (tid + 1) / nt;",
             "    long cur = -1;  /* the band in buf */",
             "    for (long it = lo; it < hi; ++it) {",
             f"        const long band = it / {s.oc_parts}, part = it % {s.oc_parts};",
             f"        const long n = band / {nbands}, oh0 = (band % {nbands}) * {s.band_rows};",
             f"        const long rows = {self.OH} - oh0 < {s.band_rows} ? {self.OH} - oh0 : {s.band_rows};",
             "        if (band != cur) {",
             "            cur = band;",
             f"            for (long cb = 0; cb < {self.CB}; ++cb) {{",
             f"                const float *xp = x + (n * {self.CB} + cb) * {self.IH * self.IW * self.ib}L;",
             f"                for (long r = 0; r < rows; ++r) {row}(xp, wd + cb * {self.KH * self.KW * self.ib}, bd, "
             f"cb * {self.ib}, oh0 + r, buf + cb * {self.bstride} + r * {self.OW * self.ib});",
             "            }",
             "        }",
             f"        const long P = rows * {self.OW};",
             f"        const long t_lo = {self.tiles} * part / {s.oc_parts}, t_hi = {self.tiles} * (part + 1) / {s.oc_parts};",
             "        for (long t = t_lo; t < t_hi; ++t) {",
             f"            const float *wt = wp + t * {self.C * J * self.ob}L;",
             f"            const long ch = t * {J * self.ob};",
             f"            const long yo = ((n * {self.OCB} + t * {J}) * {self.OH} + oh0) * {self.OW * self.ob};"]
        if self.ragged:
            L.append(f"            if (t == {self.tiles - 1}) {{")
            L += self.pw_band(self.ragged, "                ")
            L.append("            } else {")
            L += self.pw_band(J, "                ")
            L.append("            }")
        else:
            L += self.pw_band(J, "            ")
        L += ["        }", "    }", "}"]
        geo = self.geo
        doc = (f"depthwise C={self.C} in={geo.ins} out={geo.outs} k={geo.ks} s={geo.strides} pads={geo.pads}, "
               f"then 1x1 {self.C}->{self.OC}; NCHW{self.ib}c -> NCHW{self.ob}c; band_rows={s.band_rows} "
               f"oc_parts={s.oc_parts} dw_cols={s.dw_cols} pw tile {J}x{s.pw_cols}; "
               f"epilogue: {epilogue_doc(self.node)}")
        return define(self.em, f"f32_dw_pw_conv_nchw{self.ib}c_{self.ob}c__{self.bo.isa}", "\n".join(L), doc)


def _check(node: Node, g: Graph) -> str | None:
    s = node.schedule
    if not isinstance(s, DwPwSchedule):
        return "not scheduled by schedule/dwpw.py"
    out = g.values[node.outputs[0]]
    if out.layout == PLAIN or layout_block(out.layout) != s.ob:
        return f"output layout {out.layout} is not NCHW{s.ob}c"
    if layout_block(g.values[node.inputs[0]].layout) != s.ib:
        return f"input layout is not NCHW{s.ib}c"
    for e in node.epilogue:
        if e.input and e.broadcast == "full" and g.values[e.input].layout != out.layout:
            return f"residual operand {e.input!r} is {g.values[e.input].layout}, output {out.layout}"
    return None


@register(FUSED_OP, domain=SMELT_DOMAIN, check=_check, name="f32_dw_pw_conv_nchwc", blocked=True)
def emit_dw_pw_conv(node: Node, g: Graph, em: BlockEmitter) -> None:
    s = node.schedule
    assert isinstance(s, DwPwSchedule), node.name
    geo = dw_geometry(node, g)
    wd = np.asarray(g.const(node.inputs[1]), dtype=np.float32)
    wd_packed = wd.reshape(geo.c // s.ib, s.ib, geo.ks[0], geo.ks[1]).transpose(0, 2, 3, 1)
    wp = np.asarray(g.const(node.inputs[3]), dtype=np.float32)
    oc = wp.shape[0]
    wp = wp.reshape(oc, geo.c)
    width = s.pw_blocks * s.ob
    tiles = [np.ascontiguousarray(wp[t0:min(t0 + width, oc)].T).reshape(-1) for t0 in range(0, oc, width)]
    wd_ptr = em.weight(wd_packed.reshape(-1), key=f"dwpw:dw:{node.name}:{s.ib}")
    wp_ptr = em.weight(np.concatenate(tiles), key=f"dwpw:pw:{node.name}:{s}")
    bd = em.ptr(node.inputs[2]) if node.inputs[2] else wd_ptr  # (unused without a bias)
    bias = em.ptr(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] else None
    ep, eargs = kernel_param_epilogue(em, node, bias)
    gen = _Gen(em, node, g, s, ep, len(eargs))
    fn = gen.kernel()
    buf = em.scratch(max(1, em.n_threads) * s.band_rows * gen.OW * geo.c * 4)
    args = "".join(f", {a}" for a in eargs)
    em.schedule(algorithm="depthwise conv fused into the 1x1 conv, band by band of output rows (NCHW[x]c)",
                kernel=fn.rsplit("_", 1)[0], micro_kernel=f"{s.pw_blocks}x{s.pw_cols} x {s.ob} lanes {gen.bo.isa}",
                blocking=f"ib={s.ib} ob={s.ob} band_rows={s.band_rows} oc_parts={s.oc_parts} dw_cols={s.dw_cols}",
                threads="static split over (image, band, output-channel part)",
                layout=f"NCHW{s.ib}c -> NCHW{s.ob}c; weights dw [C/{s.ib}][KH][KW][{s.ib}], 1x1 [tile][C][J*{s.ob}]")
    em.step(f"{fn}({em.ptr(node.inputs[0])}, {wd_ptr}, {bd}, {wp_ptr}, {em.ptr(node.outputs[0])}, {buf}{args}, tid, nt);")
