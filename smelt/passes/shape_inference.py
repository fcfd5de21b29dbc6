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
from smelt.ir.ops import ops_where
from smelt.passes.contrib_shapes import apply_contrib_shapes

# one node's error in onnx's report; the first is the cause (the nodes after it see no type)
_NODE_ERROR = re.compile(r"\(op_type:([^,]+), node name: ([^)]*)\): (.*?)(?=\n\(op_type:|\Z)", re.S)


def _better(old, new):
    if new is None:
        return old
    if old is None or len(old) != len(new):
        return new
    return tuple(n if isinstance(n, int) else o for o, n in zip(old, new, strict=True))


# ops whose inference walks subgraphs, which smelt's export leaves partly untyped
_SUBGRAPH_OPS = ops_where(lambda t: t.subgraphs)


def _lenient(message: str, after_inlining: bool = False) -> bool:
    """Strict-mode failures that say nothing about the model: smelt's IR keeps no type for
    sequence and optional values (their readers see "null" or a type-case mismatch), and errors
    raised inside a function body or subgraph (onnx's inference of those is incomplete; the
    fallback runs them) — and any node error in a graph where an If was inlined
    (``after_inlining``): onnx never checked the branch's values, nor what replaced them (AffineGrid's
    expansion passes a [1] constant on as the "scalar" a Range reads), strictly while they were
    a subgraph's, and onnxruntime runs what its strict inference refuses."""
    m = _NODE_ERROR.search(message)
    first = m.group(3) if m is not None else message
    return ("null" in first or "type info" in first or "type case mismatch" in first
            or "Inference error(s)" in first
            or (m is not None and (m.group(1) in _SUBGRAPH_OPS or after_inlining)))


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


_CEIL_POOLS = ("MaxPool", "AveragePool", "LpPool")


def _ceil_pool_sizes(node: onnx.NodeProto, in_shape: list[int]) -> tuple[list[int], list[int]] | None:
    """For a ceil_mode pool with explicit pads: (onnx's output sizes, onnxruntime's), else None.
    onnxruntime drops a last window that would start in the end padding ((out-1)*stride >=
    in + pad_begin), onnx 1.23's inference keeps it: a MaxPool 2x2/2 with pads [1,1,1,0] on an
    11x13 input is 6x7 in onnxruntime, 7x7 in onnx."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if not attrs.get("ceil_mode") or attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        return None
    k = list(attrs.get("kernel_shape", []))
    r = len(k)
    if r == 0 or len(in_shape) != r + 2 or not all(isinstance(d, int) and d > 0 for d in in_shape[2:]):
        return None
    strides = list(attrs.get("strides", [1] * r))
    dil = list(attrs.get("dilations", [1] * r))
    pads = list(attrs.get("pads", [0] * (2 * r)))
    ours, theirs = [], []
    for a in range(r):
        n, s, ek = in_shape[2 + a], strides[a], dil[a] * (k[a] - 1) + 1
        span = n + pads[a] + pads[a + r] - ek
        if s <= 0 or span < 0:
            return None  # invalid: onnx's inference and the validator report it
        out = -(-span // s) + 1
        ours.append(out)
        theirs.append(out - 1 if (out - 1) * s >= n + pads[a] else out)
    return ours, theirs


def _inferred_shapes(inferred: onnx.ModelProto) -> dict[str, list]:
    shapes = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input):
        dims = vi.type.tensor_type.shape.dim
        shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in dims]
    return shapes


def _patch_ceil_pools(model: onnx.ModelProto, shapes: dict[str, list]) -> bool:
    """Make the exported copy's ceil_mode pools infer onnxruntime's sizes: where they differ,
    the copy's node gets ceil_mode 0 and the end pads that give onnxruntime's size (the copy is
    only inferred, never run). Whether any node changed."""
    changed = False
    for node in model.graph.node:
        if node.op_type not in _CEIL_POOLS or not node.input or node.input[0] not in shapes:
            continue
        sizes = _ceil_pool_sizes(node, shapes[node.input[0]])
        if sizes is None or sizes[0] == sizes[1]:
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        k, r = list(attrs["kernel_shape"]), len(attrs["kernel_shape"])
        strides, dil = list(attrs.get("strides", [1] * r)), list(attrs.get("dilations", [1] * r))
        pads = list(attrs.get("pads", [0] * (2 * r)))
        for a in range(r):  # floor((n + pb + pe - ek) / s) + 1 == out; where that needs pe < 0,
            # pe = 0 already gives out (floor mode without end pads is at most onnxruntime's size)
            n, ek = shapes[node.input[0]][2 + a], dil[a] * (k[a] - 1) + 1
            pads[a + r] = max(0, (sizes[1][a] - 1) * strides[a] + ek - n - pads[a])
        kept = [a for a in node.attribute if a.name not in ("ceil_mode", "pads")]
        del node.attribute[:]
        node.attribute.extend(kept + [onnx.helper.make_attribute("pads", pads)])
        changed = True
    return changed


def _infer(model: onnx.ModelProto, after_inlining: bool = False) -> onnx.ModelProto | None:
    """onnx's inference in strict mode (errors about the model raise ``InvalidModelError``),
    else best effort; None when even that fails."""
    try:
        return onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    except onnx.shape_inference.InferenceError as exc:
        message = str(exc)
        if not _lenient(message, after_inlining):
            m = _NODE_ERROR.search(message)
            if m is None:
                raise InvalidModelError(f"shape inference: {message.strip()}") from None
            detail = " ".join(m.group(3).split())
            raise InvalidModelError(detail, node=m.group(2) or None, op=m.group(1)) from None
        try:
            return onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)
        except Exception:  # best effort: unknown shapes fall back, never crash
            return None
    except Exception:  # inference is best effort; unknown shapes fall back, never crash
        return None


def infer_shapes(g: Graph) -> Graph:
    _infer_onnx(g)
    # onnxruntime's contrib ops (and ai.onnx.ml's untyped ones), then what follows them; again while that types another contrib
    # node's inputs (stacked DynamicQuantizeLSTMs joined by Squeezes: one layer per round; a
    # single round left the third layer untyped and refused)
    for _ in range(1 + sum(n.domain in ("com.microsoft", "ai.onnx.ml") for n in g.nodes)):
        if not apply_contrib_shapes(g):
            break
        _infer_onnx(g)
    return g


def _infer_onnx(g: Graph) -> None:
    model = to_onnx(g, small_consts_only=True)
    _guard_slices(model)
    # pools whose input shape is known already (a second inference exports the sizes the first
    # found, which onnx's own pool inference would contradict), then each round fixes at least
    # the first ceil_mode pool onnx sized differently from onnxruntime
    _patch_ceil_pools(model, {k: list(v.shape) for k, v in g.values.items() if v.shape is not None})
    inferred = _infer(model, g.inlined_branches)
    for _ in range(sum(n.op_type in _CEIL_POOLS for n in model.graph.node)):
        if inferred is None or not _patch_ceil_pools(model, _inferred_shapes(inferred)):
            break
        inferred = _infer(model, g.inlined_branches)
    if inferred is None:
        return
    infos = list(inferred.graph.value_info) + list(inferred.graph.output) + list(inferred.graph.input)
    for vi in infos:
        v = g.values.get(vi.name)
        if v is None or v.const is not None:
            continue
        dtype, shape = _type_of(vi.type)
        if v.dtype is None and dtype is not None:
            v.dtype = dtype
        v.shape = _better(v.shape, shape)
