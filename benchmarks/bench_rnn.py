"""Time smelt's native LSTM / GRU / RNN against onnxruntime (same thread count).

Each case is a one-node model with constant weights (as PyTorch exports them); both engines
run it interleaved, in alternating blocks of BLOCK timed runs, and the median (and best)
latency is reported. smelt's time includes its Python call overhead (~10-20 us per call).

Why blocks and a pause: both engines' worker threads spin-wait after a run (smelt:
$SMELT_SPIN_US, 2 ms by default; onnxruntime's intra-op workers: >10 ms here), so on a 2-core
machine strictly alternating runs makes one engine's spinning workers steal a core from the
other's run (measured: a 50 us GRU took 2.4 ms in 99% of runs right after onnxruntime runs,
0.05 ms after a 50 ms pause). So each switch sleeps GAP seconds and the first SETTLE runs after
it are run but not timed.

    python benchmarks/bench_rnn.py [--threads 1 2] [--runs 200] [--only lstm]

DeepCPU's Fig. 4(a) ablation (per-step fused GEMM baseline -> +hoisting -> +PCP -> +WCS, the
``smelt_rnn_schedule`` levels of the rnn template), as a table and a chart:

    python benchmarks/bench_rnn.py --ablation [--rounds 10] [--chart docs/images/rnn_ablation.png]

DeepCPU's Fig. 5 curves (smelt vs onnxruntime: latency and GFLOPS against hidden size, sequence
length and batch size, LSTM), as charts:

    python benchmarks/bench_rnn.py --fig5 docs/images/rnn_fig5.png [--rounds 8]

ModelCompiler's Fig. 4(a) stacked LSTMs, pipeline plan vs layers one after another:

    python benchmarks/bench_rnn.py --stacked [--rounds 10]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import smelt

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
BLOCK = 10  # timed runs per engine before switching to the other
SETTLE = 3  # untimed runs after each switch
GAP = 0.05  # seconds of pause at each switch, for the other engine's workers to stop spinning
# name, op, E (input size), H, B, T, direction, extra attributes
CASES = [
    ("lstm_64_b1_t100", "LSTM", 64, 64, 1, 100, "forward", {}),
    ("lstm_256_b1_t100", "LSTM", 256, 256, 1, 100, "forward", {}),
    ("gru_64_b1_t100", "GRU", 64, 64, 1, 100, "forward", {"linear_before_reset": 1}),
    ("gru_256_b1_t100", "GRU", 256, 256, 1, 100, "forward", {"linear_before_reset": 1}),
    ("gru0_256_b1_t100", "GRU", 256, 256, 1, 100, "forward", {}),
    ("rnn_256_b1_t100", "RNN", 256, 256, 1, 100, "forward", {}),
    ("bilstm_256_b1_t100", "LSTM", 256, 256, 1, 100, "bidirectional", {}),
    ("lstm_256_b16_t50", "LSTM", 256, 256, 16, 50, "forward", {}),
    ("lstm_512_b1_t50", "LSTM", 512, 512, 1, 50, "forward", {}),
]


def rnn_case(op, e, h, b, t, direction, attrs, rng):
    d = 2 if direction == "bidirectional" else 1
    g = GATES[op]
    s = 1.0 / np.sqrt(h)
    inits = [numpy_helper.from_array(rng.uniform(-s, s, (d, g * h, e)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.uniform(-s, s, (d, g * h, h)).astype(np.float32), "R"),
             numpy_helper.from_array(rng.uniform(-s, s, (d, 2 * g * h)).astype(np.float32), "B")]
    outs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    node = helper.make_node(op, ["X", "W", "R", "B"], outs, hidden_size=h, direction=direction, **attrs)
    graph = helper.make_graph([node], "bench", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [t, b, e])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, {"X": rng.uniform(-1, 1, (t, b, e)).astype(np.float32)}


def bench(name: str, model: onnx.ModelProto, feeds: dict, threads: int, runs: int) -> None:
    compiled = smelt.compile(model, threads=threads)
    assert not compiled.fallback_nodes, compiled.fallback_nodes
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    ref = sess.run(None, feeds)
    out = compiled.run(feeds)
    err = max(float(np.abs(a - b).max() / max(1.0, float(np.abs(b).max()))) for a, b in zip(out, ref, strict=True))
    for _ in range(10):
        compiled.run(feeds)
        sess.run(None, feeds)
    ts, to = [], []
    for _ in range(max(1, runs // BLOCK)):  # interleaved blocks of runs (see the module doc)
        for fn, times in ((lambda: compiled.run(feeds), ts), (lambda: sess.run(None, feeds), to)):
            time.sleep(GAP)
            for i in range(BLOCK + SETTLE):
                t = time.perf_counter()
                fn()
                if i >= SETTLE:
                    times.append(time.perf_counter() - t)
    ms, mo = np.median(ts) * 1e3, np.median(to) * 1e3
    print(f"{name:20s} threads={threads}  smelt {ms:7.3f} ms (best {min(ts) * 1e3:7.3f})   "
          f"ort {mo:7.3f} ms (best {min(to) * 1e3:7.3f})   speedup {mo / ms:5.2f}x   err {err:.1e}", flush=True)
    compiled.close()


# DeepCPU Fig. 4(a): LSTMs as [batch, input = hidden], sequence length 100
ABLATION = [(1, 64), (1, 256), (1, 1024), (20, 64), (20, 256), (20, 1024)]


def ablation(threads: int, rounds: int, chart: str | None) -> None:
    """Median ms of each schedule level per config, timed interleaved (smelt.bench.timing)."""
    from smelt.bench.timing import time_interleaved
    from smelt.codegen.templates.rnn import SCHEDULES, annotate
    from smelt.frontend.zoo.rnn import lstm_model

    rows = []
    print(f"DeepCPU Fig. 4(a) ablation, LSTM T=100, {threads} threads, median ms of {rounds} rounds x 5 calls")
    print(f"{'[batch, size]':14s} " + " ".join(f"{s:>9s}" for s in SCHEDULES) + "   wcs speedup vs baseline")
    for b, h in ABLATION:
        model = lstm_model(h, h, b, 100)
        x = np.random.default_rng(0).uniform(-1, 1, (100, b, h)).astype(np.float32)
        cms = {s: smelt.compile(annotate(model, schedule=s), threads=threads) for s in SCHEDULES}
        outs = {s: cm.run({"x": x}) for s, cm in cms.items()}
        for s in SCHEDULES:  # every level computes the same thing
            assert all(np.abs(a - r).max() <= 1e-4 * max(1.0, np.abs(r).max())
                       for a, r in zip(outs[s], outs["wcs"], strict=True)), s
        times = time_interleaved({s: (lambda cm=cm, x=x: cm.run({"x": x})) for s, cm in cms.items()},
                                 rounds=rounds if h < 1024 else max(3, rounds // 3))
        med = {s: float(np.median(v)) for s, v in times.items()}
        rows.append(((b, h), med))
        print(f"{str([b, h]):14s} " + " ".join(f"{med[s]:9.3f}" for s in SCHEDULES)
              + f"   {med['baseline'] / med['wcs']:5.2f}x", flush=True)
        for cm in cms.values():
            cm.close()
    if chart:
        from smelt.bench.output import pyplot

        plt = pyplot()
        fig, ax = plt.subplots(figsize=(8, 4))
        width = 0.2
        for i, s in enumerate(SCHEDULES):
            ax.bar([j + i * width for j in range(len(rows))], [med["baseline"] / med[s] for _, med in rows],
                   width, label=s)
        ax.set_xticks([j + 1.5 * width for j in range(len(rows))], [str(list(c)) for c, _ in rows])
        ax.set_ylabel("speedup over per-step baseline")
        ax.set_xlabel("[batch, input/hidden size], LSTM, T=100")
        ax.set_title(f"DeepCPU Fig. 4(a) in smelt ({threads} threads)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(chart, dpi=110)
        print(f"chart: {chart}")


# DeepCPU Fig. 5 sweeps: (label, values, (E, H, B, T) as a function of the swept value)
FIG5 = [("hidden size (E=H, B=1, T=100)", [64, 128, 256, 512, 1024], lambda v: (v, v, 1, 100)),
        ("sequence length (E=H=256, B=1)", [1, 10, 25, 50, 100, 200], lambda v: (256, 256, 1, v)),
        ("batch size (E=H=256, T=100)", [1, 2, 5, 10, 20], lambda v: (256, 256, v, 100))]


def fig5(chart: str, threads: int, rounds: int) -> None:
    """Latency and GFLOPS of smelt and onnxruntime over DeepCPU's Fig. 5 sweeps (LSTM)."""
    from smelt.bench.output import pyplot
    from smelt.bench.timing import time_interleaved
    from smelt.frontend.zoo.rnn import lstm_model

    results = []
    for label, values, shape in FIG5:
        series = []
        for v in values:
            e, h, b, t = shape(v)
            model = lstm_model(e, h, b, t)
            x = np.random.default_rng(0).uniform(-1, 1, (t, b, e)).astype(np.float32)
            cm = smelt.compile(model, threads=threads)
            so = ort.SessionOptions()
            so.intra_op_num_threads = threads
            so.inter_op_num_threads = 1
            so.log_severity_level = 3
            sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
            fns = {"smelt": lambda cm=cm, x=x: cm.run({"x": x}),
                   "onnxruntime": lambda sess=sess, x=x: sess.run(None, {"x": x})}
            times = time_interleaved(fns, rounds=rounds)
            flop = 2.0 * t * b * 4 * h * (e + h)
            med = {k: float(np.median(ms)) for k, ms in times.items()}
            series.append((v, med, {k: flop / (ms * 1e-3) / 1e9 for k, ms in med.items()}))
            print(f"{label:32s} {v:5d}: smelt {med['smelt']:8.3f} ms  onnxruntime {med['onnxruntime']:8.3f} ms  "
                  f"({med['onnxruntime'] / med['smelt']:.2f}x)", flush=True)
            cm.close()
        results.append((label, series))
    plt = pyplot()
    fig, axes = plt.subplots(2, 3, figsize=(13, 6.5))
    for col, (label, series) in enumerate(results):
        xs = [v for v, _, _ in series]
        for eng, style in (("smelt", "o-"), ("onnxruntime", "s--")):
            axes[0][col].plot(xs, [m[eng] for _, m, _ in series], style, label=eng)
            axes[1][col].plot(xs, [g[eng] for _, _, g in series], style, label=eng)
        axes[0][col].set_yscale("log")
        axes[0][col].set_ylabel("latency, ms")
        axes[1][col].set_ylabel("GFLOPS")
        for row in (0, 1):
            axes[row][col].set_xlabel(label)
            axes[row][col].legend()
            if label.startswith(("hidden", "sequence")):
                axes[row][col].set_xscale("log", base=2)
    fig.suptitle(f"DeepCPU Fig. 5 in smelt: LSTM, {threads} threads")
    fig.tight_layout()
    fig.savefig(chart, dpi=110)
    print(f"chart: {chart}")


