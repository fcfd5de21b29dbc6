"""Resize (templates/resize.py) against onnxruntime: every mode, coordinate transformation and
rounding mode, scales and sizes, up- and downscaling by integer and fractional factors, opsets 11,
13 and 18-19 (axes), 1-D to 3-D inputs, uint8 nearest, blocked NCHW<b>c between convolutions,
NaN/Inf; at every ISA the host runs, 1 and 2 threads. onnx.reference is not the oracle: its cubic
align_corners differs from onnxruntime's by whole units."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_models import force_isa
from node_cases import Cases, build_model, check

import smelt

RNG = np.random.default_rng(20261125)
ISAS = ["native", "avx2", "scalar"]
CTMS = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric")
EMPTY = np.zeros(0, np.float32)


def _resize(cases: Cases, x: str, mode: str, scales=None, sizes=None, **attrs) -> None:
    # sizes given: scales is an empty tensor (opset 11 requires the input; later opsets accept it)
    consts = (EMPTY, EMPTY if scales is None else np.asarray(scales, np.float32),
              None if sizes is None else np.asarray(sizes, np.int64))
    if consts[-1] is None:
        consts = consts[:-1]
    cases.add("Resize", [x], consts, mode=mode, **attrs)


def _all_native(cases: Cases, feeds: dict, opset: int) -> None:
    """Every case runs natively and matches onnxruntime at 1 and 2 threads (node_cases.check)."""
    check(cases, feeds, opset=opset)


@pytest.mark.parametrize("isa", ISAS)
def test_modes_and_coordinate_transforms(isa, monkeypatch, cache):
    force_isa(isa, monkeypatch, cache)
    cases = Cases()
    geometries = (([1, 1, 2, 2], None), ([1, 1, 0.5, 0.75], None), ([1, 1, 1.7, 2.3], None),
                  (None, [1, 3, 3, 11]), (None, [1, 3, 14, 5]))
    for ctm in CTMS:
        for scales, sizes in geometries:
            for nm in ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"):
                _resize(cases, "x", "nearest", scales, sizes, coordinate_transformation_mode=ctm, nearest_mode=nm)
            _resize(cases, "x", "linear", scales, sizes, coordinate_transformation_mode=ctm)
            _resize(cases, "x", "cubic", scales, sizes, coordinate_transformation_mode=ctm)
            _resize(cases, "x", "cubic", scales, sizes, coordinate_transformation_mode=ctm, exclude_outside=1,
                    cubic_coeff_a=-0.5)
    x = RNG.standard_normal((1, 3, 7, 5)).astype(np.float32)
    x[0, 1, 3, 2], x[0, 2, 0, 4], x[0, 0, 6, 0] = np.nan, np.inf, -np.inf
    _all_native(cases, {"x": x}, opset=19)


@pytest.mark.parametrize("isa", ["native", "scalar"])
def test_opsets_axes_ranks_and_dtypes(isa, monkeypatch, cache):
    force_isa(isa, monkeypatch, cache)
    for opset in (11, 13):  # opset 11: roi and scales are required inputs (empty tensors)
        cases = Cases()
        _resize(cases, "x", "nearest", [1, 1, 2, 3], coordinate_transformation_mode="asymmetric", nearest_mode="floor")
        _resize(cases, "x", "linear", None, [2, 3, 4, 4], coordinate_transformation_mode="align_corners")
        if opset == 11:
            _resize(cases, "x", "nearest", [1, 1, 2, 2], coordinate_transformation_mode="tf_half_pixel_for_nn")
        _all_native(cases, {"x": RNG.standard_normal((2, 3, 5, 6)).astype(np.float32)}, opset)
    cases = Cases()
    # 1-D (N, C, L) and 3-D (N, C, D, H, W) with only the last two axes resized; opset 18 axes
    _resize(cases, "v", "linear", [1, 1, 2.5], coordinate_transformation_mode="half_pixel")
    _resize(cases, "v", "nearest", None, [5], axes=[2])  # (onnxruntime has no 1-D cubic)
    _resize(cases, "w", "nearest", [1, 1, 1, 2, 2])
    _resize(cases, "w", "linear", [1.5, 0.5], axes=[-1, -2], coordinate_transformation_mode="pytorch_half_pixel")
    _resize(cases, "u8", "nearest", [1, 1, 3, 0.5], coordinate_transformation_mode="asymmetric")
    _all_native(cases, {"v": RNG.standard_normal((2, 3, 9)).astype(np.float32),
                        "w": RNG.standard_normal((1, 2, 3, 4, 5)).astype(np.float32),
                        "u8": RNG.integers(0, 255, (1, 2, 4, 6), dtype=np.uint8)}, opset=19)


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_blocked_between_convolutions(isa, monkeypatch, cache):
    """An FPN-style neck: conv -> 2x nearest upsample -> add with a lateral conv -> conv; and a
    bilinear upsample, both kept in NCHW<b>c (no layout transform around the Resize)."""
    target = force_isa(isa, monkeypatch, cache)
    if target.isa not in ("avx2", "avx512"):
        pytest.skip("blocked layouts need AVX2 or AVX-512")
    c = 16
    cases = Cases()
    w = lambda *s: (RNG.standard_normal(s) * 0.2).astype(np.float32)  # noqa: E731
    top = cases.add("Conv", ["x"], (w(c, 3, 3, 3),), pads=[1, 1, 1, 1], strides=[2, 2])[0]
    up = cases.add("Resize", [top], (EMPTY, np.array([1, 1, 2, 2], np.float32)), mode="nearest",
                   coordinate_transformation_mode="asymmetric", nearest_mode="floor")[0]
    lateral = cases.add("Conv", ["x"], (w(c, 3, 1, 1),))[0]
    s = cases.add("Add", [up, lateral])[0]
    bil = cases.add("Resize", [s], (EMPTY, np.array([1, 1, 2, 2], np.float32)), mode="linear")[0]
    cases.add("Conv", [bil], (w(c, c, 3, 3),), pads=[1, 1, 1, 1])
    for name in (top, up, lateral, s, bil):
        cases.outputs.remove(name)
    feeds = {"x": RNG.standard_normal((1, 3, 10, 14)).astype(np.float32)}
    check(cases, feeds, opset=19, layout="propagate")
    plan = smelt.compile(build_model(cases, feeds, 19), threads=1).plan
    resizes = [i for i in plan.step_infos() if i.schedule.get("template") == "resize"]
    assert len(resizes) == 2 and all(i.schedule.get("layout", "").startswith("NCHW") and
                                     i.schedule["layout"] != "NCHW" for i in resizes), resizes


def test_not_native_is_named():
    """What the template does not implement falls back with the reason, and still answers right
    (tf_crop_and_resize and antialias are native now: tests/kernels/test_node_ops_b.py)."""
    cases = Cases()
    roi = np.array([0, 0, 0.1, 0.2, 1, 1, 0.9, 0.8], np.float32)
    cases.add("Resize", ["x"], (roi, np.array([1, 1, 0.5, 0.5], np.float32)), mode="linear", antialias=1,
              coordinate_transformation_mode="tf_crop_and_resize")
    cases.add("Resize", ["x"], (EMPTY, np.array([1, 2, 1, 1], np.float32)), mode="nearest")
    feeds = {"x": RNG.standard_normal((1, 2, 6, 8)).astype(np.float32)}
    model = build_model(cases, feeds, 19)
    compiled = smelt.compile(model, threads=1)
    compiled.run(feeds)
    reasons = {r["node"]: r["reason"] for r in compiled.fallback_report}
    assert "antialias with tf_crop_and_resize" in reasons["Resize_0"]
    assert "leading axis" in reasons["Resize_1"]
    check(cases, feeds, opset=19, fallback=("Resize_0", "Resize_1"))
