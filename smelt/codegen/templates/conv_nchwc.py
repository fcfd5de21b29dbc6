"""2-D ``Conv`` on blocked layouts (NeoCPU's NCHW[x]c template), float32, AVX-512 and AVX2.

Layouts: a value in ``NCHW<b>c`` is stored [N][C/b][H][W][b] (``plain`` NCHW is the b = 1 case
for reading). The output is always blocked, with ``oc_bn`` = one vector of output channels
(16 on AVX-512, 8 on AVX2 or for channel counts that are not multiples of 16); the input may be
in any block size ``ic_bn`` (its producer's), including plain.

Kernel ``f32_conv2d_nchw<oc_bn>c_<J>x<R>__<isa>`` (Algorithm 1 of NeoCPU, extended):
a register tile is ``J`` output-channel blocks x ``R`` output columns of one output row
(J*R accumulators; the hints of the issue and our own sweeps: 2 x 14 or 1 x 28 on AVX-512).
For each input-channel block, kernel row and kernel column (unrolled: ``unroll_ker``), and each
of the ic_bn channels inside the block, the tile loads J weight vectors and broadcasts R input
scalars into J*R FMAs. An empty ``asm volatile`` after each kernel column stops gcc 12 from
keeping overlapping broadcasts live across columns (it spilled them to the stack).

Rows are split into left-pad / body / right-pad tiles at compile time: body tiles never check
bounds; edge tiles are separate functions in which the (column, kernel column) pairs that fall
into the padding are simply not emitted. Kernel rows outside the image are skipped by the
row's loop bounds.

Two loop orders (``ic_chunk``):
- row-outer (0): work items are (image, output-channel tile, output row), split statically and
  evenly over threads (oc-tile outer, so consecutive items reuse one weight tile from L2); a
  tile's accumulators stay in registers over all input channels. While a row computes, a slice
  of the *next* tile's weights is prefetched into L2, a few lines per kernel tap.
- ic-outer (k channels per chunk, NeoCPU's own order): work items are (image, output-channel
  tile); for each chunk of input channels every row of the item runs, loading its partial sums
  from the output and storing them back (the epilogue runs after the last chunk). A chunk's
  weights (sized to a third of L1) come from memory once and serve all rows. On small planes
  (7x7, 14x14) with big weights the row-outer order streams a tile's weights from memory for
  its first row with little compute to hide it (ResNet-50 stage 4: 47-53% of peak); ic-outer
  with the chunk after next prefetched a few lines per tap runs the same layers at 65-77% in
  the network (80%+ alone). The default takes it for planes of at most ``IC_OUTER_MAX_PLANE``
  positions.

Epilogue in registers before the store: bias, then the node's fused chain (residual add in the
output's layout, per-channel operands, activations).

Weights are re-laid out at compile time per tile: [tile][IC/ic_bn][KH][KW][ic_bn][J*oc_bn].

Column pairs (``NchwcSchedule.pairs``, ``_Gen.pair_tile_fn``): 8-channel output blocks on a
16-lane ISA put two adjacent output columns in each vector (contiguous in NCHW8c) instead of
running at half width: weights duplicated into both halves ([..][J][2][8]), each input tap a
two-scalar broadcast (one of them where the other column's tap is on the padding), raw sums
stored and the epilogue applied after on half-width vectors (``epilogue_pass``).

Depthwise (group == C == OC) has its own kernel ``f32_dwconv2d_nchw<b>c_<R>__<isa>``: input and
output in the same block size, one vector of channels per tap (a load, not a broadcast).

The schedule stage (``smelt/schedule/conv.py``) decides everything this template renders and
writes it on the node as a ``ConvSchedule``: the tile (``NchwcSchedule``, fitted to the blocks
the layout pass chose), the prefetches and the row-first work split (``DirectKernel``), whether the conv runs as Winograd F(2x2, 3x3) instead
(``templates/winograd.py``), and whether its output may overwrite a fused residual operand (the
memory planner applies that when the conv is the operand's last reader; ``y`` then loses
``restrict``).
"""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import BlockEmitter
from smelt.codegen.kernels.conv_geometry import (
    ConvGeometry,
    is_depthwise,
    is_flat_pointwise,
)
from smelt.codegen.kernels.epilogue import epilogue_doc
from smelt.codegen.kernels.gemm import (
    Blocking,
    TileEpilogue,
    define,
    kernel_param_epilogue,
    scalar_epilogue,
    vector_epilogue_stmts,
)
from smelt.codegen.kernels.isa import vector_isa, with_lanes
from smelt.codegen.kernels.tile import RegisterTile
from smelt.codegen.registry import register
from smelt.ir.graph import PLAIN, Graph, Node, layout_block
from smelt.schedule.conv import (
    ConvSchedule,
    DirectKernel,
    NchwcSchedule,
    geometry_reason,
    ic_outer_blocks,
)


