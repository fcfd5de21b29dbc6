"""How much smelt and onnxruntime slow down when another process keeps one core busy.

Both engines run 2 threads (onnxruntime: intra_op_num_threads=2). Each model is timed quiet,
then with a busy process (a Python spin loop pinned to ``--busy-cpu``), then quiet again, in
interleaved blocks of runs (engines alternate within a phase; GAP seconds between blocks so one
engine's spinning workers have stopped before the other runs). Reported: per engine the median
latency per phase and the slowdown ratio busy / quiet (quiet = median over both quiet phases).

``--pools both`` (default) also runs smelt with SMELT_POOL_SHARE=0, the barrier pool (every
worker enters every job, a barrier between steps: the pool before work sharing), so old and
new pool are compared in the same run.

    python benchmarks/bench_busy_core.py [--models resnet18 lstm] [--runs 60] [--busy-cpu 1] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np
import onnxruntime as ort

import smelt
from smelt.frontend.zoo import load_model_or_zoo

BLOCK = 5  # timed runs per engine before switching
SETTLE = 2  # untimed runs after each switch
GAP = 0.03  # seconds between blocks (the other engine's workers stop spinning)


def make_runners(name: str, pools: list[str]) -> tuple[dict, dict]:
    proto, _, _ = load_model_or_zoo(f"zoo:{name}")
    rng = np.random.default_rng(0)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    feeds = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in i.shape]
        feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
    runners = {"onnxruntime": lambda: sess.run(None, feeds)}
    want = sess.run(None, feeds)
    for pool in pools:
        os.environ["SMELT_POOL_SHARE"] = "0" if pool == "barrier" else "1"
        m = smelt.compile(proto, threads=2)
        got = m.run(feeds)  # the pool is created at load, under this environment
        err = max(float(np.abs(g - w).max()) for g, w in zip(got, want, strict=True))
        assert err < 1e-3, f"{name} {pool}: max error {err}"
        runners[f"smelt-{pool}"] = (lambda m=m: m.run(feeds))
    os.environ.pop("SMELT_POOL_SHARE", None)
    return runners, feeds


def phase(runners: dict, runs: int) -> dict[str, float]:
    times: dict[str, list[float]] = {k: [] for k in runners}
    while min(len(v) for v in times.values()) < runs:
        for k, fn in runners.items():
            time.sleep(GAP)
            for _ in range(SETTLE):
                fn()
            for _ in range(BLOCK):
                t = time.perf_counter()
                fn()
                times[k].append(time.perf_counter() - t)
    return {k: float(np.median(v)) * 1e3 for k, v in times.items()}


def busy(cpu: int) -> subprocess.Popen:
    code = f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"
    return subprocess.Popen([sys.executable, "-c", code])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["resnet18", "lstm"])
    ap.add_argument("--runs", type=int, default=60, help="timed runs per engine per phase")
    ap.add_argument("--busy-cpu", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=1, help="quiet/busy/quiet rounds per model")
    ap.add_argument("--pools", choices=["both", "sharing"], default="both")
    args = ap.parse_args()
    pools = ["sharing", "barrier"] if args.pools == "both" else ["sharing"]
    for name in args.models:
        runners, _ = make_runners(name, pools)
        for r in range(args.rounds):
            q1 = phase(runners, args.runs)
            proc = busy(args.busy_cpu)
            time.sleep(0.3)
            try:
                b = phase(runners, args.runs)
            finally:
                proc.kill()
                proc.wait()
            time.sleep(0.3)
            q2 = phase(runners, args.runs)
            print(f"{name} round {r}: busy process on CPU {args.busy_cpu}, median ms (quiet1 / busy / quiet2) and slowdown")
            for k in runners:
                quiet = (q1[k] + q2[k]) / 2
                print(f"  {k:15s} {q1[k]:8.3f} {b[k]:8.3f} {q2[k]:8.3f}   x{b[k] / quiet:6.2f}", flush=True)


if __name__ == "__main__":
    main()
