"""Shape-manipulating templates: Slice, Gather, Split, Pad, Expand, Tile, DepthToSpace,
SpaceToDepth, Cast, CastLike.

Template ``index_copy``: Slice, Split, Pad, Expand, Tile and Gather with constant indices are
all "out[i_0, .., i_r] = x[m_0(i_0), .., m_r(i_r)]" with a per-dim index map computed at
compile time (-1 = fill with the pad value); DepthToSpace and SpaceToDepth are the same copy
over a 6-D view of the output with permuted source strides. Maps that are affine are merged with their
neighbours where the strides allow; the remaining outer dims are offset tables; the innermost
dim is cut into at most eight segments (fill, memcpy, or a constant-stride loop), or else read
through an offset table. So a Slice of the last axis is one memcpy per row and a constant Pad
of H and W is fill / memcpy / fill per row, with no per-element index arithmetic.

``gather_rt``: Gather with run-time int32/int64 indices copies one slab per index; an index
outside [-n, n) is never read: the kernel calls SMELT_FAIL(), and the inference raises an error
naming the node (ONNX calls such an index an error, as onnxruntime does).

``cast``: element conversions whose C semantics equal ONNX's: from integer or bool types to
anything, float to float, and float to bool (x != 0). Float to integer is left to the fallback
(C leaves out-of-range and NaN conversions undefined).
"""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import BlockEmitter, c_literal
from smelt.codegen.kernels import half
from smelt.codegen.kernels.broadcast import PARALLEL_MIN_ELEMS, elementwise_loop
from smelt.codegen.kernels.loops import dtype_name, emit_kernel, inner_chunks, work_range
from smelt.codegen.registry import register
from smelt.ir.graph import Graph, Node
from smelt.ir.types import FLOAT_TYPES, c_type, has_c_type, has_storage_type

MAX_SEGMENTS = 8
FILL_SENTINEL = -(1 << 60)


def _strides(shape: list[int]) -> list[int]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= int(d)
    return out[::-1]


def _affine(offs: np.ndarray) -> tuple[int, int] | None:
    """(start, step) when ``offs`` is an arithmetic sequence without fills."""
    if (offs < 0).any():
        return None
    if offs.size == 1:
        return int(offs[0]), 0
    d = np.diff(offs)
    return (int(offs[0]), int(d[0])) if (d == d[0]).all() else None


def _segments(offs: np.ndarray) -> list[tuple] | None:
    """The innermost map as (kind, out_start, length, src_start, step) runs; None if too many."""
    n = offs.size
    # break wherever the fill state changes or the stride between neighbours changes
    segs: list[tuple] = []
    i = 0
    while i < n:
        if len(segs) >= MAX_SEGMENTS:
            return None
        if offs[i] < 0:
            fills = np.flatnonzero(offs[i:] >= 0)
            j = i + (int(fills[0]) if fills.size else n - i)
            segs.append(("fill", i, j - i, 0, 0))
            i = j
            continue
        if i + 1 < n and offs[i + 1] >= 0:
            st = int(offs[i + 1] - offs[i])
            rest = offs[i:]
            ok = (rest >= 0) & (rest == offs[i] + st * np.arange(rest.size))
            bad = np.flatnonzero(~ok)
            j = i + (int(bad[0]) if bad.size else rest.size)
            segs.append(("copy", i, j - i, int(offs[i]), st))
            i = j
        else:
            segs.append(("copy", i, 1, int(offs[i]), 0))
            i += 1
    return segs


