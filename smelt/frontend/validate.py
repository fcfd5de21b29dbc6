"""Model validation: a model is checked against the ONNX specification before smelt compiles it.

Generated C trusts its node's attributes and shapes (a stride divides, a kernel fits its padded
input, an output buffer is as large as what its node writes), and so does the onnx.reference
fallback. A model that breaks the specification must therefore stop here, with an
``InvalidModelError`` naming the node, its op, the attribute or value, what is allowed and what
was given, instead of reaching a template (a ZeroDivisionError, a heap overflow) or the
fallback (an arbitrary exception at run time). onnxruntime is the oracle: what it refuses when
it creates a session, smelt refuses; what it accepts, smelt accepts unless a kernel would have to
guess (a kernel larger than its padded input, a Gemm bias that does not broadcast: onnxruntime
fails those only when it runs them).

Two stages, because some rules need shapes:

- ``check_model(proto)`` runs on the ONNX model before it becomes IR: every value is produced
  once (never over a graph input or an initializer) and read after it is produced, graph outputs
  exist, initializers hold as many elements as their (non-negative) dims say, and every node of
  an ONNX domain matches its operator schema (onnx.defs) at the model's opset: the op exists,
  input and output counts, no empty name for a required input, required attributes present, no
  unknown attribute, attribute types.
- ``check_graph(g)`` runs after each shape inference: shapes the model declares (graph outputs,
  value_info) agree with the inferred ones (the declaration never sizes a buffer: see
  ``Graph.declared``), no inferred dim is negative, and the op-specific rules of the ops smelt
  has native templates for (strides, dilations, kernels, pads, group, Split sizes, LRN size,
  block sizes, permutations, axes, index ranges, RNN weight shapes, ...).

Rules that onnx's strict shape inference enforces (broadcasting, MatMul dims, dtype
constraints, ...) are not repeated here: ``passes.shape_inference`` turns its errors into
``InvalidModelError`` too.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, defs, helper

from smelt.errors import InvalidModelError
from smelt.ir.activations import RNN_ACTIVATIONS
from smelt.ir.graph import Graph, Node

# domains whose operators onnx.defs describes; other domains (custom ops) have no schema here
# and are refused or run by the rules of the fallback (compiler._check_fallbacks)
ONNX_DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "ai.onnx.preview.training")
# attributes smelt itself puts on recurrent nodes (api's ``smelt_dynamic``, the rnn template's
# ``annotate``); any other attribute outside the schema is refused, as onnxruntime refuses it
SMELT_ATTRS = {op: frozenset({"smelt_dynamic", "smelt_rnn_schedule", "smelt_rnn_grid", "smelt_rnn_pipeline",
                                "smelt_rnn_split_barrier"})
               for op in ("LSTM", "GRU", "RNN")}
AUTO_PAD = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")
RNN_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
# 4-bit and 2-bit types are packed; their element counts are checked by decoding them
_PACKED = {getattr(TensorProto, n) for n in ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2") if hasattr(TensorProto, n)}


def node_label(node: onnx.NodeProto, index: int) -> str:
    """The name smelt reports for a node (``to_ir`` names unnamed nodes the same way)."""
    return node.name or f"{node.op_type}_{index}"


# -- stage 1: the ONNX model ---------------------------------------------------------------------

def check_model(proto: onnx.ModelProto) -> None:
    """Raise ``InvalidModelError`` unless ``proto``'s graph and nodes match the ONNX spec."""
    opset: dict[str, int] = {}
    for imp in proto.opset_import:
        opset["" if imp.domain == "ai.onnx" else imp.domain] = int(imp.version)
    _check_graph_proto(proto.graph, opset, frozenset(), "the graph")


