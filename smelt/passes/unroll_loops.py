"""Pass: a Scan or Loop of static length becomes its body, once per iteration, when that runs natively.

No template runs a subgraph, so a Scan or Loop used to run whole through the onnx.reference
fallback (the body interpreted in Python, step by step). With every shape static a Scan's
iteration count T is known, and Scan (opset 9 on) is exactly its body applied T times with the
state threaded through:

- scan input j, iteration i: ``Gather(x_j, i, axis_j)`` (index T - 1 - i for a reverse direction),
  which removes the scanned axis as the body expects;
- the body's nodes copied per iteration, its values renamed ``<scan>/<i>/<name>``, its state
  inputs bound to the previous iteration's state outputs (the Scan's initial states first), its
  reads of outer values kept as they are;
- final states: ``Identity`` of the last iteration's state outputs (eliminated later);
- scan output k: the iterations' values ``Unsqueeze``d at the output axis and ``Concat``enated
  along it (reverse direction: in reverse order).

A Loop (opset 11 on) unrolls the same way when its trip count M is a constant (folded, or
compiled in by value specialization: ``frontend.value_guards`` treats M as a structural operand)
and its condition input is absent or constant true: the body's iteration number becomes the
constant i, its condition input the previous iteration's condition output, and every
iteration's condition output but the last must fold to a constant true (a body that may stop
early is left whole; the last one stops nothing M does not: tf2onnx's Keras RNN loops compute
``i + 1 < T``, false exactly there); scan outputs stack along a new leading axis.

As ``expand_functions``, only when the whole unrolled graph, folded and inferred in a scratch
graph, leaves no node to the fallback, and only up to ``MAX_UNROLLED_NODES`` body nodes in all
(a long sequence stays one fallback node rather than a huge program). Scan-8, whose states and
scan inputs carry a leading batch axis (the sequence on axis 1), unrolls per batch element and
step when its sequence_lens is absent or all full. Not unrolled: bodies with subgraphs of their
own, zero iterations, shorter sequence_lens.

Needs: shapes inferred. Runs inside ``pipeline.fold_to_fixpoint`` after ``expand_functions``
(a function body may hold a Scan or Loop: LinearAttention's and Range's do). Guarantees: the
node's outputs keep their names; new values are typed (shape inference re-runs).
"""

from __future__ import annotations

import copy

import numpy as np
import onnx
from onnx import numpy_helper

from smelt.codegen.registry import find_template
from smelt.frontend.onnx_import import attribute_value, op_version
from smelt.frontend.validate import check_graph
from smelt.ir.graph import Graph, Node, Value
from smelt.passes.constant_folding import fold_constants
from smelt.passes.eliminate_identity import eliminate_identity
from smelt.passes.expand_functions import expand_functions
from smelt.passes.shape_inference import infer_shapes

# body nodes x iterations above which a Scan is left to the fallback (compile time and code size)
MAX_UNROLLED_NODES = 4096
SCRATCH_ROUNDS = 8


def _ints(node: Node, key: str, n: int) -> list[int]:
    v = node.attr(key)
    return [int(x) for x in v] if v else [0] * n


def _body(node: Node) -> onnx.GraphProto | None:
    for a in node.attr_protos:
        if a.name == "body" and a.type == onnx.AttributeProto.GRAPH:
            return a.g
    return None


class _Names:
    """Fresh value and node names, unique in ``g`` and among those handed out."""

    def __init__(self, g: Graph) -> None:
        self.g = g
        self.taken: set[str] = set()
        self.nodes = {n.name for n in g.nodes}

    def value(self, hint: str) -> str:
        name, k = hint, 0
        while name in self.g.values or name in self.taken:
            k += 1
            name = f"{hint}__{k}"
        self.taken.add(name)
        return name

    def node(self, hint: str) -> str:
        while hint in self.nodes:
            hint += "_"
        self.nodes.add(hint)
        return hint


