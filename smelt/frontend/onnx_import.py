"""ONNX front-end: a model (path, bytes or ModelProto) into smelt's IR, and IR back to ONNX.

Opsets 11 to 21 of the default domain are the supported range; older models are upgraded with
onnx's version converter, newer ones load and each node keeps its exact operator version (see
``op_version``), so templates only claim the versions whose semantics they implement.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from smelt.errors import ModelLoadError
from smelt.frontend.local_functions import inline_local_functions
from smelt.ir.graph import Graph, Node, Shape, Value
from smelt.ir.types import np_dtype_from_onnx, onnx_from_np_dtype

MIN_OPSET = 11
MAX_TESTED_OPSET = 21

ModelLike = str | os.PathLike | bytes | onnx.ModelProto


def load_model(model: ModelLike) -> onnx.ModelProto:
    """Read a model from a path, serialized bytes or a ModelProto, with external data (read from
    the model file's directory only; see ``load_external_data``)."""
    if isinstance(model, onnx.ModelProto):
        proto = model
        _refuse_external_data(proto, "an onnx.ModelProto")
    elif isinstance(model, bytes | bytearray):
        try:
            proto = onnx.load_from_string(bytes(model))
        except Exception as exc:  # protobuf raises DecodeError and friends
            raise ModelLoadError(f"the given bytes are not a valid ONNX model: {exc}") from exc
        _refuse_external_data(proto, "bytes")
    elif isinstance(model, str | os.PathLike):
        path = Path(model)
        if not path.is_file():
            raise ModelLoadError(f"model file not found: {path}")
        try:
            proto = onnx.load(str(path), load_external_data=False)
        except Exception as exc:
            raise ModelLoadError(f"{path} is not a valid ONNX model: {exc}") from exc
        load_external_data(proto, path.parent)
    else:
        raise TypeError(f"model must be a path, bytes or onnx.ModelProto, not {type(model).__name__}")
    if not proto.graph.node and not proto.graph.output:
        raise ModelLoadError("the model has an empty graph (is it really an ONNX model?)")
    # local functions first: the version converter and everything after see plain graph nodes
    return _upgrade_opset(_unknown_negative_dims(inline_local_functions(proto)))


def _unknown_negative_dims(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Exporters (paddle2onnx among them) declare an unknown dimension as -1 on graph inputs,
    outputs and value_info; onnxruntime treats it as unknown, so smelt does too: such a dim loses
    its value (a copy of the model is changed, never the caller's)."""
    graph = proto.graph
    infos = list(graph.input) + list(graph.output) + list(graph.value_info)
    if not any(d.HasField("dim_value") and d.dim_value < 0
               for vi in infos if vi.type.HasField("tensor_type") for d in vi.type.tensor_type.shape.dim):
        return proto
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    g = out.graph
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        if vi.type.HasField("tensor_type"):
            for d in vi.type.tensor_type.shape.dim:
                if d.HasField("dim_value") and d.dim_value < 0:
                    d.Clear()
    return out


def _tensors(proto: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every tensor of the model: initializers and attribute tensors, in subgraphs and functions."""
    def sparse(sp: onnx.SparseTensorProto) -> Iterator[onnx.TensorProto]:
        yield sp.values
        yield sp.indices

    def nodes(ns) -> Iterator[onnx.TensorProto]:
        for n in ns:
            for a in n.attribute:
                if a.HasField("t"):
                    yield a.t
                yield from a.tensors
                if a.HasField("sparse_tensor"):
                    yield from sparse(a.sparse_tensor)
                for sp in a.sparse_tensors:
                    yield from sparse(sp)
                if a.HasField("g"):
                    yield from graph(a.g)
                for sub in a.graphs:
                    yield from graph(sub)

    def graph(g: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
        yield from g.initializer
        for sp in g.sparse_initializer:
            yield from sparse(sp)
        yield from nodes(g.node)

    yield from graph(proto.graph)
    for f in proto.functions:
        yield from nodes(f.node)


def _external(proto: onnx.ModelProto) -> list[onnx.TensorProto]:
    return [t for t in _tensors(proto) if t.data_location == onnx.TensorProto.EXTERNAL]


def _refuse_external_data(proto: onnx.ModelProto, given: str) -> None:
    external = _external(proto)
    if external:
        t = external[0]
        location = {e.key: e.value for e in t.external_data}.get("location", "")
        raise ModelLoadError(
            f"tensor {t.name!r} keeps its data in an external file ({location!r}), and the model was given as "
            f"{given}, which has no directory to find it in; pass the model's file path instead (external data "
            "is read from the model's directory, as onnxruntime does), or load the data into the model first "
            "(onnx.load(path))")


_PACKED_4BIT = frozenset(getattr(onnx.TensorProto, n) for n in ("INT4", "UINT4", "FLOAT4E2M1")
                         if hasattr(onnx.TensorProto, n))


def _raw_bytes(t: onnx.TensorProto) -> int | None:
    """Bytes of ``t``'s raw data by its shape and type (None: a type without a fixed size)."""
    n = int(np.prod(t.dims, dtype=np.int64))
    if t.data_type in _PACKED_4BIT:
        return (n + 1) // 2
    if t.data_type == onnx.TensorProto.STRING:
        return None
    try:
        return n * np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
    except Exception:  # an unknown data type: left to the importer to report
        return None


def _external_error(tensor: str, location: str, why: str) -> ModelLoadError:
    return ModelLoadError(f"tensor {tensor!r}: external data location {location!r} {why}")


def load_external_data(proto: onnx.ModelProto, base: Path) -> None:
    """Read every external tensor's data into ``proto``, confined to ``base`` (the model file's
    directory) as onnxruntime confines it: a location must be a relative path that resolves,
    symbolic links included, to a regular file inside ``base``; offset and length must lie within
    it and match the tensor's size. The working directory is never consulted."""
    base_real = os.path.realpath(base)
    for t in _external(proto):
        info = {e.key: e.value for e in t.external_data}
        location = info.get("location", "")
        refuse = functools.partial(_external_error, t.name, location)
        if not location:
            raise refuse("is empty (the tensor names no file)")
        if os.path.isabs(location):
            raise refuse(f"is an absolute path; external data must be a path relative to the model's directory {base_real}")
        try:
            real = os.path.realpath(os.path.join(base_real, location))
        except (ValueError, OSError) as exc:
            raise refuse(f"is not a usable path: {exc}") from None
        if os.path.commonpath([real, base_real]) != base_real:
            raise refuse(f"resolves to {real}, outside the model's directory {base_real} (external data must stay "
                         "inside it, as onnxruntime requires)")
        if not os.path.isfile(real):
            raise refuse(f"is not a file in the model's directory {base_real}")
        try:
            offset = int(info.get("offset", 0))
            length = int(info["length"]) if "length" in info else None
        except ValueError:
            raise refuse(f"has a non-integer offset or length ({info.get('offset')!r}, {info.get('length')!r})") from None
        size = os.path.getsize(real)
        if offset < 0 or (length is not None and length < 0) or offset + (length or 0) > size:
            raise refuse(f"asks for bytes {offset}..{offset + (length or 0)} of a {size}-byte file")
        with open(real, "rb") as fh:
            fh.seek(offset)
            data = fh.read(length if length is not None else -1)
        want = _raw_bytes(t)
        if want is not None and len(data) != want:
            raise refuse(f"holds {len(data)} bytes, but the tensor's shape {list(t.dims)} needs {want}")
        t.raw_data = data
        t.data_location = onnx.TensorProto.DEFAULT
        del t.external_data[:]


def default_opset(proto: onnx.ModelProto) -> int:
    for imp in proto.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    return MIN_OPSET


def _upgrade_opset(proto: onnx.ModelProto) -> onnx.ModelProto:
    version = default_opset(proto)
    if version >= MIN_OPSET:
        return proto
    try:
        from onnx import version_converter

        upgraded = version_converter.convert_version(proto, MIN_OPSET)
    except Exception as exc:
        raise ModelLoadError(
            f"the model uses opset {version}; smelt supports {MIN_OPSET} to {MAX_TESTED_OPSET} "
            f"and onnx's version converter could not upgrade it: {exc}"
        ) from exc
    if model_input_specs(upgraded) != model_input_specs(proto):
        # the converter changed the interface (e.g. Scan-8's batch axis): keep the original
        # opset; templates only accept the operator versions they implement
        return proto
    return upgraded


ANONYMOUS_DIM = "?"


def model_input_specs(proto: onnx.ModelProto) -> list[tuple[str, np.dtype | None, Shape | None]]:
    """(name, dtype, shape) of the inputs a caller feeds: initializers excluded."""
    inits = {i.name for i in proto.graph.initializer}
    specs = []
    for vi in proto.graph.input:
        if vi.name in inits:
            continue
        specs.append((vi.name, *_type_of(vi.type)))
    return specs


def model_output_specs(proto: onnx.ModelProto) -> list[tuple[str, np.dtype | None, Shape | None]]:
    return [(vi.name, *_type_of(vi.type)) for vi in proto.graph.output]


def _type_of(tp: onnx.TypeProto) -> tuple[np.dtype | None, Shape | None]:
    if not tp.HasField("tensor_type"):
        return None, None
    tt = tp.tensor_type
    dtype = np_dtype_from_onnx(tt.elem_type) if tt.elem_type else None
    if not tt.HasField("shape"):
        return dtype, None
    dims: list[int | str] = []
    for i, d in enumerate(tt.shape.dim):
        # "?" is how paddle2onnx writes every unknown dimension, not one shared symbol: each
        # accepts any size, as in onnxruntime (a -1 dim_value was cleared at load)
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param and d.dim_param != ANONYMOUS_DIM:
            dims.append(d.dim_param)
        else:
            dims.append(f"unk_{i}")
    return dtype, tuple(dims)


def specialize_inputs(proto: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> onnx.ModelProto:
    """Copy of the model with the named inputs' dimensions fixed to concrete sizes."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    for vi in out.graph.input:
        if vi.name not in shapes:
            continue
        dims = vi.type.tensor_type.shape.dim
        new = list(shapes[vi.name])
        del dims[:]
        for d in new:
            dims.add().dim_value = int(d)
    return out


def attribute_value(attr: onnx.AttributeProto):
    """A decoded attribute value as the IR keeps it (subgraphs stay ONNX protos)."""
    if attr.type == onnx.AttributeProto.TENSOR:
        return numpy_helper.to_array(attr.t)
    if attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
        return attr  # subgraphs stay ONNX: only the fallback executes them
    value = helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, list) and value and isinstance(value[0], bytes):
        if len(value) > 1024 and not any(b"\0" in v for v in value[:1024]):
            # one decode for the lot (a LightGBM ensemble's millions of node modes), split
            # back; a string holding NUL itself takes the per-element way
            joined = b"\0".join(value)
            if joined.count(b"\0") == len(value) - 1:
                return joined.decode("utf-8", errors="replace").split("\0")
        return [v.decode("utf-8", errors="replace") for v in value]
    return value


def to_ir(proto: onnx.ModelProto) -> Graph:
    """Convert a (shape-inferred) ModelProto into an IR graph."""
    g = Graph(proto.graph.name or "model", {i.domain or "": i.version for i in proto.opset_import})
    for init in proto.graph.initializer:
        arr = numpy_helper.to_array(init)
        g.add_value(Value(init.name, arr.dtype, tuple(arr.shape), const=arr))
    for sparse in proto.graph.sparse_initializer:
        raise ModelLoadError(f"sparse initializer {sparse.values.name!r} is not supported")
    for vi in proto.graph.input:
        if vi.name not in g.values:
            g.add_value(Value(vi.name, *_type_of(vi.type)))
    for vi in list(proto.graph.value_info) + list(proto.graph.output):
        if vi.name not in g.values:  # types come from inference; the declaration is only checked
            g.add_value(Value(vi.name))
            g.declared[vi.name] = _type_of(vi.type)
    g.inputs = [vi.name for vi in proto.graph.input if g.values[vi.name].const is None]
    g.outputs = [vi.name for vi in proto.graph.output]
    for idx, n in enumerate(proto.graph.node):
        name = n.name or f"{n.op_type}_{idx}"
        node = Node(
            op=n.op_type,
            name=name,
            inputs=list(n.input),
            outputs=list(n.output),
            attrs={a.name: attribute_value(a) for a in n.attribute},
            domain=n.domain or "",
            attr_protos=list(n.attribute),
        )
        for o in node.outputs:
            if o and o not in g.values:
                g.add_value(Value(o))
        for i in node.inputs:
            if i and i not in g.values:
                raise ModelLoadError(f"node {name!r} ({n.op_type}) reads {i!r}, which nothing defines")
        g.nodes.append(node)
    for o in g.outputs:
        if o not in g.values:
            raise ModelLoadError(f"graph output {o!r} is not produced by any node")
    return g


def _value_info(v: Value) -> onnx.ValueInfoProto:
    if v.dtype is None:
        return onnx.ValueInfoProto(name=v.name)
    return helper.make_tensor_value_info(
        v.name, onnx_from_np_dtype(v.dtype), list(v.shape) if v.shape is not None else None
    )


def node_to_onnx(node: Node) -> onnx.NodeProto:
    proto = helper.make_node(node.op, node.inputs, node.outputs, name=node.name, domain=node.domain)
    proto.attribute.extend(node.attr_protos)
    return proto


# attributes onnx's shape inference reads of the legacy tree ensembles; the rest (their trees:
# millions of values in a LightGBM model) it does not need, and exporting them for every round
# of inference cost most of such a model's compile
_TREE_TYPING_ATTRS = frozenset({"classlabels_int64s", "classlabels_strings", "n_targets", "post_transform",
                                "aggregate_function"})
_TREE_OPS = ("TreeEnsembleClassifier", "TreeEnsembleRegressor")


def to_onnx(g: Graph, *, small_consts_only: bool = False, max_const_elems: int = 4096) -> onnx.ModelProto:
    """Export the graph back to ONNX. Fused epilogues are not expressible and must be absent.

    With ``small_consts_only`` large constants become typed graph inputs instead of
    initializers, and the legacy tree ensembles keep only the attributes that type their
    outputs: all shape inference needs, and it keeps the export cheap.
    """
    inits, extra_inputs = [], []
    for v in g.values.values():
        if v.const is None:
            continue
        if small_consts_only and v.const.size > max_const_elems:
            extra_inputs.append(_value_info(v))
        else:
            inits.append(numpy_helper.from_array(np.asarray(v.const), v.name))
    for n in g.nodes:
        if n.epilogue:
            raise ValueError(f"node {n.name!r} has fused epilogues and cannot be exported to ONNX")
    def exported(n: Node) -> onnx.NodeProto:
        if small_consts_only and n.domain == "ai.onnx.ml" and n.op in _TREE_OPS:
            proto = helper.make_node(n.op, n.inputs, n.outputs, name=n.name, domain=n.domain)
            proto.attribute.extend(a for a in n.attr_protos if a.name in _TREE_TYPING_ATTRS)
            return proto
        return node_to_onnx(n)
    graph = helper.make_graph(
        [exported(n) for n in g.nodes],
        g.name,
        [_value_info(g.values[i]) for i in g.inputs] + extra_inputs,
        [_value_info(g.values[o]) for o in g.outputs],
        initializer=inits,
        value_info=[
            _value_info(v)
            for k, v in g.values.items()
            if v.const is None and k not in g.inputs and k not in g.outputs and v.dtype is not None
        ],
    )
    opsets = [helper.make_opsetid(d, v) for d, v in g.opset.items()]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = max(model.ir_version, 8)
    return model


def op_version(g: Graph, node: Node) -> int:
    """The since-version of the operator schema this node uses (its semantics' version)."""
    opset = g.opset.get(node.domain, g.opset.get("", MAX_TESTED_OPSET))
    try:
        return onnx.defs.get_schema(node.op, opset, node.domain).since_version
    except Exception:
        return -1
