"""Stacked layers: ModelCompiler's pipeline execution plan (chosen by smelt.schedule.rnn)."""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import BlockEmitter
from smelt.codegen.kernels.rnn_config import (
    GATES,
    RnnConfig,
    config,
)
from smelt.codegen.kernels.rnn_vec import vmath_source
from smelt.codegen.templates.rnn.cell import cell_code
from smelt.codegen.templates.rnn.common import _schedule, _scratch, native_vector
from smelt.codegen.templates.rnn.packing import pack_bias, pack_p, pack_r, pack_w
from smelt.codegen.templates.rnn.projection import gemm_code
from smelt.ir.graph import Graph, Node


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
    vx = em.function("rnn_vmath", vmath_source("FNAME", em.target), doc="RNN vector math: exp/sigmoid/tanh, activations, group barrier")

    def fn(base: str, code: str, doc: str) -> str:
        return em.function(base, code.replace("VX_", f"{vx}_"), doc=doc)

    P = max(1, em.n_threads)
    flags = em.scratch(max(2, P) * 64, "uint8")
    em.step(f"if (tid == 0) memset((void *){flags}, 0, {max(2, P) * 64});")
    layer_code, init_code, final_code = [], [], []
    l2, nat = em.target.l2_bytes, native_vector(em.target)  # the cells' L2 and native-vector tiles
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
            cells = [fn("rnn_cell", cell_code(cfg, 0, "a", rows={B}, l2_bytes=l2, native=nat), "GRU z/r gates"),
                     fn("rnn_cell", cell_code(cfg, 0, "b", rows={B}, l2_bytes=l2, native=nat), "GRU candidate")]
        else:
            cells = [fn("rnn_cell", cell_code(cfg, 0, "", rows={B}, l2_bytes=l2, native=nat), f"{cfg.op} cell")]
        # layer l reads layer l-1's Y directly ([T,1,B,H] has the bytes of its Squeeze output,
        # which the glue step only produces after this step)
        xin = em.ptr(cfg.x) if li == 0 else em.ptr(cfgs[li - 1].y)
        y = em.ptr(cfg.y) if cfg.y else "(float *)0"
        t_expr = f"{T - 1} - t" if cfg.reverse[0] else "t"
        yrow = f"{y} + (long)tt * {B * H}" if cfg.y else y
        calls = [f"{c}({rp}, {xwrow}, hp, hn, {cbuf}, {pp}, {rbh}, {zb}, {rh}, {yrow}, (const int32_t *)0, tt, "
                 f"0, {nhb}, 0, {B}, {H}, {'0' if cfg.h0 else 't == 0'}, 0, 0, 0, (float *)0);" for c in cells]
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
}}""", synchronize=min(P, L) > 1)
