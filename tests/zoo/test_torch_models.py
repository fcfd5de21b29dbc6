"""Tests for the PyTorch definitions of the zoo models (smelt.frontend.zoo.torch_models).

``smelt bench`` times PyTorch on these definitions, so each must compute what
the zoo's ONNX graph computes with the same weights: every model is run in
onnxruntime and in torch on the same input and compared output by output.
The weight loading must be strict, so a renamed or mis-shaped weight can never
leave a randomly initialised layer behind a plausible-looking benchmark.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from functools import cache

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from smelt.frontend import zoo
from smelt.frontend.zoo.rnn import lstm_model

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

from smelt.frontend.zoo.torch_models import (  # noqa: E402 - needs torch, skipped above
    has_torch_definition,
    torch_model_for,
)

SMALL_CNNS = ["resnet18", "mobilenet_v2", "squeezenet1_1"]
BIG_CNNS = ["resnet50", "vgg16", "densenet121", "inception_v3"]
RTOL = 1e-4  # max abs diff allowed, relative to max |reference| of that output


@pytest.fixture(scope="module", autouse=True)
def _two_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@cache
def _model(name: str) -> onnx.ModelProto:
    """Small models shared by the error tests; always copy before mutating."""
    return zoo.get_model(name)


def _copy(name: str) -> onnx.ModelProto:
    model = onnx.ModelProto()
    model.CopyFrom(_model(name))
    return model


def _feeds(model: onnx.ModelProto, batch: int = 1, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs in graph-input order; symbolic dims (batch) become ``batch``."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in model.graph.input:
        dims = [
            d.dim_value if d.HasField("dim_value") else batch for d in vi.type.tensor_type.shape.dim
        ]
        feeds[vi.name] = rng.standard_normal(dims, dtype=np.float32)
    return feeds


def _run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _run_torch(module: torch.nn.Module, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    with torch.inference_mode():
        out = module(*(torch.from_numpy(v) for v in feeds.values()))
    assert isinstance(out, tuple)
    return [t.numpy() for t in out]


def _assert_matches(got: list[np.ndarray], ref: list[np.ndarray]) -> None:
    assert len(got) == len(ref)
    for i, (g, r) in enumerate(zip(got, ref, strict=True)):
        assert g.shape == r.shape, f"output {i}: shape {g.shape} != {r.shape}"
        assert g.dtype == np.float32
        scale = float(np.abs(r).max())
        err = float(np.abs(g - r).max())
        assert err <= RTOL * scale, f"output {i}: max abs diff {err:.3g} > {RTOL} * {scale:.3g}"


def _check_module(module: torch.nn.Module) -> None:
    assert not module.training and not any(m.training for m in module.modules())
    for t in [*module.parameters(), *module.buffers()]:
        assert t.device.type == "cpu" and not t.requires_grad
        assert t.dtype in (torch.float32, torch.int64)


def _weight_names(model: onnx.ModelProto) -> set[str]:
    """Initializers other than the builder's shared operator constants (Clip bounds ...)."""
    return {i.name for i in model.graph.initializer if not i.name.startswith("const.")}


# ----------------------------------------------------------------------- CNNs
@pytest.mark.parametrize(
    "name", SMALL_CNNS + [pytest.param(n, marks=pytest.mark.slow) for n in BIG_CNNS]
)
def test_cnn_matches_onnxruntime(name: str) -> None:
    model = zoo.get_model(name)
    module = torch_model_for(name, model)
    _check_module(module)
    # Module paths were chosen so the state_dict *is* the ONNX weight set.
    keys = {k for k in module.state_dict() if not k.endswith(".num_batches_tracked")}
    assert keys == _weight_names(model)
    feeds = _feeds(model)
    _assert_matches(_run_torch(module, feeds), _run_ort(model, feeds))


def test_cnn_symbolic_batch() -> None:
    # The torch definition is batch-agnostic: a symbolic-batch proto loads
    # and a batch of 3 matches onnxruntime.
    model = zoo.get_model("zoo:squeezenet1_1", batch="N", seed=4)
    module = torch_model_for("zoo:SqueezeNet1_1", model)
    feeds = _feeds(model, batch=3)
    _assert_matches(_run_torch(module, feeds), _run_ort(model, feeds))


# ----------------------------------------------------------------------- RNNs
@pytest.mark.parametrize(
    ("name", "batch"),
    [
        ("lstm", 1),
        ("gru", 1),
        ("lstm-stacked", 1),
        ("gru-stacked", 1),
        ("lstm-bidirectional", 1),
        ("gru-bidirectional", 1),
        ("lstm", 4),
        ("gru-bidirectional", 3),
        ("zoo:lstm-E40-H24-B5-T9-L3-bi", 1),
        ("GRU-E24-H40-T7-L2-bi", 6),
        ("lstm-E1024-H64-B2-T10", 1),
    ],
)
def test_rnn_matches_onnxruntime(name: str, batch: int) -> None:
    model = zoo.get_model(name, batch=batch, seed=2)
    module = torch_model_for(name, model)
    _check_module(module)
    feeds = _feeds(model, seed=1)
    assert list(feeds) == ["x"]
    _assert_matches(_run_torch(module, feeds), _run_ort(model, feeds))


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_rnn_initial_states(cell: str) -> None:
    # A zoo RNN built with initial_states=True takes h0_i (and c0_i) inputs;
    # forward() takes them positionally after x, in graph-input order.
    model = lstm_model(12, 7, 3, 5, layers=2, bidirectional=True, cell=cell, initial_states=True)
    module = torch_model_for(f"{cell}-E12-H7-T5-L2-bi", model)
    feeds = _feeds(model, seed=3)
    assert len(feeds) == (5 if cell == "lstm" else 3)
    _assert_matches(_run_torch(module, feeds), _run_ort(model, feeds))


