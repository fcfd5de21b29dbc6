"""ConvInteger and QLinearConv whose weights (or weight zero point) are known only at run time,
2-D (4-D tensors), explicit pads or VALID.

templates/int_conv.py packs W - w_zero into int16 pairs at compile time for its integer GEMM tile,
which needs both constant. This is its companion for weights fed in (a graph input, a computed
tensor), kept apart from it on purpose: a direct convolution that reads W, the zero points,
scales and bias where they are, in ONNX's layout, with nothing packed. One work item is one
output row (image, output channel, output row); its int32 sums live in the thread's scratch row:
``acc[ow] += (x - x_zero) * (w - w_zero[oc])`` over the receptive field (padding is the zero
point, so it adds 0), exact like int_conv. ConvInteger stores the sums; QLinearConv adds the
int32 bias and requantizes exactly as int_conv does (``kernels/int_gemm.requantize``: rounded
half to even, saturated, NaN low, clamps counted for the numeric debug report).
"""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import BlockEmitter
from smelt.codegen.kernels.int_gemm import SATURATION_COUNTERS, flush_counters, requantize
from smelt.codegen.kernels.loops import dtype_name, work_range
from smelt.codegen.registry import register
from smelt.ir.graph import PLAIN, Graph, Node
from smelt.ir.types import c_type

EIGHT_BIT = ("int8", "uint8")
MAX_K = 1 << 16  # 255 * 255 * 2^16 < 2^32: below this receptive field the int32 sum cannot overflow
PARALLEL_MIN_MACS = 1 << 15  # below this one thread does the node (a barrier costs more)


def _io(node: Node) -> dict[str, str]:
    ins = list(node.inputs) + [""] * 9
    if node.op == "ConvInteger":
        return {"x": ins[0], "w": ins[1], "xz": ins[2], "wz": ins[3]}
    return {"x": ins[0], "xs": ins[1], "xz": ins[2], "w": ins[3], "ws": ins[4], "wz": ins[5], "ys": ins[6],
            "yz": ins[7], "b": ins[8]}


def _size(g: Graph, name: str) -> int:
    return int(np.prod(g.values[name].shape, dtype=np.int64)) if name else 0


