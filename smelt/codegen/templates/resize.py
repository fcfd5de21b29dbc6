"""Resize (opsets 11-19): nearest, linear and cubic interpolation over the last two axes, in plain
NCHW and in blocked NCHW<b>c layouts (where it sits between convolutions, as in FPN necks).

Shapes are static, so every output coordinate's source taps are computed at compile time, per
resized axis, into tables (``resize_taps``): T source indices and T weights per output index
(T = 1 nearest, 2 linear, 4 cubic). The kernel then only gathers: for each output row, the T row
taps times, for each output column, the T column taps, ``sum_a sum_b (wy[a] * wx[b]) * x[..]``
(the weight product first, as onnxruntime's bilinear kernel does). Nearest copies elements of any
native type; linear and cubic are float32.

Coordinates follow onnxruntime (upsamplebase.h) in float32: the scale is the ``scales`` operand,
or output/input length when ``sizes`` is given; ``coordinate_transformation_mode`` maps an
output index to a source coordinate; nearest rounds it by ``nearest_mode`` and clamps it; linear
clamps the coordinate to [0, L-1] and takes the two neighbours (0.5/0.5 on the last one); cubic
takes the four neighbours of floor(x) with Keys' coefficients (``cubic_coeff_a``), indices
clamped to the edge, or with ``exclude_outside`` the outside taps' weights zeroed and the rest
renormalized.

Also native, each still only a tap table:
- ``antialias`` when downscaling (linear/cubic): onnxruntime's (Pillow's) filter, whose support
  widens by 1/scale, so T = the window (ceil(support) * 2 + 1); each output's weights are the
  filter over the window normalized to sum 1, taps outside the image folded onto the edge pixel
  (or dropped and renormalized with ``exclude_outside``); unused taps have weight 0;
- ``keep_aspect_ratio_policy`` not_larger / not_smaller: with ``sizes``, one scale for every
  resized axis (the smallest / largest of size/input), the output round(scale * input);
- ``tf_crop_and_resize``: coordinates from ``roi`` (a constant, or a graph input the model is
  specialized for); an output whose coordinate on either axis lies outside the image is
  ``extrapolation_value`` (per-axis compile-time flags).
Not native (falls back, with the reason): leading axes that are resized, antialias together
with tf_crop_and_resize.
"""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import BlockEmitter
from smelt.codegen.kernels.loops import work_range
from smelt.codegen.registry import register
from smelt.ir.graph import PLAIN, Graph, Node, layout_block
from smelt.ir.types import has_c_type

TAPS = {"nearest": 1, "linear": 2, "cubic": 4}
COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
                    "tf_half_pixel_for_nn", "tf_crop_and_resize")
POLICIES = ("stretch", "not_larger", "not_smaller")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
PARALLEL_MIN_OUTPUTS = 1 << 14  # below this an output is one thread's work (a barrier costs more)


def _attr(node: Node, name: str, default):
    v = node.attr(name, default)
    return v.decode() if isinstance(v, bytes) else v


def _scales(node: Node, g: Graph) -> tuple[list[float] | None, str | None]:
    """Per-axis float32 scales, or None and the reason."""
    x, y = g.values[node.inputs[0]], g.values[node.outputs[0]]
    rank = len(x.shape)
    ins = node.inputs + [""] * (4 - len(node.inputs))
    scales_in, sizes_in = ins[2], ins[3]
    axes = _attr(node, "axes", None)
    axes = [a + rank if a < 0 else a for a in axes] if axes else list(range(rank))
    given = None
    if scales_in and g.values[scales_in].const is not None and g.values[scales_in].size > 0:
        given = [float(s) for s in np.asarray(g.values[scales_in].const, np.float32).ravel()]
    elif sizes_in and g.values[sizes_in].const is not None and g.values[sizes_in].size > 0:
        given = None  # scales follow from the static output shape below
    elif (scales_in and g.values[scales_in].const is None) or (sizes_in and g.values[sizes_in].const is None):
        return None, "Resize's scales/sizes are known only at run time"
    scales = [1.0] * rank
    policy = _attr(node, "keep_aspect_ratio_policy", "stretch")
    if given is None and policy != "stretch":
        return _policy_scales(node, g, axes, policy)
    for k, axis in enumerate(axes):
        if given is not None:
            if len(given) != len(axes):
                return None, f"Resize has {len(given)} scales for {len(axes)} axes"
            scales[axis] = given[k]
        else:  # onnxruntime: the scale of a sizes-given axis is float(out) / float(in)
            scales[axis] = float(np.float32(y.shape[axis]) / np.float32(x.shape[axis])) if x.shape[axis] else 1.0
    return scales, None


