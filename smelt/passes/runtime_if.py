"""Pass: an If whose condition is only known at run time becomes both branches plus a select.

openWakeWord's hey-jarvis head runs a second "verifier" MLP only when the first one's probability
passes a threshold: ``If(p >= 0.5, then: verifier(x), else: p)``. No input decides it, so neither
constant folding nor a guard (``frontend/control_flow.py``) can; left as an If, the whole node ran
on the onnx.reference fallback (3x slower than onnxruntime on that model). Here each branch's nodes
are inlined into the graph (values ``<if>/then/<name>``, ``<if>/else/<name>``) and every If output
becomes ``Where(cond, then_out, else_out)`` with a one-element condition. The branches are then
ordinary graph: folded, inferred, fused, compiled natively. That a branch runs only when it is
taken is decided at plan time (``codegen/guards.py``): a Where whose condition has one element
reads only one of its data inputs, so the nodes that only it needs are guarded by the condition
and skipped at run time inside the generated code, as onnxruntime skips the untaken branch.

Only after the fold fixpoint (an If that folding can still decide is inlined by ``inline_if``, and
the untaken branch of a shape test may not even be valid for the actual shapes), only where no
branch outputs a sequence or an optional, and only where, inferred inlined, both branches give each
output the same static shape and dtype (so the Where neither broadcasts nor converts), and only
where every branch node has a native template (a fallback step always runs, so it could not be
skipped). Otherwise (or if inference or validation refuses the inlined branches) the If is
restored whole and stays on the fallback.

Needs: constant folding and shape inference at their fixpoint. Guarantees: every converted If is gone; the
branch values are new names; each If output is produced by a Where of the same shape and dtype.
"""

from __future__ import annotations

import numpy as np

from smelt.codegen.registry import find_template
from smelt.errors import SmeltError
from smelt.frontend.control_flow import tensor_outputs
from smelt.frontend.validate import check_graph
from smelt.ir.graph import Graph, Node, Value
from smelt.passes.inline_if import TAKEN, _inline
from smelt.passes.shape_inference import infer_shapes


def _eligible(g: Graph, node: Node) -> bool:
    if node.op != "If" or node.domain not in ("", "ai.onnx") or not node.inputs or not node.inputs[0]:
        return False
    cond = g.values.get(node.inputs[0])
    if cond is None or cond.const is not None or not cond.is_static or cond.size != 1:
        return False
    branches = {a.name: a.g for a in node.attr_protos if a.name in TAKEN.values()}
    if len(branches) != 2 or not all(tensor_outputs(b) for b in branches.values()):
        return False
    return any(node.outputs)


def _convert(g: Graph, node: Node) -> list[Node]:
    """The nodes replacing ``node``: both branches inlined, a Where per output."""
    new: list[Node] = []
    cond = node.inputs[0]
    if g.values[cond].shape != ():  # Where broadcasts its condition: a [1, 1] one would reshape a scalar output
        scalar = g.fresh_name(f"{node.name}/cond")
        g.add_value(Value(scalar, np.dtype(bool), ()))
        new.append(Node("Reshape", f"{node.name}/cond_scalar", [cond, g.add_const(np.zeros(0, np.int64), "scalar_shape")],
                        [scalar]))
        cond = scalar
    picked: dict[bool, list[str]] = {}
    for taken, attr in TAKEN.items():
        branch = next(a.g for a in node.attr_protos if a.name == attr)
        side = "then" if taken else "else"
        outs = [g.fresh_name(f"{node.name}/{side}_out") if o else "" for o in node.outputs]
        for o in outs:
            if o:
                g.add_value(Value(o))
        new += _inline(g, Node("If", f"{node.name}/{side}", node.inputs, outs), branch)
        picked[taken] = outs
    for k, out in enumerate(node.outputs):
        if out:
            new.append(Node("Where", f"{node.name}/select_{k}", [cond, picked[True][k], picked[False][k]], [out]))
    return new


def _agrees(g: Graph, selects: list[Node]) -> bool:
    """Every Where made for an If: both data inputs have the output's shape and dtype."""
    for n in selects:
        out, a, b = (g.values[v] for v in (n.outputs[0], n.inputs[1], n.inputs[2]))
        if not (out.is_static and a.shape == b.shape == out.shape and a.dtype == b.dtype == out.dtype):
            return False
    return True


# what the next fold round removes (so whether a template takes it does not matter), and nested Ifs
# (converted by the next call in turn; one that stays whole decides its own branch when it runs)
_FOLDED = ("Constant", "Identity", "Shape", "Size", "If")


def _all_native(g: Graph, prefixes: tuple[str, ...]) -> bool:
    """Every inlined branch node that folding will not remove has a template. A branch node on the
    fallback could not be skipped (fallback steps always run: codegen/guards.py), so an untaken
    branch's fallback op would meet values onnxruntime never gives it; such an If stays whole."""
    for n in g.nodes:
        if not n.name.startswith(prefixes) or n.op in _FOLDED:
            continue
        if all(g.values[i].const is not None for i in n.present_inputs()):
            continue
        if find_template(n, g)[0] is None:
            return False
    return True


def convert_runtime_ifs(g: Graph) -> bool:
    """Convert every eligible run-time If (see the module doc), one at a time (a refused one stays
    whole without holding the others back); True if any was."""
    changed = False
    for name in [n.name for n in g.nodes if _eligible(g, n)]:
        node = next(n for n in g.nodes if n.name == name)
        saved = (list(g.nodes), dict(g.values), g.inlined_branches, {k: (v.dtype, v.shape) for k, v in g.values.items()})
        at = next(i for i, n in enumerate(g.nodes) if n is node)
        g.nodes = g.nodes[:at] + _convert(g, node) + g.nodes[at + 1:]
        g.inlined_branches = True
        try:
            check_graph(infer_shapes(g))
            ok = (_agrees(g, [n for n in g.nodes if n.op == "Where" and n.name.rsplit("/select_", 1)[0] == name])
                  and _all_native(g, (f"{name}/then/", f"{name}/else/")))
        except SmeltError:
            ok = False
        if ok:
            changed = True
            continue
        g.nodes, g.values, g.inlined_branches, types = saved  # the If stays whole (on the fallback)
        for k, (dtype, shape) in types.items():
            g.values[k].dtype, g.values[k].shape = dtype, shape
    if changed:
        g.prune_values()
    return changed
