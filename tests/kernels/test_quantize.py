"""Native QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear against onnxruntime.

Integer outputs must be equal, not close: onnxruntime's rounding (x / scale, half to even), its
saturation and its NaN handling are part of the contract. Every ISA the host runs, 1 and 2
threads, per-tensor and per-axis (every axis, negative axis), ragged sizes, zero points absent
and at the ends of the range, NaN and infinities.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_models import force_isa
from node_cases import Cases, build_model, check, oracle

import smelt

pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(20261125)
ISAS = ["native", "avx2", "scalar"]
QTYPES = [np.int8, np.uint8, np.int16, np.uint16]


def _specials(n: int) -> np.ndarray:
    """``n`` values around quantization ties, far outside every range, NaN and infinities."""
    x = (RNG.integers(-4000, 4000, n) * 0.05).astype(np.float32)
    x[::17] = np.nan
    x[1::19] = np.inf
    x[2::23] = -np.inf
    x[3::29] = 1e30
    return x


@pytest.mark.parametrize("isa", ISAS)
def test_quantize_linear(isa: str, monkeypatch, cache) -> None:
    force_isa(isa, monkeypatch, cache)
    cases = Cases()
    for dt in QTYPES:
        info = np.iinfo(dt)
        for zp in (0, int(info.min), int(info.max), int(info.min) // 2 + int(info.max) // 2):
            cases.add("QuantizeLinear", ["t"], consts=(np.float32(0.1), dt(zp)))
        # per axis over every axis of a 4-D input, ragged channel counts
        for axis in (0, 1, 2, 3, -1):
            c = (3, 5, 7, 9)[axis]
            scale = RNG.uniform(0.01, 0.5, c).astype(np.float32)
            zps = RNG.integers(info.min, int(info.max) + 1, c).astype(dt)
            cases.add("QuantizeLinear", ["f"], consts=(scale, zps), axis=axis)
    cases.add("QuantizeLinear", ["t"], consts=(np.float32(0.02),))  # no zero point: uint8
    cases.add("QuantizeLinear", ["s"], consts=(np.float32(0.3), np.int8(-3)))  # a 0-d input
    feeds = {"t": _specials(1001), "f": (RNG.standard_normal((3, 5, 7, 9)) * 20).astype(np.float32),
             "s": np.array(2.75, np.float32)}
    check(cases, feeds, opset=21)


@pytest.mark.parametrize("isa", ISAS)
def test_dequantize_linear(isa: str, monkeypatch, cache) -> None:
    force_isa(isa, monkeypatch, cache)
    cases = Cases()
    feeds = {}
    for dt in QTYPES + [np.int32]:
        info = np.iinfo(dt)
        lo, hi = (int(info.min), int(info.max)) if dt != np.int32 else (-(1 << 24), 1 << 24)
        name = f"q_{np.dtype(dt).name}"
        feeds[name] = RNG.integers(lo, hi, (2, 6, 5, 3), endpoint=True).astype(dt)
        zp = dt(0) if dt == np.int32 else dt((lo + hi) // 2)
        cases.add("DequantizeLinear", [name], consts=(np.float32(0.037), zp))
        cases.add("DequantizeLinear", [name], consts=(np.float32(1.5),))
        if dt != np.int32:
            for axis in (0, 1, -2, 3):
                c = (2, 6, 5, 3)[axis]
                zps = RNG.integers(lo, hi, c, endpoint=True).astype(dt)
                cases.add("DequantizeLinear", [name], consts=(RNG.uniform(0.001, 2, c).astype(np.float32), zps),
                          axis=axis)
    check(cases, feeds, opset=21)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kind", ["mixed", "positive", "negative", "zeros", "ragged", "inf"])
def test_dynamic_quantize_linear(isa: str, kind: str, monkeypatch, cache) -> None:
    """Scale and zero point from the data's range (widened to 0), at sizes below and above the
    parallel split; all outputs equal onnxruntime's."""
    force_isa(isa, monkeypatch, cache)
    x = {"mixed": RNG.standard_normal((64, 33)) * 3, "positive": RNG.uniform(0.5, 9, (7, 300)),
         "negative": -RNG.uniform(0.5, 9, (300,)), "zeros": np.zeros((5, 5)),
         "ragged": RNG.standard_normal((3, 1, 4097)),
         # (NaN is not compared: onnxruntime's range over NaN depends on which vector lane the NaN
         # falls in, from maxps/minps operand order; smelt leaves NaN out of the range)
         "inf": np.array([np.inf, 1.0, -1.0, 0.5])}[kind].astype(np.float32)
    cases = Cases()
    cases.add("DynamicQuantizeLinear", ["x"], n_out=3)
    check(cases, {"x": x}, opset=11)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("threads", [1, 2])
