"""`smelt profile`'s backend: the instrumented build, its counters and the report.

Timing assertions are deliberately loose (the machine is shared): the checks are about structure
(one row per planned node, in order, every time positive), the accounting identity (steps tile
their block), and the ordinary build staying free of instrumentation.
"""

from __future__ import annotations

import json
import re

import numpy as np
import onnx
import pytest
from helpers import const, make_model, tensor
from onnx import helper

import smelt
from smelt.bench.profile import ProfileReport, op_class, run_profile
from smelt.codegen.toolchain import RUNTIME_HEADER
from smelt.errors import SmeltError
from smelt.runtime.artifact import ArtifactPlan, NativeBlockEntry

RNG = np.random.default_rng(7)


def _tiny() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """3x3 conv (bias + fused Relu), 1x1 conv, ai.onnx.ml Binarizer (no native template: a
    fallback node), then Flatten and Gemm (a second native block)."""

    def w(*shape):
        return RNG.standard_normal(shape).astype(np.float32) * 0.2

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv3x3"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv1x1"),
        helper.make_node("Binarizer", ["c2"], ["h"], name="cosh", domain="ai.onnx.ml", threshold=0.1),
        helper.make_node("Flatten", ["h"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wg", "bg"], ["y"], transB=1, name="fc"),
    ]
    inits = [const("w1", w(16, 3, 3, 3)), const("b1", w(16)), const("w2", w(8, 16, 1, 1)),
             const("wg", w(10, 8 * 12 * 12)), const("bg", w(10))]
    model = make_model(nodes, [tensor("x", [1, 3, 12, 12])], [tensor("y", [1, 10])], inits, name="tiny")
    model.opset_import.append(helper.make_opsetid("ai.onnx.ml", 3))
    return model, {"x": RNG.standard_normal((1, 3, 12, 12)).astype(np.float32)}


EXPECTED = [("conv3x3", "Conv"), ("conv1x1", "Conv"), ("LayoutTransform", "LayoutTransform"),
            ("cosh", "Binarizer"), ("flatten", "Flatten"), ("fc", "Gemm")]
# the Relu is fused into conv3x3; the convs write NCHW16c and the fallback Binarizer reads plain NCHW,
# so the layout pass puts one transform between them (its name is generated: compared by op)


def _ops(rows) -> list[tuple[str, str]]:
    return [("LayoutTransform", op) if op == "LayoutTransform" else (name, op) for name, op in rows]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _plan_nodes(plan: ArtifactPlan) -> list[tuple[str, str]]:
    out = []
    for st in plan.steps:
        if isinstance(st, NativeBlockEntry):
            for name, op in st.step_nodes:
                if not out or out[-1] != (name, op):
                    out.append((name, op))
        else:
            out.append((st.node, st.op))
    return out


@pytest.mark.parametrize("threads", [1, 2])
def test_report_rows_match_the_plan(cache, threads):
    model, feeds = _tiny()
    report = run_profile(model, feeds, threads=threads, rounds=10, warmup=1, settle=0.005, peak=False)
    plain = smelt.compile(model, threads=threads)
    plain.run(feeds)
    assert _ops((n.name, n.op) for n in report.nodes) == _ops(_plan_nodes(plain.plan)) == EXPECTED
    plain.close()
    assert report.threads == threads and report.calls == 10 and 1 <= report.typical_calls <= 10
    for n in report.nodes:
        assert n.ms > 0 and n.median_ms > 0, n
        assert len(n.busy_ms) == threads
    by = {n.name: n for n in report.nodes}
    assert by["cosh"].fallback and not by["conv3x3"].fallback
    assert by["cosh"].block is None and by["fc"].block == 1
    # FLOPs from smelt.ir.ops: 2 * outputs * (C/group * kernel volume)
    assert by["conv3x3"].flops == 2 * 16 * 12 * 12 * 3 * 9
    assert by["conv1x1"].flops == 2 * 8 * 12 * 12 * 16
    assert by["fc"].flops == 2 * 10 * 8 * 12 * 12
    assert by["conv3x3"].gflops and by["conv3x3"].gflops > 0
    assert by["cosh"].gflops is None
    # the template's own description of the schedule, not parsed from C
    assert "NCHW[x]c" in by["conv3x3"].schedule and "reg_n=" in by["conv3x3"].detail.get("blocking", "")
    assert "1x1 on flat rows" in by["conv1x1"].schedule
    assert by["conv3x3"].epilogue == ["bias", "Relu"]
    assert by["conv3x3"].layout.startswith("NCHW")
    assert by["fc"].op_class == "Gemm/MatMul" and by["conv3x3"].op_class == "Conv"
    assert sum(c.count for c in report.classes) == len(report.nodes)
    assert abs(sum(n.pct for n in report.nodes) - 100.0) < 1e-6
    assert report.node_sum_ms == pytest.approx(sum(n.ms for n in report.nodes))
    # nodes, pool dispatch and Python glue account for the instrumented calls exactly; the nodes
    # are most of it (loose: the glue around a tiny model's blocks is a fair share)
    assert report.node_sum_ms + report.dispatch_ms + report.glue_ms == pytest.approx(report.e2e_profiled_ms)
    assert 0.2 * report.e2e_profiled_ms < report.node_sum_ms <= report.e2e_profiled_ms
    assert report.dispatch_ms >= -1e-3 and report.glue_ms > 0
    assert report.e2e_ms > 0 and report.arena_bytes >= 0 and report.weights_bytes > 0
    assert report.peak_gflops is None and report.peak_note == "not requested"

    text = report.format_table()
    assert all(name in text for name, op in EXPECTED if op != "LayoutTransform")
    top = report.format_table(top=2)
    assert "top 2 of 6 nodes" in top


def test_outputs_html_png_json(cache, tmp_path):
    pytest.importorskip("matplotlib")
    model, feeds = _tiny()
    report = run_profile(model, feeds, threads=2, rounds=5, warmup=1, settle=0.005, peak=False)
    d = report.to_dict()
    text = json.dumps(d)  # JSON-serialisable as is
    assert json.loads(text)["nodes"][0]["name"] == "conv3x3"
    assert ProfileReport.from_dict(json.loads(text)).to_dict() == d
    page = report.write_html(tmp_path / "p.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page
    assert all(name in page for name, op in EXPECTED if op != "LayoutTransform")
    # self-contained: nothing fetched (XML namespace URIs in the inline SVG are only names)
    assert "<script" not in page and "<link" not in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    png = report.write_chart(tmp_path / "p.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_html_names_are_escaped(cache, tmp_path):
    pytest.importorskip("matplotlib")
    model, feeds = _tiny()
    model.graph.node[0].name = "<script>alert(1)</script>"
    report = run_profile(model, feeds, threads=1, rounds=2, warmup=0, settle=0.0, peak=False)
    page = report.write_html(tmp_path / "p.html").read_text()
    assert "<script>" not in page and "&lt;script&gt;" in page


def test_counters_api_and_block_accounting(cache):
    model, feeds = _tiny()
    m = smelt.compile(model, threads=2, profile=True)
    m.run(feeds)
    m.profile_reset()
    c0 = m.profile_counters()
    assert c0.calls == 0 and not c0.seconds.any() and not c0.busy.any() and not c0.block_seconds.any()
    for _ in range(4):
        m.run(feeds)
    c = m.profile_counters()
    assert c.calls == 4
    assert _ops((s.node, s.op) for s in c.steps) == EXPECTED
    assert (c.seconds > 0).all()
    assert c.busy.shape == (len(EXPECTED), m.plan.codegen_threads)
    assert (c.busy[:, 0] > 0).all()
    # a block's steps tile its entry's wall time, leaving only the pool's dispatch outside
    for k in range(len(c.block_seconds)):
        steps = sum(t for s, t in zip(c.steps, c.seconds, strict=True) if s.block == k)
        assert steps <= c.block_seconds[k] * 1.001 + 1e-6
        assert steps >= 0.3 * c.block_seconds[k]
    d = m.profile_counters() - c0
    assert d.calls == 4 and np.allclose(d.seconds, c.seconds)
    m.profile_reset()
    assert m.profile_counters().calls == 0
    m.close()


def test_plain_build_has_no_instrumentation(cache, monkeypatch):
    monkeypatch.setenv("SMELT_DEBUG", "1")  # keeps the generated C (source_path)
    model, feeds = _tiny()
    plain = smelt.compile(model, threads=2)
    prof = smelt.compile(model, threads=2, profile=True)
    plain.run(feeds)
    prof.run(feeds)
    np.testing.assert_array_equal(plain.run(feeds)[0], prof.run(feeds)[0])
    # separate cache entries: artifact and library
    assert plain.plan.profile is False and prof.plan.profile is True
    assert plain.source_path != prof.source_path and plain.plan.lib != prof.plan.lib
    header = RUNTIME_HEADER.read_text()
    plain_c = plain.source_path.read_text().replace(header, "")
    prof_c = prof.source_path.read_text().replace(header, "")
    assert "smelt_prof" not in plain_c and "SMELT_PROFILE" not in plain_c
    assert "#define SMELT_PROFILE 1" in prof_c and "smelt_prof_busy(" in prof_c
    with pytest.raises(AttributeError):
        plain._current().lib.smelt_profile_counters  # noqa: B018 - the symbol must not exist
    with pytest.raises(SmeltError, match="profile=True"):
        plain.profile_counters()
    # the plan records the schedule either way (plan.json is the same apart from "profile")
    info = plain.plan.steps[0].step_info
    assert info[0].schedule["template"] == "f32_conv_nchwc" and info[0].flops > 0
    plain.close()
    prof.close()


def test_multi_step_node_is_one_row(cache):
    """An LSTM renders several steps (projection GEMM, recurrence): one row, steps counted."""
    from smelt.frontend.zoo import get_model

    model = get_model("lstm-E16-H24-B2-T5")
    report = run_profile(model, threads=2, rounds=4, warmup=1, settle=0.005, peak=False)
    lstm = [n for n in report.nodes if n.op == "LSTM"]
    assert len(lstm) == 1 and lstm[0].steps >= 2 and lstm[0].op_class == "RNN"
    assert lstm[0].flops > 0 and "hoisted projection" in lstm[0].schedule


def test_op_class():
    assert op_class("Conv", {"algorithm": "depthwise direct"}) == "Conv (depthwise)"
    assert op_class("Conv", {"algorithm": "conv 1x1 as GEMM"}) == "Conv"
    assert op_class("MatMul") == "Gemm/MatMul"
    assert op_class("Add") == "Elementwise" and op_class("Relu") == "Elementwise"
    assert op_class("Reshape") == "Data movement"
    assert op_class("ReduceMean") == "Softmax/Reduce"
    assert op_class("Hardmax") == "Hardmax"


@pytest.mark.sanitize
def test_instrumented_build_clean_under_sanitizers(tmp_path):
    """The counters are indexed in C by step and thread: run the instrumented build under ASan."""
    from test_sanitize import _assert_clean, _run_child

    model, feeds = _tiny()
    onnx.save(model, str(tmp_path / "m.onnx"))
    np.savez(tmp_path / "feeds.npz", **feeds)
    proc = _run_child(f"""
        import numpy as np, smelt
        feeds = dict(np.load({str(tmp_path / 'feeds.npz')!r}))
        for threads in (1, 2):
            m = smelt.compile({str(tmp_path / 'm.onnx')!r}, threads=threads, profile=True)
            for _ in range(3):
                m.run(feeds)
            c = m.profile_counters()
            assert c.calls == 3 and (c.seconds > 0).all(), c
            m.profile_reset()
            m.close()
        """, tmp_path)
    _assert_clean(proc)
