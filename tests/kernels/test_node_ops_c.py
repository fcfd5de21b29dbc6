"""Node-suite ops against onnxruntime: TensorScatter (templates/tensor_scatter.py),
TfIdfVectorizer (templates/tfidf.py), QLinearMatMul with float16 scales (templates/int_matmul.py). Edge shapes (update as long as the cache, a batch of one,
slices of one element, rows too short for any n-gram), every mode, every dtype the templates
take; every ISA the host runs, 1 and 2 threads (node_cases.check)."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_models import force_isa
from node_cases import Cases, build_model, check

import smelt

# node-suite ops at every ISA and thread count: the long suite (`pytest -m slow`, run by .ci/run)
pytestmark = pytest.mark.slow

RNG = np.random.default_rng(1515)
ISAS = ["native", "avx2", "scalar"]


@pytest.mark.parametrize("isa", ISAS)
def test_tensor_scatter(isa, monkeypatch, cache):
    force_isa(isa, monkeypatch, cache)
    cases, feeds = Cases(), {}

    def scatter(cache_shape, update_len, dtype=np.float32, write=None, **attrs) -> None:
        k = len(cases.nodes)
        axis = attrs.get("axis", -2) % len(cache_shape)
        us = list(cache_shape)
        us[axis] = update_len
        feeds[f"c{k}"] = RNG.standard_normal(cache_shape).astype(dtype) * 4
        feeds[f"u{k}"] = RNG.standard_normal(us).astype(dtype) * 4
        ins = [f"c{k}", f"u{k}"]
        if write is not None:
            feeds[f"w{k}"] = np.asarray(write, np.int64)
            ins.append(f"w{k}")
        cases.add("TensorScatter", ins, **attrs)

    scatter((2, 1, 4, 5), 1, write=[1, 3])  # one step per batch, at the last slot
    scatter((2, 3, 6, 4), 3, write=[0, 3])  # ends exactly at the end
    scatter((3, 2, 5, 3), 5, write=[0, 0, 0])  # the whole cache replaced
    scatter((2, 2, 5, 3), 2)  # no write_indices: all zero
    scatter((2, 3, 4, 5), 3, write=[2, 7], mode="circular")  # wraps; an index past the length
    scatter((1, 4, 4, 1), 4, write=[3], mode="circular")  # slices of one element
    scatter((2, 5, 3), 2, write=[1, 0], axis=1)  # rank 3, sequence on axis 1
    scatter((2, 4, 3, 2, 2), 2, write=[1, 2], axis=2, mode="circular")  # dims after the axis
    scatter((2, 3, 4, 5), 2, np.float16, write=[2, 1])
    scatter((2, 3, 4, 5), 2, np.int64, write=[0, 3], mode="circular")
    scatter((2, 4, 64, 64), 32, write=[16, 5], mode="circular")  # 64 KiB of slices: split over threads
    feeds["c0"][0, 0, 0, 0], feeds["u1"][1, 2, 1, 3] = np.nan, np.inf  # moved as bits
    check(cases, feeds, opset=24)


def test_tensor_scatter_bad_index_fails(monkeypatch, cache):
    """A negative index or a linear write past the cache's end fails the inference (onnxruntime
    refuses both); a circular index past the end wraps."""
    monkeypatch.setenv("SMELT_CACHE_DIR", str(cache))
    for mode, write, ok in (("linear", [3, 0], False), ("linear", [-1, 0], False), ("circular", [-1, 0], False),
                            ("circular", [9, 0], True), ("linear", [2, 0], True)):
        cases = Cases()
        cases.add("TensorScatter", ["c", "u", "w"], mode=mode)
        feeds = {"c": np.zeros((2, 3, 4, 5), np.float32), "u": np.ones((2, 3, 2, 5), np.float32),
                 "w": np.asarray(write, np.int64)}
        compiled = smelt.compile(build_model(cases, feeds, opset=24))
        assert compiled.fallback_nodes == []
        if ok:
            got = compiled.run(feeds)[0]
            pos = [(write[0] + s) % 4 for s in range(2)]
            assert np.all(got[0, :, pos] == 1) and got.sum() == 2 * 3 * 2 * 5
        else:
            with pytest.raises(Exception):  # noqa: B017 - smelt's run-time failure, whatever its class
                compiled.run(feeds)
        compiled.close()


def _tfidf(cases: Cases, x: str, mode: str, lo: int, hi: int, skip: int, pool: list[list[list[int]]],
           indexes: list[int] | None = None, weights: list[float] | None = None) -> None:
    """``pool[n - 1]``: the n-grams of size n."""
    flat, counts = [], []
    for grams in pool:
        counts.append(len(flat))
        for gram in grams:
            flat += gram
    n_grams = sum(len(grams) for grams in pool)
    attrs = dict(mode=mode, min_gram_length=lo, max_gram_length=hi, max_skip_count=skip, pool_int64s=flat,
                 ngram_counts=counts, ngram_indexes=indexes if indexes is not None else list(range(n_grams)))
    if weights is not None:
        attrs["weights"] = weights
    cases.add("TfIdfVectorizer", [x], **attrs)


@pytest.mark.parametrize("isa", ISAS)
def test_tfidf_vectorizer(isa, monkeypatch, cache):
    force_isa(isa, monkeypatch, cache)
    cases = Cases()
    uni = [[2], [3], [5], [4], [7], [1]]
    bi = [[5, 6], [7, 8], [6, 7], [2, 3], [3, 3]]
    tri = [[2, 3, 5], [5, 6, 7], [3, 3, 3]]
    pool = [uni, bi, tri]
    w13 = [float(v) for v in RNG.uniform(0.1, 3.0, 14).round(3)]
    for x in ("x32", "x64", "v"):
        for mode, weights in (("TF", None), ("IDF", None), ("IDF", w13), ("TFIDF", None), ("TFIDF", w13)):
            _tfidf(cases, x, mode, 1, 3, 2, pool, weights=weights)
        _tfidf(cases, x, "TF", 2, 2, 0, pool)  # bigrams only, no skips
        _tfidf(cases, x, "TF", 2, 3, 5, pool)  # skips past the row's end
        _tfidf(cases, x, "TF", 3, 3, 1, pool)  # trigrams: rows too short at large skips
        _tfidf(cases, x, "TF", 1, 1, 3, pool)  # unigrams, counted once whatever the skips
    # two n-grams sharing a column, a column no n-gram maps to, weights per column
    _tfidf(cases, "x32", "TFIDF", 1, 2, 1, [[[2], [3], [4]], [[2, 3]]], indexes=[3, 0, 3, 1],
           weights=[0.5, 1.5, 2.5, 3.5])
    _tfidf(cases, "x64", "IDF", 1, 2, 1, [[[2], [3], [4]], [[2, 3]]], indexes=[3, 0, 3, 1],
           weights=[0.5, 1.5, 2.5, 3.5])
    _tfidf(cases, "e", "TF", 1, 2, 1, pool)  # an empty row
    _tfidf(cases, "big", "TFIDF", 1, 3, 3, pool, weights=w13)  # enough tokens to split rows over threads
    x = RNG.integers(1, 9, size=(3, 11))
    x[1, :5] = [3, 3, 3, 3, 3]
    feeds = {"x32": x.astype(np.int32), "x64": x.astype(np.int64) - 1, "v": RNG.integers(1, 9, 17).astype(np.int64),
             "e": np.zeros((2, 0), np.int64), "big": RNG.integers(0, 9, size=(64, 300)).astype(np.int32)}
    check(cases, feeds, opset=17)


@pytest.mark.parametrize("isa", ISAS)
def test_qlinear_matmul_float16_scales(isa, monkeypatch, cache):
    """QLinearMatMul-21 with float16 scales (templates/int_matmul.py): scalar and per-column
    scales (onnxruntime takes no per-row ones), int8 and uint8, B fed at run time and B constant (the packed register
    tile), a matrix-vector product (column split), batches; scales with many mantissa bits so a
    multiplier rounded in float16 would differ from onnxruntime's float one."""
    force_isa(isa, monkeypatch, cache)
    cases, feeds = Cases(), {}

    def qmm(m: int, k: int, n: int, dt=np.int8, batch: tuple = (),
            per_col: bool = False, b_const: bool = False) -> None:
        i = len(cases.nodes)
        info = np.iinfo(dt)
        a = RNG.integers(info.min, info.max + 1, (*batch, m, k)).astype(dt)
        b = RNG.integers(info.min, info.max + 1, (k, n)).astype(dt)
        az, bz, yz = (RNG.integers(info.min // 8, info.max // 8 + 1, s).astype(dt)
                      for s in ((1,), (n,) if per_col else (1,), (1,)))  # onnxruntime: A's zero point scalar
        a_s = RNG.uniform(0.002, 0.03, (1,)).astype(np.float16)  # onnxruntime: A's scale scalar
        b_s = RNG.uniform(0.002, 0.03, (n,) if per_col else (1,)).astype(np.float16)
        y_s = RNG.uniform(0.05, 0.7, (1,)).astype(np.float16)
        feeds.update({f"a{i}": a, f"as{i}": a_s, f"az{i}": az, f"ys{i}": y_s, f"yz{i}": yz})
        names = [f"a{i}", f"as{i}", f"az{i}"]
        if b_const:  # B, its scale and zero point constant: the packed path
            cases.add("QLinearMatMul", names, (b, b_s, bz))
            cases.nodes[-1].input.extend([f"ys{i}", f"yz{i}"])
        else:
            feeds.update({f"b{i}": b, f"bs{i}": b_s, f"bz{i}": bz})
            cases.add("QLinearMatMul", names + [f"b{i}", f"bs{i}", f"bz{i}", f"ys{i}", f"yz{i}"])

    qmm(2, 4, 3)
    qmm(5, 17, 9, np.uint8)
    qmm(7, 33, 21, per_col=True)
    qmm(1, 64, 130)  # one row: columns split over threads
    qmm(6, 20, 19, np.uint8, b_const=True)
    qmm(9, 31, 40, per_col=True, b_const=True)
    qmm(3, 12, 5, batch=(2, 3))
    check(cases, feeds, opset=21)


def _ml_model(nodes: list, feeds: dict[str, np.ndarray], outputs: list[tuple[str, int]]):
    """A model of ai.onnx.ml nodes (node_cases.build_model imports the default domain only)."""
    from onnx import helper

    inputs = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
              for k, v in feeds.items()]
    graph = helper.make_graph(nodes, "ml", inputs, [helper.make_tensor_value_info(o, t, None) for o, t in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("isa", ISAS)
def test_array_feature_extractor(isa, monkeypatch, cache):
    """ArrayFeatureExtractor (templates/ml_ops.py) against onnxruntime: every dtype, repeated and
    2-D indices, one row, rows enough to split over threads; an index past the end fails the run.
    (A 1-D X stays on the fallback: onnx's shape inference leaves its [1, n] output untyped.)"""
    from node_cases import assert_close, oracle
    from onnx import helper

    force_isa(isa, monkeypatch, cache)
    feeds = {"f32": RNG.standard_normal((3, 5)).astype(np.float32),
             "f64": RNG.standard_normal((2, 3, 7)).astype(np.float64),
             "i64": RNG.integers(-9, 9, (4, 6)).astype(np.int64),
             "i32": RNG.integers(-9, 9, (1, 8)).astype(np.int32),
             "big": RNG.standard_normal((3000, 24)).astype(np.float32),
             "k1": np.array([4, 0, 4], np.int64), "k2": np.array([[6, 1], [0, 2]], np.int64),
             "k3": np.array([5], np.int64), "k4": np.array([7, 3, 0, 1], np.int64),
             "k5": np.array([23, 0, 11, 5, 17], np.int64)}
    feeds["f32"][1, 4] = np.nan
    pairs = [("f32", "k1"), ("f64", "k2"), ("i64", "k3"), ("i32", "k4"), ("big", "k5")]
    types = {"f32": 1, "f64": 11, "i64": 7, "i32": 6, "big": 1}
    nodes = [helper.make_node("ArrayFeatureExtractor", [x, k], [f"z{i}"], domain="ai.onnx.ml")
             for i, (x, k) in enumerate(pairs)]
    model = _ml_model(nodes, feeds, [(f"z{i}", types[x]) for i, (x, _) in enumerate(pairs)])
    want = oracle(model, feeds)
    for threads in (1, 2):
        compiled = smelt.compile(model, threads=threads)
        assert compiled.fallback_nodes == []
        for i, (g, w) in enumerate(zip(compiled.run(feeds), want, strict=True)):
            assert_close(f"z{i} (threads={threads})", g, w)
        bad = dict(feeds, k3=np.array([6], np.int64))  # past the last feature: refused
        with pytest.raises(Exception):  # noqa: B017 - smelt's run-time failure, whatever its class
            compiled.run(bad)
        compiled.close()


def _random_trees(n_trees: int, depth: int, features: int, targets: int, dtype) -> dict:
    """TreeEnsemble-5 attributes of random full trees (nodes in depth-first order, so the
    membership sets read in node order are the trees' own): every mode, NaN directions,
    a one-leaf tree."""
    from onnx import numpy_helper

    nodes = {k: [] for k in ("feat", "mode", "split", "miss", "tid", "fid", "tleaf", "fleaf")}
    leaves_t, leaves_w, members, roots = [], [], [], []

    def leaf() -> int:
        leaves_t.append(int(RNG.integers(0, targets)))
        leaves_w.append(float(RNG.standard_normal()))
        return len(leaves_t) - 1

    def make(d: int) -> tuple[int, int]:
        if d == 0:
            return leaf(), 1
        k = len(nodes["feat"])
        mode = int(RNG.integers(0, 7))
        for key, v in (("feat", int(RNG.integers(0, features))), ("mode", mode),
                       ("split", float(RNG.integers(0, 5)) if mode in (4, 5, 6) else float(RNG.uniform(0, 4))),
                       ("miss", int(RNG.integers(0, 2))), ("tid", 0), ("fid", 0), ("tleaf", 0), ("fleaf", 0)):
            nodes[key].append(v)
        if mode == 6:
            members.extend([float(v) for v in RNG.choice(5, size=int(RNG.integers(1, 4)), replace=False)] + [np.nan])
        nodes["tid"][k], nodes["tleaf"][k] = make(d - 1)
        nodes["fid"][k], nodes["fleaf"][k] = make(d - 1)
        return k, 0

    for _ in range(n_trees):
        roots.append(make(int(RNG.integers(1, depth + 1)))[0])
    one = leaf()  # a one-leaf tree: a root whose two ways are the same leaf
    roots.append(len(nodes["feat"]))
    for key, v in (("feat", 0), ("mode", 0), ("split", 0.0), ("miss", 0), ("tid", one), ("fid", one),
                   ("tleaf", 1), ("fleaf", 1)):
        nodes[key].append(v)
    attrs = dict(leaf_targetids=leaves_t, leaf_weights=numpy_helper.from_array(np.asarray(leaves_w, dtype)),
                 n_targets=targets, nodes_featureids=nodes["feat"],
                 nodes_modes=numpy_helper.from_array(np.asarray(nodes["mode"], np.uint8)),
                 nodes_splits=numpy_helper.from_array(np.asarray(nodes["split"], dtype)),
                 nodes_missing_value_tracks_true=nodes["miss"], nodes_truenodeids=nodes["tid"],
                 nodes_falsenodeids=nodes["fid"], nodes_trueleafs=nodes["tleaf"], nodes_falseleafs=nodes["fleaf"],
                 tree_roots=roots)
    if members:
        attrs["membership_values"] = numpy_helper.from_array(np.asarray(members, dtype))
    return attrs


@pytest.mark.parametrize("isa", ISAS)
def test_tree_ensemble(isa, monkeypatch, cache):
    """TreeEnsemble-5 (templates/ml_ops.py) against onnxruntime: random ensembles of every
    branch mode (set membership included), NaN features with both directions, every
    aggregate, float32 and float64, one row and rows split over threads."""
    from node_cases import assert_close, oracle
    from onnx import helper

    force_isa(isa, monkeypatch, cache)
    feeds, nodes, outs = {}, [], []
    for i, (dtype, rows, agg) in enumerate([(np.float32, 1, 1), (np.float32, 37, 0), (np.float64, 29, 1),
                                            (np.float32, 23, 2), (np.float64, 17, 3), (np.float32, 2000, 1)]):
        x = RNG.integers(0, 5, (rows, 4)).astype(dtype)
        cont = RNG.random(x.shape) < 0.5  # half the features continuous, half on the splits' grid
        x[cont] = RNG.uniform(0, 4, int(cont.sum())).astype(dtype)
        x[RNG.random(x.shape) < 0.1] = np.nan
        feeds[f"x{i}"] = x
        attrs = _random_trees(7, 5, 4, 3, dtype)
        nodes.append(helper.make_node("TreeEnsemble", [f"x{i}"], [f"y{i}"], domain="ai.onnx.ml",
                                      aggregate_function=agg, **attrs))
        outs.append((f"y{i}", helper.np_dtype_to_tensor_dtype(np.dtype(dtype))))
    model = _ml_model(nodes, feeds, outs)
    model.opset_import[1].version = 5
    model.opset_import[0].version = 21
    model.ir_version = 10
    want = oracle(model, feeds)
    for threads in (1, 2):
        compiled = smelt.compile(model, threads=threads)
        assert compiled.fallback_nodes == [], compiled.fallback_report
        for i, (g, w) in enumerate(zip(compiled.run(feeds), want, strict=True)):
            assert_close(f"y{i} (threads={threads})", g, w)
        compiled.close()


@pytest.mark.parametrize("isa", ISAS)
def test_conv_float16(isa, monkeypatch, cache):
    """float16 Conv (passes/half_conv.py: a float Conv between Casts, onnxruntime's own way on
    x86): 1-D to 3-D, groups and depthwise, pads, strides, dilations, auto_pad, with and
    without bias, weights constant and fed at run time, NaN/Inf in X. Float sums in another
    order may land a rounding on the other side of a float16 tie: at most one unit in the last
    place, in few elements."""
    from node_cases import build_model, oracle

    force_isa(isa, monkeypatch, cache)
    cases, feeds = Cases(), {}

    def conv(x: str, w: tuple, bias: bool = False, const: bool = False, **attrs) -> None:
        k = len(cases.nodes)
        wv = (RNG.standard_normal(w) * 0.3).astype(np.float16)
        bv = RNG.standard_normal(w[0]).astype(np.float16) if bias else None
        if const:
            cases.add("Conv", [x], (wv, bv) if bias else (wv,), **attrs)
            return
        feeds[f"w{k}"] = wv
        ins = [x, f"w{k}"]
        if bias:
            feeds[f"b{k}"] = bv
            ins.append(f"b{k}")
        cases.add("Conv", ins, **attrs)

    conv("x", (5, 6, 3, 3), bias=True, pads=[1, 1, 1, 1])
    conv("x", (4, 6, 3, 3), const=True, strides=[2, 2], pads=[1, 0, 2, 1])
    conv("x", (6, 2, 2, 3), bias=True, const=True, group=3, dilations=[2, 1])
    conv("x", (6, 1, 3, 3), group=6, auto_pad="SAME_UPPER")  # depthwise
    conv("x", (3, 6, 1, 1), bias=True)
    conv("v", (4, 3, 5), bias=True, pads=[2, 2])  # 1-D, as the causal conv's expansion
    conv("u", (2, 2, 2, 3, 2), const=True, pads=[1, 0, 1, 0, 1, 1])  # 3-D
    x = RNG.standard_normal((2, 6, 7, 9)).astype(np.float16)
    x[0, 1, 2, 3], x[1, 4, 0, 6] = np.nan, np.inf
    feeds.update(x=x, v=RNG.standard_normal((2, 3, 17)).astype(np.float16),
                 u=RNG.standard_normal((1, 2, 3, 4, 5)).astype(np.float16))
    model = build_model(cases, feeds, opset=17)
    want = oracle(model, feeds)
    for threads in (1, 2):
        compiled = smelt.compile(model, threads=threads)
        assert compiled.fallback_nodes == [], compiled.fallback_report
        for name, g, w in zip(cases.outputs, compiled.run(feeds), want, strict=True):
            assert g.dtype == w.dtype == np.float16 and g.shape == w.shape, name
            same = (g.view(np.int16) == w.view(np.int16)) | (np.isnan(g) & np.isnan(w))
            ulps = np.abs(g.view(np.int16).astype(np.int64) - w.view(np.int16).astype(np.int64))
            assert np.all(same | (ulps <= 1)) and same.mean() >= 0.99, (name, threads, int((~same).sum()))
        compiled.close()
