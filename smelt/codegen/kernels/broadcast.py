"""Loop nests for element-wise ops with numpy/ONNX multidirectional broadcasting.

The output's dimensions are coalesced wherever every operand is contiguous across the seam
(or broadcast across both dims), leaving an outer "row" space and one inner dimension. Each
thread takes a range of rows (or, when there are fewer rows than threads, a range of the inner
dimension); per row, operand offsets are computed once, and the inner loop has constant
strides (1 or 0) that the C compiler vectorizes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

# Below this many output elements a step runs on thread 0 alone: a barrier costs more.
PARALLEL_MIN_ELEMS = 1 << 15


def broadcast_strides(in_shape: Sequence[int], out_shape: Sequence[int]) -> list[int]:
    """Element strides of an operand over the output's dimensions (0 where broadcast)."""
    rank = len(out_shape)
    padded = [1] * (rank - len(in_shape)) + list(in_shape)
    strides = [0] * rank
    acc = 1
    for d in range(rank - 1, -1, -1):
        strides[d] = acc if padded[d] != 1 else 0
        if padded[d] != 1 and padded[d] != out_shape[d]:
            raise ValueError(f"shape {tuple(in_shape)} does not broadcast to {tuple(out_shape)}")
        acc *= padded[d]
    return strides


def coalesce(out_shape: Sequence[int], strides: list[list[int]]) -> tuple[list[int], list[list[int]]]:
    """Merge adjacent output dims where every operand's strides allow it."""
    dims = [int(d) for d in out_shape] or [1]
    st = [list(s) or [0] for s in strides]
    if not out_shape:
        st = [[0] for _ in strides]
    out_dims, out_st = [dims[0]], [[s[0]] for s in st]
    for d in range(1, len(dims)):
        ok = all(s[d - 1] == s[d] * dims[d] for s in st)
        if ok:
            out_dims[-1] *= dims[d]
            for k, s in enumerate(st):
                out_st[k][-1] = s[d]
        else:
            out_dims.append(dims[d])
            for k, s in enumerate(st):
                out_st[k].append(s[d])
    # drop size-1 dims (they contribute nothing)
    keep = [i for i, d in enumerate(out_dims) if d != 1] or [len(out_dims) - 1]
    return [out_dims[i] for i in keep], [[s[i] for i in keep] for s in out_st]


def elementwise_loop(out_shape: Sequence[int], in_shapes: Sequence[Sequence[int]],
                     body: Callable[[list[str], str], str]) -> str:
    """C statements for out[i] = f(in_k[off_k]) over the broadcast iteration space.

    ``body(operand_index_exprs, out_index_expr)`` returns the statement of the inner loop.
    ``tid`` and ``nt`` must be in scope.
    """
    total = int(np.prod(out_shape, dtype=np.int64)) if len(out_shape) else 1
    strides = [broadcast_strides(s, out_shape) for s in in_shapes]
    dims, cst = coalesce(out_shape, [_out_strides(out_shape)] + strides)
    out_st, in_st = cst[0], cst[1:]
    inner = dims[-1]
    outer = dims[:-1]
    rows = int(np.prod(outer, dtype=np.int64)) if outer else 1
    # serial, rows split, or the inner run split: literal conditions (gcc folds them), so the code
    # is the same whichever way the sizes decide (loops.work_range)
    serial, by_rows = total < PARALLEL_MIN_ELEMS, rows >= 2 * 2
    rng = (f"long rb = 0, re = {rows}, ib = 0, ie = {inner}; "
           f"if ({int(serial)}) {{ if (tid != 0) re = 0; }} "
           f"else if ({int(by_rows)}) smelt_range({rows}, tid, nt, &rb, &re); "
           f"else smelt_range({inner}, tid, nt, &ib, &ie);")
    lines = [rng]
    lines.append("for (long r = rb; r < re; ++r) {")
    # decompose r over the outer dims (row-major), accumulating each operand's offset
    offs = [f"long o{k} = 0;" for k in range(len(in_shapes))] + ["long oo = 0;"]
    lines.append("    " + " ".join(offs))
    if outer:
        lines.append("    long rem = r;")
        for d in range(len(outer) - 1, -1, -1):
            lines.append(f"    {{ long ix = rem % {outer[d]}; rem /= {outer[d]};")
            parts = [f"o{k} += ix * {in_st[k][d]};" for k in range(len(in_shapes)) if in_st[k][d]]
            parts.append(f"oo += ix * {out_st[d]};")
            lines.append("      " + " ".join(parts) + " }")
    lines.append("    for (long i = ib; i < ie; ++i) {")
    idx = [f"o{k} + i * {in_st[k][-1]}" if in_st[k][-1] else f"o{k}" for k in range(len(in_shapes))]
    lines.append("        " + body(idx, f"oo + i * {out_st[-1]}" if out_st[-1] != 1 else "oo + i"))
    lines.append("    }")
    lines.append("}")
    return "\n".join(lines)


def _out_strides(shape: Sequence[int]) -> list[int]:
    st, acc = [], 1
    for d in reversed(list(shape)):
        st.append(acc)
        acc *= int(d)
    return list(reversed(st))
