"""An If only the run decides (passes/runtime_if.py, codegen/guards.py): both branches compile
natively under a one-element Where, and the steps of the branch not taken return at once. Against
onnxruntime at every ISA this host runs, 1 and 2 threads, each branch taken."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import const, make_model, ort_run, tensor
from kernel_models import force_isa
from onnx import TensorProto, helper

import smelt
from smelt.codegen.plan import build_plan
from smelt.errors import SmeltError
from smelt.frontend.onnx_import import to_ir
from smelt.passes.pipeline import run_passes

RNG = np.random.default_rng(15)
ISAS = ["native", "avx2", "scalar"]


def _branch(name: str, nodes, outs, inits=()) -> onnx.GraphProto:
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs],
                             initializer=list(inits))


def _mlp(prefix: str, x: str, dims: list[int], out: str) -> tuple[list, list]:
    """Gemm -> LayerNorm (decomposed, as torch exports it) -> Relu per layer, then Gemm -> Sigmoid."""
    nodes, inits, cur = [], [], x
    for k, (a, b) in enumerate(zip(dims, dims[1:], strict=False)):
        w, bias = f"{prefix}w{k}", f"{prefix}b{k}"
        inits += [const(w, (RNG.standard_normal((b, a)) / np.sqrt(a)).astype(np.float32)),
                  const(bias, RNG.standard_normal(b).astype(np.float32) * 0.1)]
        g = f"{prefix}g{k}"
        nodes.append(helper.make_node("Gemm", [cur, w, bias], [g], transB=1))
        if k + 2 < len(dims):
            m, d, sq, v, s, n = (f"{prefix}{t}{k}" for t in ("m", "d", "sq", "v", "s", "n"))
            nodes += [helper.make_node("ReduceMean", [g], [m], axes=[-1]),
                      helper.make_node("Sub", [g, m], [d]),
                      helper.make_node("Mul", [d, d], [sq]),
                      helper.make_node("ReduceMean", [sq], [v], axes=[-1]),
                      helper.make_node("Add", [v, "eps"], [s]),
                      helper.make_node("Sqrt", [s], [f"{s}r"]),
                      helper.make_node("Div", [d, f"{s}r"], [n]),
                      helper.make_node("Relu", [n], [f"{prefix}h{k}"])]
            cur = f"{prefix}h{k}"
        else:
            nodes.append(helper.make_node("Sigmoid", [g], [out]))
    return nodes, inits


def _wake_word_model(threshold: float) -> onnx.ModelProto:
    """openWakeWord's hey-jarvis head: p = MLP(x); y = If(p >= threshold, verifier(x), p)."""
    head, head_w = _mlp("h", "flat", [96, 32, 32, 1], "p")
    ver, ver_w = _mlp("v", "vflat", [96, 16, 16, 1], "p2")
    then = _branch("then", [helper.make_node("Flatten", ["x"], ["vflat"])] + ver, ["p2"], ver_w)
    other = _branch("else", [helper.make_node("Identity", ["p"], ["p_out"])], ["p_out"])
    nodes = [helper.make_node("Flatten", ["x"], ["flat"])] + head + [
        helper.make_node("GreaterOrEqual", ["p", "thr"], ["c"]),
        helper.make_node("If", ["c"], ["y"], name="verify", then_branch=then, else_branch=other)]
    return make_model(nodes, [tensor("x", [1, 4, 24])], [tensor("y", None)],
                      head_w + [const("eps", np.float32(1e-5)), const("thr", np.float32(threshold))], opset=13)


@pytest.mark.parametrize("isa", ISAS)
def test_wake_word_verifier_both_branches(isa, monkeypatch, tmp_path):
    """The threshold is set around the head's output so one input takes each branch."""
    force_isa(isa, monkeypatch, tmp_path)
    xs = [RNG.standard_normal((1, 4, 24)).astype(np.float32) for _ in range(6)]
    probe = make_model(_wake_word_model(0.5).graph.node[:-2], [tensor("x", [1, 4, 24])], [tensor("p", None)],
                       list(_wake_word_model(0.5).graph.initializer), opset=13)
    ps = sorted(float(ort_run(probe, {"x": x})[0].reshape(())) for x in xs)
    model = _wake_word_model((ps[2] + ps[3]) / 2)  # three inputs above, three below
    taken = set()
    for threads in (1, 2):
        cm = smelt.compile(model, threads=threads)
        for x in xs:
            want = ort_run(model, {"x": x})[0]
            got = cm.run({"x": x})[0]
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
            taken.add(bool(float(ort_run(probe, {"x": x})[0].reshape(())) >= (ps[2] + ps[3]) / 2))
        assert cm.fallback_nodes == []
        cm.close()
    assert taken == {True, False}


