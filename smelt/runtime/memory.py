"""Memory the variants of one model share: the arena and the weights.

A model called with many input shapes keeps up to $SMELT_MAX_VARIANTS compiled variants (api.py).
Each used to own an arena sized for its shape and a copy of the weights, so memory grew with
the number of shapes seen: eight widths of an OCR recognizer held eight arenas and eight copies
of the same packed weights (a shape class decides layouts and packing once, so its variants'
weights are identical byte for byte). Here:

- ``ArenaPool``: the arenas of a model's variants come from one free list. A call takes the
  largest free buffer, replaced by a bigger one when it is too small, and gives it back when it
  returns; so with one caller the model holds one arena, as large as the largest shape seen
  (or a declared maximum: ``max_dims``), and with k concurrent callers at most k. An arena
  holds nothing between calls (instance state lives in the variant's own state buffer), so any
  variant may use any buffer.
- ``shared_weights``: variants whose weights files have the same bytes map one buffer
  (kept while some variant uses it).
"""

from __future__ import annotations

import hashlib
import os
import threading
import weakref
from collections.abc import Callable
from pathlib import Path

import numpy as np


def _nbytes(entry: tuple[np.ndarray, int]) -> int:
    return entry[0].nbytes


class ArenaPool:
    """Free list of zero-initialised, 64-byte aligned byte buffers; thread-safe."""

    def __init__(self, allocate: Callable[[int], np.ndarray]) -> None:
        self._allocate = allocate
        self._free: list[tuple[np.ndarray, int]] = []  # (buffer, its address)
        self._lock = threading.Lock()
        self.allocated = 0  # bytes of the buffers made so far that are still referenced here

    def take(self, nbytes: int) -> tuple[np.ndarray, int]:
        """A buffer of at least ``nbytes`` and its address (the largest free one, or a new one
        when that is too small: the small one is dropped, so the pool never holds more buffers
        than callers)."""
        with self._lock:
            if self._free:
                entry = self._free.pop()
                if entry[0].nbytes >= nbytes:
                    return entry
                self.allocated -= entry[0].nbytes
            self.allocated += nbytes
        buf = self._allocate(nbytes)
        return buf, buf.ctypes.data

    def give(self, entry: tuple[np.ndarray, int]) -> None:
        """Return what ``take`` gave; the free list stays sorted, largest last."""
        with self._lock:
            free = self._free
            free.append(entry)
            if len(free) > 1:
                free.sort(key=_nbytes)

    def after_fork_in_child(self) -> None:
        """A child after os.fork(): the lock may be held by a thread that is gone (the buffers
        such threads had taken are simply not given back)."""
        self._lock = threading.Lock()

    def largest(self) -> int:
        """Bytes of the largest free buffer (0 when none is free)."""
        with self._lock:
            return self._free[-1][0].nbytes if self._free else 0


_WEIGHTS: weakref.WeakValueDictionary[tuple[int, bytes], np.ndarray] = weakref.WeakValueDictionary()
_WEIGHTS_LOCK = threading.Lock()


def _new_weights_lock() -> None:
    global _WEIGHTS_LOCK
    _WEIGHTS_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_new_weights_lock)


def shared_weights(path: Path, nbytes: int, allocate: Callable[[int], np.ndarray]) -> np.ndarray:
    """The ``nbytes``-byte aligned weights buffer holding ``path``'s bytes, shared with every
    loaded variant whose weights file has the same content (read-only to the generated code)."""
    raw = np.fromfile(path, dtype=np.uint8)
    key = (nbytes, hashlib.blake2b(memoryview(raw), digest_size=20).digest())
    with _WEIGHTS_LOCK:
        found = _WEIGHTS.get(key)
        if found is not None:
            return found
        buf = allocate(nbytes)
        buf[: raw.size] = raw
        _WEIGHTS[key] = buf
        return buf
