"""Pass: 1-D integer convolutions (ConvInteger, QLinearConv) run as 2-D ones with a height of one.

What: each ConvInteger / QLinearConv over [N, C, L] with constant weights [M, C/group, k] becomes
the same op over [N, C, 1, L] with weights [M, C/group, 1, k] (reshaped at compile time),
kernel_shape [1, k], strides [1, s], dilations [1, d], pads [0, p_begin, 0, p_end] (SAME_UPPER /
SAME_LOWER turned into those explicit pads; VALID into zero pads), group kept. Its input gets
one Reshape to the unit height (one per input value, shared by every lifted conv reading it; a
value that is itself a Reshape of a rank-4 value of that shape is read directly, that Reshape
dropped when nothing else reads it), and its 2-D output one Reshape back to rank 3 under the
original name. Zero points, scales and bias are kept as they are: the scalar or
per-output-channel ones (axis 0) mean the same at rank 4.

Why: the integer conv templates (templates/int_conv.py, int_conv_nchwc.py) are 2-D only, so a
1-D quantized network (a dynamically quantized HiFi-GAN vocoder: 74 dilated 1-D ConvIntegers)
ran every conv through the onnx.reference fallback, ~40x slower than onnxruntime.

Unlike ``lift_1d_convs`` (passes/lift_1d.py), which lifts whole regions of float values so
blocked layouts flow between convs, this is per node: the int convs' neighbours (a dynamic
quantization before, a Cast and scale Mul after) gain nothing from the unit height, and the
node's gain is native code instead of a fallback. Each boundary Reshape is a copy of its
tensor (templates/movement.py), small next to the conv (the HiFi-GAN's 140: 2.1 of 68 ms).

Needs: shapes inferred and static (after the fold fixpoint); runs right after
``lift_1d_convs``, switched by the same ``lift_1d`` option. A node is lifted only when a native
template accepts the rewritten 2-D node (``registry.find_template`` on it in the graph);
otherwise it is left exactly as it was.
Guarantees: every value keeps its name, rank-3 shape and dtype; new values are ``<name>__h1``
(the lifted input and output) and ``<node>/w_h1`` (the reshaped weights).
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from smelt.codegen.registry import find_template
from smelt.ir.graph import PLAIN, Graph, Node, Value

_OPS = ("ConvInteger", "QLinearConv")
_W = {"ConvInteger": 1, "QLinearConv": 3}  # position of the weights among the inputs


def lift_1d_integer_convs(g: Graph) -> Graph:
    if not any(n.op in _OPS for n in g.nodes):
        return g
    producers = g.producers()
    lifted_x: dict[str, str] = {}  # a rank-3 input -> its unit-height value
    out: list[Node] = []
    for n in g.nodes:
        attrs = _attrs_2d(g, n) if _candidate(g, n) else None
        if attrs is None:
            out.append(n)
            continue
        x, y = n.inputs[0], n.outputs[0]
        x4, made = _lifted_input(g, x, producers, lifted_x)
        if not _try_lift(g, n, attrs, x4):
            if made:  # made for this node only: dropped again
                del g.values[x4], lifted_x[x]
            out.append(n)
            continue
        if made:  # one Reshape per input, before its first lifted reader
            out.append(_reshape(g, x, x4, f"{n.name}/h1_in"))
        out.append(n)
        out.append(_reshape(g, n.outputs[0], y, f"{n.name}/h1_out"))
    g.nodes = out
    # a Reshape down to rank 3 that only the lifted convs read (they read its input now): gone
    readers = g.consumers()
    orphans = {id(producers[x]) for x, x4 in lifted_x.items()
               if x4 != x and producers.get(x) is not None and producers[x].inputs[0] == x4
               and x not in g.outputs and not readers.get(x)}
    if orphans:
        g.nodes = [n for n in g.nodes if id(n) not in orphans]
        g.prune_values()
    return g


# -- which nodes ------------------------------------------------------------------------------
def _static(v: Value | None, rank: int) -> bool:
    return (v is not None and v.is_static and len(v.shape) == rank and all(int(d) > 0 for d in v.shape)
            and v.layout == PLAIN)


def _candidate(g: Graph, n: Node) -> bool:
    if n.op not in _OPS or n.domain not in ("", "ai.onnx") or n.epilogue or n.guard is not None:
        return False
    if len(n.inputs) <= _W[n.op] or len([o for o in n.outputs if o]) != 1:
        return False
    x, y = g.values.get(n.inputs[0]), g.values.get(n.outputs[0])
    w = g.values.get(n.inputs[_W[n.op]])
    return (_static(x, 3) and _static(y, 3) and x.const is None and w is not None and w.const is not None
            and w.const.ndim == 3)


def _attrs_2d(g: Graph, n: Node) -> dict[str, object] | None:
    """The lifted node's spatial attributes, or None when the 1-D ones cannot be said exactly in
    2-D (an unknown auto_pad, lists of the wrong length, an output length they do not give)."""
    x, y = g.values[n.inputs[0]].shape, g.values[n.outputs[0]].shape
    w = g.values[n.inputs[_W[n.op]]].const.shape
    length = int(x[2])

    def one(key: str, default: int, size: int = 1) -> list[int] | None:
        v = n.attr(key)
        if v is None:
            return [default] * size
        v = [int(a) for a in v]
        return v if len(v) == size else None

    kernel, strides, dils, pads = one("kernel_shape", int(w[2])), one("strides", 1), one("dilations", 1), one("pads", 0, 2)
    if kernel is None or strides is None or dils is None or pads is None or kernel[0] != int(w[2]):
        return None
    k, s, d = kernel[0], strides[0], dils[0]
    if s < 1 or d < 1:
        return None
    auto_pad = n.attr("auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
    span = (k - 1) * d + 1
    if auto_pad == "VALID":
        pads = [0, 0]
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        total = max(0, (-(-length // s) - 1) * s + span - length)
        small, large = total // 2, total - total // 2
        pads = [small, large] if auto_pad == "SAME_UPPER" else [large, small]
    elif auto_pad != "NOTSET":
        return None
    if min(pads) < 0 or (length + pads[0] + pads[1] - span) // s + 1 != int(y[2]):
        return None
    return {"kernel_shape": [1, k], "strides": [1, s], "dilations": [1, d], "pads": [0, pads[0], 0, pads[1]]}


def _lifted_input(g: Graph, x: str, producers: dict[str, Node], lifted: dict[str, str]) -> tuple[str, bool]:
    """The unit-height value ``x`` is read as, and whether it was made just now (and needs a
    Reshape if kept). A value produced by a Reshape of a plain rank-4 value of the lifted shape
    (the boundary of a float region lifted by ``lift_1d_convs``) is that value: no copy back."""
    if x in lifted:
        return lifted[x], False
    v = g.values[x]
    shape = (int(v.shape[0]), int(v.shape[1]), 1, int(v.shape[2]))
    p = producers.get(x)
    if p is not None and p.op == "Reshape" and p.domain in ("", "ai.onnx") and not p.epilogue and p.guard is None:
        src = g.values.get(p.inputs[0])
        if (src is not None and src.is_static and tuple(int(s) for s in src.shape) == shape
                and src.dtype == v.dtype and src.layout == PLAIN):
            lifted[x] = src.name
            return src.name, False
    new = g.fresh_name(f"{x}__h1")
    g.add_value(Value(new, v.dtype, shape))
    lifted[x] = new
    return new, True


def _try_lift(g: Graph, n: Node, attrs: dict[str, object], x4: str) -> bool:
    """Rewrite ``n`` to its 2-D form reading ``x4`` when a native template takes that form; else
    leave ``n`` (and the graph) as it was. The new output is left in ``n.outputs[0]``."""
    wpos = _W[n.op]
    w = g.const(n.inputs[wpos])
    y = g.values[n.outputs[0]]
    w4 = g.add_const(w.reshape(w.shape[0], w.shape[1], 1, w.shape[2]), f"{n.name}/w_h1")
    y4 = g.fresh_name(f"{n.outputs[0]}__h1")
    g.add_value(Value(y4, y.dtype, (int(y.shape[0]), int(y.shape[1]), 1, int(y.shape[2]))))
    inputs = list(n.inputs)
    inputs[0], inputs[wpos] = x4, w4
    kept = [a for a in n.attr_protos if a.name not in attrs and a.name != "auto_pad"]
    protos = kept + [helper.make_attribute(key, value) for key, value in attrs.items()]
    decoded = {key: value for key, value in n.attrs.items() if key != "auto_pad"} | attrs
    trial = Node(n.op, n.name, inputs, [y4], decoded, n.domain, protos)
    tpl, _ = find_template(trial, g)
    if tpl is None:
        del g.values[w4], g.values[y4]
        return False
    n.inputs, n.outputs, n.attrs, n.attr_protos = inputs, [y4], decoded, protos
    return True


def _reshape(g: Graph, src: str, dst: str, name: str) -> Node:
    shape = g.add_const(np.array(g.values[dst].shape, np.int64), f"{name}/shape")
    return Node("Reshape", g.fresh_name(name), [src, shape], [dst])
