"""Det: the determinant of each trailing [M, M] matrix of a [..., M, M] input.

Each matrix is copied into scratch and reduced by Gaussian elimination with partial pivoting
(the row of largest magnitude in the column, as LAPACK's getrf and Eigen's PartialPivLU): the
determinant is the product of the pivots, negated per row swap; a zero column gives 0. A 2x2
matrix is a*d - b*c, the closed form Eigen (onnxruntime's Det) uses. Computed in the input type
(float32, float64); matrices split over the threads.
"""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import BlockEmitter
from smelt.codegen.kernels.broadcast import PARALLEL_MIN_ELEMS
from smelt.codegen.registry import register
from smelt.ir.graph import PLAIN, Graph, Node
from smelt.ir.types import FLOAT_TYPES, c_type


def _dtype(g: Graph, name: str) -> str:
    return np.dtype(g.values[name].dtype).name


def _check(node: Node, g: Graph) -> str | None:
    x, y = node.inputs[0], node.outputs[0]
    dt = _dtype(g, x)
    if dt not in FLOAT_TYPES or _dtype(g, y) != dt:
        return f"native Det takes {FLOAT_TYPES} (given {dt})"
    xs = g.values[x].shape
    if len(xs) < 2 or xs[-1] != xs[-2] or g.values[x].size == 0:
        return f"Det needs a non-empty [..., M, M] input (given {list(xs)})"
    if g.values[x].layout != PLAIN or g.values[y].layout != PLAIN:
        return "Det reads plain layouts only"
    return None


@register("Det", check=_check, name="det")
def emit_det(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, y = node.inputs[0], node.outputs[0]
    dt = _dtype(g, x)
    t = c_type(dt)
    fabs = "fabsf" if dt == "float32" else "fabs"
    xs = [int(d) for d in g.values[x].shape]
    m = xs[-1]
    mats = int(np.prod(xs[:-2], dtype=np.int64))
    split = (f"smelt_range({mats}, tid, nt, &mb, &me);" if mats * m * m * m >= PARALLEL_MIN_ELEMS and mats > 1
             else f"mb = 0; me = tid == 0 ? {mats} : 0;")
    lines = [f"const {t} *restrict X = {em.ptr(x)};", f"{t} *restrict Y = {em.ptr(y)};",
             f"long mb, me; {split}"]
    if m == 2:
        lines += ["for (long k = mb; k < me; ++k) {", "    const " + t + " *a = X + k * 4;",
                  "    Y[k] = a[0] * a[3] - a[2] * a[1];", "}"]
    else:
        lines += [
            f"{t} *restrict W = {em.scratch(mats * m * m * np.dtype(dt).itemsize, dt)};",
            "for (long k = mb; k < me; ++k) {",
            f"    {t} *a = W + k * {m * m};",
            f"    for (long i = 0; i < {m * m}; ++i) a[i] = X[k * {m * m} + i];",
            f"    {t} det = 1;",
            f"    for (long col = 0; col < {m}; ++col) {{",
            "        long p = col;",
            f"        for (long r = col + 1; r < {m}; ++r) if ({fabs}(a[r * {m} + col]) > {fabs}(a[p * {m} + col])) p = r;",
            f"        const {t} piv = a[p * {m} + col];",
            "        if (piv == 0) { det = 0; break; }",
            "        if (p != col) {",
            f"            for (long j = 0; j < {m}; ++j) {{ const {t} s = a[p * {m} + j]; "
            f"a[p * {m} + j] = a[col * {m} + j]; a[col * {m} + j] = s; }}",
            "            det = -det;",
            "        }",
            "        det *= piv;",
            f"        for (long r = col + 1; r < {m}; ++r) {{",
            f"            const {t} f = a[r * {m} + col] / piv;",
            f"            for (long j = col + 1; j < {m}; ++j) a[r * {m} + j] -= f * a[col * {m} + j];",
            "        }",
            "    }",
            "    Y[k] = det;",
            "}",
        ]
    em.step("\n".join(lines), name=f"det_{dt}", doc=f"Det of {m}x{m} matrices")
    em.schedule(algorithm="closed form" if m == 2 else "LU with partial pivoting", threads="matrices")
