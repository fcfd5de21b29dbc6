"""LinearAttention (opset 27): the recurrent linear attention of GLA / RetNet / DeltaNet / Gated
DeltaNet, prefill (T > 1) and decode (T = 1), with grouped KV heads.

Per batch and KV head the state S [d_k, d_v] (float32, from past_state or zeros) is updated token
by token, in the order the operator defines (and the reference runs):

    gated rules:  S *= exp(g_t)                 (g per key row, or one per head)
    delta rules:  u = beta_t * (v_t - S^T k_t)  (else u = v_t)
    all:          S += k_t (outer) u
    output:       o_t = scale * q_t^T S         for each of the KV head's G = H_q / H_kv query heads

scale is the attribute, or 1/sqrt(d_k) when it is 0. The inner loops run along d_v over rows of S
(contiguous: the compiler vectorizes them at the target's width). Work items are (batch, KV head)
pairs, split over the threads: each owns its state and its query heads' output columns. Float32
and float16 activations (widened on load, output rounded once); the state is float32 or float16
(present_state takes past_state's type, else the query's, as the reference). A float32 state
lives in present_state itself; a float16 one in float32 scratch, rounded once at the end.
``chunk_size`` is a tuning hint for chunked GPU algorithms and changes nothing here.
"""

from __future__ import annotations

import math

import numpy as np

from smelt.codegen.emitter import BlockEmitter, c_literal
from smelt.codegen.kernels import half
from smelt.codegen.kernels.broadcast import PARALLEL_MIN_ELEMS
from smelt.codegen.registry import register
from smelt.ir.graph import PLAIN, Graph, Node

TYPES = ("float32", "float16")
RULES = ("linear", "gated", "delta", "gated_delta")


def _dtype(g: Graph, name: str) -> str:
    return np.dtype(g.values[name].dtype).name


def _rule(node: Node) -> str:
    r = node.attr("update_rule", "gated_delta")
    return r.decode() if isinstance(r, bytes) else str(r)


def _opt(node: Node, i: int) -> str:
    return node.inputs[i] if len(node.inputs) > i else ""


def _dims(node: Node, g: Graph) -> tuple[int, int, int, int, int, int]:
    """B, T, H_q, H_kv, d_k, d_v."""
    hq, hkv = int(node.attr("q_num_heads", 0)), int(node.attr("kv_num_heads", 0))
    b, t, qw = (int(d) for d in g.values[node.inputs[0]].shape)
    vw = int(g.values[node.inputs[2]].shape[2])
    return b, t, hq, hkv, qw // max(hq, 1), vw // max(hkv, 1)


