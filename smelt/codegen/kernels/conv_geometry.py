"""The geometry of an ONNX Conv node, and what every native convolution kernel requires of it.

Read by the conv templates (conv.py, conv_nchwc.py, winograd.py) and by the schedule stage's
cost models and layout planning (smelt/schedule/), so both see one definition.
"""

from __future__ import annotations

import numpy as np

from smelt.ir.graph import Graph, Node


class ConvGeometry:
    """Sizes, strides and begin-pads of one Conv node (spatial rank S)."""

    def __init__(self, node: Node, g: Graph) -> None:
        x, w = node.inputs[0], node.inputs[1]
        xs = tuple(int(d) for d in g.values[x].shape)
        ws = tuple(int(d) for d in g.values[w].shape)
        self.batch, self.c = xs[0], xs[1]
        self.ins = list(xs[2:])
        self.oc, self.cg = ws[0], ws[1]
        self.ks = list(ws[2:])
        s = len(self.ins)
        self.rank = s
        self.group = int(node.attr("group", 1))
        self.strides = [int(v) for v in (node.attr("strides") or [1] * s)]
        self.dils = [int(v) for v in (node.attr("dilations") or [1] * s)]
        auto_pad = node.attr("auto_pad", "NOTSET")
        if isinstance(auto_pad, bytes):
            auto_pad = auto_pad.decode()
        self.auto_pad = auto_pad
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            self.outs = [-(-i // st) for i, st in zip(self.ins, self.strides, strict=True)]
            begins, ends = [], []
            for i, o, k, st, d in zip(self.ins, self.outs, self.ks, self.strides, self.dils, strict=True):
                total = max(0, (o - 1) * st + (k - 1) * d + 1 - i)
                b = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
                begins.append(b)
                ends.append(total - b)
            self.pads = begins + ends
        else:
            self.pads = [0] * (2 * s) if auto_pad == "VALID" else [int(v) for v in (node.attr("pads") or [0] * (2 * s))]
            self.outs = [
                (i + self.pads[d] + self.pads[d + s] - ((k - 1) * dl + 1)) // st + 1
                for d, (i, k, st, dl) in enumerate(zip(self.ins, self.ks, self.strides, self.dils, strict=True))
            ]
        self.pb = self.pads[:s]
        self.ihw = int(np.prod(self.ins, dtype=np.int64))
        self.ohw = int(np.prod(self.outs, dtype=np.int64))
        self.ksp = int(np.prod(self.ks, dtype=np.int64))
        self.ocg = self.oc // self.group if self.group else 0

    @property
    def is_pointwise(self) -> bool:
        return all(k == 1 for k in self.ks) and all(st == 1 for st in self.strides) and not any(self.pads)

    @property
    def is_depthwise(self) -> bool:
        return self.group > 1 and self.group == self.c and self.cg == 1 and self.rank <= 2

    def describe(self) -> str:
        return (f"C={self.c} OC={self.oc} in={self.ins} out={self.outs} k={self.ks} s={self.strides} "
                f"pads={self.pads} d={self.dils} group={self.group} auto_pad={self.auto_pad}")


def check_conv(node: Node, g: Graph, runtime_weights: bool = False) -> str | None:
    """None when every native conv kernel can take this node (float32, constant weights, 1-D to
    3-D, consistent attributes), else why not. ``runtime_weights``: the weights need not be a
    constant (templates/conv_runtime.py, which reads them in ONNX's order)."""
    ins = node.present_inputs()
    for name in ins + [node.outputs[0]]:
        v = g.values[name]
        if v.dtype is None or np.dtype(v.dtype) != np.float32:
            return f"native Conv is float32 only ({name!r} is {np.dtype(v.dtype).name if v.dtype else '?'})"
    if g.const(node.inputs[1]) is None and not runtime_weights:
        return "native Conv needs constant weights (they are packed at compile time)"
    for name in (node.inputs[0], node.inputs[1], node.outputs[0]):
        if not g.values[name].is_static:  # a symbolic or unknown dim (the layout pass asks early)
            return f"Conv value {name!r} has no static shape"
    xs, ws = g.values[node.inputs[0]].shape, g.values[node.inputs[1]].shape
    if len(xs) < 3 or len(xs) > 5 or len(ws) != len(xs):
        return f"native Conv handles 1-D to 3-D convolutions (input rank {len(xs)})"
    try:
        geo = ConvGeometry(node, g)
    except (TypeError, ValueError) as exc:
        return f"unsupported Conv attributes: {exc}"
    if geo.auto_pad not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        return f"unknown auto_pad {geo.auto_pad!r}"
    if node.attr("kernel_shape") and [int(k) for k in node.attr("kernel_shape")] != geo.ks:
        return "kernel_shape attribute disagrees with the weights"
    if geo.group < 1 or geo.c % geo.group or geo.oc % geo.group or geo.c // geo.group != geo.cg:
        return f"inconsistent group={geo.group} for C={geo.c}, W {list(ws)}"
    if min(geo.strides + geo.dils) < 1 or min(geo.pads) < 0:
        return "Conv strides and dilations must be positive and pads non-negative"
    if geo.cg * geo.ksp == 0:
        return "Conv with an empty kernel"
    out = tuple(g.values[node.outputs[0]].shape)
    if out != (geo.batch, geo.oc, *geo.outs):
        return f"Conv output shape {out} differs from the computed {(geo.batch, geo.oc, *geo.outs)}"
    if len(node.inputs) > 2 and node.inputs[2] and tuple(g.values[node.inputs[2]].shape) != (geo.oc,):
        return "Conv bias must have shape [OC]"
    return None


def is_depthwise(geo: ConvGeometry) -> bool:
    return geo.group > 1 and geo.group == geo.c == geo.oc and geo.cg == 1


def is_flat_pointwise(geo: ConvGeometry) -> bool:
    """1x1, stride 1, unpadded: the plane runs as flat rows (see ``_Gen``)."""
    return geo.ks == [1, 1] and geo.strides == [1, 1] and not any(geo.pads) and not is_depthwise(geo)


def row_width(geo: ConvGeometry) -> int:
    """Output columns of one row as the kernel sees it (a flat pointwise plane is one row)."""
    return geo.outs[1] * (geo.outs[0] if is_flat_pointwise(geo) else 1)
