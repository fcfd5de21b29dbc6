"""Native ConvInteger and QLinearConv against onnxruntime: equal, not close.

Every ISA the host runs, 1 and 2 threads; strides, pads, dilations, groups (depthwise too), odd
channel counts, 1x1 and 5x5 kernels, batch 2, zero points at the ends of the range and per output
channel, requantization with bias and per-channel scales saturating both ways.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_models import AVX_VNNI, force_isa
from node_cases import Cases, check

pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(20261128)
ISAS = ["native", "avx2", AVX_VNNI, "scalar"]
f32 = np.float32


def _q(dtype, *shape) -> np.ndarray:
    info = np.iinfo(dtype)
    return RNG.integers(info.min, int(info.max) + 1, shape).astype(dtype)


GEOMETRIES = [  # (C, OC, k, stride, pad, dilation, group)
    (3, 8, 3, 1, 1, 1, 1), (5, 7, 3, 2, 1, 1, 1), (4, 6, 1, 1, 0, 1, 1), (6, 9, 5, 1, 2, 1, 3),
    (8, 8, 3, 1, 1, 1, 8), (3, 20, 3, 2, 0, 2, 1), (16, 33, 3, 1, 1, 1, 1),
]


@pytest.mark.parametrize("isa", ISAS)
def test_conv_integer(isa: str, monkeypatch, cache) -> None:
    force_isa(isa, monkeypatch, cache)
    cases = Cases()
    feeds = {}
    for c, oc, k, s, p, d, grp in GEOMETRIES:
        x = f"x{c}"
        feeds.setdefault(x, _q(np.uint8, 2, c, 11, 9))
        w = _q(np.int8, oc, c // grp, k, k)
        attrs = dict(kernel_shape=[k, k], strides=[s, s], pads=[p, p, p, p], dilations=[d, d], group=grp)
        cases.add("ConvInteger", [x], consts=(w, np.uint8(128), np.int8(-3)), **attrs)
        cases.add("ConvInteger", [x], consts=(w,), **attrs)
        cases.add("ConvInteger", [x], consts=(w, np.uint8(255), np.int8(127)), **attrs)
        # uint8 weights, asymmetric (what older quantize_dynamic writes): on VNNI hosts int8
        # bytes W - 128 and a receptive-field sum times the offset (kernels/int_gemm.py)
        wu = _q(np.uint8, oc, c // grp, k, k)
        cases.add("ConvInteger", [x], consts=(wu, np.uint8(121), np.uint8(178)), **attrs)
        cases.add("ConvInteger", [x], consts=(wu, np.uint8(0), np.uint8(255)), **attrs)
        cases.add("ConvInteger", [x], consts=(wu,), **attrs)
    check(cases, feeds, opset=21)


@pytest.mark.parametrize("isa", ["native", AVX_VNNI])
def test_uint8_weights_take_the_quad_form_on_vnni(isa: str, monkeypatch, cache) -> None:
    """ddddocr's uint8 ConvInteger/MatMulInteger ran as int16 pairs at half the VNNI rate; the
    compile-time shift to int8 bytes puts them on vpdpbusd. Per-output-channel zero points of a
    grouped conv (checked against the int64 definition: onnxruntime takes a scalar only)."""
    from node_cases import build_model

    import smelt

    target = force_isa(isa, monkeypatch, cache)
    if not ({"avx512_vnni", "avx_vnni"} & set(target.flags)):
        pytest.skip("no VNNI at this ISA")
    x, wu, wz = _q(np.uint8, 1, 6, 9, 7), _q(np.uint8, 10, 3, 3, 3), _q(np.uint8, 10)
    cases = Cases()
    cases.add("ConvInteger", ["x"], consts=(wu, np.uint8(119), wz), kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=2)
    b = _q(np.uint8, 40, 70)
    cases.add("MatMulInteger", ["a"], consts=(b, np.uint8(3), np.uint8(119)))
    feeds = {"x": x, "a": _q(np.uint8, 5, 40)}
    model = build_model(cases, feeds, opset=21)
    xs = np.pad(x.astype(np.int64) - 119, ((0, 0), (0, 0), (1, 1), (1, 1)))
    w = wu.astype(np.int64) - wz.astype(np.int64)[:, None, None, None]
    want = np.zeros((1, 10, 9, 7), np.int64)
    for o in range(10):
        gi = o // 5
        for dy in range(3):
            for dx in range(3):
                want[0, o] += np.einsum("chw,c->hw", xs[0, 3 * gi:3 * gi + 3, dy:dy + 9, dx:dx + 7], w[o, :, dy, dx])
    for threads in (1, 2):
        compiled = smelt.compile(model, threads=threads)
        forms = {i.op: i.schedule.get("micro_kernel", "") for i in compiled.plan.step_infos()
                 if i.op in ("ConvInteger", "MatMulInteger")}
        assert all("dpbusd" in f for f in forms.values()) and len(forms) == 2, forms
        got = compiled.run(feeds)
        np.testing.assert_array_equal(got[0], want.astype(np.int32))
        np.testing.assert_array_equal(got[1], (feeds["a"].astype(np.int64) - 3) @ (b.astype(np.int64) - 119))


@pytest.mark.parametrize("isa", ISAS)
def test_qlinear_conv(isa: str, monkeypatch, cache) -> None:
    force_isa(isa, monkeypatch, cache)
    cases = Cases()
    feeds = {"xu": _q(np.uint8, 1, 6, 10, 13), "xs": _q(np.int8, 2, 6, 7, 8)}
    for xname, xt in (("xu", np.uint8), ("xs", np.int8)):
        for c, oc, k, s, p, d, grp in [(6, 8, 3, 1, 1, 1, 1), (6, 10, 3, 2, 1, 1, 2), (6, 6, 3, 1, 1, 1, 6),
                                       (6, 17, 1, 1, 0, 1, 1)]:
            w = _q(np.int8, oc, c // grp, k, k)
            attrs = dict(kernel_shape=[k, k], strides=[s, s], pads=[p, p, p, p], dilations=[d, d], group=grp)
            bias = RNG.integers(-5000, 5000, oc).astype(np.int32)
            for y_scale in (f32(0.5), f32(40.0), f32(1e-3)):  # the last saturates nearly everything
                cases.add("QLinearConv", [xname], consts=(f32(0.02), xt(7), w, f32(0.01), np.int8(0), y_scale, xt(3),
                                                          bias), **attrs)
            per_channel = RNG.uniform(0.002, 0.03, oc).astype(f32)
            cases.add("QLinearConv", [xname], consts=(f32(0.05), xt(-2 if xt == np.int8 else 100), w, per_channel,
                                                      np.zeros(oc, np.int8), f32(0.7), xt(0)), **attrs)
    check(cases, feeds, opset=21)
