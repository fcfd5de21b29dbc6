"""ONNX ``Conv`` (float32, 1-D/2-D/3-D): GEMM on NCHW with im2col fused into B packing, and
direct depthwise kernels.

Templates (all strides, pads, dilations, auto_pad modes, groups, optional bias, fused epilogue
with channel = output channel = GEMM row):
- ``f32_conv<S>d_1x1_gemm_<mr>x<nr>__<isa>``: 1x1, stride 1, no padding: per image and group,
  Y[oc, hw] = W[oc, ic] . X[ic, hw]; X rows are packed straight into NR-column panels.
- ``f32_conv<S>d_im2col_gemm_<mr>x<nr>__<isa>``: any other conv. The B panels of the implicit
  im2col matrix (rows (ic, kd, kh, kw), columns the flattened output positions) are packed
  straight from the image, one KC x NC block at a time into per-thread scratch (PyDTNN-style),
  so the full im2col matrix never exists. Per panel, a table gives for every kernel offset
  where each lane reads: on AVX-512 at stride 1 or 2 a few (offset, lane mask) runs (output
  rows that are contiguous in the image merge into one run), so a K row is one masked load
  per vector and run (stride 2: two loads and an even-lane permute); otherwise per-lane
  offsets (masked gathers, or a plain loop on other targets). Padding lanes are never read.
- ``f32_conv1d_window_gemm_<mr>x<nr>__<isa>``: a 1-D conv with one input channel and no padding
  (an STFT frontend): column n of the im2col matrix is the contiguous window starting at
  x[n * stride], so B is a strided view of the signal, packed by the GEMM's generic packer
  (no per-lane tables or gathers: 2.2x faster on openWakeWord's mel frontend).
- ``f32_conv<S>d_depthwise_direct``: group == C, one input channel per group (1-D/2-D), any
  channel multiplier. AVX-512: a plane of up to ``DepthwiseKernel.plane_vectors`` vectors (16
  on 32 registers: 256 outputs) is one block of registers (16 flat outputs per vector) with
  every tap's lane mask and offsets compile-time constants; larger planes go row by row
  (``row_vectors`` vectors per row in registers at a time). The epilogue is applied to the
  accumulators before the masked store. Other targets: compiler-vectorized row loops.
  Threading, blocking and the GEMM's switches are the node's ``ConvSchedule`` (``gemm``,
  ``depthwise``; schedule/conv.py); this template only reads them.

Weights are reordered at compile time: per group, W[oc, ic*kd*kh*kw] packed into MR-row panels
of the GEMM micro-kernel ([G][OC/G/MR][K][MR]). Images and groups are the GEMM's items.
"""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import BlockEmitter
from smelt.codegen.kernels.conv_geometry import ConvGeometry, check_conv
from smelt.codegen.kernels.epilogue import TileOperand, epilogue_doc
from smelt.codegen.kernels.gemm import (
    Blocking,
    ConstPacked,
    GemmProblem,
    Strided,
    TileEpilogue,
    blocking_for,
    pack_const_a,
    render_gemm,
    tile_epilogue_code,
    vector_epilogue_stmts,
)
from smelt.codegen.kernels.isa import VectorIsa
from smelt.codegen.registry import register
from smelt.ir.graph import Graph, Node
from smelt.schedule.conv import ConvSchedule, DepthwiseKernel


def _schedule(node: Node) -> ConvSchedule:
    """The schedule stage's "gemm" schedule (schedule/conv.py ``finish``: every plain Conv)."""
    s = node.schedule
    assert isinstance(s, ConvSchedule) and s.algorithm == "gemm" and s.gemm is not None, (
        f"Conv {node.name}: no NCHW GEMM schedule ({s!r})")
    return s


