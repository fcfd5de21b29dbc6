"""Run-time weights and sampling ops against onnxruntime: Conv and ConvTranspose whose weights are
graph inputs (templates/conv_runtime.py, conv_transpose.py), GridSample and AffineGrid
(templates/grid_sample.py), Resize's antialias / keep_aspect_ratio_policy / tf_crop_and_resize
(templates/resize.py). Edge shapes (ragged rows, odd channels, pads/strides/dilations, groups),
NaN/Inf in the data; every ISA the host runs, 1 and 2 threads (node_cases.check)."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_models import force_isa
from node_cases import Cases, check

# node-suite ops at every ISA and thread count: the long suite (`pytest -m slow`, run by .ci/run);
# the node suite itself (tests/conformance) checks these ops against onnxruntime too
pytestmark = pytest.mark.slow

RNG = np.random.default_rng(151)
ISAS = ["native", "avx2", "scalar"]


def _r(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


@pytest.mark.parametrize("path", ["gemm", "direct"])
@pytest.mark.parametrize("isa", ISAS)
def test_conv_runtime_weights(isa, path, monkeypatch, cache):
    """Both paths of templates/conv_runtime.py: im2col + GEMM (the default) and the direct
    kernel (taken when the im2col matrix would be too large: forced here by a zero limit)."""
    force_isa(isa, monkeypatch, cache)
    if path == "direct":
        monkeypatch.setattr("smelt.codegen.templates.conv_runtime.COL_LIMIT_BYTES", 0)
    cases, feeds = Cases(), {}

    def conv(x: str, w: tuple, bias: bool = False, **attrs) -> list[str]:
        k = len(feeds)
        feeds[f"w{k}"] = _r(*w, scale=0.3)
        ins = [x, f"w{k}"]
        if bias:
            feeds[f"b{k}"] = _r(w[0])
            ins.append(f"b{k}")
        return cases.add("Conv", ins, **attrs)

    conv("x", (5, 7, 3, 3), bias=True, pads=[1, 1, 1, 1])
    conv("x", (4, 7, 3, 3), strides=[2, 2], pads=[1, 0, 2, 1])  # asymmetric pads, stride 2
    conv("x", (3, 7, 2, 3), strides=[1, 3], dilations=[2, 2])
    conv("x", (3, 7, 3, 3), bias=True, strides=[2, 2], auto_pad="SAME_UPPER")
    conv("x", (2, 7, 2, 2), auto_pad="SAME_LOWER")
    conv("x", (7, 1, 3, 3), bias=True, group=7, pads=[1, 1, 1, 1])  # depthwise
    conv("y", (6, 2, 1, 3), group=3, pads=[0, 1, 0, 1])
    conv("x", (2, 7, 5, 7), pads=[2, 3, 2, 3])  # kernel as wide as the image
    conv("x", (9, 7, 1, 1), bias=True)  # 1x1: the image rows are the GEMM's B
    conv("y", (6, 3, 1, 1), group=2)
    conv("v", (4, 3, 5), bias=True, strides=[2], pads=[2, 1])  # 1-D
    conv("u", (3, 2, 2, 3, 2), bias=True, pads=[1, 0, 1, 0, 1, 1], strides=[1, 2, 1])  # 3-D
    # a fused epilogue: Conv -> Add(per-channel) -> Relu, the conv's own output not a graph output
    k = len(feeds)
    feeds[f"w{k}"] = _r(4, 7, 3, 3, scale=0.3)
    (c_out,) = cases.add("Conv", ["x", f"w{k}"], pads=[1, 1, 1, 1])
    (a_out,) = cases.add("Add", [c_out], (_r(4, 1, 1),))
    cases.add("Relu", [a_out])
    cases.outputs.remove(c_out)
    cases.outputs.remove(a_out)
    # weights computed in the graph (an arena value, not a graph input)
    feeds["wsrc"] = _r(3, 7, 2, 2, scale=0.3)
    (w_out,) = cases.add("Neg", ["wsrc"])
    cases.add("Conv", ["x", w_out], strides=[2, 3], pads=[0, 1, 1, 0])
    cases.outputs.remove(w_out)
    x = _r(2, 7, 5, 7)
    x[0, 1, 2, 3], x[1, 4, 0, 6] = np.nan, np.inf
    feeds.update(x=x, y=_r(1, 6, 4, 9), v=_r(2, 3, 11), u=_r(1, 2, 3, 4, 5))
    check(cases, feeds, opset=17)


@pytest.mark.parametrize("path", ["gemm", "scatter"])
@pytest.mark.parametrize("isa", ISAS)
def test_conv_transpose_runtime_weights(isa, path, monkeypatch, cache):
    """Both forms of templates/conv_transpose.py (GEMM + col2im, and the scatter with the weights
    inside), each forced on every case by its threshold."""
    force_isa(isa, monkeypatch, cache)
    monkeypatch.setattr("smelt.codegen.templates.conv_transpose.GEMM_MIN_MACS", 0 if path == "gemm" else 1 << 62)
    monkeypatch.setattr("smelt.codegen.templates.conv_transpose.GEMM_MIN_CHANNELS", 1)
    cases, feeds = Cases(), {}

    def convt(x: str, w: tuple, bias: bool = False, **attrs) -> None:
        k = len(feeds)
        feeds[f"w{k}"] = _r(*w, scale=0.3)
        ins = [x, f"w{k}"]
        if bias:
            feeds[f"b{k}"] = _r(w[1] * attrs.get("group", 1))
            ins.append(f"b{k}")
        cases.add("ConvTranspose", ins, **attrs)

    convt("x", (6, 5, 2, 2), strides=[2, 2])
    convt("x", (6, 3, 3, 3), bias=True, strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1])
    convt("x", (6, 2, 3, 2), strides=[3, 1], dilations=[2, 3])
    convt("x", (6, 3, 3, 3), bias=True, strides=[2, 2], group=2, auto_pad="SAME_UPPER")
    convt("x", (6, 2, 3, 3), strides=[2, 2], output_shape=[10, 14])
    convt("v", (3, 4, 5), bias=True, strides=[2], pads=[2, 1])
    convt("u", (2, 3, 2, 2, 2), strides=[2, 2, 2])
    convt("x", (6, 2, 1, 1), strides=[4, 4], pads=[0, 0, 1, 1])  # gaps in y
    convt("x", (6, 1, 4, 4), bias=True, strides=[2, 2], pads=[1, 1, 1, 1], group=6)  # depthwise
    x = _r(2, 6, 5, 7)
    x[0, 1, 2, 3], x[1, 4, 0, 6] = np.nan, np.inf
    feeds.update(x=x, v=_r(1, 3, 9), u=_r(1, 2, 3, 4, 5))
    check(cases, feeds, opset=17)


def _grid(*shape: int, reach: float = 1.3) -> np.ndarray:
    """Grid points inside and up to ``reach`` outside [-1, 1] (every padding branch is taken)."""
    return RNG.uniform(-reach, reach, shape).astype(np.float32)


@pytest.mark.parametrize("isa", ISAS)
def test_grid_sample_2d(isa, monkeypatch, cache):
    force_isa(isa, monkeypatch, cache)
    cases = Cases()
    for mode in ("linear", "nearest", "cubic"):
        for padding in ("zeros", "border", "reflection"):
            for align in (0, 1):
                cases.add("GridSample", ["x", "g"], mode=mode, padding_mode=padding, align_corners=align)
    cases.add("GridSample", ["x", "far"], mode="linear", padding_mode="reflection")  # several reflections
    cases.add("GridSample", ["x", "far"], mode="cubic", padding_mode="reflection", align_corners=1)
    cases.add("GridSample", ["x1", "g1"], mode="linear", padding_mode="border")  # one-pixel rows
    x = _r(2, 3, 5, 7)
    x[0, 1, 2, 3], x[1, 2, 4, 6] = np.nan, np.inf
    check(cases, {"x": x, "g": _grid(2, 4, 9, 2), "far": _grid(2, 3, 5, 2, reach=4.0),
                  "x1": _r(1, 5, 1, 6), "g1": _grid(1, 3, 17, 2)}, opset=20)


@pytest.mark.parametrize("isa", ISAS)
def test_grid_sample_3d_and_opset16(isa, monkeypatch, cache):
    force_isa(isa, monkeypatch, cache)
    cases = Cases()
    for mode in ("linear", "nearest"):
        for padding in ("zeros", "border", "reflection"):
            cases.add("GridSample", ["v", "gv"], mode=mode, padding_mode=padding, align_corners=int(mode == "linear"))
    check(cases, {"v": _r(2, 3, 4, 5, 6), "gv": _grid(2, 3, 2, 5, 3)}, opset=20)
    old = Cases()
    old.add("GridSample", ["x", "g"])  # opset 16's default: bilinear, zeros
    old.add("GridSample", ["x", "g"], mode="bicubic", padding_mode="border", align_corners=1)
    old.add("GridSample", ["x", "g"], mode="nearest", padding_mode="reflection")
    check(old, {"x": _r(1, 3, 6, 5), "g": _grid(1, 7, 3, 2)}, opset=16)


@pytest.mark.parametrize("isa", ISAS)
def test_affine_grid(isa, monkeypatch, cache):
    force_isa(isa, monkeypatch, cache)
    cases = Cases()
    for align in (0, 1):
        cases.add("AffineGrid", ["t2"], (np.array([2, 3, 5, 7], np.int64),), align_corners=align)
        cases.add("AffineGrid", ["t3"], (np.array([2, 1, 3, 4, 6], np.int64),), align_corners=align)
        cases.add("AffineGrid", ["t2"], (np.array([2, 1, 1, 9], np.int64),), align_corners=align)  # one row
    # the spatial-transformer pattern: AffineGrid's grid sampled by GridSample
    (grid,) = cases.add("AffineGrid", ["t2"], (np.array([2, 3, 6, 5], np.int64),))
    cases.add("GridSample", ["img", grid], mode="linear", padding_mode="border")
    cases.outputs.remove(grid)
    check(cases, {"t2": _r(2, 2, 3), "t3": _r(2, 3, 4), "img": _r(2, 3, 8, 7)}, opset=20)


EMPTY = np.zeros(0, np.float32)


@pytest.mark.parametrize("isa", ISAS)
def test_resize_antialias(isa, monkeypatch, cache):
    """Antialiased linear/cubic downscaling (and upscaling, and mixed), exclude_outside,
    cubic_coeff_a, sizes and scales, coordinate modes; ragged sizes."""
    force_isa(isa, monkeypatch, cache)
    cases = Cases()
    for mode in ("linear", "cubic"):
        cases.add("Resize", ["x"], (EMPTY, np.array([1, 1, 0.6, 0.6], np.float32)), mode=mode, antialias=1)
        cases.add("Resize", ["x"], (EMPTY, np.array([1, 1, 0.3, 0.45], np.float32)), mode=mode, antialias=1,
                  exclude_outside=1)
        cases.add("Resize", ["x"], (EMPTY, EMPTY, np.array([2, 3, 4, 17], np.int64)), mode=mode, antialias=1)
        cases.add("Resize", ["x"], (EMPTY, EMPTY, np.array([2, 3, 7, 5], np.int64)), mode=mode, antialias=1,
                  coordinate_transformation_mode="align_corners")
        cases.add("Resize", ["x"], (EMPTY, np.array([1, 1, 0.5, 1.0], np.float32)), mode=mode, antialias=1,
                  coordinate_transformation_mode="pytorch_half_pixel")
    cases.add("Resize", ["x"], (EMPTY, np.array([1, 1, 0.4, 0.7], np.float32)), mode="cubic", antialias=1,
              cubic_coeff_a=-0.5)
    x = _r(2, 3, 13, 11)
    x[1, 2, 5, 5] = np.nan
    check(cases, {"x": x}, opset=19)


@pytest.mark.parametrize("isa", ISAS)
def test_resize_aspect_policy_and_crop(isa, monkeypatch, cache):
    """keep_aspect_ratio_policy not_larger / not_smaller (sizes, with and without axes) and
    tf_crop_and_resize (nearest/linear/cubic, roi inside and beyond the image, extrapolation_value,
    axes in either order)."""
    force_isa(isa, monkeypatch, cache)
    cases = Cases()
    for policy in ("not_larger", "not_smaller"):
        for mode in ("nearest", "linear"):
            cases.add("Resize", ["x"], (EMPTY, EMPTY, np.array([5, 9], np.int64)), mode=mode, axes=[2, 3],
                      keep_aspect_ratio_policy=policy)
            cases.add("Resize", ["x"], (EMPTY, EMPTY, np.array([7, 20], np.int64)), mode=mode, axes=[3, 2],
                      keep_aspect_ratio_policy=policy)
    inside = np.array([0, 0, 0.2, 0.35, 1, 1, 0.8, 0.9], np.float32)
    beyond = np.array([0, 0, -0.3, 0.1, 1, 1, 1.2, 1.4], np.float32)
    for mode in ("nearest", "linear", "cubic"):
        cases.add("Resize", ["x"], (inside, EMPTY, np.array([2, 3, 5, 6], np.int64)), mode=mode,
                  coordinate_transformation_mode="tf_crop_and_resize")
        cases.add("Resize", ["x"], (beyond, np.array([1, 1, 0.8, 1.7], np.float32)), mode=mode,
                  coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=-7.5)
    cases.add("Resize", ["x"], (np.array([0.9, 0.1, 0.2, 1.3], np.float32), EMPTY, np.array([4, 3], np.int64)),
              mode="linear", axes=[3, 2], coordinate_transformation_mode="tf_crop_and_resize")
    cases.add("Resize", ["x"], (np.array([0.3, 0.7], np.float32), EMPTY, np.array([1], np.int64)),
              mode="linear", axes=[3], coordinate_transformation_mode="tf_crop_and_resize")  # one column
    check(cases, {"x": _r(2, 3, 7, 10)}, opset=19)


@pytest.mark.parametrize("isa", ISAS)
def test_col2im(isa, monkeypatch, cache):
    """Col2Im 1-D to 3-D: strides, dilations, asymmetric pads, blocks overlapping and leaving gaps."""
    force_isa(isa, monkeypatch, cache)
    cases, feeds = Cases(), {}

    def col2im(c: int, image: list, block: list, **attrs) -> None:
        rank = len(image)
        st, dl = attrs.get("strides", [1] * rank), attrs.get("dilations", [1] * rank)
        pads = attrs.get("pads", [0] * (2 * rank))
        n_blocks = int(np.prod([(image[i] + pads[i] + pads[i + rank] - (dl[i] * (block[i] - 1) + 1)) // st[i] + 1
                                for i in range(rank)]))
        name = f"x{len(feeds)}"
        feeds[name] = _r(2, c * int(np.prod(block)), n_blocks)
        cases.add("Col2Im", [name], (np.array(image, np.int64), np.array(block, np.int64)), **attrs)

    col2im(3, [5, 5], [1, 5])
    col2im(2, [6, 7], [2, 3], strides=[2, 1], pads=[1, 0, 0, 2])
    col2im(3, [7, 9], [3, 2], dilations=[2, 3], pads=[1, 1, 1, 1])
    col2im(1, [8, 8], [2, 2], strides=[3, 3])  # gaps between blocks
    col2im(2, [11], [3], strides=[2], pads=[1, 2])
    col2im(2, [3, 4, 5], [2, 2, 3], pads=[0, 1, 0, 1, 0, 1])
    check(cases, feeds, opset=18)


@pytest.mark.parametrize("path", ["gemm", "rows"])
@pytest.mark.parametrize("isa", ISAS)
def test_deform_conv(isa, path, monkeypatch, cache):
    """DeformConv against onnxruntime: offsets moving taps inside, across and out of the image,
    groups, offset groups, mask, bias, strides, dilations, pads; both paths (im2col + GEMM, and
    per-row columns when the matrix would be too large: forced by a zero limit)."""
    force_isa(isa, monkeypatch, cache)
    if path == "rows":
        monkeypatch.setattr("smelt.codegen.templates.col_ops.COL_LIMIT_BYTES", 0)
    cases, feeds = Cases(), {}

    def deform(x: str, w: tuple, oh_ow: tuple, bias: bool = False, mask: bool = False, **attrs) -> None:
        k = len(feeds)
        og, kk = attrs.get("offset_group", 1), w[2] * w[3]
        n = feeds[x].shape[0]
        feeds[f"w{k}"] = _r(*w, scale=0.4)
        feeds[f"o{k}"] = _r(n, og * 2 * kk, *oh_ow, scale=1.5)
        ins = [x, f"w{k}", f"o{k}"]
        if bias or mask:
            feeds[f"b{k}"] = _r(w[0])
            ins.append(f"b{k}" if bias else "")
        if mask:
            feeds[f"m{k}"] = RNG.uniform(0, 1, (n, og * kk, *oh_ow)).astype(np.float32)
            ins.append(f"m{k}")
        cases.add("DeformConv", ins, **attrs)

    feeds["x"] = _r(2, 4, 6, 7)
    deform("x", (3, 4, 3, 3), (4, 5))
    deform("x", (5, 4, 3, 3), (6, 7), bias=True, pads=[1, 1, 1, 1])
    deform("x", (4, 2, 2, 3), (3, 3), mask=True, group=2, offset_group=2, strides=[2, 2], pads=[0, 1, 1, 0])
    deform("x", (8, 1, 3, 2), (2, 6), bias=True, mask=True, group=4, offset_group=4, dilations=[2, 1])
    deform("x", (2, 4, 1, 1), (6, 7), offset_group=2)
    check(cases, feeds, opset=19)


@pytest.mark.parametrize("isa", ISAS)
def test_max_unpool(isa, monkeypatch, cache):
    """MaxUnpool of MaxPool's own indices (2-D, 3-D, strides, pads). With an output_shape input
    onnx infers no output shape, so that form falls back (and onnxruntime fails its node test)."""
    force_isa(isa, monkeypatch, cache)
    cases = Cases()
    _, i0 = cases.add("MaxPool", ["x"], n_out=2, kernel_shape=[2, 2], strides=[2, 2])
    cases.add("MaxUnpool", [cases.outputs[-2], i0], kernel_shape=[2, 2], strides=[2, 2])
    _, i1 = cases.add("MaxPool", ["x2"], n_out=2, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cases.add("MaxUnpool", [cases.outputs[-2], i1], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    _, i2 = cases.add("MaxPool", ["v"], n_out=2, kernel_shape=[2, 2, 2], strides=[2, 2, 2])
    cases.add("MaxUnpool", [cases.outputs[-2], i2], kernel_shape=[2, 2, 2], strides=[2, 2, 2])
    check(cases, {"x": _r(2, 3, 8, 10), "x2": _r(2, 3, 7, 9), "v": _r(1, 2, 4, 6, 4)}, opset=11)


def _u8(*shape: int) -> np.ndarray:
    return RNG.integers(0, 256, shape).astype(np.uint8)


def _i8(*shape: int) -> np.ndarray:
    return RNG.integers(-128, 128, shape).astype(np.int8)


@pytest.mark.parametrize("isa", ISAS)
def test_integer_conv_runtime_weights(isa, monkeypatch, cache):
    """ConvInteger and QLinearConv whose weights and zero points are graph inputs
    (templates/int_conv_runtime.py): uint8/int8, scalar and per-channel zero points and scales,
    bias, pads, strides, dilations, groups; exact for ConvInteger, requantized like onnxruntime."""
    force_isa(isa, monkeypatch, cache)
    cases, feeds = Cases(), {"xu": _u8(2, 4, 7, 9), "xs": _i8(1, 4, 6, 5)}

    def feed(arr) -> str:
        name = f"f{len(feeds)}"
        feeds[name] = np.asarray(arr)
        return name

    cases.add("ConvInteger", ["xu", feed(_u8(3, 4, 3, 3)), feed(np.uint8(131)), feed(np.uint8(7))], pads=[1, 1, 1, 1])
    cases.add("ConvInteger", ["xu", feed(_i8(6, 2, 2, 3)), feed(np.uint8(3)), feed(np.int8(-9))], group=2,
              strides=[2, 1], pads=[0, 1, 1, 0])
    cases.add("ConvInteger", ["xs", feed(_i8(2, 4, 3, 2))], dilations=[2, 2])
    cases.add("ConvInteger", ["xs", feed(_u8(5, 4, 1, 1)), feed(np.int8(-5)), feed(np.uint8(200))])
    f32 = np.float32
    cases.add("QLinearConv", ["xu", feed(f32(0.02)), feed(np.uint8(128)), feed(_u8(5, 4, 3, 3)), feed(f32([0.01])),
                              feed(np.array([120], np.uint8)), feed(f32(0.3)), feed(np.uint8(100)),
                              feed(RNG.integers(-5000, 5000, 5).astype(np.int32))], pads=[1, 1, 1, 1])
    cases.add("QLinearConv", ["xs", feed(f32(0.05)), feed(np.int8(2)), feed(_i8(4, 2, 3, 3)),
                              feed(RNG.uniform(0.001, 0.02, 4).astype(f32)), feed(np.zeros(4, np.int8)),
                              feed(f32(0.1)), feed(np.int8(-3))], group=2, strides=[2, 2])
    check(cases, feeds, opset=13)
