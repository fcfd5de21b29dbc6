"""`smelt quantize`: a static QDQ model that onnxruntime loads and smelt runs on integer kernels.

The quantized model must (1) pass onnx's checker and load in onnxruntime, (2) lower in smelt to
QLinearConv/QLinearMatMul with nothing left in float for the quantized ops, (3) give smelt the
same answer onnxruntime gives on the same file (both run the integer ops), and (4) stay close to
the fp32 model: SQNR above 20 dB on held-out inputs (24-35 dB seen: random weights, 16 samples) from the calibration distribution.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import smelt
from smelt.cli import main
from smelt.compiler import lower
from smelt.errors import SmeltError
from smelt.options import CompileOptions
from smelt.quantize import quantize

ort = pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(20261130)


def _cnn(rng: np.random.Generator = RNG) -> onnx.ModelProto:
    w = lambda *s: (rng.standard_normal(s) * 0.3).astype(np.float32)  # noqa: E731
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c0", "g", "be", "mu", "var"], ["c1"]),  # folded first
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"]),
             helper.make_node("Add", ["c3", "c3"], ["a3"]),  # a float op between quantized ones
             helper.make_node("Flatten", ["a3"], ["f"]),
             helper.make_node("MatMul", ["f", "wf"], ["y"])]
    inits = [numpy_helper.from_array(a, n) for n, a in (
        ("w1", w(8, 3, 3, 3)), ("b1", w(8)), ("w2", w(16, 8, 3, 3)), ("b2", w(16)), ("w3", w(4, 16, 1, 1)),
        ("b3", w(4)), ("wf", w(4 * 6 * 5, 10)), ("g", 1 + w(8)), ("be", w(8)), ("mu", w(8)),
        ("var", np.abs(1 + w(8))))]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 10])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _feeds(n: int, rng: np.random.Generator = RNG) -> list[dict[str, np.ndarray]]:
    return [{"x": rng.standard_normal((1, 3, 12, 10)).astype(np.float32)} for _ in range(n)]


def _sqnr(ref: np.ndarray, got: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / max(np.sum((ref - got) ** 2.0), 1e-30)))


@pytest.mark.parametrize(("method", "per_channel"), [("minmax", True), ("minmax", False), ("percentile", True)])
def test_quantized_model_runs_integer_and_matches_onnxruntime(method: str, per_channel: bool) -> None:
    fp32 = _cnn()
    model, report = quantize(fp32, _feeds(16), method=method, per_channel=per_channel)
    # the classifier's inputs are quantized too; its output is the model's, which stays fp32
    assert sorted(report.quantized_nodes) == ["c1", "c2", "c3", "y"]  # c1: the BN-folded conv
    assert report.samples == 16
    onnx.checker.check_model(model)
    ops = [n.op for n in lower(model, CompileOptions(threads=1)).nodes]
    assert ops.count("QLinearConv") == 3, ops
    assert "Conv" not in ops and "BatchNormalization" not in ops, ops
    _check_against_onnxruntime(model, fp32)


def _check_against_onnxruntime(model: onnx.ModelProto, fp32: onnx.ModelProto) -> None:
    """smelt runs ``model`` fully native, answers what onnxruntime answers on the same QDQ file,
    and stays within 20 dB SQNR of the fp32 model."""
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ref32 = ort.InferenceSession(fp32.SerializeToString(), providers=["CPUExecutionProvider"])
    compiled = smelt.compile(model, threads=2)
    assert compiled.fallback_nodes == []
    for feed in _feeds(4):
        got, want = compiled.run(feed)[0], sess.run(None, feed)[0]
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * max(1.0, float(np.abs(want).max())))
        assert _sqnr(ref32.run(None, feed)[0], got) > 20.0


@pytest.mark.parametrize("bounds", ["initializers", "constant nodes"])
def test_relu6_folds_into_the_conv_output(bounds: str) -> None:
    """A Clip(0, 6) alone after a conv (MobileNet's Relu6) is quantized like a Relu: the conv's
    output Q sits after the Clip with the range calibrated there, so Q's saturation is the Clip and
    the conv runs as one QLinearConv, with no requantization of its own for the Clip (onnxruntime's
    quantizer and its ClipQuantFusion do the same); the numeric debug's float reference keeps the
    Clip, which is the model's, not the writer's saturation. The same with the bounds written as
    Constant nodes, as PyTorch's TorchScript exporter writes a ReLU6 (both the quantizer and the
    QDQ lowering left that conv in float)."""
    from smelt.quantize.numeric import strip_activation_qdq

    fp32 = _cnn_with_clip(6.0, constant_nodes=bounds == "constant nodes")
    model, _ = quantize(fp32, _feeds(16), per_channel=True)
    readers = [n for n in model.graph.node if "c2" in n.input]
    assert [n.op_type for n in readers] == ["Clip"], [n.op_type for n in readers]
    ops = [n.op for n in lower(model, CompileOptions(threads=1)).nodes]
    assert ops.count("QLinearConv") == 3 and not {"Clip", "QLinearClip", "Max", "Conv"} & set(ops), ops
    assert "Clip" in [n.op_type for n in strip_activation_qdq(model).graph.node]
    _check_against_onnxruntime(model, fp32)


def test_numeric_debug_does_not_count_a_folded_clip_as_saturation() -> None:
    """Below a Clip folded into the conv's output the kernel clamps every value past the Clip's
    bounds; those clamps are the Clip, not a loss: the debug report counts none of them, and
    counts the real ones once the tensor's scale is planted too small."""
    from smelt.quantize import debug_report

    fp32 = _cnn_with_clip(0.5)
    feeds = _feeds(8)
    c2 = ort.InferenceSession(_with_output(fp32, "c2").SerializeToString(),
                              providers=["CPUExecutionProvider"]).run(["c2"], feeds[0])[0]
    assert np.mean(c2 > 0.5) > 0.1  # the Clip cuts many values
    model, _ = quantize(fp32, feeds)
    entry = next(t for t in debug_report(model, feeds, float_model=fp32).tensors if t.name == "r2")
    assert entry.saturated == 0, entry
    scale = next(i for i in model.graph.initializer if i.name == "r2_scale")
    scale.CopyFrom(numpy_helper.from_array((numpy_helper.to_array(scale) / 4).astype(np.float32), scale.name))
    entry = next(t for t in debug_report(model, feeds, float_model=fp32).tensors if t.name == "r2")
    assert entry.saturated > 0, entry


