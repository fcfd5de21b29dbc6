"""Value specialization: small graph inputs that decide shapes are compiled in as constants.

ONNX lets a model take a Reshape's target shape, a reduction's axes, Resize's scales or sizes,
Slice's starts/ends/axes/steps, Pad's pads, Split's sizes, a Range's bounds, ... as graph
*inputs* (every ONNX node test does; exported models do it for lengths and sample rates). Then
no output shape is known before the call, and those nodes (and everything downstream) leave the
native code for the onnx.reference fallback. These operands are tiny and a caller rarely varies
them, so smelt keys the compiled variant on their *values*, as it keys it on input shapes and on
the branch of an If (``smelt.frontend.control_flow``, whose ``Decisions``/``specialize`` machinery
this module plugs into: a ``ValueGuard`` is one more guard kind).

``value_guards`` walks back from every *structural operand* (``STRUCTURAL_OPERANDS``) through
shape arithmetic (``SHAPE_ARITHMETIC``, If nodes' taken-branch outputs included) to its leaves.
When every leaf is a constant, the output of a Shape/Size (a static shape once inference has
run), or a graph input with at most ``MAX_VALUE_ELEMS`` elements, each such input gets a guard
naming the edges of that cone that read it. At a call the guard's decision is the input's value
(dtype, shape, bytes); ``ValueGuard.apply`` writes it into the variant's copy of the model as an
initializer and points those edges, and only those, at it: constant folding and shape inference
then give every downstream value a static shape. Nodes that read the input as *data* (outside
every cone) still read the real graph input, so a small input that is both a shape and a data
operand never turns data paths into folded weights.

Bounds: an input whose actual size exceeds ``MAX_VALUE_ELEMS`` at a call is not specialized
(decision None: the generic variant, where those nodes run on the fallback); and
``control_flow.Decisions`` caps the distinct value combinations a model specializes for, after
which it warns (``ValueSpecializationWarning``) and runs new values on the generic variant
instead of recompiling per call.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

MAX_VALUE_ELEMS = 64  # a specialized input holds at most this many elements (shapes, axes, scales)
MAX_CONE_NODES = 256  # nodes walked back from one structural operand before giving up on it

REDUCE_OPS = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
              "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")

# (op, input positions) whose value decides an output shape or a compile-time constant a template
# needs (Resize's roi and scales, CumSum's axis, Trilu's k): never data a kernel streams through.
# Not DFT/STFT: they have no native template, and onnx 1.2x's STFT inference contradicts its own
# reference (16 bins where onesided gives 9) once frame_length is a constant
STRUCTURAL_OPERANDS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "Slice": (1, 2, 3, 4), "Pad": (1, 3), "Split": (1,),
    "Squeeze": (1,), "Unsqueeze": (1,), "Resize": (1, 2, 3), "Upsample": (1,), "ConstantOfShape": (0,),
    "Range": (0, 1, 2), "TopK": (1,), "OneHot": (1,), "CenterCropPad": (1,), "CumSum": (1,), "Trilu": (1,),
    "Col2Im": (1, 2), "MaxUnpool": (2,), "HannWindow": (0,), "AffineGrid": (1,),
    "HammingWindow": (0,), "BlackmanWindow": (0,), "MelWeightMatrix": (0, 1, 2, 3, 4),
    "Dropout": (1, 2),  # ratio and training_mode: at ratio 0 or not training, a copy (masks.py)
    "Loop": (0, 1),  # trip count and condition: constant ones let passes/unroll_loops.py unroll it
    **{op: (1,) for op in REDUCE_OPS},
}

# ops a cone may pass through: shape arithmetic, whose result is a constant once its inputs are
# (constant folding evaluates them at compile time; nothing here runs per call)
SHAPE_ARITHMETIC = frozenset({
    "Identity", "Cast", "CastLike", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Gather", "GatherElements",
    "GatherND", "Concat", "Slice", "Split", "Expand", "Tile", "Transpose", "Add", "Sub", "Mul", "Div", "Mod",
    "Pow", "Neg", "Abs", "Sign", "Floor", "Ceil", "Round", "Sqrt", "Reciprocal", "Relu", "Max", "Min", "Sum",
    "Mean", "Clip", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Xor",
    "Where", "ReduceProd", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceMean", "Range", "ConstantOfShape",
    "ArgMax", "ArgMin", "CumSum",
})  # not NonZero/Compress/Unique: shapes decided by data, whose small inputs would change per call
LEAF_OPS = frozenset({"Constant", "Shape", "Size"})  # values decided without reading another value's data
STANDARD = ("", "ai.onnx")

Edge = tuple[tuple[tuple[int, str], ...], int, int]  # (path of (If node index, branch) from the top, node, input)


class ValueSpecializationWarning(UserWarning):
    """A model saw more distinct values of its shape-deciding inputs than it compiles variants for;
    further values run on the generic variant (those nodes on the fallback) instead of recompiling."""


@dataclass
class ValueGuard:
    """Specializes the variant on the value of graph input ``input`` (see the module doc)."""

    input: str
    edges: tuple[Edge, ...]  # the reads of ``input`` inside shape-deciding cones
    open_ended: bool = True  # decisions are values, not a bounded set: Decisions caps how many

    @property
    def inputs(self) -> tuple[str, ...]:
        return (self.input,)

    def evaluate(self, feeds: Mapping[str, np.ndarray]) -> tuple | None:
        """The input's value as a key (dtype, shape, bytes), or None when it is too large to specialize."""
        arr = np.asarray(feeds[self.input])
        if arr.size > MAX_VALUE_ELEMS or arr.dtype.kind not in "biuf":
            return None
        return (arr.dtype.str, tuple(arr.shape), np.ascontiguousarray(arr).tobytes())

    def apply(self, proto: onnx.ModelProto, decision: tuple | None) -> None:
        """Point the guarded edges of ``proto`` (a copy, edited in place) at the decided value."""
        if decision is None:
            return
        dtype, shape, raw = decision
        value = np.frombuffer(raw, dtype=np.dtype(dtype)).reshape(shape)
        taken = _all_names(proto.graph)
        name, k = f"{self.input}/specialized_value", 1
        while name in taken:
            name, k = f"{self.input}/specialized_value_{k}", k + 1
        proto.graph.initializer.append(numpy_helper.from_array(value, name))
        for path, idx, pos in self.edges:
            graph = proto.graph
            for node_idx, attr in path:
                graph = next(a.g for a in graph.node[node_idx].attribute if a.name == attr)
            node = graph.node[idx]
            assert node.input[pos] == self.input, (node.name, pos, self.input)
            node.input[pos] = name


