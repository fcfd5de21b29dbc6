"""Templates that copy a tensor under a constant mask or reinterpret its bytes: Trilu, EyeLike,
Dropout (inference, or a ratio of 0), BitCast.

``trilu``: per row of the innermost matrix, the kept run is one memcpy and the rest zero bytes
(every dtype's zero is all-zero bits), rows split across threads. ``eyelike``: zeros with ones
on diagonal k. ``dropout_identity``: what onnxruntime computes when dropout is off (no
training_mode, or training with ratio 0): the input unchanged and a mask of all ones. A
training dropout with a nonzero ratio is random and stays with the fallback. ``bitcast``: the
bytes as they are, under the output's type (equal element widths).
"""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import BlockEmitter, c_literal
from smelt.codegen.kernels.broadcast import PARALLEL_MIN_ELEMS
from smelt.codegen.kernels.loops import copy_step, dtype_name, emit_kernel, work_range
from smelt.codegen.registry import register
from smelt.ir.graph import Graph, Node
from smelt.ir.types import has_c_type, has_storage_type


def _shape(g: Graph, name: str) -> list[int]:
    return [int(d) for d in g.values[name].shape]


def _native(node: Node, g: Graph, names: list[str]) -> str | None:
    """None when every value is natively held (these templates only move bytes: float16 too)."""
    for n in names:
        if not has_storage_type(g.values[n].dtype):
            return f"dtype {dtype_name(g, n)} has no native {node.op}"
    return None


def _const_input(node: Node, g: Graph, pos: int) -> np.ndarray | None | str:
    """The constant at optional input ``pos`` (None if absent), or a reason if computed."""
    if len(node.inputs) <= pos or not node.inputs[pos]:
        return None
    c = g.const(node.inputs[pos])
    return f"input {pos} of {node.op} is computed at run time" if c is None else np.asarray(c)


# -- Trilu -----------------------------------------------------------------------------------------

def _check_trilu(node: Node, g: Graph) -> str | None:
    x, y = node.inputs[0], node.outputs[0]
    why = _native(node, g, [x, y])
    if why:
        return why
    if len(_shape(g, x)) < 2:
        return "Trilu needs a rank of at least 2"
    if len(node.inputs) > 1 and node.inputs[1] and dtype_name(g, node.inputs[1]) != "int64":
        return "Trilu's k must be int64"
    return None


