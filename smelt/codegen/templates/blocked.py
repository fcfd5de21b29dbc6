"""Templates on blocked (NCHW<b>c) layouts besides convolution: the layout transform itself,
pooling, global pooling, BatchNormalization and DepthToSpace from a blocked input.

- ``LayoutTransform`` (domain ai.smelt, attributes ``src``/``dst`` layout names): re-blocks a
  4-D float32 (or 8-bit integer) value between plain NCHW and NCHW<b>c (or between two block sizes). Work items are
  (image, block of the coarser layout, run of 64 positions); the inner loops move a b x 64 tile
  so reads and writes both stay in L1.
- ``MaxPool`` / ``AveragePool`` (2-D, float32): one output row per work item; per output the
  in-bounds kernel window comes from compile-time tables (rows and columns), and the inner loop
  runs over the b lanes of the block (one vector). Averages divide by the in-bounds count, or by
  the count inside the explicit padding with count_include_pad (ONNX semantics).
- ``GlobalAveragePool`` / ``GlobalMaxPool``: a blocked input, a plain [N, C, 1, 1] output (for a
  1x1 plane the two layouts are the same bytes, so nothing downstream needs a transform).
- ``BatchNormalization`` (constant statistics, folded at compile time into a per-channel scale
  and shift): one vector per position, the fused epilogue in registers.
"""

from __future__ import annotations

import math

import numpy as np

from smelt.codegen.emitter import BlockEmitter
from smelt.codegen.kernels.epilogue import epilogue_doc
from smelt.codegen.kernels.gemm import (
    Blocking,
    TileEpilogue,
    node_epilogue_ops,
    scalar_epilogue,
    vector_epilogue_stmts,
)
from smelt.codegen.kernels.isa import vector_isa
from smelt.codegen.kernels.loops import work_range
from smelt.codegen.kernels.pool_geometry import geometry
from smelt.codegen.registry import SMELT_DOMAIN, register
from smelt.ir.graph import PLAIN, Graph, Node
from smelt.ir.graph import layout_block as block_of
from smelt.ir.types import c_type
from smelt.target import Target


def _f32(g: Graph, *names: str) -> bool:
    return all(g.values[n].dtype is not None and np.dtype(g.values[n].dtype) == np.float32 for n in names)


def _dims(g: Graph, name: str) -> list[int]:
    return [int(d) for d in g.values[name].shape]


# ------------------------------------------------------------------------------------------
# LayoutTransform
# ------------------------------------------------------------------------------------------
# float32, and the 8-bit activations of the blocked int8 convolution (int_conv_nchwc.py)
TRANSFORM_DTYPES = ("float32", "uint8", "int8")


def _check_transform(node: Node, g: Graph) -> str | None:
    x, y = node.inputs[0], node.outputs[0]
    dtypes = {np.dtype(g.values[n].dtype).name if g.values[n].dtype is not None else None for n in (x, y)}
    if len(dtypes) != 1 or not dtypes <= set(TRANSFORM_DTYPES):
        return f"LayoutTransform moves one dtype of {TRANSFORM_DTYPES}"
    xs, ys = _dims(g, x), _dims(g, y)
    if xs != ys or len(xs) != 4:
        return f"LayoutTransform needs one 4-D shape ({xs} -> {ys})"
    bi, bo = block_of(g.values[x].layout), block_of(g.values[y].layout)
    if xs[1] % bi or xs[1] % bo:
        return f"{xs[1]} channels do not divide into blocks {bi} / {bo}"
    return None


