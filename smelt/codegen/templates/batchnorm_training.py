"""BatchNormalization with training_mode=1 (opset 14 on): normalized by the batch's own statistics.

Per channel c, over the batch and spatial positions: mean_c, then the population variance
var_c = mean((x - mean_c)^2) (two passes: no cancellation as in E[x^2] - mean^2), then
Y = (x - mean_c) / sqrt(var_c + epsilon) * scale_c + B_c, and the running statistics outputs
running_mean = input_mean * momentum + mean_c * (1 - momentum) (likewise the variance), which is
the ONNX definition and the reference's. Channels are split over the threads; float32 and
float64, accumulated in the input type. The inference form stays with ``norm.py``.
"""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import BlockEmitter, c_literal
from smelt.codegen.kernels.broadcast import PARALLEL_MIN_ELEMS
from smelt.codegen.registry import register
from smelt.ir.graph import PLAIN, Graph, Node
from smelt.ir.types import FLOAT_TYPES, c_type


def _dtype(g: Graph, name: str) -> str:
    return np.dtype(g.values[name].dtype).name


def _check(node: Node, g: Graph) -> str | None:
    if not node.attr("training_mode", 0):
        return "inference-mode BatchNormalization is norm.py's"
    if len(node.inputs) != 5 or not all(node.inputs):
        return "BatchNormalization needs five inputs"
    x = node.inputs[0]
    dt = _dtype(g, x)
    names = list(node.inputs) + [o for o in node.outputs if o]
    if dt not in FLOAT_TYPES or any(_dtype(g, n) != dt for n in names):
        return f"native training BatchNormalization needs one float type (given {dt})"
    if any(g.values[n].layout != PLAIN for n in names):
        return "training BatchNormalization reads plain layouts only"
    xs = g.values[x].shape
    if len(xs) < 2 or g.values[x].size == 0:
        return "needs a non-empty [N, C, ...] input"
    for i in node.inputs[1:]:
        if tuple(g.values[i].shape) != (xs[1],):
            return "parameters are not per-channel vectors"
    return None


@register("BatchNormalization", versions=(14, 15), check=_check, name="batchnorm_training")
def emit_batchnorm_training(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, scale, bias, mean_in, var_in = node.inputs
    y = node.outputs[0]
    rm = node.outputs[1] if len(node.outputs) > 1 else ""
    rv = node.outputs[2] if len(node.outputs) > 2 else ""
    dt = _dtype(g, x)
    t = c_type(dt)
    xs = [int(d) for d in g.values[x].shape]
    n, c = xs[0], xs[1]
    spatial = int(np.prod(xs[2:], dtype=np.int64))
    count = n * spatial
    eps = c_literal(float(node.attr("epsilon", 1e-5)), dt)
    mom = float(node.attr("momentum", 0.9))
    sqrt = "sqrtf" if dt == "float32" else "sqrt"
    split = (f"smelt_range({c}, tid, nt, &cb, &ce);" if n * c * spatial >= PARALLEL_MIN_ELEMS and c > 1
             else f"cb = 0; ce = tid == 0 ? {c} : 0;")
    lines = [f"const {t} *restrict X = {em.ptr(x)};", f"{t} *restrict Y = {em.ptr(y)};",
             f"const {t} *restrict S = {em.ptr(scale)};", f"const {t} *restrict B = {em.ptr(bias)};",
             f"const {t} *restrict M = {em.ptr(mean_in)};", f"const {t} *restrict V = {em.ptr(var_in)};"]
    if rm:
        lines.append(f"{t} *restrict RM = {em.ptr(rm)};")
    if rv:
        lines.append(f"{t} *restrict RV = {em.ptr(rv)};")
    lines += [
        f"long cb, ce; {split}",
        "for (long ch = cb; ch < ce; ++ch) {",
        f"    {t} sum = 0;",
        f"    for (long b = 0; b < {n}; ++b) {{ const {t} *xr = X + (b * {c} + ch) * {spatial};",
        f"        for (long i = 0; i < {spatial}; ++i) sum += xr[i]; }}",
        f"    const {t} mean = sum / {c_literal(count, dt)};",
        f"    {t} dev = 0;",
        f"    for (long b = 0; b < {n}; ++b) {{ const {t} *xr = X + (b * {c} + ch) * {spatial};",
        f"        for (long i = 0; i < {spatial}; ++i) {{ const {t} d = xr[i] - mean; dev += d * d; }} }}",
        f"    const {t} var = dev / {c_literal(count, dt)};",
        f"    const {t} inv = {c_literal(1, dt)} / {sqrt}(var + {eps}), sc = S[ch], sh = B[ch];",
        f"    for (long b = 0; b < {n}; ++b) {{ const long o = (b * {c} + ch) * {spatial};",
        f"        for (long i = 0; i < {spatial}; ++i) Y[o + i] = (X[o + i] - mean) * inv * sc + sh; }}",
    ]
    if rm:
        lines.append(f"    RM[ch] = M[ch] * {c_literal(mom, dt)} + mean * {c_literal(1 - mom, dt)};")
    if rv:
        lines.append(f"    RV[ch] = V[ch] * {c_literal(mom, dt)} + var * {c_literal(1 - mom, dt)};")
    lines.append("}")
    em.step("\n".join(lines), name=f"batchnorm_training_{dt}", doc="BatchNormalization on batch statistics")
    em.schedule(algorithm="two-pass per-channel mean and variance, then normalize", threads="channels")
