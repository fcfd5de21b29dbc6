"""Ops the ONNX node suite ran through the fallback: inverse and hyperbolic trigonometry, Pow
with integer or mixed operand types; each against onnxruntime at every ISA this host runs, 1 and
2 threads (``node_cases.check``), over odd sizes, broadcasting, out-of-domain inputs, NaN, +-Inf."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_models import force_isa
from node_cases import Cases, check

ISAS = ["native", "avx2", "scalar"]
RNG = np.random.default_rng(20261126)
NAN, INF = np.float32(np.nan), np.float32(np.inf)
SPECIALS = np.array([NAN, INF, -INF, 0.0, -0.0, 1.0, -1.0, 1e-30, -1e-30, 89.0, -89.0, 100.0], np.float32)


@pytest.mark.parametrize("isa", ISAS)
def test_trigonometric(isa, monkeypatch, cache):
    """Acos/Asin/Atan/Acosh/Asinh/Atanh/Sinh/Cosh on [-3, 3] (outside every bounded domain too,
    where onnxruntime gives NaN), the specials (atanh(+-1) = +-Inf, cosh(100) = Inf, signed
    zeros), a ragged 1-D length and a 3-D shape, and one large input split across threads."""
    force_isa(isa, monkeypatch, cache)
    cases = Cases()
    for op in ("Acos", "Asin", "Atan", "Acosh", "Asinh", "Atanh", "Sinh", "Cosh"):
        for x in ("x", "s", "big"):
            cases.add(op, [x])
    feeds = {"x": RNG.uniform(-3, 3, (3, 5, 7)).astype(np.float32),
             "s": np.concatenate([SPECIALS, RNG.uniform(-1.2, 1.2, 21).astype(np.float32)]),
             "big": RNG.uniform(-1.5, 4, (70001,)).astype(np.float32)}
    check(cases, feeds, opset=17)


def _pow_feeds() -> dict:
    ints = RNG.integers(-6, 7, (4, 1, 9))
    return {
        "xi32": ints.astype(np.int32), "xi64": (ints * 7).astype(np.int64),
        "ei32": RNG.integers(-2, 6, (5, 9)).astype(np.int32), "ei64": RNG.integers(0, 9, (9,)).astype(np.int64),
        "xf": RNG.uniform(-3, 3, (4, 5, 9)).astype(np.float32), "xd": RNG.uniform(0.1, 3, (5, 9)),
        "ef": RNG.uniform(-2, 3, (5, 9)).astype(np.float32), "ed": RNG.uniform(-2, 2, (9,)),
        "two": np.array(2, np.int32), "three": np.array([3], np.int64), "five": np.array(5, np.int64),
        "big": np.array([46341, 65536, -65536, 3, 2_000_000_000], np.int32),
        "zero": np.array([0, 0, 2, -2, 1], np.int32), "neg": np.array([-1, -2, -1, -3, 0], np.int32),
    }


@pytest.mark.parametrize("isa", ISAS)
def test_pow_mixed_types(isa, monkeypatch, cache):
    """Every (base, exponent) pair of float32/float64/int32/int64 onnxruntime runs except the
    equal-float ones, broadcasting both ways; the single-exponent 2 and 3 path (multiplications in
    the base type, integers wrapping), negative exponents of integers (truncated; 0^-1 overflows
    to the type's minimum as in onnxruntime), results beyond int32, NaN (negative base, fractional exponent) into an integer."""
    force_isa(isa, monkeypatch, cache)
    cases = Cases()
    for x in ("xi32", "xi64", "xf", "xd"):
        for e in ("ei32", "ei64", "ef", "ed"):
            if x[1:] in ("f", "d") and x[1:] == e[1:]:
                continue
            cases.add("Pow", [x, e])
    for x in ("xi32", "xi64", "xf"):
        for e in ("two", "three", "five"):
            cases.add("Pow", [x, e])
    cases.add("Pow", ["big", "two"])  # wraps in int32, as onnxruntime's x * x
    cases.add("Pow", ["big", "five"])  # beyond int32 in double: the type's minimum
    cases.add("Pow", ["zero", "neg"])  # 0^-1 = Inf and 0^-2 as integers; 2^-1 truncates to 0
    check(cases, _pow_feeds(), opset=15)