def _check_graph_proto(graph: onnx.GraphProto, opset: dict[str, int], outer: frozenset[str],
                       where: str) -> None:
    _check_names(graph, where)
    origin: dict[str, str] = {}  # value name -> what defines it, for messages
    for t in graph.initializer:
        if t.name in origin:
            raise InvalidModelError(f"{where} has two initializers named {t.name!r}")
        check_tensor(t, f"initializer {t.name!r}")
        origin[t.name] = "an initializer"
    for vi in graph.input:
        if vi.name in origin and origin[vi.name] != "an initializer":
            raise InvalidModelError(f"{where} declares graph input {vi.name!r} twice")
        origin.setdefault(vi.name, "a graph input")
    produced_at: dict[str, int] = {}
    named: dict[str, int] = {}
    for idx, n in enumerate(graph.node):
        if n.name and named.setdefault(n.name, idx) != idx:  # names identify nodes in reports
            raise InvalidModelError(f"{where} has two nodes named {n.name!r} (ops "
                                    f"{graph.node[named[n.name]].op_type} and {n.op_type}); node names "
                                    "must be unique")
        for o in n.output:
            if not o:
                continue
            if o in produced_at:
                first = graph.node[produced_at[o]]
                raise InvalidModelError(
                    f"value {o!r} is produced twice: by node {node_label(first, produced_at[o])!r} "
                    f"(op {first.op_type}) and by node {node_label(n, idx)!r} (op {n.op_type}); every "
                    "value must have exactly one producer")
            if o in origin:
                raise InvalidModelError(f"writes {o!r}, which is {origin[o]}; a node may not overwrite it",
                                        node=node_label(n, idx), op=n.op_type)
            produced_at[o] = idx
    for idx, n in enumerate(graph.node):
        label = node_label(n, idx)
        for i in n.input:
            if not i or i in origin or i in outer:
                continue
            at = produced_at.get(i)
            if at is None:
                raise InvalidModelError(f"reads {i!r}, which is not a graph input, an initializer or "
                                        "the output of any node", node=label, op=n.op_type)
            if at >= idx:
                raise InvalidModelError(
                    f"reads {i!r} before node {node_label(graph.node[at], at)!r} produces it, and no "
                    "order of the nodes can fix that: the graph has a cycle", node=label, op=n.op_type)
        check_node_schema(n, label, opset)
        for a in n.attribute:
            subs = [a.g] if a.type == AttributeProto.GRAPH else list(a.graphs) if a.type == AttributeProto.GRAPHS else []
            for sub in subs:  # a subgraph sees every name defined before its node
                scope = outer | origin.keys() | {o for k in range(idx) for o in graph.node[k].output if o}
                _check_graph_proto(sub, opset, frozenset(scope), f"subgraph {a.name!r} of node {label!r}")
            if a.type == AttributeProto.TENSOR:
                check_tensor(a.t, f"attribute {a.name!r} of node {label!r} (op {n.op_type})")
            elif a.type == AttributeProto.TENSORS:
                for t in a.tensors:
                    check_tensor(t, f"attribute {a.name!r} of node {label!r} (op {n.op_type})")
    for vi in graph.output:
        if vi.name not in origin and vi.name not in produced_at and vi.name not in outer:
            raise InvalidModelError(f"graph output {vi.name!r} of {where} is not a graph input, an "
                                    "initializer or the output of any node")


def _check_names(graph: onnx.GraphProto, where: str) -> None:
    """Names are text: protobuf hands back a string field that is not valid UTF-8 as bytes."""
    names = [graph.name] + [t.name for t in graph.initializer] + [v.name for v in graph.input] + \
        [v.name for v in graph.output] + [v.name for v in graph.value_info]
    for n in graph.node:
        names += [n.name, n.op_type, n.domain, *n.input, *n.output, *(a.name for a in n.attribute)]
    bad = next((v for v in names if not isinstance(v, str)), None)
    if bad is not None:
        raise InvalidModelError(f"{where} has a name that is not valid UTF-8 text: {bytes(bad)[:40]!r}")


def check_tensor(t: TensorProto, what: str) -> None:
    """A tensor's element type is known, its dims are non-negative, and its data holds exactly
    as many elements as the dims say (external data must already be loaded to be checked)."""
    if t.data_type == TensorProto.UNDEFINED or t.data_type not in TensorProto.DataType.values():
        raise InvalidModelError(f"{what} has an unknown element type {t.data_type}")
    dims = list(t.dims)
    if any(d < 0 for d in dims):
        raise InvalidModelError(f"{what} has a negative dimension: dims {dims} (dims must be >= 0)")
    if t.data_location == TensorProto.EXTERNAL and not t.raw_data:
        return  # not loaded here; reading it is the loader's job
    count = math.prod(dims)
    if t.data_type in _PACKED or t.data_type == TensorProto.STRING:
        if t.data_type == TensorProto.STRING and len(t.string_data) != count:
            raise InvalidModelError(f"{what} has dims {dims} ({count} elements) but holds "
                                    f"{len(t.string_data)} strings")
        if t.data_type in _PACKED:
            try:
                onnx.numpy_helper.to_array(t)
            except Exception as exc:  # the decoder's own complaint, whatever its type
                raise InvalidModelError(f"{what} with dims {dims} cannot be decoded: {exc}") from exc
        return
    itemsize = helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    if t.raw_data:
        if len(t.raw_data) != count * itemsize:
            raise InvalidModelError(f"{what} has dims {dims} ({count} elements of {itemsize} bytes = "
                                    f"{count * itemsize} bytes) but {len(t.raw_data)} bytes of data")
        return
    field = helper.tensor_dtype_to_field(t.data_type)
    held = len(getattr(t, field))
    per = 2 if t.data_type in (TensorProto.COMPLEX64, TensorProto.COMPLEX128) else 1
    if held != count * per:
        raise InvalidModelError(f"{what} has dims {dims} ({count} elements) but holds {held // per} values")


