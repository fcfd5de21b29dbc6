"""Shapes and dtypes of the ``com.microsoft`` ops smelt runs natively.

onnx's inference has no schema for onnxruntime's contrib ops, so their outputs would stay untyped
and their nodes (and everything after them) off the native path. Each rule here types one op's
outputs from its inputs, as onnxruntime's schema does; ``shape_inference.infer_shapes`` applies
them after onnx's pass and runs onnx's again so the values downstream are typed too.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from smelt.ir.graph import Graph, Node

MS_DOMAIN = "com.microsoft"


def _dynamic_quantize_lstm(node: Node, g: Graph) -> list[tuple[np.dtype, tuple] | None]:
    """Y [seq, num_directions, batch, hidden], Y_h and Y_c [num_directions, batch, hidden]: the
    LSTM's outputs (W_quantized is [num_directions, input, 4 * hidden])."""
    x, w = g.values[node.inputs[0]], g.values[node.inputs[1]]
    if x.shape is None or w.shape is None or len(x.shape) != 3 or len(w.shape) != 3:
        return [None, None, None]
    hidden = int(node.attr("hidden_size", 0)) or (w.shape[2] // 4 if isinstance(w.shape[2], int) else None)
    if hidden is None:
        return [None, None, None]
    seq, batch = x.shape[0], x.shape[1]
    dirs = w.shape[0]
    f32 = np.dtype(np.float32)
    return [(f32, (seq, dirs, batch, hidden)), (f32, (dirs, batch, hidden)), (f32, (dirs, batch, hidden))]


RULES: dict[str, Callable[[Node, Graph], list[tuple[np.dtype, tuple] | None]]] = {
    "DynamicQuantizeLSTM": _dynamic_quantize_lstm,
}


def apply_contrib_shapes(g: Graph) -> bool:
    """Type the outputs of contrib nodes that have a rule; True when a value gained a shape."""
    changed = False
    for node in g.nodes:
        rule = RULES.get(node.op) if node.domain == MS_DOMAIN else None
        if rule is None:
            continue
        for name, typed in zip(node.outputs, rule(node, g), strict=False):
            if not name or typed is None:
                continue
            v = g.values[name]
            if v.shape is None or v.dtype is None:
                v.dtype, v.shape = typed
                changed = True
    return changed
