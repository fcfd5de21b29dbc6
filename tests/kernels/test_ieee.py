"""NaN and +-Inf through every native template family, position by position, against onnxruntime.

Inputs (and weights, biases, residuals) carry NaN, +Inf and -Inf at chosen positions; every
output must have NaN exactly where onnxruntime has NaN, infinities of the same sign where it has
them, and the finite values within tolerance (``node_cases.assert_close``). Each model runs at
1 and 2 threads, for every ISA this host can execute (the native one, AVX2 forced, portable C).

onnxruntime is the oracle even where its choices differ by op: Relu, Clip, HardSigmoid and
Max/Min keep NaN; Clip without bounds clamps +-Inf to +-FLT_MAX (its default bounds are the
float range); ThresholdedRelu maps NaN to 0; x * 0 in HardSwish(-Inf) gives NaN.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_models import force_isa
from node_cases import Cases, assert_close, build_model, check, oracle

import smelt
from smelt.schedule.rnn import annotate
from smelt.target import detect

NAN, INF = np.float32(np.nan), np.float32(np.inf)
RNG = np.random.default_rng(20261124)
ISAS = ["native", "avx2", "scalar"]


def _target(isa: str, monkeypatch, cache):
    """Force ``isa`` for the compiles of this test (avx2 is skipped where it is the native ISA)."""
    return force_isa(isa, monkeypatch, cache)


def uniform(*shape: int, lo: float = -1.0, hi: float = 1.0) -> np.ndarray:
    return RNG.uniform(lo, hi, shape).astype(np.float32)


def sprinkle(x: np.ndarray, positions: dict) -> np.ndarray:
    """``x`` with ``value`` written at each index of ``positions`` {index tuple: value}."""
    x = x.copy()
    for idx, v in positions.items():
        x[idx] = v
    return x


def hidden(cases: Cases, op: str, inputs: list[str], consts: tuple = (), **attrs) -> str:
    """A node whose output is not a graph output (so the epilogue pass may fuse its reader)."""
    out = cases.add(op, inputs, consts, **attrs)[0]
    cases.outputs.remove(out)
    return out


# every special next to the values activations treat differently (negative, zero, 0..6, > 6)
ROW = np.array([NAN, INF, -INF, -1.5, -0.0, 0.0, 0.3, 2.0, 7.0, -7.0, 100.0, -100.0, 0.5, -3.0, 6.0, 1.0],
               np.float32)


def _elementwise_cases(cases: Cases) -> dict:
    """Standalone unary, Clip, binary and Softmax ops on rows of specials; returns their feeds."""
    for op in ("Relu", "Neg", "Abs", "Sign", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Reciprocal", "Floor", "Ceil",
               "Round", "Erf", "Sin", "Cos", "Tan", "Softplus", "Softsign", "Elu", "Celu", "Selu", "HardSwish",
               "Mish"):
        cases.add(op, ["x"])
    cases.add("LeakyRelu", ["x"], alpha=0.1)
    cases.add("LeakyRelu", ["x"], alpha=0.0)
    cases.add("ThresholdedRelu", ["x"], alpha=0.5)
    cases.add("HardSigmoid", ["x"], alpha=0.3, beta=0.4)
    cases.add("Gelu", ["x"])
    cases.add("Gelu", ["x"], approximate="tanh")
    f = np.float32
    for lo, hi in ((None, None), (f(0), None), (None, f(6)), (f(0), f(6)), (f(-INF), f(INF))):
        cases.add("Clip", ["x"], (lo, hi))
    cases.add("Clip", ["x", "lo", "hi"])  # run-time bounds
    cases.add("Clip", ["x", "", "hi"])
    for op in ("Max", "Min", "Add", "Sub", "Mul", "Div", "Pow", "PRelu", "Equal", "Less", "Greater"):
        cases.add(op, ["x", "xr"])
        cases.add(op, ["xr", "x"])
    for op in ("Max", "Min", "PRelu"):
        cases.add(op, ["x"], (np.float32(0),))
        if op != "PRelu":  # PRelu's slope must broadcast to X: a scalar X with slope x is invalid
            cases.add(op, [], (np.float32(0),))
            cases.nodes[-1].input.append("x")
    cases.add("Where", ["cond", "x", "xr"])
    for op in ("Softmax", "LogSoftmax"):
        cases.add(op, ["s"])
        cases.add(op, ["s"], axis=0)
    x = np.stack([ROW, np.roll(ROW, 5), -ROW, np.roll(ROW, -3)])
    s = sprinkle(uniform(6, 5) * 3, {(0, 1): NAN, (1, 0): INF, (2, 4): -INF, (3, 2): INF, (3, 3): INF,
                                              (4, 0): -INF, (4, 1): -INF, (4, 2): -INF, (4, 3): -INF, (4, 4): -INF})
    return {"x": x, "xr": x[:, ::-1].copy(), "lo": np.array(-2.0, np.float32),
            "hi": np.array(1.0, np.float32), "cond": RNG.integers(0, 2, x.shape).astype(bool), "s": s}


def _reduce_input() -> np.ndarray:
    """[5, 4, 6]: rows (along every axis) with NaN first / in the middle / last / everywhere,
    +Inf, -Inf, both, all -Inf, ties of infinities, and plain rows."""
    x = uniform(5, 4, 6)
    put = {(0, 0, 0): NAN, (0, 1, 3): NAN, (0, 2, 5): NAN, (0, 3, 1): INF, (1, 0, 2): -INF, (1, 1, 0): INF,
           (1, 1, 4): -INF, (1, 2, 1): INF, (1, 2, 4): INF, (2, 0, 3): NAN, (2, 0, 4): INF, (2, 1, 2): -INF,
           (2, 1, 5): NAN, (3, 3, 3): -INF, (0, 0, 4): NAN, (3, 0, 0): NAN}
    x = sprinkle(x, put)
    x[1, 3, :] = -INF
    x[4, 2, :] = NAN
    x[4, 0, :] = INF
    return x


def _pool_input(c: int) -> np.ndarray:
    p = uniform(2, c, 5, 7) * 4
    p = sprinkle(p, {(0, 0, 0, 0): NAN, (0, 1, 2, 3): INF, (0, 2, 4, 6): -INF, (0, 3, 1, 1): INF,
                     (0, 3, 1, 2): -INF, (1, 4, 3, 3): NAN, (1, 4, 3, 4): INF, (1, 5, 0, 6): NAN, (1, 5, 2, 2): NAN})
    p[1, 1, 2:4, 2:5] = INF
    p[1, 0, 1:3, :] = NAN  # two whole rows: windows and a plane with many NaN
    return p


@pytest.mark.parametrize("isa", ISAS)
def test_standalone_ops(isa, monkeypatch, cache):
    """The element-wise family (unary math and activations, Clip with every bound form, binary
    ops in both operand orders, Softmax) and the ops whose onnxruntime kernels treat NaN the same
    at every position: sums, means, products,
    norms, LogSumExp, ArgMax/ArgMin (first and last index), average / Lp pooling, BatchNorm (NaN/Inf
    in the input and in its parameters, fused Relu/Clip), LRN, Layer/InstanceNorm; and ReduceMax /
    ReduceMin over leading axes (onnxruntime folds std::max from the first element there)."""
    _target(isa, monkeypatch, cache)
    cases = Cases()
    for op in ("ReduceSum", "ReduceMean", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp"):
        for axes in (None, [0], [1], [2], [0, 2]):
            cases.add(op, ["r"], () if axes is None else (np.array(axes, np.int64),), keepdims=len(op) % 2)
    for op in ("ReduceMax", "ReduceMin"):
        for axes in ([0], [1], [0, 1]):
            cases.add(op, ["r"], (np.array(axes, np.int64),), keepdims=axes[-1])
    for op in ("ArgMax", "ArgMin"):
        for axis in (0, 1, 2):
            for last in (0, 1):
                cases.add(op, ["r"], axis=axis, select_last_index=last, keepdims=axis % 2)
    pad = {"pads": [1, 1, 1, 1]}
    cases.add("AveragePool", ["p"], kernel_shape=[3, 3], strides=[2, 2], **pad)
    cases.add("AveragePool", ["p"], kernel_shape=[2, 2])
    cases.add("AveragePool", ["p"], kernel_shape=[3, 3], count_include_pad=1, **pad)
    cases.add("LpPool", ["p"], kernel_shape=[2, 2], p=2)
    cases.add("GlobalAveragePool", ["p"])
    c = 6
    bn = [uniform(c), uniform(c), uniform(c), uniform(c, lo=0.5, hi=1.5)]
    cases.add("BatchNormalization", ["p"], bn)
    odd = [sprinkle(bn[0], {1: NAN, 2: INF}), sprinkle(bn[1], {3: -INF, 2: -INF}), sprinkle(bn[2], {4: INF}),
           sprinkle(bn[3], {5: INF, 0: 0.0})]  # var 0 with epsilon: finite; var inf: scale 0
    cases.add("BatchNormalization", ["q"], odd)
    b = hidden(cases, "BatchNormalization", ["p"], bn)
    cases.add("Relu", [b])
    b = hidden(cases, "BatchNormalization", ["p"], bn)
    cases.add("Clip", [b], (np.float32(0), np.float32(6)))
    cases.add("LRN", ["p"], size=3)
    cases.add("LayerNormalization", ["p"], (uniform(7), uniform(7)))
    cases.add("InstanceNormalization", ["p"], (uniform(c), uniform(c)))
    q = sprinkle(uniform(2, c, 5, 7) * 4, {(0, 1, 1, 1): NAN})
    feeds = _elementwise_cases(cases)
    check(cases, {**feeds, "r": _reduce_input(), "p": _pool_input(c), "q": q}, opset=20)


def _max_like_cases() -> Cases:
    cases = Cases()
    for op in ("ReduceMax", "ReduceMin"):
        for axes in (None, [2], [1, 2], [0, 2]):
            cases.add(op, ["r"], () if axes is None else (np.array(axes, np.int64),), keepdims=len(op) % 2)
    pad = {"pads": [1, 1, 1, 1]}
    cases.add("MaxPool", ["p"], kernel_shape=[3, 3], strides=[2, 2], **pad)
    cases.add("MaxPool", ["p"], kernel_shape=[2, 2])
    cases.add("MaxPool", ["p"], kernel_shape=[3, 3], dilations=[2, 2], ceil_mode=1)
    cases.add("MaxPool", ["p1"], kernel_shape=[3], strides=[2])
    cases.add("GlobalMaxPool", ["p"])
    return cases


@pytest.mark.parametrize("isa", ISAS)
def test_max_reductions_and_pools_nan(isa, monkeypatch, cache):
    """ReduceMax/Min, MaxPool and GlobalMaxPool. onnxruntime's vector kernels keep or drop a NaN
    depending on the SIMD lane it lands in (its issue #10514), so smelt follows the rule of its
    scalar code: max pooling skips NaN, a window of only NaN gives NaN (IEEE maxNum); ReduceMax/Min
    fold from the first element (a NaN there is the result, later NaNs are skipped). The oracle is
    onnxruntime on the input with every NaN replaced by -Inf (+Inf for Min), then NaN where the
    first element is NaN (reductions) or the window is all NaN (pools)."""
    _target(isa, monkeypatch, cache)
    cases = _max_like_cases()
    r, p = _reduce_input(), _pool_input(6)
    feeds = {"r": r, "p": p, "p1": p[:, :, 0].copy()}
    model = build_model(cases, feeds, opset=18)
    all_nan = oracle(model, {k: np.where(np.isnan(v), -1, 0).astype(np.float32) for k, v in feeds.items()})
    want = []
    for i, node in enumerate(cases.nodes):
        lo = -INF if node.op_type != "ReduceMin" else INF
        w = oracle(model, {k: np.where(np.isnan(v), lo, v).astype(np.float32) for k, v in feeds.items()})[i]
        if node.op_type.startswith("Reduce"):
            axes = list(node.input[1:] and cases.inits[node.input[1]]) or [0, 1, 2]
            first = np.isnan(r[tuple(0 if d in axes else slice(None) for d in range(3))])
            w = np.where(first.reshape(w.shape), NAN, w)
        else:
            w = np.where(all_nan[i] == -1, NAN, w)
        want.append(w)
    for threads in (1, 2):
        compiled = smelt.compile(model, threads=threads)
        assert compiled.fallback_nodes == []
        for name, g, w in zip(cases.outputs, compiled.run(feeds), want, strict=True):
            assert_close(f"{name} (threads={threads})", g, w)
        compiled.close()


# epilogue chains the fuse pass folds into Conv / Gemm / MatMul / BatchNormalization
POSTS = [(), ("Relu",), ("Clip06",), ("Clip",), ("ClipLo",), ("ClipHi",), ("Add", "Relu"), ("LeakyRelu",),
         ("HardSigmoid",), ("HardSwish",), ("Sigmoid",), ("Tanh",), ("SiLU",), ("Mul", "Clip06"), ("Div", "Relu")]


def _epilogue(cases: Cases, y: str, post: tuple, full: str, chan: np.ndarray) -> None:
    """Append the ops of ``post`` to ``y``; the last one's output is a graph output. ``full`` is a
    same-shape operand (residual), ``chan`` a per-channel one (NaN/Inf at some channels)."""
    f = np.float32
    for i, op in enumerate(post):
        ins, consts, attrs = [y], (), {}
        if op == "Clip06":
            op, consts = "Clip", (f(0), f(6))
        elif op == "ClipLo":
            op, consts = "Clip", (f(0),)
        elif op == "ClipHi":
            op, consts = "Clip", (None, f(6))
        elif op == "Add":
            ins = [full, y]
        elif op in ("Mul", "Div"):
            consts = (chan,) if op == "Mul" else (f(-0.5),)
        elif op == "LeakyRelu":
            attrs = {"alpha": 0.1}
        elif op == "HardSigmoid":
            attrs = {"alpha": 0.3, "beta": 0.4}
        elif op == "SiLU":
            s = hidden(cases, "Sigmoid", [y])
            op, ins = "Mul", [y, s]
        if i == len(post) - 1:
            cases.add(op, ins, consts, **attrs)
        else:
            y = hidden(cases, op, ins, consts, **attrs)
    if not post:
        cases.outputs.append(y)


def _host(cases: Cases, op: str, inputs: list[str], consts: tuple, post: tuple, full: str, chan, **attrs) -> None:
    y = hidden(cases, op, inputs, consts, **attrs)
    _epilogue(cases, y, post, full, chan)


def _gemm_conv_feeds():
    m, k, n = 6, 24, 40
    a = sprinkle(uniform(m, k), {(0, 3): NAN, (1, 5): INF, (2, 7): -INF, (4, 1): INF, (4, 2): -INF})
    w = sprinkle(uniform(k, n), {(11, 9): NAN, (5, 13): 0.0, (17, 21): INF})
    bias = sprinkle(uniform(n), {2: NAN, 4: INF, 6: -INF})
    res = sprinkle(uniform(m, n), {(3, 0): NAN, (3, 1): INF, (5, 8): -INF, (1, 20): -INF})
    c, h, wd = 8, 7, 9
    x = sprinkle(uniform(1, c, h, wd) * 2, {(0, 2, 1, 1): NAN, (0, 5, 4, 6): INF, (0, 1, 5, 2): -INF,
                                           (0, 7, 0, 8): INF, (0, 3, 6, 0): NAN})
    return a, w, bias, res, x


def _gemm_conv_cases() -> tuple[Cases, dict]:
    a, w, bias, res, x = _gemm_conv_feeds()
    n, c, oc = w.shape[1], x.shape[1], 16
    cases = Cases()
    chan_n = sprinkle(uniform(n), {7: NAN, 8: INF})
    # (no Inf in the conv's per-channel Mul: onnxruntime folds a constant Mul into the weights
    # (ConvMulFusion), where x * (w * -Inf) sums to NaN instead of (x * w) * -Inf = +-Inf)
    chan_c = sprinkle(uniform(oc, 1, 1), {(3, 0, 0): NAN})
    wc1 = sprinkle(uniform(oc, c, 1, 1), {(9, 2, 0, 0): NAN})
    wc3 = sprinkle(uniform(oc, c, 3, 3), {(10, 4, 1, 1): INF})
    wdw = sprinkle(uniform(c, 1, 3, 3), {(6, 0, 2, 2): NAN})
    bc = sprinkle(uniform(oc), {1: NAN, 5: INF, 12: -INF})
    for post in POSTS:  # every kind on the GEMM's micro-kernel store and tile epilogue, and on a 1x1 conv
        _host(cases, "MatMul", ["a"], (w,), post, "res", chan_n)
        _host(cases, "Gemm", ["a"], (w, bias), post, "res", chan_n)
        _host(cases, "Conv", ["x"], (wc1, bc), post, "res1", chan_c)
    for post in (("Relu",), ("Clip",), ("Add", "Relu"), ("HardSigmoid",), ("SiLU",)):  # the other paths
        _host(cases, "Gemm", ["a"], (np.ascontiguousarray(w.T), bias), post, "res", chan_n, transB=1)
        _host(cases, "Conv", ["x"], (wc3, bc), post, "res3", chan_c, pads=[1, 1, 1, 1])
        _host(cases, "Conv", ["x"], (wdw, bc[:c]), post, "resdw", chan_c[:c], pads=[1, 1, 1, 1], group=c)
    resc = uniform(1, oc, *x.shape[2:])
    feeds = {"a": a, "res": res, "x": x,
             "res1": sprinkle(resc, {(0, 2, 3, 3): NAN, (0, 6, 0, 0): INF}), "res3": resc,
             "resdw": sprinkle(resc[:, :c], {(0, 1, 2, 2): -INF})}
    return cases, feeds


@pytest.mark.parametrize("isa", ISAS)
def test_gemm_conv_epilogues(isa, monkeypatch, cache):
    """MatMul, Gemm (bias in the micro-kernel's store), Conv 1x1 / im2col / depthwise with every
    fused epilogue kind: NaN and Inf from the data, the weights, the bias and the residual."""
    _target(isa, monkeypatch, cache)
    cases, feeds = _gemm_conv_cases()
    check(cases, feeds, opset=17, layout="nchw")



@pytest.mark.parametrize("isa", ISAS)
def test_depthwise_border_taps_skip_padding(isa, monkeypatch, cache):
    """NaN and Inf weights on the border taps of NCHW depthwise convs: onnxruntime skips a tap
    that falls on the padding, so those outputs stay finite (0 * NaN would not). Small planes
    (one register block: 7x9, 4x5 at stride 2) and wide ones (row by row: 19x21), stride 1 and 2,
    dilation 2; every tap of the 3x3 kernel carries a special in some channel.

    onnxruntime 1.32 skips padded taps in its blocked depthwise kernel, which it uses when the
    channels are a multiple of 8 (nearly every real depthwise conv); at other channel counts its
    im2col GEMM multiplies the padding and gives NaN. smelt skips them at every channel count (one
    semantics); the oracle comparison therefore uses 16 channels."""
    _target(isa, monkeypatch, cache)
    c = 16
    cases = Cases()
    w = uniform(c, 1, 3, 3)
    for ch, (ky, kx) in enumerate([(0, 0), (0, 2), (2, 0), (2, 2), (1, 0), (1, 2), (0, 1), (2, 1)]):
        w[ch, 0, ky, kx] = (NAN, INF, -INF)[ch % 3]
    for name in ("xs", "xw"):
        for attrs in ({}, {"strides": [2, 2]}, {"dilations": [2, 2], "pads": [2, 2, 2, 2]}):
            kw = {"pads": [1, 1, 1, 1], **attrs}
            cases.add("Conv", [name], (w, uniform(c)), group=c, **kw)
    check(cases, {"xs": uniform(1, c, 7, 9), "xw": uniform(1, c, 19, 21)}, opset=17, layout="nchw")

@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_nchwc_epilogues_and_blocked_ops(isa, monkeypatch, cache):
    """The blocked (NCHW<b>c) templates: direct 1x1 / 3x3 / depthwise convs with every epilogue kind
    (bias and residual with NaN/Inf), then max / average / global pooling, BatchNorm + Relu and a
    standalone Relu on blocked values (their inputs carry +-Inf, not NaN: onnxruntime's pooling
    keeps or drops a NaN by SIMD lane, see test_max_reductions_and_pools_nan)."""
    target = _target(isa, monkeypatch, cache)
    if target.isa not in ("avx2", "avx512"):
        pytest.skip("NCHWc needs AVX2 or AVX-512")
    _, _, _, _, x = _gemm_conv_feeds()
    c, oc = x.shape[1], 16
    cases = Cases()
    bias = sprinkle(uniform(oc), {1: NAN, 5: INF, 12: -INF})
    chan = sprinkle(uniform(oc, 1, 1), {(3, 0, 0): NAN})
    for post in POSTS:
        _host(cases, "Conv", ["x"], (uniform(oc, c, 1, 1), bias), post, "res", chan)
    for post in (("Relu",), ("Clip",), ("Add", "Relu"), ("SiLU",)):
        _host(cases, "Conv", ["x"], (uniform(oc, c, 3, 3), bias), post, "res", chan, pads=[1, 1, 1, 1])
        h = hidden(cases, "Conv", ["x"], (uniform(oc, c, 1, 1),))
        _host(cases, "Conv", [h], (uniform(oc, 1, 3, 3), bias), post, "res", chan, pads=[1, 1, 1, 1], group=oc)
    inf_only = hidden(cases, "Conv", ["xi"], (uniform(oc, c, 1, 1), uniform(oc)))
    cases.add("MaxPool", [inf_only], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cases.add("AveragePool", [inf_only], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    cases.add("GlobalMaxPool", [inf_only])
    cases.add("GlobalAveragePool", [inf_only])
    pooled = hidden(cases, "MaxPool", [inf_only], kernel_shape=[2, 2])
    b = hidden(cases, "BatchNormalization", [pooled], (uniform(oc), uniform(oc), uniform(oc), uniform(oc, lo=0.5, hi=1)))
    cases.add("Relu", [b])
    nan_in = hidden(cases, "MaxPool", [hidden(cases, "Conv", ["x"], (uniform(oc, c, 1, 1),))], kernel_shape=[1, 1])
    cases.add("Relu", [nan_in])
    xi = sprinkle(uniform(*x.shape) * 2, {(0, 1, 2, 3): INF, (0, 4, 6, 7): -INF, (0, 2, 0, 0): INF})
    res = sprinkle(uniform(1, oc, *x.shape[2:]), {(0, 2, 3, 3): NAN, (0, 6, 0, 0): INF, (0, 9, 4, 4): -INF})
    check(cases, {"x": x, "xi": xi, "res": res}, opset=17, layout="propagate")
    plan = smelt.compile(build_model(cases, {"x": x, "xi": xi, "res": res}, 17), threads=1).plan
    templates = {i.schedule.get("template") for i in plan.step_infos()}
    assert {"f32_conv_nchwc", "pool_nchwc", "global_pool_nchwc", "batchnorm_nchwc"} <= templates, templates


def test_avx512_rendering_keeps_nan(tmp_path):
    """AVX-512 code cannot run here: generate it for a forced AVX-512 target (GEMM micro-kernel store
    epilogue, tile epilogue, NCHW16c direct and Winograd convs, blocked max pooling) and check that
    every max/min of an epilogue has the value second (``max_ps(0, x)``: NaN kept, one
    instruction), none the old way round, and that gcc compiles it with AVX-512 enabled."""
    import dataclasses
    import re
    import subprocess

    from smelt.codegen import toolchain
    from smelt.codegen.emit import generate
    from smelt.codegen.plan import build_plan
    from smelt.compiler import lower
    from smelt.frontend.onnx_import import load_model
    from smelt.options import CompileOptions

    target = dataclasses.replace(detect(), isa="avx512", vector_bits=512, vector_registers=32)
    cases = Cases()
    a, w, bias = uniform(20, 24), uniform(24, 40), uniform(40)
    _host(cases, "MatMul", ["a"], (w,), ("Relu",), "", None)
    _host(cases, "Gemm", ["a"], (w, bias), ("Clip",), "", None)
    _host(cases, "Gemm", ["a"], (w, bias), ("HardSwish",), "", None)
    h = hidden(cases, "Conv", ["x"], (uniform(32, 8, 1, 1), uniform(32)))
    _host(cases, "Conv", [h], (uniform(32, 32, 3, 3),), ("Relu",), "", None, pads=[1, 1, 1, 1])  # Winograd
    _host(cases, "Conv", [h], (uniform(32, 32, 1, 1), uniform(32)), ("Clip06",), "", None)
    cases.add("MaxPool", [h], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    model = build_model(cases, {"a": a, "x": uniform(1, 8, 14, 14)}, 17)
    g = lower(load_model(model), CompileOptions(threads=2), target)
    src = toolchain.source_with_runtime(generate(g, build_plan(g, ()), target, 2).source)
    assert "winograd" in src.lower() and "nchw16c" in src
    calls = re.findall(r"_mm512_(max|min)_ps\(([^(),]+(?:\([^()]*\))?), ", src)
    assert calls, "no AVX-512 max/min rendered"
    value_first = [c for c in calls if not re.match(r"_mm512_set(zero|1)_ps|[lh]$|x$", c[1])]
    # the only value-first max is max pooling's max_ps(x, a), which skips a NaN element on purpose
    assert all(arg.startswith("_mm512_load") for _, arg in value_first), value_first
    assert "_mm512_max_ps(_mm512_setzero_ps(), c0_0)" in src  # the micro-kernel's fused Relu
    assert "_mm512_min_ps(h, _mm512_max_ps(l, c0_0))" in src  # its fused Clip
    c_file = tmp_path / "avx512.c"
    c_file.write_text(src)
    cc = toolchain.find_compiler().path
    proc = subprocess.run([cc, "-std=gnu11", "-fPIC", "-O1", "-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl",
                           "-mfma", "-c", "-o", str(tmp_path / "avx512.o"), str(c_file)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]


# (activations, clip): every activation family onnxruntime treats differently at +-Inf / NaN
RNN_CASES = {"LSTM": [(("Sigmoid", "Tanh", "Tanh"), None), (("HardSigmoid", "Affine", "Relu"), 2.5)],
             "GRU": [(("Sigmoid", "Tanh"), None)],
             "RNN": [(("Relu",), 2.5), (("Affine",), None)]}


@pytest.mark.parametrize("isa", ISAS)
def test_rnn_activations(isa, monkeypatch, cache):
    """LSTM / GRU / RNN with +-Inf in X (reaching every gate of its batch row, and through the
    state every later step; NaN where it meets an opposite Inf) and in a bias, with the activation
    families and with and without clip. onnxruntime clips LSTM/GRU gates to the float range by
    default (+-Inf -> +-FLT_MAX) and, with a bias, turns NaN into +clip; its RNN activation
    functors map NaN to 0 in Relu/HardSigmoid (rnn.py follows all of that). Every ISA header
    (kernels/csrc/rnn_vec_*.h: exp/sigmoid/tanh, min/max, masks differ per ISA). The baseline
    schedule: every schedule runs the same gate math (one generator), and it is 40% less C to
    compile."""
    _target(isa, monkeypatch, cache)
    cases = Cases()
    T, B, E, H = 3, 3, 5, 18  # two hidden blocks of 16, the second padded
    for op, variants in RNN_CASES.items():
        G = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
        for i, (acts, clip) in enumerate(variants):
            w, r = uniform(1, G * H, E), uniform(1, G * H, H) * 0.4
            bias = sprinkle(uniform(1, 2 * G * H), {(0, G * H + 7): INF, (0, 11 + i): -INF})
            attrs = {"activations": list(acts), "activation_alpha": [0.3, 0.7, 0.2], "activation_beta": [0.4, 0.1]}
            if clip is not None:
                attrs["clip"] = clip
            cases.add(op, ["rx"], (w, r, bias), n_out=2, hidden_size=H, **attrs)
    feeds = {"rx": sprinkle(uniform(T, B, E) * 2, {(0, 1, 3): INF, (1, 2, 1): -INF, (2, 0, 4): INF})}
    check(cases, feeds, opset=14, transform=lambda m: annotate(m, schedule="baseline"))
