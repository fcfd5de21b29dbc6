"""Cast from floating point to integers runs natively (ddddocr-old's 21 float -> int32 Casts used the
fallback): in range it truncates toward zero; out of range, NaN and ±Inf give what onnxruntime gives
on x86 (INT32_MIN / INT64_MIN; the low bits of the 32-bit conversion for 8/16-bit targets). Every
element bit-exact against onnxruntime, at every ISA, 1 and 2 threads, vector bodies and tails."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import make_model, ort_run, tensor
from kernel_models import force_isa
from onnx import TensorProto, helper

import smelt

EDGES = [0.0, -0.0, 1.9, -1.9, 2.5, -2.5, 0.49999997, -0.5, 127.9, 128.0, -128.9, -129.0, 255.9, 256.0, 300.7,
         -300.7, 32767.9, 32768.0, -32769.0, 65535.5, 65536.5, 16777217.0, 2147483520.0, 2147483648.0,
         -2147483648.0, -2147483904.0, 4294967296.0, 9.2233715e18, 9.223372e18, -9.223372e18, -9.2233725e18,
         1e30, -1e30, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45]
TARGETS = {"int8": TensorProto.INT8, "uint8": TensorProto.UINT8, "int16": TensorProto.INT16,
           "uint16": TensorProto.UINT16, "int32": TensorProto.INT32, "int64": TensorProto.INT64}
SOURCES = {"float32": TensorProto.FLOAT, "float64": TensorProto.DOUBLE, "float16": TensorProto.FLOAT16}


def _values(dtype: str, n: int) -> np.ndarray:
    """The edge values (as the source type holds them), then random ones across every target's
    range and beyond, ``n`` in all (an odd count: vector body and tail)."""
    rng = np.random.default_rng(7)
    edges = np.array(EDGES, np.float64)
    rand = rng.uniform(-1, 1, n - len(edges)) * 10.0 ** rng.integers(0, 20, n - len(edges))
    with np.errstate(over="ignore"):
        return np.concatenate([edges, rand]).astype(dtype)


def _model(src: str, n: int):
    nodes = [helper.make_node("Cast", ["x"], [f"y_{d}"], to=t, name=f"cast_{d}") for d, t in TARGETS.items()]
    outs = [tensor(f"y_{d}", None, t) for d, t in TARGETS.items()]
    return make_model(nodes, [tensor("x", [n], SOURCES[src])], outs)


@pytest.mark.parametrize("isa", ["native", "avx2", "scalar"])
@pytest.mark.parametrize("src", list(SOURCES))
def test_float_to_int_matches_onnxruntime(isa, src, monkeypatch, tmp_path):
    force_isa(isa, monkeypatch, tmp_path)
    n = 1027
    model, x = _model(src, n), _values(src, n)
    want = ort_run(model, {"x": x})
    for threads in (1, 2):
        cm = smelt.compile(model, threads=threads)
        assert cm.fallback_nodes == []
        for d, got, w in zip(TARGETS, cm.run({"x": x}), want, strict=True):
            assert got.dtype == w.dtype
            bad = np.flatnonzero(got != w)
            assert bad.size == 0, f"{src} -> {d} ({isa}, {threads} threads): x={x[bad[:5]]} got {got[bad[:5]]} want {w[bad[:5]]}"
        cm.close()


def test_unsigned_wide_targets_stay_on_the_fallback(monkeypatch, tmp_path):
    """float -> uint32/uint64: onnxruntime's out-of-range results follow no one rule, so the
    fallback (onnxruntime's own kernel) keeps answering them."""
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    nodes = [helper.make_node("Cast", ["x"], ["a"], to=TensorProto.UINT32, name="u32"),
             helper.make_node("Cast", ["x"], ["b"], to=TensorProto.UINT64, name="u64")]
    model = make_model(nodes, [tensor("x", [8])], [tensor("a", None, TensorProto.UINT32), tensor("b", None, TensorProto.UINT64)])
    x = np.array([0, 1.5, 7, 100.9, 3e9, 65536, 2, 9], np.float32)
    cm = smelt.compile(model, threads=1)
    for got, want in zip(cm.run({"x": x}), ort_run(model, {"x": x}), strict=True):
        np.testing.assert_array_equal(got, want)
    assert sorted(cm.fallback_nodes) == ["u32", "u64"]
