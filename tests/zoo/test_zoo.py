"""Tests for the built-in model zoo (smelt.frontend.zoo).

The zoo is the ground truth for benchmarks and end-to-end tests, so these
check that each model is valid ONNX, has the published architecture's
parameter count, runs in onnxruntime with well-scaled outputs, is
bit-for-bit reproducible, and (for RNNs) computes what a plain numpy
reference computes -- the last catches miswired Transpose/Reshape glue
between stacked bidirectional layers.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from functools import cache

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from smelt.frontend import zoo
from smelt.frontend.zoo.builder import ModelBuilder, count_parameters
from smelt.frontend.zoo.cnn import REFERENCE_PARAMS
from smelt.frontend.zoo.rnn import deepcpu_table1, lstm_model

ort = pytest.importorskip("onnxruntime")

CNNS = [
    "resnet18",
    "resnet50",
    "vgg16",
    "mobilenet_v2",
    "squeezenet1_1",
    "densenet121",
    "inception_v3",
]
RNNS = ["lstm", "gru", "lstm-stacked", "lstm-bidirectional", "gru-bidirectional", "gru-stacked"]


@cache
def _cnn(name: str) -> tuple[onnx.ModelProto, bytes]:
    """Build each CNN once per session; VGG-16 alone is ~550 MB of weights."""
    model = zoo.get_model(name)
    return model, model.SerializeToString()


@pytest.fixture(scope="module", autouse=True)
def _free_cached_models() -> Iterator[None]:
    """Release the ~1.5 GB of cached models once this module is done."""
    yield
    _cnn.cache_clear()


def _session(data: bytes) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    opts.log_severity_level = 3
    return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])


def _dims(vi: onnx.ValueInfoProto) -> list[int | str]:
    return [
        d.dim_value if d.HasField("dim_value") else d.dim_param
        for d in vi.type.tensor_type.shape.dim
    ]


# ------------------------------------------------------------------ registry
def test_registry_names() -> None:
    names = zoo.list_models()
    assert set(CNNS + RNNS) == set(names)
    for name in names:
        assert name in zoo.describe(name)
        assert zoo.describe(f"zoo:{name}") == zoo.describe(name)


def test_unknown_name_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="resnet18.*lstm-stacked"):
        zoo.get_model("resnet19")
    with pytest.raises(ValueError, match="valid names"):
        zoo.describe("lstm-E1-H1")


def test_parametric_names() -> None:
    spec = zoo.parse_rnn_name("zoo:lstm-E256-H128-B4-T10-L3-bi")
    assert spec == zoo.RnnSpec("lstm", 256, 128, 4, 10, 3, True)
    assert spec.name == "lstm-E256-H128-B4-T10-L3-bi"
    assert zoo.parse_rnn_name("gru-E64-H64-T100", batch=7) == zoo.RnnSpec("gru", 64, 64, 7, 100)
    assert zoo.parse_rnn_name("resnet18") is None
    with pytest.raises(ValueError, match="fixes batch"):
        zoo.get_model("lstm-E8-H8-B2-T3", batch=5)
    model = zoo.get_model("zoo:gru-E64-H64-B10-T100")
    assert _dims(model.graph.input[0]) == [100, 10, 64]
    assert count_parameters(model) == zoo.parse_rnn_name("gru-E64-H64-B10-T100").num_params()


def test_import_is_light() -> None:
    import subprocess
    import sys

    # Listing and describing must not build anything or load the model code
    # (the parent ``smelt`` package may import onnx itself; that is not ours).
    code = (
        "import sys; import smelt.frontend.zoo as z; z.list_models(); z.describe('lstm');"
        "z.describe('resnet50'); print(sorted(m for m in sys.modules if '.zoo.' in m))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ----------------------------------------------------------------------- CNNs
@pytest.mark.parametrize("name", CNNS)
def test_cnn(name: str) -> None:
    model, data = _cnn(name)
    onnx.checker.check_model(data)
    assert model.opset_import[0].version == 17
    assert count_parameters(model) == pytest.approx(REFERENCE_PARAMS[name], rel=0.01)

    (inp,) = model.graph.input
    (out,) = model.graph.output
    size = 299 if name == "inception_v3" else 224
    assert inp.name == "input" and _dims(inp) == [1, 3, size, size]
    assert out.name == "logits" and _dims(out) == [1, 1000]
    # Shape inference ran: every intermediate has a typed, shaped value_info.
    produced = {o for n in model.graph.node for o in n.output} - {"logits"}
    typed = {vi.name for vi in model.graph.value_info if vi.type.tensor_type.HasField("shape")}
    assert produced <= typed

    sess = _session(data)
    x = np.random.default_rng(123).standard_normal((1, 3, size, size), dtype=np.float32)
    start = time.perf_counter()
    (y,) = sess.run(None, {"input": x})
    assert time.perf_counter() - start < 20
    assert y.shape == (1, 1000)
    assert np.isfinite(y).all()
    assert 1e-2 < float(y.std()) < 1e3


def test_cnn_readable_names() -> None:
    model, _ = _cnn("resnet18")
    nodes = [n.name for n in model.graph.node]
    assert len(set(nodes)) == len(nodes)
    assert {"conv1", "layer1.0.conv1", "layer1.0.bn1", "layer2.0.downsample.0", "fc"} <= set(nodes)
    inits = {i.name for i in model.graph.initializer}
    assert {"layer1.0.conv1.weight", "layer1.0.bn1.running_var", "fc.bias"} <= inits


def test_cnn_architecture_details() -> None:
    ops = {name: [n.op_type for n in _cnn(name)[0].graph.node] for name in CNNS}
    assert ops["vgg16"].count("Dropout") == 2
    assert ops["densenet121"].count("Concat") == 58 and ops["densenet121"].count("AveragePool") == 3

    mnv2 = _cnn("mobilenet_v2")[0]
    clips = [n for n in mnv2.graph.node if n.op_type == "Clip"]
    assert len(clips) == 35 and ops["mobilenet_v2"].count("Add") == 10
    inits = {i.name: numpy_helper.to_array(i) for i in mnv2.graph.initializer}
    assert {float(inits[c.input[1]]) for c in clips} == {0.0}
    assert {float(inits[c.input[2]]) for c in clips} == {6.0}
    depthwise = [
        n
        for n in mnv2.graph.node
        if n.op_type == "Conv" and any(a.name == "group" and a.i > 1 for a in n.attribute)
    ]
    assert len(depthwise) == 17

    inc = _cnn("inception_v3")[0]
    kernels = {
        tuple(onnx.helper.get_attribute_value(a))
        for n in inc.graph.node
        if n.op_type == "Conv"
        for a in n.attribute
        if a.name == "kernel_shape"
    }
    assert {(1, 7), (7, 1), (1, 3), (3, 1)} <= kernels
    avg = [n for n in inc.graph.node if n.op_type == "AveragePool"]
    assert len(avg) == 9
    for n in avg:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        assert attrs["count_include_pad"] == 1 and attrs["pads"] == [1, 1, 1, 1]

    r50 = _cnn("resnet50")[0]
    strides = {
        n.name: [a.ints for a in n.attribute if a.name == "strides"][0]
        for n in r50.graph.node
        if n.op_type == "Conv"
    }
    assert list(strides["layer2.0.conv2"]) == [2, 2]  # v1.5: stride on the 3x3
    assert list(strides["layer2.0.conv1"]) == [1, 1]


def test_symbolic_batch() -> None:
    model = zoo.get_model("squeezenet1_1", batch="N")
    assert _dims(model.graph.input[0])[0] == "N"
    x = np.random.default_rng(0).standard_normal((3, 3, 224, 224), dtype=np.float32)
    (y,) = _session(model.SerializeToString()).run(None, {"input": x})
    assert y.shape == (3, 1000)


def test_batch_size_matches() -> None:
    model = zoo.get_model("mobilenet_v2", batch=2)
    assert _dims(model.graph.input[0])[0] == 2 and _dims(model.graph.output[0]) == [2, 1000]


# ---------------------------------------------------------------- determinism
def _digest(model: onnx.ModelProto) -> str:
    return hashlib.sha256(model.SerializeToString()).hexdigest()


@pytest.mark.parametrize(
    "name",
    [
        "resnet18",
        "mobilenet_v2",
        "densenet121",
        "inception_v3",
        "squeezenet1_1",
        "lstm-bidirectional",
        "gru-stacked",
    ],
)
def test_deterministic(name: str) -> None:
    first = zoo.get_model(name).SerializeToString()
    second = zoo.get_model(name).SerializeToString()
    assert first == second
    assert zoo.get_model(name, seed=1).SerializeToString() != first


def test_deterministic_vgg16() -> None:
    # Second build only; the first comes from the shared cache.
    assert _digest(zoo.get_model("vgg16")) == hashlib.sha256(_cnn("vgg16")[1]).hexdigest()


# ----------------------------------------------------------------------- RNNs
def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return _session(model.SerializeToString()).run(None, feeds)


@pytest.mark.parametrize("name", RNNS)
def test_named_rnn(name: str) -> None:
    spec = zoo.parse_rnn_name(name)
    model = zoo.get_model(name)
    nd = 2 if spec.bidirectional else 1
    assert [o.name for o in model.graph.output] == ["y", "y_h"]
    assert _dims(model.graph.output[0]) == [100, 1, nd * 256]
    assert count_parameters(model) == spec.num_params()
    x = np.random.default_rng(0).standard_normal((100, 1, 256), dtype=np.float32)
    y, y_h = _run(model, {"x": x})
    assert y.shape == (100, 1, nd * 256) and y_h.shape == (nd, 1, 256)
    assert np.isfinite(y).all() and 1e-2 < float(y.std()) < 1.0


def test_deepcpu_table1() -> None:
    shapes = deepcpu_table1()
    assert len(shapes) == 15 and len(set(shapes)) == 15
    assert shapes[0] == (64, 64, 1, 100) and shapes[-1] == (1024, 1024, 20, 100)
    for E, H, B, T in [(64, 64, 1, 100), (256, 256, 1, 1), (1024, 1024, 10, 100)]:
        model = zoo.get_model(f"lstm-E{E}-H{H}-B{B}-T{T}")
        x = np.random.default_rng(0).standard_normal((T, B, E), dtype=np.float32)
        y, y_h = _run(model, {"x": x})
        assert y.shape == (T, B, H) and y_h.shape == (1, B, H)
        np.testing.assert_array_equal(y[-1], y_h[0])


def _sigmoid(v: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-v))


def _ref_lstm_dir(x, w, r, b, reverse):  # noqa: ANN001, ANN202 - test helper
    """One direction of ONNX LSTM (gates i, o, f, c; zero initial state)."""
    hsz = r.shape[-1]
    h = np.zeros((x.shape[1], hsz))
    c = np.zeros((x.shape[1], hsz))
    ys = [None] * x.shape[0]
    for t in reversed(range(x.shape[0])) if reverse else range(x.shape[0]):
        g = x[t] @ w.T + h @ r.T + b[: 4 * hsz] + b[4 * hsz :]
        i, o, f, cc = np.split(g, 4, axis=1)
        c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(cc)
        h = _sigmoid(o) * np.tanh(c)
        ys[t] = h
    return np.stack(ys), h


def _ref_gru_dir(x, w, r, b, reverse):  # noqa: ANN001, ANN202 - test helper
    """One direction of ONNX GRU with linear_before_reset=1 (gates z, r, h)."""
    hsz = r.shape[-1]
    h = np.zeros((x.shape[1], hsz))
    wb, rb = b[: 3 * hsz], b[3 * hsz :]
    ys = [None] * x.shape[0]
    for t in reversed(range(x.shape[0])) if reverse else range(x.shape[0]):
        gx = x[t] @ w.T + wb
        gh = h @ r.T + rb
        z = _sigmoid(gx[:, :hsz] + gh[:, :hsz])
        rr = _sigmoid(gx[:, hsz : 2 * hsz] + gh[:, hsz : 2 * hsz])
        hh = np.tanh(gx[:, 2 * hsz :] + rr * gh[:, 2 * hsz :])
        h = (1 - z) * hh + z * h
        ys[t] = h
    return np.stack(ys), h


def _reference(model: onnx.ModelProto, x: np.ndarray, cell: str) -> tuple[np.ndarray, np.ndarray]:
    """Stacked multi-direction RNN in float64 from the model's own weights."""
    inits = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in model.graph.initializer}
    step = _ref_lstm_dir if cell == "lstm" else _ref_gru_dir
    seq = x.astype(np.float64)
    for node in model.graph.node:
        if node.op_type not in ("LSTM", "GRU"):
            continue
        w, r, b = (inits[n] for n in node.input[1:4])
        outs = [step(seq, w[d], r[d], b[d], reverse=d == 1) for d in range(w.shape[0])]
        seq = np.concatenate([y for y, _ in outs], axis=-1)  # [T, B, D*H], direction-major
        last_h = np.stack([h for _, h in outs])
    return seq, last_h


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_stacked_bidirectional_matches_numpy(cell: str) -> None:
    E, H, B, T = 12, 7, 3, 6
    model = lstm_model(E, H, B, T, layers=3, bidirectional=True, cell=cell, seed=5)
    assert [n.op_type for n in model.graph.node].count("Transpose") == 3
    x = np.random.default_rng(1).standard_normal((T, B, E), dtype=np.float32)
    y, y_h = _run(model, {"x": x})
    ref_y, ref_h = _reference(model, x, cell)
    assert y.shape == (T, B, 2 * H) and y_h.shape == (2, B, H)
    np.testing.assert_allclose(y, ref_y, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(y_h, ref_h, rtol=1e-4, atol=1e-5)


def test_initial_states_and_symbolic_dims() -> None:
    model = lstm_model(8, 5, "B", "T", layers=2, initial_states=True)
    assert [i.name for i in model.graph.input] == ["x", "h0_0", "c0_0", "h0_1", "c0_1"]
    assert _dims(model.graph.output[0]) == ["T", "B", 5]
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((4, 2, 8), dtype=np.float32)}
    feeds |= {n: np.zeros((1, 2, 5), np.float32) for n in ["h0_0", "c0_0", "h0_1", "c0_1"]}
    y, _ = _run(model, feeds)
    (y0, _) = _run(lstm_model(8, 5, "B", "T", layers=2), {"x": feeds["x"]})
    np.testing.assert_array_equal(y, y0)


# -------------------------------------------------------------------- builder
def test_builder_generic_op_and_errors() -> None:
    b = ModelBuilder(seed=0)
    x = b.input("x", ["N", 4, 8, 8])
    y = b.op("Sigmoid", [x])
    assert b.shape(y) == ("N", 4, 8, 8)  # inferred on demand
    z = b.conv(y, 6, (3, 1), pad=(1, 0), name="c")
    assert b.shape(z) == ("N", 6, 8, 8)
    s, idx = b.op("TopK", [z, b.const([2], np.int64)], {"axis": 1}, n_outputs=2)
    b.output(s, "values")
    b.output(idx, "indices")
    model = b.build("probe")
    assert b.num_params == count_parameters(model) == 6 * 4 * 3
    assert _dims(model.graph.output[1]) == ["N", 2, 8, 8]
    assert model.graph.output[1].type.tensor_type.elem_type == onnx.TensorProto.INT64

    with pytest.raises(ValueError, match="shape mismatch"):
        b.add(z, y)
    with pytest.raises(ValueError, match="divisible"):
        b.conv(z, 4, 3, groups=4)
