"""onnxruntime's dynamic quantization chain as one MatMulIntegerToFloat
(passes/matmul_integer_to_float.py): MatMulInteger → Cast → Mul(scale) [→ Add(bias)], the scale
the product of a run-time one-element scale and a constant per tensor or per column, or a
constant. What is fused and what is not; the answer bit for bit the graph's as written
(``onnx.reference``, and smelt with the pass off) at every ISA, 1 and 2 threads, K past the
quads and ragged N; A's zero point at run time."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import const, make_model, tensor
from kernel_models import AVX_VNNI, force_isa
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import smelt
from smelt.compiler import lower
from smelt.options import CompileOptions

RNG = np.random.default_rng(1129)
ISAS = ["native", "avx2", AVX_VNNI, "scalar"]


def _model(n: int = 37, k: int = 70, m: int = 5):
    """x [M, K] through DynamicQuantizeLinear into five chains: a per-column scale product and a
    bias (fused), a per-tensor product without a bias (fused), a constant scale with a bias
    (fused), a chain whose Cast output is read twice (kept), and one whose activation scale is
    computed after the product in node order (fused, and run where the chain's last node ran)."""
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"])]
    inits = []
    outs = []
    for i, (scale, bias, twice) in enumerate((("column", True, False), ("tensor", False, False),
                                              ("const", True, False), ("tensor", False, True),
                                              ("late", True, False))):
        w = RNG.integers(-128, 128, (k, n)).astype(np.int8)
        inits += [const(f"w{i}", w), const(f"wz{i}", np.int8(0))]
        nodes.append(helper.make_node("MatMulInteger", ["xq", f"w{i}", "xz", f"wz{i}"], [f"acc{i}"]))
        nodes.append(helper.make_node("Cast", [f"acc{i}"], [f"f{i}"], to=TensorProto.FLOAT))
        if scale == "const":
            inits.append(const(f"s{i}", RNG.uniform(1e-4, 1e-3, n).astype(np.float32)))
        elif scale == "late":  # the activation's scale computed after the product, in node order
            inits += [const(f"one{i}", np.float32(1.0)), const(f"ws{i}", RNG.uniform(0.001, 0.01, n).astype(np.float32))]
            nodes += [helper.make_node("Mul", ["xs", f"one{i}"], [f"xs{i}"]),
                      helper.make_node("Mul", [f"xs{i}", f"ws{i}"], [f"s{i}"])]
        else:
            ws = RNG.uniform(0.001, 0.01, n if scale == "column" else ()).astype(np.float32)
            inits.append(const(f"ws{i}", ws))
            nodes.append(helper.make_node("Mul", ["xs", f"ws{i}"], [f"s{i}"]))
        nodes.append(helper.make_node("Mul", [f"f{i}", f"s{i}"], [f"m{i}"]))
        y = f"m{i}"
        if bias:
            inits.append(const(f"b{i}", RNG.standard_normal(n).astype(np.float32)))
            nodes.append(helper.make_node("Add", [f"b{i}", y], [f"y{i}"]))
            y = f"y{i}"
        if twice:
            nodes.append(helper.make_node("Add", [f"f{i}", y], [f"t{i}"]))
            y = f"t{i}"
        outs.append(y)
    return make_model(nodes, [tensor("x", [m, k])], [tensor(o, None) for o in outs], inits, opset=17)


def test_what_is_fused() -> None:
    ops = [n.op for n in lower(_model(), CompileOptions(threads=1)).nodes]
    assert ops.count("MatMulIntegerToFloat") == 4 and ops.count("MatMulInteger") == 1, ops
    assert ops.count("Cast") == 1, ops  # the chain whose Cast is read twice
    off = [n.op for n in lower(_model(), CompileOptions(threads=1, matmul_integer_to_float=False)).nodes]
    assert "MatMulIntegerToFloat" not in off and off.count("MatMulInteger") == 5, off


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("mkn", [(5, 70, 37), (40, 200, 300)])  # the second: B past the L1, rows inner
def test_fused_chains_answer_as_written(isa: str, threads: int, mkn: tuple, monkeypatch, tmp_path) -> None:
    force_isa(isa, monkeypatch, tmp_path)
    m, k, n = mkn
    model = _model(n=n, k=k, m=m)
    feeds = {"x": (RNG.standard_normal((m, k)) * 3).astype(np.float32)}
    want = ReferenceEvaluator(model).run(None, feeds)
    fused = smelt.compile(model, threads=threads)
    assert fused.fallback_nodes == [], fused.fallback_report
    unfused = smelt.compile(model, threads=threads, schedule={"matmul_integer_to_float": False})
    for got, plain, ref in zip(fused.run(feeds), unfused.run(feeds), want, strict=True):
        np.testing.assert_array_equal(got, ref)
        np.testing.assert_array_equal(got, plain)
