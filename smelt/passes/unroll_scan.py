"""Pass: a Scan over a static sequence becomes its body, once per iteration, when that runs natively.

No template runs a subgraph, so a Scan used to run whole through the onnx.reference fallback
(the body interpreted in Python, step by step). With every shape static the iteration count T is
known, and Scan (opset 9 on) is exactly its body applied T times with the state threaded through:

- scan input j, iteration i: ``Gather(x_j, i, axis_j)`` (index T - 1 - i for a reverse direction),
  which removes the scanned axis as the body expects;
- the body's nodes copied per iteration, its values renamed ``<scan>/<i>/<name>``, its state
  inputs bound to the previous iteration's state outputs (the Scan's initial states first), its
  reads of outer values kept as they are;
- final states: ``Identity`` of the last iteration's state outputs (eliminated later);
- scan output k: the iterations' values ``Unsqueeze``d at the output axis and ``Concat``enated
  along it (reverse direction: in reverse order).

As ``expand_functions``, only when the whole unrolled graph, folded and inferred in a scratch
graph, leaves no node to the fallback, and only up to ``MAX_UNROLLED_NODES`` body nodes in all
(a long sequence stays one fallback node rather than a huge program). Not unrolled: Scan-8 (its
batch axis and sequence_lens), bodies with subgraphs of their own, T = 0.

Needs: shapes inferred. Runs inside ``pipeline.fold_to_fixpoint`` after ``expand_functions``
(a function body may hold a Scan: LinearAttention's does). Guarantees: the Scan's outputs keep
their names; new values are typed (shape inference re-runs).
"""

from __future__ import annotations

import copy

import numpy as np
import onnx

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


def unrolled_nodes(g: Graph, node: Node) -> tuple[list[Node], dict[str, Value]] | None:
    """The Scan ``node`` unrolled (module docstring), with the constants it adds; None when it
    cannot be (shapes unknown, Scan-8, nested subgraphs, T = 0, too many nodes)."""
    body = _body(node)
    if body is None or node.domain not in ("", "ai.onnx") or op_version(g, node) < 9:
        return None
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in body.node for a in n.attribute):
        return None
    m = int(node.attr("num_scan_inputs", 0))
    n_state = len(node.inputs) - m
    k_out = len(body.output) - n_state
    if m <= 0 or n_state < 0 or k_out < 0 or len(body.input) != n_state + m or not all(node.inputs):
        return None
    for name in node.inputs:
        v = g.values.get(name)
        if v is None or v.dtype is None or not v.is_static:
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

    names = _Names(g)
    prefix = f"{node.name}/"
    consts: dict[str, Value] = {}
    opset = g.opset.get("", 1)

    def const(hint: str, arr: np.ndarray) -> str:
        name = names.value(prefix + hint)
        consts[name] = Value(name, arr.dtype, tuple(arr.shape), const=arr)
        return name

    def make(op: str, inputs: list[str], outputs: list[str], **attrs) -> Node:
        protos = [onnx.helper.make_attribute(k, v) for k, v in attrs.items()]
        return Node(op=op, name=names.node(f"{prefix}{op}_{len(out)}"), inputs=inputs, outputs=outputs,
                    attrs={a.name: attribute_value(a) for a in protos}, attr_protos=protos)

    def unsqueeze(x: str, axis: int, y: str) -> Node:
        if opset >= 13:
            return make("Unsqueeze", [x, const("axis", np.array([axis], np.int64))], [y])
        return make("Unsqueeze", [x], [y], axes=[axis])

    out: list[Node] = []
    state = list(node.inputs[:n_state])
    per_iter: list[list[str]] = [[] for _ in range(k_out)]
    for i in range(t):
        rename: dict[str, str] = {"": ""}
        for s, formal in enumerate(body.input[:n_state]):
            rename[formal.name] = state[s]
        for j, formal in enumerate(body.input[n_state:]):
            idx = t - 1 - i if in_dirs[j] else i
            sl = names.value(f"{prefix}{i}/{formal.name}")
            out.append(make("Gather", [scans[j], const(f"index{idx}", np.array(idx, np.int64))], [sl],
                            axis=in_axes[j]))
            rename[formal.name] = sl
        for bn in body.node:
            outs = []
            for o in bn.output:
                if o:
                    rename[o] = names.value(f"{prefix}{i}/{o}")
                outs.append(rename[o] if o else "")
            protos = [copy.deepcopy(a) for a in bn.attribute]
            ins = [rename.get(x, x) for x in bn.input]  # outer reads keep their names
            out.append(Node(op=bn.op_type, name=names.node(f"{prefix}{i}/{bn.name or bn.op_type}"),
                            inputs=ins, outputs=outs, attrs={a.name: attribute_value(a) for a in protos},
                            domain=bn.domain, attr_protos=protos))
        results = [rename.get(o.name, o.name) for o in body.output]
        state = results[:n_state]
        for k in range(k_out):
            per_iter[k].append(results[n_state + k])
    for s in range(n_state):
        if node.outputs[s]:
            out.append(make("Identity", [state[s]], [node.outputs[s]]))
    for k in range(k_out):
        y = node.outputs[n_state + k] if n_state + k < len(node.outputs) else ""
        if not y:
            continue
        vals = per_iter[k] if not out_dirs[k] else per_iter[k][::-1]
        # the axis is relative to the output's rank, one more than the body value's
        axis = out_axes[k]
        unsq = []
        for i, v in enumerate(vals):
            u = names.value(f"{prefix}{i}/scan_out{k}")
            unsq.append(u)
            out.append(unsqueeze(v, axis, u))
        out.append(make("Concat", unsq, [y], axis=axis))
    return out, consts