@register("Trilu", versions=(14,), check=_check_trilu, name="trilu")
def emit_trilu(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, y = node.inputs[0], node.outputs[0]
    shape = _shape(g, x)
    n, m = shape[-2], shape[-1]
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    item = np.dtype(g.values[x].dtype).itemsize
    k = _const_input(node, g, 1)
    # clamped: a k past either corner keeps everything or nothing, and i + k stays small
    if k is None:
        kk = "0"
    elif isinstance(k, str):  # known at run time
        kk = f"SMELT_MAX({-n - 1}L, SMELT_MIN({m + 1}L, (long){em.ptr(node.inputs[1])}[0]))"
    else:
        kk = str(int(np.clip(int(k.reshape(-1)[0]), -n - 1, m + 1)))
    upper = bool(node.attr("upper", 1))
    if rows == 0 or m == 0:
        return  # nothing to write
    # kept columns of row i: upper [max(0, i + k), m), lower [0, min(m, i + k + 1))
    keep = (f"long lo = SMELT_MAX(0L, SMELT_MIN((long){m}, i + kk)), hi = {m};" if upper else
            f"long lo = 0, hi = SMELT_MAX(0L, SMELT_MIN((long){m}, i + kk + 1));")
    body = "\n".join([
        f"const char *X = (const char *){em.ptr(x)};", f"char *Y = (char *){em.ptr(y)};",
        f"const long kk = {kk};",
        work_range(rows, rows * m >= PARALLEL_MIN_ELEMS),
        "for (long r = wb; r < we; ++r) {",
        f"    long i = r % {n};",
        f"    {keep}",
        f"    char *yr = Y + r * {m * item}L; const char *xr = X + r * {m * item}L;",
        f"    if (lo > 0) memset(yr, 0, (size_t)lo * {item});",
        f"    if (hi > lo) memcpy(yr + lo * {item}, xr + lo * {item}, (size_t)(hi - lo) * {item});",
        f"    if (hi < {m}) memset(yr + hi * {item}, 0, (size_t)({m} - hi) * {item});",
        "}"])
    emit_kernel(em, "trilu", body, f"Trilu {'upper' if upper else 'lower'} over {shape}")


# -- EyeLike ---------------------------------------------------------------------------------------

def _check_eyelike(node: Node, g: Graph) -> str | None:
    y = node.outputs[0]
    if not has_c_type(g.values[y].dtype):  # writes the literal 1 of the type
        return f"dtype {dtype_name(g, y)} has no native EyeLike"
    return None if len(_shape(g, y)) == 2 else "EyeLike needs a 2-D input"


@register("EyeLike", versions=(9, 22), check=_check_eyelike, name="eyelike")
def emit_eyelike(node: Node, g: Graph, em: BlockEmitter) -> None:
    y = node.outputs[0]
    n, m = _shape(g, y)
    k = int(np.clip(int(node.attr("k", 0)), -n - 1, m + 1))  # past a corner: no diagonal at all
    dt = dtype_name(g, y)
    item = np.dtype(dt).itemsize
    body = "\n".join([
        f"__typeof__(*{em.ptr(y)}) *restrict Y = (void *){em.ptr(y)};",
        "if (tid == 0) {",
        f"    memset((void *)Y, 0, {n * m * item});",
        f"    for (long i = SMELT_MAX(0L, {-k}L); i < {n}L && i + ({k}L) < {m}L; ++i) Y[i * {m}L + i + ({k}L)] = {c_literal(1, dt)};",
        "}"])
    emit_kernel(em, f"eyelike_{dt}", body, f"EyeLike {[n, m]} k={k}")


# -- Dropout ---------------------------------------------------------------------------------------

def _check_dropout(node: Node, g: Graph) -> str | None:
    x, y = node.inputs[0], node.outputs[0]
    outs = [o for o in node.outputs if o]
    why = _native(node, g, [x] + outs)
    if why:
        return why
    if g.values[x].dtype != g.values[y].dtype:
        return "Dropout output dtype differs from its input's"
    training = _const_input(node, g, 2)
    if isinstance(training, str):
        return training
    if training is not None and bool(training.reshape(-1)[0]):
        ratio = _const_input(node, g, 1)
        if ratio is None or isinstance(ratio, str) or float(ratio.reshape(-1)[0]) != 0.0:
            return "training Dropout with a nonzero (or run-time) ratio is random"
    return None


@register("Dropout", versions=(7, 10, 12, 13, 22), check=_check_dropout, name="dropout_identity")
def emit_dropout(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, y = node.inputs[0], node.outputs[0]
    if g.values[y].nbytes:
        em.step(copy_step(em, em.ptr(x), em.ptr(y), g.values[y].nbytes))
    if len(node.outputs) > 1 and node.outputs[1] and g.values[node.outputs[1]].size:
        mask = node.outputs[1]
        dt, total = dtype_name(g, mask), g.values[mask].size
        em.step(f"__typeof__(*{em.ptr(mask)}) *restrict M = (void *){em.ptr(mask)};\n"
                f"{work_range(total, total >= PARALLEL_MIN_ELEMS)}\n"
                f"for (long i = wb; i < we; ++i) M[i] = {c_literal(1, dt)};")


# -- BitCast ---------------------------------------------------------------------------------------

def _check_bitcast(node: Node, g: Graph) -> str | None:
    x, y = node.inputs[0], node.outputs[0]
    why = _native(node, g, [x, y])
    if why:
        return why
    if g.values[x].nbytes != g.values[y].nbytes:
        return "BitCast between element widths that differ"
    return None


@register("BitCast", versions=(26,), check=_check_bitcast, name="bitcast")
def emit_bitcast(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, y = node.inputs[0], node.outputs[0]
    if g.values[y].nbytes:
        em.step(copy_step(em, em.ptr(x), em.ptr(y), g.values[y].nbytes))
