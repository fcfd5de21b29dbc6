"""Global layout search (NeoCPU §3.3.2, Algorithm 2): which block each conv writes and reads.

Every NCHWc conv ``k`` chooses an output block ``ob_k`` (16 or 8 on AVX-512) and an input block
``ib_k``; its measured time ``cost_k(ib, ob)`` comes from the local search's scheme records
(``search.SCHEME_KIND``). Layouts then flow through the graph as the layout pass moves them: a
layout-tolerant op (pooling, BatchNorm, element-wise, channel Concat) keeps its inputs' block,
an op with several data inputs converts them to their majority block (ties: the first input's),
anything else reads plain. A ``LayoutTransform`` costs its measured time (``TRANSFORM_KIND``)
wherever a value's block differs from what its reader wants: a conv reading another block than
its producer's (smelt's kernel reads ANY input block directly, so ``ib_k = `` the producer's
block costs nothing; another ``ib_k`` is worth a transform only if the kernel gains more), a
residual operand fused into a conv in another block than the conv's output, the inputs of an
Add/Concat that disagree, graph outputs (plain). Total modelled time = sum of these factors.

Exact search: dynamic programming over the convs in topological order (Algorithm 2, generalised
from chains to DAGs as variable elimination): a state is the output blocks of the convs whose
layout some later factor still reads (the *frontier*); each step extends every state by every
block of the next conv, adds the factors that become fully known, and keeps the cheapest state
per frontier assignment. Chains and ResNets keep one or two convs in the frontier, Inception a
few per module. Where branches and concats make the table exceed ``max_states`` (DenseNet's
growing concats make every earlier layer of a dense block part of the frontier), the fallback
is greedy in topological order (each conv takes the block that is cheapest given the choices
before it) followed by iterated conditional modes (re-choose one conv at a time against the
full model until nothing improves), a PBQP-style local reduction.

Costs that were never measured fall back to estimates: another input block's time for the same
output block (the kernel's speed barely depends on it), else the cost model scaled to a nominal
rate; transforms to a bandwidth estimate.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from smelt.codegen.kernels.conv_geometry import ConvGeometry, is_depthwise
from smelt.ir.graph import Graph, Node
from smelt.ir.ops import ops_where
from smelt.options import CompileOptions
from smelt.schedule.conv import (
    NchwcSchedule,
    candidate_schedules,
    default_schedule,
    nchwc_reason,
    oc_block_choices,
    prefers_gemm,
    schedule_cost,
    workload,
)
from smelt.schedule.db import SCHEME_KIND, TRANSFORM_KIND, transform_key
from smelt.target import Target

# non-conv ops whose blocked templates exist (the ``blocked`` trait)
_TOLERANT = ops_where(lambda t: t.blocked)
NOMINAL_FLOPS_PER_THREAD = 100e9  # for convs never measured (only ratios between blocks matter)
NOMINAL_BYTES_PER_S = 20e9  # for transforms never measured


class Costs(Protocol):
    """Where the search reads times from (the tuning database, or synthetic in tests)."""

    def conv(self, node: Node, g: Graph, ib: int, ob: int) -> tuple[float, NchwcSchedule | None] | None: ...

    def transform(self, shape: tuple[int, ...], src: int, dst: int) -> float | None: ...


class DBCosts:
    """Measured costs from a ``TuningDB`` (records of ``smelt.tune.search``)."""

    def __init__(self, db, target: Target, threads: int) -> None:
        self.db, self.tk, self.threads = db, target.key(), threads

    def conv(self, node: Node, g: Graph, ib: int, ob: int) -> tuple[float, NchwcSchedule | None] | None:

        rec = self.db.record(SCHEME_KIND, {**workload(node, g, ib, self.threads), "ob": ob}, self.tk)
        return None if rec is None else (rec.cost_s, NchwcSchedule.from_dict(rec.config))

    def transform(self, shape: tuple[int, ...], src: int, dst: int) -> float | None:

        n, c, h, w = (int(d) for d in shape)
        rec = self.db.record(TRANSFORM_KIND, transform_key(n, c, h, w, src, dst, self.threads), self.tk)
        return None if rec is None else rec.cost_s


# ------------------------------------------------------------------------------------------
# The model
# ------------------------------------------------------------------------------------------
@dataclass
class ConvVar:
    node: str
    obs: list[int]  # the domain: output blocks this conv can write
    ibs: list[int]  # input blocks it may ask for (besides whatever arrives)
    costs: dict[tuple[int, int], tuple[float, NchwcSchedule | None]]  # (ib, ob) -> seconds, schedule
    depthwise: bool

    def cost(self, ib: int, ob: int) -> float:
        if (ib, ob) in self.costs:
            return self.costs[ib, ob][0]
        same_ob = [v[0] for (i, o), v in self.costs.items() if o == ob]
        return min(same_ob) if same_ob else float("inf")


@dataclass
class _Factor:
    support: frozenset[int]
    fn: Callable[[Callable[[str], int], dict[int, int]], float]  # (layout of value, assignment) -> s
    what: str


@dataclass
class LayoutProblem:
    """Conv variables, value-layout rules and cost factors of one graph (see the docstring)."""

    vars: list[ConvVar]
    factors: list[_Factor]
    # value -> ("conv", k) | ("plain",) | ("join", [inputs], channel counts)
    rules: dict[str, tuple]
    order: list[str] = field(default_factory=list)  # values in topological order

    def layouts(self, assign: dict[int, int]) -> Callable[[str], int]:
        """The layout of each value under an assignment of (at least) its support."""
        memo: dict[str, int] = {}

        def lay(v: str) -> int:
            if v in memo:
                return memo[v]
            rule = self.rules.get(v, ("plain",))
            if rule[0] == "conv":
                out = assign[rule[1]]
            elif rule[0] == "plain":
                out = 1
            else:
                ins, chans = rule[1], rule[2]
                ls = [lay(i) for i in ins]
                out = max(dict.fromkeys(ls), key=ls.count)  # majority; ties: the first input's
                if any(c % out for c in chans):
                    out = 1
            memo[v] = out
            return out

        return lay

    def total(self, assign: dict[int, int]) -> float:
        lay = self.layouts(assign)
        return sum(f.fn(lay, assign) for f in self.factors)

    def choose_ib(self, k: int, arriving: int, ob: int, tcost: Callable[[int, int], float]) -> int:
        """Conv ``k``'s best input block given the block that arrives and its output block."""
        return _choose_ib(self.vars[k], arriving, ob, tcost)


