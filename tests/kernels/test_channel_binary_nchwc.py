"""Squeeze-and-excitation blocks on blocked layouts: an image's spatial mean written as ReduceMean
becomes GlobalAveragePool (passes/spatial_mean.py), and a binary op of a blocked value and one
value per channel ([N or 1, C, 1, 1]) runs on the blocked layout (templates/elementwise.py
``blocked_channel_operand``), so neither turns the feature map back to plain. Against
onnxruntime at every ISA, 1 and 2 threads: gates per image (batch 2) and shared (a graph input),
the gate as either operand of a non-commutative op, runs of positions with a ragged last one,
the serial and the threaded split."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import const, make_model, tensor
from kernel_models import Chain, _rand, check_cases
from onnx import helper

from smelt.compiler import lower
from smelt.frontend.onnx_import import load_model
from smelt.options import CompileOptions


def _se(chain: Chain, op: str = "Mul", gate_first: bool = False, reduce: str = "ReduceMean",
        gate_input: bool = False, residual: bool = False) -> Chain:
    """``op(x, gate)`` (or ``op(gate, x)``) with the gate HardSigmoid(Conv(Relu(Conv(mean(x)))))
    (PP-LCNet's SE block), or a [1, C, 1, 1] graph input; ``residual``: x + op(x, gate), x read
    twice (RSE-FPN)."""
    x, shape = chain.cur, list(chain.shape)
    n, c = shape[:2]
    if gate_input:
        gate = chain._name("gate")
        chain.inputs.append(tensor(gate, [1, c, 1, 1]))
        chain.feeds[gate] = (_rand(1, c, 1, 1) + 2).astype(np.float32)  # in [1, 3]: a divisor
    else:
        if reduce == "ReduceMean":
            chain._op("ReduceMean", [x], axes=[2, 3], keepdims=1)
        else:
            chain._op("GlobalAveragePool", [x])
        chain.shape = [n, c, 1, 1]
        chain.conv(max(4, c // 4), (1, 1), post=("Relu",)).conv(c, (1, 1), post=("HardSigmoid",))
        gate = chain.cur
    chain.cur, chain.shape = x, shape
    chain._op(op, [gate, x] if gate_first else [x, gate])
    if residual:
        chain._op("Add", [x, chain.cur])
    return chain


def _cases():
    C = Chain
    return [
        # the SE block of PP-LCNet: 32 channels (two 16-blocks, four 8-blocks), then a 1x1 conv
        _se(C("se_mul", (1, 32, 9, 11)).conv(32, (3, 3), pads=(1, 1, 1, 1))).conv(16, (1, 1)).case(),
        # batch 2: a gate per image; the gate first in a Sub (gate - x); GlobalAveragePool spelled so
        _se(C("se_sub", (2, 48, 7, 5)).conv(48, (1, 1)), op="Sub", gate_first=True,
            reduce="GlobalAveragePool").conv(16, (1, 1)).case(),
        # a shared gate from a graph input (plain [1, C, 1, 1]), x / gate + x (x read twice, so no
        # conv takes the Div as its epilogue), 24 channels
        _se(C("se_div", (2, 24, 6, 6)).conv(24, (3, 3), pads=(1, 1, 1, 1)), op="Div", gate_input=True, residual=True)
        .conv(8, (1, 1)).case(),
        # RSE-FPN's x + x * gate on a plane of 1320 positions: runs of 256 with a ragged last one,
        # more than the serial threshold of elements (the threaded split)
        _se(C("rse", (1, 32, 40, 33)).conv(32, (1, 1)), residual=True).conv(16, (3, 3), pads=(1, 1, 1, 1)).case(),
    ]


@pytest.mark.parametrize("isa", ["native", "avx2", "scalar"])
def test_se_blocks_stay_blocked(isa, monkeypatch, tmp_path):
    monkeypatch.setenv("SMELT_DEBUG", "1")  # keeps the generated C (source_path)

    def check(compiled, target):
        src = compiled.source_path.read_text()
        steps = src.count("f32_eltwise_channel_nchwc_")
        if isa == "scalar":  # no blocked layouts without vectors
            assert steps == 0
            return
        assert steps >= 4, "an SE block's gate op ran plain"
        ops = [op for _, op in compiled.native_nodes]
        assert "ReduceMean" not in ops and ops.count("GlobalAveragePool") == 3, ops
        # the outputs leave through a transform, the first input enters through one: no feature
        # map goes to plain and back
        assert ops.count("LayoutTransform") <= len(_cases()) + 1, ops

    check_cases(_cases(), isa, monkeypatch, tmp_path, check, layout="propagate")


def _mean_graph(axes, keepdims=1, shape=(1, 8, 5, 6), opset=17):
    x = tensor("x", list(shape))
    if opset >= 18:
        node = helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=keepdims)
        inits = [const("axes", np.array(axes, np.int64))]
    else:
        node = helper.make_node("ReduceMean", ["x"], ["y"], axes=axes, keepdims=keepdims)
        inits = []
    model = make_model([node], [x], [helper.make_tensor_value_info("y", 1, None)], inits, opset=opset)
    return lower(load_model(model), CompileOptions(threads=1))


@pytest.mark.parametrize(("axes", "keepdims", "shape", "opset", "pooled"), [
    ([2, 3], 1, (1, 8, 5, 6), 17, True),
    ([-1, -2], 1, (2, 8, 5, 6), 17, True),
    ([2, 3], 1, (1, 8, 5, 6), 18, True),  # axes as an input
    ([2, 3], 0, (1, 8, 5, 6), 17, False),  # [N, C]: not GlobalAveragePool's shape
    ([1, 2], 1, (1, 8, 5, 6), 17, False),
    ([2], 1, (1, 8, 5, 6), 17, False),
    ([1, 2], 1, (1, 8, 5), 17, False),  # rank 3
])
def test_spatial_mean_is_global_average_pool(axes, keepdims, shape, opset, pooled):
    g = _mean_graph(axes, keepdims, shape, opset)
    ops = [n.op for n in g.nodes]
    assert ("GlobalAveragePool" in ops) == pooled and ("ReduceMean" in ops) != pooled, ops
