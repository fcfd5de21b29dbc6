"""The conv algorithm choice for output rows too narrow for the direct kernel's register tile
(schedule/conv.py ``narrow_row_bound``): a plane of width 1 with many rows and a deep reduction
(magika's 256->512 5x1 conv on [512, 1]) runs as the NCHW GEMM, not NCHWc direct with a 4x1 tile;
an SE block's 1x1 plane, a 2-wide plane and ordinary planes keep their choice. Choices read from
the schedule stage at the native ISA and at AVX2; answers against onnxruntime at every ISA, 1 and
2 threads."""

from __future__ import annotations

import pytest
from kernel_models import Chain, check_cases
from onnx import helper

from smelt.compiler import lower
from smelt.frontend.onnx_import import load_model
from smelt.options import CompileOptions
from smelt.target import detect

# name -> (input shape, output channels, kernel, pads, the algorithm the default must pick)
CASES = {
    "thin_5x1": ((1, 256, 512, 1), 512, (5, 1), (2, 0, 2, 0), "gemm"),  # magika's conv
    "thin_3x1_s2": ((1, 128, 200, 1), 128, (3, 1), (1, 0, 1, 0), "gemm"),
    "thin_dilated": ((1, 96, 150, 1), 48, (3, 1), (2, 0, 2, 0), "gemm"),  # 3 of 6 output blocks per tile row
    # a 1x1 stride-1 conv is one flat row of the whole plane for the direct kernel: width 1 is no limit
    "thin_1x1": ((1, 512, 96, 1), 64, (1, 1), (0, 0, 0, 0), "direct"),
    "se_1x1_plane": ((1, 256, 1, 1), 64, (1, 1), (0, 0, 0, 0), "direct"),  # squeeze-excite: no columns
    "short_thin": ((1, 256, 40, 1), 256, (3, 1), (1, 0, 1, 0), "direct"),  # 40 positions: too few for the GEMM
    "two_wide": ((1, 256, 128, 2), 256, (3, 1), (1, 0, 1, 0), "direct"),  # 8 accumulators: FMA latency hidden
    "shallow_thin": ((1, 16, 512, 1), 64, (3, 1), (1, 0, 1, 0), "direct"),  # reduction 48 < 256
    "plane_14x14": ((1, 256, 14, 14), 256, (3, 3), (1, 1, 1, 1), "direct"),
}


def _chain(name: str) -> Chain:
    xs, oc, ks, pads, _ = CASES[name]
    strides = (2, 1) if name.endswith("_s2") else (1, 1)
    dilations = (2, 1) if name.endswith("_dilated") else (1, 1)
    # a 1x1 conv before and after keeps the neighbours blocked where the conv under test may be
    c = Chain(name, xs).conv(xs[1], (1, 1), post=("Relu",))
    return c.conv(oc, ks, pads=pads, strides=strides, dilations=dilations, post=("Relu",)).conv(16, (1, 1))


def _algorithm(name: str, isa: str) -> str:
    chain = _chain(name)
    model = load_model(helper.make_model(helper.make_graph(
        chain.nodes, "g", chain.inputs, [helper.make_tensor_value_info(chain.cur, 1, None)], chain.inits),
        opset_imports=[helper.make_opsetid("", 17)]))
    target = detect()
    if isa != "native":
        if isa not in target.isa_caps():
            pytest.skip(f"host cannot run {isa}")
        target = target.narrowed(isa)
    g = lower(model, CompileOptions(threads=2, winograd=False), target)
    convs = [n for n in g.nodes if n.op == "Conv"]
    assert len(convs) == 3
    return convs[1].schedule.algorithm


@pytest.mark.parametrize(("oc", "strides", "pairs", "want"), [
    (24, (1, 1), False, "gemm"), (24, (2, 2), False, "direct"), (24, (1, 2), False, "direct"),
    (24, (1, 1), True, "direct"), (24, (2, 2), True, "direct"), (40, (1, 1), True, "gemm")])