def _choose_ib(var: ConvVar, arriving: int, ob: int, tcost: Callable[[int, int], float]) -> int:
    if var.depthwise:
        return ob
    opts = list(dict.fromkeys([arriving] + var.ibs))
    return min(opts, key=lambda ib: (var.cost(ib, ob) + (tcost(arriving, ib) if ib != arriving else 0.0),
                                     ib != arriving))


def _support(rules: dict[str, tuple], v: str, memo: dict[str, frozenset[int]]) -> frozenset[int]:
    if v in memo:
        return memo[v]
    rule = rules.get(v, ("plain",))
    if rule[0] == "conv":
        out = frozenset([rule[1]])
    elif rule[0] == "plain":
        out = frozenset()
    else:
        out = frozenset().union(*[_support(rules, i, memo) for i in rule[1]])
    memo[v] = out
    return out


def _shape(g: Graph, name: str) -> tuple[int, ...]:
    return tuple(int(d) for d in g.values[name].shape)


def _estimate_transform(shape: Sequence[int]) -> float:
    return 1e-6 + 2 * 4 * float(np.prod(shape)) / NOMINAL_BYTES_PER_S


def _schedule_for_ob(node: Node, g: Graph, target: Target, ob: int) -> NchwcSchedule:
    d = default_schedule(node, g, target)
    if d.oc_bn == ob:
        return d
    geo = ConvGeometry(node, g)
    cands = [s for s in candidate_schedules(node, g, target) if s.oc_bn == ob and s.unroll_ker]
    if is_depthwise(geo):
        return max(cands, key=lambda s: s.reg_n) if cands else NchwcSchedule(ob, d.reg_n)
    return min(cands, key=lambda s: (schedule_cost(geo, s), -s.reg_n)) if cands else NchwcSchedule(ob, d.reg_n)


