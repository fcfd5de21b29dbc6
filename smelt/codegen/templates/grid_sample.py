"""GridSample (opsets 16, 20, 22; 2-D all modes, 3-D nearest and linear) and AffineGrid (opset
20; 2-D and 3-D), float32.

GridSample follows onnxruntime's CPU kernel (grid_sample.cc), which is the oracle, in float32:
- a grid point's normalized coordinate n maps to ``(n + 1) / 2 * (L - 1)`` (align_corners) or
  ``((n + 1) * L - 1) / 2``;
- nearest rounds it half-to-even (``nearbyintf``); linear takes floor(x) and floor(x) + 1 with
  weights ``x1 + 1 - x`` and ``x - x1`` (a tap's weight is the product over the axes, as in
  onnxruntime's bilinear plan); cubic (2-D only, as in onnxruntime) the 4x4 neighbourhood of
  floor(x) with Keys' coefficients (a = -0.75), weight cy[i] * cx[j];
- padding is applied per *pixel index*, not per coordinate: zeros reads 0 outside, border clamps
  the index, reflection reflects the index about the borders (-0.5 and L - 0.5, or 0 and L - 1
  with align_corners) and truncates it.
The grid is the same for every channel of an image, so (as onnxruntime's sampling plan) one work
item is one output row of one image (image, output depth, output row): its grid points become T
taps each (1 nearest, 4 bilinear, 8 trilinear, 16 bicubic), a pixel offset (-1 for a zeros-padded
tap, which adds 0 and reads nothing) and a weight, in the thread's scratch; then every channel's
row is a T-tap gather-dot over them. The sizes, borders and the padding mode are compile-time
constants.

AffineGrid: the base grid (per axis, Eigen's LinSpaced(-1, 1) scaled by (L-1)/L without
align_corners, as onnxruntime builds it) is a compile-time constant of L floats per axis; the
kernel computes ``theta[:, :k] @ base + theta[:, k]`` per point, theta read at run time.
"""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import BlockEmitter
from smelt.codegen.kernels.loops import work_range
from smelt.codegen.registry import register
from smelt.ir.graph import Graph, Node

PARALLEL_MIN_OUTPUTS = 1 << 13  # below this one thread does the node (a barrier costs more)
MODES = {"bilinear": "linear", "linear": "linear", "nearest": "nearest", "bicubic": "cubic", "cubic": "cubic"}
PADDINGS = ("zeros", "border", "reflection")
INDEX_LIMIT = float(1 << 40)  # coordinates are clamped here before the cast to long (no UB)


def _attr(node: Node, name: str, default):
    v = node.attr(name, default)
    return v.decode() if isinstance(v, bytes) else v


def _mode(node: Node, g: Graph) -> str | None:
    """The interpolation, spelled as opset 20 does (16 said bilinear/bicubic, its default)."""
    default = "linear" if g.opset.get("", 17) >= 20 else "bilinear"
    return MODES.get(_attr(node, "mode", default))


def _f32(g: Graph, names: list[str]) -> str | None:
    for name in names:
        v = g.values[name]
        if v.dtype is None or np.dtype(v.dtype) != np.float32:
            return f"native {name!r} must be float32"
    return None


def _check_grid_sample(node: Node, g: Graph) -> str | None:
    why = _f32(g, [node.inputs[0], node.inputs[1], node.outputs[0]])
    if why:
        return f"GridSample: {why}"
    x, grid = g.values[node.inputs[0]], g.values[node.inputs[1]]
    rank = len(x.shape) - 2
    mode = _mode(node, g)
    if mode is None:
        return f"GridSample mode {_attr(node, 'mode', '')!r}"
    if _attr(node, "padding_mode", "zeros") not in PADDINGS:
        return f"GridSample padding_mode {_attr(node, 'padding_mode', '')!r}"
    if rank not in (2, 3) or len(grid.shape) != rank + 2 or grid.shape[-1] != rank or grid.shape[0] != x.shape[0]:
        return "GridSample is native for 2-D and 3-D images with a matching grid"
    if rank == 3 and mode == "cubic":
        return "GridSample cubic is 2-D only (as in onnxruntime)"
    if x.size == 0 or g.values[node.outputs[0]].size == 0:
        return "empty tensor"
    return None


