"""ai.onnx.ml's ZipMap, as skl2onnx and onnxmltools end every classifier by default, against
onnxruntime: the graph runs natively with the ZipMap's probability tensor as its output, and a
call returns onnxruntime's list of {label: probability} dicts (frontend/zipmap.py)."""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from kernel_models import force_isa
from onnx import TensorProto, helper

import smelt
from smelt.errors import InvalidModelError
from smelt.frontend.zipmap import as_tensor, split_zipmaps
from smelt.quantize import debug_report

ML = "ai.onnx.ml"
RNG = np.random.default_rng(4242)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A compile cache of this module's own (pytest's ``cache`` fixture is something else)."""
    return tmp_path_factory.mktemp("smelt-cache")


def _seq_of_maps(key: int) -> onnx.TypeProto:
    return helper.make_sequence_type_proto(
        helper.make_map_type_proto(key, helper.make_tensor_type_proto(TensorProto.FLOAT, [])))


def _classifier(labels: list[int] | list[str], features: int = 5, rank1: bool = False) -> onnx.ModelProto:
    """A linear classifier as skl2onnx writes one: scores, Softmax, ArgMax for the label index,
    the labels gathered, the probabilities through ZipMap (``rank1``: one sample as a [C] row)."""
    classes = len(labels)
    w = RNG.standard_normal((features, classes)).astype(np.float32)
    b = RNG.standard_normal(classes).astype(np.float32)
    strings = isinstance(labels[0], str)
    label_tensor = helper.make_tensor("labels", TensorProto.STRING if strings else TensorProto.INT64, [classes],
                                      [s.encode() for s in labels] if strings else labels)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["scores0"], name="matmul"),
             helper.make_node("Add", ["scores0", "b"], ["scores"], name="add"),
             helper.make_node("Softmax", ["scores"], ["probs"], name="softmax", axis=-1),
             helper.make_node("ArgMax", ["probs"], ["index"], name="argmax", axis=-1, keepdims=0),
             helper.make_node("Gather", ["labels", "index"], ["label"], name="gather")]
    zip_input = "probs"
    if rank1:
        nodes.append(helper.make_node("Squeeze", ["probs", "zero"], ["row"], name="squeeze"))
        zip_input = "row"
    key = {"classlabels_strings": labels} if strings else {"classlabels_int64s": labels}
    nodes.append(helper.make_node("ZipMap", [zip_input], ["output_probability"], name="zipmap", domain=ML, **key))
    inits = [helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.ravel()),
             helper.make_tensor("b", TensorProto.FLOAT, b.shape, b), label_tensor,
             helper.make_tensor("zero", TensorProto.INT64, [1], [0])]
    graph = helper.make_graph(
        nodes, "classifier", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1 if rank1 else "N", features])],
        [helper.make_tensor_value_info("label", TensorProto.STRING if strings else TensorProto.INT64, [1 if rank1 else "N"]),
         helper.make_value_info("output_probability", _seq_of_maps(TensorProto.STRING if strings else TensorProto.INT64))],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ML, 1)])
    model.ir_version = 8
    return model


def _ort(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _assert_same_maps(got: list[dict], want: list[dict]) -> None:
    assert isinstance(got, list) and len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert list(g) == list(w)  # the same keys, of the same Python type, in label order
        assert all(type(k) is type(kw) for k, kw in zip(g, w, strict=True))
        assert all(type(v) is float for v in g.values())
        np.testing.assert_allclose(list(g.values()), list(w.values()), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("isa", ["native", "avx2", "scalar"])
@pytest.mark.parametrize("labels", [[0, 1, 2], [3, -7, 11, 5, 9], ["setosa", "versicolor", "virginica"],
                                    ["spam", "ham"], ["b", "é", "a", "b"]],
                         ids=["int3", "int5-unsorted", "str3", "str2", "str-repeated"])
def test_zipmap_outputs_are_onnxruntimes_maps(labels, isa, monkeypatch, cache) -> None:
    """Labels int64 and string, 2 to 5 classes, unsorted and repeated (onnxruntime's maps are
    sorted by key and a repeated label keeps its last column), 1 to 9 rows (a NaN row among
    them), 1 and 2 threads: the same keys in the same order and the probabilities of
    onnxruntime, which the graph before the ZipMap computes natively."""
    force_isa(isa, monkeypatch, cache)
    model = _classifier(labels)
    sess = _ort(model)
    for threads in (1, 2):
        compiled = smelt.compile(model, threads=threads)
        for rows in (1, 4, 9):
            x = RNG.standard_normal((rows, 5)).astype(np.float32)
            if rows == 4:
                x[2, 1] = np.nan  # a NaN row maps to NaN probabilities in both
            got, want = compiled.run({"x": x}), sess.run(None, {"x": x})
            assert got[0].tolist() == want[0].tolist()
            _assert_same_maps(got[1], want[1])
            assert np.array_equal(np.isnan(as_tensor(got[1])), np.isnan(as_tensor(want[1])))
        # the label Gather of strings is the fallback's (strings have no native kernels)
        assert compiled.fallback_nodes == (["gather"] if isinstance(labels[0], str) else [])
        assert [(o.name, o.type) for o in compiled.get_outputs()] == [(o.name, o.type) for o in sess.get_outputs()]
        compiled.close()


def test_rank1_probabilities_are_one_map(monkeypatch, tmp_path) -> None:
    """A [C] probability row is one map, as in onnxruntime."""
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    model = _classifier([10, 20, 30], rank1=True)
    x = RNG.standard_normal((1, 5)).astype(np.float32)
    got = smelt.compile(model).run({"x": x})
    want = _ort(model).run(None, {"x": x})
    _assert_same_maps(got[1], want[1])


def test_session_run_check_and_run_graph(monkeypatch, tmp_path) -> None:
    """``InferenceSession.run`` picks the maps by name; ``run_graph`` and ``smelt check`` see the
    probability tensor (``graph_proto`` has an Identity where the ZipMap was); the caller's model
    is not changed."""
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    model = _classifier(["a", "b", "c"])
    before = model.SerializeToString()
    sess = smelt.InferenceSession(model)
    x = RNG.standard_normal((3, 5)).astype(np.float32)
    (maps,) = sess.run(["output_probability"], {"x": x})
    _assert_same_maps(maps, _ort(model).run(["output_probability"], {"x": x})[0])
    compiled = sess.compiled
    label, probs = compiled.run_graph({"x": x})
    assert probs.dtype == np.float32 and probs.shape == (3, 3)
    np.testing.assert_array_equal(probs, as_tensor(maps))
    assert [n.op_type for n in compiled.graph_proto.graph.node][-1] == "Identity"
    assert model.SerializeToString() == before and compiled.proto.graph.node[-1].op_type == "ZipMap"
    assert [zm.labels for zm in compiled.zipmap_outputs] == [("a", "b", "c")]
    report = smelt.check(compiled, {"x": x})
    assert report.ok, report.summary()


def test_wrong_label_count_is_a_clear_error(monkeypatch, tmp_path) -> None:
    """Four probability columns and three labels: an error naming the node and both counts (as
    onnxruntime refuses it at run time), never a short map."""
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    model = _classifier([0, 1, 2, 3])
    for a in model.graph.node[-1].attribute:
        if a.name == "classlabels_int64s":
            del a.ints[-1]
    compiled = smelt.compile(model)
    with pytest.raises(smelt.SmeltError, match=r"'zipmap'.*4 columns.*3 class labels"):
        compiled.run({"x": RNG.standard_normal((2, 5)).astype(np.float32)})


def test_labels_must_be_one_kind() -> None:
    """Both label lists, or neither: the model is invalid, and the error names the node."""
    model = _classifier([0, 1])
    model.graph.node[-1].attribute.append(helper.make_attribute("classlabels_strings", ["a", "b"]))
    with pytest.raises(InvalidModelError, match=r"'zipmap'.*exactly one of"):
        split_zipmaps(model)


def test_as_tensor_refuses_ragged_maps() -> None:
    """Maps with different keys have no tensor form; anything but a list of dicts passes through."""
    assert as_tensor(np.ones(2)) is not None and as_tensor("x") == "x"
    np.testing.assert_array_equal(as_tensor([{1: 0.5, 2: 0.25}]), np.array([[0.5, 0.25]], np.float32))
    with pytest.raises(smelt.SmeltError, match="different keys"):
        as_tensor([{1: 0.5}, {2: 0.5}])


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_quantized_classifier_keeps_its_maps(mode, monkeypatch, tmp_path) -> None:
    """``smelt.quantize`` calibrates, and its numeric debug mode compares, on the probability
    tensor (``run_graph``; the debug mode took the maps for arrays), and the quantized model still
    returns onnxruntime's maps."""
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    model = _classifier([0, 1, 2, 3], features=16)
    calibration = [{"x": RNG.standard_normal((4, 16)).astype(np.float32)} for _ in range(4)]
    quantized, _ = smelt.quantize(model, calibration, mode=mode)
    assert any(n.op_type == "ZipMap" for n in quantized.graph.node)
    got = smelt.compile(quantized).run(calibration[0])
    _assert_same_maps(got[1], _ort(quantized).run(None, calibration[0])[1])
    report = debug_report(quantized, calibration, float_model=model).format_text(top=5)
    assert re.search(r"output_probability: SQNR [\d.]+ dB", report), report
