"""The recurrence cell for one direction, one time step, a range of hidden blocks: the register
tiles of ``XW[t] + h·R^T`` and the gate math per (row, hidden block)."""

from __future__ import annotations

from smelt.codegen.kernels.isa import VectorIsa
from smelt.codegen.kernels.rnn_config import (
    REC_GROUP_ROWS,
    VL,
    RnnConfig,
    gate_split_parts,
    tile_rows,
)
from smelt.codegen.kernels.tile import RegisterTile
from smelt.codegen.templates.rnn.common import CB, VX, _row_chunks
from smelt.codegen.templates.rnn.gates import act_code, clip_code

# --------------------------------------------------------------------------------------------
# C: the recurrence cell for one direction, one time step, a range of hidden blocks
# --------------------------------------------------------------------------------------------
# Rows of a native-vector tile (_native_dot_code), where the logical tile holds one row: AVX2
# LSTM, 2 rows x at most 6 ymm per pass (12 accumulators + 2 broadcasts + 1 load of the 16
# ymm; the LSTM's 8 ymm per row in 2 passes of 4). Perf samples of the recurrence kernels, LSTM
# forced to AVX2 on Zen 4, 1 thread: H=256 B=10 T=50 4140 -> 3491, H=128 B=8 3804 -> 3308,
# H=128 B=4 3481 -> 2798 (3 rows x 3 ymm with the loads first: about the same; the GRU's 2-row
# logical tile gained nothing as a native one, and without "unroll 2" no variant gained).
NATIVE_TILE_ROWS = 2


def _gate_groups(gates: list[int], most: int) -> list[list[int]]:
    """``gates`` cut into balanced runs of at most ``most`` consecutive gates."""
    out, i = [], 0
    for size, count in _row_chunks(len(gates), most):
        for _ in range(count):
            out.append(gates[i:i + size])
            i += size
    return out


