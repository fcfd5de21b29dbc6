"""onnxruntime's com.microsoft MatMulNBits (frontend/contrib_matmul_nbits.py) against onnxruntime
itself on random weights: bits 2, 4 and 8, block sizes 16, 32 and 128, K a multiple of the block
and not, N odd, zero points absent, packed uint8 or float, g_idx, bias, A of rank 2 and 3, float32
and float16 A, 1 and 2 threads; every node runs natively. accuracy_level 4 (onnxruntime quantizes
A to int8) is compared with the float32 product onnxruntime computes at level 0. What is not
expanded stays refused with its name."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import smelt
from smelt.errors import UnsupportedOpError

ort = pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(20261127)
MS = "com.microsoft"


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A compile cache of this module's own (pytest's ``cache`` fixture is something else)."""
    return tmp_path_factory.mktemp("smelt-cache")


def _pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """[..., L] codes -> uint8 [..., ceil(L * bits / 8)], lowest bits first (onnxruntime's layout)."""
    per = 8 // bits
    pad = (-codes.shape[-1]) % per
    c = np.concatenate([codes, np.zeros((*codes.shape[:-1], pad), codes.dtype)], -1).astype(np.uint32)
    c = c.reshape(*codes.shape[:-1], -1, per)
    return sum(c[..., i] << (bits * i) for i in range(per)).astype(np.uint8)


def _nbits_node(name: str, a: str, k: int, n: int, block: int, bits: int = 4, zp: str = "none",
                g_idx: bool = False, bias: bool = False, dtype=np.float32, inits: dict | None = None,
                **attrs) -> onnx.NodeProto:
    """A MatMulNBits ``name`` of input ``a`` into ``name``; its initializers go into ``inits``."""
    blocks = -(-k // block)
    codes = RNG.integers(0, 1 << bits, (n, blocks, block)).astype(np.uint8)
    inits[f"{name}_b"] = _pack(codes, bits)
    inits[f"{name}_s"] = (RNG.random((n, blocks)) * 0.1 + 0.01).astype(dtype)
    ins = [a, f"{name}_b", f"{name}_s", "", "", ""]
    if zp == "packed":
        inits[f"{name}_zp"] = _pack(RNG.integers(0, 1 << bits, (n, blocks)).astype(np.uint8), bits)
    elif zp == "float":
        inits[f"{name}_zp"] = (RNG.random((n, blocks)) * (1 << bits)).astype(dtype)
    if zp != "none":
        ins[3] = f"{name}_zp"
    if g_idx:
        inits[f"{name}_g"] = RNG.integers(0, blocks, k).astype(np.int32)
        ins[4] = f"{name}_g"
    if bias:
        inits[f"{name}_bias"] = RNG.standard_normal(n).astype(dtype)
        ins[5] = f"{name}_bias"
    while not ins[-1]:
        ins.pop()
    return helper.make_node("MatMulNBits", ins, [name], name=name, domain=MS, K=k, N=n, bits=bits,
                            block_size=block, **attrs)


def _model(nodes, inputs: dict[str, np.ndarray], inits: dict) -> onnx.ModelProto:
    ins = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
           for k, v in inputs.items()]
    elem = helper.np_dtype_to_tensor_dtype(next(iter(inputs.values())).dtype)
    g = helper.make_graph(nodes, "nbits", ins, [helper.make_tensor_value_info(n.output[0], elem, None) for n in nodes],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    m.ir_version = 8
    return m


def _ort(model: onnx.ModelProto, feeds) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, feeds)


