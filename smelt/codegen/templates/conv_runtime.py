"""``Conv`` whose weights are known only at run time (a graph input or a computed value), float32,
1-D to 3-D, NCHW.

The other conv templates (conv.py, conv_nchwc.py, winograd.py) reorder the weights into their
micro-kernels' panels at compile time, which needs them constant. Here they are read where they
are, in ONNX's order W[OC][C/G][kd][kh][kw], by a direct convolution, so nothing is packed at all
(neither in numpy nor at run time):

- one work item is one output row (image, output channel, output depth, output row); threads
  split the items, so every output element is summed in one fixed order whatever the thread
  count;
- the row starts at the bias (or zero); for each input channel of the group and each kernel tap
  whose input row lies inside the image, ``y[ow] += w * x[ow*s + kw*d - p]`` over the range of
  ``ow`` whose input column is inside the image. Those ranges (one per kw) are compile-time
  tables, so the innermost loop has no bounds test and gcc vectorizes it at stride 1; the row
  stays in L1 while the input rows stream through;
- the fused epilogue (passes/fuse_epilogue.py) is applied to the finished row.

This is the fallback-free path for the models that feed weights in (ONNX's node tests, weight
sharing through a graph input), not the fast path: constant weights never reach it.
"""

from __future__ import annotations

from smelt.codegen.emitter import BlockEmitter
from smelt.codegen.kernels.conv_geometry import ConvGeometry, check_conv
from smelt.codegen.kernels.epilogue import epilogue_doc, epilogue_expr
from smelt.codegen.kernels.loops import work_range
from smelt.codegen.registry import register
from smelt.ir.graph import Graph, Node

PARALLEL_MIN_MACS = 1 << 15  # below this one thread does the node (a barrier costs more)


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


@register("Conv", versions=(1, 11, 22), check=_check, name="f32_conv_runtime_weights")
def emit_conv_runtime(node: Node, g: Graph, em: BlockEmitter) -> None:
    geo = ConvGeometry(node, g)
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
