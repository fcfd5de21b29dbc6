"""Value specialization (frontend/value_guards.py, through control_flow's Decisions/specialize):
small graph inputs that decide shapes are compiled in as constants, one variant per value, so the
nodes they size run natively. Always against onnxruntime."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from helpers import assert_close, const, make_model, ort_run, tensor
from onnx import TensorProto, helper

import smelt
from smelt.frontend.control_flow import Decisions, guards, specialize
from smelt.frontend.value_guards import (
    MAX_VALUE_ELEMS,
    ValueGuard,
    ValueSpecializationWarning,
    value_guards,
)

RNG = np.random.default_rng(11)
I64 = TensorProto.INT64


def _reshape_model():
    return make_model([helper.make_node("Reshape", ["x", "shape"], ["y"])],
                      [tensor("x", [2, 3, 4]), tensor("shape", [2], I64)], [tensor("y", None)])


def test_reshape_target_input_two_values_two_variants():
    """Each target value is its own native variant; a value seen before reuses its variant."""
    model = _reshape_model()
    cm = smelt.compile(model, threads=1)
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    for target, built in (([6, 4], 1), ([4, -1], 2), ([6, 4], 2), ([4, -1], 2)):
        feeds = {"x": x, "shape": np.array(target, np.int64)}
        got = cm.run(feeds)
        assert_close(got, ort_run(model, feeds))
        assert got[0].shape == ort_run(model, feeds)[0].shape
        assert cm.fallback_nodes == []
        assert cm.compilations == built


def test_reduce_axes_input():
    """ReduceSum's axes (an input since opset 13), declared with a symbolic length, both ways."""
    model = make_model([helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)],
                       [tensor("x", [3, 4, 5]), tensor("axes", ["k"], I64)], [tensor("y", None)], opset=18)
    cm = smelt.compile(model, threads=2)
    x = RNG.standard_normal((3, 4, 5)).astype(np.float32)
    for axes in ([1], [0, 2], [-1]):
        feeds = {"x": x, "axes": np.array(axes, np.int64)}
        assert_close(cm.run(feeds), ort_run(model, feeds))
        assert cm.fallback_nodes == []


