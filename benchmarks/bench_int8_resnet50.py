"""ResNet-50 int8 (written by `smelt quantize`) against smelt's fp32 and onnxruntime on both.

    smelt quantize zoo:resnet50 -o r50q.onnx --calibration CALIB_DIR
    python benchmarks/bench_int8_resnet50.py r50q.onnx [--rounds 3]

Prints which ops the quantized model runs as, smelt's difference from onnxruntime on the same QDQ
file, the SQNR of smelt's int8 output against onnxruntime's fp32 output, then per round the
median of 10 calls per engine (2 threads, engines one after the other). ``--cpu-time`` (with
``--threads 1``) times each call by the calling thread's CPU time instead of the wall clock: at one
thread smelt and onnxruntime both run on the calling thread, and on a shared machine the CPU time
does not count the time the thread waited for a core.
"""

from __future__ import annotations

import argparse
import collections
import time

import numpy as np
import onnx
import onnxruntime as ort

import smelt
from smelt.frontend.zoo import get_model


def _median_ms(fn, n: int = 10, clock=time.perf_counter) -> float:
    times = []
    for _ in range(n):
        start = clock()
        fn()
        times.append(clock() - start)
    return float(np.median(times) * 1e3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", help="the quantized ResNet-50 (.onnx)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cpu-time", action="store_true", help="the calling thread's CPU time (use with --threads 1)")
    args = ap.parse_args()
    quantized = onnx.load(args.model)
    name = quantized.graph.input[0].name
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    fp32 = get_model("resnet50")
    fp32 = fp32[0] if isinstance(fp32, tuple) else fp32
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    ort_q = ort.InferenceSession(quantized.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    ort_f = ort.InferenceSession(fp32.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    ours_q = smelt.compile(quantized, threads=args.threads)
    ours_f = smelt.compile(fp32, threads=args.threads)
    clock = time.thread_time if args.cpu_time else time.perf_counter
    print("smelt int8 runs:", collections.Counter(op for _, op in ours_q.native_nodes).most_common(),
          "fallback:", ours_q.fallback_nodes)
    got, ref_q, ref_f = ours_q.run({name: x})[0], ort_q.run(None, {name: x})[0], ort_f.run(None, {name: x})[0]
    err = ((ref_f.astype(np.float64) - got) ** 2).sum()
    print(f"max |smelt - onnxruntime| on the QDQ file {np.abs(got - ref_q).max():.4g}; "
          f"SQNR vs fp32 {10 * np.log10((ref_f.astype(np.float64) ** 2).sum() / err):.1f} dB; "
          f"argmax {got.argmax()} / {ref_f.argmax()}")
    for _ in range(args.rounds):
        calls = [lambda: ours_q.run({name: x}), lambda: ours_f.run({name: x}), lambda: ort_q.run(None, {name: x}),
                 lambda: ort_f.run(None, {name: x})]
        times = [_median_ms(call, clock=clock) for call in calls]
        print("smelt int8 {:.1f}  smelt fp32 {:.1f}  onnxruntime int8 {:.1f}  onnxruntime fp32 {:.1f} ms".format(*times))


if __name__ == "__main__":
    main()
