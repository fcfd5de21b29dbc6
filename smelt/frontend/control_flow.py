"""Guards: decisions taken per call from small graph inputs, before the native code runs, that
the model is specialized (and compiled) for, like once per input shape. Two kinds:

* ``BranchGuard`` (this module): an If whose condition depends only on small graph inputs
  (silero-vad's ``sr == 16000``) is decided per call and compiled once per branch combination.
* ``ValueGuard`` (``smelt.frontend.value_guards``): a small input that decides shapes (a
  Reshape target, reduction axes, Resize scales, ...) is compiled in as a constant, once per
  distinct value. Its decisions are open-ended, so ``Decisions`` caps how many distinct ones a
  model specializes for (``settings.max_variants()``) and warns past that.

A guard has ``inputs`` (the graph inputs it reads), ``open_ended`` (whether its decisions are an
unbounded set), ``evaluate(feeds)`` (its decision: hashable, part of the variant key) and
``apply(proto, decision)`` (writes the decision into a copy of the model). ``guards`` finds both
kinds; ``specialize`` applies a tuple of decisions.

For each such If a ``BranchGuard`` holds the nodes that compute its condition from the inputs
(a few scalar ops: the guard is refused if they include anything heavier, or read anything but
graph inputs of at most ``MAX_GUARD_ELEMS`` elements, initializers and Constants). At a call,
``Decisions`` evaluates them with onnx.reference on the caller's (tiny) values; ``specialize`` writes
each decision into a copy of the model as a constant condition, which the compiler's If
inlining pass (smelt.passes.inline_if) turns into the branch's own nodes.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import onnx
from onnx import helper, numpy_helper

from smelt import settings
from smelt.frontend.value_guards import MAX_VALUE_ELEMS, value_guards, warn_widened

# ops a guard may evaluate: shape and comparison glue, never compute
GUARD_OPS = frozenset({"Identity", "Cast", "Reshape", "Squeeze", "Unsqueeze", "Gather", "Flatten", "Constant",
                       "Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Not", "And", "Or", "Xor",
                       "Shape", "Size", "ReduceMax", "ReduceMin", "Mod", "Add", "Sub", "Mul", "Div"})
MAX_GUARD_ELEMS = 64  # a guard reads graph inputs up to this size (sample rates, flags, lengths)
MAX_GUARD_NODES = 32
MAX_REMEMBERED = 256  # distinct guard-input values whose decisions are kept


class Guard(Protocol):
    inputs: tuple[str, ...]
    open_ended: bool

    def evaluate(self, feeds: Mapping[str, np.ndarray]) -> Hashable: ...

    def apply(self, proto: onnx.ModelProto, decision: Hashable) -> None: ...


@dataclass
class BranchGuard:
    node: str  # the If node's name
    cond: str  # the value its condition reads
    inputs: tuple[str, ...]  # the graph inputs the condition depends on
    model: onnx.ModelProto  # the nodes computing ``cond`` from ``inputs``
    _evaluator: object = field(default=None, repr=False)
    open_ended: bool = False  # two branches

    def evaluate(self, feeds: Mapping[str, np.ndarray]) -> bool:
        if self._evaluator is None:
            from onnx.reference import ReferenceEvaluator

            from smelt.runtime.reference_ops import FIXED_OPS

            self._evaluator = ReferenceEvaluator(self.model, new_ops=FIXED_OPS)
        (value,) = self._evaluator.run(None, {k: feeds[k] for k in self.inputs})  # type: ignore[attr-defined]
        value = np.asarray(value)
        if value.size != 1:
            raise ValueError(f"If node {self.node!r}: its condition has {value.size} elements, not one")
        return bool(value.reshape(()))

    def apply(self, proto: onnx.ModelProto, decision: bool) -> None:
        """Make the If of ``proto`` (a copy, edited in place) read ``decision`` as a constant condition."""
        for idx, node in enumerate(proto.graph.node):
            if node.op_type == "If" and _name(node, idx) == self.node:
                const = f"{self.node}/decided_condition"
                proto.graph.initializer.append(numpy_helper.from_array(np.array(decision), const))
                node.input[0] = const


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


def guards(proto: onnx.ModelProto) -> list[Guard]:
    """Every guard of ``proto``: its input-decided Ifs, then its shape-deciding small inputs."""
    return [*branch_guards(proto), *value_guards(proto)]


class Decisions:
    """Each guard's decision for given feeds, remembered per distinct value of the inputs the
    guards read: onnx.reference takes tens of microseconds, a model like silero-vad a hundred in
    all, while a caller passes the same sample rate on every call.

    Open-ended guards (values) are bounded: after ``settings.max_variants()`` distinct
    combinations of their decisions, a new combination is not specialized (its open-ended
    decisions become None: the generic variant) and a ``ValueSpecializationWarning`` says so once.
    Without the cap, a caller passing a new Reshape target on every call would compile on every
    call; with it, those calls run the generic variant's fallback nodes instead."""

    def __init__(self, guards: list[Guard], open_limit: int | None = None, warn: bool = True) -> None:
        self.guards = guards
        # open-ended combinations to specialize for (None: settings.max_variants()); ``warn``:
        # say once when the cap is reached
        self.open_limit = open_limit
        self.warn = warn
        self.names = sorted({i for g in guards for i in g.inputs})
        self._seen: dict[tuple, tuple] = {}
        self._specialized: set[tuple] = set()  # open-ended decision combinations compiled for
        self._widened = False
        self._max_elems = max(MAX_GUARD_ELEMS, MAX_VALUE_ELEMS)
        # concurrent calls: the evaluators and the eviction are not thread-safe; a hit needs no lock
        self._lock = threading.Lock()

    def _key(self, arr: np.ndarray) -> tuple:
        # an input too large for any guard to read by value (a value guard's input of unknown
        # declared size) is keyed by its type and shape only: never hash a data tensor per call.
        # dtype.num (an int) rather than dtype.str, which builds a string: this runs every call
        if arr.size > self._max_elems:
            return (arr.dtype.num, arr.shape)
        return (arr.dtype.num, arr.shape, arr.tobytes())

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> tuple:
        key = tuple([self._key(np.asarray(feeds[n])) for n in self.names])
        found = self._seen.get(key)
        if found is None:
            with self._lock:
                found = self._bounded(tuple(g.evaluate(feeds) for g in self.guards))
                if len(self._seen) >= MAX_REMEMBERED:
                    self._seen.pop(next(iter(self._seen)))
                self._seen[key] = found
        return found

    def _bounded(self, decided: tuple) -> tuple:
        """``decided`` with its open-ended decisions dropped (None) once the cap is reached."""
        opened = tuple(d for g, d in zip(self.guards, decided, strict=True) if g.open_ended)
        if not any(d is not None for d in opened) or opened in self._specialized:
            return decided
        limit = settings.max_variants() if self.open_limit is None else self.open_limit
        if len(self._specialized) < limit:
            self._specialized.add(opened)
            return decided
        if not self._widened and self.warn:
            self._widened = True
            warn_widened(sorted({i for g in self.guards if g.open_ended for i in g.inputs}), limit)
        return tuple(None if g.open_ended else d for g, d in zip(self.guards, decided, strict=True))


def specialize(proto: onnx.ModelProto, guards: list[Guard], choices: tuple) -> onnx.ModelProto:
    """A copy of ``proto`` with each guard's decision written in (constant If conditions,
    constant shape operands)."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    for g, c in zip(guards, choices, strict=True):
        g.apply(out, c)
    return out
