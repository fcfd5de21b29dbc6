"""The ONNX ``Gemm`` and ``MatMul`` templates (float32): Y = alpha * A' B' + beta * C and batched
matmul with numpy broadcasting, rendered by the kernel library's BLIS-style GEMM
(``codegen/kernels/gemm.py``: templates ``f32_gemm_<mr>x<nr>__<isa>`` / ``f32_matmul_<mr>x<nr>__<isa>``).
"""


from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from smelt.codegen.emitter import BlockEmitter
from smelt.codegen.kernels.epilogue import (
    TileOperand,
    TileScale,
)
from smelt.codegen.kernels.gemm import (
    ConstPacked,
    GemmProblem,
    Strided,
    TileEpilogue,
    TileOp,
    blocking_for,
    pack_const_a,
    pack_const_b,
    render_gemm,
)
from smelt.codegen.registry import register
from smelt.ir.graph import Graph, Node
from smelt.schedule.gemm import GemmSchedule


# ------------------------------------------------------------------------------------------
# ONNX Gemm
# ------------------------------------------------------------------------------------------
def _schedule(node: Node) -> GemmSchedule:
    """The schedule stage's decisions for this node (schedule/gemm.py: every Gemm and MatMul)."""
    s = node.schedule
    assert isinstance(s, GemmSchedule), f"{node.op} {node.name}: no GemmSchedule (the schedule stage did not run)"
    return s


def _f32(g: Graph, name: str) -> bool:
    v = g.values[name]
    return v.dtype is not None and np.dtype(v.dtype) == np.float32


def _shape(g: Graph, name: str) -> tuple[int, ...]:
    return tuple(int(d) for d in g.values[name].shape)


def _gemm_c_kind(c_shape: tuple[int, ...], m: int, n: int) -> str | None:
    if int(np.prod(c_shape, dtype=np.int64)) == 1:
        return "scalar"
    if len(c_shape) == 1:
        return "col" if c_shape[0] == n else None
    if len(c_shape) == 2:
        cm, cn = c_shape
        if (cm, cn) == (m, n):
            return "full"
        if cm == 1 and cn == n:
            return "col"
        if cm == m and cn == 1:
            return "row"
    return None


def _check_gemm(node: Node, g: Graph) -> str | None:
    ins = node.present_inputs()
    if len(node.inputs) < 2 or not node.inputs[0] or not node.inputs[1]:
        return "Gemm needs A and B"
    for name in ins + [node.outputs[0]]:
        if not _f32(g, name):
            return f"native Gemm is float32 only ({name!r} is {np.dtype(g.values[name].dtype).name})"
    a, b = _shape(g, node.inputs[0]), _shape(g, node.inputs[1])
    if len(a) != 2 or len(b) != 2:
        return "Gemm needs 2-D A and B"
    m, k = (a[1], a[0]) if node.attr("transA", 0) else a
    k2, n = (b[1], b[0]) if node.attr("transB", 0) else b
    if k != k2:
        return f"Gemm inner dimensions differ ({k} vs {k2})"
    if k == 0:
        return "Gemm with K == 0"
    if m == 0 or n == 0:
        return "Gemm of an empty tensor"
    if len(node.inputs) > 2 and node.inputs[2] and float(node.attr("beta", 1.0)) != 0.0:
        if _gemm_c_kind(_shape(g, node.inputs[2]), m, n) is None:
            return f"Gemm C of shape {_shape(g, node.inputs[2])} does not broadcast to ({m}, {n})"
    return None


