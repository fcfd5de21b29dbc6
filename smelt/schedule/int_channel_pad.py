"""Channel padding of 8-bit activations between blocked int8 convolutions.

The blocked layout needs a channel count the block divides (``layout.can_block``); the int8
block is the ISA's int32 lanes (16 at AVX-512). A tensor of 24 channels (MobileNetV2's second
stage, EfficientNet's 40, ...) therefore stays plain: the conv writing it scatters each output
vector a byte per channel, and each conv reading it first copies it into blocks (MobileNetV2 int8
at AVX-512: four such convs and a QLinearAdd took 250 us of 1.1 ms). The kernels already compute
the padded channels (an output vector holds a whole block; a reduction covers whole input
blocks), so padding the tensor itself costs no arithmetic.

``pad_int8_channels`` pads each such tensor to the next multiple of the block, where every value
it touches lets the padding stay invisible: a connected set of uint8 values of one channel count,
each written by a QLinearConv (plain or depthwise), a com.microsoft QLinearAdd or a quantized
ReLU (``Max`` with a scalar) and read only by those or as the input of a plain QLinearConv. The
writers get zero weights (and a zero bias, a unit weight scale) for the new channels, so those
hold the output zero point; a QLinearAdd of two zero points writes its own; the readers get zero
weights for them, so no output changes. A set touching anything else (a model output, a
DequantizeLinear, a pool, a concat) is left as it is.
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from smelt.ir.graph import Graph, Node
from smelt.schedule.int_conv import int_block, int_nchwc_reason
from smelt.target import Target

QLINEAR_ADD = ("QLinearAdd", "com.microsoft")


def _kind(node: Node, g: Graph, target: Target) -> str | None:
    """How ``node`` takes part in a padded set: "conv" (a blocked int8 conv, group 1), "dw"
    (depthwise: channels in = channels out), "add" (QLinearAdd), "relu" (Max with a constant
    scalar), else None."""
    if node.op == "QLinearConv" and node.domain in ("", "ai.onnx"):
        if int_nchwc_reason(node, g, target) is not None:
            return None
        return "conv" if int(node.attr("group", 1)) == 1 else "dw"
    if (node.op, node.domain) == QLINEAR_ADD and len(node.inputs) >= 8 and node.inputs[7]:
        shapes = {g.values[n].shape for n in (node.inputs[0], node.inputs[3], node.outputs[0]) if n in g.values}
        return "add" if len(shapes) == 1 else None  # (no broadcasting)
    if (node.op == "Max" and node.domain in ("", "ai.onnx") and len(node.inputs) == 2
            and g.const(node.inputs[1]) is not None and g.const(node.inputs[1]).size == 1):
        return "relu"
    return None


def _component(seed: str, g: Graph, producers: dict[str, Node], consumers: dict[str, list[Node]],
               target: Target) -> tuple[set[str], list[Node], list[Node]] | None:
    """The set of values padded with ``seed``, the nodes whose outputs are in it (writers) and the
    plain convs reading it (readers); None where some node cannot take the padding."""
    values: set[str] = set()
    writers: dict[int, Node] = {}
    readers: dict[int, Node] = {}
    todo = [seed]
    while todo:
        v = todo.pop()
        if v in values:
            continue
        val = g.values.get(v)
        if (val is None or v in g.outputs or v in g.inputs or val.const is not None or not val.is_static
                or val.shape is None or len(val.shape) != 4 or val.dtype is None
                or np.dtype(val.dtype).name != "uint8"):
            return None
        values.add(v)
        p = producers.get(v)
        kind = None if p is None else _kind(p, g, target)
        if kind is None or p.outputs[0] != v:
            return None
        writers[id(p)] = p
        if kind == "dw":
            todo.append(p.inputs[0])
        elif kind == "add":
            todo += [p.inputs[0], p.inputs[3]]
        elif kind == "relu":
            todo.append(p.inputs[0])
        for r in consumers.get(v, []):
            rk = _kind(r, g, target)
            if rk == "conv" and r.inputs[0] == v and v not in r.inputs[1:]:
                readers[id(r)] = r
            elif rk in ("dw", "relu") and r.inputs[0] == v:
                todo.append(r.outputs[0])
            elif rk == "add" and v in (r.inputs[0], r.inputs[3]):
                todo += [r.inputs[0], r.inputs[3], r.outputs[0]]
            else:
                return None
    channels = {int(g.values[v].shape[1]) for v in values}
    if len(channels) != 1:
        return None
    return values, list(writers.values()), list(readers.values())


def _pad_axis(a: np.ndarray, axis: int, size: int, fill: float = 0) -> np.ndarray:
    widths = [(0, 0)] * a.ndim
    widths[axis] = (0, size - a.shape[axis])
    return np.pad(a, widths, constant_values=fill)


def _pad_conv_output(node: Node, g: Graph, cp: int) -> None:
    """``node``'s output channels to ``cp``: zero weights, unit scales, zero bias (depthwise: its
    group too)."""
    ins = list(node.inputs) + [""] * (9 - len(node.inputs))
    w = g.const(ins[3])
    ins[3] = g.add_const(_pad_axis(w, 0, cp), f"{node.name}_W_padded")
    ws = g.const(ins[4])
    if ws.size > 1:
        ins[4] = g.add_const(_pad_axis(ws.reshape(-1), 0, cp, 1.0), f"{node.name}_W_scale_padded")
    wz = g.const(ins[5]) if ins[5] else None
    if wz is not None and wz.size > 1:
        ins[5] = g.add_const(_pad_axis(wz.reshape(-1), 0, cp), f"{node.name}_W_zero_padded")
    if ins[8]:
        ins[8] = g.add_const(_pad_axis(g.const(ins[8]).reshape(-1), 0, cp), f"{node.name}_B_padded")
    node.inputs = ins if ins[8] else ins[:8]
    if int(node.attr("group", 1)) != 1:
        node.attrs = dict(node.attrs, group=cp)
        node.attr_protos = [a for a in node.attr_protos if a.name != "group"] + [helper.make_attribute("group", cp)]


def pad_int8_channels(g: Graph, target: Target) -> Graph:
    """Pad the channels of 8-bit activations between blocked int8 convs to the int8 block where
    that is invisible (module docstring)."""
    block = int_block(target)
    if block is None or g.shape_generic:
        return g
    producers, consumers = g.producers(), g.consumers()
    done: set[str] = set()
    for node in list(g.nodes):
        if _kind(node, g, target) != "conv":
            continue
        y = node.outputs[0]
        v = g.values.get(y)
        if y in done or v is None or v.shape is None or len(v.shape) != 4 or int(v.shape[1]) % block == 0:
            continue
        found = _component(y, g, producers, consumers, target)
        if found is None:
            done.add(y)
            continue
        values, writers, readers = found
        done |= values
        cp = -(-int(v.shape[1]) // block) * block
        for w in writers:
            if w.op == "QLinearConv":
                _pad_conv_output(w, g, cp)
        for r in readers:
            r.inputs = list(r.inputs)
            r.inputs[3] = g.add_const(_pad_axis(g.const(r.inputs[3]), 1, cp), f"{r.name}_W_padded")
        for name in values:
            shape = list(g.values[name].shape)
            shape[1] = cp
            g.values[name].shape = tuple(shape)
    return g
