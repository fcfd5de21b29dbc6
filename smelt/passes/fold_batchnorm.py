"""Pass: fold inference-mode BatchNormalization into the preceding Conv or Gemm.

Needs: constants for the BatchNorm parameters and the producer's weights; shapes inferred.
Guarantees: a BatchNormalization whose input comes only from a Conv (or a Gemm with a 2-D
output) is removed and the producer's weights and bias are rescaled so that
``producer'(x) == BN(producer(x))``; the arithmetic is done in float64 and stored back in the
weights' own dtype (fp32 stays fp32). Anything else is left for the standalone BN template.
"""

from __future__ import annotations

import numpy as np

from smelt.ir.graph import Graph, Node


def _bn_scale_shift(g: Graph, bn: Node) -> tuple[np.ndarray, np.ndarray] | None:
    if len([o for o in bn.outputs if o]) != 1 or bn.attr("training_mode", 0):
        return None
    params = [g.const(i) for i in bn.inputs[1:5]]
    if any(p is None for p in params):
        return None
    scale, bias, mean, var = (p.astype(np.float64) for p in params)
    s = scale / np.sqrt(var + bn.attr("epsilon", 1e-5))
    return s, bias - mean * s


def fold_batchnorm(g: Graph) -> Graph:
    producers = g.producers()
    consumers = g.consumers()
    dead = []
    for bn in g.iter_op("BatchNormalization"):
        src = bn.inputs[0]
        prod = producers.get(src)
        if prod is None or prod.epilogue or len(consumers.get(src, [])) != 1 or src in g.outputs:
            continue
        folded = _bn_scale_shift(g, bn)
        if folded is None:
            continue
        s, shift = folded
        if prod.op == "Conv" and _fold_into_conv(g, prod, s, shift):
            pass
        elif prod.op == "Gemm" and _fold_into_gemm(g, prod, s, shift):
            pass
        else:
            continue
        prod.outputs = [bn.outputs[0] if o == src else o for o in prod.outputs]
        dead.append(bn)
    g.remove_nodes(dead)
    g.prune_values()
    return g


def _fold_into_conv(g: Graph, conv: Node, s: np.ndarray, shift: np.ndarray) -> bool:
    w = g.const(conv.inputs[1])
    if w is None or w.shape[0] != s.shape[0]:
        return False
    b = g.const(conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] else np.zeros(w.shape[0], w.dtype)
    if b is None:
        return False
    new_w = (w.astype(np.float64) * s.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype)
    new_b = (b.astype(np.float64) * s + shift).astype(w.dtype)
    conv.inputs = [conv.inputs[0], g.add_const(new_w, f"{conv.name}.w_bn"), g.add_const(new_b, f"{conv.name}.b_bn")]
    return True


def _fold_into_gemm(g: Graph, gemm: Node, s: np.ndarray, shift: np.ndarray) -> bool:
    out = g.values[gemm.outputs[0]]
    b = g.const(gemm.inputs[1])
    if b is None or out.shape is None or len(out.shape) != 2 or out.shape[1] != s.shape[0]:
        return False
    trans_b, alpha, beta = gemm.attr("transB", 0), gemm.attr("alpha", 1.0), gemm.attr("beta", 1.0)
    c = g.const(gemm.inputs[2]) if len(gemm.inputs) > 2 and gemm.inputs[2] else np.zeros(1, b.dtype)
    if c is None:
        return False
    scale_b = s.reshape(-1, 1) if trans_b else s.reshape(1, -1)
    new_b = (b.astype(np.float64) * scale_b * alpha).astype(b.dtype)
    new_c = ((beta * c.astype(np.float64)) * s + shift).astype(b.dtype)
    gemm.inputs = [gemm.inputs[0], g.add_const(new_b, f"{gemm.name}.b_bn"), g.add_const(new_c, f"{gemm.name}.c_bn")]
    from onnx import helper

    gemm.attrs.update(alpha=1.0, beta=1.0)
    gemm.attr_protos = [a for a in gemm.attr_protos if a.name not in ("alpha", "beta")]
    gemm.attr_protos += [helper.make_attribute("alpha", 1.0), helper.make_attribute("beta", 1.0)]
    return True