def _compile_and_check(model, feeds, want, threads, rtol=1e-5):
    compiled = smelt.compile(model, threads=threads)
    got = compiled.run(feeds)
    assert compiled.fallback_nodes == [], compiled.fallback_report
    for node, g, w in zip(model.graph.node, got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype, (node.name, g.shape, w.shape, g.dtype, w.dtype)
        tol = rtol * max(1.0, float(np.abs(w.astype(np.float64)).max()))
        err = float(np.abs(g.astype(np.float64) - w.astype(np.float64)).max())
        assert err <= tol, (node.name, threads, err, tol)
    compiled.close()


def _float32_model():
    """Every supported form, each on the rank-3 input (a batch of 2) or the rank-2 one."""
    k3, k2 = 300, 64
    inits: dict[str, np.ndarray] = {}
    nodes = [
        _nbits_node("q4", "a3", k3, 33, 32, inits=inits),  # K not a multiple of 32
        _nbits_node("q4_zp", "a3", k3, 17, 16, zp="packed", bias=True, inits=inits),  # odd blocks: a half byte of zp
        _nbits_node("q4_zf", "a3", k3, 9, 128, zp="float", inits=inits),
        _nbits_node("q4_g", "a3", k3, 11, 32, g_idx=True, bias=True, inits=inits),
        _nbits_node("q4_gzf", "a2", k2, 7, 16, g_idx=True, zp="float", inits=inits),
        _nbits_node("q8", "a3", k3, 13, 32, bits=8, inits=inits),
        _nbits_node("q8_zp", "a2", k2, 7, 16, bits=8, zp="packed", bias=True, inits=inits),
        _nbits_node("q2", "a3", k3, 15, 128, bits=2, inits=inits),
        _nbits_node("q2_zp", "a2w", 80, 7, 16, bits=2, zp="packed", inits=inits),  # 5 blocks: 2 zp bytes a row
        _nbits_node("q2_zf", "a2", k2, 5, 32, bits=2, zp="float", bias=True, inits=inits),
        _nbits_node("q4_acc1", "a2", k2, 31, 64, zp="packed", accuracy_level=1, inits=inits),
    ]
    feeds = {"a3": RNG.standard_normal((2, 5, k3)).astype(np.float32),
             "a2": RNG.standard_normal((6, k2)).astype(np.float32),
             "a2w": RNG.standard_normal((6, 80)).astype(np.float32)}
    return _model(nodes, feeds, inits), feeds


@pytest.mark.parametrize("threads", [1, 2])
def test_matmul_nbits_matches_onnxruntime(threads, monkeypatch, cache):
    monkeypatch.setenv("SMELT_CACHE_DIR", str(cache))
    model, feeds = _float32_model()
    _compile_and_check(model, feeds, _ort(model, feeds), threads)


def test_matmul_nbits_float16(monkeypatch, cache):
    """float16 A, scales, zero points and bias: onnxruntime computes in float32 and rounds the
    result once."""
    monkeypatch.setenv("SMELT_CACHE_DIR", str(cache))
    inits: dict[str, np.ndarray] = {}
    f16 = np.float16
    nodes = [_nbits_node("h4", "a", 96, 9, 32, zp="packed", bias=True, dtype=f16, inits=inits),
             _nbits_node("h4_zf", "a", 96, 7, 16, zp="float", dtype=f16, inits=inits),
             _nbits_node("h8", "a", 96, 5, 32, bits=8, bias=True, dtype=f16, inits=inits)]
    feeds = {"a": RNG.standard_normal((2, 3, 96)).astype(f16)}
    model = _model(nodes, feeds, inits)
    # one float16 ulp of the largest output (the rounding of the float32 sum may differ by one)
    _compile_and_check(model, feeds, _ort(model, feeds), 2, rtol=1e-3)


def test_accuracy_level_4_computes_in_float32(monkeypatch, cache):
    """Level 4 lets onnxruntime quantize A to int8; smelt keeps the float32 product (what
    onnxruntime computes at level 0), within int8 rounding of onnxruntime's level-4 result."""
    monkeypatch.setenv("SMELT_CACHE_DIR", str(cache))
    inits: dict[str, np.ndarray] = {}
    node = _nbits_node("q", "a", 256, 33, 32, zp="packed", accuracy_level=4, inits=inits)
    feeds = {"a": RNG.standard_normal((4, 256)).astype(np.float32)}
    model = _model([node], feeds, inits)
    level0 = onnx.ModelProto()
    level0.CopyFrom(model)
    next(a for a in level0.graph.node[0].attribute if a.name == "accuracy_level").i = 0
    _compile_and_check(model, feeds, _ort(level0, feeds), 1)
    got = smelt.compile(model).run(feeds)[0]
    level4 = _ort(model, feeds)[0]
    assert np.abs(got - level4).max() <= 2e-2 * np.abs(level4).max()


def test_non_constant_weights_are_refused_by_name(monkeypatch, cache):
    monkeypatch.setenv("SMELT_CACHE_DIR", str(cache))
    inits: dict[str, np.ndarray] = {}
    node = _nbits_node("dyn_nbits", "a", 64, 8, 32, inits=inits)
    b = inits.pop("dyn_nbits_b")
    feeds = {"a": RNG.standard_normal((3, 64)).astype(np.float32), "dyn_nbits_b": b}
    model = _model([node], feeds, inits)
    with pytest.raises(UnsupportedOpError, match="dyn_nbits"):
        smelt.compile(model)


def test_g_idx_with_packed_zero_points_is_refused(monkeypatch, cache):
    """onnxruntime's CPU kernel ignores uint8 zero points when g_idx is given (it uses 8): the
    node is left alone rather than computed one way or the other."""
    monkeypatch.setenv("SMELT_CACHE_DIR", str(cache))
    inits: dict[str, np.ndarray] = {}
    node = _nbits_node("gzp_nbits", "a", 64, 8, 32, zp="packed", g_idx=True, inits=inits)
    feeds = {"a": RNG.standard_normal((3, 64)).astype(np.float32)}
    with pytest.raises(UnsupportedOpError, match="gzp_nbits"):
        smelt.compile(_model([node], feeds, inits))