def test_resize_scales_input():
    """Resize's float scales as an input: specialized by value, native, right."""
    model = make_model([helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear")],
                       [tensor("x", [1, 2, 4, 6]), tensor("scales", [4])], [tensor("y", None)], opset=18)
    cm = smelt.compile(model, threads=1)
    x = RNG.standard_normal((1, 2, 4, 6)).astype(np.float32)
    for scales in ([1, 1, 2, 0.5], [1, 1, 1.5, 2]):
        feeds = {"x": x, "scales": np.array(scales, np.float32)}
        assert_close(cm.run(feeds), ort_run(model, feeds))
        assert cm.fallback_nodes == []


def test_shape_arithmetic_and_if_branches():
    """The target is computed from the input through arithmetic and through an If (decided by a
    shape) whose branches read the input: the reads inside the branches are specialized too."""
    ifnode = helper.make_node(
        "If", ["is1"], ["t"],
        then_branch=helper.make_graph([helper.make_node("Mul", ["n", "one"], ["tt"])], "then", [],
                                      [tensor("tt", None, I64)]),
        else_branch=helper.make_graph([helper.make_node("Add", ["n", "zero"], ["te"])], "else", [],
                                      [tensor("te", None, I64)]))
    nodes = [helper.make_node("Shape", ["x"], ["shp"]),
             helper.make_node("Gather", ["shp", "zero"], ["b"], axis=0),
             helper.make_node("Equal", ["b", "one"], ["is1"]),
             ifnode,
             helper.make_node("Unsqueeze", ["t", "zero1"], ["t1"]),
             helper.make_node("Concat", ["t1", "minus1"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    model = make_model(nodes, [tensor("x", ["B", 12]), tensor("n", [], I64)], [tensor("y", None)],
                       [const("zero", np.int64(0)), const("one", np.int64(1)), const("zero1", np.array([0], np.int64)),
                        const("minus1", np.array([-1], np.int64))])
    (guard,) = value_guards(model)
    assert guard.input == "n" and {path for path, _, _ in guard.edges} == {((3, "then_branch"),), ((3, "else_branch"),)}
    cm = smelt.compile(model, threads=1)
    for batch, n in ((1, 3), (2, 4), (2, 6)):
        feeds = {"x": RNG.standard_normal((batch, 12)).astype(np.float32), "n": np.array(n, np.int64)}
        assert_close(cm.run(feeds), ort_run(model, feeds))
        assert cm.fallback_nodes == []


def test_data_reads_keep_the_input():
    """An input read both as a shape and as data: only the shape edge is specialized (the data
    path still reads the graph input, so it is not folded into a constant)."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"]),
             helper.make_node("Cast", ["shape"], ["sf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["sf", "w"], ["z"])]
    model = make_model(nodes, [tensor("x", [2, 6]), tensor("shape", [2], I64), tensor("w", [2])],
                       [tensor("y", None), tensor("z", [2])])
    (guard,) = value_guards(model)
    assert guard.edges == (((), 0, 1),)
    spec = specialize(model, [guard], (guard.evaluate({"shape": np.array([3, 4], np.int64)}),))
    assert list(spec.graph.node[0].input) == ["x", "shape/specialized_value"]
    assert list(spec.graph.node[1].input) == ["shape"]
    cm = smelt.compile(model, threads=1)
    feeds = {"x": RNG.standard_normal((2, 6)).astype(np.float32), "shape": np.array([3, 4], np.int64),
             "w": np.array([0.5, 2.0], np.float32)}
    assert_close(cm.run(feeds), ort_run(model, feeds))
    assert cm.fallback_nodes == []


def test_large_data_input_is_never_specialized():
    """A target computed from a data input of more than MAX_VALUE_ELEMS elements is data-dependent:
    no guard, the Reshape stays on the fallback (right), and no call hashes the data."""
    n = MAX_VALUE_ELEMS + 1
    nodes = [helper.make_node("ReduceMax", ["d"], ["m"], keepdims=1),
             helper.make_node("Cast", ["m"], ["mi"], to=I64),
             helper.make_node("Concat", ["mi", "minus1"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    model = make_model(nodes, [tensor("x", [4, 6]), tensor("d", [n])], [tensor("y", None)],
                       [const("minus1", np.array([-1], np.int64))])
    assert guards(model) == []
    cm = smelt.compile(model, threads=1)
    for top in (2.0, 3.0):
        feeds = {"x": RNG.standard_normal((4, 6)).astype(np.float32), "d": np.full(n, top, np.float32)}
        assert_close(cm.run(feeds), ort_run(model, feeds))
    assert "Reshape" in [r["op"] for r in cm.fallback_report]
    # an input of undeclared size is a candidate, but a call giving it more elements is not specialized
    guard = ValueGuard("s", ())
    assert guard.evaluate({"s": np.zeros(n, np.int64)}) is None
    assert guard.evaluate({"s": np.zeros(MAX_VALUE_ELEMS, np.int64)}) is not None
    big = np.arange(n, dtype=np.int64)
    assert Decisions([guard])._key(big) == (big.dtype.num, big.shape)


def test_recompile_bound(monkeypatch):
    """Past SMELT_MAX_VARIANTS distinct values, new values warn once and run the generic variant
    (the Reshape on the fallback) instead of compiling per call; values seen before stay native."""
    monkeypatch.setenv("SMELT_MAX_VARIANTS", "2")
    model = _reshape_model()
    cm = smelt.compile(model, threads=1)
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    targets = ([6, 4], [4, 6], [12, 2], [2, 12], [3, 8])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for target in targets:
            feeds = {"x": x, "shape": np.array(target, np.int64)}
            assert_close(cm.run(feeds), ort_run(model, feeds))
    widened = [w for w in caught if issubclass(w.category, ValueSpecializationWarning)]
    assert len(widened) == 1 and "shape" in str(widened[0].message)
    assert cm.compilations == 3  # two specialized values, then one generic variant for the rest
    assert cm.fallback_nodes == ["Reshape_0"]
    cm.run({"x": x, "shape": np.array([6, 4], np.int64)})
    assert cm.fallback_nodes == []


def test_recompile_bound_without_fallback_is_an_error(monkeypatch):
    """With allow_fallback=False the generic variant cannot be built: past the bound a new value
    is an error naming the node, never a silent recompile per call."""
    monkeypatch.setenv("SMELT_MAX_VARIANTS", "1")
    model = _reshape_model()
    cm = smelt.compile(model, threads=1, allow_fallback=False)
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    cm.run({"x": x, "shape": np.array([6, 4], np.int64)})
    assert cm.fallback_nodes == []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ValueSpecializationWarning)
        with pytest.raises(Exception, match="Reshape"):
            cm.run({"x": x, "shape": np.array([4, 6], np.int64)})
