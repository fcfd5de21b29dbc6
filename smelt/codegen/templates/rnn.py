"""Recurrent templates: ONNX LSTM, GRU and RNN (float32), every attribute and input.

Template ``rnn_native``, a DeepCPU-style schedule (Zhang et al., "DeepCPU: Serving RNN-based
Deep Learning Models 10x Faster", USENIX ATC 2018):

* **MM-DAG phase 1, hoisting.** The input projection X·W^T (+ both biases, where the gate
  equations allow merging them) of every time step and every direction is one GEMM before the
  recurrence, into scratch ``XW[T*B][D*G*Hp]``. All gates of all directions are *fused* into
  one weight matrix, re-laid out at compile time into 64-column panels ``[K][64]`` so the
  micro-kernel (6 rows x 4 vectors of 16) streams it; threads split (panel, row-block) tasks
  panel-major, so each thread keeps its own panels in L2.
* **Recurrence, fused gates.** ``R`` is packed per direction and per block of 16 hidden units
  as ``[H][G*16]``: the G gate pre-activations of 16 hidden units (x a tile of batch rows) are
  accumulated in registers as ``XW[t] + h_{t-1}·R^T`` by a non-inlined tile kernel
  (``_dot_code``), then the gate math (vectorized sigmoid / tanh / ...) runs per row and block.
  Batch rows are cut into balanced chunks of up to 6 (LSTM) / 8 rows; the K loop is blocked so
  all chunks of a row group reuse an L1 block of R (at H=1024 otherwise re-read from L3). When
  R exceeds L2 (H=1024: re-read from L3 every step), odd steps walk the hidden blocks in reverse,
  so each step starts on the ~2 MB the previous one left in L2 (batch 1: 17-29% faster).
* **Gate split** (R streamed from L3 and a thread's rows between one tile and
  ``GATE_SPLIT_ROWS``, e.g. H=1024 B=10): R is packed gate-major per hidden block
  (``[g][H][16]``, ``RnnConfig.rgm``) and the cell computes all of the thread's rows in one
  tile, over the gates in passes (10 rows x 2 gates), each pass one contiguous stream of R that
  every row consumes as it arrives. Row chunks instead read each K block from L3 in one chunk
  and from L1 in the others, so the L3 stream stalled the first chunk and idled during the rest
  (no overlap: step time ~ stream + compute). A/B in one process, medians of 30 calls:
  recurrence LSTM E1024 H1024 B10 43.0 -> 38.0 ms, GRU 32.1 -> 28.9 ms (whole model 1.075x /
  1.062x). Not at 20 rows (20 rows x 1 gate: 21 loads per 20 FMAs, no faster than chunks in a
  microbenchmark), nor with R's interleaved [H][G*16] layout (no faster either).
* **PCP: the partition.** Per direction group, the recurrence is a grid of ``xi`` batch-row
  groups x ``xj`` hidden-unit groups (``grid_for``): the data-movement model ``step_cost``
  (DeepCPU sec. 5.2.3: a thread's R slice is read from L1, from its own L2 if it fits - reuse
  across steps - or from L3 every step; row groups need no barrier, hidden groups one per step)
  with the target's L1/L2 sizes picks it, unless the tuning database has a measured grid
  (``smelt.tune.rnn_calibrate``; kind "rnn") or the node forces one (``smelt_rnn_grid``).
  Using fewer threads than available is a candidate (the parallelism degree).
* **Weight-centric streamlining.** Each thread keeps its partition (rows x hidden blocks, so a
  fixed slice of the fused ``R`` rows) for the whole sequence: its slice stays in its own L2.
  Threads of a row group meet once per time step (GRU with linear_before_reset=0 twice:
  ``(r ⊙ h)·Rh`` needs every thread's r). The meeting is ``VX_sync``, a barrier of per-thread
  epoch flags in scratch: one cache-line transfer per peer instead of the pool barrier's two
  or three (0.12 vs 0.25 us on the 2-core dev VM), and it lets thread subsets synchronize
  alone. Bidirectional: with 2+ threads each direction gets its own thread group and the
  groups never synchronize (parallel GEMMs in parallel), unless ``directions_in_sequence``
  finds it cheaper to run one direction after the other on all threads (a direction's R
  too big for one L2, its per-thread slices not); on one thread the directions run one
  after the other, so only one direction's R must stay in L2.
* **Ablation levels** (node attribute ``smelt_rnn_schedule``, see ``annotate``; DeepCPU Fig.
  4(a)): ``baseline`` = no hoisting, a fused-gate GEMM of x_t per step, column-split over all
  threads, partitions rotating over threads every step (a parallel GEMM without affinity);
  ``hoist`` = hoisted projection, same recurrence; ``pcp`` = the model's grid, still rotating;
  ``wcs`` (default) = the model's grid, fixed per thread.
* **Dynamic axes** (``smelt_dynamic``, set by ``smelt.api`` for recurrent models): T and B are
  read at run time from the node's int64 pair in the instance state (``BlockEmitter.state``,
  written by ``smelt.runtime.module``; not a library global, which instances of one .so would
  share); every index is a run-time expression, the tile kernels exist for every chunk size and
  the partition table has a row per batch size; scratch is sized for the compile-time shapes,
  which are the bounds.
* **Stacked layers** (``pipeline_chain`` / ``emit_pipeline``): ModelCompiler's pipeline plan.
* Hidden sizes are padded to Hp = ceil(H/16)*16 lanes; padded lanes of the state are kept at
  zero (masked), and never reach an output (masked stores).
* Weights given as runtime inputs (as in the ONNX backend tests) are packed into scratch by a
  first step each run, with the same layout the compile-time packing produces. Outputs that
  nothing reads (often Y_h / Y_c in PyTorch exports) are not computed.
* Threads write interleaved parts of shared buffers (XW panels, hidden blocks, Y rows), so
  each work item ends with a compiler barrier (``CB``): GCC 12 -O3 predictive commoning
  otherwise invents stores (loads a later iteration's targets early, stores them back at loop
  exit), which clobbered the other thread's XW panel in a stress test. Generated functions
  take no ``restrict`` parameters for the same reason (it made that transformation likelier).

Semantics follow onnxruntime exactly (it is the oracle): activation alpha/beta are consumed in
order by the functions that take them, with ORT's defaults (LeakyRelu 0.01, HardSigmoid
0.2/0.5, Elu 1.0, others 0), and the activation list must have one set per direction (ORT
rejects a single set for bidirectional; so does ``check``); clip bounds every gate
pre-activation (after bias and peephole); ``input_forget`` sets f = 1 - i; with
``sequence_lens`` a batch row is active at time t iff t < len (both directions), Y is zero
where inactive, the state freezes, and Y_h / Y_c are zero for rows of length 0 (ORT accepts 0);
lengths outside [0, T] make the inference fail (SMELT_FAIL), as ORT rejects them.
Layout 1 (batch-major) is native too (ORT itself rejects it).

Vector math: one C header per ISA, ``smelt/codegen/kernels/csrc/rnn_vec_{avx512,avx2,portable}.h``
(+ ``rnn_vec_common.h``), chosen by ``smelt/codegen/kernels/rnn_vec.py`` from the target's ISA,
which also says how many registers a 16-lane logical vector takes (AVX-512 one zmm, AVX2 two
ymm), so the register tiles (``RnnConfig.acc_budget``: 24 logical accumulators on AVX-512, 6 on
AVX2) fit the target's register file. Exp is a Cephes-style degree-6 polynomial (2^n by
``scalef``, on AVX2 by two exponent-field factors); 1/x is rcp14 (AVX2: rcp) + one Newton step
(no vdivps); sigmoid = 1/(1+exp(-x)); tanh = odd rational x*P(x^2)/Q(x^2) (degrees 13/6, Eigen's
float coefficients) on x clamped to +-7.9988, 1/Q by rcp + Newton: half the operations of the
earlier exp form (1 - 2/(exp(2|x|)+1) blended with a polynomial near 0; LSTM E64 H64 B10 T100
at 2 threads 0.353 -> 0.324 ms). Measured against libm in double precision on a dense grid over
[-30, 30] (tests/kernels/test_rnn.py, ``test_vector_math_accuracy``, per ISA): AVX-512 max abs
error 9.0e-8 (sigmoid) and 2.9e-7 (tanh), tanh max relative error 3.0e-7 for |x| < 1; the test
asserts 5e-7 / 1e-6; AVX2 1.4e-7 / 2.9e-7 (relative 3.0e-7: rcp has 12 bits, rcp14 14). The
portable header (no vector ISA: non-x86, the forced "scalar" target)
runs the same kernels on a 16-lane struct with libm (8.9e-8 / 1.0e-7). The exotic activations
Elu and Softplus always use libm lane by lane, as onnxruntime's formulas.
"""

