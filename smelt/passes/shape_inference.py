"""Pass: shape and dtype inference.

Needs: a graph of standard ONNX nodes (no fused epilogues yet).
Guarantees: every value onnx's inference can type gets a dtype and shape; symbolic dimensions
stay symbols; concrete sizes replace symbols wherever data propagation resolves them. Values it
cannot type (data-dependent shapes) stay unknown, which keeps their nodes out of native blocks.
"""

from __future__ import annotations

import onnx

from smelt.frontend.onnx_import import _type_of, to_onnx
from smelt.ir.graph import Graph


def _better(old, new):
    if new is None:
        return old
    if old is None or len(old) != len(new):
        return new
    return tuple(n if isinstance(n, int) else o for o, n in zip(old, new, strict=True))


def infer_shapes(g: Graph) -> Graph:
    model = to_onnx(g, small_consts_only=True)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)
    except Exception:  # inference is best effort; unknown shapes fall back, never crash
        return g
    infos = list(inferred.graph.value_info) + list(inferred.graph.output) + list(inferred.graph.input)
    for vi in infos:
        v = g.values.get(vi.name)
        if v is None or v.const is not None:
            continue
        dtype, shape = _type_of(vi.type)
        if v.dtype is None and dtype is not None:
            v.dtype = dtype
        v.shape = _better(v.shape, shape)
    return g
