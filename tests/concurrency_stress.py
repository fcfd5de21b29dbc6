"""Stress: compiled models under many threads at once, every answer checked.

For a given number of seconds, all at the same time:
- three threads call one model with a symbolic batch, cycling through four shapes while
  SMELT_MAX_VARIANTS=2 (set by the caller) keeps evicting variants other threads are running;
- a thread closes that model every 0.3 s (its variants are freed while calls are in flight);
- two instances of one dynamic LSTM (one shared .so) are called from three threads, and halfway
  through one thread starts sending longer and wider inputs, so instance ``a`` grows its bounds
  (a rebuild) while the other threads keep calling it.
Everything is compiled before the clock starts except the grown LSTM variant.
Results are compared exactly (the element-wise chain, with numpy) or with onnxruntime's (LSTM,
1e-5 relative; the references are computed by the parent, ``write_references``, so that this
script runs under AddressSanitizer without onnxruntime). Run by tests/test_concurrency.py and,
with the sanitizer build, by tests/test_sanitize.py.

Usage: python concurrency_stress.py SECONDS REFERENCES.npz
"""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
from helpers import chain_expected, chain_model

CHAIN_NODES = 6
CHAIN_WIDTH = 1 << 15
LSTM_ARGS = (8, 16, "B", "T")  # smelt.frontend.zoo.rnn.lstm_model(E, H, B, T)
LSTM_BOUNDS = {"T": 8, "B": 4}
SMALL = [(8, 4), (3, 1), (5, 2), (1, 3)]  # (T, B) within LSTM_BOUNDS
LARGE = [(12, 4), (16, 1)]  # longer: grows the T bound to 16


def _lstm_input(T: int, B: int) -> np.ndarray:
    return np.random.default_rng(T * 100 + B).standard_normal((T, B, LSTM_ARGS[0])).astype(np.float32)


def write_references(path: str) -> None:
    """onnxruntime's outputs of the LSTM for every size the stress uses, saved to ``path``."""
    from helpers import ort_run

    from smelt.frontend.zoo.rnn import lstm_model

    model = lstm_model(*LSTM_ARGS)
    refs = {}
    for T, B in SMALL + LARGE:
        for i, out in enumerate(ort_run(model, {"x": _lstm_input(T, B)})):
            refs[f"{T}x{B}_{i}"] = out
    np.savez(path, **refs)


def main(seconds: float, ref_path: str) -> None:
    import smelt
    from smelt.frontend.zoo.rnn import lstm_model

    refs = dict(np.load(ref_path))
    chain = smelt.compile(chain_model(CHAIN_NODES, ("N", CHAIN_WIDTH)), threads=2)
    a = smelt.compile(lstm_model(*LSTM_ARGS), threads=2, max_dims=LSTM_BOUNDS)
    b = smelt.compile(lstm_model(*LSTM_ARGS), threads=2, max_dims=LSTM_BOUNDS)
    assert a._current().lib_path == b._current().lib_path  # one library behind both instances
    for n in range(1, 5):  # compiled (or loaded) before the clock starts
        chain(np.zeros((n, CHAIN_WIDTH), np.float32))
    errors: list[str] = []
    calls = {"chain": 0, "lstm": 0}
    start = time.monotonic()
    deadline = start + seconds

    def guarded(fn):
        def run(*args):
            try:
                fn(*args)
            except BaseException as err:  # noqa: BLE001 - reported by the main thread
                errors.append(f"{fn.__name__}{args}: {err!r}")
        return run

    @guarded
    def chain_caller(seed: int) -> None:
        rng = np.random.default_rng(seed)
        i = 0
        while time.monotonic() < deadline:
            n = 1 + (seed + i) % 4
            x = rng.standard_normal((n, CHAIN_WIDTH)).astype(np.float32)
            if not np.array_equal(chain(x), chain_expected(x, CHAIN_NODES)):
                errors.append(f"chain: wrong answer for batch {n}")
            calls["chain"] += 1
            i += 1

    @guarded
    def closer() -> None:
        while time.monotonic() < deadline:
            time.sleep(0.3)
            chain.close()

    @guarded
    def lstm_caller(model, seed: int, grow: bool) -> None:
        rng = np.random.default_rng(seed)
        while time.monotonic() < deadline:
            late = grow and time.monotonic() > start + seconds / 2
            T, B = (LARGE if late else SMALL)[rng.integers(0, len(LARGE) if late else len(SMALL))]
            outs = model(_lstm_input(T, B))
            for i, out in enumerate(outs):
                want = refs[f"{T}x{B}_{i}"]
                if out.shape != want.shape or float(np.abs(out - want).max()) > 1e-5 * max(1.0, float(np.abs(want).max())):
                    errors.append(f"lstm: wrong output {i} for T={T} B={B}")
            calls["lstm"] += 1

    threads = [threading.Thread(target=chain_caller, args=(s,)) for s in range(3)]
    threads += [threading.Thread(target=closer)]
    threads += [threading.Thread(target=lstm_caller, args=(m, s, g)) for m, s, g in ((a, 1, False), (a, 2, True),
                                                                                    (b, 3, False))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:5]
    assert a.max_dims == {"T": 16, "B": 4} and b.max_dims == LSTM_BOUNDS, (a.max_dims, b.max_dims)
    assert calls["chain"] > 20 and calls["lstm"] > 20, calls
    print("stress ok", calls, flush=True)


if __name__ == "__main__":
    main(float(sys.argv[1]), sys.argv[2])
