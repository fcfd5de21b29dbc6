"""What passes need to know about each op, declared once, never special-cased in passes.

- fusion class (TVM's): "elementwise" (unary, same shape), "broadcast" (binary with
  broadcasting), "injective" (data movement), "reduce", "out_fusable" (a heavy op whose output
  can take an element-wise epilogue: Conv, Gemm, MatMul), "opaque".
- layout class (NeoCPU §3.2): "oblivious" (any layout), "tolerant" (knows and accepts several
  layouts), "dependent" (plain layout only).
- flops: multiply-adds count as 2 FLOPs; only heavy ops report non-zero.
- epilogue_channel_axis: set for an epilogue host (its template applies a fused element-wise
  chain, passes/fuse_epilogue.py): the output axis a per-channel operand indexes (1: NCHW's
  channel, -1: the last axis).
- blocked: has a blocked (NCHWc) template, so the global layout search may keep it blocked.
- recurrent / shape_glue: the RNN family, and the shape ops exported around it (the dynamic RNN
  mode in api.py accepts models of only these).
- deterministic: False for random ops (never constant-folded).
- subgraphs: the control-flow ops whose attributes hold graphs.

This table is smelt's only op list: passes read these traits, never their own op sets (templates
declare the ops they implement with ``register``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from smelt.ir.graph import Graph, Node


@dataclass(frozen=True)
class OpTraits:
    fusion: str
    layout: str
    flops: Callable[[Node, Graph], int] | None = None
    epilogue_channel_axis: int | None = None
    blocked: bool = False
    recurrent: bool = False
    shape_glue: bool = False
    deterministic: bool = True
    subgraphs: bool = False

    @property
    def epilogue_host(self) -> bool:
        return self.epilogue_channel_axis is not None


UNARY_ELEMENTWISE = (
    "Relu", "Sigmoid", "Tanh", "Clip", "LeakyRelu", "HardSigmoid", "HardSwish", "Elu", "Selu",
    "Exp", "Log", "Sqrt", "Neg", "Abs", "Reciprocal", "Floor", "Ceil", "Softplus", "Softsign",
    "Erf", "Sin", "Cos", "Tan", "Acos", "Asin", "Atan", "Acosh", "Asinh", "Atanh", "Sinh", "Cosh", "Identity",
    "Not", "Sign", "Round", "Mish", "Gelu", "Celu", "ThresholdedRelu",
)
BINARY_BROADCAST = (
    "Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "PRelu", "Equal", "Less", "Greater",
    "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Mod", "BitShift", "Sum", "Mean", "Where",
)
INJECTIVE = (
    "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Concat", "Slice", "Split",
    "Gather", "Pad", "Expand", "Tile", "Cast", "DepthToSpace", "SpaceToDepth",
)
REDUCE = ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "Softmax", "LogSoftmax",
          "GlobalAveragePool", "GlobalMaxPool", "ArgMax", "ArgMin")


def _shape(g: Graph, name: str) -> tuple[int, ...]:
    v = g.values[name]
    return tuple(v.shape) if v.is_static else ()


def conv_flops(node: Node, g: Graph) -> int:
    out = _shape(g, node.outputs[0])
    w = _shape(g, node.inputs[1])
    if not out or not w:
        return 0
    return 2 * int(np.prod(out)) * int(np.prod(w[1:]))


def gemm_flops(node: Node, g: Graph) -> int:
    out = _shape(g, node.outputs[0])
    a = _shape(g, node.inputs[0])
    if not out or not a:
        return 0
    k = a[0] if node.attr("transA", 0) else a[-1]
    if node.op == "MatMul" and len(a) == 1:
        k = a[0]
    return 2 * int(np.prod(out)) * int(k)


def rnn_flops(node: Node, g: Graph) -> int:
    x, w, r = (_shape(g, node.inputs[i]) for i in range(3))
    if not x or not w or not r:
        return 0
    seq, batch, inp = (x[1], x[0], x[2]) if node.attr("layout", 0) else x
    dirs, gates_h, hidden = r
    return 2 * dirs * seq * batch * gates_h * (inp + hidden)


def attention_flops(node: Node, g: Graph) -> int:
    """smelt's fused HeadAttention (passes/fuse_attention.py): QK^T and PV, 2 x 2 B S Sk H D."""
    q, k = _shape(g, node.inputs[0]), _shape(g, node.inputs[1])
    if not q or not k:
        return 0
    return 4 * int(q[0]) * int(q[1]) * int(k[1]) * int(q[2])


