"""DynamicQuantizeLSTM's fast paths (templates/quantized_lstm.py) against onnxruntime.

The template hoists X.W into one integer GEMM, permutes the gate columns into panels of 16-unit
blocks (one or two per panel), splits the recurrence over threads above a size (a flag barrier
per step) and picks the u8 x s8 quad form where the host has VNNI and the weights are int8 of
zero point 0, else int16 pairs (AVX2, and AVX-512 for uint8 weights), else portable C. Each
case below is built to reach one of those branches; every one runs at every ISA this host has
and at 1 and 2 threads. The answers must agree with onnxruntime's to float rounding (its h
quantization depends on its thread count where it splits the batch between threads: the session
runs with its default, the physical cores, whose row groups smelt takes).
"""

from __future__ import annotations

import zlib

import numpy as np
import onnx
import pytest
from kernel_models import AVX_VNNI, force_isa
from onnx import TensorProto, helper, numpy_helper

import smelt

ort = pytest.importorskip("onnxruntime")
quantization = pytest.importorskip("onnxruntime.quantization")

ISAS = ["native", AVX_VNNI, "avx2", "scalar"]

# name: (seq, batch, input, hidden, direction, peepholes, initial state, weight type, per channel)
CASES = {
    # H not a multiple of 16 (padded units), E odd, per-channel int8: quad form, one panel
    "h20-e13-perchannel": (6, 1, 13, 20, "forward", False, False, "QInt8", True),
    # T = 1, E = 1
    "t1-e1": (1, 1, 1, 32, "forward", False, True, "QInt8", False),
    # 4H*H*B = 2^19 (REC_PARALLEL_MIN_MACS): the recurrence split over threads (barrier per
    # step), two blocks per panel
    "split-h256-b2": (9, 2, 24, 256, "forward", False, False, "QInt8", False),
    # B > 1 with ragged row tiles in both products, peepholes, initial state, reverse
    "b5-reverse-peep": (7, 5, 17, 48, "reverse", True, True, "QInt8", False),
    # uint8 weights with zero points (onnxruntime's quantizer always writes symmetric int8 for
    # an LSTM: the test shifts them to uint8 around 128, the same real values): the pair form
    # on every ISA; bidirectional, two threads run one direction each
    "bidir-uint8": (5, 3, 9, 36, "bidirectional", True, True, "uint8", True),
    # bidirectional at a size that splits a one-direction recurrence: at 2 threads each thread
    # still runs one direction (no barrier), at 1 thread the directions run in turn
    "bidir-h144": (4, 2, 31, 144, "bidirectional", False, False, "QInt8", False),
}


def _model(tmp_path, seq, batch, isz, hidden, direction, peep, init, rng):
    dirs = 2 if direction == "bidirectional" else 1
    w = lambda *s: (rng.standard_normal(s) * 0.3).astype(np.float32)  # noqa: E731
    inits = [numpy_helper.from_array(w(dirs, 4 * hidden, isz), "W"),
             numpy_helper.from_array((w(dirs, 4 * hidden, hidden) / np.sqrt(hidden / 8)).astype(np.float32), "R"),
             numpy_helper.from_array(w(dirs, 8 * hidden) * 0.3, "B")]
    ins = ["x", "W", "R", "B", "", "", "", ""]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, batch, isz])]
    if init:
        ins[5], ins[6] = "h0", "c0"
        inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, [dirs, batch, hidden]) for n in ("h0", "c0")]
    if peep:
        ins[7] = "P"
        inits.append(numpy_helper.from_array(w(dirs, 3 * hidden), "P"))
    while not ins[-1]:
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


def _shift_to_uint8(model: onnx.ModelProto) -> None:
    """W and R as uint8 = int8 + 128 with zero point 128: the same weights, asymmetric storage."""
    node = model.graph.node[0]
    names = {node.input[1], node.input[2], node.input[9], node.input[11]}
    for init in model.graph.initializer:
        if init.name in names:
            shifted = (numpy_helper.to_array(init).astype(np.int16) + 128).astype(np.uint8)
            init.CopyFrom(numpy_helper.from_array(shifted, init.name))


def _expected_form(isa: str, wtype: str, target) -> str:
    """The instruction the recurrence's micro-kernel should be spelled with."""
    if isa == "scalar":
        return "portable pairs"
    if isa == AVX_VNNI or isa == "native" and {"avx512_vnni", "avx_vnni"} & set(target.flags):
        return "vpdpbusd" if wtype == "QInt8" else "vpdpwssd"  # u8 x u8: int16 pairs
    return "madd_epi16"


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_fast_paths_match_onnxruntime(case: str, isa: str, monkeypatch, cache, tmp_path) -> None:
    seq, batch, isz, hidden, direction, peep, init, wtype, per_channel = CASES[case]
    rng = np.random.default_rng(zlib.crc32(case.encode()))  # (str hash() is salted per process)
    target = force_isa(isa, monkeypatch, cache)
    src, dst, inputs = _model(tmp_path, seq, batch, isz, hidden, direction, peep, init, rng)
    quantization.quantize_dynamic(str(src), str(dst), weight_type=quantization.QuantType.QInt8,
                                  per_channel=per_channel)
    model = onnx.load(str(dst))
    assert [n.op_type for n in model.graph.node] == ["DynamicQuantizeLSTM"]
    if wtype == "uint8":
        _shift_to_uint8(model)
        onnx.save(model, str(dst))
    feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in inputs}
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = target.physical_cores  # onnxruntime's default: its row groups
    want = ort.InferenceSession(str(dst), opts, providers=["CPUExecutionProvider"]).run(None, feeds)
    first = None
    for threads in (1, 2):
        compiled = smelt.compile(str(dst), threads=threads)
        assert compiled.fallback_nodes == []
        got = compiled.run(feeds)
        kernel = next(i.schedule for i in compiled.plan.step_infos() if i.op == "DynamicQuantizeLSTM")
        assert kernel["micro_kernel"].split()[0] != "", kernel
        assert _expected_form(isa, wtype, target) in kernel["micro_kernel"], kernel
        if case.startswith("split"):  # the split path is what this case is for
            assert "up to 1 thread" not in kernel["threads"], kernel
        for name, g, ref in zip(("Y", "Y_h", "Y_c"), got, want, strict=True):
            assert g.shape == ref.shape, (name, g.shape, ref.shape)
            err = float(np.abs(g - ref).max())
            assert err <= 2e-6 * max(1.0, float(np.abs(ref).max())), f"{case} {isa} {name} threads={threads}: {err}"
        if first is None:
            first = got
        else:  # the thread split changes which thread computes a unit, never its arithmetic
            for a, b in zip(first, got, strict=True):
                np.testing.assert_array_equal(a, b)
        compiled.close()


@pytest.mark.sanitize
@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_fast_paths_clean_under_sanitizers(isa: str, tmp_path) -> None:
    """The quad form, the split recurrence (H=256, B=2: a flag barrier per step) and ragged batch
    tiles under AddressSanitizer and UBSan, at 1 and 2 threads (tests/test_sanitize.py's
    harness: a child process, compared with onnxruntime)."""
    from test_sanitize import _check_clean, _isa_or_skip

    _isa_or_skip(isa)
    rng = np.random.default_rng(7)
    src, dst, _ = _model(tmp_path, 3, 2, 19, 256, "forward", True, False, rng)
    quantization.quantize_dynamic(str(src), str(dst), weight_type=quantization.QuantType.QInt8)
    _check_clean(onnx.load(str(dst)), isa, tmp_path)