# ------------------------------------------------------------------------------------------
# Compile-time weight layout
# ------------------------------------------------------------------------------------------
def pack_weights(w: np.ndarray, geo: ConvGeometry, s: NchwcSchedule, ib: int) -> np.ndarray:
    """[OC, C/G, KH, KW] -> per tile [C/G/ib][KH][KW][ib][J*oc_bn] (tiles never straddle groups);
    column pairs (``s.pairs``): [J][2][oc_bn], each block twice, one vector spanning both."""
    oc, cg, kh, kw = w.shape
    ob, j = s.oc_bn, s.oc_blocks
    ocg = oc // geo.group
    tiles = []
    for g0 in range(0, oc, ocg):  # groups
        for t0 in range(g0, g0 + ocg, ob * j):
            t1 = min(t0 + ob * j, g0 + ocg)
            blk = w[t0:t1].reshape(t1 - t0, cg // ib, ib, kh, kw).transpose(1, 3, 4, 2, 0)
            if s.pairs:
                blk = np.repeat(blk.reshape(*blk.shape[:-1], (t1 - t0) // ob, 1, ob), 2, axis=-2)
            tiles.append(np.ascontiguousarray(blk, dtype=np.float32).reshape(-1))
    return np.concatenate(tiles)


# ------------------------------------------------------------------------------------------
# Code generation
# ------------------------------------------------------------------------------------------
def _blocking(ob: int) -> Blocking:
    """The vector spelling for one block of ``ob`` lanes (kernels/isa.py; 8 lanes: the AVX2
    spelling, on AVX-512 hosts too)."""
    vx = with_lanes(ob)
    assert vx.lanes == ob, ob
    return Blocking(vx.name, ob, 1, ob, 1, 1, 1, fma=True)


class _Gen:
    """Renders one convolution's kernel (driver + tile functions)."""

    def __init__(self, em: BlockEmitter, node: Node, g: Graph, geo: ConvGeometry, s: NchwcSchedule,
                 dk: DirectKernel, ib: int, ep: TileEpilogue, n_eps: int, y_aliased: bool = False) -> None:
        self.em, self.node, self.g, self.geo, self.s, self.dk, self.ib = em, node, g, geo, s, dk, ib
        # y written over a residual operand (codegen/inplace.py): y may not be restrict
        self.yq = "" if y_aliased else "restrict "
        self.ep = ep
        # (schedule.conv.epilogue_after_store; never over an aliased residual operand)
        self.after_store = dk.epilogue_after_store and not y_aliased and not ep.empty()
        # column pairs (``NchwcSchedule.pairs``): the tile runs on the full-width ISA, two output
        # columns per vector; raw sums are stored, then the epilogue runs on half-width vectors
        self.pairs = s.pairs
        assert not (s.pairs and y_aliased), "column pairs store raw sums: never over a residual operand"
        self.vp = vector_isa(em.target) if s.pairs else None
        self.wdup = 2 if s.pairs else 1  # weight floats per output channel (pairs: each twice)
        self.has_bias = len(node.inputs) > 2 and bool(node.inputs[2])
        self.blk = _blocking(s.oc_bn)
        self.v = self.blk.vx
        self.eparams = "".join(f", const float *e{k}" for k in range(n_eps))
        self.eargs = "".join(f", e{k}" for k in range(n_eps))
        self.chunk = max(1, s.ic_chunk // ib)  # input blocks per chunk
        self.chunked = ic_outer_blocks(geo, s, ib) > 0
        self.icparams = ", int icb_lo, int icb_hi" if self.chunked else ""
        self.icargs = ", icb_lo, icb_hi" if self.chunked else ""
        # the schedule's work split: row-outer order with small weights splits work by rows first
        # (schedule.conv.DirectKernel.row_split); big weights split by oc tile
        self.row_split = dk.row_split
        # the next weights (ic-outer: a chunk ahead; row-outer: the next oc tile) are prefetched
        # into L2 a few lines per kernel tap (``pf``: this row's slice of them), spread evenly so
        # the prefetches never crowd the line-fill buffers the FMAs' loads need
        self.tap_prefetch = dk.prefetch_weights
        if self.tap_prefetch:
            self.icparams += ", const char *pf"
            self.icargs += ", pf"
        ih, iw = geo.ins
        oh, ow = geo.outs
        self.IH, self.IW, self.OH, self.OW = ih, iw, oh, ow
        self.KH, self.KW = geo.ks
        self.SH, self.SW = geo.strides
        self.DH, self.DW = geo.dils
        self.PT, self.PL = geo.pb
        self.dw = is_depthwise(geo)
        # 1x1 stride-1 unpadded: the plane is one flat row of positions, cut into pseudo-rows of
        # P columns (a multiple of reg_n), so a 7x7 plane takes 28-wide tiles, not 7-wide ones
        self.flat = is_flat_pointwise(geo)
        if self.flat:
            hw = oh * ow
            self.IH, self.IW, self.OH, self.OW = 1, hw, 1, hw
            self.P = min(hw, s.reg_n * max(1, round(ow / s.reg_n)))
            self.rows = -(-hw // self.P)
            self.last = hw - (self.rows - 1) * self.P
        else:
            self.P, self.rows, self.last = ow, oh, ow
        # lines per tap: a chunk's weights / (rows x taps per chunk)
        self.pf_lines = -(-(ib * s.oc_blocks * s.oc_bn * 4 * self.wdup) // (self.rows * 64))
        # taps that prefetch: enough to cover a row's slice (a thin kernel, e.g. 3 input channels,
        # has more taps than lines to fetch)
        row_lines = -(-(geo.cg * self.KH * self.KW * s.oc_blocks * s.oc_bn * 4 * self.wdup) // (self.rows * 64))
        if self.chunked:
            row_lines = -(-row_lines * self.chunk // (geo.cg // ib))
        self.pf_taps = -(-row_lines // self.pf_lines)
        # the next output row's input (``DirectKernel.prefetch_rows``): the rows it reads that this
        # one does not (offsets from this row's first input row; a flat 1x1's next pseudo-row is
        # P positions on), each tile prefetching its own columns of them, a share per kernel row
        self.prefetch_rows = dk.prefetch_rows
        assert not (self.prefetch_rows and (self.dw or self.chunked)), "next-row prefetch: row-outer, not depthwise"
        if self.flat:
            self.next_rows: list[int] = [0]
        else:
            now = {k * self.DH for k in range(self.KH)}
            self.next_rows = sorted({self.SH + k * self.DH for k in range(self.KH)} - now)
        self.prparams = ", long pr" if self.prefetch_rows else ""

    # -- tiles ---------------------------------------------------------------------------
    def col_ok(self, ow: int, kw: int) -> bool:
        iw = ow * self.SW - self.PL + kw * self.DW
        return 0 <= iw < self.IW

    def body_range(self) -> tuple[int, int]:
        """Output columns [lo, hi) whose every kernel column is inside the image."""
        lo = -(-self.PL // self.SW)
        hi = (self.IW - 1 + self.PL - (self.KW - 1) * self.DW) // self.SW + 1
        return max(0, lo), min(self.OW, max(hi, 0))

    def out_flat(self, j: int, r: int) -> str:
        """Offset in y of output-channel block j, column r of the tile."""
        return f"yo + {j * self.OH * self.OW * self.s.oc_bn + r * self.s.oc_bn}"

    def store_lines(self, j: int, r: int, acc: str, flat: str | None = None) -> list[str]:
        ob = self.s.oc_bn
        flat = self.out_flat(j, r) if flat is None else flat
        col = f"ch + {j * ob}"
        lines = []
        vec = vector_epilogue_stmts(self.ep, self.em, self.blk, acc, None, flat, "0", col) if not self.ep.empty() else []
        if vec is not None:
            lines += vec
            lines.append(self.v.store(f"y + {flat}", acc))
        else:  # an op without a vector form: finish lane by lane
            lines.append(self.v.store(f"y + {flat}", acc))
            expr = scalar_epilogue(self.ep, self.em, f"y[{flat} + l]", f"({flat} + l)", "0", f"({col} + l)")
            lines.append(f"for (int l = 0; l < {ob}; ++l) y[{flat} + l] = {expr};")
        return lines

    def finish_lines(self, jt: int, width: int) -> list[str]:
        """The tile's stores with its epilogue: in registers, or (``epilogue_after_store``) the raw
        sums stored first and the epilogue applied by a loop over the stored vectors, whose
        constants stay in registers (same operations in the same order: the same bits)."""
        if not self.after_store:
            return ["    " + x for j in range(jt) for r in range(width) for x in self.store_lines(j, r, f"a{j}_{r}")]
        v = self.v
        out = [f"    {v.store(f'y + {self.out_flat(j, r)}', f'a{j}_{r}')}" for j in range(jt) for r in range(width)]
        return out + self.epilogue_pass(jt, width)

    def epilogue_pass(self, jt: int, width: int) -> list[str]:
        """The fused epilogue over a tile's stored raw sums, a loop over its block vectors (whose
        constants stay in registers): none when the epilogue is empty. With ``after_store`` (an
        activation of many constants, schedule.conv.MEMORY_EPILOGUE_OPS) the loops are a function
        of their own that is never inlined: inlined, gcc forwarded the stored sums to the loop
        and hoisted its constants (an erf GELU's table and coefficients, 12 vectors) out of the
        tile loop, so the FMA loop kept its accumulators on the stack (a 48->96 1x1 conv at
        160x160 with GELU 1.68 ms, 0.73 without; EMR, 2 threads)."""
        if self.ep.empty():
            return []
        v, out = self.v, []
        for j in range(jt):
            flat = f"{self.out_flat(j, 0)} + (long)r * {self.s.oc_bn}"
            out.append(f"    for (int r = 0; r < {width}; ++r) {{")
            out.append(f"        {v.t} t = {v.load(f'y + {flat}')};")
            out += ["        " + x for x in self.store_lines(j, 0, "t", flat)]
            out.append("    }")
        if not self.after_store:
            return out
        code = "\n".join([f"static __attribute__((noinline)) void FNAME(float *restrict y, long yo, long ch{self.eparams}) {{",
                          *out, "}"])
        fn = define(self.em, f"f32_conv_nchw{self.s.oc_bn}c_epilogue_{jt}x{width}__{self.blk.isa}", code,
                    f"the fused epilogue over a stored {jt}x{width} tile; {epilogue_doc(self.node)}")
        return [f"    {fn}(y, yo, ch{self.eargs});"]

    def block_head(self, width: int, icbs: int, icb_end: str) -> list[str]:
        """Inside an input-block loop (``icb``, ending at ``icb_end``): the next block's first
        input row prefetched, the kernel-row loop opened and its input row ``xr`` declared."""
        ib, L = self.ib, []
        if self.dk.prefetch_input and icbs > 1:
            # the next channel block's first input row of this tile: its lines would otherwise
            # miss L1 at the start of every block (the input plane rarely fits L1)
            L.append(f"        if (icb + 1 < {icb_end}) {{ const char *pn = (const char *)(x + xo + ((long)(icb + 1) * {self.IH} "
                     f"+ (long)kh_lo * {self.DH}) * {self.IW * ib});")
            for begin, end in self.tap_runs(width):
                L.append(f"            for (int q = {begin * 4}; q < {end * 4}; q += 64) _mm_prefetch(pn + q, _MM_HINT_T0);")
            L.append("        }")
        L.append("        for (int kh = kh_lo; kh < kh_hi; ++kh) {")
        L.append(f"            const float *xr = x + xo + ((long)icb * {self.IH} + (long)kh * {self.DH}) * {self.IW * ib};")
        return L + self.next_row_prefetch(width)

    def tap_runs(self, width: int) -> list[tuple[int, int]]:
        """The floats of one input row a tile of ``width`` columns reads, as [begin, end) runs from
        its first column: one run where the kernel columns' ranges overlap, one per kernel column
        where a dilation leaves gaps between them (a 1-D TCN's dilation of 2048 would otherwise
        prefetch the 256 KiB between its taps at every block start)."""
        ib, per_tap = self.ib, ((width - 1) * self.SW + 1) * self.ib
        runs: list[tuple[int, int]] = []
        for kw in range(self.KW):
            begin = kw * self.DW * ib
            if runs and begin <= runs[-1][1]:
                runs[-1] = (runs[-1][0], begin + per_tap)
            else:
                runs.append((begin, begin + per_tap))
        return runs

    def next_row_prefetch(self, width: int) -> list[str]:
        """Inside a kernel row's loop (``kh``) of input block ``icb``: this kernel row's share of
        the tile's columns of the input rows the next output row adds (``prefetch_rows``), into
        L2, where they arrive long before that row runs. ``pr`` keeps them inside the image: this
        row's first input row ``ih0``, or (a flat 1x1) the positions left after the tile's span
        in the next pseudo-row."""
        if not self.prefetch_rows:
            return []
        ib, L = self.ib, []
        for begin, end in self.tap_runs(width):
            lines = (end - begin) * 4 // 64 + 1  # the run may straddle one more line than its length
            share = -(-lines // self.KH)  # lines per kernel row
            step, stop = share * 64, begin * 4 + lines * 64
            L.append(f"            {{ const long q0 = {begin * 4} + (long)kh * {step}, "
                     f"q1 = q0 + {step} < {stop} ? q0 + {step} : {stop};")
            for off in self.next_rows:
                if self.flat:
                    base = f"x + xo + (long)icb * {self.IW * ib} + {self.P * ib}"
                    guard = "pr >= 0"
                else:
                    base = f"x + xo + ((long)icb * {self.IH} + {off}) * {self.IW * ib}"
                    guard = f"(unsigned long)(pr + {off}) < {self.IH}UL"
                L.append(f"              if ({guard}) {{ const char *nr = (const char *)({base});")
                L.append("                for (long q = q0; q < q1; q += 64) _mm_prefetch(nr + q, _MM_HINT_T1); }")
            L.append("            }")
        return L

    def pr_arg(self, c0: str) -> str:
        """The ``pr`` argument of a tile call at output column ``c0`` (see ``next_row_prefetch``)."""
        if not self.prefetch_rows:
            return ""
        if self.flat:
            return f", {self.IW} - (oh + 1) * {self.P} - ({c0}) - {self.s.reg_n}"
        return ", ih0"

    def tap_prefetch_lines(self, kw: int | str, icbs: int, ind: str) -> list[str]:
        """After kernel column ``kw`` (a number, or the loop variable's name): this tap's slice of
        the weights prefetched next (``pf``), while the row still has taps to cover them."""
        if not self.tap_prefetch:
            return []
        icb0 = "(icb - icb_lo)" if self.chunked else "icb"
        tap = f"({icb0} * {self.KH} + kh) * {self.KW} + {kw}"
        taps = (self.chunk if self.chunked else icbs) * self.KH * self.KW
        # (a run-time width: always tested, so the code does not change with the rows)
        guard = f"if ({tap} < {self.pf_taps}) " if self.pf_taps < taps or self.dk.runtime_width else ""
        return [f"{ind}{guard}{{ const char *pq = pf + (long)({tap}) * {self.pf_lines * 64};",
                f"{ind}  for (int q = 0; q < {self.pf_lines * 64}; q += 64) _mm_prefetch(pq + q, _MM_HINT_T1); }}"]

    def tile_fn(self, width: int, jt: int, ow0: int | None, checked: bool = False) -> str:
        """A J x width tile; ``ow0`` known (an edge tile, padding taps dropped) or None (body);
        ``checked``: one column whose input column ``iw0`` is known at run time only, each
        kernel column tested against the image (the right edge of a run-time width)."""
        v, ob, ib = self.v, self.s.oc_bn, self.ib
        sw_ib, dw_ib = self.SW * ib, self.DW * ib
        icbs = self.geo.cg // ib
        tile = RegisterTile(v, jt, width)
        L = [f"static inline __attribute__((always_inline)) void FNAME(const float *restrict x, long xo, "
             f"const float *restrict w, float *{self.yq}y, long yo, long ch, int kh_lo, int kh_hi"
             f"{', long iw0' if checked else ''}{self.prparams}{self.icparams}{self.eparams}) {{"]
        if self.chunked:
            # ic-outer order: the first chunk starts from zero, later ones from the partial sums
            L += ["    " + x for x in tile.declare(None)]
            L.append("    if (icb_lo == 0) {")
            L += [f"        a{j}_{r} = {v.zero()};" for j in range(jt) for r in range(width)]
            L.append("    } else {")
            L += [f"        a{j}_{r} = {v.load(f'y + {self.out_flat(j, r)}')};" for j in range(jt) for r in range(width)]
            L.append("    }")
            L.append("    for (int icb = icb_lo; icb < icb_hi; ++icb) {")
            icb_end = "icb_hi"
        else:
            L += ["    " + x for x in tile.declare()]
            L.append(f"    for (int icb = 0; icb < {icbs}; ++icb) {{")
            icb_end = str(icbs)
        unroll = self.s.unroll_ker or ow0 is not None or checked
        L += self.block_head(width, icbs, icb_end)
        L.append(f"            const float *wr = w + ((long)icb * {self.KH} + kh) * {self.KW * ib * jt * ob};")
        kws = range(self.KW) if unroll else [None]
        for kw in kws:
            ind = "            "
            if kw is None:
                L.append(f"{ind}for (int kw = 0; kw < {self.KW}; ++kw) {{")
                ind += "    "
                rows = list(range(width))
                kwx, kww = f"kw * {dw_ib}", f"kw * {ib * jt * ob}"
            else:
                rows = [r for r in range(width) if ow0 is None or self.col_ok(ow0 + r, kw)]
                if not rows:
                    continue
                kwx, kww = str(kw * dw_ib), str(kw * ib * jt * ob)
                # checked: this kernel column only where it falls inside the image
                L.append(f"{ind}if ((unsigned long)(iw0 + {kw * self.DW}) < (unsigned long){self.IW}) {{"
                         if checked else f"{ind}{{")
                ind += "    "
            L.append(f"{ind}for (int i = 0; i < {ib}; ++i) {{")
            L += tile.fma_step(lambda j, kww=kww: v.load(f"wr + {kww} + i * {jt * ob} + {j * ob}"),
                               lambda r, kwx=kwx: v.set1(f"xr[{kwx} + i + {r * sw_ib}]"), rows, indent=ind + "    ")
            L.append(f"{ind}}}")
            L += self.tap_prefetch_lines(kw if kw is not None else "kw", icbs, ind)
            L.append(f'{ind}__asm__ volatile("" ::: "memory"); /* no broadcast reuse across kernel columns */')
            L.append(f"{ind[:-4]}}}")
        L.append("        }")
        L.append("    }")
        finish = self.finish_lines(jt, width)
        if self.chunked:  # partial sums go back raw; the last chunk applies the epilogue
            L.append(f"    if (icb_hi == {icbs}) {{")
            L += ["    " + x for x in finish]
            L.append("    } else {")
            L += [f"        {v.store(f'y + {self.out_flat(j, r)}', f'a{j}_{r}')};" for j in range(jt) for r in range(width)]
            L.append("    }")
        else:
            L += finish
        L.append("}")
        doc = (f"tile {jt}x{width} of oc_bn={ob} ic_bn={ib}{', ic-outer (partial sums in y)' if self.chunked else ''}, "
               + ("right edge, kernel columns checked at run time" if checked else
                  "body (no bounds checks)" if ow0 is None else f"edge at ow={ow0} (padding taps dropped)"))
        return define(self.em, f"f32_conv2d_nchw{ob}c_tile_{jt}x{width}__{self.blk.isa}", "\n".join(L), doc)

    def any_tile_fn(self, width: int, jt: int, ow0: int | None) -> str:
        """The tile of ``width`` columns: column pairs or one column per vector."""
        return self.pair_tile_fn(width, jt, ow0) if self.pairs else self.tile_fn(width, jt, ow0)

    def pair_tile_fn(self, width: int, jt: int, ow0: int | None) -> str:
        """A J x ``width`` tile with two output columns per vector (``NchwcSchedule.pairs``):
        column pair p is columns 2p (low half) and 2p + 1 (high half; an odd width's last pair
        has none). Per input channel and tap: J loads of the duplicated weights and one two-scalar
        broadcast per pair; a tap that falls on the padding for one column of a pair broadcasts
        the other alone, zeros beside it. Row-outer order only; the epilogue after the raw
        store, on half-width vectors (``epilogue_pass``)."""
        vp, ob, ib = self.vp, self.s.oc_bn, self.ib
        assert vp is not None and not self.chunked and not self.dw
        sw_ib, dw_ib = self.SW * ib, self.DW * ib
        icbs = self.geo.cg // ib
        npairs = (width + 1) // 2
        wstride = jt * 2 * ob  # weight floats per input channel of one tap
        tile = RegisterTile(vp, jt, npairs)
        L = [f"static inline __attribute__((always_inline)) void FNAME(const float *restrict x, long xo, "
             f"const float *restrict w, float *{self.yq}y, long yo, long ch, int kh_lo, int kh_hi"
             f"{self.prparams}{self.icparams}{self.eparams}) {{"]
        L += ["    " + x for x in tile.declare()]
        L.append(f"    for (int icb = 0; icb < {icbs}; ++icb) {{")
        L += self.block_head(width, icbs, str(icbs))
        L.append(f"            const float *wr = w + ((long)icb * {self.KH} + kh) * {self.KW * ib * wstride};")
        for kw in range(self.KW):
            halves = {}
            for p in range(npairs):
                c0, c1 = 2 * p, 2 * p + 1
                lo = ow0 is None or self.col_ok(ow0 + c0, kw)
                hi = c1 < width and (ow0 is None or self.col_ok(ow0 + c1, kw))
                if lo or hi:
                    halves[p] = (lo, hi)
            if not halves:
                continue
            kwx, kww = kw * dw_ib, kw * ib * wstride

            def pair(p: int, kwx: int = kwx, halves: dict = halves) -> str:
                lo, hi = halves[p]
                a, b = f"xr[{kwx} + i + {2 * p * sw_ib}]", f"xr[{kwx} + i + {(2 * p + 1) * sw_ib}]"
                name = "f32_pair_set1" if lo and hi else "f32_low_set1" if lo else "f32_high_set1"
                return vp.x(name, a=a, b=b)

            ind = "            "
            L.append(f"{ind}{{")
            L.append(f"{ind}    for (int i = 0; i < {ib}; ++i) {{")
            L += tile.fma_step(lambda j, kww=kww: vp.loadu(f"wr + {kww} + i * {wstride} + {j * 2 * ob}"),
                               pair, list(halves), indent=ind + "        ")
            L.append(f"{ind}    }}")
            L += self.tap_prefetch_lines(kw, icbs, ind + "    ")
            L.append(f'{ind}    __asm__ volatile("" ::: "memory"); /* no broadcast reuse across kernel columns */')
            L.append(f"{ind}}}")
        L.append("        }")
        L.append("    }")
        half = vp.lane_mask(str(ob))
        for j in range(jt):
            for p in range(npairs):
                ptr = f"y + {self.out_flat(j, 2 * p)}"
                acc = f"a{j}_{p}"
                L.append("    " + (vp.storeu(ptr, acc) if 2 * p + 1 < width else vp.masked_store(ptr, acc, half)))
        L += self.epilogue_pass(jt, width)
        L.append("}")
        doc = (f"column-pair tile {jt}x{width} of oc_bn={ob} ic_bn={ib}, two columns per {vp.lanes}-lane vector, "
               + ("body (no bounds checks)" if ow0 is None else f"edge at ow={ow0} (padding taps dropped per column)"))
        return define(self.em, f"f32_conv2d_nchw{ob}c_pairs_{jt}x{width}__{vp.name}", "\n".join(L), doc)

    def dw_tile_fn(self, width: int, ow0: int | None, checked: bool = False) -> str:
        """Depthwise: ``width`` columns of one channel block; taps are vector loads
        (``checked``: as in ``tile_fn``)."""
        v, ob = self.v, self.s.oc_bn
        L = [f"static inline __attribute__((always_inline)) void FNAME(const float *restrict x, long xo, "
             f"const float *restrict w, float *{self.yq}y, long yo, long ch, int kh_lo, int kh_hi"
             f"{', long iw0' if checked else ''}{self.eparams}) {{",
             f"    {v.t} " + ", ".join(f"a0_{r} = {v.zero()}" for r in range(width)) + ";",
             "    for (int kh = kh_lo; kh < kh_hi; ++kh) {",
             f"        const float *xr = x + xo + (long)kh * {self.DH * self.IW * ob};",
             f"        const float *wr = w + (long)kh * {self.KW * ob};"]
        for kw in range(self.KW):
            rows = [r for r in range(width) if ow0 is None or self.col_ok(ow0 + r, kw)]
            if not rows:
                continue
            if checked:
                L.append(f"        if ((unsigned long)(iw0 + {kw * self.DW}) < (unsigned long){self.IW})")
            L.append(f"        {{ const {v.t} wk = {v.load(f'wr + {kw * ob}')};")
            for r in rows:
                off = kw * self.DW * ob + r * self.SW * ob
                L.append(f"          a0_{r} = {v.fmadd(v.loadu(f'xr + {off}'), 'wk', f'a0_{r}')};")
            L.append("        }")
        L.append("    }")
        for r in range(width):
            L += ["    " + x for x in self.store_lines(0, r, f"a0_{r}")]
        L.append("}")
        doc = (f"depthwise tile {width} of block {ob}, "
               + ("right edge, taps checked at run time" if checked else
                  "body" if ow0 is None else f"edge at ow={ow0} (padding taps dropped)"))
        return define(self.em, f"f32_dwconv2d_nchw{ob}c_tile_{width}__{self.blk.isa}", "\n".join(L), doc)

    # -- the row --------------------------------------------------------------------------
    def segment_columns(self) -> list[tuple[int, int]]:
        """The output columns [begin, end) of each of the row's ``row_segments`` segments: runs of
        whole register tiles, as even as the tile count allows."""
        r_n, segs = self.s.reg_n, self.dk.row_segments
        n_tiles = -(-self.P // r_n)
        cuts = [round(k * n_tiles / segs) * r_n for k in range(segs + 1)]
        return [(cuts[k], min(cuts[k + 1], self.P)) for k in range(segs)]

    def row_calls(self, jt: int, row: int | None = None, cols: tuple[int, int] | None = None) -> list[str]:
        """Calls covering one output row (``row`` columns, default the row length) with tiles
        of ``reg_n`` columns; ``cols``: only the tiles starting in [begin, end) (a segment)."""
        row = self.P if row is None else row
        if self.dk.runtime_width:
            stable = self.runtime_row_calls(jt, row)
            if stable is not None:
                return stable
            if self.dk.row_segments > 1:  # no body: the first segment takes the whole row
                return ["if (seg == 0) {", *("    " + c for c in self.static_row_calls(jt, row, None)), "}"]
        return self.static_row_calls(jt, row, cols)

    def static_row_calls(self, jt: int, row: int, cols: tuple[int, int] | None) -> list[str]:
        """``row_calls`` with every column's tile chosen at compile time."""
        r_n = self.s.reg_n
        lo, hi = self.body_range()
        c_lo, c_hi = cols if cols is not None else (0, row)
        tiles = [(c, min(r_n, row - c)) for c in range(0, row, r_n) if c_lo <= c < c_hi]
        calls: list[str] = []
        run: list[int] = []  # consecutive full-width body tiles, emitted as one loop

        def flush() -> None:
            if not run:
                return
            fn = self.dw_tile_fn(r_n, None) if self.dw else self.any_tile_fn(r_n, jt, None)
            calls.append(f"for (long c0 = {run[0]}; c0 <= {run[-1]}; c0 += {r_n}) "
                         f"{fn}(x, xo + (c0 * {self.SW} - {self.PL}) * {self.ib}, wt, y, yo + c0 * {self.s.oc_bn}, "
                         f"ch, kh_lo, kh_hi{self.pr_arg('c0')}{self.icargs}{self.eargs});")
            run.clear()

        for c0, width in tiles:
            interior = c0 >= lo and c0 + width <= hi
            if interior and width == r_n:
                run.append(c0)
                continue
            flush()
            edge = None if interior else c0
            fn = self.dw_tile_fn(width, edge) if self.dw else self.any_tile_fn(width, jt, edge)
            calls.append(f"{fn}(x, xo + {(c0 * self.SW - self.PL) * self.ib}, wt, y, yo + {c0 * self.s.oc_bn}, "
                         f"ch, kh_lo, kh_hi{self.pr_arg(str(c0))}{self.icargs}{self.eargs});")
        flush()
        return calls

    def _call(self, fn: str, c0: str, checked: bool = False) -> str:
        iw0 = f"{c0} * {self.SW} - {self.PL}"
        return (f"{fn}(x, xo + ({iw0}) * {self.ib}, wt, y, yo + {c0} * {self.s.oc_bn}, ch, kh_lo, kh_hi"
                f"{', ' + iw0 if checked else ''}{self.pr_arg(c0)}{self.icargs}{self.eargs});")

    def runtime_row_calls(self, jt: int, row: int) -> list[str] | None:
        """One output row in code that is the same for every width (``DirectKernel.runtime_width``):
        the left edge's columns one at a time with each kernel column checked, a loop of full
        body tiles, the body's last (< reg_n) columns as tiles of 2^k columns picked by the bits
        of their count, and the right edge one checked column at a time. Only numbers change
        with the width. None when the row has no body (narrower than the kernel)."""
        r_n = self.s.reg_n
        lo, hi = self.body_range()
        hi = min(hi, row)  # a flat 1x1's pseudo-row: all body
        if hi <= lo:
            return None
        tile = (lambda w: self.dw_tile_fn(w, None)) if self.dw else (lambda w: self.tile_fn(w, jt, None))
        checked = (self.dw_tile_fn(1, None, checked=True) if self.dw
                   else self.tile_fn(1, jt, None, checked=True))
        calls: list[str] = []
        segs = self.dk.row_segments
        # row segments: segment ``seg`` runs its share of the full body tiles, the first one the
        # left edge, the last one the body's tail and the right edge
        first, last = ("if (seg == 0) ", f"if (seg == {segs - 1}) ") if segs > 1 else ("", "")
        if self.PL > 0:  # columns whose taps reach the left padding
            calls.append(f"{first}for (long c0 = 0; c0 < {lo}; ++c0) {self._call(checked, 'c0', checked=True)}")
        end = lo + (hi - lo) // r_n * r_n
        if segs > 1:
            full = (end - lo) // r_n
            calls.append(f"{{ const long b0 = {lo} + {full}L * seg / {segs} * {r_n}, "
                         f"b1 = {lo} + {full}L * (seg + 1) / {segs} * {r_n};")
            calls.append(f"  for (long c0 = b0; c0 < b1; c0 += {r_n}) {self._call(tile(r_n), 'c0')} }}")
        else:
            calls.append(f"for (long c0 = {lo}; c0 < {end}; c0 += {r_n}) {self._call(tile(r_n), 'c0')}")
        w = 1 << max(0, (r_n - 1).bit_length() - 1) if r_n > 1 else 0
        if w:
            calls.append(f"{last}{{ long c0 = {end}; const long rem = {hi - end};")
            while w:
                calls.append(f"  if (rem & {w}) {{ {self._call(tile(w), 'c0')} c0 += {w}; }}")
                w //= 2
            calls.append("}")
        if self.geo.pads[3] > 0 and not self.flat:  # columns whose taps reach the right padding
            calls.append(f"{last}for (long c0 = {hi}; c0 < {row}; ++c0) {self._call(checked, 'c0', checked=True)}")
        return calls

    def kernel(self) -> str:
        geo, s, ib = self.geo, self.s, self.ib
        ob = s.oc_bn
        n = geo.batch
        if self.dw:
            ocb, j, tiles_per_group, groups = geo.oc // ob, 1, geo.oc // ob, 1
            w_tile = self.KH * self.KW * ob
        else:
            ocg = geo.ocg if geo.group > 1 else geo.oc
            groups = geo.group
            ocb = geo.oc // ob
            j = s.oc_blocks
            tiles_per_group = -(-(ocg // ob) // j)
            w_tile = (geo.cg // ib) * self.KH * self.KW * ib * j * ob * self.wdup
        ragged = (ocb // groups) % j
        n_tiles = tiles_per_group * groups
        icb_per_group = geo.cg // ib if not self.dw else 1
        rows = self.rows
        L = [f"static void FNAME(const float *restrict x, const float *restrict w, float *{self.yq}y{self.eparams}, "
             "int tid, int nt) {"]
        if self.chunked:
            # ic-outer: an item is (image, oc tile); its rows run inside each input-channel chunk
            ind = "            "
            L += [f"    const long total = {n * n_tiles}L;",
                  "    const long lo = total * tid / nt, hi = total * (tid + 1) / nt;",
                  "    for (long it = lo; it < hi; ++it) {",
                  f"        const long t = it % {n_tiles}, n = it / {n_tiles};"]
        else:
            ind = "        "
            segs = self.dk.row_segments
            # row segments (schedule.conv.row_segments): the item's column segment, innermost, so
            # a thread's consecutive items are neighbouring segments of one row
            item = "it" if segs == 1 else f"(it / {segs})"
            L += [f"    const long total = {n * n_tiles * rows * segs}L;",
                  "    const long lo = total * tid / nt, hi = total * (tid + 1) / nt;",
                  "    for (long it = lo; it < hi; ++it) {",
                  (f"        const long t = {item} % {n_tiles}, oh = ({item} / {n_tiles}) % {rows}, "
                   f"n = {item} / {rows * n_tiles};"
                   if self.row_split else
                   f"        const long oh = {item} % {rows}, t = ({item} / {rows}) % {n_tiles}, "
                   f"n = {item} / {rows * n_tiles};")]
            if segs > 1:
                L.append(f"        const int seg = (int)(it % {segs});")
        L += [f"        const long grp = t / {tiles_per_group}, tg = t % {tiles_per_group};",
              f"        const long ocb0 = grp * {(ocb // groups)} + tg * {j};",
              f"        const float *wt = w + t * {w_tile}L;",
              f"        const long ch = ocb0 * {ob};"]
        if self.chunked:
            chunk = self.chunk
            L += [f"        for (int icb_lo = 0; icb_lo < {icb_per_group}; icb_lo += {chunk}) {{",
                  f"          const int icb_hi = icb_lo + {chunk} < {icb_per_group} ? icb_lo + {chunk} : {icb_per_group};",
                  f"          for (long oh = 0; oh < {rows}; ++oh) {{"]
            if self.tap_prefetch:
                # this row's slice of the weights after this chunk (the next chunk, or the next
                # tile's first): the stream from memory overlaps this chunk's FMAs; the thread's
                # very last chunk re-touches its own tile instead
                per_icb = self.KH * self.KW * ib * j * ob
                nbytes = chunk * per_icb * 4
                ahead = (self.dk.weight_distance - 1) * chunk
                L += [f"{ind}const char *pf = (const char *)wt;",
                      f"{ind}if (icb_hi < {icb_per_group} || it + 1 < hi)",
                      f"{ind}    pf = (const char *)(wt + ((long)icb_hi + {ahead}) * {per_icb}) + {nbytes}L * oh / {rows};"]
        if self.tap_prefetch and not self.chunked:
            # row-outer: this row's slice of the next oc tile's weights, so the next tile's
            # first row finds them in L2 instead of streaming them from memory
            L += [f"{ind}const char *pf = (const char *)(wt + {w_tile}L) + {w_tile * 4}L * oh / {rows};"]
        if self.flat:
            L += [f"{ind}const int kh_lo = 0, kh_hi = 1;",
                  f"{ind}const long yo = ((n * {ocb} + ocb0) * {self.OW} + oh * {self.P}) * {ob};",
                  f"{ind}const long xo = ((n * {geo.c // ib} + grp * {icb_per_group}) * {self.IW} + oh * {self.P}) "
                  f"* {ib};"]
        else:
            L += [f"{ind}const long ih0 = oh * {self.SH} - {self.PT};",
                  f"{ind}const int kh_lo = ih0 < 0 ? (int)((-ih0 + {self.DH - 1}) / {self.DH}) : 0;",
                  f"{ind}const long kh_end = ({self.IH} - ih0 + {self.DH - 1}) / {self.DH};",
                  f"{ind}const int kh_hi = kh_end < {self.KH} ? (int)kh_end : {self.KH};",
                  f"{ind}const long yo = ((n * {ocb} + ocb0) * {self.OH} + oh) * {self.OW * ob};"]
            if self.dw:
                L.append(f"{ind}const long xo = ((n * {ocb} + ocb0) * {self.IH} + ih0) * {self.IW * ob};")
            else:
                L.append(f"{ind}const long xo = ((n * {geo.c // ib} + grp * {icb_per_group}) * {self.IH} + ih0) "
                         f"* {self.IW * ib};")

        def row(jt: int, ind: str) -> list[str]:
            if self.dk.row_segments > 1 and not self.dk.runtime_width:  # (a run-time width: row_calls)
                out = []
                for k, (c_lo, c_hi) in enumerate(self.segment_columns()):
                    out.append(f"{ind}{'if' if k == 0 else '} else if'} (seg == {k}) {{")
                    out += [ind + "    " + c for c in self.row_calls(jt, cols=(c_lo, c_hi))]
                return out + [f"{ind}}}"]
            if self.last == self.P and not self.dk.runtime_width:
                return [ind + c for c in self.row_calls(jt)]
            return ([f"{ind}if (oh == {rows - 1}) {{"] + [ind + "    " + c for c in self.row_calls(jt, self.last)]
                    + [f"{ind}}} else {{"] + [ind + "    " + c for c in self.row_calls(jt)] + [f"{ind}}}"])

        if ragged:
            L.append(f"{ind}if (tg == {tiles_per_group - 1}) {{")
            L += row(ragged, ind + "    ")
            L.append(f"{ind}}} else {{")
            L += row(j, ind + "    ")
            L.append(f"{ind}}}")
        else:
            L += row(j, ind)
        if self.chunked:
            L += ["          }", "        }"]
        L.append("    }")
        L.append("}")
        kind = "dwconv2d" if self.dw else "conv2d"
        tag = f"{s.reg_n}" if self.dw else f"{j}x{s.reg_n}{'p' if self.pairs else ''}"
        doc = (f"NCHW{ob}c output, input NCHW{ib}c; C={geo.c} OC={geo.oc} in={geo.ins} out={geo.outs} "
               f"k={geo.ks} s={geo.strides} d={geo.dils} pads={geo.pads} group={geo.group}; "
               f"schedule oc_bn={ob} reg_n={s.reg_n} oc_blocks={j} unroll_ker={int(s.unroll_ker)} "
               f"ic_chunk={self.chunk * ib if self.chunked else 0}; "
               f"{'bias + ' if self.has_bias else ''}{epilogue_doc(self.node)}")
        return define(self.em, f"f32_{kind}_nchw{ob}c_{tag}__{self.blk.isa}", "\n".join(L), doc)


def _check_nchwc(node: Node, g: Graph) -> str | None:
    out = g.values[node.outputs[0]]
    if out.layout == PLAIN:
        return "the NCHWc template writes blocked outputs (the layout pass did not block this conv)"
    if isinstance(node.schedule, ConvSchedule) and node.schedule.algorithm == "winograd":
        return "scheduled as Winograd F(2x2,3x3) (templates/winograd.py)"
    why = geometry_reason(node, g)
    if why is not None:
        return why
    geo = ConvGeometry(node, g)
    ob = layout_block(out.layout)
    ib = layout_block(g.values[node.inputs[0]].layout)
    if geo.oc % ob or geo.c % ib:
        return f"channels {geo.c}->{geo.oc} do not divide into blocks {ib}->{ob}"
    if is_depthwise(geo) and ib != ob:
        return f"depthwise NCHWc needs input and output in one block size ({ib} vs {ob})"
    if not is_depthwise(geo) and geo.group > 1 and (geo.cg % ib or geo.ocg % ob):
        return f"group channels {geo.cg}->{geo.ocg} do not divide into blocks {ib}->{ob}"
    for e in node.epilogue:
        if e.input and e.broadcast == "full" and g.values[e.input].layout != out.layout:
            return f"residual operand {e.input!r} is {g.values[e.input].layout}, output {out.layout}"
    return None


@register("Conv", versions=(1, 11, 22), check=_check_nchwc, name="f32_conv_nchwc", blocked=True)
def emit_conv_nchwc(node: Node, g: Graph, em: BlockEmitter) -> None:
    geo = ConvGeometry(node, g)
    out = g.values[node.outputs[0]]
    ob = layout_block(out.layout)
    ib = layout_block(g.values[node.inputs[0]].layout)
    sched = node.schedule
    assert isinstance(sched, ConvSchedule) and sched.tile is not None and sched.tile.oc_bn == ob, (
        f"conv {node.name}: the schedule stage did not fit a tile to its blocks ({sched!r})")
    assert sched.direct is not None, f"conv {node.name}: no direct-kernel schedule ({sched!r})"
    s = sched.tile
    y_ptr = em.ptr(node.outputs[0])
    aliased = any(em.ptr(e.input) == y_ptr for e in node.epilogue if e.input)
    # partial sums in y would overwrite the residual (schedule.conv.inplace_residual)
    assert not (aliased and s.ic_chunk), f"conv {node.name}: in place with an ic-outer tile"
    w = np.asarray(g.const(node.inputs[1]), dtype=np.float32)
    bias = em.ptr(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else None
    ep, eargs = kernel_param_epilogue(em, node, bias)
    if is_depthwise(geo):
        # [C, 1, KH, KW] -> [C/b][KH][KW][b]
        packed = w.reshape(geo.oc // ob, ob, geo.ks[0], geo.ks[1]).transpose(0, 2, 3, 1)
    else:
        packed = pack_weights(w, geo, s, ib)
    wptr = em.weight(packed.reshape(-1), key=f"nchwc:{node.name}:{s}:{ib}")
    gen = _Gen(em, node, g, geo, s, sched.direct, ib, ep, len(eargs), aliased)
    fn = gen.kernel()
    args = "".join(f", {a}" for a in eargs)
    em.schedule(algorithm="direct convolution, NCHW[x]c (NeoCPU)" + (" depthwise" if gen.dw else "")
                + (", 1x1 on flat rows" if gen.flat else ""),
                kernel=fn.rsplit("_", 1)[0],
                micro_kernel=(f"{s.oc_blocks}x{s.reg_n} x {ob} lanes {gen.blk.isa}" if not s.pairs else
                              f"{s.oc_blocks}x{s.reg_n} x {ob} lanes, column pairs in {gen.vp.lanes}-lane {gen.vp.name}"),
                blocking=f"oc_bn={ob} ic_bn={ib} reg_n={s.reg_n} oc_blocks={s.oc_blocks} unroll_ker={int(s.unroll_ker)}"
                + (f" ic_chunk={gen.chunk * ib} (ic-outer)" if gen.chunked else ""),
                threads="static split over " + ("(image, oc tile)" if gen.chunked else "(image, oc tile, output row)"),
                layout=f"NCHW{ib}c -> NCHW{ob}c; weights [tile][IC/{ib}][KH][KW][{ib}][{s.oc_blocks}*{ob}]")
    em.step(f"{fn}({em.ptr(node.inputs[0])}, {wptr}, {y_ptr}{args}, tid, nt);")