from __future__ import annotations

import json

import numpy as np

from smelt.codegen.emitter import BlockEmitter, c_literal
from smelt.codegen.kernels.epilogue import (
    vector_clamp,
    vector_hard_sigmoid,
    vector_leaky_relu,
    vector_relu,
)
from smelt.codegen.kernels.rnn_config import (
    GATE_SPLIT_ROWS,
    GATES,
    REC_GROUP_ROWS,
    VL,
    RnnConfig,
    config,
    tile_rows,
)
from smelt.codegen.kernels.rnn_vec import vmath_source
from smelt.codegen.registry import register
from smelt.ir.graph import Graph, Node
from smelt.schedule.rnn import RnnSchedule

PANEL = 64  # GEMM panel width (4 vectors)
GEMM_MR = 6  # GEMM rows per register tile
GEMM_KC = 128  # GEMM K block: a 64-column panel slice of 32 KiB stays in L1
GEMM_MC_BLOCKS = 8  # GEMM 6-row tiles per block: a 48x64 XW tile (12 KiB) stays in L1 across K blocks
# Compiler barrier between work items whose stores interleave with other threads' stores: GCC 12
# -O3 predictive commoning otherwise may load a later iteration's target locations early and
# store them back at loop exit (an invented store: it clobbered the other thread's XW panel in
# a stress test of the ONNX backend cases; -fno-predictive-commoning or -O2 also avoid it).
CB = '__asm__ volatile("" ::: "memory");'



# --------------------------------------------------------------------------------------------
# configuration
# --------------------------------------------------------------------------------------------
def check_rnn(node: Node, g: Graph) -> str | None:
    cfg, why = config(node, g)
    return None if cfg is not None else why


# --------------------------------------------------------------------------------------------
# weight layouts (compile time: numpy; run time: the C in _pack_code does the same)
# --------------------------------------------------------------------------------------------
def fused_rows(cfg: RnnConfig) -> np.ndarray:
    """For one direction: source row (g*H + j) of each fused column (hb, g, lane); -1 = pad."""
    hb, g, lane = np.meshgrid(np.arange(cfg.nhb), np.arange(cfg.G), np.arange(VL), indexing="ij")
    j = hb * VL + lane
    return np.where(j < cfg.H, g * cfg.H + j, -1).reshape(-1)


def _gather(mat: np.ndarray, rows: np.ndarray) -> np.ndarray:
    out = np.zeros((rows.size,) + mat.shape[1:], dtype=np.float32)
    ok = rows >= 0
    out[ok] = mat[rows[ok]]
    return out


