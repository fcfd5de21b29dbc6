"""If nodes: a condition known at compile time inlines the branch taken (passes/inline_if.py); one
decided by small graph inputs specializes the model per branch (frontend/control_flow.py); a
data-dependent one runs both branches natively under a run-time select (passes/runtime_if.py,
tests/passes/test_runtime_if.py), or stays on the fallback when its branches' shapes differ.
Always against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
from helpers import assert_close, const, make_model, ort_run, tensor
from onnx import TensorProto, helper

import smelt

RNG = np.random.default_rng(3)


def _branch(name: str, nodes, out: str, inits=()) -> onnx.GraphProto:
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
                             initializer=list(inits))


def _two_way_model(cond_nodes, cond: str, inputs, opset: int = 17):
    """y = If(cond, then: Relu(x @ W1 + b) with a nested If on a branch value, else: Sigmoid(x) * 2)."""
    nested = helper.make_node(
        "If", ["k"], ["n"], name="nested",
        then_branch=_branch("nt", [helper.make_node("Neg", ["h"], ["nn"])], "nn"),  # reads the branch's h
        else_branch=_branch("ne", [helper.make_node("Identity", ["h"], ["ne_o"])], "ne_o"))
    then = _branch("then", [helper.make_node("MatMul", ["x", "w1"], ["m"]),
                            helper.make_node("Add", ["m", "b1"], ["a"]),
                            helper.make_node("Relu", ["a"], ["h"]),
                            helper.make_node("Constant", [], ["k"], value=helper.make_tensor("kv", TensorProto.BOOL, [], [True])),
                            nested,
                            helper.make_node("Mul", ["n", "two"], ["t_out"])], "t_out",
                   inits=[const("w1", RNG.standard_normal((4, 4)).astype(np.float32)),
                          const("b1", RNG.standard_normal(4).astype(np.float32))])
    other = _branch("else", [helper.make_node("Sigmoid", ["x"], ["s"]),
                             helper.make_node("Mul", ["s", "two"], ["e_out"])], "e_out")
    nodes = cond_nodes + [helper.make_node("If", [cond], ["y"], name="choose", then_branch=then, else_branch=other)]
    return make_model(nodes, inputs, [tensor("y", None)], [const("two", np.float32(2.0))], opset=opset)


def test_shape_condition_inlines_the_branch():
    """cond = (x.shape[0] == 1): constant once shapes are known; each batch size compiles the
    branch it takes, natively (the If and its nested If disappear)."""
    nodes = [helper.make_node("Shape", ["x"], ["shp"]),
             helper.make_node("Gather", ["shp", "zero"], ["batch"], axis=0),
             helper.make_node("Equal", ["batch", "one"], ["c"])]
    model = _two_way_model(nodes, "c", [tensor("x", ["N", 4])])
    model.graph.initializer.extend([const("zero", np.int64(0)), const("one", np.int64(1))])
    cm = smelt.compile(model, threads=2)
    for batch in (1, 3):
        x = RNG.standard_normal((batch, 4)).astype(np.float32)
        assert_close([cm(x)], ort_run(model, {"x": x}))
        assert cm.fallback_nodes == []


def test_input_condition_specializes_per_branch():
    """cond = (sr == 16000) on a scalar input, as silero-vad: one native variant per branch, each
    built once; the decision is remembered per input value."""
    nodes = [helper.make_node("Equal", ["sr", "rate"], ["c"])]
    model = _two_way_model(nodes, "c", [tensor("x", [2, 4]), tensor("sr", [], TensorProto.INT64)])
    model.graph.initializer.append(const("rate", np.int64(16000)))
    cm = smelt.compile(model, threads=1)
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    for sr in (16000, 8000, 16000, 8000):
        feeds = {"x": x, "sr": np.array(sr, np.int64)}
        assert_close(cm.run(feeds), ort_run(model, feeds))
        assert cm.fallback_nodes == []
    assert cm.compilations == 2


def test_data_condition_runs_natively():
    """cond = (sum(x) > 0) depends on the data: both branches (the nested If inlined) compile
    natively, the taken one is chosen at run time, and the answer is right for either."""
    nodes = [helper.make_node("ReduceSum", ["x"], ["r"], keepdims=0),
             helper.make_node("Greater", ["r", "zero"], ["c"])]
    model = _two_way_model(nodes, "c", [tensor("x", [2, 4])])
    model.graph.initializer.append(const("zero", np.float32(0)))
    cm = smelt.compile(model, threads=1)
    for sign in (1.0, -1.0):
        x = (np.abs(RNG.standard_normal((2, 4))) * sign).astype(np.float32)
        assert_close([cm(x)], ort_run(model, {"x": x}))
    assert cm.fallback_nodes == []


def test_fallback_if_reading_an_eliminated_identity():
    """An If left on the fallback reads an outer value that an Identity produced; eliminating the
    Identity renames that read inside the branches too (it used to leave the branch reading a
    value nothing produced any more). Its branches' shapes differ ([3] and []), so it stays whole."""
    x_copy = helper.make_node("Identity", ["x"], ["x_copy"])
    cond = [helper.make_node("ReduceSum", ["x_copy"], ["r"], keepdims=0),
            helper.make_node("Greater", ["r", "zero"], ["c"])]
    then = _branch("then", [helper.make_node("Relu", ["x_copy"], ["t"])], "t")
    other = _branch("else", [helper.make_node("ReduceMax", ["x_copy"], ["e"], keepdims=0)], "e")
    model = make_model([x_copy] + cond + [helper.make_node("If", ["c"], ["y"], name="choose", then_branch=then,
                                                           else_branch=other)],
                       [tensor("x", [3])], [tensor("y", None)], [const("zero", np.float32(0))])
    cm = smelt.compile(model, threads=1)
    for x in (np.array([1, -2, 3], np.float32), np.array([-1, -2, 0.5], np.float32)):
        assert_close([cm(x)], ort_run(model, {"x": x}))
    assert cm.fallback_nodes == ["choose"]
