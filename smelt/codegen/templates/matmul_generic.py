"""MatMul of the types the float32 GEMM (``gemm.py``) does not take: float64, float16 and the
integer types onnxruntime multiplies (int32, int64, uint32, uint64).

Template ``matmul_generic``: numpy semantics (1-D promotion, batch broadcasting); per output row
one accumulator row (float for float16, double for float64, the unsigned type of the width for
integers, so products and sums wrap as onnxruntime's do, without signed overflow), updated
``acc[n] += a[m, k] * b[k, n]`` with k outer so the inner loop is contiguous in B and
vectorizes. float16 is widened exactly to float and the sum rounded once to nearest-even, as
onnxruntime's float16 MatMul computes in float. Rows are split across threads. These types are
rare in inference graphs (function expansions of attention in float16, float64 reference
models), so this is a plain kernel rather than a packed GEMM.
"""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import BlockEmitter
from smelt.codegen.kernels import half
from smelt.codegen.kernels.broadcast import PARALLEL_MIN_ELEMS
from smelt.codegen.kernels.loops import dtype_name, emit_kernel, unsigned_of, work_range
from smelt.codegen.registry import register
from smelt.ir.graph import Graph, Node
from smelt.ir.types import c_type

TYPES = ("float64", "float16", "int32", "int64", "uint32", "uint64")


def _shape(g: Graph, name: str) -> list[int]:
    return [int(d) for d in g.values[name].shape]


def _check(node: Node, g: Graph) -> str | None:
    a, b, y = node.inputs[0], node.inputs[1], node.outputs[0]
    dt = dtype_name(g, a)
    if dt not in TYPES or dtype_name(g, b) != dt or dtype_name(g, y) != dt:
        return f"no generic native MatMul for {dt}"
    if getattr(node, "epilogue", None):
        return "fused epilogue"
    sa, sb = _shape(g, a), _shape(g, b)
    if not sa or not sb:
        return "MatMul of a scalar"
    if sa[-1] != (sb[0] if len(sb) == 1 else sb[-2]):
        return "MatMul inner dimensions differ"
    try:
        np.broadcast_shapes(tuple(sa[:-2]), tuple(sb[:-2]))
    except ValueError:
        return "MatMul batch dimensions do not broadcast"
    return None


def _batch_offsets(shape: list[int], out_batch: list[int], mat: int) -> np.ndarray:
    """Element offset of each output batch's matrix in an operand (0 stride where broadcast)."""
    rank = len(out_batch)
    padded = [1] * (rank - len(shape)) + list(shape)
    strides, acc = [0] * rank, mat
    for d in range(rank - 1, -1, -1):
        strides[d] = acc if padded[d] != 1 else 0
        acc *= padded[d]
    idx = np.indices(out_batch, dtype=np.int64).reshape(rank, -1) if rank else np.zeros((0, 1), np.int64)
    return (np.asarray(strides, np.int64)[:, None] * idx).sum(axis=0) if rank else np.zeros(1, np.int64)


@register("MatMul", versions=(1, 9, 13), check=_check, name="matmul_generic")
def emit_matmul_generic(node: Node, g: Graph, em: BlockEmitter) -> None:
    a, b, y = node.inputs[0], node.inputs[1], node.outputs[0]
    dt = dtype_name(g, a)
    sa, sb = _shape(g, a), _shape(g, b)
    a2 = [1] + sa if len(sa) == 1 else sa  # 1-D promotion
    b2 = sb + [1] if len(sb) == 1 else sb
    M, K, N = a2[-2], a2[-1], b2[-1]
    batch = list(np.broadcast_shapes(tuple(a2[:-2]), tuple(b2[:-2])))
    nb = int(np.prod(batch, dtype=np.int64))
    if not nb * M * N:
        return
    t = c_type(dt)
    if dt == "float16":
        half.half_helpers(em)
        acc_t, load, store = "float", (lambda e: f"smelt_h2f({e})"), (lambda e: f"smelt_f2h({e})")
    elif dt == "float64":
        acc_t, load, store = "double", (lambda e: e), (lambda e: e)
    else:
        u = unsigned_of(dt)
        acc_t, load, store = u, (lambda e: f"({u})({e})"), (lambda e: f"({t})({e})")
    offs_a = _batch_offsets(a2[:-2], batch, M * K)
    offs_b = _batch_offsets(b2[:-2], batch, K * N)
    tab_a = em.weight(offs_a)
    tab_b = em.weight(offs_b)
    rows = nb * M
    acc_dt = {"float": "float32", "double": "float64"}.get(acc_t, "uint64")  # 8 bytes hold any of them
    acc = em.scratch(em.n_threads * N * np.dtype(acc_dt).itemsize, acc_dt)
    body = "\n".join([
        f"const {t} *restrict A = {em.ptr(a)};", f"const {t} *restrict B = {em.ptr(b)};",
        f"{t} *restrict Y = (void *){em.ptr(y)};",
        f"{acc_t} *restrict R = (void *)({acc} + (long)tid * {N});",
        work_range(rows, rows * N * K >= PARALLEL_MIN_ELEMS),
        "for (long r = wb; r < we; ++r) {",
        f"    long bt = r / {M}L, m = r % {M}L;",
        f"    const {t} *ar = A + {tab_a}[bt] + m * {K}L; const {t} *bm = B + {tab_b}[bt];",
        f"    for (long n = 0; n < {N}L; ++n) R[n] = 0;",
        f"    for (long k = 0; k < {K}L; ++k) {{",
        f"        const {acc_t} av = {load('ar[k]')}; const {t} *br = bm + k * {N}L;",
        f"        for (long n = 0; n < {N}L; ++n) R[n] += av * {load('br[n]')};",
        "    }",
        f"    for (long n = 0; n < {N}L; ++n) Y[r * {N}L + n] = {store('R[n]')};",
        "}"])
    emit_kernel(em, f"matmul_{dt}", body, f"MatMul {sa} x {sb} ({dt})")
