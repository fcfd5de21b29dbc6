"""Local search: a tiny workload within a tiny budget writes records; the stored schedule
compiles and matches onnxruntime. No timing asserts (the machine is shared)."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import assert_close, ort_run
from tune_models import chain_model

import smelt
from smelt.frontend.onnx_import import load_model
from smelt.schedule.db import CONV_KIND, TuningDB
from smelt.target import detect
from smelt.tune import search
from smelt.tune.measure import ConvShape, measure_convs, measure_transforms

pytestmark = pytest.mark.skipif(detect().isa not in ("avx512", "avx2"), reason="NCHWc needs AVX2/AVX-512")


def test_measure_many_schedules_in_one_library(tune_env):
    target = detect()
    shape = ConvShape(1, 16, 6, 9, 32, 3, 3, pt=1, pl=1, pb=1, pr=1)
    g, node = search.probe(shape, 16)
    default, queue = search.ordered_candidates(node, g, target)
    entries = [(16, default), (8, default)] + [(16, s) for s in queue[:3]]
    t = measure_convs(shape, entries, 1, target)
    assert len(t.seconds) == len(entries) and all(s > 0 for s in t.seconds) and t.calls >= 5
    tr = measure_transforms([(1, 16, 6, 9, 1, 16), (1, 16, 6, 9, 16, 8), (1, 16, 6, 9, 8, 1)], 1, target)
    assert len(tr) == 3 and all(s > 0 for s in tr)


def test_tune_writes_records_and_the_schedule_runs(tune_env, monkeypatch):
    target = detect()
    model, feeds = chain_model()
    g = search.lower_for_tuning(load_model(model), 1, target)
    tasks = search.collect_tasks([("chain", g)], 1, target)
    # one task per direct conv: all three on AVX-512; on AVX2 the 3x3 32->32 runs as Winograd
    direct = [n for n in g.nodes if n.op == "Conv" and n.schedule.algorithm == "direct"]
    assert len(tasks) == len(direct) >= 2 and all(t.models == ["chain"] for t in tasks)
    # conv2 reads its producer's block, and every other block the target offers is tried as an
    # alternate input block (AVX-512: 16 and 8; AVX2 has only 8, so no alternate there)
    blocks = search.oc_block_choices(32, target)
    assert any(t.ibs[0] > 1 and sorted(t.ibs) == sorted(blocks) for t in tasks), [t.ibs for t in tasks]
    monkeypatch.setattr(search, "MARGIN", -1.0)  # store even if the default wins: we test the plumbing
    db = TuningDB(tune_env)
    report = search.tune_tasks(tasks, 8.0, 1, target, db, transforms=False)
    assert report.results and len(report.results) + len(report.skipped) == len(tasks)
    res = report.results[0]
    assert res.tried >= 3 and res.default_s > 0 and res.best_s <= res.default_s
    assert res.stored and set(res.schemes) == set(res.task.ibs)
    rec = db.record(CONV_KIND, res.task.key(res.task.ibs[0]), target.key())
    assert rec is not None and rec.config == res.best.to_dict()
    assert any(True for _ in db.records(search.SCHEME_KIND))
    # the compiler picks the record up (the fingerprint changed) and the result is right
    compiled = smelt.compile(model, threads=1)
    blockings = [i.schedule.get("blocking", "") for i in compiled.plan.step_infos() if i.op == "Conv"]
    b = res.best
    assert any(f"oc_bn={b.oc_bn} " in x and f"reg_n={b.reg_n} " in x and f"oc_blocks={b.oc_blocks} " in x
               for x in blockings), (b, blockings)
    assert_close(compiled.run(feeds), ort_run(model, feeds))


def test_budget_exhausted_skips_and_reports(tune_env):
    target = detect()
    model, _ = chain_model()
    tasks = search.collect_tasks([("chain", search.lower_for_tuning(load_model(model), 1, target))], 1, target)
    report = search.tune_tasks(tasks, 0.5, 1, target, None, transforms=False)
    assert not report.results and len(report.skipped) == len(tasks)


def test_winograd_convs_are_not_tuned():
    """A conv that runs as Winograd has no direct schedule to tune: graph_tasks leaves it out
    (the 3x3 32->32 conv on a 14x16 plane), and keeps the others; with Winograd off it is in."""
    target = detect()
    if target.isa not in ("avx512", "avx2"):
        pytest.skip("Winograd needs AVX2 or AVX-512")
    # (16 input channels: conv1 reads the plain graph input as it comes, no Winograd)
    model, _ = chain_model(c=16, hw=(14, 16))
    g = search.lower_for_tuning(load_model(model), 1, target)
    names = [n.name for n, _ in search.graph_tasks(g, 1, target)]
    assert "conv2" not in names and {"conv1", "conv3"} <= set(names), names
    conv2 = next(n for n in g.nodes if n.name == "conv2")
    assert conv2.schedule.algorithm == "winograd"
    conv2.schedule = dataclasses.replace(conv2.schedule, algorithm="direct")
    assert "conv2" in [n.name for n, _ in search.graph_tasks(g, 1, target)]


def test_measuring_a_winograd_eligible_shape_times_the_direct_kernel(tune_env):
    """The harness feeds graph inputs straight to the convs (not 64-byte aligned) and means to
    time direct schedules: a Winograd-eligible workload must run direct (it crashed on an
    aligned load once) and give one time per entry."""
    target = detect()
    shape = ConvShape(1, 32, 14, 14, 32, 3, 3, pt=1, pl=1, pb=1, pr=1)
    g, node = search.probe(shape, 16)
    default, queue = search.ordered_candidates(node, g, target)
    t = measure_convs(shape, [(16, default)] + [(16, s) for s in queue[:2]], 2, target)
    assert len(t.seconds) == 3 and all(s > 0 for s in t.seconds)
