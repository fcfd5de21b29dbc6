"""Passes: the structure they promise (before/after) and unchanged numerics (vs onnxruntime)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import assert_close, const, make_model, ort_run, tensor
from onnx import TensorProto, helper

import smelt
from smelt.compiler import lower
from smelt.frontend.onnx_import import specialize_inputs
from smelt.options import CompileOptions

RNG = np.random.default_rng(42)


def _ops(g):
    return [n.op for n in g.nodes]


def _lower(model, shapes=None):
    return lower(specialize_inputs(model, shapes or {}), CompileOptions(threads=1))


def _bn_params(c, prefix):
    return [const(f"{prefix}.s", RNG.uniform(0.5, 1.5, c).astype(np.float32)),
            const(f"{prefix}.b", RNG.uniform(-0.2, 0.2, c).astype(np.float32)),
            const(f"{prefix}.m", RNG.uniform(-0.1, 0.1, c).astype(np.float32)),
            const(f"{prefix}.v", RNG.uniform(0.5, 2.0, c).astype(np.float32))]


def _conv_bn_relu_add_model():
    c = 5
    inits = [const("w", RNG.standard_normal((c, 3, 3, 3)).astype(np.float32) * 0.3)] + _bn_params(c, "bn")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("BatchNormalization", ["c", "bn.s", "bn.b", "bn.m", "bn.v"], ["n"], name="bn"),
             helper.make_node("Relu", ["n"], ["r"], name="relu"),
             helper.make_node("Add", ["r", "skip"], ["y"], name="residual")]
    return make_model(nodes, [tensor("x", [1, 3, 6, 7]), tensor("skip", [1, c, 6, 7])],
                      [tensor("y", [1, c, 6, 7])], inits)


def test_batchnorm_folds_into_conv_and_epilogues_fuse():
    g = _lower(_conv_bn_relu_add_model())
    assert _ops(g) == ["Conv"]
    assert [e.op for e in g.nodes[0].epilogue] == ["Relu", "Add"]
    assert g.nodes[0].epilogue[1].broadcast == "full"


@pytest.mark.parametrize("threads", [1, 2])
def test_conv_bn_relu_add_numerics_unchanged(threads):
    model = _conv_bn_relu_add_model()
    feeds = {"x": RNG.standard_normal((1, 3, 6, 7)).astype(np.float32),
             "skip": RNG.standard_normal((1, 5, 6, 7)).astype(np.float32)}
    cm = smelt.compile(model, threads=threads)
    assert cm.fallback_nodes == []
    assert_close(cm.run(feeds), ort_run(model, feeds))


def test_batchnorm_folds_into_gemm_with_transposed_weights():
    inits = [const("w", RNG.standard_normal((4, 6)).astype(np.float32)),
             const("bias", RNG.standard_normal(4).astype(np.float32))] + _bn_params(4, "bn")
    nodes = [helper.make_node("Gemm", ["x", "w", "bias"], ["g"], transB=1, alpha=0.5, beta=2.0),
             helper.make_node("BatchNormalization", ["g", "bn.s", "bn.b", "bn.m", "bn.v"], ["y"])]
    model = make_model(nodes, [tensor("x", [3, 6])], [tensor("y", [3, 4])], inits)
    g = _lower(model)
    assert _ops(g) == ["Gemm"]
    x = RNG.standard_normal((3, 6)).astype(np.float32)
    assert_close(smelt.compile(model).run({"x": x}), ort_run(model, {"x": x}))


def test_identity_and_dropout_disappear_and_dead_nodes_go():
    nodes = [helper.make_node("Identity", ["x"], ["i"]),
             helper.make_node("Dropout", ["i"], ["d"], name="drop"),
             helper.make_node("Relu", ["d"], ["y"]),
             helper.make_node("Neg", ["x"], ["unused"], name="dead")]
    model = make_model(nodes, [tensor("x", [4])], [tensor("y", [4])])
    g = _lower(model)
    assert _ops(g) == ["Relu"]
    assert g.nodes[0].inputs == ["x"]


def test_shape_subgraph_folds_once_input_shapes_are_known():
    # y = Reshape(x, Concat(Gather(Shape(x), 0), [-1])): a flatten written as shape arithmetic
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
             helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    inits = [const("zero", np.array(0, np.int64)), const("axes", np.array([0], np.int64)),
             const("minus1", np.array([-1], np.int64))]
    model = make_model(nodes, [tensor("x", ["N", 3, 4])], [tensor("y", ["N", 12])], inits)
    g = _lower(model, {"x": [2, 3, 4]})
    assert _ops(g) == ["Reshape"]
    assert g.values[g.nodes[0].inputs[1]].const.tolist() == [2, -1]
    assert g.values["y"].shape == (2, 12)
    cm = smelt.compile(model)
    x = RNG.standard_normal((5, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(cm(x), x.reshape(5, 12))
    assert cm.fallback_nodes == []


def test_chained_shape_subgraphs_fold_to_a_fixpoint():
    """Three Reshapes in a row, each target computed from the Shape of the previous Reshape's
    output (as exported attention blocks do): each Shape can only fold once shape inference has
    sized its input, which needs the previous fold. One fold + one inference left two of them
    (and everything after) unsized and falling back (PP-OCRv4's recognizer: 105 nodes)."""
    def constant(name, values):  # Constant nodes, as paddle2onnx writes them (not initializers)
        return helper.make_node("Constant", [], [name], value=helper.make_tensor(
            name + "_v", TensorProto.INT64, [len(values)], values))

    nodes, inits, prev = [], [], "x"
    for i in range(3):
        nodes += [helper.make_node("Sigmoid", [prev], [f"g{i}"]),
                  helper.make_node("Mul", [prev, f"g{i}"], [f"r{i}"]),
                  helper.make_node("Shape", [f"r{i}"], [f"s{i}"]),
                  constant(f"zero{i}", [0]), constant(f"two{i}", [2]), constant(f"m{i}", [-1]),
                  helper.make_node("Slice", [f"s{i}", f"zero{i}", f"two{i}", f"zero{i}"], [f"h{i}"]),
                  helper.make_node("Concat", [f"h{i}", f"m{i}"], [f"t{i}"], axis=0),
                  helper.make_node("Reshape", [f"r{i}", f"t{i}"], [f"y{i}"])]
        prev = f"y{i}"
    nodes.append(helper.make_node("Softmax", [prev], ["y"], axis=-1))
    # opset 12, as paddle2onnx wrote it: onnx's data propagation (which would size the Reshapes
    # in one inference) only knows Shape/Slice/Concat from opset 13 on
    model = make_model(nodes, [tensor("x", ["N", 3, 4, 5])], [tensor("y", None)], inits, opset=12)
    g = _lower(model, {"x": [2, 3, 4, 5]})
    assert "Shape" not in _ops(g) and g.values["y"].shape == (2, 3, 20)
    cm = smelt.compile(model)
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    assert_close([cm(x)], ort_run(model, {"x": x}))
    assert cm.fallback_nodes == []


def test_silu_and_clip_fuse_into_conv():
    w = const("w", RNG.standard_normal((4, 2, 1, 1)).astype(np.float32))
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("Sigmoid", ["c"], ["s"]),
             helper.make_node("Mul", ["c", "s"], ["m"]),
             helper.make_node("Clip", ["m", "lo", "hi"], ["y"])]
    model = make_model(nodes, [tensor("x", [1, 2, 3, 3])], [tensor("y", [1, 4, 3, 3])],
                       [w, const("lo", np.float32(-0.1)), const("hi", np.float32(0.4))])
    g = _lower(model)
    assert _ops(g) == ["Conv"] and [e.op for e in g.nodes[0].epilogue] == ["SiLU", "Clip"]
    x = RNG.standard_normal((1, 2, 3, 3)).astype(np.float32)
    assert_close(smelt.compile(model).run({"x": x}), ort_run(model, {"x": x}))


