"""TensorScatter (opset 24): a key/value cache updated in place of a copy.

Template ``tensor_scatter``: the output is ``past_cache`` with, for every batch ``b`` and every
prefix of the dims before ``axis``, the ``update``'s ``L`` slices along ``axis`` written at
positions ``write_indices[b] + s`` (mode "linear") or ``(write_indices[b] + s) % max_len``
(mode "circular"); a missing ``write_indices`` is all zeros. Two steps: a parallel copy of the
cache, then the slices, split over (prefix, s) pairs across threads (each pair writes its own
slice: the positions of one prefix are distinct, ``L <= max_len``). Every slice is a run of
``prod(dims after axis)`` elements moved by memcpy, so any dtype native kernels hold (float16
included) is served. A negative write index, or a linear write running past the cache's end,
makes the inference fail (SMELT_FAIL), as onnxruntime refuses them; a circular index may be any
non-negative number (it wraps, as in onnxruntime).
"""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import BlockEmitter
from smelt.codegen.kernels.loops import copy_step, dtype_name, emit_kernel, work_range
from smelt.codegen.registry import register
from smelt.ir.graph import Graph, Node
from smelt.ir.types import has_storage_type

MODES = ("linear", "circular")
# below this many bytes moved the slices are written by thread 0 alone
PARALLEL_MIN_BYTES = 1 << 16


def _shape(g: Graph, name: str) -> list[int]:
    return [int(d) for d in g.values[name].shape]


def _mode(node: Node) -> str:
    return str(node.attr("mode", "linear"))


def _check(node: Node, g: Graph) -> str | None:
    cache, update = node.inputs[0], node.inputs[1]
    y = node.outputs[0]
    dt = g.values[cache].dtype
    if not has_storage_type(dt) or g.values[update].dtype != dt or g.values[y].dtype != dt:
        return f"TensorScatter of {dtype_name(g, cache)} (native: one dtype native kernels hold)"
    if _mode(node) not in MODES:
        return f"mode {_mode(node)!r}"
    cs, us = _shape(g, cache), _shape(g, update)
    rank = len(cs)
    axis = int(node.attr("axis", -2))
    if rank < 2 or not -rank <= axis < rank or axis % rank == 0:
        return f"axis {axis} of a rank-{rank} cache (the batch is dim 0, the axis one after it)"
    axis %= rank
    if len(us) != rank or any(u != c for k, (u, c) in enumerate(zip(us, cs, strict=True)) if k != axis) \
            or us[axis] > cs[axis]:
        return f"update {us} does not fit cache {cs} along axis {axis}"
    if len(node.inputs) > 2 and node.inputs[2]:
        wi = node.inputs[2]
        if dtype_name(g, wi) != "int64" or _shape(g, wi) != [cs[0]]:
            return "write_indices must be int64 of shape [batch]"
    return None


@register("TensorScatter", versions=(24,), check=_check, name="tensor_scatter")
def emit_tensor_scatter(node: Node, g: Graph, em: BlockEmitter) -> None:
    cache, update = node.inputs[0], node.inputs[1]
    wi = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else ""
    y = node.outputs[0]
    cs, us = _shape(g, cache), _shape(g, update)
    axis = int(node.attr("axis", -2)) % len(cs)
    circular = _mode(node) == "circular"
    if g.values[y].nbytes:
        em.step(copy_step(em, em.ptr(cache), em.ptr(y), g.values[y].nbytes))
    prefix = int(np.prod(cs[:axis], dtype=np.int64))
    per_batch = prefix // cs[0]  # prefixes of one batch (dims 1 .. axis-1)
    slab = int(np.prod(cs[axis + 1:], dtype=np.int64)) * np.dtype(g.values[cache].dtype).itemsize
    length, max_len = us[axis], cs[axis]
    total = prefix * length
    if not total or not slab:
        return
    pos = "(w + s) % " + str(max_len) if circular else "w + s"
    lines = [
        f"const char *restrict U = (const char *){em.ptr(update)};",
        f"char *restrict Y = (char *){em.ptr(y)};",
        f"const int64_t *restrict W = {em.ptr(wi) if wi else 'NULL'}; (void)W;",
        work_range(total, total * slab >= PARALLEL_MIN_BYTES),
        "for (long q = wb; q < we; ++q) {",
        f"    const long p = q / {length}, s = q % {length}, b = p / {per_batch};",
        f"    const long w = {'(long)W[b]' if wi else '0'};",
        # a linear write must end inside the cache; a circular one wraps
        f"    if (w < 0 || {int(not circular)} && w + {length} > {max_len}) {{ SMELT_FAIL(); continue; }}  /* reported */",
        f"    memcpy(Y + (p * {max_len} + {pos}) * {slab}L, U + (p * {length} + s) * {slab}L, {slab});",
        "}",
    ]
    emit_kernel(em, "tensor_scatter", "\n".join(lines),
                f"TensorScatter {_mode(node)} of {us} into {cs} along axis {axis}")
