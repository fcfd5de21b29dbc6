"""``ai.smelt`` HeadAttention: multi-head scaled dot-product attention per head, fused
(passes/fuse_attention.py makes the node from an exported attention block).

Inputs Q [B, S, H*D], K and V [B, Sk, H*D] (the projections' own layout: head h is columns
h*D .. h*D + D), an optional additive float mask broadcasting to [B, H, S, Sk]; output
[B, S, H*D], head h in the same columns. ``scale`` multiplies QK^T; ``nan_to_zero`` maps a NaN
probability to 0 (the sdpa exports' ``Where(IsNaN(p), 0, p)``).

Two steps. (1) K^T per (batch, head) into scratch, [D][Sk'] with Sk' = Sk rounded up to whole
vectors (zeros after Sk), so QK^T is a broadcast-FMA register tile over keys. (2) Work items of
R = 4 query rows of one head, split evenly over the threads; per item:
- scores: R rows x JV vectors of keys (JV = 4 with 32 registers, 2 with 16) accumulated over D,
  scaled at the store into a per-thread [R][Sk'] buffer (a row past S re-reads the last row, so
  the tile has no row tail; it is never stored);
- per row: the mask row added, max, exp(s - max) and its sum (kernels/rows.py: the softmax
  template's vectorizable expf), each probability scaled by 1/sum (NaN -> 0 when asked) into a
  second per-thread buffer: the probabilities onnxruntime computes, before PV;
- PV: R rows x up to 6 (32 registers) / 3 (16) vectors of D per pass over the keys, each key's V
  row read in place from [B, Sk, H*D]; a head dimension that is no multiple of the vector width
  ends in a masked load and store; stored straight into the output's columns.
An item's scores live in L1/L2 from QK^T to PV: the unfused graph wrote them to memory three
times (MatMul, mask Add, Softmax) and twice more for the NaN guard. Portable C runs the same
order in plain loops, per row.
"""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import BlockEmitter, c_literal
from smelt.codegen.kernels.isa import VectorIsa, vector_isa
from smelt.codegen.kernels.loops import emit_kernel, work_range
from smelt.codegen.kernels.rows import row_expsum_fn, row_expsum_vector_fn, row_reduce_fn
from smelt.codegen.registry import register
from smelt.ir.graph import Graph, Node


def tile_shape(v: VectorIsa) -> tuple[int, int]:
    """(query rows per work item, key vectors per score tile) for a vector ISA.

    Each item streams its head's K^T and V (Sk x D each: 384 KiB apiece for Whisper's 1500 keys)
    from L2 once per pass, so the rows per item set the L2 traffic per FMA. With 32 registers
    8 rows x 3 key vectors (24 accumulators) read half the bytes per FMA of 4 x 4; on Zen 5 that
    was worth a few percent of Whisper-tiny's encoder (the softmax's exp was the bigger cost:
    ``row_expsum_vector_fn``). 16 registers (and portable C): 4 x 2."""
    return (8, 3) if v.vector and v.registers >= 32 else (4, 2)


def _dims(node: Node, g: Graph) -> tuple[int, int, int, int, int]:
    """(B, S, Sk, H, D)."""
    b, s, hd = (int(x) for x in g.values[node.inputs[0]].shape)
    sk = int(g.values[node.inputs[1]].shape[1])
    h = int(node.attr("heads"))
    return b, s, sk, h, hd // h


def _check(node: Node, g: Graph) -> str | None:
    vals = [g.values[i] for i in node.inputs]
    if any(v.dtype != np.float32 or not v.is_static for v in vals) or g.values[node.outputs[0]].dtype != np.float32:
        return "HeadAttention is native for static float32 only"
    q, k, v = (tuple(int(d) for d in x.shape) for x in vals[:3])
    h = int(node.attr("heads", 0))
    if len(q) != 3 or len(k) != 3 or k != v or q[0] != k[0] or q[2] != k[2] or h < 1 or q[2] % h:
        return f"HeadAttention wants Q [B, S, H*D] and K, V [B, Sk, H*D]; got {q}, {k}, {v} with {h} heads"
    if 0 in q or 0 in k:
        return "empty tensor"
    return None


