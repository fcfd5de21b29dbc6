"""Fallback steps run onnx.reference with smelt's corrections (runtime/reference_ops.py)."""

from __future__ import annotations

import numpy as np
from helpers import make_model, ort_run, tensor
from onnx import TensorProto, helper

import smelt


def _loop_model():
    """A Loop of 3 iterations whose body emits a 0-d scan value and a 2x2 one."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["acc_in", "one"], ["acc_out"]),
         helper.make_node("Identity", ["acc_out"], ["scalar_scan"]),
         helper.make_node("Expand", ["acc_out", "shape22"], ["mat_scan"])],
        "body",
        [tensor("it", [], TensorProto.INT64), tensor("cond_in", [], TensorProto.BOOL), tensor("acc_in", [])],
        [tensor("cond_out", [], TensorProto.BOOL), tensor("acc_out", []), tensor("scalar_scan", None),
         tensor("mat_scan", None)],
        initializer=[helper.make_tensor("one", TensorProto.FLOAT, [], [1.0]),
                     helper.make_tensor("shape22", TensorProto.INT64, [2], [2, 2])])
    loop = helper.make_node("Loop", ["M", "cond", "x"], ["acc", "scalars", "mats"], body=body)
    return make_model([loop], [tensor("x", [])], [tensor("acc", None), tensor("scalars", None), tensor("mats", None)],
                      [helper.make_tensor("M", TensorProto.INT64, [], [3]),
                       helper.make_tensor("cond", TensorProto.BOOL, [], [True])])


def test_loop_scan_outputs_stack_on_a_new_axis():
    """onnx.reference joins scan outputs with vstack ((3, 1) and (6, 2) here); the spec and
    onnxruntime stack them: (3,) and (3, 2, 2)."""
    model = _loop_model()
    feeds = {"x": np.array(0.5, dtype=np.float32)}
    want = ort_run(model, feeds)
    got = smelt.compile(model, threads=1).run(feeds)
    assert [w.shape for w in want] == [(), (3,), (3, 2, 2)]
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_array_equal(g, w)


def test_stft_of_a_signal_without_its_last_axis(tmp_path, monkeypatch):
    """STFT of a [batch, length] real signal (Kokoro-82M's vocoder; onnxruntime takes it as
    [batch, length, 1]) runs on the fallback: onnx.reference found no frames in it. Lengths
    that leave a ragged tail and one frame exactly; onesided and two-sided."""
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    window = np.hanning(20).astype(np.float32)
    for length, onesided in ((300, 1), (20, 1), (97, 0)):
        node = helper.make_node("STFT", ["x", "step", "win", "len"], ["y"], onesided=onesided, name="stft")
        model = make_model([node], [tensor("x", [2, length])], [tensor("y", None)],
                           [helper.make_tensor("step", TensorProto.INT64, [], [5]),
                            helper.make_tensor("win", TensorProto.FLOAT, [20], window),
                            helper.make_tensor("len", TensorProto.INT64, [], [20])])
        x = np.random.default_rng(length).standard_normal((2, length)).astype(np.float32)
        compiled = smelt.compile(model, threads=2)
        got = compiled.run({"x": x})
        want = ort_run(model, {"x": x})
        assert got[0].shape == want[0].shape
        np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)  # onnx.reference's DFT is float64
