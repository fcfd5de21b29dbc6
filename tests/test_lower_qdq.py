"""QDQ models from onnxruntime's static quantizer run on smelt's integer kernels.

``quantize_static`` (QDQ format, per tensor and per channel, u8 activations and s8 weights) on a
small CNN with a classifier: smelt lowers each DQ -> Conv/MatMul -> (Relu) -> Q to
QLinearConv/QLinearMatMul as onnxruntime does, so the integer outputs agree with onnxruntime's
(one quantization step at most, where fp32 rounding upstream flips a rounding tie; rare) and the
lowered nodes are gone from the float graph.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import smelt
from smelt.compiler import lower
from smelt.options import CompileOptions

ort = pytest.importorskip("onnxruntime")
quantization = pytest.importorskip("onnxruntime.quantization")

RNG = np.random.default_rng(20261129)


def _float_model(path) -> None:
    w = lambda *s: (RNG.standard_normal(s) * 0.2).astype(np.float32)  # noqa: E731
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2], group=2),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Conv", ["r2", "w3"], ["c3"]),
             helper.make_node("Flatten", ["c3"], ["f"]),
             helper.make_node("MatMul", ["f", "wf"], ["y"])]
    inits = [numpy_helper.from_array(a, n) for n, a in (("w1", w(8, 3, 3, 3)), ("b1", w(8)), ("w2", w(12, 4, 3, 3)),
                                                         ("b2", w(12)), ("w3", w(6, 12, 1, 1)), ("wf", w(6 * 5 * 6, 10)))]
    graph = helper.make_graph(nodes, "qcnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 10, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


class _Reader(quantization.CalibrationDataReader):
    def __init__(self, shape: tuple[int, ...]) -> None:
        self.batches = iter([{"x": RNG.standard_normal(shape).astype(np.float32)} for _ in range(8)])

    def get_next(self):
        return next(self.batches, None)


def _quantized(tmp_path, write_float, shape: tuple[int, ...], per_channel: bool):
    """(path, model) of ``write_float``'s model through quantize_static (QDQ, u8 activations,
    s8 weights), calibrated on 8 random inputs of ``shape``."""
    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    write_float(src)
    quantization.quantize_static(str(src), str(dst), _Reader(shape), quant_format=quantization.QuantFormat.QDQ,
                                 per_channel=per_channel, activation_type=quantization.QuantType.QUInt8,
                                 weight_type=quantization.QuantType.QInt8)
    return dst, onnx.load(str(dst))


@pytest.mark.parametrize("per_channel", [False, True])
def test_qdq_model_runs_on_integer_kernels(tmp_path, per_channel: bool) -> None:
    dst, model = _quantized(tmp_path, _float_model, (1, 3, 10, 12), per_channel)
    assert any(n.op_type == "DequantizeLinear" for n in model.graph.node)
    g = lower(model, CompileOptions(threads=1))
    ops = [n.op for n in g.nodes]
    assert ops.count("QLinearConv") == 3 and ops.count("QLinearMatMul") == 1, ops
    assert "Conv" not in ops and "MatMul" not in ops, ops
    x = RNG.standard_normal((1, 3, 10, 12)).astype(np.float32)
    want = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    step = float(numpy_helper.to_array(next(i for i in model.graph.initializer
                                            if i.name.startswith("y_scale") or i.name == "y_scale")))
    for threads in (1, 2):
        compiled = smelt.compile(str(dst), threads=threads)
        assert compiled.fallback_nodes == []
        got = compiled.run({"x": x})[0]
        assert float(np.abs(got - want).max()) <= step * 1.001, (threads, np.abs(got - want).max(), step)


def _float_model_1d(path) -> None:
    """A Whisper encoder's front: two 1-D convs (k=3, pad 1; the second stride 2) with a GELU."""
    w = lambda *s: (RNG.standard_normal(s) * 0.2).astype(np.float32)  # noqa: E731
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1]),
             helper.make_node("Sigmoid", ["c1"], ["s1"]),
             helper.make_node("Mul", ["c1", "s1"], ["g1"]),
             helper.make_node("Conv", ["g1", "w2", "b2"], ["y"], pads=[1, 1], strides=[2])]
    inits = [numpy_helper.from_array(a, n) for n, a in (("w1", w(24, 10, 3)), ("b1", w(24)),
                                                         ("w2", w(20, 24, 3)), ("b2", w(20)))]
    graph = helper.make_graph(nodes, "qconv1d", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 10, 37])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 20, 19])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


