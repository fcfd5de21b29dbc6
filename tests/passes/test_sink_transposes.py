"""Transposes sunk through element-wise ops and cancelled in pairs (passes/sink_transposes.py),
and same-type Casts removed (passes/eliminate_identity.py): a PyTorch export of a TensorFlow-
ported ResNet block (NCHW convs, NHWC bias/BatchNorm/Relu between them spelled as Transpose,
float->float Cast, Add, Sub, Mul, Add, Relu, Transpose back; a residual Add of two transposed
convs, one of them also read back in NCHW). Against onnxruntime at every ISA, 1 and 2 threads,
and what is left: no Cast, one Transpose (the NHWC graph output), every element-wise op fused."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import const, make_model, tensor
from kernel_models import Case, check_cases
from onnx import TensorProto, helper

from smelt.compiler import lower
from smelt.frontend.onnx_import import load_model
from smelt.options import CompileOptions

RNG = np.random.default_rng(1128)
TO_NHWC, TO_NCHW = [0, 2, 3, 1], [0, 3, 1, 2]


def _f32(*shape, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _block(name: str, c: int = 16, hw: tuple[int, int] = (9, 11)) -> Case:
    p = f"{name}_"
    nodes, inits = [], []

    def conv(x: str, oc: int, ic: int, y: str) -> None:
        nodes.append(helper.make_node("Conv", [x, p + y + "_w"], [y], pads=[1, 1, 1, 1]))
        inits.append(const(p + y + "_w", _f32(oc, ic, 3, 3, scale=0.2)))

    def nhwc_epilogue(x: str, oc: int, y: str, relu: bool = True) -> None:
        """x NCHW -> NHWC -> Cast -> +bias -> (-mean) * scale + shift -> Relu; y stays NHWC."""
        nodes.extend([helper.make_node("Transpose", [x], [y + "_t"], perm=TO_NHWC),
                      helper.make_node("Cast", [y + "_t"], [y + "_c"], to=TensorProto.FLOAT),
                      helper.make_node("Add", [y + "_c", p + y + "_b"], [y + "_a"]),
                      helper.make_node("Sub", [y + "_a", p + y + "_m"], [y + "_s"]),
                      helper.make_node("Mul", [y + "_s", p + y + "_k"], [y + "_x"]),
                      helper.make_node("Add", [y + "_x", p + y + "_h"], [y if not relu else y + "_n"])])
        if relu:
            nodes.append(helper.make_node("Relu", [y + "_n"], [y]))
        inits.extend([const(p + y + "_b", _f32(oc)), const(p + y + "_m", _f32(oc)),
                      const(p + y + "_k", np.abs(_f32(oc)) + 0.5), const(p + y + "_h", _f32(1, 1, oc))])

    x = p + "x"
    conv(x, c, c, p + "c1")
    nhwc_epilogue(p + "c1", c, p + "e1")                      # NHWC
    nodes.append(helper.make_node("Transpose", [p + "e1"], [p + "e1n"], perm=TO_NCHW))
    conv(p + "e1n", c, c, p + "c2")                           # the shortcut conv
    nhwc_epilogue(p + "c2", c, p + "e2", relu=False)
    nodes.append(helper.make_node("Transpose", [p + "e2"], [p + "e2n"], perm=TO_NCHW))  # read back NCHW too
    conv(p + "e2n", c, c, p + "c3")
    nhwc_epilogue(p + "c3", c, p + "e3", relu=False)
    nodes.extend([helper.make_node("Add", [p + "e2", p + "e3"], [p + "sum"]),   # residual, in NHWC
                  helper.make_node("Relu", [p + "sum"], [p + "y"])])           # the NHWC output
    return Case(name, nodes, [tensor(x, [2, c, *hw])], inits, p + "y", {x: _f32(2, c, *hw)})


def _broadcast(name: str) -> Case:
    """A transposed [1, 1, 1, 8] value added to a [1, 5, 6, 8] constant: moving the transpose after
    the Add would move the broadcast output, 30 times larger; it stays."""
    p = f"{name}_"
    nodes = [helper.make_node("Transpose", [p + "x"], [p + "t"], perm=TO_NHWC),
             helper.make_node("Add", [p + "t", p + "big"], [p + "y"])]
    x = p + "x"
    return Case(name, nodes, [tensor(x, [1, 8, 1, 1])], [const(p + "big", _f32(1, 5, 6, 8))], p + "y",
                {x: _f32(1, 8, 1, 1)})


CASES = [_block("blk"), _block("odd", c=8, hw=(7, 5)), _broadcast("bcast")]


def _lowered(case: Case, **options):
    model = load_model(make_model(case.nodes, case.inputs, [tensor(case.output, None)], case.inits))
    return lower(model, CompileOptions(threads=1, **options))


@pytest.mark.parametrize("case", CASES[:2], ids=lambda c: c.name)
def test_nhwc_chains_fold_into_the_convs(case):
    g = _lowered(case)
    ops = [n.op for n in g.nodes]
    assert "Cast" not in ops and ops.count("Transpose") == 1, ops
    assert not {"Add", "Sub", "Mul", "Relu"} & set(ops), ops
    assert all(n.epilogue for n in g.nodes if n.op == "Conv")
    off = [n.op for n in _lowered(case, sink_transposes=False).nodes]
    assert off.count("Transpose") == 5, off


def test_a_broadcast_that_grows_keeps_its_transpose():
    ops = [n.op for n in _lowered(CASES[2]).nodes]
    assert ops.index("Transpose") < ops.index("Add"), ops


def test_transposes_that_undo_each_other_into_a_graph_output():
    """T(T^-1(x)) as the graph output: an Identity keeps its name; a Cast to another type stays."""
    nodes = [helper.make_node("Transpose", ["x"], ["a"], perm=TO_NHWC),
             helper.make_node("Transpose", ["a"], ["y"], perm=TO_NCHW),
             helper.make_node("Cast", ["x"], ["z"], to=TensorProto.DOUBLE)]
    model = make_model(nodes, [tensor("x", [1, 3, 4, 5])], [tensor("y", None), tensor("z", None, TensorProto.DOUBLE)])
    import smelt

    x = _f32(1, 3, 4, 5)
    compiled = smelt.compile(model, threads=1)
    y, z = compiled.run({"x": x})
    np.testing.assert_array_equal(y, x)
    assert z.dtype == np.float64 and np.array_equal(z, x.astype(np.float64))
    ops = [op for _, op in compiled.native_nodes]
    assert "Transpose" not in ops and "Cast" in ops, ops


@pytest.mark.parametrize("isa", ["native", "avx2", "scalar"])
def test_matches_onnxruntime(isa, monkeypatch, tmp_path):
    check_cases(CASES, isa, monkeypatch, tmp_path, lambda compiled, target: None, layout="propagate")
