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