def _denorm(n: str, length: int, align: bool) -> str:
    if align:
        return f"(({n}) + 1.0f) / 2.0f * {float(length - 1)!r}f"
    return f"((({n}) + 1.0f) * {float(length)!r}f - 1.0f) / 2.0f"


def _index_function(em: BlockEmitter, dims: list[int], padding: str, align: bool) -> str:
    """A C function ``long f(long z, long y, long x)``: the offset of a pixel in a D x H x W plane
    with the padding mode applied to the indices (onnxruntime's PixelAtGrid), -1 for a zeros-padded
    one (it reads as 0)."""
    d, h, w = dims
    lines = ["static inline float FNAME_reflect(float x, float lo, float hi) {",
             "    const float range = hi - lo;",
             "    if (!(range > 0.0f)) return lo;  /* a one-pixel axis with align_corners */",
             "    if (x < lo) { const float dx = lo - x; const long n = (long)(dx / range);",
             "        const float r = dx - (float)n * range; return n % 2 == 0 ? lo + r : hi - r; }",
             "    if (x > hi) { const float dx = x - hi; const long n = (long)(dx / range);",
             "        const float r = dx - (float)n * range; return n % 2 == 0 ? hi - r : lo + r; }",
             "    return x;",
             "}",
             "static inline long FNAME(long z, long y, long x) {"]
    if padding == "zeros":
        lines.append(f"    if (z < 0 || z >= {d} || y < 0 || y >= {h} || x < 0 || x >= {w}) return -1;")
    elif padding == "border":
        for v, n in (("z", d), ("y", h), ("x", w)):
            lines.append(f"    {v} = {v} < 0 ? 0 : {v} > {n - 1} ? {n - 1} : {v};")
    else:
        for v, n in (("z", d), ("y", h), ("x", w)):
            lo, hi = (0.0, n - 1.0) if align else (-0.5, n - 0.5)
            lines.append(f"    {v} = (long)FNAME_reflect((float){v}, {lo!r}f, {hi!r}f);")
    lines += [f"    return (z * {h} + y) * {w}L + x;", "}"]
    return em.function(f"grid_sample_index_{padding}", "\n".join(lines) + "\n")


def _floor_index(v: str) -> str:
    return f"(long)fminf(fmaxf(floorf({v}), {-INDEX_LIMIT!r}f), {INDEX_LIMIT!r}f)"


TAPS = {("nearest", 2): 1, ("nearest", 3): 1, ("linear", 2): 4, ("linear", 3): 8, ("cubic", 2): 16}