def test_half_width_outputs_gemm_or_column_pairs(oc, strides, pairs, want):
    """24 output channels on AVX-512 divide only into 8-lane blocks. Without column pairs the
    deep 48->24 3x3 conv runs as the full-width GEMM at stride 1, but direct where the GEMM's B
    packing would gather every other input column (PP-OCRv6-det's stride-2 conv: 3.2 ms as the
    GEMM). With them (the default) the direct kernel runs full width and takes it while the
    output channels fit one register tile (24); 40 keep the GEMM."""
    if detect().isa != "avx512":
        pytest.skip("24 channels fill whole vectors below AVX-512")
    xs = (1, 48, 64, 64)
    chain = Chain("half", xs).conv(48, (1, 1), post=("Relu",))
    chain = chain.conv(oc, (3, 3), pads=(1, 1, 1, 1), strides=strides, post=("Relu",)).conv(16, (1, 1))
    model = load_model(helper.make_model(helper.make_graph(
        chain.nodes, "g", chain.inputs, [helper.make_tensor_value_info(chain.cur, 1, None)], chain.inits),
        opset_imports=[helper.make_opsetid("", 17)]))
    g = lower(model, CompileOptions(threads=2, winograd=False, conv_column_pairs=pairs), detect())
    conv = [n for n in g.nodes if n.op == "Conv"][1]
    assert conv.schedule.algorithm == want
    if want == "direct":
        assert conv.schedule.tile.pairs == pairs


@pytest.fixture
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("smelt-cache")


@pytest.mark.parametrize("isa", ["native", "avx2"])
@pytest.mark.parametrize("name", list(CASES))
def test_narrow_rows_choose_gemm(name, isa):
    assert _algorithm(name, isa) == CASES[name][4]


@pytest.mark.parametrize("isa", ["native", "avx2", "scalar"])
def test_narrow_row_convs_match_onnxruntime(isa, monkeypatch, cache):
    cases = [_chain(n).case() for n in ("thin_5x1", "thin_3x1_s2", "thin_dilated", "thin_1x1", "se_1x1_plane")]

    def check(compiled, target):
        templates = [i.schedule.get("template") for i in compiled.plan.step_infos() if i.op == "Conv"]
        assert templates.count("f32_conv") >= 3, templates  # the three narrow-row convs at least

    check_cases(cases, isa, monkeypatch, cache, check, layout="propagate", winograd=False)


@pytest.mark.parametrize(("l1_kib", "tile"), [(48, (2, 4)), (32, (1, 4))])
def test_ic_outer_chunk_may_take_two_thirds_of_l1_for_fma_chains(l1_kib, tile):
    """ICLabel's 256->512 4x4 stride-2 conv on an 8x8 input (a 4x4 plane) runs ic-outer. Its
    chunk weights in half of a 48 KiB L1 leave a 1 x 4 tile (4 accumulators: latency-bound), so
    the chunk may take two thirds of it: 2 x 4. A 32 KiB L1 cannot hold that either: 1 x 4."""
    import dataclasses

    from smelt.schedule.conv import default_schedule

    if detect().isa not in ("avx512",):
        pytest.skip("the tile counts are AVX-512's (16-channel blocks)")
    target = dataclasses.replace(detect(), l1d_bytes=l1_kib * 1024)
    chain = Chain("iclabel3", (1, 256, 8, 8)).conv(256, (1, 1), post=("Relu",))
    chain = chain.conv(512, (4, 4), pads=(1, 1, 1, 1), strides=(2, 2), post=("Relu",))
    model = load_model(helper.make_model(helper.make_graph(
        chain.nodes, "g", chain.inputs, [helper.make_tensor_value_info(chain.cur, 1, None)], chain.inits),
        opset_imports=[helper.make_opsetid("", 17)]))
    g = lower(model, CompileOptions(threads=2, winograd=False), target)
    conv = [n for n in g.nodes if n.op == "Conv"][1]
    s = default_schedule(conv, g, target)
    assert s.ic_chunk > 0 and (s.oc_blocks, s.reg_n) == tile, s
