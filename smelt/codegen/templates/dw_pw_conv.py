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
    """The depthwise conv's geometry (its attributes are kept on the fused node; with the expand
    conv fused, x has the expand's input channels: the depthwise has C = OC)."""
    geo = ConvGeometry(Node("Conv", node.name, [node.inputs[0], node.inputs[1]], [node.outputs[0]],
                            attrs=dict(node.attr("dw_attrs") or {})), g)
    geo.c = geo.oc
    return geo


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
        # the expand conv fused too: x is its input ([N][CIN/ex_ib][IH][IW][ex_ib]); the
        # depthwise reads its rows from the ring (row ih at ih % ring_rows)
        self.expand = s.ex_ib > 0
        self.CIN = int(g.values[node.inputs[0]].shape[1]) if self.expand else self.C
        eops = [TileOperand("Add", "be", "col")] if self.expand and node.inputs[6] else []
        self.ex_ep = TileEpilogue(eops + list(node.attr("ex_epilogue") or []))

    # -- depthwise ------------------------------------------------------------------------
    def row_index(self, ih: str) -> str:
        """Where input row ``ih`` (>= 0) is: its row in x, or its slot in the ring."""
        return f"(({ih}) % {self.s.ring_rows})" if self.expand else f"({ih})"

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
             f"        const float *xr = xp + ({self.row_index('ih0 + kh')} * {self.IW} + iw0) * {ib};",
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
    def onexone_tile(self, tag: str, jt: int, width: int, cin: int, ib: int, in_stride: int, ob: int,
                     out_stride: int, ep: TileEpilogue, params: str, yq: str = "restrict ") -> str:
        """J x ``width`` positions of a 1x1 conv: input at ``b`` ([cin/ib] blocks ``in_stride``
        floats apart, positions ``ib`` floats apart), weights [cin][jt x ob], output blocks
        ``out_stride`` floats apart from ``yo`` (the 1x1 into y, or the expand into the ring).
        Not inlined: inside the band loop's live addresses gcc 12 spilled a 2 x 14 tile's
        accumulators to the stack (the expand of a 112x112 block ran 37% slower than alone)."""
        blk = _blocking(ob)
        v = blk.vx
        tile = RegisterTile(v, jt, width)
        L = ["static __attribute__((noinline)) void FNAME(const float *restrict b, "
             f"const float *restrict w, float *{yq}y, long yo, long ch{params}) {{"]
        L += ["    " + x for x in tile.declare()]
        L.append(f"    for (int cb = 0; cb < {cin // ib}; ++cb) {{")
        L.append(f"        const float *br = b + (long)cb * {in_stride};")
        L.append(f"        const float *wr = w + (long)cb * {ib * jt * ob};")
        L.append(f"        for (int i = 0; i < {ib}; ++i) {{")
        L += tile.fma_step(lambda j: v.load(f"wr + i * {jt * ob} + {j * ob}"),
                           lambda r: v.set1(f"br[{r * ib} + i]"), list(range(width)), indent="            ")
        L.append("        }")
        # as in the NCHWc conv kernel: gcc 12 otherwise keeps broadcasts of later steps live
        # next to the J x R accumulators and spills accumulators to the stack
        L.append('        __asm__ volatile("" ::: "memory");')
        L.append("    }")
        for j in range(jt):
            for r in range(width):
                acc, flat = f"a{j}_{r}", f"yo + {j * out_stride + r * ob}"
                if not ep.empty():
                    stmts = vector_epilogue_stmts(ep, self.em, blk, acc, None, flat, "0", f"ch + {j * ob}")
                    assert stmts is not None, "schedule/dwpw.py fuses vector epilogues only"
                    L += ["    " + x for x in stmts]
                L.append(f"    {v.store(f'y + {flat}', acc)}")
        L.append("}")
        doc = f"1x1 ({tag}) tile {jt}x{width} of {ob} lanes, input block {ib}"
        return define(self.em, f"f32_dwpw_{tag}_tile_{jt}x{width}__{blk.isa}", "\n".join(L), doc)

    def pw_tile(self, jt: int, width: int) -> str:
        return self.onexone_tile("pw", jt, width, self.C, self.ib, self.bstride, self.ob, self.OH * self.OW * self.ob,
                                 self.pw_ep, self.eparams)

    def ex_tile(self, jt: int, width: int) -> str:
        s = self.s
        return self.onexone_tile("ex", jt, width, self.CIN, s.ex_ib, self.IH * self.IW * s.ex_ib, self.ib,
                                 s.ring_rows * self.IW * self.ib, self.ex_ep, ", const float *restrict be")

    def ex_row(self) -> str:
        """The expand conv's output row ``ih`` (every channel) into the ring (row ih % ring)."""
        s = self.s
        J, R = s.ex_blocks, s.ex_cols
        tiles = -(-self.CB // J)
        ragged = self.CB % J
        L = ["static void FNAME(const float *restrict x, const float *restrict we, const float *restrict be, "
             "float *restrict ring, long n, long ih) {",
             f"    const float *xr = x + ((n * {self.CIN // s.ex_ib}) * {self.IH} + ih) * {self.IW * s.ex_ib}L;",
             f"    const long ro = (ih % {s.ring_rows}) * {self.IW * self.ib};",
             f"    for (long t = 0; t < {tiles}; ++t) {{",
             f"        const float *wt = we + t * {self.CIN * J * self.ib}L;",
             f"        const long ch = t * {J * self.ib}, yo = t * {J * s.ring_rows * self.IW * self.ib}L + ro;"]

        def cols(jt: int, ind: str) -> list[str]:
            call = f"(xr + p0 * {s.ex_ib}, wt, ring, yo + p0 * {self.ib}, ch, be);"
            out = [f"{ind}long p0 = 0;"]
            if self.IW >= R:
                out.append(f"{ind}for (; p0 + {R} <= {self.IW}; p0 += {R}) {self.ex_tile(jt, R)}{call}")
            rem, w = self.IW % R, R
            while rem:
                w = 1 << (rem.bit_length() - 1)
                out.append(f"{ind}{self.ex_tile(jt, w)}{call} p0 += {w};")
                rem -= w
            return out

        if ragged:
            L.append(f"        if (t == {tiles - 1}) {{")
            L += cols(ragged, "            ")
            L.append("        } else {")
            L += cols(J, "            ")
            L.append("        }")
        else:
            L += cols(J, "        ")
        L += ["    }", "}"]
        doc = (f"expand 1x1 {self.CIN}->{self.C} of one input row of {self.IW}, NCHW{s.ex_ib}c -> ring of "
               f"{s.ring_rows} rows NCHW{self.ib}c, tile {J}x{R}")
        return define(self.em, f"f32_dwpw_ex_row__{self.bi.isa}", "\n".join(L), doc)

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

    def scratch_floats(self) -> int:
        """Floats of one thread's buffers: the band, and the expand's ring."""
        s = self.s
        return s.band_rows * self.OW * self.C + (s.ring_rows * self.IW * self.C if self.expand else 0)

    def kernel(self) -> str:
        s = self.s
        nbands = -(-self.OH // s.band_rows)
        J = s.pw_blocks
        row = self.dw_row()
        exp = ", const float *restrict we, const float *restrict be" if self.expand else ""
        L = ["static void FNAME(const float *restrict x, const float *restrict wd, const float *restrict bd, "
             f"const float *restrict wp, float *restrict y, float *restrict scratch{exp}{self.eparams}, int tid, int nt) {{",
             f"    float *restrict buf = scratch + (long)tid * {self.scratch_floats()};"]
        if self.expand:
            # the ring's valid input rows [have_lo, have_hi) of image have_n: a thread's bands are
            # consecutive, so a band computes only the rows the previous one did not
            L += [f"    float *restrict ring = buf + {s.band_rows * self.OW * self.C};",
                  "    long have_n = -1, have_lo = 0, have_hi = 0;"]
        L += [
             f"    const long total = {self.N * nbands * s.oc_parts}L;",
             "    const long lo = total * tid / nt, hi = total * (tid + 1) / nt;",
             "    long cur = -1;  /* the band in buf */",
             "    for (long it = lo; it < hi; ++it) {",
             f"        const long band = it / {s.oc_parts}, part = it % {s.oc_parts};",
             f"        const long n = band / {nbands}, oh0 = (band % {nbands}) * {s.band_rows};",
             f"        const long rows = {self.OH} - oh0 < {s.band_rows} ? {self.OH} - oh0 : {s.band_rows};",
             "        if (band != cur) {",
             "            cur = band;"]
        if self.expand:
            L += [f"            long need_lo = oh0 * {self.SH} - {self.PT}, need_hi = (oh0 + rows - 1) * {self.SH} - {self.PT} + {self.KH};",
                  "            if (need_lo < 0) need_lo = 0;",
                  f"            if (need_hi > {self.IH}) need_hi = {self.IH};",
                  "            if (n != have_n || need_lo < have_lo || need_lo > have_hi) { have_n = n; have_lo = have_hi = need_lo; }",
                  f"            for (long ih = have_hi; ih < need_hi; ++ih) {self.ex_row()}(x, we, be, ring, n, ih);",
                  "            have_hi = need_hi;",
                  f"            if (have_lo < need_hi - {s.ring_rows}) have_lo = need_hi - {s.ring_rows};"]
            src = f"ring + cb * {s.ring_rows * self.IW * self.ib}L"
        else:
            src = f"x + (n * {self.CB} + cb) * {self.IH * self.IW * self.ib}L"
        L += [f"            for (long cb = 0; cb < {self.CB}; ++cb) {{",
             f"                const float *xp = {src};",
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
        doc = ((f"expand 1x1 {self.CIN}->{self.C} (NCHW{s.ex_ib}c, tile {s.ex_blocks}x{s.ex_cols}, ring of "
                f"{s.ring_rows} rows), " if self.expand else "") + f"depthwise C={self.C} in={geo.ins} out={geo.outs} k={geo.ks} s={geo.strides} pads={geo.pads}, "
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
    want = s.ex_ib or s.ib
    if layout_block(g.values[node.inputs[0]].layout) != want:
        return f"input layout is not NCHW{want}c"
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
    buf = em.scratch(max(1, em.n_threads) * gen.scratch_floats() * 4)
    args = "".join(f", {a}" for a in eargs)
    if gen.expand:  # the expand conv's weights per tile [CIN][J x ib] and bias
        we = np.asarray(g.const(node.inputs[5]), dtype=np.float32)
        we = we.reshape(we.shape[0], we.shape[1])
        ew = s.ex_blocks * s.ib
        etiles = [np.ascontiguousarray(we[t0:min(t0 + ew, geo.c)].T).reshape(-1) for t0 in range(0, geo.c, ew)]
        we_ptr = em.weight(np.concatenate(etiles), key=f"dwpw:ex:{node.name}:{s}")
        be = em.ptr(node.inputs[6]) if node.inputs[6] else we_ptr  # (unused without a bias)
        args = f", {we_ptr}, {be}" + args
    em.schedule(algorithm=("expand 1x1 + " if gen.expand else "")
                + "depthwise conv fused into the 1x1 conv, band by band of output rows (NCHW[x]c)",
                kernel=fn.rsplit("_", 1)[0], micro_kernel=f"{s.pw_blocks}x{s.pw_cols} x {s.ob} lanes {gen.bo.isa}",
                blocking=f"ib={s.ib} ob={s.ob} band_rows={s.band_rows} oc_parts={s.oc_parts} dw_cols={s.dw_cols}"
                + (f" expand ib={s.ex_ib} tile {s.ex_blocks}x{s.ex_cols} ring_rows={s.ring_rows}" if gen.expand else ""),
                threads="static split over (image, band, output-channel part)",
                layout=f"NCHW{s.ib}c -> NCHW{s.ob}c; weights dw [C/{s.ib}][KH][KW][{s.ib}], 1x1 [tile][C][J*{s.ob}]")
    em.step(f"{fn}({em.ptr(node.inputs[0])}, {wd_ptr}, {bd}, {wp_ptr}, {em.ptr(node.outputs[0])}, {buf}{args}, tid, nt);")