def _policy_scales(node: Node, g: Graph, axes: list[int], policy: str) -> tuple[list[float] | None, str | None]:
    """keep_aspect_ratio_policy with ``sizes`` (onnxruntime's AdjustOutputSizeAsPolicy): every
    resized axis takes the smallest (not_larger) or largest (not_smaller) size/input ratio, and
    its output is round(scale * input); the inferred output shape must agree."""
    x, y = g.values[node.inputs[0]], g.values[node.outputs[0]]
    if any(a < 0 for a in (_attr(node, "axes", None) or [])):
        # onnxruntime 1.32 matches the policy's axes against 0..rank-1 as written, so negative
        # ones are left unresized there, against onnx's shape inference: no answer to agree with
        return None, f"Resize {policy} with negative axes"
    sizes = [int(v) for v in np.asarray(g.values[node.inputs[3]].const).ravel()]
    if len(sizes) != len(axes) or any(x.shape[a] == 0 for a in axes):
        return None, f"Resize has {len(sizes)} sizes for {len(axes)} axes"
    ratios = [np.float32(sz) / np.float32(x.shape[a]) for sz, a in zip(sizes, axes, strict=True)]
    scale = np.float32(min(ratios) if policy == "not_larger" else max(ratios))
    scales = [1.0] * len(x.shape)
    for a in axes:
        scales[a] = float(scale)
        want = int(np.round(np.float64(np.float32(scale * np.float32(x.shape[a])))))
        if want != y.shape[a]:
            return None, f"Resize {policy} gives {want} on axis {a}, the inferred shape {y.shape[a]}"
    return scales, None


def _original(ctm: str, out_idx: np.ndarray, scale: np.float32, in_len: int, out_len: int,
              roi: tuple[float, float] = (0.0, 1.0)) -> np.ndarray:
    """Source coordinates of output indices, in float32 as onnxruntime computes them (``roi``:
    this axis' start and end, for tf_crop_and_resize)."""
    f = np.float32
    x = out_idx.astype(np.float32)
    if ctm == "tf_crop_and_resize":
        start, end = f(roi[0]), f(roi[1])
        if out_len > 1:
            return start * f(in_len - 1) + (x * (end - start) * f(in_len - 1)) / f(out_len - 1)
        # onnxruntime's 0.5 is a double literal: that branch is double arithmetic
        return np.full_like(x, np.float32(0.5 * np.float64(start + end) * (in_len - 1)))
    if ctm == "asymmetric":
        return x / scale
    if ctm == "half_pixel":
        return (x + f(0.5)) / scale - f(0.5)
    if ctm == "pytorch_half_pixel":
        return (x + f(0.5)) / scale - f(0.5) if out_len > 1 else np.zeros_like(x)
    if ctm == "tf_half_pixel_for_nn":
        return (x + f(0.5)) / scale
    if ctm == "align_corners":
        return x * f(in_len - 1) / f(out_len - 1) if out_len > 1 else np.zeros_like(x)
    if ctm == "half_pixel_symmetric":
        adjustment = f(out_len) / (scale * f(in_len))
        center = f(in_len) / f(2)
        offset = center * (f(1) - adjustment)
        # onnxruntime adds the half pixels as double literals: that part is double arithmetic
        d = np.float64
        return (d(offset) + (x.astype(d) + 0.5) / d(scale) - 0.5).astype(np.float32)
    raise ValueError(ctm)


