"""onnxruntime's com.microsoft quantized element-wise ops, native, against onnxruntime: equal.

QLinearAdd / QLinearMul (broadcasting both ways, along the last axis and the middle, scalars,
odd sizes), QLinearSigmoid / QLinearLeakyRelu (every input code), QLinearGlobalAveragePool (NCHW
and channels_last, 1x1 to odd windows), QLinearConcat (same and different scales); uint8 and
int8, random scales and zero points; every ISA the host runs, 1 and 2 threads.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from kernel_models import AVX_VNNI, force_isa
from onnx import TensorProto, helper, numpy_helper

import smelt

# quantized-op and quantize-tool cases at every ISA and mode: the long suite (`pytest -m slow`,
# run by .ci/run); the default run keeps the blocked int8 conv, the int8 LSTM and lower_qdq tests
pytestmark = pytest.mark.slow

ort = pytest.importorskip("onnxruntime")

ISAS = ["native", "avx2", "scalar"]
MS = "com.microsoft"
TYPES = (np.uint8, np.int8)


class Model:
    """Many com.microsoft nodes in one model, each output a graph output."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.feeds: dict[str, np.ndarray] = {}
        self.outputs: list[tuple[str, np.dtype]] = []

    def data(self, dtype, shape) -> str:
        name = f"x{len(self.feeds)}"
        info = np.iinfo(dtype)
        self.feeds[name] = self.rng.integers(info.min, int(info.max) + 1, shape).astype(dtype)
        return name

    def const(self, value) -> str:
        name = f"c{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def qparams(self, dtype, lo: float = 0.002, hi: float = 0.2) -> list[str]:
        info = np.iinfo(dtype)
        scale = np.float32(self.rng.uniform(lo, hi))
        return [self.const(scale), self.const(dtype(self.rng.integers(info.min, int(info.max) + 1)))]

    def node(self, op: str, inputs: list[str], dtype, **attrs) -> None:
        out = f"{op}_{len(self.nodes)}"
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, domain=MS, **attrs))
        self.outputs.append((out, dtype))

    def build(self) -> onnx.ModelProto:
        ins = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
               for k, v in self.feeds.items()]
        outs = [helper.make_tensor_value_info(o, helper.np_dtype_to_tensor_dtype(np.dtype(t)), None)
                for o, t in self.outputs]
        graph = helper.make_graph(self.nodes, "qlinear", ins, outs, initializer=self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
        model.ir_version = 8
        return model


def _ort(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, feeds)


def _check(m: Model, op_count: int | None = None) -> None:
    model = m.build()
    want = _ort(model, m.feeds)
    for threads in (1, 2):
        compiled = smelt.compile(model, threads=threads)
        assert compiled.fallback_nodes == [], compiled.fallback_report
        got = compiled.run(m.feeds)
        for (name, _), g, w in zip(m.outputs, got, want, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape, (name, g.dtype, w.dtype, g.shape, w.shape)
            bad = int(np.sum(g != w))
            assert bad == 0, f"{name} (threads={threads}): {bad} of {w.size} differ, max {np.max(np.abs(g.astype(int) - w.astype(int)))}"
        compiled.close()


BROADCASTS = [
    ((1000,), (1000,)), ((7,), (7,)), ((2, 3, 5, 7), (2, 3, 5, 7)),  # same shape, odd sizes
    ((2, 16, 5, 5), (1, 16, 1, 1)), ((1, 16, 1, 1), (2, 16, 5, 5)),  # one value per inner run
    ((3, 4, 9), (9,)), ((9,), (3, 4, 9)), ((3, 1, 9), (1, 4, 9)),  # runs on both sides
    ((33, 17), (1,)), ((), (5, 3)), ((4, 1), (4, 1)), ((64,), (1,)),  # scalars
]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
def test_qlinear_binary(op: str, isa: str, monkeypatch, cache) -> None:
    force_isa(isa, monkeypatch, cache)
    m = Model(16 if op == "QLinearAdd" else 17)
    for dtype in TYPES:
        for sa, sb in BROADCASTS:
            for _ in range(2):
                a, b = m.data(dtype, sa), m.data(dtype, sb)
                hi = 0.5 if op == "QLinearMul" else 0.2
                m.node(op, [a, *m.qparams(dtype), b, *m.qparams(dtype), *m.qparams(dtype, 0.002, hi)], dtype)
        # an output scale small enough to saturate most elements both ways
        a, b = m.data(dtype, (300,)), m.data(dtype, (300,))
        zero = m.const(dtype(0))
        m.node(op, [a, m.const(np.float32(0.05)), zero, b, m.const(np.float32(0.07)), zero,
                    m.const(np.float32(0.001)), zero], dtype)
    _check(m)


@pytest.mark.parametrize("isa", ISAS)
def test_qlinear_lookup(isa: str, monkeypatch, cache) -> None:
    force_isa(isa, monkeypatch, cache)
    m = Model(18)
    for dtype in TYPES:
        info = np.iinfo(dtype)
        codes = np.arange(info.min, int(info.max) + 1).astype(dtype).reshape(2, 4, 32)  # every code
        for k in range(6):
            x = f"codes_{np.dtype(dtype).name}_{k}"
            m.feeds[x] = codes
            m.node("QLinearSigmoid", [x, *m.qparams(dtype, 0.01, 0.3), *m.qparams(dtype, 0.001, 0.01)], dtype)
            m.node("QLinearLeakyRelu", [x, *m.qparams(dtype), *m.qparams(dtype)], dtype,
                   alpha=float(m.rng.uniform(0.01, 0.5)))
        m.node("QLinearSigmoid", [m.data(dtype, (3, 77)), *m.qparams(dtype, 0.01, 0.1), *m.qparams(dtype, 0.002, 0.01)],
               dtype)
    _check(m)


@pytest.mark.parametrize("isa", ISAS)
def test_qlinear_global_average_pool(isa: str, monkeypatch, cache) -> None:
    force_isa(isa, monkeypatch, cache)
    m = Model(19)
    for dtype in TYPES:
        for shape in ((1, 5, 1, 1), (2, 3, 7, 5), (1, 64, 7, 7), (3, 2, 13, 1), (1, 9, 17)):
            for last in (0, 1):
                xs, xz = m.qparams(dtype, 0.01, 0.1)
                m.node("QLinearGlobalAveragePool", [m.data(dtype, shape), xs, xz, *m.qparams(dtype, 0.005, 0.05)],
                       dtype, channels_last=last)
    _check(m)


@pytest.mark.parametrize("isa", ISAS)
def test_qlinear_average_pool(isa: str, monkeypatch, cache) -> None:
    force_isa(isa, monkeypatch, cache)
    m = Model(24)
    cases = [((2, 3, 9, 7), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
             ((1, 4, 8, 8), dict(kernel_shape=[2, 2], strides=[2, 2])),
             ((1, 5, 7, 6), dict(kernel_shape=[3, 2], pads=[0, 1, 2, 0], count_include_pad=1)),
             ((1, 3, 6, 5), dict(kernel_shape=[6, 5])),  # the whole image: onnxruntime's global pool
             ((2, 3, 11), dict(kernel_shape=[4], strides=[3], pads=[2, 1])),  # 1-D
             ((1, 2, 5, 5), dict(kernel_shape=[5, 5], pads=[1, 1, 1, 1], count_include_pad=1))]
    for dtype in TYPES:
        for shape, attrs in cases:
            for last in (0, 1):
                data_shape = (shape[0], *shape[2:], shape[1]) if last else shape
                m.node("QLinearAveragePool", [m.data(dtype, data_shape), *m.qparams(dtype, 0.01, 0.1),
                                              *m.qparams(dtype, 0.005, 0.05)], dtype, channels_last=last, **attrs)
    _check(m)


@pytest.mark.parametrize("isa", ISAS)
def test_qlinear_concat(isa: str, monkeypatch, cache) -> None:
    force_isa(isa, monkeypatch, cache)
    m = Model(20)
    for dtype in TYPES:
        for axis, shapes in ((1, [(2, 3, 4, 5), (2, 1, 4, 5), (2, 6, 4, 5)]), (0, [(3, 7), (1, 7)]),
                             (-1, [(2, 5, 3), (2, 5, 1), (2, 5, 8)])):
            ys, yz = m.qparams(dtype)
            ins = [m.data(dtype, s) for s in shapes]
            triples = []
            for k, x in enumerate(ins):  # the first shares the output's quantization: copied
                triples += [x, ys, yz] if k == 0 else [x, *m.qparams(dtype)]
            m.node("QLinearConcat", [ys, yz, *triples], dtype, axis=axis)
    _check(m)


def test_lookup_table_matches_formula() -> None:
    """The compile-time table is the dequantize → function → quantize chain onnxruntime builds."""
    from smelt.codegen.templates.qlinear_ops import lookup_table

    t = lookup_table("uint8", np.float32(0.1), 128, np.float32(0.1), 128, lambda x: x)
    np.testing.assert_array_equal(t, np.arange(256, dtype=np.uint8))  # identity requantization
    t = lookup_table("int8", np.float32(0.1), 0, np.float32(0.05), 0, lambda x: np.maximum(x, np.float32(0)))
    codes = np.arange(256, dtype=np.uint8).view(np.int8).astype(int)
    np.testing.assert_array_equal(t.astype(int), np.clip(np.maximum(codes, 0) * 2, -128, 127))


def test_tensor_proto_types() -> None:
    assert helper.np_dtype_to_tensor_dtype(np.dtype(np.int8)) == TensorProto.INT8


# -- the integer GEMM contrib ops ----------------------------------------------------------------
GEMM_SHAPES = [((1, 40), 23), ((9, 33), 70), ((2, 3, 17), 5), ((64, 130), 129), ((5, 1), 1)]


def _floats(m: Model, shape) -> str:
    name = f"f{len(m.feeds)}"
    m.feeds[name] = m.rng.standard_normal(shape).astype(np.float32) * 3
    return name


def _b(m: Model, dtype, k: int, n: int, per_column: bool, zero: bool) -> list[str]:
    """B, b_scale, b_zero_point (int8 symmetric: zero points 0, the VNNI quad form)."""
    info = np.iinfo(dtype)
    b = m.const(m.rng.integers(info.min, int(info.max) + 1, (k, n)).astype(dtype))
    shape = (n,) if per_column else ()
    bs = m.const(m.rng.uniform(0.001, 0.02, shape).astype(np.float32))
    bz = m.const(np.zeros(shape, dtype) if zero else m.rng.integers(info.min, int(info.max) + 1, shape).astype(dtype))
    return [b, bs, bz]


@pytest.mark.parametrize("isa", ISAS)
def test_dynamic_quantize_matmul(isa: str, monkeypatch, cache) -> None:
    force_isa(isa, monkeypatch, cache)
    m = Model(21)
    for (ashape, n) in GEMM_SHAPES:
        k = ashape[-1]
        for bt, per_column, zero, bias in ((np.int8, False, True, False), (np.int8, True, True, True),
                                           (np.uint8, True, False, True), (np.int8, False, False, False)):
            b, bs, bz = _b(m, bt, k, n, per_column, zero)
            ins = [_floats(m, ashape), b, bs, bz]
            if bias:
                ins.append(m.const(m.rng.standard_normal(n).astype(np.float32)))
            m.node("DynamicQuantizeMatMul", ins, np.float32)
    _check(m)


@pytest.mark.parametrize("isa", ISAS)
def test_matmul_integer_to_float(isa: str, monkeypatch, cache) -> None:
    force_isa(isa, monkeypatch, cache)
    m = Model(22)
    for (ashape, n) in GEMM_SHAPES:
        k = ashape[-1]
        for at, bt, per_column, zero, bias in ((np.uint8, np.int8, True, True, True), (np.uint8, np.uint8, False, False, False),
                                               (np.int8, np.int8, True, False, True)):
            b, bs, bz = _b(m, bt, k, n, per_column, zero)
            info = np.iinfo(at)
            az = m.const(at(m.rng.integers(info.min, int(info.max) + 1)))
            ins = [m.data(at, ashape), b, m.const(np.float32(m.rng.uniform(0.01, 0.1))), bs, az, bz]
            if bias:
                ins.append(m.const(m.rng.standard_normal(n).astype(np.float32)))
            m.node("MatMulIntegerToFloat", ins, np.float32)
    _check(m)


@pytest.mark.parametrize("isa", ISAS)
def test_qgemm(isa: str, monkeypatch, cache) -> None:
    force_isa(isa, monkeypatch, cache)
    m = Model(23)
    for mm, k, n in ((1, 40, 23), (9, 33, 70), (64, 130, 17), (3, 1, 5)):
        for at, bt in ((np.uint8, np.int8), (np.int8, np.int8), (np.uint8, np.uint8)):
            for trans_a, trans_b, alpha, bias, requant in ((0, 0, 1.0, False, False), (0, 1, 0.5, True, True),
                                                           (1, 0, 1.0, True, False), (1, 1, 2.0, False, True)):
                info = np.iinfo(at)
                a = m.data(at, (k, mm) if trans_a else (mm, k))
                b, bs, bz = _b(m, bt, k, n, bool(trans_b), at == np.uint8)
                if trans_b:  # stored [N, K]; scale and zero point stay per output column
                    stored = next(i for i in m.inits if i.name == b)
                    stored.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(stored).T.copy(), b))
                ins = [a, m.const(np.float32(m.rng.uniform(0.01, 0.1))),
                       m.const(at(m.rng.integers(info.min, int(info.max) + 1))), b, bs, bz]
                ins.append(m.const(m.rng.integers(-5000, 5000, (n,)).astype(np.int32)) if bias else "")
                out_type = np.float32
                if requant:
                    ins += [m.const(np.float32(m.rng.uniform(0.05, 0.5))),
                            m.const(at(m.rng.integers(info.min, int(info.max) + 1)))]
                    out_type = at
                m.node("QGemm", ins, out_type, transA=trans_a, transB=trans_b, alpha=alpha)
    _check(m)


@pytest.mark.parametrize("isa", [*ISAS, AVX_VNNI])
def test_gemm_seven_bit_weights(isa: str, monkeypatch, cache) -> None:
    """Weights in [-64, 63] (quantized with reduce_range): the u8 x 7-bit quads on hosts without
    VNNI (vpmaddubsw, exact there), VNNI's quads or the pairs elsewhere; the extremes of both
    operands in every product's reach (A all 255 in one row, B at -64 and 63)."""
    force_isa(isa, monkeypatch, cache)
    m = Model(24)
    for mm, k, n in ((1, 40, 23), (9, 33, 70), (7, 130, 17), (3, 1, 5)):
        bvals = m.rng.integers(-64, 64, (k, n)).astype(np.int8)
        bvals[0, :] = 63
        bvals[-1, ::2] = -64
        for op in ("QGemm", "MatMulIntegerToFloat", "DynamicQuantizeMatMul"):
            b = m.const(bvals)
            bs = m.const(m.rng.uniform(0.001, 0.02, (n,)).astype(np.float32))
            bz = m.const(np.zeros((n,), np.int8))
            if op == "DynamicQuantizeMatMul":
                m.node(op, [_floats(m, (mm, k)), b, bs, bz], np.float32)
                continue
            a = m.data(np.uint8, (mm, k))
            m.feeds[a][0] = 255
            az = m.const(np.uint8(m.rng.integers(0, 256)))
            a_scale = m.const(np.float32(m.rng.uniform(0.01, 0.1)))
            if op == "QGemm":
                ins = [a, a_scale, az, b, bs, bz, m.const(m.rng.integers(-5000, 5000, (n,)).astype(np.int32)),
                       m.const(np.float32(m.rng.uniform(0.05, 0.5))), m.const(np.uint8(m.rng.integers(0, 256)))]
                m.node(op, ins, np.uint8)
            else:
                m.node(op, [a, b, a_scale, bs, az, bz], np.float32)
    _check(m)
    if isa == "avx2":  # (no VNNI: the 7-bit quads, not the pairs)
        infos = list(smelt.compile(m.build()).plan.step_infos())
        assert len({s.node for s in infos if "u8 x 7-bit quads" in s.schedule.get("algorithm", "")}) == 12, infos


@pytest.mark.parametrize("isa", ISAS)
def test_qlinear_softmax(isa: str, monkeypatch, cache) -> None:
    """onnxruntime's QLinearSoftmax (what its quantizer writes in QOperator format for a
    transformer's attention): row lengths below, at and above the 16 summing lanes, 400 keys,
    opset 13 over the last axis and opset 12 coerced at axis 1, uint8 and int8, an infinite
    uint8 x_scale (a -inf attention mask's: every code 0, as onnxruntime answers). Codes equal
    onnxruntime's but where the sums' lane order moves one across a rounding boundary: at most
    one unit, in at most 1 of 2000 codes."""
    force_isa(isa, monkeypatch, cache)
    m = Model(20261128)
    for dt in TYPES:
        info = np.iinfo(dt)
        for shape, attrs in (((3, 1), {}), ((2, 15), {}), ((2, 3, 16), {}), ((2, 17), {}), ((3, 33), {}),
                             ((2, 6, 400), {}), ((2, 3, 5), {"opset": 12, "axis": 1})):
            x = m.data(dt, shape)
            # an infinite x_scale for uint8 only: for int8 onnxruntime writes -128 in its vector
            # blocks and 0 in a row's tail (a C cast of NaN there); smelt writes -128 throughout
            for xs, ys in ((0.06, 1 / 256), (0.3, 1 / 255)) + (((np.inf, 1 / 256),) if dt == np.uint8 else ()):
                params = [m.const(np.float32(xs)), m.const(dt(0)), m.const(np.float32(ys)), m.const(dt(info.min))]
                m.node("QLinearSoftmax", [x, *params], dt, **{"opset": 13, "axis": -1, **attrs})
    model = m.build()
    want = _ort(model, m.feeds)
    for threads in (1, 2):
        compiled = smelt.compile(model, threads=threads)
        assert compiled.fallback_nodes == [], compiled.fallback_report
        for (name, _), g, w in zip(m.outputs, compiled.run(m.feeds), want, strict=True):
            diff = np.abs(g.astype(int) - w.astype(int))
            assert g.dtype == w.dtype and g.shape == w.shape, name
            assert diff.max() <= 1 and np.count_nonzero(diff) * 2000 <= max(w.size, 2000), (name, threads, diff.max())
        compiled.close()


def test_qlinear_softmax_refusals_name_the_limit() -> None:
    m = Model(1)
    x = m.data(np.uint8, (2, 3, 4))
    m.node("QLinearSoftmax", [x, m.const(np.float32(0.1)), m.const(np.uint8(0)), m.const(np.float32(1 / 256)),
                              m.const(np.uint8(0))], np.uint8, opset=13, axis=1)
    with pytest.raises(smelt.UnsupportedOpError, match="axis other than the last"):
        smelt.compile(m.build(), threads=1, allow_fallback=False)
