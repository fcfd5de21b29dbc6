"""smelt vs onnxruntime latency on zoo models, same threads, interleaved rounds, medians.

    python benchmarks/baseline_latency.py --models resnet50 lstm --threads 2 --rounds 50

Prints a markdown table (median ms, interquartile range, speedup) and, with --cold, the cold
compile time of each model measured in a fresh cache directory.
"""

from __future__ import annotations

import argparse
import datetime
import os
import tempfile
import time

import numpy as np
import onnxruntime as ort

import smelt
from smelt.bench.timing import median_and_spread, time_interleaved
from smelt.frontend import zoo


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["resnet50", "lstm"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--cold", action="store_true", help="also time a cold compile in a fresh cache")
    args = ap.parse_args()
    print(f"date {datetime.date.today()}, threads {args.threads}, rounds {args.rounds}")
    print("| model | smelt ms (IQR) | onnxruntime ms (IQR) | speedup | cold compile s |")
    print("|---|---:|---:|---:|---:|")
    for name in args.models:
        model = zoo.get_model(name)
        cold = ""
        if args.cold:
            os.environ["SMELT_CACHE_DIR"] = tempfile.mkdtemp()
            start = time.perf_counter()
            smelt.compile(model, threads=args.threads)
            cold = f"{time.perf_counter() - start:.1f}"
        cm = smelt.compile(model, threads=args.threads)
        rng = np.random.default_rng(0)
        feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
                 for i in model.graph.input}
        so = ort.SessionOptions()
        so.intra_op_num_threads = args.threads
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        ref = sess.run(None, feeds)
        got = cm.run(feeds)
        err = max(float(np.max(np.abs(a - b)) / np.max(np.abs(b))) for a, b in zip(got, ref, strict=True))
        assert err <= 1e-4, f"{name}: relative error {err}"
        times = time_interleaved({"smelt": lambda c=cm, f=feeds: c.run(f),
                                  "ort": lambda s=sess, f=feeds: s.run(None, f)},
                                 args.rounds, warmup=5, block=5, settle=0.05)
        (sm, siqr), (om, oiqr) = median_and_spread(times["smelt"]), median_and_spread(times["ort"])
        print(f"| {name} | {sm:.3f} ({siqr:.3f}) | {om:.3f} ({oiqr:.3f}) | {om / sm:.2f}x | {cold} |", flush=True)


if __name__ == "__main__":
    main()
