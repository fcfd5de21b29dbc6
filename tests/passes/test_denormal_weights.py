"""passes/denormal_weights.py: subnormal float32 weights of the multiply-heavy ops read as zero
(signed), everything else bit for bit; small constants never touched; the option turns it off;
the answers agree with onnxruntime either way."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import smelt
from smelt.frontend.onnx_import import to_ir
from smelt.passes.denormal_weights import FLT_MIN, flush_denormal_weights, subnormal_count
from smelt.passes.pipeline import run_passes

RNG = np.random.default_rng(4242)


def _weights(shape) -> np.ndarray:
    w = RNG.standard_normal(shape).astype(np.float32)
    flat = w.reshape(-1)
    flat[0::7] = RNG.uniform(1e-45, 1e-38, flat[0::7].shape).astype(np.float32)  # positive subnormals
    flat[3::7] = -RNG.uniform(1e-45, 1e-38, flat[3::7].shape).astype(np.float32)  # negative ones
    flat[-2], flat[-1] = np.float32(-0.0), FLT_MIN  # a negative zero and the smallest normal stay
    return w


def _model(w: np.ndarray, eps: float):
    """Conv, a per-channel bias Add (fused onto the conv: half its channels subnormal, the
    first one's weights all subnormal too, so its outputs are subnormal-scale), then an Add
    of a one-element subnormal epsilon."""
    w[0] = np.float32(1e-40)
    bias = np.where(np.arange(16) % 2 == 0, np.float32(3e-39), RNG.standard_normal(16).astype(np.float32))
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Add", ["c", "bias"], ["cb"], name="bias_add"),
             helper.make_node("Add", ["cb", "eps"], ["y"], name="eps_add")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 9, 9])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 9, 9])],
                              [numpy_helper.from_array(w, "w"),
                               numpy_helper.from_array(bias.astype(np.float32).reshape(1, 16, 1, 1), "bias"),
                               numpy_helper.from_array(np.float32([eps]), "eps")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_pass_zeroes_subnormal_weights_only():
    w = _weights((16, 8, 3, 3))
    assert subnormal_count(w) > 100
    g = flush_denormal_weights(to_ir(_model(w, 1e-40)))
    got = g.values["w"].const
    tiny = (w != 0) & (np.abs(w) < FLT_MIN)
    assert subnormal_count(got) == 0
    assert np.all(got[tiny] == 0) and np.array_equal(np.signbit(got[tiny]), np.signbit(w[tiny]))
    assert np.array_equal(got[~tiny].view(np.uint32), w[~tiny].view(np.uint32))  # bit for bit
    assert np.signbit(got.reshape(-1)[-2]) and got.reshape(-1)[-1] == FLT_MIN
    # a one-element constant (an epsilon) of another op is not a weight: kept subnormal
    assert subnormal_count(g.values["eps"].const) == 1


def test_the_bias_fused_onto_the_conv_is_flushed_in_the_pipeline():
    """Through the whole pipeline: both Adds become the conv's epilogue; the bias's subnormal
    entries are flushed with the weights, the one-element epsilon is kept."""
    g = run_passes(to_ir(_model(_weights((16, 8, 3, 3)), 1e-40)))
    conv = next(n for n in g.nodes if n.op == "Conv")
    consts = [np.asarray(g.values[i].const) for i in conv.all_inputs()
              if i in g.values and g.values[i].const is not None]
    big = [c for c in consts if c.size >= 16]
    assert len(big) == 2 and all(subnormal_count(c) == 0 for c in big)  # weights and bias
    assert [subnormal_count(c) for c in consts if c.size == 1] == [1]  # the epsilon


@pytest.mark.parametrize("flush", [True, False], ids=["flushed", "kept"])
def test_compiled_answers_agree_with_onnxruntime(flush, monkeypatch, tmp_path):
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    model = _model(_weights((16, 8, 3, 3)), 1e-40)
    x = RNG.standard_normal((1, 8, 9, 9)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    for threads in (1, 2):
        compiled = smelt.compile(model, threads=threads, schedule={"flush_denormal_weights": flush})
        np.testing.assert_allclose(compiled.run({"x": x})[0], want, rtol=1e-5, atol=1e-5)
        assert compiled.options.flush_denormal_weights is flush


def test_dead_conv_channels_are_zeroed_whole(monkeypatch, tmp_path):
    """A Conv output channel whose weights are all tiny normals (below DEAD_CHANNEL_MAX) is zeroed
    whole, signs kept; one just above the bound, the live ones, a channel holding a NaN, and a
    MatMul's tiny weights stay bit for bit; the answers stay onnxruntime's."""
    from smelt.passes.denormal_weights import DEAD_CHANNEL_MAX

    w = RNG.standard_normal((6, 4, 3, 3)).astype(np.float32)
    w[1] = RNG.uniform(-1.3e-37, 1.3e-37, w[1].shape).astype(np.float32)  # dead: tiny normals
    w[2] = w[1] * np.float32(1e4)  # up to 1.3e-33: above the bound, kept
    w[2].reshape(-1)[0] = np.float32(2e-33)
    w[3] = w[1]
    w[3, 0, 0, 0] = np.nan  # a NaN is not dead
    m = (RNG.uniform(2e-38, 1e-37, (6, 5)) * RNG.choice([-1, 1], (6, 5))).astype(np.float32)  # tiny normals
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Transpose", ["c"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("MatMul", ["t", "m"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 7, 7])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(RNG.standard_normal(6).astype(np.float32), "b"),
                               numpy_helper.from_array(m, "m")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    g = flush_denormal_weights(to_ir(model))
    got = g.values["w"].const
    assert np.all(got[1] == 0) and np.array_equal(np.signbit(got[1]), np.signbit(w[1]))
    assert float(np.abs(w[1]).max()) < DEAD_CHANNEL_MAX <= float(np.abs(w[2]).max())
    for k in (0, 2, 4, 5):
        assert np.array_equal(got[k].view(np.uint32), w[k].view(np.uint32)), k
    normal = ~((w[3] != 0) & (np.abs(w[3]) < FLT_MIN))  # its subnormal entries go, as anywhere
    assert np.isnan(got[3, 0, 0, 0]) and np.array_equal(got[3][normal].view(np.uint32), w[3][normal].view(np.uint32))
    assert np.array_equal(g.values["m"].const.view(np.uint32), m.view(np.uint32))  # not a Conv's

    w[3, 0, 0, 0] = 0.0  # a NaN would make every output NaN: compare the rest with onnxruntime
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(w, "w"))
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    x = RNG.standard_normal((1, 4, 7, 7)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    for threads in (1, 2):
        np.testing.assert_allclose(smelt.compile(model, threads=threads).run({"x": x})[0], want, rtol=1e-5, atol=1e-30)
