"""Which native nodes run only under a run-time condition: the branches of a run-time If.

A ``Where`` whose condition has one element reads only one of its two data inputs: the second
(``then``) when the condition is true, the third (``else``) when it is false.
``passes/runtime_if.py`` turns an If that only the run decides into such a Where over both
branches inlined; this decides, by a backward walk over the planned graph, which nodes' results are
needed only on one side, and sets ``Node.guard = (condition, polarity)`` on them. The generated
step then returns at once when the condition differs (``BlockEmitter.step``), so the untaken
branch costs one load and a compare per step, where onnxruntime's If skips it too.

A node is guarded by (c, p) when every reader of every output needs it only under (c, p): a
guarded reader with that guard, or the select's side p. Anything else a reader could need it for
(a graph output, a fallback step, an unguarded reader, readers under different conditions) makes it
needed always: a guard is never wrong to leave off (the nodes are pure; the select ignores the
other side), only slower. Nested Ifs keep the outer guard only. A node is guarded only if it comes
after the condition's producer (so the condition is computed when it runs) and runs natively
(fallback steps are Python and always run).
"""

from __future__ import annotations

from smelt.ir.graph import Graph, Node

ALWAYS = "always"


def _one_element_cond(g: Graph, node: Node) -> str | None:
    if node.op != "Where" or node.domain not in ("", "ai.onnx") or len(node.inputs) != 3:
        return None
    v = g.values.get(node.inputs[0])
    if v is None or v.const is not None or not v.is_static or v.size != 1:
        return None
    return node.inputs[0]


def assign_guards(g: Graph, native: set[int]) -> int:
    """Set ``guard`` on the nodes (``id`` in ``native``: they run in native blocks) needed only
    under one side of a one-element Where; returns how many were guarded."""
    for n in g.nodes:
        n.guard = None
    pos = {o: i for i, n in enumerate(g.nodes) for o in n.outputs if o}
    # demand per value: None = not needed yet, ALWAYS, or (cond, polarity)
    demand: dict[str, object] = {o: ALWAYS for o in g.outputs}

    def need(value: str, what: object) -> None:
        have = demand.get(value)
        demand[value] = what if have is None or have == what else ALWAYS

    count = 0
    for i in range(len(g.nodes) - 1, -1, -1):
        n = g.nodes[i]
        ins = n.all_inputs()  # before the guard is set: the data and epilogue reads
        mine: object = None
        for o in n.outputs:
            if o:
                d = demand.get(o)
                if d is None:  # an output nothing reads
                    continue
                mine = d if mine is None or mine == d else ALWAYS
        if isinstance(mine, tuple) and id(n) in native and pos.get(mine[0], -1) < i:
            n.guard = mine  # type: ignore[assignment]
            count += 1
        else:
            # unread (dead) nodes are kept by the passes only as graph outputs; be safe
            mine = ALWAYS
        cond = _one_element_cond(g, n)
        if n.guard is not None:  # the condition itself is read whenever the node is reached
            need(n.guard[0], ALWAYS)
        for k, inp in enumerate(ins):
            if cond is not None and k in (1, 2) and mine == ALWAYS and inp != cond:
                need(inp, (cond, k == 1))
            else:
                need(inp, mine)
    return count
