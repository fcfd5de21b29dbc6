"""Per-call latency of tiny wild-suite models called back to back, smelt against onnxruntime.

A serving loop calls a wake-word head every few milliseconds; at 15-100 us a call, the Python
overhead of a call and a GEMV's thread split decide the ratio. Both engines run 2 threads; each
figure is the minimum over 9 repeats of 2000 back-to-back calls (timeit), the engines measured
one after the other per model.

    python benchmarks/bench_small_models.py [wild:oww-alexa ...]
"""

from __future__ import annotations

import sys
import timeit

import onnxruntime as ort

import smelt
from smelt.bench.harness import resolve_model

DEFAULT = ["wild:oww-alexa", "wild:oww-hey-mycroft", "wild:oww-weather", "wild:oww-melspectrogram"]


def main(names: list[str]) -> None:
    for name in names:
        bm = resolve_model(name)
        compiled = smelt.compile(bm.proto, threads=2, input_shapes={k: v.shape for k, v in bm.feeds.items()})
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 2
        opts.inter_op_num_threads = 1
        sess = ort.InferenceSession(bm.proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        feeds = bm.feeds
        compiled.run(feeds)
        sess.run(None, feeds)
        scope = {"compiled": compiled, "sess": sess, "feeds": feeds}
        ours = min(timeit.repeat("compiled.run(feeds)", globals=scope, number=2000, repeat=9)) / 2000 * 1e6
        theirs = min(timeit.repeat("sess.run(None, feeds)", globals=scope, number=2000, repeat=9)) / 2000 * 1e6
        print(f"{name}: smelt {ours:.1f} us  onnxruntime {theirs:.1f} us  onnxruntime/smelt {theirs / ours:.2f}")


if __name__ == "__main__":
    main(sys.argv[1:] or DEFAULT)
