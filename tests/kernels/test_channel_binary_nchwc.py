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
from kernel_models import check_cases, se_block_cases
from onnx import helper

from smelt.compiler import lower
from smelt.frontend.onnx_import import load_model
from smelt.options import CompileOptions


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
        assert ops.count("LayoutTransform") <= len(se_block_cases()) + 1, ops

    check_cases(se_block_cases(), isa, monkeypatch, tmp_path, check, layout="propagate")


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
