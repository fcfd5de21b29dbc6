"""Pass: ``x[:, s:e] = v`` as paddle2onnx writes it becomes a select with static shapes.

paddle2onnx lowers a slice assignment whose bounds are tensors (a decoder writing step i's
output into a preallocated buffer, ``x[:, i] = v``) to seven nodes:

    w      = Shape(Slice(x, s, e, axes=[a], steps=[1]))        # the slice's shape
    update = Expand(v, w)                                      # v broadcast over it
    index  = Tile(Reshape(Range(s, e, 1), [1, .., -1, .., 1]), ...)   # s..e-1 along axis a
    x'     = ScatterElements(x, index, update, axis=a)

Inside a Loop body ``s`` is the iteration counter, so no shape after the Slice is known when the
body is compiled: all seven ran on the onnx.reference fallback at every iteration (SLANet's
attention decoder: two such chains, about half of each call's time). Yet ``x'`` has ``x``'s shape,
and which positions are written is a comparison against a constant position ramp:

    x' = Where(in_range(p), v, x),   p = 0..D-1 along axis a (D = x's extent there)
    in_range(p) = s <= p < e  or  s + D <= p < e + D           # negative indices count from D

every node native, with static shapes (the ramp and the mask are [1, .., D, .., 1]: D elements).
``s`` and ``e`` are clamped to [-D, D] first, which changes no comparison and keeps ``+ D`` far
from int64 overflow (a Slice end is often INT64_MAX).

Matched only when: the ScatterElements has no reduction; the Slice reads the same ``x``, on the
one constant axis ``a`` with step 1; the Range's start and limit are the Slice's start and end
(up to Squeeze/Unsqueeze/Reshape/Identity of one element) and its delta the constant 1; the
Reshape's constant target puts the range on axis ``a`` alone; ``v`` has ``x``'s dtype and a
static shape that broadcasts to ``x``'s with extent 1 on axis ``a``. Where the original graph is
well-formed the answers are identical (every element is either copied or taken from ``v``). Where
it is not (a Range longer than the Slice, positions outside [-D, D): onnxruntime fails the call),
the select writes the positions that exist instead of failing.

Needs: shapes inferred (runs inside ``pipeline.fold_to_fixpoint``, after ``unroll_loops``).
Guarantees: the ScatterElements' output keeps its name and shape; the Slice/Shape/Expand/Range/
Reshape/Tile chain is left to dead-node elimination (read by nothing else, it goes); new values
are ``<scatter>/...`` and typed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from smelt.frontend.onnx_import import attribute_value
from smelt.ir.graph import Graph, Node, Value

_STANDARD = ("", "ai.onnx")
_PASS_THROUGH = ("Squeeze", "Unsqueeze", "Reshape", "Identity")  # a one-element value's other spellings


def _producer(producers: dict[str, Node], name: str, op: str) -> Node | None:
    node = producers.get(name)
    return node if node is not None and node.op == op and node.domain in _STANDARD else None


def _one_element_root(g: Graph, producers: dict[str, Node], name: str) -> str:
    """``name`` with Squeeze/Unsqueeze/Reshape/Identity of one element stripped off."""
    for _ in range(8):
        v = g.values.get(name)
        node = producers.get(name)
        if v is None or not v.is_static or v.size != 1 or node is None or node.op not in _PASS_THROUGH \
                or node.domain not in _STANDARD or not node.inputs:
            return name
        src = g.values.get(node.inputs[0])
        if src is None or not src.is_static or src.size != 1:
            return name
        name = node.inputs[0]
    return name


def _const_ints(g: Graph, name: str) -> list[int] | None:
    c = g.const(name) if name else None
    return None if c is None or c.dtype.kind not in "iu" else [int(x) for x in c.reshape(-1)]


@dataclass(frozen=True)
class _Match:
    scatter: Node
    axis: int
    start: str  # the slice's start and end (one-element integer values)
    end: str
    update: str  # v, before the Expand


def _match(g: Graph, producers: dict[str, Node], sc: Node) -> _Match | None:
    if sc.domain not in _STANDARD or len(sc.inputs) != 3 or sc.attr("reduction", "none") not in ("none", b"none"):
        return None
    data, index, update = sc.inputs
    x, y = g.values.get(data), g.values.get(sc.outputs[0])
    if x is None or y is None or not x.is_static or x.dtype is None or not x.shape:
        return None
    rank = len(x.shape)
    axis = int(sc.attr("axis", 0))
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis < rank:
        return None
    # update = Expand(v, Shape(Slice(x, s, e, [a], [1])))
    expand = _producer(producers, update, "Expand")
    shape = _producer(producers, expand.inputs[1], "Shape") if expand is not None else None
    if shape is None or shape.attr("start") not in (None, 0) or shape.attr("end") is not None:
        return None
    sl = _producer(producers, shape.inputs[0], "Slice")
    if sl is None or len(sl.inputs) < 4 or sl.inputs[0] != data:
        return None
    axes = _const_ints(g, sl.inputs[3])
    steps = _const_ints(g, sl.inputs[4]) if len(sl.inputs) > 4 and sl.inputs[4] else [1]
    if axes is None or len(axes) != 1 or (axes[0] + rank if axes[0] < 0 else axes[0]) != axis or steps != [1]:
        return None
    start, end = sl.inputs[1], sl.inputs[2]
    for bound in (start, end):
        bv = g.values.get(bound)
        if bv is None or not bv.is_static or bv.size != 1 or bv.dtype is None or np.dtype(bv.dtype).kind != "i":
            return None
    # index = Tile(Reshape(Range(s, e, 1), [1, .., -1 at a, .., 1]), reps)
    tile = _producer(producers, index, "Tile")
    reshape = _producer(producers, tile.inputs[0], "Reshape") if tile is not None else None
    ramp = _producer(producers, reshape.inputs[0], "Range") if reshape is not None else None
    if ramp is None:
        return None
    target = _const_ints(g, reshape.inputs[1])
    if target is None or len(target) != rank or any(d != 1 for k, d in enumerate(target) if k != axis) \
            or target[axis] == 0:
        return None
    if _const_ints(g, ramp.inputs[2]) != [1]:
        return None
    same = _one_element_root(g, producers, ramp.inputs[0]) == _one_element_root(g, producers, start) \
        and _one_element_root(g, producers, ramp.inputs[1]) == _one_element_root(g, producers, end)
    if not same:
        return None
    # v broadcasts to x's shape with extent 1 on axis a
    v = g.values.get(expand.inputs[0])
    if v is None or not v.is_static or v.dtype != x.dtype or len(v.shape) > rank:
        return None
    padded = (1,) * (rank - len(v.shape)) + tuple(v.shape)
    if padded[axis] != 1 or any(d not in (1, x.shape[k]) for k, d in enumerate(padded) if k != axis):
        return None
    return _Match(sc, axis, start, end, expand.inputs[0])


def _rewrite(g: Graph, m: _Match) -> list[Node]:
    sc = m.scatter
    x = g.values[sc.inputs[0]]
    rank, extent = len(x.shape), int(x.shape[m.axis])
    prefix = sc.name or sc.outputs[0]
    nodes: list[Node] = []

    def value(hint: str, dtype: type, shape: tuple[int, ...]) -> str:
        name = g.fresh_name(f"{prefix}/{hint}")
        g.add_value(Value(name, np.dtype(dtype), shape))
        return name

    def add(op: str, inputs: list[str], out: str, **attrs: object) -> str:
        protos = [onnx.helper.make_attribute(k, v) for k, v in attrs.items()]
        nodes.append(Node(op, f"{prefix}/{op}_{len(nodes)}", inputs, [out],
                          attrs={a.name: attribute_value(a) for a in protos}, attr_protos=protos))
        return out

    ramp_shape = tuple(extent if k == m.axis else 1 for k in range(rank))
    ramp = g.add_const(np.arange(extent, dtype=np.int64).reshape(ramp_shape), f"{prefix}/positions")
    lo, hi = g.add_const(np.array([-extent], np.int64), f"{prefix}/lo"), \
        g.add_const(np.array([extent], np.int64), f"{prefix}/hi")

    def bound(name: str, hint: str) -> str:
        """The slice bound as int64 [1], clamped to [-D, D]."""
        b = g.values[name]
        if b.shape != (1,):
            name = add("Reshape", [name, g.add_const(np.array([1], np.int64), f"{prefix}/one")],
                       value(f"{hint}_1", b.dtype, (1,)))
        if np.dtype(b.dtype) != np.int64:
            name = add("Cast", [name], value(f"{hint}_i64", np.int64, (1,)), to=onnx.TensorProto.INT64)
        name = add("Max", [name, lo], value(f"{hint}_lo", np.int64, (1,)))
        return add("Min", [name, hi], value(f"{hint}_clamped", np.int64, (1,)))

    s, e = bound(m.start, "start"), bound(m.end, "end")
    s_wrapped = add("Add", [s, hi], value("start_plus_extent", np.int64, (1,)))
    e_wrapped = add("Add", [e, hi], value("end_plus_extent", np.int64, (1,)))

    def between(low: str, high: str, hint: str) -> str:
        at_least = add("GreaterOrEqual", [ramp, low], value(f"{hint}_ge", np.bool_, ramp_shape))
        below = add("Less", [ramp, high], value(f"{hint}_lt", np.bool_, ramp_shape))
        return add("And", [at_least, below], value(hint, np.bool_, ramp_shape))

    mask = add("Or", [between(s, e, "in_slice"), between(s_wrapped, e_wrapped, "in_wrapped_slice")],
               value("written", np.bool_, ramp_shape))
    add("Where", [mask, m.update, sc.inputs[0]], sc.outputs[0])
    return nodes


def slice_assign_as_where(g: Graph) -> Graph:
    """Every ``x[.., s:e, ..] = v`` chain (module docstring) as a Where over a position mask."""
    scatters = list(g.iter_op("ScatterElements"))
    if not scatters:  # the usual case, every fold round: no producer map to build
        return g
    producers = g.producers()
    for sc in scatters:
        m = _match(g, producers, sc)
        if m is None:
            continue
        at = g.nodes.index(sc)
        g.nodes[at:at + 1] = _rewrite(g, m)
        producers = g.producers()
    return g
