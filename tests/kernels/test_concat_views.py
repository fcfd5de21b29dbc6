"""Concat without copies (codegen/concat_views.py) against onnxruntime.

Producers write into their slice of the concat's buffer when the slices are contiguous and
aligned; otherwise the Concat copies. Every case checks the answer (1 and 2 threads, via
``check_cases``) and how many Concat copies remain, so a view that should not exist (a conflict,
batch 2, unaligned plain slices, a graph output) or one that should and does not fails.
"""

from __future__ import annotations

import pytest
from helpers import const, tensor
from kernel_models import Case, _model, _rand, check_cases
from onnx import helper

from smelt.codegen.concat_views import plan_concat_views


class Net:
    """A tiny graph builder: convs (3x3 pad 1 or 1x1) and concats on named values."""

    def __init__(self, name: str, shape: tuple) -> None:
        self.p, self.nodes, self.inits, self.k = name, [], [], 0
        self.x = f"{name}_x"
        self.inputs = [tensor(self.x, list(shape))]
        self.feeds = {self.x: _rand(*shape)}
        self.channels = {self.x: shape[1]}

    def conv(self, src: str, oc: int, k: int = 3, relu: bool = True) -> str:
        self.k += 1
        w, b, y = f"{self.p}_w{self.k}", f"{self.p}_b{self.k}", f"{self.p}_c{self.k}"
        self.inits += [const(w, _rand(oc, self.channels[src], k, k) * 0.2), const(b, _rand(oc))]
        self.nodes.append(helper.make_node("Conv", [src, w, b], [y], kernel_shape=[k, k], pads=[k // 2] * 4))
        if relu:
            self.nodes.append(helper.make_node("Relu", [y], [y + "r"]))
            y += "r"
        self.channels[y] = oc
        return y

    def concat(self, *srcs: str) -> str:
        self.k += 1
        y = f"{self.p}_cat{self.k}"
        self.nodes.append(helper.make_node("Concat", list(srcs), [y], axis=1))
        self.channels[y] = sum(self.channels[s] for s in srcs)
        return y

    def case(self, out: str) -> Case:
        return Case(self.p, self.nodes, self.inputs, self.inits, out, self.feeds)


def _copies(expected: int):
    """Structural check: exactly ``expected`` Concat nodes still copy (emit a step)."""
    def check(compiled, target):
        copying = [i.node for i in compiled.plan.step_infos() if i.op == "Concat"]
        assert len(copying) == expected, copying
    return check


def fire(name: str, shape: tuple) -> Case:
    """SqueezeNet's fire module: squeeze, two expands, concat, and a conv reading it."""
    n = Net(name, shape)
    s = n.conv(n.x, 16, 1)
    cat = n.concat(n.conv(s, 32, 1), n.conv(s, 48, 3))
    return n.case(n.conv(cat, 16, 1, relu=False))


def dense_block(name: str, shape: tuple, layers: int = 3) -> Case:
    """DenseNet's pattern: layer k reads the concat of the block input and all earlier features."""
    n = Net(name, shape)
    feats = [n.conv(n.x, 32, 1)]
    for _ in range(layers):
        cat = n.concat(*feats)
        feats.append(n.conv(n.conv(cat, 32, 1), 16, 3))
    return n.case(n.conv(n.concat(*feats), 16, 1, relu=False))


@pytest.mark.parametrize("layout", ["propagate", "nchw"])
def test_fire_and_dense_blocks_write_in_place(layout, monkeypatch, cache):
    # NCHW16c slices are whole channel blocks (aligned); plain 8x8 planes are 256 bytes per channel
    cases = [fire("fire", (1, 32, 8, 8)), dense_block("dense", (1, 16, 8, 8))]
    check_cases(cases, "native", monkeypatch, cache, _copies(0), layout=layout)


def test_batch_two_keeps_the_copy(monkeypatch, cache):
    check_cases([fire("fire_b2", (2, 32, 6, 7))], "native", monkeypatch, cache, _copies(1), layout="propagate")


def test_unaligned_plain_slices_keep_the_copy(monkeypatch, cache):
    # 5x5 planes: a 32-channel slice is 3200 bytes, not a multiple of 64
    n = Net("odd", (1, 8, 5, 5))
    cat = n.concat(n.conv(n.x, 3, 1), n.conv(n.x, 32, 3))
    check_cases([n.case(n.conv(cat, 8, 1, relu=False))], "native", monkeypatch, cache, _copies(1), layout="nchw")


def test_conflicting_concats_share_an_input(monkeypatch, cache):
    """x is the first slice of two concats whose second slices differ: only one can be a view
    (both would put different data at the same place); the answer stays right."""
    n = Net("conflict", (1, 16, 8, 8))
    x = n.conv(n.x, 32, 1)
    a = n.concat(x, n.conv(n.x, 16, 3))
    b = n.concat(x, n.conv(n.x, 32, 1))
    out = n.concat(n.conv(a, 16, 1), n.conv(b, 16, 1))
    check_cases([n.case(out)], "native", monkeypatch, cache, _copies(1), layout="propagate")


def test_repeated_input_keeps_the_copy(monkeypatch, cache):
    n = Net("rep", (1, 16, 8, 8))
    x = n.conv(n.x, 16, 1)
    twice = n.concat(x, x)  # one value cannot sit in two slices
    check_cases([n.case(n.conv(twice, 16, 1, relu=False))], "native", monkeypatch, cache, _copies(1),
                layout="propagate")


def test_graph_output_input_keeps_the_copy(monkeypatch, cache):
    """On plain layouts a concat input that is also a graph output lives outside the arena (on
    blocked layouts it would be the transform's source, which can be a view)."""
    m = Net("gout", (1, 16, 8, 8))
    y = m.conv(m.x, 16, 1)
    cat = m.concat(y, m.conv(m.x, 16, 3))
    cases = [m.case(m.conv(cat, 16, 1, relu=False)), Case("gout_y", [], [], [], y, {})]
    check_cases(cases, "native", monkeypatch, cache, _copies(1), layout="nchw")


def test_views_never_overlap_written_values():
    """Planner invariant on a dense block: written values of a group never share a byte."""
    from smelt.codegen.plan import ALIGN
    from smelt.compiler import lower
    from smelt.frontend.onnx_import import load_model
    from smelt.options import CompileOptions

    model, _ = _model([dense_block("inv", (1, 16, 8, 8), layers=4)])
    g = lower(load_model(model), CompileOptions(threads=1, use_tuning_db=False))
    internal = {o for n in g.nodes for o in n.outputs if o and o not in g.outputs}
    views = plan_concat_views(g, list(g.nodes), internal, ALIGN)
    assert len(views.elided) == 5
    producers = g.producers()
    for members in views.groups().values():
        spans = sorted((off, off + g.values[m].nbytes) for m, off in members.items()
                       if producers[m].name not in views.elided)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False)), spans
        assert all(off % ALIGN == 0 for off in members.values())