class _Builder:
    """The unrolled nodes of one Scan or Loop node, and the constants they add."""

    def __init__(self, g: Graph, node: Node) -> None:
        self.names = _Names(g)
        self.prefix = f"{node.name}/"
        self.opset = g.opset.get("", 1)
        self.consts: dict[str, Value] = {}
        self.nodes: list[Node] = []
        self.true: list[str] = []  # values that must fold to a constant true (Loop conditions)
        self.body_consts: dict[str, str] = {}  # the body's initializers, one constant each for all iterations

    def const(self, hint: str, arr: np.ndarray) -> str:
        name = self.names.value(self.prefix + hint)
        self.consts[name] = Value(name, arr.dtype, tuple(arr.shape), const=arr)
        return name

    def add(self, op: str, inputs: list[str], outputs: list[str], **attrs) -> None:
        protos = [onnx.helper.make_attribute(k, v) for k, v in attrs.items()]
        self.nodes.append(Node(op=op, name=self.names.node(f"{self.prefix}{op}_{len(self.nodes)}"), inputs=inputs,
                               outputs=outputs, attrs={a.name: attribute_value(a) for a in protos},
                               attr_protos=protos))

    def iteration(self, body: onnx.GraphProto, i: int, bound: dict[str, str]) -> list[str]:
        """One copy of ``body`` with its inputs ``bound`` (formal name -> value); returns the
        values of its outputs. Reads of outer values keep their names."""
        for init in body.initializer:  # the body's own constants (a Loop's bound, a step of 1)
            if init.name not in self.body_consts:
                self.body_consts[init.name] = self.const(f"body/{init.name}", numpy_helper.to_array(init))
        rename = {"": "", **self.body_consts, **bound}
        for bn in body.node:
            outs = []
            for o in bn.output:
                if o:
                    rename[o] = self.names.value(f"{self.prefix}{i}/{o}")
                outs.append(rename[o] if o else "")
            protos = [copy.deepcopy(a) for a in bn.attribute]
            self.nodes.append(Node(op=bn.op_type, name=self.names.node(f"{self.prefix}{i}/{bn.name or bn.op_type}"),
                                   inputs=[rename.get(x, x) for x in bn.input], outputs=outs,
                                   attrs={a.name: attribute_value(a) for a in protos}, domain=bn.domain,
                                   attr_protos=protos))
        return [rename.get(o.name, o.name) for o in body.output]

    def stack(self, values: list[str], axis: int, y: str, k: int) -> None:
        """``y`` = the values stacked along a new ``axis`` (Unsqueeze each, one Concat)."""
        parts = []
        for i, v in enumerate(values):
            u = self.names.value(f"{self.prefix}{i}/scan_out{k}")
            parts.append(u)
            if self.opset >= 13:
                self.add("Unsqueeze", [v, self.const("axis", np.array([axis], np.int64))], [u])
            else:
                self.add("Unsqueeze", [v], [u], axes=[axis])
        self.add("Concat", parts, [y], axis=axis)

    def finish(self, node: Node, state: list[str]) -> None:
        for s, v in enumerate(state):
            if s < len(node.outputs) and node.outputs[s]:
                self.add("Identity", [v], [node.outputs[s]])


def _plain_body(g: Graph, node: Node) -> onnx.GraphProto | None:
    body = _body(node)
    if body is None or node.domain not in ("", "ai.onnx"):
        return None
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in body.node for a in n.attribute):
        return None
    if body.sparse_initializer:
        return None
    for name in node.present_inputs():
        v = g.values.get(name)
        if v is None or v.dtype is None or not v.is_static:
            return None
    return body


def _scan8(g: Graph, node: Node, body: onnx.GraphProto) -> _Builder | None:
    """Scan-8: every state and scan input carries a leading batch axis, the sequence is axis 1
    of the scan inputs; each batch element is its own Scan. Unrolled per batch element and step
    when the optional sequence_lens is absent or a constant equal to the full length."""
    m = int(node.attr("num_scan_inputs", 0))
    lens, rest = node.inputs[0], node.inputs[1:]
    n_state = len(rest) - m
    k_out = len(body.output) - n_state
    if m <= 0 or n_state < 0 or k_out < 0 or len(body.input) != n_state + m or not all(rest):
        return None
    dirs = _ints(node, "directions", m)
    shapes = [g.values[x].shape for x in rest]
    if any(len(s) < 1 for s in shapes) or any(len(s) < 2 for s in shapes[n_state:]):
        return None
    batch = {int(s[0]) for s in shapes}
    steps = {int(s[1]) for s in shapes[n_state:]}
    if len(batch) != 1 or len(steps) != 1:
        return None
    nb, t = batch.pop(), steps.pop()
    if lens:
        given = g.values[lens].const
        if given is None or given.shape != (nb,) or not bool(np.all(given == t)):
            return None
    if nb <= 0 or t <= 0 or nb * t * (len(body.node) + 2 * m + 2) > MAX_UNROLLED_NODES:
        return None
    b = _Builder(g, node)

    def take(x: str, index: int, axis: int, hint: str) -> str:
        v = b.names.value(f"{b.prefix}{hint}")
        b.add("Gather", [x, b.const(f"index{index}", np.array(index, np.int64))], [v], axis=axis)
        return v

    finals: list[list[str]] = [[] for _ in range(n_state)]
    outs: list[list[str]] = [[] for _ in range(k_out)]
    for e in range(nb):
        state = [take(x, e, 0, f"b{e}/state{s}") for s, x in enumerate(rest[:n_state])]
        seqs = [take(x, e, 0, f"b{e}/seq{j}") for j, x in enumerate(rest[n_state:])]
        per_iter: list[list[str]] = [[] for _ in range(k_out)]
        for i in range(t):
            bound = {formal.name: state[s] for s, formal in enumerate(body.input[:n_state])}
            for j, formal in enumerate(body.input[n_state:]):
                bound[formal.name] = take(seqs[j], t - 1 - i if dirs[j] else i, 0, f"b{e}/{i}/{formal.name}")
            results = b.iteration(body, e * t + i, bound)
            state = results[:n_state]
            for k in range(k_out):
                per_iter[k].append(results[n_state + k])
        for s in range(n_state):
            finals[s].append(state[s])
        for k in range(k_out):
            y = b.names.value(f"{b.prefix}b{e}/scan_out{k}")
            b.stack(per_iter[k], 0, y, k)  # scan outputs in step order, whatever the direction
            outs[k].append(y)
    for s in range(n_state):
        if node.outputs[s]:
            b.stack(finals[s], 0, node.outputs[s], n_state + k_out + s)
    for k in range(k_out):
        y = node.outputs[n_state + k] if n_state + k < len(node.outputs) else ""
        if y:
            b.stack(outs[k], 0, y, k)
    return b


