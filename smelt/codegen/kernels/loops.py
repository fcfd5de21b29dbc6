"""Loop and step plumbing every template renders with: a thread's share of a range, flat-index
decomposition, a parallel copy, and the step wrapper (``emit_kernel``) with gcc's vector-width
attribute."""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import BlockEmitter
from smelt.codegen.kernels.isa import vector_isa
from smelt.ir.graph import Graph
from smelt.ir.types import c_type

# below this many bytes a copy runs on thread 0 alone
PARALLEL_COPY_BYTES = 1 << 16


def dtype_name(g: Graph, name: str) -> str:
    return np.dtype(g.values[name].dtype).name


def fn_suffix(name: str, dtype: str) -> str:
    """libm function for the element type: expf for float32, exp for float64."""
    return f"{name}f" if dtype == "float32" else name


def unsigned_of(dtype: str) -> str:
    return {"int8": "uint8_t", "int16": "uint16_t", "int32": "uint32_t", "int64": "uint64_t"}.get(
        dtype, c_type(dtype))


def work_range(total: int, parallel: bool, lo: str = "wb", hi: str = "we") -> str:
    """C declaring [lo, hi): this thread's share of ``total`` items (all of it on tid 0 if serial).

    The choice is a literal in a C condition, not two spellings: gcc folds it, and the code is
    the same whichever way a size decides it, so shapes that differ only in sizes can share one
    library (``codegen.shape_slots``)."""
    return (f"long {lo} = 0, {hi} = tid == 0 ? {total} : 0; "
            f"if ({int(parallel)}) smelt_range({total}, tid, nt, &{lo}, &{hi});")


def decompose(index: str, dims: list[tuple[int, int]], acc: str, indent: str = "    ") -> list[str]:
    """C lines adding to ``acc`` the offset of row-major ``index`` over (size, stride) ``dims``."""
    lines = []
    if not dims:
        return lines
    if len(dims) == 1:
        size, stride = dims[0]
        return [f"{indent}{acc} += {index} * {stride};"] if stride else []
    lines.append(f"{indent}{{ long rem_ = {index};")
    for k, (size, stride) in enumerate(reversed(dims)):
        last = k == len(dims) - 1
        ix = "rem_" if last else f"(rem_ % {size})"
        if stride:
            lines.append(f"{indent}  {acc} += {ix} * {stride};")
        if not last:
            lines.append(f"{indent}  rem_ /= {size};")
    lines.append(f"{indent}}}")
    return lines


def wide_vectors(em: BlockEmitter) -> str:
    """Function attribute asking gcc for the target's full vector width where it is wider than the
    256 bits gcc prefers (512 on AVX-512): the ISA description's."""
    return vector_isa(em.target).fn_attributes()


def emit_kernel(em: BlockEmitter, base: str, body: str, doc: str = "", wide: bool = False) -> None:
    """Render ``body`` as the node's step, a function named for ``base`` (``BlockEmitter.step``:
    shared by every node whose body differs only in its buffers).

    Inside ``body`` the step's names are in scope (``tid``, ``nt`` and what ``em.ptr`` and
    ``em.scratch`` expressions refer to).
    """
    em.step(body, name=base, doc=doc, attributes=wide_vectors(em) if wide else "")


def inner_chunks(rows: int, inner: int, n_threads: int) -> int:
    """How many chunks to cut each row of ``inner`` elements into, so all threads get work."""
    if rows >= 4 * n_threads or inner < 64:
        return 1
    return max(1, min(-(-inner // 32), -(-4 * n_threads // rows)))


def copy_step(em: BlockEmitter, src: str, dst: str, nbytes: int) -> str:
    """A (parallel, when large) memcpy of ``nbytes`` from ``src`` to ``dst`` pointer expressions."""
    # serial or split: a literal condition, so the code does not change with the size (see
    # work_range)
    lines = 64
    return (f"long b = 0, e = tid == 0 ? {-(-nbytes // lines)} : 0;\n"
            f"if ({int(nbytes >= PARALLEL_COPY_BYTES)}) smelt_range({-(-nbytes // lines)}, tid, nt, &b, &e);\n"
            f"long lo = b * {lines}, hi = SMELT_MIN(e * {lines}, {nbytes});\n"
            f"if (hi > lo) memcpy((char *){dst} + lo, (const char *){src} + lo, (size_t)(hi - lo));")