def _mask_strides(node: Node, g: Graph, dims: tuple[int, int, int, int]) -> tuple[int, int, int] | None:
    """Element strides of the mask along B, H, S (0 where it broadcasts); None without a mask."""
    if len(node.inputs) < 4 or not node.inputs[3]:
        return None
    shape = (1,) * (4 - len(g.values[node.inputs[3]].shape)) + tuple(int(d) for d in g.values[node.inputs[3]].shape)
    strides = [0, 0, 0, 1]
    acc = 1
    for ax in range(3, -1, -1):
        strides[ax] = acc if shape[ax] != 1 else 0
        acc *= shape[ax]
    return strides[0], strides[1], strides[2]


@register("HeadAttention", check=_check, name="head_attention", domain="ai.smelt")
def emit_attention(node: Node, g: Graph, em: BlockEmitter) -> None:
    b, s, sk, h, d = _dims(node, g)
    hd = h * d
    scale = c_literal(float(node.attr("scale", 1.0)), "float32")
    nan_to_zero = bool(node.attr("nan_to_zero", 0))
    strides = _mask_strides(node, g, (b, h, s, sk))
    v_isa = vector_isa(em.target)
    lanes = v_isa.lanes
    nrows, jv = tile_shape(v_isa)
    jb = jv * lanes  # keys per score tile
    skp = -(-sk // lanes) * lanes
    full, tail = skp // jb, skp % jb  # whole tiles of jb keys, then one of ``tail`` (ViT's 197: 3 x 64 + 16)
    kt = em.scratch(b * h * d * skp * 4)
    # step 1: K^T per (batch, head) in tiles of jb keys, [tile][D][width], zero-padded to whole
    # vectors: a score tile then reads one contiguous 16 KiB (D 64, jb 64) run instead of D rows
    # 4*Sk' bytes apart
    em.step("\n".join([
        f"const float *restrict K = {em.ptr(node.inputs[1])}; float *restrict KT = {kt};",
        work_range(b * h, b * h > 1),
        "for (long w = wb; w < we; ++w) {",
        f"    const float *restrict src = K + (w / {h}) * {sk * hd} + (w % {h}) * {d};",
        f"    float *restrict dst = KT + w * {d * skp};",
        f"    for (long j = 0; j < {skp}; ++j) {{",
        f"        const long t = j / {jb}, wdt = t < {full} ? {jb} : {tail};",
        f"        float *restrict col = dst + t * {d * jb} + j % {jb};",
        f"        if (j < {sk}) for (long c = 0; c < {d}; ++c) col[c * wdt] = src[j * {hd} + c];",
        "        else for (long c = 0; c < {d}; ++c) col[c * wdt] = 0.0f;".replace("{d}", str(d)),
        "    }",
        "}"]), name="f32_attention_pack_kt",
        doc=f"K^T per head: {full} tiles [{d}][{jb}] + [{d}][{tail}] for {b}x{h} heads")
    # step 2: per item of nrows query rows of one head
    rblocks = -(-s // nrows)
    items = b * h * rblocks
    fmax = row_reduce_fn(em, "max", "float32")
    fexp = row_expsum_vector_fn(em, v_isa) if v_isa.vector else row_expsum_fn(em, "float32", store=True)
    sbuf = em.scratch(em.n_threads * 2 * nrows * skp * 4)
    lines = [f"const float *restrict Q = {em.ptr(node.inputs[0])}; const float *restrict V = {em.ptr(node.inputs[2])};",
             f"const float *restrict KT = {kt}; float *restrict O = {em.ptr(node.outputs[0])};",
             f"float *restrict Sc = {sbuf} + (long)tid * {2 * nrows * skp}; float *restrict P = Sc + {nrows * skp};"]
    if strides is not None:
        lines.append(f"const float *restrict M = {em.ptr(node.inputs[3])};")
    lines += [work_range(items, items > 1),
              "for (long w = wb; w < we; ++w) {",
              f"    const long bh = w / {rblocks}, i0 = (w % {rblocks}) * {nrows}, b = bh / {h}, h = bh % {h};",
              f"    const long rows = SMELT_MIN({nrows}, {s} - i0);",
              f"    const float *restrict kt = KT + bh * {d * skp};",
              f"    const float *restrict vh = V + b * {sk * hd} + h * {d};",
              f"    float *restrict oh = O + (b * {s} + i0) * {hd} + h * {d};"]
    body: list[str] = []
    if v_isa.vector:
        body += _scores_vector(v_isa, nrows, s, d, skp, hd, scale, jv, full, tail)
    else:
        body += _scores_portable(s, d, skp, hd, scale, jb, full, tail)
    body += ["for (long r = 0; r < rows; ++r) {",
             f"    float *restrict sr = Sc + r * {skp}; float *restrict pr = P + r * {skp};"]
    if strides is not None:
        mb, mh, ms = strides
        body.append(f"    const float *restrict mr = M + b * {mb} + h * {mh} + (i0 + r) * {ms};")
        body.append(f"    for (long j = 0; j < {sk}; ++j) sr[j] += mr[j];")
    body += [f"    const float m = {fmax}(sr, {sk});",
             f"    const float inv = 1.0f / {fexp}(pr, sr, {sk}, m);"]
    if nan_to_zero:
        body.append(f"    for (long j = 0; j < {sk}; ++j) {{ const float x = pr[j] * inv; pr[j] = x == x ? x : 0.0f; }}")
    else:
        body.append(f"    for (long j = 0; j < {sk}; ++j) pr[j] *= inv;")
    body.append("}")
    if v_isa.vector:
        body += _pv_vector(v_isa, nrows, d, sk, skp, hd)
    else:
        body += _pv_portable(d, sk, skp, hd)
    lines += ["    " + ln for ln in body] + ["}"]
    mask_doc = "no mask" if strides is None else f"mask strides {strides}"
    emit_kernel(em, f"f32_attention_{nrows}x{jb}_{v_isa.name}", "\n".join(lines),
                f"B={b} S={s} Sk={sk} H={h} D={d}, {nrows} rows per item, {mask_doc}", wide=True)
    em.schedule(algorithm=f"fused multi-head attention (K^T packed; per {nrows} query rows: QK^T tile, softmax, PV)",
                kernel=f"f32_attention_{nrows}x{jb}_{v_isa.name}", threads=f"{items} items of {nrows} rows over the threads")


def _scores_vector(v: VectorIsa, nrows: int, s: int, d: int, skp: int, hd: int, scale: str, jv: int,
                   full: int, tail: int) -> list[str]:
    """Sc[r][j] = scale * q_r . k_j: ``full`` tiles of jv vectors of keys, then one of ``tail``
    keys (rows past S re-read the last row)."""
    jb = jv * v.lanes
    out = [f"const float *restrict q{r} = Q + (b * {s} + i0 + SMELT_MIN({r}, rows - 1)) * {hd} + h * {d};"
           for r in range(nrows)]
    out.append(f"const {v.t} vscale = {v.set1(scale)};")
    if full:
        out.append(f"for (long j = 0; j < {full * jb}; j += {jb}) {{")
        out += ["    " + ln for ln in _score_tile(v, nrows, d, skp, jv, "j")]
        out.append("}")
    if tail:
        out.append("{")
        out += ["    " + ln for ln in _score_tile(v, nrows, d, skp, tail // v.lanes, str(full * jb))]
        out.append("}")
    return out


def _score_tile(v: VectorIsa, nrows: int, d: int, skp: int, nvec: int, j: str) -> list[str]:
    """One tile: nrows x ``nvec`` vectors of keys from key ``j`` (K^T tile [D][nvec lanes])."""
    w = nvec * v.lanes
    out = [f"{v.t} a{r}_{c} = {v.zero()};" for r in range(nrows) for c in range(nvec)]
    out.append(f"const float *restrict kb = kt + {j} * {d};")
    out.append(f"for (long c = 0; c < {d}; ++c) {{")
    out += [f"    {v.t} k{c} = {v.load(f'kb + c * {w} + {c * v.lanes}')};" for c in range(nvec)]
    out.append("    " + _in_registers([f"k{c}" for c in range(nvec)]))
    for r in range(nrows):
        out.append(f"    {{ const {v.t} q = {v.broadcast(f'q{r} + c')};")
        out += [f"      a{r}_{c} = {v.fmadd('q', f'k{c}', f'a{r}_{c}')};" for c in range(nvec)]
        out.append("    }")
    out.append("}")
    out += [v.store(f"Sc + {r * skp} + {j} + {c * v.lanes}", v.op("mul", f"a{r}_{c}", "vscale"))
            for r in range(nrows) for c in range(nvec)]
    return out


def _in_registers(names: list[str]) -> str:
    """An empty asm that takes the loaded vectors as register operands: gcc 12 otherwise folds
    each load into every row's FMA as a memory operand, loading a key (or V) vector once per row
    (4x the loads: the score tile ran at 21 GFLOPS on one Zen 4 core, load-bound)."""
    return "__asm__(\"\" : " + ", ".join(f'"+v"({n})' for n in names) + ");"


def _scores_portable(s: int, d: int, skp: int, hd: int, scale: str, jb: int, full: int, tail: int) -> list[str]:
    return ["for (long r = 0; r < rows; ++r) {",
            f"    const float *restrict qr = Q + (b * {s} + i0 + r) * {hd} + h * {d};",
            f"    float *restrict sr = Sc + r * {skp};",
            f"    for (long j = 0; j < {skp}; ++j) sr[j] = 0.0f;",
            f"    for (long j = 0; j < {skp}; j += {jb}) {{",
            f"        const long wdt = j < {full * jb} ? {jb} : {tail};",
            "        for (long c = 0; c < " + str(d) + "; ++c) {",
            f"            const float qv = qr[c]; const float *restrict kr = kt + j * {d} + c * wdt;",
            "            for (long l = 0; l < wdt; ++l) sr[j + l] += qv * kr[l]; } }",
            f"    for (long j = 0; j < {skp}; ++j) sr[j] *= {scale};",
            "}"]


def _pv_vector(v: VectorIsa, nrows: int, d: int, sk: int, skp: int, hd: int) -> list[str]:
    """O[r][c] = sum_j P[r][j] V[j][c], in passes of up to 24 (32 registers) or 12 accumulators,
    the vectors of D shared evenly between the passes (D 64 at 8 rows: 2 + 2, not 3 + 1)."""
    nvec = -(-d // v.lanes)
    most = max(1, (24 if v.registers >= 32 else 12) // nrows)
    passes = -(-nvec // most)
    per_pass = -(-nvec // passes)
    tail = d % v.lanes
    out = [f"const {v.mask_type} dmask = {v.lane_mask(str(tail))};"] if tail else []
    for c0 in range(0, nvec, per_pass):
        cols = range(c0, min(nvec, c0 + per_pass))

        def mask(c: int) -> str | None:
            return "dmask" if tail and c == nvec - 1 else None

        out.append("{")
        out += [f"    {v.t} o{r}_{c} = {v.zero()};" for r in range(nrows) for c in cols]
        out.append(f"    for (long j = 0; j < {sk}; ++j) {{")
        out.append(f"        const float *restrict vr = vh + j * {hd};")
        out += [f"        {v.t} x{c} = {v.masked_load(f'vr + {c * v.lanes}', mask(c))};" for c in cols]
        out.append("        " + _in_registers([f"x{c}" for c in cols]))
        for r in range(nrows):
            out.append(f"        {{ const {v.t} p = {v.broadcast(f'P + {r * skp} + j')};")
            out += [f"          o{r}_{c} = {v.fmadd('p', f'x{c}', f'o{r}_{c}')};" for c in cols]
            out.append("        }")
        out.append("    }")
        for r in range(nrows):
            stores = " ".join(v.masked_store(f"oh + {r * hd + c * v.lanes}", f"o{r}_{c}", mask(c)) for c in cols)
            out.append(f"    if (rows > {r}) {{ {stores} }}")
        out.append("}")
    return out


def _pv_portable(d: int, sk: int, skp: int, hd: int) -> list[str]:
    return ["for (long r = 0; r < rows; ++r) {",
            f"    float acc[{d}] = {{0}}; const float *restrict pr = P + r * {skp};",
            f"    for (long j = 0; j < {sk}; ++j) {{ const float pj = pr[j]; const float *restrict vr = vh + j * {hd};",
            f"        for (long c = 0; c < {d}; ++c) acc[c] += pj * vr[c]; }}",
            f"    for (long c = 0; c < {d}; ++c) oh[r * {hd} + c] = acc[c];",
            "}"]
