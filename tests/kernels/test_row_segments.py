"""Row segments (``schedule.conv.row_segments``): a row-outer NCHWc direct conv with too few work
items for the threads (one output row per image: a lifted 1-D conv at batch 1) cuts each row
into column segments, each a work item. Against onnxruntime at every vector ISA, 1 and 2 threads:
pads on both sides, stride and dilation, depthwise, a ragged last output-channel tile, a residual
written in place, two rows, column pairs; and with a run-time width (a shape class: one library, each
segment's tiles computed at run time), from widths with many tiles down to rows with no body."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import assert_close, const, make_model, ort_run, tensor
from kernel_models import Chain, check_cases, force_isa
from onnx import helper

import smelt
from smelt.compiler import lower
from smelt.frontend.onnx_import import load_model
from smelt.options import CompileOptions

RNG = np.random.default_rng(20261127)


def _cases():
    return [
        Chain("pad5", (1, 32, 1, 300)).conv(32, (1, 5), pads=(0, 2, 0, 2), post=("Relu",)).case(),
        Chain("strided", (1, 16, 1, 401)).conv(32, (1, 3), strides=(1, 2), dilations=(1, 3), pads=(0, 4, 0, 1)).case(),
        Chain("dw", (1, 32, 1, 333)).conv(32, (1, 3), group=32, pads=(0, 1, 0, 1)).case(),
        Chain("res", (1, 32, 1, 250)).conv(32, (1, 3), pads=(0, 1, 0, 1), post=("residual", "Relu")).case(),
        Chain("ragged", (1, 16, 1, 290)).conv(48, (1, 3)).case(),
        Chain("rows2", (1, 16, 2, 300)).conv(16, (1, 3), pads=(0, 1, 0, 1)).case(),
        # 24 output channels: column pairs on AVX-512 (two columns per vector) in segments
        Chain("pairs", (1, 16, 1, 333)).conv(24, (1, 3), pads=(0, 1, 0, 1), post=("Relu",)).case(),
    ]


def test_segments_where_items_are_few():
    """Every case's conv cuts its rows (batch 1, one or two rows); at batch 8 none does."""
    from kernel_models import _model

    for case in _cases():
        g = lower(load_model(_model([case])[0]), CompileOptions(threads=2))
        conv = next(n for n in g.nodes if n.op == "Conv")
        assert conv.schedule.direct.row_segments > 1, (case.name, conv.schedule)
    batched = Chain("b8", (8, 32, 1, 300)).conv(32, (1, 5), pads=(0, 2, 0, 2)).case()
    g = lower(load_model(_model([batched])[0]), CompileOptions(threads=2))
    assert next(n for n in g.nodes if n.op == "Conv").schedule.direct.row_segments == 1


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_matches_onnxruntime(isa, monkeypatch, tmp_path):
    monkeypatch.setenv("SMELT_DEBUG", "1")  # keeps the generated C (source_path)

    def has(expected: bool):
        def check(compiled, target):
            assert ("const int seg = " in compiled.source_path.read_text()) == expected
        return check

    options = {"layout": "propagate", "winograd": False}
    check_cases(_cases(), isa, monkeypatch, tmp_path / "on", has(True), **options)
    check_cases(_cases()[:2], isa, monkeypatch, tmp_path / "off", has(False), schedule={"conv_row_segments": False},
                **options)


def _width_model():
    """x [1, 16, 1, W] -> Conv 32 (1x5, pads 2) -> Relu -> Conv 32 (1x3, pads 1) + residual, the
    graph output (the conv writes a blocked value, a layout transform the output)."""
    w = lambda *s: (RNG.standard_normal(s) * 0.2).astype(np.float32)  # noqa: E731
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[1, 5], pads=[0, 2, 0, 2]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], kernel_shape=[1, 3], pads=[0, 1, 0, 1]),
             helper.make_node("Add", ["c2", "r1"], ["y"])]
    inits = [const("w1", w(32, 16, 1, 5)), const("b1", w(32)), const("w2", w(32, 32, 1, 3)), const("b2", w(32))]
    return make_model(nodes, [tensor("x", [1, 16, 1, "W"])], [tensor("y", None)], inits)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_run_time_widths_share_one_library(isa, threads, monkeypatch, tmp_path):
    force_isa(isa, monkeypatch, tmp_path / "cache")
    monkeypatch.setenv("SMELT_DEBUG", "1")
    model = _width_model()
    compiled = smelt.compile(model, threads=threads)
    libs = set()
    # the decision width first (many tiles per segment), then odd, a tile's edge, fewer tiles
    # than segments; last a row with no body (narrower than the kernel and its pads: the first
    # segment runs it whole, in a library of its own, as every such width has)
    for width in (400, 401, 64, 37, 9, 2):
        x = RNG.standard_normal((1, 16, 1, width)).astype(np.float32)
        assert_close(compiled.run({"x": x}), ort_run(model, {"x": x}), rel=2e-4)
        art = compiled._variants[compiled._last]
        if width > 2:
            assert art.plan.slots is not None, f"width {width} did not share a library"
            libs.add(art.lib_path)
        assert "const int seg = " in compiled.source_path.read_text()
    assert len(libs) == 1