def _check(node: Node, g: Graph) -> str | None:
    q, k, v = node.inputs[:3]
    past, decay, beta = _opt(node, 3), _opt(node, 4), _opt(node, 5)
    rule = _rule(node)
    if rule not in RULES:
        return f"unknown update_rule {rule!r}"
    gating, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    if gating != bool(decay) or delta != bool(beta):
        return f"update_rule {rule!r} with decay {'given' if decay else 'absent'}, beta {'given' if beta else 'absent'}"
    dt = _dtype(g, q)
    names = [n for n in (q, k, v, decay, beta) if n] + [node.outputs[0]]
    if dt not in TYPES or any(_dtype(g, n) != dt for n in names):
        return f"native LinearAttention takes one of {TYPES} for query, key, value, decay, beta, output"
    states = [n for n in (past, node.outputs[1] if len(node.outputs) > 1 else "") if n]
    if any(_dtype(g, n) not in TYPES for n in states):
        return f"native LinearAttention keeps its state in one of {TYPES}"
    if any(g.values[n].layout != PLAIN for n in names + states):
        return "LinearAttention reads plain layouts only"
    hq, hkv = int(node.attr("q_num_heads", 0)), int(node.attr("kv_num_heads", 0))
    if hq <= 0 or hkv <= 0 or hq % hkv:
        return f"q_num_heads {hq} must be a positive multiple of kv_num_heads {hkv}"
    shapes = {n: tuple(g.values[n].shape) for n in (q, k, v)}
    if any(len(s) != 3 for s in shapes.values()):
        return "query, key and value must be rank 3"
    b, t, _, _, dk, dv = _dims(node, g)
    if (shapes[q] != (b, t, hq * dk) or shapes[k] != (b, t, hkv * dk) or shapes[v] != (b, t, hkv * dv)
            or dk <= 0 or dv <= 0):
        return f"query/key/value shapes {list(shapes.values())} do not match the heads"
    if decay and tuple(g.values[decay].shape) not in ((b, t, hkv), (b, t, hkv * dk)):
        return f"decay must be [{b}, {t}, {hkv}] or [{b}, {t}, {hkv * dk}]"
    if beta and tuple(g.values[beta].shape) not in ((b, t, hkv), (b, t, 1)):
        return f"beta must be [{b}, {t}, {hkv}] or [{b}, {t}, 1]"
    for n in states:
        if tuple(g.values[n].shape) != (b, hkv, dk, dv):
            return f"state {n!r} must be [{b}, {hkv}, {dk}, {dv}]"
    if tuple(g.values[node.outputs[0]].shape) != (b, t, hq * dv):
        return "output shape does not match the heads"
    return None


