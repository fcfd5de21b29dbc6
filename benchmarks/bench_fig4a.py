"""ModelCompiler's Fig. 4(a): stacked LSTMs, hidden 128, sequence 17, batch 1, 1 to 8 layers.

    python benchmarks/bench_fig4a.py [--threads 2 1] [--rounds 7] [--layers 1 2 3 4 5 6 7 8]

Each model is the zoo's stacked LSTM (``lstm_model(128, 128, 1, 17, layers=L)``: input and
hidden 128, as in the paper) in fp32, and the same model quantized by onnxruntime's
``quantize_dynamic`` (QInt8: one com.microsoft DynamicQuantizeLSTM per layer, int8 weights, X
and h quantized to uint8 at run time). ModelCompiler compared against CNTK; onnxruntime takes
that place here (fp32 and its own int8 kernels on the same files). All engines run in one
process, interleaved (``smelt.bench.timing.time_interleaved``), medians of the rounds.

Columns: latency in ms of smelt fp32, smelt int8, onnxruntime fp32, onnxruntime int8; smelt's
int8 speedup over its fp32; the maximum |difference| of the int8 output (the last layer's
sequence, y) from smelt's fp32 output, and of onnxruntime's int8 from its fp32 (the
quantization error, growing with depth); and smelt int8 against onnxruntime int8 on the same
file (float rounding only).

int16: not run. The paper's 16-bit form has no counterpart here: DynamicQuantizeLSTM's schema
takes 8-bit weights only, onnxruntime's quantizer writes no 16-bit LSTM (16 bits only in QDQ
form for MatMul/Conv-like ops), and smelt has no 16-bit recurrent kernel.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import QuantType, quantize_dynamic

import smelt
from smelt.bench.timing import time_interleaved
from smelt.frontend.zoo.rnn import lstm_model

HIDDEN, SEQ, BATCH = 128, 17, 1


def _ort(path: str, threads: int) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[2, 1])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--layers", type=int, nargs="+", default=list(range(1, 9)))
    args = ap.parse_args()
    logging.getLogger().setLevel(logging.ERROR)  # quantize_dynamic's pre-processing advice
    x = {"x": np.random.default_rng(0).standard_normal((SEQ, BATCH, HIDDEN)).astype(np.float32)}
    with tempfile.TemporaryDirectory() as tmp:
        for threads in args.threads:
            print(f"\nFig. 4(a): stacked LSTM, input = hidden = {HIDDEN}, sequence {SEQ}, batch {BATCH}; "
                  f"{threads} thread{'s' if threads > 1 else ''}; load average {os.getloadavg()[0]:.1f} on "
                  f"{os.cpu_count()} cpus (machine possibly shared: interleaved medians)")
            print(f"{'layers':>6s} {'smelt fp32':>10s} {'smelt int8':>10s} {'ort fp32':>9s} {'ort int8':>9s} "
                  f"{'int8/fp32':>9s} {'max|d| smelt':>12s} {'max|d| ort':>10s} {'smelt-ort int8':>14s}")
            for layers in args.layers:
                fp32, q8 = Path(tmp) / f"l{layers}.onnx", Path(tmp) / f"l{layers}_int8.onnx"
                if not q8.exists():
                    onnx.save(lstm_model(HIDDEN, HIDDEN, BATCH, SEQ, layers=layers), str(fp32))
                    quantize_dynamic(str(fp32), str(q8), weight_type=QuantType.QInt8)
                sf, sq = smelt.compile(str(fp32), threads=threads), smelt.compile(str(q8), threads=threads)
                of, oq = _ort(str(fp32), threads), _ort(str(q8), threads)
                assert not sq.fallback_nodes, sq.fallback_nodes
                yf, yq = sf.run(x)[0], sq.run(x)[0]
                rf, rq = of.run(None, x)[0], oq.run(None, x)[0]
                fns = {"sf": lambda m=sf: m.run(x), "sq": lambda m=sq: m.run(x),
                       "of": lambda s=of: s.run(None, x), "oq": lambda s=oq: s.run(None, x)}
                samples = time_interleaved(fns, args.rounds, warmup=3, block=5)
                ms = {k: statistics.median(v) for k, v in samples.items()}
                print(f"{layers:6d} {ms['sf']:10.3f} {ms['sq']:10.3f} {ms['of']:9.3f} {ms['oq']:9.3f} "
                      f"{ms['sf'] / ms['sq']:8.2f}x {float(np.abs(yq - yf).max()):12.2e} "
                      f"{float(np.abs(rq - rf).max()):10.2e} {float(np.abs(yq - rq).max()):14.1e}", flush=True)
                sf.close()
                sq.close()


if __name__ == "__main__":
    main()
