"""Spelled-out GELU and HardSwish that no producer took as an epilogue become one node each.

``fuse_epilogues`` folds ``x * 0.5 * (1 + erf(x / sqrt2))`` (gelu_pattern.py) and
``x * clip(x + 3, 0, 6) / 6`` (hardswish_pattern.py) into the Conv/MatMul/Gemm that produces x.
When x comes from anything else (a DequantizeLinear in a QDQ transformer, an Add of a residual, a
graph input) the pattern stayed five or four element-wise passes over the activation, the Erf one
in scalar libm: in pipecat's int8 smart-turn model the four unfused GELUs took 40% of the call.
Here each becomes one ``Gelu`` / ``HardSwish`` node, which the element-wise template runs in one
pass with the target's vector math (the same expression the epilogue applies, so a fused and an
unfused GELU answer alike).
"""

from __future__ import annotations

import numpy as np

from smelt.ir.graph import Graph, Node
from smelt.passes.gelu_pattern import match_gelu
from smelt.passes.hardswish_pattern import match_hardswish


def collapse_activation_patterns(g: Graph) -> Graph:
    """Replace each unfused GELU / HardSwish spelling with one node of that op (float32 only)."""
    consumers = g.consumers()
    position = {id(n): i for i, n in enumerate(g.nodes)}
    dead: set[int] = set()
    new_nodes: list[tuple[int, Node]] = []
    candidates = list(g.inputs) + [o for n in g.nodes for o in n.outputs if o]
    for y in candidates:
        v = g.values.get(y)
        if v is None or v.dtype != np.float32 or len(consumers.get(y, [])) != 2:
            continue
        if any(id(r) in dead for r in consumers[y]):
            continue
        for op, match in (("Gelu", match_gelu), ("HardSwish", match_hardswish)):
            found = match(g, y, consumers)
            if found is None:
                continue
            absorbed, out = found
            if g.values[out].dtype != np.float32 or any(id(n) in dead for n in absorbed):
                continue
            dead.update(id(n) for n in absorbed)
            # at the first absorbed node's place: y is computed by then, and every later reader
            # of ``out`` comes after the last absorbed node
            at = min(position[id(n)] for n in absorbed)
            new_nodes.append((at, Node(op, f"{absorbed[-1].name}__{op.lower()}", [y], [out])))
            for n in absorbed:
                for i in n.all_inputs():
                    consumers[i] = [r for r in consumers.get(i, []) if r is not n]
            consumers.setdefault(y, []).append(new_nodes[-1][1])
            break
    if not new_nodes:
        return g
    at_position = {at: node for at, node in new_nodes}
    nodes: list[Node] = []
    for i, n in enumerate(g.nodes):
        if i in at_position:
            nodes.append(at_position[i])
        if id(n) not in dead:
            nodes.append(n)
    g.nodes = nodes
    g.prune_values()
    return g