def _cnn_with_clip(hi: float, constant_nodes: bool = False) -> onnx.ModelProto:
    """``_cnn`` with its second conv's Relu as Clip(0, ``hi``) (Relu6 at 6), the bounds
    initializers or (``constant_nodes``) Constant nodes."""
    fp32 = _cnn()
    r2 = next(n for n in fp32.graph.node if n.output[0] == "r2")
    lo_hi = [numpy_helper.from_array(np.array(0, np.float32), "lo"), numpy_helper.from_array(np.array(hi, np.float32), "hi")]
    if constant_nodes:
        at = list(fp32.graph.node).index(r2)
        for k, t in enumerate(lo_hi):
            fp32.graph.node.insert(at + k, helper.make_node("Constant", [], [t.name], value=t))
    else:
        fp32.graph.initializer.extend(lo_hi)
    r2.op_type = "Clip"
    r2.input.extend(["lo", "hi"])
    return fp32


def _with_output(model: onnx.ModelProto, name: str) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.graph.output.append(onnx.ValueInfoProto(name=name))
    return out


def test_cli_writes_a_model_from_a_calibration_folder(tmp_path, capsys) -> None:
    src, out, calib = tmp_path / "m.onnx", tmp_path / "q.onnx", tmp_path / "calib"
    onnx.save(_cnn(), str(src))
    calib.mkdir()
    for k, feed in enumerate(_feeds(4)):
        np.save(calib / f"{k}.npy", feed["x"])
    assert main(["quantize", str(src), "-o", str(out), "--calibration", str(calib), "--debug"]) == 0
    text = capsys.readouterr().out
    assert "quantized 4 node(s)" in text
    assert "numeric debug over 4 input(s)" in text and "SQNR dB" in text and "r2" in text
    onnx.checker.check_model(onnx.load(str(out)))


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_cli_says_when_7_bit_weights_would_run_faster(tmp_path, capsys, monkeypatch, isa) -> None:
    """Without VNNI (forced AVX2 here) `smelt quantize` keeps 8-bit weights and says that
    --weight-bits 7 takes the byte products; with VNNI, or when 7 bits are asked, nothing."""
    from smelt.codegen.kernels.isa import exact_byte_products
    from smelt.target import detect

    host = detect()
    if isa not in host.isa_caps() and isa != "native":
        pytest.skip(f"host cannot run {isa}")
    target = host.narrowed(isa)
    monkeypatch.setattr("smelt.target.detect", lambda: target)
    src, calib = tmp_path / "m.onnx", tmp_path / "calib"
    onnx.save(_cnn(), str(src))
    calib.mkdir()
    np.save(calib / "0.npy", _feeds(1)[0]["x"])
    for bits in ("8", "7"):
        assert main(["quantize", str(src), "-o", str(tmp_path / f"q{bits}.onnx"), "--calibration", str(calib),
                     "--weight-bits", bits]) == 0
        said = "--weight-bits 7" in capsys.readouterr().out
        assert said == (bits == "8" and not exact_byte_products(target)), (isa, bits)


