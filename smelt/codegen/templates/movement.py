"""Data-movement templates: reshape-like copies, Transpose, Concat.

Reshape, Flatten, Squeeze and Unsqueeze keep the bytes and change only the shape, so they are
a parallel memcpy (their shape operands are constants after folding). Transpose is a loop nest
over the output with the permuted input strides, or, where the output's innermost dimension is
strided in the input and another is the input's innermost (a matrix transpose: attention's K^T,
NHWC <-> NCHW), square tiles of the two (``_emit_tiled_transpose``); Concat copies each input's
contiguous runs into its slice of the output.
"""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import BlockEmitter
from smelt.codegen.kernels.isa import vector_isa
from smelt.codegen.kernels.loops import copy_step, work_range
from smelt.codegen.registry import blocked_concat_reason, register
from smelt.ir.graph import Graph, Node
from smelt.ir.types import has_storage_type

RESHAPES = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")


def _native(g: Graph, name: str) -> bool:
    """Movement only copies elements: float16 moves as its bits (a uint16_t)."""
    return has_storage_type(g.values[name].dtype)


def _check_reshape(node: Node, g: Graph) -> str | None:
    x, y = node.inputs[0], node.outputs[0]
    if not _native(g, x) or g.values[x].size != g.values[y].size:
        return "reshape needs a native dtype and equal element counts"
    if g.values[y].dtype != g.values[x].dtype:
        return "reshape output dtype differs from its input's"
    # Reshape's shape and (opset >= 13) Squeeze/Unsqueeze's axes: the output shape must come
    # from a constant, not only from a declared output shape the run-time operand may contradict
    operands = [i for i in node.inputs[1:] if i]
    if any(g.values[i].const is None for i in operands):
        return f"{node.op}'s shape/axes operand is known only at run time"
    return None


