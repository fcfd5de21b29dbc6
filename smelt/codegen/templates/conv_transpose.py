"""ConvTranspose (1-D to 3-D; groups, strides, dilations, pads, output_padding), float32 NCHW.

Output-stationary per plane: each (image, output channel) plane belongs to one thread, which
starts it at the bias (or zero) and scatters every input channel of its group into it,
``y[i*s - p + k*d] += w[k] * x[i]`` for each kernel tap. The plane stays in cache while the
input planes stream through; no two threads write one plane, so there are no atomics. For each
tap the range of input columns that land inside the output is a compile-time constant (as in the
pooling and depthwise templates), so the innermost loop has no bounds test: contiguous at
stride 1 (gcc vectorizes it), a fixed stride otherwise.

Pads: explicit (auto_pad NOTSET or VALID), or, with ``output_shape`` or SAME_UPPER/SAME_LOWER,
the total padding split as onnxruntime splits it; the inferred output shape must agree with
what that gives (``s*(i-1) + output_padding + (k-1)*d + 1 - pads``), else the node falls back
naming why.

Weights and bias may be constants or run-time values (graph inputs, computed tensors): the
kernels read both in ONNX's layout, so nothing is reordered at compile time.

GEMM + col2im (when there is work enough for it, ``GEMM_MIN_MACS``, and at least
``GEMM_MIN_CHANNELS`` input channels per group), tiled over the input rows so that any size takes
it with bounded scratch: the input's rows (depth x height, flattened) are cut into chunks whose
column block (all images and groups) fits ``COL_CHUNK_L2`` times the target's L2
(``_chunk_rows``, the one place that decides; at least one row per chunk). Per chunk, first
col[(o, tap)][pixel] = W^T . X over the chunk's pixels, per (image, group), on the kernel
library's GEMM (W [C/G][OC/G * taps] is a transposed run-time A operand, packed inside the
generated code; the chunk's image rows are B, threads split the GEMM), then per (image, output
channel) plane (one thread each, so no two threads write one plane) the same output-stationary
pass as above adds the chunk's col rows, one per tap, onto the plane, which a first step started
at the bias. Chunks run one after another (a barrier between steps), from the last input rows
to the first: an output element then receives its taps in ascending tap order, the order of
the untiled form, so the sums are the same for any chunk size. The chunk a step works on is
read at run time (see ``_chunk_index``), so every full chunk shares one GEMM and one col2im
function. The scatter pass with the weights inside is kept for small convolutions.
"""

from __future__ import annotations

import re

import numpy as np

from smelt.codegen.emitter import BlockEmitter, ref_expr
from smelt.codegen.kernels.gemm import GemmProblem, Strided, TileEpilogue, blocking_for, render_gemm
from smelt.codegen.kernels.loops import work_range
from smelt.codegen.registry import register
from smelt.ir.graph import Graph, Node
from smelt.schedule import gemm as gemm_schedule

PARALLEL_MIN_MACS = 1 << 15  # below this one thread does the node (a barrier costs more)
GEMM_MIN_MACS = 1 << 16  # from here the GEMM + col2im form beats the scatter with weights inside
# ... given this many input channels per group: the GEMM's K; below it (depthwise-like) the
# column matrix costs more memory traffic than the multiply-adds it organizes
GEMM_MIN_CHANNELS = 4
# the GEMM form's column block per chunk of input rows (all images and groups): this many times the
# target's L2 (at least one input row); the GEMM writes it and col2im reads it back while cached
COL_CHUNK_L2 = 2