def check_node_schema(n: onnx.NodeProto, label: str, opset: dict[str, int]) -> None:
    """``n`` against its operator schema: op, input/output counts, attributes and their types."""
    domain = "" if n.domain == "ai.onnx" else n.domain
    if domain not in ONNX_DOMAINS:
        if domain not in opset:
            raise InvalidModelError(f"uses domain {n.domain!r}, which the model does not import "
                                    f"(opset_import lists {sorted(opset)})", node=label, op=n.op_type)
        return
    version = opset.get(domain)
    if version is None:
        raise InvalidModelError(f"uses the {domain or 'default ONNX'} domain, which the model does not "
                                f"import (opset_import lists {sorted(opset)})", node=label, op=n.op_type)
    schema = _schema(n.op_type, version, domain)
    if schema is None:
        if not defs.has(n.op_type, domain):
            raise InvalidModelError(f"{n.op_type!r} is not an operator of the {domain or 'ONNX'} domain",
                                    node=label, op=n.op_type)
        raise InvalidModelError(f"{n.op_type} does not exist at opset {version} of the "
                                f"{domain or 'ONNX'} domain (it appeared in a later opset)", node=label,
                                op=n.op_type)
    _check_arity(n, label, "input", list(n.input), schema.inputs, schema.min_input, schema.max_input)
    _check_arity(n, label, "output", list(n.output), schema.outputs, schema.min_output, schema.max_output)
    given: dict[str, AttributeProto] = {}
    for a in n.attribute:
        if a.name in given:
            raise InvalidModelError(f"attribute {a.name!r} is given twice", node=label, op=n.op_type,
                                    attribute=a.name)
        given[a.name] = a
        if a.name in SMELT_ATTRS.get(n.op_type, ()) and domain == "":
            continue
        spec = schema.attributes.get(a.name)
        if spec is None:
            raise InvalidModelError(f"unknown attribute {a.name!r}; {n.op_type}-{schema.since_version} "
                                    f"takes {sorted(schema.attributes) or 'none'}", node=label,
                                    op=n.op_type, attribute=a.name)
        want = spec[0]
        if a.ref_attr_name:
            continue  # a function body's reference to its caller's attribute
        if a.type != want:
            got = AttributeProto.AttributeType.Name(a.type) if a.type in AttributeProto.AttributeType.values() \
                else str(a.type)
            raise InvalidModelError(f"attribute {a.name!r} must be of type "
                                    f"{AttributeProto.AttributeType.Name(want)}, given {got}",
                                    node=label, op=n.op_type, attribute=a.name)
    for name, (_, required) in schema.attributes.items():
        if required and name not in given:
            raise InvalidModelError(f"required attribute {name!r} is missing", node=label, op=n.op_type,
                                    attribute=name)


@dataclass(frozen=True)
class _Schema:
    """What the checks read of an OpSchema, converted once (onnx.defs builds its Python objects
    on every attribute access)."""

    since_version: int
    inputs: tuple[tuple[str, bool], ...]  # (name, required) per formal input
    outputs: tuple[tuple[str, bool], ...]
    min_input: int
    max_input: int
    min_output: int
    max_output: int
    attributes: dict[str, tuple[int, bool]]  # name -> (AttributeProto type, required)


@functools.lru_cache(maxsize=4096)
def _schema(op: str, version: int, domain: str) -> _Schema | None:
    try:
        s = defs.get_schema(op, version, domain)
    except defs.SchemaError:
        return None
    single = defs.OpSchema.FormalParameterOption.Single
    return _Schema(s.since_version, tuple((p.name, p.option == single) for p in s.inputs),
                   tuple((p.name, p.option == single) for p in s.outputs), s.min_input, s.max_input,
                   s.min_output, s.max_output,
                   {k: (int(a.type.value), bool(a.required)) for k, a in s.attributes.items()})


def _check_arity(n: onnx.NodeProto, label: str, kind: str, names: list[str],
                 params: tuple[tuple[str, bool], ...], lo: int, hi: int) -> None:
    if not lo <= len(names) <= hi:
        allowed = f"{lo}" if lo == hi else f"{lo} to {hi}" if hi < 2**30 else f"at least {lo}"
        raise InvalidModelError(f"takes {allowed} {kind}s, given {len(names)}", node=label, op=n.op_type)
    for k, name in enumerate(names):
        if name or not params:
            continue
        param, required = params[min(k, len(params) - 1)]
        if required:
            raise InvalidModelError(f"{kind} {k} ({param}) is required but its name is empty",
                                    node=label, op=n.op_type)


# -- stage 2: the IR with inferred shapes -------------------------------------------------------

# one tensor of 2^32 elements is 16 GiB of fp32: no model an inference engine serves on a CPU
# has one; a shape like that comes from an attribute out of proportion (a pad of 2^31 - 1), and
# planning it would loop over every output index at compile time
MAX_VALUE_ELEMENTS = 1 << 32


class DeclaredShapeWarning(UserWarning):
    """A value's declared shape contradicts shape inference (the inferred one is used)."""


def check_graph(g: Graph) -> Graph:
    """Declared vs inferred types and shapes, then the op rules; returns ``g`` (a pipeline step)."""
    producer = {o: n for n in g.nodes for o in n.outputs if o}
    for name, (dtype, shape) in g.declared.items():
        v = g.values.get(name)
        if v is None:
            continue
        _check_declared(name, dtype, shape, v.dtype, v.shape, producer.get(name))
    for node in g.nodes:
        if node.domain in ("", "ai.onnx"):  # the op's rule first: its message says why
            rule = OP_RULES.get(node.op)
            if rule is not None:
                rule(_Ctx(node, g))
        for o in node.outputs:
            v = g.values.get(o) if o else None
            if v is not None and v.shape is not None and any(isinstance(d, int) and d < 0 for d in v.shape):
                raise InvalidModelError(f"its output {o!r} would have shape {list(v.shape)}, with a "
                                        "negative dimension", node=node.name, op=node.op)
            if v is not None and v.shape is not None and all(isinstance(d, int) for d in v.shape):
                elements = math.prod(v.shape)
                if elements > MAX_VALUE_ELEMENTS:
                    raise InvalidModelError(f"its output {o!r} would have shape {list(v.shape)}: {elements:,} "
                                            f"elements, more than any value smelt plans ({MAX_VALUE_ELEMENTS:,}; "
                                            "a pad or scale attribute out of proportion?)", node=node.name, op=node.op)
    return g


