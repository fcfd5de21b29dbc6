"""Progress display for long-running commands: tqdm when installed, plain stderr lines otherwise."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TypeVar

T = TypeVar("T")


def track(items: Iterable[T], desc: str, total: int | None = None, enabled: bool = True) -> Iterator[T]:
    """Iterate with a progress bar on stderr."""
    if not enabled:
        yield from items
        return
    try:
        from tqdm import tqdm
    except ImportError:
        n = total if total is not None else (len(items) if hasattr(items, "__len__") else None)  # type: ignore[arg-type]
        for i, item in enumerate(items):
            print(f"{desc}: {i + 1}{'/' + str(n) if n else ''}", file=sys.stderr, flush=True)
            yield item
        return
    yield from tqdm(items, desc=desc, total=total, file=sys.stderr, leave=False)


@contextmanager
def stage(desc: str, enabled: bool = True) -> Iterator[None]:
    """Print what is happening, then how long it took."""
    if not enabled:
        yield
        return
    print(f"{desc} ...", file=sys.stderr, end="", flush=True)
    start = time.perf_counter()
    try:
        yield
    finally:
        print(f" {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)


def counter(desc: str, total: int, enabled: bool = True) -> Callable[[int], None]:
    """A callback ``tick(i)`` that advances a progress bar of ``total`` steps; closes at the end."""
    if not enabled:
        return lambda i: None
    try:
        from tqdm import tqdm
    except ImportError:
        def tick_plain(i: int) -> None:
            print(f"{desc}: {i + 1}/{total}", file=sys.stderr, flush=True)

        return tick_plain
    bar = tqdm(total=total, desc=desc, file=sys.stderr, leave=False)

    def tick(i: int) -> None:
        bar.update(1)
        if i + 1 >= total:
            bar.close()

    return tick


class Phases:
    """A progress bar over named phases of one long job (compiling: passes, plan, C, gcc).

    The bar's clock keeps ticking inside a phase (a background refresh), so a 5-second gcc run
    shows elapsed time rather than a frozen line. Without tqdm it prints one line per phase.
    """

    def __init__(self, desc: str, phases: Sequence[str], enabled: bool = True) -> None:
        self.desc, self.phases, self.enabled = desc, list(phases), enabled
        self._bar = None
        self._done = 0
        self._stop: threading.Event | None = None
        if not enabled:
            return
        try:
            from tqdm import tqdm
        except ImportError:
            return
        self._bar = tqdm(total=len(self.phases), desc=desc, file=sys.stderr, leave=False,
                         bar_format="{desc} [{n_fmt}/{total_fmt} phases, {elapsed}]")
        self._stop = threading.Event()
        threading.Thread(target=self._tick, daemon=True).start()

    def _tick(self) -> None:
        while self._stop is not None and not self._stop.wait(0.25):
            self._bar.refresh()

    def start(self, phase: str) -> None:
        """Mark ``phase`` as running; the phases before it count as done."""
        if not self.enabled:
            return
        index = self.phases.index(phase) if phase in self.phases else self._done
        if self._bar is None:
            print(f"{self.desc}: {phase}", file=sys.stderr, flush=True)
            return
        self._bar.update(index - self._done)
        self._done = index
        self._bar.set_description_str(f"{self.desc}: {phase}")

    def close(self) -> None:
        if self._stop is not None:
            self._stop.set()
        if self._bar is not None:
            self._bar.update(len(self.phases) - self._done)
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Phases:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