def stacked(threads: int, rounds: int) -> None:
    """ModelCompiler Fig. 4(a) stacks (E=H=128, T=17, B=1, 1-8 layers): the pipeline plan vs
    running the layers one after another (each with DeepCPU's schedule), and onnxruntime."""
    from smelt.bench.timing import time_interleaved
    from smelt.codegen.templates.rnn import annotate
    from smelt.frontend.zoo import get_model
    from smelt.frontend.zoo.rnn import modelcompiler_fig4a

    print(f"stacked LSTMs E=H=128 T=17 B=1, {threads} threads, median ms of {rounds} rounds x 5 calls")
    print(f"{'layers':>6s} {'pipeline':>9s} {'sequential':>10s} {'onnxrt':>8s}  pipeline gain  default plan")
    for name in modelcompiler_fig4a():
        model = get_model(name)
        layers = sum(n.op_type == "LSTM" for n in model.graph.node)
        x = np.random.default_rng(0).uniform(-1, 1, (17, 1, 128)).astype(np.float32)
        pipe = smelt.compile(annotate(model, pipeline=True), threads=threads)
        seq = smelt.compile(annotate(model, pipeline=False), threads=threads)
        default = smelt.compile(model, threads=threads)
        plan = "pipeline" if any("pipeline plan" in i.schedule.get("algorithm", "")
                                 for i in default.plan.step_infos()) else "sequential"
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        fns = {"pipeline": lambda p=pipe, x=x: p.run({"x": x}), "sequential": lambda s=seq, x=x: s.run({"x": x}),
               "onnxruntime": lambda s=sess, x=x: s.run(None, {"x": x})}
        med = {k: float(np.median(v)) for k, v in time_interleaved(fns, rounds=rounds).items()}
        print(f"{layers:6d} {med['pipeline']:9.3f} {med['sequential']:10.3f} {med['onnxruntime']:8.3f}  "
              f"{med['sequential'] / med['pipeline']:12.2f}x  {plan}", flush=True)
        for cm in (pipe, seq, default):
            cm.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--only", default="")
    ap.add_argument("--ablation", action="store_true", help="DeepCPU Fig. 4(a): schedule levels")
    ap.add_argument("--fig5", metavar="CHART.png", help="DeepCPU Fig. 5 sweeps vs onnxruntime")
    ap.add_argument("--stacked", action="store_true", help="ModelCompiler Fig. 4(a): pipeline vs sequential")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--chart", default=None)
    args = ap.parse_args()
    os.environ.setdefault("SMELT_CACHE_DIR", os.path.join(tempfile.gettempdir(), "smelt-bench-cache"))
    if args.ablation:
        ablation(max(args.threads), args.rounds, args.chart)
        return
    if args.stacked:
        stacked(max(args.threads), args.rounds)
        return
    if args.fig5:
        fig5(args.fig5, max(args.threads), args.rounds)
        return
    rng = np.random.default_rng(0)
    cases = [(name, *rnn_case(op, e, h, b, t, d, attrs, rng)) for name, op, e, h, b, t, d, attrs in CASES]
    for threads in args.threads:
        for name, model, feeds in cases:
            if args.only and args.only not in name:
                continue
            bench(name, model, feeds, threads, args.runs)


if __name__ == "__main__":
    main()
