"""Pass: constant folding, shape subgraphs included.

Needs: shapes inferred (``Shape``/``Size`` fold only when their input's shape is static, which is
the case once input shapes are known). Guarantees: every deterministic standard-domain node
whose inputs are all constants is replaced by its result (computed by ``onnx.reference``, the
oracle, at compile time), so shape arithmetic (Shape -> Gather -> Concat -> Reshape) disappears
and Reshape targets become constants. Results above ``MAX_FOLD_ELEMS`` are left unfolded.

An empty tensor of static shape counts as a constant (it has no data to wait for: a reduction
over an empty axis is its identity value, a Cast of nothing is nothing), and a node whose every
output is statically empty folds to those empty outputs without being run: templates refuse
empty tensors, and the ONNX node tests feed plenty (``*_empty_set``, zero-size splits).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from smelt.frontend.onnx_import import node_to_onnx
from smelt.ir.graph import Graph, Node
from smelt.ir.ops import ops_where

MAX_FOLD_ELEMS = 1 << 26
NONDETERMINISTIC = ops_where(lambda t: not t.deterministic)


def _fold_shape(g: Graph, node: Node) -> list[np.ndarray] | None:
    v = g.values[node.inputs[0]]
    if not v.is_static:
        return None
    if node.op == "Size":
        return [np.array(v.size, dtype=np.int64)]
    shape = np.array(v.shape, dtype=np.int64)
    rank = len(shape)
    start = node.attr("start", 0)
    end = node.attr("end", rank)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    return [shape[start:end]]


def _plain(dtype: np.dtype | None) -> bool:
    """A dtype an empty constant may have: not strings (numpy object arrays, which the
    artifact's weights cannot hold)."""
    return dtype is not None and np.dtype(dtype).kind != "O"


def _known(g: Graph, name: str) -> np.ndarray | None:
    """The data of a value that needs no computing: a constant, or an empty tensor."""
    v = g.values[name]
    if v.const is not None:
        return v.const
    if v.is_static and _plain(v.dtype) and v.size == 0:
        return np.zeros(v.shape, v.dtype)
    return None


def _empty_outputs(g: Graph, node: Node) -> list[np.ndarray] | None:
    """The outputs of ``node`` when each is statically empty (nothing to compute), else None."""
    outs = [g.values[o] for o in node.outputs if o]
    if not outs or not all(v.is_static and _plain(v.dtype) and v.size == 0 for v in outs):
        return None
    return [np.zeros(v.shape, v.dtype) for v in outs]


def evaluate_node(g: Graph, node: Node, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run one node with onnx.reference on the given inputs."""
    from onnx.reference import ReferenceEvaluator

    inputs = [helper.make_tensor_value_info(n, numpy_helper.from_array(np.asarray(a)).data_type, None)
              for n, a in feeds.items()]
    outputs = [helper.make_empty_tensor_value_info(o) for o in node.outputs if o]
    graph = helper.make_graph([node_to_onnx(node)], "fold", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in g.opset.items()])
    model.ir_version = max(model.ir_version, 8)
    # with the fallback's corrections: DequantizeLinear of constant int8 weights (opset < 19, which
    # onnx.reference lacks) folds to the fp32 weights a native GEMM/conv then packs
    from smelt.runtime.reference_ops import FIXED_OPS

    return [np.asarray(r) for r in ReferenceEvaluator(model, new_ops=FIXED_OPS).run(None, feeds)]


def _fold(g: Graph, node: Node) -> bool:
    """Replace ``node``'s outputs by their values where they are computable now; whether it was."""
    if node.domain not in ("", "ai.onnx") or node.op in NONDETERMINISTIC or node.epilogue:
        return False
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attr_protos):
        return False
    if node.op in ("Shape", "Size"):
        results = _fold_shape(g, node)
    elif (results := _empty_outputs(g, node)) is not None:
        pass
    elif all(_known(g, i) is not None for i in node.present_inputs()):
        feeds = {i: _known(g, i) for i in node.present_inputs()}
        try:
            results = evaluate_node(g, node, feeds)
        except Exception:
            return False  # leave it to run time, where a real error will name the node
    else:
        return False
    if results is None or any(r.size > MAX_FOLD_ELEMS for r in results):
        return False
    for name, arr in zip([o for o in node.outputs if o], results, strict=False):
        v = g.values[name]
        expected = v.dtype
        if expected is not None and arr.dtype != expected:
            arr = arr.astype(expected)
        v.const, v.dtype, v.shape = arr, arr.dtype, tuple(arr.shape)
    return True


def fold_constants(g: Graph) -> Graph:
    changed = True
    while changed:
        dead = [node for node in g.nodes if _fold(g, node)]
        changed = bool(dead)
        g.remove_nodes(dead)
    g.prune_values()
    return g


def fold_constant_nodes(g: Graph) -> Graph:
    """Only the Constant nodes: their values become constants, as initializers are. The passes
    before folding then see a constant written either way (PyTorch's TorchScript exporter writes
    a ReLU6's Clip bounds as Constant nodes, which the QDQ lowering must read)."""
    g.remove_nodes([n for n in g.nodes if n.op == "Constant" and _fold(g, n)])
    return g
