"""Concat without copies: producers write straight into their slice of the concat's buffer.

For a Concat whose inputs are contiguous byte runs of its output (one image, or more generally
nothing but ones before the axis: SqueezeNet's fire modules, Inception's branches, DenseNet's
growing feature stacks on NCHW<b>c), each input can live *inside* the output's buffer at its
slice. Its producer then writes the concatenated result directly and the Concat step does
nothing. The memory planner asks this module which values are such views and places every group
of them as one arena region.

Groups nest: DenseNet's layer k concatenates [x0, f1, ..., f(k-1)], and layer k+1 the same list
plus f(k), so every concat output of a dense block becomes a view of the block's last one and
each f(i) is written once, where every later layer reads it.

Safety rules (each checked, else the Concat keeps its copy):
- every value involved is internal to one native block's arena (not a graph input or output,
  not handed across blocks), the output has one dtype with its inputs, no input repeats;
- each slice starts on an ``ALIGN``-byte boundary (kernels use aligned vector stores);
- an input already in a group must sit at the same offset relative to this Concat as the slices
  demand, for every input from that group (groups move rigidly);
- values that are *written* (everything except the elided Concats' outputs, which are views)
  never overlap inside a group, so a byte has one writer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from smelt.ir.graph import Graph, Node


@dataclass
class ConcatViews:
    """Where each aliased value lives: ``parent[v] = (u, offset)`` means v's bytes start
    ``offset`` bytes into u's (offsets may be negative before a group is normalized)."""

    parent: dict[str, tuple[str, int]] = field(default_factory=dict)
    elided: set[str] = field(default_factory=set)  # Concat node names that copy nothing

    def find(self, v: str) -> tuple[str, int]:
        off = 0
        while v in self.parent:
            v, d = self.parent[v]
            off += d
        return v, off

    def groups(self) -> dict[str, dict[str, int]]:
        """root -> {member: offset relative to the root} (the root itself included, at 0)."""
        out: dict[str, dict[str, int]] = {}
        for v in self.parent:
            root, off = self.find(v)
            out.setdefault(root, {root: 0})[v] = off
        return out


def _slices(node: Node, g: Graph, align: int) -> list[tuple[str, int]] | None:
    """(input, byte offset in the output) when every input is one contiguous aligned run."""
    y = g.values[node.outputs[0]]
    shape = list(y.shape)
    rank = len(shape)
    if rank == 0:
        return None
    axis = int(node.attr("axis", 0))
    axis = axis + rank if axis < 0 else axis
    if int(np.prod(shape[:axis], dtype=np.int64)) != 1:
        return None  # several runs per input (batch > 1): keep the copy
    inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
    item = np.dtype(y.dtype).itemsize
    out, off = [], 0
    for name in node.present_inputs():
        v = g.values[name]
        if np.dtype(v.dtype) != np.dtype(y.dtype) or v.layout != y.layout or off % align:
            return None
        out.append((name, off))
        off += int(v.shape[axis]) * inner * item
    return out


def plan_concat_views(g: Graph, nodes: list[Node], internal: set[str], align: int) -> ConcatViews:
    """Decide, in topological order, which Concats of ``nodes`` become views."""
    views = ConcatViews()
    nbytes = {v: g.values[v].nbytes for v in internal}
    producers = g.producers()
    for node in nodes:
        if node.op != "Concat" or node.outputs[0] not in internal:
            continue
        y = node.outputs[0]
        parts = _slices(node, g, align)
        if not parts or len({n for n, _ in parts}) != len(parts) or any(n not in internal for n, _ in parts):
            continue
        # the shift that puts each input group in place, agreed by all its inputs
        shifts: dict[str, int] = {}
        ok = True
        for name, want in parts:
            root, off = views.find(name)
            shift = want - off
            if shifts.setdefault(root, shift) != shift:
                ok = False
                break
        if not ok:
            continue
        groups = views.groups()
        written: list[tuple[int, int]] = []  # [start, end) of written members, relative to y
        for root, shift in shifts.items():
            members = groups.get(root, {root: 0})
            for m, off in members.items():
                if not (m in producers and producers[m].name in views.elided):  # views are not written
                    written.append((shift + off, shift + off + nbytes[m]))
        written.sort()
        if any(a_end > b_start for (_, a_end), (b_start, _) in zip(written, written[1:], strict=False)):
            continue
        for root, shift in shifts.items():
            views.parent[root] = (y, shift)
        views.elided.add(node.name)
    return views

