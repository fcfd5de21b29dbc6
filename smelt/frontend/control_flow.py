"""Branch specialization: an If whose condition depends only on small graph inputs (silero-vad's
``sr == 16000``) is decided per call, before the native code runs, and the model is compiled once
per branch combination taken, like once per input shape.

For each such If a ``BranchGuard`` holds the nodes that compute its condition from the inputs
(a few scalar ops: the guard is refused if they include anything heavier, or read anything but
graph inputs of at most ``MAX_GUARD_ELEMS`` elements, initializers and Constants). At a call,
``Decisions`` evaluates them with onnx.reference on the caller's (tiny) values; ``specialize`` writes
each decision into a copy of the model as a constant condition, which the compiler's If
inlining pass (smelt.passes.inline_if) turns into the branch's own nodes.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

# ops a guard may evaluate: shape and comparison glue, never compute
GUARD_OPS = frozenset({"Identity", "Cast", "Reshape", "Squeeze", "Unsqueeze", "Gather", "Flatten", "Constant",
                       "Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Not", "And", "Or", "Xor",
                       "Shape", "Size", "ReduceMax", "ReduceMin", "Mod", "Add", "Sub", "Mul", "Div"})
MAX_GUARD_ELEMS = 64  # a guard reads graph inputs up to this size (sample rates, flags, lengths)
MAX_GUARD_NODES = 32
MAX_REMEMBERED = 256  # distinct guard-input values whose decisions are kept


@dataclass
class BranchGuard:
    node: str  # the If node's name
    cond: str  # the value its condition reads
    inputs: tuple[str, ...]  # the graph inputs the condition depends on
    model: onnx.ModelProto  # the nodes computing ``cond`` from ``inputs``
    _evaluator: object = field(default=None, repr=False)

    def evaluate(self, feeds: Mapping[str, np.ndarray]) -> bool:
        if self._evaluator is None:
            from onnx.reference import ReferenceEvaluator

            self._evaluator = ReferenceEvaluator(self.model)
        (value,) = self._evaluator.run(None, {k: feeds[k] for k in self.inputs})  # type: ignore[attr-defined]
        value = np.asarray(value)
        if value.size != 1:
            raise ValueError(f"If node {self.node!r}: its condition has {value.size} elements, not one")
        return bool(value.reshape(()))


def tensor_outputs(branch: onnx.GraphProto) -> bool:
    """No output of the branch is declared a sequence, an optional or a map (smelt's values are
    tensors; an output exported without a type is taken to be a tensor, as inference will check)."""
    return not any(o.type.HasField(kind) for o in branch.output
                   for kind in ("sequence_type", "optional_type", "map_type"))


def _name(node: onnx.NodeProto, idx: int) -> str:
    """The node's name as smelt's IR names it (frontend.onnx_import.to_ir)."""
    return node.name or f"{node.op_type}_{idx}"


def _small(vi: onnx.ValueInfoProto) -> bool:
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
        return False
    dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim]
    return all(d >= 0 for d in dims) and int(np.prod(dims, dtype=np.int64)) <= MAX_GUARD_ELEMS


def branch_guards(proto: onnx.ModelProto) -> list[BranchGuard]:
    """Guards for the top-level Ifs whose condition depends on small graph inputs only."""
    graph = proto.graph
    producer = {o: n for n in graph.node for o in n.output if o}
    inits = {i.name: i for i in graph.initializer}
    inputs = {vi.name: vi for vi in graph.input if vi.name not in inits}
    guards = []
    for idx, if_node in enumerate(graph.node):
        if if_node.op_type != "If" or if_node.domain not in ("", "ai.onnx"):
            continue
        if not all(tensor_outputs(a.g) for a in if_node.attribute if a.type == onnx.AttributeProto.GRAPH):
            continue  # sequence/optional branches stay with the fallback
        nodes, used_inputs, used_inits, todo, seen, ok = [], set(), set(), [if_node.input[0]], set(), True
        while todo and ok:
            name = todo.pop()
            if not name or name in seen:
                continue
            seen.add(name)
            if name in inits:
                used_inits.add(name)
            elif name in inputs:
                ok = _small(inputs[name])
                used_inputs.add(name)
            elif name in producer and producer[name].op_type in GUARD_OPS and producer[name].domain in ("", "ai.onnx"):
                nodes.append(producer[name])
                todo += list(producer[name].input)
            else:
                ok = False
        if not ok or not used_inputs or len(nodes) > MAX_GUARD_NODES:
            continue  # a constant condition folds at compile time; a data-dependent one falls back
        order = [n for n in graph.node if any(n is m for m in nodes)]  # the graph's topological order
        sub = helper.make_graph(order, f"guard_{if_node.name}", [inputs[i] for i in sorted(used_inputs)],
                                [helper.make_empty_tensor_value_info(if_node.input[0])],
                                initializer=[inits[i] for i in sorted(used_inits)])
        model = helper.make_model(sub, opset_imports=list(proto.opset_import))
        model.ir_version = proto.ir_version
        guards.append(BranchGuard(_name(if_node, idx), if_node.input[0], tuple(sorted(used_inputs)), model))
    return guards


class Decisions:
    """Each guarded If's branch for given feeds (True: then_branch), remembered per distinct
    value of the inputs the guards read: onnx.reference takes tens of microseconds, a model like
    silero-vad a hundred in all, while a caller passes the same sample rate on every call."""

    def __init__(self, guards: list[BranchGuard]) -> None:
        self.guards = guards
        self.names = sorted({i for g in guards for i in g.inputs})
        self._seen: dict[tuple, tuple[bool, ...]] = {}
        # concurrent calls: the evaluators and the eviction are not thread-safe; a hit needs no lock
        self._lock = threading.Lock()

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> tuple[bool, ...]:
        key = tuple((feeds[n].dtype.str, feeds[n].shape, feeds[n].tobytes()) for n in self.names)
        found = self._seen.get(key)
        if found is None:
            with self._lock:
                found = tuple(g.evaluate(feeds) for g in self.guards)
                if len(self._seen) >= MAX_REMEMBERED:
                    self._seen.pop(next(iter(self._seen)))
                self._seen[key] = found
        return found


def specialize(proto: onnx.ModelProto, guards: list[BranchGuard], choices: tuple[bool, ...]) -> onnx.ModelProto:
    """A copy of ``proto`` whose guarded Ifs read their decided condition as a constant."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    by_name = {g.node: c for g, c in zip(guards, choices, strict=True)}
    for idx, node in enumerate(out.graph.node):
        if node.op_type == "If" and _name(node, idx) in by_name:
            const = f"{_name(node, idx)}/decided_condition"
            out.graph.initializer.append(numpy_helper.from_array(np.array(by_name[_name(node, idx)]), const))
            node.input[0] = const
    return out