class Im2col:
    """B operand of a conv GEMM: the implicit im2col matrix of one (image, group) item.

    Per NR-column panel, the output positions are cut into output-row segments; then for each
    kernel offset t = (kd, kh, kw) a table says where each lane reads (a channel-relative
    offset): on AVX-512 with stride 1 as a few (offset, 64-bit lane mask) runs (adjacent
    output rows merge into one run when they are contiguous in the image), otherwise as one
    int32 offset per lane (-1 = padding). Every K row (c, t) of the panel is then one masked
    load per run and vector (or one masked gather per vector) from channel c.
    """

    def __init__(self, ptr: str, geo: ConvGeometry) -> None:
        self.ptr = ptr
        self.geo = geo

    def _runs(self, blk: Blocking) -> bool:
        return blk.vx.has("permute2") and blk.vx.bit_masks and self.geo.strides[-1] in (1, 2)

    def _nseg(self, blk: Blocking) -> int:
        return -(-blk.nr // self.geo.outs[-1]) + 1

    def table_bytes(self, blk: Blocking) -> int:
        """Per-thread scratch for the per-panel tables."""
        ksp = self.geo.ksp
        if self._runs(blk):
            return ksp * self._nseg(blk) * 16 + ksp * 4 + 64
        return ksp * blk.nr * 4 + 64

    def pack_code(self, blk: Blocking) -> str:
        """Pack rows [pc, pc+kb) x columns [jc, jc+nb) into Bs (NR-column panels)."""
        geo, nr = self.geo, blk.nr
        s = geo.rank
        ow, sw, pw = geo.outs[-1], geo.strides[-1], geo.pb[-1]
        nseg = self._nseg(blk)
        ksp = geo.ksp
        L = ["{", "    const float *restrict X = Bbase + bo;"]
        if self._runs(blk):
            L += [f"    long *restrict toff = (long *)Ts; unsigned long long *restrict tmask = "
                  f"(unsigned long long *)(Ts + {ksp * nseg * 8});",
                  f"    int *restrict tn = (int *)(Ts + {ksp * nseg * 16});"]
        else:
            L.append("    int *restrict tidx = (int *)Ts;")
        L.append(f"    int sj[{nseg}], sl[{nseg}]; long sw0[{nseg}];")
        for d in range(s - 1):
            L.append(f"    long so{d}[{nseg}];")
        L += [f"    for (long q = 0; q < nb; q += {nr}) {{",
              f"        const long cc = SMELT_MIN({nr}, nb - q);",
              f"        float *restrict d = Bs + (q / {nr}) * kb * {nr};",
              "        int ns = 0;",
              f"        {{ long n = jc + q, r = n / {ow}, ow = n % {ow}; int j = 0;",
              "          while (j < cc) {",
              f"            const int len = (int)SMELT_MIN(cc - j, {ow} - ow);",
              f"            sj[ns] = j; sl[ns] = len; sw0[ns] = ow * {sw} - {pw};"]
        if s > 1:
            L.append("            long rr = r;")
            for d in reversed(range(s - 1)):
                L.append(f"            so{d}[ns] = (rr % {geo.outs[d]}) * {geo.strides[d]} - {geo.pb[d]}; "
                         f"rr /= {geo.outs[d]};")
        L += ["            ++ns; j += len; ow = 0; ++r;",
              "          }",
              "        }",
              "        { long t = 0;"]
        ind = "          "
        for d in range(s):
            L.append(f"{ind}for (long kz{d} = 0; kz{d} < {geo.ks[d]}; ++kz{d})")
        L.append(ind + "{")
        L.append(ind + "    " + self._table_entry(blk).replace("\n", "\n" + ind + "    "))
        L += [ind + "    ++t;", ind + "}", "        }",
              f"        long c = pc / {ksp}, t = pc % {ksp};",
              "        for (long kk = 0; kk < kb; ++kk) {",
              f"            float *restrict dk = d + kk * {nr};",
              f"            const float *restrict xc = X + c * {geo.ihw}L;",
              "            " + self._row(blk).replace("\n", "\n            "),
              f"            if (++t == {ksp}) {{ t = 0; ++c; }}",
              "        }",
              "    }",
              "}"]
        return "\n".join(L)

    def _outer(self) -> list[str]:
        """Statements computing the segment's input row offset ``ro``; `continue` when padding."""
        geo = self.geo
        s = geo.rank
        if s == 1:
            return ["const long ro = 0;"]
        L = []
        for d in range(s - 1):
            L.append(f"const long i{d} = so{d}[u] + kz{d} * {geo.dils[d]};")
            L.append(f"if ((unsigned long)i{d} >= {geo.ins[d]}ul) continue;")
        expr = "i0"
        for d in range(1, s - 1):
            expr = f"({expr} * {geo.ins[d]} + i{d})"
        L.append(f"const long ro = {expr} * {geo.ins[-1]}L;")
        return L

    def _table_entry(self, blk: Blocking) -> str:
        geo, nr = self.geo, blk.nr
        s = geo.rank
        iw, sw, dw = geo.ins[-1], geo.strides[-1], geo.dils[-1]
        nseg = self._nseg(blk)
        L = []
        if self._runs(blk):
            L += [f"long *restrict to = toff + t * {nseg}; unsigned long long *restrict tm = tmask + t * {nseg};",
                  "int cnt = 0;",
                  "for (int u = 0; u < ns; ++u) {"]
            L += ["    " + x for x in self._outer()]
            L += [f"    const long iws = sw0[u] + kz{s - 1} * {dw};",
                  f"    if (iws >= {iw}) continue;",
                  f"    const long lo = sj[u] + (iws < 0 ? (-iws + {sw - 1}) / {sw} : 0);",
                  f"    const long hi = SMELT_MIN((long)(sj[u] + sl[u]), sj[u] + ({iw} - iws + {sw - 1}) / {sw});",
                  "    if (lo >= hi) continue;",
                  "    const unsigned long long m = (hi >= 64 ? ~0ull : ((1ull << hi) - 1ull)) & ~((1ull << lo) - 1ull);",
                  f"    const long off = ro + iws - (long)sj[u] * {sw};",
                  "    if (cnt && to[cnt - 1] == off) tm[cnt - 1] |= m;",
                  "    else { to[cnt] = off; tm[cnt] = m; ++cnt; }",
                  "}",
                  "tn[t] = cnt;"]
        elif blk.vx.has("gather") and blk.vx.bit_masks:
            v, nv, w = blk.vx, blk.nv, blk.vx.lanes
            it = v.x("itype")
            L += [f"int *restrict ti = tidx + t * {nr};",
                  " ".join(f"{it} x{j} = {v.x('i32_set1', a='-1')};" for j in range(nv)),
                  "for (int u = 0; u < ns; ++u) {"]
            L += ["    " + x for x in self._outer()]
            L += [f"    const long iws = sw0[u] + kz{s - 1} * {dw};",
                  "    const unsigned long long sm = ((1ull << sl[u]) - 1ull) << sj[u];",
                  f"    const {it} iw0 = {v.x('i32_set1', a=f'(int)(iws - (long)sj[u] * {sw})')};",
                  f"    const {it} rov = {v.x('i32_set1', a='(int)ro')};"]
            for j in range(nv):
                lanes = ", ".join(str((w * j + e) * sw) for e in range(w))
                L += [f"    {{ const {it} iwv = {v.x('i32_add', a='iw0', b=v.x('i32_setr', a=lanes))};",
                      f"      const {v.mask_type} ok = ({v.mask_type})(sm >> {w * j}) & "
                      f"{v.x('i32_ge0_mask', a='iwv')} & "
                      f"{v.x('i32_lt_mask', a='iwv', b=v.x('i32_set1', a=str(iw)))};",
                      f"      x{j} = {v.x('i32_mask_add', a=f'x{j}', m='ok', b='iwv', c='rov')}; }}"]
            L.append("}")
            L += [v.x("i32_storeu", p=f"ti + {w * j}", a=f"x{j}") for j in range(nv)]
        else:
            L += [f"int *restrict ti = tidx + t * {nr};",
                  f"for (int j = 0; j < {nr}; ++j) ti[j] = -1;",
                  "for (int u = 0; u < ns; ++u) {"]
            L += ["    " + x for x in self._outer()]
            L += [f"    const long iws = sw0[u] + kz{s - 1} * {dw};",
                  "    for (int e = 0; e < sl[u]; ++e) {",
                  f"        const long iwx = iws + (long)e * {sw};",
                  f"        if ((unsigned long)iwx < {iw}ul) ti[sj[u] + e] = (int)(ro + iwx);",
                  "    }",
                  "}"]
        return "\n".join(L)

    def _row(self, blk: Blocking) -> str:
        nr = blk.nr
        nseg = self._nseg(blk)
        v, w = blk.vx, blk.vx.lanes
        if self._runs(blk):
            nv, mt = blk.nv, v.mask_type
            even = ", ".join(str(2 * e) for e in range(w))
            L = [" ".join(f"{v.t} v{j} = {v.zero()};" for j in range(nv)),
                 f"const long *restrict to = toff + t * {nseg}; const unsigned long long *restrict tm = "
                 f"tmask + t * {nseg};",
                 f"const {v.x('itype')} even = {v.x('i32_setr', a=even)};"
                 " (void)even;",
                 "for (int i = 0; i < tn[t]; ++i) {",
                 "    const float *src = (const float *)((uintptr_t)xc + (uintptr_t)(to[i] * 4));",
                 "    const unsigned long long m = tm[i];"]
            if self.geo.strides[-1] == 1:
                for j in range(nv):
                    L.append(f"    v{j} = {v.x('mask_loadu', a=f'v{j}', m=f'({mt})(m >> {w * j})', p=f'src + {w * j}')};")
            else:  # stride 2: two masked loads of the 2w-float window, keep the even lanes
                full, half = (1 << w) - 1, w // 2
                spread = sum(1 << (2 * b) for b in range(half))  # _pdep_u32 target: every other lane
                for j in range(nv):
                    lo = v.masked_load(f"src + {2 * w * j}", f"({mt})_pdep_u32(mj & {(1 << half) - 1:#x}u, {spread:#x}u)")
                    hi = v.masked_load(f"src + {2 * w * j + w}", f"({mt})_pdep_u32(mj >> {half}, {spread:#x}u)")
                    L += [f"    {{ const unsigned mj = (unsigned)(m >> {w * j}) & {full:#X}u;".replace("0X", "0x"),
                          "      if (mj) {",
                          f"        const {v.t} lo = {lo};",
                          f"        const {v.t} hi = {hi};",
                          f"        v{j} = {v.x('mask_mov', a=f'v{j}', m=f'({mt})mj', b=v.x('permute2', a='lo', i='even', b='hi'))};",
                          "      } }"]
            L.append("}")
            L += [v.store(f"dk + {w * j}", f"v{j}") for j in range(nv)]
            return "\n".join(L)
        if v.has("gather") and v.bit_masks:
            L = [f"const int *restrict ti = tidx + t * {nr};"]
            for j in range(blk.nv):
                L += [f"{{ const {v.x('itype')} idx = {v.x('i32_loadu', p=f'ti + {w * j}')};",
                      f"  const {v.mask_type} ok = {v.x('i32_ge0_mask', a='idx')};",
                      f"  {v.store(f'dk + {w * j}', v.x('gather', a=v.zero(), m='ok', i='idx', p='xc'))} }}"]
            return "\n".join(L)
        return "\n".join([f"const int *restrict ti = tidx + t * {nr};",
                          f"for (int j = 0; j < {nr}; ++j) {{ const int o = ti[j]; dk[j] = o >= 0 ? xc[o] : 0.0f; }}"])


def _epilogue(node: Node, g: Graph, em: BlockEmitter) -> TileEpilogue:
    ops = []
    if len(node.inputs) > 2 and node.inputs[2]:
        ops.append(TileOperand("Add", em.ptr(node.inputs[2]), "row"))
    return TileEpilogue(ops, node, channel="row")


@register("Conv", versions=(1, 11, 22), check=check_conv, name="f32_conv")
def emit_conv(node: Node, g: Graph, em: BlockEmitter) -> None:
    geo = ConvGeometry(node, g)
    sched = _schedule(node)
    if geo.is_depthwise:
        assert sched.depthwise is not None, f"Conv {node.name}: depthwise without its kernel's schedule"
        _emit_depthwise(node, g, em, geo, sched.depthwise)
        return
    assert sched.gemm is not None
    blk = blocking_for(em.target)
    w = np.asarray(g.const(node.inputs[1]), np.float32)
    k = geo.cg * geo.ksp
    wg = w.reshape(geo.group, geo.ocg, k)
    packed = np.stack([pack_const_a(wg[i], blk.mr) for i in range(geo.group)])
    a_op = ConstPacked(em.weight(packed, key=f"conv_w:{node.inputs[1]}:{geo.group}:{blk.tag}"))
    x_ptr = em.ptr(node.inputs[0])
    if geo.is_pointwise:
        b_op: object = Strided(x_ptr, geo.ihw, 1)
        kind = "1x1"
        em.schedule(algorithm="conv 1x1 as GEMM on NCHW (image rows are B)")
    elif geo.rank == 1 and geo.cg == 1 and not any(geo.pads):
        # one input channel, no padding (an STFT as a Conv1d): output n's receptive field is the
        # contiguous window x[n*stride + k*dilation], so the im2col matrix is a plain strided view
        # and the generic packer copies it without the per-lane tables and gathers
        b_op = Strided(x_ptr, geo.dils[0], geo.strides[0])
        kind = "window"
        em.schedule(algorithm="conv 1-D, one input channel: im2col as a strided view packed into B")
    else:
        b_op = Im2col(x_ptr, geo)
        kind = "im2col"
        em.schedule(algorithm="conv im2col fused into B packing (CONV_GEMM)"
                    + (", masked-load runs" if b_op._runs(blk) else ", gathers" if blk.vx.has("gather") else ""))
    em.schedule(layout=f"NCHW; weights packed [G][OC/{blk.mr}][K][{blk.mr}]",
                shape=f"{geo.ks} kernel, stride {geo.strides}, group {geo.group}")
    items = geo.batch * geo.group
    gsz = packed[0].size
    item_code = (f"const long bi = it / {geo.group}, gi = it % {geo.group};\n"
                 f"const long ao = gi * {gsz}L, bo = bi * {geo.c * geo.ihw}L + gi * {geo.cg * geo.ihw}L;\n"
                 f"const long co = bi * {geo.oc * geo.ohw}L + gi * {geo.ocg * geo.ohw}L, grow0 = gi * {geo.ocg}L;")
    p = GemmProblem(geo.ocg, geo.ohw, k, a_op, b_op, em.ptr(node.outputs[0]), geo.ohw, _epilogue(node, g, em),
                    **sched.gemm.problem_args(),
                    items=items, item_code=item_code, name=f"f32_conv{geo.rank}d_{kind}_gemm",
                    doc=f"Conv {geo.describe()}")
    render_gemm(em, p, blk)


def _emit_depthwise(node: Node, g: Graph, em: BlockEmitter, geo: ConvGeometry, dk: DepthwiseKernel) -> None:
    blk = blocking_for(em.target)
    ins, outs, ks = list(geo.ins), list(geo.outs), list(geo.ks)
    strides, dils, pb = list(geo.strides), list(geo.dils), list(geo.pb)
    if geo.rank == 1:
        ins, outs, ks, strides, dils, pb = [1] + ins, [1] + outs, [1] + ks, [1] + strides, [1] + dils, [0] + pb
    ih, iw = ins
    oh_, ow = outs
    kh, kw = ks
    sh, sw = strides
    dh, dw = dils
    ph, pw = pb
    mult = geo.oc // geo.group
    w = np.asarray(g.const(node.inputs[1]), np.float32).reshape(geo.oc, kh * kw)
    wptr = em.weight(w)
    planes = geo.batch * geo.oc
    ep = _epilogue(node, g, em)
    L = ["(void)in; (void)out; (void)arena; (void)scratch; (void)W;",
         f"const float *restrict X = {em.ptr(node.inputs[0])};",
         f"float *restrict Y = {em.ptr(node.outputs[0])};",
         f"const float *restrict Wt = {wptr};",
         "long p0, p1;"]
    if not dk.threaded:
        L.append(f"if (tid != 0) return; p0 = 0; p1 = {planes};")
    else:
        L.append(f"smelt_range({planes}, tid, nt, &p0, &p1);")
    L += ["for (long pl = p0; pl < p1; ++pl) {",
          f"    const long bi = pl / {geo.oc}, oc = pl % {geo.oc}, gi = oc / {mult};",
          f"    const float *restrict x = X + (bi * {geo.c} + gi) * {ih * iw}L;",
          f"    float *restrict y = Y + pl * {oh_ * ow}L;",
          f"    const float *restrict wk = Wt + oc * {kh * kw};"]
    v = blk.vx
    # the register kernels build every tap's lane mask at compile time: bit-mask ISAs with gathers
    in_regs = v.bit_masks and v.has("gather")
    flat = in_regs and oh_ * ow <= v.lanes * dk.plane_vectors

    def finish(acc: str, n: int, flat_off: str) -> list[str]:
        """The epilogue on an accumulator before its (masked) store."""
        mask = None if n == v.lanes else f"({v.mask_type}){(1 << n) - 1:#x}"
        return vector_epilogue_stmts(ep, em, blk, acc, mask, flat_off, "oc", "0") or []

    epi_in_regs = in_regs and (
        ep.empty() or vector_epilogue_stmts(ep, em, blk, "a", None, "0", "oc", "0") is not None)
    if flat:
        L += ["    " + x for x in _dw_plane_avx512(v, ih, iw, oh_, ow, kh, kw, sh, sw, dh, dw, ph, pw,
                                                    finish if epi_in_regs else None)]
    else:
        L += [f"    for (long oh = 0; oh < {oh_}; ++oh) {{",
              f"        float *restrict yr = y + oh * {ow};"]
    if flat:
        pass
    elif in_regs:
        L += ["        " + x for x in _dw_row_avx512(v, ih, iw, oh_, ow, kh, kw, sh, sw, dh, dw, ph, pw,
                                                     dk.row_vectors, finish if epi_in_regs else None)]
    else:
        L += [f"        for (long o = 0; o < {ow}; ++o) yr[o] = 0.0f;",
              f"        for (int kh = 0; kh < {kh}; ++kh) {{",
              f"            const long ih = oh * {sh} - {ph} + kh * {dh};",
              f"            if ((unsigned long)ih >= {ih}ul) continue;",
              f"            const float *restrict xr = x + ih * {iw};"]
        for kx in range(kw):
            off = kx * dw - pw
            # valid output columns: 0 <= o*sw + off < iw
            lo = (-off + sw - 1) // sw if off < 0 else 0
            hi = min(ow, (iw - 1 - off) // sw + 1) if iw - 1 - off >= 0 else 0
            if hi <= lo:
                continue
            L.append(f"            {{ const float wv = wk[kh * {kw} + {kx}];")
            L.append(f"              for (long o = {lo}; o < {hi}; ++o) yr[o] += wv * xr[o * {sw} + ({off})]; }}")
        L.append("        }")
    epi = tile_epilogue_code(ep, em, blk, ow)
    if epi and not epi_in_regs:
        if flat:
            L += ["    {",
                  f"        float *cp = y; const long coff = pl * {oh_ * ow}L, grow = oc, gcol = 0;",
                  f"        const long rows = 1, cols = {oh_ * ow}; (void)coff; (void)gcol; (void)grow;",
                  "        " + epi.replace("\n", "\n        "),
                  "    }"]
        else:
            L += ["        {",
                  f"            float *cp = yr; const long coff = pl * {oh_ * ow}L + oh * {ow}, grow = oc, gcol = 0;",
                  f"            const long rows = 1, cols = {ow}; (void)coff; (void)gcol; (void)grow;",
                  "            " + epi.replace("\n", "\n            "),
                  "        }"]
    if not flat:
        L.append("    }")
    L.append("}")
    doc = f"depthwise Conv {geo.describe()} multiplier={mult}; {epilogue_doc(node)}"
    em.schedule(algorithm="depthwise direct" + (
        " (whole plane in registers)" if flat else " (row by row in registers)" if in_regs else ""),
        kernel=f"f32_conv{geo.rank}d_depthwise_direct", layout="NCHW",
        threads="planes split over threads" if dk.threaded else "thread 0 only",
        epilogue_at="in registers" if epi_in_regs and not ep.empty() else "row pass" if epi else "",
        shape=f"{geo.ks} kernel, stride {geo.strides}, multiplier {mult}")
    em.step("\n".join(L), name=f"f32_conv{geo.rank}d_depthwise_direct", doc=doc)


def _dw_tap(v: VectorIsa, src: str, mask: int, sw: int, lanes: list[int] | None = None) -> str:
    """A vector of input taps: ``lanes`` (offsets from src, per lane) or src + lane * sw."""
    w, mt = v.lanes, v.mask_type
    if lanes is None:
        if sw == 1:
            return v.masked_load(src, None if mask == (1 << w) - 1 else f"({mt}){mask:#x}")
        if sw == 2:
            half = w // 2
            lo = sum(1 << (2 * b) for b in range(half) if mask >> b & 1)
            hi = sum(1 << (2 * b) for b in range(half) if mask >> (half + b) & 1)
            return v.x("maskz_permute2", m=f"({mt}){mask:#x}", a=v.masked_load(src, f"({mt}){lo:#x}"), i="DW_EVEN",
                       b=v.masked_load(f"{src} + {w}", f"({mt}){hi:#x}"))
        lanes = [e * sw for e in range(w)]
    idx = ", ".join(str(x) for x in lanes)
    return v.x("gather", a=v.zero(), m=f"({mt}){mask:#x}", i=v.x("i32_setr", a=idx), p=src)


def _dw_even(v: VectorIsa) -> str:
    """The index vector of the even lanes of two vectors (stride-2 taps)."""
    return f"const {v.x('itype')} DW_EVEN = {v.x('i32_setr', a=', '.join(str(2 * e) for e in range(v.lanes)))};"


def _dw_fma(v: VectorIsa, tap: str, acc: str, mask: int) -> str:
    """``acc += wv * tap`` in the lanes whose tap lies inside the input (``mask``); lanes over
    the padding keep ``acc``. Multiplying the zero a masked load gives there would turn a NaN or
    Inf weight into a NaN at the border, where onnxruntime skips the padded taps."""
    if mask == (1 << v.lanes) - 1:
        return v.fmadd("wv", tap, acc)
    return v.x("mask3_fmadd", a="wv", b=tap, c=acc, m=f"({v.mask_type}){mask:#x}")


def _dw_store(v: VectorIsa, c: int, n: int, dst: str, finish, flat_off: str) -> list[str]:
    L = ["  " + x for x in (finish(f"a{c}", n, flat_off) if finish else [])]
    L.append("  " + v.masked_store(dst, f"a{c}", None if n == v.lanes else f"({v.mask_type}){(1 << n) - 1:#x}"))
    return L


def _dw_plane_avx512(v: VectorIsa, ih: int, iw: int, oh: int, ow: int, kh: int, kw: int, sh: int, sw: int, dh: int,
                     dw: int, ph: int, pw: int, finish) -> list[str]:
    """A whole (small) depthwise output plane in registers: 16 consecutive flat outputs per
    vector; for every tap the lanes' input offsets are compile-time constants (a masked load
    when they are contiguous, two loads and a permute at stride 2, else a gather)."""
    n_out, w = oh * ow, v.lanes
    chunks = -(-n_out // w)
    L = ["{ const uintptr_t xb = (uintptr_t)x;",
         "  " + " ".join(f"{v.t} a{c} = {v.zero()};" for c in range(chunks))]
    uses_even = False
    for ky in range(kh):
        for kx in range(kw):
            taps = []
            for c in range(chunks):
                offs = []
                for lane in range(w):
                    o = w * c + lane
                    if o >= n_out:
                        offs.append(None)
                        continue
                    y, xx = divmod(o, ow)
                    iy, ix = y * sh - ph + ky * dh, xx * sw - pw + kx * dw
                    offs.append(iy * iw + ix if 0 <= iy < ih and 0 <= ix < iw else None)
                valid = [i for i, v in enumerate(offs) if v is not None]
                if not valid:
                    continue
                mask = sum(1 << i for i in valid)
                base = offs[valid[0]] - valid[0]
                if all(offs[i] == base + i for i in valid):
                    taps.append((c, _dw_tap(v, f"(const float *)(xb + (uintptr_t)({base}L * 4))", mask, 1), mask))
                    continue
                base2 = offs[valid[0]] - 2 * valid[0]
                if all(offs[i] == base2 + 2 * i for i in valid):
                    uses_even = True
                    taps.append((c, _dw_tap(v, f"(const float *)(xb + (uintptr_t)({base2}L * 4))", mask, 2), mask))
                    continue
                lanes = [v if v is not None else 0 for v in offs]
                taps.append((c, _dw_tap(v, "(const float *)xb", mask, 0, lanes), mask))
            if not taps:
                continue
            L.append(f"  {{ const {v.t} wv = {v.set1(f'wk[{ky * kw + kx}]')};")
            for c, xv, mask in taps:
                L.append(f"    a{c} = {_dw_fma(v, xv, f'a{c}', mask)};")
            L.append("  }")
    for c in range(chunks):
        L += _dw_store(v, c, min(w, n_out - w * c), f"y + {w * c}", finish, f"pl * {n_out}L + {w * c}")
    L.append("}")
    if uses_even:
        L.insert(0, _dw_even(v))
    return L


def _dw_row_avx512(v: VectorIsa, ih: int, iw: int, oh: int, ow: int, kh: int, kw: int, sh: int, sw: int, dh: int,
                   dw: int, ph: int, pw: int, row_vectors: int, finish=None) -> list[str]:
    """One depthwise output row (``yr``) in registers: a vector of outputs per accumulator,
    ``row_vectors`` accumulators at a time (the schedule's ``DepthwiseKernel``), every tap's
    lane mask (padding, row end) a compile-time constant."""
    L, w = [], v.lanes
    chunks = -(-ow // w)
    for g0 in range(0, chunks, row_vectors):
        group = list(range(g0, min(chunks, g0 + row_vectors)))
        L.append("{ " + " ".join(f"{v.t} a{c} = {v.zero()};" for c in group))
        L += [f"  for (int kh = 0; kh < {kh}; ++kh) {{",
              f"    const long ih = oh * {sh} - {ph} + kh * {dh};",
              f"    if ((unsigned long)ih >= {ih}ul) continue;",
              f"    const uintptr_t xr = (uintptr_t)(x + ih * {iw});",
              f"    const float *restrict wr = wk + kh * {kw};"]
        for kx in range(kw):
            off = kx * dw - pw
            taps = []
            for c in group:
                mask = 0
                for lane in range(w):
                    o = w * c + lane
                    if o < ow and 0 <= o * sw + off < iw:
                        mask |= 1 << lane
                if mask:
                    taps.append((c, mask, w * c * sw + off))
            if not taps:
                continue
            L.append(f"    {{ const {v.t} wv = {v.set1(f'wr[{kx}]')};")
            for c, mask, base in taps:
                src = f"(const float *)(xr + (uintptr_t)({base}L * 4))"
                L.append(f"      a{c} = {_dw_fma(v, _dw_tap(v, src, mask, sw), f'a{c}', mask)};")
            L.append("    }")
        L.append("  }")
        for c in group:
            L += _dw_store(v, c, min(w, ow - w * c), f"yr + {w * c}", finish,
                           f"pl * {oh * ow}L + oh * {ow} + {w * c}")
        L.append("}")
    if sw == 2:
        L.insert(0, _dw_even(v))
    return L