@register("Gemm", versions=(9, 11, 13), check=_check_gemm, name="f32_gemm")
def emit_gemm(node: Node, g: Graph, em: BlockEmitter) -> None:
    a_name, b_name = node.inputs[0], node.inputs[1]
    ta, tb = int(node.attr("transA", 0)), int(node.attr("transB", 0))
    alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))
    a_shape, b_shape = _shape(g, a_name), _shape(g, b_name)
    m, k = (a_shape[1], a_shape[0]) if ta else a_shape
    n = b_shape[0] if tb else b_shape[1]
    # a shape class's GEMM: the same blocking for every M (no matrix-vector special case)
    blk = blocking_for(em.target, None if _schedule(node).runtime_shape else m, n, 1, em.n_threads)
    y = node.outputs[0]
    ops: list[TileOp] = []
    if alpha != 1.0:
        ops.append(TileScale(alpha))
    c_name = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
    if c_name is not None and beta != 0.0:
        kind = _gemm_c_kind(_shape(g, c_name), m, n)
        c_const = g.const(c_name)
        if c_const is not None:
            cc = np.asarray(c_const, np.float32)
            if beta != 1.0:
                cc = (np.float32(beta) * cc).astype(np.float32)
            ptr = em.weight(cc.reshape(-1))
            ops.append(TileOperand("Add", ptr, kind))
        else:
            ops.append(TileOperand("Add", em.ptr(c_name), kind, scale=None if beta == 1.0 else beta))
    ep = TileEpilogue(ops, node, channel="col")
    b_const = g.const(b_name)
    if b_const is not None:
        bm = np.asarray(b_const, np.float32)
        bm = bm.T if tb else bm
        b_op: object = ConstPacked(em.weight(pack_const_b(bm, blk.nr), key=f"gemm_b:{b_name}:{tb}:{blk.tag}"))
    else:
        b_op = Strided(em.ptr(b_name), 1, k) if tb else Strided(em.ptr(b_name), n, 1)
    a_const = g.const(a_name)
    if a_const is not None:
        am = np.asarray(a_const, np.float32)
        am = am.T if ta else am
        a_op: ConstPacked | Strided = ConstPacked(em.weight(pack_const_a(am, blk.mr)))
    else:
        a_op = Strided(em.ptr(a_name), 1, m) if ta else Strided(em.ptr(a_name), k, 1)
    p = GemmProblem(m, n, k, a_op, b_op, em.ptr(y), n, ep, **_schedule(node).problem_args(), name="f32_gemm",
                    doc=f"Gemm transA={ta} transB={tb} alpha={alpha!r} beta={beta!r}")
    em.schedule(algorithm="BLIS-style GEMM",
                layout=f"row-major{' A^T' if ta else ''}{' B^T' if tb else ''}"
                       f"{'; B packed [N/NR][K][NR] at compile time' if b_const is not None else ''}")
    render_gemm(em, p, blk)


# ------------------------------------------------------------------------------------------
# ONNX MatMul (numpy semantics: 1-D promotion, batch broadcasting)
# ------------------------------------------------------------------------------------------
def _check_matmul(node: Node, g: Graph) -> str | None:
    a, b, y = node.inputs[0], node.inputs[1], node.outputs[0]
    for name in (a, b, y):
        if not _f32(g, name):
            return f"native MatMul is float32 only ({name!r} is {np.dtype(g.values[name].dtype).name})"
    sa, sb = _shape(g, a), _shape(g, b)
    if not sa or not sb:
        return "MatMul of a scalar"
    ka = sa[-1]
    kb = sb[0] if len(sb) == 1 else sb[-2]
    if ka != kb:
        return f"MatMul inner dimensions differ ({ka} vs {kb})"
    if ka == 0:
        return "MatMul with K == 0"
    if 0 in sa or 0 in sb or 0 in _shape(g, y):  # nothing to compute; the fallback returns the empty result
        return "MatMul of an empty tensor"
    try:
        np.broadcast_shapes(sa[:-2], sb[:-2])
    except ValueError:
        return f"MatMul batch dimensions {sa[:-2]} and {sb[:-2]} do not broadcast"
    return None


def _batch_strides(shape: Sequence[int], out: Sequence[int], mat: int) -> list[int]:
    """Per output batch dim, the operand's element stride (0 where broadcast)."""
    rank = len(out)
    padded = [1] * (rank - len(shape)) + list(shape)
    strides = [0] * rank
    acc = mat
    for d in range(rank - 1, -1, -1):
        strides[d] = acc if padded[d] != 1 else 0
        acc *= padded[d]
    return strides


