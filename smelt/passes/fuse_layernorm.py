"""Pass: the spelled-out layer normalization of exports below opset 17 into one node.

Needs: shapes inferred, constants folded. Before opset 17 ONNX had no LayerNormalization, so
torch.onnx (and every exporter of that era: BERT, ViT and Whisper exports at opsets 11-16, which
many published ONNX encoders are) writes::

    m = ReduceMean(x, axes=[-1]); d = Sub(x, m); v = ReduceMean(Pow(d, 2), axes=[-1])
    y = Add(Mul(Div(d, Sqrt(Add(v, eps))), gamma), beta)

nine nodes, five passes over the activations and two reductions. Matched here (last axis only,
every intermediate read only inside the pattern, gamma and beta constants of the normalized
length, a scalar eps), it becomes ``ai.smelt`` LayerNormalization(x, gamma, beta; axis=-1,
epsilon): the same one-pass kernel as ONNX's op (templates/norm.py registers it for both
domains; smelt's domain, because the model's own opset has no LayerNormalization schema). The
kernel computes (x - mean) * (1/sqrt(var + eps)) where the pattern divides by the square root:
within an ulp or two of it.
"""

from __future__ import annotations

import numpy as np

from smelt.ir.graph import Graph, Node

DOMAIN = "ai.smelt"


def fuse_layernorm(g: Graph) -> Graph:
    producers = g.producers()
    consumers = g.consumers()
    removed: set[int] = set()
    for mean in list(g.nodes):
        if mean.op != "ReduceMean" or mean.domain not in ("", "ai.onnx") or id(mean) in removed:
            continue
        found = _match(g, mean, producers, consumers)
        if found is None:
            continue
        dead, node = found
        g.nodes.insert(g.nodes.index(dead[-1]), node)
        removed.update(id(n) for n in dead)
        for n in dead:
            for i in n.all_inputs():
                consumers[i] = [r for r in consumers.get(i, []) if r is not n]
        consumers.setdefault(node.inputs[0], []).append(node)
    if removed:
        g.remove_nodes(n for n in g.nodes if id(n) in removed)
        g.prune_values()
    return g


def _last_axis_mean(g: Graph, node: Node) -> str | None:
    """The input of a ReduceMean over the last axis only with keepdims (None otherwise)."""
    if node.op != "ReduceMean" or not node.attr("keepdims", 1):
        return None
    x = node.inputs[0]
    xv = g.values.get(x)
    if xv is None or not xv.is_static or xv.dtype != np.float32 or not xv.shape:
        return None
    axes = node.attr("axes")
    if axes is None and len(node.inputs) > 1 and node.inputs[1]:
        c = g.const(node.inputs[1])
        axes = None if c is None else [int(a) for a in c.reshape(-1)]
    rank = len(xv.shape)
    if axes is None or [a % rank for a in axes] != [rank - 1]:
        return None
    return x


def _match(g: Graph, mean: Node, producers: dict[str, Node],
           consumers: dict[str, list[Node]]) -> tuple[list[Node], Node] | None:
    def only(value: str, op: str) -> Node | None:
        rs = consumers.get(value, [])
        if value in g.outputs or len(rs) != 1 or rs[0].op != op or rs[0].domain not in ("", "ai.onnx"):
            return None
        return rs[0]

    def other(node: Node, x: str) -> str | None:
        if len(node.inputs) != 2 or node.inputs.count(x) != 1:
            return None
        return node.inputs[1] if node.inputs[0] == x else node.inputs[0]

    def scalar(name: str | None) -> float | None:
        c = None if name is None else g.const(name)
        return float(c.reshape(-1)[0]) if c is not None and c.size == 1 and c.dtype == np.float32 else None

    x = _last_axis_mean(g, mean)
    if x is None:
        return None
    n = int(g.values[x].shape[-1])
    sub = only(mean.outputs[0], "Sub")
    if sub is None or sub.inputs != [x, mean.outputs[0]]:
        return None
    d = sub.outputs[0]
    readers = consumers.get(d, [])
    if d in g.outputs or len(readers) != 2 or {r.op for r in readers} != {"Pow", "Div"}:
        return None
    pw = next(r for r in readers if r.op == "Pow")
    div = next(r for r in readers if r.op == "Div")
    if pw.inputs[0] != d or scalar(pw.inputs[1]) != 2.0 or div.inputs[0] != d:
        return None
    var = only(pw.outputs[0], "ReduceMean")
    if var is None or _last_axis_mean(g, var) != pw.outputs[0]:
        return None
    add_eps = only(var.outputs[0], "Add")
    eps = scalar(other(add_eps, var.outputs[0])) if add_eps is not None else None
    sqrt = only(add_eps.outputs[0], "Sqrt") if eps is not None else None
    if sqrt is None or only(sqrt.outputs[0], "Div") is not div or div.inputs[1] != sqrt.outputs[0]:
        return None
    mul = only(div.outputs[0], "Mul")
    gamma = other(mul, div.outputs[0]) if mul is not None else None
    add = only(mul.outputs[0], "Add") if mul is not None else None
    beta = other(add, mul.outputs[0]) if add is not None else None
    for p in (gamma, beta):
        c = None if p is None else g.const(p)
        if c is None or c.dtype != np.float32 or c.size != n or c.shape[-1] != n:
            return None
    dead = [mean, sub, pw, var, add_eps, sqrt, div, mul, add]
    node = Node("LayerNormalization", f"{mean.name}/fused_layernorm", [x, gamma, beta], [add.outputs[0]],
                attrs={"axis": -1, "epsilon": eps}, domain=DOMAIN)
    return dead, node