def _index_model() -> onnx.ModelProto:
    """i = int(max(x)); y = If(i < 4, then: table[i], else: sum of the table's rows). The then
    branch's Gather has an index out of range exactly when the branch is not taken, so if the
    untaken branch ran, the native Gather would fail the call."""
    then = _branch("then", [helper.make_node("Gather", ["table", "i"], ["row"], axis=0),
                            helper.make_node("Mul", ["row", "two"], ["t"])], ["t"])
    other = _branch("else", [helper.make_node("ReduceSum", ["table", "zero_axis"], ["e"], keepdims=0)], ["e"])
    nodes = [helper.make_node("ReduceMax", ["x"], ["mx"], keepdims=0),
             helper.make_node("Cast", ["mx"], ["i"], to=TensorProto.INT64),
             helper.make_node("Less", ["i", "four"], ["c"]),
             helper.make_node("If", ["c"], ["y"], name="pick", then_branch=then, else_branch=other)]
    table = RNG.standard_normal((4, 8)).astype(np.float32)
    return make_model(nodes, [tensor("x", [100])], [tensor("y", None)],
                      [const("table", table), const("two", np.float32(2)), const("four", np.int64(4)),
                       const("zero_axis", np.array([0], np.int64))])


@pytest.mark.parametrize("isa", ISAS)
def test_untaken_branch_does_not_run(isa, monkeypatch, tmp_path):
    force_isa(isa, monkeypatch, tmp_path)
    model = _index_model()
    for threads in (1, 2):
        cm = smelt.compile(model, threads=threads)
        for top in (2.5, 10.0, 0.0, 77.0):  # taken, not taken (index 10, 77 out of range), ...
            x = RNG.uniform(-1, 0, 100).astype(np.float32)
            x[17] = top
            np.testing.assert_allclose(cm.run({"x": x})[0], ort_run(model, {"x": x})[0], rtol=1e-5)
        assert cm.fallback_nodes == []
        cm.close()


def test_an_out_of_range_index_in_the_taken_branch_still_fails(monkeypatch, tmp_path):
    """The guard only skips: a taken branch's own failure is reported as before."""
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    then = _branch("then", [helper.make_node("Gather", ["table", "i"], ["t"], axis=0)], ["t"])
    other = _branch("else", [helper.make_node("ReduceSum", ["table", "zero_axis"], ["e"], keepdims=0)], ["e"])
    nodes = [helper.make_node("ReduceMax", ["x"], ["mx"], keepdims=0),
             helper.make_node("Cast", ["mx"], ["i"], to=TensorProto.INT64),
             helper.make_node("Greater", ["i", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], name="pick", then_branch=then, else_branch=other)]
    model = make_model(nodes, [tensor("x", [100])], [tensor("y", None)],
                       [const("table", np.ones((4, 8), np.float32)), const("zero", np.int64(0)),
                        const("zero_axis", np.array([0], np.int64))])
    cm = smelt.compile(model, threads=1)
    x = np.zeros(100, np.float32)
    x[3] = 9.0
    with pytest.raises(SmeltError):
        cm.run({"x": x})


