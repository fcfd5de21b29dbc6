"""The exact GELU as exporters spell it, found for the epilogue fuse pass (passes/fuse_epilogue.py).

ONNX has a Gelu op only from opset 20; torch's exporter at lower opsets (and transformers'
``GELUActivation`` everywhere) writes ``x * 0.5 * (1 + erf(x / sqrt2))`` as five nodes. Unfused
they are five passes over the FFN's widest activation (128 x 1536 floats a layer in a MiniLM),
the Erf one in scalar libm. Matched here, they become one ``Gelu`` epilogue step of the MatMul
that produces x, applied in registers with the vector erf of csrc/smelt_vec.h.

Spellings matched (y: the host's output; every intermediate read once, none a graph output):

- ``Mul(Mul(y, Add(Erf(Div(y, sqrt2)), 1)), 0.5)`` (torch.onnx, transformers' BERT/ViT/Whisper)
- ``Mul(Mul(y, 0.5), Add(Erf(Div(y, sqrt2)), 1))`` (the half taken first)
- ``Mul(y, Mul(Add(Erf(Div(y, sqrt2)), 1), 0.5))`` (the half taken of the bracket: pipecat's
  int8 smart-turn, exported by torch.onnx's dynamo path)
- ``Mul(y, 1/sqrt2)`` in place of the Div; operands of Add and Mul in either order.
"""

from __future__ import annotations

import math

import numpy as np

from smelt.ir.graph import Graph, Node

_RTOL = 1e-6  # a constant within float32 rounding of the exact one


def _scalar(g: Graph, name: str) -> float | None:
    c = g.const(name)
    if c is None or c.size != 1 or c.dtype != np.float32:
        return None
    return float(c.reshape(()))


def _is(g: Graph, name: str, want: float) -> bool:
    v = _scalar(g, name)
    return v is not None and abs(v - want) <= _RTOL * abs(want)


def _other(node: Node, x: str) -> str | None:
    """The input of binary ``node`` that is not ``x`` (None unless x is exactly one of two)."""
    if len(node.inputs) != 2 or node.inputs.count(x) != 1:
        return None
    return node.inputs[1] if node.inputs[0] == x else node.inputs[0]


def match_gelu(g: Graph, y: str, consumers: dict[str, list[Node]]) -> tuple[list[Node], str] | None:
    """(the absorbed nodes, the value they end in) when ``y``'s readers compute GELU(y), else None."""
    readers = consumers.get(y, [])
    if len(readers) != 2:
        return None

    def only_reader(value: str, op: str) -> Node | None:
        if value in g.outputs:
            return None
        rs = consumers.get(value, [])
        return rs[0] if len(rs) == 1 and rs[0].op == op and rs[0].domain in ("", "ai.onnx") else None

    for scale, other in (readers, readers[::-1]):
        c = _other(scale, y)
        if c is None or not (scale.op == "Div" and scale.inputs[0] == y and _is(g, c, math.sqrt(2.0))
                             or scale.op == "Mul" and _is(g, c, math.sqrt(0.5))):
            continue
        erf = only_reader(scale.outputs[0], "Erf")
        add = erf and only_reader(erf.outputs[0], "Add")
        if add is None or not _is(g, _other(add, erf.outputs[0]) or "", 1.0) or other.op != "Mul":
            continue
        a, o = add.outputs[0], _other(other, y)
        if o == a and consumers.get(a) == [other] and a not in g.outputs:  # y * (1 + erf): then * 0.5
            last = only_reader(other.outputs[0], "Mul")
            if last is not None and _is(g, _other(last, other.outputs[0]) or "", 0.5):
                return [scale, erf, add, other, last], last.outputs[0]
        elif (half := only_reader(a, "Mul")) is not None and _is(g, _other(half, a) or "", 0.5) \
                and o == half.outputs[0] and consumers.get(o) == [other] and o not in g.outputs:
            return [scale, erf, add, half, other], other.outputs[0]  # y * ((1 + erf) * 0.5)
        elif o is not None and _is(g, o, 0.5):  # (y * 0.5) * (1 + erf)
            last = only_reader(other.outputs[0], "Mul")
            if (last is not None and _other(last, other.outputs[0]) == a and consumers.get(a) == [last]
                    and a not in g.outputs):
                return [scale, erf, add, other, last], last.outputs[0]
    return None