@register("LayoutTransform", check=_check_transform, name="layout_transform", blocked=True, domain=SMELT_DOMAIN)
def emit_layout_transform(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, y = node.inputs[0], node.outputs[0]
    n, c, h, w = _dims(g, x)
    hw = h * w
    bi, bo = block_of(g.values[x].layout), block_of(g.values[y].layout)
    ct = c_type(g.values[x].dtype)
    P = 64
    # a work item moves every channel of one block of the coarser layout (lcm of the two blocks):
    # NCHW16c -> plain by single output channels read each input line 16 times, 400 items apart
    # on a 160x160 plane, after L2 had dropped it (1.5 ms for 96 channels, now a b x 64 tile that
    # stays in L1 both ways)
    grp = math.lcm(bi, bo)
    chunks = -(-hw // P)
    total = n * (c // grp) * chunks
    # element (n, ch, p) of a layout with block b sits at ((n*C/b + ch/b)*HW + p)*b + ch%b
    src = f"((nn * {c // bi} + ch / {bi}) * {hw}L + p) * {bi} + ch % {bi}"
    dst = f"((nn * {c // bo} + ch / {bo}) * {hw}L + p) * {bo} + ch % {bo}"
    # float32 between plain and one vector's block: lanes x lanes tiles transposed in registers
    # (csrc/smelt_vec.h; gcc's own vectorization of the strided copy spent a permute per element)
    vx = vector_isa(em.target, grp)
    tiled = (ct == "float" and min(bi, bo) == 1 and vx.vector and vx.lanes == grp and vx.has("f32_transpose"))
    body = ["    const long pt = p;  /* the scalar rest: the whole run, or the tail after the tiles */",
            f"    for (int l = 0; l < {grp}; ++l) {{",
            f"        const long ch = cg * {grp} + l;",
            f"        for (long p = pt; p < p1; ++p) Y[{dst}] = X[{src}];",
            "    }"]
    if tiled:
        # rows of the plain side: the group's channels, hw apart; of the blocked side: positions
        plain = f"((nn * {c} + cg * {grp}) * {hw}L + p)"
        blocked = f"((nn * {c // grp} + cg) * {hw}L + p) * {grp}"
        xs, ys = (blocked, plain) if bo == 1 else (plain, blocked)
        ss, ds = (grp, hw) if bo == 1 else (hw, grp)
        body = [f"    for (; p + {grp} <= p1; p += {grp}) "
                + vx.x("f32_transpose", src=f"X + {xs}", ss=str(ss), dst=f"Y + {ys}", ds=str(ds))] + body
    code = "\n".join([
        f"const {ct} *restrict X = {em.ptr(x)}; {ct} *restrict Y = {em.ptr(y)};",
        work_range(total, total > 1 and n * c * hw >= 4096, "lo", "hi"),
        "for (long it = lo; it < hi; ++it) {",
        f"    const long q = it % {chunks}, cg = (it / {chunks}) % {c // grp}, nn = it / {chunks * (c // grp)};",
        f"    const long p0 = q * {P}, p1 = SMELT_MIN(p0 + {P}, {hw}L);",
        "    long p = p0;",
        *body,
        "}"])
    em.schedule(algorithm=f"layout transform {g.values[x].layout} -> {g.values[y].layout}"
                + (f", {grp}x{grp} tiles transposed in registers" if tiled else ""),
                threads=f"static split over (image, {grp} channels, {P} positions)",
                layout=f"{g.values[x].layout} -> {g.values[y].layout}")
    em.step(code)


# ------------------------------------------------------------------------------------------
# Pooling
# ------------------------------------------------------------------------------------------
def _blocked_in(node: Node, g: Graph) -> int:
    return block_of(g.values[node.inputs[0]].layout)


def _check_pool(node: Node, g: Graph) -> str | None:
    x, y = node.inputs[0], node.outputs[0]
    if g.values[x].layout == PLAIN:
        return "plain input (the blocked pooling template reads NCHW<b>c)"
    if len(node.outputs) > 1 and node.outputs[1]:
        return "MaxPool's Indices output is computed on plain layouts only"
    if not _f32(g, x, y) or len(_dims(g, x)) != 4:
        return "blocked pooling is 2-D float32"
    if g.values[y].layout != g.values[x].layout:
        return f"blocked pooling keeps the layout ({g.values[x].layout} -> {g.values[y].layout})"
    geo, why = geometry(node, g)
    if geo is None:
        return why
    return None


def _block_vector(b: int, target: Target) -> Blocking | None:
    """The vector spelling for one channel block of ``b`` lanes on ``target``, or None when the
    block is not one vector there (then the kernels use scalar lane loops)."""
    vx = vector_isa(target, b)
    if vx.vector and vx.lanes == b:
        return Blocking(vx.name, b, 1, b, 1, 1, 1, fma=True)
    return None


def _all_nan_windows(out: str, b: int, scan: list[str], ind: str, any_inf: str | None = None) -> list[str]:
    """C lines setting to NaN the lanes of the ``b`` max-pool results at ``out`` whose window held
    only NaN (they came out -Inf: NaN never wins, see pool.py); ``scan`` ORs ``num[lane]`` over
    the window. Runs only when some lane is -Inf (``any_inf``: a vector test of that), which real
    data almost never makes."""
    head = [f"if ({any_inf}) {{"] if any_inf else [
        f"int any_inf = 0; for (int l = 0; l < {b}; ++l) any_inf |= ({out})[l] == -INFINITY;", "if (any_inf) {"]
    body = [*head, f"    int num[{b}] = {{0}};", *["    " + line for line in scan],
            f"    for (int l = 0; l < {b}; ++l) if (!num[l] && ({out})[l] == -INFINITY) ({out})[l] = NAN;", "}"]
    return [ind + line for line in body]


def _tap_range(o: str, name: str, stride: int, pad: int, dil: int, size: int, kernel: int,
               pad_end: int | None = None) -> str:
    """C declaring ``{name}l`` / ``{name}h``: the taps [lo, hi) of output index ``o`` inside
    [0, size) (``Geometry.valid_range``), or with ``pad_end`` inside the explicitly padded
    extent [-pad, size + pad_end) (``Geometry.padded_count``). Computed, not tabled: the code is
    the same for every size (codegen/shape_slots.py)."""
    lo_edge, hi_edge = (0, size) if pad_end is None else (-pad, size + pad_end)
    return (f"const long {name}s = (long){o} * {stride} - {pad}; "
            f"const int {name}l = {name}s >= {lo_edge} ? 0 : (int)(({lo_edge} - {name}s + {dil - 1}) / {dil}); "
            f"const long {name}e = {hi_edge} - {name}s <= 0 ? 0 : ({hi_edge} - {name}s + {dil - 1}) / {dil}; "
            f"const int {name}h = {name}e < {name}l ? {name}l : {name}e > {kernel} ? {kernel} : (int){name}e;")


@register(("MaxPool", "AveragePool"), versions=(10, 11, 12, 19, 22), check=_check_pool, name="pool_nchwc",
          blocked=True)
def emit_pool_nchwc(node: Node, g: Graph, em: BlockEmitter) -> None:
    geo, _ = geometry(node, g)
    assert geo is not None
    x, y = node.inputs[0], node.outputs[0]
    b = _blocked_in(node, g)
    n, c = geo.n, geo.c
    ih, iw = geo.ins
    oh, ow = geo.outs
    is_max = node.op == "MaxPool"
    include_pad = bool(node.attr("count_include_pad", 0))
    sh, sw = geo.strides
    dh, dw = geo.dilations
    ph, pw = geo.pads_begin
    kh_n, kw_n = geo.kernel
    total = n * (c // b) * oh
    init = "-INFINITY" if is_max else "0.0f"
    upd = "a[l] = v > a[l] ? v : a[l];" if is_max else "a[l] += v;"
    # a true division, as onnxruntime does (x * (1/n) can differ in the last bit)
    fin = "" if is_max else "const float cnt = (float)(CH * CW);"
    store = "a[l]" if is_max else "a[l] / cnt"
    # each row's and column's taps inside the image (and, for an average, the divisor: taps
    # inside the image, or inside the explicit padding with count_include_pad)
    row_taps = _tap_range("oy", "KH", sh, ph, dh, ih, kh_n)
    col_taps = _tap_range("ox", "KW", sw, pw, dw, iw, kw_n)
    counts = ""
    if not is_max:
        if include_pad:
            counts = (_tap_range("ox", "PW", sw, pw, dw, iw, kw_n, geo.pads_end[1])
                      + " const int CH = PHh - PHl, CW = PWh - PWl;")
        else:
            counts = "const int CH = KHh - KHl, CW = KWh - KWl;"
    L = [f"const float *restrict X = {em.ptr(x)}; float *restrict Y = {em.ptr(y)};"]
    L += [work_range(total, total > 1 and total * ow * b >= 4096, "lo", "hi"),
          "for (long it = lo; it < hi; ++it) {",
          f"    const long oy = it % {oh}, cbn = it / {oh};",
          f"    {row_taps}",
          f"    const float *restrict xb = X + cbn * {ih * iw * b}L;",
          f"    float *restrict yr = Y + it * {ow * b}L;"]
    if not is_max and include_pad:
        L.append("    " + _tap_range("oy", "PH", sh, ph, dh, ih, kh_n, geo.pads_end[0]))
    window_scan = ["for (int kh = KHl; kh < KHh; ++kh)",
                   "    for (int kw = KWl; kw < KWh; ++kw) {",
                   f"        const float *xp = xb + (oy * {sh} - {ph} + kh * {dh}) * {iw * b}L + (ox * {sw} - {pw} + kw * {dw}) * {b};",
                   f"        for (int l = 0; l < {b}; ++l) num[l] |= xp[l] == xp[l];",
                   "    }"]
    blk = _block_vector(b, em.target)
    if blk is not None:
        # one vector of channels per position; a window column that lies wholly inside the
        # image has a compile-time trip count (unrolled), edge columns use the tables
        v = blk.vx
        # max: max_ps(x, a) returns a when x is NaN, so NaN is skipped (see _all_nan_windows)
        acc = (lambda x: v.op("max", x, "a")) if is_max else (lambda x: v.op("add", x, "a"))
        any_inf = v.any_eq("a", v.set1("-INFINITY"))
        kw_full = geo.kernel[1]
        L += [f"    for (int ox = 0; ox < {ow}; ++ox) {{",
              f"        {v.t} a = {v.set1('-INFINITY') if is_max else v.zero()};",
              f"        {col_taps} const int kwl = KWl, kwh = KWh;",
              f"        {counts}",
              "        for (int kh = KHl; kh < KHh; ++kh) {",
              f"            const float *xr = xb + (oy * {sh} - {ph} + kh * {dh}) * {iw * b}L + (ox * {sw} - {pw}) * {b};",
              f"            if (kwl == 0 && kwh == {kw_full}) {{",
              f"                for (int kw = 0; kw < {kw_full}; ++kw) a = {acc(v.load(f'xr + kw * {dw * b}'))};",
              "            } else {",
              f"                for (int kw = kwl; kw < kwh; ++kw) a = {acc(v.load(f'xr + kw * {dw * b}'))};",
              "            }",
              "        }"]
        if is_max:
            L.append(f"        {v.store(f'yr + ox * {b}', 'a')}")
            L += _all_nan_windows(f"yr + ox * {b}", b, window_scan, "        ", any_inf)
        else:  # a true division, as onnxruntime does
            L.append(f"        {v.store(f'yr + ox * {b}', v.op('div', 'a', v.set1('(float)(CH * CW)')))}")
        L += ["    }", "}"]
    else:
        L += [f"    for (int ox = 0; ox < {ow}; ++ox) {{",
              f"        float a[{b}];",
              f"        {col_taps}",
              f"        {counts}",
              f"        for (int l = 0; l < {b}; ++l) a[l] = {init};",
              "        for (int kh = KHl; kh < KHh; ++kh) {",
              f"            const float *xr = xb + (oy * {sh} - {ph} + kh * {dh}) * {iw * b}L;",
              "            for (int kw = KWl; kw < KWh; ++kw) {",
              f"                const float *xp = xr + (ox * {sw} - {pw} + kw * {dw}) * {b};",
              f"                for (int l = 0; l < {b}; ++l) {{ const float v = xp[l]; {upd} }}",
              "            }",
              "        }",
              f"        {fin}",
              f"        for (int l = 0; l < {b}; ++l) yr[ox * {b} + l] = {store};"]
        if is_max:
            L += _all_nan_windows(f"yr + ox * {b}", b, window_scan, "        ")
        L += ["    }", "}"]
    em.schedule(algorithm=f"{node.op} on NCHW{b}c, lanes = channels",
                threads="static split over (image, channel block, output row)", layout=f"NCHW{b}c")
    em.step("\n".join(L))


def _check_global(node: Node, g: Graph) -> str | None:
    x, y = node.inputs[0], node.outputs[0]
    if g.values[x].layout == PLAIN:
        return "plain input (the blocked global pooling template reads NCHW<b>c)"
    if not _f32(g, x, y) or len(_dims(g, x)) != 4:
        return "blocked global pooling is 2-D float32"
    if g.values[y].layout != PLAIN:
        return "blocked global pooling writes a plain [N, C, 1, 1] output"
    return None


@register(("GlobalAveragePool", "GlobalMaxPool"), versions=(1, 22), check=_check_global,
          name="global_pool_nchwc", blocked=True)
def emit_global_pool_nchwc(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, y = node.inputs[0], node.outputs[0]
    n, c, h, w = _dims(g, x)
    b = block_of(g.values[x].layout)
    hw = h * w
    is_max = node.op == "GlobalMaxPool"
    init = "-INFINITY" if is_max else "0.0f"
    upd = "a[l] = v > a[l] ? v : a[l];" if is_max else "a[l] += v;"
    store = "a[l]" if is_max else f"a[l] / {float(hw)!r}f"
    total = n * (c // b)
    L = [f"const float *restrict X = {em.ptr(x)}; float *restrict Y = {em.ptr(y)};",
         work_range(total, total > 1 and n * c * hw >= 4096, "lo", "hi"),
         "for (long it = lo; it < hi; ++it) {",
         f"    const float *restrict xb = X + it * {hw * b}L;",
         f"    float a[{b}];",
         f"    for (int l = 0; l < {b}; ++l) a[l] = {init};"]
    if is_max or hw <= 64:
        L += [f"    for (long p = 0; p < {hw}; ++p)",
              f"        for (int l = 0; l < {b}; ++l) {{ const float v = xb[p * {b} + l]; {upd} }}"]
    else:
        # the sum in chunks of ~sqrt(hw) positions, each chunk's partial added to the total: one
        # running fp32 sum over a 160x160 plane (PP-OCRv6's detector) drifts by ~1e-4 of the mean
        # (every add rounds against an ever larger total), the chunked sum by ~1e-6
        chunk = max(8, math.isqrt(hw))
        L += [f"    for (long p0 = 0; p0 < {hw}; p0 += {chunk}) {{",
              f"        const long p1 = p0 + {chunk} < {hw} ? p0 + {chunk} : {hw};",
              f"        float s[{b}];",
              f"        for (int l = 0; l < {b}; ++l) s[l] = 0.0f;",
              "        for (long p = p0; p < p1; ++p)",
              f"            for (int l = 0; l < {b}; ++l) s[l] += xb[p * {b} + l];",
              f"        for (int l = 0; l < {b}; ++l) a[l] += s[l];",
              "    }"]
    L.append(f"    for (int l = 0; l < {b}; ++l) Y[it * {b} + l] = {store};")  # [n][cb][l] == [n][c]
    if is_max:
        L += _all_nan_windows(f"Y + it * {b}", b, [f"for (long p = 0; p < {hw}; ++p)",
                                                   f"    for (int l = 0; l < {b}; ++l) num[l] |= xb[p * {b} + l] == xb[p * {b} + l];"],
                              "    ")
    L.append("}")
    em.schedule(algorithm=f"{node.op} on NCHW{b}c", threads="static split over (image, channel block)",
                layout=f"NCHW{b}c -> plain (same bytes for a 1x1 plane)")
    em.step("\n".join(L))


# ------------------------------------------------------------------------------------------
# BatchNormalization
# ------------------------------------------------------------------------------------------
def _check_bn(node: Node, g: Graph) -> str | None:
    x, y = node.inputs[0], node.outputs[0]
    if g.values[x].layout == PLAIN:
        return "plain input (the blocked BatchNormalization reads NCHW<b>c)"
    if node.attr("training_mode", 0) or any(node.outputs[1:]):
        return "training-mode BatchNormalization"
    if len(node.present_inputs()) != 5 or any(g.const(i) is None for i in node.inputs[1:5]):
        return "blocked BatchNormalization needs constant statistics"
    if not _f32(g, x, y) or len(_dims(g, x)) != 4 or g.values[y].layout != g.values[x].layout:
        return "blocked BatchNormalization is 4-D float32, layout kept"
    for e in node.epilogue:
        if e.input and e.broadcast == "full" and g.values[e.input].layout != g.values[y].layout:
            return f"epilogue operand {e.input!r} is in another layout"
    return None


@register("BatchNormalization", versions=(9, 14, 15), check=_check_bn, name="batchnorm_nchwc", blocked=True)
def emit_batchnorm_nchwc(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, y = node.inputs[0], node.outputs[0]
    n, c, h, w = _dims(g, x)
    b = block_of(g.values[x].layout)
    hw = h * w
    eps = float(node.attr("epsilon", 1e-5))
    scale, bias, mean, var = (np.asarray(g.const(i), np.float64).reshape(-1) for i in node.inputs[1:5])
    with np.errstate(all="ignore"):  # NaN/Inf parameters give NaN/Inf, as computed at run time
        s = scale / np.sqrt(var + eps)
        shift = bias - mean * s
    sc = em.weight(s.astype(np.float32))
    sh = em.weight(shift.astype(np.float32))
    total = n * (c // b)
    L = [f"const float *restrict X = {em.ptr(x)}; float *restrict Y = {em.ptr(y)};",
         f"const float *restrict SC = {sc}; const float *restrict SH = {sh};",
         work_range(total, total > 1 and n * c * hw >= 4096, "lo", "hi"),
         "for (long it = lo; it < hi; ++it) {",
         f"    const long ch = (it % {c // b}) * {b};"]
    ep = TileEpilogue(node_epilogue_ops(em, node, "col"))
    blk = _block_vector(b, em.target)
    vec = None
    if blk is not None:
        vec = vector_epilogue_stmts(ep, em, blk, "v", None, f"it * {hw * b}L + p * {b}", "0", "ch") \
            if not ep.empty() else []
    if vec is not None:
        v = blk.vx
        L += [f"    const {v.t} s = {v.loadu('SC + ch')}, t = {v.loadu('SH + ch')};",
              f"    for (long p = 0; p < {hw}; ++p) {{",
              f"        {v.t} v = {v.fmadd(v.loadu(f'X + it * {hw * b}L + p * {b}'), 's', 't')};"]
        L += ["        " + st for st in vec]
        L += [f"        {v.storeu(f'Y + it * {hw * b}L + p * {b}', 'v')}", "    }"]
    else:
        flat = f"(it * {hw * b}L + p * {b} + l)"
        expr = scalar_epilogue(ep, em, "v", flat, "0", "(ch + l)")
        L += [f"    for (long p = 0; p < {hw}; ++p)",
              f"        for (int l = 0; l < {b}; ++l) {{ const float v = X[{flat}] * SC[ch + l] + SH[ch + l]; "
              f"Y[{flat}] = {expr}; }}"]
    L.append("}")
    em.schedule(algorithm=f"BatchNormalization on NCHW{b}c (scale/shift folded)", layout=f"NCHW{b}c",
                threads="static split over (image, channel block)")
    em.schedule(epilogue=epilogue_doc(node))
    em.step("\n".join(L))


# ------------------------------------------------------------------------------------------
# DepthToSpace from a blocked input
# ------------------------------------------------------------------------------------------
def _check_d2s_nchwc(node: Node, g: Graph) -> str | None:
    x, y = node.inputs[0], node.outputs[0]
    if g.values[x].layout == PLAIN:
        return "plain input (the plain DepthToSpace template takes it)"
    if g.values[y].layout != PLAIN:
        return "the blocked DepthToSpace writes a plain output"
    if not _f32(g, x, y) or len(_dims(g, x)) != 4:
        return "blocked DepthToSpace is 4-D float32"
    r = int(node.attr("blocksize", 0))
    if r < 1 or _dims(g, x)[1] % (r * r):
        return "channels not divisible by blocksize^2"
    if node.attr("mode", "DCR") not in ("DCR", "CRD"):
        return f"unknown mode {node.attr('mode')!r}"
    return None


# positions per DepthToSpace work item: the transposed tiles of every input channel for them
# stay in L1 (96 channels x 64 positions = 24 KiB)
D2S_POSITIONS = 64


@register("DepthToSpace", versions=(1, 11, 13), check=_check_d2s_nchwc, name="depth_to_space_nchwc", blocked=True)
def emit_depth_to_space_nchwc(node: Node, g: Graph, em: BlockEmitter) -> None:
    """DepthToSpace reading NCHW<b>c and writing plain NCHW: what a ConvTranspose whose stride
    equals its kernel becomes (passes/deconv_as_conv.py: a blocked 1x1 conv, then this), without
    the LayoutTransform to plain in between.

    Where the block is one vector with a register transpose (csrc/smelt_vec.h): work items are
    (image, input row, run of D2S_POSITIONS columns); each transposes the run's b x b tiles of
    every channel block into a per-thread buffer (channel-major, in L1), then writes each output
    row segment from the r buffer rows that interleave into it (constant r: gcc vectorizes the
    interleaved stores); a run's ragged end (fewer than b columns) is copied element by element.
    The scalar form read one float per 64-byte line, at a stride of b floats: 0.77-1.04 ms of the
    PP-OCR detectors. It remains for other blocks and for rows narrower than a block: items
    (image, input row, output channel), an element-by-element copy."""
    x, y = node.inputs[0], node.outputs[0]
    n, c, h, w = _dims(g, x)
    b = block_of(g.values[x].layout)
    r = int(node.attr("blocksize"))
    cc = c // (r * r)
    dcr = node.attr("mode", "DCR") == "DCR"
    vx = vector_isa(em.target, b)
    def channel(j: str) -> str:
        """C expression: the input channel of output channel k at sub-position (i, j)."""
        return f"(i * {r} + {j}) * {cc} + k" if dcr else f"k * {r * r} + i * {r} + {j}"

    ch = channel("j")
    tiled = vx.vector and vx.lanes == b and vx.has("f32_transpose") and w >= b
    if not tiled:
        total = n * h * cc
        code = "\n".join([
            f"const float *restrict X = {em.ptr(x)}; float *restrict Y = {em.ptr(y)};",
            work_range(total, total > 1 and n * c * h * w >= 4096, "lo", "hi"),
            "for (long it = lo; it < hi; ++it) {",
            f"    const long k = it % {cc}, yy = (it / {cc}) % {h}, nn = it / {cc * h};",
            f"    for (int i = 0; i < {r}; ++i) {{",
            f"        float *restrict yr = Y + ((nn * {cc} + k) * {h * r} + yy * {r} + i) * {w * r}L;",
            f"        for (int j = 0; j < {r}; ++j) {{",
            f"            const long ch = {ch};",
            f"            const float *restrict xr = X + ((nn * {c // b} + ch / {b}) * {h * w}L + yy * {w}) * {b} + ch % {b};",
            f"            for (long xx = 0; xx < {w}; ++xx) yr[xx * {r} + j] = xr[xx * {b}];",
            "        }",
            "    }",
            "}"])
        em.schedule(algorithm=f"DepthToSpace {g.values[x].layout} -> plain, blocksize {r}",
                    threads="static split over (image, input row, output channel)",
                    layout=f"{g.values[x].layout} -> plain")
        em.step(code)
        return
    P = min(D2S_POSITIONS, w // b * b)  # whole tiles per run; the ragged end element by element
    runs = -(-w // P)
    total = n * h * runs
    buf = em.scratch(em.n_threads * c * P * 4)
    # the r source rows of output row (k, i), j = 0 .. r-1, as the buffer's channel rows
    ch_of = [channel(str(jj)) for jj in range(r)]
    stores = " ".join(f"yr[px * {r} + {jj}] = t{jj}[px];" for jj in range(r))
    tail_stores = " ".join(f"yr[px * {r} + {jj}] = X[xb{jj} + px * {b}];" for jj in range(r))
    code = "\n".join([
        f"const float *restrict X = {em.ptr(x)}; float *restrict Y = {em.ptr(y)};",
        f"float *restrict T = {buf} + (long)tid * {c * P};",
        work_range(total, total > 1 and n * c * h * w >= 4096, "lo", "hi"),
        "for (long it = lo; it < hi; ++it) {",
        f"    const long q = it % {runs}, yy = (it / {runs}) % {h}, nn = it / {runs * h};",
        f"    const long x0 = q * {P}, nx = SMELT_MIN({P}, {w} - x0), whole = nx / {b} * {b};",
        "    /* the run's whole tiles of every channel block, channel-major: T[ch][px] */",
        f"    for (long cb = 0; cb < {c // b}; ++cb)",
        f"        for (long px = 0; px < whole; px += {b}) "
        + vx.x("f32_transpose", src=f"X + ((nn * {c // b} + cb) * {h * w}L + yy * {w} + x0 + px) * {b}",
               ss=str(b), dst=f"T + cb * {b * P} + px", ds=str(P)),
        f"    for (long k = 0; k < {cc}; ++k) {{",
        f"        for (int i = 0; i < {r}; ++i) {{",
        f"            float *restrict yr = Y + ((nn * {cc} + k) * {h * r} + yy * {r} + i) * {w * r}L + x0 * {r};",
        "            const float " + ", ".join(f"*restrict t{jj} = T + ({e}) * {P}" for jj, e in enumerate(ch_of)) + ";",
        f"            for (long px = 0; px < whole; ++px) {{ {stores} }}",
        "            if (whole < nx) {  /* the row's ragged end, element by element */",
        "                " + " ".join(
            f"const long xb{jj} = ((nn * {c // b} + ({e}) / {b}) * {h * w}L + yy * {w} + x0) * {b} + ({e}) % {b};"
            for jj, e in enumerate(ch_of)),
        f"                for (long px = whole; px < nx; ++px) {{ {tail_stores} }}",
        "            }",
        "        }",
        "    }",
        "}"])
    em.schedule(algorithm=f"DepthToSpace {g.values[x].layout} -> plain, blocksize {r}, {b}x{b} tiles transposed "
                f"in registers, rows interleaved from L1",
                threads=f"static split over (image, input row, {P} columns)",
                layout=f"{g.values[x].layout} -> plain")
    em.step(code)
