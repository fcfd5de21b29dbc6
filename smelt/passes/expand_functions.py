"""Pass: a node no template runs becomes its schema's function body, when that body runs natively.

Many ONNX operators are *defined* by a function in their schema: a static body
(``OpSchema.function_body``: Shrink, MeanVarianceNormalization, the window functions, Swish) or
one built per node from its attributes and input types (``get_context_dependent_function``:
SoftmaxCrossEntropyLoss, NegativeLogLikelihoodLoss, RMSNormalization, RotaryEmbedding,
Attention, GroupNormalization, CenterCropPad). Such a node with no native template used to run
whole through the onnx.reference fallback; its body is made of ops smelt renders (Softmax,
Gather, ReduceSum, MatMul, Where, ...), so it is expanded into them instead.

A node is expanded when (a) no registered template accepts it (``registry.find_template``), (b)
its schema has a function usable at the node's opset (the newest version not above it first,
then newer ones whose ops are compatible: ``_versions``, ``_compatible``), and
(c) the expansion runs natively: the body, in a scratch graph holding only the node's inputs
(their dtypes, static shapes and constants), is folded and shape-inferred as the pipeline will
do, nested function nodes are expanded in turn, and every node left must have a template. A
body that would leave any node to the fallback is not used (no mixed native/fallback pieces of
one operator), nor one whose ops mean something else at the model's opset than at the body's
(``_compatible``: a newer version may only add types, optional inputs, or attributes whose
default keeps the old behaviour), nor one with subgraph attributes. Verdicts are remembered
per signature (op, attributes, input types, shapes and small constants): blocks repeat.

Ops whose schema has no function (or only one the model's opset cannot use) may have smelt's
own body in ``DECOMPOSITIONS``, written in ONNX ops and checked the same way: Hardmax-13
(ArgMax compared with the axis' indices), LpNormalization (X / ReduceL<p>, a zero norm giving 0
as onnxruntime does), Shrink below opset 15 (its schema body needs CastLike), Sum / Mean
(Adds left to right, Mean then divided by the count), and ai.onnx.ml's Scaler (a Sub and a
Mul in onnxruntime's precision: ``ML_DECOMPOSITIONS``).

Names: the body's values become ``<node>/<name>`` (made unique if taken), its nodes
``<node>/<op>_<k>``; the node's inputs and outputs keep their names, so graph outputs do too.
An absent optional input is "" in the body (functions test it, as onnx's inliner does); an
absent optional output gets a body-local name. Attribute references (``ref_attr_name``) take the
node's attribute or the schema's default; a reference to an attribute with neither is dropped
(ONNX's rule: the body node then sees it absent).

Needs: shapes inferred (a node is only considered once its inputs are static). Runs inside
``pipeline.fold_to_fixpoint`` (opt level >= 1): expanded nodes are folded and inferred by the
rounds after it. Guarantees: every node it leaves in place either has a template, has no
function, or would not expand natively; the new values are typed (it re-runs shape inference).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from functools import cache

import numpy as np
import onnx
from onnx import defs, helper, numpy_helper

from smelt.codegen.registry import find_template
from smelt.frontend.onnx_import import attribute_value, node_to_onnx, op_version
from smelt.frontend.validate import check_graph
from smelt.ir.graph import Graph, Node, Value
from smelt.ir.types import onnx_from_np_dtype
from smelt.passes.compress_gather import compress_gather
from smelt.passes.constant_folding import fold_constants
from smelt.passes.einsum_matmul import einsum_matmul
from smelt.passes.eliminate_identity import eliminate_identity
from smelt.passes.half_conv import half_conv
from smelt.passes.shape_inference import infer_shapes

# nested function calls expanded inside one body (ops defined by functions of functions); a
# body deeper than this is not expanded
MAX_DEPTH = 4
# rounds of fold + inference on a body's scratch graph (as pipeline.MAX_FOLD_ROUNDS, but a body
# is small: Attention's shape arithmetic needs 3)
SCRATCH_ROUNDS = 8


def _schema(g: Graph, node: Node) -> defs.OpSchema | None:
    if node.domain not in ("", "ai.onnx"):
        return None
    return _defined_by_function(node.op, g.opset.get("", 1))


@cache
def _defined_by_function(op: str, opset: int) -> defs.OpSchema | None:
    """The schema of ``op`` at ``opset`` when it has a function (static or context-dependent,
    of any version: ``_versions``); cached: the pass asks for every node of every round."""
    try:
        schema = defs.get_schema(op, opset, "")
    except Exception:  # noqa: BLE001 - an op onnx does not know has no function either
        return None
    versions = list(schema.function_opset_versions) + list(schema.context_dependent_function_opset_versions)
    return schema if versions else None


def _hardmax(g: Graph, node: Node, opset: int) -> onnx.FunctionProto | None:
    """Hardmax-13 (one axis) as ArgMax (first maximum, as onnxruntime) compared with the axis'
    indices: Y = Cast(Equal(iota, ArgMax(X, axis, keepdims=1)))."""
    x = g.values[node.inputs[0]]
    rank = len(x.shape)
    axis = int(node.attr("axis", -1)) % rank
    iota = np.arange(x.shape[axis], dtype=np.int64).reshape([-1 if d == axis else 1 for d in range(rank)])
    nodes = [
        helper.make_node("ArgMax", ["X"], ["index"], axis=axis, keepdims=1, select_last_index=0),
        helper.make_node("Constant", [], ["iota"], value=numpy_helper.from_array(iota)),
        helper.make_node("Equal", ["iota", "index"], ["hot"]),
        helper.make_node("Cast", ["hot"], ["Y"], to=onnx_from_np_dtype(x.dtype)),
    ]
    return helper.make_function("", "Hardmax", ["X"], ["Y"], nodes, [helper.make_opsetid("", opset)])


def _lp_normalization(g: Graph, node: Node, opset: int) -> onnx.FunctionProto | None:
    """LpNormalization as X / ReduceL<p>(X, axis, keepdims=1), a zero norm divided as 1 so the
    row stays 0 (onnxruntime's kernel gives 0 there, not 0/0's NaN)."""
    x = g.values[node.inputs[0]]
    p = int(node.attr("p", 2))
    if p not in (1, 2):
        return None
    axis = int(node.attr("axis", -1)) % len(x.shape)
    reduce = "ReduceL1" if p == 1 else "ReduceL2"
    nodes = [helper.make_node("Constant", [], ["zero"], value=numpy_helper.from_array(np.zeros((), x.dtype))),
             helper.make_node("Constant", [], ["one"], value=numpy_helper.from_array(np.ones((), x.dtype)))]
    if opset >= 18:  # the reductions' axes became an input at 18
        nodes += [helper.make_node("Constant", [], ["axes"], value=numpy_helper.from_array(np.array([axis], np.int64))),
                  helper.make_node(reduce, ["input", "axes"], ["norm"], keepdims=1)]
    else:
        nodes.append(helper.make_node(reduce, ["input"], ["norm"], axes=[axis], keepdims=1))
    nodes += [helper.make_node("Equal", ["norm", "zero"], ["is_zero"]),
              helper.make_node("Where", ["is_zero", "one", "norm"], ["divisor"]),
              helper.make_node("Div", ["input", "divisor"], ["output"])]
    return helper.make_function("", "LpNormalization", ["input"], ["output"], nodes, [helper.make_opsetid("", opset)])


def _shrink(g: Graph, node: Node, opset: int) -> onnx.FunctionProto | None:
    """Shrink without CastLike (its schema body is written for opset 18; models below 15 have no
    CastLike): Where(x < -lambd, x + bias, Where(x > lambd, x - bias, 0)), as onnxruntime."""
    dtype = g.values[node.inputs[0]].dtype
    lambd, bias = float(node.attr("lambd", 0.5)), float(node.attr("bias", 0.0))

    def scalar(name: str, v: float) -> onnx.NodeProto:
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(v, dtype)))
    nodes = [scalar("lo", -lambd), scalar("hi", lambd), scalar("bias", bias), scalar("zero", 0.0),
             helper.make_node("Less", ["input", "lo"], ["below"]),
             helper.make_node("Greater", ["input", "hi"], ["above"]),
             helper.make_node("Add", ["input", "bias"], ["raised"]),
             helper.make_node("Sub", ["input", "bias"], ["lowered"]),
             helper.make_node("Where", ["above", "lowered", "zero"], ["upper"]),
             helper.make_node("Where", ["below", "raised", "upper"], ["output"])]
    return helper.make_function("", "Shrink", ["input"], ["output"], nodes, [helper.make_opsetid("", opset)])


def _sum_or_mean(g: Graph, node: Node, opset: int) -> onnx.FunctionProto | None:
    """Sum as a left-to-right chain of Adds (onnxruntime's order: ((a + b) + c)), Mean as that
    sum divided by the input count; Add broadcasts as Sum-8/13 do (Sum-6's inputs have one
    shape). One input: an Identity."""
    k = len(node.inputs)
    if k == 0 or not all(node.inputs):
        return None
    ins = [f"data_{i}" for i in range(k)]
    last = "total" if node.op == "Mean" else "output"
    nodes, cur = [], ins[0]
    for i in range(1, k):
        out = last if i == k - 1 else f"partial_{i}"
        nodes.append(helper.make_node("Add", [cur, ins[i]], [out]))
        cur = out
    if k == 1:
        nodes.append(helper.make_node("Identity", [cur], [last]))
    if node.op == "Mean":
        count = np.array(k, g.values[node.inputs[0]].dtype)
        nodes += [helper.make_node("Constant", [], ["count"], value=numpy_helper.from_array(count)),
                  helper.make_node("Div", ["total", "count"], ["output"])]
    return helper.make_function("", node.op, ins, ["output"], nodes, [helper.make_opsetid("", opset)])


def _scaler(g: Graph, node: Node, opset: int) -> onnx.FunctionProto | None:
    """ai.onnx.ml Scaler: Y = (X - offset) * scale in float32, per feature (the last axis of a
    [N, F] or [F] input) or one value for all, as onnxruntime computes it: a double X in double,
    then cast; an integer X cast to float first."""
    x = g.values[node.inputs[0]]
    offset = np.asarray(node.attr("offset") or [0.0], np.float32)
    scale = np.asarray(node.attr("scale") or [1.0], np.float32)
    features = x.shape[-1] if x.shape else 1
    if len(offset) != len(scale) or (len(offset) != 1 and (len(x.shape) not in (1, 2) or len(offset) != features)):
        return None  # onnxruntime refuses these (or reads a rank-3 X's features oddly): fallback
    work = np.float64 if x.dtype == np.float64 else np.float32
    nodes = [helper.make_node("Constant", [], ["offset"], value=numpy_helper.from_array(offset.astype(work))),
             helper.make_node("Constant", [], ["scale"], value=numpy_helper.from_array(scale.astype(work)))]
    if x.dtype == work:
        nodes.append(helper.make_node("Identity", ["X"], ["Xw"]))
    else:
        nodes.append(helper.make_node("Cast", ["X"], ["Xw"], to=onnx_from_np_dtype(np.dtype(work))))
    nodes += [helper.make_node("Sub", ["Xw", "offset"], ["centred"]),
              helper.make_node("Mul", ["centred", "scale"], ["scaled" if work == np.float64 else "Y"])]
    if work == np.float64:
        nodes.append(helper.make_node("Cast", ["scaled"], ["Y"], to=onnx.TensorProto.FLOAT))
    return helper.make_function("", "Scaler", ["X"], ["Y"], nodes, [helper.make_opsetid("", opset)])


# smelt's own bodies for ops whose schema has no function (by op and schema since-version), in
# ONNX ops so they go through the same checks: ops common enough in the node suite and models
DECOMPOSITIONS: dict[tuple[str, int], Callable[[Graph, Node, int], onnx.FunctionProto | None]] = {
    ("Hardmax", 13): _hardmax,
    ("LpNormalization", 1): _lp_normalization,
    ("LpNormalization", 22): _lp_normalization,
    ("Shrink", 9): _shrink,
    **{(op, v): _sum_or_mean for op in ("Sum", "Mean") for v in (6, 8, 13)},
    ("Einsum", 12): einsum_matmul,  # float32 contractions with a batched-MatMul form
    ("Compress", 9): compress_gather,  # a constant condition: a Gather
    ("Compress", 11): compress_gather,
    **{("Conv", v): half_conv for v in (1, 11, 22)},  # float16: a float Conv between Casts
}


# ... and for ai.onnx.ml ops, whose schemas have none
ML_DECOMPOSITIONS: dict[tuple[str, int], Callable[[Graph, Node, int], onnx.FunctionProto | None]] = {
    ("Scaler", 1): _scaler,
}


def _decompositions(node: Node) -> dict[tuple[str, int], Callable[[Graph, Node, int], onnx.FunctionProto | None]]:
    return (DECOMPOSITIONS if node.domain in ("", "ai.onnx") else
            ML_DECOMPOSITIONS if node.domain == "ai.onnx.ml" else {})


def _decomposition(g: Graph, node: Node) -> onnx.FunctionProto | None:
    make = _decompositions(node).get((node.op, op_version(g, node)))
    return make(g, node, g.opset.get("", 1)) if make else None


def _has_body(g: Graph, node: Node) -> bool:
    return _schema(g, node) is not None or (node.op, op_version(g, node)) in _decompositions(node)


def _type_proto(g: Graph, name: str) -> onnx.TypeProto:
    """The TypeProto of ``name`` as a context-dependent function builder reads it (empty for an
    absent input)."""
    tp = onnx.TypeProto()
    if not name:
        return tp
    v = g.values[name]
    tt = tp.tensor_type
    tt.elem_type = onnx_from_np_dtype(v.dtype)
    shape = tt.shape
    for d in v.shape:
        shape.dim.add().dim_value = int(d)
    return tp


def _with_defaults(node: Node, schema: defs.OpSchema) -> onnx.NodeProto:
    """The node as ONNX, with every schema default it leaves out written in (a body's attribute
    reference reads the default, as onnx's own expansion does)."""
    proto = node_to_onnx(node)
    given = {a.name for a in proto.attribute}
    for name, attr in schema.attributes.items():
        if name not in given and attr.default_value is not None and attr.default_value.name:
            proto.attribute.append(attr.default_value)
    return proto


def _versions(schema: defs.OpSchema, opset: int) -> list[tuple[int, bool]]:
    """(function version, context-dependent) in order of preference: the newest not above the
    model's opset first (its body is written in the model's operators), then newer ones (Shrink's
    only body is written for opset 18; it serves opset 9 to 17 when ``_same_semantics`` holds)."""
    found = [(v, False) for v in schema.function_opset_versions]
    found += [(v, True) for v in schema.context_dependent_function_opset_versions if v not in
              schema.function_opset_versions]
    below = sorted((f for f in found if f[0] <= opset), reverse=True)
    above = sorted(f for f in found if f[0] > opset)
    return below + above


def function_proto(g: Graph, node: Node) -> onnx.FunctionProto | None:
    """The schema's function for ``node``, of the preferred version (``_versions``) whose body
    means at the model's opset what it means at its own, or None when there is none (or the
    context-dependent builder refuses these attributes and input types)."""
    schema = _schema(g, node)
    if schema is None:
        return _own_body(g, node)
    proto = _with_defaults(node, schema)
    types = [_type_proto(g, i).SerializeToString() for i in node.inputs]
    for version, context in _versions(schema, g.opset.get("", 1)):
        fn = onnx.FunctionProto()
        try:
            if context:
                fn.ParseFromString(schema.get_context_dependent_function_with_opset_version(
                    version, proto.SerializeToString(), types))
            else:
                fn.ParseFromString(schema.get_function_with_opset_version(version))
        except Exception:  # noqa: BLE001 - the builder rejects this node: try another version
            continue
        if fn.node and _same_semantics(g, fn):
            return fn
    return _own_body(g, node)


def _own_body(g: Graph, node: Node) -> onnx.FunctionProto | None:
    """smelt's decomposition (``DECOMPOSITIONS``), where the schema has no usable function."""
    fn = _decomposition(g, node)
    return fn if fn is not None and _same_semantics(g, fn) else None


def _compatible(old: defs.OpSchema, new: defs.OpSchema) -> bool:
    """Whether a node written for ``old`` means the same under ``new``: a version that only
    adds types, optional trailing inputs/outputs or attributes whose default keeps the old
    behaviour (Pow-15, Reshape-14's allowzero, Cast-19's saturate). Removed or retyped
    attributes and changed defaults (ReduceMean-18's axes becoming an input, Softmax-13's axis
    default) are not."""
    if old.since_version == new.since_version:
        return True
    def formals(params):  # noqa: E306
        return [(p.name, p.option) for p in params]
    if formals(new.inputs)[:len(old.inputs)] != formals(old.inputs):
        return False
    if formals(new.outputs)[:len(old.outputs)] != formals(old.outputs):
        return False
    if any(p.option != defs.OpSchema.FormalParameterOption.Optional for p in new.inputs[len(old.inputs):]):
        return False
    for name, a in old.attributes.items():
        b = new.attributes.get(name)
        if b is None or b.type != a.type or b.required != a.required:
            return False
        if a.default_value.SerializeToString() != b.default_value.SerializeToString():
            return False
    return all(not b.required for name, b in new.attributes.items() if name not in old.attributes)


def _same_semantics(g: Graph, fn: onnx.FunctionProto) -> bool:
    """Every body op means at the model's opset what it means at the body's: the graph keeps one
    opset per domain, so a body written for opset 13 (ReduceMean's axes an attribute until 18)
    is only spliced where each of its ops is the same or a compatible version (``_compatible``).
    Bodies with subgraph attributes are not used (no native template runs a subgraph)."""
    body = {o.domain or "": o.version for o in fn.opset_import}
    model = g.opset.get("", 1)
    for n in fn.node:
        if n.domain not in ("", "ai.onnx"):
            return False
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in n.attribute):
            return False
        try:
            old = defs.get_schema(n.op_type, body.get("", model), "")
            new = defs.get_schema(n.op_type, model, "")
        except Exception:  # noqa: BLE001 - an op unknown at one of the two opsets
            return False
        if not (_compatible(old, new) if old.since_version <= new.since_version else _compatible(new, old)):
            return False
    return True


def _unique(g: Graph, taken: set[str], hint: str) -> str:
    name = hint
    k = 0
    while name in g.values or name in taken:
        k += 1
        name = f"{hint}__{k}"
    taken.add(name)
    return name


def body_nodes(g: Graph, node: Node, fn: onnx.FunctionProto) -> list[Node]:
    """The body of ``fn`` instantiated for ``node``: inputs and outputs bound to the node's,
    attribute references resolved, body values renamed ``<node>/<name>`` (values not added to
    ``g``)."""
    schema = _schema(g, node)
    attrs = {a.name: a for a in _with_defaults(node, schema).attribute} if schema else {}
    names: dict[str, str] = {"": ""}
    for k, formal in enumerate(fn.input):
        names[formal] = node.inputs[k] if k < len(node.inputs) else ""
    for k, formal in enumerate(fn.output):
        if k < len(node.outputs) and node.outputs[k]:
            names[formal] = node.outputs[k]
    prefix = f"{node.name}/"
    taken: set[str] = set()
    node_names = {n.name for n in g.nodes}

    def rename(name: str) -> str:
        if name not in names:
            names[name] = _unique(g, taken, prefix + name)
        return names[name]

    out: list[Node] = []
    for k, n in enumerate(fn.node):
        protos: list[onnx.AttributeProto] = []
        for a in n.attribute:
            if a.ref_attr_name:
                if a.ref_attr_name not in attrs:
                    continue  # referenced attribute absent: absent in the body node too
                a2 = onnx.AttributeProto()
                a2.CopyFrom(attrs[a.ref_attr_name])
                a2.name = a.name
                protos.append(a2)
            else:
                protos.append(a)
        label = prefix + (n.name or f"{n.op_type}_{k}")
        while label in node_names:
            label += "_"
        node_names.add(label)
        out.append(Node(op=n.op_type, name=label, inputs=[rename(i) for i in n.input],
                        outputs=[rename(o) if o else "" for o in n.output],
                        attrs={a.name: attribute_value(a) for a in protos}, domain="", attr_protos=protos))
    return out


def _scratch(g: Graph, node: Node, nodes: list[Node]) -> Graph:
    """A graph holding copies of ``nodes`` (the passes run on it rewrite nodes in place) and of
    the node's inputs (typed, constants kept)."""
    s = Graph(f"{g.name}:{node.name}", g.opset)
    for i in dict.fromkeys(node.present_inputs()):
        v = g.values[i]
        s.add_value(Value(i, v.dtype, v.shape, const=v.const))
        if v.const is None:
            s.inputs.append(i)
    for n in nodes:
        for o in n.outputs:
            if o:
                s.add_value(Value(o))
    s.nodes = copy.deepcopy(nodes)
    s.outputs = [o for o in node.outputs if o]
    s.inlined_branches = g.inlined_branches
    return s


def _signature(g: Graph, node: Node) -> tuple:
    """What decides whether a node's body runs natively: opset, op, attributes, and per input its
    dtype, shape, whether it is a constant and, for small constants (axes, shapes, sizes), its
    values. Large constants (weights) count by constness only."""
    ins = []
    for name in node.inputs:
        v = g.values.get(name) if name else None
        if v is None:
            ins.append(None)
            continue
        data = v.const.tobytes() if v.const is not None and v.const.size <= SMALL_CONST else None
        ins.append((str(v.dtype), v.shape, v.const is not None, data))
    attrs = tuple(a.SerializeToString() for a in node.attr_protos)
    return (tuple(sorted(g.opset.items())), node.op, attrs, tuple(ins), len(node.outputs),
            tuple(bool(o) for o in node.outputs))


# verdicts of _runs_natively by _signature: a model repeats its blocks (an LLM's RMSNormalization
# per layer), and a node whose body cannot run natively is asked again every fold round
_VERDICTS: dict[tuple, bool] = {}
MAX_VERDICTS = 4096
SMALL_CONST = 64


def _runs_natively(g: Graph, node: Node, nodes: list[Node], depth: int) -> bool:
    """Whether the expansion, folded and inferred as the pipeline will, leaves no node to the
    fallback (nested function nodes expanded in turn, up to ``MAX_DEPTH``); remembered per
    ``_signature``."""
    key = _signature(g, node)
    if key not in _VERDICTS:
        if len(_VERDICTS) >= MAX_VERDICTS:
            _VERDICTS.clear()
        _VERDICTS[key] = _try_natively(g, node, nodes, depth)
    return _VERDICTS[key]


def _try_natively(g: Graph, node: Node, nodes: list[Node], depth: int) -> bool:
    s = _scratch(g, node, nodes)
    try:
        s = infer_shapes(s)
        for _ in range(SCRATCH_ROUNDS):
            before = len(s.nodes)
            s = _expand(infer_shapes(eliminate_identity(fold_constants(s))), depth + 1)
            if len(s.nodes) == before:
                break
    except Exception:  # noqa: BLE001 - a body inference or fold refuses: leave the node whole
        return False
    return all(find_template(n, s)[0] is not None for n in s.nodes)


def _candidate(g: Graph, node: Node) -> bool:
    """Inputs typed and statically shaped, and no template takes it. (Outputs may be untyped:
    onnx infers GroupNormalization-21 only through its function, which it does not run here.)"""
    for name in node.present_inputs():
        v = g.values.get(name)
        if v is None or v.dtype is None or not v.is_static:
            return False
    return find_template(node, g)[0] is None


def _expand(g: Graph, depth: int = 0) -> Graph:
    if depth > MAX_DEPTH:
        raise RecursionError("function bodies nested too deep")
    out: list[Node] = []
    changed = False
    for node in g.nodes:
        fn = None
        if _has_body(g, node) and _candidate(g, node):
            fn = function_proto(g, node)
        if fn is None:
            out.append(node)
            continue
        nodes = body_nodes(g, node, fn)
        made = {o for n in nodes for o in n.outputs if o}
        # a body that passes an input straight through as an output has no node writing it
        if not all(o in made for o in node.outputs if o) or not _runs_natively(g, node, nodes, depth):
            out.append(node)
            continue
        for n in nodes:
            for o in n.outputs:
                if o and o not in g.values:
                    g.add_value(Value(o))
        out += nodes
        changed = True
    if changed:
        g.nodes = out
        g.prune_values()
        g = check_graph(infer_shapes(g)) if depth == 0 else infer_shapes(g)
    return g


def expand_functions(g: Graph) -> Graph:
    """Expand every node that no template runs into its schema's function body, where the body
    runs natively (module docstring)."""
    for n in g.nodes:
        if _has_body(g, n):
            break
    else:
        return g
    return _expand(g)
