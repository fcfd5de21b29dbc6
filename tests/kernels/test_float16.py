"""float16 held natively (a uint16_t in C): movement ops move its bits; Cast to and from float16
and element-wise ops convert through float and round to nearest-even, as onnxruntime. Compared
bit for bit with onnxruntime (the conversion is exact integer C), at 1 and 2 threads and every
ISA the host runs."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_models import force_isa
from node_cases import Cases, build_model, oracle

import smelt

ort = pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(20261127)
ISAS = ("native", "avx2", "scalar")


def _halves() -> np.ndarray:
    """Every finite and special float16 bit pattern worth testing, plus random ones."""
    bits = np.concatenate([np.arange(0, 1 << 16, 37, dtype=np.uint32),
                           [0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x0400, 0x7bff, 0xfbff, 0x7c00, 0xfc00, 0x7e00]])
    return bits.astype(np.uint16).view(np.float16)


def _floats() -> np.ndarray:
    """float32 values around every float16 rounding boundary: ties, subnormals, overflow."""
    h = _halves()
    h = h[np.isfinite(h)].astype(np.float32)
    mid = (h[:-1] + np.diff(h) / 2).astype(np.float32)
    extra = np.array([65504, 65519.99, 65520, 65536, 1e10, -1e10, 2.0 ** -25, 2.0 ** -24 * 1.5, 2.0 ** -26,
                      np.inf, -np.inf, np.nan, -0.0, 5.96e-8, 6.1e-5], np.float32)
    return np.concatenate([h, mid, np.nextafter(mid, np.float32(np.inf)), extra]).astype(np.float32)


# libm and onnxruntime's own float16 approximations may differ in the last float16 bit here
APPROXIMATE = ("Exp", "Sigmoid", "Tanh", "Pow")


def _check_bits(model, feeds, threads_list=(1, 2)) -> None:
    want = oracle(model, feeds)
    for threads in threads_list:
        compiled = smelt.compile(model, threads=threads)
        assert compiled.fallback_nodes == [], compiled.fallback_report
        got = compiled.run(feeds)
        for k, (g, w) in enumerate(zip(got, want, strict=True)):
            assert g.dtype == w.dtype and g.shape == w.shape, (k, g.dtype, w.dtype, g.shape, w.shape)
            if model.graph.node[k].op_type in APPROXIMATE:
                np.testing.assert_allclose(g.astype(np.float32), w.astype(np.float32), rtol=2e-3, atol=3e-7)  # a few subnormal units
            elif w.dtype == np.float16:  # bit-identical, any NaN for NaN (onnxruntime's Where gives +0 for -0)
                same = (g.view(np.uint16) == w.view(np.uint16)) | (np.isnan(g) & np.isnan(w)) | ((g == 0) & (w == 0))
                assert same.all(), (k, model.graph.node[k].op_type, g[~same][:5], w[~same][:5])
            else:
                np.testing.assert_array_equal(g, w, err_msg=str(k))
        compiled.close()


@pytest.mark.parametrize("isa", ISAS)
def test_cast_float16(isa, monkeypatch, tmp_path) -> None:
    force_isa(isa, monkeypatch, tmp_path)
    cases = Cases()
    f = _floats()
    feeds = {"f": f, "d": f.astype(np.float64) * (1 + 1e-9), "h": _halves()}
    cases.add("Cast", ["f"], to=10)
    cases.add("Cast", ["d"], to=10)
    for to in (1, 11, 10, 9):
        cases.add("Cast", ["h"], to=to)
    cases.add("CastLike", ["f", "h"])
    cases.add("CastLike", ["h", "d"])
    _check_bits(build_model(cases, feeds, 21), feeds)


@pytest.mark.parametrize("isa", ISAS)
def test_float16_elementwise_and_movement(isa, monkeypatch, tmp_path) -> None:
    force_isa(isa, monkeypatch, tmp_path)
    cases = Cases()
    a = (RNG.standard_normal((3, 4, 50)) * 30).astype(np.float16)
    b = (RNG.standard_normal((4, 50)) * 3).astype(np.float16)
    c = RNG.standard_normal((1, 50)).astype(np.float16)
    a.reshape(-1)[:6] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 65504]
    feeds = {"a": a, "b": b, "c": c, "m": RNG.random((4, 50)) < 0.5, "h": _halves()}
    for op in ("Add", "Sub", "Mul", "Div", "Max", "Min", "Equal", "Less", "Greater", "Pow"):
        cases.add(op, ["a", "b"])
    cases.add("Mod", ["a", "b"], fmod=1)
    for op in ("Relu", "Neg", "Abs", "Exp", "Sqrt", "Sigmoid", "Tanh", "Floor", "IsNaN", "IsInf"):
        cases.add(op, ["h"])
    for op in ("Max", "Min", "Sum"):
        cases.add(op, ["a", "b", "c"])
    cases.add("Where", ["m", "a", "b"])
    cases.add("Transpose", ["a"], perm=[2, 0, 1])
    cases.add("Reshape", ["a"], (np.array([12, 50], np.int64),))
    cases.add("Unsqueeze", ["b"], (np.array([0], np.int64),))
    cases.add("Concat", ["a", "a"], axis=1)
    cases.add("Expand", ["c"], (np.array([2, 3, 50], np.int64),))
    cases.add("Slice", ["a"], (np.array([1], np.int64), np.array([40], np.int64), np.array([2], np.int64)))
    cases.add("Gather", ["a"], (np.array([2, 0], np.int64),), axis=1)
    cases.add("Trilu", ["b"])
    cases.add("Pad", ["b"], (np.array([1, 2, 0, 3], np.int64), np.array(-2.5, np.float16)))
    cases.add("Pad", ["b"], (np.array([0, 1, 2, 0], np.int64),), mode="reflect")
    cases.add("Pad", ["b"], (np.array([2, 0, 0, 1], np.int64),))
    _check_bits(build_model(cases, feeds, 20), feeds)


@pytest.mark.parametrize("isa", ISAS)
def test_float16_reduce_max_min(isa, monkeypatch, tmp_path) -> None:
    """ReduceMax / ReduceMin of float16: exact."""
    force_isa(isa, monkeypatch, tmp_path)
    cases = Cases()
    x = (RNG.standard_normal((2, 3, 5, 40)) * 4).astype(np.float16)
    x[0, 0, 0, :3] = [np.nan, -np.inf, 65504]
    # (a NaN past the first element: onnxruntime's vector min/max keep or drop it by SIMD lane)
    feeds = {"x": x}
    for op in ("ReduceMax", "ReduceMin"):
        for axes in ([-1], [1, 3], [0], [0, 1, 2, 3], None):
            for keepdims in (0, 1):
                cases.add(op, ["x"], () if axes is None else (np.array(axes, np.int64),), keepdims=keepdims)
    model = build_model(cases, feeds, 18)
    want = oracle(model, feeds)
    for threads in (1, 2):
        compiled = smelt.compile(model, threads=threads)
        assert compiled.fallback_nodes == [], compiled.fallback_report
        for k, (g, w) in enumerate(zip(compiled.run(feeds), want, strict=True)):
            assert g.shape == w.shape and g.dtype == w.dtype
            np.testing.assert_array_equal(g, w, err_msg=str(k))  # exact, NaN where onnxruntime has NaN
        compiled.close()
