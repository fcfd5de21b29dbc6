"""Timing engines fairly: warm-up, then rounds interleaved across engines, medians reported."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

# A settle lasts until the process's threads used under IDLE_CPU of CPU time in an IDLE_SLICE of
# wall time (every engine's spinning workers gone to sleep), at most SETTLE_MOST seconds.
IDLE_SLICE = 0.01
IDLE_CPU = 0.001
SETTLE_MOST = 0.5


def settle_idle(least: float, most: float = SETTLE_MOST) -> None:
    """Sleep ``least`` seconds, then on until this process's threads are idle (CPU time of all
    of them, ``time.process_time``), at most ``most`` seconds in all. onnxruntime 1.32's
    intra-op workers keep spinning about 100 ms after a call (process CPU time after a block of
    LSTM E=H=256 B=10 calls at 2 threads: 17-35 ms in the first 50 ms, 37-41 ms by 100 ms, 2-4
    ms more in the next 100 ms), so a fixed 50 ms settle let them spin on the cores through the
    first ~50 ms of the next engine's block. (A/B on the shared VM, quiet moments, smelt vs
    onnxruntime on that LSTM: 1.01x and 0.98x with the fixed settle, 1.02x and 1.01x with this
    one: within the noise, so a fairness fix, not a measured speed-up.)"""
    start = time.perf_counter()
    time.sleep(least)
    while time.perf_counter() - start < most:
        cpu = time.process_time()
        time.sleep(IDLE_SLICE)
        if time.process_time() - cpu < IDLE_CPU:
            return


def time_interleaved(fns: dict[str, Callable[[], object]], rounds: int, warmup: int = 3, block: int = 5,
                     settle: float = 0.05, rotate: bool = True,
                     on_round: Callable[[int], None] | None = None) -> dict[str, list[float]]:
    """Milliseconds per call of each function, engines interleaved in blocks.

    Each round gives every engine, in turn, ``block`` timed calls after one untimed call. Between
    engines the process idles at least ``settle`` seconds and until its threads are idle
    (``settle_idle``): engines keep their worker threads spinning for a while after a call
    (onnxruntime for ~100 ms), and a peer's spinning threads would otherwise sit on the cores
    the next engine's pinned workers need, which measures contention, not the engine. With
    ``rotate`` the engine that goes first changes every round, so no engine always follows the
    same neighbour. ``on_round(i)`` is called after each round (progress display).
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    names = list(fns)
    times: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(rounds):
        shift = r % len(names) if rotate and names else 0
        for name in names[shift:] + names[:shift]:
            fn = fns[name]
            if settle:
                settle_idle(settle)
            fn()
            for _ in range(block):
                start = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - start) * 1e3)
        if on_round is not None:
            on_round(r)
    return times


def median_and_spread(samples: list[float]) -> tuple[float, float]:
    """Median and interquartile range."""
    qs = statistics.quantiles(samples, n=4) if len(samples) >= 2 else [samples[0]] * 3
    return statistics.median(samples), qs[2] - qs[0]
