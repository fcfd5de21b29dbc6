"""Col2Im (opset 18; 1-D to 3-D images), DeformConv (opsets 19, 22; 2-D) and MaxUnpool (opsets 9,
11, 22), float32 data.

Col2Im: output-stationary per (image, channel) plane, like ConvTranspose: each plane belongs to
one thread, starts at zero and receives, for every kernel tap and block position, the column
element ``x[n, c*K + k, l]`` at ``block*stride - pad + tap*dilation`` when that is inside the
image. Per tap the range of block columns that land inside is a compile-time table, so the
innermost loop has no bounds test. The image and block shapes are compile-time constants (a
graph input holding them is a value guard, frontend/value_guards.py).

DeformConv (onnxruntime's deform_conv.cc): the deformable im2col matrix ``col[n][c*K + k][pixel]``
is sampled once per (channel, tap, output pixel): the tap's position ``oh*s - p + k*d + offset``
is read bilinearly, 0 when it lies at or beyond one pixel outside the image and each corner
outside the image weighted 0, times the mask when there is one. Then, as in onnxruntime, a GEMM
per (image, group): Y = W[group] . col[group] + bias, on the kernel library's GEMM (W a run-time
strided A operand, bias in the tile epilogue). When that matrix would exceed
``COL_LIMIT_BYTES`` of scratch, each thread instead samples one output row's columns into its
own scratch and computes ``bias + W[oc] . col`` per output channel with plain loops. Weights,
offsets, mask and bias are read at run time in ONNX's layout (nothing is packed ahead).

MaxUnpool: the output is zeroed, then ``y[I[i]] = x[i]`` for every element (indices flat over the
whole output tensor, as MaxPool writes them; one that is out of range is skipped). Thread 0 does
the scatter so that repeated indices resolve in element order, as onnxruntime's loop does.
"""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import BlockEmitter
from smelt.codegen.kernels.epilogue import TileOperand
from smelt.codegen.kernels.gemm import GemmProblem, Strided, TileEpilogue, blocking_for, render_gemm
from smelt.codegen.kernels.loops import work_range
from smelt.codegen.registry import register
from smelt.ir.graph import Graph, Node
from smelt.schedule.gemm import PARALLEL_MIN_MACS

PARALLEL_MIN_WORK = 1 << 15  # below this one thread does the node (a barrier costs more)
COL_LIMIT_BYTES = 64 << 20  # DeformConv's whole im2col matrix in scratch up to this size


def _f32(g: Graph, names: list[str]) -> str | None:
    for name in names:
        v = g.values[name]
        if v.dtype is None or np.dtype(v.dtype) != np.float32:
            return f"{name!r} must be float32"
    return None


def _ints(g: Graph, name: str) -> list[int] | None:
    c = g.values[name].const if name else None
    return None if c is None else [int(v) for v in np.asarray(c).ravel()]


