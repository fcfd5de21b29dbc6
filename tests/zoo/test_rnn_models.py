"""The recurrent models from the papers in the zoo, end to end against onnxruntime.

DeepCPU's text similarity model (bidirectional GRUs, input 200, hidden 512, length 20) and BiDAF's
three LSTM layers (Table 2); ModelCompiler's Fig. 4(a) stacked LSTMs (hidden 128, length 17,
batch 1, 1 to 8 layers) are parametric zoo names.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import smelt
from smelt.frontend import zoo
from smelt.frontend.zoo.rnn import modelcompiler_fig4a


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "smelt-rnn-zoo-cache"))


def _feeds(model: onnx.ModelProto, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in model.graph.input:
        dims = [d.dim_value if d.HasField("dim_value") else batch for d in vi.type.tensor_type.shape.dim]
        feeds[vi.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


def _against_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray], threads: int) -> smelt.CompiledModel:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    ref = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)
    compiled = smelt.compile(model, threads=threads)
    got = compiled.run(feeds)
    for a, b in zip(got, ref, strict=True):
        assert a.shape == b.shape
        assert float(np.abs(a - b).max()) <= 1e-5 * max(1.0, float(np.abs(b).max()))
    return compiled


def test_paper_models_are_listed_and_described():
    assert zoo.paper_rnn_models() == ["text-similarity", "bidaf-lstms"]
    for name in zoo.paper_rnn_models():
        assert name in zoo.describe(f"zoo:{name}")
    assert modelcompiler_fig4a()[0] == "lstm-E128-H128-B1-T17"
    assert modelcompiler_fig4a()[-1] == "lstm-E128-H128-B1-T17-L8"
    spec = zoo.parse_rnn_name(modelcompiler_fig4a()[3])
    assert (spec.E, spec.H, spec.B, spec.T, spec.layers) == (128, 128, 1, 17, 4)


@pytest.mark.parametrize("batch,threads", [(1, 2), (3, 1)])
def test_text_similarity(batch, threads):
    model = zoo.get_model("text-similarity", batch=batch)
    grus = [n for n in model.graph.node if n.op_type == "GRU"]
    assert len(grus) == 2 and all(
        onnx.helper.get_attribute_value(a) == b"bidirectional" for n in grus for a in n.attribute if a.name == "direction")
    compiled = _against_ort(model, _feeds(model, batch), threads)
    assert compiled.fallback_nodes == []


def test_bidaf_lstms():
    model = zoo.get_model("bidaf-lstms")
    assert sum(n.op_type == "LSTM" for n in model.graph.node) == 5  # phrase x2 (shared), modeling x2, output
    compiled = _against_ort(model, _feeds(model, 1), 2)
    assert compiled.fallback_nodes == []


@pytest.mark.parametrize("layers", [1, 3])
def test_modelcompiler_stacks(layers):
    model = zoo.get_model(modelcompiler_fig4a()[layers - 1])
    assert sum(n.op_type == "LSTM" for n in model.graph.node) == layers
    _against_ort(model, _feeds(model, 1), 2)