def _check_declared(name: str, dtype, shape, got_dtype, got_shape, node: Node | None) -> None:
    who = f" (output of node {node.name!r}, op {node.op})" if node is not None else ""
    if dtype is not None and got_dtype is not None and np.dtype(dtype) != np.dtype(got_dtype):
        raise InvalidModelError(f"value {name!r}{who} is declared {np.dtype(dtype).name} but is "
                                f"{np.dtype(got_dtype).name}")
    if shape is None or got_shape is None:
        return
    if len(shape) != len(got_shape) or any(isinstance(a, int) and isinstance(b, int) and a != b
                                           for a, b in zip(shape, got_shape, strict=False)):
        # onnxruntime merges such a declaration leniently (a warning, the inferred shape wins) and
        # runs the model; exporters write stale output shapes (ddddocr's recognizer declares
        # [1, seqlen] for a [T, 1, 8210] output). smelt sizes every buffer from inference alone, so
        # the declaration is only reported, never believed.
        show = lambda s: [d if isinstance(d, int) else "?" if d.startswith("unk_") else d for d in s]  # noqa: E731
        warnings.warn(f"value {name!r}{who} is declared with shape {show(shape)} but its inferred shape is "
                      f"{show(got_shape)}; the inferred shape is used, as onnxruntime does", DeclaredShapeWarning,
                      stacklevel=2)


class _Ctx:
    """One node under the op rules: attributes, shapes and constants, and the error to raise."""

    def __init__(self, node: Node, g: Graph) -> None:
        self.node, self.g = node, g

    def fail(self, message: str, attribute: str | None = None) -> None:
        raise InvalidModelError(message, node=self.node.name, op=self.node.op, attribute=attribute)

    def input(self, i: int) -> str:
        ins = self.node.inputs
        return ins[i] if i < len(ins) else ""

    def shape(self, name: str) -> tuple | None:
        v = self.g.values.get(name) if name else None
        return None if v is None or v.shape is None else tuple(v.shape)

    def rank(self, i: int = 0) -> int | None:
        s = self.shape(self.input(i))
        return None if s is None else len(s)

    def const(self, i: int) -> np.ndarray | None:
        name = self.input(i)
        return None if not name else self.g.const(name)

    def attr(self, key: str, default: Any = None) -> Any:
        return self.node.attr(key, default)

    def flag(self, key: str, default: int = 0) -> int:
        v = int(self.attr(key, default))
        if v not in (0, 1):
            self.fail(f"attribute {key!r} must be 0 or 1; given {v}", key)
        return v

    def choice(self, key: str, default: str, allowed: Sequence[str]) -> str:
        v = self.attr(key, default)
        if v not in allowed:
            self.fail(f"attribute {key!r} must be one of {list(allowed)}; given {v!r}", key)
        return v

    def ints(self, key: str, count: int | None, minimum: int | None, what: str) -> list[int] | None:
        """An INTS attribute: ``count`` values (when known), each >= ``minimum``."""
        v = self.attr(key)
        if v is None:
            return None
        v = [int(a) for a in v]
        if count is not None and len(v) != count:
            self.fail(f"attribute {key!r} must hold {count} values ({what}); given {v}", key)
        if minimum is not None and any(a < minimum for a in v):
            bound = "positive" if minimum == 1 else "non-negative" if minimum == 0 else f">= {minimum}"
            self.fail(f"attribute {key!r} must be {bound} ({what}); given {v}", key)
        return v

    def axis(self, value: int, rank: int | None, key: str, extra: int = 0) -> int | None:
        """``value`` normalised into [0, rank + extra) (``extra`` 1 for Flatten-like axes)."""
        if rank is None:
            return None
        if not -rank - extra <= value < rank + extra:
            self.fail(f"{key} {value} is out of range for rank {rank}: allowed "
                      f"[{-rank - extra}, {rank + extra - 1}]", key)
        return value + rank + extra if value < 0 else value


def _static(dims: Sequence | None) -> bool:
    return dims is not None and all(isinstance(d, int) for d in dims)