def _all_names(graph: onnx.GraphProto) -> set[str]:
    names = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    for n in graph.node:
        names.update(n.output)
        for a in n.attribute:
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                names |= _all_names(sub)
    return names


def _candidate(vi: onnx.ValueInfoProto) -> bool:
    """A graph input that may be specialized: a numeric or bool tensor of at most
    MAX_VALUE_ELEMS elements, or of unknown size (then decided per call by its actual size)."""
    if not vi.type.HasField("tensor_type"):
        return False
    tt = vi.type.tensor_type
    if tt.elem_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED, onnx.TensorProto.COMPLEX64,
                        onnx.TensorProto.COMPLEX128):
        return False
    if not tt.HasField("shape"):
        return True
    dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    if any(d is None for d in dims):
        return True
    return int(np.prod(dims, dtype=np.int64)) <= MAX_VALUE_ELEMS


class _Scope:
    """One graph (the model's, or an If branch inside it) and where its names come from."""

    def __init__(self, graph: onnx.GraphProto, parent: _Scope | None, path: tuple[tuple[int, str], ...]) -> None:
        self.graph, self.parent, self.path = graph, parent, path
        self.producer = {o: i for i, n in enumerate(graph.node) for o in n.output if o}
        self.consts = {i.name for i in graph.initializer}
        self.formal = {i.name for i in graph.input} - self.consts  # a subgraph's per-iteration inputs

    def resolve(self, name: str) -> tuple[_Scope, str]:
        """(the scope defining ``name``, how: "node", "const", "input" or "unknown")."""
        s: _Scope | None = self
        while s is not None:
            if name in s.producer:
                return s, "node"
            if name in s.consts:
                return s, "const"
            if name in s.formal:
                return s, "input"
            s = s.parent
        return self, "unknown"


