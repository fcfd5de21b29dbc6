"""The blocked int8 depthwise convolution and the QLinearClip fused into the int8 conv epilogue
(templates/int_conv_nchwc.py, schedule/int_conv.py) against onnxruntime: equal, not close.

Every ISA the host runs (native: AVX-512, VNNI's vpdpwssd where present; avx2: vpmaddwd; scalar:
the NCHW kernel and the QLinearClip table, which the planner keeps there), 1 and 2 threads.
Depthwise edge shapes: channels that are not a multiple of the block (5, 24, 40: plain input
copied into blocks, plain output) and that are (16, 32, 48), ragged rows against the tile,
stride 2, asymmetric pads, no padding (the blocked input read in place), dilation 2, a 5x5
kernel, batch 2; zero points at the ends of the range; per-tensor and per-channel weight scales;
with and without bias; a fused ReLU. Clip fusion: MobileNet's Relu6 (DequantizeLinear -> Clip ->
QuantizeLinear, which lower_qdq makes a QLinearClip) after depthwise and 1x1 convs, a one-sided
Clip, with and without a ReLU before it, in the checked FMA form and (forced) the division form.
The reference is onnxruntime running the nodes one by one (graph optimizations off: with them on
it may drop a Clip whose QuantizeLinear range lies inside it, which changes codes at the ends).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnxruntime as ort
import pytest
from kernel_models import AVX_VNNI, Uint8ModelBuilder, _isa_target
from onnx import TensorProto, helper

from smelt.schedule.int_conv import int_isa
from smelt.target import detect

RNG = np.random.default_rng(20261127)
# the host's AVX-512 without AVX512-VBMI's byte permute: the four-shuffle form of the row pairs
# (isa.py ``_VBMI_FORMS``), which hosts with VBMI would otherwise never run
NO_VBMI = "avx512-without-vbmi"
ISAS = ["native", NO_VBMI, "avx2", AVX_VNNI, "scalar"]


def _target(isa: str, monkeypatch):
    if isa != NO_VBMI:
        return _isa_target(isa, monkeypatch)
    real = detect()
    if "avx512vbmi" not in real.flags:
        pytest.skip("host has no AVX512-VBMI: the native runs are this form already")
    return dataclasses.replace(real, flags=tuple(f for f in real.flags if f != "avx512vbmi"))


def test_row_pairs_take_the_byte_permute_with_vbmi() -> None:
    """The int16 pairs of two rows are one masked vpermb where the target has AVX512-VBMI, the
    unpack-and-widen form without it (both run by the depthwise tests on a VBMI host)."""
    real = detect()
    if "avx512f" not in real.flags:
        pytest.skip("host has no AVX-512")
    with_vbmi = dataclasses.replace(real, flags=tuple({*real.flags, "avx512vbmi"}))
    without = dataclasses.replace(real, flags=tuple(f for f in real.flags if f != "avx512vbmi"))
    assert "permutexvar_epi8" in int_isa(with_vbmi).x("u8x2_to_i16_pairs", p="p", q="q")
    assert "unpacklo_epi8" in int_isa(without).x("u8x2_to_i16_pairs", p="p", q="q")

# (C, H, W, k, stride, pads (t, l, b, r), dilation)
DEPTHWISE = [
    (16, 9, 11, 3, 1, (1, 1, 1, 1), 1),
    (24, 7, 13, 3, 2, (1, 0, 2, 1), 1),  # C not a multiple of 16, stride 2, asymmetric pads
    (5, 6, 19, 3, 1, (1, 1, 1, 1), 1),  # odd channels (plain in and out)
    (32, 17, 17, 3, 2, (1, 1, 1, 1), 1),  # MobileNet's stride-2 depthwise, ragged rows
    (48, 8, 9, 3, 1, (0, 0, 0, 0), 1),  # unpadded: the blocked input read in place
    (40, 9, 10, 3, 1, (2, 2, 2, 2), 2),  # dilation
    (16, 11, 23, 5, 1, (2, 2, 2, 2), 1),  # 5x5, a row wider than any tile
    (24, 9, 10, 2, 1, (0, 0, 1, 1), 1),  # 2x2: kernel rows all in pairs (no single last row)
    (16, 6, 9, 4, 2, (1, 2, 2, 1), 1),  # 4x4, stride 2: two row pairs
    (8, 28, 28, 3, 1, (1, 1, 1, 1), 1),  # enough rows for row bands (the block's 1x1s and depthwise), batch 2
    (32, 5, 7, 1, 1, (0, 0, 0, 0), 1),  # 1x1: one row, nothing to pair
    (24, 33, 35, 3, 2, (1, 1, 1, 1), 1),  # row bands, stride 2, bands not a multiple of a row's tiles
]


class _Model(Uint8ModelBuilder):
    graph_name = "int_dwconv"

    def __init__(self) -> None:
        super().__init__(RNG)

    def conv(self, x: str, c: int, oc: int, k: int, s: int, pads, d: int, *, group: int, xz: int, yz: int,
             y_scale: float, per_channel: bool = True, bias: bool = True, relu: bool = False) -> str:
        w = RNG.integers(-128, 128, (oc, c // group, k, k)).astype(np.int8)
        ws = (RNG.uniform(0.5, 2.0, oc if per_channel else 1) * (2e-3 if group == 1 else 2e-2)).astype(np.float32)
        names = [x, self.const("xs", np.float32(0.02)), self.const("xz", np.uint8(xz)), self.const("w", w),
                 self.const("ws", ws if per_channel else ws[0]), self.const("wz", np.int8(0)),
                 self.const("ys", np.float32(y_scale)), self.const("yz", np.uint8(yz))]
        if bias:
            names.append(self.const("b", RNG.integers(-2000, 2000, oc).astype(np.int32)))
        y = self.name("y")
        self.nodes.append(helper.make_node("QLinearConv", names, [y], kernel_shape=[k, k], strides=[s, s],
                                           pads=list(pads), dilations=[d, d], group=group))
        if relu:
            r = self.name("r")
            self.nodes.append(helper.make_node("Max", [y, names[7]], [r]))
            y = r
        return y

    def clip(self, y: str, scale: float, zero: int, lo: float | None, hi: float | None, out_scale: float,
             out_zero: int) -> str:
        """DequantizeLinear -> Clip -> QuantizeLinear: what smelt quantize writes around Relu6."""
        s, z = self.const("cs", np.float32(scale)), self.const("cz", np.uint8(zero))
        d, c, q = self.name("dq"), self.name("clip"), self.name("q")
        bounds = [self.const("lo", np.float32(lo)) if lo is not None else "",
                  self.const("hi", np.float32(hi)) if hi is not None else ""]
        while bounds and not bounds[-1]:
            bounds.pop()
        self.nodes += [helper.make_node("DequantizeLinear", [y, s, z], [d]),
                       helper.make_node("Clip", [d, *bounds], [c]),
                       helper.make_node("QuantizeLinear", [c, self.const("qs", np.float32(out_scale)),
                                                           self.const("qz", np.uint8(out_zero))], [q])]
        return q

    def output(self, y: str) -> None:
        self.outputs.append(helper.make_tensor_value_info(y, TensorProto.UINT8, None))



def _depthwise_cases() -> _Model:
    m = _Model()
    for i, (c, h, w, k, s, pads, d) in enumerate(DEPTHWISE):
        x = m.input((2 if i % 3 == 0 else 1, c, h, w))
        xz, yz = (0, 128, 255, 7)[i % 4], (3, 0, 255, 128)[i % 4]
        # alone on the (plain) graph input; y_scale 0.01 saturates many values both ways
        m.output(m.conv(x, c, c, k, s, pads, d, group=c, xz=xz, yz=yz, y_scale=(0.05, 0.01)[i % 2],
                        per_channel=i % 2 == 0, bias=i % 3 != 2, relu=i % 2 == 1))
        # MobileNet's block: 1x1 expand with Relu6, depthwise with Relu6, 1x1 project
        # (calibrated scales, not round numbers: with round ones the table has exact ties)
        e = m.conv(x, c, 2 * c, 1, 1, (0, 0, 0, 0), 1, group=1, xz=xz, yz=120, y_scale=0.0513)
        e = m.clip(e, 0.0513, 120, 0.0, 6.0, 6.0 / 255, 0)
        dw = m.conv(e, 2 * c, 2 * c, k, s, pads, d, group=2 * c, xz=0, yz=(110, 0)[i % 2], y_scale=0.0437,
                    relu=i % 2 == 1)
        dw = m.clip(dw, 0.0437, (110, 0)[i % 2], 0.0, 6.0, 6.0 / 255, 0)
        m.output(m.conv(dw, 2 * c, 16, 1, 1, (0, 0, 0, 0), 1, group=1, xz=0, yz=128, y_scale=0.1))
    return m


def _reference(model, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _check(m: _Model, isa: str, monkeypatch, cache, *, fused_form: str | None = None,
           pad_in_kernel: bool = False) -> None:
    import smelt

    monkeypatch.setenv("SMELT_CACHE_DIR", str(cache))
    target = _target(isa, monkeypatch)
    monkeypatch.setattr("smelt.compiler.detect", lambda: target)
    model = m.build()
    want = _reference(model, m.feeds)
    for threads in (1, 2):
        compiled = smelt.compile(model, threads=threads)
        assert compiled.fallback_nodes == []
        infos = list(compiled.plan.step_infos())
        templates = [s.schedule.get("template", "") for s in infos]
        algorithms = " ".join(s.schedule.get("algorithm", "") for s in infos)
        ops = [op for _, op in compiled.native_nodes]
        if isa != "scalar":
            # every conv blocked (depthwise ones on their kernel), every Clip and ReLU fused
            assert templates.count("int_conv_nchwc") >= ops.count("QLinearConv") > 0, templates
            assert "depthwise" in algorithms and "QLinearClip" not in ops and "Max" not in ops, ops
            assert "kernel rows in pairs" in algorithms, algorithms  # (every vector ISA forms the pairs)
            if pad_in_kernel:  # the MobileNet blocks' padded depthwise convs on a blocked input
                assert "(padded in the kernel)" in algorithms, algorithms
                assert "row bands" in algorithms, algorithms  # (split over 2 threads by rows)
            if fused_form:
                assert f"clip fused ({fused_form})" in algorithms, algorithms
        else:
            assert "int_conv_nchwc" not in templates and "QLinearClip" in ops
        got = compiled.run(m.feeds)
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert g.dtype == w.dtype and g.shape == w.shape, (i, g.shape, w.shape)
            np.testing.assert_array_equal(g, w, err_msg=f"output {i} ({isa}, {threads} threads)")
        compiled.close()


@pytest.mark.parametrize("isa", ISAS)
def test_depthwise_and_clip_fusion(isa: str, monkeypatch, cache) -> None:
    _check(_depthwise_cases(), isa, monkeypatch, cache, fused_form="fma" if isa != "scalar" else None,
           pad_in_kernel=True)


def _clip_cases() -> _Model:
    """Clips of other shapes after 1x1 and 3x3 convs: one-sided (Relu through Clip), a range
    inside the conv's, a ReLU before the Clip, zero points at both ends, saturating scales."""
    m = _Model()
    x = m.input((1, 32, 7, 9))
    for i, (lo, hi, scale, zero, relu) in enumerate([(0.0, None, 0.02, 0, False), (-1.0, 2.5, 0.013, 77, False),
                                                      (0.0, 6.0, 0.03, 255, True), (None, 1.0, 0.004, 200, True),
                                                      (0.5, 0.75, 0.001, 3, False)]):
        yz = (0, 128, 255, 60, 200)[i]
        k = 3 if i % 2 else 1
        y = m.conv(x, 32, 48, k, 1, (1, 1, 1, 1) if k == 3 else (0, 0, 0, 0), 1, group=1, xz=(9, 0)[i % 2], yz=yz,
                   y_scale=0.05, relu=relu)
        m.output(m.clip(y, 0.05, yz, lo, hi, scale, zero))
        dw = m.conv(x, 32, 32, 3, 1 + i % 2, (1, 1, 1, 1), 1, group=32, xz=(9, 0)[i % 2], yz=yz, y_scale=0.05,
                    relu=relu)
        m.output(m.clip(dw, 0.05, yz, lo, hi, scale, zero))
    return m


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_clip_fusion_shapes(isa: str, monkeypatch, cache) -> None:
    _check(_clip_cases(), isa, monkeypatch, cache)


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_clip_fusion_division_form(isa: str, monkeypatch, cache) -> None:
    """Where no FMA matches the table the epilogue runs the table's float steps (with a
    division): forced here by refusing every fit."""
    monkeypatch.setattr("smelt.schedule.int_conv.fit_affine", lambda clip, *a: clip)
    _check(_clip_cases(), isa, monkeypatch, cache, fused_form="div")


