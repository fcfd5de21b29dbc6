"""Gemm and MatMul schedules: what the GEMM templates render (``node.schedule``).

The blocking (MC/KC/NC) and the micro-kernel come from the target's facts in the kernel library
(``kernels/gemm.py``: ``blocking_for``, the ISA description's kernel shape); what a caller can
switch is decided here, once, from the compile options.
"""

from __future__ import annotations

from dataclasses import dataclass

from smelt.ir.graph import Graph
from smelt.options import CompileOptions

GEMM_OPS = ("Gemm", "MatMul")


@dataclass(frozen=True)
class GemmSchedule:
    """How one Gemm/MatMul runs."""

    # read a run-time B with unit column stride in place instead of packing it
    read_b_in_place: bool = False


def decide_gemm_graph(g: Graph, options: CompileOptions) -> None:
    """``node.schedule = GemmSchedule(...)`` for every Gemm and MatMul."""
    for node in g.nodes:
        if node.op in GEMM_OPS and node.domain in ("", "ai.onnx"):
            node.schedule = GemmSchedule(read_b_in_place=options.gemm_read_b_in_place)