def pack_w(cfg: RnnConfig, W: np.ndarray) -> np.ndarray:
    """W [D, G*H, I] -> panels: for each 64 fused columns, [I][width] (width 64 but the last)."""
    rows = fused_rows(cfg)
    fused = np.concatenate([_gather(W[d], rows) for d in range(cfg.D)])  # [NTOT, I]
    return np.concatenate([fused[p:p + PANEL].T.reshape(-1) for p in range(0, cfg.ntot, PANEL)])


def pack_r(cfg: RnnConfig, R: np.ndarray) -> np.ndarray:
    """R [D, G*H, H] -> [D][hb][H][G*16], or [D][hb][G][H][16] when ``cfg.rgm`` (gate-major)."""
    rows = fused_rows(cfg).reshape(cfg.nhb, cfg.G * VL)
    if cfg.rgm:  # [D][hb][g][H][16]
        return np.concatenate([_gather(R[d], rows[hb][g * VL:(g + 1) * VL]).T.reshape(-1) for d in range(cfg.D)
                               for hb in range(cfg.nhb) for g in range(cfg.G)])
    return np.concatenate([_gather(R[d], rows[hb]).T.reshape(-1) for d in range(cfg.D) for hb in range(cfg.nhb)])


def _merge_rb(cfg: RnnConfig, gate: int) -> bool:
    """Whether gate's recurrence bias can be folded into the hoisted projection."""
    return not (cfg.op == "GRU" and cfg.lbr and gate == 2)


