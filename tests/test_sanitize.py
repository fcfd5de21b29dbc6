"""Generated C built with AddressSanitizer and UBSan, run on zoo models and under concurrency:
no report allowed.

The sanitizer runtimes must be loaded first, so each model runs in a child Python started with
LD_PRELOAD; the onnxruntime reference is computed here, in the parent, and handed over as .npy.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest
from helpers import ort_run, run_python

pytestmark = pytest.mark.sanitize


def _runtime_libs() -> str:
    libs = []
    for name in ("libasan.so", "libubsan.so"):
        out = subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
        if not os.path.isabs(out):
            pytest.skip(f"gcc has no {name}")
        libs.append(out)
    return ":".join(libs)


def _sanitizer_env(tmp_path) -> dict[str, str]:
    return dict(os.environ, LD_PRELOAD=_runtime_libs(), SMELT_SANITIZE="1",
                ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:halt_on_error=1",
                UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1",
                SMELT_CACHE_DIR=str(tmp_path / "cache"))


def _run_child(code: str, tmp_path) -> subprocess.CompletedProcess:
    return run_python(textwrap.dedent(code), env=_sanitizer_env(tmp_path), timeout=900)


def _assert_clean(proc: subprocess.CompletedProcess) -> None:
    report = proc.stderr
    assert "AddressSanitizer" not in report and "runtime error" not in report, report[-4000:]
    assert proc.returncode == 0, report[-4000:]


def _isa_or_skip(isa: str) -> None:
    """The forced-AVX2 case runs only where AVX2 is not already the native ISA."""
    from smelt.target import detect

    if isa == "avx2" and (detect().isa == "avx2" or "avx2" not in detect().isa_caps()):
        pytest.skip("avx2 is the native ISA here (or not runnable)")
    if isa not in ("native", "avx2") and isa not in detect().isa_caps():
        pytest.skip(f"host cannot run {isa}")


@pytest.mark.parametrize("isa", ["native", "avx2"])
@pytest.mark.parametrize("name", ["lstm-E32-H48-B3-T7-bi"])  # the zoo's list: the test below
def test_zoo_model_clean_under_sanitizers(name, isa, tmp_path):
    from smelt.frontend import zoo

    _isa_or_skip(isa)
    _check_clean(zoo.get_model(name), isa, tmp_path)


def _every_zoo_model_at_every_isa() -> list:
    from smelt.frontend import zoo
    from smelt.target import ISA_CAPS

    # "avx2_vnni" adds only integer dot products to "avx2": the fp32 zoo renders the same C
    return [pytest.param(name, isa, id=f"{name}-{isa}") for name in zoo.list_models() for isa in ISA_CAPS
            if isa != "avx2_vnni"]


@pytest.mark.parametrize(("name", "isa"), _every_zoo_model_at_every_isa())
def test_every_zoo_model_at_every_isa_clean_under_sanitizers(name, isa, tmp_path):
    """Issue 14's acceptance: no crash and no sanitizer report on every zoo model at every ISA the
    host can run, at 1 and 2 threads: ~45 s of CPU a case; the sanitizer stage of .ci/run took
    20 min on 2 cores with them (not the default run)."""
    from smelt.frontend import zoo
    from smelt.target import detect

    if isa not in detect().isa_caps():
        pytest.skip(f"this host cannot run {isa}")
    _check_clean(zoo.get_model(name), isa, tmp_path)


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_wild_model_templates_clean_under_sanitizers(isa, tmp_path):
    """The templates real models brought in (Resize nearest/linear on plain and blocked layouts,
    ConvTranspose, GatherElements), an FPN-like neck, under the sanitizers."""
    from helpers import const, make_model, tensor
    from onnx import helper

    _isa_or_skip(isa)
    rng = np.random.default_rng(1)
    w = lambda *s: (rng.standard_normal(s) * 0.2).astype(np.float32)  # noqa: E731
    empty, two = np.zeros(0, np.float32), np.array([1, 1, 2, 2], np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Resize", ["c1", "roi", "two"], ["up"], mode="nearest",
                              coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
             helper.make_node("ConvTranspose", ["c1", "wt"], ["ct"], strides=[2, 2]),
             helper.make_node("Add", ["up", "ct"], ["s"]),
             helper.make_node("Resize", ["s", "roi", "two"], ["y"], mode="linear"),
             helper.make_node("GatherElements", ["g", "gi"], ["z"], axis=1)]
    inits = [const("w1", w(16, 3, 3, 3)), const("wt", w(16, 16, 2, 2)), const("roi", empty), const("two", two),
             const("gi", rng.integers(-7, 7, (2, 5)).astype(np.int64))]
    model = make_model(nodes, [tensor("x", [1, 3, 11, 13]), tensor("g", [2, 7])], [tensor("y", None), tensor("z", None)],
                       inits)
    _check_clean(model, isa, tmp_path)


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_se_blocks_and_activations_after_store_clean_under_sanitizers(isa, tmp_path):
    """SE blocks on blocked layouts (the per-channel binary op's runs, per-image and shared gates,
    ReduceMean as GlobalAveragePool) and convs whose SiLU, Sigmoid, Tanh or GELU epilogue runs
    after the store in its own function, under the sanitizers."""
    from kernel_models import Chain, _model, se_block_cases

    _isa_or_skip(isa)
    acts = (Chain("acts", (1, 24, 9, 13)).conv(48, (1, 1), post=("silu",)).conv(32, (3, 3), pads=(1, 1, 1, 1), post=("Sigmoid",))
            .conv(32, (3, 3), group=32, pads=(1, 1, 1, 1), post=("Tanh",)).conv(16, (1, 1), post=("gelu",)).case())
    model, feeds = _model([*se_block_cases(), acts])
    _check_clean(model, isa, tmp_path, feeds=feeds)


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_column_pairs_d2s_and_next_b_prefetch_clean_under_sanitizers(isa, tmp_path):
    """NCHWc convs with 24 output channels (column pairs on AVX-512: odd widths, padding taps
    for one column of a pair), a ConvTranspose run as a blocked 1x1 conv and the tiled
    DepthToSpace (a ragged run of columns), and a MatMul over prepacked weights with two K
    blocks (the next-B-block prefetch), under the sanitizers; the convs prefetch the next output
    row's input rows (``conv_prefetch_rows="always"``: the last rows' guards)."""
    from helpers import const, make_model, tensor
    from onnx import helper

    _isa_or_skip(isa)
    rng = np.random.default_rng(3)
    w = lambda *s: (rng.standard_normal(s) * 0.2).astype(np.float32)  # noqa: E731
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 2, 1, 0], strides=[1, 2]),
             helper.make_node("ConvTranspose", ["c2", "wt"], ["y"], strides=[2, 2]),
             helper.make_node("MatMul", ["a", "wm"], ["z"])]
    inits = [const("w1", w(24, 3, 3, 3)), const("b1", w(24)), const("w2", w(24, 24, 3, 3)),
             const("wt", w(24, 8, 2, 2)), const("wm", w(900, 100))]
    model = make_model(nodes, [tensor("x", [1, 3, 13, 141]), tensor("a", [1, 9, 900])],
                       [tensor("y", None), tensor("z", None)], inits)
    _check_clean(model, isa, tmp_path, schedule={"conv_prefetch_rows": "always"})


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_lifted_1d_convs_in_row_segments_clean_under_sanitizers(isa, tmp_path):
    """A 1-D conv network at batch 1 (passes/lift_1d.py: convs of height 1, one output row cut
    into column segments, a dilated tap reaching both pads, a residual written in place, a
    causal Pad and a Slice) under the sanitizers."""
    from helpers import const, make_model, tensor
    from onnx import helper

    _isa_or_skip(isa)
    rng = np.random.default_rng(4)
    w = lambda *s: (rng.standard_normal(s) * 0.2).astype(np.float32)  # noqa: E731
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[5], pads=[2, 2]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], kernel_shape=[3], dilations=[7], pads=[7, 7]),
             helper.make_node("Add", ["c2", "r1"], ["a2"]),
             helper.make_node("Pad", ["a2", "pads"], ["p2"]),
             helper.make_node("Conv", ["p2", "w3"], ["c3"], kernel_shape=[3], strides=[2]),
             helper.make_node("Slice", ["c3", "st", "en", "ax"], ["y"])]
    inits = [const("w1", w(32, 8, 5)), const("b1", w(32)), const("w2", w(32, 32, 3)), const("b2", w(32)),
             const("pads", np.array([0, 0, 2, 0, 0, 0], np.int64)), const("w3", w(16, 32, 3)),
             const("st", np.array([0], np.int64)), const("en", np.array([-1], np.int64)),
             const("ax", np.array([2], np.int64))]
    model = make_model(nodes, [tensor("x", [1, 8, 397])], [tensor("y", None)], inits)
    _check_clean(model, isa, tmp_path)


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_tree_ensembles_and_lifted_int_convs_clean_under_sanitizers(isa, tmp_path):
    """The legacy tree ensembles (every form of tests/test_ml_ops.py: leaves of no, one and
    several weights, NaN features, int inputs) and 1-D ConvIntegers lifted to height 1
    (passes/lift_1d_integer.py) under the sanitizers."""
    from onnx import TensorProto, helper
    from test_ml_ops import _legacy_cases, _model

    _isa_or_skip(isa)
    nodes, feeds, outs = _legacy_cases()
    rng = np.random.default_rng(5)
    w = helper.make_tensor("cw", TensorProto.INT8, [6, 5, 3], rng.integers(-128, 128, 90).tolist())
    nodes += [helper.make_node("ConvInteger", ["q", "cw"], ["ci"], kernel_shape=[3], dilations=[3], pads=[3, 2],
                               strides=[2])]
    feeds["q"] = rng.integers(0, 256, (2, 5, 37)).astype(np.uint8)
    outs.append(("ci", TensorProto.INT32))
    model = _model(nodes, feeds, outs, ml_opset=3)
    model.graph.initializer.append(w)
    model.opset_import[0].version = 17
    _check_clean(model, isa, tmp_path, feeds=feeds)


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_conv_transpose_in_chunks_clean_under_sanitizers(isa, tmp_path):
    """ConvTranspose's GEMM + col2im form tiled over input rows (templates/conv_transpose.py): a
    16-channel 64x64 -> 128x128 node whose 4 MiB column matrix takes several chunks of input rows
    at any L2 of 2 MiB or less (the chunk index read from a marker pointer, a ragged last chunk
    where the rows do not divide), with a bias, under the sanitizers."""
    from helpers import const, make_model, tensor
    from onnx import helper

    _isa_or_skip(isa)
    rng = np.random.default_rng(9)
    w = (rng.standard_normal((16, 16, 4, 4)) * 0.1).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1])
    model = make_model([node], [tensor("x", [1, 16, 63, 64])], [tensor("y", [1, 16, 126, 128])],
                       [const("w", w), const("b", b)])
    _check_clean(model, isa, tmp_path)


@pytest.mark.parametrize("isa", ["native", "avx2_vnni", "avx2"])
def test_quantize_templates_clean_under_sanitizers(isa, tmp_path):
    """QuantizeLinear per axis and per tensor (float-to-int saturation is where C has undefined
    behaviour), DequantizeLinear, DynamicQuantizeLinear, MatMulInteger, QLinearMatMul (a run-time
    B as int16 pairs and as quads), ConvInteger
    (int8 and uint8 weights with zero points: the VNNI quads' row-sum correction), QLinearConv,
    under the sanitizers."""
    from helpers import const, make_model, tensor
    from onnx import helper

    _isa_or_skip(isa)
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("Mul", ["x", "big"], ["xb"]),  # values far outside int8's range
             helper.make_node("QuantizeLinear", ["xb", "s", "z"], ["q"], axis=1),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], axis=1),
             helper.make_node("QuantizeLinear", ["x", "s0"], ["q0"]),
             helper.make_node("DequantizeLinear", ["q0", "s0"], ["d0"]),
             helper.make_node("DynamicQuantizeLinear", ["x"], ["dq", "ds", "dz"]),
             helper.make_node("DequantizeLinear", ["dq", "ds", "dz"], ["y"]),
             # integer products: a constant (packed) and a run-time B, requantized
             helper.make_node("MatMulInteger", ["dq", "wq", "dz", "wz"], ["mi"]),
             helper.make_node("Cast", ["mi"], ["mf"], to=1),
             # quantize_dynamic's chain: one MatMulIntegerToFloat, its scale and zero point at run time
             helper.make_node("MatMulInteger", ["dq", "wq", "dz", "wz"], ["mi2"]),
             helper.make_node("Cast", ["mi2"], ["mf2"], to=1),
             helper.make_node("Mul", ["ds", "s0"], ["dws"]),
             helper.make_node("Mul", ["mf2", "dws"], ["mif"]),
             helper.make_node("Transpose", ["dq"], ["dq7"], perm=[0, 2, 1]),
             helper.make_node("QLinearMatMul", ["dq", "ds", "dz", "dq7", "s0", "z0", "s1", "z1"], ["ql"]),
             helper.make_node("DequantizeLinear", ["ql", "s1", "z1"], ["qf"]),
             # uint8 by a run-time uint8 B, zero points constant: the quad form packed per call on VNNI
             helper.make_node("Transpose", ["ql"], ["qlt"], perm=[0, 2, 1]),
             helper.make_node("QLinearMatMul", ["ql", "s1", "z1", "qlt", "s1", "z1", "s1", "z1"], ["qq"]),
             helper.make_node("DequantizeLinear", ["qq", "s1", "z1"], ["qqf"]),
             # integer convolutions (im2col pairs, padding, stride 2, groups) on a 4-D view
             helper.make_node("Reshape", ["dq", "shape4"], ["dq4"]),
             helper.make_node("ConvInteger", ["dq4", "cw", "dz"], ["ci"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Cast", ["ci"], ["cf"], to=1),
             helper.make_node("ConvInteger", ["dq4", "cwu", "dz", "cwz"], ["cu"], pads=[1, 1, 1, 1]),
             helper.make_node("Cast", ["cu"], ["cuf"], to=1),
             helper.make_node("QLinearConv", ["dq4", "ds", "dz", "cwg", "s0", "z8", "s1", "z1", "cb"], ["qc"],
                              pads=[1, 1, 1, 1], group=3),
             helper.make_node("DequantizeLinear", ["qc", "s1", "z1"], ["qcf"])]
    inits = [const("big", np.float32(300)), const("s", rng.uniform(0.5, 2, 5).astype(np.float32)),
             const("z", rng.integers(-100, 100, 5).astype(np.int8)), const("s0", np.float32(0.01)),
             const("wq", rng.integers(-128, 128, (7, 11)).astype(np.int8)), const("wz", np.int8(-3)),
             const("z0", np.uint8(9)), const("s1", np.float32(0.2)), const("z1", np.uint8(100)),
             const("shape4", np.array([1, 3, 5, 7], np.int64)),
             const("cw", rng.integers(-128, 128, (4, 3, 3, 3)).astype(np.int8)),
             const("cwu", rng.integers(0, 256, (5, 3, 3, 3)).astype(np.uint8)), const("cwz", np.uint8(119)),
             const("cwg", rng.integers(-128, 128, (6, 1, 3, 3)).astype(np.int8)), const("z8", np.int8(0)),
             const("cb", rng.integers(-1000, 1000, 6).astype(np.int32))]
    model = make_model(nodes, [tensor("x", [3, 5, 7])],
                       [tensor(n, None) for n in ("d", "d0", "y", "mf", "mif", "qf", "qqf", "cf", "cuf", "qcf")], inits,
                       opset=21)
    _check_clean(model, isa, tmp_path)


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_transpose_tiles_and_quantized_softmax_clean_under_sanitizers(isa, tmp_path):
    """The tiled Transpose (float32 tiles in registers and ragged edges, uint8 tiles), smelt's
    QDQSoftmax (DQ -> Softmax -> Q in one pass per row) and onnxruntime's QLinearSoftmax, with
    QuantizeLinear's reciprocal loop before them, under the sanitizers. onnxruntime runs the QDQ
    softmax as its own QLinearSoftmax: one code (1/256) apart at most."""
    from helpers import const, make_model, tensor
    from onnx import helper

    _isa_or_skip(isa)
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
             helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["q"]),
             helper.make_node("Transpose", ["q"], ["qt"], perm=[0, 2, 1]),
             helper.make_node("DequantizeLinear", ["qt", "sx", "zx"], ["qtf"]),
             helper.make_node("DequantizeLinear", ["q", "sx", "zx"], ["d"]),
             helper.make_node("Softmax", ["d"], ["p"], axis=-1),
             helper.make_node("QuantizeLinear", ["p", "sp", "zp"], ["pq"]),
             helper.make_node("DequantizeLinear", ["pq", "sp", "zp"], ["pf"]),
             helper.make_node("QLinearSoftmax", ["q", "sx", "zx", "sp", "zp"], ["ms"], domain="com.microsoft",
                              opset=13, axis=-1),
             helper.make_node("DequantizeLinear", ["ms", "sp", "zp"], ["msf"])]
    inits = [const("sx", np.float32(0.05)), const("zx", np.uint8(128)), const("sp", np.float32(1 / 256)),
             const("zp", np.uint8(0))]
    model = make_model(nodes, [tensor("x", [2, 37, 19])], [tensor(n, None) for n in ("xt", "qtf", "pf", "msf")],
                       inits, opset=21)
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    _check_clean(model, isa, tmp_path, tolerance=1.001 / 256)


@pytest.mark.parametrize("isa", ["native", "avx2_vnni", "avx2"])
def test_blocked_int8_convs_clean_under_sanitizers(isa, tmp_path):
    """The blocked int8 conv (templates/int_conv_nchwc.py) on padded channel sets
    (schedule/int_channel_pad.py: 24 channels, a depthwise conv and a QLinearAdd join inside the
    set), and convs of several output-channel groups whose kernels walk the next group's weights
    (``prefetch_next``), under the sanitizers."""
    import sys
    from pathlib import Path

    _isa_or_skip(isa)
    sys.path.insert(0, str(Path(__file__).parent / "kernels"))
    from test_int_channel_pad import _model

    m = _model(24)
    x = m.input((1, 96, 7, 7))
    m.params[x] = (0.02, 7)
    y = m.conv(x, 96, 200, 3, yz=9, y_scale=0.05, relu=True)
    m.output(m.conv(y, 200, 72, 1, yz=120, y_scale=0.06))
    _check_clean(m.build(), isa, tmp_path, feeds=m.feeds)


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_quantized_lstm_clean_under_sanitizers(isa, tmp_path):
    """com.microsoft:DynamicQuantizeLSTM, bidirectional, batch 1 (one row: onnxruntime's grouping
    of h at any thread count), under the sanitizers."""
    from onnx import TensorProto, helper, numpy_helper

    _isa_or_skip(isa)
    rng = np.random.default_rng(3)
    h, i = 5, 6
    inits = [numpy_helper.from_array(rng.integers(-128, 128, (2, i, 4 * h)).astype(np.int8), "W"),
             numpy_helper.from_array(rng.integers(-128, 128, (2, h, 4 * h)).astype(np.int8), "R"),
             numpy_helper.from_array((rng.standard_normal((2, 8 * h)) * 0.1).astype(np.float32), "B"),
             numpy_helper.from_array(np.array([0.004, 0.003], np.float32), "ws"),
             numpy_helper.from_array(np.zeros(2, np.int8), "wz"),
             numpy_helper.from_array(np.array([0.005, 0.002], np.float32), "rs"),
             numpy_helper.from_array(np.array([1, -1], np.int8), "rz")]
    node = helper.make_node("DynamicQuantizeLSTM", ["x", "W", "R", "B", "", "", "", "", "ws", "wz", "rs", "rz"],
                            ["y", "yh", "yc"], domain="com.microsoft", hidden_size=h, direction="bidirectional")
    graph = helper.make_graph([node], "dql", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 1, i])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "yh", "yc")],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    _check_clean(model, isa, tmp_path)


def _check_clean(model, isa: str, tmp_path, schedule: dict | None = None, feeds: dict | None = None,
                 tolerance: float = 1e-4) -> None:
    """Compile ``model`` at ``isa`` (and the ``schedule`` switches) under the sanitizers at 1 and
    2 threads, fully native, and compare with onnxruntime (on ``feeds``, or float32 noise) within
    ``tolerance`` relative to max(1, max|output|)."""
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    rng = np.random.default_rng(0)
    if feeds is None:
        feeds = {}
        for inp in model.graph.input:
            shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
            feeds[inp.name] = rng.standard_normal(shape).astype(np.float32)
    np.savez(tmp_path / "feeds.npz", **feeds)
    np.savez(tmp_path / "ref.npz", *ort_run(model, feeds, threads=2))
    proc = _run_child(f"""
        import numpy as np, smelt
        feeds = dict(np.load({str(tmp_path / 'feeds.npz')!r}))
        ref = np.load({str(tmp_path / 'ref.npz')!r})
        for threads in (1, 2):
            cm = smelt.compile({str(path)!r}, threads=threads, isa={isa!r}, schedule={schedule or {}!r})
            assert cm.fallback_nodes == [], cm.fallback_nodes
            outs = cm.run(feeds)
            for i, out in enumerate(outs):
                want = ref[f"arr_{{i}}"]
                err = float(np.max(np.abs(out - want))) / max(1.0, float(np.max(np.abs(want))))
                assert err <= {tolerance!r}, (threads, i, err)
        print("ok")
    """, tmp_path)
    _assert_clean(proc)
    assert "ok" in proc.stdout


def test_sanitizer_build_does_report_a_real_overflow(tmp_path):
    """Negative control: the sanitized toolchain must catch an out-of-bounds write."""
    proc = _run_child("""
        import ctypes
        from smelt.codegen.toolchain import build_shared_library
        src = '#include "smelt_rt.h"\\n' + '''
        __attribute__((visibility("default"))) int overflow(int n) {
            int *p = (int *)malloc(sizeof(int) * n);
            p[n] = 1;  /* one past the end */
            int r = p[0];
            free(p);
            return r;
        }'''
        lib = ctypes.CDLL(str(build_shared_library(src, name="overflow", sanitize=True)))
        lib.overflow(4)
    """, tmp_path)
    assert "heap-buffer-overflow" in proc.stderr


def test_concurrency_stress_clean_under_sanitizers(tmp_path):
    """tests/concurrency_stress.py for 10 s on sanitized builds: variants evicted, closed and
    replaced while other threads run them, two instances of one library, a bound growing
    mid-run. A pool, arena or library freed under a call would be a use-after-free report."""
    from concurrency_stress import write_references

    refs = tmp_path / "refs.npz"
    write_references(str(refs))
    proc = run_python(Path(__file__).parent / "concurrency_stress.py", "10", str(refs),
                      env=_sanitizer_env(tmp_path), extra_env={"SMELT_MAX_VARIANTS": "2"}, timeout=1800)
    _assert_clean(proc)
    assert "stress ok" in proc.stdout
