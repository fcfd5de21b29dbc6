"""AVX-VNNI: the 256-bit integer dot products (VEX vpdpbusd / vpdpwssd) of AVX2-class CPUs with
VNNI (Intel cores since Alder Lake, Zen 5), described as ISA data (``isa.with_int_dot``).

The kernel tests of the integer templates run a pseudo-ISA ``AVX_VNNI`` beside native, avx2 and
scalar (``kernel_models._avx_vnni_target``): on a host without AVX-VNNI but with AVX512-VNNI and
VL, the same instructions in their EVEX encoding. These tests check what that substitution
cannot: the encoding a real AVX-VNNI host gets, the form each integer template picks, and the
answers of a quantized MatMul and LSTM on the ymm quad path against onnxruntime.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from kernel_models import AVX_VNNI, _isa_target
from onnx import TensorProto, helper
from onnx import numpy_helper as nh

from smelt.codegen.kernels.isa import exact_byte_products, vector_isa, with_int_dot
from smelt.target import detect

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(20261126)


def _avx2_host(*extra: str):
    """This host held to AVX2, with ``extra`` flags (a description, never run)."""
    capped = detect().narrowed("avx2") if "avx2" in detect().isa_caps() else None
    if capped is None:
        pytest.skip("host cannot run avx2")
    return dataclasses.replace(capped, flags=tuple(f for f in capped.flags if f != "avx_vnni") + extra)


def test_avx_vnni_is_vex_encoded_and_exact() -> None:
    with_vnni, without = _avx2_host("avx_vnni"), _avx2_host()
    v = with_int_dot(vector_isa(with_vnni), with_vnni)
    dot = v.x("u8s8_dot_acc", a="a", b="b", c="c")
    # "%{vex%}" in GCC's extended asm is gas's {vex} pseudo-prefix: without it gas writes the
    # EVEX (AVX512-VNNI) encoding, which an AVX2-only CPU cannot run
    assert "%{vex%} vpdpbusd" in dot and "__m256i" in dot, dot
    assert "%{vex%} vpdpwssd" in v.x("i16_dot_acc", a="a", b="b", c="c")
    assert exact_byte_products(with_vnni) and not exact_byte_products(without)
    assert not with_int_dot(vector_isa(without), without).has("u8s8_dot_acc")


def _compile(model: onnx.ModelProto, target, threads: int, monkeypatch):
    import smelt

    monkeypatch.setattr("smelt.compiler.detect", lambda: target)
    return smelt.compile(model, threads=threads)


def _micro_kernels(compiled) -> str:
    return " ".join(s.schedule.get("micro_kernel", "") for s in compiled.plan.step_infos())


def test_matmul_integer_runs_ymm_quads(monkeypatch, cache) -> None:
    monkeypatch.setenv("SMELT_CACHE_DIR", str(cache))
    target = _isa_target(AVX_VNNI, monkeypatch)
    # K = 37 and 8: ragged quads; N = 19 and 70: ragged 8-lane panels; M = 1 (a GEMV) and 7
    nodes, inits, feeds, outs = [], [], {}, []
    for i, (m, k, n) in enumerate(((1, 37, 70), (7, 8, 19), (5, 300, 33))):
        a, b, y = f"a{i}", f"b{i}", f"y{i}"
        feeds[a] = RNG.integers(0, 256, (m, k)).astype(np.uint8)
        inits += [nh.from_array(RNG.integers(-128, 128, (k, n)).astype(np.int8), b),
                  nh.from_array(np.uint8(RNG.integers(0, 256)), f"az{i}")]
        nodes.append(helper.make_node("MatMulInteger", [a, b, f"az{i}"], [y]))
        outs.append(helper.make_tensor_value_info(y, TensorProto.INT32, None))
    graph = helper.make_graph(nodes, "avx_vnni_matmul",
                              [helper.make_tensor_value_info(a, TensorProto.UINT8, list(v.shape)) for a, v in feeds.items()],
                              outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for threads in (1, 2):
        compiled = _compile(model, target, threads, monkeypatch)
        assert compiled.fallback_nodes == []
        assert "vpdpbusd" in _micro_kernels(compiled) and "avx2" in _micro_kernels(compiled)
        for g, w in zip(compiled.run(feeds), want, strict=True):
            np.testing.assert_array_equal(g, w)
        compiled.close()


def test_dynamic_quantize_lstm_runs_ymm_quads(monkeypatch, cache, tmp_path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from smelt.frontend.zoo.rnn import lstm_model

    monkeypatch.setenv("SMELT_CACHE_DIR", str(cache))
    target = _isa_target(AVX_VNNI, monkeypatch)
    # hidden 40: not a multiple of the 16-unit blocks; batch 3: a ragged row tile
    fp32, q8 = tmp_path / "lstm.onnx", tmp_path / "lstm_int8.onnx"
    onnx.save(lstm_model(24, 40, 3, 5, cell="lstm"), str(fp32))
    quantize_dynamic(str(fp32), str(q8), weight_type=QuantType.QInt8)
    feeds = {"x": RNG.standard_normal((5, 3, 24)).astype(np.float32)}
    opts = ort.SessionOptions()
    # onnxruntime's default thread count, whose row groups for h smelt takes (schedule.rnn.h_quant_rows)
    opts.intra_op_num_threads = target.physical_cores
    want = ort.InferenceSession(str(q8), opts, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    for threads in (1, 2):
        compiled = _compile(onnx.load(str(q8)), target, threads, monkeypatch)
        assert compiled.fallback_nodes == []
        assert "vpdpbusd" in _micro_kernels(compiled)
        # the same integer arithmetic as onnxruntime: equal but for float rounding of the gates
        np.testing.assert_allclose(compiled.run(feeds)[0], want, rtol=0, atol=2e-6)
        compiled.close()