def _window_rules(c: _Ctx, kernel: list[int] | None, *, pool: bool) -> None:
    """Strides, dilations, pads and auto_pad of Conv / ConvTranspose / pooling, and (for static
    inputs) that the dilated kernel fits the padded input."""
    xs = c.shape(c.input(0))
    if xs is not None and len(xs) < 3:
        c.fail(f"input {c.input(0)!r} must have rank >= 3 (N, C and spatial axes); given shape {list(xs)}")
    s = len(xs) - 2 if xs is not None else (len(kernel) if kernel is not None else None)
    axes = "one per spatial axis"
    if kernel is not None:
        if s is not None and len(kernel) != s:
            c.fail(f"the kernel must have {s} spatial dims (one per spatial axis); given {kernel}", "kernel_shape")
        if any(k < 1 for k in kernel):
            c.fail(f"kernel sizes must be positive; given {kernel}", "kernel_shape")
    c.ints("strides", s, 1, axes)
    dils = c.ints("dilations", s, 1, axes)
    pads = c.ints("pads", 2 * s if s is not None else None, 0, "begin and end per spatial axis")
    auto_pad = c.choice("auto_pad", "NOTSET", AUTO_PAD)
    if pool and pads is not None and kernel is not None and s is not None:
        for d in range(s):
            if pads[d] >= kernel[d] or pads[d + s] >= kernel[d]:
                c.fail(f"pads {pads} must be smaller than the kernel {kernel} along every axis", "pads")
    if xs is None or kernel is None or not _static(xs[2:]) or auto_pad not in ("NOTSET", "VALID") \
            or c.node.op == "ConvTranspose":
        return
    pads = [0] * (2 * s) if auto_pad == "VALID" or pads is None else pads
    for d in range(s):
        span = (kernel[d] - 1) * (dils[d] if dils else 1) + 1
        extent = xs[2 + d] + pads[d] + pads[d + s]
        if span > extent:
            c.fail(f"the kernel {kernel} (dilated size {span} along spatial axis {d}) is larger than "
                   f"the padded input ({xs[2 + d]} + pads {pads[d]} + {pads[d + s]} = {extent})",
                   "kernel_shape")


def _conv(c: _Ctx) -> None:
    group = int(c.attr("group", 1))
    if group < 1:
        c.fail(f"attribute 'group' must be a positive integer; given {group}", "group")
    xs, ws = c.shape(c.input(0)), c.shape(c.input(1))
    if xs is not None and ws is not None and len(ws) != len(xs):
        c.fail(f"weights {c.input(1)!r} of shape {list(ws)} must have the input's rank {len(xs)}")
    kernel = c.ints("kernel_shape", None, 1, "one per spatial axis")
    if ws is not None and _static(ws[2:]):
        if kernel is not None and kernel != list(ws[2:]):
            c.fail(f"attribute 'kernel_shape' {kernel} disagrees with the weights' spatial dims "
                   f"{list(ws[2:])}", "kernel_shape")
        kernel = list(ws[2:])
    _window_rules(c, kernel, pool=False)
    if c.node.op != "Conv" or xs is None or ws is None or len(xs) < 2 or len(ws) < 2:
        return
    cin, m, cg = xs[1], ws[0], ws[1]
    if isinstance(m, int) and m % group:
        c.fail(f"the weights' {m} output channels must be a multiple of group {group}", "group")
    if isinstance(cin, int) and isinstance(cg, int) and cin != cg * group:
        c.fail(f"input channels {cin} must equal the weights' channels per group {cg} x group {group}",
               "group")
    bs = c.shape(c.input(2))
    if bs is not None and isinstance(m, int) and bs != (m,):
        c.fail(f"bias {c.input(2)!r} must have shape [{m}]; given {list(bs)}")


def _pool(c: _Ctx) -> None:
    kernel = c.ints("kernel_shape", None, 1, "one per spatial axis")
    _window_rules(c, kernel, pool=True)
    c.flag("ceil_mode")
    if c.node.op == "AveragePool":
        c.flag("count_include_pad")
    if c.node.op == "MaxPool":
        c.flag("storage_order")
    if c.node.op == "LpPool" and int(c.attr("p", 2)) < 1:
        c.fail(f"attribute 'p' must be a positive integer; given {c.attr('p')}", "p")


def _global_pool(c: _Ctx) -> None:
    if c.rank() is not None and c.rank() < 3:
        c.fail(f"input {c.input(0)!r} must have rank >= 3; given shape {list(c.shape(c.input(0)))}")
    if c.node.op == "GlobalLpPool" and int(c.attr("p", 2)) < 1:
        c.fail(f"attribute 'p' must be a positive integer; given {c.attr('p')}", "p")


def _lrn(c: _Ctx) -> None:
    size = int(c.attr("size", 0))
    if size < 1 or size % 2 == 0:  # onnxruntime refuses an even size too
        c.fail(f"attribute 'size' must be a positive odd integer; given {size}", "size")
    if c.rank() is not None and c.rank() < 3:
        c.fail(f"input {c.input(0)!r} must have rank >= 3; given shape {list(c.shape(c.input(0)))}")


def _split(c: _Ctx) -> None:
    xs = c.shape(c.input(0))
    rank = None if xs is None else len(xs)
    axis = c.axis(int(c.attr("axis", 0)), rank, "axis")
    outs = len(c.node.outputs)
    sizes = c.attr("split")
    if sizes is None and c.input(1):
        sizes = c.const(1)
        if sizes is None:
            return  # run-time sizes: inference cannot know them either
    num = c.attr("num_outputs")
    if num is not None and (int(num) < 1 or int(num) != outs):
        c.fail(f"attribute 'num_outputs' must equal the node's {outs} outputs; given {num}", "num_outputs")
    if sizes is None:
        return
    sizes = [int(v) for v in np.asarray(sizes).reshape(-1)]
    if len(sizes) != outs:
        c.fail(f"split sizes {sizes} must give one size per output ({outs})", "split")
    if any(v < 0 for v in sizes):
        c.fail(f"split sizes must be non-negative; given {sizes}", "split")
    if axis is not None and isinstance(xs[axis], int) and sum(sizes) != xs[axis]:
        c.fail(f"split sizes {sizes} add up to {sum(sizes)}, but axis {axis} of {c.input(0)!r} has "
               f"{xs[axis]} elements", "split")


