"""1-D ConvInteger and QLinearConv run as 2-D ones of height 1 (passes/lift_1d_integer.py).

Against onnxruntime, equal (not close): ConvInteger with uint8 input, int8 and uint8 weights,
with and without zero points, kernels 1/3/7, dilations 1/3/5, strides 1/2, asymmetric pads,
SAME_UPPER/SAME_LOWER/VALID, groups and depthwise, odd channel counts, lengths below, at and
above 16, batch 2; a per-output-channel weight zero point against the int64 definition
(onnxruntime's ConvInteger takes a scalar only). QLinearConv with uint8 and int8 activations,
per-tensor and per-channel scales, with and without bias, saturating scales. Every ISA the int
conv template has, 1 and 2 threads, nothing falls back. Then the graph: what the pass writes,
that a shared input gets one Reshape, a node no template takes in 2-D is left as it was, and
the ``lift_1d`` switch turns it off.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from helpers import const, make_model, tensor
from kernel_models import AVX_VNNI, force_isa
from node_cases import Cases, assert_close, build_model, oracle
from onnx import TensorProto, helper

import smelt
from smelt.compiler import lower
from smelt.options import CompileOptions

pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(20261127)
ISAS = ["native", "avx2", AVX_VNNI, "scalar"]  # as tests/kernels/test_int_conv.py
f32 = np.float32


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("smelt-cache")


def _q(dtype, *shape) -> np.ndarray:
    info = np.iinfo(dtype)
    return RNG.integers(info.min, int(info.max) + 1, shape).astype(dtype)


# (C, OC, k, stride, dilation, pads or auto_pad, group, L)
GEOMETRIES = [
    (5, 7, 3, 1, 3, (3, 3), 1, 16),
    (13, 16, 7, 1, 5, (15, 15), 1, 37),
    (5, 13, 1, 2, 1, (0, 1), 1, 11),
    (6, 9, 3, 2, 1, (2, 0), 3, 16),  # grouped, asymmetric pads
    (13, 13, 7, 1, 3, (9, 9), 13, 23),  # depthwise, dilated
    (8, 16, 3, 1, 1, "SAME_UPPER", 1, 9),
    (8, 8, 7, 2, 1, "SAME_LOWER", 2, 16),
    (5, 8, 3, 1, 5, "VALID", 1, 37),
]


def _attrs(k: int, s: int, d: int, pads, group: int) -> dict:
    attrs = dict(kernel_shape=[k], strides=[s], dilations=[d], group=group)
    if isinstance(pads, str):
        attrs["auto_pad"] = pads
    else:
        attrs["pads"] = list(pads)
    return attrs


def _conv_integer_ref(x, w, xz, wz, k, s, d, pads, group) -> np.ndarray:
    """The int64 definition of a 1-D ConvInteger with explicit pads; ``wz`` scalar or per channel."""
    n, c, length = x.shape
    oc, cg = w.shape[:2]
    xs = np.pad(x.astype(np.int64) - int(xz), ((0, 0), (0, 0), pads))
    wd = w.astype(np.int64) - np.broadcast_to(np.asarray(wz, np.int64).reshape(-1), (oc,))[:, None, None]
    out_len = (length + pads[0] + pads[1] - (k - 1) * d - 1) // s + 1
    y = np.zeros((n, oc, out_len), np.int64)
    for o in range(oc):
        gi = o // (oc // group)
        for t in range(k):
            cols = xs[:, gi * cg:(gi + 1) * cg, t * d:t * d + (out_len - 1) * s + 1:s]
            y[:, o] += np.einsum("ncl,c->nl", cols, wd[o, :, t])
    return y.astype(np.int32)


def _cases() -> tuple[Cases, dict, set[str], dict[str, np.ndarray]]:
    """One model: the ConvInteger and QLinearConv cases; the outputs onnxruntime cannot take
    (checked against the int64 definition instead) with their expected values."""
    cases, feeds, own = Cases(), {}, {}
    for c, oc, k, s, d, pads, grp, length in GEOMETRIES:
        x = f"x{c}_{length}"
        feeds.setdefault(x, _q(np.uint8, 2, c, length))
        attrs = _attrs(k, s, d, pads, grp)
        wi, wu = _q(np.int8, oc, c // grp, k), _q(np.uint8, oc, c // grp, k)
        cases.add("ConvInteger", [x], consts=(wi, np.uint8(128), np.int8(-3)), **attrs)
        cases.add("ConvInteger", [x], consts=(wi,), **attrs)
        cases.add("ConvInteger", [x], consts=(wu, np.uint8(121), np.uint8(178)), **attrs)
        cases.add("ConvInteger", [x], consts=(wu, np.uint8(0), np.uint8(255)), **attrs)
        cases.add("ConvInteger", [x], consts=(wu, None, np.uint8(7)), **attrs)
        if isinstance(pads, tuple):  # per output channel: the int64 definition is the oracle
            for w, zt in ((wi, np.int8), (wu, np.uint8)):
                wz = _q(zt, oc)
                out = cases.add("ConvInteger", [x], consts=(w, np.uint8(99), wz), **attrs)[0]
                own[out] = _conv_integer_ref(feeds[x], w, 99, wz, k, s, d, pads, grp)
    # QLinearConv: uint8 and int8 activations, per-tensor and per-channel scales, bias
    for c, oc, k, s, d, pads, grp, length in GEOMETRIES[:5]:
        attrs = _attrs(k, s, d, pads, grp)
        for xt in (np.uint8, np.int8):
            x = f"q{xt.__name__}{c}_{length}"
            feeds.setdefault(x, _q(xt, 2, c, length))
            w = _q(np.int8, oc, c // grp, k)
            bias = RNG.integers(-5000, 5000, oc).astype(np.int32)
            for y_scale in (f32(0.5), f32(1e-3)):  # the second saturates nearly everything
                cases.add("QLinearConv", [x], consts=(f32(0.02), xt(7), w, f32(0.01), np.int8(0), y_scale, xt(3), bias),
                          **attrs)
            per_channel = RNG.uniform(0.002, 0.03, oc).astype(f32)
            cases.add("QLinearConv", [x], consts=(f32(0.05), xt(-2 if xt == np.int8 else 100), w, per_channel,
                                                  np.zeros(oc, np.int8), f32(0.7), xt(0), bias), **attrs)
            cases.add("QLinearConv", [x], consts=(f32(0.03), xt(5), w, per_channel, np.zeros(oc, np.int8), f32(0.2),
                                                  xt(-4 if xt == np.int8 else 9)), **attrs)
    return cases, feeds, set(own), own


def _without(model, outputs: set[str]):
    """``model`` without the nodes writing ``outputs`` (onnxruntime refuses them)."""
    m = copy.deepcopy(model)
    keep = [n for n in m.graph.node if n.output[0] not in outputs]
    del m.graph.node[:]
    m.graph.node.extend(keep)
    keep_out = [o for o in m.graph.output if o.name not in outputs]
    del m.graph.output[:]
    m.graph.output.extend(keep_out)
    return m


@pytest.mark.parametrize("isa", ISAS)
def test_matches_onnxruntime(isa: str, monkeypatch, cache) -> None:
    force_isa(isa, monkeypatch, cache)
    cases, feeds, refused, own = _cases()
    model = build_model(cases, feeds, opset=21)
    want = dict(zip([o for o in cases.outputs if o not in refused],
                    oracle(_without(model, refused), feeds), strict=True)) | own
    errors = []
    for threads in (1, 2):
        compiled = smelt.compile(model, threads=threads)
        assert compiled.fallback_nodes == [], compiled.fallback_report
        for name, got in zip(cases.outputs, compiled.run(feeds), strict=True):
            try:
                assert_close(f"{name} ({isa}, threads={threads})", got, want[name])
            except AssertionError as exc:
                errors.append(str(exc))
        compiled.close()
    assert not errors, "\n".join(errors)


# -- the graph --------------------------------------------------------------------------------
def _int_conv_model(c: int = 5, oc: int = 8, k: int = 3, length: int = 20, weights=None, **attrs):
    """x (uint8 [1, C, L]) -> two ConvIntegers reading it, dilated; weights a constant unless given."""
    nodes = [helper.make_node("ConvInteger", ["x", "w", "xz"], ["y"], kernel_shape=[k], pads=[3, 3], dilations=[3],
                              **attrs),
             helper.make_node("ConvInteger", ["x", "w2"], ["y2"], kernel_shape=[k], strides=[2])]
    w = _q(np.int8, oc, c, k) if weights is None else weights
    inits = [const("w", w), const("w2", _q(np.int8, oc, c, k)), const("xz", np.uint8(128))]
    return make_model(nodes, [tensor("x", [1, c, length], TensorProto.UINT8)],
                      [tensor("y", None, TensorProto.INT32), tensor("y2", None, TensorProto.INT32)], inits)


def _convs(g) -> list:
    return [n for n in g.nodes if n.op == "ConvInteger"]


def test_lifted_form_and_one_reshape_per_input() -> None:
    g = lower(_int_conv_model(), CompileOptions(threads=1))
    convs = _convs(g)
    assert len(convs) == 2
    for n in convs:
        assert len(g.values[n.inputs[0]].shape) == 4 and len(g.values[n.outputs[0]].shape) == 4
        assert g.values[n.inputs[1]].const.shape[2] == 1
    assert convs[0].inputs[0] == convs[1].inputs[0]  # one lifted input, read by both
    assert convs[0].attrs["pads"] == [0, 3, 0, 3] and convs[0].attrs["dilations"] == [1, 3]
    assert convs[1].attrs["strides"] == [1, 2] and convs[1].attrs["kernel_shape"] == [1, 3]
    assert sum(n.op == "Reshape" for n in g.nodes) == 3  # one in, two out
    assert [tuple(g.values[o].shape) for o in g.outputs] == [(1, 8, 20), (1, 8, 9)]


def test_switched_off_stays_1d() -> None:
    g = lower(_int_conv_model(), CompileOptions(threads=1, lift_1d=False))
    assert all(len(g.values[n.inputs[0]].shape) == 3 for n in _convs(g))
    assert not any(n.op == "Reshape" for n in g.nodes)


def test_node_no_template_takes_is_left_alone() -> None:
    """A receptive field beyond the int16-pair sum's bound (int_conv's MAX_K): refused in 2-D
    too, so the node stays 1-D and the graph gains nothing."""
    from smelt.codegen.kernels.int_gemm import MAX_K

    c = MAX_K // 3 + 1
    w = np.ones((1, c, 3), np.int8)
    g = lower(_int_conv_model(c=c, oc=1, length=8, weights=w), CompileOptions(threads=1))
    big = next(n for n in _convs(g) if n.inputs[1] == "w")
    assert len(g.values[big.inputs[0]].shape) == 3 and big.attrs["pads"] == [3, 3]
    assert not any("w_h1" in name and g.values[name].const.shape[1] == c for name in g.values)


def test_reads_a_lifted_producer_directly(monkeypatch, cache) -> None:
    """An input that is a Reshape of a [N, C, 1, L] value (the boundary of a lifted float region)
    is read as that value: no Reshape back and forth."""
    nodes = [helper.make_node("Reshape", ["x4", "shape"], ["x"]),
             helper.make_node("ConvInteger", ["x", "w"], ["y"], kernel_shape=[3])]
    model = make_model(nodes, [tensor("x4", [2, 5, 1, 12], TensorProto.UINT8)], [tensor("y", None, TensorProto.INT32)],
                       [const("shape", np.array([2, 5, 12], np.int64)), const("w", _q(np.int8, 4, 5, 3))])
    g = lower(model, CompileOptions(threads=1))
    (conv,) = _convs(g)
    assert conv.inputs[0] == "x4"
    assert [n.op for n in g.nodes] == ["ConvInteger", "Reshape"]  # the Reshape down is gone
    monkeypatch.setenv("SMELT_CACHE_DIR", str(cache))
    compiled = smelt.compile(model)
    x4 = _q(np.uint8, 2, 5, 1, 12)
    np.testing.assert_array_equal(compiled(x4), oracle(model, {"x4": x4})[0])
    assert compiled.fallback_nodes == []
    compiled.close()
