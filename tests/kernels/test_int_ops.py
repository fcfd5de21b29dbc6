"""Integer and bitwise element-wise templates, Mod, the variadic Sum/Mean/Max/Min, against
onnxruntime: every integer dtype, broadcasting, empty and ragged shapes, edge values (INT_MIN,
-1, shift counts out of range), at 1 and 2 threads and at every ISA the host runs (the C is
scalar, but gcc vectorizes it differently per ISA)."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_models import force_isa
from node_cases import Cases, build_model, check

import smelt

ort = pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(20261125)
INTS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
ORT_MAX_INTS = ("int32", "int64", "uint32", "uint64")  # onnxruntime's Max/Min kernels
ISAS = ("native", "avx2", "scalar")
SHAPES = [((3, 1, 37), (4, 37)), ((2, 0, 5), (5,)), ((1,), (6, 7)), ((), ()), ((70, 1030), (1030,))]


def _ints(dt: str, shape: tuple, nonzero: bool = False) -> np.ndarray:
    info = np.iinfo(dt)
    x = RNG.integers(info.min, info.max, shape, dtype=dt, endpoint=True)
    small = RNG.integers(max(info.min, -9), 10, shape, dtype=dt, endpoint=True)
    x = np.where(RNG.random(shape) < 0.5, small, x).astype(dt)
    if x.size:  # the edges: the most negative value, -1, 0 and 1
        flat = x.reshape(-1)
        flat[: min(4, flat.size)] = np.array([info.min, -1 if info.min else 1, 0, 1], dtype=np.int64)[: min(4, flat.size)].astype(dt)
    if nonzero:
        x = np.where(x == 0, 3, x).astype(dt)
    return x


@pytest.mark.parametrize("isa", ISAS)
def test_int_div_mod_bitwise(isa, monkeypatch, tmp_path) -> None:
    force_isa(isa, monkeypatch, tmp_path)
    cases, feeds = Cases(), {}
    for dt in INTS:
        for k, (sa, sb) in enumerate(SHAPES):
            a, b = f"a_{dt}_{k}", f"b_{dt}_{k}"
            # INT_MIN / -1 is a SIGFPE in onnxruntime: tested against numpy below
            x = _ints(dt, sa)
            feeds[a], feeds[b] = np.where(x == np.iinfo(dt).min, -7, x).astype(dt), _ints(dt, sb, nonzero=True)
            for op in ("Div", "BitwiseAnd", "BitwiseOr", "BitwiseXor"):
                cases.add(op, [a, b])
            cases.add("Mod", [a, b], fmod=1)
            cases.add("Mod", [a, b], fmod=0)
            cases.add("BitwiseNot", [a])
            if dt in ORT_MAX_INTS:
                cases.add("Max", [a, b, a])
                cases.add("Min", [b])
    check(cases, feeds, opset=18)


@pytest.mark.parametrize("isa", ISAS)
def test_bitshift(isa, monkeypatch, tmp_path) -> None:
    """Counts in [-3, bits + 3): the out-of-range ones give 0 (or the sign fill to the right)."""
    force_isa(isa, monkeypatch, tmp_path)
    cases, feeds = Cases(), {}
    for dt in INTS:
        bits = 8 * np.dtype(dt).itemsize
        for k, (sa, sb) in enumerate(SHAPES):
            a, b = f"a_{dt}_{k}", f"b_{dt}_{k}"
            feeds[a] = _ints(dt, sa)
            feeds[b] = np.asarray(RNG.integers(-3 if dt.startswith("int") else 0, bits + 3, sb)).astype(dt)
            for d in ("LEFT", "RIGHT"):
                cases.add("BitShift", [a, b], direction=d)
    check(cases, feeds, opset=28)


@pytest.mark.parametrize("isa", ISAS)
def test_float_mod_and_variadic(isa, monkeypatch, tmp_path) -> None:
    force_isa(isa, monkeypatch, tmp_path)
    cases, feeds = Cases(), {}
    special = np.array([0.0, -0.0, 5.0, -5.0, 1e30, np.inf, -np.inf, np.nan, 4.0, -6.0, 7.5, -7.5])
    for dt in ("float32", "float64"):
        for k, (sa, sb) in enumerate(SHAPES):
            a, b, c = f"a_{dt}_{k}", f"b_{dt}_{k}", f"c_{dt}_{k}"
            feeds[a] = np.asarray(RNG.standard_normal(sa) * 10).astype(dt)
            feeds[b] = np.asarray(RNG.standard_normal(sb) * 3).astype(dt)
            feeds[c] = np.asarray(RNG.standard_normal(sb)).astype(dt)
            cases.add("Mod", [a, b], fmod=1)
            cases.add("Mod", [a, b], fmod=0)
            for op in ("Sum", "Mean", "Max", "Min"):
                if op == "Mean" and dt == "float64":
                    continue  # onnxruntime's Mean is float32 only
                cases.add(op, [a, b, c])
                cases.add(op, [c])
                cases.add(op, [c, a, b, a])
        sa, sb = f"sa_{dt}", f"sb_{dt}"
        feeds[sa] = np.repeat(special, len(special)).astype(dt)
        feeds[sb] = np.tile(special, len(special)).astype(dt)
        cases.add("Mod", [sa, sb], fmod=1)
        cases.add("Mod", [sa, sb], fmod=0)
        cases.add("Max", [sa, sb, sa])
        cases.add("Min", [sb, sa, sb])
    for dt in ORT_MAX_INTS:
        a, b = f"i_{dt}", f"j_{dt}"
        feeds[a], feeds[b] = _ints(dt, (4, 9)), _ints(dt, (9,))
        cases.add("Max", [a, b, b])
        cases.add("Min", [b, a])
        cases.add("Max", [a])
    check(cases, feeds, opset=28)


@pytest.mark.parametrize("op,fmod", [("Div", 0), ("Mod", 0), ("Mod", 1)])
@pytest.mark.parametrize("dt", ["int32", "uint8", "int64"])
def test_integer_division_by_zero_fails(op, fmod, dt) -> None:
    """onnxruntime fails the run ("Integer division by zero"); so does smelt, without a SIGFPE.
    INT_MIN / -1 (a SIGFPE in onnxruntime) wraps to INT_MIN and INT_MIN % -1 is 0, like numpy."""
    cases = Cases()
    cases.add(op, ["a", "b"], **({"fmod": fmod} if op == "Mod" else {}))
    a = np.array([7, 9, 5], dt)
    model = build_model(cases, {"a": a, "b": a}, 14)
    for threads in (1, 2):
        compiled = smelt.compile(model, threads=threads)
        assert compiled.fallback_nodes == []
        with pytest.raises(smelt.SmeltError, match="out of range|failed"):
            compiled.run({"a": a, "b": np.array([1, 0, 1], dt)})
        if dt != "uint8":
            lo = np.iinfo(dt).min
            got = compiled.run({"a": np.array([lo, lo, 6], dt), "b": np.array([-1, 1, -4], dt)})[0]
            want = {"Div": [lo, lo, -1], "Mod": [0, 0, -2 if fmod == 0 else 2]}[op]
            np.testing.assert_array_equal(got, np.array(want, dt))
        compiled.close()
