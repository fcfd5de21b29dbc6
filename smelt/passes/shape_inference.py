"""Pass: shape and dtype inference.

Needs: a graph of standard ONNX nodes (no fused epilogues yet).
Guarantees: every value onnx's inference can type gets a dtype and shape; symbolic dimensions
stay symbols; concrete sizes replace symbols wherever data propagation resolves them. Values it
cannot type (data-dependent shapes) stay unknown, which keeps their nodes out of native blocks.
Shapes come from the graph inputs and constants only: what the model declares for other values
(``Graph.declared``) is never believed, only checked (``frontend.validate.check_graph``).

Inference is strict: a node whose inference function finds the model invalid (Split sizes that
do not add up, a stride of 0, operands that do not broadcast, inputs of different types for one
type parameter, ...: what onnxruntime refuses when it loads the model) raises
``InvalidModelError``. Where onnx's strict mode fails for reasons that are not the model's
(``_lenient``), inference falls back to best effort.
"""

from __future__ import annotations

import re

import onnx

from smelt.errors import InvalidModelError
from smelt.frontend.onnx_import import _type_of, to_onnx
from smelt.ir.graph import Graph

# one node's error in onnx's report; the first is the cause (the nodes after it see no type)
_NODE_ERROR = re.compile(r"\(op_type:([^,]+), node name: ([^)]*)\): (.*?)(?=\n\(op_type:|\Z)", re.S)


def _better(old, new):
    if new is None:
        return old
    if old is None or len(old) != len(new):
        return new
    return tuple(n if isinstance(n, int) else o for o, n in zip(old, new, strict=True))


# ops whose inference walks subgraphs, which smelt's export leaves partly untyped
_SUBGRAPH_OPS = ("If", "Loop", "Scan", "SequenceMap")


def _lenient(message: str) -> bool:
    """Strict-mode failures that say nothing about the model: smelt's IR keeps no type for
    sequence and optional values (their readers see "null" or a type-case mismatch), and errors
    raised inside a function body or subgraph (onnx's inference of those is incomplete; the
    fallback runs them)."""
    m = _NODE_ERROR.search(message)
    first = m.group(3) if m is not None else message
    return ("null" in first or "type info" in first or "type case mismatch" in first
            or "Inference error(s)" in first or (m is not None and m.group(1) in _SUBGRAPH_OPS))


def _guard_slices(model: onnx.ModelProto) -> None:
    """onnx's Slice inference aborts the whole process (a failed std::clamp assertion) when its
    data input has a negative dim, which onnx's Pad, Conv and pooling inference produce for
    invalid models without complaint. So when the graph has Slice nodes, shapes are first
    inferred without them and a negative dim is refused before the real inference runs."""
    if not any(n.op_type == "Slice" for n in model.graph.node):
        return
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    kept = [n for n in probe.graph.node if n.op_type != "Slice"]
    del probe.graph.node[:]
    probe.graph.node.extend(kept)
    try:
        inferred = onnx.shape_inference.infer_shapes(probe, check_type=False, strict_mode=False, data_prop=True)
    except Exception:  # best effort: the strict run reports what is wrong
        return
    producer = {o: n for n in kept for o in n.output}
    for vi in inferred.graph.value_info:
        dims = vi.type.tensor_type.shape.dim
        if any(d.HasField("dim_value") and d.dim_value < 0 for d in dims):
            n = producer.get(vi.name)
            shape = [d.dim_value if d.HasField("dim_value") else "?" for d in dims]
            raise InvalidModelError(f"its output {vi.name!r} would have shape {shape}, with a negative "
                                    "dimension", node=n.name if n else None, op=n.op_type if n else None)


def infer_shapes(g: Graph) -> Graph:
    model = to_onnx(g, small_consts_only=True)
    _guard_slices(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    except onnx.shape_inference.InferenceError as exc:
        message = str(exc)
        if not _lenient(message):
            m = _NODE_ERROR.search(message)
            if m is None:
                raise InvalidModelError(f"shape inference: {message.strip()}") from None
            detail = " ".join(m.group(3).split())
            raise InvalidModelError(detail, node=m.group(2) or None, op=m.group(1)) from None
        try:
            inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False,
                                                         data_prop=True)
        except Exception:  # best effort: unknown shapes fall back, never crash
            return g
    except Exception:  # inference is best effort; unknown shapes fall back, never crash
        return g
    infos = list(inferred.graph.value_info) + list(inferred.graph.output) + list(inferred.graph.input)
    for vi in infos:
        v = g.values.get(vi.name)
        if v is None or v.const is not None:
            continue
        dtype, shape = _type_of(vi.type)
        if v.dtype is None and dtype is not None:
            v.dtype = dtype
        v.shape = _better(v.shape, shape)
    return g
