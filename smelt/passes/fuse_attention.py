"""Pass: fuse exported multi-head self-attention into one ``ai.smelt`` ``HeadAttention`` node.

Needs: shapes inferred and constants folded (the Reshape targets are constants by then). Runs
before ``fuse_epilogues``, so the Q/K/V projections keep their bias epilogues.

What transformers' exports (BERT, DistilBERT, ViT, Whisper: torch.onnx at opsets 14-18) spell
per layer, Q/K/V being [B, S, H*D] projection outputs::

    q = Transpose(Reshape(Q, [B, S, H, D]), [0, 2, 1, 3])      [B, H, S, D]
    k = Transpose(Reshape(K, [B, Sk, H, D]), [0, 2, 3, 1])     [B, H, D, Sk]
    v = Transpose(Reshape(V, [B, Sk, H, D]), [0, 2, 1, 3])     [B, H, Sk, D]
    s = MatMul(Mul(q, c1)?, Mul(k, c2)?)  (+ mask)?            [B, H, S, Sk]
    p = Softmax(s, axis=-1), then Where(IsNaN(p), 0, p)?       (sdpa's fully-masked-row guard)
    o = Reshape?(MatMul(p, v)) -> Transpose [0, 2, 1, 3] -> Reshape [B, S, H*D]

becomes ``HeadAttention(Q, K, V[, mask]) -> [B, S, H*D]`` with attributes ``heads``, ``scale``
(c1 * c2) and ``nan_to_zero``. Unfused, the head split and merge are five copies, the scales and
the mask two passes over the [B, H, S, Sk] scores and the NaN guard two more, and the two batched
MatMuls have K = D (32 or 64): small GEMMs whose packing costs as much as their FMAs. Fused
(templates/attention.py), a thread takes a block of query rows of one head and keeps its scores
in L1/L2 from QK^T through softmax to PV, reading Q, K, V and writing the output in their
[B, S, H*D] layout (DeepCPU's attention layer does the same per head).

The mask operand must broadcast to [B, H, S, Sk] with its last axis Sk (an additive float mask:
BERT's Where(mask, -FLT_MAX, 0), a causal triangle); any other spelling is left alone, as is
everything whose intermediates have other readers or are graph outputs.
"""

from __future__ import annotations

import numpy as np

from smelt.ir.graph import Graph, Node

DOMAIN = "ai.smelt"
OP = "HeadAttention"


def _shape(g: Graph, name: str) -> tuple | None:
    v = g.values.get(name)
    if v is None or not v.is_static or v.dtype != np.float32:
        return None
    return tuple(int(d) for d in v.shape)


def fuse_attention(g: Graph) -> Graph:
    """Replace every matched attention block (see the module doc)."""
    producers = g.producers()
    consumers = g.consumers()
    removed: set[int] = set()
    for sm in list(g.nodes):
        if sm.op != "Softmax" or sm.domain not in ("", "ai.onnx") or id(sm) in removed:
            continue
        found = _match(g, sm, producers, consumers)
        if found is None:
            continue
        dead, node = found
        # where the head merge's last Reshape was: every input exists by then (V's projection
        # may come after the Softmax), every reader of the output after it
        g.nodes.insert(g.nodes.index(dead[-2]), node)
        removed.update(id(n) for n in dead)
        # the new node's output was the last Reshape's: producers/consumers of the inputs change
        for n in dead:
            for i in n.all_inputs():
                consumers[i] = [r for r in consumers.get(i, []) if r is not n]
        for i in node.all_inputs():
            consumers.setdefault(i, []).append(node)
        producers[node.outputs[0]] = node
    if removed:
        g.remove_nodes(n for n in g.nodes if id(n) in removed)
        g.prune_values()
    return g