def _depth_space(c: _Ctx) -> None:
    b = int(c.attr("blocksize", 0))
    if b < 1:
        c.fail(f"attribute 'blocksize' must be a positive integer; given {b}", "blocksize")
    if c.node.op == "DepthToSpace":
        c.choice("mode", "DCR", ("DCR", "CRD"))
    xs = c.shape(c.input(0))
    if xs is None:
        return
    if len(xs) != 4:
        c.fail(f"input {c.input(0)!r} must have rank 4 (N, C, H, W); given shape {list(xs)}")
    if c.node.op == "DepthToSpace" and isinstance(xs[1], int) and xs[1] % (b * b):
        c.fail(f"blocksize {b}: the {xs[1]} input channels must be a multiple of blocksize^2 = {b * b}",
               "blocksize")
    if c.node.op == "SpaceToDepth":
        for d, n in ((2, "height"), (3, "width")):
            if isinstance(xs[d], int) and xs[d] % b:
                c.fail(f"blocksize {b} must divide the input {n} {xs[d]}", "blocksize")


def _reshape(c: _Ctx) -> None:
    spec = c.const(1)
    if spec is None:
        return
    spec = [int(v) for v in np.asarray(spec).reshape(-1)]
    allowzero = c.flag("allowzero")
    if spec.count(-1) > 1 or any(v < -1 for v in spec):
        c.fail(f"the target shape {spec} may hold at most one -1 and no other negative value")
    if allowzero and 0 in spec and -1 in spec:
        c.fail(f"with allowzero=1 the target shape {spec} may not hold both 0 and -1", "allowzero")
    xs = c.shape(c.input(0))
    if not _static(xs):
        return
    dims = [xs[k] if v == 0 and not allowzero and k < len(xs) else v for k, v in enumerate(spec)]
    size, known = math.prod(xs), math.prod(d for d in dims if d != -1)
    if -1 not in dims and known != size or -1 in dims and (known == 0 and size != 0 or known and size % known):
        c.fail(f"cannot reshape {c.input(0)!r} of shape {list(xs)} ({size} elements) to {spec}")


def _transpose(c: _Ctx) -> None:
    perm = c.attr("perm")
    rank = c.rank()
    if perm is None or rank is None:
        return
    if sorted(int(p) for p in perm) != list(range(rank)):
        c.fail(f"attribute 'perm' must be a permutation of 0..{rank - 1} (the input's rank is {rank}); "
               f"given {list(perm)}", "perm")


def _gather(c: _Ctx) -> None:
    xs = c.shape(c.input(0))
    if xs is not None and len(xs) < 1:
        c.fail(f"data {c.input(0)!r} must have rank >= 1; given a scalar")
    axis = c.axis(int(c.attr("axis", 0)), None if xs is None else len(xs), "axis")
    ind = c.const(1)
    if axis is None or ind is None or not isinstance(xs[axis], int):
        return
    n = xs[axis]
    ind = np.asarray(ind).astype(np.int64)
    bad = ind[(ind < -n) | (ind >= n)]
    if bad.size:
        c.fail(f"constant index {int(bad.reshape(-1)[0])} is out of range for axis {axis} of size {n}: "
               f"allowed [{-n}, {n - 1}]")


def _concat(c: _Ctx) -> None:
    shapes = [c.shape(i) for i in c.node.inputs if i]
    known = [s for s in shapes if s is not None]
    if not known:
        return
    rank = len(known[0])
    if rank == 0:
        c.fail("cannot concatenate scalars (inputs must have rank >= 1)")
    axis = c.axis(int(c.attr("axis", 0)), rank, "axis")
    for name, s in zip([i for i in c.node.inputs if i], shapes, strict=True):
        if s is None:
            continue
        if len(s) != rank:
            c.fail(f"input {name!r} has rank {len(s)}, the first input rank {rank}; all must agree")
        for d, (a, b) in enumerate(zip(s, known[0], strict=True)):
            if d != axis and isinstance(a, int) and isinstance(b, int) and a != b:
                c.fail(f"input {name!r} of shape {list(s)} differs from {list(known[0])} along axis {d} "
                       f"(only the concat axis {axis} may differ)")


def _axis_rule(extra: int) -> Callable[[_Ctx], None]:
    def rule(c: _Ctx) -> None:
        default = -1 if c.node.op in ("Softmax", "LogSoftmax", "Hardmax", "LayerNormalization") else \
            (1 if c.node.op == "Flatten" else 0)
        c.axis(int(c.attr("axis", default)), c.rank(), "axis", extra)
        if c.node.op in ("ArgMax", "ArgMin"):
            c.flag("keepdims", 1)
            c.flag("select_last_index")
    return rule


