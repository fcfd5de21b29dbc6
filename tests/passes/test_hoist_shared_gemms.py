"""An RNN unrolled into cells (torch's LSTMCell in a loop, as captcha-whisperer's CRNN exports it):
the input projections of every step share their weights and become one Gemm
(passes/hoist_shared_gemms.py); the recurrent ones, each reading the previous step's state, stay
apart. Against onnxruntime at every ISA, 1 and 2 threads, and against smelt without the pass;
near misses keep their Gemms."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import const, make_model, ort_run, tensor
from kernel_models import force_isa
from onnx import helper

import smelt
from smelt.compiler import lower
from smelt.frontend.onnx_import import load_model
from smelt.options import CompileOptions
from smelt.passes import pipeline

RNG = np.random.default_rng(37)


def _unrolled_rnn(steps: int = 5, k: int = 70, hidden: int = 24, rows: int = 1, bias_rows: int = 0,
                  other_weights_at: int | None = None, trans_a: bool = False, same_a_at: int | None = None,
                  backward: bool = False):
    """h_t = Tanh(Gemm(x_t, W_ih, b_ih) + Gemm(h_{t-1}, W_hh, b_hh)), x_t = Gather(X, t), the
    output Concat(h_1 .. h_T). ``bias_rows``: b_ih as [rows, H] (a bias per row: not one row);
    ``other_weights_at``: that step's input Gemm reads a copy of W_ih under another name;
    ``trans_a``: the input Gemms read x_t as [K, rows] with transA; ``same_a_at``: that step's
    input Gemm reads the step before's x; ``backward``: a second direction (two groups)."""
    w = lambda *s: (RNG.standard_normal(s) * 0.2).astype(np.float32)  # noqa: E731
    inits = [const("w_ih", w(hidden, k)), const("w_ih2", w(hidden, k)), const("w_hh", w(hidden, hidden)),
             const("b_ih", w(bias_rows, hidden) if bias_rows else w(hidden)), const("b_hh", w(hidden)),
             const("h0", np.zeros((rows, hidden), np.float32))]
    nodes, h, outs = [], "h0", []
    for t in range(steps):
        inits.append(const(f"i{t}", np.array(t, np.int64)))
        nodes.append(helper.make_node("Gather", ["X", f"i{t}"], [f"x{t}"], axis=0))
        a = f"x{t - 1}" if t == same_a_at else f"x{t}"  # [K, rows] with trans_a
        wname = "w_ih2" if t == other_weights_at else "w_ih"
        nodes += [helper.make_node("Gemm", [a, wname, "b_ih"], [f"gi{t}"], transB=1, transA=int(trans_a)),
                  helper.make_node("Gemm", [h, "w_hh", "b_hh"], [f"gh{t}"], transB=1),
                  helper.make_node("Add", [f"gi{t}", f"gh{t}"], [f"s{t}"]),
                  helper.make_node("Tanh", [f"s{t}"], [f"h{t + 1}"])]
        h = f"h{t + 1}"
        outs.append(h)
    if backward:  # a second direction over the same x_t, its own weights, steps reversed
        inits += [const("w_ih_b", w(hidden, k)), const("w_hh_b", w(hidden, hidden))]
        h = "h0"
        for t in reversed(range(steps)):
            nodes += [helper.make_node("Gemm", [f"x{t}", "w_ih_b", "b_ih"], [f"bgi{t}"], transB=1),
                      helper.make_node("Gemm", [h, "w_hh_b", "b_hh"], [f"bgh{t}"], transB=1),
                      helper.make_node("Add", [f"bgi{t}", f"bgh{t}"], [f"bs{t}"]),
                      helper.make_node("Tanh", [f"bs{t}"], [f"bh{t}"])]
            h = f"bh{t}"
            outs.append(h)
    nodes.append(helper.make_node("Concat", outs, ["Y"], axis=0))
    model = make_model(nodes, [tensor("X", [steps, k, rows] if trans_a else [steps, rows, k])], [tensor("Y", None)], inits)
    feeds = {"X": RNG.standard_normal([steps, k, rows] if trans_a else [steps, rows, k]).astype(np.float32)}
    return model, feeds


def _gemms(model) -> list:
    return [n for n in lower(load_model(model), CompileOptions(threads=1)).nodes if n.op == "Gemm"]


@pytest.mark.parametrize("isa", ["native", "avx2", "scalar"])
@pytest.mark.parametrize("rows", [1, 3])
def test_input_projections_become_one_gemm(isa, rows, monkeypatch, tmp_path):
    model, feeds = _unrolled_rnn(steps=7, rows=rows)
    force_isa(isa, monkeypatch, tmp_path)
    gemms = _gemms(model)
    hoisted = [n for n in gemms if n.inputs[1] == "w_ih"]
    assert len(hoisted) == 1 and hoisted[0].name.endswith("/hoisted"), [n.name for n in gemms]
    # the recurrence stays a Gemm per step (the first one's, of the constant h0, is folded)
    assert sum(n.inputs[1] == "w_hh" for n in gemms) == 6
    want = ort_run(model, feeds)[0]
    without = [p for p in pipeline.PASSES if p[0] != "hoist_shared_gemms"]
    for threads in (1, 2):
        got = smelt.compile(model, threads=threads).run(feeds)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        with monkeypatch.context() as m:
            m.setattr(pipeline, "PASSES", without)
            apart = smelt.compile(model, threads=threads).run(feeds)[0]
        np.testing.assert_array_equal(got, apart)


@pytest.mark.parametrize(("kw", "hoisted"), [
    ({}, 1),
    ({"other_weights_at": 2}, 1),  # that step's Gemm stays; the other four still stack
    ({"bias_rows": 3, "rows": 3}, 0),  # a bias per row: the stacked rows would not broadcast it
    ({"trans_a": True}, 0),
    ({"steps": 1}, 0),  # one member: nothing to stack
    ({"same_a_at": 3}, 1),  # steps 2 and 3 read one x: both stay; the other three stack
    ({"backward": True}, 2),  # one stacked Gemm per direction
])
def test_what_is_hoisted(kw, hoisted):
    model, feeds = _unrolled_rnn(**kw)
    names = [n.name for n in _gemms(model)]
    assert sum(name.endswith("/hoisted") for name in names) == hoisted, names
    np.testing.assert_allclose(smelt.compile(model, threads=2).run(feeds)[0], ort_run(model, feeds)[0],
                               rtol=1e-5, atol=1e-5)
