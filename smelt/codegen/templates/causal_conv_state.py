"""CausalConvWithState (opset 27): the stateful causal depthwise 1-D convolution of Gated DeltaNet
and Mamba blocks.

output[b, c, l] = act(bias[c] + sum_j w[c, 0, j] * padded[b, c, l + j]) over the sequence
``padded = concat(past_state or zeros (k - 1 positions), input)``, and present_state is
padded's last k - 1 positions (which reach into past_state when the input is shorter than k - 1).
act is none or SiLU (``swish`` is its alias): x * sigmoid(x), the reference's spelling; in
float32 on a vector target the whole row goes through the vector sigmoid (``smelt_vsigmoid*``,
the one the fused epilogues use) once it is computed, else libm's expf per element.

One (batch, channel) row per work item, rows split over the threads; the kernel length is a
compile-time constant, so the tap loop unrolls. Float32 and float16 (computed in float, one
rounding per output, as the reference rounds the convolution once). The weight and bias may be
constants or run-time inputs: they are read where they are, never packed.
"""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import BlockEmitter
from smelt.codegen.kernels import half
from smelt.codegen.kernels.broadcast import PARALLEL_MIN_ELEMS
from smelt.codegen.kernels.isa import vector_isa
from smelt.codegen.registry import register
from smelt.ir.graph import PLAIN, Graph, Node

TYPES = ("float32", "float16")


def _dtype(g: Graph, name: str) -> str:
    return np.dtype(g.values[name].dtype).name


def _activation(node: Node) -> str:
    act = node.attr("activation", "none")
    return act.decode() if isinstance(act, bytes) else str(act)


def _check(node: Node, g: Graph) -> str | None:
    x, w = node.inputs[0], node.inputs[1]
    bias = node.inputs[2] if len(node.inputs) > 2 else ""
    past = node.inputs[3] if len(node.inputs) > 3 else ""
    dt = _dtype(g, x)
    if dt not in TYPES:
        return f"native CausalConvWithState takes {TYPES} (given {dt})"
    names = [n for n in (x, w, bias, past) if n] + [o for o in node.outputs if o]
    if any(_dtype(g, n) != dt for n in names):
        return "native CausalConvWithState needs one dtype for every input and output"
    if any(g.values[n].layout != PLAIN for n in names):
        return "CausalConvWithState reads plain layouts only"
    if _activation(node) not in ("none", "silu", "swish"):
        return f"unknown activation {_activation(node)!r}"
    xs, ws = tuple(g.values[x].shape), tuple(g.values[w].shape)
    if len(xs) != 3 or len(ws) != 3 or ws[0] != xs[1] or ws[1] != 1 or ws[2] < 1:
        return f"CausalConvWithState needs input [B, C, L] and weight [C, 1, k] (given {list(xs)}, {list(ws)})"
    bsz, c, _ = xs
    k = ws[2]
    if bias and tuple(g.values[bias].shape) != (c,):
        return f"bias must be [{c}]"
    if past and tuple(g.values[past].shape) != (bsz, c, k - 1):
        return f"past_state must be [{bsz}, {c}, {k - 1}]"
    if tuple(g.values[node.outputs[0]].shape) != xs:
        return "output shape differs from the input's"
    return None


