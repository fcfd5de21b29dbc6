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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    os.environ.setdefault("SMELT_CACHE_DIR", os.path.join(tempfile.gettempdir(), "smelt-bench-cache"))
    rng = np.random.default_rng(0)
    cases = [(name, *rnn_case(op, e, h, b, t, d, attrs, rng)) for name, op, e, h, b, t, d, attrs in CASES]
    for threads in args.threads:
        for name, model, feeds in cases:
            if args.only and args.only not in name:
                continue
            bench(name, model, feeds, threads, args.runs)


if __name__ == "__main__":
    main()
