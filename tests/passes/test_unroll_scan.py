"""Scan over a static sequence unrolled into its body once per iteration (passes/unroll_scan.py),
against onnxruntime: directions, axes, several states and scan outputs, outer-scope reads; and
the cases left to the fallback (too long, a body op with no template)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import assert_close, const, make_model, ort_run, tensor
from onnx import TensorProto, helper

import smelt
from smelt.passes import unroll_scan

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


def test_long_sequence_stays_one_fallback_node(monkeypatch):
    """Past MAX_UNROLLED_NODES the Scan is left whole (to the fallback), and still right."""
    monkeypatch.setattr(unroll_scan, "MAX_UNROLLED_NODES", 20)
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