@register("MatMul", versions=(1, 9, 13), check=_check_matmul, name="f32_matmul")
def emit_matmul(node: Node, g: Graph, em: BlockEmitter) -> None:
    a_name, b_name, y = node.inputs[0], node.inputs[1], node.outputs[0]
    sa, sb = _shape(g, a_name), _shape(g, b_name)
    a_vec, b_vec = len(sa) == 1, len(sb) == 1
    sa2 = (1, sa[0]) if a_vec else sa
    sb2 = (sb[0], 1) if b_vec else sb
    m, k = sa2[-2], sa2[-1]
    n = sb2[-1]
    batch = tuple(int(d) for d in np.broadcast_shapes(sa2[:-2], sb2[:-2]))
    items = int(np.prod(batch, dtype=np.int64)) if batch else 1
    blk = blocking_for(em.target, None if _schedule(node).runtime_shape else m, n, items, em.n_threads)
    a_bs = _batch_strides(sa2[:-2], batch, m * k)
    b_bs = _batch_strides(sb2[:-2], batch, k * n)
    b_const = g.const(b_name)
    a_const = g.const(a_name)
    channel = "row" if b_vec else "col"
    row_mod = 0
    # B shared by every batch and A holding every batch contiguously: one GEMM with M*batch rows
    if items > 1 and not any(b_bs) and a_bs == _batch_strides(batch, batch, m * k):
        if channel == "row":
            row_mod = m
        m, items, batch, a_bs, b_bs = m * items, 1, (), [], []
    ep = TileEpilogue([], node, row_mod=row_mod, channel=channel)
    # constant operands: one packed copy per distinct batch index of the operand
    if b_const is not None:
        bm = np.asarray(b_const, np.float32).reshape((-1, k, n) if not b_vec else (1, k, 1))
        packed = np.stack([pack_const_b(x, blk.nr) for x in bm])
        b_op: object = ConstPacked(em.weight(packed, key=f"matmul_b:{b_name}:{blk.tag}"))
        b_item_stride = packed[0].size
    else:
        b_op = Strided(em.ptr(b_name), n, 1)
        b_item_stride = k * n
    if a_const is not None:
        am = np.asarray(a_const, np.float32).reshape(-1, m, k)
        packed_a = np.stack([pack_const_a(x, blk.mr) for x in am])
        a_op: ConstPacked | Strided = ConstPacked(em.weight(packed_a))
        a_item_stride = packed_a[0].size
    else:
        a_op = Strided(em.ptr(a_name), k, 1)
        a_item_stride = m * k
    item_code = f"const long ao = 0, bo = 0, co = it * {m * n}L, grow0 = 0;"
    if items > 1:
        parts = ["long ao = 0, bo = 0, rem = it;"]
        for d in range(len(batch) - 1, -1, -1):
            sub = []
            if a_bs[d]:
                sub.append(f"ao += ix * {a_bs[d] // (m * k) * a_item_stride}L;")
            if b_bs[d]:
                sub.append(f"bo += ix * {b_bs[d] // (k * n) * b_item_stride}L;")
            if sub:
                parts.append(f"{{ const long ix = rem % {batch[d]}; {' '.join(sub)} }}")
            parts.append(f"rem /= {batch[d]};")
        parts.append(f"const long co = it * {m * n}L, grow0 = 0; (void)rem;")
        item_code = "\n".join(parts)
    p = GemmProblem(m, n, k, a_op, b_op, em.ptr(y), n, ep, **_schedule(node).problem_args(), items=items, item_code=item_code,
                    name="f32_matmul", doc=f"MatMul {list(sa)} x {list(sb)}")
    em.schedule(algorithm="BLIS-style GEMM",
                layout="row-major" + ("; constant B packed [N/NR][K][NR] at compile time"
                                      if b_const is not None else ""))
    render_gemm(em, p, blk)