class _Cone:
    """The walk back from one structural operand; ``ok`` False as soon as a leaf is data."""

    def __init__(self, candidates: set[str]) -> None:
        self.candidates = candidates
        self.ok = True
        self.edges: dict[str, set[Edge]] = {}
        self.seen: set[tuple] = set()
        self.nodes = 0

    def read(self, scope: _Scope, idx: int, pos: int, name: str) -> None:
        """Node ``idx`` of ``scope`` reads ``name`` at input ``pos``, inside the cone."""
        if not name or not self.ok:
            return
        where, how = scope.resolve(name)
        if how == "input" and where.parent is None and name in self.candidates:
            self.edges.setdefault(name, set()).add((scope.path, idx, pos))
        self.walk(scope, name)

    def walk(self, scope: _Scope, name: str) -> None:
        where, how = scope.resolve(name)
        key = (where.path, name)  # a scope's path names it uniquely
        if not self.ok or key in self.seen:
            return
        self.seen.add(key)
        if how == "const":
            return
        if how in ("input", "unknown"):
            # a top-level candidate is a leaf the guard decides; anything else is data
            self.ok = how == "input" and where.parent is None and name in self.candidates
            return
        idx = where.producer[name]
        node = where.graph.node[idx]
        self.nodes += 1
        if self.nodes > MAX_CONE_NODES or node.domain not in STANDARD:
            self.ok = False
        elif node.op_type in LEAF_OPS:
            return
        elif node.op_type == "If":
            self.read(where, idx, 0, node.input[0])
            k = list(node.output).index(name)
            for attr in node.attribute:  # each branch, back from its output that becomes ``name``
                if attr.type == onnx.AttributeProto.GRAPH and k < len(attr.g.output):
                    self.walk(_Scope(attr.g, where, where.path + ((idx, attr.name),)), attr.g.output[k].name)
        elif node.op_type in SHAPE_ARITHMETIC:
            for pos, inp in enumerate(node.input):
                self.read(where, idx, pos, inp)
        else:
            self.ok = False


def _operands(scope: _Scope):
    """(scope, node index, input position) of every structural operand in ``scope`` and in the
    If branches nested in it (Loop/Scan bodies run per iteration: their operands are left alone)."""
    for idx, node in enumerate(scope.graph.node):
        if node.domain not in STANDARD:
            continue
        for pos in STRUCTURAL_OPERANDS.get(node.op_type, ()):
            if pos < len(node.input) and node.input[pos]:
                yield scope, idx, pos
        if node.op_type == "If":
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    yield from _operands(_Scope(attr.g, scope, scope.path + ((idx, attr.name),)))


def value_guards(proto: onnx.ModelProto) -> list[ValueGuard]:
    """A guard for each small graph input that decides a structural operand (module doc)."""
    inits = {i.name for i in proto.graph.initializer}
    candidates = {vi.name for vi in proto.graph.input if vi.name not in inits and _candidate(vi)}
    if not candidates:
        return []
    top = _Scope(proto.graph, None, ())
    top.formal = {vi.name for vi in proto.graph.input} - inits
    edges: dict[str, set[Edge]] = {}
    for scope, idx, pos in _operands(top):
        cone = _Cone(candidates)
        cone.read(scope, idx, pos, scope.graph.node[idx].input[pos])
        if cone.ok:
            for name, found in cone.edges.items():
                edges.setdefault(name, set()).update(found)
    return [ValueGuard(name, tuple(sorted(found))) for name, found in sorted(edges.items())]


def warn_widened(inputs: list[str], limit: int) -> None:
    warnings.warn(f"inputs {inputs} decide shapes and took more than {limit} distinct values (SMELT_MAX_VARIANTS): "
                  "later values run on one generic variant, where the nodes they size use the onnx.reference "
                  "fallback, instead of compiling a variant per call", ValueSpecializationWarning, stacklevel=4)
