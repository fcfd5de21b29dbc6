"""Pass: 1-D convolution networks run as 2-D ones with a height of one.

A Conv over [N, C, L] reads as the 2-D Conv over [N, C, 1, L] with kernel [1, k]. Only the 2-D
form has the blocked NCHW[x]c kernels, layout planning and Winograd; the 1-D form runs on the
NCHW GEMM (im2col in its packing) with a layout transform nowhere to save. So each region of
1-D values around a Conv is lifted whole: every value of the region gains the unit height (axis
2), each node's attributes that name axes or spatial sizes gain that axis, and the region's
boundary gets one Reshape in (a rank-3 value from outside, e.g. the graph input) and one
Reshape out (a value read outside the region or a graph output, which keeps its name and its
rank-3 shape). Element-wise chains, pooling, padding, slicing, concatenation and residual adds
between the convs stay inside, so blocked values flow from conv to conv as in a CNN.

The region grows over nodes of ``_LIFTABLE``: ops whose meaning does not depend on the rank
beyond the attributes rewritten here (Conv, pooling, BatchNormalization, InstanceNormalization,
element-wise ops, Concat/Split/Slice/Pad). It is a connected set of them joined by rank-3
values; only regions holding a Conv are lifted (a lone element-wise chain gains nothing). A
Conv joins only when it gains (``_gains``): output channels that divide into blocks and a
shallow reduction (deeper 1-D convs run well on the GEMM already). ConvTranspose stays 1-D (no
blocked kernel). A broadcast operand of rank 2 or 3 gains the unit axis at
its second-to-last position (a constant is reshaped, a run-time value gets a Reshape), so it
broadcasts against the lifted value as before; ranks 0 and 1 broadcast over the last axis
either way.

Needs: shapes inferred and static for the region (runs after the fold fixpoint), before
BatchNorm folding and epilogue fusion (which then see 2-D convs). Guarantees: every value read
outside the region or returned keeps its name, rank-3 shape and dtype; new values are
``<name>__h1`` (lifted) and ``<node>/h1`` (reshaped operands).
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from smelt.ir.graph import Graph, Node, Value
from smelt.ir.ops import BINARY_BROADCAST, UNARY_ELEMENTWISE
from smelt.schedule.conv import GEMM_MIN_REDUCTION, NCHWC_BLOCKS

# ops lifted with their attributes rewritten (spatial lists gain the unit height)
_SPATIAL = ("Conv", "MaxPool", "AveragePool", "LpPool")
# ops whose meaning is the same at rank 4 with no attribute changed (channel axis 1 kept)
_RANK_FREE = frozenset(UNARY_ELEMENTWISE) | frozenset(BINARY_BROADCAST) | {
    "BatchNormalization", "InstanceNormalization", "GlobalAveragePool", "GlobalMaxPool", "Dropout"}
# ops with an axis (attribute or constant operand) that moves with the lifted rank
_AXIS_OPS = ("Concat", "Split", "Slice", "Pad")
_LIFTABLE = frozenset(_SPATIAL) | _RANK_FREE | frozenset(_AXIS_OPS)
# the ops whose presence makes a region worth lifting
_ANCHORS = ("Conv",)


def lift_1d_convs(g: Graph) -> Graph:
    candidates = [n for n in g.nodes if _liftable(g, n)]
    if not any(n.op in _ANCHORS for n in candidates):
        return g
    readers = g.consumers()
    lifted = [n for region in _regions(g, candidates)
              if 0 < _crossings(g, region, readers) <= sum(n.op in _ANCHORS for n in region) for n in region]
    if lifted:
        _Lifter(g, lifted).run()
        g.prune_values()
    return g


# -- which nodes ------------------------------------------------------------------------------
def _rank3(g: Graph, name: str) -> bool:
    v = g.values.get(name)
    return (v is not None and v.const is None and v.is_static and len(v.shape) == 3
            and all(int(d) > 0 for d in v.shape))


def _static_rank(g: Graph, name: str) -> int | None:
    v = g.values.get(name)
    return len(v.shape) if v is not None and v.is_static else None


def _liftable(g: Graph, n: Node) -> bool:
    if n.op not in _LIFTABLE or n.domain not in ("", "ai.onnx") or n.epilogue or n.guard is not None:
        return False
    outs = [o for o in n.outputs if o]
    if not outs or not all(_rank3(g, o) for o in outs):
        return False
    if n.op in _SPATIAL:
        # one data input of rank 3 (Conv: constant weights, rank 3); MaxPool's Indices output
        # counts positions of the original shape: not lifted
        if not _rank3(g, n.inputs[0]) or len(outs) != 1 or len(n.outputs) > 1 and n.outputs[1]:
            return False
        if n.op == "Conv":
            w = g.const(n.inputs[1]) if len(n.inputs) > 1 else None
            return w is not None and w.ndim == 3 and _gains(g, n, w.shape)
        return True
    if n.op in _RANK_FREE:
        return all((r := _static_rank(g, n.inputs[k])) is not None and r <= 3 for k in _data_inputs(n))
    if n.op == "Concat":
        return all(_rank3(g, i) for i in n.present_inputs())
    if n.op == "Split":
        return _rank3(g, n.inputs[0]) and all(g.const(i) is not None for i in n.inputs[1:] if i)
    # Slice (opset >= 10), Pad (opset >= 11): rank-3 data, every other operand a constant
    # (starts, ends, axes, steps; pads, value, axes); the older forms' attributes are not rewritten
    return (len(n.inputs) >= (3 if n.op == "Slice" else 2) and _rank3(g, n.inputs[0])
            and all(g.const(i) is not None for i in n.inputs[1:] if i))


def _gains(g: Graph, n: Node, w_shape: tuple[int, ...]) -> bool:
    """Whether the conv gains from running as a blocked 2-D conv: its output channels divide
    into blocks (whole groups of them; a conv left on the NCHW GEMM gains nothing: a 64->51
    strided conv ran 9% slower lifted), and its reduction (input channels per group x taps) is
    shallow, below ``GEMM_MIN_REDUCTION``, where the 2-D planner too never takes the GEMM. A
    deep 1-D conv already runs the GEMM near the direct kernel's efficiency (a 128->128 k=3 conv
    over 7500 steps: 79% of the 1-thread peak as the GEMM, 70% direct in its network), and
    lifting it would pull its neighbours into blocked layouts for nothing. (A lifted conv has
    one output row per image: at batch 1 the direct kernel cuts it into column segments to have
    work for every thread, ``schedule.conv.row_segments``.)"""
    block = min(NCHWC_BLOCKS)
    oc, cg, taps, group = int(w_shape[0]), int(w_shape[1]), int(w_shape[2]), int(n.attr("group", 1))
    depthwise = group > 1 and group == oc == int(g.values[n.inputs[0]].shape[1])
    return (oc % block == 0 and (group == 1 or depthwise or (oc // group) % block == 0)
            and cg * taps < GEMM_MIN_REDUCTION)


def _data_inputs(n: Node) -> list[int]:
    """Positions of ``n``'s inputs that are lifted with it (the others are weights, parameters
    and constant operands, rewritten or kept as they are)."""
    if n.op in _SPATIAL or n.op in ("BatchNormalization", "InstanceNormalization", "Split", "Slice", "Pad"):
        return [0]
    return [k for k, i in enumerate(n.inputs) if i]


def _crossings(g: Graph, region: list[Node], readers: dict[str, list[Node]]) -> int:
    """The Reshapes lifting ``region`` costs: rank-2/3 run-time values it reads from outside, and
    its values read outside or returned. Each is a copy of its tensor (and a layout transform
    next to a blocked one), each lifted conv a saving of part of its time: a region is lifted
    when it holds at least as many convs as crossings (a 1-D TCN: 15 convs, 2 crossings; a U-Net
    whose deep convs stay on the GEMM: 3 shallow convs and 20 crossings around the deep ones)."""
    ids = {id(n) for n in region}
    made = {o for n in region for o in n.outputs if o}
    inbound = {n.inputs[k] for n in region for k in _data_inputs(n)
               if n.inputs[k] not in made and g.values[n.inputs[k]].const is None
               and len(g.values[n.inputs[k]].shape) >= 2}
    outbound = [o for o in made if o in g.outputs or any(id(r) not in ids for r in readers.get(o, []))]
    return len(inbound) + len(outbound)


def _regions(g: Graph, candidates: list[Node]) -> list[list[Node]]:
    """Connected components of ``candidates``, joined where one's rank-3 output is another's input."""
    index = {id(n): k for k, n in enumerate(candidates)}
    parent = list(range(len(candidates)))

    def find(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    producer = {o: n for n in candidates for o in n.outputs if o}
    for n in candidates:
        for i in n.present_inputs():
            p = producer.get(i)
            if p is not None:
                parent[find(index[id(n)])] = find(index[id(p)])
    groups: dict[int, list[Node]] = {}
    for n in candidates:
        groups.setdefault(find(index[id(n)]), []).append(n)
    return list(groups.values())


# -- rewriting ---------------------------------------------------------------------------------
def _with_height(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A rank-2 or rank-3 shape with the unit height before its last axis; lower ranks as given."""
    return shape if len(shape) < 2 else (*shape[:-1], 1, shape[-1])


