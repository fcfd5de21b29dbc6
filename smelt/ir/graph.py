"""smelt's graph IR: typed values and the operators that produce them.

The IR is deliberately close to ONNX (op types and attribute names are ONNX's) so that
`onnx.reference` and onnx's shape inference can serve as oracles for any node, while adding
what ONNX has no room for: a physical layout per value, constants held as numpy arrays, and
element-wise epilogues fused into their producer.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from smelt.ir.epilogue import EpilogueStep
from smelt.ir.subgraphs import outer_names, with_outer_renamed

Dim = int | str  # a concrete size or a symbolic dimension name
Shape = tuple[Dim, ...]


PLAIN = "plain"


def layout_block(layout: str) -> int:
    """Channels per block of a layout name: "plain" -> 1, "NCHW16c" -> 16 (a value in NCHW<b>c
    is stored [N][C/b][H][W][b]; plain NCHW is the b = 1 case for readers)."""
    if layout == PLAIN:
        return 1
    if layout.startswith("NCHW") and layout.endswith("c") and layout[4:-1].isdigit():
        return int(layout[4:-1])
    raise ValueError(f"unknown layout {layout!r}")


def blocked_layout(block: int) -> str:
    """The layout name of ``block`` channels per block (1 = plain)."""
    return PLAIN if block == 1 else f"NCHW{block}c"


@dataclass
class Value:
    """A tensor flowing through the graph.

    ``shape`` is None while unknown (rank unknown); a dimension may be a symbol string.
    ``layout`` names the physical layout: "plain" is the ONNX row-major order; blocked
    layouts such as "NCHW16c" are chosen by layout passes.
    ``const`` holds the data of initializers and folded constants.
    """

    name: str
    dtype: np.dtype | None = None
    shape: Shape | None = None
    layout: str = "plain"
    const: np.ndarray | None = None

    @property
    def is_const(self) -> bool:
        return self.const is not None

    @property
    def is_static(self) -> bool:
        return self.shape is not None and all(isinstance(d, int) for d in self.shape)

    @property
    def size(self) -> int:
        assert self.is_static, f"{self.name} has no static shape"
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        assert self.dtype is not None
        return self.size * np.dtype(self.dtype).itemsize


@dataclass
class Node:
    """One operator application.

    ``inputs`` may contain "" for an omitted optional input (ONNX's convention).
    ``attrs`` holds decoded attribute values; ``attr_protos`` keeps the original ONNX
    attributes so a node can be handed back to onnx (fallback, export) unchanged.
    ``epilogue`` lists element-wise ops fused into this node's output, applied in order;
    each a typed step of smelt/ir/epilogue.py (``EpilogueBinary`` reads an ``input`` value).
    """

    op: str
    name: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    domain: str = ""
    attr_protos: list[onnx.AttributeProto] = field(default_factory=list)
    epilogue: list[EpilogueStep] = field(default_factory=list)
    # how a template should compute this node, chosen by a layout/tuning pass (e.g. the NCHWc
    # convolution's blocking); empty = the template's deterministic default
    # how the node runs, written by the schedule stage (smelt.schedule: ConvSchedule, RnnSchedule); None before it
    schedule: Any = None
    # (condition value, polarity): the node runs only when the one-element bool condition equals
    # the polarity (its result is read only then: a branch of a run-time If, codegen/guards.py);
    # None = always. Set at plan time; the condition counts as an input for liveness.
    guard: tuple[str, bool] | None = None

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def present_inputs(self) -> list[str]:
        return [i for i in self.inputs if i]

    def all_inputs(self) -> list[str]:
        """Data inputs, values read by fused epilogues, and outer values read by subgraphs."""
        extra = [e.input for e in self.epilogue if e.input]
        if self.guard is not None:
            extra.append(self.guard[0])
        if self.attr_protos:
            for attr in self.attr_protos:
                if attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
                    extra.extend(sorted(outer_names(attr) - set(extra)))
        return self.present_inputs() + extra


class Graph:
    """A model: values by name, nodes in topological order, graph inputs and outputs."""

    def __init__(self, name: str = "model", opset: dict[str, int] | None = None) -> None:
        self.name = name
        self.values: dict[str, Value] = {}
        self.nodes: list[Node] = []
        self.inputs: list[str] = []
        self.outputs: list[str] = []
        self.opset: dict[str, int] = dict(opset or {"": 17})
        # an If branch was inlined (passes/inline_if.py): shape inference is as lenient with the
        # graph as it was while the branch was a subgraph
        self.inlined_branches = False
        # lowered for a shape class (compiler.ShapeClass): one library serves several input
        # shapes, so kernels whose code would otherwise depend on a size lay it out at run time
        self.shape_generic = False
        # with shape_generic: each value's shape at the class's decision shapes
        self.decision_shapes: dict[str, Shape | None] = {}
        # (dtype, shape) the model *declares* for values it does not feed (graph outputs,
        # value_info): checked against inference (smelt.frontend.validate), never used to size
        # a buffer, since a model's declaration can be wrong
        self.declared: dict[str, tuple[np.dtype | None, Shape | None]] = {}
        self._counter = itertools.count()

    # -- construction -----------------------------------------------------------------
    def add_value(self, value: Value) -> Value:
        self.values[value.name] = value
        return value

    def value(self, name: str) -> Value:
        try:
            return self.values[name]
        except KeyError:
            raise KeyError(f"graph {self.name!r} has no value named {name!r}") from None

    def fresh_name(self, hint: str) -> str:
        while True:
            name = f"{hint}__{next(self._counter)}"
            if name not in self.values:
                return name

    def add_const(self, array: np.ndarray, hint: str = "const") -> str:
        name = self.fresh_name(hint)
        arr = np.asarray(array)
        self.add_value(Value(name, arr.dtype, tuple(arr.shape), const=arr))
        return name

    # -- queries ----------------------------------------------------------------------
    def producers(self) -> dict[str, Node]:
        return {o: n for n in self.nodes for o in n.outputs if o}

    def consumers(self) -> dict[str, list[Node]]:
        result: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in n.all_inputs():
                result.setdefault(i, []).append(n)
        return result

    def const(self, name: str) -> np.ndarray | None:
        v = self.values.get(name)
        return None if v is None else v.const

    def iter_op(self, *ops: str) -> Iterator[Node]:
        for n in list(self.nodes):
            if n.op in ops and n.domain in ("", "ai.onnx"):
                yield n

    def remove_nodes(self, dead: Iterable[Node]) -> None:
        dead_ids = {id(n) for n in dead}
        self.nodes = [n for n in self.nodes if id(n) not in dead_ids]

    def replace_uses(self, old: str, new: str) -> None:
        """Make every reader of ``old`` read ``new`` instead (graph outputs included)."""
        for n in self.nodes:
            n.inputs = [new if i == old else i for i in n.inputs]
            n.epilogue = [e.with_input(new) if e.input == old else e for e in n.epilogue]
            if n.guard is not None and n.guard[0] == old:
                n.guard = (new, n.guard[1])
            if n.attr_protos and any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                                     for a in n.attr_protos):
                n.attr_protos = with_outer_renamed(n.attr_protos, {old: new})
                n.attrs.update({a.name: a for a in n.attr_protos
                                if a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)})
        self.outputs = [new if o == old else o for o in self.outputs]

    def prune_values(self) -> None:
        """Drop values nothing refers to any more."""
        live = set(self.inputs) | set(self.outputs)
        for n in self.nodes:
            live.update(n.all_inputs())
            live.update(o for o in n.outputs if o)
        self.values = {k: v for k, v in self.values.items() if k in live}

    def summary(self) -> str:
        ops: dict[str, int] = {}
        for n in self.nodes:
            ops[n.op] = ops.get(n.op, 0) + 1
        body = ", ".join(f"{k}×{v}" for k, v in sorted(ops.items()))
        return f"graph {self.name}: {len(self.nodes)} nodes ({body})"
