"""The int8 dynamically quantized RNN suite: DeepCPU Table 1 shapes, smelt against onnxruntime.

    python benchmarks/bench_int8_rnn.py [--threads 2 1] [--rounds 5] [--all-batches] [--json OUT]

Per shape (the fp32 `rnn` suite's, ``smelt.frontend.zoo.rnn.deepcpu_table1``; batch 1 unless
``--all-batches``), the zoo's fp32 model is quantized by onnxruntime's own
``quantize_dynamic`` (QInt8 weights, per tensor: the default a user gets). Three engines, in one
process, interleaved (``smelt.bench.timing.time_interleaved``: rounds of a few calls per engine,
the order rotating, medians reported):

- ``smelt int8``: smelt on the quantized file (com.microsoft DynamicQuantizeLSTM, native);
- ``ort int8``: onnxruntime on the same file;
- ``smelt fp32``: smelt on the float model.

Before timing, smelt's int8 output is compared with onnxruntime's on the same file (they should
agree to float rounding: both quantize X once and h per row per step with the same rule) and
with smelt's fp32 output (the quantization error itself).

GRU: onnxruntime's quantizer has no quantized GRU (its IntegerOps registry quantizes LSTM but
not GRU; ``op_types_to_quantize=["GRU"]`` is a no-op), so ``quantize_dynamic`` returns the GRU
unchanged, in fp32. There is no int8 GRU on either side to compare, so the suite's GRU rows
time both engines on the file ``quantize_dynamic`` writes: what a user who asks onnxruntime for
an int8 GRU gets (fp32 against fp32; the fp32 `rnn` suite covers the same kernels). A GRU
written by hand from MatMuls inside a Scan would quantize, but would compare per-node
dispatch rather than a recurrent kernel, and is no model an exporter writes.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import QuantType, quantize_dynamic

import smelt
from smelt.bench.timing import time_interleaved
from smelt.frontend.zoo.rnn import deepcpu_table1, lstm_model


def _ort(path: str, threads: int) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def bench_shape(cell: str, e: int, h: int, b: int, t: int, threads: int, rounds: int, work: Path) -> dict:
    tag = f"{cell}-E{e}-H{h}-B{b}-T{t}"
    fp32, q8 = work / f"{tag}.onnx", work / f"{tag}_int8.onnx"
    if not q8.exists():
        onnx.save(lstm_model(e, h, b, t, cell=cell), str(fp32))
        quantize_dynamic(str(fp32), str(q8), weight_type=QuantType.QInt8)
    ops = [n.op_type for n in onnx.load(str(q8)).graph.node]
    feeds = {"x": np.random.default_rng(0).standard_normal((t, b, e)).astype(np.float32)}
    sq = smelt.compile(str(q8), threads=threads)
    sf = smelt.compile(str(fp32), threads=threads)
    oq = _ort(str(q8), threads)
    try:
        got, ref, flt = sq.run(feeds)[0], oq.run(None, feeds)[0], sf.run(feeds)[0]
        fns = {"smelt int8": lambda: sq.run(feeds), "ort int8": lambda: oq.run(None, feeds),
               "smelt fp32": lambda: sf.run(feeds)}
        samples = time_interleaved(fns, rounds, warmup=3, block=5)
        fallback = sq.fallback_nodes  # (close() below frees the variant it names them from)
    finally:
        sq.close()
        sf.close()
    med = {k: statistics.median(v) for k, v in samples.items()}
    return {"model": tag, "threads": threads, "quantized_ops": sorted(set(ops) - {"Squeeze"}),
            "fallback": fallback, "ms": med,
            "vs_ort_int8": med["ort int8"] / med["smelt int8"], "vs_smelt_fp32": med["smelt fp32"] / med["smelt int8"],
            "max_diff_vs_ort_int8": float(np.abs(got - ref).max()),
            "max_diff_vs_fp32": float(np.abs(got - flt).max())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[2, 1])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--all-batches", action="store_true", help="also the batch 10 and 20 shapes")
    ap.add_argument("--cells", nargs="+", default=["lstm", "gru"], choices=["lstm", "gru"])
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    logging.getLogger().setLevel(logging.ERROR)  # quantize_dynamic's pre-processing advice
    shapes = [s for s in deepcpu_table1() if args.all_batches or s[2] == 1]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for threads in args.threads:
            print(f"\n{threads} thread{'s' if threads > 1 else ''}; load average {os.getloadavg()[0]:.1f} on "
                  f"{os.cpu_count()} cpus (the machine may be shared: medians of interleaved rounds)")
            print("GRU rows: quantize_dynamic leaves a GRU in fp32, so their int8 columns are that fp32 file")
            print(f"{'model':26s} {'ops':22s} {'smelt int8':>10s} {'ort int8':>9s} {'smelt fp32':>10s} "
                  f"{'vs ort':>7s} {'vs fp32':>7s} {'|d| ort':>8s} {'|d| fp32':>8s}")
            for cell in args.cells:
                for e, h, b, t in shapes:
                    r = bench_shape(cell, e, h, b, t, threads, args.rounds, Path(tmp))
                    rows.append(r)
                    ms = r["ms"]
                    ops = ",".join(r["quantized_ops"]) + ("" if "DynamicQuantizeLSTM" in r["quantized_ops"]
                                                          else " (fp32)")
                    print(f"{r['model']:26s} {ops:22s} {ms['smelt int8']:10.3f} "
                          f"{ms['ort int8']:9.3f} {ms['smelt fp32']:10.3f} {r['vs_ort_int8']:6.2f}x "
                          f"{r['vs_smelt_fp32']:6.2f}x {r['max_diff_vs_ort_int8']:8.1e} {r['max_diff_vs_fp32']:8.1e}",
                          flush=True)
    lstm = [r for r in rows if r["model"].startswith("lstm")]
    if lstm:
        for threads in args.threads:
            mine = [r for r in lstm if r["threads"] == threads]
            worst_ort = min(mine, key=lambda r: r["vs_ort_int8"])
            worst_f = min(mine, key=lambda r: r["vs_smelt_fp32"])
            print(f"LSTM, {threads} thread(s): slowest against ort int8 {worst_ort['model']} "
                  f"{worst_ort['vs_ort_int8']:.2f}x; against smelt fp32 {worst_f['model']} {worst_f['vs_smelt_fp32']:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"argv": sys.argv, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
