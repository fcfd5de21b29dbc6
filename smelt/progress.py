"""Progress display for long-running commands: tqdm when installed, plain stderr lines otherwise."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
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