def _geometry(node: Node, g: Graph, io: dict[str, str]) -> dict | str:
    x, w, y = g.values[io["x"]].shape, g.values[io["w"]].shape, g.values[node.outputs[0]].shape
    if len(x) != 4 or len(w) != 4 or len(y) != 4:
        return "native integer Conv with run-time weights is 2-D (4-D tensors)"
    auto_pad = node.attr("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad not in ("NOTSET", "VALID"):
        return f"auto_pad {auto_pad} is not native"
    group = int(node.attr("group", 1))
    pads = list(node.attr("pads", [0, 0, 0, 0])) if auto_pad == "NOTSET" else [0, 0, 0, 0]
    strides, dils = list(node.attr("strides", [1, 1])), list(node.attr("dilations", [1, 1]))
    if group < 1 or x[1] != w[1] * group or w[0] % group:
        return f"channels {x[1]} / weights {list(w)} do not fit group {group}"
    outs = [(x[2 + i] + pads[i] + pads[i + 2] - (dils[i] * (w[2 + i] - 1) + 1)) // strides[i] + 1 for i in range(2)]
    if list(y) != [x[0], w[0], *outs]:
        return f"output {list(y)} differs from the computed {[x[0], w[0], *outs]}"
    if w[1] * w[2] * w[3] > MAX_K:
        return f"receptive field of {w[1] * w[2] * w[3]} > {MAX_K}: the int32 sum could overflow"
    return dict(n=x[0], c=x[1], h=x[2], w=x[3], oc=w[0], cg=w[1], kh=w[2], kw=w[3], oh=y[2], ow=y[3],
                group=group, strides=strides, dil=dils, pads=pads)


def _check(node: Node, g: Graph) -> str | None:
    io = _io(node)
    if g.values[io["w"]].const is not None and (not io["wz"] or g.values[io["wz"]].const is not None):
        return "constant weights go to the packed integer GEMM (int_conv)"
    if any(g.values[n].layout != PLAIN for n in node.inputs + node.outputs if n):
        return f"{node.op} reads plain layouts only"
    for role in ("x", "w"):
        if dtype_name(g, io[role]) not in EIGHT_BIT:
            return f"{role} of dtype {dtype_name(g, io[role])}: native {node.op} takes int8/uint8"
    geo = _geometry(node, g, io)
    if isinstance(geo, str):
        return geo
    if io["xz"] and _size(g, io["xz"]) != 1:
        return "the input zero point must be a scalar"
    if io["wz"] and _size(g, io["wz"]) not in (1, geo["oc"]):
        return "the weight zero point must be a scalar or one per output channel"
    if node.op == "QLinearConv":
        for key in ("xs", "ws", "ys"):
            if dtype_name(g, io[key]) != "float32":
                return f"scale {io[key]!r} is {dtype_name(g, io[key])}: native QLinearConv takes float32"
        if _size(g, io["ws"]) not in (1, geo["oc"]) or _size(g, io["xs"]) != 1 or _size(g, io["ys"]) != 1:
            return "QLinearConv scales: x and y scalar, w scalar or one per output channel"
        if io["yz"] and _size(g, io["yz"]) != 1:
            return "the output zero point must be a scalar"
        if io["b"] and (dtype_name(g, io["b"]) != "int32" or _size(g, io["b"]) != geo["oc"]):
            return "the bias must be int32, one per output channel"
        if dtype_name(g, node.outputs[0]) not in EIGHT_BIT:
            return "QLinearConv output must be int8/uint8"
    elif dtype_name(g, node.outputs[0]) != "int32":
        return "ConvInteger output must be int32"
    if g.values[node.outputs[0]].size == 0:
        return "empty tensor"
    return None


@register(("ConvInteger", "QLinearConv"), check=_check, name="int_conv_runtime_weights")
def emit_int_conv_runtime(node: Node, g: Graph, em: BlockEmitter) -> None:
    io = _io(node)
    geo = _geometry(node, g, io)
    n, c, h, w, oc, cg, kh, kw, oh, ow, group = (geo[k] for k in ("n", "c", "h", "w", "oc", "cg", "kh", "kw", "oh",
                                                                  "ow", "group"))
    (sh, sw), (dh, dw), (pt, pl) = geo["strides"], geo["dil"], geo["pads"][:2]
    ocg = oc // group
    xt, wt = c_type(dtype_name(g, io["x"])), c_type(dtype_name(g, io["w"]))
    rows = n * oc * oh
    macs = rows * ow * cg * kh * kw
    acc = em.scratch(max(1, em.n_threads) * ow * 4, "int32")
    xz = f"(int32_t){em.ptr(io['xz'])}[0]" if io["xz"] else "0"
    if io["wz"]:
        wz = f"(int32_t){em.ptr(io['wz'])}[{'oc' if _size(g, io['wz']) > 1 else '0'}]"
    else:
        wz = "0"
    # output columns whose input column is inside the image, per kernel column (compile time)
    lo, hi = [], []
    for kx in range(kw):
        off = kx * dw - pl
        a = min(ow, max(0, -(off // sw)))
        lo.append(a)
        hi.append(max(a, min(ow, -((off - w) // sw))))
    yt = c_type(dtype_name(g, node.outputs[0]))
    L = [f"const {xt} *restrict X = {em.ptr(io['x'])};",
         f"const {wt} *restrict Wt = {em.ptr(io['w'])};",
         f"{yt} *restrict Y = (void *){em.ptr(node.outputs[0])};",
         f"int32_t *restrict acc = {acc} + (long)tid * {ow};",
         f"const int32_t xz = {xz}; (void)xz;",
         f"static const int wlo[{kw}] = {{{', '.join(map(str, lo))}}};",
         f"static const int whi[{kw}] = {{{', '.join(map(str, hi))}}};"]
    store = "Y[yi] = ACC;"
    if node.op == "QLinearConv":
        L += [f"const float *restrict XS = {em.ptr(io['xs'])};", f"const float *restrict WS = {em.ptr(io['ws'])};",
              f"const float *restrict YS = {em.ptr(io['ys'])};", SATURATION_COUNTERS]
        w_scale = "WS[oc]" if _size(g, io["ws"]) > 1 else "WS[0]"
        bias = f"{em.ptr(io['b'])}[oc]" if io["b"] else "0"
        y_zero = f"(float){em.ptr(io['yz'])}[0]" if io["yz"] else "0.0f"
        store = requantize(f"(float)(ACC + {bias}) * ((XS[0] * {w_scale}) / YS[0])", y_zero,
                           dtype_name(g, node.outputs[0]), "Y[yi]")
    L += [work_range(rows, macs >= PARALLEL_MIN_MACS),
          "for (long r = wb; r < we; ++r) {",
          f"    const long oy = r % {oh}, oc = (r / {oh}) % {oc}, b = r / {oh * oc}, grp = oc / {ocg};",
          f"    const int32_t wz = {wz};",
          f"    for (long i = 0; i < {ow}; ++i) acc[i] = 0;",
          f"    for (long ci = 0; ci < {cg}; ++ci) {{",
          f"        const {xt} *restrict xc = X + (b * {c} + grp * {cg} + ci) * {h * w}L;",
          f"        const {wt} *restrict wk = Wt + (oc * {cg} + ci) * {kh * kw};",
          f"        for (long ky = 0; ky < {kh}; ++ky) {{",
          f"            const long iy = oy * {sh} - {pt} + ky * {dh};",
          f"            if (iy < 0 || iy >= {h}) continue;",
          f"            const {xt} *restrict xr = xc + iy * {w}L;",
          f"            for (long kx = 0; kx < {kw}; ++kx) {{",
          f"                const int32_t wv = (int32_t)wk[ky * {kw} + kx] - wz;",
          f"                const {xt} *restrict xs = xr + kx * {dw} - {pl};",
          f"                for (long ox = wlo[kx]; ox < whi[kx]; ++ox) acc[ox] += wv * ((int32_t)xs[ox * {sw}] - xz);",
          "            }", "        }", "    }",
          f"    for (long ox = 0; ox < {ow}; ++ox) {{",
          f"        const long yi = r * {ow}L + ox;",
          "        " + store.replace("ACC", "acc[ox]").replace("\n", "\n        "),
          "    }",
          "}"]
    if node.op == "QLinearConv":
        L.append(flush_counters(em.saturation_counter(node.outputs[0])))
    em.schedule(algorithm="direct integer convolution per output row, run-time weights in ONNX order",
                kernel="int_conv_runtime_weights", layout="NCHW",
                shape=f"{kh}x{kw} kernel, stride {[sh, sw]}, group {group}")
    em.step("\n".join(L), name="int_conv_runtime_weights")
