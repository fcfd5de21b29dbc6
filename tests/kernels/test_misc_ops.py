"""Native Softmax-family, reduction and shape-op templates against onnxruntime.

Same harness as test_pool_norm.py: many single-node cases per model, smelt at 1 and 2 threads,
max abs error <= 1e-5 * max(1, max|ref|), every case native unless listed as a fallback. The
slow test at the end runs the ONNX backend node tests of these ops through smelt.
"""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest
from node_cases import Cases, assert_close, build_model, check, oracle  # noqa: F401
from onnx import helper, numpy_helper

import smelt

ort = pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(20261123)



def randn(*shape: int, dtype=np.float32, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(dtype)


def ints(*v: int) -> np.ndarray:
    return np.array(v, np.int64)


# -- Softmax, LogSoftmax ---------------------------------------------------------------------------

@pytest.mark.parametrize("opset", [11, 13])
def test_softmax_family(opset: int) -> None:
    """Opset 11 coerces to 2-D at axis (default 1); opset 13 normalizes one axis (default -1)."""
    cases = Cases()
    for op in ("Softmax", "LogSoftmax"):
        for ax in (0, 1, 2, 3, -1, -3):
            cases.add(op, ["x"], axis=ax)
        cases.add(op, ["x"])
        for ax in (1, -1):
            cases.add(op, ["big"], axis=ax)
    cases.add("Softmax", ["d"], axis=0)
    cases.add("LogSoftmax", ["d"])
    feeds = {"x": randn(3, 5, 7, 37, scale=4), "big": randn(4, 200, 50, scale=4), "d": randn(6, 9, dtype=np.float64)}
    check(cases, feeds, opset=opset)


def test_softmax_extremes() -> None:
    x = randn(4, 40, scale=30)
    x[0, 3] = -np.inf
    x[1, :] = -1e30
    x[2, 7] = 1e30
    cases = Cases()
    for op in ("Softmax", "LogSoftmax"):
        cases.add(op, ["x"])
        cases.add(op, ["x"], axis=0)
    check(cases, {"x": x}, opset=13)


@pytest.mark.parametrize("isa", ["native", "avx2", "scalar"])
def test_softmax_rows_at_every_isa(isa: str) -> None:
    """Contiguous float32 rows take the ISA's vector exp two vectors at a time, the ragged end
    under a lane mask: lengths below, at and above one and two vectors of 8 and 16 lanes, and an
    attention row (400 keys); a row of -inf but one, a NaN row, one +inf (NaN: inf - inf)."""
    rng = np.random.default_rng(20261128)  # its own: the module's stream stays the other tests'
    cases, feeds = Cases(), {}
    for n in (1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 400):
        name = f"x{n}"
        feeds[name] = (rng.standard_normal((3, n)) * 6).astype(np.float32)
        cases.add("Softmax", [name], axis=-1)
    odd = (rng.standard_normal((4, 37)) * 6).astype(np.float32)
    odd[0, :] = -np.inf
    odd[0, 5] = 1.0
    odd[1, 9] = np.nan
    odd[2, 30] = np.inf
    odd[3, :] = 80.0  # exp(0) for every lane: the sum is exact, the row uniform
    feeds["odd"] = odd
    cases.add("Softmax", ["odd"], axis=-1)
    check(cases, feeds, opset=13, isa=isa)


@pytest.mark.parametrize("isa", ["native", "avx2", "scalar"])
def test_transpose_tiles_at_every_isa(isa: str) -> None:
    """Transposes whose output's innermost dimension is strided in the input run in square tiles
    (in registers for float32): sides below, at and above one tile of 8 and 16, ragged on both,
    unit dimensions between, the input's innermost dimension not next to the output's (NHWC to
    NCHW), 1-, 2- and 8-byte elements and float16, and sides too short to tile."""
    rng = np.random.default_rng(20261128)  # its own stream, as above
    cases, feeds = Cases(), {}
    shapes_perms = [((6, 400, 64), (0, 2, 1)), ((1, 6, 33, 17), (0, 1, 3, 2)), ((2, 16, 16), (0, 2, 1)),
                    ((1, 9, 10, 24), (0, 3, 1, 2)), ((1, 24, 9, 10), (0, 2, 3, 1)), ((3, 1, 40, 1, 7), (2, 1, 4, 3, 0)),
                    ((15, 31), (1, 0)), ((3, 5, 2), (2, 1, 0)), ((2, 3, 8, 100), (3, 0, 2, 1))]
    for k, (shape, perm) in enumerate(shapes_perms):
        for dt in (np.float32, np.uint8, np.int64, np.float16):
            name = f"x{k}_{np.dtype(dt).name}"
            feeds[name] = (rng.standard_normal(shape) * 50).astype(dt)
            cases.add("Transpose", [name], perm=list(perm))
    check(cases, feeds, opset=13, isa=isa)


# -- reductions ------------------------------------------------------------------------------------

FLOAT_REDUCE = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                "ReduceSumSquare", "ReduceLogSumExp", "ReduceLogSum"]
AXES = [None, [0], [-1], [1, 2], [0, 2], [1, 3], [0, 1, 2, 3], [2]]


