"""Pass: identity and inference-mode dropout elimination.

Needs: nothing. Guarantees: no Identity node and no Dropout node whose mask output is unused
and whose training_mode is absent or constant false remain; their readers read the input
directly. A graph output keeps its name: when the eliminated node produced a graph output from
a graph input or a constant, the node stays (the output must still be a distinct tensor).
"""

from __future__ import annotations

from smelt.ir.graph import Graph


def _is_inference_dropout(g: Graph, node) -> bool:
    if len(node.outputs) > 1 and node.outputs[1]:
        return False
    if len(node.inputs) > 2 and node.inputs[2]:
        mode = g.const(node.inputs[2])
        if mode is None or bool(mode):
            return False
    return True


def eliminate_identity(g: Graph) -> Graph:
    producers = g.producers()
    dead = []
    for node in g.nodes:
        if node.op == "Identity" or (node.op == "Dropout" and _is_inference_dropout(g, node)):
            src, dst = node.inputs[0], node.outputs[0]
            if g.values[src].dtype != g.values[dst].dtype and g.values[dst].dtype is not None:
                continue
            if dst in g.outputs:
                if src in g.inputs or src in g.outputs or src not in producers or g.values[src].const is not None:
                    continue
                # rename the producer's output so the graph output keeps its name
                prod = producers[src]
                prod.outputs = [dst if o == src else o for o in prod.outputs]
                g.replace_uses(src, dst)
                g.values[dst].shape = g.values[dst].shape or g.values[src].shape
            else:
                g.replace_uses(dst, src)
            dead.append(node)
    g.remove_nodes(dead)
    g.prune_values()
    return g