@pytest.mark.parametrize("isa", ["native", "avx2", "scalar"])
@pytest.mark.parametrize("per_channel", [False, True])
def test_qdq_1d_convs_run_on_integer_kernels(tmp_path, per_channel: bool, isa: str) -> None:
    """1-D QDQ convs (smart-turn's Whisper front ran them in float: 11% of the model) lower to
    QLinearConv as onnxruntime's QDQ transformer does, then run as 2-D integer convs of height
    one; the codes are onnxruntime's exactly."""
    dst, model = _quantized(tmp_path, _float_model_1d, (1, 10, 37), per_channel)
    g = lower(model, CompileOptions(threads=1))
    ops = [n.op for n in g.nodes]
    assert ops.count("QLinearConv") == 2 and "Conv" not in ops, ops
    x = RNG.standard_normal((1, 10, 37)).astype(np.float32)
    want = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    for threads in (1, 2):
        compiled = smelt.compile(str(dst), threads=threads, isa=isa)
        assert compiled.fallback_nodes == []
        np.testing.assert_array_equal(compiled.run({"x": x})[0], want)
        compiled.close()


def _qdq_softmax_model(dtype, lengths: tuple[int, ...], extra_outputs: bool, opset: int = 19) -> onnx.ModelProto:
    """x_n -> Q -> DQ -> Softmax(last axis) -> Q(1/255, type's low end) -> DQ -> y_n per row
    length; ``extra_outputs`` also returns each Softmax's float output (so nothing is fused)."""
    low = int(np.iinfo(dtype).min)
    inits = [numpy_helper.from_array(np.float32(0.07), "xs"), numpy_helper.from_array(dtype(low + 100), "xz"),
             numpy_helper.from_array(np.float32(1 / 255), "ys"), numpy_helper.from_array(dtype(low), "yz")]
    nodes, inputs, outputs = [], [], []
    for n in lengths:
        shape = [2, 3, n]
        nodes += [helper.make_node("QuantizeLinear", [f"x{n}", "xs", "xz"], [f"xq{n}"]),
                  helper.make_node("DequantizeLinear", [f"xq{n}", "xs", "xz"], [f"xf{n}"]),
                  helper.make_node("Softmax", [f"xf{n}"], [f"p{n}"], axis=-1 if opset >= 13 else 2),
                  helper.make_node("QuantizeLinear", [f"p{n}", "ys", "yz"], [f"pq{n}"]),
                  helper.make_node("DequantizeLinear", [f"pq{n}", "ys", "yz"], [f"y{n}"])]
        inputs.append(helper.make_tensor_value_info(f"x{n}", TensorProto.FLOAT, shape))
        outputs.append(helper.make_tensor_value_info(f"y{n}", TensorProto.FLOAT, shape))
        if extra_outputs:
            outputs.append(helper.make_tensor_value_info(f"p{n}", TensorProto.FLOAT, shape))
    graph = helper.make_graph(nodes, "qdq_softmax", inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("isa", ["native", "avx2", "scalar"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qdq_softmax_is_the_float_graph_in_one_pass(isa: str, dtype) -> None:
    """``Q(Softmax(DQ(x)))`` over the last axis becomes smelt's QDQSoftmax, whose codes are
    exactly the unfused DQ, Softmax and Q kernels' (the same graph with the Softmax's float output
    also returned, which keeps them apart), at row lengths below, at and above one and two
    vectors of 8 and 16 lanes; and within one code of onnx.reference's float graph."""
    from onnx.reference import ReferenceEvaluator

    lengths = (1, 7, 15, 16, 17, 33, 400)
    fused, apart = _qdq_softmax_model(dtype, lengths, False), _qdq_softmax_model(dtype, lengths, True)
    ops = [n.op for n in lower(fused, CompileOptions(threads=1)).nodes]
    assert ops.count("QDQSoftmax") == len(lengths) and "Softmax" not in ops, ops
    assert "QDQSoftmax" not in [n.op for n in lower(apart, CompileOptions(threads=1)).nodes]
    feeds = {f"x{n}": (RNG.standard_normal((2, 3, n)) * 3).astype(np.float32) for n in lengths}
    feeds["x400"][0, 0, :] = 50.0  # a saturated row: every code the same, the sum exact
    want = ReferenceEvaluator(fused).run(None, feeds)
    for threads in (1, 2):
        a = smelt.compile(fused, threads=threads, isa=isa)
        b = smelt.compile(apart, threads=threads, isa=isa)
        assert a.fallback_nodes == [] and b.fallback_nodes == []
        got, ref = a.run(feeds), b.run(feeds)
        for k, n in enumerate(lengths):
            np.testing.assert_array_equal(got[k], ref[2 * k], err_msg=f"length {n}, {threads} threads")
            assert np.abs(got[k] - want[k]).max() <= 1.001 / 255, (n, threads)
        a.close()
        b.close()


def test_qdq_softmax_not_over_the_last_axis_stays_float() -> None:
    model = _qdq_softmax_model(np.uint8, (5,), False)
    for node in model.graph.node:
        if node.op_type == "Softmax":
            node.attribute[0].i = 1
    ops = [n.op for n in lower(model, CompileOptions(threads=1)).nodes]
    assert "QDQSoftmax" not in ops and "Softmax" in ops, ops
