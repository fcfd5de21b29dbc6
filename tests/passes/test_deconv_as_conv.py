"""ConvTranspose with stride == kernel becomes a 1x1 Conv + DepthToSpace (passes/deconv_as_conv.py),
with the per-channel Add, BatchNorm and activations after it moved onto the conv (DBNet's head in
PP-OCR's detectors); other ConvTransposes stay. Against onnxruntime at every ISA, 1 and 2 threads,
NCHWc and NCHW layouts."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import const, make_model, tensor
from kernel_models import Case, check_cases
from onnx import helper

from smelt.compiler import lower
from smelt.frontend.onnx_import import load_model
from smelt.options import CompileOptions

RNG = np.random.default_rng(44)


def _f32(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _dbnet_head(name: str, c: int = 16, s: int = 2, hw=(9, 7)) -> Case:
    """ConvTranspose(s, no bias) -> Add(bias [1, C, 1, 1]) -> BatchNorm -> Relu -> ConvTranspose(to 1
    channel, bias) -> Add(scalar) -> Sigmoid."""
    p = f"{name}_"
    nodes = [helper.make_node("ConvTranspose", [p + "x", p + "w1"], [p + "t1"], kernel_shape=[s, s], strides=[s, s]),
             helper.make_node("Add", [p + "t1", p + "b1"], [p + "a1"]),
             helper.make_node("BatchNormalization", [p + "a1", p + "g", p + "be", p + "m", p + "v"], [p + "bn"]),
             helper.make_node("Relu", [p + "bn"], [p + "r"]),
             helper.make_node("ConvTranspose", [p + "r", p + "w2", p + "b2"], [p + "t2"], kernel_shape=[s, s],
                              strides=[s, s]),
             helper.make_node("Add", [p + "t2", p + "k"], [p + "a2"]),
             helper.make_node("Sigmoid", [p + "a2"], [p + "y"])]
    inits = [const(p + "w1", _f32(c, c, s, s) * 0.3), const(p + "b1", _f32(1, c, 1, 1)),
             const(p + "g", _f32(c)), const(p + "be", _f32(c)), const(p + "m", _f32(c)),
             const(p + "v", np.abs(_f32(c)) + 0.5), const(p + "w2", _f32(c, 1, s, s) * 0.3), const(p + "b2", _f32(1)),
             const(p + "k", np.float32(0.1))]
    x = p + "x"
    return Case(name, nodes, [tensor(x, [1, c, *hw])], inits, p + "y", {x: _f32(1, c, *hw)})


def _single(name: str, **attrs) -> Case:
    """One ConvTranspose (with bias) and a Mul by a per-channel constant after it."""
    p = f"{name}_"
    ks = attrs.get("kernel_shape", [2, 2])
    nodes = [helper.make_node("ConvTranspose", [p + "x", p + "w", p + "b"], [p + "t"], **attrs),
             helper.make_node("Mul", [p + "sc", p + "t"], [p + "y"])]
    inits = [const(p + "w", _f32(8, 16, *ks)), const(p + "b", _f32(16)), const(p + "sc", _f32(16, 1, 1))]
    x = p + "x"
    return Case(name, nodes, [tensor(x, [2, 8, 5, 6])], inits, p + "y", {x: _f32(2, 8, 5, 6)})


REWRITTEN = [_dbnet_head("dbnet"), _dbnet_head("s3", c=8, s=3, hw=(4, 5)),
             _single("single", kernel_shape=[2, 2], strides=[2, 2])]
KEPT = [_single("overlap", kernel_shape=[3, 3], strides=[2, 2]),
        _single("padded", kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1]),
        _single("out_pad", kernel_shape=[2, 2], strides=[2, 2], output_padding=[1, 1])]


def _ops(case: Case) -> list[str]:
    model = load_model(make_model(case.nodes, case.inputs, [tensor(case.output, None)], case.inits))
    return [n.op for n in lower(model, CompileOptions(threads=1)).nodes]


@pytest.mark.parametrize("case", REWRITTEN, ids=lambda c: c.name)
def test_rewritten_and_readers_moved_onto_the_conv(case):
    ops = _ops(case)
    assert "ConvTranspose" not in ops and ops.count("DepthToSpace") >= 1
    # everything after each DepthToSpace moved before it and fused: only layout moves remain
    assert set(ops) <= {"Conv", "DepthToSpace", "LayoutTransform"}, ops


@pytest.mark.parametrize("case", KEPT, ids=lambda c: c.name)
def test_overlapping_or_padded_stay(case):
    assert "ConvTranspose" in _ops(case)


@pytest.mark.parametrize("layout", ["propagate", "nchw"])
@pytest.mark.parametrize("isa", ["native", "avx2", "scalar"])
def test_matches_onnxruntime(isa, layout, monkeypatch, tmp_path):
    def check(compiled, target):
        ops = [op for _, op in compiled.native_nodes]
        assert ops.count("ConvTranspose") == len(KEPT) and ops.count("DepthToSpace") == 5, ops

    check_cases(REWRITTEN + KEPT, isa, monkeypatch, tmp_path, check, layout=layout, winograd=False)
