"""Scan over a static sequence unrolled into its body once per iteration (passes/unroll_loops.py),
against onnxruntime: directions, axes, several states and scan outputs, outer-scope reads; and
the cases left to the fallback (too long, a body op with no template)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import assert_close, const, make_model, ort_run, tensor
from onnx import TensorProto, helper

import smelt
from smelt.passes import unroll_loops

RNG = np.random.default_rng(11)


def _vi(name: str, shape=None):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _model(t: int = 5, body_op: str = "Tanh", opset: int = 17, general: bool = True):
    """Two states (a running sum h [3] and a product-ish accumulator c [2, 3]), two scan inputs (x
    along axis 1 reversed, u along axis 0), two scan outputs (one reversed, one on axis 1), and
    reads of an outer initializer W and an outer value o computed before the Scan. ``general``
    False: every axis 0 and direction forward (the only Scans onnx.reference, the fallback, runs)."""
    body = helper.make_graph(
        [helper.make_node("MatMul", ["x_t", "W"], ["xw"]),            # x_t [3] @ W [3, 3]
         helper.make_node("Add", ["h_in", "xw"], ["s"]),
         helper.make_node(body_op, ["s"], ["h_out"], **({"axis": 0} if body_op == "Hardmax" else {})),
         helper.make_node("Mul", ["c_in", "u_t"], ["cu"]),             # [2, 3] * [3]
         helper.make_node("Add", ["cu", "o"], ["c_out"]),
         helper.make_node("Sigmoid", ["h_out"], ["y1"]),
         helper.make_node("ReduceSum", ["c_out"], ["y2"], keepdims=0)],
        "body",
        [_vi("h_in", [3]), _vi("c_in", [2, 3]), _vi("x_t", [3]), _vi("u_t", [3])],
        [_vi("h_out", [3]), _vi("c_out", [2, 3]), _vi("y1", [3]), _vi("y2", [])])
    layout = dict(scan_input_axes=[1, 0], scan_input_directions=[1, 0], scan_output_axes=[0, -1],
                  scan_output_directions=[1, 0]) if general else {}
    scan = helper.make_node("Scan", ["h0", "c0", "x", "u"], ["h_T", "c_T", "ys1", "ys2"], name="scan",
                            num_scan_inputs=2, body=body, **layout)
    pre = helper.make_node("Mul", ["z", "half"], ["o"])
    inputs = [tensor("h0", [3]), tensor("c0", [2, 3]), tensor("x", [3, t] if general else [t, 3]), tensor("u", [t, 3]), tensor("z", [3])]
    outputs = [tensor(n, None) for n in ("h_T", "c_T", "ys1", "ys2")]
    inits = [const("W", RNG.uniform(-1, 1, (3, 3)).astype(np.float32)), const("half", np.float32(0.5))]
    return make_model([pre, scan], inputs, outputs, inits, opset=opset)


def _feeds(t: int = 5, general: bool = True) -> dict:
    return {"h0": RNG.uniform(-1, 1, 3).astype(np.float32), "c0": RNG.uniform(-1, 1, (2, 3)).astype(np.float32),
            "x": RNG.uniform(-1, 1, (3, t) if general else (t, 3)).astype(np.float32), "u": RNG.uniform(0.5, 1, (t, 3)).astype(np.float32),
            "z": RNG.uniform(-1, 1, 3).astype(np.float32)}


@pytest.mark.parametrize("opset", [11, 17])
def test_scan_unrolls_natively(opset):
    """Unrolled (no fallback node, no Scan left) and equal to onnxruntime at 1 and 2 threads;
    opset 11 spells Unsqueeze's axes as an attribute. Axes and directions the fallback
    (onnx.reference) cannot run work unrolled."""
    model, feeds = _model(opset=opset), _feeds()
    want = ort_run(model, feeds)
    for threads in (1, 2):
        cm = smelt.compile(model, threads=threads)
        assert cm.fallback_nodes == [], cm.fallback_report
        assert_close(cm.run(feeds), want)
        cm.close()


def test_single_step():
    """T = 1: one iteration, each scan output a Concat of one value."""
    model, feeds = _model(t=1), _feeds(t=1)
    cm = smelt.compile(model)
    assert cm.fallback_nodes == []
    assert_close(cm.run(feeds), ort_run(model, feeds))


def test_long_sequence_stays_one_fallback_node(monkeypatch, tmp_path):
    """Past MAX_UNROLLED_NODES the Scan is left whole (to the fallback), and still right."""
    monkeypatch.setattr(unroll_loops, "MAX_UNROLLED_NODES", 20)
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))  # the artifact key does not see the cap
    model, feeds = _model(t=5, general=False), _feeds(t=5, general=False)
    cm = smelt.compile(model)
    assert [f["op"] for f in cm.fallback_report] == ["Scan"]
    assert_close(cm.run(feeds), ort_run(model, feeds))


def test_body_with_a_fallback_op_is_not_unrolled():
    """A body op no template runs (a string-free one the fallback handles: Hardmax-1 on a 1-D
    value is not native) keeps the whole Scan on the fallback rather than unrolling it into T
    fallback nodes."""
    model, feeds = _model(body_op="Hardmax", opset=11, general=False), _feeds(general=False)
    cm = smelt.compile(model)
    ops = sorted({f["op"] for f in cm.fallback_report})
    assert ops == ["Scan"], cm.fallback_report
    assert_close(cm.run(feeds), ort_run(model, feeds))


def _loop_model(data_cond: bool = False, opset: int = 17):
    """y_{i+1} = y_i * 0.5 + x[i] + i (x an outer graph input read per iteration with Gather on the
    iteration number); scan output y_i + 1. ``data_cond``: the body's condition output is
    sum(y) < 100, which may end the loop early (not unrollable)."""
    nodes = [helper.make_node("Gather", ["x", "i"], ["xi"], axis=0),
             helper.make_node("Mul", ["y_in", "half"], ["h"]),
             helper.make_node("Add", ["h", "xi"], ["s"]),
             helper.make_node("Cast", ["i"], ["fi"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["s", "fi"], ["y_out"]),
             helper.make_node("Add", ["y_out", "one"], ["scan"])]
    if data_cond:
        nodes += [helper.make_node("ReduceSum", ["y_out"], ["tot"], keepdims=0),
                  helper.make_node("Less", ["tot", "hundred"], ["c_out"])]
    else:
        nodes.append(helper.make_node("Identity", ["c_in"], ["c_out"]))
    body = helper.make_graph(
        nodes, "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
         _vi("y_in", [4])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []), _vi("y_out", [4]), _vi("scan", [4])])
    loop = helper.make_node("Loop", ["trip", "cond", "y0"], ["y_T", "ys"], name="loop", body=body)
    inputs = [tensor("y0", [4]), tensor("x", [8, 4]), helper.make_tensor_value_info("trip", TensorProto.INT64, []),
              helper.make_tensor_value_info("cond", TensorProto.BOOL, [])]
    inits = [const("half", np.float32(0.5)), const("one", np.float32(1.0)), const("hundred", np.float32(100.0))]
    return make_model([loop], inputs, [tensor("y_T", None), tensor("ys", None)], inits, opset=opset)


def _loop_feeds(trip: int) -> dict:
    return {"y0": RNG.uniform(-1, 1, 4).astype(np.float32), "x": RNG.uniform(-1, 1, (8, 4)).astype(np.float32),
            "trip": np.array(trip, np.int64), "cond": np.array(True)}


@pytest.mark.parametrize("opset", [11, 17])
def test_loop_unrolls_per_trip_count(opset):
    """Trip count and condition given as graph inputs: each trip count compiles a variant in
    which the Loop is unrolled (value specialization makes them constants), natively, equal to
    onnxruntime at 1 and 2 threads."""
    model = _loop_model(opset=opset)
    for threads in (1, 2):
        cm = smelt.compile(model, threads=threads)
        for trip in (3, 8, 1):
            feeds = _loop_feeds(trip)
            assert_close(cm.run(feeds), ort_run(model, feeds))
            assert cm.fallback_nodes == [], cm.fallback_report
        cm.close()


def test_loop_with_a_data_condition_is_not_unrolled():
    """A body whose condition output depends on data may stop early: the Loop stays whole (on the
    fallback) and is still right, including when it stops before the trip count."""
    model = _loop_model(data_cond=True)
    cm = smelt.compile(model)
    for early, steps in ((False, 6), (True, 2)):  # the second stops early
        feeds = _loop_feeds(6)
        feeds["x"] = np.abs(feeds["x"])
        if early:  # sum(y) about 40 after the first step, about 144 after the second: it stops there
            # (set, not drawn: the module's RNG state depends on which tests ran before in the worker)
            feeds["x"][0], feeds["x"][1:] = 10.0, 30.0
        want = ort_run(model, feeds)
        assert len(want[1]) == steps
        assert_close(cm.run(feeds), want)
        assert [f["op"] for f in cm.fallback_report] == ["Loop"]


def test_loop_whose_last_condition_is_false_unrolls():
    """tf2onnx's Keras RNN loop: trip count T, and a body condition ``i + 1 < T`` (its constants the
    body's own initializers) that turns false exactly on the last iteration, where the trip count
    ends the loop anyway: unrolled, natively, equal to onnxruntime. A condition false one
    iteration earlier stops the loop early: left whole, and still right."""
    for stop_at in (6, 5):  # the condition turns false on iteration stop_at - 1; trip count 6
        nodes = [helper.make_node("Gather", ["x", "i"], ["xi"], axis=0),
                 helper.make_node("Add", ["y_in", "xi"], ["y_out"]),
                 helper.make_node("Tanh", ["y_out"], ["scan"]),
                 helper.make_node("Add", ["i", "step"], ["next"]),
                 helper.make_node("Less", ["next", "bound"], ["c_out"])]
        body = helper.make_graph(
            nodes, "body",
            [helper.make_tensor_value_info("i", TensorProto.INT64, []),
             helper.make_tensor_value_info("c_in", TensorProto.BOOL, []), _vi("y_in", [4])],
            [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []), _vi("y_out", [4]), _vi("scan", [4])],
            [const("step", np.array(1, np.int64)), const("bound", np.array(stop_at, np.int64))])
        loop = helper.make_node("Loop", ["trip", "cond", "y0"], ["y_T", "ys"], name="loop", body=body)
        inits = [const("trip", np.array(6, np.int64)), const("cond", np.array(True))]
        model = make_model([loop], [tensor("y0", [4]), tensor("x", [6, 4])], [tensor("y_T", None), tensor("ys", None)],
                           inits)
        feeds = {"y0": RNG.uniform(-1, 1, 4).astype(np.float32), "x": RNG.uniform(-1, 1, (6, 4)).astype(np.float32)}
        cm = smelt.compile(model)
        want = ort_run(model, feeds)
        assert len(want[1]) == stop_at
        assert_close(cm.run(feeds), want)
        assert [f["op"] for f in cm.fallback_report] == ([] if stop_at == 6 else ["Loop"])
        cm.close()


def test_scan8_unrolls_per_batch_element():
    """Scan-8 (opset 8: a leading batch axis on states and scan inputs, the sequence on axis 1):
    unrolled per batch element and step, one scan input reversed, against onnxruntime."""
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "a_t"], ["s1"]),
         helper.make_node("Mul", ["s1", "b_t"], ["s_out"]),
         helper.make_node("Identity", ["s_out"], ["y_t"])],
        "body", [_vi("s_in", [3]), _vi("a_t", [3]), _vi("b_t", [3])], [_vi("s_out", [3]), _vi("y_t", [3])])
    scan = helper.make_node("Scan", ["", "s0", "a", "b"], ["s_T", "ys"], name="scan8", num_scan_inputs=2,
                            body=body, directions=[0, 1])
    model = make_model([scan], [tensor("s0", [2, 3]), tensor("a", [2, 4, 3]), tensor("b", [2, 4, 3])],
                       [tensor("s_T", None), tensor("ys", None)], opset=8)
    feeds = {"s0": RNG.uniform(-1, 1, (2, 3)).astype(np.float32), "a": RNG.uniform(-1, 1, (2, 4, 3)).astype(np.float32),
             "b": RNG.uniform(0.5, 1.5, (2, 4, 3)).astype(np.float32)}
    for threads in (1, 2):
        cm = smelt.compile(model, threads=threads)
        assert cm.fallback_nodes == [], cm.fallback_report
        assert_close(cm.run(feeds), ort_run(model, feeds))
        cm.close()