# ---------------------------------------------------------------- strictness
def _initializer(model: onnx.ModelProto, name: str) -> onnx.TensorProto:
    return next(i for i in model.graph.initializer if i.name == name)


def test_missing_weight_is_named() -> None:
    model = _copy("resnet18")
    model.graph.initializer.remove(_initializer(model, "layer1.0.bn1.running_var"))
    with pytest.raises(ValueError, match=r"missing weights: layer1\.0\.bn1\.running_var$"):
        torch_model_for("resnet18", model)


def test_renamed_weight_is_missing_and_unexpected() -> None:
    model = _copy("squeezenet1_1")
    _initializer(model, "features.3.squeeze.weight").name = "features.3.squeeze.kernel"
    with pytest.raises(ValueError) as info:
        torch_model_for("squeezenet1_1", model)
    msg = str(info.value)
    assert "'squeezenet1_1'" in msg
    assert "missing weights: features.3.squeeze.weight" in msg
    assert "unexpected ONNX initializers: features.3.squeeze.kernel" in msg


def test_wrong_shape_is_named() -> None:
    model = _copy("squeezenet1_1")
    bias = _initializer(model, "classifier.1.bias")
    bias.CopyFrom(numpy_helper.from_array(np.zeros(999, np.float32), bias.name))
    with pytest.raises(
        ValueError, match=r"classifier\.1\.bias: ONNX shape \(999,\), torch \(1000,\)"
    ):
        torch_model_for("squeezenet1_1", model)


def test_other_zoo_model_is_rejected() -> None:
    with pytest.raises(ValueError, match="does not match the PyTorch definition of 'resnet18'"):
        torch_model_for("resnet18", _model("squeezenet1_1"))


def test_rnn_weight_errors_name_onnx_tensors() -> None:
    model = lstm_model(8, 6, 2, 3, layers=2, bidirectional=True)
    model.graph.initializer.remove(_initializer(model, "layer1.lstm.W"))
    with pytest.raises(ValueError, match=r"rnn\.weight_ih_l1 \(from ONNX layer1\.lstm\.W\)"):
        torch_model_for("lstm-E8-H6-T3-L2-bi", model)
    # Sizes in the name must match the proto's.
    with pytest.raises(ValueError, match=r"layer0\.lstm\.W: ONNX shape \(2, 24, 8\)"):
        torch_model_for("lstm-E9-H6-T3-L2-bi", lstm_model(8, 6, 2, 3, 2, True))
    with pytest.raises(ValueError, match="expected 1x LSTM"):
        torch_model_for("lstm-E8-H6-T3", lstm_model(8, 6, 2, 3, cell="gru"))
    with pytest.raises(ValueError, match="direction 'forward', expected 'bidirectional'"):
        torch_model_for("lstm-E8-H6-T3-bi", lstm_model(8, 6, 2, 3))


def test_gru_linear_before_reset_0_is_rejected() -> None:
    # torch.nn.GRU has no linear_before_reset=0 formulation; silently loading
    # such a model would benchmark a different computation.
    model = lstm_model(8, 6, 2, 3, cell="gru")
    (gru,) = [n for n in model.graph.node if n.op_type == "GRU"]
    gru.attribute.remove(next(a for a in gru.attribute if a.name == "linear_before_reset"))
    gru.attribute.append(helper.make_attribute("linear_before_reset", 0))
    with pytest.raises(ValueError, match="linear_before_reset=0"):
        torch_model_for("gru-E8-H6-T3", model)


# ------------------------------------------------------------------ registry
def test_has_torch_definition() -> None:
    for name in zoo.list_models():
        assert has_torch_definition(name) and has_torch_definition(f"zoo:{name}")
    assert has_torch_definition("ResNet50")
    assert has_torch_definition("zoo:lstm-E256-H256-B1-T100-L2-bi")
    assert has_torch_definition("gru-E64-H64-T100")
    for name in ["resnet19", "", "lstm-E0-H8-T3", "lstm-E8-H8", "zoo:"]:
        assert not has_torch_definition(name)


def test_unknown_name_raises() -> None:
    with pytest.raises(ValueError, match="no PyTorch definition for zoo model 'resnet19'.*vgg16"):
        torch_model_for("resnet19", _model("squeezenet1_1"))


def test_zoo_does_not_import_torch() -> None:
    # Only torch_models imports torch; building zoo models must not need it.
    code = (
        "import sys; import smelt.frontend.zoo as z; z.get_model('squeezenet1_1');"
        "z.get_model('lstm-E8-H8-T3'); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
