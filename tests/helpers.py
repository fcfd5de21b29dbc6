"""Shared helpers for tests: tiny ONNX models and the comparison against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def make_model(nodes, inputs, outputs, initializers=(), opset: int = 17, name: str = "test") -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8  # onnxruntime 1.x reads IR <= 10
    return model


def tensor(name: str, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def const(name: str, array) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(array), name)


def ort_run(model: onnx.ModelProto, feeds: dict, threads: int = 1) -> list[np.ndarray]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def assert_close(got, want, rel: float = 1e-4) -> None:
    for g, w in zip(got, want, strict=True):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape, (g.shape, w.shape)
        assert g.dtype == w.dtype, (g.dtype, w.dtype)
        scale = max(1.0, float(np.max(np.abs(w)))) if w.size else 1.0
        err = float(np.max(np.abs(g.astype(np.float64) - w.astype(np.float64)))) if w.size else 0.0
        assert err <= rel * scale, f"max abs error {err} > {rel} * {scale}"
