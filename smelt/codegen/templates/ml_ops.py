"""ai.onnx.ml ops with a tensor-only form: ArrayFeatureExtractor.

Template ``array_feature_extractor``: Z = X[..., Y], the last axis gathered at the indices of
``Y`` (any shape, read flat), as onnxruntime does it: a 1-D X gives Z of shape [1, len(Y)],
an index outside [0, X.shape[-1]) makes the inference fail (SMELT_FAIL; onnxruntime refuses it,
negative indices included). Rows split over threads; every share checks all the indices before
it writes a row, so a bad index leaves no partial result. (A 1-D X reaches the template only
typed: onnx's shape inference leaves its output untyped, so it stays on the fallback.)
"""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import BlockEmitter
from smelt.codegen.kernels.broadcast import PARALLEL_MIN_ELEMS
from smelt.codegen.kernels.loops import dtype_name, emit_kernel, work_range
from smelt.codegen.registry import register
from smelt.ir.graph import Graph, Node
from smelt.ir.types import c_type

ML = "ai.onnx.ml"
AFE_TYPES = ("float32", "float64", "int64", "int32")


def _check_afe(node: Node, g: Graph) -> str | None:
    x, y, z = node.inputs[0], node.inputs[1], node.outputs[0]
    if dtype_name(g, x) not in AFE_TYPES or dtype_name(g, z) != dtype_name(g, x):
        return f"ArrayFeatureExtractor of {dtype_name(g, x)} (native: {', '.join(AFE_TYPES)})"
    if dtype_name(g, y) != "int64":
        return "ArrayFeatureExtractor indices must be int64"
    xs = [int(d) for d in g.values[x].shape]
    n = g.values[y].size
    if not xs or not n:
        return "a scalar X or no indices (onnxruntime refuses both)"
    want = [1, n] if len(xs) == 1 else xs[:-1] + [n]
    if [int(d) for d in g.values[z].shape] != want:
        return f"output shape {list(g.values[z].shape)}, expected {want}"
    return None


@register("ArrayFeatureExtractor", check=_check_afe, name="array_feature_extractor", domain=ML)
def emit_array_feature_extractor(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, y, z = node.inputs[0], node.inputs[1], node.outputs[0]
    xs = [int(d) for d in g.values[x].shape]
    stride, n = xs[-1], g.values[y].size
    rows = int(np.prod(xs[:-1], dtype=np.int64))
    t = c_type(dtype_name(g, x))
    lines = [
        f"const {t} *restrict X = {em.ptr(x)};", f"const int64_t *restrict I = {em.ptr(y)};",
        f"{t} *restrict Z = (void *){em.ptr(z)};",
        "int bad = 0;",
        f"for (long j = 0; j < {n}; ++j) bad |= (uint64_t)I[j] >= {stride}u;",
        work_range(rows, rows * n >= PARALLEL_MIN_ELEMS),
        "if (bad) { SMELT_FAIL(); we = wb; }  /* reported */",
        "for (long r = wb; r < we; ++r) {",
        f"    const {t} *restrict xr = X + r * {stride}L; {t} *restrict zr = Z + r * {n}L;",
        f"    for (long j = 0; j < {n}; ++j) zr[j] = xr[I[j]];",
        "}",
    ]
    emit_kernel(em, f"array_feature_extractor_{dtype_name(g, x)}", "\n".join(lines),
                f"ArrayFeatureExtractor of {n} of {stride} features, {rows} rows")
