"""The blocked int8 convolution (templates/int_conv_nchwc.py, schedule/int_conv.py) against
onnxruntime's QLinearConv: equal, not close.

Every ISA the host runs (native: AVX-512 with VNNI's u8 x s8 quads where present; avx2: the int16
pair form; scalar: the NCHW kernel, which the planner keeps there), 1 and 2 threads. Edge shapes:
channels odd and not multiples of 4 or 16 (in and out), ragged widths against every register
tile, strides, asymmetric pads, dilation, the 7x7 stride-2 stem and other inputs of fewer than
four channels (read as rows of (kx, channel) quads), 1x1 stride 2, batch 2; zero
points at the ends of the range; per-tensor and per-channel weight scales; with and without bias;
a fused quantized ReLU (Max at the zero point); scales that saturate both ways (onnxruntime has no
uint8-in, int8-out QLinearConv, and the blocked kernel takes uint8 in and out only). Chains keep activations blocked between convs (NCHW<b>c in, NCHW<b>c out), and a per-tensor
DequantizeLinear reads a blocked value.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import ort_run
from kernel_models import AVX_VNNI, Uint8ModelBuilder, _isa_target
from onnx import TensorProto, helper
from onnx import numpy_helper as nh

from smelt.schedule.int_conv import int_isa

pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(20261126)
ISAS = ["native", "avx2", AVX_VNNI, "scalar"]

# (C, OC, H, W, k, stride, pads (t, l, b, r), dilation)
GEOMETRIES = [
    (3, 64, 23, 23, 7, 2, (3, 3, 3, 3), 1),  # the stem: 3 channels read as one quad
    (16, 32, 9, 11, 3, 1, (1, 1, 1, 1), 1),
    (5, 17, 7, 13, 3, 2, (1, 0, 2, 1), 1),  # odd channels, asymmetric pads
    (20, 33, 8, 9, 3, 1, (2, 2, 2, 2), 2),  # dilation, C not a multiple of 16
    (32, 48, 8, 8, 1, 1, (0, 0, 0, 0), 1),
    (64, 64, 14, 14, 1, 2, (0, 0, 0, 0), 1),  # 1x1 stride 2 (the projection shortcut)
    (64, 80, 7, 7, 3, 1, (1, 1, 1, 1), 1),  # width 7 against the tiles
    (6, 7, 5, 29, 1, 1, (0, 0, 0, 0), 1),  # a wide ragged row, 7 outputs
    # fewer channels than a quad: rows of (kx, channel) quads (kx_packed), 5 * 1 = 5 and
    # 3 * 2 = 6 values per kernel row (2 quads each, the rest zero weights); dilated: not packed
    (1, 16, 11, 13, 5, 1, (2, 1, 2, 3), 1),
    (2, 24, 9, 10, 3, 2, (1, 1, 1, 1), 1),
    (3, 16, 10, 10, 3, 1, (2, 2, 2, 2), 2),
]


def _const(name: str, value) -> TensorProto:
    return nh.from_array(np.asarray(value), name)


class _Model(Uint8ModelBuilder):
    graph_name = "int_conv_nchwc"

    def __init__(self) -> None:
        super().__init__(RNG)

    def conv(self, x: str, c: int, oc: int, k: int, s: int, pads, d: int, *, xz: int, yz: int, y_scale: float,
             per_channel: bool, bias: bool, relu: bool, out_type=np.uint8, seven_bit: bool = False) -> str:
        n = self.name("c")
        lo, hi = (-64, 64) if seven_bit else (-128, 128)  # 7-bit weights: the vpmaddubsw form without VNNI
        w = RNG.integers(lo, hi, (oc, c, k, k)).astype(np.int8)
        if seven_bit:
            w.reshape(-1)[:2] = (-64, 63)  # both ends of the range that form is exact on
        ws = (RNG.uniform(0.5, 2.0, oc if per_channel else 1) * 2e-3).astype(np.float32)
        names = [x, f"{n}_xs", f"{n}_xz", f"{n}_w", f"{n}_ws", f"{n}_wz", f"{n}_ys", f"{n}_yz"]
        self.inits += [_const(names[1], np.float32(0.02)), _const(names[2], np.uint8(xz)), _const(names[3], w),
                       _const(names[4], ws if per_channel else ws[0]), _const(names[5], np.int8(0)),
                       _const(names[6], np.float32(y_scale)), _const(names[7], out_type(yz))]
        if bias:
            names.append(f"{n}_b")
            self.inits.append(_const(names[-1], RNG.integers(-20000, 20000, oc).astype(np.int32)))
        y = self.name("y")
        self.nodes.append(helper.make_node("QLinearConv", names, [y], kernel_shape=[k, k], strides=[s, s],
                                           pads=[pads[0], pads[1], pads[2], pads[3]], dilations=[d, d]))
        if relu:
            r = self.name("r")
            self.nodes.append(helper.make_node("Max", [y, names[7]], [r]))
            y = r
        return y

    def output(self, y: str, dtype=np.uint8) -> None:
        self.outputs.append(helper.make_tensor_value_info(y, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), None))

    def dequantize(self, y: str, yz: int, out_type=np.uint8) -> str:
        out = self.name("dq")
        s, z = self.name("dqs"), self.name("dqz")
        self.inits += [_const(s, np.float32(0.05)), _const(z, out_type(yz))]
        self.nodes.append(helper.make_node("DequantizeLinear", [y, s, z], [out]))
        return out

    def add_residual(self, u: str, v: str, scale: float, zero: int) -> str:
        """Add, Relu, QuantizeLinear to uint8: the float residual join of a quantized ResNet."""
        t, r, q = self.name("add"), self.name("relu"), self.name("q")
        s, z = self.name("qs"), self.name("qz")
        self.inits += [_const(s, np.float32(scale)), _const(z, np.uint8(zero))]
        self.nodes += [helper.make_node("Add", [u, v], [t]), helper.make_node("Relu", [t], [r]),
                       helper.make_node("QuantizeLinear", [r, s, z], [q])]
        return q



def _cases() -> _Model:
    m = _Model()
    for i, (c, oc, h, w, k, s, pads, d) in enumerate(GEOMETRIES):
        batch = 2 if i % 3 == 0 else 1
        x = m.input((batch, c, h, w))
        xz, yz = (0, 128, 255, 7)[i % 4], (3, 0, 255, 128)[i % 4]
        # alone, written as a graph output (plain); y_scale 0.01 saturates many values both ways
        m.output(m.conv(x, c, oc, k, s, pads, d, xz=xz, yz=yz, y_scale=(0.05, 0.01)[i % 2],
                        per_channel=i % 2 == 0, bias=i % 3 != 2, relu=i % 2 == 1))
        # fused ReLU, then a second conv reading the blocked result, then a DequantizeLinear
        # reading that conv's blocked output
        y1 = m.conv(x, c, oc, k, s, pads, d, xz=xz, yz=yz, y_scale=0.05, per_channel=True, bias=True, relu=True)
        y2 = m.conv(y1, oc, 16 + 16 * (i % 3), 3 if i % 2 else 1, 1, (1, 1, 1, 1) if i % 2 else (0, 0, 0, 0), 1,
                    xz=yz, yz=(5, 250)[i % 2], y_scale=0.08, per_channel=i % 2 == 1, bias=True, relu=i % 3 == 0)
        m.output(m.dequantize(y2, (5, 250)[i % 2]), np.float32)
        if i % 2 == 0:  # the same with 7-bit weights, at full-scale inputs (the saturating-int16 worst case)
            m.output(m.conv(x, c, oc, k, s, pads, d, xz=xz, yz=yz, y_scale=0.05, per_channel=True, bias=True,
                            relu=True, seven_bit=True))
    return m


@pytest.mark.parametrize("isa", ISAS)
def test_qlinear_conv_blocked(isa: str, monkeypatch, cache) -> None:
    import smelt

    monkeypatch.setenv("SMELT_CACHE_DIR", str(cache))
    target = _isa_target(isa, monkeypatch)
    monkeypatch.setattr("smelt.compiler.detect", lambda: target)
    m = _cases()
    model = m.build()
    want = ort_run(model, m.feeds)
    blocked_expected = isa != "scalar"
    for threads in (1, 2):
        compiled = smelt.compile(model, threads=threads)
        assert compiled.fallback_nodes == []
        templates = [s.schedule.get("template", "") for s in compiled.plan.step_infos()]
        convs = sum(op == "QLinearConv" for _, op in compiled.native_nodes)
        if blocked_expected:
            # every conv on the blocked kernel and every quantized ReLU fused into its conv
            assert templates.count("int_conv_nchwc") >= convs > 0, templates
            assert not any(op == "Max" for _, op in compiled.native_nodes)
            layouts = " ".join(s.schedule.get("layout", "") for s in compiled.plan.step_infos())
            assert "-> out NCHW" in layouts and "in NCHW" in layouts  # blocked values flow between convs
            forms = " ".join(s.schedule.get("algorithm", "") for s in compiled.plan.step_infos())
            if isa == "avx2":  # no VNNI: 7-bit weights take vpmaddubsw quads, the others int16 pairs
                assert "u8 x 7-bit quads" in forms and "int16 pairs" in forms, forms
            if isa == AVX_VNNI:  # AVX-VNNI: every conv on exact u8 x s8 quads in 8-channel blocks
                assert "u8s8 quads, block 8" in forms and "int16 pairs" not in forms, forms
            # convs of several output-channel groups walk the next group's weights (the 64- and
            # 80-channel ones at any tile), the rest do not
            assert "next weights prefetched" in forms, forms
        else:
            assert "int_conv_nchwc" not in templates
        got = compiled.run(m.feeds)
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert g.dtype == w.dtype and g.shape == w.shape, (i, g.dtype, w.dtype, g.shape, w.shape)
            np.testing.assert_array_equal(g, w, err_msg=f"output {i} ({isa}, {threads} threads)")
        compiled.close()


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_weight_prefetch_changes_no_answer(isa: str, monkeypatch, cache) -> None:
    """The next group's weights prefetched or not (``int_conv_prefetch_weights``): the same
    bytes, on ResNet-50 layer4's shapes (many groups, 7x7 rows, weights past L1) and a ragged
    last group; the byte quads and the int16 pairs (whose weights are twice the bytes)."""
    import smelt

    monkeypatch.setenv("SMELT_CACHE_DIR", str(cache))
    target = _isa_target(isa, monkeypatch)
    monkeypatch.setattr("smelt.compiler.detect", lambda: target)
    m = _Model()
    x = m.input((1, 96, 7, 7))
    y = m.conv(x, 96, 200, 3, 1, (1, 1, 1, 1), 1, xz=3, yz=9, y_scale=0.05, per_channel=True, bias=True, relu=True)
    m.output(m.conv(y, 200, 72, 1, 1, (0, 0, 0, 0), 1, xz=9, yz=120, y_scale=0.06, per_channel=True, bias=True,
                    relu=False))
    model = m.build()
    want = ort_run(model, m.feeds)
    for on in (True, False):
        compiled = smelt.compile(model, threads=2, schedule={"int_conv_prefetch_weights": on})
        forms = {s.node: s.schedule.get("algorithm", "") for s in compiled.plan.step_infos() if s.op == "QLinearConv"}
        assert sum("next weights prefetched" in f for f in forms.values()) == (2 if on else 0), forms
        for g, w in zip(compiled.run(m.feeds), want, strict=True):
            np.testing.assert_array_equal(g, w, err_msg=f"{isa}, prefetch {on}")
        compiled.close()


def test_tile_choice_fits_registers() -> None:
    """Every tile the model picks fits the register file: nv * rw accumulators, nv weight
    vectors and one broadcast."""
    from smelt.schedule.int_conv import IntConvGeometry, choose_tile

    for registers, lanes in ((32, 16), (16, 8)):
        for oc in (8, 16, 17, 64, 256, 2048):
            for ow in (1, 3, 7, 14, 28, 56, 112):
                geo = IntConvGeometry(n=1, c=64, h=ow, w=ow, oc=oc, kh=1, kw=1, oh=ow, ow=ow, sh=1, sw=1, dh=1,
                                      dw=1, pt=0, pl=0, pb=0, pr=0)
                nv, rw = choose_tile(geo, lanes, registers)
                assert nv * rw + nv + 1 <= registers and 1 <= rw <= ow and nv * lanes <= max(lanes, -(-oc // lanes) * lanes)


def test_saturation_counters_match_nchw(monkeypatch, cache) -> None:
    """The numeric debug counters of the blocked kernel (per lane, in vectors) count what the
    NCHW kernel's scalar counters count: the elements clamped low and high, summed over the
    model (a fused ReLU's clamp at the zero point is not a saturation)."""
    _check_saturation_totals(_cases(), monkeypatch, cache)


def _check_saturation_totals(m, monkeypatch, cache) -> None:
    """The model's clamp counts (low, high) on the blocked kernels (native) equal the NCHW
    kernels' (scalar), and both ends are hit."""
    import smelt

    monkeypatch.setenv("SMELT_CACHE_DIR", str(cache))
    model = m.build()
    totals = {}
    for isa in ("native", "scalar"):
        target = _isa_target(isa, monkeypatch)
        monkeypatch.setattr("smelt.compiler.detect", lambda target=target: target)
        compiled = smelt.compile(model, threads=2, count_saturation=True)
        compiled.run(m.feeds)
        counts = compiled.saturation_counts()
        totals[isa] = tuple(sum(c[i] for c in counts.values()) for i in (0, 1))
        compiled.close()
    assert totals["native"] == totals["scalar"] and min(totals["scalar"]) > 0, totals


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_residual_path_stays_blocked(isa: str, monkeypatch, cache) -> None:
    """A ResNet block as onnxruntime's quantizer writes it: two int8 convs, DequantizeLinear of
    each, a float Add and Relu, QuantizeLinear, and the next int8 conv. Every value between the
    convs stays NCHW<b>c (per-tensor Q/DQ run on any layout), so no LayoutTransform is needed;
    the last conv writes plain for its DequantizeLinear into the graph output. Equal to onnxruntime running the same nodes one by one (graph optimizations off, so it
    does not fuse DQ -> Add -> Q into its own QLinearAdd, which rounds differently)."""
    import onnxruntime as ort

    import smelt

    monkeypatch.setenv("SMELT_CACHE_DIR", str(cache))
    target = _isa_target(isa, monkeypatch)
    monkeypatch.setattr("smelt.compiler.detect", lambda: target)
    m = _Model()
    x = m.input((1, 32, 10, 12))
    a = m.conv(x, 32, 32, 1, 1, (0, 0, 0, 0), 1, xz=9, yz=0, y_scale=0.05, per_channel=True, bias=True, relu=True)
    b = m.conv(a, 32, 64, 3, 1, (1, 1, 1, 1), 1, xz=0, yz=130, y_scale=0.08, per_channel=True, bias=True,
               relu=False)
    c = m.conv(x, 32, 64, 1, 1, (0, 0, 0, 0), 1, xz=9, yz=120, y_scale=0.06, per_channel=True, bias=True,
               relu=False)
    s = m.add_residual(m.dequantize(b, 130), m.dequantize(c, 120), 0.07, 0)
    d = m.conv(s, 64, 32, 3, 2, (1, 1, 1, 1), 1, xz=0, yz=4, y_scale=0.1, per_channel=True, bias=True, relu=True)
    m.output(m.dequantize(d, 4), np.float32)
    model = m.build()
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, m.feeds)
    for threads in (1, 2):
        compiled = smelt.compile(model, threads=threads)
        ops = [op for _, op in compiled.native_nodes]
        assert compiled.fallback_nodes == [] and "LayoutTransform" not in ops and "Max" not in ops, ops
        np.testing.assert_array_equal(compiled.run(m.feeds)[0], want[0])
        compiled.close()


