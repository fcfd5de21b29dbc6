"""Shared pieces of the GEMM and convolution kernel tests: cases packed into one model, and
forcing a vector ISA so the AVX2 and portable templates are tested on this host too."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from helpers import const, make_model, ort_run, tensor
from onnx import helper, numpy_helper

from smelt.target import detect

RNG = np.random.default_rng(20261122)
AVX_VNNI = "avx2_vnni"  # the cap AVX2 plus AVX-VNNI's ymm dot products (on a host without it, emulated: below)


def _rand(*shape) -> np.ndarray:
    return RNG.uniform(-1, 1, shape).astype(np.float32)


@dataclasses.dataclass
class Case:
    name: str
    nodes: list
    inputs: list
    inits: list
    output: str
    feeds: dict



def _model(cases: list[Case]):
    nodes, inputs, inits, outputs, feeds = [], [], [], [], {}
    for c in cases:
        nodes += c.nodes
        inputs += c.inputs
        inits += c.inits
        outputs.append(helper.make_tensor_value_info(c.output, 1, None))
        feeds.update(c.feeds)
    return make_model(nodes, inputs, outputs, inits), feeds


def _isa_target(isa: str, monkeypatch=None):
    """The host held to ``isa`` by the library's own cap (``Target.narrowed``, what
    ``smelt.compile(isa=...)`` uses); skipped where the host cannot run it. ``AVX_VNNI`` needs
    ``monkeypatch`` (see ``_avx_vnni_target``)."""
    if isa == AVX_VNNI:
        return _avx_vnni_target(monkeypatch)
    real = detect()
    if isa not in real.isa_caps() and isa != "native":
        pytest.skip(f"host cannot run {isa}")
    return real.narrowed(isa)


def _avx_vnni_target(monkeypatch):
    """The host held to AVX2 with AVX-VNNI's ymm vpdpbusd/vpdpwssd. A host without AVX-VNNI but
    with AVX512-VNNI and AVX512VL runs the same instructions in their EVEX encoding, the only
    difference: the code is rendered with that encoding here. Skipped on other hosts."""
    real = detect()
    if "avx_vnni" in real.flags:
        return real.narrowed(AVX_VNNI)
    if not {"avx512_vnni", "avx512vl"} <= set(real.flags):
        pytest.skip("host has neither AVX-VNNI nor AVX512-VNNI with VL")
    monkeypatch.setattr("smelt.codegen.kernels.isa.AVX_VNNI_ENCODING", "")
    capped = real.narrowed("avx2")
    return dataclasses.replace(capped, flags=capped.flags + ("avx_vnni",), cap=AVX_VNNI)


def force_isa(isa: str, monkeypatch, cache):
    """Compile for ``isa`` ("native", "avx2", "scalar", or ``AVX_VNNI``) in this test, with its
    own cache; "avx2" is skipped where it is the native ISA (the "native" case covers it)."""
    if isa == "avx2" and detect().isa == "avx2":
        pytest.skip("avx2 is the native ISA here")
    monkeypatch.setenv("SMELT_CACHE_DIR", str(cache))
    target = _isa_target(isa, monkeypatch)
    monkeypatch.setattr("smelt.compiler.detect", lambda: target)
    return target


def check_cases(cases: list[Case], isa: str, monkeypatch, cache, check_compiled, layout: str = "nchw",
                **compile_kw) -> None:
    """Compile the cases for ``isa`` at 1 and 2 threads and compare every output with onnxruntime.

    ``check_compiled(compiled, target)`` adds the caller's structural assertions. ``layout``: the
    layout planning mode (default "nchw": the plain-layout templates; "propagate" for NCHWc);
    ``compile_kw``: further ``smelt.compile`` options (``winograd``, ``schedule``).
    """
    import smelt

    monkeypatch.setenv("SMELT_CACHE_DIR", str(cache))
    target = _isa_target(isa, monkeypatch)
    monkeypatch.setattr("smelt.compiler.detect", lambda: target)
    model, feeds = _model(cases)
    want = ort_run(model, feeds)
    first = None
    for threads in (1, 2):
        compiled = smelt.compile(model, threads=threads, layout=layout, **compile_kw)
        assert compiled.fallback_nodes == []
        check_compiled(compiled, target)
        got = compiled.run(feeds)
        if first is None:
            first = got
        else:  # every element is accumulated in the same order whatever the thread split
            for c, a, b in zip(cases, first, got, strict=True):
                np.testing.assert_array_equal(a, b, err_msg=c.name)
        for c, g, w in zip(cases, got, want, strict=True):
            assert g.shape == w.shape, (c.name, g.shape, w.shape)
            scale = max(1.0, float(np.max(np.abs(w)))) if w.size else 1.0
            err = float(np.max(np.abs(g.astype(np.float64) - w))) if w.size else 0.0
            assert err <= 1e-4 * scale, f"{c.name} ({isa}, threads={threads}): max abs error {err}"
        compiled.close()


class Chain:
    """Builds one case: a sequence of ops on a running value."""

    def __init__(self, name: str, xs: tuple) -> None:
        self.p = name
        self.nodes: list = []
        self.inits: list = []
        self.cur = f"{name}_x"
        self.shape = list(xs)
        self.inputs = [tensor(self.cur, list(xs))]
        self.feeds = {self.cur: _rand(*xs)}
        self.k = 0
        self.marked: tuple | None = None

    def mark(self) -> Chain:
        self.marked = (self.cur, list(self.shape))
        return self

    def _name(self, what: str) -> str:
        self.k += 1
        return f"{self.p}_{what}{self.k}"

    def conv(self, oc: int, ks: tuple, group: int = 1, bias: bool = True, strides=(1, 1), dilations=(1, 1),
             pads=(0, 0, 0, 0), post: tuple = ()) -> Chain:
        c = self.shape[1]
        w = self._name("w")
        self.inits.append(const(w, _rand(oc, c // group, *ks)))
        ins = [self.cur, w]
        if bias:
            b = self._name("b")
            self.inits.append(const(b, _rand(oc)))
            ins.append(b)
        out = self._name("conv")
        self.nodes.append(helper.make_node("Conv", ins, [out], group=group, strides=list(strides),
                                           dilations=list(dilations), pads=list(pads), kernel_shape=list(ks)))
        h, wd = self.shape[2:]
        oh = (h + pads[0] + pads[2] - ((ks[0] - 1) * dilations[0] + 1)) // strides[0] + 1
        ow = (wd + pads[1] + pads[3] - ((ks[1] - 1) * dilations[1] + 1)) // strides[1] + 1
        before = self.cur, list(self.shape)
        self.cur, self.shape = out, [self.shape[0], oc, oh, ow]
        for op in post:
            if op == "residual":  # the marked value, else this conv's input
                src = self.marked or before
                assert src[1] == self.shape, "residual needs an unchanged shape"
                self._op("Add", [self.cur, src[0]])
                self.marked = None
            elif op == "chan_mul":
                s = self._name("s")
                self.inits.append(const(s, _rand(oc, 1, 1)))
                self._op("Mul", [self.cur, s])
            elif op in ("prelu", "prelu_scalar"):  # slope per channel ([1, C, 1, 1]) or one slope
                s = self._name("slope")
                self.inits.append(const(s, _rand(1, oc, 1, 1) if op == "prelu" else _rand(1)))
                self._op("PRelu", [self.cur, s])
            elif op == "gelu":  # the exact GELU as exporters spell it: x * 0.5 * (1 + erf(x / sqrt2))
                x, s2, one, half = self.cur, self._name("s2"), self._name("one"), self._name("half")
                self.inits += [const(s2, np.float32(np.sqrt(2.0))), const(one, np.float32(1.0)),
                               const(half, np.float32(0.5))]
                self._op("Div", [x, s2])._op("Erf", [self.cur])._op("Add", [self.cur, one])
                self._op("Mul", [x, self.cur])._op("Mul", [self.cur, half])
            elif op == "silu":  # x * sigmoid(x), as exporters spell SiLU
                x = self.cur
                self._op("Sigmoid", [x])._op("Mul", [x, self.cur])
            elif op == "Clip":
                lo, hi = self._name("lo"), self._name("hi")
                self.inits += [const(lo, np.float32(0.0)), const(hi, np.float32(6.0))]
                self._op("Clip", [self.cur, lo, hi])
            else:
                self._op(op, [self.cur])
        return self

    def _op(self, op: str, ins: list, **attrs) -> Chain:
        out = self._name(op.lower())
        self.nodes.append(helper.make_node(op, ins, [out], **attrs))
        self.cur = out
        return self

    def pool(self, op: str, **attrs) -> Chain:
        self._op(op, [self.cur], **attrs)
        if op.startswith("Global"):
            self.shape = self.shape[:2] + [1, 1]
            return self
        ks, st = attrs["kernel_shape"], attrs.get("strides", [1, 1])
        pads = attrs.get("pads", [0, 0, 0, 0])
        dims = []
        for d in range(2):
            span = (ks[d] - 1) * attrs.get("dilations", [1, 1])[d] + 1
            num = self.shape[2 + d] + pads[d] + pads[d + 2] - span
            o = (-(-num // st[d]) if attrs.get("ceil_mode") else num // st[d]) + 1
            if attrs.get("ceil_mode") and (o - 1) * st[d] >= self.shape[2 + d] + pads[d]:
                o -= 1
            dims.append(o)
        self.shape = self.shape[:2] + dims
        return self

    def batchnorm(self, relu: bool = True) -> Chain:
        c = self.shape[1]
        names = [self._name(n) for n in ("scale", "bias", "mean", "var")]
        vals = [_rand(c), _rand(c), _rand(c), np.abs(_rand(c)) + 0.5]
        self.inits += [const(n, v.astype(np.float32)) for n, v in zip(names, vals, strict=True)]
        self._op("BatchNormalization", [self.cur, *names])
        if relu:
            self._op("Relu", [self.cur])
        return self

    def branch_concat(self, *convs: dict) -> Chain:
        """Concat (channels) of several convs of the current value."""
        src, shape = self.cur, list(self.shape)
        outs, total = [], 0
        for kw in convs:
            self.cur, self.shape = src, list(shape)
            self.conv(**kw)
            outs.append(self.cur)
            total += self.shape[1]
        self._op("Concat", outs, axis=1)
        self.shape[1] = total
        return self

    def add_branches(self, a: dict, b: dict) -> Chain:
        """Add of two conv branches that the epilogue fusion cannot absorb (both are convs, the
        later one takes it; so add a Relu first to keep a standalone blocked Add)."""
        src, shape = self.cur, list(self.shape)
        self.conv(**a)._op("Relu", [self.cur])
        left = self.cur
        self.cur, self.shape = src, list(shape)
        self.conv(**b)._op("Sigmoid", [self.cur])
        self._op("Add", [left, self.cur])
        return self

    def se(self, op: str = "Mul", gate_first: bool = False, reduce: str = "ReduceMean",
           gate_input: bool = False, residual: bool = False) -> Chain:
        """``op(x, gate)`` (or ``op(gate, x)``) with the gate HardSigmoid(Conv(Relu(Conv(mean(x)))))
        (PP-LCNet's SE block; the mean a ``reduce`` op), or a [1, C, 1, 1] graph input in [1, 3]
        (a divisor); ``residual``: x + op(x, gate), x read twice (RSE-FPN)."""
        x, shape = self.cur, list(self.shape)
        n, c = shape[:2]
        if gate_input:
            gate = self._name("gate")
            self.inputs.append(tensor(gate, [1, c, 1, 1]))
            self.feeds[gate] = (_rand(1, c, 1, 1) + 2).astype(np.float32)
        else:
            if reduce == "ReduceMean":
                self._op("ReduceMean", [x], axes=[2, 3], keepdims=1)
            else:
                self._op(reduce, [x])
            self.shape = [n, c, 1, 1]
            self.conv(max(4, c // 4), (1, 1), post=("Relu",)).conv(c, (1, 1), post=("HardSigmoid",))
            gate = self.cur
        self.cur, self.shape = x, shape
        self._op(op, [gate, x] if gate_first else [x, gate])
        if residual:
            self._op("Add", [x, self.cur])
        return self

    def case(self) -> Case:
        return Case(self.p, self.nodes, self.inputs, self.inits, self.cur, self.feeds)


def se_block_cases() -> list[Case]:
    """SE blocks on blocked layouts (tests/kernels/test_channel_binary_nchwc.py, the sanitizer test)."""
    C = Chain
    return [
        # the SE block of PP-LCNet: 32 channels (two 16-blocks, four 8-blocks), then a 1x1 conv
        C("se_mul", (1, 32, 9, 11)).conv(32, (3, 3), pads=(1, 1, 1, 1)).se().conv(16, (1, 1)).case(),
        # batch 2: a gate per image; the gate first in a Sub (gate - x); GlobalAveragePool spelled so
        C("se_sub", (2, 48, 7, 5)).conv(48, (1, 1)).se(op="Sub", gate_first=True, reduce="GlobalAveragePool")
        .conv(16, (1, 1)).case(),
        # a shared gate from a graph input (plain [1, C, 1, 1]), x / gate + x (x read twice, so no
        # conv takes the Div as its epilogue), 24 channels
        C("se_div", (2, 24, 6, 6)).conv(24, (3, 3), pads=(1, 1, 1, 1)).se(op="Div", gate_input=True, residual=True)
        .conv(8, (1, 1)).case(),
        # RSE-FPN's x + x * gate on a plane of 1320 positions: runs of 256 with a ragged last one,
        # more than the serial threshold of elements (the threaded split)
        C("rse", (1, 32, 40, 33)).conv(32, (1, 1)).se(residual=True).conv(16, (3, 3), pads=(1, 1, 1, 1)).case(),
    ]


class Uint8ModelBuilder:
    """A QDQ test model under construction: nodes, initializers, uint8 graph inputs with random
    feeds from ``rng``, unique names; ``build()`` makes it an opset-13, IR-8 model (what
    onnxruntime's quantizer writes). The int8 conv tests extend it with their ops."""

    graph_name = "uint8_model"

    def __init__(self, rng: np.random.Generator) -> None:
        self.nodes, self.inits, self.inputs, self.outputs, self.feeds = [], [], [], [], {}
        self.k = 0
        self.rng = rng

    def name(self, what: str) -> str:
        self.k += 1
        return f"{what}{self.k}"

    def const(self, what: str, value) -> str:
        """An initializer holding ``value``; its name."""
        n = self.name(what)
        self.inits.append(numpy_helper.from_array(np.asarray(value), n))
        return n

    def input(self, shape, dtype=np.uint8) -> str:
        x = self.name("x")
        self.inputs.append(helper.make_tensor_value_info(x, 2, list(shape)))  # 2: UINT8
        self.feeds[x] = self.rng.integers(0, 256, shape).astype(dtype)
        return x

    def build(self):
        g = helper.make_graph(self.nodes, self.graph_name, self.inputs, self.outputs, self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
        m.ir_version = 8
        return m
