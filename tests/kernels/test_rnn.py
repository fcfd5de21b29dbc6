"""Native LSTM / GRU / RNN templates against onnxruntime.

Each test builds one ONNX model holding many independent recurrent nodes (one per case, its own
inputs and weights), so one compile covers many configurations. The reference is onnxruntime
running an equivalent model: onnxruntime rejects layout=1, so there a case is rewritten as
Transpose -> the layout-0 node -> Transpose. Every model runs natively at threads=1 and 2
(fallback_nodes == []); tolerance: max abs error <= 1e-5 * max(1, max |ref|).
"""

from __future__ import annotations

import ctypes
import dataclasses
import re
import subprocess
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from kernel_models import _isa_target, force_isa
from onnx import TensorProto, helper, numpy_helper

import smelt
from smelt.codegen.kernels.rnn_vec import vmath_source
from smelt.codegen.toolchain import RUNTIME_HEADER, arch_flags, find_compiler
from smelt.schedule.rnn import SCHEDULES, annotate
from smelt.target import detect

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
OPSET = 14


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "smelt-rnn-cache"))


@dataclass
class Case:
    op: str
    T: int
    B: int
    E: int  # input size
    H: int
    direction: str = "forward"
    layout: int = 0
    seq: str | list[int] | None = None  # None, "rand" (includes 0 and T when B >= 3) or explicit
    init: bool = False
    peep: bool = False
    bias: bool = True
    attrs: dict = field(default_factory=dict)
    outputs: tuple[str, ...] = ("Y", "Y_h", "Y_c")
    runtime_weights: bool = False  # W, R, B, P as graph inputs (as in the ONNX backend tests)
    seq_const: bool = False  # sequence_lens as an initializer


def _node_and_data(case: Case, p: str, rng: np.random.Generator, layout: int):
    D = 2 if case.direction == "bidirectional" else 1
    G, T, B, E, H = GATES[case.op], case.T, case.B, case.E, case.H
    k = 1.5 / np.sqrt(max(H, E))
    consts = {f"{p}W": rng.uniform(-k, k, (D, G * H, E)).astype(np.float32),
              f"{p}R": rng.uniform(-k, k, (D, G * H, H)).astype(np.float32)}
    if case.bias:
        consts[f"{p}B"] = rng.uniform(-0.5, 0.5, (D, 2 * G * H)).astype(np.float32)
    if case.peep:
        consts[f"{p}P"] = rng.uniform(-0.5, 0.5, (D, 3 * H)).astype(np.float32)
    feeds = {f"{p}X": rng.standard_normal((T, B, E) if layout == 0 else (B, T, E)).astype(np.float32)}
    if case.seq is not None:
        if case.seq == "rand":
            lens = rng.integers(0, T + 1, B)
            if B >= 3:
                lens[0], lens[-1] = 0, T
        else:
            lens = np.asarray(case.seq)
        (consts if case.seq_const else feeds)[f"{p}L"] = lens.astype(np.int32)
    sshape = (D, B, H) if layout == 0 else (B, D, H)
    if case.init:
        feeds[f"{p}h0"] = (0.5 * rng.standard_normal(sshape)).astype(np.float32)
        if case.op == "LSTM":
            feeds[f"{p}c0"] = (0.5 * rng.standard_normal(sshape)).astype(np.float32)
    ins = [f"{p}X", f"{p}W", f"{p}R", f"{p}B" if case.bias else "", f"{p}L" if case.seq is not None else "",
           f"{p}h0" if case.init else "", f"{p}c0" if case.init and case.op == "LSTM" else "",
           f"{p}P" if case.peep else ""]
    ins = ins[:8 if case.op == "LSTM" else 6]
    while ins[-1] == "":
        ins.pop()
    names = ["Y", "Y_h", "Y_c"][:3 if case.op == "LSTM" else 2]
    outs = [f"{p}{n}" if n in case.outputs else "" for n in names]
    while outs[-1] == "":
        outs.pop()
    attrs = dict(case.attrs)
    if layout:
        attrs["layout"] = 1
    node = helper.make_node(case.op, ins, outs, hidden_size=H, direction=case.direction, **attrs)
    return node, consts, feeds, [o for o in outs if o]


def _models(cases: list[Case], seed: int = 0):
    """(smelt model, reference model, feeds, output names) for a list of cases."""
    rng = np.random.default_rng(seed)
    nodes, ref_nodes, inits, ref_inits, g_in, r_in, outs, feeds = [], [], [], [], [], [], [], {}

    def vi(name, arr):
        return helper.make_tensor_value_info(name, TensorProto.INT32 if arr.dtype == np.int32 else TensorProto.FLOAT,
                                             list(arr.shape))

    for ci, case in enumerate(cases):
        p = f"c{ci}_"
        node, consts, fd, case_outs = _node_and_data(case, p, rng, case.layout)
        nodes.append(node)
        outs += case_outs
        feeds.update(fd)
        if case.runtime_weights:
            feeds.update(consts)
        else:
            inits += [numpy_helper.from_array(v, k) for k, v in consts.items()]
            ref_inits += [numpy_helper.from_array(v, k) for k, v in consts.items()]
        for k, v in (fd | consts if case.runtime_weights else fd).items():
            g_in.append(vi(k, v))
            r_in.append(vi(k, v))
        if case.layout == 0:
            ref_nodes.append(node)
            continue
        # onnxruntime has no layout=1: transpose around a layout-0 node
        rnode = onnx.NodeProto()
        rnode.CopyFrom(node)
        del rnode.attribute[:]
        rnode.attribute.extend([a for a in node.attribute if a.name != "layout"])
        for i, name in enumerate(rnode.input):
            if name and name.endswith(("X", "h0", "c0")):
                ref_nodes.append(helper.make_node("Transpose", [name], [name + "_t"], perm=[1, 0, 2]))
                rnode.input[i] = name + "_t"
        for i, name in enumerate(rnode.output):
            if name:
                perm = [2, 0, 1, 3] if name.endswith("_Y") else [1, 0, 2]
                ref_nodes.append(helper.make_node("Transpose", [name + "_t"], [name], perm=perm))
                rnode.output[i] = name + "_t"
        ref_nodes.insert(len(ref_nodes) - sum(1 for o in rnode.output if o), rnode)
    g_out = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs]

    def model(ns, ins, its):
        m = helper.make_model(helper.make_graph(ns, "rnn_cases", ins, g_out, its),
                              opset_imports=[helper.make_opsetid("", OPSET)])
        m.ir_version = 8
        return m

    return model(nodes, g_in, inits), model(ref_nodes, r_in, ref_inits), feeds, outs


