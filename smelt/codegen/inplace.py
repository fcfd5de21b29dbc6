"""Outputs written over a dead operand's buffer (a residual add fused into a convolution).

ResNet's ``y = relu(conv(x) + r)`` reads the residual ``r`` once, at exactly the element it then
writes, and ``r`` is dead afterwards. Writing ``y`` into ``r``'s buffer instead of a fresh one
turns two streams (read ``r``, then read-for-ownership and write ``y``'s lines) into one line
that is read and written back, and shrinks the arena. The memory planner asks this module which
outputs may reuse which operand; a template opts in per node (``inplace_operand``) only when its
kernel reads each operand element before writing that same element and nothing else reads the
operand meanwhile.

Safety rules (each checked, else the output gets its own buffer):
- the schedule stage vouches for the node (``ConvSchedule.inplace_operand``, set by
  ``schedule.conv.inplace_residual`` when ``CompileOptions.inplace``: the NCHWc kernel's
  row-outer order, the residual is not the conv's own input, same shape and layout);
- both values are internal to the arena and in no concat-view group;
- the node is the operand's last reader;
- the two values have the same size.
"""

from __future__ import annotations

from smelt.ir.graph import Graph, Node


def inplace_operand(node: Node) -> str | None:
    """The operand ``node``'s schedule allows its output to overwrite, or None."""
    return getattr(node.schedule, "inplace_operand", None)


def plan_inplace(g: Graph, order: list[Node], start: dict[str, int], end: dict[str, int],
                 excluded: set[str]) -> dict[str, str]:
    """output -> operand whose buffer it reuses, for every pair the rules allow (``order``: the
    arena's node order, ``start``/``end``: live ranges of internal values, ``excluded``: values
    placed by another rule)."""
    pairs: dict[str, str] = {}
    for t, node in enumerate(order):
        src = inplace_operand(node)
        if src is None or not node.outputs:
            continue
        out = node.outputs[0]
        if out not in start or src not in start or out in excluded or src in excluded:
            continue
        if end[src] != t or g.values[src].nbytes != g.values[out].nbytes:
            continue
        pairs[out] = src
    return pairs
