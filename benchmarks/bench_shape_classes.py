"""An OCR model called with many input widths: compiles, first-call time, per-call latency.

Issue 15's acceptance: an OCR-style model called with 50 different input widths compiles once,
and its per-call latency is within 15% of a shape-specialized build. This script
1. compiles the model once (``share_shapes=True``, the default) and calls it with ``--widths``
   random widths, checking each answer against onnxruntime and counting C compiler runs;
2. for ``--specialized`` of those widths, builds a shape-specialized model
   (``share_shapes=False``: decided and compiled for that width alone) and times the shared
   build, the specialized build and onnxruntime interleaved (each first in turn, 50 ms idle
   between engines so one's spinning workers do not slow the next), ``--rounds`` rounds of
   ``--calls`` calls each, 2 threads each; medians.

    python benchmarks/bench_shape_classes.py [wild:ddddocr-rec] [--widths 50] [--specialized 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnxruntime as ort

import smelt
from smelt.bench.harness import resolve_model
from smelt.codegen import toolchain
from smelt.target import detect


def _count_compiles() -> list[int]:
    """Counts C compiler runs from here on (wraps the toolchain's one compile function)."""
    runs = [0]
    real = toolchain._compile

    def counted(*args, **kwargs):
        runs[0] += 1
        return real(*args, **kwargs)

    toolchain._compile = counted
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", default="wild:ddddocr-rec")
    ap.add_argument("--input", default=None, help="the input whose last dimension is the width (default: the first)")
    ap.add_argument("--widths", type=int, default=50)
    ap.add_argument("--min-width", type=int, default=48)
    ap.add_argument("--max-width", type=int, default=640)
    ap.add_argument("--specialized", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    bm = resolve_model(args.model)
    name = args.input or next(iter(bm.feeds))
    base_shape = list(bm.feeds[name].shape)
    rng = np.random.default_rng(0)
    widths = [int(w) for w in rng.choice(np.arange(args.min_width, args.max_width + 1), args.widths, replace=False)]
    tgt = detect()
    print(f"{args.model}: input {name!r} {base_shape[:-1]} x width; {len(widths)} widths "
          f"{args.min_width}..{args.max_width}; {args.threads} threads; CPU {tgt.model_name} ({tgt.isa})")

    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    sess = ort.InferenceSession(bm.proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    runs = _count_compiles()
    shared = smelt.compile(bm.proto, threads=args.threads)
    first_calls, worst = [], 0.0
    feeds_for = {}
    for i, w in enumerate(widths):
        feeds = dict(bm.feeds)
        feeds[name] = rng.random(base_shape[:-1] + [w], dtype=np.float32)
        feeds_for[w] = feeds
        t = time.perf_counter()
        got = shared.run(feeds)
        first_calls.append(time.perf_counter() - t)
        want = sess.run(None, feeds)
        for g, r in zip(got, want, strict=True):
            worst = max(worst, float(np.max(np.abs(g - r)) / (np.max(np.abs(r)) + 1e-12)))
        print(f"  [{i + 1}/{len(widths)}] width {w}: first call {first_calls[-1]:.2f} s, "
              f"C compiler runs so far {runs[0]}", flush=True)
    print(f"C compiler runs for {len(widths)} widths: {runs[0]}; first call median "
          f"{statistics.median(first_calls):.2f} s (the first width {first_calls[0]:.1f} s); "
          f"largest relative difference from onnxruntime {worst:.2e}")

    print(f"\n{'width':>6} {'shared ms':>10} {'specialized ms':>15} {'onnxruntime ms':>15} {'shared/specialized':>19}")
    ratios = []
    for w in widths[: args.specialized]:
        feeds = feeds_for[w]
        special = smelt.compile(bm.proto, threads=args.threads, share_shapes=False,
                                input_shapes={k: v.shape for k, v in feeds.items()})
        engines = {"shared": lambda f=feeds: shared.run(f), "special": lambda f=feeds, s=special: s.run(f),
                   "ort": lambda f=feeds: sess.run(None, f)}
        for run in engines.values():
            run()
        times: dict[str, list[float]] = {k: [] for k in engines}
        order = list(engines)
        for r in range(args.rounds):
            for key in order[r % 3:] + order[:r % 3]:  # each engine first in turn
                run = engines[key]
                time.sleep(0.05)  # the previous engine's spinning workers leave the cores first
                t = time.perf_counter()
                for _ in range(args.calls):
                    run()
                times[key].append((time.perf_counter() - t) / args.calls * 1e3)
        med = {k: statistics.median(v) for k, v in times.items()}
        ratios.append(med["shared"] / med["special"])
        print(f"{w:>6} {med['shared']:>10.3f} {med['special']:>15.3f} {med['ort']:>15.3f} {ratios[-1]:>19.3f}")
    print(f"geomean shared/specialized: {float(np.exp(np.mean(np.log(ratios)))):.3f} "
          f"(worst {max(ratios):.3f})")


if __name__ == "__main__":
    main()