def test_reduce_float_axes_keepdims() -> None:
    cases = Cases()
    for op in FLOAT_REDUCE:
        x = "xa" if op == "ReduceLogSum" else ("xp" if op == "ReduceProd" else "x")
        for i, axes in enumerate(AXES):
            keepdims = (i + len(op)) % 2
            cases.add(op, [x], () if axes is None else (np.array(axes, np.int64),), keepdims=keepdims)
    x = randn(3, 5, 7, 33)
    feeds = {"x": x, "xa": np.abs(x) + 0.1, "xp": (1 + 0.05 * x).astype(np.float32)}
    check(cases, feeds, opset=18)


def test_reduce_large_and_parallel() -> None:
    """Split reductions (few outputs), kept-inner-dim accumulation and LogSumExp, past the thread threshold."""
    cases = Cases()
    for op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceLogSumExp", "ReduceL2"):
        cases.add(op, ["xb"], keepdims=0)
        for axes in ([1], [0]):
            cases.add(op, ["xb"], (ints(*axes),))
        for axes in ([0], [0, 2], [1]):
            cases.add(op, ["xc"], (ints(*axes),))
    cases.add("ReduceSum", ["xb"], (ints(),), noop_with_empty_axes=1)
    cases.add("ReduceMax", ["xc"], (ints(),), noop_with_empty_axes=0)
    for op, ax, kd, last in itertools.product(("ArgMax", "ArgMin"), (0, 1, -1), (0, 1), (0, 1)):
        cases.add(op, ["xc"], axis=ax, keepdims=kd, select_last_index=last)
    feeds = {"xb": randn(2, 40000), "xc": randn(300, 3, 130)}
    check(cases, feeds, opset=18)


def test_reduce_int_types_and_arg() -> None:
    cases = Cases()
    for x in ("i32", "i64"):
        for op in ("ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"):
            cases.add(op, [x], (ints(1),))
            cases.add(op, [x], (ints(2),), keepdims=0)
            cases.add(op, [x], (ints(0, 2),))
    for x in ("i32", "i64", "u8", "f64"):
        for op, ax in itertools.product(("ArgMax", "ArgMin"), (0, 1, 2)):
            cases.add(op, [x], axis=ax, select_last_index=ax % 2)
    cases.add("ReduceMax", ["u8"], (ints(1),))
    cases.add("ReduceMin", ["u8"], (ints(0, 2),))
    cases.add("ReduceMean", ["f64"], (ints(1),))
    feeds = {"i32": RNG.integers(-5, 5, (4, 6, 9)).astype(np.int32),
             "i64": RNG.integers(-5, 5, (4, 6, 9)).astype(np.int64),
             "u8": RNG.integers(0, 5, (4, 6, 9)).astype(np.uint8), "f64": randn(4, 6, 9, dtype=np.float64)}
    check(cases, feeds, opset=18)