def _outer_reads(nodes: list[Node]) -> list[str]:
    made = {o for n in nodes for o in n.outputs if o}
    return list(dict.fromkeys(i for n in nodes for i in n.inputs if i and i not in made))


def _runs_natively(g: Graph, node: Node, nodes: list[Node], consts: dict[str, Value]) -> bool:
    """The unrolled nodes, in a scratch graph of their own with the values they read, folded,
    inferred and function-expanded as the pipeline will: does every node left have a template?"""
    s = Graph(f"{g.name}:{node.name}", g.opset)
    for name in _outer_reads(nodes):
        v = consts.get(name) or g.values.get(name)
        if v is None or v.dtype is None or not v.is_static:
            return False
        s.add_value(Value(name, v.dtype, v.shape, const=v.const))
        if v.const is None:
            s.inputs.append(name)
    for n in nodes:
        for o in n.outputs:
            if o:
                s.add_value(Value(o))
    s.nodes = copy.deepcopy(nodes)
    s.outputs = [o for o in node.outputs if o]
    s.inlined_branches = g.inlined_branches
    try:
        s = infer_shapes(s)
        for _ in range(SCRATCH_ROUNDS):
            before = len(s.nodes)
            s = expand_functions(infer_shapes(eliminate_identity(fold_constants(s))))
            if len(s.nodes) == before:
                break
    except Exception:  # noqa: BLE001 - the unrolled body does not infer or fold: leave the Scan
        return False
    return all(find_template(n, s)[0] is not None for n in s.nodes)


def unroll_scans(g: Graph) -> Graph:
    """Unroll every Scan whose unrolled body runs natively (module docstring)."""
    if not any(n.op == "Scan" for n in g.nodes):
        return g
    out: list[Node] = []
    changed = False
    for node in g.nodes:
        made = unrolled_nodes(g, node) if node.op == "Scan" else None
        if made is None or not _runs_natively(g, node, *made):
            out.append(node)
            continue
        nodes, consts = made
        for v in consts.values():
            g.add_value(v)
        for n in nodes:
            for o in n.outputs:
                if o and o not in g.values:
                    g.add_value(Value(o))
        out += nodes
        changed = True
    if changed:
        g.nodes = out
        g.prune_values()
        g = check_graph(infer_shapes(g))
    return g