def _check(cases: list[Case], threads=(1, 2), seed: int = 0, transform=None) -> None:
    model, ref_model, feeds, outs = _models(cases, seed)
    if transform is not None:  # e.g. a schedule / grid annotation of the smelt model
        model = transform(model)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    ref = ort.InferenceSession(ref_model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(outs, feeds)
    for th in threads:
        compiled = smelt.compile(model, threads=th)
        assert compiled.fallback_nodes == [], compiled.fallback_report
        for run in range(3):  # repeated runs: no state leaks between calls, no racy results
            got = compiled.run(feeds)
            for name, a, b in zip(outs, got, ref, strict=True):
                assert a.shape == b.shape, (name, a.shape, b.shape)
                err = float(np.abs(a - b).max()) if a.size else 0.0
                bound = 1e-5 * max(1.0, float(np.abs(b).max()) if b.size else 0.0)
                ci = int(name[1:name.index("_")])
                assert err <= bound, f"threads={th} run {run} {name}: {cases[ci]} max abs err {err:.3g} > {bound:.3g}"
        compiled.close()


# --------------------------------------------------------------------------------------------
def _matrix(op: str) -> list[Case]:
    lstm = op == "LSTM"
    cases = []
    # directions x layouts, with variable lengths (incl. 0 and T), initial states, peepholes
    for direction in ("forward", "reverse", "bidirectional"):
        for layout in (0, 1):
            cases.append(Case(op, 5, 3, 4, 7, direction, layout, seq="rand", init=True, peep=lstm))
    # hidden sizes below / at / above the 16-lane block and the thread split
    for H in (1, 16, 33, 64, 130):
        cases.append(Case(op, 3, 1 if H != 33 else 3, 5, H, "bidirectional" if H in (16, 130) else "forward"))
    # one direction split over two threads (weight-centric: each owns half the hidden blocks)
    cases.append(Case(op, 3, 2, 5, 130, "forward", seq=[3, 1], init=True, peep=lstm))
    # constant sequence_lens: all full (masks dropped at compile time) and variable
    cases.append(Case(op, 3, 3, 4, 5, "bidirectional", seq=[3, 3, 3], seq_const=True))
    cases.append(Case(op, 3, 3, 4, 5, "reverse", seq=[2, 0, 3], seq_const=True))
    # batch sizes (register tiles of up to 6-8 rows), sequence length 1
    cases.append(Case(op, 4, 20, 6, 17, "forward", seq="rand", init=True))
    cases.append(Case(op, 1, 3, 3, 9, "reverse", init=True))
    cases.append(Case(op, 1, 20, 3, 40, "bidirectional", 1, seq="rand", init=True, peep=lstm))
    # clip, no bias, omitted outputs
    cases.append(Case(op, 6, 2, 5, 12, "bidirectional", attrs={"clip": 0.4}, seq=[6, 3], init=True, peep=lstm))
    cases.append(Case(op, 4, 3, 8, 20, "reverse", bias=False, outputs=("Y_h",)))
    cases.append(Case(op, 4, 3, 8, 20, "forward", 1, outputs=("Y",), seq=[0, 0, 0]))
    if lstm:
        cases.append(Case(op, 5, 2, 3, 18, "bidirectional", attrs={"input_forget": 1}, init=True, peep=True))
        cases.append(Case(op, 4, 3, 5, 10, "forward", outputs=("Y_c",), seq="rand"))
    if op == "GRU":
        for direction in ("forward", "bidirectional"):
            cases.append(Case(op, 5, 3, 4, 19, direction, seq="rand", init=True, attrs={"linear_before_reset": 1}))
        cases.append(Case(op, 3, 20, 6, 70, "reverse", 1, attrs={"linear_before_reset": 1, "clip": 0.7}))
    return cases


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_attribute_matrix(op):
    _check(_matrix(op))


ACTS = [("HardSigmoid", "LeakyRelu", "ThresholdedRelu"), ("Affine", "ScaledTanh", "Elu"),
        ("Softsign", "Softplus", "Relu"), ("Tanh", "Sigmoid", "HardSigmoid")]


def test_activations():
    cases = []
    for i, acts in enumerate(ACTS):
        alpha = [0.3, 0.7, 1.1, 0.9, 0.4, 0.6][: 2 + i]  # fewer values than takers: defaults apply
        beta = [0.2, 0.4, 0.1]
        for op, n in (("LSTM", 3), ("GRU", 2), ("RNN", 1)):
            attrs = {"activations": list(acts[:n]), "activation_alpha": alpha, "activation_beta": beta}
            cases.append(Case(op, 4, 2, 3, 9, attrs=attrs, seq=[4, 2], init=True))
    # per-direction activations (bidirectional: 2 sets)
    cases.append(Case("LSTM", 4, 2, 3, 9, "bidirectional",
                      attrs={"activations": ["Sigmoid", "Tanh", "Tanh", "HardSigmoid", "Softsign", "Elu"],
                             "activation_alpha": [0.25], "activation_beta": [0.45]}))
    cases.append(Case("GRU", 4, 2, 3, 9, "bidirectional",
                      attrs={"activations": ["Sigmoid", "Tanh", "Sigmoid", "LeakyRelu"], "linear_before_reset": 1}))
    cases.append(Case("RNN", 4, 2, 3, 9, "bidirectional", attrs={"activations": ["Relu", "Affine"],
                                                                   "activation_alpha": [0.5], "activation_beta": [0.1]}))
    _check(cases)


def test_runtime_weights():
    """W, R, B and P fed at run time are packed by a first step, with the compile-time layout."""
    cases = [Case("LSTM", 5, 3, 6, 21, "bidirectional", seq="rand", init=True, peep=True, runtime_weights=True),
             Case("GRU", 4, 2, 5, 18, "forward", runtime_weights=True),
             Case("GRU", 4, 2, 5, 35, "bidirectional", 1, attrs={"linear_before_reset": 1}, seq=[1, 4],
                  runtime_weights=True),
             Case("RNN", 3, 3, 70, 4, "reverse", bias=False, runtime_weights=True),
             Case("LSTM", 2, 1, 67, 3, "forward", runtime_weights=True, bias=False)]
    _check(cases)


def test_oversubscribed_threads():
    """More threads than cores: direction groups of several threads with their own barriers."""
    cases = [Case("LSTM", 4, 20, 16, 130, "bidirectional", seq="rand", init=True, peep=True),
             Case("GRU", 3, 8, 16, 160, "forward"),
             Case("RNN", 3, 8, 8, 200, "bidirectional", 1)]
    _check(cases, threads=(3, 4))


def _backend_cases(monkeypatch) -> list[tuple[str, onnx.NodeProto, list, list]]:
    """The ONNX backend node tests for these ops, from the generators onnx ships."""
    import importlib

    found = []
    for mod_name in ("lstm", "gru", "rnn"):
        mod = importlib.import_module(f"onnx.backend.test.case.node.{mod_name}")
        monkeypatch.setattr(mod, "expect", lambda node, inputs, outputs, name, **kw: found.append(
            (name, node, list(inputs), list(outputs))))
        for cls in vars(mod).values():
            if isinstance(cls, type) and cls.__module__ == mod.__name__:
                for attr in dir(cls):
                    if attr.startswith("export"):
                        getattr(cls, attr)()
    return found


def test_onnx_backend_cases(monkeypatch):
    """The ONNX backend node tests (test_lstm_*, test_gru_*, test_*rnn_*) merged into one model."""
    nodes, inputs, outputs, feeds, expected = [], [], [], {}, {}
    cases = _backend_cases(monkeypatch)
    opset = 22  # LSTM-22 / GRU-22 / RNN-22, the newest schemas
    assert len(cases) >= 15, [c[0] for c in cases]
    for name, src_node, ins, outs in cases:
        p = name + "__"
        node = onnx.NodeProto()
        node.CopyFrom(src_node)
        in_names = [n for n in node.input if n]
        out_names = [n for n in node.output if n]
        node.input[:] = [p + n if n else "" for n in node.input]
        node.output[:] = [p + n if n else "" for n in node.output]
        nodes.append(node)
        for n, arr in zip(in_names, ins, strict=True):
            feeds[p + n] = arr
            elem = TensorProto.INT32 if arr.dtype == np.int32 else TensorProto.FLOAT
            inputs.append(helper.make_tensor_value_info(p + n, elem, list(arr.shape)))
        for n, arr in zip(out_names, outs, strict=True):
            expected[p + n] = arr
            outputs.append(helper.make_tensor_value_info(p + n, TensorProto.FLOAT, None))
    model = helper.make_model(helper.make_graph(nodes, "backend", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    compiled = smelt.compile(model, threads=2)
    assert compiled.fallback_nodes == [], compiled.fallback_report
    # Many runs: 54 steps of tiny work per run make thread interleavings vary; a data race
    # between threads' stores (see ``CB`` in rnn.py) showed up here in ~30% of runs.
    for _ in range(200):
        got = compiled.run(feeds)
        for vi, a in zip(outputs, got, strict=True):
            b = expected[vi.name]
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(b).max())),
                                       err_msg=vi.name)


