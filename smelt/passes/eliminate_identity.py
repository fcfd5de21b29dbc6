"""Pass: identity, same-type cast and inference-mode dropout elimination.

Needs: nothing. Guarantees: no Identity node, no Cast/CastLike to the type its input already
has (PyTorch's exports of TensorFlow-ported nets carry hundreds: 298 float->float Casts, 11% of
a call, in an NSFW classifier) and no Dropout node whose mask output is unused and whose
training_mode is absent or constant false remain; their readers read the input directly. A
graph output keeps its name: when the eliminated node produced a graph output from
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


def _is_same_type_cast(g: Graph, node) -> bool:
    if node.op not in ("Cast", "CastLike") or node.domain not in ("", "ai.onnx"):
        return False
    src, dst = g.values.get(node.inputs[0]), g.values.get(node.outputs[0])
    return src is not None and dst is not None and src.dtype is not None and src.dtype == dst.dtype


def eliminate_identity(g: Graph) -> Graph:
    producers = g.producers()
    dead = []
    for node in g.nodes:
        if (node.op == "Identity" or (node.op == "Dropout" and _is_inference_dropout(g, node))
                or _is_same_type_cast(g, node)):
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