def test_arg_nan_and_ties_match_onnxruntime() -> None:
    """onnxruntime (the oracle) scans from the first element with a strict compare: a NaN there
    wins, a later NaN is never chosen (numpy's argmax would pick the first NaN)."""
    x = randn(64, 96)
    x[3, 5] = x[3, 70] = np.nan
    x[7, 9] = x[7, 60] = x[7].max() + 1
    x[8, 11] = x[8, 50] = x[8].min() - 1
    cases = Cases()
    for op, ax, last in itertools.product(("ArgMax", "ArgMin"), (0, 1), (0, 1)):
        cases.add(op, ["x"], axis=ax, select_last_index=last)
    x[0, 0] = x[20, 1] = np.nan  # first in a row and in a column
    check(cases, {"x": x}, opset=13)


@pytest.mark.parametrize("opset", [11, 13])
def test_reduce_axes_attribute_forms(opset: int) -> None:
    """Axes as an attribute (opset 11; ReduceSum's is an input from 13), and reduce-all defaults."""
    cases = Cases()
    for op in ("ReduceSum", "ReduceMean", "ReduceLogSumExp", "ReduceL1", "ReduceMax"):
        if op == "ReduceSum" and opset >= 13:
            cases.add(op, ["x"], (ints(0, -1),), keepdims=0)
        else:
            cases.add(op, ["x"], axes=[0, -1], keepdims=0)
        cases.add(op, ["x"])
    for op in ("ArgMax", "ArgMin"):
        cases.add(op, ["x"], axis=-2, keepdims=0)
    check(cases, {"x": randn(3, 4, 5)}, opset=opset)


def test_reduce_runtime_axes_are_specialized() -> None:
    """Axes given as a small graph input: the variant is specialized for their value
    (frontend/value_guards.py), so the reduction runs natively."""
    cases = Cases()
    cases.add("ReduceSum", ["x", "axes"])
    cases.add("ReduceMean", ["x"], (ints(1),))
    check(cases, {"x": randn(3, 4, 5), "axes": ints(1)}, opset=18)


# -- shape ops -------------------------------------------------------------------------------------

def test_slice_split() -> None:
    cases = Cases()
    for x in ("x", "xi"):
        cases.add("Slice", [x], (ints(1), ints(3), ints(1)))
        cases.add("Slice", [x], (ints(0, 1), ints(2, -1), ints(0, -1)))
        cases.add("Slice", [x], (ints(-1), ints(-100), ints(3), ints(-1)))
        cases.add("Slice", [x], (ints(4, 0), ints(0, 100), ints(-1, 2), ints(-2, 2)))
        cases.add("Slice", [x], (ints(2), ints(2**62), ints(-2), ints(3)))
        cases.add("Slice", [x], (ints(0, 0, 0, 0), ints(3, 4, 5, 7)))
        cases.add("Slice", [x], (ints(1), ints(2), ints(0)))
    cases.add("Slice", ["big"], (ints(5, 3), ints(120, 250), ints(1, 2)))
    cases.add("Slice", ["big"], (ints(-1), ints(-2**62), ints(2), ints(-3)))
    cases.add("Split", ["x"], (ints(1, 3),), n_out=2, axis=1)
    cases.add("Split", ["big"], (ints(100, 30),), n_out=2, axis=1)
    cases.add("Split", ["xi"], n_out=3, axis=-1, num_outputs=3)
    cases.add("Split", ["b"], n_out=2, axis=0, num_outputs=2)
    feeds = {"x": randn(3, 4, 5, 7), "xi": RNG.integers(-100, 100, (3, 4, 5, 7)),
             "big": randn(2, 130, 260), "b": RNG.integers(0, 2, (5, 3)).astype(bool)}
    check(cases, feeds, opset=18)


