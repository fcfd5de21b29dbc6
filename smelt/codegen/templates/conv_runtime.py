"""``Conv`` whose weights are known only at run time (a graph input or a computed value), float32,
1-D to 3-D, NCHW.

The other conv templates (conv.py, conv_nchwc.py, winograd.py) reorder the weights into their
micro-kernels' panels at compile time, which needs them constant. Here nothing is reordered
ahead of time; W is read in ONNX's order W[OC][C/G][kd][kh][kw], which per group already is the
row-major GEMM operand A[OC/G][C/G * k]:

- GEMM path (the default): a first step writes the im2col matrix of every (image, group) into
  scratch, rows (input channel, tap), columns the output positions, padding as 0 (rows split
  over threads; per kernel column the range of output columns inside the image is a
  compile-time table); then the kernel library's GEMM (kernels/gemm.py ``render_gemm``) computes
  Y = W . col per item with A a run-time strided operand (packed into MR panels at run time
  inside the generated code, or read in place as the node's GemmSchedule says), the bias and
  the fused epilogue in its tile epilogue. A 1x1 stride-1 unpadded conv needs no im2col (the
  image rows are B). So a conv with run-time weights runs on the same micro-kernels as one with
  constant weights; only the A packing moves from compile time to run time.
- direct path, when the im2col matrix would exceed ``COL_LIMIT_BYTES`` of scratch: one work
  item is one output row (image, output channel, output depth, output row); the row starts at
  the bias (or zero); for each input channel of the group and each kernel tap whose input row
  lies inside the image, ``y[ow] += w * x[ow*s + kw*d - p]`` over the compile-time range of
  ``ow`` whose input column is inside; the fused epilogue is applied to the finished row.
Either way every output element is summed in one fixed order whatever the thread count.
Constant weights never reach this template.
"""

from __future__ import annotations

from smelt.codegen.emitter import BlockEmitter
from smelt.codegen.kernels.conv_geometry import ConvGeometry, check_conv
from smelt.codegen.kernels.epilogue import TileOperand, epilogue_doc, epilogue_expr
from smelt.codegen.kernels.gemm import GemmProblem, Strided, TileEpilogue, blocking_for, render_gemm
from smelt.codegen.kernels.loops import work_range
from smelt.codegen.registry import register
from smelt.ir.graph import Graph, Node
from smelt.schedule.conv import ConvSchedule

PARALLEL_MIN_MACS = 1 << 15  # below this one thread does the node (a barrier costs more)
# the im2col matrix of all (image, group) items lives in scratch up to this size; larger convs
# take the direct kernel instead of growing every model's scratch arena by it
COL_LIMIT_BYTES = 64 << 20


def _check(node: Node, g: Graph) -> str | None:
    if g.const(node.inputs[1]) is not None:
        return "constant conv weights go to the packed kernels (conv.py)"
    return check_conv(node, g, runtime_weights=True)


