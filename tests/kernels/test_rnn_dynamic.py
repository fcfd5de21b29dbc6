"""Dynamic axes for recurrent models: sequence length and batch are run-time parameters.

A model of LSTM/GRU/RNN nodes and shape glue with symbolic input dims compiles once (for bounds
of its symbolic dims); calls with any sizes within the bounds never recompile, the arena stays the
same size, and results match onnxruntime on every call. A call beyond a bound raises it (one
recompile, to the next power of two).
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import smelt
from smelt.frontend.zoo.rnn import lstm_model


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "smelt-rnn-dyn-cache"))


def _ort(model):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _close(got, ref):
    for a, b in zip(got, ref, strict=True):
        assert a.shape == b.shape
        assert float(np.abs(a - b).max()) <= 1e-5 * max(1.0, float(np.abs(b).max()))


SIZES = [(5, 3), (9, 1), (1, 7), (16, 2), (3, 8), (12, 5), (1, 1)]


@pytest.mark.parametrize("cell,layers,bi", [("lstm", 1, False), ("gru", 2, True), ("lstm", 2, False)])
@pytest.mark.parametrize("threads", [1, 2])
def test_varying_lengths_and_batches_compile_once(cell, layers, bi, threads):
    model = lstm_model(12, 20, "B", "T", layers=layers, bidirectional=bi, cell=cell, initial_states=True)
    nd = 2 if bi else 1
    compiled = smelt.compile(model, threads=threads, max_dims={"T": 16, "B": 8})
    assert compiled.dynamic and compiled.compilations == 1  # compiled ahead: every dim bounded
    arena = compiled.arena_bytes
    ref = _ort(model)
    rng = np.random.default_rng(1)
    for T, B in SIZES + SIZES[::-1]:
        feeds = {"x": rng.standard_normal((T, B, 12)).astype(np.float32)}
        for i in range(layers):
            feeds[f"h0_{i}"] = rng.standard_normal((nd, B, 20)).astype(np.float32)
            if cell == "lstm":
                feeds[f"c0_{i}"] = rng.standard_normal((nd, B, 20)).astype(np.float32)
        _close(compiled.run(feeds), ref.run(None, feeds))
    assert compiled.compilations == 1
    assert compiled.arena_bytes == arena
    # the recurrent nodes are native; only the glue between them runs in numpy
    assert {op for _, op in compiled.native_nodes} == {cell.upper()}


def test_dynamic_batch_avx2(monkeypatch):
    """Batch 1..8 at run time with the AVX2 LSTM tiles: native-vector kernels for chunks of 2
    rows, the logical one-row tile (split accumulators) for a single row."""
    from kernel_models import _isa_target

    target = _isa_target("avx2")
    monkeypatch.setattr("smelt.compiler.detect", lambda: target)
    model = lstm_model(12, 20, "B", "T", initial_states=True)
    compiled = smelt.compile(model, threads=2, max_dims={"T": 16, "B": 8})
    ref = _ort(model)
    rng = np.random.default_rng(2)
    for T, B in SIZES:
        feeds = {"x": rng.standard_normal((T, B, 12)).astype(np.float32),
                 "h0_0": rng.standard_normal((1, B, 20)).astype(np.float32),
                 "c0_0": rng.standard_normal((1, B, 20)).astype(np.float32)}
        _close(compiled.run(feeds), ref.run(None, feeds))


def test_bound_grows_geometrically():
    model = lstm_model(8, 16, "B", "T")
    compiled = smelt.compile(model, threads=2)
    assert compiled.compilations == 0  # nothing bounded yet: compiled on the first call
    ref = _ort(model)
    rng = np.random.default_rng(2)
    for T, B in [(5, 3), (4, 2), (8, 4), (9, 4), (3, 1), (16, 4), (2, 2)]:
        x = rng.standard_normal((T, B, 8)).astype(np.float32)
        _close(compiled.run({"x": x}), ref.run(None, {"x": x}))
    # (5, 3) -> bounds T 8, B 4; (9, 4) -> T 16; nothing else exceeds them
    assert compiled.compilations == 2
    assert compiled.max_dims == {"T": 16, "B": 4}


def test_no_per_call_allocation_beyond_outputs():
    """Within the bounds a call allocates its outputs and nothing that grows with calls."""
    model = lstm_model(16, 32, "B", "T")
    compiled = smelt.compile(model, threads=2, max_dims={"T": 64, "B": 8})
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((T, B, 16)).astype(np.float32) for T, B in [(64, 8), (7, 3), (40, 1), (64, 8)]]
    for x in xs:  # warm every code path once
        compiled.run({"x": x})
    tracemalloc.start()
    try:
        for x in xs * 5:
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
            outs = compiled.run({"x": x})
            peak = tracemalloc.get_traced_memory()[1] - before
            out_bytes = sum(o.nbytes for o in outs)
            # outputs (Y and its squeezed view share memory) plus small Python bookkeeping
            assert peak <= out_bytes + 64 * 1024, (x.shape, peak, out_bytes)
            del outs
    finally:
        tracemalloc.stop()
    assert compiled.compilations == 1


def _single_node(op: str, layout: int, direction: str, seq: bool) -> tuple:
    """One ONNX LSTM/GRU node with symbolic T and B (layout 0 or 1) and optional sequence_lens."""
    rng = np.random.default_rng(4)
    G = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    D = 2 if direction == "bidirectional" else 1
    E, H = 6, 19
    W = rng.uniform(-0.4, 0.4, (D, G * H, E)).astype(np.float32)
    R = rng.uniform(-0.4, 0.4, (D, G * H, H)).astype(np.float32)
    Bias = rng.uniform(-0.4, 0.4, (D, 2 * G * H)).astype(np.float32)
    xshape = ["T", "B", E] if layout == 0 else ["B", "T", E]
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, xshape)]
    node_in = ["X", "W", "R", "Bias"]
    if seq:
        inputs.append(helper.make_tensor_value_info("L", TensorProto.INT32, ["B"]))
        node_in.append("L")
    outs = ["Y", "Y_h"]
    node = helper.make_node(op, node_in, outs, hidden_size=H, direction=direction, layout=layout)
    graph = helper.make_graph([node], "dyn", inputs, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                                      for o in outs],
                              [numpy_helper.from_array(a, n) for a, n in ((W, "W"), (R, "R"), (Bias, "Bias"))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model, E


@pytest.mark.parametrize("op,layout,direction,seq", [("LSTM", 0, "bidirectional", True), ("GRU", 0, "reverse", True),
                                                     ("RNN", 0, "forward", False), ("LSTM", 1, "forward", True)])
def test_single_node_layouts_and_lengths(op, layout, direction, seq):
    model, E = _single_node(op, layout, direction, seq)
    compiled = smelt.compile(model, threads=2, max_dims={"T": 16, "B": 9})
    rng = np.random.default_rng(5)
    ref = None if layout == 1 else _ort(model)
    for T, B in SIZES:
        x = rng.standard_normal((T, B, E) if layout == 0 else (B, T, E)).astype(np.float32)
        feeds = {"X": x}
        if seq:
            feeds["L"] = rng.integers(0, T + 1, B).astype(np.int32)
        got = compiled.run(feeds)
        if ref is not None:
            _close(got, ref.run(None, feeds))
        else:  # onnxruntime has no layout 1: compare with the same sizes compiled statically
            static = smelt.compile(model, threads=2, dynamic=False)
            _close(got, static.run(feeds))
    assert compiled.compilations == 1


def test_dynamic_errors():
    model = lstm_model(8, 16, "B", "T")
    with pytest.raises(ValueError, match="not symbolic"):
        smelt.compile(model, max_dims={"N": 4})
    with pytest.raises(ValueError, match="positive"):
        smelt.compile(model, max_dims={"T": 0, "B": 2})
    conv = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]), opset_imports=[helper.make_opsetid("", 14)])
    with pytest.raises(ValueError, match="dynamic=True needs"):
        smelt.compile(conv, dynamic=True)
    assert not smelt.compile(conv).dynamic  # not recurrent: per-shape variants as before


def test_input_shapes_seed_the_bounds():
    model = lstm_model(8, 16, "B", "T")
    compiled = smelt.compile(model, threads=2, input_shapes={"x": (12, 3, 8)})
    assert compiled.compilations == 1 and compiled.max_dims == {"T": 12, "B": 3}
    x = np.random.default_rng(6).standard_normal((7, 2, 8)).astype(np.float32)
    _close(compiled.run({"x": x}), _ort(model).run(None, {"x": x}))
    assert compiled.compilations == 1
