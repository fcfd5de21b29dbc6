"""Trilu, EyeLike, Dropout (off), BitCast, CumSum/CumProd, ScatterElements/ScatterND against
onnxruntime: every attribute, edge shapes (empty, single row, ragged), duplicate and negative
indices, at 1 and 2 threads and at every ISA the host runs."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_models import force_isa
from node_cases import Cases, build_model, check

import smelt

ort = pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(20261126)
ISAS = ("native", "avx2", "scalar")


def _r(*shape, dt="float32") -> np.ndarray:
    if np.dtype(dt).kind == "f":
        return np.asarray(RNG.standard_normal(shape)).astype(dt)
    return np.asarray(RNG.integers(-50, 50, shape)).astype(dt)


@pytest.mark.parametrize("isa", ISAS)
def test_trilu_eyelike_dropout(isa, monkeypatch, tmp_path) -> None:
    force_isa(isa, monkeypatch, tmp_path)
    cases = Cases()
    feeds = {"x": _r(2, 3, 5, 7), "xb": RNG.random((4, 9)) < 0.5, "xi": _r(130, 300, dt="int64"),
             "x1": _r(1, 6), "e": _r(0, 4), "sq": _r(6, 6, dt="int32"),
             "kn": np.array(-2, np.int64), "kp": np.array(3, np.int64), "kbig": np.array(1 << 62, np.int64)}
    for k in ("kn", "kp", "kbig"):  # k known at run time
        for upper in (0, 1):
            cases.add("Trilu", ["x", k], upper=upper)
    for x in ("x", "xb", "xi", "x1", "e", "sq"):
        for upper in (0, 1):
            cases.add("Trilu", [x], upper=upper)
            for k in (-100, -3, -1, 0, 2, 5, 100):
                cases.add("Trilu", [x], (np.array(k, np.int64),), upper=upper)
    for k in (-7, -2, 0, 1, 3, 9):
        cases.add("EyeLike", ["sq"], k=k)
        cases.add("EyeLike", ["x1"], k=k, dtype=1)
    cases.add("EyeLike", ["xi"], dtype=7)
    cases.add("Dropout", ["x"], n_out=2)
    cases.add("Dropout", ["x"], (np.array(0.3, np.float32), np.array(False)), n_out=2)
    cases.add("Dropout", ["x"], (np.array(0.0, np.float32), np.array(True)), n_out=2)
    cases.add("Dropout", ["e"], n_out=2)
    check(cases, feeds, opset=21)  # onnxruntime has no EyeLike-22


@pytest.mark.parametrize("isa", ISAS)
def test_cumulative(isa, monkeypatch, tmp_path) -> None:
    force_isa(isa, monkeypatch, tmp_path)
    cases = Cases()
    feeds = {"x": _r(3, 4, 300), "d": _r(5, 7, dt="float64"), "i": _r(6, 40, dt="int32"),
             "l": _r(2, 9, 3, dt="int64"),
             "v": _r(1000), "big": _r(40, 1000), "e": _r(3, 0, 2)}
    for op in ("CumSum", "CumProd"):
        for x in feeds:
            rank = feeds[x].ndim
            for axis in range(-rank, rank):
                for exclusive in (0, 1):
                    for reverse in (0, 1):
                        if (axis + exclusive + 2 * reverse) % 2 and x in ("big", "e"):
                            continue
                        src = x
                        cases.add(op, [src], (np.array(axis, np.int64 if axis % 2 else np.int32),),
                                  exclusive=exclusive, reverse=reverse)
    # the axis known only at run time
    feeds.update({"a1": np.array(1, np.int32), "an": np.array(-1, np.int64), "a0": np.array([0], np.int64)})
    for op in ("CumSum", "CumProd"):
        for a in ("a1", "an", "a0"):
            cases.add(op, ["x", a], exclusive=1)
            cases.add(op, ["d", a], reverse=1)
    # products of many normal values under/overflow to 0/inf equally on both sides
    check(cases, feeds, opset=26)


@pytest.mark.parametrize("isa", ISAS)
def test_scatter(isa, monkeypatch, tmp_path) -> None:
    force_isa(isa, monkeypatch, tmp_path)
    cases = Cases()
    data = _r(4, 5, 6)
    feeds = {"data": data, "di": _r(4, 5, 6, dt="int64"), "d2": _r(3, 3)}
    # ScatterElements: indices with duplicates and negatives along each axis
    for axis in (0, 1, 2, -1):
        ax = axis % 3
        shp = [3, 4, 5]
        idx = RNG.integers(-data.shape[ax], data.shape[ax], shp)
        upd = _r(*shp)
        for red in ("none", "add", "mul", "max", "min"):
            for d, u in (("data", upd), ("di", upd.astype(np.int64) * 7)):
                if red == "none" and d == "data":  # duplicates: last write wins, like onnxruntime
                    pass
                cases.add("ScatterElements", [d], (idx, u), axis=axis, reduction=red)
    cases.add("ScatterElements", ["d2"], (np.array([[1, 0, 2], [0, 2, 1]], np.int32), _r(2, 3)))
    # ScatterND: element, row and slab indices
    for q in (1, 2, 3):
        idx = np.stack([RNG.integers(-data.shape[k], data.shape[k], (2, 3)) for k in range(q)], axis=-1)
        ushape = [2, 3] + list(data.shape[q:])
        for red in ("none", "add", "mul", "max", "min"):
            if red == "none":  # onnxruntime's result with duplicate indices is unspecified
                idx_u = np.stack([np.arange(6).reshape(2, 3) % data.shape[k] for k in range(q)], axis=-1)
                if q == 1:
                    idx_u = np.arange(4)[:, None][:4].reshape(2, 2, 1)
                    cases.add("ScatterND", ["data"], (idx_u, _r(2, 2, 5, 6)))
                    continue
                cases.add("ScatterND", ["data"], (idx_u[:1, :3] if q > 1 else idx_u, _r(1, 3, *data.shape[q:])))
                continue
            cases.add("ScatterND", ["data"], (idx, _r(*ushape)), reduction=red)
            cases.add("ScatterND", ["di"], (idx, (_r(*ushape) * 5).astype(np.int64)), reduction=red)
    check(cases, feeds, opset=18)


def test_bitcast_and_scatter_out_of_range() -> None:
    cases = Cases()
    x = np.array([1.5, -2.0, np.nan, 0.0], np.float32)
    cases.add("BitCast", ["x"], to=6)
    cases.add("BitCast", ["i"], to=1)
    model = build_model(cases, {"x": x, "i": x.view(np.int32)}, 26)
    compiled = smelt.compile(model, threads=2)
    assert compiled.fallback_nodes == []
    a, b = compiled.run({"x": x, "i": x.view(np.int32)})
    np.testing.assert_array_equal(a, x.view(np.int32))
    np.testing.assert_array_equal(b.view(np.int32), x.view(np.int32))
    cases = Cases()
    cases.add("ScatterElements", ["d", "j", "u"], axis=1)
    cases.add("ScatterND", ["d", "k", "v"])
    feeds = {"d": _r(2, 3), "j": np.array([[0, 1]], np.int64), "u": _r(1, 2),
             "k": np.array([[1]], np.int64), "v": _r(1, 3)}
    compiled = smelt.compile(build_model(cases, feeds, 18), threads=1)
    assert compiled.fallback_nodes == []
    compiled.run(feeds)
    for bad in ({"j": np.array([[0, 3]], np.int64)}, {"k": np.array([[-3]], np.int64)}):
        with pytest.raises(smelt.SmeltError, match="out of range|failed"):
            compiled.run({**feeds, **bad})


@pytest.mark.parametrize("isa", ISAS)
def test_topk(isa, monkeypatch, tmp_path) -> None:
    force_isa(isa, monkeypatch, tmp_path)
    cases = Cases()
    feeds = {"x": _r(3, 40, 7), "d": _r(6, 33, dt="float64"), "i": _r(5, 64, dt="int32"),
             "ties": np.asarray(RNG.integers(0, 4, (4, 50))).astype(np.float32), "l": _r(2, 3000, dt="int64")}
    for x, shape in ((k, v.shape) for k, v in feeds.items()):
        for axis in range(-len(shape), len(shape)):
            n = shape[axis]
            for k in sorted({0, 1, 3, n // 2, n} & set(range(n + 1))):
                for largest in (0, 1):
                    cases.add("TopK", [x], (np.array([k], np.int64),), n_out=2, axis=axis, largest=largest)
    check(cases, feeds, opset=11)


def test_cumsum_runtime_axis_out_of_range_fails() -> None:
    cases = Cases()
    cases.add("CumSum", ["x", "a"])
    feeds = {"x": _r(3, 4), "a": np.array(1, np.int64)}
    compiled = smelt.compile(build_model(cases, feeds, 14), threads=2)
    np.testing.assert_allclose(compiled.run(feeds)[0], np.cumsum(feeds["x"], axis=1), rtol=1e-6)
    assert compiled.fallback_nodes == []  # after the call: the axis input is a value guard
    with pytest.raises(smelt.SmeltError, match="out of range|failed"):
        compiled.run({**feeds, "a": np.array(2, np.int64)})


@pytest.mark.parametrize("opset", [13, 28])
@pytest.mark.parametrize("isa", ISAS)
def test_onehot_gathernd_reverse_sequence(isa, opset, monkeypatch, tmp_path) -> None:
    force_isa(isa, monkeypatch, tmp_path)
    cases = Cases()
    feeds = {"i": np.asarray(RNG.integers(-12, 12, (3, 5))).astype(np.int64),
             "f": np.array([[0.0, 1.7, -2.2, 9.9], [np.nan, np.inf, -10.0, 3.0]], np.float32),
             "i32": np.asarray(RNG.integers(-6, 6, (7,))).astype(np.int32),
             "data": _r(4, 5, 6), "hd": _r(3, 4, 5).astype(np.float16),
             "seq": _r(6, 4, 3), "seqb": _r(4, 6, 2, 2, dt="int32"),
             "lens": np.array([6, 1, 0, 3], np.int64)}
    for axis in (-1, 0, 1, -2):
        cases.add("OneHot", ["i"], (np.array(10, np.int64), np.array([0, 1], np.int64)), axis=axis)
        cases.add("OneHot", ["f"], (np.array(10.0, np.float32), np.array([-1.5, 2.5], np.float32)), axis=axis)
    cases.add("OneHot", ["i32"], (np.array(5, np.int32), np.array([3.0, 7.0], np.float32)))
    for q in (1, 2, 3):
        idx = np.stack([RNG.integers(-(4, 5, 6)[k], (4, 5, 6)[k], (2, 7)) for k in range(q)], axis=-1)
        cases.add("GatherND", ["data"], (idx.astype(np.int64),))
    bidx = np.stack([RNG.integers(-5, 5, (4, 3)), RNG.integers(0, 6, (4, 3))], axis=-1)
    cases.add("GatherND", ["data"], (bidx[..., :1].astype(np.int64),), batch_dims=1)
    cases.add("GatherND", ["data"], (bidx.astype(np.int64),), batch_dims=1)
    cases.add("GatherND", ["hd"], (np.array([[1, 2], [0, -1]], np.int64),))
    cases.add("ReverseSequence", ["seq", "lens"], time_axis=0, batch_axis=1)
    cases.add("ReverseSequence", ["seqb", "lens"], time_axis=1, batch_axis=0)
    check(cases, feeds, opset=opset)