def _axes_values(c: _Ctx, input_index: int) -> list[int] | None:
    axes = c.attr("axes")
    if axes is None and c.input(input_index):
        axes = c.const(input_index)
    return None if axes is None else [int(a) for a in np.asarray(axes).reshape(-1)]


def _unique_axes(c: _Ctx, axes: list[int], rank: int | None) -> list[int] | None:
    norm = [c.axis(a, rank, "axes") for a in axes]
    if rank is not None and len(set(norm)) != len(norm):
        c.fail(f"axes {axes} name an axis twice", "axes")
    return None if rank is None else norm


def _reduce(c: _Ctx) -> None:
    c.flag("keepdims", 1)
    c.flag("noop_with_empty_axes")
    axes = _axes_values(c, 1)
    if axes is not None:
        _unique_axes(c, axes, c.rank())


def _squeeze(c: _Ctx) -> None:
    axes = _axes_values(c, 1)
    xs = c.shape(c.input(0))
    if axes is None or xs is None:
        return
    for a in _unique_axes(c, axes, len(xs)):
        if isinstance(xs[a], int) and xs[a] != 1:
            c.fail(f"axis {a} of {c.input(0)!r} (shape {list(xs)}) has size {xs[a]}; only size-1 axes "
                   "can be squeezed", "axes")


def _unsqueeze(c: _Ctx) -> None:
    axes = _axes_values(c, 1)
    rank = c.rank()
    if axes is not None:
        _unique_axes(c, axes, None if rank is None else rank + len(axes))


def _slice(c: _Ctx) -> None:
    if c.attr("starts") is not None:  # opset < 10: attributes
        return
    rank = c.rank()
    parts = [None if c.const(i) is None else [int(v) for v in np.asarray(c.const(i)).reshape(-1)]
             for i in range(1, 5)]
    starts, ends, axes, steps = parts
    lengths = {len(p) for p in parts if p is not None}
    if len(lengths) > 1:
        c.fail(f"starts, ends, axes and steps must have one length; given {starts}, {ends}, {axes}, {steps}")
    if steps is not None and 0 in steps:
        c.fail(f"steps may not be 0; given {steps}")
    if axes is not None:
        _unique_axes(c, axes, rank)


def _pad(c: _Ctx) -> None:
    mode = c.choice("mode", "constant", ("constant", "reflect", "edge", "wrap"))
    xs = c.shape(c.input(0))
    pads = c.attr("pads")
    if pads is None:
        pads = c.const(1)
    if pads is None or xs is None:
        return
    pads = [int(v) for v in np.asarray(pads).reshape(-1)]
    axes = _axes_values(c, 3) if c.attr("pads") is None else None
    axes = list(range(len(xs))) if axes is None else _unique_axes(c, axes, len(xs))
    if len(pads) != 2 * len(axes):
        c.fail(f"pads must hold {2 * len(axes)} values (begin and end for each padded axis); given {pads}")
    for k, a in enumerate(axes):
        if not isinstance(xs[a], int):
            continue
        if xs[a] + pads[k] + pads[k + len(axes)] < 0:
            c.fail(f"pads {pads} would give axis {a} (size {xs[a]}) a negative size")
        if mode != "constant" and xs[a] == 0 and (pads[k] > 0 or pads[k + len(axes)] > 0):
            c.fail(f"mode {mode!r} cannot pad axis {a}, which is empty", "mode")


def _tile(c: _Ctx) -> None:
    reps = c.const(1)
    if reps is None:
        return
    reps = [int(v) for v in np.asarray(reps).reshape(-1)]
    if c.rank() is not None and len(reps) != c.rank():
        c.fail(f"repeats {reps} must hold one value per input axis ({c.rank()})")
    if any(r < 0 for r in reps):
        c.fail(f"repeats must be non-negative; given {reps}")


def _gemm(c: _Ctx) -> None:
    ta, tb = c.flag("transA"), c.flag("transB")
    a, b, cs = c.shape(c.input(0)), c.shape(c.input(1)), c.shape(c.input(2))
    if a is None or b is None or len(a) != 2 or len(b) != 2 or cs is None:
        return
    m, n = (a[1] if ta else a[0]), (b[0] if tb else b[1])
    if len(cs) > 2 or any(isinstance(x, int) and isinstance(y, int) and x not in (1, y)
                          for x, y in zip(cs[::-1], (n, m), strict=False)):
        c.fail(f"C {c.input(2)!r} of shape {list(cs)} does not broadcast to the product's shape "
               f"[{m}, {n}]")


def _channel_params(names: Sequence[int]) -> Callable[[_Ctx], None]:
    """BatchNormalization / InstanceNormalization: per-channel inputs of shape [C]."""
    def rule(c: _Ctx) -> None:
        xs = c.shape(c.input(0))
        if xs is not None and len(xs) < 2:
            c.fail(f"input {c.input(0)!r} must have rank >= 2 (N, C, ...); given shape {list(xs)}")
        if c.node.op == "BatchNormalization":
            c.flag("training_mode")
        if xs is None or not isinstance(xs[1], int):
            return
        for i in names:
            s = c.shape(c.input(i))
            if s is not None and s != (xs[1],):
                c.fail(f"input {c.input(i)!r} must have shape [{xs[1]}] (one value per channel); "
                       f"given {list(s)}")
    return rule


