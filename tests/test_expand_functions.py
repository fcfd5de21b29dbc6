"""Schema function expansion (smelt/passes/expand_functions.py) and model-local function inlining
(smelt/frontend/local_functions.py): ops no template runs compile natively through their ONNX
function bodies and agree with onnxruntime, at 1 and 2 threads."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import assert_close, const, ort_run, tensor
from onnx import TensorProto, helper

import smelt
from smelt.compiler import lower
from smelt.frontend.onnx_import import load_model, to_ir
from smelt.options import CompileOptions
from smelt.passes.expand_functions import body_nodes, function_proto
from smelt.passes.shape_inference import infer_shapes

RNG = np.random.default_rng(20261125)
F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _x(*shape, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _model(nodes, inputs, outputs, inits=(), opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "fe", inputs, [helper.make_tensor_value_info(o, F, None) for o in outputs],
                              initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _sce(reduction: str | None, weights: bool, ignore: int | None, log_prob: bool, opset: int = 13):
    n, c, d = 3, 5, 2
    attrs = {k: v for k, v in (("reduction", reduction), ("ignore_index", ignore)) if v is not None}
    labels = RNG.integers(0, c, (n, d)).astype(np.int64)
    if ignore is not None:
        labels[0, 0] = ignore
    ins = ["x", "y"] + (["w"] if weights else [])
    node = helper.make_node("SoftmaxCrossEntropyLoss", ins, ["z", "lp"] if log_prob else ["z"], **attrs)
    inputs = [tensor("x", [n, c, d]), tensor("y", [n, d], I64)] + ([tensor("w", [c])] if weights else [])
    feeds = {"x": _x(n, c, d, scale=30.0), "y": labels}
    if weights:
        feeds["w"] = RNG.uniform(0.1, 1.0, c).astype(np.float32)
    return _model([node], inputs, ["z", "lp"] if log_prob else ["z"], opset=opset), feeds


def _nll(reduction: str | None, weights: bool, ignore: int | None):
    n, c = 4, 6
    attrs = {k: v for k, v in (("reduction", reduction), ("ignore_index", ignore)) if v is not None}
    labels = RNG.integers(0, c, (n,)).astype(np.int64)
    if ignore is not None:
        labels[1] = ignore
    ins = ["x", "y"] + (["w"] if weights else [])
    inputs = [tensor("x", [n, c]), tensor("y", [n], I64)] + ([tensor("w", [c])] if weights else [])
    feeds = {"x": _x(n, c), "y": labels}
    if weights:
        feeds["w"] = RNG.uniform(0.1, 1.0, c).astype(np.float32)
    return _model([helper.make_node("NegativeLogLikelihoodLoss", ins, ["z"], **attrs)], inputs, ["z"], opset=22), feeds


def _rms(axis: int | None, eps: float | None, scale_const: bool):
    attrs = {k: v for k, v in (("axis", axis), ("epsilon", eps)) if v is not None}
    shape = [2, 3, 8]
    norm = shape[axis:] if axis is not None else shape[-1:]
    inits = [const("s", RNG.uniform(0.5, 1.5, norm).astype(np.float32))] if scale_const else []
    inputs = [tensor("x", shape)] + ([] if scale_const else [tensor("s", norm)])
    feeds = {"x": _x(*shape)}
    if not scale_const:
        feeds["s"] = RNG.uniform(0.5, 1.5, norm).astype(np.float32)
    return _model([helper.make_node("RMSNormalization", ["x", "s"], ["y"], **attrs)], inputs, ["y"], inits,
                  opset=23), feeds


def _group_norm(eps: float | None):
    attrs = {"num_groups": 2} | ({"epsilon": eps} if eps is not None else {})
    inits = [const("s", RNG.uniform(0.5, 1.5, 4).astype(np.float32)), const("b", _x(4))]
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], **attrs)
    return _model([node], [tensor("x", [2, 4, 3, 5])], ["y"], inits, opset=21), {"x": _x(2, 4, 3, 5)}


def _with_opset(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """Shrink's schema body needs CastLike (opset 15): below it smelt's own body serves."""
    model.opset_import[0].version = opset
    return model


def _shrink(lambd: float | None, bias: float | None):
    attrs = {k: v for k, v in (("lambd", lambd), ("bias", bias)) if v is not None}
    return _model([helper.make_node("Shrink", ["x"], ["y"], **attrs)], [tensor("x", [4, 33])], ["y"]), \
        {"x": _x(4, 33)}


def _mvn(axes: list[int] | None):
    attrs = {"axes": axes} if axes is not None else {}
    node = helper.make_node("MeanVarianceNormalization", ["x"], ["y"], **attrs)
    return _model([node], [tensor("x", [2, 3, 4, 5])], ["y"]), {"x": _x(2, 3, 4, 5, scale=3.0)}


def _rotary(interleaved: int | None, rotary_dim: int | None):
    b, s, h, d = 1, 4, 2, 8
    attrs = {k: v for k, v in (("interleaved", interleaved), ("rotary_embedding_dim", rotary_dim)) if v is not None}
    half = (rotary_dim or d) // 2
    angles = np.arange(s)[:, None] * (1e-1 ** (np.arange(half) / half))[None, :]
    inits = [const("cos", np.cos(angles).astype(np.float32)), const("sin", np.sin(angles).astype(np.float32)),
             const("pos", np.tile(np.arange(s, dtype=np.int64), (b, 1)))]
    node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin", "pos"], ["y"], num_heads=h, **attrs)
    return _model([node], [tensor("x", [b, s, h * d])], ["y"], inits, opset=23), {"x": _x(b, s, h * d)}


def _attention(causal: int | None, mask: bool, scale: float | None):
    b, h, s, d = 2, 2, 5, 4
    attrs = {k: v for k, v in (("is_causal", causal), ("scale", scale)) if v is not None}
    ins = ["q", "k", "v"] + (["m"] if mask else [])
    inputs = [tensor(n, [b, h, s, d]) for n in "qkv"] + ([tensor("m", [s, s])] if mask else [])
    feeds = {n: _x(b, h, s, d) for n in "qkv"}
    if mask:
        feeds["m"] = _x(s, s)
    return _model([helper.make_node("Attention", ins, ["y"], **attrs)], inputs, ["y"], opset=23), feeds


def _hardmax(axis: int | None, ties: bool):
    x = _x(3, 4, 5)
    if ties:  # equal maxima: the first one is hot, as in onnxruntime
        x[:, 1, :] = x[:, 3, :] = 9.0
    attrs = {"axis": axis} if axis is not None else {}
    return _model([helper.make_node("Hardmax", ["x"], ["y"], **attrs)], [tensor("x", [3, 4, 5])], ["y"],
                  opset=13), {"x": x}


def _lp_norm(p: int | None, axis: int | None, opset: int):
    x = _x(4, 6)
    x[2] = 0.0  # a zero norm gives 0, not NaN
    attrs = {k: v for k, v in (("p", p), ("axis", axis)) if v is not None}
    return _model([helper.make_node("LpNormalization", ["x"], ["y"], **attrs)], [tensor("x", [4, 6])], ["y"],
                  opset=opset), {"x": x}


def _variadic(op: str, shapes: list[list[int]], opset: int = 13):
    """Sum / Mean over inputs that broadcast (Sum-8 and later)."""
    names = [f"x{i}" for i in range(len(shapes))]
    return _model([helper.make_node(op, names, ["y"])], [tensor(n, s) for n, s in zip(names, shapes, strict=True)],
                  ["y"], opset=opset), {n: _x(*s) for n, s in zip(names, shapes, strict=True)}


CASES = {
    "sce_mean": lambda: _sce(None, False, None, False),
    "sce_sum_weights_logprob": lambda: _sce("sum", True, None, True),
    "sce_none_ignore": lambda: _sce("none", False, 1, True),
    "sce_mean_weights_ignore": lambda: _sce("mean", True, 2, False),
    "nll_mean": lambda: _nll(None, False, None),
    "nll_sum_weights": lambda: _nll("sum", True, None),
    "nll_none_ignore": lambda: _nll("none", False, 3),
    "nll_mean_weights_ignore": lambda: _nll("mean", True, 0),
    "rms_default": lambda: _rms(None, None, True),
    "rms_axis1_eps": lambda: _rms(1, 1e-3, False),
    "group_norm": lambda: _group_norm(None),
    "group_norm_eps": lambda: _group_norm(1e-2),
    "hardmax_default": lambda: _hardmax(None, False),
    "hardmax_axis1_ties": lambda: _hardmax(1, True),
    "lpnorm_default_opset17": lambda: _lp_norm(None, None, 17),
    "lpnorm_p1_axis0_opset18": lambda: _lp_norm(1, 0, 18),
    "sum_one": lambda: _variadic("Sum", [[3, 4]]),
    "sum_three_broadcast": lambda: _variadic("Sum", [[2, 3, 4], [4], [3, 1]]),
    "mean_two": lambda: _variadic("Mean", [[5, 7], [5, 7]], opset=11),
    "mean_three_broadcast": lambda: _variadic("Mean", [[2, 1, 4], [3, 4], [1]]),
    "shrink_default": lambda: _shrink(None, None),
    "shrink_opset11": lambda: (lambda m, f: (_with_opset(m, 11), f))(*_shrink(0.3, 0.1)),
    "shrink_set": lambda: _shrink(0.7, 0.2),
    "mvn_default": lambda: _mvn(None),
    "mvn_axes": lambda: _mvn([1, 3]),
    "rotary": lambda: _rotary(None, None),
    "rotary_interleaved_partial": lambda: _rotary(1, 4),
    "attention": lambda: _attention(None, False, None),
    "attention_causal_scale": lambda: _attention(1, False, 0.3),
    "attention_mask": lambda: _attention(None, True, None),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_expanded_op_runs_natively(case, tmp_path, monkeypatch):
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    model, feeds = CASES[case]()
    try:
        want = ort_run(model, feeds)
    except Exception as exc:  # noqa: BLE001 - an onnxruntime without this opset
        pytest.skip(f"onnxruntime cannot run it: {exc}")
    for threads in (1, 2):
        compiled = smelt.compile(model, threads=threads)
        assert compiled.fallback_nodes == [], compiled.fallback_report
        assert_close(compiled.run(feeds), want, rel=1e-4)
        compiled.close()


def test_sce_large_logits_stays_finite(tmp_path, monkeypatch):
    """The body computes LogSoftmax (max-subtracted), not Log(Softmax): logits of 1e30 give
    finite log-probabilities, as onnxruntime's kernel does."""
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    model, feeds = _sce("none", False, None, True)
    feeds["x"] = _x(3, 5, 2, scale=1e30)
    want = ort_run(model, feeds)
    compiled = smelt.compile(model)
    got = compiled.run(feeds)
    assert compiled.fallback_nodes == []
    assert np.isfinite(got[1]).all()
    assert_close(got, want, rel=1e-5)
    compiled.close()


