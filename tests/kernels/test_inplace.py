"""Outputs written over a dead residual operand (codegen/inplace.py) against onnxruntime.

A row-outer NCHWc conv with a fused residual Add may write its output into the residual's
buffer when the conv is the residual's last reader. The planner cases check where it does and
where it must not (the residual read again later, the conv's own input as the residual, the
ic-outer order that keeps partial sums in the output); every case also checks the answer at 1
and 2 threads.
"""

from __future__ import annotations

from kernel_models import Chain, _model, check_cases
from onnx import helper

from smelt.codegen.plan import build_plan
from smelt.compiler import lower
from smelt.frontend.onnx_import import load_model
from smelt.options import CompileOptions


def _residual_pairs(model) -> tuple[list[tuple[str, str]], dict[str, int]]:
    """(conv output, residual operand) of every conv with a fused residual, and arena offsets."""
    g = lower(load_model(model), CompileOptions(threads=2, use_tuning_db=False))
    plan = build_plan(g)
    pairs = [(n.outputs[0], e.input) for n in g.nodes if n.op == "Conv"
             for e in n.epilogue if e.input and e.broadcast == "full"]
    return pairs, plan.arena_offsets


def _bottleneck(name: str, shape: tuple) -> Chain:
    """Two ResNet bottleneck-like blocks of 1x1 convs (each block's input is its residual)."""
    c = shape[1]
    ch = Chain(name, shape).conv(c, (1, 1), post=("Relu",))
    for _ in range(2):
        ch.mark().conv(c // 2, (1, 1), post=("Relu",)).conv(c, (1, 1), post=("residual", "Relu"))
    return ch


def test_residual_outputs_reuse_the_residual_buffer(monkeypatch, cache):
    case = _bottleneck("ip", (1, 32, 16, 16)).case()  # 256 positions: row-outer order
    model, _ = _model([case])
    pairs, offsets = _residual_pairs(model)
    assert len(pairs) == 2
    # the first block's residual is the arena value of the stem conv; the graph output (the
    # last conv) leaves through a layout transform, so both outputs are arena values
    assert all(offsets[out] == offsets[res] for out, res in pairs), (pairs, offsets)
    check_cases([case], "native", monkeypatch, cache, lambda c, t: None, layout="propagate")


def test_no_reuse_when_the_residual_is_read_later(monkeypatch, cache):
    ch = _bottleneck("late", (1, 32, 16, 16))
    case = ch.case()
    # the first block's input is read once more after its residual conv
    first_res = next(n.input[1] for n in case.nodes if n.op_type == "Add")
    case.nodes.append(helper.make_node("Add", [case.output, first_res], ["late_out"]))
    case.output = "late_out"
    model, _ = _model([case])
    pairs, offsets = _residual_pairs(model)
    lingering = [(o, r) for o, r in pairs if r == first_res]
    assert lingering and all(offsets[o] != offsets[r] for o, r in lingering)
    check_cases([case], "native", monkeypatch, cache, lambda c, t: None, layout="propagate")


def test_no_reuse_in_ic_outer_order():
    """A 7x7 plane runs ic-outer: partial sums go through the output, so no aliasing."""
    model, _ = _model([_bottleneck("small", (1, 64, 7, 7)).case()])
    pairs, offsets = _residual_pairs(model)
    assert pairs and all(offsets[o] != offsets[r] for o, r in pairs)


def test_no_reuse_of_the_convs_own_input(monkeypatch, cache):
    """conv(x) + x: the residual is the conv's input, which other tiles still read."""
    ch = Chain("own", (1, 32, 16, 16)).conv(32, (1, 1), post=("Relu",))
    ch.conv(32, (1, 1), post=("residual", "Relu"))  # residual = this conv's own input
    case = ch.case()
    model, _ = _model([case])
    pairs, offsets = _residual_pairs(model)
    assert pairs and all(offsets[o] != offsets[r] for o, r in pairs)
    check_cases([case], "native", monkeypatch, cache, lambda c, t: None, layout="propagate")