def _axis(axis: int, rank: int = 3) -> int:
    """An axis of the rank-3 value, counted in the lifted rank-4 one."""
    a = axis + rank if axis < 0 else axis
    return a if a < 2 else a + 1


class _Lifter:
    def __init__(self, g: Graph, nodes: list[Node]) -> None:
        self.g = g
        self.nodes = nodes
        self.ids = {id(n) for n in nodes}
        self.renamed: dict[str, str] = {}  # a region value -> its lifted name
        self.inbound: dict[str, str] = {}  # an outside value -> its lifted Reshape's output

    def run(self) -> None:
        g = self.g
        for n in self.nodes:
            for o in n.outputs:
                if o:
                    v = g.values[o]
                    new = g.fresh_name(f"{o}__h1")
                    g.add_value(Value(new, v.dtype, _with_height(tuple(v.shape))))
                    self.renamed[o] = new
        readers = g.consumers()
        out: list[Node] = []
        for n in g.nodes:
            if id(n) not in self.ids:
                out.append(n)
                continue
            before: list[Node] = []
            self._rewrite(n, before)
            out.extend(before)
            out.append(n)
            for k, o in enumerate(n.outputs):
                if not o:
                    continue
                new = self.renamed[o]
                n.outputs[k] = new
                outside = o in g.outputs or any(id(r) not in self.ids for r in readers.get(o, []))
                if outside:  # read as rank 3 outside the region: a Reshape back, under the old name
                    out.append(self._reshape(new, o, tuple(g.values[o].shape), f"{n.name}/h1_out"))
        g.nodes = out

    def _reshape(self, src: str, dst: str, shape: tuple[int, ...], name: str) -> Node:
        shape_const = self.g.add_const(np.array(shape, np.int64), f"{name}/shape")
        return Node("Reshape", self.g.fresh_name(name), [src, shape_const], [dst])

    def _lifted_input(self, name: str, node: Node, before: list[Node]) -> str:
        """``name`` as the lifted node reads it: the region's lifted value, a constant with the unit
        height, or a Reshape of an outside value (one per value, shared by every reader)."""
        g = self.g
        if name in self.renamed:
            return self.renamed[name]
        v = g.values[name]
        if v.const is not None:
            if v.const.ndim < 2:
                return name
            return g.add_const(v.const.reshape(_with_height(v.const.shape)), f"{node.name}/h1")
        if len(v.shape) < 2:
            return name
        if name not in self.inbound:
            new = g.fresh_name(f"{name}__h1")
            g.add_value(Value(new, v.dtype, _with_height(tuple(v.shape))))
            before.append(self._reshape(name, new, _with_height(tuple(v.shape)), f"{node.name}/h1_in"))
            self.inbound[name] = new
        return self.inbound[name]

    def _rewrite(self, n: Node, before: list[Node]) -> None:
        """``n`` on lifted data inputs, with its attributes and axis operands for rank 4."""
        g = self.g
        for k in _data_inputs(n):
            n.inputs[k] = self._lifted_input(n.inputs[k], n, before)
        if n.op in _SPATIAL:
            if n.op == "Conv":
                w = g.const(n.inputs[1])
                n.inputs[1] = g.add_const(w.reshape(w.shape[0], w.shape[1], 1, w.shape[2]), f"{n.name}/w_h1")
            self._spatial_attrs(n)
        elif n.op in ("Concat", "Split"):
            self._set_attrs(n, axis=_axis(int(n.attr("axis", 0))))
        elif n.op == "Slice":
            self._slice_axes(n)
        elif n.op == "Pad":
            self._pads(n)

    def _set_attrs(self, n: Node, **changed: object) -> None:
        """Change attributes in both forms the node carries (decoded, and the protos the
        fallback and export hand to onnx)."""
        n.attrs.update(changed)
        kept = [a for a in n.attr_protos if a.name not in changed]
        n.attr_protos = kept + [helper.make_attribute(k, v) for k, v in changed.items()]

    def _spatial_attrs(self, n: Node) -> None:
        changed: dict[str, object] = {}
        for key in ("kernel_shape", "strides", "dilations"):
            v = n.attr(key)
            if v is not None:
                changed[key] = [1, *(int(x) for x in v)]
        pads = n.attr("pads")
        if pads is not None:
            changed["pads"] = [0, int(pads[0]), 0, int(pads[1])]
        if n.op == "Conv" and n.attr("kernel_shape") is None:
            changed["kernel_shape"] = [1, int(self.g.values[n.inputs[1]].shape[-1])]
        self._set_attrs(n, **changed)

    def _slice_axes(self, n: Node) -> None:
        g = self.g
        starts = g.const(n.inputs[1])
        axes = g.const(n.inputs[3]) if len(n.inputs) > 3 and n.inputs[3] else np.arange(len(starts), dtype=np.int64)
        while len(n.inputs) < 4:
            n.inputs.append("")
        n.inputs[3] = g.add_const(np.array([_axis(int(a)) for a in axes], axes.dtype), f"{n.name}/axes_h1")

    def _pads(self, n: Node) -> None:
        g = self.g
        pads = g.const(n.inputs[1])
        axes_name = n.inputs[3] if len(n.inputs) > 3 and n.inputs[3] else ""
        if axes_name:  # pads for the listed axes only: the axes move, the pads stay
            axes = g.const(axes_name)
            n.inputs[3] = g.add_const(np.array([_axis(int(a)) for a in axes], axes.dtype), f"{n.name}/axes_h1")
            return
        b, e = pads[:3], pads[3:]
        zero = np.zeros(1, pads.dtype)
        n.inputs[1] = g.add_const(np.concatenate([b[:2], zero, b[2:], e[:2], zero, e[2:]]), f"{n.name}/pads_h1")