def test_no_fusion_when_intermediate_has_other_readers():
    w = const("w", RNG.standard_normal((4, 2, 1, 1)).astype(np.float32))
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Add", ["r", "c"], ["y"])]
    model = make_model(nodes, [tensor("x", [1, 2, 3, 3])], [tensor("y", [1, 4, 3, 3])], [w])
    g = _lower(model)
    assert _ops(g) == ["Conv", "Relu", "Add"]
    assert not g.nodes[0].epilogue


def test_verifier_catches_a_broken_graph(monkeypatch):
    from smelt.errors import VerifyError
    from smelt.ir.verify import verify

    g = _lower(make_model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", [2])], [tensor("y", [2])]))
    g.nodes[0].inputs = ["nonexistent"]
    with pytest.raises(VerifyError, match="nonexistent"):
        verify(g, "test")


def test_debug_mode_runs_the_verifier(monkeypatch):
    monkeypatch.setenv("SMELT_DEBUG", "1")
    calls = []
    import smelt.passes.pipeline as pipeline

    real = pipeline.verify
    monkeypatch.setattr(pipeline, "verify", lambda g, after="": calls.append(after) or real(g, after))
    _lower(_conv_bn_relu_add_model())
    assert "import" in calls and "fuse_epilogues" in calls


def test_int_constant_folding_keeps_dtype():
    nodes = [helper.make_node("Add", ["a", "b"], ["c"]), helper.make_node("Mul", ["x", "c"], ["y"])]
    model = make_model(nodes, [tensor("x", [3], TensorProto.INT64)], [tensor("y", [3], TensorProto.INT64)],
                       [const("a", np.array([1, 2, 3], np.int64)), const("b", np.array([1, 1, 1], np.int64))])
    g = _lower(model)
    assert _ops(g) == ["Mul"]
    cm = smelt.compile(model)
    np.testing.assert_array_equal(cm(np.array([1, 2, 3], np.int64)), [2, 6, 12])


@pytest.mark.parametrize("threads", [1, 2])
def test_ceil_mode_pool_is_sized_as_onnxruntime_does(tmp_path, monkeypatch, threads):
    """onnx 1.23's inference keeps a ceil_mode window that would start in the end padding;
    onnxruntime drops it (MaxPool 2x2/2, pads [1,1,1,0] on 11x13: 6x7, not 7x7). Shapes come from
    inference alone now, so smelt must size it as onnxruntime does, through a following op too."""
    from helpers import ort_run
    from onnx import TensorProto

    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path / "cache"))
    nodes = [helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 1, 0],
                              ceil_mode=1),
             helper.make_node("Relu", ["p"], ["y"])]
    model = make_model(nodes, [tensor("x", [2, 3, 11, 13])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    x = np.random.default_rng(0).standard_normal((2, 3, 11, 13)).astype(np.float32)
    want = ort_run(model, {"x": x})[0]
    got = smelt.compile(model, threads=threads).run({"x": x})[0]
    assert got.shape == want.shape == (2, 3, 6, 7)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_empty_tensors_fold_as_constants():
    """A reduction over an empty axis is its identity value, and a zero-size Split output is
    nothing to compute: both fold (templates refuse empty tensors), natively and as onnxruntime."""
    nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=1),
             helper.make_node("ReduceMax", ["x", "axes"], ["m"], keepdims=0),
             helper.make_node("Split", ["y", "sizes"], ["a", "b"], axis=0),
             helper.make_node("Relu", ["b"], ["r"])]
    model = make_model(nodes, [tensor("x", [2, 0, 3]), tensor("y", [4, 2])],
                       [tensor("s", None), tensor("m", None), tensor("a", None), tensor("r", None)],
                       [const("axes", np.array([1], np.int64)), const("sizes", np.array([4, 0], np.int64))], opset=18)
    cm = smelt.compile(model, threads=1)
    feeds = {"x": np.zeros((2, 0, 3), np.float32), "y": RNG.standard_normal((4, 2)).astype(np.float32)}
    got = cm.run(feeds)
    for g, w in zip(got, ort_run(model, feeds), strict=True):  # exact: ReduceMax of nothing is -inf
        np.testing.assert_array_equal(g, w)
        assert g.dtype == w.dtype
    assert cm.fallback_nodes == []