def pack_bias(cfg: RnnConfig, Bias: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(bias of the fused projection [NTOT], GRU lbr recurrence bias of the h gate [D][Hp])."""
    G, H, Hp = cfg.G, cfg.H, cfg.Hp
    if Bias is None:
        Bias = np.zeros((cfg.D, 2 * G * H), np.float32)
    rows = fused_rows(cfg)
    bx, rbh = [], np.zeros((cfg.D, Hp), np.float32)
    for d in range(cfg.D):
        wb, rb = Bias[d][:G * H].astype(np.float32), Bias[d][G * H:].astype(np.float32)
        merged = np.stack([wb[gi * H:(gi + 1) * H] + (rb[gi * H:(gi + 1) * H] if _merge_rb(cfg, gi)
                                                      else np.float32(0)) for gi in range(G)]).reshape(-1)
        bx.append(_gather(merged[:, None], rows)[:, 0])
        if cfg.op == "GRU":
            rbh[d, :H] = rb[2 * H:3 * H]
    return np.concatenate(bx), rbh


def pack_p(cfg: RnnConfig, P: np.ndarray) -> np.ndarray:
    """P [D, 3H] -> [D][3][Hp] (i, o, f)."""
    out = np.zeros((cfg.D, 3, cfg.Hp), np.float32)
    out[:, :, :cfg.H] = P.reshape(cfg.D, 3, cfg.H)
    return out


# --------------------------------------------------------------------------------------------
# C: vector math: one C header per ISA (smelt/codegen/kernels/csrc/rnn_vec_*.h, chosen by
# smelt/codegen/kernels/rnn_vec.py from the target's ISA); "VX_" is replaced by the helper
# chunk's unique name.
# --------------------------------------------------------------------------------------------
def _f(x: float) -> str:
    return c_literal(x, "float32")


class _VXOps:
    """``codegen.epilogue.VectorOps`` spelled with this template's ``VX_`` helpers (whose min/max
    have x86 ``min_ps``/``max_ps`` semantics on the 16-lane struct too)."""

    def zero(self) -> str:
        return "VX_zero()"

    def set1(self, x: str) -> str:
        return f"VX_set1({x})"

    def op(self, name: str, a: str, b: str) -> str:
        return f"VX_{name}({a}, {b})"

    def ge_zero_select(self, v: str, if_ge: str, if_lt: str) -> str:
        return f"VX_select(VX_ge({v}, VX_zero()), {if_ge}, {if_lt})"


VX = _VXOps()


def act_code(name: str, alpha: float, beta: float, x: str) -> str:
    """C expression applying an activation to the vector variable ``x`` (Relu, LeakyRelu and
    HardSigmoid rendered by codegen/epilogue.py). NaN as onnxruntime's RNN activation functors
    (rnn_activation_functors.h): Relu and HardSigmoid (``std::max(0.0f, x)``) and
    ThresholdedRelu map NaN to 0, the others keep it."""
    if name == "sigmoid":
        return f"VX_sigmoid({x})"
    if name == "tanh":
        return f"VX_tanh({x})"
    if name == "relu":
        return vector_relu(VX, x, nan_to_zero=True)
    if name == "affine":
        return f"VX_fma(VX_set1({_f(alpha)}), {x}, VX_set1({_f(beta)}))"
    if name == "leakyrelu":
        return vector_leaky_relu(VX, x, alpha)
    if name == "thresholdedrelu":
        return f"VX_select(VX_gt({x}, VX_set1({_f(alpha)})), {x}, VX_zero())"
    if name == "scaledtanh":
        return f"VX_mul(VX_set1({_f(alpha)}), VX_tanh(VX_mul(VX_set1({_f(beta)}), {x})))"
    if name == "hardsigmoid":
        return vector_hard_sigmoid(VX, x, alpha, beta, nan_to_zero=True)
    if name == "elu":
        return f"VX_elu({x}, {_f(alpha)})"
    if name == "softsign":
        return f"VX_div({x}, VX_add(VX_set1(1.0f), VX_abs({x})))"
    if name == "softplus":
        return f"VX_softplus({x})"
    raise ValueError(name)


def clip_code(cfg: RnnConfig, x: str) -> str:
    """A gate pre-activation clipped as onnxruntime does. LSTM and GRU clip to [-clip, clip], or
    to the float range without a clip (their default), so +-Inf becomes +-FLT_MAX; with a bias
    they clip with std::min(b, x) then std::max(-b, x), which turns NaN into +b (``VX_min(x, b)``
    returns b for a NaN x), without one NaN is kept. RNN clips only with a clip, keeping NaN."""
    if cfg.op == "RNN" and cfg.clip is None:
        return x
    b = cfg.clip if cfg.clip is not None else float(np.finfo(np.float32).max)
    lo, hi = VX.set1(_f(-b)), VX.set1(_f(b))
    if cfg.op != "RNN" and cfg.b:
        return VX.op("max", lo, VX.op("min", x, hi))
    return vector_clamp(VX, x, lo, hi)


# --------------------------------------------------------------------------------------------
# C: the hoisted input projection (one GEMM for all time steps, gates and directions)
# --------------------------------------------------------------------------------------------
def _row_chunks(total: int, most: int) -> list[tuple[int, int]]:
    """Balanced chunks of at most ``most``: (size, count) pairs, at most two distinct sizes."""
    n = -(-total // most)
    q, r = divmod(total, n)
    return [(s, c) for s, c in ((q + 1, r), (q, n - r)) if c > 0]


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


# --------------------------------------------------------------------------------------------
# C: the recurrence cell for one direction, one time step, a range of hidden blocks
# --------------------------------------------------------------------------------------------
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
    """FNAME_d{mb}x{nb}(Rp, xw, h, rbh, hb, acc, k0, k1, hbn): the gate pre-activations of ``mb``
    batch rows x ``nb`` hidden blocks, ``xw + h·R^T`` accumulated in registers, stored to ``acc``
    (``hbn``: the first hidden block of the tile the cell computes next, whose XW it prefetches).
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
         "const float *h, const float *rbh, long hb, float *acc, long k0, long k1, long hbn) {",
         "    (void)rbh; (void)hbn;"]
    for n in range(nb):
        L.append(f"    const float *rp{n} = Rp + (hb + {n}) * {H * G * VL}L;")
    for m in range(mb):
        L.append(f"    const float *h{m} = h + {m * cfg.Hp}L;")
    for m in range(mb):
        for n in range(nb):
            for g in gates:
                if kin_lbr and g == 2:
                    init = f"VX_load(rbh + (hb + {n}) * {VL})"
                else:
                    init = f"VX_load(xw + {m * N}L + (hb + {n}) * {G * VL} + {g * VL})"
                L.append(f"    VX_v a{m}_{n}_{g} = k0 == 0 ? {init} : VX_load(acc + {slot(m, n, g) * VL});")
    names = [f"a{m}_{n}_{g}" for m in range(mb) for n in range(nb) for g in gates]
    # XW of this step was written by the projection GEMM long before (T*B rows of it do not fit
    # L2), so the accumulators' first loads came from L3: fetch the next tile's lines now, a whole
    # K loop ahead (GRU B=10 H=256: recurrence 1.71 -> 1.57 ms).
    L.append("    if (k0 == 0) {")
    for m in range(mb):
        for g in (gates if acc_gates is not None else range(G)):  # gate-split: each pass its own gates
            L.append(f"        __builtin_prefetch(xw + {m * N}L + hbn * {G * VL} + {g * VL}, 0, 3);")
    L.append("    }")
    # Few accumulators (batch 1): each is one FMA chain over K, 4 cycles per link, so the loop is
    # latency bound; a second set over odd k halves the chain (summed at the end).
    split = 2 * len(names) <= cfg.acc_budget

    def body(k: str, suffix: str) -> None:
        for m in range(mb):
            L.append(f"        VX_v h{m}k{suffix} = VX_set1(h{m}[{k}]);")
        for n in range(nb):
            for g in gates:
                if pf_ahead:
                    L.append(f"        __builtin_prefetch(rp{n} + ({k} + {pf_ahead}) * {ks} + {g * gst}, 0, 2);")
                L.append(f"        VX_v w{n}_{g}{suffix} = VX_load(rp{n} + ({k}) * {ks} + {g * gst});")
                for m in range(mb):
                    a = f"a{m}_{n}_{g}{suffix}"
                    L.append(f"        {a} = VX_fma(h{m}k{suffix}, w{n}_{g}{suffix}, {a});")

    if split:
        for a in names:
            L.append(f"    VX_v {a}b = VX_zero();")
        L.append("    long k = k0;")
        L.append("    for (; k + 1 < k1; k += 2) {")
        body("k", "")
        body("k + 1", "b")
        L.append("    }")
        L.append("    if (k < k1) {")
        body("k", "")
        L.append("    }")
        for a in names:
            L.append(f"    {a} = VX_add({a}, {a}b);")
    else:
        L.append("    #pragma GCC unroll 2")
        L.append("    for (long k = k0; k < k1; ++k) {")
        body("k", "")
        L.append("    }")
    for m in range(mb):
        for n in range(nb):
            for g in gates:
                L.append(f"    VX_store(acc + {slot(m, n, g) * VL}, a{m}_{n}_{g});")
    L.append("}")
    return "\n".join(L)