def _vmath_lib(tmp_path, isa: str) -> ctypes.CDLL:
    src = tmp_path / "vmath.c"
    target = {"avx512": lambda: dataclasses.replace(detect(), isa="avx512", vector_bits=512, vector_registers=32),
              "avx2": lambda: _isa_target("avx2"), "scalar": lambda: _isa_target("scalar")}[isa]()
    src.write_text('#include "smelt_rt.h"\n' + vmath_source("t", target) + r"""
void eval_all(const float *x, float *sg, float *th, long n) {
    for (long i = 0; i < n; i += 16) {
        t_v v = t_loadu(x + i);
        t_storeu(sg + i, t_sigmoid(v));
        t_storeu(th + i, t_tanh(v));
    }
}""")
    so = tmp_path / f"vmath-{isa}.so"
    subprocess.run([find_compiler().path, "-O3", "-std=gnu11", *arch_flags(detect()), "-shared", "-fPIC",
                    "-I", str(RUNTIME_HEADER.parent), str(src), "-o", str(so), "-lm"], check=True)
    return ctypes.CDLL(str(so))


@pytest.mark.parametrize("isa", ["avx512", "avx2", "scalar"])
def test_vector_math_accuracy(tmp_path, isa):
    """Each ISA's vector sigmoid / tanh (csrc/rnn_vec_*.h) vs libm in double: max abs error < 5e-7
    (AVX-512 measured 9e-8 / 2.9e-7)."""
    need = {"avx512": "avx512f", "avx2": "avx2"}.get(isa)
    if need and need not in detect().flags:
        pytest.skip(f"no {isa} on this machine")
    lib = _vmath_lib(tmp_path, isa)
    x = np.concatenate([np.linspace(-30, 30, 600_001, dtype=np.float32),
                        np.linspace(-1, 1, 200_001, dtype=np.float32),
                        np.array([0.0, -0.0, 1e-30, -1e-30, 1e-8, 88, -88, 100, -100, 1e30, -1e30], np.float32)])
    x = np.concatenate([x, np.zeros((-x.size) % 16, np.float32)])
    sg, th = np.empty_like(x), np.empty_like(x)
    ptr = lambda a: a.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
    lib.eval_all(ptr(x), ptr(sg), ptr(th), ctypes.c_long(x.size))
    xd = x.astype(np.float64)
    with np.errstate(over="ignore"):
        ref_sg = 1.0 / (1.0 + np.exp(-xd))
    ref_th = np.tanh(xd)
    assert np.abs(sg - ref_sg).max() < 5e-7
    assert np.abs(th - ref_th).max() < 5e-7
    small = (np.abs(x) < 1) & (x != 0)
    rel = np.abs(th - ref_th)[small] / np.abs(ref_th[small])
    assert rel.max() < 1e-6  # tanh keeps relative accuracy near 0
    assert np.all((sg >= 0) & (sg <= 1)) and np.all(np.abs(th) <= 1)


