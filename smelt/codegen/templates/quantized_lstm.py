"""onnxruntime's ``com.microsoft:DynamicQuantizeLSTM``: the LSTM its dynamic quantizer writes.

Template ``dq_lstm``. The weights are int8/uint8 with per-tensor or per-gate-column scales and
zero points; the activations are quantized at run time to uint8, as onnxruntime does (found by
matching its outputs to 5e-8 over the variants, tests/kernels/test_quantized_lstm.py):
- the whole input X [seq, batch, input] once, with DynamicQuantizeLinear's rule (range widened
  to 0, scale = range / 255, zero point rounded half to even);
- the hidden state at every step, with the same rule over each group of batch rows onnxruntime
  quantizes together (``h_quant_rows``: the whole batch, or, where onnxruntime splits the batch
  between its threads, chunks of ceil(batch / physical cores), its default thread count; its own
  answer moves by ~1e-3 with its thread count there).
Each product is exact in int32, then scaled by ``x_scale * w_scale[column]``; the gates follow
onnxruntime's order (X.W + h.R, then the peephole, then the bias; sigmoid, tanh, tanh; other
activations, ``clip``, ``input_forget`` and a ``sequence_lens`` input are refused with the reason,
since a contrib op cannot fall back).

DeepCPU's schedule on integers (its MM-DAG phases, fused gates and weight-centric streamlining):
1. X quantized once: each share finds its part's range 16 lanes at a time (and sets up the
   initial states), then every share combines the ranges into the scale and zero point and
   quantizes its rows straight into the packed words of the tile;
2. the input projection of every step hoisted into one integer GEMM over (steps x batch) rows,
   with the shared register tile (``kernels/int_gemm.py`` ``tile_loop``);
3. the recurrence: the gate columns are permuted so that one panel holds the four gates of
   ``upp`` blocks of 16 hidden units, and each thread owns a fixed range of panels for the whole
   sequence (its slice of R stays in its own L2). Per step every thread quantizes the whole
   previous h row itself (H values: cheaper than a second barrier), runs the register tile over
   its panels and finishes those units' gates, cell and h in registers; one flag barrier per
   step among the threads of the direction, and only that step synchronizes its shares
   (``BlockEmitter.step(synchronize=True)``): the others stay shareable. Below
   ``REC_PARALLEL_MIN_MACS`` a step is too short for a barrier and one thread runs the
   recurrence; two directions run on two threads.

Integer forms, per ISA (``isa.with_int_dot``): on VNNI hosts a uint8 activation times int8
weights of zero point 0 (what ``quantize_dynamic`` writes with QInt8) runs as u8 x s8 quads
(vpdpbusd), the activation's zero point taken off afterwards with the weights' compile-time
column sums; otherwise int16 pairs with both zero points subtracted (vpmaddwd / vpdpwssd), and
portable C runs the same pair layout in plain loops. All exact in int32.
"""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import BlockEmitter
from smelt.codegen.kernels.int_gemm import (
    PAIR,
    QUAD,
    pack_b,
    quad_colsums,
    tile_loop,
    uint8_params,
    uint8_quantize,
)
from smelt.codegen.kernels.isa import VectorIsa, vector_isa, with_int_dot
from smelt.codegen.kernels.loops import dtype_name
from smelt.codegen.kernels.rnn_vec import LOGICAL_LANES, vmath_source
from smelt.codegen.registry import register
from smelt.ir.graph import PLAIN, Graph, Node
from smelt.schedule.gemm import int_dot_tile
from smelt.schedule.rnn import h_quant_rows

MS_DOMAIN = "com.microsoft"
EIGHT_BIT = ("int8", "uint8")
# inputs: X, W, R, B, sequence_lens, initial_h, initial_c, P, W_scale, W_zero_point, R_scale,
# R_zero_point
X, W, R, BIAS, SEQ_LENS, INIT_H, INIT_C, PEEP, W_SCALE, W_ZERO, R_SCALE, R_ZERO = range(12)
LANES = LOGICAL_LANES  # hidden units per block: the RNN vector math's 16-lane logical vector
# multiply-adds per recurrence step below which one thread runs it: the split's flag barrier and
# the h lines crossing cores cost what halving the step saves up to H=256 at batch 1 (262K MACs,
# ~2 us on one thread): quiet Zen 4, 2 threads, E=H=256 B1, split against one thread: T=10
# 63 against 58 us, T=100 287 against 290 us. H=1024 (4.2M MACs a step) splits.
REC_PARALLEL_MIN_MACS = 1 << 19
PORTABLE_TILE = (4, 64)  # portable C: rows x columns of the plain-loop tile


