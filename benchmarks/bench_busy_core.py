"""How much smelt and onnxruntime slow down when another process keeps one core busy.

Both engines run 2 threads (onnxruntime: intra_op_num_threads=2, inter_op_num_threads=1).
A busy process (a Python spin loop pinned to ``--busy-cpu``) is started once and toggled with
SIGSTOP/SIGCONT. Each round times every engine for BLOCK_S seconds quiet and BLOCK_S seconds
busy, back to back (which comes first alternates by round), so an engine's quiet and busy
blocks are at most a second apart: the load other processes put on a shared machine drifts
slowly and mostly cancels out of the ratio. Reported per engine: median latency quiet and busy
over all rounds, their ratio (the slowdown), the median of the per-round ratios, and the
same for the mean (throughput: calls a descheduled thread stalled weigh in).

Calls are back to back, as a serving loop makes them: after a pause a woken worker has CPU
credit and preempts the busy process at once, so calls after pauses would hide the slowdown.

``--pools both`` (default) also runs smelt with SMELT_POOL_SHARE=0, the barrier pool (every
worker enters every job, a barrier between steps: the pool before work sharing), so the old
and the new pool are compared in the same run.

    python benchmarks/bench_busy_core.py [--models resnet18 lstm] [--rounds 8] [--busy-cpu 1]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

import numpy as np
import onnxruntime as ort

import smelt
from smelt.frontend.zoo import load_model_or_zoo

BLOCK_S = 0.3  # seconds of timed calls per engine and phase in a round
SETTLE_S = 0.1  # untimed calls after each switch (engine, or busy process resumed)
GAP = 0.03  # seconds of pause before an engine's block (the other engine's workers stop spinning)


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


def block(fn, seconds: float) -> list[float]:
    end = time.perf_counter() + SETTLE_S
    while time.perf_counter() < end:
        fn()
    times: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 3:
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return times


def busy(cpu: int) -> subprocess.Popen:
    code = f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"
    return subprocess.Popen([sys.executable, "-c", code])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["resnet18", "lstm"])
    ap.add_argument("--busy-cpu", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--pools", choices=["both", "sharing"], default="both")
    args = ap.parse_args()
    pools = ["sharing", "barrier"] if args.pools == "both" else ["sharing"]
    proc = busy(args.busy_cpu)
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        for name in args.models:
            runners, _ = make_runners(name, pools)
            quiet: dict[str, list[float]] = {k: [] for k in runners}
            loaded: dict[str, list[float]] = {k: [] for k in runners}
            ratios: dict[str, list[float]] = {k: [] for k in runners}
            for r in range(args.rounds):
                for k, fn in runners.items():
                    got = {}
                    for ph in (("quiet", "busy") if r % 2 == 0 else ("busy", "quiet")):
                        time.sleep(GAP)
                        if ph == "busy":
                            os.kill(proc.pid, signal.SIGCONT)
                        try:
                            got[ph] = block(fn, BLOCK_S)
                        finally:
                            if ph == "busy":
                                os.kill(proc.pid, signal.SIGSTOP)
                    quiet[k] += got["quiet"]
                    loaded[k] += got["busy"]
                    ratios[k].append(float(np.median(got["busy"]) / np.median(got["quiet"])))
            print(f"{name}: busy process on CPU {args.busy_cpu}, {args.rounds} rounds. Median ms quiet, busy, "
                  "slowdown; median of the per-round slowdowns; mean ms quiet, busy, slowdown (the mean is "
                  "throughput: it counts the calls a descheduled thread stalled)")
            for k in runners:
                q, b = float(np.median(quiet[k])) * 1e3, float(np.median(loaded[k])) * 1e3
                qm, bm = float(np.mean(quiet[k])) * 1e3, float(np.mean(loaded[k])) * 1e3
                print(f"  {k:15s} {q:8.3f} {b:8.3f} x{b / q:5.2f}   x{float(np.median(ratios[k])):5.2f}   "
                      f"{qm:8.3f} {bm:8.3f} x{bm / qm:5.2f}", flush=True)
    finally:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    main()
