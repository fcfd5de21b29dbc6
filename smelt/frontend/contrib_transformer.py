"""onnxruntime's transformer ops (``com.microsoft``) spelled in standard ONNX ops.

onnxruntime's transformer optimizer (``onnxruntime.transformers.optimizer``) and many published
"optimized" encoders replace the exported graph's pieces by contrib ops: SkipLayerNormalization,
EmbedLayerNormalization, Attention, BiasGelu, FastGelu, Gelu. smelt has no template of its own for
them and onnx.reference cannot run them, so such a model was refused. Here, before import, each
becomes the standard ops it stands for, in the spellings smelt's passes already fuse: the
layer norm as ``ReduceMean/Sub/Pow/Sqrt/Div/Mul/Add`` below opset 17 (``fuse_layernorm`` makes
it one kernel again) or LayerNormalization from 17; the erf GELU as exporters write it
(``fuse_epilogue`` puts it in the MatMul before it); attention as the MatMul/Softmax/MatMul of an
exported head split (``fuse_attention``). Semantics are onnxruntime's CPU kernels' (checked
against them in tests/test_contrib_transformer.py).

onnxruntime's optimizer also writes ONNX-domain LayerNormalization into models below opset 17
(onnxruntime registers it from opset 1); it is spelled out the same way.

Refused (the node stays and the model is refused with the op's name, as before), rather than
guessed: Attention with past state, a present output, relative position bias, rotary embedding,
``unidirectional``, a 4-D mask or one whose rank is unknown before inference (a mask index that
is neither a graph input nor an EmbedLayerNormalization's); SkipLayerNormalization or EmbedLayerNormalization
asked for their mean / inverse-std outputs; EmbedLayerNormalization's position ids input.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from smelt.frontend.contrib_matmul_nbits import expand_matmul_nbits

MS_DOMAIN = "com.microsoft"


class _Rewriter:
    """New nodes and constants for one model; unique names."""

    def __init__(self, proto: onnx.ModelProto) -> None:
        self.proto = proto
        self._inferred_ranks: dict[str, int] | None = None
        self.opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 1)
        self.inits = {i.name: i for i in proto.graph.initializer}
        self.taken = {o for n in proto.graph.node for o in list(n.input) + list(n.output)} | set(self.inits)
        self.taken |= {i.name for i in proto.graph.input}
        self.new_inits: list[onnx.TensorProto] = []
        self.nodes: list[onnx.NodeProto] = []
        self.graph_inputs = {vi.name: vi for vi in proto.graph.input}
        # values whose rank is known before inference: graph inputs, and the 1-D mask index an
        # EmbedLayerNormalization writes
        # tensor inputs of a numpy-mappable type (not sequences, optionals or undefined types)
        tensors = [vi for vi in proto.graph.input if vi.type.HasField("tensor_type")
                   and vi.type.tensor_type.elem_type != onnx.TensorProto.UNDEFINED
                   and vi.type.tensor_type.elem_type != onnx.TensorProto.STRING]
        self.ranks = {vi.name: len(vi.type.tensor_type.shape.dim) for vi in tensors
                      if vi.type.tensor_type.HasField("shape")}
        self.dtypes = {vi.name: helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type) for vi in tensors}
        for n in proto.graph.node:
            if n.domain == MS_DOMAIN and n.op_type == "EmbedLayerNormalization" and len(n.output) > 1 and n.output[1]:
                self.ranks[n.output[1]], self.dtypes[n.output[1]] = 1, np.dtype(np.int32)

    def name(self, hint: str) -> str:
        k = 0
        while f"{hint}__{k}" in self.taken:
            k += 1
        self.taken.add(f"{hint}__{k}")
        return f"{hint}__{k}"

    def const(self, hint: str, value: np.ndarray) -> str:
        n = self.name(hint)
        self.new_inits.append(numpy_helper.from_array(np.asarray(value), n))
        return n

    def op(self, op: str, inputs: list[str], hint: str, out: str | None = None, **attrs) -> str:
        y = out or self.name(hint)
        self.nodes.append(helper.make_node(op, inputs, [y], name=self.name(f"{hint}_{op}"), **attrs))
        return y

    def rank_of(self, name: str) -> int | None:
        """The rank of a value: a graph input's or an initializer's, else onnx's inference's (run
        once, on demand: a FusedMatMul's operands are mostly intermediate values)."""
        if name in self.ranks:
            return self.ranks[name]
        if name in self.inits:
            return len(self.inits[name].dims)
        if self._inferred_ranks is None:
            try:
                inferred = onnx.shape_inference.infer_shapes(self.proto)
            except Exception:  # noqa: BLE001 - best effort: an unknown rank leaves the node as it is
                inferred = self.proto
            self._inferred_ranks = {vi.name: len(vi.type.tensor_type.shape.dim) for vi in inferred.graph.value_info
                                    if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape")}
        return self._inferred_ranks.get(name)

    def shape_of(self, name: str) -> tuple[int, ...] | None:
        init = self.inits.get(name)
        return tuple(init.dims) if init is not None else None


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _layer_norm(rw: _Rewriter, x: str, gamma: str, beta: str, eps: float, out: str, hint: str) -> None:
    """LayerNormalization over the last axis into ``out`` (the pre-17 spelling fuse_layernorm
    knows, or the op itself)."""
    if rw.opset >= 17:
        ins = [x, gamma] + ([beta] if beta else [])
        rw.op("LayerNormalization", ins, hint, out=out, axis=-1, epsilon=float(eps))
        return
    mean = rw.op("ReduceMean", [x], hint, axes=[-1])
    d = rw.op("Sub", [x, mean], hint)
    var = rw.op("ReduceMean", [rw.op("Pow", [d, rw.const(f"{hint}_two", np.float32(2))], hint)], hint, axes=[-1])
    den = rw.op("Sqrt", [rw.op("Add", [var, rw.const(f"{hint}_eps", np.float32(eps))], hint)], hint)
    scaled = rw.op("Mul", [rw.op("Div", [d, den], hint), gamma], hint)
    if beta:
        rw.op("Add", [scaled, beta], hint, out=out)
    else:
        rw.op("Identity", [scaled], hint, out=out)


def _gelu_erf(rw: _Rewriter, x: str, out: str, hint: str) -> None:
    """x * 0.5 * (1 + erf(x / sqrt 2)), torch.onnx's spelling (passes/gelu_pattern.py)."""
    e = rw.op("Erf", [rw.op("Div", [x, rw.const(f"{hint}_sqrt2", np.float32(math.sqrt(2.0)))], hint)], hint)
    p = rw.op("Add", [e, rw.const(f"{hint}_one", np.float32(1.0))], hint)
    rw.op("Mul", [rw.op("Mul", [x, p], hint), rw.const(f"{hint}_half", np.float32(0.5))], hint, out=out)


def _present(names, k: int) -> str:
    return names[k] if len(names) > k else ""


def _skip_layer_norm(rw: _Rewriter, n: onnx.NodeProto) -> bool:
    outs = list(n.output)
    if _present(outs, 1) or _present(outs, 2):  # mean, inv_std_var
        return False
    x, skip, gamma = n.input[0], n.input[1], n.input[2]
    beta, bias = _present(n.input, 3), _present(n.input, 4)
    s = rw.op("Add", [x, skip], n.name)
    if bias:
        s = rw.op("Add", [s, bias], n.name)
    if _present(outs, 3):  # input + skip + bias
        rw.op("Identity", [s], n.name, out=outs[3])
    _layer_norm(rw, s, gamma, beta, float(_attrs(n).get("epsilon", 1e-12)), outs[0], n.name)
    return True


def _bias_gelu(rw: _Rewriter, n: onnx.NodeProto) -> bool:
    _gelu_erf(rw, rw.op("Add", [n.input[0], n.input[1]], n.name), n.output[0], n.name)
    return True


def _ms_gelu(rw: _Rewriter, n: onnx.NodeProto) -> bool:
    _gelu_erf(rw, n.input[0], n.output[0], n.name)
    return True


def _fast_gelu(rw: _Rewriter, n: onnx.NodeProto) -> bool:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) of x (+ bias), onnxruntime's FastGelu."""
    x = n.input[0]
    if _present(n.input, 1):
        x = rw.op("Add", [x, n.input[1]], n.name)
    x3 = rw.op("Mul", [rw.op("Mul", [x, x], n.name), x], n.name)
    inner = rw.op("Add", [x, rw.op("Mul", [x3, rw.const("c", np.float32(0.044715))], n.name)], n.name)
    t = rw.op("Tanh", [rw.op("Mul", [inner, rw.const("k", np.float32(math.sqrt(2.0 / math.pi)))], n.name)], n.name)
    p = rw.op("Add", [t, rw.const("one", np.float32(1.0))], n.name)
    rw.op("Mul", [rw.op("Mul", [x, rw.const("half", np.float32(0.5))], n.name), p], n.name, out=n.output[0])
    return True


def _embed_layer_norm(rw: _Rewriter, n: onnx.NodeProto) -> bool:
    """Word + position (+ segment) embeddings, then the layer norm; ``mask_index`` the row sums
    of the mask (zeros without one), as onnxruntime's CPU kernel writes them."""
    ins, outs = list(n.input), list(n.output)
    ids, seg_ids, word, pos, seg, gamma, beta = (ins + [""] * 7)[:7]
    mask, pos_ids = _present(ins, 7), _present(ins, 8)
    # (Unsqueeze's axes as an input: an opset-13 spelling)
    if pos_ids or not word or not pos or not gamma or rw.opset < 13:
        return False
    s = rw.op("Gather", [word, ids], n.name)
    # positions 0..S-1 for every row: the first S rows of the position table
    seq = rw.op("Gather", [rw.op("Shape", [ids], n.name), rw.const("one", np.int64(1))], n.name)
    end = rw.op("Unsqueeze", [seq, rw.const("ax0", np.array([0], np.int64))], n.name)
    rows = rw.op("Slice", [pos, rw.const("zero", np.array([0], np.int64)), end], n.name)
    s = rw.op("Add", [s, rows], n.name)
    if seg and seg_ids:
        s = rw.op("Add", [s, rw.op("Gather", [seg, seg_ids], n.name)], n.name)
    if _present(outs, 2):  # the embedding sum
        rw.op("Identity", [s], n.name, out=outs[2])
    _layer_norm(rw, s, gamma, beta, float(_attrs(n).get("epsilon", 1e-12)), outs[0], n.name)
    if _present(outs, 1):
        if mask:
            rw.op("ReduceSum", [rw.op("Cast", [mask], n.name, to=onnx.TensorProto.INT32),
                                rw.const("ax1", np.array([1], np.int64))], n.name, out=outs[1], keepdims=0)
        else:
            zeros = rw.op("Gather", [rw.op("Shape", [ids], n.name), rw.const("b", np.int64(0))], n.name)
            rw.op("ConstantOfShape", [rw.op("Unsqueeze", [zeros, rw.const("ax0", np.array([0], np.int64))], n.name)],
                  n.name, out=outs[1], value=numpy_helper.from_array(np.array([0], np.int32)))
    return True


def _attention(rw: _Rewriter, n: onnx.NodeProto) -> bool:
    """QKV = input . weights + bias, per head softmax(Q K^T scale + mask) V, heads merged; the
    mask a 2-D [B, S_total] or 3-D [B, S, S_total] raw 0/1 mask (0: masked, adds
    ``mask_filter_value``)."""
    a = _attrs(n)
    ins, outs = list(n.input), list(n.output)
    if (any(_present(ins, k) for k in (4, 5, 6)) or _present(outs, 1) or int(a.get("unidirectional", 0))
            or int(a.get("do_rotary", 0)) or rw.opset < 13):
        return False
    heads = int(a["num_heads"])
    wshape = rw.shape_of(ins[1])
    if wshape is None or len(wshape) != 2:
        return False
    sizes = [int(v) for v in a.get("qkv_hidden_sizes", [])] or [wshape[1] // 3] * 3
    if sum(sizes) != wshape[1] or sizes[0] != sizes[1] or any(s % heads for s in sizes):
        return False
    mask = _present(ins, 3)
    mrank = rw.ranks.get(mask) if mask else None
    if mask and mrank not in (1, 2, 3):
        return False
    dq, dv = sizes[0] // heads, sizes[2] // heads
    scale = float(a.get("scale", 0.0)) or 1.0 / math.sqrt(dq)
    x = n.input[0]
    qkv = rw.op("MatMul", [x, ins[1]], n.name)
    if _present(ins, 2):
        qkv = rw.op("Add", [qkv, ins[2]], n.name)
    split = rw.const("split", np.array(sizes, np.int64))
    q, k, v = (rw.name(f"{n.name}_{c}") for c in "qkv")
    rw.nodes.append(helper.make_node("Split", [qkv, split], [q, k, v], name=rw.name(f"{n.name}_Split"), axis=-1))

    def heads_first(t: str, d: int) -> str:  # [B, S, N*d] -> [B, N, S, d]
        r = rw.op("Reshape", [t, rw.const("shape", np.array([0, 0, heads, d], np.int64))], n.name)
        return rw.op("Transpose", [r], n.name, perm=[0, 2, 1, 3])

    qh, vh = heads_first(q, dq), heads_first(v, dv)
    kt = rw.op("Transpose", [rw.op("Reshape", [k, rw.const("shape", np.array([0, 0, heads, dq], np.int64))], n.name)],
               n.name, perm=[0, 2, 3, 1])
    scores = rw.op("Mul", [rw.op("MatMul", [qh, kt], n.name), rw.const("scale", np.float32(scale))], n.name)
    if mask:
        fill = float(a.get("mask_filter_value", -10000.0))
        if mrank == 1:  # each row's valid length (right padding): keys at or past it masked
            total = rw.op("Gather", [rw.op("Shape", [x], n.name), rw.const("one", np.int64(1))], n.name)
            pos = rw.op("Range", [rw.const("zero", np.int64(0)), total, rw.const("one", np.int64(1))], n.name)
            ends = rw.op("Unsqueeze", [rw.op("Cast", [mask], n.name, to=onnx.TensorProto.INT64),
                                       rw.const("ax1", np.array([1], np.int64))], n.name)
            masked = rw.op("Not", [rw.op("Less", [pos, ends], n.name)], n.name)
        else:  # a raw 0/1 mask, [B, S_total] or [B, S, S_total]
            masked = rw.op("Equal", [mask, rw.const("zero", np.array(0, rw.dtypes.get(mask, np.dtype(np.int32))))],
                           n.name)
        add = rw.op("Where", [masked, rw.const("fill", np.float32(fill)), rw.const("none", np.float32(0.0))], n.name)
        axes = [1, 2] if mrank in (1, 2) else [1]
        add = rw.op("Unsqueeze", [add, rw.const("axes", np.array(axes, np.int64))], n.name)
        scores = rw.op("Add", [scores, add], n.name)
    p = rw.op("Softmax", [scores], n.name, axis=-1)
    ctx = rw.op("Transpose", [rw.op("MatMul", [p, vh], n.name)], n.name, perm=[0, 2, 1, 3])
    rw.op("Reshape", [ctx, rw.const("shape", np.array([0, 0, sizes[2]], np.int64))], n.name, out=outs[0])
    return True


def _old_layer_norm(rw: _Rewriter, n: onnx.NodeProto) -> bool:
    """LayerNormalization in the ONNX domain below opset 17, which onnxruntime's optimizer writes
    into such models (onnxruntime registers it from opset 1): the last axis only."""
    a = _attrs(n)
    if _present(list(n.output), 1) or _present(list(n.output), 2) or int(a.get("axis", -1)) != -1:
        return False
    _layer_norm(rw, n.input[0], n.input[1], _present(list(n.input), 2), float(a.get("epsilon", 1e-5)),
                n.output[0], n.name)
    return True


def _fused_matmul(rw: _Rewriter, n: onnx.NodeProto) -> bool:
    """FusedMatMul (onnxruntime's optimizer folds a Transpose of the last two axes and a scale
    into a MatMul, and models saved after its optimization keep it): alpha * op(A) @ op(B). The
    batch-transposing forms (transBatchA/B) are left alone, as is an operand of unknown rank that
    must be transposed."""
    a = _attrs(n)
    if a.get("transBatchA", 0) or a.get("transBatchB", 0):
        return False
    operands = []
    for x, trans in ((n.input[0], a.get("transA", 0)), (n.input[1], a.get("transB", 0))):
        if trans:
            rank = rw.rank_of(x)
            if rank is None or rank < 2:
                return False
            x = rw.op("Transpose", [x], "fused_matmul_t", perm=[*range(rank - 2), rank - 1, rank - 2])
        operands.append(x)
    alpha = float(a.get("alpha", 1.0))
    if alpha == 1.0:
        rw.op("MatMul", operands, "fused_matmul", out=n.output[0])
    else:
        y = rw.op("MatMul", operands, "fused_matmul")
        rw.op("Mul", [y, rw.const("fused_matmul_alpha", np.array(alpha, np.float32))], "fused_matmul_scale",
              out=n.output[0])
    return True


def _fused_conv(rw: _Rewriter, n: onnx.NodeProto) -> bool:
    """FusedConv (onnxruntime's optimizer folds an activation, and a residual sum ``Z``, into a
    Conv; models saved after its optimization keep it, e.g. NVIDIA's MarbleNet VAD):
    ``activation(Conv(X, W, B) + Z)`` with MLAS's activations and their ``activation_params``
    (LeakyRelu alpha; Clip min, max; HardSigmoid alpha, beta). The Conv and what follows it are
    fused again by smelt's own passes. An activation MLAS does not have stays refused."""
    a = _attrs(n)
    act = a.pop("activation", b"")
    act = act.decode() if isinstance(act, bytes) else str(act)
    params = [float(v) for v in a.pop("activation_params", [])]
    ins = list(n.input)
    needs = {"": 0, "Identity": 0, "Relu": 0, "Tanh": 0, "Sigmoid": 0, "LeakyRelu": 1, "Clip": 2, "HardSigmoid": 2}
    if act not in needs or len(params) < needs[act]:
        return False
    y = rw.op("Conv", ins[:2] + ([ins[2]] if _present(ins, 2) else []), n.name, **a)
    if _present(ins, 3):  # Z: added before the activation, as MLAS's convolution adds its Beta * output
        y = rw.op("Add", [y, ins[3]], n.name)
    out = n.output[0]
    if act in ("", "Identity"):
        rw.op("Identity", [y], n.name, out=out)
    elif act == "LeakyRelu":
        rw.op("LeakyRelu", [y], n.name, out=out, alpha=params[0])
    elif act == "HardSigmoid":
        rw.op("HardSigmoid", [y], n.name, out=out, alpha=params[0], beta=params[1])
    elif act == "Clip" and rw.opset >= 11:
        rw.op("Clip", [y, rw.const("clip_min", np.float32(params[0])), rw.const("clip_max", np.float32(params[1]))],
              n.name, out=out)
    elif act == "Clip":
        rw.op("Clip", [y], n.name, out=out, min=params[0], max=params[1])
    else:
        rw.op(act, [y], n.name, out=out)
    return True


EXPANSIONS = {"SkipLayerNormalization": _skip_layer_norm, "BiasGelu": _bias_gelu, "Gelu": _ms_gelu,
              "FastGelu": _fast_gelu, "EmbedLayerNormalization": _embed_layer_norm, "Attention": _attention,
              "FusedMatMul": _fused_matmul, "FusedConv": _fused_conv,
              "MatMulNBits": expand_matmul_nbits}  # frontend/contrib_matmul_nbits.py


def _expansion(rw: _Rewriter, n: onnx.NodeProto):
    if n.domain == MS_DOMAIN:
        return EXPANSIONS.get(n.op_type)
    if n.domain in ("", "ai.onnx") and n.op_type == "LayerNormalization" and rw.opset < 17:
        return _old_layer_norm
    return None


def expand_transformer_contrib_ops(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` with every expandable com.microsoft transformer op replaced by standard ops
    (the same object when there is none)."""
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 1)
    if not any(n.domain == MS_DOMAIN and n.op_type in EXPANSIONS
               or n.domain in ("", "ai.onnx") and n.op_type == "LayerNormalization" and opset < 17
               for n in proto.graph.node):
        return proto  # (most models: nothing built)
    rw = _Rewriter(proto)
    out_nodes: list[onnx.NodeProto] = []
    for n in proto.graph.node:
        expand = _expansion(rw, n)
        rw.nodes = []
        if expand is not None and expand(rw, n):
            out_nodes.extend(rw.nodes)
        else:
            out_nodes.append(n)
    result = onnx.ModelProto()
    result.CopyFrom(proto)
    del result.graph.node[:]
    result.graph.node.extend(out_nodes)
    result.graph.initializer.extend(rw.new_inits)
    return result
