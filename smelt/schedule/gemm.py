"""Gemm and MatMul schedules: what the GEMM templates render (``node.schedule``).

The blocking (MC/KC/NC) and the micro-kernel come from the target's facts in the kernel library
(``kernels/gemm.py``: ``blocking_for``, the ISA description's kernel shape); what a caller can
switch, and when a GEMM is worth splitting over threads, is decided here, once, and written on
the node as a ``GemmSchedule`` (the NCHW conv GEMMs carry one inside their ``ConvSchedule``).
"""

from __future__ import annotations

from dataclasses import dataclass

from smelt.ir.graph import Graph
from smelt.options import CompileOptions

GEMM_OPS = ("Gemm", "MatMul")

# Below this many multiply-adds (all items together) a GEMM runs on thread 0 alone: waking a
# second thread and the barrier after it cost more than half of such a GEMM saves (a few
# microseconds against ~2 us of FMAs). Counted in MACs, not cycles, so the same on every ISA.
PARALLEL_MIN_MACS = 1 << 16


@dataclass(frozen=True)
class GemmSchedule:
    """How one GEMM runs (a Gemm/MatMul node, or an NCHW conv's GEMM)."""

    # read a run-time B with unit column stride in place instead of packing it (measured slower
    # on ResNet-50's 1x1 layers: packed panels stream better; ``options.gemm_read_b_in_place``)
    read_b_in_place: bool
    # read a run-time row-major A in place (the micro-kernel broadcasts from MR rows lda apart)
    # instead of packing MR-row panels (``options.gemm_read_a_in_place``)
    read_a_in_place: bool
    # the micro-kernel prefetches its C tile (and a residual operand) before the K loop
    prefetch_c: bool
    # prepacked weights: the next B block is prefetched into L2 while this one computes
    # (``options.gemm_prefetch_next_b``)
    prefetch_next_b: bool
    # fewer multiply-adds than this: thread 0 alone (``PARALLEL_MIN_MACS``)
    parallel_min_macs: int
    # code that is the same for every M and N (a shape class's graph, ``Graph.shape_generic``):
    # every row and column tail kernel present and picked at run time, the threads always split
    # the grid, no size-dependent packing choice
    runtime_shape: bool = False

    def problem_args(self) -> dict:
        """The kernel library's ``GemmProblem`` fields this schedule sets (kernels/gemm.py)."""
        return {"direct_b": self.read_b_in_place, "direct_a": self.read_a_in_place,
                "prefetch_c": self.prefetch_c, "prefetch_next_b": self.prefetch_next_b,
                "parallel_min_macs": self.parallel_min_macs,
                "runtime_shape": self.runtime_shape}


def gemm_schedule(options: CompileOptions, runtime_shape: bool = False) -> GemmSchedule:
    """The schedule every GEMM gets under ``options`` (nothing here depends on the shape)."""
    return GemmSchedule(read_b_in_place=options.gemm_read_b_in_place,
                        read_a_in_place=options.gemm_read_a_in_place,
                        prefetch_c=options.gemm_prefetch_c, prefetch_next_b=options.gemm_prefetch_next_b,
                        parallel_min_macs=PARALLEL_MIN_MACS,
                        runtime_shape=runtime_shape)


def decide_gemm_graph(g: Graph, options: CompileOptions) -> None:
    """``node.schedule = GemmSchedule(...)`` for every Gemm and MatMul."""
    for node in g.nodes:
        if node.op in GEMM_OPS and node.domain in ("", "ai.onnx"):
            node.schedule = gemm_schedule(options, g.shape_generic)


INT_TILE_MAX_ROWS = 12  # rows of a narrow tile (fewer vectors per row): broadcasts stay cheap


def int_tiles_rows_inner(row_blocks: int, panels: int, a_bytes: int, b_bytes: int, l1_bytes: int) -> bool:
    """Whether an integer GEMM's (row block, column panel) tiles run row blocks innermost (each
    column panel of B stays in cache while every row block of A passes it; A is read once per
    panel) rather than panels innermost (B read once per row block). A B that fits in the L1
    (``l1_bytes``: the target's) is read from there either way: panels inner, A streams once (an
    im2col conv's many rows against its few weights). Else whichever streams fewer bytes. A
    dynamically quantized DistilBERT's FFN (A 128 x 768, B 768 x 3072 int8) streamed its 2.4 MB
    B 22 times a call panels-inner; rows-inner it reads A (98 KB) 48 times: 1.05 -> 0.61 ms
    (Emerald Rapids, 2 threads)."""
    if b_bytes <= l1_bytes:
        return False
    return panels * a_bytes + b_bytes < row_blocks * b_bytes + a_bytes


def int_dot_tile(registers: int, rows: int | None = None, columns: int | None = None,
                 lanes: int = 16) -> tuple[int, int]:
    """The integer GEMM's register tile (rows MR, int32 vectors NV per row) for a vector ISA with
    ``registers`` registers: MR * NV accumulators, NV B vectors and one A broadcast must fit
    (32 registers: 6 x 4, 29 live; 16: 6 x 2, 15 live). ``rows``: the product's rows when known
    at compile time; MR is never more (a tile's rows past the end re-read the last row and
    their sums are dropped: ResNet-50's classifier, M = 1, did six rows' dots for one; its time
    did not change, since streaming its 2 MB of weights bounds it, but a one-row product whose
    weights are in cache does six times fewer dots). ``columns``: the product's columns when
    fewer than a full tile's (``lanes`` int32 per vector): NV shrinks to cover them and the
    freed registers hold more rows, up to ``INT_TILE_MAX_ROWS`` (ddddocr's ConvIntegers with 24
    output channels did 64 columns' dots for 24: 6 x 4 became 12 x 2)."""
    nv = 4 if registers >= 32 else 2
    mr = min(6, (registers - nv - 1) // nv)
    if columns is not None and -(-columns // lanes) < nv:
        nv = max(1, -(-columns // lanes))
        mr = min(INT_TILE_MAX_ROWS, (registers - nv - 1) // nv)
    return (mr if rows is None else max(1, min(mr, rows))), nv
