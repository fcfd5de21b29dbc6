"""Gemms that share their weights and do not depend on one another as one Gemm (DeepCPU's
hoisting of the input projection out of the recurrence).

An LSTM exported as a loop unrolled into cells (torch's ``LSTMCell`` in a Python loop) computes
``x_t W_ih^T + b_ih`` once per step, each a Gemm of one row: the weights are read from memory once
per step. captcha-whisperer's CRNN does it 2 x 20 times with a 4096 x 400 weight (6.5 MB, past
L2): 40 Gemms at 21 GFLOPS took 6.2 of its 9.7 ms. Stacked, the rows are one Gemm that reads the
weights once: ``Split(Gemm(Concat(A_1, ..., A_n), B, C))``. Each output row is the same dot
product in the same order as before (a row of a GEMM does not depend on the other rows), so the
answers are unchanged.

Matched: standard-domain Gemm nodes with a float32 A of static shape [m, K] (transA 0), a constant
B and a constant or absent C (one bias row), grouped by (B, C, alpha, beta, transB); a member whose
A depends on another member's output (the recurrent ``h_{t-1} W_hh^T``) or whose A another member
reads too is left out, and a group needs two members. After each group the nodes are put back
in a topological order that keeps the original one wherever it can (the next group's dependency
sweep reads them in order).
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from smelt.frontend.node_order import stable_order
from smelt.ir.graph import Graph, Node, Value


def _key(g: Graph, node: Node) -> tuple | None:
    if node.op != "Gemm" or node.domain not in ("", "ai.onnx") or node.attr("transA", 0):
        return None
    a, y = g.values.get(node.inputs[0]), g.values.get(node.outputs[0])
    if a is None or not a.is_static or len(a.shape) != 2 or a.dtype is None or np.dtype(a.dtype) != np.float32:
        return None
    if y is None or not y.is_static or len(y.shape) != 2:
        return None
    b = node.inputs[1]
    c = node.inputs[2] if len(node.inputs) > 2 else ""
    if g.const(b) is None or (c and g.const(c) is None):
        return None
    if c and g.const(c).ndim == 2 and g.const(c).shape[0] != 1:  # one bias row broadcast to every row only
        return None
    return (b, c, float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0)), int(node.attr("transB", 0)))


def _independent(g: Graph, members: list[Node]) -> list[Node]:
    """The members whose A does not depend on any remaining member's output (to a fixpoint)."""
    while len(members) > 1:
        reached = {o for m in members for o in m.outputs if o}
        for node in g.nodes:  # topological: one forward sweep closes the set
            if any(i in reached for i in node.all_inputs()):
                reached.update(o for o in node.outputs if o)
        keep = [m for m in members if m.inputs[0] not in reached]
        if len(keep) == len(members):
            break
        members = keep
    return members


def _node(op: str, name: str, inputs: list[str], outputs: list[str], attrs: dict) -> Node:
    return Node(op, name, inputs, outputs, attrs=attrs, attr_protos=[helper.make_attribute(k, v) for k, v in attrs.items()])


def hoist_shared_gemms(g: Graph) -> Graph:
    """Stack every group of independent Gemms over the same weights (module docstring)."""
    groups: dict[tuple, list[Node]] = {}
    for node in g.nodes:
        key = _key(g, node)
        if key is not None:
            groups.setdefault(key, []).append(node)
    for key, members in groups.items():
        # two members of one A compute one product: that is common-subexpression work, not
        # stacking (and three Gemms of one A each with its own activation keep their epilogues)
        seen: dict[str, int] = {}
        for m in members:
            seen[m.inputs[0]] = seen.get(m.inputs[0], 0) + 1
        members = _independent(g, [m for m in members if seen[m.inputs[0]] == 1])
        if len(members) < 2:
            continue
        first = next(k for k, x in enumerate(g.nodes) if x is members[0])
        rows = [int(g.values[m.inputs[0]].shape[0]) for m in members]
        k = int(g.values[members[0].inputs[0]].shape[1])
        n = int(g.values[members[0].outputs[0]].shape[1])
        base = members[0].name
        stacked, product = g.fresh_name(f"{base}/hoisted_a"), g.fresh_name(f"{base}/hoisted_y")
        g.add_value(Value(stacked, np.dtype(np.float32), [sum(rows), k]))
        g.add_value(Value(product, np.dtype(np.float32), [sum(rows), n]))
        gemm_attrs = {"alpha": key[2], "beta": key[3], "transB": key[4]}
        new = [_node("Concat", f"{base}/hoisted_concat", [m.inputs[0] for m in members], [stacked], {"axis": 0}),
               _node("Gemm", f"{base}/hoisted", [stacked, *members[0].inputs[1:]], [product], gemm_attrs),
               _node("Split", f"{base}/hoisted_split", [product, g.add_const(np.array(rows, np.int64), f"{base}/rows")],
                     [m.outputs[0] for m in members], {"axis": 0})]
        gone = {id(m) for m in members}
        g.nodes = [x for x in g.nodes[:first] if id(x) not in gone] + new + \
                  [x for x in g.nodes[first:] if id(x) not in gone]
        order = stable_order([set(x.all_inputs()) for x in g.nodes], [x.outputs for x in g.nodes])
        assert order is not None, "hoist_shared_gemms: the graph has a cycle"
        g.nodes = [g.nodes[k] for k in order]
    return g