def build_problem(g: Graph, target: Target, threads: int, costs: Costs,
                  force_fallback: frozenset[str] = frozenset()) -> LayoutProblem:
    """The model of ``g`` (lowered by the graph passes, layouts not yet planned)."""
    vars_: list[ConvVar] = []
    rules: dict[str, tuple] = {}
    factors: list[_Factor] = []
    order: list[str] = []
    memo: dict[str, frozenset[int]] = {}

    tmemo: dict[tuple, float] = {}

    def tcost(shape: tuple[int, ...], src: int, dst: int) -> float:
        if src == dst:
            return 0.0
        key = (shape, src, dst)
        if key not in tmemo:  # the solvers ask millions of times; the database is sqlite
            t = costs.transform(shape, src, dst)
            tmemo[key] = _estimate_transform(shape) if t is None else t
        return tmemo[key]

    def data_inputs(node: Node) -> list[str]:
        return [i for i in node.present_inputs() if i in g.values and g.values[i].const is None]

    for node in g.nodes:
        if (node.op == "Conv" and node.domain in ("", "ai.onnx") and node.name not in force_fallback
                and nchwc_reason(node, g, target) is None and not prefers_gemm(node, g, target, CompileOptions(threads))):
            geo = ConvGeometry(node, g)
            dw = is_depthwise(geo)
            grouped = geo.group > 1 and not dw
            obs = [b for b in oc_block_choices(geo.oc, target)
                   if not grouped or geo.ocg % b == 0] if not dw else [b for b in oc_block_choices(geo.c, target)]
            cg = geo.cg if grouped else geo.c
            ibs = [b for b in oc_block_choices(geo.c, target) if cg % b == 0] if not dw else list(obs)
            table: dict[tuple[int, int], tuple[float, NchwcSchedule | None]] = {}
            for ib in [1] + ibs:  # 1: what a conv reading a plain value (the stem) costs
                for ob in obs:
                    if dw and ib != ob:
                        continue
                    got = costs.conv(node, g, ib, ob)
                    if got is not None:
                        table[ib, ob] = got
            if not any(o == ob for (_, o) in table for ob in obs):  # never measured: the model
                best = min(schedule_cost(geo, _schedule_for_ob(node, g, target, ob)) for ob in obs)
                base = geo.batch * geo.oc * geo.ohw * geo.cg * geo.ksp * 2 / (threads * NOMINAL_FLOPS_PER_THREAD)
                for ob in obs:
                    rel = schedule_cost(geo, _schedule_for_ob(node, g, target, ob)) / best if best else 1.0
                    table[ob, ob] = (base * rel, None)  # any input block: see ConvVar.cost
            for ob in obs:  # an output block with no time at all must not look free
                if not any(o == ob for (_, o) in table):
                    table[obs[0], ob] = (float("inf"), None)
            k = len(vars_)
            vars_.append(ConvVar(node.name, obs, ibs, table, dw))
            x = node.inputs[0]
            res = [e.input for e in node.epilogue if e.input and e.broadcast == "full"]
            xs = _shape(g, x)
            res_shapes = tuple((r, _shape(g, r)) for r in res)

            def conv_factor(lay, assign, k=k, x=x, res=res_shapes, xs=xs):
                ob = assign[k]
                arriving = lay(x)
                ib = _choose_ib(vars_[k], arriving, ob, lambda a, d: tcost(xs, a, d))
                c = vars_[k].cost(ib, ob) + tcost(xs, arriving, ib)
                return c + sum(tcost(rs, lay(r), ob) for r, rs in res)

            sup = frozenset([k]).union(_support(rules, x, memo), *[_support(rules, r, memo) for r in res])
            factors.append(_Factor(sup, conv_factor, f"conv {node.name}"))
            for o in node.outputs:
                if o:
                    rules[o] = ("conv", k)
                    order.append(o)
            continue
        ins = data_inputs(node)
        outs = [o for o in node.outputs if o]
        four_d = all(g.values[v].shape is not None and len(g.values[v].shape) == 4 and g.values[v].is_static
                     and g.values[v].dtype is not None and np.dtype(g.values[v].dtype) == np.float32
                     for v in ins + outs)
        axis_ok = node.op != "Concat" or int(node.attr("axis", 0)) in (1, -3)
        extra = [e.input for e in node.epilogue if e.input and e.input in g.values
                 and g.values[e.input].const is None]
        reads = ins + extra
        if ins and node.op in _TOLERANT and node.domain in ("", "ai.onnx") and four_d and axis_ok and len(outs) == 1:
            chans = [int(g.values[v].shape[1]) for v in reads + outs]
            rules[outs[0]] = ("join", reads, chans)
            join = outs[0]

            read_shapes = tuple((r, _shape(g, r)) for r in reads)

            def join_factor(lay, assign, reads=read_shapes, join=join):
                lo = lay(join)
                return sum(tcost(rs, lay(r), lo) for r, rs in reads)

            factors.append(_Factor(_support(rules, join, memo), join_factor, f"{node.op} {node.name}"))
            order.append(join)
            continue
        for o in outs:  # layout-dependent (or not modelled): reads plain, writes plain
            rules[o] = ("plain",)
            order.append(o)
        for r in reads:
            if r in rules and _support(rules, r, memo) and len(g.values[r].shape or ()) == 4:
                def plain_factor(lay, assign, r=r):
                    return tcost(_shape(g, r), lay(r), 1)

                factors.append(_Factor(_support(rules, r, memo), plain_factor, f"{node.op} {node.name} reads plain"))
    for out in g.outputs:
        if out in rules and _support(rules, out, memo):
            def out_factor(lay, assign, out=out):
                return tcost(_shape(g, out), lay(out), 1)

            factors.append(_Factor(_support(rules, out, memo), out_factor, f"output {out}"))
    return LayoutProblem(vars_, factors, rules, order)


