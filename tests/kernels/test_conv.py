"""Conv template against onnxruntime: every padding/stride/dilation/group/auto_pad variant.

Covers 1x1 direct GEMM, im2col-in-packing GEMM (stride 1 masked loads and stride > 1 gathers),
depthwise direct loops (with and without a channel multiplier), 1-D, 2-D and 3-D, output
channels and positions below, at and above the micro-kernel tile (MR=8, NR=48), K above KC,
output planes above NC, batches and groups split between threads, bias / no bias, and fused
epilogues (Conv->Relu, Conv->Add(residual)->Relu, Conv->Clip, ...). Independent cases share one
multi-output model per test so one C compile covers many.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import const, make_model, ort_run, tensor
from kernel_models import Case, _model, _rand, check_cases
from onnx import helper

import smelt

RNG = np.random.default_rng(4321)


def _out_shape(xs, oc, ks, attrs) -> tuple:
    s = len(ks)
    strides = attrs.get("strides", [1] * s)
    dils = attrs.get("dilations", [1] * s)
    auto = attrs.get("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        sp = [-(-i // st) for i, st in zip(xs[2:], strides, strict=True)]
    else:
        pads = attrs.get("pads", [0] * 2 * s) if auto == "NOTSET" else [0] * 2 * s
        sp = [(i + pads[d] + pads[d + s] - ((k - 1) * dl + 1)) // st + 1
              for d, (i, k, st, dl) in enumerate(zip(xs[2:], ks, strides, dils, strict=True))]
    return (xs[0], oc, *sp)


def conv_case(name, xs, oc, ks, group=1, bias=True, post=(), **attrs) -> Case:
    p = name
    w = _rand(oc, xs[1] // group, *ks)
    inits = [const(f"{p}_w", w)]
    ins = [f"{p}_x", f"{p}_w"]
    if bias:
        inits.append(const(f"{p}_b", _rand(oc)))
        ins.append(f"{p}_b")
    nodes = [helper.make_node("Conv", ins, [f"{p}_c"], group=group, **attrs)]
    inputs = [tensor(f"{p}_x", list(xs))]
    feeds = {f"{p}_x": _rand(*xs)}
    cur = f"{p}_c"
    out_shape = _out_shape(xs, oc, ks, attrs)
    for i, op in enumerate(post):
        nxt = f"{p}_e{i}"
        if op == "Relu":
            nodes.append(helper.make_node("Relu", [cur], [nxt]))
        elif op == "Clip":
            inits += [const(f"{nxt}_lo", np.float32(0.0)), const(f"{nxt}_hi", np.float32(6.0))]
            nodes.append(helper.make_node("Clip", [cur, f"{nxt}_lo", f"{nxt}_hi"], [nxt]))
        elif op == "Sigmoid":
            nodes.append(helper.make_node("Sigmoid", [cur], [nxt]))
        elif op == "SiLU":
            nodes.append(helper.make_node("Sigmoid", [cur], [f"{nxt}_s"]))
            nodes.append(helper.make_node("Mul", [cur, f"{nxt}_s"], [nxt]))
        elif op == "residual":  # a same-shape run-time tensor
            inputs.append(tensor(f"{nxt}_r", list(out_shape)))
            feeds[f"{nxt}_r"] = _rand(*out_shape)
            nodes.append(helper.make_node("Add", [f"{nxt}_r", cur], [nxt]))
        elif op == "chan_mul":  # per-channel scale [OC, 1, 1]
            inits.append(const(f"{nxt}_s", _rand(oc, *([1] * len(ks)))))
            nodes.append(helper.make_node("Mul", [cur, f"{nxt}_s"], [nxt]))
        elif op == "scalar_sub":
            inits.append(const(f"{nxt}_s", np.array([0.25], np.float32)))
            nodes.append(helper.make_node("Sub", [f"{nxt}_s", cur], [nxt]))
        else:
            raise ValueError(op)
        cur = nxt
    return Case(name, nodes, inputs, inits, cur, feeds)


PAD1 = dict(pads=[1, 1, 1, 1])

CONV2D_CASES = [
    # 1x1 direct GEMM: channels and positions around MR=8 / NR=48; K (=C) above KC=384
    conv_case("pw_small", (1, 3, 1, 1), 1, (1, 1)),
    conv_case("pw_7x47", (1, 5, 1, 47), 7, (1, 1), post=("Relu",)),
    conv_case("pw_8x48", (1, 16, 6, 8), 8, (1, 1), bias=False),
    conv_case("pw_9x49", (1, 9, 7, 7), 9, (1, 1), post=("residual", "Relu")),
    conv_case("pw_k400", (1, 400, 5, 10), 17, (1, 1), post=("Clip",)),
    conv_case("pw_nc", (1, 6, 26, 26), 24, (1, 1)),  # 676 positions > NC=672
    conv_case("pw_batch_group", (3, 8, 5, 6), 12, (1, 1), group=2, post=("chan_mul",)),
    conv_case("pw_stride2", (1, 6, 9, 9), 10, (1, 1), strides=[2, 2]),
    conv_case("pw_pad", (1, 4, 5, 5), 6, (1, 1), pads=[1, 0, 0, 2]),
    # im2col GEMM, stride 1 (masked-load packing)
    conv_case("c3_pad1", (1, 3, 9, 9), 5, (3, 3), **PAD1),
    conv_case("c3_nopad", (1, 4, 8, 10), 16, (3, 3), post=("Relu",)),
    conv_case("c3_asym", (2, 5, 7, 11), 9, (3, 2), pads=[2, 0, 1, 3], post=("scalar_sub",)),
    conv_case("c3_dil", (1, 3, 12, 12), 8, (3, 3), dilations=[2, 3], pads=[2, 3, 2, 3]),
    conv_case("c3_k_above_kc", (1, 50, 8, 8), 33, (3, 3), **PAD1, post=("residual",)),
    conv_case("c3_wide", (1, 2, 3, 100), 4, (3, 3), **PAD1),
    conv_case("c3_narrow_rows", (1, 2, 30, 2), 4, (3, 3), **PAD1),  # many row segments per panel
    conv_case("c5_big_pad", (1, 2, 4, 4), 3, (5, 5), pads=[4, 4, 4, 4]),
    conv_case("c3_one_out", (1, 3, 3, 3), 2, (3, 3)),
    conv_case("c3_nc", (1, 3, 28, 28), 8, (3, 3), **PAD1, post=("Clip",)),  # 784 positions
    # strided (gather packing)
    conv_case("c7s2", (1, 3, 23, 23), 16, (7, 7), strides=[2, 2], pads=[3, 3, 3, 3], post=("Relu",)),
    conv_case("c3s2", (1, 8, 14, 14), 12, (3, 3), strides=[2, 2], **PAD1),
    conv_case("c3s3_dil", (2, 3, 17, 16), 5, (3, 3), strides=[3, 2], dilations=[2, 1], pads=[0, 1, 2, 0]),
    conv_case("c2s2_odd", (1, 3, 9, 7), 6, (2, 2), strides=[2, 2]),
    conv_case("c3_sw3", (1, 4, 10, 23), 6, (3, 3), strides=[1, 3], pads=[1, 2, 0, 1]),  # gathers
    # auto_pad
    conv_case("same_upper", (1, 3, 9, 8), 4, (3, 3), auto_pad="SAME_UPPER"),
    conv_case("same_lower", (1, 3, 9, 8), 4, (4, 4), auto_pad="SAME_LOWER"),
    conv_case("same_upper_s2", (1, 3, 11, 10), 4, (3, 3), strides=[2, 2], auto_pad="SAME_UPPER"),
    conv_case("same_lower_s2", (1, 3, 11, 10), 4, (2, 2), strides=[2, 2], auto_pad="SAME_LOWER"),
    conv_case("valid", (1, 3, 9, 8), 4, (3, 2), auto_pad="VALID", post=("Sigmoid",)),
    # groups
    conv_case("grp2", (1, 4, 8, 8), 6, (3, 3), group=2, **PAD1, post=("Relu",)),
    conv_case("grp3_batch", (2, 9, 6, 7), 12, (3, 3), group=3, strides=[2, 1], **PAD1),
    conv_case("grp4_nobias", (1, 16, 5, 5), 16, (3, 3), group=4, bias=False),
    # depthwise (direct)
    conv_case("dw3", (1, 8, 9, 9), 8, (3, 3), group=8, **PAD1, post=("Clip",)),
    conv_case("dw3_s2", (2, 6, 11, 10), 6, (3, 3), group=6, strides=[2, 2], **PAD1, post=("residual",)),
    conv_case("dw5_dil", (1, 5, 12, 13), 5, (5, 5), group=5, dilations=[2, 1], pads=[4, 2, 4, 2]),
    conv_case("dw_mult2", (1, 4, 7, 7), 8, (3, 3), group=4, bias=False, post=("SiLU",)),
    conv_case("dw_same", (1, 32, 14, 14), 32, (3, 3), group=32, auto_pad="SAME_UPPER", post=("Relu",)),
    conv_case("dw_valid_s2", (1, 3, 8, 9), 3, (3, 2), group=3, strides=[2, 3]),
    conv_case("dw_big", (1, 64, 30, 30), 64, (3, 3), group=64, **PAD1, post=("chan_mul", "Relu")),
    conv_case("dw_big_s2", (2, 8, 41, 40), 8, (3, 3), group=8, strides=[2, 2], **PAD1, post=("residual",)),
    conv_case("dw_wide", (1, 2, 3, 150), 2, (3, 3), group=2, **PAD1, post=("Sigmoid",)),
]

CONV_ND_CASES = [
    conv_case("c1d", (1, 5, 17), 7, (3,), pads=[1, 2]),
    conv_case("c1d_s2", (2, 4, 30), 9, (5,), strides=[2], dilations=[2], pads=[3, 0], post=("Relu",)),
    conv_case("c1d_same", (1, 3, 50), 8, (4,), auto_pad="SAME_UPPER"),
    conv_case("c1d_pw", (1, 16, 100), 10, (1,)),
    conv_case("c1d_dw", (1, 6, 40), 6, (3,), group=6, pads=[1, 1], post=("residual",)),
    conv_case("c1d_grp", (1, 6, 20), 4, (3,), group=2),
    # one input channel, no padding: the im2col matrix is a strided window view (an STFT frontend)
    conv_case("c1d_window_stft", (1, 1, 1760), 257, (512,), strides=[160]),  # N=8: column kernel
    conv_case("c1d_window_dil", (2, 1, 100), 9, (5,), strides=[3], dilations=[2], post=("Relu",)),
    conv_case("c1d_window_s1", (1, 1, 70), 17, (7,), bias=False),
    conv_case("c3d", (1, 3, 5, 6, 7), 4, (3, 2, 3), pads=[1, 0, 1, 1, 1, 0]),
    conv_case("c3d_s2", (2, 2, 7, 6, 9), 9, (3, 3, 3), strides=[2, 1, 2], dilations=[1, 2, 1],
              pads=[1, 2, 0, 0, 1, 1], post=("Relu",)),
    conv_case("c3d_pw", (1, 8, 3, 4, 5), 5, (1, 1, 1)),
    conv_case("c3d_dw", (1, 4, 4, 5, 6), 4, (3, 3, 3), group=4, pads=[1] * 6),
    conv_case("c3d_same", (1, 2, 5, 5, 5), 3, (2, 2, 2), auto_pad="SAME_LOWER"),
]


def _check(cases: list[Case], isa: str, monkeypatch, cache) -> None:
    def structure(compiled, target):
        assert [op for _, op in compiled.native_nodes] == ["Conv"] * len(cases)  # epilogues fused

    check_cases(cases, isa, monkeypatch, cache, structure)


@pytest.mark.parametrize("isa", ["native", "avx2", "scalar"])
def test_conv2d(isa, monkeypatch, cache):
    _check(CONV2D_CASES if isa == "native" else CONV2D_CASES[1::2], isa, monkeypatch, cache)


@pytest.mark.parametrize("isa", ["native", "avx2", "scalar"])
def test_conv_1d_3d(isa, monkeypatch, cache):
    _check(CONV_ND_CASES, isa, monkeypatch, cache)


def test_resnet_like_layers(monkeypatch, cache):
    """Full-size layers: many K blocks, NC blocks and a thread grid over positions/channels."""
    cases = [
        conv_case("r_3x3", (1, 64, 56, 56), 64, (3, 3), **PAD1, post=("Relu",)),
        conv_case("r_1x1", (1, 256, 14, 14), 128, (1, 1), post=("residual", "Relu")),
        conv_case("r_7x7", (1, 512, 7, 7), 80, (3, 3), **PAD1),
        conv_case("r_s2", (1, 64, 28, 28), 96, (3, 3), strides=[2, 2], **PAD1),
    ]
    _check(cases, "native", monkeypatch, cache)


def test_kernel_header_comments(monkeypatch, cache):
    monkeypatch.setenv("SMELT_CACHE_DIR", str(cache))
    monkeypatch.setenv("SMELT_DEBUG", "1")  # keeps the generated C (source_path)
    cases = [conv_case("h_pw", (1, 8, 4, 4), 8, (1, 1)), conv_case("h_3x3", (1, 4, 6, 6), 8, (3, 3)),
             conv_case("h_dw", (1, 4, 6, 6), 4, (3, 3), group=4)]
    model, feeds = _model(cases)
    compiled = smelt.compile(model, threads=2, layout="nchw")
    src = compiled.source_path.read_text()
    assert "template: f32_conv2d_1x1_gemm_" in src
    assert "template: f32_conv2d_im2col_gemm_" in src
    assert "template: f32_conv2d_depthwise_direct" in src


def test_runtime_weights_run_natively(monkeypatch, cache):
    """Weights given as a graph input take the direct kernel of templates/conv_runtime.py (more
    shapes in tests/kernels/test_node_ops_b.py); constant ones never do."""
    monkeypatch.setenv("SMELT_CACHE_DIR", str(cache))
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"])],
                       [tensor("x", [1, 2, 5, 5]), tensor("w", [3, 2, 3, 3])], [tensor("y", [1, 3, 3, 3])])
    compiled = smelt.compile(model, threads=1)
    assert compiled.fallback_nodes == []
    infos = list(compiled.plan.step_infos())
    assert {i.schedule.get("template") for i in infos} == {"f32_conv_runtime_weights"}, infos
    assert "GEMM" in infos[-1].schedule.get("algorithm", ""), infos[-1].schedule
    feeds = {"x": _rand(1, 2, 5, 5), "w": _rand(3, 2, 3, 3)}
    np.testing.assert_allclose(compiled.run(feeds)[0], ort_run(model, feeds)[0], atol=1e-5)


def test_conv_with_an_unknown_shape_is_a_reason_not_a_crash():
    """A Conv whose input shape inference could not fix (silero-vad's, shipped in its PyPI
    wheel: the input comes out of an If) reached the layout planner's NCHWc test, which took
    len() of a None shape: TypeError at compile time. It is a reason now, so the conv falls
    back (or runs on the GEMM path once shapes are known at run time)."""
    from smelt.codegen.kernels.conv_geometry import check_conv
    from smelt.ir.graph import Graph, Node, Value

    g = Graph("g")
    g.add_value(Value("x", np.dtype(np.float32), None))
    w = g.add_const(np.ones((8, 4, 3, 3), np.float32), "w")
    g.add_value(Value("y", np.dtype(np.float32), None))
    node = Node("Conv", "conv", ["x", w], ["y"])
    why = check_conv(node, g)
    assert why is not None and "'x'" in why and "static shape" in why
