"""Native pooling and normalization templates against onnxruntime.

Each test builds one model holding many single-node cases (one compile serves them all), runs
it through smelt at 1 and 2 threads and compares every output with onnxruntime: max abs error
<= 1e-5 * max(1, max|ref|). Shapes are odd on purpose (ragged vector tails and thread splits);
the "large" cases cross the size where a step is split over threads.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from node_cases import Cases, assert_close, build_model, check, oracle  # noqa: F401

import smelt

ort = pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(20261122)



def randn(*shape: int, dtype=np.float32, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(dtype)


# -- pooling ---------------------------------------------------------------------------------------

POOL_OPSET = {"MaxPool": 17, "AveragePool": 19, "LpPool": 18}


def pool_variants(op: str, rank: int, full: bool) -> list[dict]:
    """Attribute sets: kernel/stride/dilation/pad/ceil_mode grid (subset unless ``full``), auto_pad."""
    out = []
    grid = itertools.product([2, 3], [1, 2, 3], [1, 2], [0, 1], [0, 1])
    for i, (k, s, d, p, ceil) in enumerate(grid):
        if not full and i % 3:
            continue
        attrs = dict(kernel_shape=[k] * rank, strides=[s] * rank, dilations=[d] * rank,
                     pads=[p] * rank + [(p + i) % k if p else 0 for i in range(rank)], ceil_mode=ceil)
        out.append(attrs)
    for auto_pad in ("SAME_UPPER", "SAME_LOWER", "VALID"):
        for s in (1, 2):
            out.append(dict(kernel_shape=[3] * rank, strides=[s] * rank, auto_pad=auto_pad))
    if op == "AveragePool":
        out = [dict(a, count_include_pad=c) for a in out for c in (0, 1)]
    if op == "LpPool":
        out = [dict(a, p=p) for a, p in zip(out, itertools.cycle([2, 1, 3]))]
    return out


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool", "LpPool"])
def test_pool_2d_grid(op: str) -> None:
    cases = Cases()
    for attrs in pool_variants(op, 2, full=True):
        cases.add(op, ["x"], **attrs)
    # non-square kernels, asymmetric pads
    cases.add(op, ["x"], kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 2, 1])
    cases.add(op, ["x"], kernel_shape=[1, 4], strides=[1, 3], pads=[0, 2, 0, 3], ceil_mode=1)
    check(cases, {"x": randn(2, 3, 11, 13)}, opset=POOL_OPSET[op])


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool", "LpPool"])
def test_pool_1d_3d(op: str) -> None:
    cases = Cases()
    for attrs in pool_variants(op, 1, full=False):
        cases.add(op, ["x1"], **attrs)
    for attrs in pool_variants(op, 3, full=False)[::2]:
        cases.add(op, ["x3"], **attrs)
    check(cases, {"x1": randn(2, 5, 17), "x3": randn(1, 3, 7, 8, 9)}, opset=POOL_OPSET[op])


def test_pool_large_parallel() -> None:
    cases = Cases()
    cases.add("MaxPool", ["x"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cases.add("MaxPool", ["x"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)
    cases.add("AveragePool", ["x"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=0)
    cases.add("AveragePool", ["x"], kernel_shape=[5, 5], strides=[3, 3], pads=[2, 2, 2, 2], count_include_pad=1,
              ceil_mode=1)
    cases.add("GlobalAveragePool", ["x"])
    cases.add("GlobalMaxPool", ["x"])
    cases.add("GlobalAveragePool", ["g"])
    cases.add("GlobalMaxPool", ["g"])
    check(cases, {"x": randn(1, 19, 57, 61), "g": randn(2, 301, 11, 13)}, opset=19)


def test_pool_small_types_and_globals() -> None:
    cases = Cases()
    for x in ("i8", "u8"):
        cases.add("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
        cases.add("MaxPool", [x], kernel_shape=[2, 3], strides=[1, 2], dilations=[2, 1], ceil_mode=1)
    for x in ("a", "b", "c"):
        cases.add("GlobalAveragePool", [x])
        cases.add("GlobalMaxPool", [x])
    feeds = {"i8": RNG.integers(-128, 128, (2, 3, 9, 10)).astype(np.int8),
             "u8": RNG.integers(0, 256, (2, 3, 9, 10)).astype(np.uint8),
             "a": randn(1, 7, 3, 5), "b": randn(2, 3, 1), "c": randn(1, 3, 2, 3, 4)}
    check(cases, feeds, opset=19)


def test_maxpool_indices() -> None:
    """Indices: flat input index of the first maximum (int8 data has many ties)."""
    cases = Cases()
    for x in ("x", "q"):
        cases.add("MaxPool", [x], n_out=2, kernel_shape=[2, 2])
        cases.add("MaxPool", [x], n_out=2, kernel_shape=[3, 3], pads=[1, 1, 1, 1], storage_order=1)
        cases.add("MaxPool", [x], n_out=2, kernel_shape=[3, 2], strides=[2, 3], pads=[1, 0, 2, 1], ceil_mode=1)
        cases.add("MaxPool", [x], n_out=2, kernel_shape=[2, 3], dilations=[2, 2], storage_order=1)
    cases.add("MaxPool", ["x1"], n_out=2, kernel_shape=[3], strides=[2], pads=[1, 1])
    cases.add("MaxPool", ["x3"], n_out=2, kernel_shape=[2, 2, 2], strides=[1, 2, 2])
    feeds = {"x": randn(2, 3, 9, 11), "q": RNG.integers(-3, 3, (2, 3, 9, 11)).astype(np.int8),
             "x1": randn(2, 3, 15), "x3": randn(1, 2, 5, 6, 7)}
    check(cases, feeds, opset=12)


# -- normalization ---------------------------------------------------------------------------------

def _bn_params(c: int) -> list[np.ndarray]:
    return [randn(c), randn(c), randn(c), np.abs(randn(c)) + 0.1]


def test_batchnorm_with_fused_epilogues() -> None:
    c = 5
    cases = Cases()
    p = _bn_params(c)
    cases.add("BatchNormalization", ["x"], p, epsilon=1e-3)
    bn = cases.add("BatchNormalization", ["x"], p)
    cases.outputs.remove(bn[0])
    cases.add("Relu", bn)
    bn = cases.add("BatchNormalization", ["x"], p)
    cases.outputs.remove(bn[0])
    a = cases.add("Add", [bn[0], "r"])
    cases.outputs.remove(a[0])
    cases.add("Clip", a, (np.float32(-0.5), np.float32(0.7)))
    bn = cases.add("BatchNormalization", ["x"], p)
    cases.outputs.remove(bn[0])
    cases.add("Mul", ["cc", bn[0]])
    bn = cases.add("BatchNormalization", ["x2"], p)
    cases.outputs.remove(bn[0])
    cases.add("Sigmoid", bn)
    bn = cases.add("BatchNormalization", ["x3"], p)
    cases.outputs.remove(bn[0])
    cases.add("LeakyRelu", bn, alpha=0.2)
    cases.add("BatchNormalization", ["x", "ps", "pb", "pm", "pv"])  # run-time parameters
    cases.add("BatchNormalization", ["x2", "ps", "pb", "pm", "pv"])
    cases.add("BatchNormalization", ["big"], _bn_params(3))
    bn = cases.add("BatchNormalization", ["big"], _bn_params(3))
    cases.outputs.remove(bn[0])
    cases.add("Relu", bn)
    feeds = {"x": randn(2, c, 7, 9), "x2": randn(3, c), "x3": randn(2, c, 11), "r": randn(2, c, 7, 9),
             "cc": randn(c, 1, 1), "ps": randn(c), "pb": randn(c), "pm": randn(c),
             "pv": np.abs(randn(c)) + 0.5, "big": randn(1, 3, 101, 103)}
    check(cases, feeds, opset=15)
    model = build_model(cases, feeds, 15)
    native = dict(smelt.compile(model, threads=1).native_nodes)
    assert not any(op in ("Relu", "Add", "Clip", "Mul", "Sigmoid", "LeakyRelu") for op in native.values()), \
        "the epilogues were not fused into BatchNormalization"


@pytest.mark.parametrize("opset", [9, 14])
def test_batchnorm_older_opsets_and_training(opset: int) -> None:
    cases = Cases()
    cases.add("BatchNormalization", ["x"], _bn_params(4), epsilon=1e-4)
    if opset >= 14:
        # training mode runs natively now (templates/batchnorm_training.py)
        cases.add("BatchNormalization", ["x"], _bn_params(4), n_out=3, training_mode=1)
    check(cases, {"x": randn(2, 4, 3, 5)}, opset=opset)


def test_layernorm_instancenorm_lrn() -> None:
    cases = Cases()
    n = 37
    cases.add("LayerNormalization", ["x"], (randn(n), randn(n)), n_out=3)
    cases.add("LayerNormalization", ["x"], (randn(4, n),), axis=-2, epsilon=1e-3)
    cases.add("LayerNormalization", ["x"], (randn(1, n), randn(n)), axis=3)
    ln = cases.add("LayerNormalization", ["x"], (randn(3, 1, 1),), n_out=3, axis=1)
    cases.outputs.remove(ln[1])
    cases.nodes[-1].output[1] = ""
    cases.add("LayerNormalization", ["x", "g"], axis=-1)
    cases.add("LayerNormalization", ["wide", "gw", "bw"])
    cases.add("InstanceNormalization", ["x"], (randn(3), randn(3)), epsilon=1e-4)
    cases.add("InstanceNormalization", ["wide3"], (randn(7), randn(7)))
    cases.add("LRN", ["x"], size=3)
    cases.add("LRN", ["x"], size=1, alpha=0.01, beta=0.6, bias=2.0)
    cases.add("LRN", ["x"], size=5, alpha=0.001, beta=0.75)
    cases.add("LRN", ["wide3"], size=5, alpha=0.02, beta=0.5)
    feeds = {"x": randn(2, 3, 4, n), "g": randn(n), "wide": randn(48, 1031), "gw": randn(1031),
             "bw": randn(1031), "wide3": randn(2, 7, 41, 57)}
    check(cases, feeds, opset=17)


def test_float64_pool_norm() -> None:
    """onnxruntime has no float64 AveragePool: onnx.reference is the oracle here."""
    cases = Cases()
    cases.add("AveragePool", ["x"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1)
    cases.add("MaxPool", ["x1"], kernel_shape=[3], strides=[2], pads=[1, 1])
    cases.add("GlobalAveragePool", ["x"])
    cases.add("BatchNormalization", ["x"], [p.astype(np.float64) for p in _bn_params(3)])
    cases.add("InstanceNormalization", ["x"], (randn(3, dtype=np.float64), randn(3, dtype=np.float64)))
    check(cases, {"x": randn(2, 3, 5, 6, dtype=np.float64), "x1": randn(1, 2, 63, dtype=np.float64)},
          opset=15, kind="reference")
