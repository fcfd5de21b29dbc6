"""The geometry of a pooling node (kernel, strides, pads, dilations, ceil mode, output sizes),
shared by the plain pooling template and the blocked (NCHWc) one."""

from __future__ import annotations

from dataclasses import dataclass

from smelt.ir.graph import Graph, Node

MAX_POOL_OUTPUT = 1 << 20  # per-dim tables of this many entries at most


@dataclass
class Geometry:
    kind: str  # "max", "avg", "lp"
    n: int
    c: int
    ins: list[int]
    outs: list[int]
    kernel: list[int]
    strides: list[int]
    dilations: list[int]
    pads_begin: list[int]
    pads_end: list[int]

    def valid_range(self, d: int, o: int) -> tuple[int, int]:
        """Taps [lo, hi) of dim d that land inside the input for output index o."""
        start = o * self.strides[d] - self.pads_begin[d]
        taps = [k for k in range(self.kernel[d]) if 0 <= start + k * self.dilations[d] < self.ins[d]]
        return (taps[0], taps[-1] + 1) if taps else (0, 0)

    def padded_count(self, d: int, o: int) -> int:
        """Taps of dim d inside the explicitly padded extent [-pads_begin, in + pads_end)."""
        start = o * self.strides[d] - self.pads_begin[d]
        return sum(1 for k in range(self.kernel[d])
                   if -self.pads_begin[d] <= start + k * self.dilations[d] < self.ins[d] + self.pads_end[d])


def _ints(node: Node, key: str, default: list[int]) -> list[int]:
    v = node.attr(key)
    return [int(a) for a in v] if v is not None else list(default)


def geometry(node: Node, g: Graph) -> tuple[Geometry | None, str]:
    xs = [int(d) for d in g.values[node.inputs[0]].shape]
    if len(xs) < 3:
        return None, "pooling needs a spatial dim"
    ins = xs[2:]
    k = len(ins)
    kernel = _ints(node, "kernel_shape", [])
    if len(kernel) != k or min(kernel) < 1:
        return None, "kernel_shape does not match the input rank"
    strides = _ints(node, "strides", [1] * k)
    dil = _ints(node, "dilations", [1] * k)
    pads = _ints(node, "pads", [0] * 2 * k)
    if len(strides) != k or len(dil) != k or len(pads) != 2 * k or min(strides + dil) < 1 or min(pads) < 0:
        return None, "malformed strides, dilations or pads"
    auto_pad = node.attr("auto_pad", "NOTSET")
    ceil_mode = int(node.attr("ceil_mode", 0))
    span = [(kernel[d] - 1) * dil[d] + 1 for d in range(k)]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        if max(dil) > 1:
            return None, "auto_pad SAME with dilations (implementations disagree)"
        outs = [-(-ins[d] // strides[d]) for d in range(k)]
        total = [(outs[d] - 1) * strides[d] + kernel[d] - ins[d] for d in range(k)]
        if min(total) < 0:
            return None, "auto_pad SAME with a negative total pad"
        small = [t // 2 for t in total]
        big = [t - t // 2 for t in total]
        pb, pe = (small, big) if auto_pad == "SAME_UPPER" else (big, small)
    elif auto_pad == "VALID":
        pb, pe = [0] * k, [0] * k
        outs = [(ins[d] - span[d]) // strides[d] + 1 for d in range(k)]
    elif auto_pad in ("NOTSET", ""):
        pb, pe = pads[:k], pads[k:]
        outs = []
        for d in range(k):
            num = ins[d] + pb[d] + pe[d] - span[d]
            o = (-(-num // strides[d]) if ceil_mode else num // strides[d]) + 1
            if ceil_mode and (o - 1) * strides[d] >= ins[d] + pb[d]:
                o -= 1
            outs.append(o)
    else:
        return None, f"unknown auto_pad {auto_pad!r}"
    kind = {"MaxPool": "max", "AveragePool": "avg", "LpPool": "lp"}[node.op]
    geo = Geometry(kind, xs[0], xs[1], ins, outs, kernel, strides, dil, pb, pe)
    ys = [int(d) for d in g.values[node.outputs[0]].shape]
    if ys != xs[:2] + outs:
        return None, f"inferred output shape {ys} differs from the pooling arithmetic's {xs[:2] + outs}"
    if any(o > MAX_POOL_OUTPUT for o in outs):
        return None, f"a pooling output dimension above {MAX_POOL_OUTPUT} (its compile-time tables would be too large)"
    for d in range(k):
        for o in range(outs[d]):
            lo, hi = geo.valid_range(d, o)
            if hi <= lo:
                return None, "a pooling window holds no input element"
    return geo, ""
