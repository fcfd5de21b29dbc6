"""Pass: lower QDQ-quantized Conv and MatMul to their integer ops.

Needs: shapes inferred; runs before constant folding (which would fold the weights'
DequantizeLinear into float constants and hide the pattern).
Guarantees: ``Q(op(DQ(x), DQ(W)[, DQ(bias)]))`` — the "QDQ" format onnxruntime's
``quantize_static`` writes, optionally with a Relu before the Q — becomes ``QLinearConv`` /
``QLinearMatMul`` on the integer tensors, as onnxruntime's own QDQ transformer does, so the
model runs on the integer kernels and answers what onnxruntime answers (it runs the same integer
op, not the float graph). A Relu between the op and the Q becomes ``Max(q, y_zero_point)``: the
quantization is monotonic, so quantizing ``max(v, 0)`` is the max of the quantized value and the
quantized 0 (exact).

Only what is exact is lowered: per-tensor activation scales and zero points, weights constant
(per tensor, or per output channel on the axis onnxruntime uses), a bias only when it is the
int32 ``DQ(bias_q, x_scale * w_scale)`` the quantizer writes (a float bias would have to be
rounded, which the float graph does not do). Anything else stays the float graph the model
spells, which runs as written.
"""

from __future__ import annotations

import numpy as np

from smelt.ir.graph import Graph, Node, Value

EIGHT_BIT = ("int8", "uint8")


def _dq(g: Graph, producers: dict[str, Node], name: str) -> Node | None:
    n = producers.get(name)
    return n if n is not None and n.op == "DequantizeLinear" and n.domain in ("", "ai.onnx") else None


def _scalar(g: Graph, name: str) -> bool:
    v = g.values.get(name)
    return v is not None and v.const is not None and v.const.size == 1


def _dtype(g: Graph, name: str) -> str | None:
    v = g.values.get(name)
    return None if v is None or v.dtype is None else np.dtype(v.dtype).name


def _activation(g: Graph, dq: Node | None) -> tuple[str, str, str] | None:
    """(x_q, scale, zero point) of a per-tensor DequantizeLinear of 8-bit data, else None."""
    if dq is None or len(dq.present_inputs()) < 2 or int(dq.attr("block_size", 0)):
        return None
    xq, xs = dq.inputs[0], dq.inputs[1]
    xz = dq.inputs[2] if len(dq.inputs) > 2 else ""
    if _dtype(g, xq) not in EIGHT_BIT or not _scalar(g, xs) or _dtype(g, xs) != "float32":
        return None
    if xz and not _scalar(g, xz):
        return None
    return xq, xs, xz


def _weights(g: Graph, dq: Node | None, channels: int, axis: int) -> tuple[str, str, str] | None:
    """(W_q, scale, zero point) of a DequantizeLinear of constant 8-bit weights, per tensor or
    per ``channels`` along ``axis``, else None."""
    if dq is None or int(dq.attr("block_size", 0)):
        return None
    wq, ws = dq.inputs[0], dq.inputs[1]
    wz = dq.inputs[2] if len(dq.inputs) > 2 else ""
    if _dtype(g, wq) not in EIGHT_BIT or g.const(wq) is None or g.const(ws) is None or _dtype(g, ws) != "float32":
        return None
    if wz and g.const(wz) is None:
        return None
    size = g.const(ws).size
    if size != 1:
        rank = g.const(wq).ndim
        dq_axis = int(dq.attr("axis", 1))
        if size != channels or (dq_axis + rank) % rank != axis:
            return None
    return wq, ws, wz


def _output_q(g: Graph, consumers: dict[str, list[Node]], y: str) -> tuple[Node, Node | None] | None:
    """The QuantizeLinear that alone reads ``y`` (through one Relu at most), and that Relu."""
    if y in g.outputs:
        return None
    readers = consumers.get(y, [])
    relu = None
    if len(readers) == 1 and readers[0].op == "Relu" and readers[0].outputs[0] not in g.outputs:
        relu = readers[0]
        readers = consumers.get(relu.outputs[0], [])
    if len(readers) != 1 or readers[0].op != "QuantizeLinear" or int(readers[0].attr("block_size", 0)):
        return None
    q = readers[0]
    ys, yz = q.inputs[1], q.inputs[2] if len(q.inputs) > 2 else ""
    if not _scalar(g, ys) or _dtype(g, ys) != "float32" or not yz or not _scalar(g, yz):
        return None
    if _dtype(g, q.outputs[0]) not in EIGHT_BIT:
        return None
    return q, relu


