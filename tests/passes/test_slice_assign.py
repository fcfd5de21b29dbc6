"""``x[:, s:e] = v`` as paddle2onnx writes it (Slice -> Shape -> Expand, Range -> Reshape -> Tile,
ScatterElements) inside a Loop whose counter is the bound: passes/slice_assign.py turns it into a
Where over a position mask, so the body runs wholly native. Against onnxruntime over starts
before, at and past the buffer's ends (negative ones count from the end), widths 1 and 2, at 1
and 2 threads and every ISA the host runs; near misses keep the chain (and stay right)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import assert_close, const, make_model, ort_run, tensor
from onnx import TensorProto, helper

import smelt
from smelt.compiler import lower
from smelt.frontend.onnx_import import load_model
from smelt.ir.graph import Graph
from smelt.options import CompileOptions
from smelt.passes.slice_assign import slice_assign_as_where
from smelt.target import detect

RNG = np.random.default_rng(41)
B, D, C = 2, 9, 5  # the buffer [B, D, C]; positions along axis 1


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path / "cache"))


def _writer(width: int = 1, clamp_end: bool = True, delta: int = 1, reduction: str = "none",
            target: tuple[int, ...] = (1, -1, 1)) -> object:
    """A Loop that writes, for i = 0, 1, .. while i < limit, v_i = base * (i + 1) into buf[:, i + k] (or
    [i + k : i + k + width]), with paddle2onnx's nodes. ``clamp_end``: the end is
    min(D, start + width) as paddle2onnx writes it, else start + width."""
    body_nodes = [
        helper.make_node("Unsqueeze", ["it", "ax0"], ["it1"]),
        helper.make_node("Add", ["it1", "k"], ["start"]),
        helper.make_node("Add", ["start", "width"], ["start_w"]),
        helper.make_node("Shape", ["buf_in"], ["buf_shape"]),
        helper.make_node("Gather", ["buf_shape", "ax1"], ["extent"], axis=0),
        helper.make_node("Min", ["extent", "start_w"], ["end"]) if clamp_end else
        helper.make_node("Identity", ["start_w"], ["end"]),
        helper.make_node("Slice", ["buf_in", "start", "end", "ax1", "one"], ["window"]),
        helper.make_node("Shape", ["window"], ["window_shape"]),
        helper.make_node("Cast", ["it"], ["itf"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["itf", "onef"], ["itf1"]),
        helper.make_node("Mul", ["base", "itf1"], ["v"]),
        helper.make_node("Unsqueeze", ["v", "ax1"], ["v1"]),
        helper.make_node("Expand", ["v1", "window_shape"], ["update"]),
        helper.make_node("Squeeze", ["start"], ["start0"]),
        helper.make_node("Squeeze", ["end"], ["end0"]),
        helper.make_node("Range", ["start0", "end0", "delta"], ["ramp"]),
        helper.make_node("Reshape", ["ramp", "target"], ["ramp3"]),
        helper.make_node("Slice", ["window_shape", "z1", "one", "z1"], ["rep0"]),
        helper.make_node("Slice", ["window_shape", "two", "three", "z1"], ["rep2"]),
        helper.make_node("Concat", ["rep0", "one", "rep2"], ["reps"], axis=0),
        helper.make_node("Tile", ["ramp3", "reps"], ["index"]),
        helper.make_node("ScatterElements", ["buf_in", "index", "update"], ["buf_out"], axis=1,
                         **({} if reduction == "none" else {"reduction": reduction})),
        helper.make_node("Less", ["itf1", "limit"], ["cond_out"]),
    ]
    body = helper.make_graph(
        body_nodes, "body",
        [tensor("it", [], TensorProto.INT64), tensor("cond_in", [], TensorProto.BOOL), tensor("buf_in", [B, D, C])],
        [tensor("cond_out", [], TensorProto.BOOL), tensor("buf_out", [B, D, C])],
        initializer=[const("ax0", np.array([0], np.int64)), const("ax1", np.array([1], np.int64)),
                     const("one", np.array([1], np.int64)), const("z1", np.array([0], np.int64)),
                     const("two", np.array([2], np.int64)), const("three", np.array([3], np.int64)),
                     const("width", np.array([width], np.int64)), const("onef", np.array(1.0, np.float32)),
                     const("delta", np.array(delta, np.int64)), const("target", np.array(target, np.int64))])
    loop = helper.make_node("Loop", ["", "", "buf0"], ["buf"], name="decode", body=body)
    nodes = [helper.make_node("Relu", ["x"], ["buf0"], name="start_buffer"), loop]
    inputs = [tensor("x", [B, D, C]), tensor("base", [B, C]), tensor("limit", []),
              tensor("k", [1], TensorProto.INT64)]
    return make_model(nodes, inputs, [tensor("buf", [B, D, C])], opset=18)


def _feeds(k: int, steps: int) -> dict[str, np.ndarray]:
    return {"x": RNG.standard_normal((B, D, C)).astype(np.float32),
            "base": RNG.standard_normal((B, C)).astype(np.float32),
            "limit": np.array(steps + 0.5, np.float32), "k": np.array([k], np.int64)}


def _body(compiled) -> smelt.CompiledModel:
    (body,) = compiled._loop_bodies.values()
    return body


# (start offset k, steps): starts i + k from before -D to past D; clamped ends (paddle2onnx's)
CLAMPED = [(0, 4), (0, D), (0, D + 3), (3, 5), (D - 1, 2), (D, 2), (-D, 3), (-4, 2)]
# unclamped ends of width 2: negative windows that stay negative ([-5:-3] is two positions)
WIDE = [(0, D - 2), (-7, 3), (-D, 6), (2, 3)]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("isa", [cap for cap in detect().isa_caps() if cap != "avx2_vnni"])  # no integer code here
def test_paddle_slice_assignment_runs_native_and_matches_onnxruntime(threads, isa):
    model = _writer()
    m = smelt.compile(model, threads=threads, isa=isa)
    for k, steps in CLAMPED:
        feeds = _feeds(k, steps)
        assert_close(m.run(feeds), ort_run(model, feeds, threads), rel=1e-6)
    body = _body(m)
    assert body.fallback_nodes == []
    ops = [op for _, op in body.native_nodes]
    assert "Where" in ops and "ScatterElements" not in ops and "Range" not in ops, ops


def test_wider_windows_and_negative_starts():
    model = _writer(width=2, clamp_end=False)
    m = smelt.compile(model, threads=1)
    for k, steps in WIDE:
        feeds = _feeds(k, steps)
        assert_close(m.run(feeds), ort_run(model, feeds), rel=1e-6)
    assert _body(m).fallback_nodes == []


def _rewritten(model) -> bool:
    """Whether the pipeline turns the body's ScatterElements into a Where (the body alone,
    compiled as runtime/loop.py compiles it, with the counter an input)."""
    from smelt.runtime.loop import LoopBody

    loop = next(n for n in model.graph.node if n.op_type == "Loop")
    alone = make_model([loop], [tensor("buf0", [B, D, C]), tensor("base", [B, C]), tensor("limit", []),
                                tensor("k", [1], TensorProto.INT64)], [tensor("buf", [B, D, C])], opset=18)
    g: Graph = lower(load_model(LoopBody(alone).model), CompileOptions(threads=1))
    ops = {n.op for n in g.nodes}
    assert ("ScatterElements" in ops) != ("Where" in ops), ops
    return "Where" in ops


@pytest.mark.parametrize("near_miss", [dict(delta=2), dict(reduction="add"), dict(target=(1, 1, -1))],
                         ids=["range_step_2", "scatter_adds", "ramp_on_another_axis"])
def test_near_misses_keep_the_chain_and_stay_right(near_miss):
    model = _writer(**near_miss)
    assert not _rewritten(model)
    m = smelt.compile(model, threads=1)
    feeds = _feeds(0, 3)
    try:
        want = ort_run(model, feeds)
    except Exception:  # onnxruntime refuses it (mismatched index and update shapes): so does smelt
        with pytest.raises(Exception):  # noqa: B017
            m.run(feeds)
        return
    assert_close(m.run(feeds), want, rel=1e-6)


def test_the_pattern_is_rewritten_and_nothing_else():
    assert _rewritten(_writer())
    g = Graph()
    assert slice_assign_as_where(g) is g  # an empty graph: nothing to match