def test_gather() -> None:
    cases = Cases()
    for x in ("x", "xi"):
        cases.add("Gather", [x], (ints(2, 0, -1),), axis=1)
        cases.add("Gather", [x], (np.array([[1, 2], [-3, 0]], np.int64),), axis=3)
        cases.add("Gather", [x], (np.array(1, np.int64),), axis=0)
        cases.add("Gather", [x, "idx"], axis=2)
        cases.add("Gather", [x, "idx32"], axis=-1)
    cases.add("Gather", ["big", "idx"], axis=1)
    cases.add("Gather", ["emb", "tokens"])
    feeds = {"x": randn(3, 4, 5, 7), "xi": RNG.integers(-100, 100, (3, 4, 5, 7)), "big": randn(2, 130, 260),
             "idx": ints(4, -5, 0, 2), "idx32": np.array([[0, 6], [-7, 3]], np.int32),
             "emb": randn(1000, 64), "tokens": RNG.integers(0, 1000, (2, 300))}
    check(cases, feeds, opset=13)


def test_gather_elements_and_float_tests() -> None:
    """GatherElements (every axis, negative indices, indices smaller than the data off the axis,
    int32 and int64 indices, float and int data; onnx.reference fails BERT's position-id gather,
    so it must be native) and IsNaN / IsInf (each detect flag) on specials."""
    cases = Cases()
    for axis in (0, 1, 2, -1):
        cases.add("GatherElements", ["x", f"i{axis}"], axis=axis)
    cases.add("GatherElements", ["xi", "i1"], axis=1)
    cases.add("GatherElements", ["pos", "ids"], axis=1)  # BERT's expanded position-id buffer
    cases.add("IsNaN", ["s"])
    for pos, neg in ((1, 1), (1, 0), (0, 1), (0, 0)):
        cases.add("IsInf", ["s"], detect_positive=pos, detect_negative=neg)
    x = randn(3, 4, 5)
    feeds = {"x": x, "xi": RNG.integers(-100, 100, (3, 4, 5)),
             "i0": RNG.integers(-3, 3, (2, 4, 5)), "i1": RNG.integers(-4, 4, (3, 6, 2)).astype(np.int32),
             "i2": RNG.integers(-5, 5, (3, 4, 9)), "i-1": RNG.integers(0, 5, (1, 2, 3)),
             "pos": np.zeros((1, 512), np.int64), "ids": np.arange(128, dtype=np.int64)[None],
             "s": np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.5, -3.0, 3.4e38], np.float32)}
    check(cases, feeds, opset=13)


def test_gather_elements_index_out_of_range_raises() -> None:
    cases = Cases()
    cases.add("GatherElements", ["x", "idx"], axis=1)
    compiled = smelt.compile(build_model(cases, {"x": randn(2, 5), "idx": ints(0, 1).reshape(1, 2)}, 13), threads=1)
    with pytest.raises(smelt.SmeltError, match="GatherElements.*out of range"):
        compiled.run({"x": randn(2, 5), "idx": ints(0, 5).reshape(1, 2)})


def test_gather_runtime_index_out_of_range_raises() -> None:
    cases = Cases()
    cases.add("Gather", ["x", "idx"], axis=1)
    model = build_model(cases, {"x": randn(2, 5, 3), "idx": ints(0, 1, 2, 3)}, 13)
    compiled = smelt.compile(model, threads=2)
    assert compiled.fallback_nodes == []
    x = randn(2, 5, 3)
    for bad in (ints(-6, 0, 0, 0), ints(0, 5, 0, 0), ints(0, 0, 1 << 40, 0)):
        with pytest.raises(smelt.SmeltError, match="Gather.*out of range"):
            compiled.run({"x": x, "idx": bad})
    got = compiled.run({"x": x, "idx": ints(-5, 4, 1, -1)})[0]
    assert np.array_equal(got, x[:, [0, 4, 1, 4]])