def dw_pw_flops(node: Node, g: Graph) -> int:
    """schedule/dwpw.py's fused DwPwConv: the depthwise conv and the 1x1 that reads it, and the
    expand 1x1 before them when fused too (inputs x, dw W, dw B, pw W, pw B[, ex W, ex B])."""
    out, x = _shape(g, node.outputs[0]), _shape(g, node.inputs[0])
    dw_w, pw_w = _shape(g, node.inputs[1]), _shape(g, node.inputs[3])
    if not out or not x or not dw_w or not pw_w:
        return 0
    n, _, oh, ow = out
    c = int(pw_w[1])
    total = 2 * int(np.prod(out)) * c + 2 * n * c * oh * ow * int(np.prod(dw_w[1:]))
    if len(node.inputs) > 5 and node.inputs[5]:
        total += 2 * n * c * int(np.prod(x[2:])) * int(np.prod(_shape(g, node.inputs[5])[1:]))
    return int(total)


TRAITS: dict[str, OpTraits] = {}
for _op in UNARY_ELEMENTWISE:
    TRAITS[_op] = OpTraits("elementwise", "oblivious")
for _op in BINARY_BROADCAST:
    TRAITS[_op] = OpTraits("broadcast", "oblivious")
for _op in INJECTIVE:
    TRAITS[_op] = OpTraits("injective", "dependent")
for _op in REDUCE:
    TRAITS[_op] = OpTraits("reduce", "dependent")
TRAITS.update({
    "Conv": OpTraits("out_fusable", "tolerant", conv_flops),
    "ConvTranspose": OpTraits("opaque", "dependent", conv_flops),
    "Gemm": OpTraits("out_fusable", "dependent", gemm_flops),
    "MatMul": OpTraits("out_fusable", "dependent", gemm_flops),
    "HeadAttention": OpTraits("opaque", "dependent", attention_flops),  # domain ai.smelt
    "DwPwConv": OpTraits("opaque", "dependent", dw_pw_flops),  # domain ai.smelt
    "BatchNormalization": OpTraits("elementwise", "tolerant"),
    "MaxPool": OpTraits("opaque", "tolerant"),
    "AveragePool": OpTraits("opaque", "tolerant"),
    "Concat": OpTraits("injective", "oblivious"),
    "LSTM": OpTraits("opaque", "dependent", rnn_flops),
    "GRU": OpTraits("opaque", "dependent", rnn_flops),
    "RNN": OpTraits("opaque", "dependent", rnn_flops),
    "Dropout": OpTraits("elementwise", "oblivious"),
    "Resize": OpTraits("injective", "tolerant"),
})

OPAQUE = OpTraits("opaque", "dependent")


def _mark(ops: tuple[str, ...], **fields) -> None:
    for op in ops:
        TRAITS[op] = replace(TRAITS.get(op, OPAQUE), **fields)


_mark(("Conv", "BatchNormalization"), epilogue_channel_axis=1)
_mark(("Gemm", "MatMul"), epilogue_channel_axis=-1)
# the ops with blocked templates (templates/blocked.py, elementwise, movement, conv_nchwc)
_mark(UNARY_ELEMENTWISE + ("Add", "Sub", "Mul", "Div", "Max", "Min", "Sum", "Concat", "MaxPool", "AveragePool",
                           "GlobalAveragePool", "GlobalMaxPool", "BatchNormalization", "Resize"), blocked=True)
_mark(("LSTM", "GRU", "RNN"), recurrent=True)
_mark(("Squeeze", "Unsqueeze", "Reshape", "Transpose", "Identity", "Constant"), shape_glue=True)
_mark(("RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"),
      deterministic=False)
_mark(("If", "Loop", "Scan", "SequenceMap"), subgraphs=True)


def ops_where(pred: Callable[[OpTraits], bool]) -> frozenset[str]:
    """The ops whose traits satisfy ``pred``."""
    return frozenset(op for op, t in TRAITS.items() if pred(t))


# Producers whose templates apply a fused element-wise epilogue to each output element.
EPILOGUE_HOSTS = ops_where(lambda t: t.epilogue_host)


def traits(op: str) -> OpTraits:
    return TRAITS.get(op, OPAQUE)


def flops(node: Node, g: Graph) -> int:
    fn = traits(node.op).flops
    return fn(node, g) if fn else 0