def _geometry(node: Node, g: Graph):
    """(spatial in, out, kernel, strides, dilations, pads_begin) padded to 3-D, or a reason."""
    x, y = g.values[node.inputs[0]], g.values[node.outputs[0]]
    w = g.values[node.inputs[1]]
    rank = len(x.shape) - 2
    if rank < 1 or rank > 3 or len(w.shape) != rank + 2:
        return "ConvTranspose is native for 1-D to 3-D inputs"
    auto_pad = node.attr("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
        return f"ConvTranspose auto_pad {auto_pad!r}"
    ks = list(node.attr("kernel_shape", None) or w.shape[2:])
    if ks != list(w.shape[2:]):
        return "kernel_shape disagrees with the weights"
    strides = list(node.attr("strides", None) or [1] * rank)
    dils = list(node.attr("dilations", None) or [1] * rank)
    pads = [0] * (2 * rank) if auto_pad == "VALID" else list(node.attr("pads", None) or [0] * (2 * rank))
    out_pad = list(node.attr("output_padding", None) or [0] * rank)
    given = list(node.attr("output_shape", None) or [])
    given = given[-rank:] if given else []
    ins, outs = list(x.shape[2:]), list(y.shape[2:])
    begins = []
    for i in range(rank):
        full = strides[i] * (ins[i] - 1) + out_pad[i] + (ks[i] - 1) * dils[i] + 1
        if given or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            # the total padding split as onnxruntime 1.32 splits it (checked against it by
            # tests/kernels/test_conv_transpose.py): an odd pixel goes to the tail for SAME_UPPER,
            # to the head otherwise (SAME_LOWER, or output_shape given)
            want = given[i] if given else ins[i] * strides[i]
            total = max(0, full - want)
            begins.append(total // 2 if auto_pad == "SAME_UPPER" else total - total // 2)
        else:
            want = full - pads[i] - pads[i + rank]
            begins.append(pads[i])
        if want != outs[i]:
            return f"output size {outs[i]} on axis {i + 2} differs from ConvTranspose's ({want})"
    lead = 3 - rank
    return ([1] * lead + ins, [1] * lead + outs, [1] * lead + ks, [1] * lead + strides, [1] * lead + dils,
            [0] * lead + begins)


def _check(node: Node, g: Graph) -> str | None:
    ins = node.present_inputs()
    for name in ins + [node.outputs[0]]:
        if g.values[name].dtype is None or np.dtype(g.values[name].dtype) != np.float32:
            return "ConvTranspose is native for float32"
    x, w = g.values[node.inputs[0]], g.values[node.inputs[1]]
    group = int(node.attr("group", 1))
    if group < 1 or x.shape[1] % group or x.shape[1] != w.shape[0]:
        return "ConvTranspose channels do not divide into its groups"
    if x.size == 0 or g.values[node.outputs[0]].size == 0:
        return "empty tensor"
    geo = _geometry(node, g)
    return geo if isinstance(geo, str) else None


def _tap_range(i_len: int, o_len: int, s: int, off: int) -> tuple[int, int]:
    """Input indices i with 0 <= i*s + off < o_len: [ceil(-off / s), ceil((o_len - off) / s))
    clipped to [0, i_len) (an empty range has hi == lo)."""
    lo = max(0, -(off // s))
    hi = max(lo, min(i_len, -((off - o_len) // s)))
    return lo, hi


@register("ConvTranspose", check=_check, name="f32_conv_transpose")
def emit_conv_transpose(node: Node, g: Graph, em: BlockEmitter) -> None:
    (i_d, i_h, i_w), (o_d, o_h, o_w), (k_d, k_h, k_w), (s_d, s_h, s_w), (d_d, d_h, d_w), (p_d, p_h, p_w) = \
        _geometry(node, g)  # type: ignore[misc]
    x, w = g.values[node.inputs[0]], g.values[node.inputs[1]]
    n, c = x.shape[0], x.shape[1]
    group = int(node.attr("group", 1))
    icg, ocg = c // group, w.shape[1]
    oc = ocg * group
    # the kernel reads W in ONNX's own order [C][OC/G][k...], so run-time weights (a graph input
    # or a computed value) need no packing: the same pointer either way
    weights = em.ptr(node.inputs[1])
    ins = node.present_inputs()
    bias = em.ptr(ins[2]) if len(ins) > 2 else None
    in_plane, out_plane = i_d * i_h * i_w, o_d * o_h * o_w
    macs = n * c * ocg * in_plane * k_d * k_h * k_w
    if macs >= GEMM_MIN_MACS and icg >= GEMM_MIN_CHANNELS:
        _emit_gemm_col2im(node, g, em)
        return
    L = [f"const float *restrict X = {em.ptr(node.inputs[0])};",
         f"float *restrict Y = {em.ptr(node.outputs[0])};",
         f"const float *restrict Wt = {weights};",
         work_range(n * oc, macs >= PARALLEL_MIN_MACS),
         "for (long p = wb; p < we; ++p) {",
         f"    const long b = p / {oc}, oc = p % {oc}, grp = oc / {ocg}, o = oc % {ocg};",
         f"    float *restrict y = Y + p * {out_plane}L;",
         f"    const float init = {f'{bias}[oc]' if bias else '0.0f'};",
         f"    for (long i = 0; i < {out_plane}; ++i) y[i] = init;",
         f"    for (long icl = 0; icl < {icg}; ++icl) {{",
         f"        const long ic = grp * {icg} + icl;",
         f"        const float *restrict x = X + (b * {c} + ic) * {in_plane}L;",
         f"        const float *restrict wk = Wt + (ic * {ocg} + o) * {k_d * k_h * k_w};"]
    for kd in range(k_d):
        d0, d1 = _tap_range(i_d, o_d, s_d, kd * d_d - p_d)
        for kh in range(k_h):
            h0, h1 = _tap_range(i_h, o_h, s_h, kh * d_h - p_h)
            if d1 <= d0 or h1 <= h0:
                continue
            for kw in range(k_w):
                off = kw * d_w - p_w
                w0, w1 = _tap_range(i_w, o_w, s_w, off)
                if w1 <= w0:
                    continue
                tap = (kd * k_h + kh) * k_w + kw
                L += [f"        {{ const float wv = wk[{tap}];",
                      f"          for (long id = {d0}; id < {d1}; ++id)",
                      f"          for (long ih = {h0}; ih < {h1}; ++ih) {{",
                      f"            const float *restrict xr = x + (id * {i_h} + ih) * {i_w};",
                      f"            float *restrict yr = y + ((id * {s_d} + {kd * d_d - p_d}) * {o_h}"
                      f" + ih * {s_h} + {kh * d_h - p_h}) * {o_w} + ({off});",
                      f"            for (long iw = {w0}; iw < {w1}; ++iw) yr[iw * {s_w}] += wv * xr[iw];",
                      "          } }"]
    L += ["    }", "}"]
    em.schedule(algorithm="output-stationary scatter per (image, output channel) plane",
                kernel="f32_conv_transpose", layout="NCHW",
                shape=f"kernel {[k_d, k_h, k_w]}, stride {[s_d, s_h, s_w]}, group {group}")
    em.step("\n".join(L), name="f32_conv_transpose")


def _chunk_rows(row_bytes: int, in_rows: int, l2_bytes: int) -> int:
    """Input rows per chunk of the GEMM form: as many as keep the chunk's column block (``row_bytes``
    per input row, all images and groups) within ``COL_CHUNK_L2`` L2s, at least one, at most all."""
    return max(1, min(in_rows, int(COL_CHUNK_L2 * l2_bytes) // max(1, row_bytes)))


_REF_OFFSET = re.compile(r"\(scratch \+ (\d+)\)")


def _chunk_index(em: BlockEmitter, chunks: int) -> tuple[str, list[str]]:
    """(C expression for the chunk index, one marker pointer per chunk).

    The steps of every full chunk have the same code, so they share one function; the chunk a
    step works on comes from its arguments: marker ``ci`` is byte ``ci`` of a scratch area that
    is never read or written, and the index is its distance from the area's start (both pointers
    are buffer references, lifted into the step's arguments)."""
    base_ref = em.scratch(chunks, "uint8")
    m = _REF_OFFSET.search(base_ref)
    assert m is not None, base_ref
    base = int(m.group(1))
    markers = [ref_expr("scratch", base + ci, "char", const=True) for ci in range(chunks)]
    return f"(long)(MARK - {markers[0]})", markers


def _emit_gemm_col2im(node: Node, g: Graph, em: BlockEmitter) -> None:
    """Per chunk of input rows, last chunk first: col = W^T . X on the GEMM library (per image and
    group), then col2im of the chunk onto the planes, which a first step starts at the bias."""
    (i_d, i_h, i_w), (o_d, o_h, o_w), (k_d, k_h, k_w), (s_d, s_h, s_w), (d_d, d_h, d_w), (p_d, p_h, p_w) = \
        _geometry(node, g)  # type: ignore[misc]
    x, w = g.values[node.inputs[0]], g.values[node.inputs[1]]
    n, c = x.shape[0], x.shape[1]
    group = int(node.attr("group", 1))
    icg, ocg = c // group, w.shape[1]
    oc = ocg * group
    taps = k_d * k_h * k_w
    in_plane, out_plane = i_d * i_h * i_w, o_d * o_h * o_w
    rows = ocg * taps  # the GEMM's M: (output channel of the group, tap)
    items = n * group
    in_rows = i_d * i_h  # the input's rows (depth x height, flattened): what chunks cut
    cr = _chunk_rows(items * rows * i_w * 4, in_rows, em.target.l2_bytes)
    chunks = -(-in_rows // cr)
    col = em.scratch(items * rows * cr * i_w * 4)
    index, markers = _chunk_index(em, chunks)
    ins = node.present_inputs()
    bias = em.ptr(ins[2]) if len(ins) > 2 else None
    Y = em.ptr(node.outputs[0])
    parallel = n * oc * taps * in_plane >= PARALLEL_MIN_MACS
    em.schedule(algorithm=f"GEMM (W^T . X per image and group) into scratch, then col2im per output plane; "
                          f"tiled over input rows: {chunks} chunk(s) of {cr} row(s), last first",
                kernel="f32_conv_transpose", layout="NCHW",
                shape=f"kernel {[k_d, k_h, k_w]}, stride {[s_d, s_h, s_w]}, group {group}",
                chunks=f"{chunks} x {cr} input rows (col block {items * rows * cr * i_w * 4} bytes)")
    em.step("\n".join([f"float *restrict Y = {Y};",
                       work_range(n * oc, parallel),
                       "for (long p = wb; p < we; ++p) {",
                       f"    float *restrict y = Y + p * {out_plane}L;",
                       f"    const float init = {f'{bias}[p % {oc}]' if bias else '0.0f'};",
                       f"    for (long i = 0; i < {out_plane}; ++i) y[i] = init;",
                       "}"]), name="f32_conv_transpose_init",
            doc=f"ConvTranspose: output planes started at the {'bias' if bias else 'zero'}")
    # col2im of one chunk (rows r0 .. r1 of the input); the same code for every chunk
    L = [f"/* chunk ci of {chunks}: input rows [ci*{cr}, min(ci*{cr} + {cr}, {in_rows})) of the flattened "
         f"depth x height, whose column block is {items} x {rows} x npx in scratch */",
         f"const long ci = {index};",
         f"const long r0 = ci * {cr}, r1 = SMELT_MIN(r0 + {cr}, {in_rows}), npx = (r1 - r0) * {i_w};",
         f"const float *restrict Cl = {col};",
         f"float *restrict Y = {Y};",
         work_range(n * oc, parallel),
         "for (long p = wb; p < we; ++p) {",
         f"    const long b = p / {oc}, o = p % {oc}, grp = o / {ocg}, ol = o % {ocg};",
         f"    float *restrict y = Y + p * {out_plane}L;",
         f"    const float *restrict cp = Cl + ((b * {group} + grp) * {rows} + ol * {taps}) * npx;"]
    for kd in range(k_d):
        d0, d1 = _tap_range(i_d, o_d, s_d, kd * d_d - p_d)
        for kh in range(k_h):
            h0, h1 = _tap_range(i_h, o_h, s_h, kh * d_h - p_h)
            if d1 <= d0 or h1 <= h0:
                continue
            for kw in range(k_w):
                off = kw * d_w - p_w
                w0, w1 = _tap_range(i_w, o_w, s_w, off)
                if w1 <= w0:
                    continue
                tap = (kd * k_h + kh) * k_w + kw
                # rows of the chunk this tap reaches: depth in [d0, d1), height in [h0, h1)
                L += [f"    {{ const float *restrict ct = cp + {tap}L * npx;",
                      f"      for (long r = SMELT_MAX(r0, {d0 * i_h}L); r < SMELT_MIN(r1, {d1 * i_h}L); ++r) {{",
                      f"        const long id = r / {i_h}, ih = r % {i_h};",
                      f"        if (ih < {h0} || ih >= {h1}) continue;",
                      f"        const float *restrict cr = ct + (r - r0) * {i_w};",
                      f"        float *restrict yr = y + ((id * {s_d} + {kd * d_d - p_d}) * {o_h}"
                      f" + ih * {s_h} + {kh * d_h - p_h}) * {o_w} + ({off});",
                      f"        for (long iw = {w0}; iw < {w1}; ++iw) yr[iw * {s_w}] += cr[iw];",
                      "      } }"]
    L.append("}")
    col2im = "\n".join(L)
    blk = blocking_for(em.target)
    for ci in reversed(range(chunks)):
        npx = (min(in_rows, ci * cr + cr) - ci * cr) * i_w
        item_code = (f"const long bi = it / {group}, gi = it % {group};\n"
                     f"const long ao = gi * {icg * rows}L, bo = (bi * {c} + gi * {icg}) * {in_plane}L"
                     f" + {index.replace('MARK', markers[ci])} * {cr * i_w}L;  /* chunk's first pixel */\n"
                     f"const long co = it * {rows * npx}L, grow0 = 0; (void)grow0;")
        p = GemmProblem(rows, npx, icg, Strided(em.ptr(node.inputs[1]), 1, rows),
                        Strided(em.ptr(node.inputs[0]), in_plane, 1), col, npx, TileEpilogue([]), items=items,
                        item_code=item_code, name="f32_conv_transpose_gemm",
                        parallel_min_macs=gemm_schedule.PARALLEL_MIN_MACS,
                        doc=f"ConvTranspose W^T . X over a chunk of input rows, {rows}x{npx}x{icg}")
        render_gemm(em, p, blk)
        em.step(col2im.replace("MARK", markers[ci]), name="f32_conv_transpose_col2im",
                doc=f"ConvTranspose col2im of a chunk of {cr} input rows (of {in_rows})")