def test_pad() -> None:
    cases = Cases()
    for x in ("x", "xi"):
        cv = np.array(3, np.float32 if x == "x" else np.int64)
        cases.add("Pad", [x], (ints(0, 0, 1, 2, 0, 0, 2, 1),))
        cases.add("Pad", [x], (ints(0, 1, 1, 2, 1, 0, 2, 1), cv))
        cases.add("Pad", [x], (ints(0, 0, 2, 3, 0, 0, 1, 3),), mode="reflect")
        cases.add("Pad", [x], (ints(0, 0, 2, 3, 0, 0, 1, 9),), mode="edge")
        cases.add("Pad", [x], (ints(0, 0, -1, 3, 0, 0, 1, -2),))
        cases.add("Pad", [x], (ints(1, 3, 2, 1), None, ints(1, -1)), mode="constant")
        cases.add("Pad", [x], (ints(2, 3, 2, 9), None, ints(2, 3)), mode="wrap")
    cases.add("Pad", ["big"], (ints(0, 1, 1, 0, 1, 1),))
    cases.add("Pad", ["big"], (ints(0, 2, 3, 0, 1, 2),), mode="reflect")
    cases.add("Pad", ["x", "pads", "cv"])
    feeds = {"x": randn(3, 4, 5, 7), "xi": RNG.integers(-100, 100, (3, 4, 5, 7)), "big": randn(2, 130, 260),
             "cv": np.array(-2.5, np.float32)}
    cases.inits["pads"] = ints(0, 0, 1, 1, 0, 0, 1, 1)
    check(cases, feeds, opset=19)


def test_expand_tile() -> None:
    cases = Cases()
    for x in ("x", "xi"):
        cases.add("Expand", [x], (ints(2, 1, 1, 1, 1),))
        cases.add("Tile", [x], (ints(1, 2, 1, 3),))
    cases.add("Expand", ["v"], (ints(3, 1, 6),))
    cases.add("Expand", ["v"], (ints(2, 4, 6),))
    cases.add("Expand", ["col"], (ints(5, 300, 64),))
    cases.add("Tile", ["v"], (ints(20),))
    cases.add("Tile", ["big"], (ints(2, 1, 1),))
    feeds = {"x": randn(3, 4, 5, 7), "xi": RNG.integers(-100, 100, (3, 4, 5, 7)), "big": randn(2, 130, 260),
             "v": randn(6), "col": randn(300, 1)}
    check(cases, feeds, opset=13)


def test_depth_space() -> None:
    cases = Cases()
    for b in (1, 2, 3):
        cases.add("DepthToSpace", ["x"], blocksize=b, mode="DCR")
        cases.add("DepthToSpace", ["x"], blocksize=b, mode="CRD")
    cases.add("SpaceToDepth", ["s"], blocksize=2)
    cases.add("SpaceToDepth", ["s"], blocksize=3)
    cases.add("DepthToSpace", ["big"], blocksize=2)
    cases.add("SpaceToDepth", ["big"], blocksize=2)
    feeds = {"x": randn(2, 36, 5, 7), "s": randn(2, 5, 6, 12), "big": randn(1, 8, 96, 130)}
    check(cases, feeds, opset=13)


CAST_TYPES = ["float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool"]


