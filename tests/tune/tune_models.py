"""Tiny conv models for the tuning tests."""

from __future__ import annotations

import numpy as np
from helpers import const, make_model, tensor
from onnx import helper


def _w(rng, *shape):
    return (rng.standard_normal(shape) * 0.2).astype(np.float32)


def chain_model(c: int = 16, hw: tuple[int, int] = (10, 12)):
    """x -> conv 3x3 (c->32) relu -> conv 3x3 (32->32) + residual relu -> conv 1x1 (32->16)."""
    rng = np.random.default_rng(0)
    h, w = hw
    inits = [const("w1", _w(rng, 32, c, 3, 3)), const("b1", _w(rng, 32)), const("w2", _w(rng, 32, 32, 3, 3)),
             const("b2", _w(rng, 32)), const("w3", _w(rng, 16, 32, 1, 1))]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
             helper.make_node("Add", ["c2", "r1"], ["a2"]),
             helper.make_node("Relu", ["a2"], ["r2"]),
             helper.make_node("Conv", ["r2", "w3"], ["y"], name="conv3")]
    feeds = {"x": rng.standard_normal((1, c, h, w)).astype(np.float32)}
    return make_model(nodes, [tensor("x", [1, c, h, w])], [tensor("y", [1, 16, h, w])], inits), feeds


def branchy_model(modules: int = 3, c: int = 32, hw: int = 6):
    """Inception-like modules: four conv branches of the input, concatenated on channels."""
    rng = np.random.default_rng(1)
    nodes, inits = [], []
    cur, ch = "x", c
    for m in range(modules):
        outs = []
        for b, (oc, k) in enumerate([(16, 1), (8, 3), (16, 3), (8, 1)]):
            wn, out = f"w{m}_{b}", f"m{m}_b{b}"
            inits.append(const(wn, _w(rng, oc, ch, k, k)))
            p = k // 2
            nodes.append(helper.make_node("Conv", [cur, wn], [out + "_c"], pads=[p, p, p, p], name=f"conv{m}_{b}"))
            nodes.append(helper.make_node("Relu", [out + "_c"], [out]))
            outs.append(out)
        nodes.append(helper.make_node("Concat", outs, [f"cat{m}"], axis=1))
        cur, ch = f"cat{m}", 48
    feeds = {"x": rng.standard_normal((1, c, hw, hw)).astype(np.float32)}
    return make_model(nodes, [tensor("x", [1, c, hw, hw])], [tensor(cur, [1, ch, hw, hw])], inits), feeds
