"""1-D conv networks run as 2-D ones of height 1 (passes/lift_1d.py): a TCN (strided stem, GELU,
max pooling, dilated residual blocks), a causal GLU block (Pad, Slice, Split, Concat, BatchNorm),
depthwise and grouped 1-D convs, a region read and fed from outside (a Softmax over the time
axis), against onnxruntime at every ISA, 1 and 2 threads; which regions are lifted (the
crossings rule, deep convs left on the GEMM) and that the switch turns it off."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import const, make_model, tensor
from kernel_models import Case, check_cases
from onnx import helper

from smelt.compiler import lower
from smelt.frontend.onnx_import import load_model
from smelt.options import CompileOptions

RNG = np.random.default_rng(1127)


def _f32(*shape, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _gelu(p: str, x: str, y: str) -> list:
    """The exact GELU as exporters spell it: x * 0.5 * (1 + erf(x / sqrt 2))."""
    return [helper.make_node("Div", [x, p + "sqrt2"], [y + "_d"]),
            helper.make_node("Erf", [y + "_d"], [y + "_e"]),
            helper.make_node("Add", [y + "_e", p + "one"], [y + "_a"]),
            helper.make_node("Mul", [x, y + "_a"], [y + "_m"]),
            helper.make_node("Mul", [y + "_m", p + "half"], [y])]


def _tcn(name: str, n: int = 2, c: int = 15, length: int = 61, oc: int = 32) -> Case:
    """Conv(k7, s2, pads 3 and 1) -> GELU -> MaxPool(2) -> 2 residual blocks of dilated Conv(k5) -> Relu ->
    Conv(k5) + skip -> Mul by a per-channel constant [oc, 1] -> Add a run-time [oc, L] input."""
    p = f"{name}_"
    conv = lambda x, w, b, y, **a: helper.make_node("Conv", [x, p + w, p + b], [y], **a)  # noqa: E731
    nodes = [conv(p + "x", "w0", "b0", p + "c0", kernel_shape=[7], strides=[2], pads=[3, 1])]
    nodes += _gelu(p, p + "c0", p + "g0")
    nodes.append(helper.make_node("MaxPool", [p + "g0"], [p + "m0"], kernel_shape=[2], strides=[2]))
    inits = [const(p + "w0", _f32(oc, c, 7, scale=0.2)), const(p + "b0", _f32(oc)),
             const(p + "sqrt2", np.float32(np.sqrt(2))), const(p + "one", np.float32(1)),
             const(p + "half", np.float32(0.5))]
    cur = p + "m0"
    for k, dil in enumerate((2, 4)):
        q = f"{p}blk{k}_"
        nodes += [conv(cur, f"blk{k}_w1", f"blk{k}_b1", q + "c1", kernel_shape=[5], dilations=[dil], pads=[2 * dil] * 2),
                  helper.make_node("Relu", [q + "c1"], [q + "r1"]),
                  conv(q + "r1", f"blk{k}_w2", f"blk{k}_b2", q + "c2", kernel_shape=[5], pads=[2, 2]),
                  helper.make_node("Add", [cur, q + "c2"], [q + "y"])]
        inits += [const(q + "w1", _f32(oc, oc, 5, scale=0.1)), const(q + "b1", _f32(oc)),
                  const(q + "w2", _f32(oc, oc, 5, scale=0.1)), const(q + "b2", _f32(oc))]
        cur = q + "y"
    steps = ((length + 4 - 7) // 2 + 1) // 2
    nodes += [helper.make_node("Mul", [cur, p + "scale"], [p + "s"]),
              helper.make_node("Add", [p + "s", p + "bias_in"], [p + "y"])]
    inits.append(const(p + "scale", _f32(oc, 1)))
    x, r = p + "x", p + "bias_in"
    return Case(name, nodes, [tensor(x, [n, c, length]), tensor(r, [oc, steps])], inits, p + "y",
                {x: _f32(n, c, length), r: _f32(oc, steps)})


def _causal_glu(name: str, c: int = 8, length: int = 37, n: int = 2) -> Case:
    """Pad(4 steps before) -> Conv(c -> 2c, k5) -> Slice(drop 2 last steps) -> Split(channels) ->
    a * Sigmoid(b) -> Concat(channels, with a depthwise conv of the input's last 33 steps) ->
    grouped Conv(2 groups, k3, stride 2) -> BatchNormalization."""
    p = f"{name}_"
    nodes = [helper.make_node("Pad", [p + "x", p + "pads"], [p + "xp"]),
             helper.make_node("Conv", [p + "xp", p + "w0", p + "b0"], [p + "c0"], kernel_shape=[5]),
             helper.make_node("Slice", [p + "c0", p + "st", p + "en", p + "ax"], [p + "sl"]),
             helper.make_node("Split", [p + "sl"], [p + "ga", p + "gb"], axis=1),
             helper.make_node("Sigmoid", [p + "gb"], [p + "gs"]),
             helper.make_node("Mul", [p + "ga", p + "gs"], [p + "glu"]),
             helper.make_node("Slice", [p + "x", p + "st2", p + "en2", p + "ax2"], [p + "xt"]),
             helper.make_node("Conv", [p + "xt", p + "wd"], [p + "dw"], kernel_shape=[3], pads=[1, 1], group=c),
             helper.make_node("Concat", [p + "glu", p + "dw"], [p + "cat"], axis=-2),
             helper.make_node("Conv", [p + "cat", p + "wg", p + "bg"], [p + "cg"], kernel_shape=[3], strides=[2],
                              pads=[1, 1], group=2),
             helper.make_node("BatchNormalization", [p + "cg", p + "bs", p + "bb", p + "bm", p + "bv"], [p + "y"])]
    inits = [const(p + "pads", np.array([0, 0, 4, 0, 0, 0], np.int64)),
             const(p + "w0", _f32(2 * c, c, 5, scale=0.3)), const(p + "b0", _f32(2 * c)),
             const(p + "st", np.array([0], np.int64)), const(p + "en", np.array([-2], np.int64)),
             const(p + "ax", np.array([-1], np.int64)),
             const(p + "st2", np.array([length - 35], np.int64)), const(p + "en2", np.array([length], np.int64)),
             const(p + "ax2", np.array([2], np.int64)),
             const(p + "wd", _f32(c, 1, 3)), const(p + "wg", _f32(16, c, 3, scale=0.3)), const(p + "bg", _f32(16)),
             const(p + "bs", _f32(16)), const(p + "bb", _f32(16)), const(p + "bm", _f32(16)),
             const(p + "bv", np.abs(_f32(16)) + 0.5)]
    x = p + "x"
    return Case(name, nodes, [tensor(x, [n, c, length])], inits, p + "y", {x: _f32(n, c, length)})


def _read_outside(name: str, c: int = 16, length: int = 40) -> Case:
    """Four convs; the first one's output also goes through a Softmax over time (not lifted),
    which comes back into the region as a Mul operand: four crossings (x and the Softmax's
    output in, the first conv's output and y out) for four convs."""
    p = f"{name}_"
    nodes = [helper.make_node("Conv", [p + "x", p + "w0"], [p + "c0"], kernel_shape=[3], pads=[1, 1]),
             helper.make_node("Softmax", [p + "c0"], [p + "sm"], axis=-1),
             helper.make_node("Mul", [p + "c0", p + "sm"], [p + "m"]),
             helper.make_node("Conv", [p + "m", p + "w1"], [p + "c1"], kernel_shape=[3], pads=[1, 1]),
             helper.make_node("Conv", [p + "c1", p + "w2"], [p + "c2"], kernel_shape=[1]),
             helper.make_node("Conv", [p + "c2", p + "w3"], [p + "c3"], kernel_shape=[3], strides=[2]),
             helper.make_node("Tanh", [p + "c3"], [p + "y"])]
    inits = [const(p + "w0", _f32(c, c, 3, scale=0.3)), const(p + "w1", _f32(c, c, 3, scale=0.3)),
             const(p + "w2", _f32(c, c, 1, scale=0.3)), const(p + "w3", _f32(c, c, 3, scale=0.3))]
    x = p + "x"
    return Case(name, nodes, [tensor(x, [3, c, length])], inits, p + "y", {x: _f32(3, c, length)})


CASES = [_tcn("tcn"), _tcn("tcn_odd", n=1, c=3, length=50, oc=16), _causal_glu("glu"), _read_outside("outside")]


def _lowered(case: Case, **options):
    model = load_model(make_model(case.nodes, case.inputs, [tensor(case.output, None)], case.inits))
    return lower(model, CompileOptions(threads=1, **options))


def _conv_ranks(case: Case, **options) -> list[int]:
    g = _lowered(case, **options)
    return [len(g.values[n.inputs[0]].shape) for n in g.nodes if n.op == "Conv"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_lifted_to_blocked_2d_convs(case):
    g = _lowered(case)
    convs = [n for n in g.nodes if n.op == "Conv"]
    assert convs and all(len(g.values[n.inputs[0]].shape) == 4 for n in convs)
    assert all(g.values[n.outputs[0]].layout != "plain" for n in convs), [g.values[n.outputs[0]].layout for n in convs]
    # the region's boundary only: one Reshape in per outside value, one out per value read outside
    assert sum(n.op == "Reshape" for n in g.nodes) <= 4


def test_switched_off_stays_1d():
    assert set(_conv_ranks(CASES[0], lift_1d=False)) == {3}


def test_batch_1_cuts_rows_into_segments():
    """One image: each lifted conv has one output row, cut into column segments so that every
    thread has work (``schedule.conv.row_segments``)."""
    g = _lowered(_tcn("one", n=1, length=400))
    convs = [n for n in g.nodes if n.op == "Conv"]
    assert convs and all(len(g.values[n.inputs[0]].shape) == 4 for n in convs)
    assert all(n.schedule.direct.row_segments > 1 for n in convs), [n.schedule.direct for n in convs]


def test_deep_convs_stay_on_the_gemm():
    """128 channels x 3 taps: a deep reduction; the GEMM runs it well and its region is not lifted."""
    p = "deep_"
    nodes = [helper.make_node("Conv", [p + "x", p + "w0"], [p + "c0"], kernel_shape=[3], pads=[1, 1]),
             helper.make_node("Relu", [p + "c0"], [p + "y"])]
    case = Case("deep", nodes, [tensor(p + "x", [1, 128, 50])], [const(p + "w0", _f32(128, 128, 3))], p + "y", {})
    assert _conv_ranks(case) == [3]


def test_a_lone_shallow_conv_among_deep_ones_stays():
    """A shallow 1x1 conv between two deep ones: lifting it would cost two Reshapes for one conv."""
    p = "mix_"
    nodes = [helper.make_node("Conv", [p + "x", p + "w0"], [p + "c0"], kernel_shape=[3], pads=[1, 1]),
             helper.make_node("Conv", [p + "c0", p + "w1"], [p + "c1"], kernel_shape=[1]),
             helper.make_node("Conv", [p + "c1", p + "w2"], [p + "y"], kernel_shape=[3], pads=[1, 1])]
    inits = [const(p + "w0", _f32(128, 128, 3)), const(p + "w1", _f32(128, 128, 1)),
             const(p + "w2", _f32(128, 128, 3))]
    case = Case("mix", nodes, [tensor(p + "x", [1, 128, 50])], inits, p + "y", {})
    assert _conv_ranks(case) == [3, 3, 3]


@pytest.mark.parametrize("isa", ["native", "avx2", "scalar"])
def test_matches_onnxruntime(isa, monkeypatch, tmp_path):
    def check(compiled, target):
        assert sum(op == "Reshape" for _, op in compiled.native_nodes) <= 4 * len(CASES)

    check_cases(CASES, isa, monkeypatch, tmp_path, check, layout="propagate")