def _tap_range(i_len: int, o_len: int, s: int, off: int) -> tuple[int, int]:
    """Indices i in [0, i_len) with 0 <= i*s + off < o_len, as [lo, hi) (hi == lo when empty)."""
    lo = min(i_len, max(0, -(off // s)))
    hi = max(lo, min(i_len, -((off - o_len) // s)))
    return lo, hi


# ------------------------------------------------------------------------------------------
# Col2Im
# ------------------------------------------------------------------------------------------
def _col2im_geometry(node: Node, g: Graph):
    """(image dims, block dims, strides, dilations, pad begins, block counts), padded to 3-D, or a
    reason."""
    image, block = _ints(g, node.inputs[1]), _ints(g, node.inputs[2])
    if image is None or block is None:
        return "Col2Im's image_shape and block_shape must be known at compile time"
    rank = len(image)
    if rank < 1 or rank > 3 or len(block) != rank:
        return "Col2Im is native for 1-D to 3-D images"
    strides = list(node.attr("strides", None) or [1] * rank)
    dils = list(node.attr("dilations", None) or [1] * rank)
    pads = list(node.attr("pads", None) or [0] * (2 * rank))
    if len(strides) != rank or len(dils) != rank or len(pads) != 2 * rank or min(strides + dils) < 1:
        return "Col2Im attributes do not match the image rank"
    counts = []
    for i in range(rank):
        span = dils[i] * (block[i] - 1) + 1
        counts.append((image[i] + pads[i] + pads[i + rank] - span) // strides[i] + 1)
    if min(counts) < 1 or min(block) < 1:
        return "Col2Im with no block position"
    lead = 3 - rank
    return ([1] * lead + image, [1] * lead + block, [1] * lead + strides, [1] * lead + dils,
            [0] * lead + pads[:rank], [1] * lead + counts)


def _check_col2im(node: Node, g: Graph) -> str | None:
    why = _f32(g, [node.inputs[0], node.outputs[0]])
    if why:
        return f"Col2Im: {why}"
    geo = _col2im_geometry(node, g)
    if isinstance(geo, str):
        return geo
    x, y = g.values[node.inputs[0]], g.values[node.outputs[0]]
    _, block, *_, counts = geo
    k, l_len = int(np.prod(block)), int(np.prod(counts))
    if len(x.shape) != 3 or x.shape[1] % k or x.shape[2] != l_len:
        return f"Col2Im input {list(x.shape)} does not hold {k} taps x {l_len} blocks"
    if y.size == 0:
        return "empty tensor"
    return None


@register("Col2Im", versions=(18,), check=_check_col2im, name="f32_col2im")
def emit_col2im(node: Node, g: Graph, em: BlockEmitter) -> None:
    (i_d, i_h, i_w), (k_d, k_h, k_w), (s_d, s_h, s_w), (d_d, d_h, d_w), (p_d, p_h, p_w), (b_d, b_h, b_w) = \
        _col2im_geometry(node, g)  # type: ignore[misc]
    x = g.values[node.inputs[0]]
    n, taps = x.shape[0], k_d * k_h * k_w
    c = x.shape[1] // taps
    n_blocks, plane = b_d * b_h * b_w, i_d * i_h * i_w
    L = [f"const float *restrict X = {em.ptr(node.inputs[0])};",
         f"float *restrict Y = {em.ptr(node.outputs[0])};",
         work_range(n * c, n * c * taps * n_blocks >= PARALLEL_MIN_WORK),
         "for (long p = wb; p < we; ++p) {",
         f"    float *restrict y = Y + p * {plane}L;",
         f"    for (long i = 0; i < {plane}; ++i) y[i] = 0.0f;",
         f"    const float *restrict xc = X + p * {taps * n_blocks}L;"]
    for kd in range(k_d):
        d0, d1 = _tap_range(b_d, i_d, s_d, kd * d_d - p_d)
        for kh in range(k_h):
            h0, h1 = _tap_range(b_h, i_h, s_h, kh * d_h - p_h)
            if d1 <= d0 or h1 <= h0:
                continue
            for kw in range(k_w):
                off = kw * d_w - p_w
                w0, w1 = _tap_range(b_w, i_w, s_w, off)
                if w1 <= w0:
                    continue
                tap = (kd * k_h + kh) * k_w + kw
                L += [f"    {{ const float *restrict xt = xc + {tap * n_blocks}L;",
                      f"      for (long bd = {d0}; bd < {d1}; ++bd)",
                      f"      for (long bh = {h0}; bh < {h1}; ++bh) {{",
                      f"        const float *restrict xr = xt + (bd * {b_h} + bh) * {b_w};",
                      f"        float *restrict yr = y + ((bd * {s_d} + {kd * d_d - p_d}) * {i_h}"
                      f" + bh * {s_h} + {kh * d_h - p_h}) * {i_w} + ({off});",
                      f"        for (long bw = {w0}; bw < {w1}; ++bw) yr[bw * {s_w}] += xr[bw];",
                      "      } }"]
    L.append("}")
    em.schedule(algorithm="output-stationary scatter per (image, channel) plane", kernel="f32_col2im",
                shape=f"image {[i_d, i_h, i_w]}, block {[k_d, k_h, k_w]}, stride {[s_d, s_h, s_w]}")
    em.step("\n".join(L), name="f32_col2im")


# ------------------------------------------------------------------------------------------
# DeformConv
# ------------------------------------------------------------------------------------------
def _deform_geometry(node: Node, g: Graph):
    x, w = g.values[node.inputs[0]], g.values[node.inputs[1]]
    if len(x.shape) != 4 or len(w.shape) != 4:
        return "DeformConv is native for 2-D images"
    ks = list(node.attr("kernel_shape", None) or w.shape[2:])
    if ks != list(w.shape[2:]):
        return "kernel_shape disagrees with the weights"
    strides = list(node.attr("strides", None) or [1, 1])
    dils = list(node.attr("dilations", None) or [1, 1])
    pads = list(node.attr("pads", None) or [0, 0, 0, 0])
    outs = [(x.shape[2 + i] + pads[i] + pads[i + 2] - (dils[i] * (ks[i] - 1) + 1)) // strides[i] + 1 for i in range(2)]
    return ks, strides, dils, pads[:2], outs


def _check_deform(node: Node, g: Graph) -> str | None:
    ins = node.present_inputs()
    why = _f32(g, ins + [node.outputs[0]])
    if why:
        return f"DeformConv: {why}"
    geo = _deform_geometry(node, g)
    if isinstance(geo, str):
        return geo
    ks, strides, dils, _, outs = geo
    x, w = g.values[node.inputs[0]], g.values[node.inputs[1]]
    y = g.values[node.outputs[0]]
    group, og = int(node.attr("group", 1)), int(node.attr("offset_group", 1))
    n, c, m = x.shape[0], x.shape[1], w.shape[0]
    if min(strides + dils) < 1 or group < 1 or og < 1 or c % group or m % group or c // group != w.shape[1] or c % og:
        return "DeformConv channels do not divide into its groups"
    if tuple(y.shape) != (n, m, *outs):
        return f"DeformConv output {list(y.shape)} differs from {[n, m, *outs]}"
    k = ks[0] * ks[1]
    if tuple(g.values[node.inputs[2]].shape) != (n, og * 2 * k, *outs):
        return "DeformConv offset shape"
    if len(node.inputs) > 3 and node.inputs[3] and tuple(g.values[node.inputs[3]].shape) != (m,):
        return "DeformConv bias shape"
    if len(node.inputs) > 4 and node.inputs[4] and tuple(g.values[node.inputs[4]].shape) != (n, og * k, *outs):
        return "DeformConv mask shape"
    if y.size == 0 or x.size == 0:
        return "empty tensor"
    return None


def _deform_sample(k_h: int, k_w: int, s_h: int, s_w: int, d_h: int, d_w: int, p_h: int, p_w: int,
                   i_h: int, i_w: int, o_h: int, o_w: int, og: int, has_mask: bool) -> list[str]:
    """C computing ``v``, the deformable im2col value of channel ``ci`` (offset group ``grp``),
    tap ``t`` (row ``i``, column ``j``) at output pixel (``oh``, ``ow``) of image ``b``."""
    k = k_h * k_w
    L = [f"const long pix = oh * {o_w} + ow;",
         f"const float *restrict offh = Off + ((b * {og} + grp) * {2 * k} + 2 * t) * {o_h * o_w}L;",
         f"const float h = (float)(oh * {s_h}) + (float)({-p_h} + i * {d_h}) + offh[pix];",
         f"const float w = (float)(ow * {s_w}) + (float)({-p_w} + j * {d_w}) + offh[{o_h * o_w}L + pix];",
         "float v = 0.0f;",
         f"if (h > -1.0f && h < {float(i_h)!r}f && w > -1.0f && w < {float(i_w)!r}f) {{",
         "    const float hf = floorf(h), wf = floorf(w);",
         "    const long hl = (long)hf, wl = (long)wf, hh_ = hl + 1, wh = wl + 1;",
         "    const float lh = h - hf, lw = w - wf, hh = 1.0f - lh, hw = 1.0f - lw;",
         f"    const float p00 = (hl >= 0 && wl >= 0) ? im[hl * {i_w} + wl] : 0.0f;",
         f"    const float p01 = (hl >= 0 && wh < {i_w}) ? im[hl * {i_w} + wh] : 0.0f;",
         f"    const float p10 = (hh_ < {i_h} && wl >= 0) ? im[hh_ * {i_w} + wl] : 0.0f;",
         f"    const float p11 = (hh_ < {i_h} && wh < {i_w}) ? im[hh_ * {i_w} + wh] : 0.0f;",
         "    v = hh * hw * p00 + hh * lw * p01 + lh * hw * p10 + lh * lw * p11;",
         "}"]
    if has_mask:
        L.append(f"v *= Mk[((b * {og} + grp) * {k} + t) * {o_h * o_w}L + pix];")
    return L


@register("DeformConv", versions=(19, 22), check=_check_deform, name="f32_deform_conv")
def emit_deform_conv(node: Node, g: Graph, em: BlockEmitter) -> None:
    (k_h, k_w), (s_h, s_w), (d_h, d_w), (p_h, p_w), (o_h, o_w) = _deform_geometry(node, g)  # type: ignore[misc]
    x, w = g.values[node.inputs[0]], g.values[node.inputs[1]]
    n, c, i_h, i_w = x.shape
    m = w.shape[0]
    group, og = int(node.attr("group", 1)), int(node.attr("offset_group", 1))
    cg, mg, cog = c // group, m // group, c // og
    k = k_h * k_w
    ins = node.inputs + [""] * (5 - len(node.inputs))
    bias, mask = ins[3], ins[4]
    sample = _deform_sample(k_h, k_w, s_h, s_w, d_h, d_w, p_h, p_w, i_h, i_w, o_h, o_w, og, bool(mask))
    head = [f"const float *restrict X = {em.ptr(node.inputs[0])};",
            f"const float *restrict Off = {em.ptr(node.inputs[2])};",
            f"const float *restrict Mk = {em.ptr(mask) if mask else 'NULL'}; (void)Mk;"]
    plane = o_h * o_w
    if n * c * k * plane * 4 <= COL_LIMIT_BYTES:
        col = em.scratch(n * c * k * plane * 4)
        rows = n * c * k
        L = head + [f"float *restrict Col = {col};",
                    work_range(rows, rows * plane * 20 >= PARALLEL_MIN_WORK),
                    "for (long r = wb; r < we; ++r) {",
                    f"    const long t = r % {k}, ci = (r / {k}) % {c}, b = r / {k * c};",
                    f"    const long i = t / {k_w}, j = t % {k_w}, grp = ci / {cog};",
                    f"    const float *restrict im = X + (b * {c} + ci) * {i_h * i_w}L;",
                    f"    float *restrict cr = Col + r * {plane}L;",
                    f"    for (long oh = 0; oh < {o_h}; ++oh) for (long ow = 0; ow < {o_w}; ++ow) {{",
                    *["        " + x for x in sample],
                    "        cr[pix] = v;",
                    "    }", "}"]
        em.step("\n".join(L), name="f32_deform_im2col")
        ops = [TileOperand("Add", em.ptr(bias), "row")] if bias else []
        item_code = (f"const long bi = it / {group}, gi = it % {group};\n"
                     f"const long ao = gi * {mg * cg * k}L, bo = (bi * {c} + gi * {cg}) * {k * plane}L;\n"
                     f"const long co = (bi * {m} + gi * {mg}) * {plane}L, grow0 = gi * {mg}L;")
        p = GemmProblem(mg, plane, cg * k, Strided(em.ptr(node.inputs[1]), cg * k, 1), Strided(col, plane, 1),
                        em.ptr(node.outputs[0]), plane, TileEpilogue(ops, None, channel="row"),
                        items=n * group, item_code=item_code, name="f32_deform_conv_gemm",
                        parallel_min_macs=PARALLEL_MIN_MACS, doc=f"DeformConv {[k_h, k_w]} group {group}")
        em.schedule(algorithm="deformable im2col into scratch, then a GEMM per (image, group)",
                    kernel="f32_deform_conv", layout="NCHW",
                    shape=f"kernel {[k_h, k_w]}, stride {[s_h, s_w]}, group {group}, offset_group {og}")
        render_gemm(em, p, blocking_for(em.target))
        return
    rows = n * o_h
    col = em.scratch(max(1, em.n_threads) * c * k * o_w * 4)
    work = rows * o_w * c * k * (mg + 4)
    L = head + [f"const float *restrict Wt = {em.ptr(node.inputs[1])};",
                f"const float *restrict B = {em.ptr(bias) if bias else 'NULL'}; (void)B;",
                f"float *restrict Y = {em.ptr(node.outputs[0])};",
                f"float *restrict col = {col} + (long)tid * {c * k * o_w}L;",
                work_range(rows, work >= PARALLEL_MIN_WORK),
                "for (long r = wb; r < we; ++r) {",
                f"    const long b = r / {o_h}, oh = r % {o_h};",
                f"    for (long ci = 0; ci < {c}; ++ci) {{",
                f"        const float *restrict im = X + (b * {c} + ci) * {i_h * i_w}L;",
                f"        const long grp = ci / {cog};",
                f"        for (long t = 0; t < {k}; ++t) {{",
                f"            const long i = t / {k_w}, j = t % {k_w};",
                f"            float *restrict cr = col + (ci * {k} + t) * {o_w}L;",
                f"            for (long ow = 0; ow < {o_w}; ++ow) {{",
                *["                " + x for x in sample],
                "                cr[ow] = v;",
                "            }", "        }", "    }",
                f"    for (long oc = 0; oc < {m}; ++oc) {{",
                f"        const long gi = oc / {mg};",
                f"        float *restrict y = Y + ((b * {m} + oc) * {o_h} + oh) * {o_w}L;",
                f"        const float init = {'B[oc]' if bias else '0.0f'};",
                f"        for (long ow = 0; ow < {o_w}; ++ow) y[ow] = init;",
                f"        const float *restrict wr = Wt + oc * {cg * k}L;",
                f"        const float *restrict cg0 = col + gi * {cg * k * o_w}L;",
                f"        for (long q = 0; q < {cg * k}; ++q) {{",
                "            const float wv = wr[q];",
                f"            const float *restrict cq = cg0 + q * {o_w}L;",
                f"            for (long ow = 0; ow < {o_w}; ++ow) y[ow] += wv * cq[ow];",
                "        }", "    }", "}"]
    em.schedule(algorithm="per output row: deformable im2col into thread scratch, then W . col per channel",
                kernel="f32_deform_conv", layout="NCHW",
                shape=f"kernel {[k_h, k_w]}, stride {[s_h, s_w]}, group {group}, offset_group {og}")
    em.step("\n".join(L), name="f32_deform_conv_rows")


# ------------------------------------------------------------------------------------------
# MaxUnpool
# ------------------------------------------------------------------------------------------
def _check_maxunpool(node: Node, g: Graph) -> str | None:
    x, idx, y = g.values[node.inputs[0]], g.values[node.inputs[1]], g.values[node.outputs[0]]
    if x.dtype is None or np.dtype(x.dtype) != np.float32 or y.dtype != x.dtype:
        return "MaxUnpool is native for float32"
    if idx.dtype is None or np.dtype(idx.dtype) != np.int64 or tuple(idx.shape) != tuple(x.shape):
        return "MaxUnpool indices must be int64 of X's shape"
    if len(y.shape) != len(x.shape) or tuple(y.shape[:2]) != tuple(x.shape[:2]):
        return "MaxUnpool output keeps N and C"
    return None


@register("MaxUnpool", versions=(9, 11, 22), check=_check_maxunpool, name="f32_max_unpool")
def emit_max_unpool(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, y = g.values[node.inputs[0]], g.values[node.outputs[0]]
    total_in, total_out = x.size, y.size
    L = [f"const float *restrict X = {em.ptr(node.inputs[0])};",
         f"const int64_t *restrict I = {em.ptr(node.inputs[1])};",
         f"float *restrict Y = {em.ptr(node.outputs[0])};",
         "if (tid == 0) {",
         f"    for (long i = 0; i < {total_out}; ++i) Y[i] = 0.0f;",
         f"    for (long i = 0; i < {total_in}; ++i) {{",
         "        const int64_t at = I[i];",
         f"        if (at >= 0 && at < {total_out}) Y[at] = X[i];",
         "    }",
         "}"]
    em.schedule(algorithm="zero, then scatter x[i] to y[I[i]] in element order", kernel="f32_max_unpool")
    em.step("\n".join(L), name="f32_max_unpool")
