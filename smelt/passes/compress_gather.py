"""Compress with a constant condition as a Gather (a decomposition ``expand_functions`` uses).

A condition known at compile time (a constant, or folded) makes Compress a Gather of the
selected positions along the axis: ``Gather(X, idx, axis)`` with idx = the positions where the
condition is true (a condition shorter than the axis leaves the rest out, as ONNX says), after
``Reshape(X, [-1])`` when there is no axis. onnx's shape inference does not size a Compress even
then; the Gather it sizes, so the native gather template runs it. A condition computed at run
time decides the output shape from data: that Compress stays with the fallback.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from smelt.ir.graph import Graph, Node


def compress_gather(g: Graph, node: Node, opset: int) -> onnx.FunctionProto | None:
    """The Gather form of ``node`` as a function body, or None (a run-time condition)."""
    if len(node.inputs) != 2 or not all(node.inputs):
        return None
    cond = g.values[node.inputs[1]].const
    x = g.values[node.inputs[0]]
    if cond is None or x.shape is None or not x.is_static:
        return None
    shape = [int(d) for d in x.shape]
    axis = node.attr("axis")
    nodes = []
    data = "input"
    if axis is None:
        nodes.append(helper.make_node("Constant", [], ["flat"], value=numpy_helper.from_array(np.array([-1], np.int64))))
        nodes.append(helper.make_node("Reshape", ["input", "flat"], ["flattened"]))
        data, shape, axis = "flattened", [int(np.prod(shape, dtype=np.int64))], 0
    axis = int(axis) % len(shape)
    idx = np.flatnonzero(np.asarray(cond).reshape(-1).astype(bool)[:shape[axis]]).astype(np.int64)
    if idx.size == 0:
        return None  # an empty output: constant folding's business
    nodes.append(helper.make_node("Constant", [], ["indices"], value=numpy_helper.from_array(idx)))
    nodes.append(helper.make_node("Gather", [data, "indices"], ["output"], axis=axis))
    return helper.make_function("", "Compress", ["input", "condition"], ["output"], nodes,
                                [helper.make_opsetid("", opset)])
