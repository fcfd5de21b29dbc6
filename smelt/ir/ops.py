"""What passes need to know about each op, declared once, never special-cased in passes.

- fusion class (TVM's): "elementwise" (unary, same shape), "broadcast" (binary with
  broadcasting), "injective" (data movement), "reduce", "out_fusable" (a heavy op whose output
  can take an element-wise epilogue: Conv, Gemm, MatMul), "opaque".
- layout class (NeoCPU §3.2): "oblivious" (any layout), "tolerant" (knows and accepts several
  layouts), "dependent" (plain layout only).
- flops: multiply-adds count as 2 FLOPs; only heavy ops report non-zero.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from smelt.ir.graph import Graph, Node


@dataclass(frozen=True)
class OpTraits:
    fusion: str
    layout: str
    flops: Callable[[Node, Graph], int] | None = None


UNARY_ELEMENTWISE = (
    "Relu", "Sigmoid", "Tanh", "Clip", "LeakyRelu", "HardSigmoid", "HardSwish", "Elu", "Selu",
    "Exp", "Log", "Sqrt", "Neg", "Abs", "Reciprocal", "Floor", "Ceil", "Softplus", "Softsign",
    "Erf", "Sin", "Cos", "Identity", "Not", "Sign", "Round", "Mish", "Gelu", "Celu", "ThresholdedRelu",
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
    "BatchNormalization": OpTraits("elementwise", "tolerant"),
    "MaxPool": OpTraits("opaque", "tolerant"),
    "AveragePool": OpTraits("opaque", "tolerant"),
    "Concat": OpTraits("injective", "oblivious"),
    "LSTM": OpTraits("opaque", "dependent", rnn_flops),
    "GRU": OpTraits("opaque", "dependent", rnn_flops),
    "RNN": OpTraits("opaque", "dependent", rnn_flops),
    "Dropout": OpTraits("elementwise", "oblivious"),
})

OPAQUE = OpTraits("opaque", "dependent")


# Producers whose templates apply a fused element-wise epilogue to each output element.
EPILOGUE_HOSTS = frozenset({"Conv", "Gemm", "MatMul", "BatchNormalization"})


def traits(op: str) -> OpTraits:
    return TRAITS.get(op, OPAQUE)


def flops(node: Node, g: Graph) -> int:
    fn = traits(node.op).flops
    return fn(node, g) if fn else 0