def _bias(g: Graph, producers: dict[str, Node], name: str, xs: str, ws: str) -> str | None:
    """The int32 bias of ``DQ(bias_q, x_scale * w_scale)``; "" when there is none; None when
    the bias is something else."""
    if not name:
        return ""
    dq = _dq(g, producers, name)
    if dq is None or _dtype(g, dq.inputs[0]) != "int32" or g.const(dq.inputs[0]) is None:
        return None
    scale = g.const(dq.inputs[1])
    zero = g.const(dq.inputs[2]) if len(dq.inputs) > 2 and dq.inputs[2] else np.zeros(1, np.int32)
    if scale is None or zero is None or np.any(zero != 0):
        return None
    want = (np.float32(g.const(xs).reshape(-1)[0]) * g.const(ws).astype(np.float32)).reshape(-1)
    if scale.size != want.size or not np.array_equal(scale.astype(np.float32).reshape(-1), want):
        return None
    return dq.inputs[0]


def _zero_point(g: Graph, name: str, like: str) -> str:
    """``name``, or a 0 of ``like``'s dtype where the zero point was omitted (the integer ops
    require the input)."""
    return name or g.add_const(np.zeros((), g.values[like].dtype), f"{like}_zero")


def _finish(g: Graph, node: Node, q: Node, relu: Node | None, op: str, inputs: list[str], dead: list[Node]) -> None:
    """Turn ``node`` into the integer ``op`` writing what ``q`` wrote (through Max for a Relu)."""
    inputs[2] = _zero_point(g, inputs[2], inputs[0])
    inputs[5] = _zero_point(g, inputs[5], inputs[3])
    out = q.outputs[0]
    node.op, node.inputs = op, inputs
    if relu is None:
        node.outputs = [out]
    else:
        tmp = g.fresh_name(out)  # "<q output>__k": the numeric debug report maps its counter back
        v = g.values[out]
        g.add_value(Value(tmp, v.dtype, v.shape))
        node.outputs = [tmp]
        relu.op, relu.inputs, relu.outputs = "Max", [tmp, q.inputs[2]], [out]
        relu.attrs, relu.attr_protos = {}, []
    dead.append(q)


def lower_qdq(g: Graph) -> Graph:
    producers = g.producers()
    consumers = g.consumers()
    dead: list[Node] = []
    for node in g.iter_op("Conv", "MatMul"):
        if node.epilogue:
            continue
        out = _output_q(g, consumers, node.outputs[0])
        x = _activation(g, _dq(g, producers, node.inputs[0]))
        if out is None or x is None:
            continue
        q, relu = out
        ys, yz = q.inputs[1], q.inputs[2]
        if node.op == "Conv":
            wv = g.values.get(node.inputs[1])
            if wv is None or wv.shape is None or len(wv.shape) != 4:
                continue
            w = _weights(g, _dq(g, producers, node.inputs[1]), int(wv.shape[0]), 0)
            if w is None:
                continue
            bias = _bias(g, producers, node.inputs[2] if len(node.inputs) > 2 else "", x[1], w[1])
            if bias is None:
                continue
            _finish(g, node, q, relu, "QLinearConv", [x[0], x[1], x[2], w[0], w[1], w[2], ys, yz]
                    + ([bias] if bias else []), dead)
        else:
            bv = g.values.get(node.inputs[1])
            if bv is None or bv.shape is None or len(bv.shape) != 2:
                continue
            w = _weights(g, _dq(g, producers, node.inputs[1]), int(bv.shape[1]), 1)
            if w is None:
                continue
            _finish(g, node, q, relu, "QLinearMatMul", [x[0], x[1], x[2], w[0], w[1], w[2], ys, yz], dead)
    g.remove_nodes(dead)
    g.prune_values()
    return g
