"""``ReduceMean`` over the spatial axes of an image as ``GlobalAveragePool``.

paddle2onnx writes the squeeze-and-excitation blocks of PP-LCNet and PP-OCR's RSE-FPN as
``ReduceMean(x, axes=[2, 3], keepdims=1)``. Both ops are the mean over H and W of a 4-D
[N, C, H, W] value, kept as [N, C, 1, 1], but only GlobalAveragePool has a template on blocked
layouts (templates/blocked.py): left a ReduceMean, the layout planner turned the whole blocked
tensor back to plain for it (PP-OCRv6's detector: 0.19 ms of transform for a 48 x 160 x 160
tensor, beside a 0.09 ms mean). Both sum in float32 and divide by H x W; the sums' order differs
(as it does between any two engines).

Matched: ReduceMean on a float32 value of rank 4, keepdims 1 (the default), axes exactly {2, 3}
(or {-2, -1}) as an attribute (opset < 18) or a constant input (opset 18); not
``noop_with_empty_axes`` with empty axes.
"""

from __future__ import annotations

import numpy as np

from smelt.ir.graph import Graph, Node

SPATIAL = frozenset({2, 3})


def _axes(g: Graph, node: Node) -> list[int] | None:
    if len(node.inputs) > 1 and node.inputs[1]:
        c = g.const(node.inputs[1])
        return None if c is None else [int(a) for a in np.asarray(c).reshape(-1)]
    axes = node.attr("axes")
    return None if axes is None else [int(a) for a in axes]


def _is_spatial_mean(g: Graph, node: Node) -> bool:
    if node.op != "ReduceMean" or node.domain not in ("", "ai.onnx") or not node.attr("keepdims", 1):
        return False
    x = g.values.get(node.inputs[0])
    if x is None or x.shape is None or len(x.shape) != 4 or x.dtype is None or np.dtype(x.dtype) != np.float32:
        return False
    axes = _axes(g, node)
    return axes is not None and len(axes) == 2 and {a % 4 for a in axes} == SPATIAL


def spatial_mean_as_global_pool(g: Graph) -> Graph:
    """Rewrite every matched ReduceMean (module docstring) into GlobalAveragePool, in place."""
    for i, node in enumerate(g.nodes):
        if _is_spatial_mean(g, node):
            g.nodes[i] = Node("GlobalAveragePool", node.name, [node.inputs[0]], list(node.outputs))
    return g
