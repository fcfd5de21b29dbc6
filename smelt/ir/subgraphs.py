"""Helpers for nodes with subgraph attributes (If, Loop, Scan): which outer values they read."""

from __future__ import annotations

import onnx


def _graph_free_names(graph: onnx.GraphProto, bound: set[str]) -> set[str]:
    defined = set(bound)
    defined.update(i.name for i in graph.input)
    defined.update(i.name for i in graph.initializer)
    free: set[str] = set()
    for node in graph.node:
        for name in node.input:
            if name and name not in defined:
                free.add(name)
        for attr in node.attribute:
            for sub in _subgraphs(attr):
                free.update(_graph_free_names(sub, defined) - defined)
        defined.update(o for o in node.output if o)
    for o in graph.output:
        if o.name not in defined:
            free.add(o.name)
    return free


def _subgraphs(attr: onnx.AttributeProto) -> list[onnx.GraphProto]:
    if attr.type == onnx.AttributeProto.GRAPH:
        return [attr.g]
    if attr.type == onnx.AttributeProto.GRAPHS:
        return list(attr.graphs)
    return []


def outer_names(attr: onnx.AttributeProto) -> set[str]:
    """Names a subgraph attribute reads from the enclosing scope."""
    names: set[str] = set()
    for sub in _subgraphs(attr):
        names |= _graph_free_names(sub, set())
    return names


def rename_outer(graph: onnx.GraphProto, names: dict[str, str]) -> None:
    """Rename, in place, the outer values ``graph`` (and the subgraphs nested in it) reads:
    every reference to a key of ``names`` that the graph does not define itself."""
    defined = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {
        o for n in graph.node for o in n.output if o}
    live = {k: v for k, v in names.items() if k not in defined}
    if not live:
        return
    for node in graph.node:
        node.input[:] = [live.get(i, i) for i in node.input]
        for attr in node.attribute:
            for sub in _subgraphs(attr):
                rename_outer(sub, live)
    for out in graph.output:
        out.name = live.get(out.name, out.name)


def with_outer_renamed(attrs: list[onnx.AttributeProto], names: dict[str, str]) -> list[onnx.AttributeProto]:
    """Copies of a node's attributes whose subgraphs read the outer values renamed by ``names``."""
    out = []
    for attr in attrs:
        if attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) and outer_names(attr) & set(names):
            copy = onnx.AttributeProto()
            copy.CopyFrom(attr)
            for sub in _subgraphs(copy):
                rename_outer(sub, names)
            attr = copy
        out.append(attr)
    return out
