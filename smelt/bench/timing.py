"""Timing engines fairly: warm-up, then rounds interleaved across engines, medians reported."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def time_interleaved(fns: dict[str, Callable[[], object]], rounds: int, warmup: int = 3, block: int = 5,
                     settle: float = 0.05) -> dict[str, list[float]]:
    """Milliseconds per call of each function, engines interleaved in blocks.

    Each round gives every engine, in turn, ``block`` timed calls after one untimed call. Between
    engines the process idles ``settle`` seconds: engines keep their worker threads spinning for
    a while after a call (onnxruntime for 10+ ms), and a peer's spinning threads would otherwise
    sit on the cores the next engine's pinned workers need, which measures contention, not the
    engine.
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            if settle:
                time.sleep(settle)
            fn()
            for _ in range(block):
                start = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - start) * 1e3)
    return times


def median_and_spread(samples: list[float]) -> tuple[float, float]:
    """Median and interquartile range."""
    qs = statistics.quantiles(samples, n=4) if len(samples) >= 2 else [samples[0]] * 3
    return statistics.median(samples), qs[2] - qs[0]