def _values(dt: str) -> np.ndarray:
    if dt == "bool":
        return RNG.integers(0, 2, (3, 5)).astype(bool)
    if dt.startswith("float"):
        v = randn(3, 5, scale=50).astype(dt)
        v[0, 0] = 0
        return v
    info = np.iinfo(dt)
    return RNG.integers(info.min // 2, info.max // 2, (3, 5), dtype=np.int64 if dt != "uint64" else np.uint64).astype(dt)


def test_cast_matrix() -> None:
    """Every native pair except float -> uint32/uint64, whose out-of-range results onnxruntime does
    not give consistently (fallback); float -> the other integers: tests/kernels/test_cast_native.py."""
    cases = Cases()
    fallback = []
    for src, dst in itertools.product(CAST_TYPES, CAST_TYPES):
        cases.add("Cast", [f"x_{src}"], to=helper.np_dtype_to_tensor_dtype(np.dtype(dst)))
        if src.startswith("float") and dst in ("uint32", "uint64"):
            fallback.append(cases.nodes[-1].name)
    cases.add("CastLike", ["x_int32", "x_float64"])
    cases.add("Cast", ["big"], to=onnx.TensorProto.FLOAT)
    feeds = {f"x_{t}": _values(t) for t in CAST_TYPES}
    feeds["big"] = RNG.integers(-1000, 1000, (70000,))
    check(cases, feeds, opset=21, fallback=tuple(fallback))


# -- ONNX backend node tests -----------------------------------------------------------------------

NODE_TEST_OPS = {
    "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LpPool", "BatchNormalization",
    "LayerNormalization", "InstanceNormalization", "LRN", "Softmax", "LogSoftmax", "Hardmax", "ReduceMean",
    "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceSumSquare",
    "ReduceLogSumExp", "ReduceLogSum", "ArgMax", "ArgMin", "Slice", "Gather", "Split", "Pad", "Expand",
    "Tile", "Cast", "CastLike", "DepthToSpace", "SpaceToDepth",
}


def _node_cases():
    from onnx.backend.test.case.node import collect_testcases

    with np.errstate(all="ignore"):
        for case in collect_testcases():
            m = case.model
            if m is not None and len(m.graph.node) == 1 and m.graph.node[0].op_type in NODE_TEST_OPS:
                yield case


def _as_array(a) -> np.ndarray:
    return numpy_helper.to_array(a) if isinstance(a, onnx.TensorProto) else np.asarray(a)


@pytest.mark.slow
def test_onnx_backend_node_tests() -> None:
    """Every backend node test of these ops passes through smelt (native or fallback)."""
    failures, native, total = [], 0, 0
    for case in _node_cases():
        total += 1
        try:
            sess = smelt.InferenceSession(case.model)
            names = [i.name for i in sess.get_inputs()]
            for inputs, outputs in case.data_sets:
                got = sess.run(None, dict(zip(names, (_as_array(a) for a in inputs), strict=False)))
                for g, e in zip(got, (_as_array(a) for a in outputs), strict=True):
                    assert g.shape == e.shape and g.dtype == e.dtype, (g.shape, e.shape, g.dtype, e.dtype)
                    if e.dtype.type.__module__ != "numpy" and e.dtype.kind not in "biuO":
                        g, e = g.astype(np.float32), e.astype(np.float32)
                    if e.dtype.kind in "fc":
                        np.testing.assert_allclose(g, e, rtol=case.rtol, atol=case.atol)
                    else:
                        np.testing.assert_array_equal(g, e)
            native += not sess.compiled.fallback_nodes
        except Exception as exc:  # collect them all
            failures.append(f"{case.name}: {exc!r}"[:300])
    assert total > 400
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("isa", ["native", "avx2", "scalar"])
def test_gelu_both_approximations_standalone(isa: str, monkeypatch, tmp_path) -> None:
    """ONNX's Gelu op: approximate="none" runs on the vector math (erf), "tanh" keeps its own
    formula (the activation table's Gelu is the erf form only: the tanh one once took it and was
    1e-3 off)."""
    from kernel_models import force_isa

    force_isa(isa, monkeypatch, tmp_path)
    cases = Cases()
    cases.add("Gelu", ["x"])
    cases.add("Gelu", ["x"], approximate="tanh")
    cases.add("Gelu", ["ragged"], approximate="none")
    check(cases, {"x": randn(3, 5, 7, scale=3), "ragged": randn(37, scale=3)}, opset=20)