# ------------------------------------------------------------------------------------------
# Solvers
# ------------------------------------------------------------------------------------------
@dataclass
class Solution:
    assign: dict[int, int]  # var index -> output block
    cost: float  # modelled seconds
    method: str  # "dp" or "greedy+icm"
    states: int  # the DP's largest table (0 for the fallback)


class StateExplosion(Exception):
    pass


def _attach(problem: LayoutProblem) -> tuple[dict[int, list[_Factor]], list[int], float]:
    """Factors by the last conv of their support, each conv's last use, the constant part."""
    n = len(problem.vars)
    attach: dict[int, list[_Factor]] = {}
    last_use = [-1] * n
    const = 0.0
    for f in problem.factors:
        if not f.support:
            const += f.fn(problem.layouts({}), {})
            continue
        at = max(f.support)
        attach.setdefault(at, []).append(f)
        for v in f.support:
            last_use[v] = max(last_use[v], at)
    return attach, last_use, const


def frontier_states(problem: LayoutProblem) -> int:
    """The DP's largest table, known before running it: the product of the domain sizes of
    the convs in the widest frontier."""
    _, last_use, _ = _attach(problem)
    widest = 1
    for k in range(len(problem.vars)):
        size = len(problem.vars[k].obs)
        for v in range(k):
            if last_use[v] > k:
                size *= len(problem.vars[v].obs)
        widest = max(widest, size)
    return widest


def solve_dp(problem: LayoutProblem, max_states: int = 4096) -> Solution:
    """Exact minimum of the model (see the module docstring); ``StateExplosion`` if the
    frontier would exceed ``max_states`` assignments."""
    states_needed = frontier_states(problem)
    if states_needed > max_states:
        raise StateExplosion(f"{states_needed} frontier states (limit {max_states})")
    n = len(problem.vars)
    attach, last_use, const = _attach(problem)
    # a state: frontier assignment -> (cost, back pointer); back pointers rebuild the assignment
    frontier: list[int] = []
    states: dict[tuple, tuple[float, tuple | None]] = {(): (const, None)}
    for k in range(n):
        nxt_frontier = [v for v in frontier + [k] if last_use[v] > k]
        nxt: dict[tuple, tuple[float, tuple | None]] = {}
        for key, (cost, back) in states.items():
            base = dict(zip(frontier, key, strict=True))
            for ob in problem.vars[k].obs:
                a2 = {**base, k: ob}
                lay = problem.layouts(a2)
                c2 = cost + sum(f.fn(lay, a2) for f in attach.get(k, ()))
                key2 = tuple(a2[v] for v in nxt_frontier)
                if key2 not in nxt or c2 < nxt[key2][0]:
                    nxt[key2] = (c2, (back, k, ob))
        states, frontier = nxt, nxt_frontier
    cost, back = min(states.values(), key=lambda v: v[0])
    assign: dict[int, int] = {}
    while back is not None:
        back, k, ob = back
        assign[k] = ob
    return Solution(assign, cost, "dp", states_needed)


