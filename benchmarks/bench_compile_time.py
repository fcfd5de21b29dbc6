"""Time smelt's cold compile of long chains of nodes: the C compiler and Python apart.

Chain kinds (each node reads the previous node's output):
  unary     Relu, Sigmoid, Abs, Neg cycling on a [1, 64] input
  binary    Add / Mul with a [64] or [1, 64] constant operand
  matmul    MatMul with a [64, 64] weight, Add of a [64] bias, Relu
  movement  Reshape to [8, 8], Transpose, Concat with itself, Slice back to [8, 8], Reshape to [1, 64]
  conv      Conv 3x3 (8 -> 8 channels, pad 1) + Relu on a [1, 8, 16, 16] image

Every compile uses a fresh cache directory; every answer is checked against onnxruntime.
Wall time on a shared machine depends on its load, so CPU seconds (this process for Python,
the C compiler's children) are printed too.

    python benchmarks/bench_compile_time.py [--nodes 2000] [--kinds unary binary ...]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

KINDS = ("unary", "binary", "matmul", "movement", "conv")


def chain(kind: str, n: int, seed: int = 0) -> tuple[onnx.ModelProto, list[int]]:
    """A model of ``n`` nodes of ``kind`` and its input shape."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    shape = [1, 8, 16, 16] if kind == "conv" else [1, 64]

    def init(name: str, arr: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(arr, name))
        return name

    def f32(shape_, lo=-0.1, hi=0.1) -> np.ndarray:
        return rng.uniform(lo, hi, shape_).astype(np.float32)

    cur = "x"
    for i in range(n):
        out, name = f"t{i}", f"n{i}"
        if kind == "unary":
            node = helper.make_node(("Relu", "Sigmoid", "Abs", "Neg")[i % 4], [cur], [out], name=name)
        elif kind == "binary":
            op = ("Add", "Mul")[i % 2]
            c = f32([64] if i % 4 < 2 else [1, 64], *((0.9, 1.1) if op == "Mul" else (-0.1, 0.1)))
            node = helper.make_node(op, [cur, init(f"c{i}", c)], [out], name=name)
        elif kind == "matmul":
            if i % 3 == 0:
                node = helper.make_node("MatMul", [cur, init(f"w{i}", f32([64, 64], -0.2, 0.2))], [out], name=name)
            elif i % 3 == 1:
                node = helper.make_node("Add", [cur, init(f"b{i}", f32([64]))], [out], name=name)
            else:
                node = helper.make_node("Relu", [cur], [out], name=name)
        elif kind == "movement":
            step = i % 5
            i64 = lambda v: np.array(v, np.int64)  # noqa: E731
            if step in (0, 4):
                target = [8, 8] if step == 0 else [1, 64]
                node = helper.make_node("Reshape", [cur, init(f"s{i}", i64(target))], [out], name=name)
            elif step == 1:
                node = helper.make_node("Transpose", [cur], [out], perm=[1, 0], name=name)
            elif step == 2:
                node = helper.make_node("Concat", [cur, cur], [out], axis=0, name=name)
            else:
                node = helper.make_node("Slice", [cur, init(f"b{i}", i64([3])), init(f"e{i}", i64([11])),
                                                  init(f"a{i}", i64([0]))], [out], name=name)
        elif kind == "conv":
            if i % 2 == 0:
                w = f32([8, 8, 3, 3], -1 / 6, 1 / 6)
                node = helper.make_node("Conv", [cur, init(f"w{i}", w)], [out], pads=[1, 1, 1, 1], name=name)
            else:
                node = helper.make_node("Relu", [cur], [out], name=name)
        else:
            raise ValueError(f"unknown chain kind {kind!r} (known: {', '.join(KINDS)})")
        nodes.append(node)
        cur = out
    graph = helper.make_graph(nodes, f"chain_{kind}", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(cur, TensorProto.FLOAT, None)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, shape


def measure(kind: str, n: int) -> str:
    with tempfile.TemporaryDirectory(prefix="smelt-compile-time-") as cache:
        os.environ["SMELT_CACHE_DIR"] = cache
        return _measure(kind, n)


def _measure(kind: str, n: int) -> str:
    import smelt
    from smelt.codegen import toolchain

    model, shape = chain(kind, n)
    cc_wall = [0.0]
    run = subprocess.run

    def timed_run(cmd, *args, **kwargs):
        start = time.perf_counter()
        try:
            return run(cmd, *args, **kwargs)
        finally:
            if "--version" not in cmd:
                cc_wall[0] += time.perf_counter() - start

    toolchain.subprocess.run = timed_run
    children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    try:
        with toolchain.keeping_sources():  # the C is kept for its line count
            compiled = smelt.compile(model)
    finally:
        toolchain.subprocess.run = run
    wall = time.perf_counter() - wall0
    py_cpu = time.process_time() - cpu0
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    cc_cpu = (children.ru_utime + children.ru_stime) - (children0.ru_utime + children0.ru_stime)
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    got = compiled(x)
    got = got[0] if isinstance(got, list | tuple) else got
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    want = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    err = float(np.max(np.abs(got - want))) / max(1e-30, float(np.max(np.abs(want))))
    lines = len(compiled.source_path.read_text().splitlines())
    return (f"{kind:9s} {n:6d} nodes  wall {wall:6.2f} s (C compiler {cc_wall[0]:5.2f} s)  "
            f"cpu: python {py_cpu:5.2f} s, C compiler {cc_cpu:5.2f} s  C lines {lines:6d}  rel. error {err:.1e}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[2000])
    ap.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    args = ap.parse_args()
    for n in args.nodes:
        for kind in args.kinds:
            print(measure(kind, n), flush=True)


if __name__ == "__main__":
    main()