def cell_code(cfg: RnnConfig, d: int, phase: str = "", dynamic: bool = False,
              rows: set[int] | None = None, l2_bytes: int = 0) -> str:
    """FNAME(Rp, xw, hp, hn, cs, pp, rbh, zb, rh, y, slen, t, hb0, hb1, blo, bhi, ybs) for direction ``d``:
    hidden blocks [hb0, hb1) of batch rows [blo, bhi).

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
    mb_most = tile_rows(ng, cfg.acc_budget)
    row_counts = sorted(rows or {B})
    if dynamic:
        sizes = list(range(1, mb_most + 1))
    else:
        sizes = sorted({s for bc in row_counts if bc > 0 for s, _ in _row_chunks(bc, mb_most)})
    last_mask = (1 << (H % VL)) - 1 if H % VL else 0
    nhb = cfg.nhb
    def clip(e: str) -> str:
        return clip_code(cfg, e)

    kin_lbr = op == "GRU" and cfg.lbr

    def act(slot: int, e: str) -> str:
        name, a, b = acts[slot]
        return act_code(name, a, b, e)

    kin = "rh" if phase == "b" else "hp"
    # (rows, hidden blocks) tiles: a group of nbt hidden blocks is chosen by the largest chunk
    # (q + 1 rows, or q), and every chunk of that group uses it; leftover blocks go one by one
    pairs: set[tuple[int, int]] = {(mb, 1) for mb in sizes}
    for mb0 in (sizes if dynamic else [_row_chunks(bc, mb_most)[0][0] for bc in row_counts if bc > 0]):
        nbt = _tile_nb(ng, mb0, cfg.acc_budget)
        pairs |= {(mb, nbt) for mb in (mb0 - 1, mb0) if mb in sizes}
    # K block: the nb hidden blocks' R rows of one K block (<= 32 KiB) stay in L1 while every
    # chunk of a row group streams them (otherwise each chunk re-read the slice from L2; at
    # H=1024 from L3). One chunk: no blocking, the accumulators never leave registers.
    nb_most = max(nb for _, nb in pairs)
    kc = max(16, min(H, (32768 // (nb_most * G * VL * 4)) // 16 * 16))
    # R beyond L2 is streamed from L3 every step (H=1024). Then odd steps walk the hidden blocks
    # in reverse, so a step starts on the blocks the last one ended with, still in L2 (batch 1,
    # T=100, recurrence: LSTM 29.7 -> 25.7 ms, GRU 22.1 -> 18.0 ms); and with several row chunks
    # the second chunk of a K block, which finds R in L1, prefetches the next K block into L2, so
    # the L3 stream overlaps that chunk's FMAs instead of stalling the first chunk (B=10, 20:
    # 3.5% on 3 of 4 shapes).
    stream = bool(l2_bytes) and cfg.nhb * H * G * VL * 4 > l2_bytes * 3 // 4
    pf_chunk = stream and (dynamic or any(bc > mb_most for bc in row_counts))
    kernels = [_dot_code(cfg, gates, mb, nb, kin_lbr, pf) for mb, nb in sorted(pairs)
               for pf in ((0, kc) if pf_chunk else (0,))]
    # Gate split: a thread's rows in one tile, over the gates in passes (see GATE_SPLIT_ROWS)
    gs_rows = [bc for bc in row_counts if mb_most < bc <= GATE_SPLIT_ROWS] if cfg.rgm else []
    gs_groups = {bc: _gate_groups(gates, max(1, cfg.acc_budget // bc)) for bc in gs_rows}
    kernels += [_dot_code(cfg, grp, bc, 1, kin_lbr, acc_gates=gates) for bc in gs_rows for grp in gs_groups[bc]]

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
                f"acc + (c - c0) * {chunk_acc}, k0, k1, hbn);")

    def switch() -> str:
        if not pf_chunk:
            cases = " ".join(f"case {mb * 64 + nb}: {{ {call(mb, nb)} break; }}" for mb, nb in sorted(pairs))
            return f"switch (mb * 64 + nbt) {{ {cases} default: SMELT_FAIL(); break; }}"
        cases = " ".join(f"case {(mb * 64 + nb) * 2 + int(pf)}: {{ {call(mb, nb, pf)} break; }}"
                         for mb, nb in sorted(pairs) for pf in (False, True))
        return f"switch ((mb * 64 + nbt) * 2 + (c == c0 + 1)) {{ {cases} default: SMELT_FAIL(); break; }}"

    chunk_acc = max(mb * nb for mb, nb in pairs) * ng * VL  # floats of one chunk's accumulators
    cpg = max(1, REC_GROUP_ROWS // mb_most)  # chunks per row group (bounds acc)
    nbt_cases = " ".join(f"case {mb}: nbt0 = {_tile_nb(ng, mb, cfg.acc_budget)}; break;" for mb in sizes)
    zz_doc = ("; on odd steps in reverse order, so a\n       step starts with the blocks the last one ended with, still in L2" if stream else "")
    gs_code = []
    for bc in gs_rows:
        passes = " ".join(f"FNAME_s{bc}g{''.join(str(g) for g in grp)}(Rp, xw + blo * {N}L, {kin} + blo * {Hp}L, rbh, hb, "
                          f"acc, 0, {H}, hbn);" for grp in gs_groups[bc])
        gs_code.append(f"""if (B == {bc}) {{ /* gate split: {bc} rows x gates {' + '.join(''.join(str(g) for g in grp) for grp in gs_groups[bc])}, whole K per pass */
        const long nit = hb1 - hb0;
        for (long it = 0; it < nit; ++it) {{
            const long i = rev ? nit - 1 - it : it, hb = hb0 + i, inx = rev ? i - 1 : i + 1;
            const long hbn = inx < 0 || inx >= nit ? hb : hb0 + inx;
            {passes}
            for (long m = 0; m < {bc}; ++m)
                FNAME_g(acc + m * {ng * VL}, xw, hp, hn, cs, pp, zb, rh, y, slen, t, blo + m, hb, ybs);
            {CB}
        }}
        return;
    }}""")
    acc_floats = max([cpg * chunk_acc] + [bc * ng * VL for bc in gs_rows])
    return "\n".join(kernels) + "\n" + gate_fn + f"""
