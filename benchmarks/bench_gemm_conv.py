"""Time smelt's GEMM and Conv templates against onnxruntime on ResNet-50-like layers.

Each case is a one-node model (Conv + bias -> Relu, or Gemm/MatMul); both engines run it
interleaved in blocks of runs, and the median (and best) of many runs is reported in GFLOPS.

    python benchmarks/bench_gemm_conv.py [--threads 1 2] [--runs 50] [--only conv3x3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import smelt

# name, (C, H, W), OC, kernel, stride, pad
CONVS = [
    ("conv1_7x7s2", (3, 224, 224), 64, 7, 2, 3),
    ("l1_1x1_64_64", (64, 56, 56), 64, 1, 1, 0),
    ("l1_3x3_64", (64, 56, 56), 64, 3, 1, 1),
    ("l1_1x1_64_256", (64, 56, 56), 256, 1, 1, 0),
    ("l1_1x1_256_64", (256, 56, 56), 64, 1, 1, 0),
    ("l2_3x3s2_128", (128, 56, 56), 128, 3, 2, 1),
    ("l2_3x3_128", (128, 28, 28), 128, 3, 1, 1),
    ("l2_1x1_128_512", (128, 28, 28), 512, 1, 1, 0),
    ("l3_3x3_256", (256, 14, 14), 256, 3, 1, 1),
    ("l3_1x1_256_1024", (256, 14, 14), 1024, 1, 1, 0),
    ("l3_1x1_1024_256", (1024, 14, 14), 256, 1, 1, 0),
    ("l4_3x3_512", (512, 7, 7), 512, 3, 1, 1),
    ("l4_1x1_512_2048", (512, 7, 7), 2048, 1, 1, 0),
    ("l4_1x1_2048_512", (2048, 7, 7), 512, 1, 1, 0),
    ("dw_3x3_144", (144, 56, 56), 144, 3, 1, 1),  # MobileNetV2-like depthwise (group = C)
]
# name, M, N, K, constant B
GEMMS = [
    ("gemm_512", 512, 512, 512, False),
    ("gemm_512_constB", 512, 512, 512, True),
    ("fc_1x2048x1000", 1, 1000, 2048, True),
    ("matmul_128x768x768", 128, 768, 768, True),
]


def _model(nodes, inputs, outputs, inits) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "bench", inputs, outputs, initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def conv_case(c, h, w, oc, k, s, p, rng):
    group = c if k == 3 and c == oc and c == 144 else 1
    wt = rng.uniform(-0.1, 0.1, (oc, c // group, k, k)).astype(np.float32)
    b = rng.uniform(-0.1, 0.1, (oc,)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[k, k], strides=[s, s],
                            pads=[p] * 4, group=group)
    relu = helper.make_node("Relu", ["c"], ["y"])
    oh = (h + 2 * p - k) // s + 1
    ow = (w + 2 * p - k) // s + 1
    m = _model([node, relu], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, w])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, oc, oh, ow])],
               [numpy_helper.from_array(wt, "w"), numpy_helper.from_array(b, "b")])
    flops = 2.0 * oc * oh * ow * (c // group) * k * k
    return m, {"x": rng.uniform(-1, 1, (1, c, h, w)).astype(np.float32)}, flops


def gemm_case(m_, n, k, const_b, rng):
    b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
    if const_b:
        m = _model([helper.make_node("MatMul", ["a", "B"], ["y"])],
                   [helper.make_tensor_value_info("a", TensorProto.FLOAT, [m_, k])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m_, n])],
                   [numpy_helper.from_array(b, "B")])
        feeds = {"a": rng.uniform(-1, 1, (m_, k)).astype(np.float32)}
    else:
        m = _model([helper.make_node("MatMul", ["a", "b"], ["y"])],
                   [helper.make_tensor_value_info("a", TensorProto.FLOAT, [m_, k]),
                    helper.make_tensor_value_info("b", TensorProto.FLOAT, [k, n])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m_, n])], [])
        feeds = {"a": rng.uniform(-1, 1, (m_, k)).astype(np.float32), "b": b}
    return m, feeds, 2.0 * m_ * n * k


def bench(name, model, feeds, flops, threads, runs):
    compiled = smelt.compile(model, threads=threads)
    assert not compiled.fallback_nodes, compiled.fallback_nodes
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    ref = sess.run(None, feeds)[0]
    out = compiled.run(feeds)[0]
    err = float(np.abs(out - ref).max() / max(1.0, float(np.abs(ref).max())))
    for _ in range(3):
        compiled.run(feeds)
        sess.run(None, feeds)
    # interleaved in blocks: each engine's pool spins a little after a call, so alternating
    # single calls would make the two pools fight over the cores
    ts, to, cs, co = [], [], [], []
    block = max(1, runs // 10)
    for _ in range(-(-runs // block)):
        for engine, wall, cpu in ((lambda: compiled.run(feeds), ts, cs), (lambda: sess.run(None, feeds), to, co)):
            for _ in range(block):
                c, t = time.thread_time(), time.perf_counter()
                engine()
                wall.append(time.perf_counter() - t)
                cpu.append(time.thread_time() - c)
    gs, go = flops / np.median(ts) / 1e9, flops / np.median(to) / 1e9
    line = (f"{name:22s} T={threads}  smelt {gs:7.1f} GFLOPS (best {flops / min(ts) / 1e9:6.1f})   "
            f"ort {go:7.1f} (best {flops / min(to) / 1e9:6.1f})   ratio {gs / go:5.2f}")
    if threads == 1:  # the calling thread does all the work: CPU time is immune to a busy machine
        line += (f"   | by CPU time: smelt {flops / np.median(cs) / 1e9:6.1f} ort "
                 f"{flops / np.median(co) / 1e9:6.1f}")
    print(line + f"   err {err:.1e}", flush=True)
    compiled.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    os.environ.setdefault("SMELT_CACHE_DIR", os.path.join(tempfile.gettempdir(), "smelt-bench-cache"))
    rng = np.random.default_rng(0)
    cases = []
    for name, (c, h, w), oc, k, s, p in CONVS:
        cases.append((name, *conv_case(c, h, w, oc, k, s, p, rng)))
    for name, m, n, k, cb in GEMMS:
        cases.append((name, *gemm_case(m, n, k, cb, rng)))
    for threads in args.threads:
        for name, model, feeds, flops in cases:
            if args.only and args.only not in name:
                continue
            bench(name, model, feeds, flops, threads, args.runs)


if __name__ == "__main__":
    main()