def test_bad_calibration_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(SmeltError, match="no .npz or .npy"):
        quantize(_cnn(), tmp_path)
    with pytest.raises(SmeltError, match="calibration method"):
        quantize(_cnn(), _feeds(1), method="entropy-ish")


def test_numeric_debug_names_a_planted_saturating_layer() -> None:
    """Shrink one layer's output scale 50x after quantizing: that tensor saturates. The debug
    report ranks it worst, with a saturation count taken inside the integer kernel, while the
    other tensors saturate little or not at all."""
    from smelt.quantize import debug_report

    fp32 = _cnn()
    model, _ = quantize(fp32, _feeds(16))
    planted = "r2"  # the second conv's output after its Relu
    scale = next(i for i in model.graph.initializer if i.name == f"{planted}_scale")
    value = numpy_helper.to_array(scale) / 50
    scale.CopyFrom(numpy_helper.from_array(value.astype(np.float32), scale.name))
    report = debug_report(model, _feeds(4), float_model=fp32)
    # the tensors below r2 inherit its error (an SQNR as bad); the noise each adds itself names r2
    worst = report.most_harmful()[0]
    assert worst.name == planted, report.format_text()
    assert worst.sqnr_db <= min(t.sqnr_db for t in report.tensors) + 1.0
    assert worst.saturated > 0.2 * worst.elements, report.format_text()
    others = [t for t in report.tensors if t.name != planted]
    assert all(t.saturated < 0.01 * t.elements for t in others), report.format_text()
    assert planted in report.format_text()
    # without the plant, the same model's worst tensor is far better
    clean, _ = quantize(fp32, _feeds(16))
    assert debug_report(clean, _feeds(4), float_model=fp32).tensors[0].sqnr_db > worst.sqnr_db + 10


def test_numeric_debug_without_the_float_model() -> None:
    """The float reference of a QDQ model is the model with its activation Q/DQ pairs removed."""
    from smelt.quantize import debug_report

    model, _ = quantize(_cnn(), _feeds(8))
    report = debug_report(model, _feeds(2))
    assert {t.name for t in report.tensors} >= {"r1", "r2"}
    assert all(np.isfinite(t.sqnr_db) and t.sqnr_db > 15 for t in report.tensors), report.format_text()