def _scan(g: Graph, node: Node) -> _Builder | None:
    body = _plain_body(g, node)
    if body is None or op_version(g, node) < 8:
        return None
    if op_version(g, node) == 8:
        return _scan8(g, node, body)
    m = int(node.attr("num_scan_inputs", 0))
    n_state = len(node.inputs) - m
    k_out = len(body.output) - n_state
    if m <= 0 or n_state < 0 or k_out < 0 or len(body.input) != n_state + m or not all(node.inputs):
        return None
    in_axes, in_dirs = _ints(node, "scan_input_axes", m), _ints(node, "scan_input_directions", m)
    out_axes, out_dirs = _ints(node, "scan_output_axes", k_out), _ints(node, "scan_output_directions", k_out)
    scans = node.inputs[n_state:]
    lengths = set()
    for j, x in enumerate(scans):
        shape = g.values[x].shape
        in_axes[j] %= max(len(shape), 1)
        lengths.add(int(shape[in_axes[j]]) if shape else -1)
    if len(lengths) != 1:
        return None
    t = lengths.pop()
    if t <= 0 or t * (len(body.node) + m + 2) > MAX_UNROLLED_NODES:
        return None
    b = _Builder(g, node)
    state = list(node.inputs[:n_state])
    per_iter: list[list[str]] = [[] for _ in range(k_out)]
    for i in range(t):
        bound = {formal.name: state[s] for s, formal in enumerate(body.input[:n_state])}
        for j, formal in enumerate(body.input[n_state:]):
            idx = t - 1 - i if in_dirs[j] else i
            sl = b.names.value(f"{b.prefix}{i}/{formal.name}")
            b.add("Gather", [scans[j], b.const(f"index{idx}", np.array(idx, np.int64))], [sl], axis=in_axes[j])
            bound[formal.name] = sl
        results = b.iteration(body, i, bound)
        state = results[:n_state]
        for k in range(k_out):
            per_iter[k].append(results[n_state + k])
    b.finish(node, state)
    for k in range(k_out):
        y = node.outputs[n_state + k] if n_state + k < len(node.outputs) else ""
        if y:  # the axis counts in the output's rank, one more than the body value's
            b.stack(per_iter[k] if not out_dirs[k] else per_iter[k][::-1], out_axes[k], y, k)
    return b


def _loop(g: Graph, node: Node) -> _Builder | None:
    body = _plain_body(g, node)
    if body is None or op_version(g, node) < 11 or len(node.inputs) < 2 or not node.inputs[0]:
        return None
    trip = g.values[node.inputs[0]].const
    cond = g.values[node.inputs[1]].const if node.inputs[1] else np.array(True)
    if trip is None or trip.size != 1 or cond is None or cond.size != 1 or not bool(cond.reshape(-1)[0]):
        return None
    t = int(trip.reshape(-1)[0])
    n_state = len(node.inputs) - 2
    k_out = len(body.output) - 1 - n_state
    if (t <= 0 or k_out < 0 or len(body.input) != n_state + 2 or not all(node.inputs[2:])
            or t * (len(body.node) + 2) > MAX_UNROLLED_NODES):
        return None
    b = _Builder(g, node)
    state = list(node.inputs[2:])
    cond_name = node.inputs[1] or b.const("cond", np.array(True))
    per_iter: list[list[str]] = [[] for _ in range(k_out)]
    for i in range(t):
        bound = {body.input[0].name: b.const(f"iteration{i}", np.array(i, np.int64)), body.input[1].name: cond_name}
        bound.update({formal.name: state[s] for s, formal in enumerate(body.input[2:])})
        results = b.iteration(body, i, bound)
        cond_name = results[0]
        if i < t - 1:  # the last iteration's condition stops nothing the trip count does not
            # (tf2onnx's Keras RNN loops: cond = i + 1 < T, false exactly on the last one)
            b.true.append(cond_name)
        state = results[1:1 + n_state]
        for k in range(k_out):
            per_iter[k].append(results[1 + n_state + k])
    b.finish(node, state)
    for k in range(k_out):
        y = node.outputs[n_state + k] if n_state + k < len(node.outputs) else ""
        if y:
            b.stack(per_iter[k], 0, y, k)
    return b