@register("CausalConvWithState", check=_check, name="causal_conv_state")
def emit_causal_conv_state(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, w = node.inputs[0], node.inputs[1]
    bias = node.inputs[2] if len(node.inputs) > 2 else ""
    past = node.inputs[3] if len(node.inputs) > 3 else ""
    y = node.outputs[0]
    present = node.outputs[1] if len(node.outputs) > 1 else ""
    dt = _dtype(g, x)
    bsz, c, length = (int(d) for d in g.values[x].shape)
    k = int(g.values[w].shape[2])
    if dt == "float16":
        half.half_helpers(em)
    ld = lambda e: half.load(dt, e)  # noqa: E731
    rows = bsz * c
    split = (f"smelt_range({rows}, tid, nt, &rb, &re);" if rows * length * k >= PARALLEL_MIN_ELEMS and rows > 1
             else f"rb = 0; re = tid == 0 ? {rows} : 0;")
    # padded[b, c, j] for j < k - 1 is the past (or 0), then the input
    before = f"P[r * {k - 1} + (J)]" if past else "0"
    pad_read = f"((J) < {k - 1} ? {ld(before) if past else '0.0f'} : {ld(f'X[r * {length} + (J) - {k - 1}]')})"
    act = _activation(node)
    silu = act in ("silu", "swish")
    v = vector_isa(em.target)
    # float32 SiLU over each finished row with the target's vector sigmoid (csrc/smelt_vec.h):
    # libm's expf per element cost more than the convolution itself
    vector_silu = silu and dt == "float32" and v.vector
    out_expr = "a * (1.0f / (1.0f + expf(-a)))" if silu and not vector_silu else "a"
    lines = [
        f"const __typeof__(*{em.ptr(x)}) *restrict X = {em.ptr(x)};",
        f"const __typeof__(*{em.ptr(w)}) *restrict Wt = {em.ptr(w)};",
        f"__typeof__(*{em.ptr(y)}) *restrict Y = {em.ptr(y)};",
    ]
    if bias:
        lines.append(f"const __typeof__(*{em.ptr(bias)}) *restrict Bs = {em.ptr(bias)};")
    if past:
        lines.append(f"const __typeof__(*{em.ptr(past)}) *restrict P = {em.ptr(past)};")
    write_state = bool(present) and k > 1  # k = 1: the state is empty
    if write_state:
        lines.append(f"__typeof__(*{em.ptr(present)}) *restrict S = {em.ptr(present)};")
    lines += [
        f"long rb, re; {split}",
        "for (long r = rb; r < re; ++r) {",
        f"    const long ch = r % {c};",
        f"    float w[{k}];",
        f"    for (int j = 0; j < {k}; ++j) w[j] = {ld(f'Wt[ch * {k} + j]')};",
        f"    const float b0 = {ld('Bs[ch]') if bias else '0.0f'};",
        # the first k - 1 outputs reach into the past; the rest read the input only
        f"    const long head = {min(k - 1, length)};",
        "    for (long l = 0; l < head; ++l) {",
        "        float a = 0.0f;",
        f"        for (int j = 0; j < {k}; ++j) {{ const long J = l + j; a += w[j] * {pad_read}; }}",
        "        a += b0;",
        f"        Y[r * {length} + l] = {half.store(dt, out_expr)};",
        "    }",
        f"    for (long l = head; l < {length}; ++l) {{",
        f"        const __typeof__(*X) *xr = X + r * {length} + l - {k - 1};",
        "        float a = 0.0f;",
        f"        for (int j = 0; j < {k}; ++j) a += w[j] * {ld('xr[j]')};",
        "        a += b0;",
        f"        Y[r * {length} + l] = {half.store(dt, out_expr)};",
        "    }",
    ]
    if vector_silu:
        lanes = v.lanes
        silu_v = v.op("mul", "xv", f"{v.sigmoid_fn}(xv)")
        lines += [
            f"    float *yr = Y + r * {length};",
            f"    for (long o = 0; o < {length}; o += {lanes}) {{",
            f"        if (o + {lanes} <= {length}) {{ const {v.vtype} xv = {v.loadu('yr + o')}; {v.storeu('yr + o', silu_v)} }}",
            f"        else {{ const {v.mask_type} m = {v.lane_mask(f'{length} - o')};",
            f"               const {v.vtype} xv = {v.masked_load('yr + o', 'm')}; {v.masked_store('yr + o', silu_v, 'm')} }}",
            "    }",
        ]
    if write_state:  # present[i] = padded[L + i]
        lines += [
            f"    for (long i = 0; i < {k - 1}; ++i) {{",
            f"        const long J = {length} + i;",
            f"        S[r * {k - 1} + i] = " + (
                f"J < {k - 1} ? {'P[r * ' + str(k - 1) + ' + J]' if past else '0'} : X[r * {length} + J - {k - 1}];"),
            "    }",
        ]
    lines.append("}")
    em.step("\n".join(lines), name=f"causal_conv_state_{dt}_{v.name if vector_silu else 'scalar'}",
            doc=f"CausalConvWithState, kernel {k}, activation {act}")
    em.schedule(algorithm="direct causal depthwise taps", threads="(batch, channel) rows")