def _inp(node: Node, k: int) -> str:
    return node.inputs[k] if len(node.inputs) > k else ""


def _const(g: Graph, name: str) -> np.ndarray | None:
    return None if not name else (None if g.values[name].const is None else np.asarray(g.values[name].const))


def _check(node: Node, g: Graph) -> str | None:
    names = [n for n in node.inputs + node.outputs if n]
    if any(g.values[n].layout != PLAIN for n in names):
        return "DynamicQuantizeLSTM reads plain layouts only"
    acts = [a.decode() if isinstance(a, bytes) else a for a in node.attr("activations", [])]
    if acts and acts != ["Sigmoid", "Tanh", "Tanh"] * (len(acts) // 3):
        return f"activations {acts}: only the default Sigmoid, Tanh, Tanh are native"
    if node.attr("clip") is not None:
        return "clip is not native"
    if int(node.attr("input_forget", 0)):
        return "input_forget is not native"
    if _inp(node, SEQ_LENS):
        return "a sequence_lens input is not native"
    x = g.values[node.inputs[X]]
    if x.dtype is None or dtype_name(g, node.inputs[X]) != "float32" or x.shape is None or len(x.shape) != 3:
        return "X must be a float32 [seq, batch, input] tensor of known shape"
    for k, what in ((W, "W"), (R, "R"), (W_SCALE, "W_scale"), (W_ZERO, "W_zero_point"), (R_SCALE, "R_scale"),
                    (R_ZERO, "R_zero_point")):
        if _const(g, _inp(node, k)) is None:
            return f"{what} must be a constant (weights are packed at compile time)"
    for k, what in ((BIAS, "B"), (PEEP, "P")):
        if _inp(node, k) and _const(g, _inp(node, k)) is None:
            return f"{what} must be a constant"
    w, r = _const(g, node.inputs[W]), _const(g, node.inputs[R])
    if dtype_name(g, node.inputs[W]) not in EIGHT_BIT or dtype_name(g, node.inputs[R]) not in EIGHT_BIT:
        return "W and R must be int8 or uint8"
    dirs, hidden4 = w.shape[0], w.shape[2]
    hidden = int(node.attr("hidden_size", hidden4 // 4))
    direction = node.attr("direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    if dirs != (2 if direction == "bidirectional" else 1) or hidden4 != 4 * hidden:
        return f"W of shape {list(w.shape)} does not fit direction {direction!r} and hidden_size {hidden}"
    if r.shape != (dirs, hidden, 4 * hidden) or w.shape[1] != x.shape[2]:
        return f"W {list(w.shape)} / R {list(r.shape)} do not fit X {list(x.shape)} and hidden_size {hidden}"
    for k in (W_SCALE, W_ZERO, R_SCALE, R_ZERO):
        if _const(g, _inp(node, k)).size not in (dirs, dirs * 4 * hidden):
            return f"{_inp(node, k)!r}: scales and zero points are per direction or per gate column"
    for k in (INIT_H, INIT_C):
        if _inp(node, k) and tuple(g.values[_inp(node, k)].shape or ()) != (dirs, x.shape[1], hidden):
            return f"{_inp(node, k)!r} must be [num_directions, batch, hidden]"
    return None


def _per_column(a: np.ndarray, dirs: int, n: int) -> np.ndarray:
    return np.broadcast_to(a.reshape(dirs, -1), (dirs, n)) if a.size == dirs else a.reshape(dirs, n)


def gate_permutation(hidden: int, upp: int) -> np.ndarray:
    """The recurrence's column order: panel after panel of ``upp`` blocks of 16 hidden units,
    each block its four gates (i, o, f, c) of 16 columns; entries are ONNX columns (gate * H +
    unit), -1 where the hidden size is padded to whole blocks. One thread's panels then hold
    every gate of its units, so it finishes them without waiting for another thread."""
    hp = -(-hidden // LANES) * LANES
    order = np.full(4 * hp, -1, np.int64)
    for ub in range(hp // LANES):
        p, u = divmod(ub, upp)
        units = ub * LANES + np.arange(LANES)
        for gate in range(4):
            base = p * 4 * upp * LANES + (u * 4 + gate) * LANES
            order[base:base + LANES] = np.where(units < hidden, gate * hidden + units, -1)
    return order


def _permuted(a: np.ndarray, order: np.ndarray) -> np.ndarray:
    """``a`` [..., 4H] in the column order ``order``, zeros in the padding columns."""
    out = np.zeros(a.shape[:-1] + (order.size,), a.dtype)
    keep = order >= 0
    out[..., keep] = a[..., order[keep]]
    return out


def _portable_tile(mr: int, nr: int, k2: int, a_row: str, b_panel: str, tile: str) -> list[str]:
    """Portable C of ``tile_loop``'s pair form (same packed layouts): plain loops gcc vectorizes."""
    lines = [f"const int32_t *restrict a{r} = {a_row.format(r=r)};" for r in range(mr)]
    lines += [f"const int16_t *restrict bp = {b_panel};",
              f"for (long j = 0; j < {mr * nr}; ++j) {tile}[j] = 0;",
              f"for (long q = 0; q < {k2}; ++q) {{",
              f"    const int16_t *restrict bq = bp + q * {2 * nr};"]
    for r in range(mr):
        lines += [f"    {{ const uint32_t w = (uint32_t)a{r}[q];",
                  "      const int32_t lo = (int16_t)(uint16_t)w, hi = (int16_t)(uint16_t)(w >> 16);",
                  f"      for (long j = 0; j < {nr}; ++j) {tile}[{r * nr} + j] += lo * (int32_t)bq[2 * j] + hi * (int32_t)bq[2 * j + 1]; }}"]
    lines.append("}")
    return lines


def _tile_fn(em: BlockEmitter, v: VectorIsa, mr: int, nr: int, k2: int, group: int) -> str:
    """The register tile of ``mr`` rows as its own function (A's rows from ``A`` every ``lda``
    words, the first ``mr`` valid), one per shape, shared by the steps."""
    etype = "int8_t" if group == QUAD else "int16_t"
    a_row, b = "A + (long)SMELT_MIN({r}, mr - 1) * lda", "B"
    body = (tile_loop(v, mr, nr // v.lanes, k2=k2, a_row=a_row, b_panel=b, tile="T", group=group)
            if v.has("i16_dot_acc") else _portable_tile(mr, nr, k2, a_row, b, "T"))
    return em.function(f"dq_lstm_tile_{mr}x{nr}_{v.name}{'_u8s8' if group == QUAD else ''}",
                       f"static __attribute__((noinline)) void FNAME(const int32_t *restrict A, long lda, long mr, "
                       f"const {etype} *restrict B, int32_t *restrict T) {{\n    "
                       + "\n    ".join(body) + "\n}\n", doc=f"{mr}x{nr} integer register tile, K = {k2} words")


def _tile_call(em: BlockEmitter, v: VectorIsa, mr: int, nr: int, k2: int, group: int, total: int, *, a: str,
               lda: str, rows: str, b_panel: str, tile: str) -> str:
    """C statement running the tile over ``rows`` rows at ``a`` (blocks of ``mr`` of ``total``
    rows): the last, ragged block gets a tile of its own height, since a full-height tile would
    compute its missing rows anyway (a one-row GEMV through a 6-row tile did 6x the work)."""
    args = f"({a}, {lda}, {rows}, {b_panel}, {tile});"
    main = _tile_fn(em, v, mr, nr, k2, group)
    if total % mr == 0:
        return main + args
    return f"if ({rows} == {mr}) {main}{args} else {_tile_fn(em, v, total % mr, nr, k2, group)}{args}"


def _packed_weights(q: np.ndarray, zero: np.ndarray, order: np.ndarray, k_rows: int, nr: int,
                    group: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Weights ``q`` [dirs, K, 4H] (8-bit) with per-column ``zero`` [dirs, 4H] in the permuted
    column order, K padded to ``k_rows``, packed per ``nr``-column panel for the tile: int16
    (zero point subtracted) pairs, or int8 quads (zero point 0) with their column sums."""
    vals = _permuted(q.astype(np.int16) - zero[:, None, :], order)
    if k_rows > vals.shape[1]:
        vals = np.concatenate([vals, np.zeros((vals.shape[0], k_rows - vals.shape[1], vals.shape[2]), np.int16)], 1)
    if group == QUAD:
        vals8 = vals.astype(np.int8)
        return pack_b(vals8, nr, QUAD), np.ascontiguousarray(quad_colsums(vals8))
    return pack_b(vals, nr, PAIR), None


def _quantize_words(dest: str, src: str, n: int, padded: int, scale: str, zero: str, group: int) -> list[str]:
    """C lines quantizing the ``n`` floats at ``src`` to uint8 (``scale``/``zero`` floats) into the
    packed words at int32 ``dest``: raw bytes (quads) or int16 less the zero point (pairs),
    zeros up to ``padded`` values (the weights are 0 there). Plain loops: gcc vectorizes them
    (division, nearbyintf, the clamps, the narrowing store), which measured faster than the
    same written over the 16-lane API with its scalar narrowing."""
    if group == QUAD:
        return [f"{{ uint8_t *restrict o = (uint8_t *){dest};",
                f"  for (long k = 0; k < {n}; ++k) {uint8_quantize(f'{src}[k]', scale, zero, 'o[k]')}",
                f"  for (long k = {n}; k < {padded}; ++k) o[k] = 0; }}"]
    return [f"{{ int16_t *restrict o = (int16_t *){dest}; const int32_t zi = (int32_t){zero};",
            f"  for (long k = 0; k < {n}; ++k) {{ uint8_t qv; {uint8_quantize(f'{src}[k]', scale, zero, 'qv')} "
            "o[k] = (int16_t)((int32_t)qv - zi); }",
            f"  for (long k = {n}; k < {padded}; ++k) o[k] = 0; }}"]


@register("DynamicQuantizeLSTM", check=_check, name="dq_lstm", domain=MS_DOMAIN)
def emit_dq_lstm(node: Node, g: Graph, em: BlockEmitter) -> None:
    seq, batch, isz = g.values[node.inputs[X]].shape
    w, r = _const(g, node.inputs[W]), _const(g, node.inputs[R])
    dirs, hidden = w.shape[0], w.shape[2] // 4
    n4 = 4 * hidden
    direction = node.attr("direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    v = with_int_dot(vector_isa(em.target), em.target)
    vec = v.has("i16_dot_acc")
    hp = -(-hidden // LANES) * LANES
    nub = hp // LANES
    # two unit blocks per panel where 32 registers hold their 8 accumulators (B=1: eight
    # independent dot-product chains hide vpdpbusd's latency)
    upp = 2 if vec and v.registers >= 32 and nub % 2 == 0 else 1
    nrr, npan, n4p = 4 * upp * LANES, nub // upp, 4 * hp
    order = gate_permutation(hidden, upp)
    wz = _per_column(_const(g, _inp(node, W_ZERO)).astype(np.int16), dirs, n4)
    rz = _per_column(_const(g, _inp(node, R_ZERO)).astype(np.int16), dirs, n4)
    quads = v.has("u8s8_dot_acc")
    gw = QUAD if quads and dtype_name(g, node.inputs[W]) == "int8" and not np.any(wz) else PAIR
    gr = QUAD if quads and dtype_name(g, node.inputs[R]) == "int8" and not np.any(rz) else PAIR
    # the projection's tile: the shared GEMM shape (its NR divides 4 * hp, a multiple of 64)
    mrx, nvx = int_dot_tile(v.registers) if vec else (PORTABLE_TILE[0], PORTABLE_TILE[1] // v.lanes)
    nrx = nvx * v.lanes
    kwx = -(-isz // gw)
    kwh = hp // gr
    # the recurrence's tile: batch rows x one panel, rows as many as the registers leave
    nvr = nrr // v.lanes
    mrr = max(1, min(batch, (v.registers - 1 - nvr) // nvr)) if vec else min(batch, PORTABLE_TILE[0])
    wpack, wcs = _packed_weights(w, wz, order, gw * kwx, nrx, gw)
    rpack, rcs = _packed_weights(r, rz, order, hp, nrr, gr)
    wp, rp = em.weight(wpack), em.weight(rpack)
    wcs_p = em.weight(wcs) if wcs is not None else ""
    rcs_p = em.weight(rcs) if rcs is not None else ""
    ws = em.weight(np.ascontiguousarray(_permuted(_per_column(_const(g, _inp(node, W_SCALE)).astype(np.float32), dirs, n4), order)))
    rs = em.weight(np.ascontiguousarray(_permuted(_per_column(_const(g, _inp(node, R_SCALE)).astype(np.float32), dirs, n4), order)))
    bias = _const(g, _inp(node, BIAS))
    bias = np.zeros((dirs, 8 * hidden), np.float32) if bias is None else bias.astype(np.float32).reshape(dirs, -1)
    bsum = em.weight(np.ascontiguousarray(_permuted(bias[:, :n4] + bias[:, n4:], order)))  # Wb + Rb
    peep = _const(g, _inp(node, PEEP))
    pp = ""
    if peep is not None:  # [dirs, 3, hp]: p_i, p_o, p_f per unit, zeros in the padding
        pad = np.zeros((dirs, 3, hp), np.float32)
        pad[:, :, :hidden] = peep.astype(np.float32).reshape(dirs, 3, hidden)
        pp = em.weight(pad)
    rows = seq * batch
    threads = max(1, em.n_threads)
    xa = em.scratch(4 * max(1, rows * kwx), "int32")
    gx = em.scratch(4 * dirs * rows * n4p)
    hbuf = em.scratch(4 * dirs * 2 * batch * hp)
    cbuf = em.scratch(4 * dirs * batch * hp)
    qstride = -(-batch * kwh // 16) * 16  # per thread, whole cache lines
    qa = em.scratch(4 * threads * qstride, "int32")
    pstride = -(-2 * batch // 16) * 16
    qp = em.scratch(4 * threads * pstride)
    tstride = -(-max(mrx * nrx, mrr * nrr) // 16) * 16
    tile = em.scratch(4 * threads * tstride, "int32")
    nflags = max(2, threads)
    flags = em.scratch(64 * nflags, "uint8")
    x_ptr = em.ptr(node.inputs[X])

    vx = em.function("rnn_vmath", vmath_source("FNAME", em.target),
                     doc="RNN vector math: exp/sigmoid/tanh, activations, group barrier")
    total = seq * batch * isz
    part = em.scratch(4 * 16 * threads)  # per share: its part's [minimum, maximum], own cache line
    sc = em.scratch(4 * 16)
    ih, ic = (em.ptr(_inp(node, k)) if _inp(node, k) else "" for k in (INIT_H, INIT_C))
    # 1. X's range per share, 16 lanes at a time (NaN left out: the vector min/max keep their
    #    second operand), and the initial states (padding units 0: they stay 0), the flags
    em.step("\n".join([
        f"const float *restrict X = {x_ptr}; float *restrict P = {part};",
        f"long b, e; smelt_range({total}, tid, nt, &b, &e);",
        "VX_v vlo = VX_zero(), vhi = VX_zero();",
        f"long i = b; for (; i + {LANES} <= e; i += {LANES}) {{ const VX_v x = VX_loadu(X + i); vlo = VX_min(x, vlo); vhi = VX_max(x, vhi); }}",
        f"float tl[{LANES}], th[{LANES}], lo = 0.0f, hi = 0.0f; VX_storeu(tl, vlo); VX_storeu(th, vhi);",
        f"for (int l = 0; l < {LANES}; ++l) {{ lo = tl[l] < lo ? tl[l] : lo; hi = th[l] > hi ? th[l] : hi; }}",
        "for (; i < e; ++i) { const float x = X[i]; lo = x < lo ? x : lo; hi = x > hi ? x : hi; }",
        "P[16 * tid] = lo; P[16 * tid + 1] = hi;",
        f"long q0, q1; smelt_range({dirs * batch}, tid, nt, &q0, &q1);",
        "for (long q = q0; q < q1; ++q) {",
        f"    const long d = q / {batch}, bb = q % {batch};",
        f"    float *restrict h = {hbuf} + (d * 2 * {batch} + bb) * {hp}, *restrict c = {cbuf} + q * {hp};",
        f"    for (long k = 0; k < {hp}; ++k) {{ h[k] = k < {hidden} ? {f'{ih}[q * {hidden} + k]' if ih else '0.0f'} : 0.0f;"
        f" c[k] = k < {hidden} ? {f'{ic}[q * {hidden} + k]' if ic else '0.0f'} : 0.0f; }}",
        "}",
        f"if (tid == 0) memset((void *){flags}, 0, {64 * nflags});"]).replace("VX_", f"{vx}_"), name="dq_lstm_x_range")
    # 2. every share combines the ranges into X's scale and zero point (DynamicQuantizeLinear's
    #    rule; share 0 keeps them for the projection) and quantizes its rows into packed words
    em.step("\n".join([
        f"const float *restrict X = {x_ptr}; const float *P = {part}; float *SC = {sc};",
        f"int32_t *restrict XA = {xa};",
        "float lo = P[0], hi = P[1];",
        "for (int t = 1; t < nt; ++t) { lo = P[16 * t] < lo ? P[16 * t] : lo; hi = P[16 * t + 1] > hi ? P[16 * t + 1] : hi; }",
        "float xs, xzf;",
        *uint8_params("lo", "hi", "xs", "xzf").splitlines(),
        "if (tid == 0) { SC[0] = xs; SC[1] = xzf; }",
        f"long b, e; smelt_range({rows}, tid, nt, &b, &e);",
        "for (long r = b; r < e; ++r) {",
        *["    " + line for line in _quantize_words(f"(XA + r * {kwx})", f"(X + r * {isz})", isz, gw * kwx,
                                                 "xs", "xzf", gw)],
        "}"]).replace("VX_", f"{vx}_"), name="dq_lstm_x_pack")
    # 2. the hoisted input projection: every (step, row) and direction, one integer GEMM
    ncb, nmb = n4p // nrx, -(-rows // mrx)
    kernel = [_tile_call(em, v, mrx, nrx, kwx, gw, rows, a=f"XA + i0 * {kwx}L", lda=f"{kwx}L", rows="mr",
                         b_panel=f"WP + (d * {ncb} + cb) * {kwx * nrx * gw}L", tile="T")]
    acc = f"(T[r * {nrx} + jj] - xz * WCS[d * {n4p} + j])" if gw == QUAD else f"T[r * {nrx} + jj]"
    em.step("\n".join([
        f"const int32_t *restrict XA = {xa};", f"const float *SC = {sc};",
        f"const {'int8_t' if gw == QUAD else 'int16_t'} *restrict WP = {wp};",
        f"const float *restrict WS = {ws};", f"float *restrict GX = {gx};",
        *([f"const int32_t *restrict WCS = {wcs_p};"] if gw == QUAD else []),
        f"int32_t *restrict T = {tile} + (long)tid * {tstride};",
        "const float xs = SC[0]; const int32_t xz = (int32_t)SC[1]; (void)xz;",
        f"long wb, we; smelt_range({dirs * nmb * ncb}, tid, nt, &wb, &we);",
        "for (long p = wb; p < we; ++p) {",
        f"    const long cb = p % {ncb}, mb = (p / {ncb}) % {nmb}, d = p / {ncb * nmb};",
        f"    const long i0 = mb * {mrx}, mr = SMELT_MIN({mrx}, {rows} - i0);",
        *["    " + line for line in kernel],
        "    for (long r = 0; r < mr; ++r) {",
        f"        float *restrict o = GX + (d * {rows} + i0 + r) * {n4p} + cb * {nrx};",
        f"        for (long jj = 0; jj < {nrx}; ++jj) {{ const long j = cb * {nrx} + jj; (void)j;",
        f"            o[jj] = (float){acc} * (xs * WS[d * {n4p} + j]); }}",
        "    }",
        "}"]), name=f"dq_lstm_projection_{v.name}{'_u8s8' if gw == QUAD else ''}",
        doc=f"rows={rows} K={isz} N={n4p}, {mrx}x{nrx} register tile")
    # 3. the recurrence
    outs = (list(node.outputs) + ["", "", ""])[:3]
    y, yh, yc = (em.ptr(o) if o else "" for o in outs)
    reverse = {"forward": "0", "reverse": "1", "bidirectional": "d"}[direction]
    par = npan if n4 * hidden * batch >= REC_PARALLEL_MIN_MACS else 1
    qrows = h_quant_rows(batch, hidden, em.target.physical_cores)
    rkernel = [_tile_call(em, v, mrr, nrr, kwh, gr, batch, a=f"QA + rb0 * {kwh}L", lda=f"{kwh}L", rows="mr",
                          b_panel="rpan", tile="T")]
    racc = (f"(T[r * {nrr} + jj] - hzi * RCS[d * {n4p} + p * {nrr} + jj])" if gr == QUAD
            else f"T[r * {nrr} + jj]")
    L = LANES
    gates = [
        f"const float *restrict cp_ = C + (d * {batch} + b) * {hp} + ub * {L};",
        "VX_v cp = VX_loadu(cp_);",
        f"VX_v gi = VX_loadu(gt), go = VX_loadu(gt + {L}), gf = VX_loadu(gt + {2 * L}), gc = VX_loadu(gt + {3 * L});",
    ]
    if pp:
        gates += [f"const float *restrict pi_ = PP + d * {3 * hp} + ub * {L};",
                  f"gi = VX_add(gi, VX_mul(cp, VX_loadu(pi_))); gf = VX_add(gf, VX_mul(cp, VX_loadu(pi_ + {2 * hp})));"]
    gates += [
        f"const float *restrict bs_ = BS + d * {n4p} + p * {nrr} + u * {4 * L};",
        f"gi = VX_sigmoid(VX_add(gi, VX_loadu(bs_))); gf = VX_sigmoid(VX_add(gf, VX_loadu(bs_ + {2 * L})));",
        f"gc = VX_tanh(VX_add(gc, VX_loadu(bs_ + {3 * L})));",
        "const VX_v cn = VX_add(VX_mul(cp, gf), VX_mul(gi, gc));",
    ]
    if pp:
        gates.append(f"go = VX_add(go, VX_mul(cn, VX_loadu(pi_ + {hp})));")
    gates += [
        f"go = VX_sigmoid(VX_add(go, VX_loadu(bs_ + {L})));",
        "const VX_v hv = VX_mul(VX_tanh(cn), go);",
        "VX_storeu((float *)cp_, cn);",
        f"VX_storeu(hn + b * {hp} + ub * {L}, hv);",
    ]
    if y:
        gates += [f"{{ float hy[{L}]; VX_storeu(hy, hv);",
                  f"  float *restrict yo = Y + ((t * {dirs} + d) * {batch} + b) * {hidden} + ub * {L};",
                  f"  for (long l = 0; l < SMELT_MIN({L}L, {hidden} - ub * {L}L); ++l) yo[l] = hy[l]; }}"]
    lines = [
        f"const {'int8_t' if gr == QUAD else 'int16_t'} *restrict RP = {rp};",
        f"const float *restrict RS = {rs}, *restrict BS = {bsum}, *restrict GX = {gx};",
        *([f"const int32_t *restrict RCS = {rcs_p};"] if gr == QUAD else []),
        *([f"const float *restrict PP = {pp};"] if pp else []),
        f"float *restrict H = {hbuf}, *restrict C = {cbuf};",
        *([f"float *restrict Y = {y};"] if y else []),
        f"int32_t *restrict QA = {qa} + (long)tid * {qstride};",
        f"float *restrict QP = {qp} + (long)tid * {pstride};",
        f"int32_t *restrict T = {tile} + (long)tid * {tstride};",
        f"{vx}_flag *flags = ({vx}_flag *){flags};",
        "/* two directions on two or more threads: one group each; else one group runs them in turn */",
        f"const int ng = ({dirs} == 2 && nt >= 2) ? 2 : 1;",
        "const int gid = (ng == 2 && tid >= nt / 2) ? 1 : 0;",
        "const int gstart = gid ? nt / 2 : 0, gsize = ng == 2 ? (gid ? nt - nt / 2 : nt / 2) : nt;",
        f"const int lid = tid - gstart, nact = SMELT_MIN(gsize, {par});",
        "if (lid >= nact) return;",
        "long p0, p1; smelt_range(" + str(npan) + ", lid, nact, &p0, &p1);",
        "unsigned epoch = 0;",
        f"for (long d = gid; d < {dirs}; d += ng) {{",
        f"    const int reverse = {reverse}; (void)reverse;",
        f"    for (long s = 0; s < {seq}; ++s) {{",
        f"        const long t = reverse ? {seq - 1} - s : s;",
        f"        const float *restrict hprev = H + (d * 2 + (s & 1)) * {batch * hp};",
        f"        float *restrict hn = H + (d * 2 + ((s + 1) & 1)) * {batch * hp};",
        # no initial h: step 0's h is zero, so h.R adds exactly nothing (its zero range quantizes
        # to zeros with zero point 0): the gates start from X.W (a T=1 call reads no R at all)
        f"        const int zero_h = s == 0 && {0 if ih else 1};",
        # the whole previous h, in onnxruntime's groups of rows (``h_quant_rows``): each
        # group's range, then its rows' uint8 quantization (every thread of the group does it
        # for itself: H values against a second barrier per step)
        f"        for (long b0 = 0; b0 < {batch} && !zero_h; b0 += {qrows}) {{",
        f"            const long b1 = SMELT_MIN(b0 + {qrows}, {batch}L);",
        "            VX_v vlo = VX_zero(), vhi = VX_zero();",
        f"            for (long k = b0 * {hp}; k < b1 * {hp}; k += {L}) {{ const VX_v x = VX_loadu(hprev + k); "
        "vlo = VX_min(x, vlo); vhi = VX_max(x, vhi); }",
        f"            float tl[{L}], th[{L}], lo = 0.0f, hi = 0.0f; VX_storeu(tl, vlo); VX_storeu(th, vhi);",
        f"            for (int l = 0; l < {L}; ++l) {{ lo = tl[l] < lo ? tl[l] : lo; hi = th[l] > hi ? th[l] : hi; }}",
        "            float hs, hz;",
        *["            " + line for line in uint8_params("lo", "hi", "hs", "hz").splitlines()],
        "            for (long b = b0; b < b1; ++b) {",
        f"                const float *restrict hr = hprev + b * {hp};",
        "                QP[2 * b] = hs; QP[2 * b + 1] = hz;",
        *["                " + line for line in _quantize_words(f"(QA + b * {kwh})", "hr", hp, hp, "hs", "hz", gr)],
        "            }",
        "        }",
        "        for (long p = p0; p < p1; ++p) {",
        f"            const {'int8_t' if gr == QUAD else 'int16_t'} *restrict rpan = RP + (d * {npan} + p) * {kwh * nrr * gr}L;",
        f"            for (long rb0 = 0; rb0 < {batch}; rb0 += {mrr}) {{",
        f"                const long mr = SMELT_MIN({mrr}L, {batch} - rb0);",
                "if (!zero_h) {",
        *["                " + line for line in rkernel],
        "                }",
        "                for (long r = 0; r < mr; ++r) {",
        "                    const long b = rb0 + r;",
        f"                    const float *restrict gxr = GX + (d * {rows} + t * {batch} + b) * {n4p} + p * {nrr};",
        f"                    const float *restrict rsr = RS + d * {n4p} + p * {nrr};",
        f"                    float gts[{nrr}];",
        f"                    if (zero_h) for (long jj = 0; jj < {nrr}; ++jj) gts[jj] = gxr[jj];",
        "                    else {",
        "                        const float hs = QP[2 * b]; const int32_t hzi = (int32_t)QP[2 * b + 1]; (void)hzi;",
        f"                        for (long jj = 0; jj < {nrr}; ++jj) gts[jj] = (float){racc} * (hs * rsr[jj]) + gxr[jj];",
        "                    }",
        f"                    for (long u = 0; u < {upp}; ++u) {{",
        f"                        const long ub = p * {upp} + u; const float *gt = gts + u * {4 * L};",
        *["                        " + line for line in gates],
        "                    }",
        "                }",
        "            }",
        "        }",
        f"        if (nact > 1 && s + 1 < {seq}) {vx}_sync(flags + gstart, lid, nact, ++epoch);",
        "    }",
    ]
    fin = f"H + (d * 2 + {seq % 2}) * {batch * hp}"
    for name, buf in ((yh, fin), (yc, f"C + d * {batch * hp}")):
        if name:
            lines += [f"    for (long b = 0; b < {batch}; ++b)",
                      f"        for (long k = p0 * {upp * L}; k < SMELT_MIN(p1 * {upp * L}, {hidden}L); ++k)",
                      f"            {name}[(d * {batch} + b) * {hidden} + k] = ({buf})[b * {hp} + k];"]
    lines.append("}")
    code = "\n".join(lines).replace("VX_", f"{vx}_")
    dot = "u8s8_dot_acc" if gr == QUAD else "i16_dot_acc"
    em.schedule(algorithm="DeepCPU on integers: X quantized once, X.W of every step hoisted into one integer GEMM; "
                          "per step h quantized in onnxruntime's row groups, h.R on each thread's resident panels, "
                          "gates fused in registers",
                kernel="dq_lstm",
                micro_kernel=(f"{mrr}x{nrr} {v.name} {v.x(dot, a='a', b='b', c='c')}" if vec else f"{mrr}x{nrr} portable pairs"),
                layout=f"gate columns permuted into panels of {upp} x 16 units x 4 gates, hidden padded to {hp}",
                threads=(f"recurrence on up to {par} thread(s) per direction (panels fixed per thread)"
                         + (", one thread per direction" if dirs == 2 else "")))
    # only a split recurrence has a barrier inside: the other steps (and a one-thread-per-
    # direction recurrence: two directions on fewer than 3 threads; one step, which meets no
    # barrier) stay shareable, so a late or descheduled worker costs no wait
    em.step(code, name=f"dq_lstm_recurrence_{v.name}{'_u8s8' if gr == QUAD else ''}",
            doc=f"seq={seq} batch={batch} input={isz} hidden={hidden} directions={dirs}",
            synchronize=par > 1 and (dirs == 1 or threads >= 3) and seq > 1)
