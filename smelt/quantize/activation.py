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


def activation_range(model: onnx.ModelProto, node: onnx.NodeProto) -> tuple[float, float] | None:
    """(min, max) of a Relu, or of a Clip whose bounds are absent or float constants, else None."""
    if node.op_type == "Relu":
        return 0.0, float("inf")
    if node.op_type != "Clip":
        return None
    lo, hi = _float_attr(node, "min", float("-inf")), _float_attr(node, "max", float("inf"))  # opset < 11
    inits = {i.name: i for i in model.graph.initializer}
    for k, name in enumerate(node.input[1:3], start=1):
        if not name:
            continue
        if name not in inits:
            return None
        c = numpy_helper.to_array(inits[name])
        if c.size != 1 or c.dtype != np.float32:
            return None
        if k == 1:
            lo = float(c.reshape(-1)[0])
        else:
            hi = float(c.reshape(-1)[0])
    return lo, hi
