"""ConvTranspose's GEMM + col2im form tiled over input rows (templates/conv_transpose.py): chunks
of input rows, each a GEMM then col2im, last chunk first. Against onnxruntime at every ISA the
host runs, 1 and 2 threads, with the chunk budget shrunk so each case takes several chunks
(ragged last chunk included); and the LORE-sized node (64 channels, 96x96 -> 192x192), whose
untiled column matrix would not fit, takes the tiled GEMM form at the real budget."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from kernel_models import force_isa
from node_cases import Cases, assert_close, check
from onnx import TensorProto, helper, numpy_helper

import smelt
from smelt.codegen.templates import conv_transpose

RNG = np.random.default_rng(11)
ISAS = ["native", "avx2", "scalar"]


def _r(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


@pytest.mark.parametrize("isa", ISAS)
def test_tiled_gemm_col2im(isa, monkeypatch, cache):
    force_isa(isa, monkeypatch, cache)
    monkeypatch.setattr(conv_transpose, "GEMM_MIN_MACS", 0)
    monkeypatch.setattr(conv_transpose, "GEMM_MIN_CHANNELS", 1)
    # a budget of a few KiB: 1 to 3 input rows per chunk, so 3 to 11 chunks per node
    monkeypatch.setattr(conv_transpose, "COL_CHUNK_L2", 6000 / detect_l2())
    c = 6
    cases = Cases()
    cases.add("ConvTranspose", ["x"], (_r(c, 5, 2, 2, scale=0.3), _r(5)), strides=[2, 2])
    cases.add("ConvTranspose", ["x"], (_r(c, 3, 4, 4, scale=0.3), _r(3)), strides=[2, 2], pads=[1, 1, 1, 1])
    cases.add("ConvTranspose", ["x"], (_r(c, 3, 4, 4, scale=0.3),), strides=[2, 2], pads=[1, 2, 0, 1],
              output_padding=[1, 1])
    cases.add("ConvTranspose", ["x"], (_r(c, 2, 3, 3, scale=0.3), _r(4)), strides=[2, 2], group=2,
              dilations=[2, 1], pads=[1, 1, 1, 1])
    cases.add("ConvTranspose", ["x"], (_r(c, 7, 3, 3, scale=0.3),), pads=[1, 0, 2, 1])  # stride 1
    cases.add("ConvTranspose", ["x"], (_r(c, 1, 4, 4, scale=0.3), _r(6)), strides=[2, 2], pads=[1, 1, 1, 1],
              group=6)
    cases.add("ConvTranspose", ["v"], (_r(3, 4, 5, scale=0.3), _r(4)), strides=[2], pads=[2, 1])  # 1-D: one row
    cases.add("ConvTranspose", ["u"], (_r(2, 3, 2, 3, 2, scale=0.3), _r(3)), strides=[2, 2, 2],
              pads=[0, 1, 0, 0, 1, 1])
    x = _r(2, c, 7, 9)  # 7 rows: a ragged last chunk at 2 and 3 rows per chunk
    check(cases, {"x": x, "v": _r(1, 3, 9), "u": _r(1, 2, 3, 5, 4)}, opset=17)


def detect_l2() -> int:
    from smelt.target import detect
    return detect().l2_bytes


def _convt_model(c: int, hw: int) -> tuple[onnx.ModelProto, dict]:
    w, b = _r(c, c, 4, 4, scale=0.05), _r(c)
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], kernel_shape=[4, 4], strides=[2, 2],
                            pads=[1, 1, 1, 1])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, 2 * hw, 2 * hw])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), {"x": _r(1, c, hw, hw)}


@pytest.mark.parametrize("threads", [1, 2])
def test_lore_sized_node_takes_tiled_gemm(threads, monkeypatch, cache):
    """96x96 -> 192x192 at 64 channels: the untiled column matrix (38 MiB per 64 channels; LORE's
    256-channel node needs 151 MB) is chunked at the real budget instead of leaving the GEMM form."""
    force_isa("native", monkeypatch, cache)
    model, feeds = _convt_model(64, 96)
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    compiled = smelt.compile(model, threads=threads)
    got = compiled.run(feeds)[0]
    infos = [i for i in compiled.plan.step_infos() if i.schedule.get("template") == "f32_conv_transpose"]
    assert infos and all("col2im" in i.schedule.get("algorithm", "") for i in infos), infos
    chunks = infos[0].schedule["chunks"]
    assert int(chunks.split(" x ")[0]) > 1, chunks
    col_bytes = int(chunks.split("col block ")[1].split()[0])
    assert col_bytes <= max(conv_transpose.COL_CHUNK_L2 * detect_l2(), 64 * 16 * 96 * 4), chunks
    assert_close(f"y (threads={threads})", got, want)
    compiled.close()