def _cubic_coeffs(s: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution weights of the taps at floor(x) - 1 .. floor(x) + 2 (s = x - floor(x))."""
    f = np.float32
    a = f(a)
    s = np.abs(s).astype(np.float32)
    s1, t, t1 = s + f(1), f(1) - s, f(2) - s
    return np.stack([((a * s1 - f(5) * a) * s1 + f(8) * a) * s1 - f(4) * a,
                     ((a + f(2)) * s - (a + f(3))) * s * s + f(1),
                     ((a + f(2)) * t - (a + f(3))) * t * t + f(1),
                     ((a * t1 - f(5) * a) * t1 + f(8) * a) * t1 - f(4) * a], axis=1).astype(np.float32)


def _aa_filter(mode: str, x: np.float32, a: np.float32) -> np.float32:
    """onnxruntime's antialias filters (Pillow's): the triangle, or Keys' cubic with ``a``."""
    f = np.float32
    x = abs(x)
    if mode == "linear":
        return f(1) - x if x < f(1) else f(0)
    if x < f(1):
        return ((a + f(2)) * x - (a + f(3))) * x * x + f(1)
    if x < f(2):
        return (((x - f(5)) * x + f(8)) * x - f(4)) * a
    return f(0)


def antialias_taps(mode: str, ctm: str, in_len: int, out_len: int, scale: float, cubic_a: float = -0.75,
                   exclude_outside: bool = False, roi: tuple[float, float] = (0.0, 1.0)) -> tuple[np.ndarray, np.ndarray]:
    """Antialiased taps along one axis, as onnxruntime's SetupUpsampleFilterAntiAlias computes
    them in float32: (indices [out_len, T] int32, weights [out_len, T] float32), T the filter
    window; unused taps repeat the first tap with weight 0 (so a NaN reaches an output only
    through a pixel onnxruntime reads for it too). An axis that keeps its length is copied, as
    onnxruntime copies it (one tap)."""
    f = np.float32
    if in_len == out_len:
        return np.arange(out_len, dtype=np.int32)[:, None], np.ones((out_len, 1), np.float32)
    rscale = f(scale)
    inv = f(1) / rscale  # > 1 when downscaling: the filter's support widens by it
    support = (f(1 if mode == "linear" else 2)) * (inv if inv >= f(1) else f(1))
    window = int(np.ceil(support)) * 2 + 1
    inv_scale = f(1) / inv if inv >= f(1) else f(1)
    a = f(cubic_a)
    idx = np.zeros((out_len, window), np.int32)
    wts = np.zeros((out_len, window), np.float32)
    orig = _original(ctm, np.arange(out_len), rscale, in_len, out_len, roi)
    for i in range(out_len):
        center = f(0.5) + (f(i) if inv == f(1) else orig[i])
        lo_real = int(np.floor(center - support + f(0.5)))
        hi_real = int(np.floor(center + support + f(0.5)))
        hi_real = lo_real + min(max(hi_real - lo_real, 0), window)
        lo_cut, hi_cut = min(max(lo_real, 0), in_len), min(max(hi_real, 0), in_len)
        lo, hi = (lo_cut, hi_cut) if exclude_outside else (lo_real, hi_real)
        buf = np.zeros(window, np.float32)
        total = f(0)
        n = hi - lo
        for k in range(n):
            w = _aa_filter(mode, (f(k + lo) - center + f(0.5)) * inv_scale, a)
            buf[k] = w
            total = f(total + w)
        if not exclude_outside and lo_cut < hi_cut:
            neg = min(max(-lo, 0), n - 1)  # taps before the image fold onto its first pixel
            for k in range(neg):
                buf[neg] += buf[k]
            past = min(max(n + lo - in_len, 0), n - 1)  # and those after it onto its last
            for k in range(n - past, n):
                buf[n - past - 1] += buf[k]
            if neg or past:
                buf[:hi_cut - lo_cut] = buf[neg:neg + hi_cut - lo_cut].copy()
        scale_inv = f(1) if total == f(0) else f(1) / total
        idx[i, :] = min(lo_cut, in_len - 1)
        for k in range(hi_cut - lo_cut):
            idx[i, k] = lo_cut + k
            wts[i, k] = buf[k] * scale_inv
    return idx, wts


