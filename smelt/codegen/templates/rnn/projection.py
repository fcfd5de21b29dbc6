"""The hoisted input projection: one GEMM for all time steps, gates and directions."""

from __future__ import annotations

from smelt.codegen.kernels.rnn_config import (
    VL,
    RnnConfig,
)
from smelt.codegen.templates.rnn.common import CB

PANEL = 64  # GEMM panel width (4 vectors)
GEMM_MR = 6  # GEMM rows per register tile
GEMM_KC = 128  # GEMM K block: a 64-column panel slice of 32 KiB stays in L1
GEMM_MC_BLOCKS = 8  # GEMM 6-row tiles per block: a 48x64 XW tile (12 KiB) stays in L1 across K blocks


# --------------------------------------------------------------------------------------------
# C: the hoisted input projection (one GEMM for all time steps, gates and directions)
# --------------------------------------------------------------------------------------------
def gemm_code(cfg: RnnConfig, dynamic: bool = False, rows: int | None = None) -> str:
    """FNAME(X, XW, Wp, bias, M, TB, tid, nt): XW[t*B+b][n] = bias[n] + X[t,b,:]·Wfused[n,:].

    ``M`` = T*B rows (run time; ``TB`` = T for layout 1, whose rows are batch-major). Threads get
    even shares of the (64-column panel, 6-row tile) units, panel-major, worked in blocks of up to
    GEMM_MC_BLOCKS tiles of one panel; inside a block K is blocked by GEMM_KC so the panel's
    K-slice (<= 32 KiB) stays in L1 across the row tiles, and the block's XW tile (<= 12 KiB)
    stays in L1 across K blocks (without the row blocking, K > GEMM_KC re-read and re-wrote all
    of XW from L2/L3 per K block).
    ``rows``: the M it is called with when static (default T*B; the per-step baseline: B).
    """
    K, N = cfg.E, cfg.ntot
    n_panels = -(-N // PANEL)
    nv_last = (N - (n_panels - 1) * PANEL) // VL
    nvs = sorted(({4} if n_panels > 1 else set()) | {nv_last})
    kc = K if K <= GEMM_KC else GEMM_KC
    if dynamic:
        mrs = list(range(1, GEMM_MR + 1))
    else:
        M = rows or cfg.T * cfg.B
        mrs = sorted({min(GEMM_MR, M), M - (-(-M // GEMM_MR) - 1) * GEMM_MR})
    # a register tile is GEMM_MR rows x nvt vectors of one panel (all 4 on AVX-512; 1 on AVX2,
    # whose 16 ymm registers hold 6 x 2 accumulator halves): the tile walks the panel's columns
    nvt = max(1, min(4, cfg.acc_budget // GEMM_MR))
    tiles = []

    def cuts(pw: int) -> list[tuple[int, int]]:  # (first vector, vectors) of each tile of a panel
        return [(v0, min(nvt, pw - v0)) for v0 in range(0, pw, nvt)]

    shapes = sorted({(m, nv, pw, f) for m in mrs for pw in nvs for _, nv in cuts(pw)
                     for f in ((True,) if kc == K else (True, False))})
    for mr, nv, pw, first in shapes:
        width = pw * VL  # the panel's width: the k stride of its packed columns
        lines = [f"static inline __attribute__((always_inline)) void FNAME_t{mr}x{nv}w{pw}{'f' if first else 'a'}("
                 "const float *X, float *XW, const float *wp, const float *bias, long m0, long col, long k0, "
                 "long k1, long TB, long Bn) {", "    (void)bias; (void)TB; (void)Bn;"]
        for m in range(mr):
            lines.append(f"    const float *x{m} = X + (m0 + {m}) * {K}L;")
            if cfg.layout == 0:
                lines.append(f"    float *o{m} = XW + (m0 + {m}) * {N}L + col;")
            else:  # X rows are (b, t); XW rows are (t, b)
                lines.append(f"    float *o{m} = XW + (((m0 + {m}) % TB) * Bn + (m0 + {m}) / TB) * {N}L + col;")
        for v in range(nv):
            for m in range(mr):
                src = f"bias + col + {v * VL}" if first else f"o{m} + {v * VL}"
                lines.append(f"    VX_v a{m}_{v} = VX_load({src});")
        lines.append("    #pragma GCC unroll 4")
        lines.append("    for (long k = k0; k < k1; ++k) {")
        if nvt == 1:  # one vector wide (AVX2): each row's broadcast next to its FMA, one live at a time
            lines.append(f"        VX_v w0 = VX_load(wp + k * {width});")
            for m in range(mr):
                lines.append(f"        a{m}_0 = VX_fma(VX_set1(x{m}[k]), w0, a{m}_0);")
        else:
            for m in range(mr):
                lines.append(f"        VX_v x{m}k = VX_set1(x{m}[k]);")
            for v in range(nv):
                lines.append(f"        VX_v w{v} = VX_load(wp + k * {width} + {v * VL});")
                for m in range(mr):
                    lines.append(f"        a{m}_{v} = VX_fma(x{m}k, w{v}, a{m}_{v});")
        lines.append("    }")
        for m in range(mr):
            for v in range(nv):
                lines.append(f"    VX_store(o{m} + {v * VL}, a{m}_{v});")
        lines.append("}")
        tiles.append("\n".join(lines))

    def dispatch(pw: int) -> str:
        cases = []
        for mr in mrs:
            calls = []
            for v0, nv in cuts(pw):
                args = f"(X, XW, wp + {v0 * VL}, bias, m0, col + {v0 * VL}, k0, k1, TB, Bn);"
                t = f"FNAME_t{mr}x{nv}w{pw}"
                calls.append(f"{t}f{args}" if kc == K else f"{{ if (k0 == 0) {t}f{args} else {t}a{args} }}")
            cases.append(f"case {mr}: {' '.join(calls)} break;")
        return f"switch (SMELT_MIN(M - m0, {GEMM_MR}L)) {{ {' '.join(cases)} default: SMELT_FAIL(); break; }}"

    # Work is split over threads as contiguous ranges of (panel, 6-row tile) units, panel-major,
    # then cut into blocks of <= GEMM_MC_BLOCKS tiles of one panel. Splitting whole 48-row blocks
    # instead left the threads unbalanced when there are few panels (GRU H=64: 3 panels x
    # T=100 rows as 48+48+4-row blocks gave one thread 196 rows, the other 104).
    body = f"""
static void FNAME(const float *X, float *XW, const float *Wp, const float *bias, long M, long TB,
                  int tid, int nt) {{
    const long Bn = M / TB; (void)Bn;
    const long n_mt = (M + {GEMM_MR - 1}) / {GEMM_MR};
    long lo, hi;
    smelt_range({n_panels}L * n_mt, tid, nt, &lo, &hi);
    for (long u = lo; u < hi;) {{
        const long p = u / n_mt, t0 = u % n_mt;
        const long t1 = SMELT_MIN(SMELT_MIN(t0 + {GEMM_MC_BLOCKS}, n_mt), t0 + (hi - u));
        u += t1 - t0;
        const long col = p * {PANEL};
        const float *wp = Wp + p * {PANEL * K}L;
        for (long k0 = 0; k0 < {K}; k0 += {kc}) {{
            const long k1 = SMELT_MIN(k0 + {kc}, {K}L);
            for (long m0 = t0 * {GEMM_MR}; m0 < t1 * {GEMM_MR}; m0 += {GEMM_MR}) {{
                {f"if (p < {n_panels - 1}) {{ {dispatch(4)} }} else " if n_panels > 1 else ""}{{ {dispatch(nv_last)} }}
                {CB}
            }}
        }}
    }}
}}
"""
    return "\n".join(tiles) + body