def index_copy_code(em: BlockEmitter, x: str, y: str, dt: str, in_shape: list[int] | None,
                    out_shape: list[int], maps: list[np.ndarray], fill: str,
                    src_strides: list[int] | None = None) -> str:
    """C block computing out[i...] = x[sum_d maps[d][i_d] * stride_d] (-1 in a map: ``fill``).

    The strides are ``in_shape``'s row-major ones unless ``src_strides`` (one per output dim,
    e.g. permuted for a transposition) are given. Every thread runs the block.
    """
    t = c_type(dt)
    item = np.dtype(dt).itemsize if dt != "bool" else 1
    total = int(np.prod(out_shape, dtype=np.int64))
    in_st = src_strides if src_strides is not None else _strides(in_shape)
    base = 0
    dims: list[np.ndarray] = []
    for d, size in enumerate(out_shape):
        m = np.asarray(maps[d], np.int64).reshape(-1)
        assert m.size == size
        if size == 1:
            if m[0] < 0:
                return _fill_all(total, fill, t, y, em)
            base += int(m[0]) * in_st[d]
            continue
        dims.append(np.where(m >= 0, m * in_st[d], -1))
    if not dims:
        dims = [np.zeros(1, np.int64)]
    # merge neighbouring affine dims where the outer step equals the inner extent's stride
    merged: list[np.ndarray] = [dims[0]]
    for offs in dims[1:]:
        a, b = _affine(merged[-1]), _affine(offs)
        if a is not None and b is not None and a[1] == b[1] * offs.size:
            merged[-1] = (a[0] + b[0]) + b[1] * np.arange(merged[-1].size * offs.size, dtype=np.int64)
        else:
            merged.append(offs)
    *outer, last = merged
    inner = last.size
    rows = total // inner
    parallel = total >= PARALLEL_MIN_ELEMS
    nch = inner_chunks(rows, inner, em.n_threads) if parallel else 1
    cs = -(-inner // nch)
    L = ["{", f"const {t} *restrict X = {em.ptr(x)};", f"{t} *restrict Y = (void *){em.ptr(y)};",
         work_range(rows * nch, parallel),
         "for (long w = wb; w < we; ++w) {",
         f"    const long row = w / {nch}, i0 = (w % {nch}) * {cs}, i1 = SMELT_MIN({inner}, i0 + {cs});",
         f"    {t} *restrict yr = Y + row * {inner};",
         f"    long off = {base};"]
    may_fill = False
    if outer:
        L.append("    long rem = row;")
        for k in range(len(outer) - 1, -1, -1):
            offs = outer[k]
            idx = f"(rem % {offs.size})" if k else "rem"
            aff = _affine(offs)
            if aff is not None:
                L.append(f"    off += {aff[0]} + {idx} * {aff[1]};")
            else:
                may_fill |= bool((offs < 0).any())
                tab = em.weight(np.where(offs >= 0, offs, FILL_SENTINEL).astype(np.int64))
                L.append(f"    off += {tab}[{idx}];")
            if k:
                L.append(f"    rem /= {offs.size};")
    if may_fill:
        L.append(f"    if (off < 0) {{ for (long i = i0; i < i1; ++i) yr[i] = {fill}; continue; }}")
    L.append(f"    const {t} *restrict xr = X + off;")
    segs = _segments(last)
    if segs is None:
        tab = em.weight(last.astype(np.int64))
        if (last < 0).any():
            L.append(f"    for (long i = i0; i < i1; ++i) {{ const long s = {tab}[i]; yr[i] = s < 0 ? {fill} : xr[s]; }}")
        else:
            L.append(f"    for (long i = i0; i < i1; ++i) yr[i] = xr[{tab}[i]];")
    else:
        for kind, o0, n, s0, st in segs:
            lo, hi = f"SMELT_MAX(i0, {o0})", f"SMELT_MIN(i1, {o0 + n})"
            if kind == "fill":
                L.append(f"    for (long i = {lo}; i < {hi}; ++i) yr[i] = {fill};")
            elif st == 1 and n * item >= 64:
                L.append(f"    {{ const long lo = {lo}, hi = {hi}; if (hi > lo) "
                         f"memcpy(yr + lo, xr + ({s0 - o0}) + lo, (size_t)(hi - lo) * {item}); }}")
            else:
                L.append(f"    for (long i = {lo}; i < {hi}; ++i) yr[i] = xr[{s0} + (i - {o0}) * {st}];")
    L += ["}", "}"]
    return "\n".join(L)


def _fill_all(total: int, fill: str, t: str, y: str, em: BlockEmitter) -> str:
    return "\n".join(["{", f"{t} *restrict Y = (void *){em.ptr(y)};",
                      work_range(total, total >= PARALLEL_MIN_ELEMS),
                      f"for (long i = wb; i < we; ++i) Y[i] = {fill};", "}"])


def _shape(g: Graph, name: str) -> list[int]:
    return [int(d) for d in g.values[name].shape]


def _nonempty_native(node: Node, g: Graph, names: list[str]) -> str | None:
    """None when every value is non-empty and natively held (copies move float16 as its bits)."""
    for n in names:
        v = g.values[n]
        if not has_storage_type(v.dtype):
            return f"dtype {np.dtype(v.dtype).name} has no native {node.op}"
        if v.size == 0:
            return "empty tensor"
    return None


def _consts(node: Node, g: Graph, positions: list[int]) -> list[np.ndarray | None] | str:
    """Constant values of optional inputs at ``positions`` (None if absent); a reason if computed."""
    out: list[np.ndarray | None] = []
    for p in positions:
        if len(node.inputs) > p and node.inputs[p]:
            c = g.const(node.inputs[p])
            if c is None:
                return f"input {p} of {node.op} is computed at run time"
            out.append(np.asarray(c))
        else:
            out.append(None)
    return out


# -- Slice -----------------------------------------------------------------------------------------

def slice_maps(node: Node, g: Graph) -> list[np.ndarray] | str:
    in_shape = _shape(g, node.inputs[0])
    rank = len(in_shape)
    if node.attr("starts") is not None:  # opset < 10 form (upgraded models keep inputs)
        return "Slice with attributes"
    cs = _consts(node, g, [1, 2, 3, 4])
    if isinstance(cs, str):
        return cs
    starts, ends, axes, steps = cs
    starts, ends = starts.reshape(-1).tolist(), ends.reshape(-1).tolist()
    axes = list(range(len(starts))) if axes is None else axes.reshape(-1).tolist()
    steps = [1] * len(starts) if steps is None else steps.reshape(-1).tolist()
    if not len(starts) == len(ends) == len(axes) == len(steps):
        return "starts, ends, axes and steps differ in length"
    maps = [np.arange(d, dtype=np.int64) for d in in_shape]
    seen = set()
    for s, e, a, st in zip(starts, ends, axes, steps, strict=True):
        a = a + rank if a < 0 else a
        if not 0 <= a < rank or a in seen or st == 0:
            return "bad axes or zero step"
        seen.add(a)
        maps[a] = np.arange(in_shape[a], dtype=np.int64)[slice(int(s), int(e), int(st))]
    return maps


def _check_slice(node: Node, g: Graph) -> str | None:
    why = _nonempty_native(node, g, [node.inputs[0], node.outputs[0]])
    if why:
        return why
    maps = slice_maps(node, g)
    if isinstance(maps, str):
        return maps
    if [m.size for m in maps] != _shape(g, node.outputs[0]):
        return "inferred output shape disagrees with the slice arithmetic"
    return None


@register("Slice", versions=(10, 11, 13), check=_check_slice, name="slice")
def emit_slice(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, y = node.inputs[0], node.outputs[0]
    maps = slice_maps(node, g)
    assert not isinstance(maps, str)
    dt = dtype_name(g, x)
    code = index_copy_code(em, x, y, dt, _shape(g, x), _shape(g, y), maps, "0")
    emit_kernel(em, f"slice_{dt}", code, f"Slice {_shape(g, x)} -> {_shape(g, y)}")


# -- Split -----------------------------------------------------------------------------------------

def _check_split(node: Node, g: Graph) -> str | None:
    x = node.inputs[0]
    outs = [o for o in node.outputs if o]
    if len(outs) != len(node.outputs):
        return "omitted Split outputs"
    why = _nonempty_native(node, g, [x])
    if why:
        return why
    xs = _shape(g, x)
    axis = node.attr("axis", 0)
    if not -len(xs) <= axis < len(xs):
        return "axis out of range"
    axis = axis + len(xs) if axis < 0 else axis
    total = 0
    for o in outs:
        os_ = _shape(g, o)
        if len(os_) != len(xs) or any(a != b for d, (a, b) in enumerate(zip(os_, xs, strict=True)) if d != axis):
            return "output shapes do not match the input's"
        total += os_[axis]
    if total != xs[axis]:
        return "split sizes do not add up"
    return None


@register("Split", versions=(11, 13, 18), check=_check_split, name="split")
def emit_split(node: Node, g: Graph, em: BlockEmitter) -> None:
    x = node.inputs[0]
    xs = _shape(g, x)
    dt = dtype_name(g, x)
    axis = node.attr("axis", 0)
    axis = axis + len(xs) if axis < 0 else axis
    start, blocks = 0, []
    for o in node.outputs:
        os_ = _shape(g, o)
        n = os_[axis]
        if n:
            maps = [np.arange(d, dtype=np.int64) for d in xs]
            maps[axis] = np.arange(start, start + n, dtype=np.int64)
            blocks.append(index_copy_code(em, x, o, dt, xs, os_, maps, "0"))
        start += n
    emit_kernel(em, f"split_{dt}", "\n".join(blocks), f"Split {xs} along {axis} into {len(node.outputs)}")


# -- Gather ----------------------------------------------------------------------------------------

def _check_gather(node: Node, g: Graph) -> str | None:
    data, idx = node.inputs
    why = _nonempty_native(node, g, [data, node.outputs[0]])
    if why:
        return why
    rank = len(_shape(g, data))
    axis = node.attr("axis", 0)
    if not -rank <= axis < rank:
        return "axis out of range"
    axis = axis + rank if axis < 0 else axis
    n = _shape(g, data)[axis]
    iv = g.values[idx]
    if iv.const is not None:
        ind = np.asarray(iv.const).astype(np.int64)
        if ((ind < -n) | (ind >= n)).any():
            return "constant indices out of range"
        return None
    if dtype_name(g, idx) not in ("int32", "int64"):
        return "indices dtype"
    return None


# Gather-1 differs from 11 only in leaving negative indices unspecified (onnxruntime's one kernel
# serves both and wraps them, as here); it appears where a model stays below opset 11 (Scan-8)
@register("Gather", versions=(1, 11, 13), check=_check_gather, name="gather")
def emit_gather(node: Node, g: Graph, em: BlockEmitter) -> None:
    data, idx = node.inputs
    y = node.outputs[0]
    ds = _shape(g, data)
    dt = dtype_name(g, data)
    axis = node.attr("axis", 0)
    axis = axis + len(ds) if axis < 0 else axis
    n = ds[axis]
    iv = g.values[idx]
    if iv.const is not None:
        ind = np.asarray(iv.const).astype(np.int64).reshape(-1)
        ind = np.where(ind < 0, ind + n, ind)
        maps = [np.arange(d, dtype=np.int64) for d in ds]
        maps[axis] = ind
        out_eff = ds[:axis] + [ind.size] + ds[axis + 1:]
        code = index_copy_code(em, data, y, dt, ds, out_eff, maps, "0")
        emit_kernel(em, f"gather_const_{dt}", code, f"Gather {ds} axis {axis}, {ind.size} constant indices")
        return
    t, it = c_type(dt), c_type(dtype_name(g, idx))
    outer = int(np.prod(ds[:axis], dtype=np.int64))
    inner = int(np.prod(ds[axis + 1:], dtype=np.int64))
    k = iv.size
    item = np.dtype(dt).itemsize
    L = [f"const {t} *restrict X = {em.ptr(data)};", f"const {it} *restrict I = {em.ptr(idx)};",
         f"{t} *restrict Y = (void *){em.ptr(y)};",
         work_range(outer * k, outer * k * inner >= PARALLEL_MIN_ELEMS),
         "for (long w = wb; w < we; ++w) {",
         f"    const long o = w / {k}; long j = (long)I[w % {k}];",
         f"    if (j < 0) j += {n};",
         f"    {t} *restrict yr = Y + w * {inner};",
         f"    if ((unsigned long)j >= {n}ul) {{ memset(yr, 0, {inner * item}); SMELT_FAIL(); }}  /* reported */",
         f"    else memcpy(yr, X + (o * {n} + j) * {inner}, {inner * item});",
         "}"]
    emit_kernel(em, f"gather_rt_{dt}", "\n".join(L), f"Gather {ds} axis {axis}, {k} run-time indices")


# -- GatherElements --------------------------------------------------------------------------------

def _check_gather_elements(node: Node, g: Graph) -> str | None:
    data, idx = node.inputs
    why = _nonempty_native(node, g, [data, node.outputs[0]])
    if why:
        return why
    ds, js = _shape(g, data), _shape(g, idx)
    axis = node.attr("axis", 0)
    if len(ds) != len(js) or not -len(ds) <= axis < len(ds):
        return "GatherElements needs indices of the data's rank and an axis in range"
    if dtype_name(g, idx) not in ("int32", "int64"):
        return "indices dtype"
    axis = axis % len(ds)
    if any(j > d for k, (j, d) in enumerate(zip(js, ds, strict=True)) if k != axis):
        return "indices larger than the data off the axis"
    return None


@register("GatherElements", versions=(11, 13), check=_check_gather_elements, name="gather_elements")
def emit_gather_elements(node: Node, g: Graph, em: BlockEmitter) -> None:
    """out[c] = data[c with c[axis] replaced by indices[c]] (negative indices wrap; one out of
    range is reported with SMELT_FAIL, its element zeroed). onnx.reference's GatherElements
    fails on BERT's position-id gather, so this op must not fall back."""
    data, idx = node.inputs
    y = node.outputs[0]
    ds, js = _shape(g, data), _shape(g, idx)
    axis = node.attr("axis", 0) % len(ds)
    dt = dtype_name(g, data)
    t, it = c_type(dt), c_type(dtype_name(g, idx))
    strides = [int(np.prod(ds[k + 1:], dtype=np.int64)) for k in range(len(ds))]
    total = int(np.prod(js, dtype=np.int64))
    L = [f"const {t} *restrict X = {em.ptr(data)};", f"const {it} *restrict I = {em.ptr(idx)};",
         f"{t} *restrict Y = (void *){em.ptr(y)};",
         work_range(total, total >= PARALLEL_MIN_ELEMS),
         "for (long o = wb; o < we; ++o) {",
         "    long j = (long)I[o], rem = o, src = 0;",
         f"    if (j < 0) j += {ds[axis]};",
         f"    if ((unsigned long)j >= {ds[axis]}ul) {{ Y[o] = 0; SMELT_FAIL(); continue; }}  /* reported */"]
    for k in reversed(range(len(js))):
        term = "j" if k == axis else f"(rem % {js[k]})"
        L.append(f"    src += {term} * {strides[k]}L; rem /= {js[k]};")
    L += ["    Y[o] = X[src];", "}"]
    emit_kernel(em, f"gather_elements_{dt}", "\n".join(L), f"GatherElements {ds} axis {axis}, indices {js}")


# -- Pad -------------------------------------------------------------------------------------------

PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "edge", "wrap": "wrap"}


def pad_maps(node: Node, g: Graph) -> tuple[list[np.ndarray], tuple[str, object]] | str:
    """Per-dim maps (-1 = constant fill) and the fill: ("lit", value) or ("ptr", value name)."""
    xs = _shape(g, node.inputs[0])
    rank = len(xs)
    mode = node.attr("mode", "constant")
    if mode not in PAD_MODES:
        return f"unknown Pad mode {mode!r}"
    if node.attr("pads") is not None:
        return "Pad with attributes"
    cs = _consts(node, g, [1, 3])
    if isinstance(cs, str):
        return cs
    pads, axes = cs
    pads = [int(p) for p in pads.reshape(-1)]
    axes = list(range(rank)) if axes is None else [int(a) + rank if a < 0 else int(a) for a in axes.reshape(-1)]
    if len(pads) != 2 * len(axes) or any(not 0 <= a < rank for a in axes) or len(set(axes)) != len(axes):
        return "pads do not match the axes"
    width = [(0, 0)] * rank
    for i, a in enumerate(axes):
        width[a] = (pads[i], pads[len(axes) + i])
    maps = []
    for d, (pb, pe) in enumerate(width):
        src = np.arange(xs[d], dtype=np.int64)
        padded = np.pad(src, (max(pb, 0), max(pe, 0)), mode=mode,
                        **({"constant_values": -1} if mode == "constant" else {}))
        padded = padded[max(-pb, 0): padded.size - max(-pe, 0)]
        maps.append(padded.astype(np.int64))
    fill: tuple[str, object] = ("lit", 0)
    if len(node.inputs) > 2 and node.inputs[2] and mode == "constant":
        c = g.const(node.inputs[2])
        fill = ("ptr", node.inputs[2]) if c is None else ("lit", np.asarray(c).reshape(-1)[0].item())
    return maps, fill


def _check_pad(node: Node, g: Graph) -> str | None:
    why = _nonempty_native(node, g, [node.inputs[0], node.outputs[0]])
    if why:
        return why
    if not has_c_type(g.values[node.inputs[0]].dtype) and dtype_name(g, node.inputs[0]) != "float16":
        return f"dtype {dtype_name(g, node.inputs[0])} has no native Pad"
    res = pad_maps(node, g)
    if isinstance(res, str):
        return res
    maps, fill = res
    if [m.size for m in maps] != _shape(g, node.outputs[0]):
        return "inferred output shape disagrees with the pads"
    if fill[0] == "ptr" and (dtype_name(g, fill[1]) != dtype_name(g, node.inputs[0]) or g.values[fill[1]].size != 1):
        return "run-time constant_value of another dtype or size"
    return None


@register("Pad", versions=(11, 13, 18, 19, 21, 23, 24, 25), check=_check_pad, name="pad")
def emit_pad(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, y = node.inputs[0], node.outputs[0]
    dt = dtype_name(g, x)
    res = pad_maps(node, g)
    assert not isinstance(res, str)
    maps, fill = res
    kind, val = fill
    if kind == "ptr":
        fill_c = f"({em.ptr(str(val))}[0])"
    elif dt == "float16":  # the value's bits (float16 is held as a uint16_t)
        fill_c = str(int(np.float16(val).view(np.uint16)))
    else:
        fill_c = c_literal(float(val) if dt in FLOAT_TYPES else int(val), dt)
    code = index_copy_code(em, x, y, dt, _shape(g, x), _shape(g, y), maps, fill_c)
    emit_kernel(em, f"pad_{node.attr('mode', 'constant')}_{dt}", code, f"Pad {_shape(g, x)} -> {_shape(g, y)}")


# -- Expand / Tile ---------------------------------------------------------------------------------

def _check_expand(node: Node, g: Graph) -> str | None:
    why = _nonempty_native(node, g, [node.inputs[0], node.outputs[0]])
    if why:
        return why
    xs, ys = _shape(g, node.inputs[0]), _shape(g, node.outputs[0])
    if len(xs) > len(ys):
        return "input rank above output rank"
    pad = [1] * (len(ys) - len(xs)) + xs
    if any(a not in (1, b) for a, b in zip(pad, ys, strict=True)):
        return "input does not broadcast to the output"
    return None


@register("Expand", versions=(8, 13), check=_check_expand, name="expand")
def emit_expand(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, y = node.inputs[0], node.outputs[0]
    xs, ys = _shape(g, x), _shape(g, y)
    dt = dtype_name(g, x)
    pad = [1] * (len(ys) - len(xs)) + xs
    maps = [np.arange(b, dtype=np.int64) if a == b else np.zeros(b, np.int64) for a, b in zip(pad, ys, strict=True)]
    code = index_copy_code(em, x, y, dt, pad, ys, maps, "0")
    emit_kernel(em, f"expand_{dt}", code, f"Expand {xs} -> {ys}")


def _check_tile(node: Node, g: Graph) -> str | None:
    why = _nonempty_native(node, g, [node.inputs[0], node.outputs[0]])
    if why:
        return why
    xs, ys = _shape(g, node.inputs[0]), _shape(g, node.outputs[0])
    if len(xs) != len(ys) or any(b % a for a, b in zip(xs, ys, strict=True)):
        return "output is not a whole tiling of the input"
    return None


@register("Tile", versions=(6, 13), check=_check_tile, name="tile")
def emit_tile(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, y = node.inputs[0], node.outputs[0]
    xs, ys = _shape(g, x), _shape(g, y)
    dt = dtype_name(g, x)
    maps = [np.arange(b, dtype=np.int64) % a for a, b in zip(xs, ys, strict=True)]
    code = index_copy_code(em, x, y, dt, xs, ys, maps, "0")
    emit_kernel(em, f"tile_{dt}", code, f"Tile {xs} -> {ys}")


# -- DepthToSpace / SpaceToDepth ------------------------------------------------------------------

def _check_d2s(node: Node, g: Graph) -> str | None:
    why = _nonempty_native(node, g, [node.inputs[0], node.outputs[0]])
    if why:
        return why
    xs = _shape(g, node.inputs[0])
    b = int(node.attr("blocksize", 0))
    if len(xs) != 4 or b < 1:
        return "needs a 4-D input and blocksize >= 1"
    if node.attr("mode", "DCR") not in ("DCR", "CRD"):
        return f"unknown mode {node.attr('mode')!r}"
    if node.op == "DepthToSpace" and xs[1] % (b * b):
        return "channels not divisible by blocksize^2"
    if node.op == "SpaceToDepth" and (xs[2] % b or xs[3] % b):
        return "spatial dims not divisible by blocksize"
    return None


@register(("DepthToSpace", "SpaceToDepth"), versions=(1, 11, 13, 28), check=_check_d2s, name="depth_space")
def emit_depth_space(node: Node, g: Graph, em: BlockEmitter) -> None:
    """A 6-D transposition of the input, written as an index copy over the output's 6-D view."""
    x, y = node.inputs[0], node.outputs[0]
    n, c, h, w = _shape(g, x)
    b = int(node.attr("blocksize"))
    dt = dtype_name(g, x)
    chw, hw = c * h * w, h * w
    if node.op == "DepthToSpace":
        cc = c // (b * b)
        view = [n, cc, h, b, w, b]  # output [N, C', H, b1, W, b2]
        if node.attr("mode", "DCR") == "CRD":  # input [N, C', b1, b2, H, W]
            strides = [chw, b * b * hw, w, b * hw, 1, hw]
        else:  # DCR: input [N, b1, b2, C', H, W]
            strides = [chw, hw, w, b * cc * hw, 1, cc * hw]
    elif node.attr("mode", "DCR") == "CRD":  # (opset 28) output channel c * b * b + b1 * b + b2
        view = [n, c, b, b, h // b, w // b]
        strides = [chw, hw, w, 1, b * w, b]
    else:  # output channel (b1 * b + b2) * C + c
        view = [n, b, b, c, h // b, w // b]
        strides = [chw, w, 1, hw, b * w, b]
    maps = [np.arange(d, dtype=np.int64) for d in view]
    code = index_copy_code(em, x, y, dt, None, view, maps, "0", src_strides=strides)
    emit_kernel(em, f"{node.op.lower()}_{dt}", code, f"{node.op} {[n, c, h, w]} block {b}")


# -- Cast / CastLike -------------------------------------------------------------------------------

# float -> integer: in range, C truncates toward zero as onnxruntime does; out of range (and NaN)
# C leaves it undefined, while onnxruntime (static_cast on x86: cvttss2si / cvttps2dq) gives the
# "integer indefinite" INT32_MIN / INT64_MIN, and an 8/16-bit target the low bits of the 32-bit
# conversion (so 300.7 -> int8 44, NaN -> 0). The expressions below define exactly that, so the
# result no longer depends on gcc. Unsigned 32/64-bit targets have no such single rule in
# onnxruntime (its results differ by code path) and stay with the fallback.
_FLOAT_TO_INT_VIA = {"int8": "int32", "int16": "int32", "uint8": "int32", "uint16": "int32",
                     "int32": "int32", "int64": "int64"}
_INT_LIMIT = {"int32": ("2147483648.0", "INT32_MIN"), "int64": ("9223372036854775808.0", "INT64_MIN")}


def _float_to_int(src: str, dst: str, v: str) -> str:
    """``v`` (a float32 or float64 expression) converted as onnxruntime converts it on x86."""
    via = _FLOAT_TO_INT_VIA[dst]
    bound, indefinite = _INT_LIMIT[via]
    t = "double" if src == "float64" else "float"
    suffix = "" if t == "double" else "f"
    # -bound is exactly representable and converts to the minimum; NaN fails both compares
    wide = (f"__extension__ ({{ const {t} smelt_v_ = ({v}); (smelt_v_ >= -{bound}{suffix} && smelt_v_ < {bound}{suffix})"
            f" ? ({via}_t)smelt_v_ : {indefinite}; }})")
    if via == dst:
        return wide
    return f"({c_type(dst)})(u{via}_t)({wide})"  # the low bits (gcc's narrowing of a signed value is modular too)


def cast_expr(src: str, dst: str, v: str) -> str | None:
    """C expression converting ``v`` from dtype ``src`` to ``dst``; None if C's differs from ONNX's.
    float16 converts through float, as onnxruntime does (a double is rounded to float first)."""
    if src == "float16" and dst in _FLOAT_TO_INT_VIA:
        return _float_to_int("float32", dst, half.load(src, v))
    if src == "float16" and dst in FLOAT_TYPES + ("float16", "bool"):
        return v if dst == "float16" else f"({c_type(dst)})({half.load(src, v)}{' != 0' if dst == 'bool' else ''})"
    if dst == "float16" and src in FLOAT_TYPES:
        return half.store(dst, f"(float)({v})")
    if not (has_c_type(src) and has_c_type(dst)):
        return None
    if dst == "bool":
        return f"({v} != 0)"
    if src in FLOAT_TYPES and dst not in FLOAT_TYPES:
        return _float_to_int(src, dst, v) if dst in _FLOAT_TO_INT_VIA else None
    return f"({c_type(dst)})({v})"


def _check_cast(node: Node, g: Graph) -> str | None:
    x, y = node.inputs[0], node.outputs[0]
    src, dst = dtype_name(g, x), dtype_name(g, y)
    if cast_expr(src, dst, "x") is None:
        return f"no native cast from {src} to {dst}"
    return _nonempty_native(node, g, [x, y])


@register(("Cast", "CastLike"), versions=(6, 9, 13, 15, 19, 21, 23, 24, 25, 28), check=_check_cast, name="cast")
def emit_cast(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, y = node.inputs[0], node.outputs[0]
    src, dst = dtype_name(g, x), dtype_name(g, y)
    shape = _shape(g, y)
    expr = cast_expr(src, dst, "X[IX]")
    if "float16" in (src, dst):
        half.half_helpers(em)
    loop = elementwise_loop(shape, [shape], lambda idx, o: f"Y[{o}] = {expr.replace('IX', idx[0])};")
    emit_kernel(em, f"cast_{src}_{dst}",
                f"const {c_type(src)} *restrict X = {em.ptr(x)};\n{c_type(dst)} *restrict Y = (void *){em.ptr(y)};\n"
                + loop, f"Cast {src} -> {dst}")
