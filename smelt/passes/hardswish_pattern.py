"""HardSwish as paddle2onnx (and older torch exports) spell it, found for the epilogue fuse pass
(passes/fuse_epilogue.py).

``x * Clip(x + 3, 0, 6) / 6`` is four nodes; PP-LCNet (PP-OCR's detector and recognizer backbones)
writes one after every conv: 28 in PP-OCRv4's recognizer, each four passes over the conv's output
(the conv's own output having two readers, the epilogue chain stopped there). Matched here, they
become one ``HardSwish`` epilogue step of the conv, ``x * min(1, max(0, x / 6 + 1/2))`` in
registers; the learnable scale and bias that follow (Mul, Add by scalars) then fuse as well.

Spellings matched (y: the host's output; every intermediate read once, none a graph output):
``Div(Mul(y, Clip(Add(y, 3), 0, 6)), 6)``, with ``Mul(., 1/6)`` for the Div, the Clip's bounds as
inputs or attributes, and operands of Add and the first Mul in either order.
"""

from __future__ import annotations

import numpy as np

from smelt.ir.graph import Graph, Node

_RTOL = 1e-6  # a constant within float32 rounding of the exact one


def _is(g: Graph, name: str, want: float) -> bool:
    c = g.const(name) if name else None
    if c is None or c.size != 1 or c.dtype != np.float32:
        return False
    return abs(float(c.reshape(())) - want) <= _RTOL * max(1.0, abs(want))


def _other(node: Node, x: str) -> str | None:
    """The input of binary ``node`` that is not ``x`` (None unless x is exactly one of two)."""
    if len(node.inputs) != 2 or node.inputs.count(x) != 1:
        return None
    return node.inputs[1] if node.inputs[0] == x else node.inputs[0]


def _clip_0_6(g: Graph, node: Node) -> bool:
    lo = node.inputs[1] if len(node.inputs) > 1 and node.inputs[1] else None
    hi = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
    lo_ok = _is(g, lo, 0.0) if lo else node.attr("min") is not None and float(node.attr("min")) == 0.0
    hi_ok = _is(g, hi, 6.0) if hi else node.attr("max") is not None and float(node.attr("max")) == 6.0
    return lo_ok and hi_ok


def match_hardswish(g: Graph, y: str, consumers: dict[str, list[Node]]) -> tuple[list[Node], str] | None:
    """(the absorbed nodes, the value they end in) when ``y``'s readers compute HardSwish(y), else None."""
    readers = consumers.get(y, [])
    if len(readers) != 2 or any(r.domain not in ("", "ai.onnx") for r in readers):
        return None

    def only_reader(value: str, *ops: str) -> Node | None:
        if value in g.outputs:
            return None
        rs = consumers.get(value, [])
        return rs[0] if len(rs) == 1 and rs[0].op in ops and rs[0].domain in ("", "ai.onnx") else None

    for add, mul in (readers, readers[::-1]):
        if add.op != "Add" or mul.op != "Mul" or not _is(g, _other(add, y) or "", 3.0):
            continue
        clip = only_reader(add.outputs[0], "Clip")
        if clip is None or clip.inputs[0] != add.outputs[0] or not _clip_0_6(g, clip):
            continue
        if _other(mul, y) != clip.outputs[0] or consumers.get(clip.outputs[0]) != [mul] or clip.outputs[0] in g.outputs:
            continue
        last = only_reader(mul.outputs[0], "Div", "Mul")
        if last is None:
            continue
        c = _other(last, mul.outputs[0])
        if last.op == "Div" and last.inputs[0] == mul.outputs[0] and _is(g, c or "", 6.0) \
                or last.op == "Mul" and _is(g, c or "", 1.0 / 6.0):
            return [add, clip, mul, last], last.outputs[0]
    return None
