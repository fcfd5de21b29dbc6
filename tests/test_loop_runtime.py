"""A Loop with a run-time trip count or condition runs its body compiled (runtime/loop.py), with
onnxruntime's answers: carried values, scan outputs, the iteration number, outer values, Loop-
invariant carried values (constant or not), an early stop, zero iterations, and carried shapes
that keep changing (the reference takes over)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import assert_close, const, make_model, ort_run, tensor
from onnx import TensorProto, helper

import smelt
from smelt.passes import unroll_loops
from smelt.runtime.loop import MAX_BODY_SHAPES, NativeLoopRunner


@pytest.fixture(autouse=True)
def _loops_stay_loops(monkeypatch):
    """These tests are about the run-time Loop runner: a trip count fed as an input is specialized
    on, and ``unroll_loops`` would unroll such a Loop into its body once per iteration instead."""
    monkeypatch.setattr(unroll_loops, "MAX_UNROLLED_NODES", 0)

RNG = np.random.default_rng(11)
D = 16


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path / "cache"))


def _decoder(with_trip: bool = True, with_cond: bool = True) -> object:
    """h <- tanh(h W + b + 0.01 i) while sum(h) < limit (and i < M): b is computed before the
    Loop (an outer run-time value), W an outer constant; W2 (constant) and s (computed) are
    carried unchanged; scan outputs: h each step and its max."""
    body = helper.make_graph(
        [helper.make_node("MatMul", ["h_in", "W"], ["hw"]),
         helper.make_node("Add", ["hw", "b"], ["hb"]),
         helper.make_node("Cast", ["it"], ["itf"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["itf", "step"], ["its"]),
         helper.make_node("Add", ["hb", "its"], ["pre"]),
         helper.make_node("MatMul", ["pre", "w2_in"], ["pre2"]),
         helper.make_node("Mul", ["pre2", "s_in"], ["pre3"]),
         helper.make_node("Tanh", ["pre3"], ["h_out"]),
         helper.make_node("ReduceSum", ["h_out"], ["tot"], keepdims=0),
         helper.make_node("Less", ["tot", "limit"], ["cond_out"]),
         helper.make_node("ReduceMax", ["h_out"], ["hmax"], keepdims=0),
         helper.make_node("Identity", ["h_out"], ["h_scan"])],
        "body",
        [tensor("it", [], TensorProto.INT64), tensor("cond_in", [], TensorProto.BOOL), tensor("h_in", [1, D]),
         tensor("w2_in", [D, D]), tensor("s_in", [1])],
        [tensor("cond_out", [], TensorProto.BOOL), tensor("h_out", [1, D]), tensor("w2_in", [D, D]),
         tensor("s_in", [1]), tensor("h_scan", [1, D]), tensor("hmax", [])],
        initializer=[const("step", np.array(0.01, np.float32))])
    loop = helper.make_node("Loop", ["M" if with_trip else "", "c0" if with_cond else "", "x", "W2", "s"],
                            ["h", "w2_out", "s_out", "hs", "maxes"], name="decode", body=body)
    nodes = [helper.make_node("Relu", ["x"], ["b"], name="bias"),
             helper.make_node("ReduceMean", ["x"], ["m"], keepdims=0, name="mean"),
             helper.make_node("Abs", ["m"], ["ma"], name="abs"),
             helper.make_node("Add", ["ma", "one"], ["s1"], name="plus1"),
             helper.make_node("Reshape", ["s1", "shape1"], ["s"], name="scale"),
             loop]
    inputs = [tensor("x", [1, D]), tensor("limit", [])]
    inputs += [tensor("M", [], TensorProto.INT64)] if with_trip else []
    inputs += [tensor("c0", [], TensorProto.BOOL)] if with_cond else []
    w = RNG.standard_normal((D, D)).astype(np.float32) * 0.4
    w2 = (np.eye(D) + RNG.standard_normal((D, D)) * 0.1).astype(np.float32)
    return make_model(nodes, inputs, [tensor("h", [1, D]), tensor("hs", None), tensor("maxes", None)],
                      [const("W", w), const("W2", w2), const("one", np.array(1.0, np.float32)),
                       const("shape1", np.array([1], np.int64))], opset=17)


def _runner(compiled) -> NativeLoopRunner:
    art = compiled._current()
    found = [st[1] for st in art.steps if st[0] == "fallback" and isinstance(st[1], NativeLoopRunner)]
    assert len(found) == 1, art.steps
    return found[0]


def _check(model, feeds, threads: int = 1, isa: str | None = None):
    got = smelt.compile(model, threads=threads, isa=isa)
    want = ort_run(model, feeds, threads)
    out = got.run(feeds)
    assert_close(out, want, rel=1e-5)
    return got


@pytest.mark.parametrize("threads", [1, 2])
def test_trip_count_and_early_stop_match_onnxruntime(threads):
    model = _decoder()
    x = RNG.standard_normal((1, D)).astype(np.float32)
    m = smelt.compile(model, threads=threads)
    for trip, limit in [(1, 1e9), (7, 1e9), (40, 1e9), (40, 2.0), (40, -1e9)]:
        feeds = {"x": x, "limit": np.array(limit, np.float32), "M": np.array(trip, np.int64),
                 "c0": np.array(True)}
        want = ort_run(model, feeds, threads)
        assert_close(m.run(feeds), want, rel=1e-5)
    runner = _runner(m)
    assert not runner.use_reference, runner.reason
    # the body runs native: every node of it, the carried weights as constants
    # one compiled body for the variants (a trip count fed as an input is specialized on)
    bodies = list(m._loop_bodies.values())
    assert len(bodies) == 1 and bodies[0].fallback_nodes == []
    assert runner.loop.invariant == [1, 2] and runner.loop.fed_invariant == [2]
    [entry] = m.fallback_report
    assert entry["node"] == "decode" and "body runs compiled by smelt" in entry["reason"], entry


@pytest.mark.parametrize("isa", ["avx2", "scalar"])
def test_capped_isa(isa):
    from smelt.target import detect

    if isa not in detect().isa_caps():
        pytest.skip(f"the host cannot run {isa}")
    feeds = {"x": RNG.standard_normal((1, D)).astype(np.float32), "limit": np.array(3.0, np.float32),
             "M": np.array(25, np.int64), "c0": np.array(True)}
    _check(_decoder(), feeds, threads=2, isa=isa)


def test_zero_iterations_and_a_false_condition():
    model = _decoder()
    x = RNG.standard_normal((1, D)).astype(np.float32)
    m = smelt.compile(model, threads=1)
    for trip, cond in [(0, True), (5, False)]:
        feeds = {"x": x, "limit": np.array(1e9, np.float32), "M": np.array(trip, np.int64), "c0": np.array(cond)}
        want = ort_run(model, feeds)
        got = m.run(feeds)
        assert_close(got[:1], want[:1], rel=1e-6)
        assert [(g.shape, g.dtype) for g in got[1:]] == [(w.shape, w.dtype) for w in want[1:]]
        assert [w.shape for w in want[1:]] == [(0, 1, D), (0,)]


def test_while_loop_without_trip_count():
    model = _decoder(with_trip=False)
    feeds = {"x": RNG.standard_normal((1, D)).astype(np.float32), "limit": np.array(4.0, np.float32),
             "c0": np.array(True)}
    m = _check(model, feeds)
    assert not _runner(m).use_reference


def test_for_loop_without_condition():
    model = _decoder(with_cond=False)
    feeds = {"x": RNG.standard_normal((1, D)).astype(np.float32), "limit": np.array(1e9, np.float32),
             "M": np.array(9, np.int64)}
    _check(model, feeds, threads=2)


def test_growing_carried_shape_goes_to_the_reference():
    """seq <- concat(seq, seq[-1:] + 1): a new carried shape every iteration; past MAX_BODY_SHAPES
    the reference runs the node (this call and the next), with the same answer."""
    body = helper.make_graph(
        [helper.make_node("Slice", ["seq_in", "minus1", "big", "zero"], ["last"]),
         helper.make_node("Add", ["last", "one"], ["nxt"]),
         helper.make_node("Concat", ["seq_in", "nxt"], ["seq_out"], axis=0),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [tensor("it", [], TensorProto.INT64), tensor("cond_in", [], TensorProto.BOOL), tensor("seq_in", ["n", 3])],
        [tensor("cond_out", [], TensorProto.BOOL), tensor("seq_out", ["m", 3])],
        initializer=[const("minus1", np.array([-1], np.int64)), const("big", np.array([1 << 30], np.int64)),
                     const("zero", np.array([0], np.int64)), const("one", np.array(1.0, np.float32))])
    loop = helper.make_node("Loop", ["M", "", "x"], ["seq"], name="grow", body=body)
    model = make_model([loop], [tensor("x", [1, 3]), tensor("M", [], TensorProto.INT64)],
                       [tensor("seq", None)], opset=17)
    m = smelt.compile(model, threads=1)
    for _ in range(2):  # one trip count: one variant (a trip count fed as an input is specialized on)
        feeds = {"x": RNG.standard_normal((1, 3)).astype(np.float32), "M": np.array(MAX_BODY_SHAPES + 3, np.int64)}
        assert_close(m.run(feeds), ort_run(model, feeds), rel=1e-6)
        runner = _runner(m)
        assert runner.use_reference and "changed" in runner.reason


def test_a_loop_carrying_a_sequence_stays_with_the_reference():
    """A sequence is not a value a compiled body takes (onnx's test_loop13_seq): the reference
    runs the node, with onnxruntime's answer, and the report says why."""
    body = helper.make_graph(
        [helper.make_node("Unsqueeze", ["x", "axes"], ["xu"]),
         helper.make_node("SequenceInsert", ["seq_in", "xu"], ["seq_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [tensor("it", [], TensorProto.INT64), tensor("cond_in", [], TensorProto.BOOL),
         helper.make_tensor_sequence_value_info("seq_in", TensorProto.FLOAT, None)],
        [tensor("cond_out", [], TensorProto.BOOL),
         helper.make_tensor_sequence_value_info("seq_out", TensorProto.FLOAT, None)],
        initializer=[const("axes", np.array([0], np.int64))])
    nodes = [helper.make_node("SequenceEmpty", [], ["seq0"], dtype=TensorProto.FLOAT, name="empty"),
             helper.make_node("Loop", ["M", "", "seq0"], ["seq"], name="collect", body=body),
             helper.make_node("ConcatFromSequence", ["seq"], ["y"], axis=0, name="join")]
    model = make_model(nodes, [tensor("x", [3]), tensor("M", [], TensorProto.INT64)], [tensor("y", None)], opset=17)
    feeds = {"x": RNG.standard_normal(3).astype(np.float32), "M": np.array(4, np.int64)}
    m = smelt.compile(model, threads=1)
    assert_close(m.run(feeds), ort_run(model, feeds), rel=0)
    runner = _runner(m)
    assert runner.use_reference and "sequences" in runner.reason
    assert any("sequences" in e["reason"] for e in m.fallback_report if e["node"] == "collect")


L = 12  # encoder positions of the attention decoder below


def _attention_decoder(assign: str = "squeeze_add_zero") -> object:
    """h <- tanh(h + att' enc), att = softmax(tanh(relu(enc Wk) + h Wq) v): each step attends over
    keys relu(enc Wk), a
    product of the outer value ``enc`` (carried through the loop as paddle2onnx carries it, by
    the assignment ``assign``) and a weight: Loop-invariant work the runner hoists. ``assign``:
    "squeeze_add_zero" (paddle2onnx's Squeeze(Add(Unsqueeze(enc), 0))), "identity", or the near
    miss "add_one", which makes enc change and so keeps everything in the body."""
    spell = {
        "squeeze_add_zero": [helper.make_node("Unsqueeze", ["enc_in", "ax0"], ["enc_u"]),
                             helper.make_node("Add", ["enc_u", "zero"], ["enc_a"]),
                             helper.make_node("Squeeze", ["enc_a", "ax0"], ["enc_out"])],
        "identity": [helper.make_node("Identity", ["enc_in"], ["enc_out"])],
        "add_one": [helper.make_node("Unsqueeze", ["enc_in", "ax0"], ["enc_u"]),
                    helper.make_node("Add", ["enc_u", "onef"], ["enc_a"]),
                    helper.make_node("Squeeze", ["enc_a", "ax0"], ["enc_out"])],
    }[assign]
    body = helper.make_graph(
        [helper.make_node("MatMul", ["enc_in", "Wk"], ["keys"]),         # [L, D]: invariant
         helper.make_node("Relu", ["keys"], ["keys_r"]),                 # invariant too
         helper.make_node("MatMul", ["h_in", "Wq"], ["q"]),              # [1, D]
         helper.make_node("Add", ["keys_r", "q"], ["kq"]),
         helper.make_node("Tanh", ["kq"], ["e"]),
         helper.make_node("MatMul", ["e", "v"], ["score"]),              # [L, 1]
         helper.make_node("Softmax", ["score"], ["att"], axis=0),
         helper.make_node("Transpose", ["att"], ["att_t"], perm=[1, 0]),
         helper.make_node("MatMul", ["att_t", "enc_in"], ["ctx"]),       # [1, D]
         helper.make_node("Add", ["ctx", "h_in"], ["pre"]),
         helper.make_node("Tanh", ["pre"], ["h_out"]),
         helper.make_node("ReduceSum", ["h_out"], ["tot"], keepdims=0),
         helper.make_node("Less", ["tot", "limit"], ["cond_out"]),
         *spell],
        "body",
        [tensor("it", [], TensorProto.INT64), tensor("cond_in", [], TensorProto.BOOL), tensor("h_in", [1, D]),
         tensor("enc_in", [L, D])],
        [tensor("cond_out", [], TensorProto.BOOL), tensor("h_out", [1, D]), tensor("enc_out", [L, D])],
        initializer=[const("ax0", np.array([0], np.int64)), const("zero", np.array(0.0, np.float32)),
                     const("onef", np.array(1.0, np.float32))])
    nodes = [helper.make_node("Relu", ["x"], ["enc"], name="encoder"),
             helper.make_node("Loop", ["M", "", "h0", "enc"], ["h", "enc_last"], name="decode", body=body)]
    inits = [const("Wk", (RNG.standard_normal((D, D)) * 0.3).astype(np.float32)),
             const("Wq", (RNG.standard_normal((D, D)) * 0.3).astype(np.float32)),
             const("v", (RNG.standard_normal((D, 1)) * 0.3).astype(np.float32))]
    return make_model(nodes, [tensor("x", [L, D]), tensor("h0", [1, D]), tensor("limit", []),
                              tensor("M", [], TensorProto.INT64)],
                      [tensor("h", [1, D]), tensor("enc_last", [L, D])], inits, opset=17)


def _attention_feeds(steps: int) -> dict[str, np.ndarray]:
    return {"x": RNG.standard_normal((L, D)).astype(np.float32), "h0": RNG.standard_normal((1, D)).astype(np.float32),
            "limit": np.array(1e9, np.float32), "M": np.array(steps, np.int64)}


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("assign", ["squeeze_add_zero", "identity"])
def test_loop_invariant_work_is_hoisted_out_of_the_iterations(assign, threads):
    """The keys (MatMul and Relu of the carried-through encoder output) run once per call in the
    prologue; the answers are onnxruntime's, for several trip counts on one compiled model."""
    model = _attention_decoder(assign)
    m = smelt.compile(model, threads=threads)
    for steps in (1, 5, 17):
        feeds = _attention_feeds(steps)
        assert_close(m.run(feeds), ort_run(model, feeds, threads), rel=1e-5)
    runner = _runner(m)
    assert not runner.use_reference, runner.reason
    lp = runner.loop
    assert lp.invariant == [1] and lp.hoisted_nodes == 2 and lp.hoisted == ["keys_r"], (lp.invariant, lp.hoisted)
    body_ops = [n.op_type for n in lp.model.graph.node]
    assert body_ops.count("MatMul") == 3 and "Relu" not in body_ops  # Wq, v and the context
    assert "loop-invariant nodes run once per call" in runner.describe()


def test_a_changing_carried_value_is_not_hoisted():
    """enc + 1 each iteration: not invariant, nothing moves, the answer still onnxruntime's."""
    model = _attention_decoder("add_one")
    m = smelt.compile(model, threads=1)
    feeds = _attention_feeds(6)
    assert_close(m.run(feeds), ort_run(model, feeds), rel=1e-5)
    lp = _runner(m).loop
    assert lp.invariant == [] and lp.prologue is None and lp.hoisted_nodes == 0


def test_pass_through_chains():
    from smelt.runtime.loop import _passes_through

    def chain(*nodes):
        return helper.make_graph(list(nodes), "b", [tensor("x", [2, 3])], [tensor("y", [2, 3])],
                                 initializer=[const("a0", np.array([0], np.int64)), const("a1", np.array([1], np.int64)),
                                              const("z", np.array(0.0, np.float32)),
                                              const("z1", np.array([0.0], np.float32)),
                                              const("one", np.array(1.0, np.float32)),
                                              const("two", np.array(2.0, np.float32))])

    u0, s0 = helper.make_node("Unsqueeze", ["x", "a0"], ["u"]), helper.make_node("Squeeze", ["t", "a0"], ["y"])
    assert _passes_through(chain(u0, helper.make_node("Add", ["u", "z"], ["t"]), s0), "y", "x")
    assert _passes_through(chain(u0, helper.make_node("Add", ["z1", "u"], ["t"]), s0), "y", "x")  # inside: [1] ok
    assert _passes_through(chain(helper.make_node("Mul", ["x", "one"], ["y"])), "y", "x")
    assert _passes_through(chain(helper.make_node("Identity", ["x"], ["y"])), "y", "x")
    assert not _passes_through(chain(u0, helper.make_node("Add", ["u", "two"], ["t"]), s0), "y", "x")
    assert not _passes_through(chain(u0, helper.make_node("Sub", ["z", "u"], ["t"]), s0), "y", "x")  # 0 - x
    assert not _passes_through(chain(helper.make_node("Add", ["x", "z1"], ["y"])), "y", "x")  # [1] may broadcast
    assert not _passes_through(chain(u0, helper.make_node("Identity", ["u"], ["t"]),
                                     helper.make_node("Squeeze", ["t", "a1"], ["y"])), "y", "x")  # other axis
    assert not _passes_through(chain(helper.make_node("Relu", ["x"], ["y"])), "y", "x")