def test_checks_reject_with_reason():
    """Non-float32 data falls back with a reason rather than failing."""
    x = helper.make_tensor_value_info("X", TensorProto.DOUBLE, [2, 1, 3])
    w = numpy_helper.from_array(np.zeros((1, 8, 3)), "W")
    r = numpy_helper.from_array(np.zeros((1, 8, 2)), "R")
    node = helper.make_node("LSTM", ["X", "W", "R"], ["", "Y_h"], hidden_size=2)
    m = helper.make_model(helper.make_graph([node], "g", [x], [helper.make_tensor_value_info("Y_h", TensorProto.DOUBLE,
                                                                                            None)], [w, r]),
                          opset_imports=[helper.make_opsetid("", OPSET)])
    m.ir_version = 8
    compiled = smelt.compile(m, threads=1)
    assert len(compiled.fallback_nodes) == 1
    assert "float32" in compiled.fallback_report[0]["reason"]


def test_unread_outputs_and_chained_nodes():
    """Outputs nothing reads are skipped; a GRU feeding an LSTM (through Squeeze) stays native.

    Opset 11: the GRU-7 / LSTM-7 schemas (no layout attribute)."""
    rng = np.random.default_rng(3)
    T, B, E, H = 5, 2, 6, 20
    w1, r1 = rng.uniform(-0.3, 0.3, (1, 3 * H, E)), rng.uniform(-0.3, 0.3, (1, 3 * H, H))
    w2, r2 = rng.uniform(-0.3, 0.3, (2, 4 * H, H)), rng.uniform(-0.3, 0.3, (2, 4 * H, H))
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for a, n in ((w1, "W1"), (r1, "R1"), (w2, "W2"), (r2, "R2"))]
    nodes = [helper.make_node("GRU", ["X", "W1", "R1"], ["Y1", "Yh1"], hidden_size=H, linear_before_reset=1),
             helper.make_node("Squeeze", ["Y1"], ["S1"], axes=[1]),
             helper.make_node("LSTM", ["S1", "W2", "R2"], ["Y2", "Yh2", "Yc2"], hidden_size=H,
                              direction="bidirectional")]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [T, B, E])],
                              [helper.make_tensor_value_info("Yh2", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 8
    feeds = {"X": rng.standard_normal((T, B, E)).astype(np.float32)}
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    for th in (1, 2):
        compiled = smelt.compile(model, threads=th)
        assert compiled.fallback_nodes == [], compiled.fallback_report
        got = compiled.run(feeds)[0]
        assert float(np.abs(got - ref).max()) <= 1e-5 * max(1.0, float(np.abs(ref).max()))


def test_invalid_sequence_lens_raise():
    """Lengths outside [0, T] are an error, as in onnxruntime (0 itself is valid)."""
    from smelt.errors import SmeltError

    model, _, feeds, _ = _models([Case("LSTM", 4, 3, 3, 5, seq=[1, 2, 3])])
    compiled = smelt.compile(model, threads=2)
    assert compiled.fallback_nodes == []
    compiled.run(feeds)
    for bad in ([5, 0, 1], [-1, 2, 4]):
        with pytest.raises(SmeltError):
            compiled.run({**feeds, "c0_L": np.array(bad, np.int32)})


# every schedule level of the Fig. 4(a) ablation, and forced partition grids, stay exact
SCHED_CASES = [Case("LSTM", 5, 5, 6, 40, "bidirectional", seq="rand", init=True, peep=True),
               Case("GRU", 4, 7, 5, 35, "forward", seq=[4, 1, 0, 2, 3, 4, 4]),
               Case("GRU", 3, 3, 5, 20, "reverse", attrs={"linear_before_reset": 1}, init=True),
               Case("RNN", 4, 6, 3, 17, "forward", 1, seq="rand")]


@pytest.mark.parametrize("schedule", [s for s in SCHEDULES if s != "wcs"])
def test_schedules(schedule):
    _check(SCHED_CASES, threads=(1, 2, 3), transform=lambda m: annotate(m, schedule=schedule))


@pytest.mark.parametrize("grid", [(2, 1), (1, 2), (2, 2), (3, 1)])
def test_forced_grids(grid):
    """Row groups (no barrier), hidden groups (barrier per row group) and both; a grid larger
    than the pool or the batch falls back to the model's choice."""
    _check(SCHED_CASES, threads=(2, 4), transform=lambda m: annotate(m, grid=grid))


def test_large_hidden_reverse_walk():
    """R beyond 3/4 of L2 (4.4 MB LSTM, 1.9 MB GRU here): odd steps walk the hidden blocks in
    reverse and the second row chunk of a K block prefetches R (batch 14: chunks of 5, 5, 4);
    odd and even T, row and hidden-group splits."""
    cases = [Case("LSTM", 5, 14, 8, 520, "forward", seq="rand", init=True, peep=True),
             Case("GRU", 4, 2, 6, 400, "bidirectional", init=True),
             Case("GRU", 3, 7, 5, 400, "reverse", attrs={"linear_before_reset": 1})]
    _check(cases, threads=(1, 2))
    _check(cases[:1], threads=(2,), transform=lambda m: annotate(m, grid=(1, 2)))


def test_gate_split_gate_major():
    """R streamed from L3 (> 3/4 of L2) and a thread's rows above one register tile, up to
    GATE_SPLIT_ROWS: R is packed gate-major and the cell runs gate-split passes over all the
    thread's rows. Row counts just above the tile (LSTM 7, GRU 9), at the limit (12) and
    above it (13: not gate-major), run-time weights (the C packer's gate-major path), 1 and 2
    threads; the forced row split (2, 1) runs row chunks of 3-6 on the gate-major layout."""
    from smelt.codegen.kernels.rnn_config import GATE_SPLIT_ROWS, gate_split_parts

    assert GATE_SPLIT_ROWS == 12
    # two parts: balanced, each above one register tile, each pass covering two gates or more
    assert gate_split_parts(20, 4, 24) == [10, 10] and gate_split_parts(15, 4, 24) == [8, 7]
    assert gate_split_parts(13, 4, 24) == [] and gate_split_parts(25, 4, 24) == []
    assert gate_split_parts(10, 4, 6) == [] and gate_split_parts(5, 4, 6) == [5]  # AVX2: one part only
    cases = [Case("LSTM", 3, 7, 8, 400, seq="rand", init=True, peep=True),
             Case("LSTM", 2, 12, 5, 400, "reverse"),
             Case("LSTM", 3, 13, 6, 400, init=True),
             Case("LSTM", 2, 10, 9, 400, runtime_weights=True),
             Case("GRU", 3, 9, 8, 400, attrs={"linear_before_reset": 1}, seq="rand", init=True),
             Case("GRU", 2, 12, 4, 400, "bidirectional", attrs={"linear_before_reset": 1}, runtime_weights=True)]
    _check(cases, threads=(1, 2))
    _check(cases[:2], threads=(2,), transform=lambda m: annotate(m, grid=(2, 1)))


@pytest.mark.parametrize("isa", ["native", "avx2", pytest.param("scalar", marks=pytest.mark.slow)])
def test_gate_split_two_parts(isa, monkeypatch, tmp_path):
    """A thread's rows beyond GATE_SPLIT_ROWS, up to twice that, whose R slice stays in L2 under
    the grid (R as a whole beyond 3/4 of L2; a 1 MiB L2 here, as on Zen 4): two parts of
    gate-split passes (rnn_config.gate_split_parts), each part's passes and then its gate math
    per hidden block. LSTM 20 rows (10 + 10), 15 (8 + 7, peepholes, lengths), GRU lbr 19
    (10 + 9), run-time weights; a forced hidden split (each thread half of R: two parts), the
    same code on a pool of one thread, and a row split that gives each thread one part (24 rows
    over 2). Each ISA (AVX2's 6 accumulators: never two parts)."""
    import dataclasses

    from smelt.codegen.kernels.rnn_config import gate_split_parts
    from smelt.codegen.kernels.rnn_vec import rnn_vec

    target = dataclasses.replace(force_isa(isa, monkeypatch, tmp_path), l2_bytes=1 << 20)
    monkeypatch.setattr("smelt.compiler.detect", lambda: target)
    budget = rnn_vec(target).acc_budget(target)
    cases = [Case("LSTM", 3, 20, 6, 256, init=True),
             Case("LSTM", 2, 15, 5, 256, "reverse", seq="rand", peep=True),
             Case("GRU", 3, 19, 4, 300, attrs={"linear_before_reset": 1}, init=True),
             Case("LSTM", 2, 24, 3, 256, runtime_weights=True)]
    monkeypatch.setenv("SMELT_DEBUG", "1")  # keeps the generated C (source_path)
    model, _, _, _ = _models(cases[:1], 0)
    two = "gate split: 10 rows x gates 01 + 23 + 10 rows x gates 01 + 23"
    split = smelt.compile(annotate(model, grid=(1, 2)), threads=2).source_path.read_text()
    assert (two in split) == (gate_split_parts(20, 4, budget) == [10, 10])  # AVX-512: 24 accumulators
    _check(cases, threads=(2,), transform=lambda m: annotate(m, grid=(1, 2)))
    _check(cases[:2], threads=(1,))
    _check(cases[3:], threads=(2,), transform=lambda m: annotate(m, grid=(2, 1)))


@pytest.mark.parametrize("isa", ["native", "avx2", pytest.param("scalar", marks=pytest.mark.slow)])
def test_split_step_barrier(isa, monkeypatch, tmp_path):
    """The step barrier split around the h·R of the thread's own h (RnnSchedule.split_barrier):
    part 1 over the K range of the hidden blocks the thread owns, the wait for its peers, part
    2 over the rest of K from the kept accumulators, then the gate math. Hidden groups of 2 and
    3 threads (forced grids) on 2 and 3 threads; batch 1, at the AVX-512 row tile (6), above it
    (7: two chunks), and beyond a row group of chunks (30: accumulators of two groups kept);
    H below a vector, not a multiple of 16, and with a thread of one block; GRU in both forms
    (two barriers a step without linear_before_reset), RNN, bidirectional (one hidden split
    over both directions), reverse, sequence lengths, initial states, peepholes; each ISA,
    against onnxruntime, beside the whole-step barrier's code (split_barrier off, forced by
    ``annotate``)."""
    force_isa(isa, monkeypatch, tmp_path)
    lbr0, lbr1 = {"linear_before_reset": 0}, {"linear_before_reset": 1}
    cases = [Case("LSTM", 5, 1, 6, 40, init=True, peep=True, seq=[4]),
             Case("LSTM", 4, 6, 5, 70, "reverse", seq="rand"),
             Case("LSTM", 3, 7, 4, 33, "bidirectional", init=True),
             Case("LSTM", 3, 30, 3, 20, init=True),
             Case("GRU", 4, 1, 5, 50, "forward", attrs=lbr0, init=True),
             Case("GRU", 3, 7, 4, 48, "bidirectional", seq="rand", attrs=lbr0),
             Case("GRU", 4, 2, 6, 36, "reverse", 1, attrs=lbr1, init=True),
             Case("RNN", 4, 3, 3, 9, seq="rand")]
    monkeypatch.setenv("SMELT_DEBUG", "1")  # keeps the generated C (source_path)
    model, _, _, _ = _models(cases[:1], 0)
    src = smelt.compile(annotate(model, grid=(1, 2)), threads=2).source_path.read_text()
    assert "_wait(((" in src and "_arrive(((" in src and "_sync(((" not in src
    for grid in ((1, 2), (1, 3)):
        _check(cases, threads=(2, 3), transform=lambda m, grid=grid: annotate(m, grid=grid))
    src = smelt.compile(annotate(model, grid=(1, 2), split_barrier=False), threads=2).source_path.read_text()
    assert "_wait(((" not in src and "_sync(((" in src
    _check(cases[:3], threads=(2,), transform=lambda m: annotate(m, grid=(1, 2), split_barrier=False))


def test_calibration_stores_and_is_used(tmp_path, monkeypatch):
    """rnn_calibrate times every grid of a node, stores the fastest (kind "rnn"); the next
    compile of that workload uses it (and the artifact key changes with the database)."""
    from smelt.schedule import db as tdb
    from smelt.tune.rnn_calibrate import calibrate

    monkeypatch.setenv("SMELT_TUNING_DB", str(tmp_path / "tune.sqlite"))
    monkeypatch.setattr(tdb, "_opened", {})
    model, _, feeds, outs = _models([Case("LSTM", 4, 3, 5, 20, "forward")], 0)
    (res,) = calibrate(model, threads=2, rounds=1)
    assert set(res.timings) == {(1, 1), (1, 2), (2, 1)} and res.stored
    assert res.workload == {"op": "LSTM", "E": 5, "H": 20, "B": 3, "T": 4, "D": 1, "lbr": 0, "threads": 2}
    rec = tdb.open_default().lookup("rnn", res.workload, detect().key())
    assert rec == {"xi": res.best[0], "xj": res.best[1]}
    compiled = smelt.compile(model, threads=2)
    info = list(compiled.plan.step_infos())
    assert f"grid {res.best[0]} row x {res.best[1]} hidden" in info[-1].schedule["threads"]
    _check([Case("LSTM", 4, 3, 5, 20, "forward")], threads=(2,))


@pytest.mark.parametrize("cell,layers,B,T,H", [("lstm", 2, 1, 17, 40), ("gru", 3, 2, 5, 20), ("lstm", 4, 3, 7, 33)])
def test_pipeline_plan_stacked_layers(cell, layers, B, T, H):
    """ModelCompiler's pipeline plan (layer l at tick tau runs step tau - l, one thread per layer)
    equals onnxruntime, forced on and off, at 1 to 3 threads, with initial states."""
    from smelt.frontend.zoo.rnn import lstm_model

    model = lstm_model(H, H, B, T, layers=layers, cell=cell, initial_states=True)
    rng = np.random.default_rng(0)
    feeds = {vi.name: rng.standard_normal([d.dim_value for d in vi.type.tensor_type.shape.dim]).astype(np.float32)
             for vi in model.graph.input}
    _stacked_check(model, feeds)


def test_pipeline_plan_eligibility():
    """Only chains of forward, single-direction layers qualify (a reverse or bidirectional layer
    needs the whole sequence below it first)."""
    from smelt.frontend.onnx_import import to_ir as import_ir
    from smelt.frontend.zoo.rnn import lstm_model
    from smelt.passes.shape_inference import infer_shapes
    from smelt.schedule.rnn import pipeline_chain

    def to_ir(model):  # shapes come from inference (a model's declared shapes are only checked)
        return infer_shapes(import_ir(model))

    g = to_ir(lstm_model(8, 8, 1, 4, layers=3))
    heads = [n for n in g.nodes if n.op == "LSTM"]
    assert [n.op for n in pipeline_chain(heads[0], g)] == ["LSTM", "Squeeze", "LSTM", "Squeeze", "LSTM"]
    assert pipeline_chain(heads[1], g) == []  # not a head
    gb = to_ir(lstm_model(8, 8, 1, 4, layers=2, bidirectional=True))
    assert pipeline_chain(next(n for n in gb.nodes if n.op == "LSTM"), gb) == []
    rev = lstm_model(8, 8, 1, 4, layers=2)
    for n in rev.graph.node:
        if n.op_type == "LSTM" and n.name.startswith("layer1"):
            for a in n.attribute:
                if a.name == "direction":
                    a.s = b"reverse"
    g = to_ir(rev)
    assert pipeline_chain(next(n for n in g.nodes if n.op == "LSTM"), g) == []


def _stacked_check(model, feeds, threads=(1, 2, 3)):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    ref = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)
    for pipeline in (True, False):
        for th in threads:
            compiled = smelt.compile(annotate(model, pipeline=pipeline), threads=th)
            algos = " ".join(i.schedule.get("algorithm", "") for i in compiled.plan.step_infos())
            assert ("pipeline plan" in algos) == pipeline
            for _ in range(2):
                for a, b in zip(compiled.run(feeds), ref, strict=True):
                    assert float(np.abs(a - b).max()) <= 1e-5 * max(1.0, float(np.abs(b).max()))
            compiled.close()


def test_bidirectional_directions_in_sequence(monkeypatch):
    """Large bidirectional layers run one direction after the other on all threads (each
    thread's slice of R stays in its L2) instead of one thread per direction.

    Whether the cost model picks that order depends on the L2 size (with a 512 KiB L2 these
    layers stream R either way and it keeps the directions in parallel), so the target is
    described with a 2 MiB L2 here: the branch is generated and checked on every host."""
    monkeypatch.setattr("smelt.compiler.detect", lambda: dataclasses.replace(detect(), l2_bytes=2 << 20))
    cases = [Case("GRU", 4, 1, 8, 512, "bidirectional", attrs={"linear_before_reset": 1}, init=True),
             Case("LSTM", 3, 2, 5, 384, "bidirectional", seq=[3, 1], init=True, peep=True),
             Case("GRU", 3, 1, 4, 400, "bidirectional", 1)]
    monkeypatch.setenv("SMELT_DEBUG", "1")  # keeps the generated C (source_path)
    model, _, _, _ = _models(cases, 0)
    compiled = smelt.compile(model, threads=2)
    src = compiled.source_path.read_text()
    assert "(nact == 1 || 1)" in src  # the sequential-directions branch was generated
    _check(cases, threads=(1, 2, 3))


# the portable rendering (25 s) runs in the long suite: the default run stays under 15 minutes
@pytest.mark.parametrize("isa", ["native", "avx2", pytest.param("scalar", marks=pytest.mark.slow)])
def test_zero_initial_state_first_step(isa, monkeypatch, tmp_path):
    """Without an initial h, the first step's h is all zeros and the cells skip h·R there (the
    tiles start from XW and run an empty K range): T = 1 and longer, every cell form (LSTM with
    peepholes, GRU in both forms, RNN), reverse, bidirectional, layout 1, sequence lengths with
    0, row chunks, a hidden split over two threads (H=130), beside cases with initial states
    (the skip must not happen there); each ISA, 1 and 2 threads, against onnxruntime."""
    force_isa(isa, monkeypatch, tmp_path)
    lbr0, lbr1 = {"linear_before_reset": 0}, {"linear_before_reset": 1}
    cases = [Case("LSTM", 1, 1, 8, 20, peep=True),
             Case("LSTM", 1, 3, 5, 130, "bidirectional"),
             Case("LSTM", 4, 9, 6, 33, "reverse", seq="rand"),
             Case("GRU", 1, 2, 4, 19, "reverse", attrs=lbr0),
             Case("GRU", 3, 7, 6, 33, "forward", 1, seq="rand", attrs=lbr1),
             Case("GRU", 2, 3, 5, 40, "bidirectional", attrs=lbr0),
             Case("RNN", 1, 1, 3, 16),
             Case("LSTM", 3, 2, 4, 17, init=True, peep=True),
             Case("GRU", 1, 2, 4, 19, init=True, attrs=lbr1)]
    monkeypatch.setenv("SMELT_DEBUG", "1")  # keeps the generated C (source_path)
    model, _, _, _ = _models(cases, 0)
    src = smelt.compile(model, threads=2).source_path.read_text()
    # the cells of the nodes without h0 get the flag "s == 0", those with one a constant 0
    assert re.search(r", s == 0(\); }|, [012], )", src) and re.search(r"\d, 0(\); }|, [012], ulo)", src)
    _check(cases)


@pytest.mark.parametrize("isa", ["avx2", "scalar"])
def test_isa_headers(isa, monkeypatch):
    """The recurrence rendered with each ISA header the host runs (kernels/csrc/rnn_vec_*.h: AVX2
    as two __m256 per 16-lane vector with 6-accumulator register tiles and 6x16 GEMM tiles; the
    portable struct) agrees with onnxruntime: padded hidden tails (masked stores), peepholes,
    several batch-row chunks, both GRU forms, runtime weights."""


    target = _isa_target(isa)
    monkeypatch.setattr("smelt.compiler.detect", lambda: target)
    cases = [Case("LSTM", 4, 7, 8, 20, "bidirectional", init=True, peep=True, seq="rand"),
             Case("GRU", 5, 7, 6, 40, attrs={"linear_before_reset": 0}),
             Case("GRU", 3, 2, 70, 33, "reverse", attrs={"linear_before_reset": 1}),
             Case("RNN", 4, 3, 5, 17, runtime_weights=True)]
    monkeypatch.setenv("SMELT_DEBUG", "1")  # keeps the generated C (source_path)
    model, _, _, _ = _models(cases, 0)
    src = smelt.compile(model, threads=2).source_path.read_text()
    assert ("_mm256_maskstore_ps" in src) == (isa == "avx2")
    assert ("typedef struct { float f[16]; }" in src) == (isa == "scalar")
    _check(cases)


def test_avx2_native_vector_tiles(monkeypatch):
    """On AVX2 the LSTM's logical register tile is one row (4 gates x 2 ymm of the 6 x 2
    budget), so row chunks of 2 run as tiles of native ymm vectors (cell.py _native_dot_code);
    they agree with onnxruntime in each R layout: interleaved (H=20 with a padded tail, odd
    batches: 2-row native and 1-row logical chunks), streamed from L3 with the R prefetch variant
    (H=260, 9 rows), and gate-major (R beyond L2, rows split 7 + 6 over two threads: the 6 run a
    gate split, the 7 native row chunks on the gate-major layout)."""
    target = _isa_target("avx2")
    monkeypatch.setattr("smelt.compiler.detect", lambda: target)
    cases = [Case("LSTM", 3, 7, 8, 20, "bidirectional", init=True, peep=True, seq="rand"),
             Case("LSTM", 2, 9, 4, 260, "reverse", peep=True)]
    monkeypatch.setenv("SMELT_DEBUG", "1")  # keeps the generated C (source_path)
    model, _, _, _ = _models(cases, 0)
    src = smelt.compile(model, threads=1).source_path.read_text()
    native = [f for f in src.split("static __attribute__((noinline)) void ")[1:] if f.split("(")[0].endswith("_d2x1")]
    assert native and all("_mm256_fmadd_ps(b0, r" in f for f in native)
    _check(cases)
    gate_major = [Case("LSTM", 3, 13, 5, 256, init=True)]
    _check(gate_major, threads=(2,), transform=lambda m: annotate(m, grid=(2, 1)))


def test_schedule_stage_decides_rnn():
    """The RNN's decisions are made by smelt.schedule.rnn, not the template: every recurrent node
    of a lowered graph carries a frozen RnnSchedule; a forced attribute wins over the cost model
    (level, pipeline); the pipeline plan is taken exactly when pipeline_cost predicts it 10%
    faster; a graph that skipped the schedule stage fails with a message naming the node."""
    from smelt.codegen.kernels.rnn_config import config, gate_split_rows
    from smelt.codegen.kernels.rnn_vec import rnn_vec
    from smelt.compiler import lower
    from smelt.errors import VerifyError
    from smelt.frontend.zoo.rnn import lstm_model
    from smelt.options import CompileOptions
    from smelt.schedule.rnn import RnnSchedule, pipeline_chain, pipeline_cost

    target = detect()
    opts = CompileOptions(threads=2, use_tuning_db=False)
    for E, H, T in ((16, 16, 50), (256, 256, 20)):
        g = lower(lstm_model(E, H, 1, T, layers=2), opts, target)
        lstms = [n for n in g.nodes if n.op == "LSTM"]
        s = lstms[0].schedule
        assert isinstance(s, RnnSchedule) and s.level == "wcs" and s.threads == opts.codegen_threads(target)
        with pytest.raises(dataclasses.FrozenInstanceError):
            s.level = "hoist"
        cfgs = [config(n, g)[0] for n in lstms]
        seq, pipe = pipeline_cost(cfgs, s.threads, target.l1d_bytes, target.l2_bytes,
                                  gate_split_rows(rnn_vec(target).acc_budget(target)))
        want = tuple(n.name for n in pipeline_chain(lstms[0], g)) if pipe < 0.9 * seq else ()
        assert s.pipeline == want and lstms[1].schedule.pipeline == want
        for forced in (True, False):
            gf = lower(annotate(lstm_model(E, H, 1, T, layers=2), schedule="wcs", pipeline=forced), opts, target)
            assert bool(next(n for n in gf.nodes if n.op == "LSTM").schedule.pipeline) == forced
    g = lower(annotate(lstm_model(8, 8, 1, 4), schedule="hoist"), opts, target)
    node = next(n for n in g.nodes if n.op == "LSTM")
    assert node.schedule.level == "hoist"
    node.schedule = None
    from smelt.codegen.emit import generate
    from smelt.codegen.plan import build_plan

    with pytest.raises(VerifyError, match=node.name):
        generate(g, build_plan(g, opts.force_fallback), target, opts.codegen_threads(target))


def test_single_step_without_initial_state_runs_one_thread_per_direction():
    """A T=1 node without an initial h has no h·R to split (its one step's h is zero): the grid
    is 1 x 1 at any pool size and cache sizes (Zen 4's and an AVX2 host's L2 given explicitly),
    while the same node with an initial h, or T=2, splits its hidden blocks over two threads."""
    from smelt.codegen.kernels.rnn_config import config
    from smelt.compiler import lower
    from smelt.frontend.zoo.rnn import lstm_model
    from smelt.options import CompileOptions
    from smelt.schedule.rnn import grid_for

    def cfg_of(model):
        g = lower(model, CompileOptions(threads=2, use_tuning_db=False), detect())
        return config(next(n for n in g.nodes if n.op == "LSTM"), g)[0]

    for l2 in (1 << 20, 1 << 19):
        assert grid_for(cfg_of(lstm_model(256, 256, 1, 1)), "wcs", 2, 1, 32768, l2) == {1: (1, 1)}
        assert grid_for(cfg_of(lstm_model(256, 256, 1, 1, initial_states=True)), "wcs", 2, 1, 32768, l2) == {1: (1, 2)}
        assert grid_for(cfg_of(lstm_model(256, 256, 1, 2)), "wcs", 2, 1, 32768, l2) == {1: (1, 2)}


def test_many_rows_over_l3_split_rows_not_hidden_blocks():
    """R streamed from L3 (H=1024: 16 MB): 20 batch rows on each thread's half of R would run as
    row chunks (above one gate-split pass), so the model takes 2 row groups of 10, each a
    gate-split pass over all of R (Emerald Rapids: 114.9 against 128.2 ms per call); 10 rows
    keep the hidden-block split, whatever the L2. With AVX2's smaller register budget the
    10-row split stays too (5 rows over all of R would stream twice the bytes)."""
    from smelt.codegen.kernels.rnn_config import config, gate_split_rows
    from smelt.compiler import lower
    from smelt.frontend.zoo.rnn import lstm_model
    from smelt.options import CompileOptions
    from smelt.schedule.rnn import grid_for

    def cfg_of(model):
        g = lower(model, CompileOptions(threads=2, use_tuning_db=False), detect())
        return config(next(n for n in g.nodes if n.op == "LSTM"), g)[0]

    b20, b10 = cfg_of(lstm_model(1024, 1024, 20, 2)), cfg_of(lstm_model(1024, 1024, 10, 2))
    for l2 in (2 << 20, 1 << 20, 1 << 19):
        for budget in (24, 6):
            split = gate_split_rows(budget)
            assert grid_for(b20, "wcs", 2, 20, 49152, l2, split_rows=split) == {20: (2, 1)}
            assert grid_for(b10, "wcs", 2, 10, 49152, l2, split_rows=split) == {10: (1, 2)}


def test_rnn_tuning_records_in_cache_key_every_layout(tmp_path, monkeypatch):
    """The RNN schedule reads the tuning database (kind "rnn") in every layout mode, so its
    records are part of the artifact key in every mode (under layout="nchw" they were not: a
    calibrated grid did not rebuild a cached model); with use_tuning_db=False neither."""
    from smelt.options import CompileOptions
    from smelt.schedule import db as tdb
    from smelt.schedule.stage import fingerprint_for as tuning_fingerprint

    monkeypatch.setenv("SMELT_TUNING_DB", str(tmp_path / "tune.sqlite"))
    monkeypatch.setattr(tdb, "_opened", {})
    target = detect()
    modes = [CompileOptions(threads=2, layout=m) for m in ("nchw", "propagate")]
    db = tdb.open_default()
    before = [tuning_fingerprint(o, target) for o in modes]
    db.store("rnn", {"op": "LSTM", "E": 5, "H": 20, "B": 3, "T": 4, "D": 1, "lbr": 0, "threads": 2}, target.key(),
             {"xi": 1, "xj": 2}, 1e-3)
    after = [tuning_fingerprint(o, target) for o in modes]
    assert all(a != b for a, b in zip(after, before, strict=True))
    assert tuning_fingerprint(CompileOptions(threads=2, layout="nchw", use_tuning_db=False), target) == ""