@register("GridSample", versions=(16, 20, 22), check=_check_grid_sample, name="f32_grid_sample")
def emit_grid_sample(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, grid = g.values[node.inputs[0]], g.values[node.inputs[1]]
    rank = len(x.shape) - 2
    n, c = x.shape[0], x.shape[1]
    ins = [1] * (3 - rank) + list(x.shape[2:])
    outs = [1] * (3 - rank) + list(grid.shape[1:-1])
    i_d, i_h, i_w = ins
    o_d, o_h, o_w = outs
    mode = _mode(node, g)
    assert mode is not None
    padding = _attr(node, "padding_mode", "zeros")
    align = bool(node.attr("align_corners", 0))
    ix = _index_function(em, ins, padding, align)
    t = TAPS[(mode, rank)]
    rows = n * o_d * o_h
    slot = o_w * t
    ti = em.scratch(max(1, em.n_threads) * slot * 8, "int64")
    tw = em.scratch(max(1, em.n_threads) * slot * 4)
    L = [f"const float *restrict X = {em.ptr(node.inputs[0])};",
         f"const float *restrict G = {em.ptr(node.inputs[1])};",
         f"float *restrict Y = {em.ptr(node.outputs[0])};",
         f"long *restrict ti = (long *){ti} + (long)tid * {slot};",
         f"float *restrict tw = {tw} + (long)tid * {slot};",
         work_range(rows, rows * o_w * c * t >= PARALLEL_MIN_OUTPUTS),
         "for (long r = wb; r < we; ++r) {",
         f"    const long b = r / {o_h * o_d}, rr = r % {o_h * o_d};  /* rr: output depth * H + row */",
         f"    const float *restrict gp = G + r * {o_w * rank}L;",
         f"    for (long ow = 0; ow < {o_w}; ++ow) {{",
         f"        long *restrict oi = ti + ow * {t};",
         f"        float *restrict wt = tw + ow * {t};",
         f"        const float gx = {_denorm(f'gp[ow * {rank}]', i_w, align)};",
         f"        const float gy = {_denorm(f'gp[ow * {rank} + 1]', i_h, align)};",
         f"        const float gz = {_denorm(f'gp[ow * {rank} + 2]', i_d, align) if rank == 3 else '0.0f'};",
         "        (void)gz;"]
    if mode == "nearest":
        L += [f"        oi[0] = {ix}({_floor_index('nearbyintf(gz)')}, {_floor_index('nearbyintf(gy)')}, "
              f"{_floor_index('nearbyintf(gx)')});",
              "        wt[0] = 1.0f;"]
    elif mode == "linear":
        L += [f"        const long x1 = {_floor_index('gx')}, y1 = {_floor_index('gy')}, z1 = {_floor_index('gz')};",
              "        const float dx2 = (float)(x1 + 1) - gx, dx1 = gx - (float)x1;",
              "        const float dy2 = (float)(y1 + 1) - gy, dy1 = gy - (float)y1;",
              "        const float dz2 = (float)(z1 + 1) - gz, dz1 = gz - (float)z1;",
              "        (void)dz1; (void)dz2;"]
        q = 0
        for zi in ((0,) if rank == 2 else (0, 1)):
            for yi in (0, 1):
                for xi in (0, 1):
                    z = "0" if rank == 2 else f"z1 + {zi}"
                    wz = "" if rank == 2 else f"{('dz2', 'dz1')[zi]} * "
                    L += [f"        oi[{q}] = {ix}({z}, y1 + {yi}, x1 + {xi});",
                          f"        wt[{q}] = {wz}{('dy2', 'dy1')[yi]} * {('dx2', 'dx1')[xi]};"]
                    q += 1
    else:  # cubic, 2-D
        coeffs = em.function("smelt_gs_cubic_coeffs", _CUBIC)
        L += [f"        const long x0 = {_floor_index('gx')} - 1, y0 = {_floor_index('gy')} - 1;",
              "        float cx[4], cy[4];",
              f"        {coeffs}(gx - (float)x0 - 1.0f, cx);",
              f"        {coeffs}(gy - (float)y0 - 1.0f, cy);",
              "        for (int i = 0; i < 4; ++i)",
              "            for (int j = 0; j < 4; ++j) {",
              f"                oi[i * 4 + j] = {ix}(0, y0 + i, x0 + j);",
              "                wt[i * 4 + j] = cy[i] * cx[j];",
              "            }"]
    L += ["    }",
          f"    for (long ch = 0; ch < {c}; ++ch) {{",
          f"        const float *restrict img = X + (b * {c} + ch) * {i_d * i_h * i_w}L;",
          f"        float *restrict y = Y + ((b * {c} + ch) * {o_d * o_h} + rr) * {o_w}L;",
          f"        for (long ow = 0; ow < {o_w}; ++ow) {{",
          f"            const long *restrict oi = ti + ow * {t};",
          f"            const float *restrict wt = tw + ow * {t};",
          "            float acc = wt[0] * (oi[0] >= 0 ? img[oi[0]] : 0.0f);",
          f"            for (int q = 1; q < {t}; ++q) acc += wt[q] * (oi[q] >= 0 ? img[oi[q]] : 0.0f);",
          "            y[ow] = acc;",
          "        }",
          "    }",
          "}"]
    em.schedule(algorithm=f"per output row of an image: {t} taps per grid point, then a gather-dot per channel",
                kernel=f"f32_grid_sample_{mode}_{padding}", layout="NCHW",
                shape=f"{rank}-D, in {ins[3 - rank:]}, out {outs[3 - rank:]}, align_corners {int(align)}")
    em.step("\n".join(L), name=f"f32_grid_sample_{mode}_{padding}")


# Keys' cubic convolution coefficients with a = -0.75 for a tap at distance x in [0, 1)
_CUBIC = """static inline void FNAME(float x, float c[4]) {
    const float a = -0.75f;
    x = fabsf(x);
    c[0] = ((a * (x + 1) - 5 * a) * (x + 1) + 8 * a) * (x + 1) - 4 * a;
    c[1] = ((a + 2) * x - (a + 3)) * x * x + 1;
    c[2] = ((a + 2) * (1 - x) - (a + 3)) * (1 - x) * (1 - x) + 1;
    c[3] = ((a * (2 - x) - 5 * a) * (2 - x) + 8 * a) * (2 - x) - 4 * a;
}
"""


def _check_affine_grid(node: Node, g: Graph) -> str | None:
    why = _f32(g, [node.inputs[0], node.outputs[0]])
    if why:
        return f"AffineGrid: {why}"
    theta, out = g.values[node.inputs[0]], g.values[node.outputs[0]]
    rank = len(out.shape) - 2
    if rank not in (2, 3) or tuple(theta.shape) != (out.shape[0], rank, rank + 1) or out.shape[-1] != rank:
        return "AffineGrid is native for 2-D and 3-D grids with theta [N, k, k+1]"
    if out.size == 0:
        return "empty tensor"
    return None


def _linspace(length: int, align: bool) -> np.ndarray:
    """onnxruntime's base coordinates along one axis: Eigen's LinSpaced(L, -1, 1) (-1 + i*step,
    the last one exactly 1; a single point is 1), times (L - 1) / L without align_corners."""
    if length == 1:
        v = np.ones(1, np.float32)
    else:
        step = np.float32(2.0) / np.float32(length - 1)
        v = np.float32(-1.0) + np.arange(length, dtype=np.float32) * step
        v[-1] = np.float32(1.0)
    if not align:
        v = (v * np.float32(length - 1)) / np.float32(length)
    return v.astype(np.float32)


@register("AffineGrid", versions=(20,), check=_check_affine_grid, name="f32_affine_grid")
def emit_affine_grid(node: Node, g: Graph, em: BlockEmitter) -> None:
    out = g.values[node.outputs[0]]
    rank = len(out.shape) - 2
    align = bool(node.attr("align_corners", 0))
    n = out.shape[0]
    d, h, w = [1] * (3 - rank) + list(out.shape[1:-1])
    bx, by = em.weight(_linspace(w, align)), em.weight(_linspace(h, align))
    bz = em.weight(_linspace(d, align)) if rank == 3 else None
    k = rank + 1
    rows = n * d * h
    axes = [("bx", "i"), ("by", "j"), ("bz", "q")][:rank]
    L = [f"const float *restrict T = {em.ptr(node.inputs[0])};",
         f"float *restrict Y = {em.ptr(node.outputs[0])};",
         f"const float *restrict bx = {bx};", f"const float *restrict by = {by};",
         f"const float *restrict bz = {bz or 'bx'};" if rank == 3 else "",
         work_range(rows, rows * w >= PARALLEL_MIN_OUTPUTS),
         "for (long r = wb; r < we; ++r) {",
         f"    const long j = r % {h}, q = (r / {h}) % {d}, b = r / {h * d};",
         f"    const float *restrict t = T + b * {rank * k};",
         f"    float *restrict y = Y + r * {w * rank}L;",
         "    (void)q;",
         f"    for (long i = 0; i < {w}; ++i) {{"]
    for r in range(rank):
        dot = " + ".join(f"t[{r * k + a}] * {base}[{ix}]" for a, (base, ix) in enumerate(axes))
        L.append(f"        y[i * {rank} + {r}] = ({dot}) + t[{r * k + rank}];")
    L += ["    }", "}"]
    em.schedule(algorithm="theta x constant base grid per point", kernel="f32_affine_grid",
                shape=f"{rank}-D grid {list(out.shape)}, align_corners {int(align)}")
    em.step("\n".join(x for x in L if x), name="f32_affine_grid")