def test_dynamic_quantize_linear_leaves_nan_out(isa: str, threads: int, monkeypatch, cache) -> None:
    """NaN, which onnxruntime is not compared on (above), by smelt's stated rule, in the vector
    body and the scalar tail of both passes: left out of the range, quantized to 0; values at
    the rounding ties of the scale the rest gives."""
    force_isa(isa, monkeypatch, cache)
    x = (RNG.integers(-2000, 2000, 4099) * 0.25).astype(np.float32)
    # the extremes, each followed in its vector lane (at 8 and 16 lanes) by a NaN: a lane's
    # minimum or maximum must survive it
    x[16], x[40] = -600, 700
    x[[0, 5, 17, 32, 56, 64, 2047, 4096, 4098]] = np.nan
    cases = Cases()
    cases.add("DynamicQuantizeLinear", ["x"], n_out=3)
    model = build_model(cases, {"x": x}, opset=11)
    q, scale, zero = smelt.compile(model, threads=threads).run({"x": x})
    finite = x[~np.isnan(x)]
    lo, hi = np.float32(min(finite.min(), 0)), np.float32(max(finite.max(), 0))
    want_scale = np.float32((hi - lo) / np.float32(255))
    want_zero = np.clip(np.rint(np.float32(0) - lo / want_scale), 0, 255)
    with np.errstate(invalid="ignore"):
        want = np.clip(np.rint(x / want_scale) + want_zero, 0, 255)
    want[np.isnan(x)] = 0
    assert scale == want_scale and zero == want_zero
    np.testing.assert_array_equal(q, want.astype(np.uint8))


def test_fallback_reasons_name_the_limit() -> None:
    """What stays on the fallback says why: blocked quantization, a 2-D scale, int4."""
    cases = Cases()
    cases.add("QuantizeLinear", ["x"], consts=(np.full((4, 2), 0.1, np.float32), np.zeros((4, 2), np.int8)),
              axis=1, block_size=4)
    feeds = {"x": RNG.standard_normal((4, 8)).astype(np.float32)}
    model = build_model(cases, feeds, opset=21)
    compiled = smelt.compile(model, threads=1)
    [report] = compiled.fallback_report
    assert "block_size" in report["reason"], report
    np.testing.assert_array_equal(compiled.run(feeds)[0], oracle(model, feeds)[0])


@pytest.mark.parametrize("isa", ISAS)
def test_saturation_counters_count_exactly(isa: str, monkeypatch, cache) -> None:
    """The kernels count the elements they clamp, low and high end apart, per output value;
    the counts equal numpy's on the same data at 1 and 2 threads, and reset to zero."""
    force_isa(isa, monkeypatch, cache)
    x = (RNG.standard_normal(5001) * 40).astype(np.float32)
    x[::97] = np.nan
    cases = Cases()
    out = cases.add("QuantizeLinear", ["x"], consts=(np.float32(0.25), np.int8(10)))[0]
    model = build_model(cases, {"x": x}, opset=21)
    v = np.rint(x / np.float32(0.25)) + 10
    want = (int(np.sum(~(v >= -128))), int(np.sum(v > 127)))
    assert want[0] > 100 and want[1] > 100
    for threads in (1, 2):
        compiled = smelt.compile(model, threads=threads, count_saturation=True)
        compiled.run({"x": x})
        compiled.run({"x": x})
        assert compiled.saturation_counts() == {out: (2 * want[0], 2 * want[1])}
        compiled.reset_saturation_counts()
        assert compiled.saturation_counts() == {out: (0, 0)}
        compiled.close()
    # a default build renders no counting (the requantization's counts are dead code) and says
    # so when asked for counts; its answer is the counting build's
    plain = smelt.compile(model, threads=2)
    assert not [c for step in plain.plan.steps for c in getattr(step, "counters", ())]
    with pytest.raises(smelt.SmeltError, match="count_saturation=True"):
        plain.saturation_counts()
    counting = smelt.compile(model, threads=2, count_saturation=True)
    assert [c for step in counting.plan.steps for c in getattr(step, "counters", ())]
    np.testing.assert_array_equal(plain.run({"x": x})[0], counting.run({"x": x})[0])


def _near_ties(scale: np.float32, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` floats at and around ``(k + 1/2) * scale`` (the quotient's rounding boundaries),
    up to 3 ulps either side, over k in the 8-bit codes and past them."""
    k = rng.integers(-300, 300, n).astype(np.float32)
    x = ((k + np.float32(0.5)) * scale).astype(np.float32)
    steps = rng.integers(-3, 4, n)
    for _ in range(3):
        x = np.where(steps > 0, np.nextafter(x, np.float32(np.inf)), x)
        x = np.where(steps < 0, np.nextafter(x, np.float32(-np.inf)), x)
        steps = steps - np.sign(steps)
    return x.astype(np.float32)


@pytest.mark.parametrize("isa", ISAS)
def test_quantize_linear_rounds_like_the_division_at_ties(isa: str, monkeypatch, cache) -> None:
    """The vector loop multiplies by 1/scale and divides only vectors with a lane near a rounding
    boundary (``int_gemm.quantize_run``): values at and a few ulps around every half-code, for
    scales whose reciprocal is inexact (1/255, 0.0371, 3e-5, 7e4), exact (2^-7), not normal
    (1e-39 is itself subnormal, 3e38's reciprocal is: the division throughout) and infinite, give the
    division's codes exactly, as onnxruntime's (which divides)."""
    force_isa(isa, monkeypatch, cache)
    rng = np.random.default_rng(20261128)
    cases, feeds = Cases(), {}
    for i, scale in enumerate((1 / 255, 0.0371, 3e-5, 7e4, 2 ** -7, 1e-39, 3e38, np.inf)):
        s = np.float32(scale)
        name = f"x{i}"
        feeds[name] = _near_ties(s if 1e-30 < s < 1e30 else np.float32(0.01), 4099, rng)
        for dt, zp in ((np.uint8, 3), (np.int8, -7)):
            cases.add("QuantizeLinear", [name], consts=(s, dt(zp)))
    check(cases, feeds, opset=21)
