"""NCHW[x]c convolutions and the blocked-layout templates against onnxruntime.

Each case is a small chain so blocked values flow between ops the way the layout pass plans
them: a conv reading the plain graph input (ic_bn = 1), convs reading blocked inputs (ic_bn 8
and 16), residual operands converted by LayoutTransform, pooling / BatchNorm / Concat / Add on
blocked values, and graph outputs transformed back to plain. Sizes straddle every block: output
widths below, at and above reg_n (ragged column tiles, edge tiles narrower than a tile),
output-channel counts that leave a ragged oc tile, odd input channels, strides, dilations,
asymmetric pads, groups and depthwise, batch 2; 1 and 2 threads (``check_cases``), AVX-512 and
AVX2 (8-lane blocks), and non-default schedules read from the tuning database.
"""

from __future__ import annotations

import re

import pytest
from kernel_models import Case, Chain, _model, check_cases

import smelt
from smelt.ir.graph import layout_block
from smelt.schedule.conv import NchwcSchedule, candidate_schedules, default_schedule

PAD1 = {"pads": [1, 1, 1, 1]}


def _chains() -> list[Case]:
    C = Chain
    return [
        # stem: plain 3-channel input (ic_bn 1), 7x7 s2 p3, then max pool 3x3 s2 p1 on blocks
        C("stem", (1, 3, 37, 35)).conv(16, (7, 7), strides=(2, 2), pads=(3, 3, 3, 3), post=("Relu",))
        .pool("MaxPool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]).case(),
        # 3x3 chains: widths below / at / above reg_n, ragged oc tiles (48 = 3 blocks), residual
        C("r3", (1, 16, 9, 15)).conv(48, (3, 3), pads=(1, 1, 1, 1), post=("Relu",))
        .conv(48, (3, 3), pads=(1, 1, 1, 1), post=("residual", "Relu")).case(),
        C("w57", (1, 8, 3, 57)).conv(32, (3, 3), pads=(1, 1, 1, 1), post=("Relu",))
        .conv(16, (1, 1), post=("Clip",)).case(),
        C("w29", (2, 24, 5, 29)).conv(24, (3, 3), pads=(1, 2, 0, 1), bias=False)
        .conv(80, (3, 3), strides=(2, 2), pads=(1, 1, 1, 1), post=("Sigmoid",)).case(),
        C("w1", (1, 16, 6, 1)).conv(16, (3, 3), pads=(1, 1, 1, 1)).conv(32, (1, 1)).case(),
        # 1x1 convs (ResNet bottleneck), stride-2 1x1, a big residual block on 14x14
        C("bneck", (1, 32, 14, 14)).mark().conv(16, (1, 1), post=("Relu",)).conv(16, (3, 3), pads=(1, 1, 1, 1),
                                                                          post=("Relu",))
        .conv(32, (1, 1), post=("residual", "Relu")).conv(64, (1, 1), strides=(2, 2)).case(),
        # dilation, asymmetric pads, 1x7 / 7x1, 5x5
        C("dil", (1, 16, 17, 16)).conv(16, (3, 3), dilations=(2, 2), pads=(2, 2, 2, 2), post=("Relu",))
        .conv(32, (1, 7), pads=(0, 3, 0, 3)).conv(16, (7, 1), pads=(3, 0, 3, 0))
        .conv(16, (5, 5), strides=(2, 1), pads=(2, 1, 0, 2), post=("chan_mul",)).case(),
        # kernel wider than the image (every tile is an edge tile), big pads
        C("bigpad", (1, 8, 4, 4)).conv(16, (5, 5), pads=(4, 4, 4, 4)).conv(16, (3, 3), pads=(2, 2, 2, 2)).case(),
        # grouped (32 channels per group) and depthwise (MobileNet-style, ragged and strided)
        C("grp", (1, 64, 10, 11)).conv(64, (1, 1), post=("Relu",)).conv(64, (3, 3), group=2, pads=(1, 1, 1, 1))
        .conv(32, (3, 3), group=2, strides=(2, 2), pads=(1, 1, 1, 1)).case(),
        C("dw", (1, 16, 15, 15)).conv(48, (1, 1), post=("Clip",))
        .conv(48, (3, 3), group=48, pads=(1, 1, 1, 1), post=("Clip",))
        .conv(48, (3, 3), group=48, strides=(2, 2), pads=(1, 1, 1, 1)).conv(24, (1, 1))
        .conv(24, (3, 3), group=24, dilations=(2, 2), pads=(2, 2, 2, 2), post=("residual",)).case(),
        C("dw_b2", (2, 32, 7, 30)).conv(32, (3, 3), group=32, pads=(1, 1, 1, 1), post=("Relu",))
        .conv(32, (3, 3), group=32, pads=(0, 1, 1, 0), bias=False).case(),
        # blocked pooling, BatchNorm, Concat, Add and global pooling
        C("pools", (1, 8, 13, 12)).conv(32, (3, 3), pads=(1, 1, 1, 1))
        .pool("AveragePool", kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])
        .pool("AveragePool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1)
        .pool("MaxPool", kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1).conv(16, (1, 1))
        .pool("GlobalAveragePool").case(),
        # dilated max pool with asymmetric pads, a wide average pool (edge windows on both sides)
        C("pools2", (1, 16, 11, 13)).conv(32, (1, 1))
        .pool("MaxPool", kernel_shape=[3, 2], strides=[1, 2], dilations=[2, 1], pads=[2, 0, 1, 1])
        .pool("AveragePool", kernel_shape=[5, 5], strides=[2, 1], pads=[2, 2, 2, 2]).case(),
        C("dense", (1, 16, 8, 9)).conv(32, (3, 3), pads=(1, 1, 1, 1)).batchnorm()
        .branch_concat({"oc": 16, "ks": (1, 1)}, {"oc": 32, "ks": (3, 3), "pads": (1, 1, 1, 1)},
                       {"oc": 16, "ks": (1, 3), "pads": (0, 1, 0, 1)})
        .batchnorm().conv(16, (1, 1)).pool("GlobalMaxPool").case(),
        # ic-outer order (small planes): 5 input blocks in chunks of 2 (a ragged last chunk),
        # ragged oc tiles, residual + Relu applied only after the last chunk, batch 2, a flat 1x1
        # with a ragged last pseudo-row, a strided 3x3 and a 1x1 whose chunks straddle nothing
        C("icout", (2, 80, 7, 9)).mark().conv(48, (3, 3), pads=(1, 1, 1, 1), post=("Relu",))
        .conv(80, (1, 1), post=("residual", "Relu")).conv(96, (3, 3), strides=(2, 2), pads=(1, 0, 1, 1))
        .conv(64, (1, 1), bias=False, post=("chan_mul",)).case(),
        # the erf GELU applied after the tile's store (schedule.conv.epilogue_after_store): a flat
        # 1x1 with a ragged last pseudo-row, a padded 3x3 (edge tiles), 8-lane blocks (24
        # channels), the ic-outer order (small plane, 5 input blocks) with a residual after it
        C("gelu", (2, 24, 9, 13)).conv(48, (1, 1), post=("gelu",)).conv(24, (1, 1), post=("gelu",))
        .conv(80, (3, 3), pads=(1, 1, 1, 1), post=("gelu",)).mark().conv(80, (3, 3), pads=(1, 1, 1, 1), post=("gelu",))
        .conv(80, (1, 1), post=("gelu", "residual")).case(),
        # the other activations of many constants after the store: SiLU, Sigmoid, Tanh; a padded
        # 3x3, a depthwise 3x3, a residual after SiLU
        C("actstore", (1, 24, 9, 13)).conv(48, (1, 1), post=("silu",)).conv(32, (3, 3), pads=(1, 1, 1, 1), post=("Sigmoid",))
        .conv(32, (3, 3), group=32, pads=(1, 1, 1, 1), post=("Tanh",)).mark().conv(32, (1, 1), post=("silu", "residual")).case(),
        C("addb", (1, 16, 6, 7)).add_branches({"oc": 32, "ks": (1, 1)}, {"oc": 32, "ks": (3, 3), "pads": (1, 1, 1, 1)})
        .conv(16, (3, 3), pads=(1, 1, 1, 1)).case(),
    ]


def _structure(min_nchwc: int):
    def check(compiled, target):
        nodes = compiled.native_nodes
        assert any(op == "LayoutTransform" for _, op in nodes), "graph outputs leave through a transform"
        plan = compiled.plan
        templates = [i.schedule.get("template") for i in plan.step_infos()]
        assert templates.count("f32_conv_nchwc") >= min_nchwc, templates
        assert "f32_conv" not in templates  # every conv of these chains is blocked
    return check


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_nchwc_chains(isa, monkeypatch, cache):
    cases = _chains()
    n_convs = sum(1 for c in cases for n in c.nodes if n.op_type == "Conv")
    # the direct kernel at every shape (Winograd, which AVX2 takes down to 7x7 planes and 16
    # channels, has its own tests); depthwise convs unfused, so their own kernel runs (the fused
    # depthwise -> 1x1 kernel: test_dw_pw_conv.py)
    check_cases(cases, isa, monkeypatch, cache, _structure(n_convs), layout="propagate", winograd=False,
                schedule={"dw_pw_fusion": False})


def _pair_chains() -> list[Case]:
    """Convs with output blocks of 8 channels (24, 40, 8, grouped 2 x 24): on AVX-512 they run
    as column pairs. Plain, 16- and 8-channel input blocks; odd output widths (a half pair at the
    end of a row), stride 2 and (1, 2), dilation, asymmetric and wide pads (taps on the padding
    for one column of a pair only), ragged J tiles (40 = 3 + 2 blocks), a flat 1x1 whose last
    pseudo-row is odd, batch 2; epilogues: bias + Relu, a residual, the after-store GELU, a
    per-channel Mul, no bias."""
    C = Chain
    return [
        C("pairs_stem", (1, 3, 21, 21)).conv(24, (3, 3), strides=(2, 2), pads=(1, 1, 1, 1), post=("Relu",))
        .mark().conv(24, (3, 3), pads=(1, 2, 1, 0), post=("residual",))
        .conv(40, (1, 1), post=("gelu",)).conv(8, (3, 3), dilations=(2, 2), pads=(2, 2, 2, 2), post=("chan_mul",))
        .case(),
        C("pairs_b2", (2, 16, 5, 9)).conv(24, (1, 1), post=("Relu",)).conv(24, (5, 5), strides=(1, 2), pads=(2, 2, 2, 2))
        .conv(48, (3, 3), group=2, pads=(1, 1, 1, 1), bias=False).conv(40, (7, 7), pads=(3, 3, 3, 3)).case(),
    ]


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_column_pairs(isa, monkeypatch, cache):
    """8-channel output blocks as two output columns per 16-lane vector
    (``NchwcSchedule.pairs``; AVX-512 only: AVX2's 8-lane vector is the block), against
    onnxruntime at 1 and 2 threads; with ``conv_column_pairs`` off the half-width kernels run."""
    cases = _pair_chains()

    def pairs_used(expected: bool):
        def check(compiled, target):
            kernels = [i.schedule.get("micro_kernel", "") for i in compiled.plan.step_infos() if i.op == "Conv"]
            half = [k for k in kernels if "x 8 lanes" in k]  # direct, 8-channel output blocks
            paired = [k for k in half if "column pairs" in k]
            if expected and target.isa == "avx512":  # (the rest run as the NCHW GEMM)
                assert len(half) >= 5 and paired == half, kernels
            else:
                assert not paired, kernels
        return check

    check_cases(cases, isa, monkeypatch, cache, pairs_used(True), layout="propagate", winograd=False)
    check_cases(cases, isa, monkeypatch, cache, pairs_used(False), layout="propagate", winograd=False,
                schedule={"conv_column_pairs": False})


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_next_row_prefetch(isa, monkeypatch, tmp_path):
    """``conv_prefetch_rows="always"`` (``DirectKernel.prefetch_rows``, taken by default for
    inputs larger than L2 / 2): every row-outer direct kernel prefetches its columns of the next
    output row's new input rows (``nr``: stride 1 and 2, dilation, a 7x7 stem on plain input,
    pads beyond the kernel, width 1, batch 2, flat 1x1 pseudo-rows with a ragged last one, column
    pairs); the same answers as onnxruntime at 1 and 2 threads. Off, no kernel has them; at the
    default these small inputs have none either."""
    by_name = {c.name: c for c in _chains()}
    cases = [by_name[n] for n in ("stem", "r3", "w29", "w1", "bneck", "dil", "bigpad", "gelu")] + _pair_chains()
    monkeypatch.setenv("SMELT_DEBUG", "1")  # keeps the generated C (source_path)
    marker = "_mm_prefetch(nr + q, _MM_HINT_T1)"

    def has(expected: bool):
        def check(compiled, target):
            assert (marker in compiled.source_path.read_text()) == expected
        return check

    options = {"layout": "propagate", "winograd": False}
    check_cases(cases, isa, monkeypatch, tmp_path / "always", has(True), schedule={"conv_prefetch_rows": "always"},
                **options)
    check_cases(cases[:4], isa, monkeypatch, tmp_path / "off", has(False), schedule={"conv_prefetch_rows": False},
                **options)
    check_cases(cases[:4], isa, monkeypatch, tmp_path / "default", has(False), **options)


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_prefetches_skip_the_gaps_between_dilated_taps(isa, monkeypatch, tmp_path):
    """A dilation of 100 columns leaves gaps between a tile's kernel columns: the block-start and
    next-row prefetches fetch each column's run of input, never the gap (a 1-D TCN's dilation of
    2048 fetched 256 KiB per block start, 6x slower); answers as onnxruntime's."""
    import re

    case = (Chain("gap", (1, 32, 6, 230)).conv(32, (3, 3), dilations=(1, 100), pads=(1, 0, 1, 0), post=("Relu",))
            .case())
    monkeypatch.setenv("SMELT_DEBUG", "1")  # keeps the generated C (source_path)

    def check(compiled, target):
        src = compiled.source_path.read_text()
        loops = [(int(a), int(b)) for a, b in re.findall(r"for \(int q = (\d+); q < (\d+); q \+= 64\) _mm_prefetch\(pn", src)]
        ib = max(int(b) for b in re.findall(r"NCHW(\d+)c", src))
        assert len(loops) >= 3 and all(b - a < 100 * ib * 4 for a, b in loops), loops
        assert {a for a, _ in loops} >= {100 * ib * 4, 200 * ib * 4}, loops

    check_cases([case], isa, monkeypatch, tmp_path, check, layout="propagate", winograd=False,
                schedule={"conv_prefetch_rows": "always"})


def test_next_row_prefetch_follows_the_input_size():
    """Prefetched where an image's input exceeds half of the target's L2; not for depthwise or
    ic-outer kernels; never with the switch off."""
    import dataclasses

    from smelt.codegen.kernels.conv_geometry import ConvGeometry
    from smelt.compiler import lower
    from smelt.frontend.onnx_import import load_model
    from smelt.options import CompileOptions
    from smelt.schedule.conv import prefetch_rows
    from smelt.target import detect

    model, _ = _model([Chain("k", (1, 48, 320, 320)).conv(24, (3, 3), strides=(2, 2), pads=(1, 1, 1, 1)).case()])
    g = lower(load_model(model), CompileOptions(threads=1, layout="nchw"))
    geo = ConvGeometry(next(n for n in g.nodes if n.op == "Conv"), g)  # 18.75 MiB of input
    s = NchwcSchedule(8, 16, 3)
    opts = CompileOptions(threads=1)
    assert prefetch_rows(geo, s, 16, dataclasses.replace(detect(), l2_bytes=1 << 20), opts)
    assert not prefetch_rows(geo, s, 16, dataclasses.replace(detect(), l2_bytes=64 << 20), opts)
    assert prefetch_rows(geo, s, 16, dataclasses.replace(detect(), l2_bytes=64 << 20),
                         CompileOptions(threads=1, conv_prefetch_rows="always"))
    assert not prefetch_rows(geo, s, 16, detect(), CompileOptions(threads=1, conv_prefetch_rows=False))
    assert not prefetch_rows(geo, NchwcSchedule(8, 4, 3, ic_chunk=16), 16, detect(), opts)  # ic-outer
    # depthwise: each input row serves KH output rows; the prefetch measured no faster (7x7 on 160x160)
    model, _ = _model([Chain("d", (1, 96, 160, 160)).conv(96, (7, 7), group=96, pads=(3, 3, 3, 3)).case()])
    g = lower(load_model(model), CompileOptions(threads=1, layout="nchw"))
    dw = ConvGeometry(next(n for n in g.nodes if n.op == "Conv"), g)
    assert not prefetch_rows(dw, NchwcSchedule(16, 28, 1), 16, dataclasses.replace(detect(), l2_bytes=1 << 20), opts)


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_plain_input_of_whole_blocks_is_blocked_first(isa, monkeypatch, cache):
    """A conv whose input arrives plain (here the graph input) with whole blocks of channels reads
    it through a layout transform into its block (``conv_block_plain_input``) when its tile would
    read at least 64 input rows as 1-channel blocks on a plane of 64 positions or more: 32
    channels x 3 kernel rows and a 1x1 over 128 channels are blocked; 16 x 3 rows, and 128
    channels on an 8x7 plane, stay 1-channel blocks; off, all do. Answers as onnxruntime's."""
    from smelt.codegen.kernels.isa import vector_isa

    def target_block(target) -> int:
        return vector_isa(target).lanes

    C = Chain
    cases = [C("p32", (1, 32, 12, 13)).conv(32, (3, 3), pads=(1, 1, 1, 1), post=("Relu",)).case(),
             C("p128", (1, 128, 9, 10)).conv(32, (1, 1)).case(),
             C("p16", (1, 16, 12, 13)).conv(32, (3, 3), pads=(1, 1, 1, 1)).case(),
             C("small", (1, 128, 8, 7)).conv(32, (3, 3), pads=(1, 1, 1, 1)).case()]

    def blocks(expected: list[bool]):
        def check(compiled, target):
            layouts = [i.schedule.get("layout", "") for i in compiled.plan.step_infos() if i.op == "Conv"]
            assert [x.split(" ->")[0] for x in layouts] == [f"NCHW{target_block(target)}c" if e else "NCHW1c"
                                                             for e in expected], layouts
        return check

    check_cases(cases, isa, monkeypatch, cache, blocks([True, True, False, False]), layout="propagate", winograd=False)
    check_cases(cases, isa, monkeypatch, cache, blocks([False] * 4), layout="propagate", winograd=False,
                schedule={"conv_block_plain_input": False})


def test_conv_only_mode_transforms_around_every_conv(monkeypatch, cache):
    """NeoCPU's "layout-optimized convolutions" step: blocked convs, plain everywhere else."""
    cases = _chains()[1:3]

    def check(compiled, target):
        ops = [op for _, op in compiled.native_nodes]
        assert ops.count("LayoutTransform") >= ops.count("Conv")

    check_cases(cases, "native", monkeypatch, cache, check, layout="conv")


def test_tuned_schedules_from_database(monkeypatch, cache, tmp_path):
    """Non-default schedules (other tile shapes, no kw unrolling, 8-lane blocks) read from the
    tuning database give the same answers; the plan records the schedule used."""
    from smelt.compiler import lower
    from smelt.frontend.onnx_import import load_model
    from smelt.options import CompileOptions
    from smelt.schedule.db import CONV_KIND, TuningDB
    from smelt.target import detect

    db_path = tmp_path / "tuning.sqlite"
    monkeypatch.setenv("SMELT_TUNING_DB", str(db_path))
    cases = _chains()[1:4] + _chains()[9:10]
    model, _ = _model(cases)
    target = detect()
    # direct convs only: a conv the cost model runs as Winograd (3x3 ones on AVX2) has no
    # direct schedule for the database to override
    g = lower(load_model(model), CompileOptions(threads=1, use_tuning_db=False, winograd=False), target)
    db = TuningDB(db_path)
    from smelt.schedule.conv import workload

    chosen = {}
    for node in g.nodes:
        if node.op != "Conv":
            continue
        ib = layout_block(g.values[node.inputs[0]].layout)
        default = default_schedule(node, g, target)
        others = [s for s in candidate_schedules(node, g, target) if s != default]
        pick = others[len(others) // 2]
        chosen[node.name] = pick
        for threads in (1, 2):
            db.store(CONV_KIND, workload(node, g, ib, threads), target.key(), pick.to_dict(), 1e-3)

    def check(compiled, target):
        blockings = {i.node: i.schedule.get("blocking", "") for i in compiled.plan.step_infos() if i.op == "Conv"}
        hits = sum(1 for name, s in chosen.items()
                   if f"reg_n={s.reg_n} " in blockings.get(name, "") and f"unroll_ker={int(s.unroll_ker)}" in
                   blockings.get(name, ""))
        assert hits >= len(chosen) // 2, (chosen, blockings)

    check_cases(cases, "native", monkeypatch, cache, check, layout="propagate")


def test_small_planes_run_ic_outer(monkeypatch, cache):
    """Small planes with enough input channels default to the ic-outer order (partial sums in
    the output, the epilogue after the last chunk); every conv of the chain still matches."""
    from smelt.target import detect

    if detect().isa != "avx512":
        pytest.skip("AVX-512 defaults")
    cases = [c for c in _chains() if c.name == "icout"]

    def check(compiled, target):
        blockings = [i.schedule.get("blocking", "") for i in compiled.plan.step_infos() if i.op == "Conv"]
        assert sum("ic-outer" in b for b in blockings) >= 3, blockings

    check_cases(cases, "native", monkeypatch, cache, check, layout="propagate")


def test_ic_outer_schedules_from_database(monkeypatch, cache, tmp_path):
    """The ic-outer order forced on every conv that can chunk (also big planes, padding,
    strides, dilations, ragged oc tiles): chunks of 32 channels over 48 or 80 leave a ragged
    last chunk, chunks of 16 over 8-channel input blocks span two blocks."""
    import dataclasses

    from smelt.compiler import lower
    from smelt.frontend.onnx_import import load_model
    from smelt.options import CompileOptions
    from smelt.schedule.db import CONV_KIND, TuningDB
    from smelt.target import detect

    db_path = tmp_path / "tuning.sqlite"
    monkeypatch.setenv("SMELT_TUNING_DB", str(db_path))
    names = {"r3", "w29", "bneck", "dil", "grp", "icout"}
    cases = [c for c in _chains() if c.name in names]
    model, _ = _model(cases)
    target = detect()
    g = lower(load_model(model), CompileOptions(threads=1, use_tuning_db=False), target)
    db = TuningDB(db_path)
    from smelt.codegen.kernels.conv_geometry import ConvGeometry, is_depthwise
    from smelt.schedule.conv import workload

    forced = []
    for node in g.nodes:
        geo = ConvGeometry(node, g) if node.op == "Conv" else None
        if geo is None or is_depthwise(geo) or geo.cg < 24:
            continue
        chunk = 16 if geo.cg <= 32 else 32  # 24 channels: 16 + 8; 48 or 80: ragged last chunk
        pick = dataclasses.replace(default_schedule(node, g, target), ic_chunk=chunk)
        forced.append(node.name)
        ib = layout_block(g.values[node.inputs[0]].layout)
        for threads in (1, 2):
            db.store(CONV_KIND, workload(node, g, ib, threads), target.key(), pick.to_dict(), 1e-3)
    assert len(forced) >= 6

    def check(compiled, target):
        blockings = {i.node: i.schedule.get("blocking", "") for i in compiled.plan.step_infos() if i.op == "Conv"}
        missing = [(n, blockings.get(n)) for n in forced if "ic-outer" not in blockings.get(n, "")]
        assert not missing, missing

    check_cases(cases, "native", monkeypatch, cache, check, layout="propagate", winograd=False)


def test_schedule_space_and_default():
    """The space holds the default; the default fills the register file on wide rows."""
    model, _ = _model([Chain("s", (1, 64, 56, 56)).conv(64, (3, 3), pads=(1, 1, 1, 1)).case()])
    from smelt.compiler import lower
    from smelt.frontend.onnx_import import load_model
    from smelt.options import CompileOptions
    from smelt.target import detect

    target = detect()
    if target.isa != "avx512":
        pytest.skip("AVX-512 defaults")
    g = lower(load_model(model), CompileOptions(threads=1, layout="nchw"))
    conv = next(n for n in g.nodes if n.op == "Conv")
    space = candidate_schedules(conv, g, target)
    d = default_schedule(conv, g, target)
    assert d in space
    assert d.oc_bn == 16 and 20 <= d.oc_blocks * d.reg_n <= 28
    assert NchwcSchedule.from_dict(d.to_dict()) == d


def test_kernel_source_names_template_and_schedule(monkeypatch, cache):
    monkeypatch.setenv("SMELT_CACHE_DIR", str(cache))
    monkeypatch.setenv("SMELT_DEBUG", "1")  # keeps the generated C (source_path)
    model, _ = _model([Chain("h", (1, 16, 9, 9)).conv(32, (3, 3), pads=(1, 1, 1, 1), post=("Relu",)).case()])
    src = smelt.compile(model, threads=1, layout="propagate").source_path.read_text()
    assert "template: f32_conv2d_nchw16c_" in src or "template: f32_conv2d_nchw8c_" in src
    assert "schedule oc_bn=" in src and "epilogue: Relu" in src


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_direct_kernel_switches(isa, monkeypatch, tmp_path):
    """``conv_prefetch_input``, ``conv_prefetch_weights`` and ``conv_row_split`` off (schedule
    switches, ``schedule.conv.DirectKernel``): the same answers, and the kernels lose their
    prefetches (``pn``: the next input block's row, ``pq``: the next weights); at the defaults
    the same chains have both."""
    by_name = {c.name: c for c in _chains()}
    cases = [by_name[n] for n in ("r3", "bneck", "icout", "grp")]
    monkeypatch.setenv("SMELT_DEBUG", "1")  # keeps the generated C (source_path)
    input_pf, weight_pf = "_mm_prefetch(pn + q", "_mm_prefetch(pq + q"

    def off(compiled, target):
        src = compiled.source_path.read_text()
        assert input_pf not in src and weight_pf not in src

    check_cases(cases, isa, monkeypatch, tmp_path / "off", off, layout="propagate", winograd=False,
                schedule={"conv_prefetch_input": False, "conv_prefetch_weights": False, "conv_row_split": False})

    def on(compiled, target):
        src = compiled.source_path.read_text()
        assert input_pf in src and weight_pf in src

    check_cases(cases[2:3], isa, monkeypatch, tmp_path / "on", on, layout="propagate", winograd=False)


def test_direct_kernel_choices_follow_the_target():
    """Row split when the weights fit half of L2 (the target's), weight prefetch only without it;
    Winograd's GEMM tile fills 32 or 16 registers; the depthwise blocking fits the register file."""
    import dataclasses

    from smelt.codegen.kernels.conv_geometry import ConvGeometry
    from smelt.compiler import lower
    from smelt.frontend.onnx_import import load_model
    from smelt.options import CompileOptions
    from smelt.schedule.conv import depthwise_kernel, direct_kernel, winograd_tile
    from smelt.target import detect

    model, _ = _model([Chain("k", (1, 256, 14, 14)).conv(256, (3, 3), pads=(1, 1, 1, 1)).case()])
    g = lower(load_model(model), CompileOptions(threads=1, layout="nchw"))
    geo = ConvGeometry(next(n for n in g.nodes if n.op == "Conv"), g)  # 2.25 MiB of weights
    s = NchwcSchedule(16, 14, 2)
    opts = CompileOptions(threads=1)
    big_l2 = dataclasses.replace(detect(), l2_bytes=8 << 20)
    small_l2 = dataclasses.replace(detect(), l2_bytes=1 << 20)
    assert direct_kernel(geo, s, 16, big_l2, opts).row_split
    assert not direct_kernel(geo, s, 16, big_l2, opts).prefetch_weights
    dk = direct_kernel(geo, s, 16, small_l2, opts)
    assert not dk.row_split and dk.prefetch_weights and dk.prefetch_input
    assert not direct_kernel(geo, s, 16, small_l2, CompileOptions(threads=1, conv_prefetch_input=False)).prefetch_input
    avx2 = dataclasses.replace(detect(), isa="avx2", vector_bits=256, vector_registers=16)
    avx512 = dataclasses.replace(detect(), isa="avx512", vector_bits=512, vector_registers=32)
    assert winograd_tile(avx512) == (2, 14) and winograd_tile(avx2) == (2, 6)
    for t in (avx2, avx512):
        d = depthwise_kernel(geo, t)
        assert d.threaded and d.row_vectors + 2 <= t.vector_registers and d.plane_vectors <= t.vector_registers // 2


@pytest.mark.parametrize("isa", ["native", "avx2"])
@pytest.mark.parametrize("inplace", [True, False])
def test_gelu_epilogue_after_store(isa, inplace, monkeypatch, tmp_path):
    """Convs with a fused erf GELU (or SiLU, Sigmoid, Tanh) store their raw sums and apply the epilogue in a loop over the
    stored vectors (``DirectKernel.epilogue_after_store``): the same answers as onnxruntime at 1
    and 2 threads; with ``inplace`` off the residual conv (a "full" operand read after the store)
    runs that way too, with it on the residual conv keeps the epilogue in registers."""
    cases = [c for c in _chains() if c.name in ("gelu", "actstore")]
    monkeypatch.setenv("SMELT_DEBUG", "1")  # keeps the generated C (source_path)

    def check(compiled, target):
        src = compiled.source_path.read_text()
        loops = src.count("t = _mm512_load_ps(y + yo") + src.count("t = _mm256_load_ps(y + yo")
        assert loops > 0, "no tile applies its epilogue after the store"
        # the pass is a function the tiles call, never inlined: inlined, gcc hoisted the GELU's
        # constants out of the tile loop and the accumulators went to the stack
        passes = re.findall(r"static __attribute__\(\(noinline\)\) void (f32_conv_nchw\d+c_epilogue_\w+)\(", src)
        assert passes and all(src.count(f"{fn}(y, yo, ch") >= 1 for fn in passes), passes

    check_cases(cases, isa, monkeypatch, tmp_path, check, layout="propagate", winograd=False,
                schedule={"inplace": inplace})


def test_epilogue_after_store_decision():
    """Only an activation of MEMORY_EPILOGUE_OPS moves the epilogue after the store, and never when
    the output may overwrite a residual operand."""
    from smelt.ir.epilogue import EpilogueActivation, EpilogueBinary
    from smelt.ir.graph import Node
    from smelt.schedule.conv import epilogue_after_store

    def node(*steps):
        return Node("Conv", "c", ["x", "w"], ["y"], epilogue=list(steps))

    gelu, relu = EpilogueActivation("Gelu"), EpilogueActivation("Relu")
    add = EpilogueBinary("Add", "r", "full")
    assert epilogue_after_store(node(add, gelu), None)
    assert not epilogue_after_store(node(add, gelu), "r")
    assert not epilogue_after_store(node(relu, add), None)
    for op in ("SiLU", "Sigmoid", "Tanh"):
        assert epilogue_after_store(node(EpilogueActivation(op)), None)
    assert not epilogue_after_store(node(EpilogueActivation("HardSwish")), None)
    assert not epilogue_after_store(node(), None)


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_depth_to_space_from_blocked(isa, monkeypatch, cache):
    """DepthToSpace reading its blocked producer's output directly (blocked.py
    ``depth_to_space_nchwc``, no LayoutTransform between): DCR (what deconv_as_conv writes)
    and CRD, blocksizes 2 and 3, 16- and 8-lane blocks, batch 2, an odd plane; against
    onnxruntime at 1 and 2 threads."""
    dcr = Chain("d2s_dcr", (2, 16, 5, 7)).conv(64, (1, 1), post=("Relu",))
    crd = Chain("d2s_crd", (1, 8, 4, 6)).conv(72, (3, 3), pads=(1, 1, 1, 1))
    cases = [dcr._op("DepthToSpace", [dcr.cur], blocksize=2).case(),
             crd._op("DepthToSpace", [crd.cur], blocksize=3, mode="CRD").case()]

    def check(compiled, target):
        templates = [i.schedule.get("template") for i in compiled.plan.step_infos()]
        assert templates.count("depth_to_space_nchwc") == 2, templates

    check_cases(cases, isa, monkeypatch, cache, check, layout="propagate", winograd=False)


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_depth_to_space_from_blocked_tiled(isa, monkeypatch, cache):
    """The tiled DepthToSpace (rows at least one block wide): b x b tiles transposed into the
    per-thread buffer, output rows interleaved from it; DCR with channel groups that straddle
    blocks (96 -> 24: PP-OCR's DB head), blocksize 4 over two runs of columns (64 + 6), CRD
    blocksize 3 on 8-lane blocks; widths below, at and above whole tiles; batch 2; against
    onnxruntime at 1 and 2 threads."""
    wide = Chain("d2s_wide", (1, 24, 3, 37)).conv(96, (1, 1))
    runs = Chain("d2s_runs", (2, 16, 2, 70)).conv(64, (1, 1), post=("Relu",))
    crd = Chain("d2s_crd_wide", (2, 8, 3, 17)).conv(72, (3, 3), pads=(1, 1, 1, 1))
    exact = Chain("d2s_exact", (1, 16, 2, 16)).conv(64, (1, 1))
    cases = [wide._op("DepthToSpace", [wide.cur], blocksize=2).case(),
             runs._op("DepthToSpace", [runs.cur], blocksize=4).case(),
             crd._op("DepthToSpace", [crd.cur], blocksize=3, mode="CRD").case(),
             exact._op("DepthToSpace", [exact.cur], blocksize=2).case()]

    def check(compiled, target):
        algos = [i.schedule.get("algorithm", "") for i in compiled.plan.step_infos()
                 if i.schedule.get("template") == "depth_to_space_nchwc"]
        assert len(algos) == 4 and all("transposed in registers" in a for a in algos), algos

    check_cases(cases, isa, monkeypatch, cache, check, layout="propagate", winograd=False)
