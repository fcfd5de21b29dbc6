"""The step / barrier driver: scratch, weights, the per-thread partition of every time step,
the group barriers, and the registration of the template (``rnn_native``)."""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import BlockEmitter
from smelt.codegen.kernels.rnn_config import (
    VL,
    config,
    tile_rows,
)
from smelt.codegen.kernels.rnn_vec import vmath_source
from smelt.codegen.registry import register
from smelt.codegen.templates.rnn.cell import cell_code, gate_split_plan, part_acc_floats
from smelt.codegen.templates.rnn.common import CB, _schedule, _scratch, native_vector
from smelt.codegen.templates.rnn.dynamic import _dyn_output_shapes
from smelt.codegen.templates.rnn.packing import _pack_code, pack_bias, pack_p, pack_r, pack_w
from smelt.codegen.templates.rnn.pipeline import emit_pipeline
from smelt.codegen.templates.rnn.projection import gemm_code
from smelt.errors import VerifyError
from smelt.ir.graph import Graph, Node


# --------------------------------------------------------------------------------------------
# configuration
# --------------------------------------------------------------------------------------------
def check_rnn(node: Node, g: Graph) -> str | None:
    cfg, why = config(node, g)
    return None if cfg is not None else why


@register(("LSTM", "GRU", "RNN"), versions=(7, 14, 22), check=check_rnn, name="rnn_native")
def emit_rnn(node: Node, g: Graph, em: BlockEmitter) -> None:
    cfg, why = config(node, g)
    assert cfg is not None, why
    sched = _schedule(node)
    cfg.acc_budget = sched.acc_budget
    readers = g.consumers()
    for attr in ("y", "yh", "yc"):  # an output nothing reads is not computed
        name = getattr(cfg, attr)
        if name and name not in g.outputs and not readers.get(name):
            setattr(cfg, attr, "")
    by_name = {n.name: n for n in g.nodes}
    chain = [by_name[m] for m in sched.pipeline]
    if chain:  # stacked layers under the pipeline plan: the head's step computes them all
        if chain[0] is node:
            emit_pipeline(chain, g, em)
        else:
            em.schedule(algorithm=f"computed by the pipeline step of {chain[0].name}")
        return
    G, T, B, H, Hp, D, N = cfg.G, cfg.T, cfg.B, cfg.H, cfg.Hp, cfg.D, cfg.ntot
    nhb = cfg.nhb
    vx = em.function("rnn_vmath", vmath_source("FNAME", em.target), doc="RNN vector math: exp/sigmoid/tanh, activations, group barrier")

    def fn(base: str, code: str, doc: str) -> str:
        return em.function(base, code.replace("VX_", f"{vx}_"), doc=doc)

    # ---- the schedule (smelt/schedule/rnn.py): level, grids, direction order, R packing ----
    mode = sched.level
    dynamic = bool(node.attr("smelt_dynamic", 0))
    P = max(1, em.n_threads)
    if sched.threads != P:
        raise VerifyError(f"{node.op} node {node.name!r}: its schedule is for {sched.threads} threads, "
                         f"the code is generated for {P}")
    Tmax, Bmax = T, B  # scratch is sized for these; dynamic mode reads the actual T, B at run time
    if dynamic:  # this node's (T, B), per instance: smelt.runtime.module writes them before each call
        dims_at = em.state(2 * 8)
        tb_decl = (f"const long T = (long)((const int64_t *)(state + {dims_at}))[0], "
                   f"B = (long)((const int64_t *)(state + {dims_at}))[1];\n"
                   f"if (T < 1 || T > {Tmax} || B < 1 || B > {Bmax}) {{ SMELT_FAIL(); return; }}\n")
    else:
        tb_decl = f"const long T = {T}, B = {B};\n"
    tb_decl += "(void)T; (void)B;\n"
    grids = sched.grid_table()
    seq_dirs = sched.directions_in_sequence
    cfg.rgm = sched.gate_major
    cfg.two_parts = sched.two_parts

    # ---- weights: packed at compile time when constant, else by a first step each run ----
    src: dict[str, str] = {}
    dst: dict[str, str] = {}
    wv, rv = g.values[cfg.w], g.values[cfg.r]
    if wv.const is not None:
        wp = em.weight(pack_w(cfg, wv.const.astype(np.float32)), key=f"rnn_w:{cfg.w}:{cfg.op}")
    else:
        wp = _scratch(em, N * cfg.E)
        src["w"], dst["w"] = em.ptr(cfg.w), wp
    if rv.const is not None:
        rp = em.weight(pack_r(cfg, rv.const.astype(np.float32)), key=f"rnn_r:{cfg.r}:{cfg.op}:{int(cfg.rgm)}")
    else:
        rp = _scratch(em, D * nhb * H * G * VL)
        src["r"], dst["r"] = em.ptr(cfg.r), rp
    bconst = g.values[cfg.b].const if cfg.b else None
    if not cfg.b or bconst is not None:
        bx_arr, rbh_arr = pack_bias(cfg, None if bconst is None else bconst.astype(np.float32))
        bx = em.weight(bx_arr)
        rbh = em.weight(rbh_arr) if (cfg.op == "GRU" and cfg.lbr) else "(const float *)0"
    else:
        bx = _scratch(em, N)
        src["b"], dst["bx"] = em.ptr(cfg.b), bx
        rbh = "(const float *)0"
        if cfg.op == "GRU" and cfg.lbr:
            rbh = _scratch(em, D * Hp)
            dst["rbh"] = rbh
    pp = "(const float *)0"
    if cfg.p:
        pv = g.values[cfg.p]
        if pv.const is not None:
            pp = em.weight(pack_p(cfg, pv.const.astype(np.float32)))
        else:
            pp = _scratch(em, D * 3 * Hp)
            src["p"], dst["p"] = em.ptr(cfg.p), pp


    # ---- scratch (sized for Tmax, Bmax) ----
    xw = _scratch(em, T * B * N)
    hbuf = _scratch(em, 2 * D * B * Hp)
    cbuf = _scratch(em, D * B * Hp) if cfg.op == "LSTM" else "(float *)0"
    two_phase = cfg.op == "GRU" and not cfg.lbr
    zbuf = _scratch(em, D * B * Hp) if two_phase else "(float *)0"
    rhbuf = _scratch(em, D * B * Hp) if two_phase else "(float *)0"
    nflags = max(2, P)
    flags = em.scratch(nflags * 64, "uint8")
    state = D * Bmax * Hp  # one h buffer; direction d at d * Bmax * Hp

    if dst:
        em.step(_pack_code(cfg, src, dst))

    # ---- step 1: the hoisted projection, initial states, barrier flags ----
    hoisted = mode != "baseline"
    gemm = fn("rnn_gemm", gemm_code(cfg, dynamic, None if hoisted else B),
              f"{cfg.op} input projection, T*B rows (at most {Tmax}x{Bmax}), {N} fused columns")
    # (d stride, b stride) of initial states and Y_h / Y_c, as C expressions of B
    sst = ("B * " + str(H), str(H)) if cfg.layout == 0 else (str(H), str(D * H))

    def init_state(src_name: str, buf: str) -> str:
        if not src_name:
            return f"memset({buf} + (d * {Bmax} + b) * {Hp}, 0, {Hp * 4});"
        return (f"{{ const float *s = {em.ptr(src_name)} + d * ({sst[0]}) + b * {sst[1]}L;\n"
                f"  float *o = {buf} + (d * {Bmax} + b) * {Hp}; memcpy(o, s, {H * 4}); "
                f"memset(o + {H}, 0, {(Hp - H) * 4}); }}")

    init = [f"long lo, hi; smelt_range({D}L * B, tid, nt, &lo, &hi);",
            "for (long r = lo; r < hi; ++r) {",
            "  long d = r / B, b = r % B; (void)d; (void)b;",
            "  " + init_state(cfg.h0, f"{hbuf}"),
            ]
    if cfg.op == "LSTM":
        init.append("  " + init_state(cfg.c0, f"{cbuf}"))
    init.append(f"  {CB}")
    init.append("}")
    init.append(f"if (tid == 0) memset((void *){flags}, 0, {nflags * 64});")
    if cfg.seq:  # onnxruntime rejects lengths outside [0, T]; run on (clamped), but report it
        init.append(f"if (tid == 0) {{ const int32_t *L = {em.ptr(cfg.seq)};\n"
                    "  for (long b = 0; b < B; ++b) if (L[b] < 0 || L[b] > T) SMELT_FAIL(); }")
    if hoisted:
        init.insert(0, f"{gemm}({em.ptr(cfg.x)}, {xw}, {wp}, {bx}, T * B, {'T' if cfg.layout else '1'}, tid, nt);")
    em.step(tb_decl + "\n".join(init))

    # ---- step 2: the recurrence ----
    what = (f"H={H} (Hp={Hp}), E={cfg.E}, fused gates G={G}, row tiles of <= {tile_rows(G, cfg.acc_budget)} "
            f"rows, batch {'<= ' + str(Bmax) + ' at run time' if dynamic else B}")
    # row counts a thread can get: smelt_range shares of B over xi row groups
    rows = {c for gp_ in grids.values() for (xi_, _) in gp_.values() for c in (B // xi_, -(-B // xi_))}
    l2 = em.target.l2_bytes
    nat = native_vector(em.target)
    if two_phase:
        cells_a = [fn("rnn_cell", cell_code(cfg, d, "a", dynamic, rows, l2, nat), f"GRU z/r gates, direction {d}; {what}")
                   for d in range(D)]
        cells_b = [fn("rnn_cell", cell_code(cfg, d, "b", dynamic, rows, l2, nat), f"GRU candidate, direction {d}; {what}")
                   for d in range(D)]
    else:
        cells_a = [fn("rnn_cell", cell_code(cfg, d, "", dynamic, rows, l2, nat), f"{cfg.op} cell, direction {d}; {what}")
                   for d in range(D)]
        cells_b = []
    y = em.ptr(cfg.y) if cfg.y else "(float *)0"
    slen = em.ptr(cfg.seq) if cfg.seq else "(const int32_t *)0"
    # Y strides as C expressions: (d stride, t stride, b stride)
    ydir = (f"B * {H}", f"B * {D * H}", str(H)) if cfg.layout == 0 else (str(H), str(D * H), f"T * {D * H}")
    has_rbh = cfg.op == "GRU" and cfg.lbr

    def off(ptr: str, present: bool, offset: int) -> str:
        return f"{ptr} + {offset}" if present else ptr

    # without an initial h, step 0's previous h is all zeros: the cells skip h·R then
    zh = "0" if cfg.h0 else "s == 0"

    # The step barrier split in halves around the h·R of the h this thread wrote (wcs: a thread
    # keeps its hidden blocks, so the K range of its own h needs no peer): part 1 runs that K
    # range, the thread then waits for its peers' h, part 2 runs the rest of K and the gate math,
    # and it publishes its h at the end of the step without waiting. The flag crossing cores and
    # the peer that finished last are then hidden behind part 1 instead of stalling every step
    # (a 2-thread flag round trip on this VM: 0.5-0.8 us, at ~4 us of work a step at B=1 H=256).
    # Not with dynamic shapes (the held accumulators are sized for the static row counts), nor
    # for gate-split passes over an R slice streamed from L3 (H=1024 B=10, 20: every (row, hidden
    # block)'s accumulators written and read back each step, beside a 100 us step).
    gs_rows = any(gate_split_plan(cfg, ng_, rows) for ng_ in ((2, 1) if two_phase else (G,)))
    split = sched.split_barrier and mode == "wcs" and not dynamic and (not gs_rows or cfg.two_parts)
    if split:
        per = max(part_acc_floats(cfg, ph, rows, nat) for ph in (("a", "b") if two_phase else ("",)))
        pacc = _scratch(em, P * D * per)

    def call(cell: str, d: int, kpart: str = "0") -> str:
        t = "T - 1 - s" if cfg.reverse[d] else "s"
        tail = (f", {kpart}, ulo{d} * {VL}L, SMELT_MIN(uhi{d} * {VL}L, {H}L), {pacc} + ((long)tid * {D} + {d}) * {per}L"
                if split else ", 0, 0, 0, (float *)0")
        yarg = f"y + (long)t * ({ydir[1]}) + {d} * ({ydir[0]})" if cfg.y else "y"
        sb = d * Bmax * Hp
        return (f"{{ const int t = {t};\n"
                f"  {cell}({rp} + {d * nhb * H * G * VL}L, {xw} + (long)t * B * {N} + {d * G * Hp}, "
                f"hp + {sb}, hn + {sb}, {off(cbuf, cfg.op == 'LSTM', sb)}, "
                f"{off(pp, bool(cfg.p), d * 3 * Hp)}, {off(rbh, has_rbh, d * Hp)}, "
                f"{off(zbuf, two_phase, sb)}, {off(rhbuf, two_phase, sb)}, {yarg}, "
                f"slen, t, ulo{d}, uhi{d}, blo, bhi, {ydir[2]}, {zh}{tail}); }}")

    def per_dir(cells: list[str], dirs: list[int], kpart: str = "0") -> str:
        return "\n    ".join(f"if (ulo{d} < uhi{d}) {call(cells[d], d, kpart)}" for d in dirs)

    def halves(cells: list[str], dirs: list[int], when: str) -> str:
        """The cells of a step phase: split around the barrier's wait when ``when`` holds."""
        if not split:
            return per_dir(cells, dirs)
        return (f"if (sn > 1 && ({when})) {{\n    {per_dir(cells, dirs, '1')}\n    {wait}\n    "
                f"{per_dir(cells, dirs, '2')}\n    }} else {{\n    {per_dir(cells, dirs)}\n    }}")

    rotate = mode != "wcs"  # without WCS a partition moves to another thread every step
    bar = f"{vx}_sync((({vx}_flag *){flags}) + sbase, sme, sn, ++epoch);"
    arrive = f"{vx}_arrive((({vx}_flag *){flags}) + sbase, sme, sn, ++epoch);"
    wait = f"{vx}_wait((({vx}_flag *){flags}) + sbase, sme, sn, epoch);"

    def loop(dirs: list[int]) -> str:
        body = []
        if rotate:
            body.append(part("(lid + s) % nact"))
        if not hoisted:  # baseline: this step's input projection, all threads of the group, then sync
            xrow = f"{em.ptr(cfg.x)} + (long)(t_) * B * {cfg.E}"
            orow = f"{xw} + (long)(t_) * B * {N}"
            ts = list(dict.fromkeys("T - 1 - s" if cfg.reverse[d] else "s" for d in dirs))
            for tt in ts:
                body.append(f"{{ const long t_ = {tt}; {gemm}({xrow}, {orow}, {wp}, {bx}, B, 1, lid, nact); }}")
            body.append(bar)
        body += [f"const float *hp = {hbuf} + (s & 1) * {state}L;",
                 f"float *hn = {hbuf} + ((s + 1) & 1) * {state}L;"]
        if split:  # every barrier as arrive (end of a phase) ... wait (inside the next one)
            body.append(halves(cells_a, dirs, "s > 0"))
            if two_phase:  # phase b reads every thread's r ⊙ h (none to wait for when h = 0)
                body += [arrive, halves(cells_b, dirs, f"!({zh})")]
            body.append(f"if (s + 1 < T) {arrive}")
        else:
            body.append(per_dir(cells_a, dirs))
            if two_phase:
                body += [bar, per_dir(cells_b, dirs)]
            body.append(f"if (s + 1 < T) {bar}")
        return "for (int s = 0; s < T; ++s) {\n    " + "\n    ".join(body) + "\n}"

    # grid table: [p][b] -> (xi, xj); p = threads of the direction group
    brange = list(range(1, Bmax + 1)) if dynamic else [B]
    table = []
    for p_ in range(0, P + 1):
        for b_ in ([0] + brange if dynamic else [B]):
            xi_, xj_ = grids.get(p_, {}).get(b_, (1, 1)) if p_ >= 1 and b_ >= 1 else (1, 1)
            table += [xi_, xj_]
    bidx = "B" if dynamic else "0"
    bcols = Bmax + 1 if dynamic else 1

    def part(pi: str) -> str:  # the rows and hidden blocks of partition pi of the grid
        return (f"{{ const int i_ = ({pi}) / xj, j_ = ({pi}) % xj; long ulo, uhi;\n"
                "    smelt_range(B, i_, xi, &blo, &bhi); smelt_range(units, j_, xj, &ulo, &uhi);\n"
                f"    {dir_units} }}")

    units_decl = " ".join(f"int ulo{d} = 0, uhi{d} = 0;" for d in range(D))
    dir_units = (f"""if (ng == 2) {{ if (gid == 0) {{ ulo0 = (int)ulo; uhi0 = (int)uhi; }}
        {'else { ulo1 = (int)ulo; uhi1 = (int)uhi; }' if D == 2 else ''} }}
    else if ({int(seq_dirs)}) {{ ulo0 = (int)ulo; uhi0 = (int)uhi; {'ulo1 = (int)ulo; uhi1 = (int)uhi;' if D == 2 else ''} }}
    else {{ ulo0 = (int)SMELT_MIN(ulo, {nhb}L); uhi0 = (int)SMELT_MIN(uhi, {nhb}L);
        {f'ulo1 = (int)SMELT_MAX(ulo - {nhb}, 0L); uhi1 = (int)SMELT_MAX(uhi - {nhb}, 0L);' if D == 2 else ''} }}""")
    if D == 1:
        steps = loop([0])
    else:  # one thread, or all threads on each direction in turn: one direction's R at a time in L2
        steps = (f"if (ng == 1 && (nact == 1 || {int(seq_dirs)})) {{\n{loop([0])}\n{loop([1])}\n}} "
                 f"else {{\n{loop([0, 1])}\n}}")
    assign = f"""
/* direction groups: with 2 directions and 2+ threads, one thread group per direction, never
   synchronizing with each other (parallel GEMMs in parallel). Inside a group the recurrence is
   a grid of xi row groups x xj hidden-unit groups chosen by the data-movement model (PCP). */
static const unsigned char grid[{(P + 1) * bcols * 2}] = {{{", ".join(str(v) for v in table)}}};
const int ng = ({D} == 2 && nt >= 2{' && 0' if mode == 'baseline' or seq_dirs else ''}) ? 2 : 1;
const int gid = (ng == 2 && tid >= nt / 2) ? 1 : 0;
const int gstart = gid ? nt / 2 : 0, gsize = ng == 2 ? (gid ? nt - nt / 2 : nt / 2) : nt;
const int gp = SMELT_MIN(gsize, {P});
const int xi = grid[(gp * {bcols} + {bidx}) * 2], xj = grid[(gp * {bcols} + {bidx}) * 2 + 1];
const int nact = xi * xj;
const int lid = tid - gstart;
const long units = ng == 2 ? {nhb}L : {nhb if seq_dirs else D * nhb}L;
unsigned epoch = 0;
{units_decl}
long blo = 0, bhi = 0;
int sbase = gstart, sme = lid, sn = nact; /* the barrier group: base thread, my index, size */
if (lid < nact) {{
    {part("lid")}
    {'' if rotate else 'sbase = gstart + (lid / xj) * xj; sme = lid % xj; sn = xj; /* WCS: only my row group */'}
}}
"""
    final = []
    fin_h = f"{hbuf} + (T % 2) * {state}L"
    for name, buf in ((cfg.yh, fin_h), (cfg.yc, cbuf)):
        if not name:
            continue
        seqcheck = "slen[b] > 0" if cfg.seq else "1"
        final.append(f"""for (int d = 0; d < {D}; ++d) {{
    int lo = d == 0 ? ulo0 : {'ulo1' if D == 2 else '0'}, hi = d == 0 ? uhi0 : {'uhi1' if D == 2 else '0'};
    for (long b = blo; b < bhi; ++b) {{
        float *o = {em.ptr(name)} + d * ({sst[0]}) + b * {sst[1]}L;
        const float *s = {buf} + (d * {Bmax} + b) * {Hp}L;
        for (long j = (long)lo * {VL}; j < SMELT_MIN((long)hi * {VL}, {H}L); ++j) o[j] = ({seqcheck}) ? s[j] : 0.0f;
        {CB}
    }}
}}""")
    g1 = grids[P][Bmax if dynamic else B]
    sched = {"baseline": "no hoisting: a fused-gate GEMM of x_t and h_t-1 per step, partitions move between "
                         "threads every step (Fig. 4a baseline)",
             "hoist": "input projection of all steps hoisted into one GEMM; recurrence as a column-split "
                      "parallel GEMM per step, partitions move between threads every step",
             "pcp": "hoisted projection; recurrence partitioned by the data-movement model (PCP), partitions "
                    "move between threads every step (no WCS)",
             "wcs": "hoisted projection; recurrence partitioned by the data-movement model (PCP), each thread "
                    "keeps its R slice for the whole sequence (WCS)"}[mode]
    em.schedule(algorithm=f"{cfg.op} ({mode}): {sched}",
                threads=f"recurrence grid {g1[0]} row x {g1[1]} hidden groups at {P} threads"
                        + (f", T<={Tmax} and B<={Bmax} at run time" if dynamic else ""),
                layout=f"gates fused, hidden padded to {Hp}")
    if dynamic:
        em.dynamic_dims(state=dims_at, x=cfg.x, layout=cfg.layout, max_t=Tmax, max_b=Bmax,
                        outputs=_dyn_output_shapes(cfg))
    # Only a recurrence whose direction group has several threads meets inside the step (flag
    # barriers): then its shares run at once, one per thread. Otherwise (a 1 x 1 grid: small
    # steps, or one thread per direction) it stays shareable like the projection step before it,
    # so the caller never waits for a worker the OS has not run (GRU E=H=64 B=1 T=100 under load:
    # the 20 us grace before running alone was a fifth of the call).
    # (the direction-group sizes of every pool the code may run with, as `assign` derives them)
    split_dirs = D == 2 and not (mode == "baseline" or seq_dirs)
    gsizes = {g_ for nt_ in range(1, P + 1)
              for g_ in ((nt_ // 2, nt_ - nt_ // 2) if split_dirs and nt_ >= 2 else (nt_,))}
    meet = any(xi_ * xj_ > 1 for gs in gsizes for b_ in brange
               for xi_, xj_ in [grids.get(min(gs, P), {}).get(b_, (1, 1))])
    em.step(f"""{tb_decl}float *y = {y}; const int32_t *slen = {slen}; (void)y; (void)slen;
{assign}
if (lid < nact) {{
{steps}
{chr(10).join(final)}
}}""", synchronize=meet)
