"""Pass: dead-node elimination.

Needs: nothing. Guarantees: every remaining node contributes to a graph output (nodes with
no path to an output are removed, in reverse topological order), and unreferenced values are
dropped.
"""

from __future__ import annotations

from smelt.ir.graph import Graph


def eliminate_dead_nodes(g: Graph) -> Graph:
    needed = set(g.outputs)
    keep = []
    for node in reversed(g.nodes):
        if any(o in needed for o in node.outputs if o):
            keep.append(node)
            needed.update(node.all_inputs())
    g.nodes = list(reversed(keep))
    g.prune_values()
    return g
