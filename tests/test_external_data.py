"""External tensor data is read only from inside the model file's directory, as onnxruntime reads
it: absolute locations, ``..`` escapes and symbolic links leading outside are refused naming the
tensor and the location; the working directory is never consulted; models given as bytes or a
ModelProto with external data are refused (they have no directory)."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from helpers import assert_close, make_model, tensor
from onnx import TensorProto, helper

import smelt
from smelt.errors import ModelLoadError

W = np.arange(12, dtype=np.float32).reshape(3, 4) - 5.5


def _external_model(location: str, offset: int | None = None, length: int | None = None) -> onnx.ModelProto:
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=list(W.shape))
    w.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        if value is not None:
            entry = w.external_data.add()
            entry.key, entry.value = key, str(value)
    nodes = [helper.make_node("Add", ["x", "w"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    return make_model(nodes, [tensor("x", [3, 4])], [tensor("y", [3, 4])], [w])


def _save(directory, name: str, model: onnx.ModelProto):
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_bytes(model.SerializeToString())
    return path


def _ort_accepts(path) -> bool:
    try:
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return True
    except Exception:
        return False


@pytest.mark.parametrize("layout", ["same_dir", "sub_dir", "dot_dot_inside", "symlink_inside", "offset"])
def test_external_data_inside_the_model_directory_loads(layout, tmp_path, monkeypatch):
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path / "cache"))
    m = tmp_path / "m"
    (m / "sub").mkdir(parents=True)
    offset = None
    if layout == "same_dir":
        location = "w.bin"
    elif layout == "sub_dir":
        location = "sub/w.bin"
    elif layout == "dot_dot_inside":
        location = "sub/../w.bin"
    elif layout == "symlink_inside":
        location = "link.bin"
        os.symlink("w.bin", m / "link.bin")
    else:
        location, offset = "packed.bin", 16
        (m / "packed.bin").write_bytes(b"\x01" * 16 + W.tobytes() + b"\x02" * 8)
    data_file = m / ("sub/w.bin" if layout == "sub_dir" else "w.bin")
    W.tofile(data_file)
    path = _save(m, "model.onnx", _external_model(location, offset, W.nbytes if offset else None))
    assert _ort_accepts(path)
    x = np.linspace(-8, 8, 12, dtype=np.float32).reshape(3, 4)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for threads in (1, 2):
        assert_close([smelt.compile(path, threads=threads)(x)], want)


def test_external_data_outside_the_model_directory_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path / "cache"))
    m, outside = tmp_path / "m", tmp_path / "outside"
    outside.mkdir()
    W.tofile(outside / "w.bin")
    m.mkdir()
    os.symlink(outside / "w.bin", m / "link.bin")
    os.symlink(outside, m / "dirlink")
    cases = {
        "absolute": (str(outside / "w.bin"), "is an absolute path"),
        "dot_dot": ("../outside/w.bin", "outside the model's directory"),
        "deep_dot_dot": ("sub/../../outside/w.bin", "outside the model's directory"),
        "symlink_file": ("link.bin", "outside the model's directory"),
        "symlink_dir": ("dirlink/w.bin", "outside the model's directory"),
        "etc_passwd": ("../" * 30 + "etc/passwd", "outside the model's directory"),
    }
    for name, (location, why) in cases.items():
        path = _save(m, f"{name}.onnx", _external_model(location))
        assert not _ort_accepts(path), name  # the behaviour smelt follows
        with pytest.raises(ModelLoadError) as err:
            smelt.compile(path, threads=1)
        message = str(err.value)
        assert "tensor 'w'" in message and repr(location) in message and why in message, (name, message)


def test_working_directory_is_never_consulted(tmp_path, monkeypatch):
    """The data file exists only in the working directory, not beside the model."""
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path / "cache"))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    W.tofile(cwd / "w.bin")
    monkeypatch.chdir(cwd)
    path = _save(tmp_path / "m", "model.onnx", _external_model("w.bin"))
    assert not _ort_accepts(path)
    with pytest.raises(ModelLoadError, match=r"tensor 'w': external data location 'w.bin' is not a file in the model's"):
        smelt.compile(path, threads=1)
    # a model file in the working directory reads its own directory: that is the model's directory
    here = _save(cwd, "here.onnx", _external_model("w.bin"))
    x = np.zeros((3, 4), np.float32)
    np.testing.assert_array_equal(smelt.compile(os.path.basename(here), threads=1)(x), np.maximum(W, 0))


def test_model_without_a_directory_and_external_data_is_refused(tmp_path, monkeypatch):
    """onnxruntime 1.32 reads a bytes model's external data from the working directory (confined
    to it); smelt never reads the working directory, so it refuses and asks for the file path."""
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    W.tofile(tmp_path / "w.bin")  # in the working directory: read from there before
    model = _external_model("w.bin")
    for given, what in ((model, "onnx.ModelProto"), (model.SerializeToString(), "bytes")):
        with pytest.raises(ModelLoadError, match=f"tensor 'w' keeps its data in an external file .*given as .*{what}"):
            smelt.compile(given, threads=1)


@pytest.mark.parametrize("offset, length, why", [
    (0, 4 * 13, "asks for bytes 0..52 of a 48-byte file"),
    (8, None, "holds 40 bytes, but the tensor's shape [3, 4] needs 48"),
    (-1, None, "asks for bytes -1"),
    ("x", None, "non-integer offset"),
])
def test_external_data_ranges_are_checked(offset, length, why, tmp_path, monkeypatch):
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path / "cache"))
    W.tofile(tmp_path / "w.bin")
    path = _save(tmp_path, "model.onnx", _external_model("w.bin", offset, length))
    with pytest.raises(ModelLoadError) as err:
        smelt.compile(path, threads=1)
    assert why in str(err.value) and "tensor 'w'" in str(err.value)
