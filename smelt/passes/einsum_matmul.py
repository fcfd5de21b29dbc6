"""Einsum contractions as one batched MatMul (a decomposition ``expand_functions`` uses).

A two-operand float32 Einsum with a batched-MatMul form (``ir.einsum.matmul_form``: every label
once per operand, no broadcast dim, nothing summed inside one operand) is

    A' = Reshape(Transpose(A, [batch, m, k]), [B, M, K])
    B' = Reshape(Transpose(B, [batch, k, n]), [B, K, N])
    C  = Transpose(Reshape(MatMul(A', B'), [batch..., m..., n...]), output order)

(identity transposes and reshapes left out: ``bij,bjk->bik`` is the MatMul alone), so the GEMM runs it instead of the Einsum
template's loop nest, which is 30-100x slower on attention- or projection-sized contractions
(``tests/kernels/test_node_ops_a.py``; onnxruntime's Einsum does the same). The sum runs in the
GEMM's order: results differ from a sequential sum by rounding only.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from smelt.ir.einsum import matmul_form, parse
from smelt.ir.graph import Graph, Node


def einsum_matmul(g: Graph, node: Node, opset: int) -> onnx.FunctionProto | None:
    """The MatMul form of ``node`` as a function body, or None (the template's loop nest)."""
    if len(node.inputs) != 2 or not all(node.inputs):
        return None
    if any(np.dtype(g.values[x].dtype) != np.float32 for x in node.inputs):
        return None
    shapes = [[int(d) for d in g.values[x].shape] for x in node.inputs]
    spec = parse(node.attr("equation", ""), shapes)
    if isinstance(spec, str):
        return None
    form = matmul_form(spec, shapes)
    if form is None:
        return None
    size = lambda labels: int(np.prod([spec.sizes[lab] for lab in labels], dtype=np.int64))  # noqa: E731
    nodes: list[onnx.NodeProto] = []

    def const(name: str, values: list[int]) -> str:
        nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(values, np.int64))))
        return name

    def arrange(x: str, labels: tuple[str, ...], order: tuple[str, ...], shape: list[int], tag: str) -> str:
        perm = [labels.index(lab) for lab in order]
        if perm != list(range(len(perm))):
            nodes.append(helper.make_node("Transpose", [x], [f"{tag}_t"], perm=perm))
            x = f"{tag}_t"
        if [spec.sizes[lab] for lab in order] == shape:  # already [B, rows, cols]
            return x
        nodes.append(helper.make_node("Reshape", [x, const(f"{tag}_shape", shape)], [f"{tag}_3d"]))
        return f"{tag}_3d"

    a, b = spec.operands
    bt, m, n, k = size(form.batch), size(form.m), size(form.n), size(form.k)
    a3 = arrange("A", a, form.batch + form.m + form.k, [bt, m, k], "a")
    b3 = arrange("B", b, form.batch + form.k + form.n, [bt, k, n], "b")
    nodes.append(helper.make_node("MatMul", [a3, b3], ["c_3d"]))
    grouped = form.batch + form.m + form.n
    perm = [grouped.index(lab) for lab in spec.out]
    full = [spec.sizes[lab] for lab in grouped]
    if perm == list(range(len(perm))) and full == [bt, m, n]:
        nodes.append(helper.make_node("Identity", ["c_3d"], ["Output"]))
    elif perm == list(range(len(perm))):
        nodes.append(helper.make_node("Reshape", ["c_3d", const("c_shape", full)], ["Output"]))
    else:
        nodes.append(helper.make_node("Reshape", ["c_3d", const("c_shape", full)], ["c_full"]))
        nodes.append(helper.make_node("Transpose", ["c_full"], ["Output"], perm=perm))
    return helper.make_function("", "Einsum", ["A", "B"], ["Output"], nodes, [helper.make_opsetid("", opset)])
