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
    check(cases, feeds, opset=21)


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
