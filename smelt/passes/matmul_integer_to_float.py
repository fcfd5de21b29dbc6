"""Pass: onnxruntime's dynamic quantization pattern → ``com.microsoft`` MatMulIntegerToFloat.

Needs: constants folded (the weights' scales are constants then). Guarantees: where
``quantize_dynamic`` wrote

    DynamicQuantizeLinear(x) -> (xq, xs, xz)
    MatMulInteger(xq, Wq, xz, Wz) -> Cast(to float) -> Mul(·, Mul(xs, Ws)) [-> Add(·, bias)]

the product, the Cast, the scale Mul and a constant bias Add become one MatMulIntegerToFloat
(onnxruntime's own MatMulIntegerToFloatFusion does the same): the int32 product's tile writes
``float(acc) * (xs * Ws[j]) + bias[j]`` directly, where the graph made three more passes over
the [M, N] result (a dynamically quantized DistilBERT: 109 of its 134 element-wise nodes). The
scale product is formed per call as the Mul formed it (``xs * Ws[j]`` in float32) and the
Cast, the multiply and the add are separate roundings as before, so the answer is unchanged.
A scale that is a constant (the Mul already folded) becomes ``b_scale`` with ``a_scale`` 1, whose
product is that constant exactly. Only where the native template takes the node; the rest stays.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from smelt.ir.graph import Graph, Node

MS_DOMAIN = "com.microsoft"


def _dtype(g: Graph, name: str) -> str | None:
    v = g.values.get(name)
    return None if v is None or v.dtype is None else np.dtype(v.dtype).name


def _size(g: Graph, name: str) -> int | None:
    v = g.values.get(name)
    if v is None or v.shape is None or not all(isinstance(d, int) for d in v.shape):
        return None
    return int(np.prod(v.shape, dtype=np.int64))


def _only_reader(g: Graph, consumers: dict[str, list[Node]], name: str, op: str) -> Node | None:
    """The one node reading ``name`` when it is an ``op`` and ``name`` is not a graph output."""
    readers = consumers.get(name, [])
    if name in g.outputs or len(readers) != 1 or readers[0].op != op or readers[0].domain not in ("", "ai.onnx"):
        return None
    return readers[0]


def _scales(g: Graph, producers: dict[str, Node], s: str, n: int) -> tuple[str, str] | None:
    """(a_scale, b_scale) whose product per column is the multiplier ``s``: the operands of a
    Mul of a one-element float (the activation's scale) and a constant float per tensor or per
    column; or (a constant 1, ``s``) for a constant ``s``. None otherwise."""
    if _dtype(g, s) != "float32":
        return None
    if g.const(s) is not None:
        return (g.add_const(np.array(1.0, np.float32), "unit_scale"), s) if _size(g, s) in (1, n) else None
    mul = producers.get(s)
    if mul is None or mul.op != "Mul" or mul.domain not in ("", "ai.onnx") or len(mul.inputs) != 2:
        return None
    for a, b in (mul.inputs, mul.inputs[::-1]):
        if (_dtype(g, a) == "float32" and _size(g, a) == 1 and _dtype(g, b) == "float32"
                and g.const(b) is not None and _size(g, b) in (1, n)):
            return a, b
    return None


def fuse_matmul_integer_to_float(g: Graph) -> Graph:
    from smelt.codegen.registry import find_template  # (the registry imports the templates)

    producers, consumers = g.producers(), g.consumers()
    dead: list[Node] = []
    fused: dict[int, Node] = {}
    for mm in list(g.iter_op("MatMulInteger")):
        b = mm.inputs[1] if len(mm.inputs) > 1 else ""
        bv = g.values.get(b)
        if g.const(b) is None or bv is None or bv.shape is None or len(bv.shape) != 2:
            continue
        n = int(bv.shape[1])
        cast = _only_reader(g, consumers, mm.outputs[0], "Cast")
        if cast is None or cast.attr("to") != TensorProto.FLOAT:
            continue
        mul = _only_reader(g, consumers, cast.outputs[0], "Mul")
        if mul is None or len(mul.inputs) != 2:
            continue
        s = mul.inputs[1] if mul.inputs[0] == cast.outputs[0] else mul.inputs[0]
        scales = None if s == cast.outputs[0] else _scales(g, producers, s, n)
        if scales is None:
            continue
        gone, out, bias = [cast, mul], mul.outputs[0], ""
        add = _only_reader(g, consumers, out, "Add")
        if add is not None and len(add.inputs) == 2:
            other = add.inputs[1] if add.inputs[0] == out else add.inputs[0]
            if other != out and g.const(other) is not None and _dtype(g, other) == "float32" \
                    and tuple(g.values[other].shape) == (n,):
                gone, out, bias = gone + [add], add.outputs[0], other
        ins = list(mm.inputs) + ["", ""]
        before = (mm.op, mm.domain, list(mm.inputs), list(mm.outputs))
        mm.op, mm.domain = "MatMulIntegerToFloat", MS_DOMAIN
        mm.inputs = [ins[0], ins[1], scales[0], scales[1], ins[2], ins[3], bias]
        while mm.inputs and not mm.inputs[-1]:
            mm.inputs.pop()
        mm.outputs = [out]
        g.opset.setdefault(MS_DOMAIN, 1)
        if find_template(mm, g)[0] is None:
            mm.op, mm.domain, mm.inputs, mm.outputs = before
            continue
        fused[id(gone[-1])] = mm  # runs where the chain's last node ran: its scale is computed by then
        dead += gone + [mm]
    if fused:
        gone_ids = {id(n) for n in dead}
        g.nodes = [fused.get(id(n), n) for n in g.nodes if id(n) not in gone_ids or id(n) in fused]
        g.prune_values()
    return g
