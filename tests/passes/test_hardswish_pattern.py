"""HardSwish spelled x * Clip(x + 3, 0, 6) / 6 (paddle2onnx's PP-LCNet) fuses into the conv or GEMM
that produces x (passes/hardswish_pattern.py), with the scale and bias after it; near misses stay
separate nodes. Against onnxruntime at every ISA, 1 and 2 threads, NCHWc and NCHW convs."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import const, make_model, tensor
from kernel_models import Case, check_cases
from onnx import helper

from smelt.compiler import lower
from smelt.frontend.onnx_import import load_model
from smelt.options import CompileOptions

RNG = np.random.default_rng(28)


def _case(name: str, *, div: bool = True, swap_add: bool = False, swap_mul: bool = False, three: float = 3.0,
          extra_reader: bool = False, shape=(1, 16, 9, 11), ks=(3, 3), oc: int = 32) -> Case:
    p = f"{name}_"
    x, w, b = p + "x", p + "w", p + "b"
    n, c, h, wd = shape
    inits = [const(w, (RNG.standard_normal((oc, c, *ks)) / np.sqrt(c * ks[0] * ks[1])).astype(np.float32)),
             const(b, RNG.standard_normal(oc).astype(np.float32)),
             const(p + "three", np.float32(three)), const(p + "zero", np.float32(0)), const(p + "six", np.float32(6)),
             const(p + "sixth", np.float32(1 / 6)), const(p + "scale", np.float32(1.3)), const(p + "bias", np.float32(-0.2))]
    pads = [k // 2 for k in ks] * 2
    y = p + "y"
    nodes = [helper.make_node("Conv", [x, w, b], [y], kernel_shape=list(ks), pads=pads),
             helper.make_node("Add", [p + "three", y] if swap_add else [y, p + "three"], [p + "a"]),
             helper.make_node("Clip", [p + "a", p + "zero", p + "six"], [p + "c"]),
             helper.make_node("Mul", [p + "c", y] if swap_mul else [y, p + "c"], [p + "m"]),
             helper.make_node("Div", [p + "m", p + "six"], [p + "h"]) if div else
             helper.make_node("Mul", [p + "sixth", p + "m"], [p + "h"]),
             helper.make_node("Mul", [p + "scale", p + "h"], [p + "s"]),
             helper.make_node("Add", [p + "s", p + "bias"], [p + "o"])]
    out = p + "o"
    if extra_reader:  # the clipped value is read twice: not the pattern
        nodes.append(helper.make_node("Add", [p + "o", p + "c"], [p + "o2"]))
        out = p + "o2"
    feeds = {x: (RNG.standard_normal(shape) * 3).astype(np.float32)}
    return Case(name, nodes, [tensor(x, list(shape))], inits, out, feeds)


FUSED = [_case("div"), _case("mul_sixth", div=False), _case("swapped", swap_add=True, swap_mul=True),
         _case("pointwise", ks=(1, 1), oc=48)]
NEAR_MISSES = [_case("three_is_2_5", three=2.5), _case("clip_read_twice", extra_reader=True)]


def _fused_convs(case: Case) -> list[list[str]]:
    model = load_model(make_model(case.nodes, case.inputs, [tensor(case.output, None)], case.inits))
    g = lower(model, CompileOptions(threads=1))
    return [[e.op for e in n.epilogue] for n in g.nodes if n.op == "Conv"]


@pytest.mark.parametrize("case", FUSED, ids=lambda c: c.name)
def test_pattern_fuses_into_the_conv(case):
    (epi,) = _fused_convs(case)
    assert epi[-3:] == ["HardSwish", "Mul", "Add"]


@pytest.mark.parametrize("case", NEAR_MISSES, ids=lambda c: c.name)
def test_near_misses_stay_separate(case):
    (epi,) = _fused_convs(case)
    assert "HardSwish" not in epi


@pytest.mark.parametrize("layout", ["propagate", "nchw"])
@pytest.mark.parametrize("isa", ["native", "avx2", "scalar"])
def test_fused_hardswish_matches_onnxruntime(isa, layout, monkeypatch, tmp_path):
    def check(compiled, target):
        epilogues = [i.epilogue for i in compiled.plan.step_infos() if i.op == "Conv"]
        assert sum("HardSwish" in e for e in epilogues) >= len(FUSED), epilogues

    check_cases(FUSED + NEAR_MISSES, isa, monkeypatch, tmp_path, check, layout=layout, winograd=False)
