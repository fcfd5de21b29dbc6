"""passes/unique_lookup.py: an embedding lookup through Unique (tf2onnx's embedding_lookup_unique)
is the plain lookup, so what follows it has static shapes and runs natively; against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import smelt

RNG = np.random.default_rng(777)
V, E = 50, 8


def _model(ids_shape, unique_attrs=None, second_axis=0, counts_read=False):
    nodes = [helper.make_node("Unique", ["ids"], ["u", "idx", "inv", "cnt"], name="unique", **(unique_attrs or {})),
             helper.make_node("Gather", ["table", "u"], ["rows"], axis=0, name="rows"),
             helper.make_node("Gather", ["rows", "inv"], ["emb"], axis=second_axis, name="lookup"),
             helper.make_node("ReduceSum", ["emb", "ax0"], ["y"], keepdims=0, name="sum")]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if counts_read:
        nodes.append(helper.make_node("ReduceMax", ["cnt"], ["most"], keepdims=0, name="most"))
        outputs.append(helper.make_tensor_value_info("most", TensorProto.INT64, None))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, ids_shape)], outputs,
                              [numpy_helper.from_array(RNG.standard_normal((V, E)).astype(np.float32), "table"),
                               numpy_helper.from_array(np.array([0], np.int64), "ax0")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("ids_shape,counts_read", [([12], False), ([3, 5], False), ([1], True), ([7], True)],
                         ids=["1d", "2d-flattened", "one-id-counts-read", "counts-read"])
def test_lookup_through_unique_is_the_plain_lookup(ids_shape, counts_read, monkeypatch, tmp_path):
    """Ids of rank 1 and 2 (repeated ones and negative ones among them), the Unique's counts read
    by another node or not; exact against onnxruntime; only that other reader falls back."""
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    model = _model(ids_shape, counts_read=counts_read)
    ids = RNG.integers(-V, V, ids_shape).astype(np.int64)
    ids.flat[0] = ids.flat[-1]  # a repeated id
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"ids": ids})
    for threads in (1, 2):
        compiled = smelt.compile(model, threads=threads)
        got = compiled.run({"ids": ids})
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)
        assert set(compiled.fallback_nodes) == ({"unique", "most"} if counts_read else set())


@pytest.mark.parametrize("variant", ["unique-axis", "second-gather-axis-1"])
def test_other_forms_are_left_alone(variant, monkeypatch, tmp_path):
    """A Unique over an axis, or a second Gather on another axis, is not the lookup: the graph
    keeps it (on the fallback) and still answers as onnxruntime does."""
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    if variant == "unique-axis":
        model, ids = _model([4, 2], unique_attrs={"axis": 0}), RNG.integers(0, V, (4, 2)).astype(np.int64)
    else:
        model, ids = _model([6], second_axis=1), RNG.integers(0, E, (6,)).astype(np.int64)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"ids": ids})
    compiled = smelt.compile(model, threads=2)
    got = compiled.run({"ids": ids})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
    assert "unique" in compiled.fallback_nodes