def _prelu(c: _Ctx) -> None:
    xs, ss = c.shape(c.input(0)), c.shape(c.input(1))
    if xs is None or ss is None:
        return
    if len(ss) > len(xs) or any(isinstance(s, int) and isinstance(x, int) and s not in (1, x)
                                for s, x in zip(ss[::-1], xs[::-1], strict=False)):
        c.fail(f"slope {c.input(1)!r} of shape {list(ss)} does not broadcast to the input's {list(xs)}")


def _rnn(c: _Ctx) -> None:
    op = c.node.op
    gates = RNN_GATES[op]
    direction = c.choice("direction", "forward", ("forward", "reverse", "bidirectional"))
    dirs = 2 if direction == "bidirectional" else 1
    layout = c.flag("layout")
    if op == "LSTM":
        c.flag("input_forget")
    if op == "GRU":
        c.flag("linear_before_reset")
    hidden = c.attr("hidden_size")
    if hidden is not None and int(hidden) < 1:
        c.fail(f"attribute 'hidden_size' must be a positive integer; given {hidden}", "hidden_size")
    clip = c.attr("clip")
    if clip is not None and not float(clip) > 0:
        c.fail(f"attribute 'clip' must be positive; given {clip}", "clip")
    acts = c.attr("activations")
    if acts is not None:
        per = {"LSTM": 3, "GRU": 2, "RNN": 1}[op]
        if len(acts) != per * dirs:
            c.fail(f"{direction} {op} takes {per * dirs} activations; given {list(acts)}", "activations")
        for a in acts:
            if str(a).lower() not in RNN_ACTIVATIONS:
                c.fail(f"unknown activation {a!r}; allowed {list(RNN_ACTIVATIONS)}", "activations")
    xs, ws, rs = c.shape(c.input(0)), c.shape(c.input(1)), c.shape(c.input(2))
    for name, s in ((c.input(0), xs), (c.input(1), ws), (c.input(2), rs)):
        if s is not None and len(s) != 3:
            c.fail(f"input {name!r} must have rank 3; given shape {list(s)}")
    if rs is None or not _static(rs):
        return
    h = rs[2]
    if hidden is not None and int(hidden) != h:
        c.fail(f"attribute 'hidden_size' {hidden} disagrees with R {c.input(2)!r} of shape {list(rs)}",
               "hidden_size")
    if rs != (dirs, gates * h, h):
        c.fail(f"R {c.input(2)!r} must have shape [{dirs}, {gates}*hidden, hidden] for a {direction} "
               f"{op}; given {list(rs)}")
    e = xs[2] if xs is not None else "input_size"
    if ws is not None and _static(ws) and (ws[:2] != (dirs, gates * h) or (isinstance(e, int) and ws[2] != e)):
        c.fail(f"W {c.input(1)!r} must have shape [{dirs}, {gates * h}, {e}]; given {list(ws)}")
    batch = None if xs is None else (xs[0] if layout else xs[1])
    expect = {3: (dirs, 2 * gates * h), 7: (dirs, 3 * h)}
    if batch is not None:
        expect[4] = (batch,)
        expect.update({5: (batch, dirs, h) if layout else (dirs, batch, h)})
        if op == "LSTM":
            expect[6] = expect[5]
    for i, want in expect.items():
        s = c.shape(c.input(i))
        if s is None or (i == 7 and op != "LSTM"):
            continue
        if len(s) != len(want) or any(isinstance(a, int) and isinstance(b, int) and a != b
                                      for a, b in zip(s, want, strict=True)):
            c.fail(f"input {i} {c.input(i)!r} must have shape {list(want)}; given {list(s)}")


OP_RULES: dict[str, Callable[[_Ctx], None]] = {
    "Conv": _conv, "ConvTranspose": _conv, "ConvInteger": _conv,
    "MaxPool": _pool, "AveragePool": _pool, "LpPool": _pool,
    "GlobalAveragePool": _global_pool, "GlobalMaxPool": _global_pool, "GlobalLpPool": _global_pool,
    "LRN": _lrn, "Split": _split, "DepthToSpace": _depth_space, "SpaceToDepth": _depth_space,
    "Reshape": _reshape, "Transpose": _transpose, "Gather": _gather, "Concat": _concat,
    "Softmax": _axis_rule(0), "LogSoftmax": _axis_rule(0), "Hardmax": _axis_rule(0),
    "LayerNormalization": _axis_rule(0), "ArgMax": _axis_rule(0), "ArgMin": _axis_rule(0),
    "Flatten": _axis_rule(1),
    "Squeeze": _squeeze, "Unsqueeze": _unsqueeze, "Slice": _slice, "Pad": _pad, "Tile": _tile,
    "Gemm": _gemm, "PRelu": _prelu, "Gelu": lambda c: c.choice("approximate", "none", ("none", "tanh")),
    "BatchNormalization": _channel_params((1, 2, 3, 4)), "InstanceNormalization": _channel_params((1, 2)),
    "LSTM": _rnn, "GRU": _rnn, "RNN": _rnn,
}
for _op in ("ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean",
            "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare"):
    OP_RULES[_op] = _reduce