def _match(g: Graph, sm: Node, producers: dict[str, Node],
           consumers: dict[str, list[Node]]) -> tuple[list[Node], Node] | None:
    dead: list[Node] = []

    def only(value: str, op: str) -> Node | None:
        """The one reader of ``value`` when it is an ``op`` (and ``value`` no graph output)."""
        rs = consumers.get(value, [])
        if value in g.outputs or len(rs) != 1 or rs[0].op != op or rs[0].domain not in ("", "ai.onnx"):
            return None
        return rs[0]

    def made_by(value: str, op: str) -> Node | None:
        """The producer of ``value`` when it is an ``op`` whose output only ``value``'s one reader reads."""
        p = producers.get(value)
        if p is None or p.op != op or p.domain not in ("", "ai.onnx") or value in g.outputs:
            return None
        return p if len(consumers.get(value, [])) == 1 else None

    def scalar(name: str) -> float | None:
        c = g.const(name)
        return float(c.reshape(())) if c is not None and c.size == 1 and c.dtype == np.float32 else None

    def unscaled(value: str) -> tuple[str, float] | None:
        """(value before an optional Mul by a scalar constant, the scalar)."""
        p = made_by(value, "Mul")
        if p is None:
            return value, 1.0
        for a, b in (p.inputs, p.inputs[::-1]):
            c = scalar(b)
            if c is not None:
                dead.append(p)
                return a, c
        return None

    def split_heads(value: str, perm: list[int]) -> tuple[str, tuple] | None:
        """[B, S, H*D] source of Transpose(Reshape(src, [B, S, H, D]), perm)."""
        t = made_by(value, "Transpose")
        if t is None or list(t.attr("perm", [])) != perm:
            return None
        r = made_by(t.inputs[0], "Reshape")
        if r is None:
            return None
        src, four = r.inputs[0], _shape(g, t.inputs[0])
        s3 = _shape(g, src)
        if four is None or s3 is None or len(four) != 4 or s3 != (four[0], four[1], four[2] * four[3]):
            return None
        dead.extend([t, r])
        return src, four

    if sm.attr("axis", -1) not in (-1, 3):
        return None
    scores = _shape(g, sm.inputs[0])
    if scores is None or len(scores) != 4:
        return None
    # scores side: optional mask Add, the QK^T MatMul, optional scales
    s, mask = sm.inputs[0], None
    add = made_by(s, "Add")
    if add is not None:
        for a, b in (add.inputs, add.inputs[::-1]):
            pa = producers.get(a)
            if pa is not None and pa.op == "MatMul" and _mask_ok(g, b, scores):
                s, mask = a, b
                dead.append(add)
                break
        else:
            return None
    qk = made_by(s, "MatMul")
    if qk is None:
        return None
    dead.append(qk)
    q_side, k_side = unscaled(qk.inputs[0]), unscaled(qk.inputs[1])
    if q_side is None or k_side is None:
        return None
    q = split_heads(q_side[0], [0, 2, 1, 3])
    k = split_heads(k_side[0], [0, 2, 3, 1])
    if q is None or k is None:
        return None
    (qsrc, (b, sq, h, d)), (ksrc, (bk, sk, hk, dk)) = q, k
    if (bk, hk, dk) != (b, h, d) or scores != (b, h, sq, sk):
        return None
    # probabilities side: optional NaN guard, the PV MatMul, the head merge
    p, nan_to_zero = sm.outputs[0], False
    readers = consumers.get(p, [])
    if len(readers) == 2 and {r.op for r in readers} == {"IsNaN", "Where"} and p not in g.outputs:
        isnan = next(r for r in readers if r.op == "IsNaN")
        where = next(r for r in readers if r.op == "Where")
        zero = scalar(where.inputs[1]) if len(where.inputs) == 3 else None
        if (only(isnan.outputs[0], "Where") is not where or where.inputs[0] != isnan.outputs[0]
                or where.inputs[2] != p or zero != 0.0):
            return None
        dead += [isnan, where]
        p, nan_to_zero = where.outputs[0], True
    pv = only(p, "MatMul")
    if pv is None or pv.inputs[0] != p:
        return None
    v = split_heads(pv.inputs[1], [0, 2, 1, 3])
    if v is None or v[1] != (b, sk, h, d):
        return None
    dead.append(pv)
    o = pv.outputs[0]
    same = only(o, "Reshape")
    if same is not None and _shape(g, same.outputs[0]) == (b, h, sq, d):
        dead.append(same)
        o = same.outputs[0]
    t = only(o, "Transpose")
    if t is None or list(t.attr("perm", [])) != [0, 2, 1, 3]:
        return None
    r = only(t.outputs[0], "Reshape")
    if r is None or _shape(g, r.outputs[0]) != (b, sq, h * d):
        return None
    dead += [sm, t, r]  # r second to last: fuse_attention places the new node there
    inputs = [qsrc, ksrc, v[0]] + ([mask] if mask is not None else [])
    node = Node(OP, f"{sm.name}/fused_attention", inputs, [r.outputs[0]], domain=DOMAIN,
                attrs={"heads": h, "scale": float(np.float32(q_side[1]) * np.float32(k_side[1])),
                       "nan_to_zero": int(nan_to_zero)})
    return dead, node


def _mask_ok(g: Graph, name: str, scores: tuple) -> bool:
    """An additive float mask broadcasting to the scores [B, H, S, Sk], its last axis Sk."""
    shape = _shape(g, name)
    if shape is None or not shape or len(shape) > 4 or shape[-1] != scores[-1]:
        return False
    padded = (1,) * (4 - len(shape)) + shape
    return all(m in (1, s) for m, s in zip(padded, scores, strict=True))
