"""ConvTranspose (templates/conv_transpose.py) against onnxruntime: 1-D to 3-D, groups, strides
below/at/above the kernel, dilations, asymmetric pads, output_padding, bias or none, odd channel
counts, NaN/Inf in the data; every ISA the host runs, 1 and 2 threads."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_models import force_isa
from node_cases import Cases, check

RNG = np.random.default_rng(7)
ISAS = ["native", "avx2", "scalar"]


def _w(*shape: int) -> np.ndarray:
    return (RNG.standard_normal(shape) * 0.3).astype(np.float32)


@pytest.mark.parametrize("isa", ISAS)
def test_conv_transpose_2d(isa, monkeypatch, cache):
    force_isa(isa, monkeypatch, cache)
    c = 6
    cases = Cases()
    cases.add("ConvTranspose", ["x"], (_w(c, 5, 2, 2),), strides=[2, 2])  # the U-Net / FPN upsample
    cases.add("ConvTranspose", ["x"], (_w(c, 4, 2, 2), _w(4)), strides=[2, 2])
    cases.add("ConvTranspose", ["x"], (_w(c, 3, 3, 3), _w(3)), strides=[2, 2], pads=[1, 1, 1, 1],
              output_padding=[1, 1])
    cases.add("ConvTranspose", ["x"], (_w(c, 7, 3, 3),), pads=[1, 0, 2, 1])  # stride 1, asymmetric pads
    cases.add("ConvTranspose", ["x"], (_w(c, 2, 3, 2),), strides=[3, 1], dilations=[2, 3])
    cases.add("ConvTranspose", ["x"], (_w(c, 1, 4, 4), _w(6)), strides=[2, 2], pads=[1, 1, 1, 1], group=6)
    cases.add("ConvTranspose", ["x"], (_w(c, 3, 3, 3),), strides=[2, 2], group=2, auto_pad="VALID")
    cases.add("ConvTranspose", ["x"], (_w(c, 2, 1, 1),), strides=[4, 4], pads=[0, 0, 1, 1])  # gaps in y
    x = RNG.standard_normal((2, c, 5, 7)).astype(np.float32)
    x[0, 1, 2, 3], x[1, 4, 0, 6] = np.nan, np.inf
    check(cases, {"x": x}, opset=17)


@pytest.mark.parametrize("isa", ["native", "scalar"])
def test_conv_transpose_1d_and_3d(isa, monkeypatch, cache):
    force_isa(isa, monkeypatch, cache)
    cases = Cases()
    cases.add("ConvTranspose", ["v"], (_w(3, 4, 5), _w(4)), strides=[2], pads=[2, 1], output_padding=[1])
    cases.add("ConvTranspose", ["v"], (_w(3, 3, 2),), strides=[2])
    cases.add("ConvTranspose", ["u"], (_w(2, 3, 2, 2, 2), _w(3)), strides=[2, 2, 2])
    cases.add("ConvTranspose", ["u"], (_w(2, 1, 3, 1, 3),), pads=[1, 0, 1, 1, 0, 1], dilations=[1, 1, 2])
    check(cases, {"v": RNG.standard_normal((1, 3, 9)).astype(np.float32),
                  "u": RNG.standard_normal((1, 2, 3, 4, 5)).astype(np.float32)}, opset=17)


@pytest.mark.parametrize("isa", ["native", "scalar"])
def test_output_shape_and_same_padding(isa, monkeypatch, cache):
    """Pads derived from output_shape and SAME_UPPER/SAME_LOWER, odd totals included (onnx.reference
    fails output_shape: onnxruntime is the only oracle)."""
    force_isa(isa, monkeypatch, cache)
    cases = Cases()
    cases.add("ConvTranspose", ["x"], (_w(2, 2, 3, 3),), strides=[2, 2], output_shape=[10, 10])
    cases.add("ConvTranspose", ["x"], (_w(2, 2, 3, 3),), strides=[2, 2], output_shape=[9, 12])
    cases.add("ConvTranspose", ["x"], (_w(2, 2, 3, 3), _w(2)), strides=[2, 2], auto_pad="SAME_UPPER")
    cases.add("ConvTranspose", ["x"], (_w(2, 2, 4, 3),), strides=[2, 3], auto_pad="SAME_LOWER")
    cases.add("ConvTranspose", ["x"], (_w(2, 2, 3, 2),), strides=[2, 1], auto_pad="SAME_LOWER")  # odd totals
    cases.add("ConvTranspose", ["x"], (_w(2, 2, 3, 2),), strides=[2, 1], auto_pad="SAME_UPPER")
    check(cases, {"x": RNG.standard_normal((1, 2, 5, 5)).astype(np.float32)}, opset=17)
