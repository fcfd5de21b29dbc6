"""A CNN quantized by `smelt quantize` against smelt's fp32 and onnxruntime on both.

    smelt quantize zoo:mobilenet_v2 -o mbv2q.onnx --calibration CALIB_DIR
    python benchmarks/bench_int8_cnn.py mbv2q.onnx mobilenet_v2 [--rounds 5] [--isa avx2]

Prints which ops the quantized model runs as, smelt's difference from onnxruntime on the same QDQ
file, the SQNR of smelt's int8 output against onnxruntime's fp32 output, then per round the
median of ``--calls`` calls per engine, engines interleaved in blocks with an idle gap between
them (``smelt.bench.timing.time_interleaved``: called back to back, onnxruntime's spinning
workers sat on the core smelt's worker needed, and 2 threads measured as 1), and at the end the
medians over rounds and the ratios. ``--isa`` forces smelt's ISA (both of smelt's models; onnxruntime runs
what it detects). ``--cpu-time`` (with ``--threads 1``) times each call by the calling thread's
CPU time instead, engines interleaved call by call (a busy spell on a shared machine lands on
all of them).
"""

from __future__ import annotations

import argparse
import collections
import time

import numpy as np
import onnx
import onnxruntime as ort

import smelt
from smelt.bench.timing import time_interleaved
from smelt.frontend.zoo import get_model


def sqnr_db(ref: np.ndarray, got: np.ndarray) -> float:
    ref = ref.astype(np.float64)
    return float(10 * np.log10((ref ** 2).sum() / ((ref - got) ** 2).sum()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", help="the quantized model (.onnx)")
    ap.add_argument("fp32", help="the fp32 model: a zoo name (resnet50, mobilenet_v2) or an .onnx path")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--isa", default=None, help="force smelt's ISA (avx2, avx512, portable)")
    ap.add_argument("--no-ort-fp32", action="store_true", help="leave onnxruntime's fp32 out of the timing")
    ap.add_argument("--cpu-time", action="store_true", help="the calling thread's CPU time (use with --threads 1)")
    args = ap.parse_args()
    quantized = onnx.load(args.model)
    name = quantized.graph.input[0].name
    shape = [d.dim_value or 1 for d in quantized.graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    if args.fp32.endswith(".onnx"):
        fp32 = onnx.load(args.fp32)
    else:
        fp32 = get_model(args.fp32)
        fp32 = fp32[0] if isinstance(fp32, tuple) else fp32
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    ort_q = ort.InferenceSession(quantized.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    ort_f = ort.InferenceSession(fp32.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    kw = {"isa": args.isa} if args.isa else {}
    ours_q = smelt.compile(quantized, threads=args.threads, **kw)
    ours_f = smelt.compile(fp32, threads=args.threads, **kw)
    clock = time.thread_time if args.cpu_time else time.perf_counter
    got, ref_q, ref_f = ours_q.run({name: x})[0], ort_q.run(None, {name: x})[0], ort_f.run(None, {name: x})[0]
    print("smelt int8 runs:", collections.Counter(op for _, op in ours_q.native_nodes).most_common(),
          "fallback:", ours_q.fallback_nodes)
    print(f"max |smelt - onnxruntime| on the QDQ file {np.abs(got - ref_q).max():.4g}; "
          f"SQNR vs fp32: smelt {sqnr_db(ref_f, got):.1f} dB, onnxruntime {sqnr_db(ref_f, ref_q):.1f} dB; "
          f"argmax {got.argmax()} / {ref_f.argmax()}")
    engines = {"smelt int8": lambda: ours_q.run({name: x}), "smelt fp32": lambda: ours_f.run({name: x}),
               "onnxruntime int8": lambda: ort_q.run(None, {name: x})}
    if not args.no_ort_fp32:
        engines["onnxruntime fp32"] = lambda: ort_f.run(None, {name: x})
    rounds: dict[str, list[float]] = {k: [] for k in engines}
    if args.cpu_time:  # the calling thread's CPU time, call by call (1 thread: no pool to wait for)
        for call in engines.values():
            call()
        for _ in range(args.rounds):
            times: dict[str, list[float]] = {k: [] for k in engines}
            for _ in range(args.calls):
                for k, call in engines.items():
                    start = clock()
                    call()
                    times[k].append(clock() - start)
            for k in engines:
                rounds[k].append(float(np.median(times[k]) * 1e3))
            print("  ".join(f"{k} {rounds[k][-1]:.2f}" for k in engines), "ms")
    else:  # wall clock in blocks per engine with an idle gap between engines: called back to back,
        # onnxruntime's spinning workers sat on the core smelt's worker needs (2 threads measured as 1)
        samples = time_interleaved(engines, args.rounds, block=args.calls)
        for k, v in samples.items():
            rounds[k] = [float(np.median(v[i:i + args.calls])) for i in range(0, len(v), args.calls)]
        for r in range(args.rounds):
            print("  ".join(f"{k} {rounds[k][r]:.2f}" for k in engines), "ms")
    med = {k: float(np.median(v)) for k, v in rounds.items()}
    print("median:", "  ".join(f"{k} {t:.2f} ms" for k, t in med.items()))
    print(f"int8 speed-up: {med['smelt fp32'] / med['smelt int8']:.2f}x smelt fp32, "
          f"{med['onnxruntime int8'] / med['smelt int8']:.2f}x onnxruntime int8")


if __name__ == "__main__":
    main()
