"""Pass: an If whose condition is a constant becomes the nodes of the branch it takes.

Exported models test shapes (``Equal(Gather(Shape(x), 0), 1)``) or graph inputs (``sr == 16000``
in silero-vad) to choose a branch. Once input shapes are concrete, constant folding turns the
first kind into a constant; the second kind becomes one when the caller's value is folded in
(``smelt.frontend.control_flow`` specializes a model per branch taken). Either way the branch is
then ordinary graph, compiled natively like the rest, instead of the whole If (often most of the
model) running through the onnx.reference fallback.

Needs: constant folding done. Guarantees: no If with a constant condition remains; the branch's
own values are renamed ``<if node>/<name>`` (outer values it reads keep their names, as do
subgraphs nested in it that read its values, renamed alike); each If output is an Identity of the
branch output. Shapes of the new values are unknown until the next shape inference.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from smelt.frontend.control_flow import tensor_outputs
from smelt.frontend.onnx_import import attribute_value
from smelt.ir.graph import Graph, Node, Value
from smelt.ir.subgraphs import with_outer_renamed

TAKEN = {True: "then_branch", False: "else_branch"}


def _inline(g: Graph, node: Node, branch: onnx.GraphProto) -> list[Node]:
    prefix = f"{node.name}/"
    local = {i.name for i in branch.initializer} | {o for n in branch.node for o in n.output if o}
    names = {n: prefix + n for n in local}
    for init in branch.initializer:
        arr = numpy_helper.to_array(init)
        g.add_value(Value(names[init.name], arr.dtype, tuple(arr.shape), const=arr))
    new: list[Node] = []
    for idx, n in enumerate(branch.node):
        attrs = with_outer_renamed(list(n.attribute), names)
        inlined = Node(op=n.op_type, name=prefix + (n.name or f"{n.op_type}_{idx}"),
                       inputs=[names.get(i, i) for i in n.input], outputs=[names.get(o, o) for o in n.output],
                       attrs={a.name: attribute_value(a) for a in attrs}, domain=n.domain or "", attr_protos=attrs)
        for o in inlined.outputs:
            if o and o not in g.values:
                g.add_value(Value(o))
        new.append(inlined)
    for k, (out, dst) in enumerate(zip(branch.output, node.outputs, strict=False)):
        if dst:
            new.append(Node(op="Identity", name=f"{prefix}output_{k}", inputs=[names.get(out.name, out.name)],
                            outputs=[dst]))
    return new


def inline_constant_ifs(g: Graph) -> Graph:
    """Replace every If whose condition is a known constant by the branch it takes."""
    out: list[Node] = []
    for node in g.nodes:
        cond = g.values[node.inputs[0]].const if node.op == "If" and node.domain in ("", "ai.onnx") else None
        if cond is None or np.asarray(cond).size != 1:
            out.append(node)
            continue
        branch = next(a.g for a in node.attr_protos if a.name == TAKEN[bool(np.asarray(cond).reshape(()))])
        if not tensor_outputs(branch):  # sequences and optionals stay with the fallback
            out.append(node)
            continue
        out += _inline(g, node, branch)
        g.inlined_branches = True
    g.nodes = out
    g.prune_values()
    return g