def _outer_reads(nodes: list[Node]) -> list[str]:
    made = {o for n in nodes for o in n.outputs if o}
    return list(dict.fromkeys(i for n in nodes for i in n.inputs if i and i not in made))


def _runs_natively(g: Graph, node: Node, b: _Builder) -> bool:
    """The unrolled nodes, in a scratch graph of their own with the values they read, folded,
    inferred and function-expanded as the pipeline will: does every node left have a template,
    and does every Loop condition fold to true?"""
    s = Graph(f"{g.name}:{node.name}", g.opset)
    for name in _outer_reads(b.nodes):
        v = b.consts.get(name) or g.values.get(name)
        if v is None or v.dtype is None or not v.is_static:
            return False
        s.add_value(Value(name, v.dtype, v.shape, const=v.const))
        if v.const is None:
            s.inputs.append(name)
    for n in b.nodes:
        for o in n.outputs:
            if o:
                s.add_value(Value(o))
    s.nodes = copy.deepcopy(b.nodes)
    s.outputs = list(dict.fromkeys([o for o in node.outputs if o] + b.true))
    s.inlined_branches = g.inlined_branches
    try:
        s = infer_shapes(s)
        for _ in range(SCRATCH_ROUNDS):
            before = len(s.nodes)
            s = expand_functions(infer_shapes(eliminate_identity(fold_constants(s))))
            if len(s.nodes) == before:
                break
    except Exception:  # noqa: BLE001 - the unrolled body does not infer or fold: leave the node
        return False
    for c in b.true:
        v = s.values.get(c)
        if v is None or v.const is None or not bool(np.all(v.const)):
            return False
    return all(find_template(n, s)[0] is not None for n in s.nodes)


UNROLL = {"Scan": _scan, "Loop": _loop}

# verdicts of _runs_natively by _signature: the fold rounds ask again for every node they leave,
# and a refused body would otherwise be unrolled, folded and inferred in scratch every round
_VERDICTS: dict[tuple, bool] = {}
MAX_VERDICTS = 1024
SMALL_CONST = 64


def _signature(g: Graph, node: Node, b: _Builder) -> tuple:
    """What decides the verdict: the opset, the node's op and attributes (its body included),
    and each value the unrolled nodes read from outside: dtype, shape, and small constants'
    bytes (trip counts, indices)."""
    reads = []
    for name in _outer_reads(b.nodes):
        v = b.consts.get(name) or g.values.get(name)
        if v is None:
            reads.append((name, None))
            continue
        data = v.const.tobytes() if v.const is not None and v.const.size <= SMALL_CONST else None
        reads.append((str(v.dtype), v.shape, v.const is not None, data))
    attrs = tuple(a.SerializeToString() for a in node.attr_protos)
    return (tuple(sorted(g.opset.items())), node.op, attrs, tuple(reads), tuple(bool(o) for o in node.outputs))


def _verdict(g: Graph, node: Node, b: _Builder) -> bool:
    key = _signature(g, node, b)
    if key not in _VERDICTS:
        if len(_VERDICTS) >= MAX_VERDICTS:
            _VERDICTS.clear()
        _VERDICTS[key] = _runs_natively(g, node, b)
    return _VERDICTS[key]


def unroll_loops(g: Graph) -> Graph:
    """Unroll every Scan and Loop whose unrolled body runs natively (module docstring)."""
    if not any(n.op in UNROLL for n in g.nodes):
        return g
    out: list[Node] = []
    changed = False
    for node in g.nodes:
        b = UNROLL[node.op](g, node) if node.op in UNROLL and node.domain in ("", "ai.onnx") else None
        if b is None or not _verdict(g, node, b):
            out.append(node)
            continue
        for v in b.consts.values():
            g.add_value(v)
        for n in b.nodes:
            for o in n.outputs:
                if o and o not in g.values:
                    g.add_value(Value(o))
        out += b.nodes
        changed = True
    if changed:
        g.nodes = out
        g.prune_values()
        g = check_graph(infer_shapes(g))
    return g
