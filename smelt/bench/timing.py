"""Timing engines fairly: warm-up, then rounds interleaved across engines, medians reported."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def time_interleaved(fns: dict[str, Callable[[], object]], rounds: int, warmup: int = 3, block: int = 5,
                     settle: float = 0.05, rotate: bool = True,
                     on_round: Callable[[int], None] | None = None) -> dict[str, list[float]]:
    """Milliseconds per call of each function, engines interleaved in blocks.

    Each round gives every engine, in turn, ``block`` timed calls after one untimed call. Between
    engines the process idles ``settle`` seconds: engines keep their worker threads spinning for
    a while after a call (onnxruntime for 10+ ms), and a peer's spinning threads would otherwise
    sit on the cores the next engine's pinned workers need, which measures contention, not the
    engine. With ``rotate`` the engine that goes first changes every round, so no engine always
    follows the same neighbour. ``on_round(i)`` is called after each round (progress display).
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
                time.sleep(settle)
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
