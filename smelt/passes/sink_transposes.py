"""Pass: transposes sunk through element-wise ops, and transpose pairs cancelled.

PyTorch exports of nets ported from TensorFlow keep TensorFlow's NHWC between convolutions:
Conv -> Transpose(to NHWC) -> bias Add, BatchNorm as Sub/Mul/Add over the last axis, Relu ->
Transpose(back to NCHW) -> Conv. Both transposes are full copies of the activation, and the
element-wise ops between them cannot fuse into the conv (an NSFW classifier: 108 Transposes,
34% of a call, 1.4x slower than onnxruntime). Element-wise ops commute with a transpose, so each
one that reads a transpose is moved before it:

- ``E(T(x, p))`` for a unary element-wise E becomes ``T(E(x), p)``;
- ``E(T(x, p), c)`` for a broadcasting E and a constant c becomes ``T(E(x, c'), p)``, with c'
  the constant laid out for x (padded to x's rank with leading 1s, transposed by p's inverse);
- ``E(T(a, p), T(b, p))`` becomes ``T(E(a, b), p)``.

A transpose whose output only such an op reads moves down the chain until it meets another
transpose; two in a row become one (their composed permutation), or none when they undo each
other (the second then reads the first's input, and the first stays only for other readers). What is left between two convs is then the conv's own epilogue (bias, BatchNorm, Relu),
which epilogue fusion takes.

Needs: shapes inferred and static (runs after the fold fixpoint); after attention fusion (its
pattern has the head split's Transpose before the scale Mul, which this pass would swap), before
epilogue fusion. Guarantees: values read outside a rewritten chain and graph outputs keep their
names and contents; a transpose is only moved where its output has no other reader, so no work
is added.
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from smelt.ir.graph import Graph, Node, Value
from smelt.ir.ops import BINARY_BROADCAST, UNARY_ELEMENTWISE

# element-wise ops a transpose moves through: every input broadcasts against the output by
# position only (no axis attribute)
_UNARY = frozenset(UNARY_ELEMENTWISE)
_BINARY = frozenset(("Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "PRelu", "Sum", "Mean", "Where"))
assert _BINARY <= frozenset(BINARY_BROADCAST)
# sweeps over the graph at most: each moves every transpose it can one op down (or merges it),
# so a chain of k element-wise ops needs about k sweeps
MAX_SWEEPS = 10_000


def sink_transposes(g: Graph) -> Graph:
    for _ in range(MAX_SWEEPS):
        if not _sweep(g):
            break
    g.prune_values()
    return g


def _perm(node: Node, rank: int) -> list[int]:
    perm = node.attr("perm")
    return [int(p) for p in perm] if perm is not None else list(range(rank))[::-1]


def _is_transpose(node: Node | None) -> bool:
    return node is not None and node.op == "Transpose" and node.domain in ("", "ai.onnx") and not node.epilogue


def _static(g: Graph, name: str) -> bool:
    v = g.values.get(name)
    return v is not None and v.is_static


def _sweep(g: Graph) -> int:
    """One pass over the nodes, rewriting each that can be; the rewrites in it, 0 when none.
    The producer and reader maps are built once per sweep: a node next to a value an earlier
    rewrite of the sweep touched waits for the next sweep."""
    producers, readers = g.producers(), g.consumers()
    touched: set[str] = set()
    done = 0

    def sole_reader(value: str) -> bool:
        return value not in g.outputs and len(readers.get(value, [])) == 1

    def names(*nodes: Node) -> set[str]:
        return {v for n in nodes for v in [*n.inputs, *n.outputs] if v}

    for node in list(g.nodes):
        if node.domain not in ("", "ai.onnx") or node.epilogue or node.guard is not None or names(node) & touched:
            continue
        if _is_transpose(node):
            src = producers.get(node.inputs[0])
            if _is_transpose(src) and _static(g, src.inputs[0]) and not names(src) & touched:
                touched |= names(src, node)
                _merge(g, src, node, drop_first=sole_reader(node.inputs[0]))
                done += 1
            continue
        if node.op not in _UNARY and node.op not in _BINARY:
            continue
        outs = [o for o in node.outputs if o]
        if len(outs) != 1 or not _static(g, outs[0]):
            continue
        sources = [producers[i] for i in node.inputs if i in producers]
        if any(names(t) & touched for t in sources):
            continue
        moved = _moved_inputs(g, node, producers, sole_reader)
        if moved is not None:
            touched |= names(node, *sources)
            _sink(g, node, *moved)
            touched |= names(node)
            done += 1
    return done


def _merge(g: Graph, first: Node, second: Node, drop_first: bool) -> None:
    """``second(first(x))`` as one transpose of x, or none when they undo each other; ``first``
    stays for its other readers unless ``drop_first`` (a residual block's shortcut read both
    back in NCHW by the next conv and in NHWC by the residual Add)."""
    x = first.inputs[0]
    rank = len(g.values[x].shape)
    p, q = _perm(first, rank), _perm(second, len(g.values[second.inputs[0]].shape))
    composed = [p[i] for i in q]
    if drop_first:
        g.nodes.remove(first)
    if composed == list(range(rank)):
        if second.outputs[0] in g.outputs:  # a graph output keeps its name: an Identity copies it
            g.nodes[g.nodes.index(second)] = Node("Identity", g.fresh_name(f"{second.name}/identity"), [x],
                                                  [second.outputs[0]])
        else:
            g.nodes.remove(second)
            g.replace_uses(second.outputs[0], x)
        return
    _set_perm(second, composed)
    second.inputs[0] = x


def _moved_inputs(g: Graph, node: Node, producers: dict[str, Node], sole_reader) -> tuple[list[str], list[int]] | None:
    """``node``'s inputs read before a transpose of permutation p (and p), when every input is a
    transpose of p read only here, or (binary ops) a constant; at least one must be a transpose."""
    out = g.values[node.outputs[0]]
    out_rank = len(out.shape)
    perm: list[int] | None = None
    for i in node.inputs:
        t = producers.get(i) if i else None
        if _is_transpose(t) and sole_reader(i) and _static(g, t.inputs[0]):
            p = _perm(t, len(g.values[t.inputs[0]].shape))
            # the same permutation, and no broadcast that makes the output bigger than what
            # the transpose moved (moving it after the op would move more)
            if len(p) != out_rank or (perm is not None and p != perm) or g.values[i].size != out.size:
                return None
            perm = p
    if perm is None:
        return None
    inverse = list(np.argsort(perm))
    new_inputs: list[str] = []
    for i in node.inputs:
        t = producers.get(i) if i else None
        if not i:
            new_inputs.append(i)
        elif _is_transpose(t) and sole_reader(i) and _static(g, t.inputs[0]):
            new_inputs.append(t.inputs[0])
        else:
            c = g.const(i)
            if c is None or c.ndim > out_rank:
                return None
            if c.ndim == 0 or c.size == 1:
                new_inputs.append(i)
                continue
            full = c.reshape((1,) * (out_rank - c.ndim) + c.shape)
            new_inputs.append(g.add_const(np.ascontiguousarray(np.transpose(full, inverse)), f"{node.name}/transposed"))
    return new_inputs, perm


def _sink(g: Graph, node: Node, inputs: list[str], perm: list[int]) -> None:
    """``node`` on ``inputs`` (read before the transposes), then a transpose of ``perm`` under
    the node's old output name; the transposes it read are dropped (it was their only reader)."""
    producers = g.producers()
    dropped = [producers[i] for i in node.inputs if i and i not in inputs and _is_transpose(producers.get(i))]
    out = node.outputs[0]
    v = g.values[out]
    inverse = list(np.argsort(perm))
    pre = g.fresh_name(f"{out}__before_transpose")
    g.add_value(Value(pre, v.dtype, tuple(v.shape[k] for k in inverse)))
    node.inputs = inputs
    node.outputs = [pre]
    transpose = Node("Transpose", g.fresh_name(f"{node.name}/transpose"), [pre], [out], attrs={"perm": list(perm)})
    _set_perm(transpose, list(perm))
    for t in dropped:
        g.nodes.remove(t)
    g.nodes.insert(g.nodes.index(node) + 1, transpose)


def _set_perm(node: Node, perm: list[int]) -> None:
    node.attrs["perm"] = list(perm)
    node.attr_protos = [a for a in node.attr_protos if a.name != "perm"] + [helper.make_attribute("perm", list(perm))]