def _lowered(model: onnx.ModelProto):
    return lower(model, CompileOptions(threads=1))


def test_names_are_prefixed_and_outputs_kept():
    model, _ = _sce("mean", True, None, True)
    g = infer_shapes(to_ir(model))
    node = g.nodes[0]
    nodes = body_nodes(g, node, function_proto(g, node))
    made = {o for n in nodes for o in n.outputs if o}
    assert {"z", "lp"} <= made
    assert all(o in ("z", "lp") or o.startswith(f"{node.name}/") for o in made)
    assert all(n.name.startswith(f"{node.name}/") for n in nodes)
    assert len({n.name for n in nodes}) == len(nodes)


def test_absent_optional_output_is_not_bound():
    """Without SCE's log_prob output only ``z`` leaves the body; every other value the body
    writes is its own (prefixed), never a graph name."""
    model, _ = _sce("mean", False, None, False)
    g = infer_shapes(to_ir(model))
    node = g.nodes[0]
    made = {o for n in body_nodes(g, node, function_proto(g, node)) for o in n.outputs if o}
    assert "z" in made
    assert all(o.startswith(f"{node.name}/") for o in made - {"z"})


def test_attribute_reference_reads_default_and_given():
    """Shrink's body reads lambd and bias by reference: defaults 0.5 / 0 when absent."""
    for attrs, want in (({}, (0.5, 0.0)), ({"lambd": 0.7, "bias": 0.2}, (0.7, 0.2))):
        model = _model([helper.make_node("Shrink", ["x"], ["y"], **attrs)], [tensor("x", [4])], ["y"])
        g = infer_shapes(to_ir(model))
        nodes = body_nodes(g, g.nodes[0], function_proto(g, g.nodes[0]))
        floats = {np.float32(a.f) for n in nodes for a in n.attr_protos if a.type == onnx.AttributeProto.FLOAT}
        assert not any(a.ref_attr_name for n in nodes for a in n.attr_protos)
        assert {np.float32(w) for w in want} <= floats, floats


