"""Channel padding of 8-bit activations between blocked int8 convs (schedule/int_channel_pad.py)
against onnxruntime: equal, not close.

MobileNetV2's inverted residual on a channel count the int8 block does not divide (24: not a
multiple of 16, 20: of neither 16 nor 8): project conv, expand conv with a fused ReLU, depthwise
conv, project conv, QLinearAdd join, a depthwise conv and a 3x3 conv on the join. Padded where
every node touching the set takes it (the convs then read their input blocked, without a copy);
a set that a DequantizeLinear or a graph output also reads is left plain. Every ISA the host runs,
1 and 2 threads, padding on and off.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import ort_run
from kernel_models import AVX_VNNI, Uint8ModelBuilder, _isa_target
from onnx import TensorProto, helper

import smelt
from smelt.schedule.int_conv import int_block

pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(20261127)


class _Block(Uint8ModelBuilder):
    graph_name = "int_channel_pad"

    def __init__(self) -> None:
        super().__init__(RNG)
        self.params: dict[str, tuple[float, int]] = {}  # uint8 value -> (scale, zero point)

    def conv(self, x: str, c: int, oc: int, k: int, *, group: int = 1, yz: int, y_scale: float,
             relu: bool = False) -> str:
        """A QLinearConv (pad (k - 1) / 2), per-channel weight scales, int32 bias; a fused ReLU
        as onnxruntime's quantizer writes it (Max at the zero point)."""
        sx, zx = self.params[x]
        w = RNG.integers(-128, 128, (oc, c // group, k, k)).astype(np.int8)
        ws = (RNG.uniform(0.5, 2.0, oc) * (2e-3 if group == 1 else 2e-2)).astype(np.float32)
        names = [x, self.const("xs", np.float32(sx)), self.const("xz", np.uint8(zx)), self.const("w", w),
                 self.const("ws", ws), self.const("wz", np.int8(0)), self.const("ys", np.float32(y_scale)),
                 self.const("yz", np.uint8(yz)), self.const("b", RNG.integers(-2000, 2000, oc).astype(np.int32))]
        p = (k - 1) // 2
        y = self.name("y")
        self.nodes.append(helper.make_node("QLinearConv", names, [y], kernel_shape=[k, k], pads=[p, p, p, p],
                                           group=group))
        if relu:
            r = self.name("r")
            self.nodes.append(helper.make_node("Max", [y, names[7]], [r]))
            y = r
        self.params[y] = (y_scale, yz)
        return y

    def qadd(self, a: str, b: str, scale: float, zero: int) -> str:
        (sa, za), (sb, zb) = self.params[a], self.params[b]
        names = [a, self.const("as", np.float32(sa)), self.const("az", np.uint8(za)), b,
                 self.const("bs", np.float32(sb)), self.const("bz", np.uint8(zb)),
                 self.const("cs", np.float32(scale)), self.const("cz", np.uint8(zero))]
        y = self.name("sum")
        self.nodes.append(helper.make_node("QLinearAdd", names, [y], domain="com.microsoft"))
        self.params[y] = (scale, zero)
        return y

    def dequantize(self, y: str) -> str:
        s, z = self.params[y]
        out = self.name("dq")
        self.nodes.append(helper.make_node("DequantizeLinear", [y, self.const("s", np.float32(s)),
                                                                self.const("z", np.uint8(z))], [out]))
        return out

    def output(self, y: str, dtype=TensorProto.UINT8) -> None:
        self.outputs.append(helper.make_tensor_value_info(y, dtype, None))

    def build(self):
        m = super().build()
        m.opset_import.append(helper.make_opsetid("com.microsoft", 1))
        return m


def _model(c: int) -> _Block:
    m = _Block()
    x = m.input((1, 16, 9, 11))
    m.params[x] = (0.02, 7)
    a = m.conv(x, 16, c, 1, yz=120, y_scale=0.05)  # project: c channels
    b = m.conv(a, c, 48, 1, yz=0, y_scale=0.04, relu=True)  # expand, reading the padded set
    b = m.conv(b, 48, 48, 3, group=48, yz=0, y_scale=0.05, relu=True)
    d = m.conv(b, 48, c, 1, yz=130, y_scale=0.05)  # project
    s = m.qadd(d, a, 0.06, 125)  # the join: c channels
    e = m.conv(s, c, c, 3, group=c, yz=3, y_scale=0.07, relu=True)  # depthwise inside the set
    m.output(m.conv(e, c, 32, 3, yz=40, y_scale=0.08))  # the reader: a 3x3 conv
    # a set a DequantizeLinear reads too: left plain
    f = m.conv(x, 16, c, 1, yz=100, y_scale=0.05)
    m.output(m.dequantize(f), TensorProto.FLOAT)
    m.output(m.conv(f, c, 16, 1, yz=10, y_scale=0.05))
    return m


def _copies(compiled) -> int:
    """Int8 convs that copy their input into blocks first (a plain or unpadded input)."""
    return sum("(copied" in s.schedule.get("algorithm", "") for s in compiled.plan.step_infos()
               if s.op == "QLinearConv" and s.part == 0)


@pytest.mark.parametrize("isa", ["native", "avx2", AVX_VNNI, "scalar"])
@pytest.mark.parametrize("channels", [24, 20])
def test_padded_sets_equal_onnxruntime(isa: str, channels: int, monkeypatch, cache) -> None:
    monkeypatch.setenv("SMELT_CACHE_DIR", str(cache))
    target = _isa_target(isa, monkeypatch)
    monkeypatch.setattr("smelt.compiler.detect", lambda: target)
    m = _model(channels)
    model = m.build()
    want = ort_run(model, m.feeds)
    copies = {}
    for padding in (True, False):
        for threads in (1, 2):
            compiled = smelt.compile(model, threads=threads, schedule={"int8_channel_padding": padding})
            assert compiled.fallback_nodes == []
            for i, (g, w) in enumerate(zip(compiled.run(m.feeds), want, strict=True)):
                assert g.dtype == w.dtype and g.shape == w.shape, (i, g.shape, w.shape)
                np.testing.assert_array_equal(g, w, err_msg=f"output {i} ({isa}, {threads} threads, padding {padding})")
            copies[padding] = _copies(compiled)
            compiled.close()
    block = int_block(target)
    if block is not None and channels % block:
        # the set's readers (the expand, the depthwise conv on the join, the last conv) read it
        # blocked, in place (3 copies fewer with byte quads; the int16-pair form of AVX2 without
        # VNNI widens every input in a copy, so only its depthwise conv saves one)
        assert copies[True] < copies[False], copies
    else:  # nothing to pad
        assert copies[True] == copies[False], copies
