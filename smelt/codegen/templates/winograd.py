"""Winograd F(2x2, 3x3) convolution on NCHW<b>c (an algorithm of the NCHWc conv template), b =
the target's full vector width: NCHW16c on AVX-512, NCHW8c on AVX2.

The node's ``ConvSchedule`` gives the order (``winograd_order``), the block (``tile.oc_bn``: the
vector's lanes) and the GEMM phase's register tile (``winograd_tile``, J x R from the target's
registers: 2 x 14 in 32 registers, 2 x 6 in AVX2's 16); this template only reads them.

A 3x3, stride-1, undilated, ungrouped conv computes each 2x2 output tile from a 4x4 input patch
d as Y = Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A: 16 multiplies per (tile, input channel, output channel)
instead of 36, so 2.25x fewer FMAs than the direct kernel. All arithmetic stays fp32; the
transforms only add, subtract and (weights, at compile time in float64) halve, so the result
differs from the direct sum by rounding only (tested against onnxruntime at the template's
usual tolerance).

Per tile, three stages: the input transform (each 4x4 patch of b-channel vectors, zeros
outside the image, becomes 16 vectors V[e][icb][tile], e = 4*k + l indexing the 4x4 transform
domain), 16 independent GEMMs M[e] = U[e] · V[e] (OC x C times C x tiles: the direct
template's register tile with tiles as columns, J output blocks x R tiles of accumulators, per
input channel J weight-vector loads and R broadcasts), and the output transform (the 2x2
outputs get the conv's epilogue, bias, residual and activation, in registers and are stored
NCHW<b>c; edge tiles of odd planes store only the outputs inside). Two orders:
- banded (planes whose phased buffers would spill L2, or small transformed weights): one
  parallel step; each thread takes
  whole bands of tile rows (a multiple of the thread count per image, so the split is even) and
  runs all three stages on a band in its own V and M buffers, sized to stay in its L2;
- phased (bigger weights): three parallel steps over whole planes with a barrier between
  (items: (image, input block, tile row), then (image, e, output-channel tile) so a thread keeps
  one U[e] tile in L1 over every tile column, then (image, output block, tile row)); U is read
  once per call instead of once per band, but V and M are plane-sized (4x the input and output
  bytes): on big planes they go to memory. Only for weights too big for L3, which every band
  would read from memory (schedule.conv.winograd_choice has the measurements).

Weights U = G g Gᵀ are laid out at compile time as [e][oc tile][C][J*b] (16/9 of the direct
weights). The buffers take 16/4 = 4x the input and output bytes per 2x2 tile, which is why the
schedule stage picks this algorithm only where compute dominates (``schedule.conv.winograd_choice``,
thresholds by the target's registers in ``WINOGRAD_THRESHOLDS``): on AVX-512 planes of at least
196 outputs (ResNet-50's 56x56, 28x28 and 14x14 3x3 layers, not 7x7, whose 16/9 larger weights
would stream from memory with little compute to hide them: ResNet-50 was 5.6% slower with them)
and at least 32 input channels; on AVX2 (measured) 7x7 planes and 16 input channels win too.
"""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import BlockEmitter
from smelt.codegen.kernels.conv_geometry import ConvGeometry
from smelt.codegen.kernels.gemm import (
    Blocking,
    TileEpilogue,
    define,
    kernel_param_epilogue,
    vector_epilogue_stmts,
)
from smelt.codegen.kernels.isa import with_lanes
from smelt.codegen.kernels.tile import RegisterTile
from smelt.codegen.registry import register
from smelt.ir.graph import Graph, Node
from smelt.schedule.conv import ConvSchedule

# the transform matrix of F(2x2, 3x3) (a fact of the algorithm, not a choice)
_G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])


def _blocking(lanes: int) -> Blocking:
    """The vector spelling for blocks of ``lanes`` channels (the schedule's block)."""
    vx = with_lanes(lanes)
    assert vx.lanes == lanes, lanes
    return Blocking(vx.name, lanes, 1, lanes, 1, 1, 1, fma=True)