def _tile_nb(G: int, mb: int, budget: int) -> int:
    """Hidden blocks per register tile of ``mb`` batch rows (at most ``budget`` accumulators)."""
    return max(1, min(budget // (mb * G), max(1, 8 // G)))


def _dot_code(cfg: RnnConfig, gates: list[int], mb: int, nb: int, kin_lbr: bool, pf_ahead: int = 0,
              acc_gates: list[int] | None = None) -> str:
    """FNAME_d{mb}x{nb}(Rp, xw, h, rbh, hb, acc, k0, k1, hbn, fresh): the gate pre-activations of
    ``mb`` batch rows x ``nb`` hidden blocks, ``h·R^T`` over k in [k0, k1) accumulated in registers
    onto XW (``fresh``) or onto ``acc`` (a K range before), stored to ``acc`` (``hbn``: the first
    hidden block of the tile the cell computes next, whose XW a fresh call prefetches).
    ``pf_ahead`` > 0: the variant ``FNAME_d{mb}x{nb}p`` also prefetches R that many k ahead into L2.

    A separate non-inlined function on purpose: inlined into the cell, GCC hoisted the gate
    math's ~20 vector constants out of the hidden-block loop into registers, and the 20-24
    accumulators of a batch tile then spilled to the stack on every FMA (B=10 LSTM ran at 30%
    of peak). Storing and reloading the accumulators once per 256-long K loop costs nothing.
    """
    G, H, N = cfg.G, cfg.H, cfg.ntot
    ks, gst = (VL, H * VL) if cfg.rgm else (G * VL, VL)  # R strides of k and of a gate
    sfx = "p" if pf_ahead else ""
    name = f"d{mb}x{nb}{sfx}"
    if acc_gates is not None:  # a gate-split pass: a subset of the gates, accumulators at their place in acc
        name = f"s{mb}g{''.join(str(g) for g in gates)}"

    acc_order = gates if acc_gates is None else acc_gates  # the gates of one (row, block) in acc

    def slot(m: int, n: int, g: int) -> int:
        return (m * nb + n) * len(acc_order) + acc_order.index(g)

    L = [f"static __attribute__((noinline)) void FNAME_{name}(const float *Rp, const float *xw, "
         "const float *h, const float *rbh, long hb, float *acc, long k0, long k1, long hbn, int fresh) {",
         "    (void)rbh; (void)hbn;"]
    for n in range(nb):
        L.append(f"    const float *rp{n} = Rp + (hb + {n}) * {H * G * VL}L;")
    for m in range(mb):
        L.append(f"    const float *h{m} = h + {m * cfg.Hp}L;")
    # J axis: the (hidden block, gate) vectors of R; rows: the batch rows, h[m][k] broadcast.
    # Broadcasts first, then per vector its load and a FMA per row (few rows, up to 8 vectors).
    pairs = [(n, g) for n in range(nb) for g in gates]
    tile = RegisterTile(VX, len(pairs), mb, acc_fmt="a{r}_{j}", vec="w", bcast="h{r}k",
                        labels=tuple(f"{n}_{g}" for n, g in pairs), hoist_broadcasts=True)

    def init(j: int, m: int) -> str:
        n, g = pairs[j]
        if kin_lbr and g == 2:
            first = VX.load(f"rbh + (hb + {n}) * {VL}")
        else:
            first = VX.load(f"xw + {m * N}L + (hb + {n}) * {G * VL} + {g * VL}")
        return f"fresh ? {first} : {VX.load(f'acc + {slot(m, n, g) * VL}')}"

    L += ["    " + x for x in tile.declare(init, by_row=True, one_per_line=True)]
    # XW of this step was written by the projection GEMM long before (T*B rows of it do not fit
    # L2), so the accumulators' first loads came from L3: fetch the next tile's lines now, a whole
    # K loop ahead (GRU B=10 H=256: recurrence 1.71 -> 1.57 ms).
    L.append("    if (fresh) {")
    for m in range(mb):
        for g in (gates if acc_gates is not None else range(G)):  # gate-split: each pass its own gates
            L.append(f"        __builtin_prefetch(xw + {m * N}L + hbn * {G * VL} + {g * VL}, 0, 3);")
    L.append("    }")
    # Few accumulators (batch 1): each is one FMA chain over K, 4 cycles per link, so the loop is
    # latency bound; a second set over odd k halves the chain (summed at the end).
    split = 2 * tile.J * tile.R <= cfg.acc_budget

    def body(t: RegisterTile, k: str) -> None:
        def prefetch(j: int) -> list[str]:
            n, g = pairs[j]
            return [f"__builtin_prefetch(rp{n} + ({k} + {pf_ahead}) * {ks} + {g * gst}, 0, 2);"] if pf_ahead else []

        L.extend(t.fma_step(lambda j: VX.load(f"rp{pairs[j][0]} + ({k}) * {ks} + {pairs[j][1] * gst}"),
                            lambda m: VX.set1(f"h{m}[{k}]"), indent="        ", before_load=prefetch))

    if split:
        odd = tile.second()
        L += ["    " + x for x in odd.declare("zero", by_row=True, one_per_line=True)]
        L.append("    long k = k0;")
        L.append("    for (; k + 1 < k1; k += 2) {")
        body(tile, "k")
        body(odd, "k + 1")
        L.append("    }")
        L.append("    if (k < k1) {")
        body(tile, "k")
        L.append("    }")
        L += ["    " + x for x in tile.add(odd, by_row=True)]
    else:
        L.append("    #pragma GCC unroll 2")
        L.append("    for (long k = k0; k < k1; ++k) {")
        body(tile, "k")
        L.append("    }")
    for j, m in tile.each(by_row=True):
        n, g = pairs[j]
        L.append("    " + VX.store(f"acc + {slot(m, n, g) * VL}", tile.acc(j, m)))
    L.append("}")
    return "\n".join(L)


def _native_dot_code(cfg: RnnConfig, nv: VectorIsa, gates: list[int], mb: int, kin_lbr: bool,
                     pf_ahead: int = 0) -> str:
    """FNAME_d{mb}x1[p]: ``_dot_code``'s kernel (same arguments, same ``acc`` layout) for one
    hidden block, as register tiles of the target's native vectors (``nv``: ``lanes`` < 16, so a
    logical vector is several of them): the block's G x 16/lanes native vectors in balanced
    passes, each pass a J x mb tile (broadcasts first) over the K range of the call, whose R
    block the K blocking keeps in L1. On AVX2 the LSTM's logical tile is one row (4 gates x 2
    ymm = 8 accumulators of the 6 x 2 budget): every R vector was loaded once per FMA, and the
    8 FMA chains were just enough to cover the FMA latency; 2 rows x 4 ymm per pass loads each
    R vector once for two FMAs."""
    G, H, N = cfg.G, cfg.H, cfg.ntot
    w = nv.lanes
    ks, gst = (VL, H * VL) if cfg.rgm else (G * VL, VL)
    name = f"d{mb}x1{'p' if pf_ahead else ''}"
    vecs = [(g, q) for g in gates for q in range(VL // w)]  # (gate, native part of the logical vector)
    jp_most = max(1, (nv.registers - 1 - mb) // mb)  # J x mb accumulators + mb broadcasts + 1 load
    npass = -(-len(vecs) // jp_most)
    L = [f"static __attribute__((noinline)) void FNAME_{name}(const float *Rp, const float *xw, "
         "const float *h, const float *rbh, long hb, float *acc, long k0, long k1, long hbn, int fresh) {",
         "    (void)rbh; (void)hbn;",
         f"    const float *rp0 = Rp + hb * {H * G * VL}L;"]
    for m in range(mb):
        L.append(f"    const float *h{m} = h + {m * cfg.Hp}L;")
    L.append("    if (fresh) {")
    for m in range(mb):
        for g in range(G):
            L.append(f"        __builtin_prefetch(xw + {m * N}L + hbn * {G * VL} + {g * VL}, 0, 3);")
    L.append("    }")

    def at(m: int, g: int, q: int) -> str:  # the floats of (row m, gate g, part q) in acc
        return f"acc + {(m * len(gates) + gates.index(g)) * VL + q * w}"

    i = 0
    for p in range(npass):
        part = vecs[i:i + -(-(len(vecs) - i) // (npass - p))]
        i += len(part)
        tile = RegisterTile(nv, len(part), mb, acc_fmt="c{j}_{r}", vec="r", bcast="b{r}", hoist_broadcasts=True)

        def init(j: int, m: int, part: list[tuple[int, int]] = part) -> str:
            g, q = part[j]
            first = (f"rbh + hb * {VL} + {q * w}" if kin_lbr and g == 2
                     else f"xw + {m * N}L + hb * {G * VL} + {g * VL + q * w}")
            return f"fresh ? {nv.load(first)} : {nv.load(at(m, g, q))}"

        def pf(j: int, part: list[tuple[int, int]] = part) -> list[str]:
            g, q = part[j]
            return ([f"__builtin_prefetch(rp0 + (k + {pf_ahead}) * {ks} + {g * gst}, 0, 2);"]
                    if pf_ahead and q == 0 else [])

        L.append("    {")
        L += ["        " + x for x in tile.declare(init)]
        L.append("        #pragma GCC unroll 2")
        L.append("        for (long k = k0; k < k1; ++k) {")
        L += tile.fma_step(lambda j, part=part: nv.load(f"rp0 + k * {ks} + {part[j][0] * gst + part[j][1] * w}"),
                           lambda m: nv.set1(f"h{m}[k]"), indent="            ", before_load=pf)
        L.append("        }")
        L += ["        " + nv.store(at(m, *part[j]), tile.acc(j, m)) for j, m in tile.each()]
        L.append("    }")
    L.append("}")
    return "\n".join(L)


def _tile_plan(cfg: RnnConfig, ng: int, dynamic: bool, rows: set[int] | None,
               native: VectorIsa | None) -> tuple[int, bool, list[int], set[tuple[int, int]]]:
    """(most rows of a chunk, native-vector tiles, chunk sizes, (rows, hidden blocks) tiles) of
    a cell computing ``ng`` gates (see cell_code)."""
    mb_most = tile_rows(ng, cfg.acc_budget)
    # A logical tile of one row (AVX2 LSTM: 4 gates x 2 ymm of the 6 x 2 budget): rows of 2 and
    # more run as native-vector tiles instead (_native_dot_code); rows of 1 keep the logical tile
    # (its split accumulator set for batch 1; batch 1 renders as without native tiles).
    native_rows = native is not None and mb_most == 1 and (dynamic or max(rows or {cfg.B}) > 1)
    if native_rows:
        mb_most = NATIVE_TILE_ROWS
    row_counts = sorted(rows or {cfg.B})
    if dynamic:
        sizes = list(range(1, mb_most + 1))
    else:
        sizes = sorted({s for bc in row_counts if bc > 0 for s, _ in _row_chunks(bc, mb_most)})
    # (rows, hidden blocks) tiles: a group of nbt hidden blocks is chosen by the largest chunk
    # (q + 1 rows, or q), and every chunk of that group uses it; leftover blocks go one by one
    pairs: set[tuple[int, int]] = {(mb, 1) for mb in sizes}
    for mb0 in (sizes if dynamic else [_row_chunks(bc, mb_most)[0][0] for bc in row_counts if bc > 0]):
        nbt = 1 if native_rows and mb0 > 1 else _tile_nb(ng, mb0, cfg.acc_budget)
        pairs |= {(mb, nbt) for mb in (mb0 - 1, mb0) if mb in sizes}
    return mb_most, native_rows, sizes, pairs


def gate_split_plan(cfg: RnnConfig, ng: int, rows: set[int]) -> dict[int, list[int]]:
    """{a thread's row count: its gate-split parts} for the row counts that run as gate-split
    passes over ``ng`` gates (R packed gate-major; see gate_split_parts), the others absent."""
    return {bc: parts for bc in sorted(rows) if cfg.rgm
            for parts in [gate_split_parts(bc, ng, cfg.acc_budget, cfg.two_parts)] if parts}


def part_acc_floats(cfg: RnnConfig, phase: str, rows: set[int], native: VectorIsa | None) -> int:
    """Floats of the accumulators one thread's cell call keeps from part 1 to part 2 (the K
    split around the step barrier, see cell_code): every (hidden block, row group) of its
    largest row count, as many hidden blocks as a direction has (an upper bound on a share)."""
    ng = {"": cfg.G, "a": 2, "b": 1}[phase]
    mb_most, _, _, pairs = _tile_plan(cfg, ng, False, rows, native)
    chunk_acc = max(mb * nb for mb, nb in pairs) * ng * VL
    cpg = max(1, REC_GROUP_ROWS // mb_most)
    nch = -(-max(rows) // mb_most)
    gs = max(gate_split_plan(cfg, ng, rows), default=0)  # gate-split rows: all of them per hidden block
    return cfg.nhb * max(-(-nch // cpg) * cpg * chunk_acc, gs * ng * VL)


def cell_code(cfg: RnnConfig, d: int, phase: str = "", dynamic: bool = False,
              rows: set[int] | None = None, l2_bytes: int = 0, native: VectorIsa | None = None) -> str:
    """FNAME(Rp, xw, hp, hn, cs, pp, rbh, zb, rh, y, slen, t, hb0, hb1, blo, bhi, ybs, zh, part,
    ko0, ko1, pacc) for direction ``d``: hidden blocks [hb0, hb1) of batch rows [blo, bhi).
    ``zh`` != 0: the previous h is all zeros (the first step without an initial state), so h·R
    is skipped (the tiles start from XW and run an empty K range): a T=1 LSTM E=H=256 reads 1 MiB
    of weights instead of 2. ``part``: 0 the whole cell; 1 only h·R over k in [ko0, ko1) (the h
    this thread wrote, before it waits for its peers), every tile's accumulators left in
    ``pacc`` (part_acc_floats); 2 the rest of K onto them, then the gate math (the driver's
    split step barrier).

    ``phase``: "" (LSTM, RNN, GRU lbr=1: whole cell), "a" (GRU lbr=0: z, r and r ⊙ h) or "b"
    (GRU lbr=0: (r ⊙ h)·Rh, the candidate and the new state). The row range and ``ybs``
    (Y's batch stride) are run-time arguments; the rows are cut into balanced chunks of at most
    ``mb_most`` rows, each a register tile. With ``dynamic`` every chunk size 1..mb_most has a
    kernel (B is unknown at compile time); otherwise only the sizes that the row counts in
    ``rows`` (default {B}: a thread's share of the batch under the partition grid) need.
    When the direction's R exceeds 3/4 of ``l2_bytes`` (it is streamed from L3 every step), odd
    time steps walk the hidden blocks in reverse and the second row chunk prefetches R (below).
    """
    op, G, H, Hp, B, N = cfg.op, cfg.G, cfg.H, cfg.Hp, cfg.B, cfg.ntot
    acts = cfg.acts[d]
    gates = {"": list(range(G)), "a": [0, 1], "b": [2]}[phase]
    ng = len(gates)
    mb_most, native_rows, sizes, pairs = _tile_plan(cfg, ng, dynamic, rows, native)

    def tile_nb(mb: int) -> int:
        return 1 if native_rows and mb > 1 else _tile_nb(ng, mb, cfg.acc_budget)

    def dot(mb: int, nb: int, pf: int) -> str:
        if native_rows and mb > 1:
            return _native_dot_code(cfg, native, gates, mb, kin_lbr, pf)
        return _dot_code(cfg, gates, mb, nb, kin_lbr, pf)
    row_counts = sorted(rows or {B})
    last_mask = (1 << (H % VL)) - 1 if H % VL else 0
    nhb = cfg.nhb
    def clip(e: str) -> str:
        return clip_code(cfg, e)

    kin_lbr = op == "GRU" and cfg.lbr

    def act(slot: int, e: str) -> str:
        name, a, b = acts[slot]
        return act_code(name, a, b, e)

    kin = "rh" if phase == "b" else "hp"
    # K block: the nb hidden blocks' R rows of one K block stay in L1 while every chunk of a row
    # group streams them (otherwise each chunk re-read the slice from L2; at H=1024 from L3).
    # R within L2 (or just at it, mostly kept there by the reverse walk below): <= 16 KiB, half
    # of a 32 KiB L1, so the chunks' h rows and accumulators fit beside it (a 32 KiB block
    # filled L1 and lost ~3.5% of the recurrence: LSTM E=H=256 B=20, 1 thread, recurrence vs
    # projection perf samples). R beyond L2: 32 KiB, as the block is also the distance the
    # prefetch runs ahead of the L3 stream (16 KiB lost 2-4% at H=1024 B=20).
    # One chunk: no blocking, the accumulators never leave registers.
    nb_most = max(nb for _, nb in pairs)
    rbytes = cfg.nhb * H * G * VL * 4
    kc = max(16, min(H, ((32768 if l2_bytes and rbytes > l2_bytes else 16384) // (nb_most * G * VL * 4)) // 16 * 16))
    stream = bool(l2_bytes) and rbytes > l2_bytes * 3 // 4
    # R beyond L2 is streamed from L3 every step (H=1024). Then odd steps walk the hidden blocks
    # in reverse, so a step starts on the blocks the last one ended with, still in L2 (batch 1,
    # T=100, recurrence: LSTM 29.7 -> 25.7 ms, GRU 22.1 -> 18.0 ms); and with several row chunks
    # the second chunk of a K block, which finds R in L1, prefetches the next K block into L2, so
    # the L3 stream overlaps that chunk's FMAs instead of stalling the first chunk (B=10, 20:
    # 3.5% on 3 of 4 shapes).
    pf_chunk = stream and (dynamic or any(bc > mb_most for bc in row_counts))
    kernels = [dot(mb, nb, pf) for mb, nb in sorted(pairs)
               for pf in ((0, kc) if pf_chunk else (0,))]
    # Gate split: a thread's rows in one tile, over the gates in passes (see GATE_SPLIT_ROWS)
    # (with the logical tile's rows, as the schedule chose R's gate-major packing by: at 2 rows
    # the gate split was 1-2% faster than the native tiles, AVX2 LSTM H=256 B=2)
    # (a thread's rows beyond GATE_SPLIT_ROWS: two parts of gate-split passes, gate_split_parts)
    gs_parts = gate_split_plan(cfg, ng, set(row_counts))
    gs_rows = list(gs_parts)
    gs_sizes = sorted({pr for parts in gs_parts.values() for pr in parts})
    gs_groups = {pr: _gate_groups(gates, max(1, cfg.acc_budget // pr)) for pr in gs_sizes}
    kernels += [_dot_code(cfg, grp, pr, 1, kin_lbr, acc_gates=gates) for pr in gs_sizes for grp in gs_groups[pr]]

    # the gate math of one (row, hidden block) of a tile; a{g} are the loaded accumulators
    L: list[str] = []
    L.append("static inline __attribute__((always_inline)) void FNAME_g(const float *acc, const float *xw, "
             "const float *hp, float *hn, float *cs, const float *pp, float *zb, float *rh, float *y, "
             "const int32_t *slen, int t, long b, long hbn, long ybs) {")
    L.append("    (void)xw; (void)cs; (void)pp; (void)zb; (void)rh; (void)y; (void)slen; (void)t; (void)ybs;")
    a = {g: f"a{g}" for g in gates}
    for gi, g in enumerate(gates):
        L.append(f"    VX_v a{g} = VX_load(acc + {gi * VL});")
    L.append(f"    const long j0 = hbn * {VL};")
    if last_mask:
        L.append(f"    const VX_m km = (hbn == {nhb - 1}) ? (VX_m){last_mask}u : (VX_m)0xFFFFu;")
    L.append(f"    const VX_v hpv = VX_load(hp + b * {Hp} + j0);")
    if op == "LSTM":
        L.append(f"    const VX_v cp = VX_load(cs + b * {Hp} + j0);")
        gi_, go, gf, gc = a[0], a[1], a[2], a[3]
        if cfg.p:
            L.append(f"    {gi_} = VX_fma(VX_load(pp + j0), cp, {gi_});")
            if not cfg.input_forget:
                L.append(f"    {gf} = VX_fma(VX_load(pp + {2 * Hp} + j0), cp, {gf});")
        L.append(f"    VX_v xi = {clip(gi_)};")
        L.append(f"    VX_v ig = {act(0, 'xi')};")
        if cfg.input_forget:
            L.append("    VX_v fg = VX_sub(VX_set1(1.0f), ig);")
        else:
            L.append(f"    VX_v xf = {clip(gf)};")
            L.append(f"    VX_v fg = {act(0, 'xf')};")
        L.append(f"    VX_v xc = {clip(gc)};")
        L.append(f"    VX_v cg = {act(1, 'xc')};")
        L.append("    VX_v cn = VX_fma(fg, cp, VX_mul(ig, cg));")
        if cfg.p:
            L.append(f"    {go} = VX_fma(VX_load(pp + {Hp} + j0), cn, {go});")
        L.append(f"    VX_v xo = {clip(go)};")
        L.append(f"    VX_v og = {act(0, 'xo')};")
        L.append(f"    VX_v hv = VX_mul(og, {act(2, 'cn')});")
        if last_mask:
            L.append("    cn = VX_maskz(km, cn);")
    elif op == "RNN":
        L.append(f"    VX_v xg = {clip(a[0])};")
        L.append(f"    VX_v hv = {act(0, 'xg')};")
    elif phase == "a":
        L.append(f"    VX_v xz = {clip(a[0])};")
        L.append(f"    VX_v xr = {clip(a[1])};")
        zr = [f"{act(0, 'xz')}", f"VX_mul({act(0, 'xr')}, hpv)"]
        if last_mask:  # padded lanes (0 * Inf = NaN there) must not reach the real units via Rh
            zr = [f"VX_maskz(km, {e})" for e in zr]
        L.append(f"    VX_store(zb + b * {Hp} + j0, {zr[0]});")
        L.append(f"    VX_store(rh + b * {Hp} + j0, {zr[1]});")
    else:  # GRU: lbr (whole cell) or phase b
        if phase == "b":
            L.append(f"    VX_v zg = VX_load(zb + b * {Hp} + j0);")
            L.append(f"    VX_v xh = {clip(a[2])};")
        else:
            L.append(f"    VX_v xz = {clip(a[0])};")
            L.append(f"    VX_v zg = {act(0, 'xz')};")
            L.append(f"    VX_v xr = {clip(a[1])};")
            L.append(f"    VX_v rg = {act(0, 'xr')};")
            L.append(f"    VX_v xwh = VX_load(xw + b * {N}L + j0 * {G} + {2 * VL});")
            L.append(f"    VX_v xh0 = VX_fma(rg, {a[2]}, xwh);")
            L.append(f"    VX_v xh = {clip('xh0')};")
        L.append(f"    VX_v hh = {act(1, 'xh')};")
        L.append("    VX_v hv = VX_fma(zg, VX_sub(hpv, hh), hh);")
    if phase != "a":
        if last_mask:
            L.append("    hv = VX_maskz(km, hv);")
        L.append("    VX_v yv = hv; (void)yv;")
        if cfg.seq:
            L.append("    if (!(t < slen[b])) {")
            L.append("        hv = hpv; yv = VX_zero();")
            if op == "LSTM":
                L.append("        cn = cp;")
            L.append("    }")
        L.append(f"    VX_store(hn + b * {Hp} + j0, hv);")
        if op == "LSTM":
            L.append(f"    VX_store(cs + b * {Hp} + j0, cn);")
        if cfg.y:
            if last_mask:
                L.append("    VX_mstoreu(y + b * ybs + j0, km, yv);")
            else:
                L.append("    VX_storeu(y + b * ybs + j0, yv);")
    L.append("}")
    gate_fn = "\n".join(L)

    # dispatch: for each group of nb hidden blocks, for each row chunk: dot kernel, then gates
    def call(mb: int, nb: int, pf: bool = False) -> str:
        return (f"FNAME_d{mb}x{nb}{'p' if pf else ''}(Rp, xw + b0 * {N}L, {kin} + b0 * {Hp}L, rbh, hb, "
                f"acc + (c - c0) * {chunk_acc}, k0, k1, hbn, fresh);")

    def switch() -> str:
        if not pf_chunk:
            cases = " ".join(f"case {mb * 64 + nb}: {{ {call(mb, nb)} break; }}" for mb, nb in sorted(pairs))
            return f"switch (mb * 64 + nbt) {{ {cases} default: SMELT_FAIL(); break; }}"
        cases = " ".join(f"case {(mb * 64 + nb) * 2 + int(pf)}: {{ {call(mb, nb, pf)} break; }}"
                         for mb, nb in sorted(pairs) for pf in (False, True))
        return f"switch ((mb * 64 + nbt) * 2 + (c == c0 + 1)) {{ {cases} default: SMELT_FAIL(); break; }}"

    chunk_acc = max(mb * nb for mb, nb in pairs) * ng * VL  # floats of one chunk's accumulators
    cpg = max(1, REC_GROUP_ROWS // mb_most)  # chunks per row group (bounds acc)
    nbt_cases = " ".join(f"case {mb}: nbt0 = {tile_nb(mb)}; break;" for mb in sizes)
    zz_doc = ("; on odd steps in reverse order, so a\n       step starts with the blocks the last one ended with, still in L2" if stream else "")
    gs_code = []
    for bc in gs_rows:
        work, r0 = [], 0
        for pr in gs_parts[bc]:  # per part: its passes, then its rows' gate math
            pa = f"pa + {r0 * ng * VL}"  # the part's rows' accumulators
            work += ["for (int ri = 0; ri < nr; ++ri) if (part == 0 || ka[ri] < kb[ri]) {"]
            work += [f"    FNAME_s{pr}g{''.join(str(g) for g in grp)}(Rp, xw + (blo + {r0}) * {N}L, {kin} + (blo + {r0}) * {Hp}L, "
                     f"rbh, hb, {pa}, ka[ri], kb[ri], hbn, part != 2);" for grp in gs_groups[pr]]
            work += ["}", f"if (part != 1) for (long m = 0; m < {pr}; ++m)",
                     f"    FNAME_g({pa} + m * {ng * VL}, xw, hp, hn, cs, pp, zb, rh, y, slen, t, blo + {r0} + m, hb, ybs);"]
            r0 += pr
        desc = " + ".join(f"{pr} rows x gates {' + '.join(''.join(str(g) for g in grp) for grp in gs_groups[pr])}"
                          for pr in gs_parts[bc])
        body = "\n            ".join(work)
        gs_code.append(f"""if (B == {bc}) {{ /* gate split: {desc}, whole K (of the part's ranges) per pass */
        const long nit = hb1 - hb0;
        for (long it = 0; it < nit; ++it) {{
            const long i = rev ? nit - 1 - it : it, hb = hb0 + i, inx = rev ? i - 1 : i + 1;
            const long hbn = inx < 0 || inx >= nit ? hb : hb0 + inx;
            float *pa = part ? pacc + i * {bc * ng * VL}L : acc;
            {body}
            {CB}
        }}
        return;
    }}""")
    acc_floats = max([cpg * chunk_acc] + [bc * ng * VL for bc in gs_rows])
    return "\n".join(kernels) + "\n" + gate_fn + f"""
static void FNAME(const float *Rp, const float *xw, const float *hp, float *hn, float *cs,
                  const float *pp, const float *rbh, float *zb, float *rh, float *y,
                  const int32_t *slen, int t, int hb0, int hb1, long blo, long bhi, long ybs, int zh,
                  int part, long ko0, long ko1, float *pacc) {{
    const long B = bhi - blo;
    if (B <= 0) return;
    const long KH = zh ? 0 : {H}; /* h = 0: no h·R (one empty K block still runs the tiles' XW loads) */
    float acc_l[{acc_floats}] __attribute__((aligned(64)));
    float *acc = acc_l;
    /* K ranges: part 0 the whole K; part 1 [ko0, ko1) (h this thread wrote) into pacc, no gate
       math; part 2 the rest, [0, ko0) and [ko1, KH), from pacc, then the gate math */
    const long ka[2] = {{ part == 2 ? 0 : part == 1 ? ko0 : 0, ko1 }};
    const long kb[2] = {{ part == 2 ? ko0 : part == 1 ? ko1 : KH, KH }};
    const int nr = part == 2 ? 2 : 1;
    if (part == 2) /* the peers' h just arrived from their cores: ask for all its lines at once */
        for (long b = blo; b < bhi; ++b)
            for (int ri = 0; ri < 2; ++ri)
                for (long k = ka[ri]; k < kb[ri]; k += 16) __builtin_prefetch({kin} + b * {Hp}L + k, 0, 3);
    const int rev = {int(stream)} && (t & 1);
    {chr(10).join(gs_code)}
    /* balanced row chunks of at most {mb_most} rows (at most two distinct sizes), in groups of
       {cpg} chunks; per group, K blocks of {kc} (all chunks per block), then the gate math */
    const long nch = (B + {mb_most - 1}) / {mb_most}, q = B / nch, r = B % nch;
    const long mb0 = r ? q + 1 : q, ngrp = (nch + {cpg - 1}) / {cpg};
    const long kc = nch == 1 ? {H} : {kc};
    long nbt0 = 1;
    switch (mb0) {{ {nbt_cases} default: break; }}
    /* items: groups of nbt0 hidden blocks, then single leftover blocks{zz_doc} */
    const long ngr = (hb1 - hb0) / nbt0, nit = ngr + (hb1 - hb0) % nbt0;
    for (long it = 0; it < nit; ++it) {{
        const long i = rev ? nit - 1 - it : it;
        const long nbt = i < ngr ? nbt0 : 1, hb = i < ngr ? hb0 + i * nbt0 : hb0 + ngr * nbt0 + (i - ngr);
        const long inx = rev ? i - 1 : i + 1; /* the next item, whose XW the dot kernel prefetches */
        const long hbn = inx < 0 || inx >= nit ? hb : inx < ngr ? hb0 + inx * nbt0 : hb0 + ngr * nbt0 + (inx - ngr);
        for (long c0 = 0; c0 < nch; c0 += {cpg}) {{
            const long c1 = SMELT_MIN(c0 + {cpg}, nch);
            if (part) acc = pacc + (i * ngrp + c0 / {cpg}) * {cpg * chunk_acc}L; /* kept across the parts */
            for (int ri = 0; ri < nr; ++ri)
            for (long k0 = ka[ri]; k0 < kb[ri] || (part == 0 && k0 == 0); k0 += kc) {{
                const long k1 = SMELT_MIN(k0 + kc, kb[ri]);
                const int fresh = part != 2 && k0 == ka[ri];
                for (long c = c0; c < c1; ++c) {{
                    const long mb = c < r ? q + 1 : q, b0 = blo + (c < r ? c * (q + 1) : r * (q + 1) + (c - r) * q);
                    {switch()}
                }}
            }}
            if (part == 1) continue;
            for (long c = c0; c < c1; ++c) {{
                const long mb = c < r ? q + 1 : q, b0 = blo + (c < r ? c * (q + 1) : r * (q + 1) + (c - r) * q);
                for (long m = 0; m < mb; ++m) for (long n = 0; n < nbt; ++n)
                    FNAME_g(acc + (c - c0) * {chunk_acc} + (m * nbt + n) * {ng * VL}, xw, hp, hn, cs, pp, zb, rh,
                            y, slen, t, b0 + m, hb + n, ybs);
                {CB}
            }}
        }}
    }}
}}
"""