def test_node_with_a_template_is_not_expanded():
    """LayerNormalization has a template and a function: the template wins."""
    inits = [const("s", np.ones(8, np.float32)), const("b", np.zeros(8, np.float32))]
    model = _model([helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], name="ln")],
                   [tensor("x", [2, 8])], ["y"], inits)
    g = _lowered(model)
    assert [n.op for n in g.nodes] == ["LayerNormalization"]


def test_body_that_would_fall_back_is_not_used():
    """HannWindow with a run-time size: its body needs Range, which has no template: the node
    stays whole (one fallback node, not a mix)."""
    model = _model([helper.make_node("HannWindow", ["n"], ["y"])], [tensor("n", [], I64)], ["y"])
    g = _lowered(model)
    assert [n.op for n in g.nodes] == ["HannWindow"]


def test_window_of_constant_size_folds():
    model = _model([helper.make_node("HannWindow", ["n"], ["y"], periodic=0)], [], ["y"],
                   [const("n", np.array(10, np.int64))])
    compiled = smelt.compile(model)
    assert_close(compiled.run({}), ort_run(model, {}))
    assert compiled.fallback_nodes == []
    compiled.close()


def _local_function_model() -> onnx.ModelProto:
    """Twice(x) = Scale(Scale(x, alpha=0.5), alpha=0.25), Scale a local function whose LeakyRelu
    reads ``alpha`` by reference; the outer graph calls Twice."""
    ref = onnx.AttributeProto(name="alpha", ref_attr_name="alpha", type=onnx.AttributeProto.FLOAT)
    leaky = helper.make_node("LeakyRelu", ["x"], ["y"], name="leaky")
    leaky.attribute.append(ref)
    scale = helper.make_function("local", "Scale", ["x"], ["y"], [leaky], [helper.make_opsetid("", 17)],
                                 attributes=["alpha"])
    twice = helper.make_function("local", "Twice", ["x"], ["y"], [
        helper.make_node("Scale", ["x"], ["t"], domain="local", alpha=0.5),
        helper.make_node("Scale", ["t"], ["y"], domain="local", alpha=0.25)],
        [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)])
    graph = helper.make_graph([helper.make_node("Twice", ["X"], ["Y"], domain="local", name="tw")], "g",
                              [tensor("X", [2, 3])], [tensor("Y", [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)],
                              functions=[scale, twice])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("threads", [1, 2])
def test_local_functions_are_inlined(threads, tmp_path, monkeypatch):
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    model = _local_function_model()
    assert [n.op_type for n in load_model(model).graph.node] == ["LeakyRelu", "LeakyRelu"]
    assert len(model.functions) == 2  # the caller's proto is not changed
    feeds = {"X": _x(2, 3)}
    compiled = smelt.compile(model, threads=threads)
    assert compiled.fallback_nodes == []
    got = compiled.run(feeds)[0]
    np.testing.assert_allclose(got, np.where(feeds["X"] > 0, feeds["X"], feeds["X"] * 0.125), rtol=1e-6)
    assert_close([got], ort_run(model, feeds))
    compiled.close()