def _ranges(i_len: int, o_len: int, k: int, s: int, d: int, p: int) -> list[tuple[int, int]]:
    """Per tap kk, the outputs o with 0 <= o*s + kk*d - p < i_len, as [lo, hi) within [0, o_len)."""
    out = []
    for kk in range(k):
        off = kk * d - p
        lo = min(o_len, max(0, -(off // s)))  # ceil(-off / s)
        hi = max(lo, min(o_len, -((off - i_len) // s)))  # ceil((i_len - off) / s)
        out.append((lo, hi))
    return out


def _table(name: str, values: list[int]) -> str:
    return f"static const int {name}[{len(values)}] = {{{', '.join(str(v) for v in values)}}};"


def _padded(geo: ConvGeometry) -> tuple[list[int], ...]:
    """ins, outs, kernel, strides, dilations, begin pads, each padded to 3-D."""
    lead = 3 - geo.rank
    return ([1] * lead + geo.ins, [1] * lead + geo.outs, [1] * lead + geo.ks, [1] * lead + geo.strides,
            [1] * lead + geo.dils, [0] * lead + geo.pb)


@register("Conv", versions=(1, 11, 22), check=_check, name="f32_conv_runtime_weights")
def emit_conv_runtime(node: Node, g: Graph, em: BlockEmitter) -> None:
    geo = ConvGeometry(node, g)
    k = geo.cg * geo.ksp
    pointwise = geo.is_pointwise
    sched = node.schedule
    if isinstance(sched, ConvSchedule) and sched.gemm is not None and (
            pointwise or geo.batch * geo.group * k * geo.ohw * 4 <= COL_LIMIT_BYTES):
        _emit_gemm(node, g, em, geo, sched)
    else:
        _emit_direct(node, g, em, geo)


def _emit_im2col(node: Node, em: BlockEmitter, geo: ConvGeometry, col: str) -> None:
    """The step writing col[item][ic * ksp + tap][output position] (0 where the tap is padding)."""
    (i_d, i_h, i_w), (o_d, o_h, o_w), (k_d, k_h, k_w), (s_d, s_h, s_w), (d_d, d_h, d_w), (p_d, p_h, p_w) = \
        _padded(geo)
    k = geo.cg * geo.ksp
    rw = _ranges(i_w, o_w, k_w, s_w, d_w, p_w)
    rows = geo.batch * geo.group * k
    n_out = o_d * o_h * o_w
    L = [f"const float *restrict X = {em.ptr(node.inputs[0])};",
         f"float *restrict C = {col};",
         _table("wlo", [r[0] for r in rw]), _table("whi", [r[1] for r in rw]),
         work_range(rows, rows * n_out >= PARALLEL_MIN_MACS),
         "for (long r = wb; r < we; ++r) {",
         f"    const long it = r / {k}, kk = r % {k}, ic = kk / {geo.ksp}, tap = kk % {geo.ksp};",
         f"    const long kw = tap % {k_w}, kh = (tap / {k_w}) % {k_h}, kd = tap / {k_w * k_h};",
         f"    const float *restrict x = X + (it * {geo.cg} + ic) * {geo.ihw}L;  /* item = image * G + group */",
         f"    float *restrict c = C + r * {n_out}L;",
         f"    for (long od = 0; od < {o_d}; ++od) {{",
         f"        const long id = od * {s_d} + kd * {d_d} - {p_d};",
         f"        for (long oh = 0; oh < {o_h}; ++oh) {{",
         f"            const long ih = oh * {s_h} + kh * {d_h} - {p_h};",
         f"            float *restrict cr = c + (od * {o_h} + oh) * {o_w};",
         f"            if (id < 0 || id >= {i_d} || ih < 0 || ih >= {i_h}) {{",
         f"                for (long ow = 0; ow < {o_w}; ++ow) cr[ow] = 0.0f;",
         "                continue;",
         "            }",
         f"            const float *restrict xs = x + (id * {i_h} + ih) * {i_w}L + kw * {d_w} - {p_w};",
         "            const long lo = wlo[kw], hi = whi[kw];",
         "            for (long ow = 0; ow < lo; ++ow) cr[ow] = 0.0f;",
         f"            for (long ow = lo; ow < hi; ++ow) cr[ow] = xs[ow * {s_w}];",
         f"            for (long ow = hi; ow < {o_w}; ++ow) cr[ow] = 0.0f;",
         "        }", "    }", "}"]
    em.step("\n".join(L), name="f32_conv_runtime_im2col", doc=f"im2col {geo.describe()}")


def _emit_gemm(node: Node, g: Graph, em: BlockEmitter, geo: ConvGeometry, sched: ConvSchedule) -> None:
    """im2col into scratch (unless 1x1), then per (image, group) Y = W . col on the GEMM library
    with W a run-time strided A operand; bias and fused epilogue in the tile epilogue."""
    assert sched.gemm is not None
    k = geo.cg * geo.ksp
    items = geo.batch * geo.group
    if geo.is_pointwise:
        b_op = Strided(em.ptr(node.inputs[0]), geo.ihw, 1)
        bo = f"bi * {geo.c * geo.ihw}L + gi * {geo.cg * geo.ihw}L"
        how = "1x1: image rows are B"
    else:
        col = em.scratch(items * k * geo.ohw * 4)
        _emit_im2col(node, em, geo, col)
        b_op = Strided(col, geo.ohw, 1)
        bo = f"it * {k * geo.ohw}L"
        how = "im2col into scratch, then GEMM"
    ops = []
    if len(node.inputs) > 2 and node.inputs[2]:
        ops.append(TileOperand("Add", em.ptr(node.inputs[2]), "row"))
    item_code = (f"const long bi = it / {geo.group}, gi = it % {geo.group}; (void)bi;\n"
                 f"const long ao = gi * {geo.ocg * k}L, bo = {bo};\n"
                 f"const long co = bi * {geo.oc * geo.ohw}L + gi * {geo.ocg * geo.ohw}L, grow0 = gi * {geo.ocg}L;")
    em.schedule(algorithm=f"run-time weights: {how} (W read as a strided A operand)", layout="NCHW",
                shape=f"{geo.ks} kernel, stride {geo.strides}, group {geo.group}")
    p = GemmProblem(geo.ocg, geo.ohw, k, Strided(em.ptr(node.inputs[1]), k, 1), b_op, em.ptr(node.outputs[0]),
                    geo.ohw, TileEpilogue(ops, node, channel="row"), **sched.gemm.problem_args(),
                    items=items, item_code=item_code, name=f"f32_conv{geo.rank}d_runtime_w_gemm",
                    doc=f"Conv {geo.describe()}")
    render_gemm(em, p, blocking_for(em.target))


def _emit_direct(node: Node, g: Graph, em: BlockEmitter, geo: ConvGeometry) -> None:
    lead = 3 - geo.rank
    i_d, i_h, i_w = [1] * lead + geo.ins
    o_d, o_h, o_w = [1] * lead + geo.outs
    k_d, k_h, k_w = [1] * lead + geo.ks
    s_d, s_h, s_w = [1] * lead + geo.strides
    d_d, d_h, d_w = [1] * lead + geo.dils
    p_d, p_h, p_w = [0] * lead + geo.pb
    n, c, oc, cg, ocg = geo.batch, geo.c, geo.oc, geo.cg, geo.ocg
    ksp = k_d * k_h * k_w
    rw = _ranges(i_w, o_w, k_w, s_w, d_w, p_w)  # the depth and row taps are tested per row instead
    ins = node.present_inputs()
    bias = em.ptr(ins[2]) if len(ins) > 2 else None
    rows = n * oc * o_d * o_h
    macs = rows * o_w * cg * ksp
    plane_in = i_d * i_h * i_w
    L = [f"const float *restrict X = {em.ptr(node.inputs[0])};",
         f"const float *restrict Wt = {em.ptr(node.inputs[1])};",
         f"float *restrict Y = {em.ptr(node.outputs[0])};",
         _table("wlo", [r[0] for r in rw]), _table("whi", [r[1] for r in rw]),
         work_range(rows, macs >= PARALLEL_MIN_MACS),
         "for (long r = wb; r < we; ++r) {",
         f"    const long oh = r % {o_h}, od = (r / {o_h}) % {o_d}, q = r / {o_h * o_d};",
         f"    const long oc = q % {oc}, b = q / {oc}, grp = oc / {ocg};",
         f"    float *restrict y = Y + r * {o_w}L;",
         f"    const float init = {f'{bias}[oc]' if bias else '0.0f'};",
         f"    for (long i = 0; i < {o_w}; ++i) y[i] = init;",
         f"    for (long icl = 0; icl < {cg}; ++icl) {{",
         f"        const float *restrict x = X + (b * {c} + grp * {cg} + icl) * {plane_in}L;",
         f"        const float *restrict wk = Wt + (oc * {cg} + icl) * {ksp}L;",
         f"        for (long kd = 0; kd < {k_d}; ++kd) {{",
         f"            const long id = od * {s_d} + kd * {d_d} - {p_d};",
         f"            if (id < 0 || id >= {i_d}) continue;",
         f"            for (long kh = 0; kh < {k_h}; ++kh) {{",
         f"                const long ih = oh * {s_h} + kh * {d_h} - {p_h};",
         f"                if (ih < 0 || ih >= {i_h}) continue;",
         f"                const float *restrict xr = x + (id * {i_h} + ih) * {i_w}L;",
         f"                const float *restrict wr = wk + (kd * {k_h} + kh) * {k_w};",
         f"                for (long kw = 0; kw < {k_w}; ++kw) {{",
         "                    const float wv = wr[kw];",
         f"                    const float *restrict xs = xr + kw * {d_w} - {p_w};",
         f"                    for (long ow = wlo[kw]; ow < whi[kw]; ++ow) y[ow] += wv * xs[ow * {s_w}];",
         "                }", "            }", "        }", "    }"]
    if node.epilogue:
        flat = f"r * {o_w}L + ow"
        L += [f"    for (long ow = 0; ow < {o_w}; ++ow) y[ow] = {epilogue_expr(em, node, 'y[ow]', flat, 'oc')};"]
    L += ["}"]
    em.schedule(algorithm="direct convolution per output row, weights read in ONNX order (run-time weights)",
                kernel="f32_conv_runtime_weights", layout="NCHW",
                threads="output rows split over threads" if macs >= PARALLEL_MIN_MACS else "thread 0 only",
                shape=geo.describe())
    em.step("\n".join(L), name="f32_conv_runtime_weights", doc=f"{geo.describe()}; {epilogue_doc(node)}")