def outside_flags(ctm: str, in_len: int, out_len: int, scale: float, roi: tuple[float, float]) -> np.ndarray:
    """tf_crop_and_resize: which output indices map outside [0, in_len - 1] (they take
    extrapolation_value, as onnxruntime decides on the unrounded coordinate)."""
    x = _original(ctm, np.arange(out_len), np.float32(scale), in_len, out_len, roi)
    return (x < 0) | (x > np.float32(in_len - 1))


def resize_taps(mode: str, ctm: str, nearest_mode: str, in_len: int, out_len: int, scale: float,
                cubic_a: float = -0.75, exclude_outside: bool = False,
                roi: tuple[float, float] = (0.0, 1.0)) -> tuple[np.ndarray, np.ndarray]:
    """Per output index along one axis: (source indices [out_len, T] int32, weights [out_len, T]
    float32), T = TAPS[mode]."""
    x = _original(ctm, np.arange(out_len), np.float32(scale), in_len, out_len, roi)
    last = in_len - 1
    if mode == "nearest":
        if nearest_mode == "round_prefer_floor":
            idx = np.where(x == np.floor(x) + np.float32(0.5), np.floor(x), np.round(x))
        elif nearest_mode == "round_prefer_ceil":  # std::round: halves away from zero
            idx = np.where(x >= 0, np.floor(x + np.float32(0.5)), np.ceil(x - np.float32(0.5)))
        elif nearest_mode == "floor":
            idx = np.floor(x)
        else:
            idx = np.ceil(x)
        idx = np.clip(idx, 0, last).astype(np.int32)[:, None]
        return idx, np.ones_like(idx, np.float32)
    if mode == "linear":
        xc = np.clip(x, np.float32(0), np.float32(last))
        x1 = np.minimum(xc.astype(np.int32), last)
        x2 = np.minimum(x1 + 1, last)
        d1 = np.abs(xc - x1.astype(np.float32))  # weight of x2
        d2 = np.abs(xc - x2.astype(np.float32))  # weight of x1
        same = x1 == x2
        d1, d2 = np.where(same, np.float32(0.5), d1), np.where(same, np.float32(0.5), d2)
        return np.stack([x1, x2], 1).astype(np.int32), np.stack([d2, d1], 1).astype(np.float32)
    base = np.floor(x).astype(np.int64)
    w = _cubic_coeffs(x - base.astype(np.float32), cubic_a)
    taps = base[:, None] + np.arange(-1, 3)[None, :]
    if exclude_outside:
        w = np.where((taps < 0) | (taps > last), np.float32(0), w)
        w = (w / w.sum(axis=1, keepdims=True)).astype(np.float32)
    return np.clip(taps, 0, last).astype(np.int32), w.astype(np.float32)


def _identity(idx: np.ndarray, w: np.ndarray) -> bool:
    """The taps copy index i to output i exactly (the weights on i sum to 1, all others are 0)."""
    n = idx.shape[0]
    own = idx == np.arange(n)[:, None]
    return bool(np.all(np.where(own, 0.0, w) == 0.0) and np.all(np.where(own, w, 0.0).sum(axis=1) == 1.0))