def test_fit_affine_is_exact_or_absent() -> None:
    """``fit_affine`` sets a form only when it equals the table on every code the conv can
    write, recomputed here independently of the fitting loop; most random parameters fit."""
    from smelt.schedule.int_conv import ClipRequant, fit_affine

    fitted = 0
    rng = np.random.default_rng(3)
    for _ in range(200):
        clip = ClipRequant(x_scale=float(np.float32(rng.uniform(1e-3, 0.1))), x_zero=int(rng.integers(0, 256)),
                           lo=float(rng.choice([-np.inf, 0.0, -0.5])), hi=float(rng.choice([np.inf, 6.0, 1.0])),
                           y_scale=float(np.float32(rng.uniform(1e-3, 0.1))), y_zero=int(rng.integers(0, 256)))
        conv_zero = int(rng.integers(0, 256))
        first = conv_zero if rng.random() < 0.5 else 0
        got = fit_affine(clip, conv_zero, first, True)
        if got.affine is None:
            continue
        fitted += 1
        a, b, t_lo, t_hi = got.affine
        codes = np.arange(0, 256)
        r = np.maximum(codes, first) - conv_zero  # codes below the first clamp to it
        f = (r.astype(np.float64) * a + b).astype(np.float32)  # exact in float64 where fitted
        q = np.clip(np.rint(f), t_lo, t_hi).astype(np.int64)
        np.testing.assert_array_equal(q, clip.table(np.maximum(codes, first)))
    assert fitted > 150, fitted


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_packed_store_saturates(isa: str, monkeypatch, cache) -> None:
    """Blocked outputs store four pixels' vectors with one saturating pack, which is then the
    clamp to [0, 255]: scales that saturate most values both ways, with and without ReLU and a
    fused Clip, rows of 4k + 1..3 pixels, each read blocked by a 1x1 conv; and the saturation
    counters still equal the NCHW kernel's."""
    import smelt

    m = _Model()
    x = m.input((1, 32, 5, 13))
    for i, (yz, relu, clip) in enumerate([(128, False, False), (3, True, False), (250, False, True),
                                          (128, True, True)]):
        k = (1, 3)[i % 2]
        y = m.conv(x, 32, 32, k, 1, (k // 2,) * 4, 1, group=1, xz=(0, 200)[i % 2], yz=yz, y_scale=0.0021, relu=relu)
        if clip:
            y = m.clip(y, 0.0021, yz, -0.1, 0.2, 0.0013, 60)
        dw = m.conv(y, 32, 32, 3, 1, (1, 1, 1, 1), 1, group=32, xz=yz, yz=yz, y_scale=0.0017, relu=relu)
        m.output(m.conv(dw, 32, 16, 1, 1, (0, 0, 0, 0), 1, group=1, xz=yz, yz=128, y_scale=0.2))
    _check(m, isa, monkeypatch, cache)
    monkeypatch.setenv("SMELT_CACHE_DIR", str(cache))
    totals = {}
    for which in (isa, "scalar"):
        target = _isa_target(which)
        monkeypatch.setattr("smelt.compiler.detect", lambda target=target: target)
        compiled = smelt.compile(m.build(), threads=2, count_saturation=True)
        compiled.run(m.feeds)
        totals[which] = tuple(sum(c[i] for c in compiled.saturation_counts().values()) for i in (0, 1))
        compiled.close()
    assert totals[isa] == totals["scalar"] and min(totals["scalar"]) > 0, totals
