"""Shape classes: a model with a symbolic width compiles once and serves every width from one
library whose shape-dependent numbers are read at run time (smelt/codegen/shape_slots.py)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import assert_close, const, make_model, ort_run, tensor
from kernel_models import force_isa
from onnx import helper

import smelt
from smelt.codegen import shape_slots, toolchain

RNG = np.random.default_rng(20261126)


def _w(*shape, scale=0.3):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def ocr_model():
    """An OCR recognizer in miniature: convs (padded, strided, depthwise, 3x3 on 32 channels for
    Winograd, 1x1, a residual), a pool, the width becoming the sequence, an LSTM over it and a
    classifier per column."""
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Sigmoid", ["c2"], ["s2"]),
        helper.make_node("Mul", ["c2", "s2"], ["a2"]),
        helper.make_node("Conv", ["a2", "wd", "bd"], ["cd"], pads=[1, 1, 1, 1], group=32),
        helper.make_node("Add", ["cd", "a2"], ["res"]),
        helper.make_node("Conv", ["res", "w4", "b4"], ["c4"], pads=[1, 1, 1, 1]),  # Winograd where it may
        helper.make_node("Relu", ["c4"], ["r4"]),
        helper.make_node("Conv", ["r4", "w3", "b3"], ["c3"]),
        helper.make_node("MaxPool", ["c3"], ["p3"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Transpose", ["p3"], ["t3"], perm=[0, 3, 1, 2]),
        helper.make_node("Reshape", ["t3", "shape3"], ["seq"]),
        helper.make_node("MatMul", ["seq", "wc"], ["logits0"]),
        helper.make_node("Add", ["logits0", "bc"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
        helper.make_node("Transpose", ["seq"], ["tseq"], perm=[1, 0, 2]),
        helper.make_node("LSTM", ["tseq", "lw", "lr", "lb"], ["ly"], hidden_size=12),
        helper.make_node("Squeeze", ["ly", "ax1"], ["ly2"]),
        helper.make_node("MatMul", ["ly2", "lo"], ["tags"]),
    ]
    inits = [const("w1", _w(16, 3, 3, 3)), const("b1", _w(16)), const("w2", _w(32, 16, 3, 3, scale=0.1)),
             const("b2", _w(32)), const("wd", _w(32, 1, 3, 3)), const("bd", _w(32)),
             const("w3", _w(48, 32, 1, 1, scale=0.2)), const("b3", _w(48)),
             const("w4", _w(32, 32, 3, 3, scale=0.1)), const("b4", _w(32)),
             const("shape3", np.array([0, 0, -1], np.int64)), const("wc", _w(48 * 4, 20, scale=0.1)),
             const("bc", _w(20)), const("lw", _w(1, 48, 48 * 4, scale=0.1)), const("lr", _w(1, 48, 12)),
             const("lb", _w(1, 96)), const("ax1", np.array([1], np.int64)), const("lo", _w(12, 7))]
    return make_model(nodes, [tensor("x", [1, 3, 16, "W"])], [tensor("probs", None), tensor("tags", None)], inits)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("isa", ["native", "avx2", pytest.param("scalar", marks=pytest.mark.slow)])
def test_widths_share_one_library(isa, threads, monkeypatch, tmp_path):
    force_isa(isa, monkeypatch, tmp_path / "cache")
    compiles = []
    real_compile = toolchain._compile
    monkeypatch.setattr(toolchain, "_compile", lambda *a, **k: compiles.append(1) or real_compile(*a, **k))
    model = ocr_model()
    compiled = smelt.compile(model, threads=threads)
    libs, algorithms, weights, arenas = set(), set(), set(), []
    # below and above the decision width (the first call's 64), odd, at a tile's edge, tiny
    for width in (64, 65, 100, 37, 129, 8):
        x = RNG.standard_normal((1, 3, 16, width)).astype(np.float32)
        assert_close(compiled(x), ort_run(model, {"x": x}), rel=2e-4)
        art = compiled._variants[compiled._last]
        assert art.plan.slots is not None, f"width {width} did not share a library"
        libs.add(art.lib_path)
        algorithms |= {info.schedule.get("algorithm", "") for info in art.plan.step_infos()}
        weights.add(art.weights.ctypes.data)
        arenas.append(max(64, art.plan.arena_bytes + art.plan.scratch_bytes))
    assert len(libs) == 1
    # memory follows the largest shape, not the number of shapes (runtime/memory.py): one arena
    # (one caller), and the six variants map one copy of their identical weights
    assert compiled.arena_bytes_held == max(arenas), (compiled.arena_bytes_held, arenas)
    assert len(weights) == 1
    if isa != "scalar":  # the 32-channel 3x3 conv runs Winograd in a shape class too
        assert any("Winograd" in a for a in algorithms), algorithms
    assert len(compiles) == 1, f"{len(compiles)} compiles for 6 widths"


def test_share_shapes_false_compiles_each_shape(monkeypatch, tmp_path):
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path / "cache"))
    model = ocr_model()
    compiled = smelt.compile(model, threads=2, share_shapes=False)
    for width in (40, 41):
        x = RNG.standard_normal((1, 3, 16, width)).astype(np.float32)
        assert_close(compiled(x), ort_run(model, {"x": x}), rel=2e-4)
        assert compiled._variants[compiled._last].plan.slots is None


def test_a_slotted_library_that_does_not_compile_falls_back_to_per_shape_builds(monkeypatch, tmp_path):
    """A slot inside a C constant expression would not compile: the shape is built for itself, and
    the class stops trying (one failed compile, not one per shape)."""
    from smelt.errors import CompileError

    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path / "cache"))
    real = toolchain.shared_library
    slotted_tries = []

    def refuse_slotted(source, **kw):
        if "smelt_set_slots" in source:
            slotted_tries.append(1)
            raise CompileError("a slot in a constant expression (simulated)")
        return real(source, **kw)

    monkeypatch.setattr(toolchain, "shared_library", refuse_slotted)
    model = ocr_model()
    compiled = smelt.compile(model, threads=2)
    for width in (40, 41, 44):
        x = RNG.standard_normal((1, 3, 16, width)).astype(np.float32)
        assert_close(compiled(x), ort_run(model, {"x": x}), rel=2e-4)
        assert compiled._variants[compiled._last].plan.slots is None
    assert len(slotted_tries) == 1


C_A = """static const smelt_ref_t smelt_refs_0[2] = {
    {0, 128}, {1, 64},
};
static void f_0123456789(float *y) { for (long i = 0; i < 40; i += 8) y[i] = 0.5f * 3; }
/* a comment 77 */ const char *s = "x 12";
"""


def test_slots_are_the_numbers_that_differ():
    a = shape_slots.tokenize(C_A)
    b = shape_slots.tokenize(C_A.replace("128", "256").replace("< 40", "< 48").replace("0.5f", "0.25f")
                             .replace("77", "78").replace("f_0123456789", "f_abcdef0123"))
    assert a.structure == b.structure  # comments and function digests do not count
    smap = shape_slots.slot_map(a, [b])
    assert smap is not None and len(smap.slots) == 3
    ints, floats = smap.values(b)
    assert ints == [256, 48] and floats == [0.25]
    # a number the library fixed must match; a string's number is structure, not a slot
    assert smap.values(shape_slots.tokenize(C_A.replace("i += 8", "i += 16"))) is None
    assert shape_slots.tokenize(C_A.replace('"x 12"', '"x 13"')).structure != a.structure
    # a slot in a constant table moves the table's initializer into smelt_set_slots
    assert "static smelt_ref_t smelt_refs_0[2]; /* filled by smelt_set_slots */" in smap.source
    assert "smelt_refs_0[i] = init[i]" in smap.source
    assert "((float)smelt_sf[0])" in smap.source


def test_other_structure_learns_nothing():
    a = shape_slots.tokenize(C_A)
    b = shape_slots.tokenize(C_A.replace("y[i] = 0.5f * 3;", "y[i] = 0.5f * 3; y[i + 1] = 0;"))
    assert shape_slots.slot_map(a, [b]) is None
    assert "y [ i + # ]" in shape_slots.first_difference(a, b)
