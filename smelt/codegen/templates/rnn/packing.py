"""Weight layouts: the fused W panels, R per hidden block, biases, peepholes; at compile time
(numpy) and, for weights given as run-time inputs, the C that packs them the same way each run."""

from __future__ import annotations

import numpy as np

from smelt.codegen.kernels.rnn_config import (
    VL,
    RnnConfig,
)
from smelt.codegen.templates.rnn.common import CB
from smelt.codegen.templates.rnn.projection import PANEL


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