static void FNAME(const float *Rp, const float *xw, const float *hp, float *hn, float *cs,
                  const float *pp, const float *rbh, float *zb, float *rh, float *y,
                  const int32_t *slen, int t, int hb0, int hb1, long blo, long bhi, long ybs) {{
    const long B = bhi - blo;
    if (B <= 0) return;
    float acc[{acc_floats}] __attribute__((aligned(64)));
    const int rev = {int(stream)} && (t & 1);
    {chr(10).join(gs_code)}
    /* balanced row chunks of at most {mb_most} rows (at most two distinct sizes), in groups of
       {cpg} chunks; per group, K blocks of {kc} (all chunks per block), then the gate math */
    const long nch = (B + {mb_most - 1}) / {mb_most}, q = B / nch, r = B % nch;
    const long mb0 = r ? q + 1 : q;
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
            for (long k0 = 0; k0 < {H}; k0 += kc) {{
                const long k1 = SMELT_MIN(k0 + kc, {H}L);
                for (long c = c0; c < c1; ++c) {{
                    const long mb = c < r ? q + 1 : q, b0 = blo + (c < r ? c * (q + 1) : r * (q + 1) + (c - r) * q);
                    {switch()}
                }}
            }}
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


# --------------------------------------------------------------------------------------------
# threads
# --------------------------------------------------------------------------------------------
# --------------------------------------------------------------------------------------------
# emit
# --------------------------------------------------------------------------------------------
def _scratch(em: BlockEmitter, nfloats: int) -> str:
    return em.scratch(max(1, nfloats) * 4)


def _pack_code(cfg: RnnConfig, src: dict[str, str], dst: dict[str, str]) -> str:
    """Run-time packing of weights given as graph inputs (same layouts as pack_*)."""
    G, H, Hp, E, D, N = cfg.G, cfg.H, cfg.Hp, cfg.E, cfg.D, cfg.ntot
    parts = []
    fused = (f"long d = n / {G * Hp}, rem = n % {G * Hp}, hb = rem / {G * VL}, g = (rem / {VL}) % {G}, "
             f"j = hb * {VL} + rem % {VL};")
    if "w" in dst:
        parts.append(f"""{{ const float *S = {src['w']}; float *P = {dst['w']}; long lo, hi;
  smelt_range({N}L, tid, nt, &lo, &hi);
  for (long n = lo; n < hi; ++n) {{ {fused}
    long p = n / {PANEL}, w = SMELT_MIN({PANEL}L, {N}L - p * {PANEL}), col = n % {PANEL};
    float *o = P + p * {PANEL * E}L + col;
    if (j < {H}) {{ const float *s = S + (d * {G * H} + g * {H} + j) * {E}L;
      for (long k = 0; k < {E}; ++k) o[k * w] = s[k]; }}
    else for (long k = 0; k < {E}; ++k) o[k * w] = 0.0f;
    {CB} }} }}""")
    if "r" in dst:
        parts.append(f"""{{ const float *S = {src['r']}; float *P = {dst['r']}; long lo, hi;
  smelt_range({N}L, tid, nt, &lo, &hi);
  for (long n = lo; n < hi; ++n) {{ {fused}
    float *o = P + (d * {cfg.nhb} + hb) * {H * G * VL}L + g * {H * VL if cfg.rgm else VL} + rem % {VL};
    if (j < {H}) {{ const float *s = S + (d * {G * H} + g * {H} + j) * {H}L;
      for (long k = 0; k < {H}; ++k) o[k * {VL if cfg.rgm else G * VL}] = s[k]; }}
    else for (long k = 0; k < {H}; ++k) o[k * {VL if cfg.rgm else G * VL}] = 0.0f;
    {CB} }} }}""")
    if "bx" in dst:
        lbr_gate = 2 if (cfg.op == "GRU" and cfg.lbr) else -1
        parts.append(f"""if (tid == 0) {{ const float *S = {src['b']}; float *P = {dst['bx']};
  for (long n = 0; n < {N}; ++n) {{ {fused}
    const float *s = S + d * {2 * G * H};
    P[n] = j < {H} ? s[g * {H} + j] + (g == {lbr_gate} ? 0.0f : s[{G * H} + g * {H} + j]) : 0.0f; }}""")
        if "rbh" in dst:
            parts.append(f"""  for (long d = 0; d < {D}; ++d) for (long j = 0; j < {Hp}; ++j)
    {dst['rbh']}[d * {Hp} + j] = j < {H} ? S[d * {2 * G * H} + {G * H + 2 * H} + j] : 0.0f;""")
        parts.append("}")
    if "p" in dst:
        parts.append(f"""if (tid == 0) {{ const float *S = {src['p']}; float *P = {dst['p']};
  for (long d = 0; d < {D}; ++d) for (long q = 0; q < 3; ++q) for (long j = 0; j < {Hp}; ++j)
    P[(d * 3 + q) * {Hp} + j] = j < {H} ? S[(d * 3 + q) * {H} + j] : 0.0f; }}""")
    return "\n".join(parts)


def _schedule(node: Node) -> RnnSchedule:
    sched = node.schedule.get("rnn")
    if not isinstance(sched, RnnSchedule):
        raise ValueError(f"{node.op} node {node.name!r} has no RNN schedule: the schedule stage "
                         "(smelt.schedule.rnn.decide_rnn_graph, run by compiler.lower) did not run on this graph")
    return sched


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
    vx = em.function("rnn_vmath", vmath_source("FNAME", em.target.isa), doc="RNN vector math: exp/sigmoid/tanh, activations, group barrier")

    def fn(base: str, code: str, doc: str) -> str:
        return em.function(base, code.replace("VX_", f"{vx}_"), doc=doc)

    # ---- the schedule (smelt/schedule/rnn.py): level, grids, direction order, R packing ----
    mode = sched.level
    dynamic = bool(node.attr("smelt_dynamic", 0))
    P = max(1, em.n_threads)
    if sched.threads != P:
        raise ValueError(f"{node.op} node {node.name!r}: its schedule is for {sched.threads} threads, "
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
    if two_phase:
        cells_a = [fn("rnn_cell", cell_code(cfg, d, "a", dynamic, rows, l2), f"GRU z/r gates, direction {d}; {what}")
                   for d in range(D)]
        cells_b = [fn("rnn_cell", cell_code(cfg, d, "b", dynamic, rows, l2), f"GRU candidate, direction {d}; {what}")
                   for d in range(D)]
    else:
        cells_a = [fn("rnn_cell", cell_code(cfg, d, "", dynamic, rows, l2), f"{cfg.op} cell, direction {d}; {what}")
                   for d in range(D)]
        cells_b = []
    y = em.ptr(cfg.y) if cfg.y else "(float *)0"
    slen = em.ptr(cfg.seq) if cfg.seq else "(const int32_t *)0"
    # Y strides as C expressions: (d stride, t stride, b stride)
    ydir = (f"B * {H}", f"B * {D * H}", str(H)) if cfg.layout == 0 else (str(H), str(D * H), f"T * {D * H}")
    has_rbh = cfg.op == "GRU" and cfg.lbr

    def off(ptr: str, present: bool, offset: int) -> str:
        return f"{ptr} + {offset}" if present else ptr

    def call(cell: str, d: int) -> str:
        t = "T - 1 - s" if cfg.reverse[d] else "s"
        yarg = f"y + (long)t * ({ydir[1]}) + {d} * ({ydir[0]})" if cfg.y else "y"
        sb = d * Bmax * Hp
        return (f"{{ const int t = {t};\n"
                f"  {cell}({rp} + {d * nhb * H * G * VL}L, {xw} + (long)t * B * {N} + {d * G * Hp}, "
                f"hp + {sb}, hn + {sb}, {off(cbuf, cfg.op == 'LSTM', sb)}, "
                f"{off(pp, bool(cfg.p), d * 3 * Hp)}, {off(rbh, has_rbh, d * Hp)}, "
                f"{off(zbuf, two_phase, sb)}, {off(rhbuf, two_phase, sb)}, {yarg}, "
                f"slen, t, ulo{d}, uhi{d}, blo, bhi, {ydir[2]}); }}")

    def per_dir(cells: list[str], dirs: list[int]) -> str:
        return "\n    ".join(f"if (ulo{d} < uhi{d}) {call(cells[d], d)}" for d in dirs)

    rotate = mode != "wcs"  # without WCS a partition moves to another thread every step
    bar = f"{vx}_sync((({vx}_flag *){flags}) + sbase, sme, sn, ++epoch);"

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
                 f"float *hn = {hbuf} + ((s + 1) & 1) * {state}L;",
                 per_dir(cells_a, dirs)]
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
        em.schedule(dynamic=json.dumps({"state": dims_at, "x": cfg.x, "layout": cfg.layout, "max": [Tmax, Bmax],
                                        "outputs": _dyn_output_shapes(cfg)}))
    em.step(f"""{tb_decl}float *y = {y}; const int32_t *slen = {slen}; (void)y; (void)slen;
{assign}
if (lid < nact) {{
{steps}
{chr(10).join(final)}
}}""")


# --------------------------------------------------------------------------------------------
# dynamic axes, schedules, partitioning model
# --------------------------------------------------------------------------------------------
def _dyn_output_shapes(cfg: RnnConfig) -> dict[str, list]:
    """Output shapes with "T" / "B" where the run-time sizes go (for the runtime's allocation)."""
    D, H = cfg.D, cfg.H
    out: dict[str, list] = {}
    if cfg.y:
        out[cfg.y] = ["T", D, "B", H] if cfg.layout == 0 else ["B", "T", D, H]
    for name in (cfg.yh, cfg.yc):
        if name:
            out[name] = [D, "B", H] if cfg.layout == 0 else ["B", D, H]
    return out


# --------------------------------------------------------------------------------------------
# stacked layers: ModelCompiler's pipeline execution plan
# --------------------------------------------------------------------------------------------
def emit_pipeline(chain: list[Node], g: Graph, em: BlockEmitter) -> None:
    """ModelCompiler's pipeline plan for stacked layers: layer l owned by one thread for the
    whole sequence (its W and R stay in that core's L2), at tick tau it computes its step
    t = tau - l, consuming step t of layer l-1 produced at tick tau-1; one barrier per tick.
    The input projection is per step (it cannot be hoisted past the layer below)."""
    layers = [n for n in chain if n.op in GATES]
    L = len(layers)
    readers = g.consumers()
    cfgs: list[RnnConfig] = []
    for n in layers:
        cfg, why = config(n, g)
        assert cfg is not None, why
        cfg.acc_budget = _schedule(n).acc_budget
        for attr in ("yh", "yc"):
            name = getattr(cfg, attr)
            if name and name not in g.outputs and not readers.get(name):
                setattr(cfg, attr, "")
        cfgs.append(cfg)
    T, B = cfgs[0].T, cfgs[0].B
    vx = em.function("rnn_vmath", vmath_source("FNAME", em.target.isa), doc="RNN vector math: exp/sigmoid/tanh, activations, group barrier")

    def fn(base: str, code: str, doc: str) -> str:
        return em.function(base, code.replace("VX_", f"{vx}_"), doc=doc)

    P = max(1, em.n_threads)
    flags = em.scratch(max(2, P) * 64, "uint8")
    em.step(f"if (tid == 0) memset((void *){flags}, 0, {max(2, P) * 64});")
    layer_code, init_code, final_code = [], [], []
    for li, cfg in enumerate(cfgs):
        H, Hp, N, nhb = cfg.H, cfg.Hp, cfg.ntot, cfg.nhb
        wp = em.weight(pack_w(cfg, g.values[cfg.w].const.astype(np.float32)), key=f"rnn_w:{cfg.w}:{cfg.op}")
        rp = em.weight(pack_r(cfg, g.values[cfg.r].const.astype(np.float32)), key=f"rnn_r:{cfg.r}:{cfg.op}")
        bc = g.values[cfg.b].const if cfg.b else None
        bx_arr, rbh_arr = pack_bias(cfg, None if bc is None else bc.astype(np.float32))
        bx = em.weight(bx_arr)
        rbh = em.weight(rbh_arr) if (cfg.op == "GRU" and cfg.lbr) else "(const float *)0"
        pp = em.weight(pack_p(cfg, g.values[cfg.p].const.astype(np.float32))) if cfg.p else "(const float *)0"
        xwrow = _scratch(em, B * N)
        hbuf = _scratch(em, 2 * B * Hp)
        cbuf = _scratch(em, B * Hp) if cfg.op == "LSTM" else "(float *)0"
        two = cfg.op == "GRU" and not cfg.lbr
        zb = _scratch(em, B * Hp) if two else "(float *)0"
        rh = _scratch(em, B * Hp) if two else "(float *)0"
        gemm = fn("rnn_gemm", gemm_code(cfg, rows=B), f"{cfg.op} per-step input projection, {B} rows")
        if two:
            cells = [fn("rnn_cell", cell_code(cfg, 0, "a", rows={B}, l2_bytes=em.target.l2_bytes), "GRU z/r gates"),
                     fn("rnn_cell", cell_code(cfg, 0, "b", rows={B}, l2_bytes=em.target.l2_bytes), "GRU candidate")]
        else:
            cells = [fn("rnn_cell", cell_code(cfg, 0, "", rows={B}, l2_bytes=em.target.l2_bytes), f"{cfg.op} cell")]
        # layer l reads layer l-1's Y directly ([T,1,B,H] has the bytes of its Squeeze output,
        # which the glue step only produces after this step)
        xin = em.ptr(cfg.x) if li == 0 else em.ptr(cfgs[li - 1].y)
        y = em.ptr(cfg.y) if cfg.y else "(float *)0"
        t_expr = f"{T - 1} - t" if cfg.reverse[0] else "t"
        yrow = f"{y} + (long)tt * {B * H}" if cfg.y else y
        calls = [f"{c}({rp}, {xwrow}, hp, hn, {cbuf}, {pp}, {rbh}, {zb}, {rh}, {yrow}, (const int32_t *)0, tt, "
                 f"0, {nhb}, 0, {B}, {H});" for c in cells]
        layer_code.append(f"""if ({li} >= l0 && {li} < l1) {{ const int t = tau - {li};
    if (t >= 0 && t < {T}) {{ const int tt = {t_expr};
        const float *hp = {hbuf} + (t & 1) * {B * Hp}; float *hn = {hbuf} + ((t + 1) & 1) * {B * Hp};
        {gemm}({xin} + (long)tt * {B * cfg.E}, {xwrow}, {wp}, {bx}, {B}, 1, 0, 1);
        {' '.join(calls)}
    }}
}}""")

        def init_state(src: str, buf: str, H: int = H, Hp: int = Hp) -> str:
            if not src:
                return f"memset({buf}, 0, {B * Hp * 4});"
            return (f"for (long b = 0; b < {B}; ++b) {{ memcpy({buf} + b * {Hp}, {em.ptr(src)} + b * {H}, {H * 4}); "
                    f"memset({buf} + b * {Hp} + {H}, 0, {(Hp - H) * 4}); }}")
        c_init = init_state(cfg.c0, cbuf) if cfg.op == "LSTM" else ""
        init_code.append(f"if ({li} >= l0 && {li} < l1) {{ {init_state(cfg.h0, hbuf)} {c_init} }}")
        for name, buf in ((cfg.yh, f"{hbuf} + {(T % 2) * B * Hp}"), (cfg.yc, cbuf)):
            if name:
                final_code.append(f"if ({li} >= l0 && {li} < l1) for (long b = 0; b < {B}; ++b) "
                                  f"memcpy({em.ptr(name)} + b * {H}, {buf} + b * {Hp}, {H * 4});")
    bar = f"{vx}_sync((({vx}_flag *){flags}), tid, nact, ++epoch);"
    em.schedule(algorithm=f"pipeline plan over {L} stacked {'/'.join(sorted({c.op for c in cfgs}))} layers "
                          "(ModelCompiler): each layer owned by one thread, layer l at tick tau runs step tau-l, "
                          "per-step input projection, one barrier per tick",
                threads=f"min(threads, {L}) threads, contiguous layer ranges",
                layout="gates fused, hidden padded to 16")
    nl = "\n"
    em.step(f"""const int nact = SMELT_MIN(nt, {L});
if (tid < nact) {{
long lo_, hi_; smelt_range({L}L, tid, nact, &lo_, &hi_);
const int l0 = (int)lo_, l1 = (int)hi_;
unsigned epoch = 0;
{nl.join(init_code)}
for (int tau = 0; tau < {T + L - 1}; ++tau) {{
{nl.join(layer_code)}
if (tau + 1 < {T + L - 1}) {bar}
}}
{nl.join(final_code)}
}}""")
