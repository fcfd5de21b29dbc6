"""Ops the ONNX node suite ran through the fallback: inverse and hyperbolic trigonometry, Pow
with integer or mixed operand types; each against onnxruntime at every ISA this host runs, 1 and
2 threads (``node_cases.check``), over odd sizes, broadcasting, out-of-domain inputs, NaN, +-Inf."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_models import force_isa
from node_cases import Cases, build_model, check
from onnx import TensorProto, helper

import smelt

# node-suite ops at every ISA and thread count: the long suite (`pytest -m slow`, run by .ci/run);
# the node suite itself (tests/conformance) checks these ops against onnxruntime too
pytestmark = pytest.mark.slow

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


def _f(*shape: int, lo: float = -1.0, hi: float = 1.0) -> np.ndarray:
    return RNG.uniform(lo, hi, shape).astype(np.float32)


@pytest.mark.parametrize("isa", ISAS)
def test_causal_conv_with_state(isa, monkeypatch, cache):
    """Kernel 4 with and without bias, past state and SiLU; an input shorter than k - 1 (the
    present state reaches into the past); k = 1 (empty state); k = 3 with run-time weights;
    float16; SiLU of NaN, +-Inf, +-0 and large values (k = 1 passes them through the taps); and a
    large case split over threads."""
    force_isa(isa, monkeypatch, cache)
    cases = Cases()
    b, c, n, k = 2, 5, 7, 4
    w, bias, past = _f(c, 1, k), _f(c), _f(b, c, k - 1)
    cases.add("CausalConvWithState", ["x"], (w,), n_out=2)
    cases.add("CausalConvWithState", ["x"], (w, bias, past), n_out=2, activation="silu")
    cases.add("CausalConvWithState", ["x"], (w, None, past), n_out=2, activation="swish")
    cases.add("CausalConvWithState", ["short"], (w, bias, past), n_out=2)
    cases.add("CausalConvWithState", ["short"], (w,), n_out=2, activation="silu")
    cases.add("CausalConvWithState", ["x"], (_f(c, 1, 1), bias), n_out=2)
    cases.add("CausalConvWithState", ["x", "w3", "b3", "p3"], n_out=2)
    cases.add("CausalConvWithState", ["xh"], (w.astype(np.float16), bias.astype(np.float16),
                                              past.astype(np.float16)), n_out=2, activation="silu")
    cases.add("CausalConvWithState", ["big"], (_f(64, 1, k), _f(64)), n_out=2, activation="silu")
    cases.add("CausalConvWithState", ["sp"], (np.ones((1, 1, 1), np.float32),), n_out=2, activation="silu")
    feeds = {"sp": np.concatenate([SPECIALS, -SPECIALS, _f(11) * 30]).reshape(1, 1, -1),"x": _f(b, c, n, lo=-3, hi=3), "short": _f(b, c, 2), "w3": _f(c, 1, 3), "b3": _f(c),
             "p3": _f(b, c, 2), "xh": _f(b, c, n).astype(np.float16), "big": _f(2, 64, 301, lo=-4, hi=4)}
    check(cases, feeds, opset=27)


def _linear_attention_feeds(b: int, t: int, hq: int, hkv: int, dk: int, dv: int, tag: str) -> dict:
    k = _f(b, t, hkv, dk)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)  # the delta rules expect L2-normalized keys
    return {f"q{tag}": _f(b, t, hq * dk), f"k{tag}": k.reshape(b, t, hkv * dk).astype(np.float32),
            f"v{tag}": _f(b, t, hkv * dv), f"p{tag}": _f(b, hkv, dk, dv),
            f"gk{tag}": _f(b, t, hkv * dk, lo=-0.5, hi=0.0), f"gh{tag}": _f(b, t, hkv, lo=-0.5, hi=0.0),
            f"bh{tag}": _f(b, t, hkv, lo=0.0, hi=1.0), f"b1{tag}": _f(b, t, 1, lo=0.0, hi=1.0)}


@pytest.mark.parametrize("isa", ISAS)
def test_linear_attention(isa, monkeypatch, cache):
    """Every update rule with and without past state, per-key and per-head decay, per-head and
    shared beta, GQA (4 query heads on 2 KV heads) and MQA, an explicit scale, odd head sizes
    (d_k 5, d_v 7: ragged vector tails), decode (T = 1), float16, and a case large enough to
    split over threads."""
    force_isa(isa, monkeypatch, cache)
    cases = Cases()
    feeds = {}
    for tag, dims in (("a", (2, 9, 2, 2, 5, 7)), ("g", (1, 6, 4, 2, 8, 16)), ("m", (2, 3, 3, 1, 4, 9)),
                      ("d", (2, 1, 2, 2, 6, 6)), ("L", (2, 48, 4, 4, 16, 24))):
        b, t, hq, hkv, dk, dv = dims
        feeds.update(_linear_attention_feeds(*dims, tag))
        heads = {"q_num_heads": hq, "kv_num_heads": hkv}
        q, k, v, p = (f"{n}{tag}" for n in "qkvp")
        cases.add("LinearAttention", [q, k, v], n_out=2, update_rule="linear", **heads)
        cases.add("LinearAttention", [q, k, v, p], n_out=2, update_rule="linear", scale=0.3, **heads)
        cases.add("LinearAttention", [q, k, v, p, f"gk{tag}"], n_out=2, update_rule="gated", **heads)
        cases.add("LinearAttention", [q, k, v, "", f"gh{tag}"], n_out=2, update_rule="gated", **heads)
        cases.add("LinearAttention", [q, k, v, p, "", f"bh{tag}"], n_out=2, update_rule="delta", **heads)
        cases.add("LinearAttention", [q, k, v, p, f"gh{tag}", f"b1{tag}"], n_out=2, **heads)
        cases.add("LinearAttention", [q, k, v, "", f"gk{tag}", f"bh{tag}"], n_out=2, **heads)
    h = {n: feeds[f"{n}a"].astype(np.float16) for n in ("q", "k", "v", "gk", "bh")}
    feeds.update({f"{n}h": x for n, x in h.items()})
    cases.add("LinearAttention", ["qh", "kh", "vh", "", "gkh", "bhh"], n_out=2, q_num_heads=2, kv_num_heads=2)
    check(cases, feeds, opset=27)


EINSUMS = [  # (equation, operand shapes)
    ("bij,bjk->bik", [(3, 5, 7), (3, 7, 9)]),
    ("...ii->...i", [(2, 3, 5, 5)]),
    ("i,i", [(13,), (13,)]),
    ("ij->i", [(5, 17)]),
    ("ij->ji", [(7, 9)]),
    ("->", [()]),
    ("ij,jk", [(4, 6), (6, 5)]),                          # implicit output: ik
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (1, 5, 4, 3)]),  # broadcast batch dims
    ("ii", [(6, 6)]),                                     # trace
    ("ijk->", [(3, 4, 5)]),
    ("ij,jk,kl->il", [(3, 4), (4, 5), (5, 2)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 5, 8), (2, 3, 6, 8)]),
    ("i,j->ij", [(5,), (3,)]),
    ("b i j, b j k -> b i k", [(4, 64, 48), (4, 48, 40)]),  # spaces; large enough to split
]


@pytest.mark.parametrize("isa", ISAS)
def test_einsum(isa, monkeypatch, cache):
    """Explicit and implicit equations: batched and plain contractions, diagonals and traces,
    ``...`` broadcasting, full and partial sums, transposes, outer products, three operands, a
    scalar; float32, float64 and int32."""
    force_isa(isa, monkeypatch, cache)
    cases, feeds = Cases(), {}
    for k, (eq, shapes) in enumerate(EINSUMS):
        names = []
        for j, s in enumerate(shapes):
            feeds[f"e{k}_{j}"] = RNG.uniform(-1, 1, s).astype(np.float32)
            names.append(f"e{k}_{j}")
        cases.add("Einsum", names, equation=eq)
    feeds["d0"], feeds["d1"] = RNG.uniform(-1, 1, (3, 4, 5)), RNG.uniform(-1, 1, (3, 5, 2))
    cases.add("Einsum", ["d0", "d1"], equation="bij,bjk->bik")
    feeds["n0"], feeds["n1"] = (RNG.integers(-50, 50, (4, 7)).astype(np.int32),
                                RNG.integers(-50, 50, (7, 3)).astype(np.int32))
    cases.add("Einsum", ["n0", "n1"], equation="ij,jk->ki")
    check(cases, feeds, opset=12)


CAST_VALUES = np.array([0.4, -0.6, 1.5, 2.5, -1.5, 127.9, 128.5, 255.9, 256.5, 300.7, -1.2, -128.9, -129.5, 65535.9,
                        65536.5, -32769.0, 2.1e9, 3e9, 4.4e9, -3e9, 1e19, 2e19, -1e19, np.inf, -np.inf, np.nan, -0.0,
                        -2147483648.0, 2147483520.0, 9.2e18, -9.3e18])


@pytest.mark.parametrize("isa", ISAS)
def test_cast_float_to_int(isa, monkeypatch, cache):
    """float16/float32/float64 to int8/uint8/int16/uint16/int32/int64 (Cast and CastLike) over
    in-range, halfway, out-of-range, +-Inf and NaN values at shuffled positions (onnxruntime
    converts its vector body and scalar tail alike for these types), ragged and large lengths."""
    force_isa(isa, monkeypatch, cache)
    cases = Cases()
    to = {"int8": TensorProto.INT8, "uint8": TensorProto.UINT8, "int16": TensorProto.INT16,
          "uint16": TensorProto.UINT16, "int32": TensorProto.INT32, "int64": TensorProto.INT64}
    x = np.concatenate([RNG.permutation(CAST_VALUES) for _ in range(40)] + [RNG.uniform(-300, 300, 7)])
    feeds = {"x32": x.astype(np.float32), "x64": x, "x16": np.clip(x, -6e4, 6e4).astype(np.float16),
             "big": RNG.uniform(-3e4, 3e4, 40003).astype(np.float32)}
    for src in ("x32", "x64", "x16"):
        for name, code in to.items():
            cases.add("Cast", [src], to=code)
            if src == "x32":
                cases.add("CastLike", [src], (np.zeros(1, name),))
    cases.add("Cast", ["big"], to=TensorProto.INT16)
    with np.errstate(invalid="ignore"):
        check(cases, feeds, opset=17)


def test_dropout_with_run_time_ratio_and_mode():
    """Dropout's ratio and training_mode given as graph inputs are specialized per value
    (frontend/value_guards.py): not training, or training at ratio 0, is a native copy with an
    all-true mask; training at a nonzero ratio stays random (the fallback), with its output
    consistent with its mask."""
    node = helper.make_node("Dropout", ["x", "r", "t"], ["y", "mask"], seed=0)
    model = helper.make_model(helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4, 5]),
         helper.make_tensor_value_info("r", TensorProto.FLOAT, []),
         helper.make_tensor_value_info("t", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("mask", TensorProto.BOOL, None)]),
        opset_imports=[helper.make_opsetid("", 22)])
    x = _f(3, 4, 5)
    for threads in (1, 2):
        cm = smelt.compile(model, threads=threads)
        for ratio, training in ((0.0, True), (0.5, False), (0.0, False)):
            y, mask = cm.run({"x": x, "r": np.array(ratio, np.float32), "t": np.array(training)})
            np.testing.assert_array_equal(y, x)
            assert mask.dtype == bool and mask.all()
            assert cm.fallback_nodes == [], cm.fallback_report
        y, mask = cm.run({"x": x, "r": np.array(0.5, np.float32), "t": np.array(True)})
        np.testing.assert_allclose(y, np.where(mask, x * 2, 0), rtol=1e-6)
        assert [f["op"] for f in cm.fallback_report] == ["Dropout"]
        cm.close()


@pytest.mark.parametrize("isa", ISAS)
def test_batchnorm_training_mode(isa, monkeypatch, cache):
    """training_mode=1: batch statistics per channel over 2-D, 4-D and 5-D inputs (odd sizes) with
    the running-statistics outputs (onnx requires all three in training), a non-default momentum
    and epsilon, float64, and a large input split over threads by channel."""
    force_isa(isa, monkeypatch, cache)
    cases, feeds = Cases(), {}

    def params(c: int, dt=np.float32) -> tuple:
        return (_f(c).astype(dt), _f(c).astype(dt), _f(c).astype(dt), _f(c, lo=0.5, hi=2).astype(dt))

    for k, shape in enumerate([(2, 3, 4, 5), (5, 7), (1, 3, 2, 5, 3), (4, 32, 33, 31)]):
        feeds[f"b{k}"] = _f(*shape, lo=-2, hi=3)
        cases.add("BatchNormalization", [f"b{k}"], params(shape[1]), n_out=3, training_mode=1)
    cases.add("BatchNormalization", ["b0"], params(3), n_out=3, training_mode=1, momentum=0.7, epsilon=0.01)
    feeds["bd"] = RNG.uniform(-2, 2, (3, 4, 6))
    cases.add("BatchNormalization", ["bd"], params(4, np.float64), n_out=3, training_mode=1)
    check(cases, feeds, opset=15)


@pytest.mark.parametrize("isa", ISAS)
def test_det(isa, monkeypatch, cache):
    """Det of 1x1 to 7x7 matrices, batched in one and two leading dims, a matrix with a zero
    column and a rank-deficient one (determinant 0 up to rounding), float64, and a batch large
    enough to split over threads."""
    force_isa(isa, monkeypatch, cache)
    cases, feeds = Cases(), {}
    for k, shape in enumerate([(2, 2), (3, 3), (4, 4), (1, 1), (7, 7), (2, 3, 6, 6), (3, 2, 2), (200, 8, 8)]):
        feeds[f"m{k}"] = _f(*shape, lo=-2, hi=2)
        cases.add("Det", [f"m{k}"])
    z = _f(3, 5, 5)
    z[0, :, 2] = 0.0
    z[1, 4] = z[1, 0] * 2 - z[1, 3]
    z[2] = np.eye(5, dtype=np.float32)[[1, 0, 2, 4, 3]]  # a permutation: det +1, two swaps
    feeds["z"] = z
    cases.add("Det", ["z"])
    check(cases, feeds, opset=11)
    cases = Cases()  # onnxruntime has no float64 Det: against onnx.reference (numpy's LU)
    cases.add("Det", ["d"])
    check(cases, {"d": RNG.uniform(-1, 1, (4, 5, 5))}, opset=11, kind="reference")


MATMUL_EINSUMS = [  # contractions with a batched-MatMul form, large enough to take it
    ("bhqd,bhkd->bhqk", [(2, 3, 33, 16), (2, 3, 40, 16)]),
    ("bsd,df->bsf", [(2, 17, 64), (64, 48)]),
    ("ij,kj->ki", [(37, 50), (29, 50)]),         # output transposed
    ("abc,cbd->da", [(19, 7, 11), (11, 7, 23)]),  # two contracted labels, output transposed
    ("bij,bjk", [(4, 64, 48), (4, 48, 40)]),     # implicit output
]


@pytest.mark.parametrize("isa", ISAS)
def test_einsum_contractions_run_as_matmul(isa, monkeypatch, cache):
    """float32 contractions with a batched-MatMul form run as Transpose/Reshape + MatMul (the
    GEMM), not the loop nest: the compiled nodes hold a MatMul per such Einsum and no Einsum."""
    force_isa(isa, monkeypatch, cache)
    cases, feeds = Cases(), {}
    for k, (eq, shapes) in enumerate(MATMUL_EINSUMS):
        for j, s in enumerate(shapes):
            feeds[f"g{k}_{j}"] = RNG.uniform(-1, 1, s).astype(np.float32)
        cases.add("Einsum", [f"g{k}_{j}" for j in range(len(shapes))], equation=eq)
    check(cases, feeds, opset=12)
    ops = [op for _, op in smelt.compile(build_model(cases, feeds, 12)).native_nodes]
    assert "Einsum" not in ops and ops.count("MatMul") == len(MATMUL_EINSUMS), ops


@pytest.mark.parametrize("isa", ISAS)
def test_inverse_trig_accuracy(isa, monkeypatch, cache):
    """The vector Asin/Acos/Atan (kernels/vtrig.py; libm at the portable ISA) within 3 ulp of
    float64 over a dense grid of their domains, atan also over [1e-30, 1e30] (onnxruntime's own
    are within 4.3 ulp on the same grid)."""
    force_isa(isa, monkeypatch, cache)
    unit = np.linspace(-1, 1, 400_001, dtype=np.float32)
    wide = np.concatenate([np.linspace(-10, 10, 200_001, dtype=np.float32), np.geomspace(1e-30, 1e30, 20_001,
                                                                                        dtype=np.float32)])
    wide = np.concatenate([wide, -wide])
    for op, x, ref in (("Asin", unit, np.arcsin), ("Acos", unit, np.arccos), ("Atan", wide, np.arctan)):
        model = helper.make_model(helper.make_graph(
            [helper.make_node(op, ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [len(x)])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]), opset_imports=[helper.make_opsetid("", 17)])
        cm = smelt.compile(model, threads=2)
        assert cm.fallback_nodes == []
        want = ref(x.astype(np.float64))
        ulps = np.abs(cm.run({"x": x})[0] - want) / np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
        assert ulps.max() <= 3.0, (op, float(ulps.max()), float(x[ulps.argmax()]))
        cm.close()


def test_compress_with_a_constant_condition():
    """A constant condition (the output shape known at compile time) runs natively, as a Gather
    (passes/compress_gather.py): every axis, a negative one, no axis (flattened), a condition
    shorter than the axis, int64 data, a large input split over threads; a run-time condition
    stays with the fallback."""
    cases, feeds = Cases(), {}
    feeds["x"] = _f(4, 5, 6)
    feeds["big"] = _f(64, 40, 33)
    feeds["n"] = RNG.integers(-9, 9, (7, 3)).astype(np.int64)
    for axis in (0, 1, 2, -1, None):
        dim = 120 if axis is None else feeds["x"].shape[axis]
        cond = RNG.integers(0, 2, dim).astype(bool)
        cond[0] = True
        cases.add("Compress", ["x"], (cond,), **({} if axis is None else {"axis": axis}))
    cases.add("Compress", ["x"], (np.array([False, True, True]),), axis=1)  # shorter than the axis
    cases.add("Compress", ["n"], (np.array([1, 0, 1, 1, 0, 0, 1], bool),), axis=0)
    cases.add("Compress", ["big"], (RNG.integers(0, 2, 40).astype(bool),), axis=1)
    check(cases, feeds, opset=11)
    cases = Cases()
    cases.add("Compress", ["x", "c"], axis=1)
    check(cases, {"x": _f(4, 5, 6), "c": np.array([1, 0, 1, 1, 0], bool)}, opset=11, fallback=("Compress_0",))