def _plan(node: Node, g: Graph):
    """(mode, per-axis tables of the last two axes, leading planes) or a reason string."""
    x, y = g.values[node.inputs[0]], g.values[node.outputs[0]]
    mode = _attr(node, "mode", "nearest")
    ctm = _attr(node, "coordinate_transformation_mode", "half_pixel")
    nearest_mode = _attr(node, "nearest_mode", "round_prefer_floor")
    if mode not in TAPS:
        return f"Resize mode {mode!r}"
    if ctm not in COORDINATE_MODES:
        return f"Resize coordinate_transformation_mode {ctm!r} is not native"
    if mode == "nearest" and nearest_mode not in NEAREST_MODES:
        return f"Resize nearest_mode {nearest_mode!r}"
    policy = _attr(node, "keep_aspect_ratio_policy", "stretch")
    if policy not in POLICIES:
        return f"Resize keep_aspect_ratio_policy {policy!r}"
    scales, why = _scales(node, g)
    if scales is None:
        return why
    antialias = bool(_attr(node, "antialias", 0)) and mode != "nearest"
    if antialias and ctm == "tf_crop_and_resize":
        return "antialias with tf_crop_and_resize is not native"
    rank = len(x.shape)
    if rank < 1 or any(s <= 0 for s in scales):
        return "Resize needs positive scales and rank >= 1"
    rois = _rois(node, g, rank) if ctm == "tf_crop_and_resize" else [(0.0, 1.0)] * rank
    if isinstance(rois, str):
        return rois
    tables, flags = [], []
    for axis in range(rank):
        in_len, out_len = int(x.shape[axis]), int(y.shape[axis])
        if in_len == 0 or out_len == 0:
            return "empty tensor"
        args = (in_len, out_len, scales[axis], float(_attr(node, "cubic_coeff_a", -0.75)),
                bool(_attr(node, "exclude_outside", 0)))
        if antialias:
            idx, w = antialias_taps(mode, ctm, *args, roi=rois[axis])
        else:
            idx, w = resize_taps(mode, ctm, nearest_mode, *args, roi=rois[axis])
        out = outside_flags(ctm, in_len, out_len, scales[axis], rois[axis]) if ctm == "tf_crop_and_resize" else None
        if axis < rank - 2 and (in_len != out_len or not _identity(idx, w) or (out is not None and out.any())):
            return "Resize of a leading axis (only the last two axes are native)"
        tables.append((idx, w))
        flags.append(out)
    if rank < 2:
        return mode, tables, flags
    return mode, tables[-2:], flags[-2:]


def _rois(node: Node, g: Graph, rank: int) -> list[tuple[float, float]] | str:
    """tf_crop_and_resize's (start, end) per axis from the ``roi`` operand (its ``axes`` only,
    when given; the others 0 and 1)."""
    name = node.inputs[1] if len(node.inputs) > 1 else ""
    if not name or g.values[name].const is None:
        return "tf_crop_and_resize needs roi as a constant (or a graph input the model is specialized for)"
    roi = [float(v) for v in np.asarray(g.values[name].const, np.float32).ravel()]
    axes = _attr(node, "axes", None)
    axes = [a + rank if a < 0 else a for a in axes] if axes else list(range(rank))
    if len(roi) != 2 * len(axes):
        return f"Resize roi has {len(roi)} values for {len(axes)} axes"
    out = [(0.0, 1.0)] * rank
    for k, a in enumerate(axes):
        out[a] = (roi[k], roi[k + len(axes)])
    return out


def _check_resize(node: Node, g: Graph) -> str | None:
    x, y = g.values[node.inputs[0]], g.values[node.outputs[0]]
    if x.dtype is None or not has_c_type(x.dtype) or y.dtype != x.dtype:
        return "Resize needs a native dtype"
    plan = _plan(node, g)
    if isinstance(plan, str):
        return plan
    mode = plan[0]
    if mode != "nearest" and np.dtype(x.dtype) != np.float32:
        return f"{mode} Resize is native for float32 only"
    if x.layout != PLAIN or y.layout != PLAIN:
        if x.layout != y.layout or len(x.shape) != 4:
            return "blocked Resize keeps one NCHW<b>c layout on 4-D values"
    return None


