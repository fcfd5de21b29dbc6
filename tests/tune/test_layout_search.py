"""Global layout search: the DP is exact on a chain, the greedy fallback gives a valid plan on
a branchy graph, and layout="global" compiles models that match onnxruntime."""

from __future__ import annotations

import pytest
from helpers import assert_close, ort_run
from tune_models import branchy_model, chain_model

import smelt
from smelt.codegen.plan import build_plan
from smelt.codegen.registry import find_template
from smelt.frontend.onnx_import import load_model, to_ir
from smelt.ir.graph import PLAIN, layout_block
from smelt.options import CompileOptions
from smelt.passes.pipeline import run_passes
from smelt.schedule import layout_search as ls
from smelt.schedule.conv import NchwcSchedule, prefers_gemm
from smelt.schedule.layout import plan_layouts
from smelt.target import detect

pytestmark = pytest.mark.skipif(detect().isa != "avx512", reason="the 8/16 block choice needs AVX-512")


class Synthetic:
    """Made-up costs: per conv name, (ib, ob) -> seconds; transforms cost ``t`` each."""

    def __init__(self, table: dict[str, dict[tuple[int, int], float]], t: float) -> None:
        self.table, self.t = table, t

    def conv(self, node, g, ib, ob):
        c = self.table.get(node.name, {}).get((ib, ob))
        return None if c is None else (c, NchwcSchedule(ob, 4, 1, True))

    def transform(self, shape, src, dst):
        return self.t


def _graph(model):
    return run_passes(to_ir(load_model(model)), 1)


def test_dp_finds_the_optimum_of_a_chain():
    target = detect()
    model, _ = chain_model()
    g = _graph(model)
    # conv2 is much faster writing 8-blocks, and conv3 reading 8-blocks: worth the transform of
    # the residual operand (conv1 writes 16 cheaper, but 8 saves that transform)
    table = {
        "conv1": {(1, 16): 1.0, (1, 8): 1.3},
        "conv2": {(16, 16): 5.0, (16, 8): 3.0, (8, 16): 5.0, (8, 8): 2.9},
        "conv3": {(16, 16): 2.0, (8, 16): 1.0, (16, 8): 2.0, (8, 8): 1.1},
    }
    costs = Synthetic(table, 0.5)
    prob = ls.build_problem(g, target, 1, costs)
    assert [v.node for v in prob.vars] == ["conv1", "conv2", "conv3"]
    dp = ls.solve_dp(prob)
    brute = ls.brute_force(prob)
    assert dp.method == "dp" and dp.cost == pytest.approx(brute.cost)
    assert dp.assign == brute.assign
    # by hand: conv1 8 (1.3), conv2 8 from 8 (2.9), residual already 8, conv3 reads 8 -> 16 (1.0),
    # output transform 16 -> plain (0.5)
    assert dp.assign == {0: 8, 1: 8, 2: 16} and dp.cost == pytest.approx(1.3 + 2.9 + 1.0 + 0.5)
    # with free transforms each conv takes its own fastest block
    free = ls.solve_dp(ls.build_problem(g, target, 1, Synthetic(table, 0.0)))
    assert free.cost == pytest.approx(1.0 + 2.9 + 1.0)