def transform_weights(w: np.ndarray, blocks: int, lanes: int) -> np.ndarray:
    """[OC, C, 3, 3] -> U = G g Gᵀ laid out [e][oc tile][C][J*lanes] (the last tile may be narrower)."""
    oc, c = w.shape[:2]
    u = np.einsum("ai,ocij,bj->abco", _G, w.astype(np.float64), _G).reshape(16, c, oc)
    width = blocks * lanes
    tiles = [u[:, :, t0:t0 + width] for t0 in range(0, oc, width)]
    return np.ascontiguousarray(np.concatenate([t.reshape(16, -1) for t in tiles], axis=1), dtype=np.float32)


class _Gen:
    """Renders one Winograd conv. ``TB``: transform tiles per buffer (all ``T`` tiles of an image
    in the phased order, one band's worth in the banded order)."""

    def __init__(self, em: BlockEmitter, geo: ConvGeometry, ep: TileEpilogue, n_eps: int, sched: ConvSchedule) -> None:
        assert sched.tile is not None and sched.winograd_tile[0] > 0, sched
        self.em, self.geo, self.ep = em, geo, ep
        self.L = sched.tile.oc_bn  # channels per block = vector lanes (the schedule's block)
        self.blk = _blocking(self.L)
        self.v = self.blk.vx
        self.N = geo.batch
        self.IH, self.IW = geo.ins
        self.OH, self.OW = geo.outs
        self.PT, self.PL = geo.pb
        self.TH, self.TW = -(-self.OH // 2), -(-self.OW // 2)
        self.T = self.TH * self.TW
        self.ICB, self.OCB = geo.c // self.L, geo.oc // self.L
        # the GEMM phase's register tile: J output blocks x R transform tiles (the schedule's)
        self.J, self.R = sched.winograd_tile
        self.cname = f"nchw{self.L}c__{self.v.name}"
        self.eparams = "".join(f", const float *e{k}" for k in range(n_eps))
        self.eargs = "".join(f", e{k}" for k in range(n_eps))
        self.tag = f"C={geo.c} OC={geo.oc} in={geo.ins} out={geo.outs} pads={geo.pads}"
        # the order is the schedule stage's choice (schedule.conv.winograd_choice)
        l2 = em.target.l2_bytes
        tile_bytes = 16 * (geo.c + geo.oc) * 4  # V and M bytes per transform tile
        self.banded = sched.winograd_order == "banded"
        self.runtime_size = sched.runtime_size
        if self.banded:
            # bands of whole tile rows, a multiple of the thread count per image (balanced split),
            # each band's V and M within a quarter of L2
            rows_fit = max(1, (l2 // 4) // (tile_bytes * self.TW))
            nt = max(1, em.n_threads)
            k = 1
            while -(-self.TH // (k * nt)) > rows_fit and k * nt < self.TH:
                k += 1
            self.NB = min(self.TH, k * nt)
            self.band_rows = sorted({(b + 1) * self.TH // self.NB - b * self.TH // self.NB for b in range(self.NB)})
            self.TB = max(self.band_rows) * self.TW
        else:
            self.NB, self.band_rows, self.TB = 1, [self.TH], self.T

    # -- one tile row of one channel block -----------------------------------------------------
    def input_row(self) -> str:
        """Input transform of tile row ``ty`` of block ``icb`` into buffer row ``tb``."""
        v, L16 = self.v, self.L
        vs = self.ICB * self.TB * L16  # stride between transform elements e in V
        L = ["static inline __attribute__((always_inline)) void FNAME(const float *restrict x, float *restrict V, "
             "long icb, long ty, long tb) {",
             f"    const float *xp = x + icb * {self.IH * self.IW * L16}L;",
             f"    float *vp = V + icb * {self.TB * L16}L + tb * {self.TW * L16}L;",
             f"    const int r0 = (int)ty * 2 - {self.PT};",
             f"    const int inner_rows = r0 >= 0 && r0 + 4 <= {self.IH};",
             f"    for (int tx = 0; tx < {self.TW}; ++tx) {{",
             f"        const int c0 = tx * 2 - {self.PL};",
             f"        {v.t} " + ", ".join(f"d{k}{m}" for k in range(4) for m in range(4)) + ";",
             f"        if (inner_rows && c0 >= 0 && c0 + 4 <= {self.IW}) {{"]
        for k in range(4):
            for m in range(4):
                L.append(f"            d{k}{m} = {v.loadu(f'xp + ((long)(r0 + {k}) * {self.IW} + c0 + {m}) * {L16}')};")
        L.append("        } else {  /* padding: taps outside the image read as zero */")
        for k in range(4):
            for m in range(4):
                ok = f"r0 + {k} >= 0 && r0 + {k} < {self.IH} && c0 + {m} >= 0 && c0 + {m} < {self.IW}"
                L.append(f"            d{k}{m} = ({ok}) ? {v.loadu(f'xp + ((long)(r0 + {k}) * {self.IW} + c0 + {m}) * {L16}')} : {v.zero()};")
        L.append("        }")
        # (unaligned loads: a graph input fed straight to the conv, as in the tuner's harness,
        # need not be 64-byte aligned)
        # Bᵀ d (rows), then (.) B (columns): each is x0 - x2, x1 + x2, x2 - x1, x1 - x3
        for m in range(4):
            L += [f"        const {v.t} t0{m} = {v.op('sub', f'd0{m}', f'd2{m}')}, t1{m} = {v.op('add', f'd1{m}', f'd2{m}')};",
                  f"        const {v.t} t2{m} = {v.op('sub', f'd2{m}', f'd1{m}')}, t3{m} = {v.op('sub', f'd1{m}', f'd3{m}')};"]
        for k in range(4):
            outs = [v.op("sub", f"t{k}0", f"t{k}2"), v.op("add", f"t{k}1", f"t{k}2"),
                    v.op("sub", f"t{k}2", f"t{k}1"), v.op("sub", f"t{k}1", f"t{k}3")]
            for m, expr in enumerate(outs):
                L.append(f"        {v.store(f'vp + {(4 * k + m) * vs}L + tx * {L16}', expr)};")
        L += ["    }", "}"]
        return define(self.em, f"f32_winograd2x3_input_row_{self.cname}", "\n".join(L),
                      f"Winograd F(2x2,3x3) input transform of one tile row; {self.tag}; "
                      f"V [e][C/16][{self.TB} tiles][16]")

    def output_row(self) -> str:
        """Output transform + epilogue of tile row ``ty`` of block ``ocb`` from buffer row ``tb``."""
        v, L16 = self.v, self.L
        ms = self.OCB * self.TB * L16
        L = [f"static inline __attribute__((always_inline)) void FNAME(const float *restrict M, float *y{self.eparams}, "
             "long n, long ocb, long ty, long tb) {",
             f"    const float *mp = M + ocb * {self.TB * L16}L + tb * {self.TW * L16}L;",
             f"    const long ch = ocb * {L16};",
             f"    const int full_rows = ty * 2 + 1 < {self.OH};",
             "    (void)full_rows;",
             f"    for (int tx = 0; tx < {self.TW}; ++tx) {{",
             f"        const long yo = ((n * {self.OCB} + ocb) * {self.OH} + ty * 2) * {self.OW * L16}L + tx * {2 * L16};"]
        for k in range(4):
            for m in range(4):
                L.append(f"        const {v.t} m{k}{m} = {v.load(f'mp + {(4 * k + m) * ms}L + tx * {L16}')};")
        # Aᵀ M (rows), then (.) A (columns): x0 + x1 + x2, x1 - x2 - x3
        for m in range(4):
            L += [f"        const {v.t} s0{m} = {v.op('add', v.op('add', f'm0{m}', f'm1{m}'), f'm2{m}')};",
                  f"        const {v.t} s1{m} = {v.op('sub', v.op('sub', f'm1{m}', f'm2{m}'), f'm3{m}')};"]
        for k in range(2):
            L += [f"        {v.t} y{k}0 = {v.op('add', v.op('add', f's{k}0', f's{k}1'), f's{k}2')};",
                  f"        {v.t} y{k}1 = {v.op('sub', v.op('sub', f's{k}1', f's{k}2'), f's{k}3')};"]
        offs = {(k, m): str(k * self.OW * L16 + m * L16) for k in range(2) for m in range(2)}
        body = [x for km, off in offs.items() for x in self._store(f"y{km[0]}{km[1]}", off)]
        if self.OH % 2 == 0 and self.OW % 2 == 0 and not self.runtime_size:
            L += ["        " + x for x in body]
        else:  # odd planes: the last tile row / column stores only what lies inside
            L.append(f"        const int full_cols = tx * 2 + 1 < {self.OW};")
            L.append("        if (full_rows && full_cols) {")
            L += ["            " + x for x in body]
            L.append("        } else {")
            for (k, m), off in offs.items():
                cond = " && ".join(c for c in (("full_rows" if k else ""), ("full_cols" if m else "")) if c) or "1"
                L.append(f"            if ({cond}) {{")
                L += ["                " + x for x in self._store(f"y{k}{m}", off)]
                L.append("            }")
            L.append("        }")
        L += ["    }", "}"]
        return define(self.em, f"f32_winograd2x3_output_row_{self.cname}", "\n".join(L),
                      f"Winograd F(2x2,3x3) output transform + epilogue of one tile row; {self.tag}")

    def _store(self, acc: str, off: str) -> list[str]:
        flat = f"yo + {off}"
        lines = vector_epilogue_stmts(self.ep, self.em, self.blk, acc, None, flat, "0", "ch") \
            if not self.ep.empty() else []
        assert lines is not None  # applies() requires a vector epilogue
        return lines + [f"{self.v.store(f'y + {flat}', acc)};"]

    # -- the transform-domain GEMMs ------------------------------------------------------------
    def gemm_tile(self, jt: int, width: int) -> str:
        v, L16 = self.v, self.L
        tile = RegisterTile(v, jt, width)
        L = ["static inline __attribute__((always_inline)) void FNAME(const float *restrict vb, "
             "const float *restrict u, float *restrict m) {"]
        L += ["    " + x for x in tile.declare()]
        L += [f"    for (int icb = 0; icb < {self.ICB}; ++icb) {{",
              f"        const float *vr = vb + (long)icb * {self.TB * L16};",
              f"        const float *ur = u + (long)icb * {L16 * jt * L16};",
              f"        for (int i = 0; i < {L16}; ++i) {{"]
        L += tile.fma_step(lambda j: v.load(f"ur + i * {jt * L16} + {j * L16}"),
                           lambda r: v.set1(f"vr[i + {r * L16}]"), indent="            ")
        L += ["        }", "    }"]
        for j in range(jt):
            for r in range(width):
                L.append(f"    {v.store(f'm + {j * self.TB * L16 + r * L16}', f'a{j}_{r}')};")
        L.append("}")
        return define(self.em, f"f32_winograd2x3_gemm_tile_{jt}x{width}__{v.name}", "\n".join(L),
                      f"Winograd GEMM tile {jt} output blocks x {width} transform tiles; C={self.geo.c}, "
                      f"buffer of {self.TB} tiles")

    def gemm_calls(self, jt: int, count: int | str) -> list[str]:
        """Micro-tiles over ``count`` transform tiles (full register tiles, then the rest); with
        ``runtime_size`` ``count`` may be a C expression and the rest is cut into tiles of 2^k
        columns by its bits, so the code is the same for every count."""
        R, L16 = self.R, self.L
        if self.runtime_size:
            calls = [f"{{ const long cnt = {count}; long t0 = 0;",
                     f"  for (; t0 + {R} <= cnt; t0 += {R}) {self.gemm_tile(jt, R)}(vb + t0 * {L16}, u, m + t0 * {L16});",
                     "  const long rem = cnt - t0;"]
            w = 1 << max(0, (R - 1).bit_length() - 1) if R > 1 else 0
            while w:
                calls.append(f"  if (rem & {w}) {{ {self.gemm_tile(jt, w)}(vb + t0 * {L16}, u, m + t0 * {L16}); "
                             f"t0 += {w}; }}")
                w //= 2
            return calls + ["}"]
        assert isinstance(count, int)
        calls = []
        full = count // R * R
        if full:
            fn = self.gemm_tile(jt, R)
            calls.append(f"for (long t0 = 0; t0 < {full}; t0 += {R}) {fn}(vb + t0 * {L16}, u, m + t0 * {L16});")
        if count - full:
            fn = self.gemm_tile(jt, count - full)
            calls.append(f"{fn}(vb + {full * L16}, u, m + {full * L16});")
        return calls

    def gemm_item(self, count: int | str) -> list[str]:
        """One (e, oc tile) GEMM over ``count`` tiles, ``t``/``vb``/``u``/``m`` in scope."""
        oct_ = -(-self.OCB // self.J)
        ragged = self.OCB % self.J
        if not ragged:
            return self.gemm_calls(self.J, count)
        return ([f"if (t == {oct_ - 1}) {{"] + ["    " + x for x in self.gemm_calls(ragged, count)]
                + ["} else {"] + ["    " + x for x in self.gemm_calls(self.J, count)] + ["}"])

    def gemm_pointers(self, ind: str) -> list[str]:
        c, oc, L16 = self.geo.c, self.geo.oc, self.L
        return [f"{ind}const float *vb = V + e * {self.ICB * self.TB * L16}L;",
                f"{ind}const float *u = U + e * {c * oc}L + t * {c * self.J * L16}L;",
                f"{ind}float *m = M + e * {self.OCB * self.TB * L16}L + t * {self.J * self.TB * L16}L;"]

    # -- drivers ---------------------------------------------------------------------------------
    def buffer_floats(self) -> tuple[int, int]:
        return 16 * self.geo.c * self.TB, 16 * self.geo.oc * self.TB

    def phased(self) -> tuple[str, str, str]:
        """Three parallel steps over all tiles of an image (buffers per image, shared)."""
        f_in, f_out = self.input_row(), self.output_row()
        vf, mf = self.buffer_floats()
        x_img = self.ICB * self.IH * self.IW * self.L
        p1 = ["static void FNAME(const float *restrict x, float *restrict V, int tid, int nt) {",
              f"    const long total = {self.N * self.ICB * self.TH}L;",
              "    const long lo = total * tid / nt, hi = total * (tid + 1) / nt;",
              "    for (long it = lo; it < hi; ++it) {",
              f"        const long ty = it % {self.TH}, icb = (it / {self.TH}) % {self.ICB}, n = it / {self.TH * self.ICB};",
              f"        {f_in}(x + n * {x_img}L, V + n * {vf}L, icb, ty, ty);",
              "    }", "}"]
        oct_ = -(-self.OCB // self.J)
        p2 = ["static void FNAME(const float *restrict Vall, const float *restrict U, float *restrict Mall, "
              "int tid, int nt) {",
              f"    const long total = {self.N * 16 * oct_}L;",
              "    const long lo = total * tid / nt, hi = total * (tid + 1) / nt;",
              "    for (long it = lo; it < hi; ++it) {",
              f"        const long t = it % {oct_}, e = (it / {oct_}) % 16, n = it / {16 * oct_};",
              f"        const float *V = Vall + n * {vf}L;",
              f"        float *M = Mall + n * {mf}L;"]
        p2 += self.gemm_pointers("        ")
        p2 += ["        " + x for x in self.gemm_item(self.T)]
        p2 += ["    }", "}"]
        p3 = [f"static void FNAME(const float *restrict M, float *y{self.eparams}, int tid, int nt) {{",
              f"    const long total = {self.N * self.OCB * self.TH}L;",
              "    const long lo = total * tid / nt, hi = total * (tid + 1) / nt;",
              "    for (long it = lo; it < hi; ++it) {",
              f"        const long ty = it % {self.TH}, ocb = (it / {self.TH}) % {self.OCB}, n = it / {self.TH * self.OCB};",
              f"        {f_out}(M + n * {mf}L, y{self.eargs}, n, ocb, ty, ty);",
              "    }", "}"]
        doc = f"Winograd F(2x2,3x3), phased; {self.tag}"
        return (define(self.em, f"f32_winograd2x3_input_{self.cname}", "\n".join(p1), doc + "; input transform"),
                define(self.em, f"f32_winograd2x3_gemm_{self.J}x{self.R}__{self.v.name}", "\n".join(p2),
                       doc + f"; 16 GEMMs per image, U [e][oc tile][C][{self.J}*{self.L}]"),
                define(self.em, f"f32_winograd2x3_output_{self.cname}", "\n".join(p3), doc + "; output transform"))

    def banded_fn(self) -> str:
        """One step: each thread runs whole bands of tile rows (transform, GEMMs, inverse
        transform) in its own buffers, which stay in its L2."""
        f_in, f_out = self.input_row(), self.output_row()
        vf, mf = self.buffer_floats()
        x_img = self.ICB * self.IH * self.IW * self.L
        oct_ = -(-self.OCB // self.J)
        L = [f"static void FNAME(const float *restrict x, const float *restrict U, float *y, float *restrict S"
             f"{self.eparams}, int tid, int nt) {{",
             f"    float *restrict V = S + (long)tid * {vf + mf}L;",
             f"    float *restrict M = V + {vf}L;",
             f"    const long total = {self.N * self.NB}L;",
             "    const long lo = total * tid / nt, hi = total * (tid + 1) / nt;",
             "    for (long it = lo; it < hi; ++it) {",
             f"        const long b = it % {self.NB}, n = it / {self.NB};",
             f"        const long ty0 = b * {self.TH} / {self.NB}, ty1 = (b + 1) * {self.TH} / {self.NB};",
             f"        const float *xn = x + n * {x_img}L;",
             f"        for (long icb = 0; icb < {self.ICB}; ++icb)",
             f"            for (long ty = ty0; ty < ty1; ++ty) {f_in}(xn, V, icb, ty, ty - ty0);",
             f"        for (long e = 0; e < 16; ++e) for (long t = 0; t < {oct_}; ++t) {{"]
        L += self.gemm_pointers("            ")
        rows = self.band_rows
        if self.runtime_size:  # the band's tile count at run time (one code for every band size)
            L += ["            " + x for x in self.gemm_item(f"(ty1 - ty0) * {self.TW}")]
        elif len(rows) == 1:
            L += ["            " + x for x in self.gemm_item(rows[0] * self.TW)]
        else:
            for i, r in enumerate(rows):
                L.append(f"            {'if' if i == 0 else '} else if'} (ty1 - ty0 == {r}) {{")
                L += ["                " + x for x in self.gemm_item(r * self.TW)]
            L.append("            }")
        L += ["        }",
              f"        for (long ocb = 0; ocb < {self.OCB}; ++ocb)",
              f"            for (long ty = ty0; ty < ty1; ++ty) {f_out}(M, y{self.eargs}, n, ocb, ty, ty - ty0);",
              "    }", "}"]
        return define(self.em, f"f32_winograd2x3_banded_{self.J}x{self.R}__{self.v.name}", "\n".join(L),
                      f"Winograd F(2x2,3x3), banded: {self.NB} bands of {'/'.join(map(str, rows))} tile rows per "
                      f"image, per-thread V and M; {self.tag}; U [e][oc tile][C][{self.J}*{self.L}]")


def emit(geo: ConvGeometry, node_name: str, w: np.ndarray, x_ptr: str, y_ptr: str, eargs: list[str],
         ep: TileEpilogue, em: BlockEmitter, sched: ConvSchedule) -> None:
    """One Winograd conv: one banded step, or three phased steps (the schedule's order)."""
    gen = _Gen(em, geo, ep, len(eargs), sched)
    lanes = gen.L
    u = em.weight(transform_weights(w, gen.J, lanes).reshape(-1), key=f"winograd:{node_name}:{gen.J}")
    vf, mf = gen.buffer_floats()
    args = "".join(f", {a}" for a in eargs)
    common = dict(micro_kernel=f"{gen.J}x{gen.R} x {lanes} lanes {gen.v.name} (16 transform-domain GEMMs)",
                  layout=f"NCHW{lanes}c -> NCHW{lanes}c; weights U [16][oc tile][C][J*{lanes}]")
    if gen.banded:
        scratch = em.scratch(max(1, em.n_threads) * (vf + mf) * 4)
        fn = gen.banded_fn()
        em.schedule(algorithm=f"Winograd F(2x2,3x3), NCHW{lanes}c", kernel=fn.rsplit("_", 1)[0],
                    blocking=f"tiles={gen.TH}x{gen.TW}, {gen.NB} bands per image, J={gen.J} R={gen.R}",
                    threads="static split over (image, band of tile rows); per-thread buffers", **common)
        em.step(f"{fn}({x_ptr}, {u}, {y_ptr}, {scratch}{args}, tid, nt);")
        return
    vbuf = em.scratch(geo.batch * vf * 4)
    mbuf = em.scratch(geo.batch * mf * 4)
    f_in, f_gemm, f_out = gen.phased()
    em.schedule(algorithm=f"Winograd F(2x2,3x3), NCHW{lanes}c", kernel=f_gemm.rsplit("_", 1)[0],
                blocking=f"tiles={gen.TH}x{gen.TW}, phased, J={gen.J} R={gen.R}",
                threads="static split over (image, block, tile row) / (image, e, oc tile) / (image, block, tile row)",
                **common)
    em.step(f"{f_in}({x_ptr}, {vbuf}, tid, nt);")
    em.step(f"{f_gemm}({vbuf}, {u}, {mbuf}, tid, nt);")
    em.step(f"{f_out}({mbuf}, {y_ptr}{args}, tid, nt);")


def _check_winograd(node: Node, g: Graph) -> str | None:
    """This template takes exactly the convs the schedule stage scheduled as Winograd
    (``schedule.conv.winograd_choice`` checked the shape, the full-width blocks and the epilogue)."""
    sched = node.schedule
    if not isinstance(sched, ConvSchedule) or sched.algorithm != "winograd":
        return "not scheduled as Winograd (schedule.conv.winograd_choice)"
    return None


@register("Conv", versions=(1, 11, 22), check=_check_winograd, name="f32_conv_winograd", blocked=True)
def emit_conv_winograd(node: Node, g: Graph, em: BlockEmitter) -> None:
    geo = ConvGeometry(node, g)
    w = np.asarray(g.const(node.inputs[1]), dtype=np.float32)
    bias = em.ptr(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else None
    ep, eargs = kernel_param_epilogue(em, node, bias)
    emit(geo, node.name, w, em.ptr(node.inputs[0]), em.ptr(node.outputs[0]), eargs, ep, em, node.schedule)
