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
  accumulated in registers as ``XW[t] + h_{t-1}·R^T`` and the gate math (vectorized sigmoid /
  tanh / ...) runs on those registers directly: no gate buffer round trip.
* **Weight-centric streamlining.** Each thread owns a fixed range of hidden blocks (and so a
  fixed slice of the fused ``R`` rows) for the whole sequence: its slice stays in its own L2
  (and the projection's panel split gives each thread mostly its own XW columns). Threads meet
  once per time step (GRU with linear_before_reset=0 twice: ``(r ⊙ h)·Rh`` needs every
  thread's r). The meeting is ``VX_sync``, a barrier of per-thread epoch flags in scratch:
  one cache-line transfer per peer instead of the pool barrier's two or three (0.12 vs 0.25 us
  on the 2-core dev VM; ~7% faster at H=128), and it lets thread subsets synchronize alone.
  Bidirectional: with 2+ threads each direction gets its own thread group and the groups never
  synchronize (no sync at all for groups of one thread); on one thread the directions run one
  after the other, so only one direction's R must stay in L2. Small problems use fewer
  threads for the recurrence (``_rec_threads``).
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

Vector math (``_VMATH``): under ``__AVX512F__`` exp is a Cephes-style degree-6 polynomial with
``scalef`` reconstruction; 1/x is rcp14 + one Newton step (no vdivps); sigmoid = 1/(1+exp(-x));
tanh = Cephes odd polynomial for |x| < 0.625, else 1 - 2/(exp(2|x|)+1) with |x| clamped to 10.
Measured against libm in double precision on a dense grid over [-30, 30]
(tests/kernels/test_rnn.py, ``test_vector_math_accuracy``): max abs error 9.0e-8 (sigmoid) and
7.8e-8 (tanh), tanh max relative error 1.4e-7 for |x| < 1; the test asserts 5e-7 / 1e-6.
Without AVX-512 the same kernels run on a 16-lane struct with libm (8.9e-8 / 1.0e-7). The
exotic activations Elu and Softplus always use libm lane by lane, as onnxruntime's formulas.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from smelt.codegen.emit import BlockEmitter, c_literal
from smelt.codegen.templates.registry import register
from smelt.ir.graph import Graph, Node

VL = 16  # floats per vector (AVX-512); the packing unit of hidden blocks
PANEL = 64  # GEMM panel width (4 vectors)
GEMM_MR = 6  # GEMM rows per register tile
GEMM_KC = 128  # GEMM K block: a 64-column panel slice of 32 KiB stays in L1
ACC_BUDGET = 24  # accumulator registers a recurrence tile may use
# Minimum multiply-adds per thread per time step before splitting the recurrence pays for a
# cross-core sync (~0.25 us on this class of machine); see _rec_threads.
REC_MIN_MACS = 16384

# Compiler barrier between work items whose stores interleave with other threads' stores: GCC 12
# -O3 predictive commoning otherwise may load a later iteration's target locations early and
# store them back at loop exit (an invented store: it clobbered the other thread's XW panel in
# a stress test of the ONNX backend cases; -fno-predictive-commoning or -O2 also avoid it).
CB = '__asm__ volatile("" ::: "memory");'

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
DEFAULT_ACTS = {"LSTM": ["sigmoid", "tanh", "tanh"], "GRU": ["sigmoid", "tanh"], "RNN": ["tanh"]}
# activation -> (takes alpha, takes beta); defaults as onnxruntime (rnn_helpers.cc)
ACT_ARGS = {"affine": (True, True), "relu": (False, False), "leakyrelu": (True, False),
            "thresholdedrelu": (True, False), "tanh": (False, False), "scaledtanh": (True, True),
            "sigmoid": (False, False), "hardsigmoid": (True, True), "elu": (True, False),
            "softsign": (False, False), "softplus": (False, False)}
ACT_DEFAULTS = {"leakyrelu": (0.01, 0.0), "hardsigmoid": (0.2, 0.5), "elu": (1.0, 0.0)}


# --------------------------------------------------------------------------------------------
# configuration
# --------------------------------------------------------------------------------------------
@dataclass
class RnnConfig:
    op: str
    G: int
    T: int
    B: int
    E: int  # input size
    H: int
    D: int
    layout: int
    reverse: tuple[bool, ...]
    acts: list[list[tuple[str, float, float]]]  # per direction: (name, alpha, beta) per slot
    clip: float | None
    input_forget: bool
    lbr: bool  # GRU linear_before_reset
    x: str
    w: str
    r: str
    b: str
    seq: str
    h0: str
    c0: str
    p: str
    y: str
    yh: str
    yc: str

    @property
    def Hp(self) -> int:  # noqa: N802
        return -(-self.H // VL) * VL

    @property
    def nhb(self) -> int:
        return self.Hp // VL

    @property
    def ntot(self) -> int:
        return self.D * self.G * self.Hp


def _inp(node: Node, i: int) -> str:
    return node.inputs[i] if len(node.inputs) > i else ""


def _out(node: Node, i: int) -> str:
    return node.outputs[i] if len(node.outputs) > i else ""


def _parse_acts(op: str, D: int, node: Node) -> tuple[list[list[tuple[str, float, float]]] | None, str]:
    names = node.attr("activations")
    n = len(DEFAULT_ACTS[op])
    if names is None:
        names = DEFAULT_ACTS[op] * D
    names = [str(s).lower() for s in names]
    if len(names) != n * D:  # onnxruntime rejects this too (no implicit repeat per direction)
        return None, f"{op} needs {n * D} activations, given {len(names)}"
    alphas = [float(a) for a in (node.attr("activation_alpha") or [])]
    betas = [float(b) for b in (node.attr("activation_beta") or [])]
    ai, bi = iter(alphas), iter(betas)
    out: list[tuple[str, float, float]] = []
    for name in names:
        if name not in ACT_ARGS:
            return None, f"unknown {op} activation {name!r}"
        takes_a, takes_b = ACT_ARGS[name]
        da, db = ACT_DEFAULTS.get(name, (0.0, 0.0))
        a = next(ai, da) if takes_a else 0.0
        b = next(bi, db) if takes_b else 0.0
        out.append((name, float(np.float32(a)), float(np.float32(b))))
    return [out[d * n:(d + 1) * n] for d in range(D)], ""


def _dt(g: Graph, name: str) -> str | None:
    v = g.values[name]
    return None if v.dtype is None else np.dtype(v.dtype).name


def config(node: Node, g: Graph) -> tuple[RnnConfig | None, str]:
    op = node.op
    G = GATES[op]
    x, w, r = _inp(node, 0), _inp(node, 1), _inp(node, 2)
    if not (x and w and r):
        return None, f"{op} needs X, W and R"
    for name in [i for i in node.inputs if i] + [o for o in node.outputs if o]:
        if name == _inp(node, 4):
            if _dt(g, name) != "int32":
                return None, f"{op} sequence_lens must be int32"
        elif _dt(g, name) != "float32":
            return None, f"native {op} is float32 only ({name!r} is {_dt(g, name)})"
    layout = int(node.attr("layout", 0))
    if layout not in (0, 1):
        return None, f"{op} layout {layout} is not 0 or 1"
    xs, ws, rs = g.values[x].shape, g.values[w].shape, g.values[r].shape
    if len(xs) != 3 or len(ws) != 3 or len(rs) != 3:
        return None, f"{op} expects rank-3 X, W, R"
    T, B = (xs[0], xs[1]) if layout == 0 else (xs[1], xs[0])
    E, D, H = xs[2], ws[0], rs[2]
    direction = str(node.attr("direction", "forward"))
    if direction not in ("forward", "reverse", "bidirectional"):
        return None, f"unknown {op} direction {direction!r}"
    if D != (2 if direction == "bidirectional" else 1):
        return None, f"{op} W has {D} directions, direction is {direction}"
    if tuple(ws) != (D, G * H, E) or tuple(rs) != (D, G * H, H):
        return None, f"{op} W/R shapes {ws}/{rs} do not match X {xs} and hidden size {H}"
    if node.attr("hidden_size") is not None and int(node.attr("hidden_size")) != H:
        return None, f"{op} hidden_size attribute disagrees with R"
    if T <= 0 or B <= 0 or H <= 0 or E <= 0:
        return None, f"{op} with an empty dimension (T={T}, B={B}, E={E}, H={H})"
    bias, seq, h0 = _inp(node, 3), _inp(node, 4), _inp(node, 5)
    c0 = _inp(node, 6) if op == "LSTM" else ""
    p = _inp(node, 7) if op == "LSTM" else ""
    if bias and tuple(g.values[bias].shape) != (D, 2 * G * H):
        return None, f"{op} B has shape {g.values[bias].shape}"
    if seq and tuple(g.values[seq].shape) != (B,):
        return None, f"{op} sequence_lens has shape {g.values[seq].shape}"
    sshape = (D, B, H) if layout == 0 else (B, D, H)
    for name in (h0, c0):
        if name and tuple(g.values[name].shape) != sshape:
            return None, f"{op} initial state {name!r} has shape {g.values[name].shape}, expected {sshape}"
    if p and tuple(g.values[p].shape) != (D, 3 * H):
        return None, f"{op} P has shape {g.values[p].shape}"
    if seq and g.values[seq].const is not None and bool(np.all(g.values[seq].const == T)):
        seq = ""  # every sequence is full length: no masks needed
    acts, why = _parse_acts(op, D, node)
    if acts is None:
        return None, why
    clip = node.attr("clip")
    clip = None if clip is None else float(np.float32(clip))
    if clip is not None and not clip > 0:
        return None, f"{op} clip must be positive"
    input_forget = bool(node.attr("input_forget", 0)) if op == "LSTM" else False
    lbr = bool(node.attr("linear_before_reset", 0)) if op == "GRU" else False
    reverse = (direction == "reverse",) if D == 1 else (False, True)
    cfg = RnnConfig(op, G, int(T), int(B), int(E), int(H), int(D), layout, reverse, acts, clip, input_forget, lbr,
                    x, w, r, bias, seq, h0, c0, p, _out(node, 0), _out(node, 1),
                    _out(node, 2) if op == "LSTM" else "")
    return cfg, ""


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
    """R [D, G*H, H] -> [D][hb][H][G*16]."""
    rows = fused_rows(cfg).reshape(cfg.nhb, cfg.G * VL)
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
# C: vector math. "VX_" is replaced by the helper chunk's unique name.
# --------------------------------------------------------------------------------------------
_VMATH = r"""
#ifdef __AVX512F__
typedef __m512 VX_v;
typedef __mmask16 VX_m;
static inline VX_v VX_load(const float *p) { return _mm512_load_ps(p); }
static inline VX_v VX_loadu(const float *p) { return _mm512_loadu_ps(p); }
static inline void VX_store(float *p, VX_v v) { _mm512_store_ps(p, v); }
static inline void VX_storeu(float *p, VX_v v) { _mm512_storeu_ps(p, v); }
static inline void VX_mstoreu(float *p, VX_m m, VX_v v) { _mm512_mask_storeu_ps(p, m, v); }
static inline VX_v VX_set1(float x) { return _mm512_set1_ps(x); }
static inline VX_v VX_zero(void) { return _mm512_setzero_ps(); }
static inline VX_v VX_add(VX_v a, VX_v b) { return _mm512_add_ps(a, b); }
static inline VX_v VX_sub(VX_v a, VX_v b) { return _mm512_sub_ps(a, b); }
static inline VX_v VX_mul(VX_v a, VX_v b) { return _mm512_mul_ps(a, b); }
static inline VX_v VX_div(VX_v a, VX_v b) { return _mm512_div_ps(a, b); }
static inline VX_v VX_fma(VX_v a, VX_v b, VX_v c) { return _mm512_fmadd_ps(a, b, c); }
static inline VX_v VX_min(VX_v a, VX_v b) { return _mm512_min_ps(a, b); }
static inline VX_v VX_max(VX_v a, VX_v b) { return _mm512_max_ps(a, b); }
static inline VX_v VX_abs(VX_v a) { return _mm512_abs_ps(a); }
static inline VX_v VX_maskz(VX_m m, VX_v a) { return _mm512_maskz_mov_ps(m, a); }
static inline VX_v VX_select(VX_m m, VX_v a, VX_v b) { return _mm512_mask_blend_ps(m, b, a); }
static inline VX_m VX_ge(VX_v a, VX_v b) { return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ); }
static inline VX_m VX_gt(VX_v a, VX_v b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
/* exp(x): Cephes expf polynomial on x - n*ln2, |x - n*ln2| <= ln2/2; 2^n via scalef. */
static inline VX_v VX_exp(VX_v x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.33654f)), _mm512_set1_ps(88.72283f));
    VX_v n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    VX_v r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    VX_v p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}
/* 1/d: rcp14 plus one Newton step (relative error ~2^-27, far cheaper than vdivps) */
static inline VX_v VX_recip(VX_v d) {
    VX_v r = _mm512_rcp14_ps(d);
    return _mm512_fmadd_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(1.0f)), r);
}
static inline VX_v VX_sigmoid(VX_v x) {
    return VX_recip(_mm512_add_ps(_mm512_set1_ps(1.0f), VX_exp(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}
static inline VX_v VX_tanh(VX_v x) {
    VX_v ax = _mm512_min_ps(_mm512_abs_ps(x), _mm512_set1_ps(10.0f));
    VX_v one = _mm512_set1_ps(1.0f);
    VX_v e = VX_exp(_mm512_add_ps(ax, ax));
    VX_v big = _mm512_fnmadd_ps(_mm512_set1_ps(2.0f), VX_recip(_mm512_add_ps(e, one)), one);
    VX_v z = _mm512_mul_ps(ax, ax);
    VX_v p = _mm512_set1_ps(-5.70498872745e-3f);
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(2.06390887954e-2f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-5.37397155531e-2f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(1.33314422036e-1f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-3.33332819422e-1f));
    VX_v small = _mm512_fmadd_ps(_mm512_mul_ps(p, z), ax, ax);
    VX_v t = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(ax, _mm512_set1_ps(0.625f), _CMP_LT_OQ), big, small);
    /* copy the sign of x (tanh is odd) */
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(t),
        _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u))));
}
#else
typedef struct { float f[16]; } VX_v;
typedef unsigned VX_m;
#define VX_MAP1(expr) VX_v r; for (int l = 0; l < 16; ++l) { float x = a.f[l]; r.f[l] = (expr); } return r
#define VX_MAP2(expr) VX_v r; for (int l = 0; l < 16; ++l) { float x = a.f[l], y = b.f[l]; r.f[l] = (expr); } return r
static inline VX_v VX_load(const float *p) { VX_v r; memcpy(r.f, p, sizeof r.f); return r; }
static inline VX_v VX_loadu(const float *p) { VX_v r; memcpy(r.f, p, sizeof r.f); return r; }
static inline void VX_store(float *p, VX_v v) { memcpy(p, v.f, sizeof v.f); }
static inline void VX_storeu(float *p, VX_v v) { memcpy(p, v.f, sizeof v.f); }
static inline void VX_mstoreu(float *p, VX_m m, VX_v v) { for (int l = 0; l < 16; ++l) if (m >> l & 1u) p[l] = v.f[l]; }
static inline VX_v VX_set1(float x) { VX_v r; for (int l = 0; l < 16; ++l) r.f[l] = x; return r; }
static inline VX_v VX_zero(void) { return VX_set1(0.0f); }
static inline VX_v VX_add(VX_v a, VX_v b) { VX_MAP2(x + y); }
static inline VX_v VX_sub(VX_v a, VX_v b) { VX_MAP2(x - y); }
static inline VX_v VX_mul(VX_v a, VX_v b) { VX_MAP2(x * y); }
static inline VX_v VX_div(VX_v a, VX_v b) { VX_MAP2(x / y); }
static inline VX_v VX_fma(VX_v a, VX_v b, VX_v c) { VX_v r; for (int l = 0; l < 16; ++l) r.f[l] = fmaf(a.f[l], b.f[l], c.f[l]); return r; }
static inline VX_v VX_min(VX_v a, VX_v b) { VX_MAP2(x < y ? x : y); }
static inline VX_v VX_max(VX_v a, VX_v b) { VX_MAP2(x > y ? x : y); }
static inline VX_v VX_abs(VX_v a) { VX_MAP1(fabsf(x)); }
static inline VX_v VX_maskz(VX_m m, VX_v a) { VX_v r; for (int l = 0; l < 16; ++l) r.f[l] = (m >> l & 1u) ? a.f[l] : 0.0f; return r; }
static inline VX_v VX_select(VX_m m, VX_v a, VX_v b) { VX_v r; for (int l = 0; l < 16; ++l) r.f[l] = (m >> l & 1u) ? a.f[l] : b.f[l]; return r; }
static inline VX_m VX_ge(VX_v a, VX_v b) { VX_m m = 0; for (int l = 0; l < 16; ++l) m |= (VX_m)(a.f[l] >= b.f[l]) << l; return m; }
static inline VX_m VX_gt(VX_v a, VX_v b) { VX_m m = 0; for (int l = 0; l < 16; ++l) m |= (VX_m)(a.f[l] > b.f[l]) << l; return m; }
static inline VX_v VX_exp(VX_v a) { VX_MAP1(expf(x)); }
static inline VX_v VX_sigmoid(VX_v a) { VX_MAP1(1.0f / (1.0f + expf(-x))); }
static inline VX_v VX_tanh(VX_v a) { VX_MAP1(tanhf(x)); }
#endif
/* exotic activations lane by lane with libm, exactly as onnxruntime's formulas */
static inline VX_v VX_elu(VX_v v, float alpha) {
    float t[16]; VX_storeu(t, v);
    for (int l = 0; l < 16; ++l) t[l] = t[l] >= 0.0f ? t[l] : alpha * (expf(t[l]) - 1.0f);
    return VX_loadu(t);
}
static inline VX_v VX_softplus(VX_v v) {
    float t[16]; VX_storeu(t, v);
    for (int l = 0; l < 16; ++l) t[l] = logf(1.0f + expf(t[l]));
    return VX_loadu(t);
}
/* Barrier among the n threads of one group as per-thread epoch flags (one cache line each):
 * a thread publishes the epoch it finished, then waits until every peer published it too. One
 * cache-line transfer per peer instead of the counter barrier's two or three (on this class of
 * VM a transfer is ~0.12 us, a pool barrier ~0.25 us). Flags are zeroed by step 1 of each run. */
typedef struct { _Alignas(64) atomic_uint v; } VX_flag;
static inline void VX_sync(VX_flag *f, int me, int n, unsigned epoch) {
    if (n <= 1) return;
    atomic_store_explicit(&f[me].v, epoch, memory_order_release);
    for (int j = 0; j < n; ++j) {
        if (j == me) continue;
        unsigned spins = 0;
        while ((int)(atomic_load_explicit(&f[j].v, memory_order_acquire) - epoch) < 0) {
            SMELT_PAUSE();
            if (++spins > 20000u) { sched_yield(); spins = 0; }
        }
    }
}
"""


def vmath_source(prefix: str) -> str:
    """The vector-math helpers with their names prefixed (used by tests too)."""
    return _VMATH.replace("VX_", f"{prefix}_")


def _f(x: float) -> str:
    return c_literal(x, "float32")


def act_code(name: str, alpha: float, beta: float, x: str) -> str:
    """C expression applying an activation to the vector variable ``x``."""
    if name == "sigmoid":
        return f"VX_sigmoid({x})"
    if name == "tanh":
        return f"VX_tanh({x})"
    if name == "relu":
        return f"VX_max({x}, VX_zero())"
    if name == "affine":
        return f"VX_fma(VX_set1({_f(alpha)}), {x}, VX_set1({_f(beta)}))"
    if name == "leakyrelu":
        return f"VX_select(VX_ge({x}, VX_zero()), {x}, VX_mul(VX_set1({_f(alpha)}), {x}))"
    if name == "thresholdedrelu":
        return f"VX_select(VX_gt({x}, VX_set1({_f(alpha)})), {x}, VX_zero())"
    if name == "scaledtanh":
        return f"VX_mul(VX_set1({_f(alpha)}), VX_tanh(VX_mul(VX_set1({_f(beta)}), {x})))"
    if name == "hardsigmoid":
        return (f"VX_min(VX_set1(1.0f), VX_max(VX_zero(), VX_fma(VX_set1({_f(alpha)}), {x}, "
                f"VX_set1({_f(beta)}))))")
    if name == "elu":
        return f"VX_elu({x}, {_f(alpha)})"
    if name == "softsign":
        return f"VX_div({x}, VX_add(VX_set1(1.0f), VX_abs({x})))"
    if name == "softplus":
        return f"VX_softplus({x})"
    raise ValueError(name)


# --------------------------------------------------------------------------------------------
# C: the hoisted input projection (one GEMM for all time steps, gates and directions)
# --------------------------------------------------------------------------------------------
def _row_chunks(total: int, most: int) -> list[tuple[int, int]]:
    """Balanced chunks of at most ``most``: (size, count) pairs, at most two distinct sizes."""
    n = -(-total // most)
    q, r = divmod(total, n)
    return [(s, c) for s, c in ((q + 1, r), (q, n - r)) if c > 0]


def gemm_code(cfg: RnnConfig) -> str:
    """FNAME(X, XW, Wp, bias, tid, nt): XW[t*B+b][n] = bias[n] + X[t,b,:]·Wfused[n,:].

    Tasks are (64-column panel, 6-row block) pairs, panel-major, split evenly over threads;
    K is blocked by GEMM_KC so a panel's K-slice (<= 32 KiB) stays in L1 across row blocks.
    """
    M, K, N, T, B = cfg.T * cfg.B, cfg.E, cfg.ntot, cfg.T, cfg.B
    n_panels = -(-N // PANEL)
    nv_last = (N - (n_panels - 1) * PANEL) // VL
    n_mb = -(-M // GEMM_MR)
    mr_tail = M - (n_mb - 1) * GEMM_MR
    mr_full = GEMM_MR if n_mb > 1 else mr_tail
    nvs = ([4] if n_panels > 1 else []) + [nv_last]
    kc = K if K <= GEMM_KC else GEMM_KC
    tiles = []
    for mr, nv, first in sorted({(m, v, f) for m in (mr_full, mr_tail) for v in nvs
                                 for f in ((True,) if kc == K else (True, False))}):
        width = nv * VL
        lines = [f"static inline __attribute__((always_inline)) void FNAME_t{mr}x{nv}{'f' if first else 'a'}("
                 "const float *X, float *XW, const float *wp, const float *bias, long m0, long col, long k0, "
                 "long k1) {", "    (void)bias;"]
        for m in range(mr):
            lines.append(f"    const float *x{m} = X + (m0 + {m}) * {K}L;")
            if cfg.layout == 0:
                lines.append(f"    float *o{m} = XW + (m0 + {m}) * {N}L + col;")
            else:
                lines.append(f"    float *o{m} = XW + (((m0 + {m}) % {T}) * {B}L + (m0 + {m}) / {T}) * {N}L + col;")
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

    def dispatch(nv: int) -> str:
        args = "(X, XW, wp, bias, mb * " + str(GEMM_MR) + ", col, k0, k1);"

        def one(mr: int) -> str:
            if kc == K:
                return f"FNAME_t{mr}x{nv}f{args}"
            return f"{{ if (k0 == 0) FNAME_t{mr}x{nv}f{args} else FNAME_t{mr}x{nv}a{args} }}"

        if mr_tail == mr_full:
            return one(mr_full)
        return f"if (mb < {n_mb - 1}) {one(GEMM_MR)} else {one(mr_tail)}"

    body = f"""
static void FNAME(const float *X, float *XW, const float *Wp, const float *bias, int tid, int nt) {{
    long lo, hi;
    smelt_range({n_panels * n_mb}L, tid, nt, &lo, &hi);
    if (lo >= hi) return;
    for (long p = lo / {n_mb}; p <= (hi - 1) / {n_mb}; ++p) {{
        const long mlo = p == lo / {n_mb} ? lo % {n_mb} : 0;
        const long mhi = p == (hi - 1) / {n_mb} ? (hi - 1) % {n_mb} + 1 : {n_mb};
        const long col = p * {PANEL};
        const float *wp = Wp + p * {PANEL * K}L;
        for (long k0 = 0; k0 < {K}; k0 += {kc}) {{
            const long k1 = SMELT_MIN(k0 + {kc}, {K}L);
            for (long mb = mlo; mb < mhi; ++mb) {{
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
def _tile_shape(G: int, B: int) -> tuple[list[tuple[int, int]], int]:
    mb_most = max(1, min(8, ACC_BUDGET // G))
    chunks = _row_chunks(B, mb_most)
    mb = chunks[0][0]
    nb = max(1, min(ACC_BUDGET // (mb * G), max(1, 8 // G)))
    return chunks, nb


def cell_code(cfg: RnnConfig, d: int, phase: str = "") -> str:
    """FNAME(Rp, xw, hp, hn, cs, pp, rbh, zb, rh, y, slen, t, hb0, hb1) for direction ``d``.

    ``phase``: "" (LSTM, RNN, GRU lbr=1: whole cell), "a" (GRU lbr=0: z, r and r ⊙ h) or "b"
    (GRU lbr=0: (r ⊙ h)·Rh, the candidate and the new state).
    """
    op, G, H, Hp, B, N = cfg.op, cfg.G, cfg.H, cfg.Hp, cfg.B, cfg.ntot
    acts = cfg.acts[d]
    gates = {"": list(range(G)), "a": [0, 1], "b": [2]}[phase]
    ng = len(gates)
    chunks, nb_max = _tile_shape(ng, B)
    last_mask = (1 << (H % VL)) - 1 if H % VL else 0
    nhb = cfg.nhb
    ybs = (cfg.H if cfg.layout == 0 else cfg.T * cfg.D * cfg.H)
    clip = (lambda e: f"VX_min(VX_max({e}, VX_set1({_f(-cfg.clip)})), VX_set1({_f(cfg.clip)}))") \
        if cfg.clip is not None else (lambda e: e)

    def act(slot: int, e: str) -> str:
        name, a, b = acts[slot]
        return act_code(name, a, b, e)

    kin = "rh" if phase == "b" else "hp"

    def tile(mb: int, nb: int) -> str:
        L: list[str] = []
        L.append("{")
        for n in range(nb):
            L.append(f"    const float *rp{n} = Rp + (long)(hb + {n}) * {H * G * VL}L;")
        for m in range(mb):
            L.append(f"    const float *xw{m} = xw + (long)(b0 + {m}) * {N}L;")
            L.append(f"    const float *h{m} = {kin} + (long)(b0 + {m}) * {Hp};")
        for m in range(mb):
            for n in range(nb):
                for g in gates:
                    if op == "GRU" and cfg.lbr and g == 2:
                        init = f"VX_load(rbh + (hb + {n}) * {VL})"
                    else:
                        init = f"VX_load(xw{m} + (hb + {n}) * {G * VL} + {g * VL})"
                    L.append(f"    VX_v a{m}_{n}_{g} = {init};")
        L.append("    #pragma GCC unroll 2")
        L.append(f"    for (long k = 0; k < {H}; ++k) {{")
        for m in range(mb):
            L.append(f"        VX_v h{m}k = VX_set1(h{m}[k]);")
        for n in range(nb):
            for g in gates:
                L.append(f"        VX_v w{n}_{g} = VX_load(rp{n} + k * {G * VL} + {g * VL});")
                for m in range(mb):
                    L.append(f"        a{m}_{n}_{g} = VX_fma(h{m}k, w{n}_{g}, a{m}_{n}_{g});")
        L.append("    }")
        for m in range(mb):
            for n in range(nb):
                a = [f"a{m}_{n}_{g}" for g in range(G)]
                L.append("    {")
                L.append(f"        const long b = b0 + {m}, j0 = (long)(hb + {n}) * {VL};")
                if last_mask:
                    L.append(f"        const VX_m km = (hb + {n} == {nhb - 1}) ? (VX_m){last_mask}u : (VX_m)0xFFFFu;")
                L.append(f"        const VX_v hpv = VX_load(hp + b * {Hp} + j0);")
                if op == "LSTM":
                    L.append(f"        const VX_v cp = VX_load(cs + b * {Hp} + j0);")
                    gi, go, gf, gc = a
                    if cfg.p:
                        L.append(f"        {gi} = VX_fma(VX_load(pp + j0), cp, {gi});")
                        if not cfg.input_forget:
                            L.append(f"        {gf} = VX_fma(VX_load(pp + {2 * Hp} + j0), cp, {gf});")
                    L.append(f"        VX_v xi = {clip(gi)};")
                    L.append(f"        VX_v ig = {act(0, 'xi')};")
                    if cfg.input_forget:
                        L.append("        VX_v fg = VX_sub(VX_set1(1.0f), ig);")
                    else:
                        L.append(f"        VX_v xf = {clip(gf)};")
                        L.append(f"        VX_v fg = {act(0, 'xf')};")
                    L.append(f"        VX_v xc = {clip(gc)};")
                    L.append(f"        VX_v cg = {act(1, 'xc')};")
                    L.append("        VX_v cn = VX_fma(fg, cp, VX_mul(ig, cg));")
                    if cfg.p:
                        L.append(f"        {go} = VX_fma(VX_load(pp + {Hp} + j0), cn, {go});")
                    L.append(f"        VX_v xo = {clip(go)};")
                    L.append(f"        VX_v og = {act(0, 'xo')};")
                    L.append(f"        VX_v hv = VX_mul(og, {act(2, 'cn')});")
                    if last_mask:
                        L.append("        cn = VX_maskz(km, cn);")
                elif op == "RNN":
                    L.append(f"        VX_v xg = {clip(a[0])};")
                    L.append(f"        VX_v hv = {act(0, 'xg')};")
                elif phase == "a":
                    L.append(f"        VX_v xz = {clip(a[0])};")
                    L.append(f"        VX_v xr = {clip(a[1])};")
                    L.append(f"        VX_store(zb + b * {Hp} + j0, {act(0, 'xz')});")
                    L.append(f"        VX_store(rh + b * {Hp} + j0, VX_mul({act(0, 'xr')}, hpv));")
                    L.append("    }")
                    continue
                else:  # GRU: lbr (whole cell) or phase b
                    if phase == "b":
                        L.append(f"        VX_v zg = VX_load(zb + b * {Hp} + j0);")
                        L.append(f"        VX_v xh = {clip(a[2])};")
                    else:
                        L.append(f"        VX_v xz = {clip(a[0])};")
                        L.append(f"        VX_v zg = {act(0, 'xz')};")
                        L.append(f"        VX_v xr = {clip(a[1])};")
                        L.append(f"        VX_v rg = {act(0, 'xr')};")
                        L.append(f"        VX_v xwh = VX_load(xw{m} + (hb + {n}) * {G * VL} + {2 * VL});")
                        L.append(f"        VX_v xh0 = VX_fma(rg, {a[2]}, xwh);")
                        L.append(f"        VX_v xh = {clip('xh0')};")
                    L.append(f"        VX_v hh = {act(1, 'xh')};")
                    L.append("        VX_v hv = VX_fma(zg, VX_sub(hpv, hh), hh);")
                if last_mask:
                    L.append("        hv = VX_maskz(km, hv);")
                L.append("        VX_v yv = hv;")
                if cfg.seq:
                    L.append("        if (!(t < slen[b])) {")
                    L.append("            hv = hpv; yv = VX_zero();")
                    if op == "LSTM":
                        L.append("            cn = cp;")
                    L.append("        }")
                L.append(f"        VX_store(hn + b * {Hp} + j0, hv);")
                if op == "LSTM":
                    L.append(f"        VX_store(cs + b * {Hp} + j0, cn);")
                if cfg.y:
                    if last_mask:
                        L.append(f"        VX_mstoreu(y + b * {ybs}L + j0, km, yv);")
                    else:
                        L.append(f"        VX_storeu(y + b * {ybs}L + j0, yv);")
                L.append("    }")
        L.append("}")
        return "\n".join(L)

    def over_batch(nb: int) -> str:
        out = []
        start = 0
        for size, count in chunks:
            out.append(f"for (long b0 = {start}; b0 < {start + size * count}; b0 += {size}) "
                       f"{{ {tile(size, nb)} {CB} }}")
            start += size * count
        return "\n".join(out)

    body = over_batch(nb_max) if nb_max == 1 else (
        f"for (; hb + {nb_max} <= hb1; hb += {nb_max}) {{\n{over_batch(nb_max)}\n}}\n"
        f"for (; hb < hb1; ++hb) {{\n{over_batch(1)}\n}}")
    if nb_max == 1:
        body = f"for (; hb < hb1; ++hb) {{\n{body}\n}}"
    return f"""
static void FNAME(const float *Rp, const float *xw, const float *hp, float *hn, float *cs,
                  const float *pp, const float *rbh, float *zb, float *rh, float *y,
                  const int32_t *slen, int t, int hb0, int hb1) {{
    (void)xw; (void)hn; (void)cs; (void)pp; (void)rbh; (void)zb; (void)rh; (void)y; (void)slen; (void)t;
    int hb = hb0;
{body}
}}
"""


# --------------------------------------------------------------------------------------------
# threads
# --------------------------------------------------------------------------------------------
def _rec_threads(cfg: RnnConfig, units: int, l1_bytes: int) -> int:
    """Most threads worth using for the recurrence of a group owning ``units`` hidden blocks.

    A split costs one cross-core sync per step (~0.25 us here). It pays when each thread keeps
    REC_MIN_MACS multiply-adds per step, or half that when the group's R does not fit in 3/4 of
    L1 (a split then moves each slice closer to L1). Measured at 2 threads, B=1, T=100: LSTM
    H=32: 13 us on 1 thread vs 35 us on 2; H=64 (R 64 KiB): 51 vs 43; GRU H=64 (48 KiB): 26 vs 42.
    """
    macs = cfg.B * cfg.G * VL * cfg.H * units  # per time step, the whole group
    r_bytes = cfg.G * VL * cfg.H * units * 4
    min_macs = REC_MIN_MACS if r_bytes <= l1_bytes * 3 // 4 else REC_MIN_MACS // 2
    return max(1, min(units, macs // min_macs))


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
    float *o = P + (d * {cfg.nhb} + hb) * {H * G * VL}L + g * {VL} + rem % {VL};
    if (j < {H}) {{ const float *s = S + (d * {G * H} + g * {H} + j) * {H}L;
      for (long k = 0; k < {H}; ++k) o[k * {G * VL}] = s[k]; }}
    else for (long k = 0; k < {H}; ++k) o[k * {G * VL}] = 0.0f;
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


@register(("LSTM", "GRU", "RNN"), versions=(7, 14, 22), check=check_rnn, name="rnn_native")
def emit_rnn(node: Node, g: Graph, em: BlockEmitter) -> None:
    cfg, why = config(node, g)
    assert cfg is not None, why
    readers = g.consumers()
    for attr in ("y", "yh", "yc"):  # an output nothing reads is not computed
        name = getattr(cfg, attr)
        if name and name not in g.outputs and not readers.get(name):
            setattr(cfg, attr, "")
    G, T, B, H, Hp, D, N = cfg.G, cfg.T, cfg.B, cfg.H, cfg.Hp, cfg.D, cfg.ntot
    nhb = cfg.nhb
    vx = em.function("rnn_vmath", vmath_source("FNAME"), doc="RNN vector math: exp/sigmoid/tanh, activations, group barrier")

    def fn(base: str, code: str, doc: str) -> str:
        return em.function(base, code.replace("VX_", f"{vx}_"), doc=doc)

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
        rp = em.weight(pack_r(cfg, rv.const.astype(np.float32)), key=f"rnn_r:{cfg.r}:{cfg.op}")
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

    # ---- scratch ----
    xw = _scratch(em, T * B * N)
    hbuf = _scratch(em, 2 * D * B * Hp)
    cbuf = _scratch(em, D * B * Hp) if cfg.op == "LSTM" else "(float *)0"
    two_phase = cfg.op == "GRU" and not cfg.lbr
    zbuf = _scratch(em, D * B * Hp) if two_phase else "(float *)0"
    rhbuf = _scratch(em, D * B * Hp) if two_phase else "(float *)0"
    nflags = 2 * max(2, em.n_threads)
    flags = em.scratch(nflags * 64, "uint8")

    if dst:
        em.step(_pack_code(cfg, src, dst))

    # ---- step 1: the hoisted projection, initial states, barrier counters ----
    gemm = fn("rnn_gemm", gemm_code(cfg), f"{cfg.op} input projection, {T}x{B} rows, {N} fused columns")
    sshape_stride = (B * H, H) if cfg.layout == 0 else (H, D * H)  # (d stride, b stride)

    def init_state(src_name: str, buf: str) -> str:
        if not src_name:
            return f"memset({buf} + r * {Hp}, 0, {Hp * 4});"
        return (f"{{ const float *s = {em.ptr(src_name)} + d * {sshape_stride[0]}L + b * {sshape_stride[1]}L;\n"
                f"  float *o = {buf} + r * {Hp}; memcpy(o, s, {H * 4}); "
                f"memset(o + {H}, 0, {(Hp - H) * 4}); }}")

    init = [f"long lo, hi; smelt_range({D * B}L, tid, nt, &lo, &hi);",
            "for (long r = lo; r < hi; ++r) {",
            f"  long d = r / {B}, b = r % {B}; (void)d; (void)b;",
            "  " + init_state(cfg.h0, f"{hbuf}"),
            ]
    if cfg.op == "LSTM":
        init.append("  " + init_state(cfg.c0, f"{cbuf}"))
    init.append(f"  {CB}")
    init.append("}")
    init.append(f"if (tid == 0) memset((void *){flags}, 0, {nflags * 64});")
    if cfg.seq:  # onnxruntime rejects lengths outside [0, T]; run on (clamped), but report it
        init.append(f"if (tid == 0) {{ const int32_t *L = {em.ptr(cfg.seq)};\n"
                    f"  for (long b = 0; b < {B}; ++b) if (L[b] < 0 || L[b] > {T}) SMELT_FAIL(); }}")
    em.step(f"{gemm}({em.ptr(cfg.x)}, {xw}, {wp}, {bx}, tid, nt);\n" + "\n".join(init))

    # ---- step 2: the recurrence ----
    if two_phase:
        cells_a = [fn("rnn_cell", cell_code(cfg, d, "a"), f"GRU z/r gates, direction {d}") for d in range(D)]
        cells_b = [fn("rnn_cell", cell_code(cfg, d, "b"), f"GRU candidate, direction {d}") for d in range(D)]
    else:
        cells_a = [fn("rnn_cell", cell_code(cfg, d), f"{cfg.op} cell, direction {d}") for d in range(D)]
        cells_b = []
    max_one = _rec_threads(cfg, D * nhb, em.target.l1d_bytes)
    max_split = _rec_threads(cfg, nhb, em.target.l1d_bytes)
    y = em.ptr(cfg.y) if cfg.y else "(float *)0"
    slen = em.ptr(cfg.seq) if cfg.seq else "(const int32_t *)0"
    ydir = (B * H, D * B * H) if cfg.layout == 0 else (H, D * H)  # (d stride, t stride) of Y
    state = D * B * Hp

    has_rbh = cfg.op == "GRU" and cfg.lbr

    def off(ptr: str, present: bool, offset: int) -> str:
        return f"{ptr} + {offset}" if present else ptr

    def call(cell: str, d: int, lo: str, hi: str, hp: str, hn: str) -> str:
        t = f"{T - 1} - s" if cfg.reverse[d] else "s"
        yarg = f"y + (long)t * {ydir[1]}L + {d * ydir[0]}" if cfg.y else "y"
        return (f"{{ const int t = {t};\n"
                f"  {cell}({rp} + {d * nhb * H * G * VL}L, {xw} + (long)t * {B * N}L + {d * G * Hp}, "
                f"{hp} + {d * B * Hp}, {hn} + {d * B * Hp}, {off(cbuf, cfg.op == 'LSTM', d * B * Hp)}, "
                f"{off(pp, bool(cfg.p), d * 3 * Hp)}, {off(rbh, has_rbh, d * Hp)}, "
                f"{off(zbuf, two_phase, d * B * Hp)}, {off(rhbuf, two_phase, d * B * Hp)}, {yarg}, "
                f"slen, t, {lo}, {hi}); }}")

    def per_dir(cells: list[str], dirs: list[int]) -> str:
        return "\n    ".join(f"if (ulo{d} < uhi{d}) {call(cells[d], d, f'ulo{d}', f'uhi{d}', 'hp', 'hn')}"
                               for d in dirs)

    bar = f"{vx}_sync((({vx}_flag *){flags}) + gid * {nflags // 2}, lid, nact, ++epoch);"

    def loop(dirs: list[int]) -> str:
        body = [f"const float *hp = {hbuf} + (s & 1) * {state}L;",
                f"float *hn = {hbuf} + ((s + 1) & 1) * {state}L;",
                per_dir(cells_a, dirs)]
        if two_phase:
            body += [bar, per_dir(cells_b, dirs)]
        body.append(f"if (s + 1 < {T}) {bar}")
        return f"for (int s = 0; s < {T}; ++s) {{\n    " + "\n    ".join(body) + "\n}"

    if D == 1:
        steps = loop([0])
    else:  # one thread for both directions: one after the other, so one direction's R stays in L2
        steps = f"if (ng == 1) {{\n{loop([0])}\n{loop([1])}\n}} else {{\n{loop([0, 1])}\n}}"
    units = []
    for d in range(D):
        units.append(f"int ulo{d} = 0, uhi{d} = 0;")
    assign = f"""
/* thread groups: with 2 directions and 2+ threads, one group per direction (no shared barrier) */
const int ng = ({D} == 2 && nt >= 2) ? 2 : 1;
const int gid = (ng == 2 && tid >= nt / 2) ? 1 : 0;
const int gstart = gid ? nt / 2 : 0, gsize = ng == 2 ? (gid ? nt - nt / 2 : nt / 2) : nt;
const int nact = SMELT_MIN(gsize, ng == 2 ? {max_split} : {max_one});
const int lid = tid - gstart;
unsigned epoch = 0;
{' '.join(units)}
if (lid < nact) {{
    long lo, hi;
    if (ng == 2) {{
        smelt_range({nhb}L, lid, nact, &lo, &hi);
        if (gid == 0) {{ ulo0 = (int)lo; uhi0 = (int)hi; }}
        {'else { ulo1 = (int)lo; uhi1 = (int)hi; }' if D == 2 else ''}
    }} else {{
        smelt_range({D * nhb}L, lid, nact, &lo, &hi);
        ulo0 = (int)SMELT_MIN(lo, {nhb}L); uhi0 = (int)SMELT_MIN(hi, {nhb}L);
        {f'ulo1 = (int)SMELT_MAX(lo - {nhb}, 0L); uhi1 = (int)SMELT_MAX(hi - {nhb}, 0L);' if D == 2 else ''}
    }}
}}
"""
    final = []
    fin_h = f"{hbuf} + {(T % 2) * state}L"
    ys = (B * H, H) if cfg.layout == 0 else (H, D * H)  # Y_h (d stride, b stride)
    for name, buf in ((cfg.yh, fin_h), (cfg.yc, cbuf)):
        if not name:
            continue
        seqcheck = "slen[b] > 0" if cfg.seq else "1"
        final.append(f"""for (int d = 0; d < {D}; ++d) {{
    int lo = d == 0 ? ulo0 : {'ulo1' if D == 2 else '0'}, hi = d == 0 ? uhi0 : {'uhi1' if D == 2 else '0'};
    for (long b = 0; b < {B}; ++b) {{
        float *o = {em.ptr(name)} + d * {ys[0]}L + b * {ys[1]}L;
        const float *s = {buf} + (d * {B} + b) * {Hp}L;
        for (long j = (long)lo * {VL}; j < SMELT_MIN((long)hi * {VL}, {H}L); ++j) o[j] = ({seqcheck}) ? s[j] : 0.0f;
        {CB}
    }}
}}""")
    em.schedule(algorithm=f"{cfg.op}: input projection of all {T} steps hoisted into one GEMM, "
                          "recurrence split by hidden-unit blocks (DeepCPU)",
                threads=f"up to {max_one} threads on the recurrence ({nhb} hidden blocks)",
                layout=f"gates fused, hidden padded to {Hp}")
    em.step(f"""float *y = {y}; const int32_t *slen = {slen}; (void)y; (void)slen;
{assign}
if (lid < nact) {{
{steps}
{chr(10).join(final)}
}}""")