@register(RESHAPES, check=_check_reshape, name="reshape_copy")
def emit_reshape(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, y = node.inputs[0], node.outputs[0]
    em.step(copy_step(em, em.ptr(x), em.ptr(y), g.values[y].nbytes))


def _check_transpose(node: Node, g: Graph) -> str | None:
    return None if _native(g, node.inputs[0]) else "Transpose needs a native dtype"


@register("Transpose", check=_check_transpose, name="transpose")
def emit_transpose(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, y = node.inputs[0], node.outputs[0]
    in_shape = list(g.values[x].shape)
    rank = len(in_shape)
    perm = list(node.attr("perm") or list(range(rank))[::-1])
    out_shape = [in_shape[p] for p in perm]
    in_strides = [int(np.prod(in_shape[d + 1:], dtype=np.int64)) for d in range(rank)]
    src_strides = [in_strides[p] for p in perm]
    # drop unit dims; iterate the output row-major
    dims = [(out_shape[d], src_strides[d]) for d in range(rank) if out_shape[d] != 1] or [(1, 0)]
    total = int(np.prod(out_shape, dtype=np.int64)) if rank else 1
    outer, inner = dims[:-1], dims[-1]
    k = next((d for d, (_, st) in enumerate(outer) if st == 1), None)
    if inner[1] != 1 and k is not None:
        _emit_tiled_transpose(node, g, em, dims, k)
        return
    rows = int(np.prod([d for d, _ in outer], dtype=np.int64)) if outer else 1
    # split or serial: a literal condition, the same code either way (kernels/loops.work_range)
    body = [f"long rb = 0, re = tid == 0 ? {rows} : 0;",
            f"if ({int(total >= (1 << 15))}) smelt_range({rows}, tid, nt, &rb, &re);"]
    body.append("for (long r = rb; r < re; ++r) {")
    body.append("    long rem = r, src = 0;")
    for d, s in reversed(outer):
        body.append(f"    src += (rem % {d}) * {s}; rem /= {d};")
    body.append(f"    for (long i = 0; i < {inner[0]}; ++i) Y[r * {inner[0]} + i] = X[src + i * {inner[1]}];")
    body.append("}")
    em.step(f"const __typeof__(*{em.ptr(x)}) *restrict X = {em.ptr(x)};\n"
            f"__typeof__(*{em.ptr(y)}) *restrict Y = (void *){em.ptr(y)};\n" + "\n".join(body))


def _emit_tiled_transpose(node: Node, g: Graph, em: BlockEmitter, dims: list[tuple[int, int]], k: int) -> None:
    """Transpose whose output dims (unit dims dropped, with their input strides) ``dims`` end in
    ``I`` (input stride ``sI`` != 1) and hold at ``k`` the input's innermost ``J`` (stride 1): for
    each index of the other dims, the J x I matrix moves in B x B tiles, read along J and
    written along I, so both sides stay in cache; float32 tiles of one vector's lanes are
    transposed in registers (``f32_transpose``, csrc/smelt_vec.h), other tiles and the ragged
    edges element by element. The loop nest read the input with a stride of ``sI`` in its
    innermost loop: a Whisper encoder's K^T ([6, 400, 64] floats) took 95 us, 6.5 GB/s."""
    x, y = node.inputs[0], node.outputs[0]
    sizes = [d for d, _ in dims]
    out_strides = [int(np.prod(sizes[d + 1:], dtype=np.int64)) for d in range(len(sizes))]
    (n_j, _), (n_i, s_i) = dims[k], dims[-1]
    ysj = out_strides[k]
    rest = [(d, st, out_strides[i]) for i, (d, st) in enumerate(dims[:-1]) if i != k]
    vx = vector_isa(em.target)
    # the choices are the dtype's and the ISA's, never the sizes': shapes that differ only in
    # sizes keep one structure (one library for a shape class: codegen/shape_slots.py); a side
    # shorter than a tile takes the element loop at run time
    vector = np.dtype(g.values[x].dtype) == np.float32 and vx.vector and vx.has("f32_transpose")
    b = vx.lanes if vector else 16
    n_jt = -(-n_j // b)
    items = int(np.prod([d for d, _, _ in rest], dtype=np.int64)) * n_jt
    lines = [f"const __typeof__(*{em.ptr(x)}) *restrict X = {em.ptr(x)};",
             f"__typeof__(*{em.ptr(y)}) *restrict Y = (void *){em.ptr(y)};",
             work_range(items, g.values[y].size >= (1 << 15)),
             "for (long it = wb; it < we; ++it) {",
             f"    const long j0 = (it % {n_jt}) * {b}, jn = SMELT_MIN({b}L, {n_j} - j0);",
             f"    long rem = it / {n_jt}, src = j0, dst = j0 * {ysj};"]
    for d, st, ost in reversed(rest):
        lines.append(f"    src += (rem % {d}) * {st}; dst += (rem % {d}) * {ost}; rem /= {d};")
    lines.append("    long i0 = 0;")
    if vector:
        tile = vx.x("f32_transpose", src=f"(const float *)X + src + i0 * {s_i}", ss=str(s_i),
                    dst="(float *)Y + dst + i0", ds=str(ysj))
        lines.append(f"    if (jn == {b}) for (; i0 + {b} <= {n_i}; i0 += {b}) {tile}")
    lines += [f"    for (; i0 < {n_i}; i0 += {b}) {{",
              f"        const long in_ = SMELT_MIN({b}L, {n_i} - i0);",
              "        for (long jj = 0; jj < jn; ++jj)",
              f"            for (long ii = 0; ii < in_; ++ii) Y[dst + jj * {ysj} + i0 + ii] = X[src + jj + (i0 + ii) * {s_i}];",
              "    }",
              "}"]
    em.step("\n".join(lines), doc=f"Transpose in {b}x{b} tiles of a {n_j}x{n_i} matrix"
            + (" (in registers)" if vector else ""))


def _check_concat(node: Node, g: Graph) -> str | None:
    ins = node.present_inputs()
    if not ins or any(not _native(g, i) for i in ins):
        return "Concat needs native dtypes"
    return blocked_concat_reason(node, g)


@register("Concat", check=_check_concat, name="concat", blocked=True)
def emit_concat(node: Node, g: Graph, em: BlockEmitter) -> None:
    y = node.outputs[0]
    out_shape = list(g.values[y].shape)
    rank = len(out_shape)
    axis = node.attr("axis", 0)
    axis = axis + rank if axis < 0 else axis
    item = np.dtype(g.values[y].dtype).itemsize
    outer = int(np.prod(out_shape[:axis], dtype=np.int64))
    inner = int(np.prod(out_shape[axis + 1:], dtype=np.int64))
    out_run = out_shape[axis] * inner * item
    parts, slices, offset = [], [], 0
    for name in node.present_inputs():
        run = g.values[name].shape[axis] * inner * item
        if run:
            parts.append((em.ptr(name), run, offset))
        slices.append((name, offset))
        offset += run
    offsets = em.plan.arena_offsets
    if y in offsets and all(offsets.get(name) == offsets[y] + off for name, off in slices):
        # every producer wrote its slice in place (codegen/concat_views.py): nothing to copy
        em.schedule(algorithm="view: inputs written in place by their producers")
        return
    total = outer * len(parts)
    lines = ["long b, e;",
             f"smelt_range({total}, tid, nt, &b, &e);" if outer * out_run >= (1 << 16) else
             f"if (tid == 0) {{ b = 0; e = {total}; }} else {{ b = e = 0; }}",
             f"char *Y = (char *){em.ptr(y)};",
             "for (long t = b; t < e; ++t) {",
             f"    long o = t / {max(1, len(parts))}, k = t % {max(1, len(parts))};",
             "    switch (k) {"]
    for k, (ptr, run, off) in enumerate(parts):
        lines.append(f"    case {k}: memcpy(Y + o * {out_run} + {off}, (const char *){ptr} + o * {run}, {run}); break;")
    lines += ["    default: break;", "    }", "}"]
    em.step("\n".join(lines))
