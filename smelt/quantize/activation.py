"""The bounds of a Relu or Clip in an ONNX model, as the static quantizer (which folds such an
activation into the op before it: ``static.output_tensor``) and the numeric debug (which leaves
the activation's own clamps out of the saturation counts) both read them. Its own module: the
numeric debug cannot import the quantizer's (the API imports both)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper


def _float_attr(node: onnx.NodeProto, name: str, default: float) -> float:
    a = next((a for a in node.attribute if a.name == name), None)
    return default if a is None else float(helper.get_attribute_value(a))


def _constant(model: onnx.ModelProto, name: str) -> np.ndarray | None:
    """The value of ``name`` when it is an initializer or a Constant node's output, else None.
    (PyTorch's TorchScript exporter writes ReLU6's bounds as Constant nodes, not initializers.)"""
    init = next((i for i in model.graph.initializer if i.name == name), None)
    if init is not None:
        return numpy_helper.to_array(init)
    node = next((n for n in model.graph.node if n.op_type == "Constant" and n.output[0] == name), None)
    if node is None or len(node.attribute) != 1:
        return None
    a = node.attribute[0]
    if a.name == "value":
        return numpy_helper.to_array(a.t)
    if a.name in ("value_float", "value_floats"):
        return np.asarray(helper.get_attribute_value(a), np.float32)
    return None


def activation_range(model: onnx.ModelProto, node: onnx.NodeProto) -> tuple[float, float] | None:
    """(min, max) of a Relu, or of a Clip whose bounds are absent or float constants (initializers
    or Constant nodes), else None."""
    if node.op_type == "Relu":
        return 0.0, float("inf")
    if node.op_type != "Clip":
        return None
    lo, hi = _float_attr(node, "min", float("-inf")), _float_attr(node, "max", float("inf"))  # opset < 11
    for k, name in enumerate(node.input[1:3], start=1):
        if not name:
            continue
        c = _constant(model, name)
        if c is None or c.size != 1 or c.dtype != np.float32:
            return None
        if k == 1:
            lo = float(c.reshape(-1)[0])
        else:
            hi = float(c.reshape(-1)[0])
    return lo, hi
