"""Values whose shapes only a later fold round, or only the run, decides (models from PyPI wheels:
DeepFilterNet3's encoder, Kokoro-82M), against onnxruntime:

- a fold round that adds as many nodes as it folds away is not idle (``pipeline._fold_signature``
  counts constant and statically shaped values too): the GRU after an Einsum gets its shape;
- a com.microsoft op's output shape sharpens when its input does (``contrib_shapes._sharper``):
  a DynamicQuantizeLSTM typed with a symbolic batch in the first round stays native;
- an RNN whose sequence length the data decides falls back with a reason, never a TypeError.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import smelt

RNG = np.random.default_rng(3232)


def _ort(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _c(name, a):
    return numpy_helper.from_array(np.asarray(a), name)


@pytest.fixture(autouse=True)
def _own_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))


def test_a_round_that_folds_as_much_as_it_expands_is_not_the_last() -> None:
    """DeepFilterNet3's encoder: an Einsum sized (and expanded into 6 nodes) only in a round
    that also folds 6 constant nodes away; the Shape of its output must still fold, or the GRU
    reading the Reshape after it has no shape (it crashed the RNN scheduler)."""
    T, G, IN, H, HID = 100, 32, 16, 16, 8  # the repro's sizes: which round sizes what depends on them
    inits = [_c("w", RNG.standard_normal((G, IN, H)).astype(np.float32)), _c("s0", np.array([0], np.int64)),
             _c("s2", np.array([2], np.int64)), _c("m1", np.array([-1], np.int64)),
             _c("w2", (RNG.standard_normal((G * H, G * H)) * 0.1).astype(np.float32)),
             _c("W", (RNG.standard_normal((1, 3 * HID, G * H)) * 0.3).astype(np.float32)),
             _c("R", (RNG.standard_normal((1, 3 * HID, HID)) * 0.3).astype(np.float32)),
             _c("gi", np.array([G, IN], np.int64))]
    nodes = [helper.make_node("Shape", ["x"], ["xs"]), helper.make_node("Slice", ["xs", "s0", "s2", "s0"], ["xbt"]),
             helper.make_node("Concat", ["xbt", "gi_pad"], ["xshape"], axis=0),
             helper.make_node("Reshape", ["x", "xshape"], ["x4"]),
             helper.make_node("Einsum", ["x4", "w"], ["e"], equation="btgi,gih->btgh"),
             helper.make_node("Shape", ["e"], ["sh"]), helper.make_node("Slice", ["sh", "s0", "s2", "s0"], ["bt"]),
             helper.make_node("Concat", ["bt", "m1"], ["newshape"], axis=0),
             helper.make_node("Reshape", ["e", "newshape"], ["r"]),
             helper.make_node("Einsum", ["r", "w2"], ["r2"], equation="btk,kh->bth"),
             helper.make_node("Relu", ["r2"], ["r3"]), helper.make_node("Transpose", ["r3"], ["rt"], perm=[1, 0, 2]),
             helper.make_node("GRU", ["rt", "W", "R"], ["y", "yh"], hidden_size=HID, linear_before_reset=1)]
    prev = "gi"  # constant nodes folded in the Einsum's round: as many as its expansion adds
    for k in range(9):
        nodes.insert(0, helper.make_node("Identity" if k % 2 else "Neg", [prev], [f"gi{k}"]))
        prev = f"gi{k}"
    nodes.insert(9, helper.make_node("Abs", [prev], ["gi_pad"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "T", G * IN])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    x = RNG.standard_normal((1, T, G * IN)).astype(np.float32)
    compiled = smelt.compile(model, threads=2, input_shapes={"x": x.shape})
    got = compiled.run({"x": x})
    assert compiled.fallback_nodes == []
    np.testing.assert_allclose(got[0], _ort(model, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_a_contrib_rnn_sharpens_its_output_shape() -> None:
    """Kokoro-82M int8: the DynamicQuantizeLSTM's input is (T, ?, IN) in the first round and
    (T, 1, IN) after a fold; its output shape follows, so it stays native (a com.microsoft op
    cannot fall back: the model was refused)."""
    D, IN, H, T = 2, 8, 4, 5
    inits = [_c("W", RNG.integers(-127, 128, (D, IN, 4 * H)).astype(np.int8)),
             _c("R", RNG.integers(-127, 128, (D, H, 4 * H)).astype(np.int8)), _c("ws", np.full(D, 0.01, np.float32)),
             _c("zp", np.zeros(D, np.int8)), _c("rs", np.full(D, 0.02, np.float32)),
             _c("one", np.array([1], np.int64)), _c("i", np.array([IN], np.int64))]
    nodes = [helper.make_node("Shape", ["x"], ["xs"]), helper.make_node("Gather", ["xs", "one"], ["t0"], axis=0),
             helper.make_node("Cast", ["t0"], ["t1"], to=TensorProto.FLOAT),  # onnx's data propagation stops here
             helper.make_node("Cast", ["t1"], ["t"], to=TensorProto.INT64),
             helper.make_node("ReduceMax", ["one"], ["b"], keepdims=1),  # folded by smelt's first round
             helper.make_node("Concat", ["t", "b", "i"], ["newshape"], axis=0),
             helper.make_node("Reshape", ["x", "newshape"], ["xt"]),
             helper.make_node("DynamicQuantizeLSTM", ["xt", "W", "R", "", "", "", "", "", "ws", "zp", "rs", "zp"], ["y"],
                              domain="com.microsoft", direction="bidirectional", hidden_size=H, name="dqlstm"),
             helper.make_node("Transpose", ["y"], ["z"], perm=[0, 2, 1, 3])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "T", IN])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    x = RNG.standard_normal((1, T, IN)).astype(np.float32)
    compiled = smelt.compile(model, threads=2, input_shapes={"x": x.shape})
    got = compiled.run({"x": x})
    assert compiled.fallback_nodes == []
    np.testing.assert_allclose(got[0], _ort(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_an_rnn_over_a_length_the_data_decides_falls_back(op) -> None:
    """Frames picked by NonZero: the RNN's T is known only at run time; it runs on the fallback
    with that reason (the scheduler compared the symbolic T with 0: a TypeError)."""
    E, H, N, gates = 6, 4, 10, {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    inits = [_c("W", (RNG.standard_normal((1, gates * H, E)) * 0.3).astype(np.float32)),
             _c("R", (RNG.standard_normal((1, gates * H, H)) * 0.3).astype(np.float32)),
             _c("ax1", np.array([1], np.int64)), _c("zero", np.array([0], np.int64))]
    nodes = [helper.make_node("NonZero", ["mask"], ["nz"]), helper.make_node("Squeeze", ["nz", "zero"], ["idx"]),
             helper.make_node("Gather", ["x", "idx"], ["xs"], axis=0), helper.make_node("Unsqueeze", ["xs", "ax1"], ["xu"]),
             helper.make_node(op, ["xu", "W", "R"], ["y"], hidden_size=H, name="rnn")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [N, E]),
                                           helper.make_tensor_value_info("mask", TensorProto.BOOL, [N])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": RNG.standard_normal((N, E)).astype(np.float32), "mask": RNG.random(N) > 0.4}
    compiled = smelt.compile(model, threads=2)
    got = compiled.run(feeds)
    report = {f["node"]: f["reason"] for f in compiled.fallback_report}
    assert "no static shape" in report["rnn"] or "only the run decides" in report["rnn"], report
    np.testing.assert_allclose(got[0], _ort(model, feeds)[0], rtol=1e-5, atol=1e-6)