def test_greedy_fallback_on_a_branchy_graph_gives_a_valid_plan():
    target = detect()
    model, _ = branchy_model()
    g = _graph(model)
    names = [n.name for n in g.nodes if n.op == "Conv"]
    table = {n: {(ib, ob): 1.0 + 0.1 * ((i + ob) % 3) for ib in (8, 16) for ob in (8, 16)} for i, n in enumerate(names)}
    costs = Synthetic(table, 0.3)
    prob = ls.build_problem(g, target, 1, costs)
    assert ls.frontier_states(prob) > 4
    sol = ls.solve(prob, max_states=4)  # forces the fallback
    assert sol.method == "greedy+icm"
    assert set(sol.assign) == set(range(len(prob.vars)))
    assert all(sol.assign[k] in v.obs for k, v in enumerate(prob.vars))
    exact = ls.solve(prob)
    assert exact.method == "dp" and exact.cost <= sol.cost + 1e-12
    plan = ls.plan_global(g, target, 1, costs, max_states=4)
    planned = plan_layouts(g, target, CompileOptions(1, layout="global"), schedules=ls.schedule_fn(plan, target, 1, costs))
    for node in planned.nodes:  # every node has a native template under the planned layouts
        assert find_template(node, planned)[0] is not None, node
        if node.op == "Conv" and node.name in plan.schedules:
            assert layout_block(planned.values[node.outputs[0]].layout) == plan.schedules[node.name].oc_bn
        elif node.op == "Conv":  # the per-layer algorithm choice kept it a plain GEMM
            assert prefers_gemm(node, planned, target, CompileOptions(1)), node.name
            assert planned.values[node.outputs[0]].layout == PLAIN
    assert not build_plan(planned).fallback_steps()


@pytest.mark.parametrize("which", ["chain", "branchy"])
def test_global_mode_matches_onnxruntime(which, tune_env):
    from smelt.schedule.conv import workload
    from smelt.schedule.db import TuningDB
    from smelt.target import detect as _detect
    from smelt.tune.search import SCHEME_KIND

    model, feeds = chain_model() if which == "chain" else branchy_model(modules=2)
    target = _detect()
    g = _graph(model)
    db = TuningDB(tune_env)
    # make 8-blocks look much faster for the first conv: the plan must then carry NCHW8c values
    conv = next(n for n in g.nodes if n.op == "Conv")
    for i in (1, 8, 16):
        db.store(SCHEME_KIND, {**workload(conv, g, i, 1), "ob": 8}, target.key(), NchwcSchedule(8, 5, 2).to_dict(), 1e-6)
        db.store(SCHEME_KIND, {**workload(conv, g, i, 1), "ob": 16}, target.key(), NchwcSchedule(16, 4).to_dict(), 1.0)
    compiled = smelt.compile(model, threads=1, layout="global")
    blockings = [i.schedule.get("blocking", "") for i in compiled.plan.step_infos() if i.op == "Conv"]
    assert any("oc_bn=8 " in b and "reg_n=5 " in b for b in blockings), blockings
    assert_close(compiled.run(feeds), ort_run(model, feeds))



def test_global_without_costs_keeps_the_default_schedules():
    """With no measured costs the search confirms 16-channel blocks, and each conv runs its
    default schedule whole: the ic-outer chunk of a small plane included (it was dropped once,
    making layout="global" slower than "propagate" on ResNet-50's stages 3 and 4)."""
    import numpy as np
    from helpers import const, make_model, tensor
    from onnx import helper

    from smelt.schedule.conv import default_schedule

    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], kernel_shape=[1, 1]),
             helper.make_node("Conv", ["a", "w1"], ["b"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["b", "w2"], ["y"], kernel_shape=[1, 1])]
    inits = [const("w0", rng.standard_normal((256, 64, 1, 1)).astype(np.float32)),
             const("w1", rng.standard_normal((256, 256, 3, 3)).astype(np.float32)),
             const("w2", rng.standard_normal((512, 256, 1, 1)).astype(np.float32))]
    model = make_model(nodes, [tensor("x", [1, 64, 7, 7])], [tensor("y", None)], inits)
    target = detect()
    g = _graph(model)
    lookup = ls.global_schedules(g, target, 1, None)
    planned = plan_layouts(_graph(model), target, CompileOptions(1))
    for node in planned.nodes:
        if node.op != "Conv":
            continue
        want = default_schedule(node, planned, target)
        ib = layout_block(planned.values[node.inputs[0]].layout)
        found = lookup(node, planned, ib)
        assert found is not None, node.name
        got, _source = found
        assert got.oc_bn == want.oc_bn and got.ic_chunk == want.ic_chunk, (node.name, got, want)
        assert (got.reg_n, got.oc_blocks) == (want.reg_n, want.oc_blocks), (node.name, got, want)
    assert any(default_schedule(n, planned, target).ic_chunk for n in planned.nodes if n.op == "Conv")