@pytest.mark.parametrize("isa,separable", [("native", True), ("avx2", True), ("native", False)])
def test_maxpool_between_convs_stays_blocked(isa: str, separable: bool, monkeypatch, cache, tmp_path) -> None:
    """The quantized stem: conv, 8-bit MaxPool (3x3 stride 2 pad 1, a ragged 2x2 stride 2
    ceil_mode one, and a dilated 2x3 one with asymmetric pads), conv: the pool runs on NCHW<b>c
    bytes (int_pool_nchwc.py), so nothing between the convs is plain; equal to onnxruntime. With
    the row max first (separable) and, rows too long for its buffer, window by window."""
    import smelt

    monkeypatch.setenv("SMELT_CACHE_DIR", str(cache))
    target = _isa_target(isa, monkeypatch)
    monkeypatch.setattr("smelt.compiler.detect", lambda: target)
    if not separable:  # (its own cache: the artifact of the separable pools has the same key)
        monkeypatch.setattr("smelt.codegen.templates.int_pool_nchwc.SEPARABLE_ROW_BYTES", 0)
        monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    m = _Model()
    x = m.input((2, 3, 23, 21))
    a = m.conv(x, 3, 32, 7, 2, (3, 3, 3, 3), 1, xz=5, yz=0, y_scale=0.05, per_channel=True, bias=True, relu=True)
    p1 = m.name("pool")
    m.nodes.append(helper.make_node("MaxPool", [a], [p1], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
    p2 = m.name("pool")
    m.nodes.append(helper.make_node("MaxPool", [p1], [p2], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1))
    p3 = m.name("pool")
    m.nodes.append(helper.make_node("MaxPool", [a], [p3], kernel_shape=[2, 3], strides=[1, 2], dilations=[2, 2],
                                    pads=[0, 1, 1, 0]))
    b = m.conv(p2, 32, 16, 3, 1, (1, 1, 1, 1), 1, xz=0, yz=7, y_scale=0.1, per_channel=True, bias=True,
               relu=False)
    m.output(m.conv(p3, 32, 16, 1, 1, (0, 0, 0, 0), 1, xz=0, yz=3, y_scale=0.1, per_channel=True, bias=True,
                    relu=False))
    m.output(b)
    model = m.build()
    want = ort_run(model, m.feeds)
    for threads in (1, 2):
        compiled = smelt.compile(model, threads=threads)
        templates = [s.schedule.get("template", "") for s in compiled.plan.step_infos()]
        assert templates.count("int_maxpool_nchwc") == 3 and "layout_transform" not in templates, templates
        for got, ref in zip(compiled.run(m.feeds), want, strict=True):
            np.testing.assert_array_equal(got, ref)
        compiled.close()


# -- a residual QLinearAdd fused into the epilogue ---------------------------------------------
# (schedule/int_conv.py ``ResidualAdd``) against onnxruntime running the same QLinearConv and
# com.microsoft QLinearAdd nodes: equal, not close. ResNet's two joins: the identity block (the
# add's other operand is the block's input, computed long before: fused into the block's last
# conv, which writes over the dead input) and the projection block (the add's operands are two
# convs' outputs: fused into the one that runs later, which reads the other). Both operand orders
# (the conv's output as the add's A or B), a fused ReLU before the add, sum scales that saturate
# both ways, zero points at the ends of the range, widths ragged against the tiles, batch 2; a
# residual still read after the add (no in-place), and an add into a graph output (plain: not
# fused). Every ISA the host runs, 1 and 2 threads.
RES_RNG = np.random.default_rng(20261127)


class _Residual(_Model):
    graph_name = "int_conv_residual"

    def __init__(self) -> None:
        super().__init__()
        self.params: dict[str, tuple[float, int]] = {}  # value -> (scale, zero point) of the uint8 tensors

    def qconv(self, x: str, c: int, oc: int, k: int, s: int, *, yz: int, y_scale: float, relu: bool = False,
              seven_bit: bool = False) -> str:
        # the conv helper reads its input at scale 0.02 (``_Model.conv``): every value here is
        # written at its own scale, so the conv's x scale is only what onnxruntime also uses
        p = (k - 1) // 2
        xz = self.params.get(x, (0.02, 7))[1]
        y = self.conv(x, c, oc, k, s, (p, p, p, p), 1, xz=xz, yz=yz, y_scale=y_scale, per_channel=True, bias=True,
                      relu=relu, seven_bit=seven_bit)
        self.params[y] = (y_scale, yz)
        return y

    def qadd(self, a: str, b: str, scale: float, zero: int) -> str:
        (sa, za), (sb, zb) = self.params[a], self.params[b]
        n = self.name("add")
        names = [a, f"{n}_as", f"{n}_az", b, f"{n}_bs", f"{n}_bz", f"{n}_cs", f"{n}_cz"]
        self.inits += [_const(names[1], np.float32(sa)), _const(names[2], np.uint8(za)),
                       _const(names[4], np.float32(sb)), _const(names[5], np.uint8(zb)),
                       _const(names[6], np.float32(scale)), _const(names[7], np.uint8(zero))]
        y = self.name("sum")
        self.nodes.append(helper.make_node("QLinearAdd", names, [y], domain="com.microsoft"))
        self.params[y] = (scale, zero)
        return y

    def build(self):
        m = super().build()
        m.opset_import.append(helper.make_opsetid("com.microsoft", 1))
        return m


def _blocks(seven_bit: bool = False) -> _Residual:
    """Identity and projection blocks in a chain, every join a QLinearAdd."""
    m = _Residual()
    for batch, c, h, w in ((2, 16, 7, 13), (1, 32, 9, 9)):
        x = m.input((batch, c, h, w))
        m.params[x] = (0.02, 7)
        # the stem: a conv whose blocked output feeds both branches
        a = m.qconv(x, c, 32, 3, 1, yz=0, y_scale=0.05, relu=True, seven_bit=seven_bit)
        # identity block, the conv's output as the add's A, a sum scale that saturates both ways
        b = m.qconv(a, 32, 16, 1, 1, yz=3, y_scale=0.06, relu=True, seven_bit=seven_bit)
        b = m.qconv(b, 16, 32, 3, 1, yz=128, y_scale=0.08, seven_bit=seven_bit)
        s1 = m.qadd(b, a, 0.01, 255 if c == 16 else 0)
        # identity block, the conv's output as the add's B, its ReLU fused before the add
        d = m.qconv(s1, 32, 32, 1, 1, yz=250, y_scale=0.07, relu=True, seven_bit=seven_bit)
        s2 = m.qadd(s1, d, 0.09, 5)
        # projection block: conv branch first, then the shortcut conv, which takes the add
        e = m.qconv(s2, 32, 48, 3, 2, yz=9, y_scale=0.05, seven_bit=seven_bit)
        f = m.qconv(s2, 32, 48, 1, 2, yz=200, y_scale=0.04, seven_bit=seven_bit)
        s3 = m.qadd(e, f, 0.06, 100)
        # a residual that is still read after its add: written to a fresh buffer, not over it
        g_ = m.qconv(s3, 48, 48, 1, 1, yz=0, y_scale=0.05, seven_bit=seven_bit)
        s4 = m.qadd(g_, s3, 0.05, 20)
        m.output(m.qconv(s3, 48, 16, 1, 1, yz=30, y_scale=0.05, seven_bit=seven_bit))
        # an add into a graph output: its operands plain, so left to the QLinearAdd kernel
        h = m.qconv(s4, 48, 48, 1, 1, yz=77, y_scale=0.03, seven_bit=seven_bit)
        m.output(m.qadd(m.qconv(h, 48, 48, 3, 1, yz=60, y_scale=0.1, seven_bit=seven_bit), h, 0.08, 128))
    return m


@pytest.mark.parametrize("isa", ISAS)
def test_residual_add_fused(isa: str, monkeypatch, cache) -> None:
    import smelt

    monkeypatch.setenv("SMELT_CACHE_DIR", str(cache))
    target = _isa_target(isa, monkeypatch)
    monkeypatch.setattr("smelt.compiler.detect", lambda: target)
    for seven_bit in (False, True) if isa == "avx2" else (False,):
        m = _blocks(seven_bit)
        model = m.build()
        want = ort_run(model, m.feeds)
        for threads in (1, 2):
            compiled = smelt.compile(model, threads=threads)
            assert compiled.fallback_nodes == []
            infos = compiled.plan.step_infos()
            fused = sum("residual add fused" in s.schedule.get("algorithm", "") for s in infos if s.part == 0)
            adds = sum(op == "QLinearAdd" for _, op in compiled.native_nodes)
            if isa == "scalar":  # the NCHW kernel: every add its own node
                assert fused == 0 and adds == 10, (fused, adds)
            else:  # all but the adds into graph outputs
                assert fused == 8 and adds == 2, (fused, adds)
            got = compiled.run(m.feeds)
            for i, (g, w) in enumerate(zip(got, want, strict=True)):
                assert g.dtype == w.dtype and g.shape == w.shape, (i, g.dtype, w.dtype, g.shape, w.shape)
                np.testing.assert_array_equal(g, w, err_msg=f"output {i} ({isa}, {threads} threads, 7-bit {seven_bit})")
            compiled.close()


def test_residual_add_written_in_place(monkeypatch, cache) -> None:
    """The identity joins write their sum over the dead residual (codegen/inplace.py): the arena
    is smaller than with ``inplace=False``, and the answers are the same."""
    import smelt

    monkeypatch.setenv("SMELT_CACHE_DIR", str(cache))
    target = _isa_target("native", monkeypatch)
    monkeypatch.setattr("smelt.compiler.detect", lambda: target)
    m = _blocks()
    model = m.build()
    on = smelt.compile(model, threads=2)
    off = smelt.compile(model, threads=2, schedule={"inplace": False})
    for g, w in zip(on.run(m.feeds), off.run(m.feeds), strict=True):
        np.testing.assert_array_equal(g, w)
    assert on.arena_bytes < off.arena_bytes, (on.arena_bytes, off.arena_bytes)
    on.close()
    off.close()


def test_saturation_counters_with_fused_add(monkeypatch, cache) -> None:
    """The fused epilogue counts the conv's clamps and the add's, as the separate kernels do:
    the model's totals equal the NCHW kernels' (scalar), and both ends are hit."""
    _check_saturation_totals(_blocks(), monkeypatch, cache)


def test_add_constants_match_the_qlinear_add_kernel() -> None:
    """The schedule forms MLAS's three constants exactly as the QLinearAdd template does."""
    from smelt.codegen.templates.qlinear_ops import add_constants as kernel_constants
    from smelt.schedule.int_conv import add_constants

    for _ in range(500):
        sa, sb, sc = (float(np.float32(s)) for s in RES_RNG.uniform(1e-3, 0.2, 3))
        za, zb, zc = (int(z) for z in RES_RNG.integers(0, 256, 3))
        assert add_constants(sa, za, sb, zb, sc, zc) == tuple(float(k) for k in kernel_constants(sa, za, sb, zb, sc, zc))


# -- padding taken in the kernel (schedule/int_conv.py ``pad_in_kernel``) -----------------------
# A padded conv reading a blocked value in quads reads it in place: rows outside the input read a
# zero-point row, the tiles touching a column border leave those taps out and start from the
# bias plus x_zero times their weights. Against onnxruntime and against the zero-point-padded
# copy (the option off): channels at, above and past the block (16, 32, 48; 8 and 24 in AVX2's
# 8-lane blocks), odd and tiny widths and heights against the tiles (a width smaller than one
# tile, whose only tile touches both borders), stride 2, asymmetric pads (one side 0), pads of 2
# with dilation 2, a 5x5 kernel, zero points at both ends of the range (the padded taps' share is
# x_zero times the weights: 0 and 255 both reach it), 7-bit weights on AVX2, 1 and 2 threads.
PAD_CASES = [  # (C, OC, H, W, k, stride, pads (t, l, b, r), dilation, input zero point)
    (16, 32, 9, 13, 3, 1, (1, 1, 1, 1), 1, 255),
    (32, 16, 7, 7, 3, 1, (1, 1, 1, 1), 1, 0),
    (48, 48, 14, 14, 3, 2, (1, 1, 1, 1), 1, 131),
    (16, 24, 5, 29, 3, 1, (0, 1, 2, 1), 1, 7),
    (32, 32, 3, 2, 3, 1, (1, 1, 1, 1), 1, 200),
    (16, 16, 8, 9, 3, 1, (2, 2, 2, 2), 2, 90),
    (16, 40, 11, 10, 5, 2, (2, 2, 2, 2), 1, 33),
    (8, 24, 6, 11, 3, 2, (1, 0, 1, 1), 1, 250),
]


def _pad_model(seven_bit: bool) -> _Model:
    m = _Model()
    for i, (c, oc, h, w, k, s, pads, d, xz) in enumerate(PAD_CASES):
        x = m.input((1 + i % 2, 5, h, w))
        # a 1x1 conv writes the blocked input (zero point xz: its output's), the padded conv reads it
        a = m.conv(x, 5, c, 1, 1, (0, 0, 0, 0), 1, xz=3, yz=xz, y_scale=0.03, per_channel=True, bias=True,
                   relu=i % 2 == 0, seven_bit=seven_bit)
        m.output(m.conv(a, c, oc, k, s, pads, d, xz=xz, yz=(0, 128, 255)[i % 3], y_scale=0.05, per_channel=i % 2 == 1,
                        bias=i % 3 != 1, relu=i % 4 == 3, seven_bit=seven_bit))
    return m


@pytest.mark.parametrize("isa,seven_bit", [("native", False), (AVX_VNNI, False), ("avx2", True)])
def test_padding_in_the_kernel(isa: str, seven_bit: bool, monkeypatch, cache) -> None:
    import smelt

    monkeypatch.setenv("SMELT_CACHE_DIR", str(cache))
    target = _isa_target(isa, monkeypatch)
    monkeypatch.setattr("smelt.compiler.detect", lambda: target)
    m = _pad_model(seven_bit)
    model = m.build()
    want = ort_run(model, m.feeds)
    for threads in (1, 2):
        for on in (True, False):
            compiled = smelt.compile(model, threads=threads, schedule={"int_conv_pad_in_kernel": on})
            algos = [s.schedule.get("algorithm", "") for s in compiled.plan.step_infos()]
            in_kernel = sum("padded in the kernel" in a for a in algos)
            # every padded conv whose input is blocked in its own block (all: AVX2's 8-lane blocks
            # divide every C, and at AVX-512's 16 the 8-channel input is padded to 16 between the
            # two convs, schedule/int_channel_pad.py), when the kernel reads quads (VNNI, or 7-bit
            # weights); the int16-pair form always reads a widened copy
            quads = seven_bit or int_isa(target).has("u8s8_dot_acc")
            expected = len(PAD_CASES) if quads else 0
            assert in_kernel == (expected if on else 0), (in_kernel, algos)
            for i, (g, w) in enumerate(zip(compiled.run(m.feeds), want, strict=True)):
                np.testing.assert_array_equal(g, w, err_msg=f"case {i} ({isa}, {threads} threads, in kernel {on})")
            compiled.close()


def test_edge_tiles() -> None:
    """The tiles whose pixels read a column outside the input, and only those."""
    from smelt.schedule.int_conv import IntConvGeometry, edge_tiles

    def geo(w: int, k: int, s: int, pl: int, pr: int, d: int = 1) -> IntConvGeometry:
        ow = (w + pl + pr - (k - 1) * d - 1) // s + 1
        return IntConvGeometry(n=1, c=16, h=4, w=w, oc=16, kh=k, kw=k, oh=4, ow=ow, sh=s, sw=s, dh=d, dw=d,
                               pt=0, pl=pl, pb=0, pr=pr)

    assert edge_tiles(geo(56, 3, 1, 1, 1), 14) == [0, 3]
    assert edge_tiles(geo(56, 3, 2, 1, 1), 6) == [0]  # stride 2: the last tap of the last pixel is column 55
    assert edge_tiles(geo(7, 3, 1, 1, 1), 7) == [0]  # one tile touching both borders
    assert edge_tiles(geo(13, 3, 1, 0, 2), 4) == [2, 3]  # no left pad: the right pad reaches two pixels
    assert edge_tiles(geo(20, 5, 1, 2, 2), 1) == [0, 1, 18, 19]
    assert edge_tiles(geo(9, 3, 1, 2, 2, 2), 3) == [0, 2]  # dilated


# -- tile edges of the epilogue and of the output channels -------------------------------------
# A tile's pixels leftover after its groups of four are stored two by two through one saturating
# pack (``i32x2_store_u8``), and a last output-channel group that the channels do not fill runs
# only its vectors. Widths leaving 1, 2 and 3 pixels after the fours (flat 1x1 planes of 6, 7,
# 10, 35 pixels; 3x3 rows of 5, 7, 14), output channels of 5, 6, 7 and 13 vectors of 16 (10, 11,
# 13, 26 of AVX2's 8) against the tiles the schedule picks (checked to include both), with a fused ReLU, a fused residual add and a
# plain graph output, 1 and 2 threads, every ISA with the blocked kernel.
TILE_CASES = [  # (C, OC, H, W, k)
    (16, 80, 2, 3, 1), (16, 104, 2, 5, 1), (16, 208, 2, 5, 1), (32, 80, 5, 7, 1),
    (16, 80, 5, 5, 3), (16, 88, 4, 7, 3), (16, 208, 3, 14, 3), (48, 80, 4, 14, 3),
]


@pytest.mark.parametrize("isa", ["native", AVX_VNNI, "avx2"])
def test_tile_leftovers_and_ragged_channel_groups(isa: str, monkeypatch, cache) -> None:
    import smelt
    from smelt.schedule.int_conv import IntConvGeometry, choose_tile, flattened, int_isa

    monkeypatch.setenv("SMELT_CACHE_DIR", str(cache))
    target = _isa_target(isa, monkeypatch)
    monkeypatch.setattr("smelt.compiler.detect", lambda: target)
    m = _Residual()
    for i, (c, oc, h, w, k) in enumerate(TILE_CASES):
        x = m.input((1 + i % 2, c, h, w))
        m.params[x] = (0.02, 7)
        a = m.qconv(x, c, oc, k, 1, yz=(0, 9, 128, 255)[i % 4], y_scale=0.05, relu=i % 2 == 0)
        b = m.qconv(a, oc, oc, k, 1, yz=30, y_scale=0.04)  # its output joins a: the fused add
        m.output(m.qconv(m.qadd(b, a, 0.03, (5, 250)[i % 2]), oc, 16, 1, 1, yz=3, y_scale=0.1))
    # the first conv of each case as the schedule tiles it: both edges are reached
    v = int_isa(target)
    tiles = []
    for c, oc, h, w, k in TILE_CASES:
        p = k // 2
        geo = IntConvGeometry(n=1, c=c, h=h, w=w, oc=oc, kh=k, kw=k, oh=h, ow=w, sh=1, sw=1, dh=1, dw=1, pt=p, pl=p,
                              pb=p, pr=p)
        nv, rw = choose_tile(flattened(geo) if k == 1 else geo, v.lanes, v.registers, target.l1d_bytes or 32 << 10,
                             1 if v.has("u8s8_dot_acc") else 2)
        tiles.append((-(-oc // v.lanes) % nv, rw % 4))
    assert any(ragged for ragged, _ in tiles) and any(left >= 2 for _, left in tiles), tiles
    model = m.build()
    want = ort_run(model, m.feeds)
    for threads in (1, 2):
        compiled = smelt.compile(model, threads=threads)
        for i, (g, w_) in enumerate(zip(compiled.run(m.feeds), want, strict=True)):
            np.testing.assert_array_equal(g, w_, err_msg=f"output {i} ({isa}, {threads} threads)")
        compiled.close()


def test_padding_copied_past_the_edge_tile_limit(monkeypatch, cache) -> None:
    """More tiles touching a border than ``MAX_EDGE_TILES`` (here -1, which every conv exceeds; 0
    would still let a conv whose padding no tile reads, like the last case's, pad in the kernel):
    the padded copy again, still equal to onnxruntime."""
    import smelt

    monkeypatch.setenv("SMELT_CACHE_DIR", str(cache))
    monkeypatch.setattr("smelt.schedule.int_conv.MAX_EDGE_TILES", -1)
    m = _pad_model(False)
    model = m.build()
    compiled = smelt.compile(model, threads=2)
    algos = " ".join(s.schedule.get("algorithm", "") for s in compiled.plan.step_infos())
    assert "padded in the kernel" not in algos and "(copied, padded)" in algos, algos
    for g, w in zip(compiled.run(m.feeds), ort_run(model, m.feeds), strict=True):
        np.testing.assert_array_equal(g, w)
    compiled.close()
