"""ai.onnx.ml's ZipMap at the edge of the graph.

skl2onnx and onnxmltools end every classifier with a ZipMap unless told not to: it turns the
[N, C] probability tensor into a sequence of N maps {class label: probability}. Nothing in a
graph can read a sequence of maps, so a ZipMap is always the last node of its branch, and
onnx.reference has no implementation of it. smelt therefore compiles the graph with the ZipMap
replaced by an Identity (the graph output is then the probability tensor, computed natively)
and builds the maps when the call returns, as onnxruntime's Python binding does: a list of
dicts, keys the labels (``int`` or ``str``) in sorted order (onnxruntime's maps are sorted),
values Python floats of the float32 probabilities.

A ZipMap whose output another node reads (no standard op takes a sequence of maps, so only an
invalid or custom graph has one) is left alone, and the compiler refuses it by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from smelt.errors import InvalidModelError, SmeltError
from smelt.frontend.node_order import names_read

ML_DOMAIN = "ai.onnx.ml"


@dataclass(frozen=True)
class ZipMapOutput:
    """Graph output ``index`` (named ``name``) is ZipMap ``node``'s sequence of maps with keys
    ``labels``; the compiled graph returns its [N, C] (or [C]) probability tensor instead."""

    index: int
    name: str
    node: str
    labels: tuple[int, ...] | tuple[str, ...]

    @property
    def type_string(self) -> str:
        """onnxruntime's type string of the output, e.g. ``seq(map(int64,tensor(float)))``."""
        key = "string" if self.labels and isinstance(self.labels[0], str) else "int64"
        return f"seq(map({key},tensor(float)))"

    def __call__(self, probabilities: np.ndarray) -> list[dict[Any, float]]:
        """The maps of one call's probabilities: a [C] tensor is one row, as in onnxruntime."""
        if probabilities.ndim not in (1, 2):
            raise SmeltError(f"ZipMap node {self.node!r}: its input has shape {list(probabilities.shape)}; "
                             "it takes a [N, C] or [C] tensor")
        rows = probabilities.reshape(1, -1) if probabilities.ndim == 1 else probabilities
        if rows.shape[1] != len(self.labels):
            raise SmeltError(f"ZipMap node {self.node!r}: its input has {rows.shape[1]} columns "
                             f"(shape {list(probabilities.shape)}) but {len(self.labels)} class labels")
        keys, columns = self._key_columns
        if columns != tuple(range(len(self.labels))):
            rows = rows[:, list(columns)]
        return [dict(zip(keys, row, strict=True)) for row in rows.tolist()]

    @cached_property
    def _key_columns(self) -> tuple[tuple, tuple[int, ...]]:
        """The maps' keys in onnxruntime's order (its std::map's: sorted; UTF-8 bytes sort as code
        points do) and the column each reads (a repeated label: the last, which overwrites)."""
        last = {label: col for col, label in enumerate(self.labels)}
        keys = tuple(sorted(last))
        return keys, tuple(last[k] for k in keys)


def split_zipmaps(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, tuple[ZipMapOutput, ...]]:
    """``proto`` with every ZipMap that only feeds a graph output turned into an Identity of its
    probabilities (that output retyped as a float tensor), and what turns each such output back
    into maps. ``proto`` itself, and no outputs, when it has no such ZipMap."""
    graph = proto.graph
    candidates = [i for i, n in enumerate(graph.node) if n.op_type == "ZipMap" and n.domain == ML_DOMAIN]
    if not candidates:
        return proto, ()
    read = names_read(graph)
    output_index = {o.name: i for i, o in enumerate(graph.output)}
    found: list[tuple[int, ZipMapOutput]] = []
    for i in candidates:
        node = graph.node[i]
        y = node.output[0] if node.output else ""
        if y not in output_index or y in read or len(node.input) != 1:
            continue  # read inside the graph: left for the compiler's refusal to name
        found.append((i, ZipMapOutput(output_index[y], y, node.name or f"ZipMap_{i}", _labels(node))))
    if not found:
        return proto, ()
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    g = out.graph
    for i, zm in found:
        old = g.node[i]
        g.node[i].CopyFrom(helper.make_node("Identity", [old.input[0]], [zm.name], name=old.name))
        g.output[zm.index].type.CopyFrom(helper.make_tensor_type_proto(TensorProto.FLOAT, None))
    names = {zm.name for _, zm in found}
    kept = [vi for vi in g.value_info if vi.name not in names]
    del g.value_info[:]
    g.value_info.extend(kept)
    return out, tuple(zm for _, zm in found)


def _labels(node: onnx.NodeProto) -> tuple[int, ...] | tuple[str, ...]:
    attrs = {a.name: a for a in node.attribute}
    ints = list(attrs["classlabels_int64s"].ints) if "classlabels_int64s" in attrs else []
    strings = list(attrs["classlabels_strings"].strings) if "classlabels_strings" in attrs else []
    if bool(ints) == bool(strings):
        raise InvalidModelError(f"ZipMap node {node.name!r}: exactly one of classlabels_int64s and "
                                "classlabels_strings must be given (non-empty)")
    return tuple(int(v) for v in ints) if ints else tuple(s.decode("utf-8") for s in strings)


def as_tensor(value: Any) -> Any:
    """A sequence of maps as a ZipMap writes it, as the [N, C] float32 tensor it was made of
    (keys in order), so two engines' answers compare as tensors; any other value unchanged."""
    if isinstance(value, Sequence) and not isinstance(value, str | bytes) and value \
            and all(isinstance(row, dict) for row in value):
        keys = list(value[0])
        if any(list(row) != keys for row in value):
            raise SmeltError("the rows of a sequence of maps have different keys")
        return np.array([list(row.values()) for row in value], dtype=np.float32).reshape(len(value), len(keys))
    return value
