"""Shared helpers for tests: tiny ONNX models and the comparison against onnxruntime."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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


def chain_model(n_nodes: int = 4, shape=(1 << 16,)) -> onnx.ModelProto:
    """x -> Relu, Neg, Relu, ... -> y (``n_nodes`` nodes; ``shape`` may hold symbols)."""
    nodes, prev = [], "x"
    for i in range(n_nodes):
        nodes.append(helper.make_node("Relu" if i % 2 == 0 else "Neg", [prev], [f"t{i}"], name=f"n{i}"))
        prev = f"t{i}"
    nodes.append(helper.make_node("Identity", [prev], ["y"]))
    return make_model(nodes, [tensor("x", list(shape))], [tensor("y", list(shape))])


def chain_expected(x: np.ndarray, n_nodes: int) -> np.ndarray:
    """What ``chain_model(n_nodes)`` computes, in numpy (exact)."""
    for i in range(n_nodes):
        x = np.maximum(x, 0) if i % 2 == 0 else -x
    return x


def run_python(code: str | Path, *args: str, env: dict | None = None, timeout: float = 300,
               extra_env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``code`` (source text, or a script's path) in a fresh Python with this directory on its
    path: crash and hang cases, so a regression fails the test instead of killing pytest. A
    timeout fails the test naming the hang."""
    import pytest

    env = dict(os.environ if env is None else env, **(extra_env or {}))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).parent), env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, str(code)] if isinstance(code, Path) else [sys.executable, "-c", code]
    try:
        return subprocess.run(cmd + list(args), capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"the child process hung (no exit after {timeout} s); its stderr:\n{err.stderr}")
