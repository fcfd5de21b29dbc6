"""Element-wise ops on their fast paths, against onnxruntime at every ISA the host runs, 1 and 2
threads: PRelu fused into the epilogue of the conv / GEMM before it (per-channel, scalar and
same-shape slopes) and standalone, NaN/Inf/-0 as onnxruntime; Pow by a constant 2 or 3 as
onnxruntime's products. PRelu follows every conv of face and detection CNNs (MTCNN, ArcFace);
unfused it was a branchy scalar loop (~9 ns an element with random signs)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import const, make_model, ort_run, tensor
from kernel_models import Chain, check_cases
from onnx import helper

ISAS = ["native", "avx2", "scalar"]


def _chains() -> list:
    C = Chain
    return [
        # plain-layout direct conv, ragged channels (oc 10: below and above 8 lanes)
        C("plain", (1, 3, 13, 17)).conv(10, (3, 3), post=("prelu",)).conv(16, (3, 3), pads=(1, 1, 1, 1),
                                                                         post=("prelu_scalar",)).case(),
        # 1x1 as GEMM, odd channels, a slope after the bias and before a residual-free tail
        C("pw", (1, 7, 9, 11)).conv(19, (1, 1), post=("prelu",)).conv(5, (1, 1), post=("prelu", "Relu")).case(),
        # strided, padded, the chain MTCNN's P-Net has (3 -> 10 -> 16 -> 32 with a pool)
        C("pnet", (1, 3, 24, 31)).conv(10, (3, 3), post=("prelu",))
        .pool("MaxPool", kernel_shape=[2, 2], strides=[2, 2]).conv(16, (3, 3), post=("prelu",))
        .conv(32, (3, 3), strides=(2, 2), pads=(1, 0, 1, 1), post=("prelu",)).conv(2, (1, 1)).case(),
    ]


def _fused(compiled, target) -> None:
    assert not any(op == "PRelu" for _, op in compiled.native_nodes), compiled.native_nodes
    eps = [i.epilogue for i in compiled.plan.step_infos() if i.part == 0]
    assert sum("PRelu" in e for e in eps) >= 6, eps


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("layout", ["nchw", "propagate"])
def test_prelu_fused_into_convs(isa, layout, monkeypatch, cache):
    check_cases(_chains(), isa, monkeypatch, cache, _fused, layout=layout)


@pytest.mark.parametrize("isa", ISAS)
def test_prelu_fused_into_gemm_and_matmul(isa, monkeypatch, cache):
    """Gemm's slope per column ([N]), MatMul's full-shape slope, and a slope fed as a graph input
    (no constant: stays a standalone PRelu, which the fuse pass does not need)."""
    from kernel_models import Case

    rng = np.random.default_rng(7)
    f = lambda *s: rng.uniform(-1, 1, s).astype(np.float32)  # noqa: E731
    nodes = [helper.make_node("Gemm", ["a", "w", "bias"], ["g"], transB=1),
             helper.make_node("PRelu", ["g", "sg"], ["yg"]),
             helper.make_node("MatMul", ["a", "w2"], ["m"]),
             helper.make_node("PRelu", ["m", "sm"], ["ym"]),
             helper.make_node("PRelu", ["a", "sx"], ["yx"])]
    inits = [const("w", f(37, 29)), const("bias", f(37)), const("sg", f(37)), const("w2", f(29, 23)),
             const("sm", f(5, 23))]
    feeds = {"a": f(5, 29), "sx": f(29)}
    case = Case("gemm", nodes, [tensor("a", [5, 29]), tensor("sx", [29])], inits, "yg", feeds)
    extra = [Case("mm", [], [], [], "ym", {}), Case("x", [], [], [], "yx", {})]

    def check(compiled, target):
        ops = [op for _, op in compiled.native_nodes]
        assert ops.count("PRelu") == 1, ops  # only the one with a graph-input slope

    check_cases([case, *extra], isa, monkeypatch, cache, check)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("threads", [1, 2])
def test_prelu_nan_inf_and_signed_zero_as_onnxruntime(isa, threads, monkeypatch, cache):
    """NaN stays NaN, -Inf * 0 slope is NaN, -0 stays -0, +Inf stays +Inf: fused after a conv
    (a 1x1 with an identity weight passes the specials through) and standalone, on a plane whose
    length is not a multiple of any vector width."""
    from kernel_models import _isa_target

    import smelt

    monkeypatch.setenv("SMELT_CACHE_DIR", str(cache))
    target = _isa_target(isa, monkeypatch)
    monkeypatch.setattr("smelt.compiler.detect", lambda: target)
    c, hw = 3, 37
    x = np.random.default_rng(1).uniform(-2, 2, (1, c, hw)).astype(np.float32)
    x[0, :, :6] = [np.nan, np.inf, -np.inf, -0.0, 0.0, -1e-30]
    slope = np.array([0.25, 0.0, -1.5], np.float32).reshape(1, c, 1)
    nodes = [helper.make_node("Conv", ["x", "eye"], ["cv"]), helper.make_node("PRelu", ["cv", "s"], ["y"]),
             helper.make_node("PRelu", ["x", "s"], ["z"])]
    model = make_model(nodes, [tensor("x", [1, c, hw])], [tensor("y", None), tensor("z", None)],
                       [const("eye", np.eye(c, dtype=np.float32).reshape(c, c, 1)), const("s", slope)])
    want = ort_run(model, {"x": x})
    got = smelt.compile(model, threads=threads).run({"x": x})
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
        np.testing.assert_array_equal(np.signbit(g), np.signbit(w))
        np.testing.assert_allclose(np.nan_to_num(g), np.nan_to_num(w), rtol=1e-6, atol=0)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("exponent", [2.0, 3.0, 2.5])
def test_pow_by_a_constant_scalar_equals_onnxruntime_bit_for_bit(isa, exponent, monkeypatch, cache):
    """Pow(x, 2) and Pow(x, 3) are x*x and x*x*x in onnxruntime (not powf): smelt takes the same
    products (a vectorized loop), bit for bit; other exponents stay powf (within 1 ulp). The
    melspectrogram front ends (openWakeWord) square the STFT this way."""
    from kernel_models import _isa_target

    import smelt

    monkeypatch.setenv("SMELT_CACHE_DIR", str(cache))
    target = _isa_target(isa, monkeypatch)
    monkeypatch.setattr("smelt.compiler.detect", lambda: target)
    x = np.random.default_rng(2).uniform(-30, 30, (3, 257)).astype(np.float32)
    x[0, :5] = [np.nan, np.inf, -np.inf, -0.0, 1e-30]
    model = make_model([helper.make_node("Pow", ["x", "e"], ["y"])], [tensor("x", [3, 257])], [tensor("y", None)],
                       [const("e", np.array([exponent], np.float32))])
    want = ort_run(model, {"x": x})[0]
    for threads in (1, 2):
        got = smelt.compile(model, threads=threads).run({"x": x})[0]
        if exponent in (2.0, 3.0):
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=2e-7)


_SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, 1e-39, 1.1754944e-38, 3e38, -3e38, 20.0, 20.0001, -20.0,
             88.7, 89.0, -104.0, -87.0, 0.70710677, 0.70710683, 1.0, -1.0, 1e-7, -1e-7]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("op", ["Log", "Exp", "Elu", "Selu", "Celu", "Softplus", "Mish"])
def test_branch_free_math_matches_onnxruntime(op, isa, monkeypatch, cache):
    """The float32 loops of these ops call the branch-free exp/log (kernels/rows.py) and softplus /
    mish (templates/elementwise.py), which gcc vectorizes: within 2 ulp of float64 math where
    the result is normal, NaN / Inf / signed zero where onnxruntime has them, over denormals,
    the range ends and every exponent; odd length, 1 and 2 threads."""
    from kernel_models import _isa_target

    import smelt

    monkeypatch.setenv("SMELT_CACHE_DIR", str(cache))
    target = _isa_target(isa, monkeypatch)
    monkeypatch.setattr("smelt.compiler.detect", lambda: target)
    rng = np.random.default_rng(5)
    wide = (rng.choice([-1, 1], 3000) * np.exp(rng.uniform(-100, 88, 3000))).astype(np.float32)
    x = np.concatenate([np.array(_SPECIALS, np.float32), wide, rng.uniform(-30, 30, 2000).astype(np.float32)])
    if op == "Log":
        x = np.abs(x)
        x[:3] = [np.nan, -1.0, -0.0]
    n = x.size
    model = make_model([helper.make_node(op, ["x"], ["y"])], [tensor("x", [n])], [tensor("y", None)], [], opset=18)
    want = ort_run(model, {"x": x})[0]
    exact = {"Log": np.log, "Exp": np.exp}.get(op)
    with np.errstate(all="ignore"):
        ref = exact(x.astype(np.float64)) if exact else want.astype(np.float64)
    for threads in (1, 2):
        got = smelt.compile(model, threads=threads).run({"x": x})[0]
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{op}: NaN positions")
        fin = np.isfinite(ref) & (np.abs(ref) >= 1.2e-38)
        np.testing.assert_array_equal(got[~np.isfinite(ref)], want[~np.isfinite(ref)])
        ulp = np.abs(got[fin].astype(np.float64) - ref[fin]) / np.spacing(np.abs(ref[fin]).astype(np.float32))
        # against float64 math: 2 ulp; against onnxruntime's own float approximations: 4 ulp and 1e-6
        limit = 2.0 if exact else 4.0
        bad = (ulp > limit) & ~(np.abs(got[fin] - want[fin]) <= 1e-6 * np.maximum(1.0, np.abs(want[fin])))
        assert not bad.any(), (op, x[fin][bad][:5], got[fin][bad][:5], want[fin][bad][:5], ulp[bad][:5])
