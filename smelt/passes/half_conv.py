"""float16 Conv as a float Conv between Casts (a decomposition ``expand_functions`` uses).

No conv template computes float16; onnxruntime's CPU provider has no float16 Conv on x86
either and runs it the same way: its cast insertion widens X, W and B exactly to float, the
float kernel sums, and one rounding brings the result back to float16. So the body is
``Cast(Conv(Cast(X), Cast(W), Cast(B)))`` with the node's attributes; the float Conv and the
Casts are native (a constant W or B folds to a float initializer). Other dtypes: no body.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from smelt.ir.graph import Graph, Node


def half_conv(g: Graph, node: Node, opset: int) -> onnx.FunctionProto | None:
    """The float form of a float16 Conv as a function body, or None."""
    ins = list(node.inputs)
    if len(ins) < 2 or not all(ins[:2]) or np.dtype(g.values[ins[0]].dtype).name != "float16":
        return None
    formals = ["X", "W", "B"][:len(ins)]
    nodes, widened = [], []
    for formal, name in zip(formals, ins, strict=True):
        if not name:
            widened.append("")
            continue
        nodes.append(helper.make_node("Cast", [formal], [f"{formal}_f"], to=TensorProto.FLOAT))
        widened.append(f"{formal}_f")
    nodes.append(helper.make_node("Conv", widened, ["Y_f"], **dict(node.attrs)))
    nodes.append(helper.make_node("Cast", ["Y_f"], ["Y"], to=TensorProto.FLOAT16))
    return helper.make_function("", "Conv", formals, ["Y"], nodes, [helper.make_opsetid("", opset)])