@register("Resize", versions=(11, 13, 18, 19), check=_check_resize, name="resize", blocked=True)
def emit_resize(node: Node, g: Graph, em: BlockEmitter) -> None:
    xv, yv = g.values[node.inputs[0]], g.values[node.outputs[0]]
    mode, tables, flags = _plan(node, g)  # type: ignore[misc]
    if len(tables) == 1:  # rank 1: one row
        tables = [(np.zeros((1, 1), np.int32), np.ones((1, 1), np.float32))] + tables
        flags = [None] + flags
    fy, fx = flags
    (iy, wy), (ix, wx) = tables
    shape_in, shape_out = list(xv.shape), list(yv.shape)
    ih, iw = (shape_in[-2], shape_in[-1]) if len(shape_in) >= 2 else (1, shape_in[-1])
    oh, ow = (shape_out[-2], shape_out[-1]) if len(shape_out) >= 2 else (1, shape_out[-1])
    block = layout_block(xv.layout) if xv.layout != PLAIN else 1
    planes = int(np.prod(shape_out[:-2], dtype=np.int64)) if len(shape_out) > 2 else 1
    planes //= block  # NCHW<b>c: each plane holds b channels, interleaved per pixel
    th, tw = iy.shape[1], ix.shape[1]
    # element offsets (pixel index * block) so the kernel adds no multiply per tap
    rows = em.weight((iy.astype(np.int64) * iw * block).astype(np.int32).ravel())
    cols = em.weight((ix.astype(np.int64) * block).astype(np.int32).ravel())
    total = planes * oh
    L = [f"const __typeof__(*{em.ptr(node.inputs[0])}) *restrict X = {em.ptr(node.inputs[0])};",
         f"__typeof__(*{em.ptr(node.outputs[0])}) *restrict Y = (void *){em.ptr(node.outputs[0])};",
         f"const int *restrict ry = {rows};",
         f"const int *restrict cx = {cols};",
         work_range(total, planes * oh * ow * block >= PARALLEL_MIN_OUTPUTS),
         "for (long t = wb; t < we; ++t) {",
         f"    const long p = t / {oh}, oy = t % {oh};",
         f"    const __typeof__(*X) *restrict x = X + p * {ih * iw * block}L;",
         f"    __typeof__(*Y) *restrict y = Y + t * {ow * block}L;"]
    if mode == "nearest":
        L += ["    const __typeof__(*X) *restrict xr = x + ry[oy];",
              f"    for (long ox = 0; ox < {ow}; ++ox)",
              f"        for (long c = 0; c < {block}; ++c) y[ox * {block} + c] = xr[cx[ox] + c];"]
    else:
        wyp, wxp = em.weight(wy.ravel()), em.weight(wx.ravel())
        L += [f"    const float *restrict wy = {wyp} + oy * {th};",
              f"    const float *restrict wx = {wxp};",
              f"    const float *restrict xr[{th}];",
              f"    for (int a = 0; a < {th}; ++a) xr[a] = x + ry[oy * {th} + a];",
              f"    for (long ox = 0; ox < {ow}; ++ox) {{",
              f"        const int *restrict c0 = cx + ox * {tw};",
              f"        const float *restrict w0 = wx + ox * {tw};",
              f"        for (long c = 0; c < {block}; ++c) {{",
              "            float acc = 0.0f;",
              f"            for (int a = 0; a < {th}; ++a)",
              f"                for (int b = 0; b < {tw}; ++b) acc += (wy[a] * w0[b]) * xr[a][c0[b] + c];",
              f"            y[ox * {block} + c] = acc;",
              "        }",
              "    }"]
    if (fy is not None and fy.any()) or (fx is not None and fx.any()):
        # tf_crop_and_resize: outputs whose coordinate left the image on either axis take
        # extrapolation_value (their taps were clamped inside, so the pass above read nothing out)
        fy = fy if fy is not None else np.zeros(oh, bool)
        fx = fx if fx is not None else np.zeros(ow, bool)
        ext = float(_attr(node, "extrapolation_value", 0.0))
        ext_c = "NAN" if np.isnan(ext) else ("INFINITY" if ext > 0 else "-INFINITY") if np.isinf(ext) else f"{ext!r}"
        L += [f"    const unsigned char *restrict oy_out = {em.weight(fy.astype(np.uint8))};",
              f"    const unsigned char *restrict ox_out = {em.weight(fx.astype(np.uint8))};",
              f"    const __typeof__(*Y) ext = (__typeof__(*Y))({ext_c});",
              f"    if (oy_out[oy]) {{ for (long i = 0; i < {ow * block}; ++i) y[i] = ext; }}",
              f"    else for (long ox = 0; ox < {ow}; ++ox)",
              f"        if (ox_out[ox]) for (long c = 0; c < {block}; ++c) y[ox * {block} + c] = ext;"]
    L.append("}")
    em.schedule(algorithm=f"{mode} Resize by compile-time tap tables ({th}x{tw} taps)",
                layout=xv.layout if xv.layout != PLAIN else "NCHW",
                shape=f"{ih}x{iw} -> {oh}x{ow}, {planes} planes")
    em.step("\n".join(L), name=f"resize_{mode}")
