"""The depthwise conv fused into the 1x1 conv that reads it (``DwPwConv``: schedule/dwpw.py,
templates/dw_pw_conv.py) against onnxruntime.

Chains in MobileNet-v2's shape (expand 1x1 -> depthwise 3x3 -> project 1x1, with and without the
residual add) over the edges of the fused kernel: stride 1 and 2, symmetric, asymmetric, zero and
wide padding (a 5x5 depthwise), depthwise with and without bias, with Clip (Relu6), Relu or no
activation, output widths below / at / above the depthwise tile's columns, planes smaller than a
band and planes of several bands with a ragged last band, 1x1 outputs in 8-lane blocks (24 and
40 channels) and ragged output-channel tiles, an odd channel count at the graph input, batch 2.
Every ISA this host runs (AVX-512, AVX2; portable C, where nothing is blocked and nothing fuses),
1 and 2 threads (``check_cases``), and the fused build bit-for-bit equal to the unfused one
(both accumulate every element in the same order).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from kernel_models import Case, Chain, _model, check_cases

import smelt
from smelt.frontend.onnx_import import to_ir
from smelt.ir.graph import Node
from smelt.options import CompileOptions
from smelt.target import detect

TEMPLATE = "f32_dw_pw_conv_nchwc"
# the chains' tensors are small: fuse them all the same (by default pairs whose depthwise output
# fits L2 / SMALL_L2_FRACTION stay separate)
ALWAYS = {"dw_pw_fusion": "always"}


def _chains() -> list[Case]:
    C = Chain
    return [
        # inverted residual, stride 1, residual add on the 1x1 (16-lane blocks)
        C("ir", (1, 16, 15, 15)).mark().conv(96, (1, 1), post=("Clip",))
        .conv(96, (3, 3), group=96, pads=(1, 1, 1, 1), post=("Clip",))
        .conv(16, (1, 1), post=("residual",)).case(),
        # stride 2, a 1x1 into 40 channels (8-lane output blocks on AVX-512), no dw bias, Relu;
        # the expand reads 8-lane blocks
        C("s2", (1, 24, 13, 14)).conv(24, (1, 1)).conv(48, (1, 1), post=("Relu",))
        .conv(48, (3, 3), group=48, strides=(2, 2), pads=(1, 1, 1, 1), bias=False, post=("Relu",))
        .conv(40, (1, 1)).case(),
        # odd input channels, 24-channel outputs with a residual in 8-lane blocks
        C("odd", (1, 5, 9, 9)).conv(24, (1, 1), post=("Clip",)).mark().conv(32, (1, 1))
        .conv(32, (3, 3), group=32, pads=(1, 1, 1, 1), post=("Clip",))
        .conv(24, (1, 1), post=("residual",)).case(),
        # wide rows: several bands of rows, a ragged last band, widths above the dw tile
        C("wide", (1, 16, 13, 57)).conv(96, (1, 1), post=("Clip",))
        .conv(96, (3, 3), group=96, pads=(1, 1, 1, 1), post=("Clip",)).conv(32, (1, 1), post=("Relu",)).case(),
        # widths at / below the tile, asymmetric pads, no activation on the depthwise
        C("asym", (2, 32, 6, 28)).conv(32, (3, 3), group=32, pads=(0, 1, 1, 0))
        .conv(48, (1, 1), bias=False).case(),
        # no padding (every column a body column), stride 2 on an odd plane
        C("valid", (1, 16, 11, 11)).conv(16, (3, 3), group=16, strides=(2, 2), post=("Clip",))
        .conv(64, (1, 1), post=("Clip",)).case(),
        # a 5x5 depthwise with pads 2 on a plane narrower than the kernel (edge columns only)
        C("k5", (1, 16, 4, 3)).conv(16, (5, 5), group=16, pads=(2, 2, 2, 2), post=("Relu",))
        .conv(16, (1, 1)).case(),
        # 1x1 plane with pads 1 (every tap but the centre in the padding)
        C("one", (1, 32, 1, 1)).conv(32, (3, 3), group=32, pads=(1, 1, 1, 1), post=("Clip",))
        .conv(16, (1, 1)).case(),
        # batch 2 through the expand's ring (reset per image), a ragged expand tile (80 = 5 blocks)
        C("b2", (2, 16, 9, 10)).conv(16, (1, 1)).mark().conv(80, (1, 1), post=("Clip",))
        .conv(80, (3, 3), group=80, pads=(1, 1, 1, 1), post=("Clip",)).conv(16, (1, 1), post=("residual",)).case(),
        # one output row on 2 threads: the 1x1 split over output-channel parts
        C("row", (1, 64, 1, 9)).conv(64, (3, 3), group=64, pads=(1, 1, 1, 1), post=("Clip",))
        .conv(64, (1, 1), post=("Relu",)).case(),
        # MobileNet's late stage: 7x7, many channels, the 1x1 split over output-channel tiles
        C("late", (1, 160, 7, 7)).conv(160, (1, 1)).mark().conv(320, (1, 1), post=("Clip",))
        .conv(320, (3, 3), group=320, pads=(1, 1, 1, 1), post=("Clip",))
        .conv(160, (1, 1), post=("residual",)).case(),
        # PP-LCNet's dw -> pw -> dw -> pw: the first pair's 1x1 is not the second pair's expand
        # (taking it as one dropped the first pair and left the second reading a removed value)
        C("lcnet", (1, 16, 10, 10)).conv(16, (3, 3), group=16, pads=(1, 1, 1, 1), post=("Relu",))
        .conv(32, (1, 1), post=("Relu",)).conv(32, (3, 3), group=32, strides=(2, 2), pads=(1, 1, 1, 1),
                                                 post=("Relu",))
        .conv(48, (1, 1), post=("Relu",)).case(),
    ]


N_FUSED = 13  # one per chain, two in lcnet
# chains whose depthwise follows an expand 1x1 (ir, s2, odd, wide, b2, late): fused too
N_EXPAND = 6


def _fused(n: int, n_expand: int = 0):
    def check(compiled, target):
        infos = [i.schedule for i in compiled.plan.step_infos()]
        templates = [i.get("template") for i in infos]
        assert templates.count(TEMPLATE) == n, templates
        expand = [i for i in infos if i.get("template") == TEMPLATE and i.get("algorithm", "").startswith("expand")]
        assert len(expand) == n_expand, [i.get("blocking") for i in infos]
    return check


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_dw_pw_chains(isa, monkeypatch, cache):
    check_cases(_chains(), isa, monkeypatch, cache, _fused(N_FUSED, N_EXPAND), layout="propagate", winograd=False,
                schedule=ALWAYS)


def test_dw_pw_portable(monkeypatch, cache):
    """Portable C: no blocked layouts, so nothing fuses; the chains still answer right."""
    check_cases(_chains(), "scalar", monkeypatch, cache, _fused(0), layout="propagate", winograd=False,
                schedule=ALWAYS)


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_fused_equals_unfused(isa, monkeypatch, cache):
    """The fused kernel sums every element in the order of the two separate kernels: the same
    bits, at 1 and 2 threads; ``dw_pw_fusion`` off leaves the pairs separate."""
    from kernel_models import force_isa

    force_isa(isa, monkeypatch, cache)
    model, feeds = _model(_chains())
    for threads in (1, 2):
        fused = smelt.compile(model, threads=threads, winograd=False, schedule=ALWAYS)
        plain = smelt.compile(model, threads=threads, winograd=False, schedule={"dw_pw_fusion": False})
        _fused(N_FUSED, N_EXPAND)(fused, None)
        _fused(0)(plain, None)
        # the fused node counts the FLOPs of the convs it runs (profile and bench % peak)
        assert sum(i.flops for i in fused.plan.step_infos()) == sum(i.flops for i in plain.plan.step_infos()) > 0
        for a, b in zip(fused.run(feeds), plain.run(feeds), strict=True):
            np.testing.assert_array_equal(a, b)
        fused.close()
        plain.close()


def test_not_fused_when_the_depthwise_output_is_read_twice(monkeypatch, cache):
    """A depthwise output that is also a graph output, or read by two convs, stays separate."""
    c = Chain("two", (1, 16, 8, 8)).conv(16, (3, 3), group=16, pads=(1, 1, 1, 1), post=("Relu",))
    c.mark().conv(16, (1, 1), post=("residual",))  # the 1x1's residual is the depthwise output
    check_cases([c.case()], "native", monkeypatch, cache, _fused(0), layout="propagate", winograd=False,
                schedule=ALWAYS)


def test_band_and_split_follow_the_target():
    """Bands fit L2 / BAND_L2_FRACTION (a smaller L2: thinner bands); a plane of one band splits
    its 1x1 over output-channel tiles so both threads have work."""
    from smelt.frontend.onnx_import import load_model
    from smelt.passes.pipeline import run_passes
    from smelt.schedule.conv import vector_lanes
    from smelt.schedule.dwpw import BAND_L2_FRACTION, DwPwSchedule
    from smelt.schedule.stage import schedule_graph

    host = detect()
    if vector_lanes(host) < 8:
        pytest.skip("needs a vector ISA")
    wide = Chain("w", (1, 96, 56, 56)).conv(96, (3, 3), group=96, pads=(1, 1, 1, 1)).conv(24, (1, 1)).case()
    late = Chain("l", (1, 960, 7, 7)).conv(960, (3, 3), group=960, pads=(1, 1, 1, 1)).conv(160, (1, 1)).case()
    for case, l2 in ((wide, 1 << 20), (wide, 1 << 19), (late, 1 << 20)):
        target = dataclasses.replace(host, l2_bytes=l2)
        opts = CompileOptions(threads=2, winograd=False, dw_pw_fusion="always")
        g = run_passes(to_ir(load_model(_model([case])[0])), opts.opt_level)
        g = schedule_graph(g, target, opts)
        fused = [n for n in g.nodes if isinstance(n, Node) and isinstance(n.schedule, DwPwSchedule)]
        assert len(fused) == 1, [n.op for n in g.nodes]
        s = fused[0].schedule
        c = int(case.inputs[0].type.tensor_type.shape.dim[1].dim_value)
        assert s.band_rows * 56 * c * 4 <= l2 // BAND_L2_FRACTION or s.band_rows == 1 or case is late
        bands = -(-(7 if case is late else 56) // s.band_rows)
        assert bands * s.oc_parts >= 2, s  # work for both threads
        if case is wide:  # 56 rows: an even split of bands over 2 threads
            assert bands % 2 == 0, s
    # one row: a single band, its 1x1 split over output-channel parts
    row = Chain("r", (1, 64, 1, 9)).conv(64, (3, 3), group=64, pads=(1, 1, 1, 1)).conv(64, (1, 1)).case()
    opts = CompileOptions(threads=2, winograd=False, dw_pw_fusion="always")
    g = schedule_graph(run_passes(to_ir(load_model(_model([row])[0])), 1), host, opts)
    s = next(n.schedule for n in g.nodes if isinstance(n.schedule, DwPwSchedule))
    assert s.band_rows == 1 and s.oc_parts == 2, s


def test_small_pairs_stay_separate(monkeypatch, cache):
    """By default a pair whose depthwise output fits L2 / SMALL_L2_FRACTION is not fused (the
    late 7x7 stage); a bigger one is."""
    small = Chain("s", (1, 64, 7, 7)).conv(64, (3, 3), group=64, pads=(1, 1, 1, 1)).conv(32, (1, 1)).case()
    big = Chain("b", (1, 96, 40, 40)).conv(96, (3, 3), group=96, pads=(1, 1, 1, 1)).conv(32, (1, 1)).case()
    check_cases([small, big], "native", monkeypatch, cache, _fused(1), layout="propagate", winograd=False)


def test_balanced_band():
    """The busiest thread's rows are the fewest possible; then the tallest band."""
    from smelt.schedule.dwpw import balanced_band

    assert balanced_band(14, 1, 5, 2) == 1  # 7 + 7 rows (4 would give 8 + 6)
    assert balanced_band(14, 1, 7, 2) == 7
    assert balanced_band(56, 1, 3, 2) == 2  # 28 bands, 14 each
    assert balanced_band(56, 1, 30, 1) == 30  # one thread: the tallest band that fits
    assert balanced_band(7, 2, 7, 2) == 7  # batch 2: one image per thread


def test_fusion_switches_are_in_the_key():
    """``dw_pw_fusion`` and ``expand_fusion`` are CompileOptions fields that change the artifact key."""
    t = detect()
    base = CompileOptions(threads=1)
    for name, other in (("dw_pw_fusion", False), ("dw_pw_fusion", "always"), ("expand_fusion", False)):
        assert CompileOptions(threads=1, **{name: other}).key(t) != base.key(t), name


def test_fusion_switch_takes_only_its_modes() -> None:
    """``dw_pw_fusion`` is True, False or "always"; anything else is named, not taken as on."""
    for bad in ("alway", 1, None):
        with pytest.raises(ValueError, match="dw_pw_fusion must be True, False or 'always'"):
            CompileOptions(threads=1, dw_pw_fusion=bad)
    assert CompileOptions(threads=1, dw_pw_fusion="always").dw_pw_fusion == "always"