@register("LinearAttention", check=_check, name="linear_attention")
def emit_linear_attention(node: Node, g: Graph, em: BlockEmitter) -> None:
    q, k, v = node.inputs[:3]
    past, decay, beta = _opt(node, 3), _opt(node, 4), _opt(node, 5)
    y = node.outputs[0]
    present = node.outputs[1] if len(node.outputs) > 1 else ""
    rule = _rule(node)
    b, t, hq, hkv, dk, dv = _dims(node, g)
    grp = hq // hkv
    dt = _dtype(g, q)
    sdt = _dtype(g, present) if present else _dtype(g, past) if past else dt
    pdt = _dtype(g, past) if past else sdt
    if "float16" in (dt, sdt, pdt):
        half.half_helpers(em)
    scale = float(node.attr("scale", 0.0)) or 1.0 / math.sqrt(dk)
    units, state = b * hkv, dk * dv
    scale_c = c_literal(scale, "float32")
    lines = [
        f"const __typeof__(*{em.ptr(q)}) *restrict Q = {em.ptr(q)};",
        f"const __typeof__(*{em.ptr(k)}) *restrict K = {em.ptr(k)};",
        f"const __typeof__(*{em.ptr(v)}) *restrict V = {em.ptr(v)};",
        f"__typeof__(*{em.ptr(y)}) *restrict Y = {em.ptr(y)};",
    ]
    if past:
        lines.append(f"const __typeof__(*{em.ptr(past)}) *restrict P = {em.ptr(past)};")
    if decay:
        lines.append(f"const __typeof__(*{em.ptr(decay)}) *restrict Dg = {em.ptr(decay)};")
    if beta:
        lines.append(f"const __typeof__(*{em.ptr(beta)}) *restrict Bt = {em.ptr(beta)};")
    # a float32 present_state holds the state itself; otherwise float32 scratch does
    in_place = bool(present) and sdt == "float32"
    if in_place:
        lines.append(f"float *restrict Sall = {em.ptr(present)};")
    else:
        lines.append(f"float *restrict Sall = {em.scratch(4 * units * state)};")
        if present:
            lines.append(f"__typeof__(*{em.ptr(present)}) *restrict Pr = {em.ptr(present)};")
    work = units * t * state * (2 + grp + (2 if "delta" in rule else 0))
    split = (f"smelt_range({units}, tid, nt, &ub, &ue);" if work >= PARALLEL_MIN_ELEMS and units > 1
             else f"ub = 0; ue = tid == 0 ? {units} : 0;")
    per_key = bool(decay) and tuple(g.values[decay].shape)[2] == hkv * dk
    beta_w = int(g.values[beta].shape[2]) if beta else 0
    ld = lambda e: half.load(dt, e)  # noqa: E731
    lines += [
        f"long ub, ue; {split}",
        "for (long u = ub; u < ue; ++u) {",
        f"    const long bi = u / {hkv}, h = u % {hkv};",
        f"    float *restrict S = Sall + u * {state};",
        f"    for (long i = 0; i < {state}; ++i) S[i] = {half.load(pdt, f'P[u * {state} + i]') if past else '0.0f'};",
        f"    float kt[{dk}], ut[{dv}], ot[{dv}];",
        f"    for (long s = 0; s < {t}; ++s) {{",
        f"        const long row = bi * {t} + s;",
        f"        for (long d = 0; d < {dk}; ++d) kt[d] = {ld(f'K[row * {hkv * dk} + h * {dk} + d]')};",
        f"        for (long m = 0; m < {dv}; ++m) ut[m] = {ld(f'V[row * {hkv * dv} + h * {dv} + m]')};",
    ]
    if decay:  # S *= exp(g): per key row, or one factor for the head
        if per_key:
            lines += [
                f"        for (long d = 0; d < {dk}; ++d) {{",
                f"            const float e = expf({ld(f'Dg[row * {hkv * dk} + h * {dk} + d]')});",
                f"            for (long m = 0; m < {dv}; ++m) S[d * {dv} + m] *= e;",
                "        }",
            ]
        else:
            lines += [
                f"        {{ const float e = expf({ld(f'Dg[row * {hkv} + h]')});",
                f"          for (long i = 0; i < {state}; ++i) S[i] *= e; }}",
            ]
    if beta:  # u = beta * (v - S^T k)
        bidx = f"row * {hkv} + h" if beta_w == hkv else "row"
        lines += [
            f"        for (long m = 0; m < {dv}; ++m) ot[m] = 0.0f;",
            f"        for (long d = 0; d < {dk}; ++d) {{",
            "            const float kd = kt[d];",
            f"            for (long m = 0; m < {dv}; ++m) ot[m] += S[d * {dv} + m] * kd;",
            "        }",
            f"        {{ const float bt = {ld(f'Bt[{bidx}]')};",
            f"          for (long m = 0; m < {dv}; ++m) ut[m] = bt * (ut[m] - ot[m]); }}",
        ]
    lines += [
        f"        for (long d = 0; d < {dk}; ++d) {{",
        "            const float kd = kt[d];",
        f"            for (long m = 0; m < {dv}; ++m) S[d * {dv} + m] += kd * ut[m];",
        "        }",
        f"        for (long gq = 0; gq < {grp}; ++gq) {{",
        f"            const long hh = h * {grp} + gq;",
        f"            for (long m = 0; m < {dv}; ++m) ot[m] = 0.0f;",
        f"            for (long d = 0; d < {dk}; ++d) {{",
        f"                const float qd = {ld(f'Q[row * {hq * dk} + hh * {dk} + d]')};",
        f"                for (long m = 0; m < {dv}; ++m) ot[m] += qd * S[d * {dv} + m];",
        "            }",
        f"            for (long m = 0; m < {dv}; ++m) Y[row * {hq * dv} + hh * {dv} + m] = "
        f"{half.store(dt, scale_c + ' * ot[m]')};",
        "        }",
        "    }",
    ]
    if present and not in_place:
        lines.append(f"    for (long i = 0; i < {state}; ++i) Pr[u * {state} + i] = {half.store(sdt, 'S[i]')};")
    lines.append("}")
    em.step("\n".join(lines), name=f"linear_attention_{rule}_{dt}",
            doc=f"LinearAttention {rule}, H_q {hq}, H_kv {hkv}, d_k {dk}, d_v {dv}")
    em.schedule(algorithm=f"recurrent {rule} update per token", threads="(batch, KV head) pairs")