def solve_greedy(problem: LayoutProblem, passes: int = 4) -> Solution:
    """Greedy in topological order, then iterated conditional modes (the fallback)."""
    n = len(problem.vars)
    attach, _, _ = _attach(problem)
    touching: dict[int, list[_Factor]] = {}
    for f in problem.factors:
        for v in f.support:
            touching.setdefault(v, []).append(f)
    assign: dict[int, int] = {}
    for k in range(n):
        best = None
        for ob in problem.vars[k].obs:
            a2 = {**assign, k: ob}
            lay = problem.layouts(a2)
            c = sum(f.fn(lay, a2) for f in attach.get(k, ()))
            if best is None or c < best[0]:
                best = (c, ob)
        assert best is not None
        assign[k] = best[1]
    for _ in range(passes):
        improved = False
        for k in range(n):
            fs = touching.get(k, [])
            lay = problem.layouts(assign)
            cur = sum(f.fn(lay, assign) for f in fs)
            for ob in problem.vars[k].obs:
                if ob == assign[k]:
                    continue
                a2 = {**assign, k: ob}
                lay2 = problem.layouts(a2)
                c = sum(f.fn(lay2, a2) for f in fs)  # only factors that read conv k change
                if c < cur - 1e-12:
                    assign, cur, improved = a2, c, True
        if not improved:
            break
    return Solution(assign, problem.total(assign), "greedy+icm", 0)


def solve(problem: LayoutProblem, max_states: int = 4096) -> Solution:
    """The DP, or the greedy fallback when its state space explodes."""
    try:
        return solve_dp(problem, max_states)
    except StateExplosion:
        return solve_greedy(problem)


def brute_force(problem: LayoutProblem) -> Solution:
    """Every assignment (tests only: exponential)."""
    best = None
    for combo in itertools.product(*[v.obs for v in problem.vars]):
        a = dict(enumerate(combo))
        c = problem.total(a)
        if best is None or c < best.cost:
            best = Solution(a, c, "brute", 0)
    assert best is not None
    return best


# ------------------------------------------------------------------------------------------
# The compiler's hook
# ------------------------------------------------------------------------------------------
@dataclass
class GlobalPlan:
    problem: LayoutProblem
    solution: Solution
    schedules: dict[str, NchwcSchedule]  # conv node -> schedule with oc_bn (ic_bn set at lookup)


def plan_global(g: Graph, target: Target, threads: int, costs: Costs, max_states: int = 4096,
                force_fallback: frozenset[str] = frozenset()) -> GlobalPlan:
    """Solve the model of ``g`` and pick each conv's tile schedule for its chosen output block."""
    problem = build_problem(g, target, threads, costs, force_fallback)
    sol = solve(problem, max_states)
    nodes = {n.name: n for n in g.nodes}
    scheds = {}
    for k, var in enumerate(problem.vars):
        ob = sol.assign[k]
        tiles = [v[1] for (i, o), v in sorted(var.costs.items(), key=lambda kv: kv[1][0]) if o == ob and v[1]]
        scheds[var.node] = tiles[0] if tiles else _schedule_for_ob(nodes[var.node], g, target, ob)
    return GlobalPlan(problem, sol, scheds)


def schedule_fn(plan: GlobalPlan, target: Target, threads: int, costs: Costs):
    """The layout pass's ``schedules`` callback for mode "global": the plan's output block and
    tile, and the input block that is cheapest given the block that actually arrives."""
    index = {v.node: k for k, v in enumerate(plan.problem.vars)}

    def lookup(node: Node, g: Graph, in_block: int) -> tuple[NchwcSchedule, str] | None:
        k = index.get(node.name)
        if k is None:
            return None
        s = plan.schedules[node.name]
        xs = _shape(g, node.inputs[0])

        def tcost(a: int, b: int) -> float:
            t = costs.transform(xs, a, b)
            return _estimate_transform(xs) if t is None else t

        ib = plan.problem.choose_ib(k, in_block, s.oc_bn, tcost)
        var = plan.problem.vars[k]
        tile = var.costs.get((ib, s.oc_bn), (0.0, None))[1] or s
        return NchwcSchedule(s.oc_bn, tile.reg_n, tile.oc_blocks, tile.unroll_ker, ib, tile.ic_chunk), "forced"

    return lookup


def global_schedules(g: Graph, target: Target, threads: int, db, force_fallback: frozenset[str] = frozenset()):
    """The compiler's entry: solve with the database's costs; returns the pass's callback."""
    costs = DBCosts(db, target, threads) if db is not None else _NoCosts()
    plan = plan_global(g, target, threads, costs, force_fallback=force_fallback)
    return schedule_fn(plan, target, threads, costs)


class _NoCosts:
    def conv(self, node: Node, g: Graph, ib: int, ob: int) -> None:
        return None

    def transform(self, shape: tuple[int, ...], src: int, dst: int) -> None:
        return None


__all__ = ["DBCosts", "GlobalPlan", "LayoutProblem", "Solution", "build_problem", "global_schedules", "plan_global",
           "schedule_fn", "solve", "solve_dp", "solve_greedy"]