def _nested_model() -> onnx.ModelProto:
    """y, z = If(sum(x) > 0, then: (If(max(x) > 1, Relu(x)*3, Neg(x)), x + 1), else: (Sigmoid(x), x - 1)):
    a run-time If inside a run-time If's branch, and two outputs per branch."""
    inner = helper.make_node(
        "If", ["c2"], ["n"], name="inner",
        then_branch=_branch("it", [helper.make_node("Relu", ["x"], ["rl"]), helper.make_node("Mul", ["rl", "three"], ["ro"])],
                            ["ro"]),
        else_branch=_branch("ie", [helper.make_node("Neg", ["x"], ["no"])], ["no"]))
    then = _branch("then", [helper.make_node("ReduceMax", ["x"], ["mx"], keepdims=0),
                            helper.make_node("Greater", ["mx", "one"], ["c2"]), inner,
                            helper.make_node("Add", ["x", "one"], ["p1"])], ["n", "p1"])
    other = _branch("else", [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Sub", ["x", "one"], ["m1"])],
                    ["s", "m1"])
    nodes = [helper.make_node("ReduceSum", ["x"], ["r"], keepdims=0),
             helper.make_node("Greater", ["r", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y", "z"], name="outer", then_branch=then, else_branch=other)]
    return make_model(nodes, [tensor("x", [3, 40])], [tensor("y", None), tensor("z", None)],
                      [const("zero", np.float32(0)), const("one", np.float32(1)), const("three", np.float32(3))])


@pytest.mark.parametrize("isa", ISAS)
def test_nested_runtime_ifs_with_two_outputs(isa, monkeypatch, tmp_path):
    force_isa(isa, monkeypatch, tmp_path)
    model = _nested_model()
    cases = [np.full((3, 40), 0.5, np.float32), np.full((3, 40), 2.0, np.float32),
             np.full((3, 40), -0.5, np.float32), RNG.standard_normal((3, 40)).astype(np.float32)]
    for threads in (1, 2):
        cm = smelt.compile(model, threads=threads)
        for x in cases:
            for g, w in zip(cm.run({"x": x}), ort_run(model, {"x": x}), strict=True):
                assert g.shape == w.shape
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7)
        assert cm.fallback_nodes == []
        cm.close()


def _planned(model: onnx.ModelProto):
    g = run_passes(to_ir(model))
    build_plan(g)
    return g


def test_guards_cover_exactly_what_one_side_needs():
    """The verifier's nodes are guarded by (cond, True); the head, the condition and the select
    are not; the else side is the head's own output, needed always (the condition reads it)."""
    g = _planned(_wake_word_model(0.5))
    where = [n for n in g.nodes if n.op == "Where"]
    assert len(where) == 1 and where[0].guard is None
    cond = where[0].inputs[0]
    guarded = [n for n in g.nodes if n.guard is not None]
    assert guarded and all(n.guard == (cond, True) and n.name.startswith("verify/then/") for n in guarded)
    assert all(n.guard is None for n in g.nodes if not n.name.startswith("verify/then/"))
    assert sum(n.op == "Gemm" for n in guarded) == 3


def test_nested_branches_keep_the_outer_guard():
    g = _planned(_nested_model())
    outer = next(n for n in g.nodes if n.name == "outer/select_0").inputs[0]
    inner_nodes = [n for n in g.nodes if n.name.startswith("outer/then/inner/")]
    assert inner_nodes and all(n.guard == (outer, True) for n in inner_nodes)
    assert all(n.guard == (outer, False) for n in g.nodes if n.name.startswith("outer/else/") and n.op != "Identity")


def test_a_branch_value_read_outside_is_not_guarded():
    """The then branch's value is also a graph output: it is needed always, so not guarded."""
    then = _branch("then", [helper.make_node("Relu", ["h"], ["t"])], ["t"])
    other = _branch("else", [helper.make_node("Neg", ["h"], ["e"])], ["e"])
    nodes = [helper.make_node("Sigmoid", ["x"], ["h"]),
             helper.make_node("ReduceSum", ["x"], ["r"], keepdims=0),
             helper.make_node("Greater", ["r", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], name="pick", then_branch=then, else_branch=other),
             helper.make_node("Mul", ["y", "y"], ["yy"])]
    model = make_model(nodes, [tensor("x", [50])], [tensor("yy", None), tensor("h", None)],
                       [const("zero", np.float32(0))])
    g = _planned(model)
    assert next(n for n in g.nodes if n.op == "Sigmoid").guard is None
    cm = smelt.compile(model, threads=2)
    for sign in (1, -1):
        x = (np.abs(RNG.standard_normal(50)) * sign).astype(np.float32)
        for a, b in zip(cm.run({"x": x}), ort_run(model, {"x": x}), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    assert cm.fallback_nodes == []


def test_a_branch_with_a_fallback_op_keeps_the_if_whole():
    """ai.onnx.ml's Binarizer has no template: a fallback step always runs, so it could not be
    skipped when its branch is not taken; the If stays on the fallback, and right."""
    then = _branch("then", [helper.make_node("Binarizer", ["x"], ["t"], domain="ai.onnx.ml", threshold=0.5)], ["t"])
    other = _branch("else", [helper.make_node("Neg", ["x"], ["e"])], ["e"])
    nodes = [helper.make_node("ReduceSum", ["x"], ["r"], keepdims=0),
             helper.make_node("Greater", ["r", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], name="pick", then_branch=then, else_branch=other)]
    model = make_model(nodes, [tensor("x", [70])], [tensor("y", None)], [const("zero", np.float32(0))])
    model.opset_import.append(helper.make_opsetid("ai.onnx.ml", 3))
    cm = smelt.compile(model, threads=1)
    for sign in (1, -1):
        x = (np.abs(RNG.standard_normal(70)) * sign).astype(np.float32)
        np.testing.assert_allclose(cm.run({"x": x})[0], ort_run(model, {"x": x})[0], rtol=1e-6)
    assert cm.fallback_nodes == ["pick"]
