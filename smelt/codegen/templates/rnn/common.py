"""Pieces every part of the RNN template uses: the compiler barrier, balanced row chunks, scratch."""

from __future__ import annotations

from smelt.codegen.emitter import BlockEmitter
from smelt.codegen.kernels.isa import VectorIsa, vector_isa
from smelt.codegen.kernels.rnn_vec import rnn_vec
from smelt.codegen.kernels.tile import MacroVector
from smelt.errors import VerifyError
from smelt.ir.graph import Node
from smelt.schedule.rnn import RnnSchedule
from smelt.target import Target

# Compiler barrier between work items whose stores interleave with other threads' stores: GCC 12
# -O3 predictive commoning otherwise may load a later iteration's target locations early and
# store them back at loop exit (an invented store: it clobbered the other thread's XW panel in
# a stress test of the ONNX backend cases; -fno-predictive-commoning or -O2 also avoid it).
CB = '__asm__ volatile("" ::: "memory");'

# The 16-lane logical vector every RNN kernel computes in: VX_ names, defined per ISA by a C
# header (kernels/rnn_vec.py) and prefixed per chunk when the source is assembled.
VX = MacroVector("VX_v", "VX")


def native_vector(target: Target) -> VectorIsa | None:
    """The target's native vector description where one logical vector is several native ones
    (AVX2: two ymm), for the cell's native-vector register tiles; None where the logical vector
    is native (AVX-512) or the portable struct."""
    return vector_isa(target) if rnn_vec(target).registers_per_vector > 1 else None


def _row_chunks(total: int, most: int) -> list[tuple[int, int]]:
    """Balanced chunks of at most ``most``: (size, count) pairs, at most two distinct sizes."""
    n = -(-total // most)
    q, r = divmod(total, n)
    return [(s, c) for s, c in ((q + 1, r), (q, n - r)) if c > 0]


def _scratch(em: BlockEmitter, nfloats: int) -> str:
    return em.scratch(max(1, nfloats) * 4)


def _schedule(node: Node) -> RnnSchedule:
    sched = node.schedule
    if not isinstance(sched, RnnSchedule):
        raise VerifyError(f"{node.op} node {node.name!r} has no RNN schedule: the schedule stage "
                          "(smelt.schedule.stage.schedule_graph, run by compiler.lower) did not run on this graph")
    return sched
