"""Execution plan: the graph cut into execution blocks, and the arena laid out by liveness.

ModelCompiler's execution blocks: maximal runs of nodes (in topological order) that all have a
native template form native blocks, each one native call; a node without a template is a
fallback step between blocks. Values that stay inside a native block live in one arena at
offsets planned from their live ranges; values that cross a block boundary (or are graph
outputs) are ordinary numpy arrays handed to the block by pointer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from smelt.codegen.concat_views import plan_concat_views
from smelt.codegen.guards import assign_guards
from smelt.codegen.inplace import plan_inplace
from smelt.codegen.registry import find_template
from smelt.ir.graph import Graph, Node
from smelt.schedule.rnn import pipeline_members

ALIGN = 64


@dataclass
class NativeBlock:
    index: int
    nodes: list[Node] = field(default_factory=list)
    ext_inputs: list[str] = field(default_factory=list)  # non-constant values read from outside
    ext_outputs: list[str] = field(default_factory=list)  # values written for outside readers


@dataclass
class FallbackStep:
    node: Node
    reason: str


@dataclass
class ExecutionPlan:
    steps: list[NativeBlock | FallbackStep]
    arena_offsets: dict[str, int]
    arena_bytes: int

    def native_blocks(self) -> list[NativeBlock]:
        return [s for s in self.steps if isinstance(s, NativeBlock)]

    def fallback_steps(self) -> list[FallbackStep]:
        return [s for s in self.steps if isinstance(s, FallbackStep)]


def partition(g: Graph, force_fallback: frozenset[str] = frozenset()) -> list[NativeBlock | FallbackStep]:
    steps: list[NativeBlock | FallbackStep] = []
    current: NativeBlock | None = None
    for node in g.nodes:
        tpl, reason = (None, "forced by the caller") if node.name in force_fallback else find_template(node, g)
        if tpl is None:
            steps.append(FallbackStep(node, reason))
            current = None
            continue
        if current is None:
            current = NativeBlock(index=len([s for s in steps if isinstance(s, NativeBlock)]))
            steps.append(current)
        current.nodes.append(node)
    return steps


def _block_io(g: Graph, steps: list[NativeBlock | FallbackStep]) -> None:
    owner: dict[str, int] = {}  # value -> step index producing it
    for si, step in enumerate(steps):
        nodes = step.nodes if isinstance(step, NativeBlock) else [step.node]
        for n in nodes:
            for o in n.outputs:
                if o:
                    owner[o] = si
    readers: dict[str, set[int]] = {}
    for si, step in enumerate(steps):
        nodes = step.nodes if isinstance(step, NativeBlock) else [step.node]
        for n in nodes:
            for i in n.all_inputs():
                readers.setdefault(i, set()).add(si)
    graph_outputs = set(g.outputs)
    for si, step in enumerate(steps):
        if not isinstance(step, NativeBlock):
            continue
        ins: list[str] = []
        outs: list[str] = []
        for n in step.nodes:
            for i in n.all_inputs():
                if g.values[i].const is None and owner.get(i) != si and i not in ins:
                    ins.append(i)
            for o in n.outputs:
                if o and (o in graph_outputs or readers.get(o, set()) - {si}):
                    outs.append(o)
        step.ext_inputs, step.ext_outputs = ins, outs


def plan_arena(g: Graph, steps: list[NativeBlock | FallbackStep], concat_views: bool = True) -> tuple[dict[str, int], int]:
    """Offsets for block-internal values: greedy first-fit over live ranges (node indices).
    ``concat_views``: Concat inputs may be written in place (``CompileOptions.concat_views``)."""
    order: list[Node] = []
    internal: set[str] = set()
    for step in steps:
        if isinstance(step, NativeBlock):
            external = set(step.ext_outputs)
            for n in step.nodes:
                internal.update(o for o in n.outputs if o and o not in external)
            order.extend(step.nodes)
        else:
            order.append(step.node)
    start: dict[str, int] = {}
    end: dict[str, int] = {}
    for t, n in enumerate(order):
        for o in n.outputs:
            if o in internal:
                start[o] = t
                end[o] = t  # an unread output still needs room while its producer runs
        for i in n.all_inputs():
            if i in internal:
                end[i] = t
    # A pipelined stack of recurrent layers (templates/rnn/, pipeline plan; membership in the
    # nodes' RNN schedules) computes every layer in the first layer's step: the stack's values
    # must be live over the whole stack.
    index = {id(n): t for t, n in enumerate(order)}
    for chain in {id(c[0]): c for c in pipeline_members(g).values()}.values():
        lo, hi = min(index[id(n)] for n in chain), max(index[id(n)] for n in chain)
        for n in chain:
            for o in n.outputs:
                if o in start:
                    start[o], end[o] = min(start[o], lo), max(end[o], hi)
    # Concats whose inputs can be written in place (concat_views.py): each group of views is
    # one region, live from its first member's producer to its last member's last reader
    groups = plan_concat_views(g, order, internal, ALIGN).groups() if concat_views else {}
    regions: dict[str, tuple[int, int, int, int]] = {}  # key -> (size, start, end, lowest offset)
    member_of: dict[str, str] = {}
    for root, members in groups.items():
        lo = min(members.values())
        hi = max(off + g.values[m].nbytes for m, off in members.items())
        regions[root] = (hi - lo, min(start[m] for m in members), max(end[m] for m in members), lo)
        member_of.update({m: root for m in members})
    # Outputs written over their dead operand's buffer (inplace.py): a chain of them is one
    # region, live from the first value's producer to the last one's last reader
    alias_of: dict[str, str] = {}
    for out, src in plan_inplace(g, order, start, end, set(member_of)).items():
        alias_of[out] = alias_of.get(src, src)
    for name in start:
        if name not in member_of and name not in alias_of:
            regions[name] = (g.values[name].nbytes, start[name], end[name], 0)
    for name, root in alias_of.items():
        size, first, last, _ = regions[root]
        regions[root] = (size, first, max(last, end[name]), 0)
    # Regions are placed in order of their first node, so a placed region that ends before the
    # current one starts never overlaps a later one either: only the live ones are kept (all of
    # them made this quadratic in the node count, 15 s at 10,000 nodes)
    live: list[tuple[int, int, int]] = []  # offset, size, end of the placed regions still live
    offsets: dict[str, int] = {}
    total = 0
    for key in sorted(regions, key=lambda v: (regions[v][1], -regions[v][0])):
        nbytes, first, last, lo = regions[key]
        size = max(ALIGN, -(-nbytes // ALIGN) * ALIGN)
        live = [r for r in live if r[2] >= first]
        busy = sorted((o, s) for o, s, _ in live)
        offset = 0
        for o, s in busy:
            if offset + size <= o:
                break
            offset = max(offset, o + s)
        live.append((offset, size, last))
        if key in groups:
            for m, off in groups[key].items():
                offsets[m] = offset + off - lo
        else:
            offsets[key] = offset
        total = max(total, offset + size)
    offsets.update({name: offsets[root] for name, root in alias_of.items()})
    return offsets, total


def build_plan(g: Graph, force_fallback: frozenset[str] = frozenset(), *, concat_views: bool = True) -> ExecutionPlan:
    steps = partition(g, force_fallback)
    assign_guards(g, {id(n) for s in steps if isinstance(s, NativeBlock) for n in s.nodes})
    _block_io(g, steps)
    offsets, total = plan_arena(g, steps, concat_views)
    return ExecutionPlan(steps, offsets, total)
