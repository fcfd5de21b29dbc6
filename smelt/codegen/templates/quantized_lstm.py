"""onnxruntime's ``com.microsoft:DynamicQuantizeLSTM``: the LSTM its dynamic quantizer writes.

Template ``dq_lstm``. The weights are int8/uint8 with per-tensor or per-gate-column scales and
zero points; the activations are quantized at run time to uint8, as onnxruntime does (found by
matching its outputs to 5e-8 over the variants, tests/kernels/test_quantized_lstm.py):
- the whole input X [seq, batch, input] once, with DynamicQuantizeLinear's rule (range widened
  to 0, scale = range / 255, zero point rounded half to even);
- the hidden state per batch row at every step, with the same rule over that row. (onnxruntime
  quantizes it per chunk of rows its threads take, so its own answer moves by ~1e-3 with its
  thread count once the batch has more rows than it has threads; per row is its finest split,
  the most accurate, and the same whatever smelt's thread count.)
Each product is exact in int32 (B - zero point packed once as int16), then scaled by
``x_scale * w_scale[column]``; the gates, peepholes and state update are the fp32 LSTM's
(sigmoid, tanh, tanh; other activations, ``clip``, ``input_forget`` and a ``sequence_lens``
input fall back, which for a contrib op means the model is refused with that reason).

Three steps: quantize X (each share finds its part's range, one share combines, all quantize),
the input projection for every (step, row) in parallel, then the recurrence, one share per
direction (a step of one direction depends on the previous one).

These are portable loops: the int16 x int16 products the vector kernels of ``int_matmul`` use
are what a faster recurrence would call; the sizes such models carry (hidden 64 to 256) are
dominated by the per-step quantization and the gates.
"""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import BlockEmitter
from smelt.codegen.kernels.int_gemm import emit_dynamic_uint8, uint8_params
from smelt.codegen.kernels.loops import dtype_name
from smelt.codegen.registry import register
from smelt.ir.graph import PLAIN, Graph, Node

MS_DOMAIN = "com.microsoft"
EIGHT_BIT = ("int8", "uint8")
# inputs: X, W, R, B, sequence_lens, initial_h, initial_c, P, W_scale, W_zero_point, R_scale,
# R_zero_point
X, W, R, BIAS, SEQ_LENS, INIT_H, INIT_C, PEEP, W_SCALE, W_ZERO, R_SCALE, R_ZERO = range(12)


def _inp(node: Node, k: int) -> str:
    return node.inputs[k] if len(node.inputs) > k else ""


def _const(g: Graph, name: str) -> np.ndarray | None:
    return None if not name else (None if g.values[name].const is None else np.asarray(g.values[name].const))


def _check(node: Node, g: Graph) -> str | None:
    names = [n for n in node.inputs + node.outputs if n]
    if any(g.values[n].layout != PLAIN for n in names):
        return "DynamicQuantizeLSTM reads plain layouts only"
    acts = [a.decode() if isinstance(a, bytes) else a for a in node.attr("activations", [])]
    if acts and acts != ["Sigmoid", "Tanh", "Tanh"] * (len(acts) // 3):
        return f"activations {acts}: only the default Sigmoid, Tanh, Tanh are native"
    if node.attr("clip") is not None:
        return "clip is not native"
    if int(node.attr("input_forget", 0)):
        return "input_forget is not native"
    if _inp(node, SEQ_LENS):
        return "a sequence_lens input is not native"
    x = g.values[node.inputs[X]]
    if x.dtype is None or dtype_name(g, node.inputs[X]) != "float32" or x.shape is None or len(x.shape) != 3:
        return "X must be a float32 [seq, batch, input] tensor of known shape"
    for k, what in ((W, "W"), (R, "R"), (W_SCALE, "W_scale"), (W_ZERO, "W_zero_point"), (R_SCALE, "R_scale"),
                    (R_ZERO, "R_zero_point")):
        if _const(g, _inp(node, k)) is None:
            return f"{what} must be a constant (weights are packed at compile time)"
    for k, what in ((BIAS, "B"), (PEEP, "P")):
        if _inp(node, k) and _const(g, _inp(node, k)) is None:
            return f"{what} must be a constant"
    w, r = _const(g, node.inputs[W]), _const(g, node.inputs[R])
    if dtype_name(g, node.inputs[W]) not in EIGHT_BIT or dtype_name(g, node.inputs[R]) not in EIGHT_BIT:
        return "W and R must be int8 or uint8"
    dirs, hidden4 = w.shape[0], w.shape[2]
    hidden = int(node.attr("hidden_size", hidden4 // 4))
    direction = node.attr("direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    if dirs != (2 if direction == "bidirectional" else 1) or hidden4 != 4 * hidden:
        return f"W of shape {list(w.shape)} does not fit direction {direction!r} and hidden_size {hidden}"
    if r.shape != (dirs, hidden, 4 * hidden) or w.shape[1] != x.shape[2]:
        return f"W {list(w.shape)} / R {list(r.shape)} do not fit X {list(x.shape)} and hidden_size {hidden}"
    for k in (W_SCALE, W_ZERO, R_SCALE, R_ZERO):
        if _const(g, _inp(node, k)).size not in (dirs, dirs * 4 * hidden):
            return f"{_inp(node, k)!r}: scales and zero points are per direction or per gate column"
    for k in (INIT_H, INIT_C):
        if _inp(node, k) and tuple(g.values[_inp(node, k)].shape or ()) != (dirs, x.shape[1], hidden):
            return f"{_inp(node, k)!r} must be [num_directions, batch, hidden]"
    return None


def _per_column(a: np.ndarray, dirs: int, n: int) -> np.ndarray:
    return np.broadcast_to(a.reshape(dirs, -1), (dirs, n)) if a.size == dirs else a.reshape(dirs, n)


@register("DynamicQuantizeLSTM", check=_check, name="dq_lstm", domain=MS_DOMAIN)
def emit_dq_lstm(node: Node, g: Graph, em: BlockEmitter) -> None:
    seq, batch, isz = g.values[node.inputs[X]].shape
    w, r = _const(g, node.inputs[W]), _const(g, node.inputs[R])
    dirs, hidden = w.shape[0], w.shape[2] // 4
    n4 = 4 * hidden
    direction = node.attr("direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    wz = _per_column(_const(g, _inp(node, W_ZERO)).astype(np.int16), dirs, n4)
    rz = _per_column(_const(g, _inp(node, R_ZERO)).astype(np.int16), dirs, n4)
    wp = em.weight((w.astype(np.int16) - wz[:, None, :]).astype(np.int16))  # [dirs, input, 4h]
    rp = em.weight((r.astype(np.int16) - rz[:, None, :]).astype(np.int16))  # [dirs, hidden, 4h]
    ws = em.weight(np.ascontiguousarray(_per_column(_const(g, _inp(node, W_SCALE)).astype(np.float32), dirs, n4)))
    rs = em.weight(np.ascontiguousarray(_per_column(_const(g, _inp(node, R_SCALE)).astype(np.float32), dirs, n4)))
    bias = _const(g, _inp(node, BIAS))
    bias = np.zeros((dirs, 8 * hidden), np.float32) if bias is None else bias.astype(np.float32).reshape(dirs, -1)
    bsum = em.weight(np.ascontiguousarray(bias[:, :n4] + bias[:, n4:]))  # Wb + Rb
    peep = _const(g, _inp(node, PEEP))
    peep = np.zeros((dirs, 3 * hidden), np.float32) if peep is None else peep.astype(np.float32).reshape(dirs, -1)
    pp = em.weight(np.ascontiguousarray(peep))
    total = seq * batch * isz
    rows = seq * batch
    xq = em.scratch(max(1, total), "uint8")
    gx = em.scratch(4 * dirs * rows * n4)
    # per direction: h, c [batch, hidden], the quantized row, the int32 sums, the gates
    per_dir = 2 * batch * hidden + n4 + n4 + n4
    work = em.scratch(4 * dirs * per_dir)
    x_ptr = em.ptr(node.inputs[X])
    # 1. X quantized as a whole, as DynamicQuantizeLinear does
    xsc = emit_dynamic_uint8(em, x_ptr, total, xq, "dq_lstm_x")
    # 2. the input projection of every (step, row), both directions: int32 sums, then scaled
    acc = em.scratch(4 * n4 * max(1, em.n_threads), "int32")
    em.step("\n".join([
        f"const uint8_t *restrict Q = {xq};", f"const float *SC = {xsc};",
        f"const int16_t *restrict Wp = {wp};", f"const float *restrict WS = {ws};",
        f"const float *restrict BS = {bsum};", f"float *restrict GX = {gx};",
        f"int32_t *restrict acc = {acc} + (long)tid * {n4};",
        f"long b, e; smelt_range({dirs * rows}, tid, nt, &b, &e);",
        "const int32_t xz = (int32_t)SC[1];",
        "for (long p = b; p < e; ++p) {",
        f"    const long d = p / {rows}, row = p % {rows};",
        f"    for (long j = 0; j < {n4}; ++j) acc[j] = 0;",
        f"    for (long k = 0; k < {isz}; ++k) {{",
        f"        const int32_t a = (int32_t)Q[row * {isz} + k] - xz;",
        f"        const int16_t *restrict wr = Wp + (d * {isz} + k) * {n4};",
        f"        for (long j = 0; j < {n4}; ++j) acc[j] += a * (int32_t)wr[j];",
        "    }",
        f"    float *restrict gr = GX + (d * {rows} + row) * {n4};",
        f"    for (long j = 0; j < {n4}; ++j) gr[j] = (float)acc[j] * (SC[0] * WS[d * {n4} + j]) + BS[d * {n4} + j];",
        "}"]), name="dq_lstm_input_projection")
    # 3. the recurrence, one share per direction
    outs = (list(node.outputs) + ["", "", ""])[:3]
    y, yh, yc = (em.ptr(o) if o else "" for o in outs)
    ih, ic = (em.ptr(_inp(node, k)) if _inp(node, k) else "" for k in (INIT_H, INIT_C))
    reverse = {"forward": "0", "reverse": "1", "bidirectional": "d"}[direction]
    lines = [
        f"const int16_t *restrict Rp = {rp};", f"const float *restrict RS = {rs};",
        f"const float *restrict PP = {pp};", f"const float *restrict GX = {gx};",
        f"for (long d = tid; d < {dirs}; d += nt) {{",
        f"    float *restrict H = {work} + d * {per_dir};",
        f"    float *restrict C = H + {batch * hidden};",
        f"    int32_t *restrict hq = (int32_t *)(C + {batch * hidden});",
        f"    int32_t *restrict acc = hq + {n4};",
        f"    float *restrict gate = (float *)(acc + {n4});",
        f"    for (long i = 0; i < {batch * hidden}; ++i) {{ H[i] = {f'{ih}[d * {batch * hidden} + i]' if ih else '0.0f'};"
        f" C[i] = {f'{ic}[d * {batch * hidden} + i]' if ic else '0.0f'}; }}",
        f"    const int reverse = {reverse};",
        f"    for (long s = 0; s < {seq}; ++s) {{",
        f"        const long t = reverse ? {seq - 1} - s : s;",
        f"        for (long bb = 0; bb < {batch}; ++bb) {{",
        f"            float *restrict h = H + bb * {hidden}, *restrict c = C + bb * {hidden};",
        # the row's range (widened to 0) and its uint8 quantization, DynamicQuantizeLinear's rule
        "            float lo = 0.0f, hi = 0.0f;",
        f"            for (long k = 0; k < {hidden}; ++k) {{ lo = h[k] < lo ? h[k] : lo; hi = h[k] > hi ? h[k] : hi; }}",
        "            float hs, hz;",
        *["            " + line for line in uint8_params("lo", "hi", "hs", "hz").splitlines()],
        f"            for (long k = 0; k < {hidden}; ++k) {{",
        "                float v = nearbyintf(h[k] / hs) + hz;",
        "                if (!(v >= 0.0f)) v = 0.0f;",
        "                if (v > 255.0f) v = 255.0f;",
        "                hq[k] = (int32_t)v - (int32_t)hz;",
        "            }",
        f"            for (long j = 0; j < {n4}; ++j) acc[j] = 0;",
        f"            for (long k = 0; k < {hidden}; ++k) {{",
        f"                const int16_t *restrict rr = Rp + (d * {hidden} + k) * {n4};",
        "                const int32_t a = hq[k];",
        f"                for (long j = 0; j < {n4}; ++j) acc[j] += a * (int32_t)rr[j];",
        "            }",
        f"            const float *restrict gx = GX + (d * {rows} + t * {batch} + bb) * {n4};",
        f"            for (long j = 0; j < {n4}; ++j) gate[j] = gx[j] + (float)acc[j] * (hs * RS[d * {n4} + j]);",
        # gates i, o, f, c (ONNX order); peepholes P = [p_i, p_o, p_f]
        f"            const float *restrict pi = PP + d * {3 * hidden}, *restrict po = pi + {hidden}, "
        f"*restrict pf = po + {hidden};",
        f"            for (long k = 0; k < {hidden}; ++k) {{",
        "                const float ig = 1.0f / (1.0f + expf(-(gate[k] + pi[k] * c[k])));",
        f"                const float fg = 1.0f / (1.0f + expf(-(gate[{2 * hidden} + k] + pf[k] * c[k])));",
        f"                const float cg = tanhf(gate[{3 * hidden} + k]);",
        "                const float cn = fg * c[k] + ig * cg;",
        f"                const float og = 1.0f / (1.0f + expf(-(gate[{hidden} + k] + po[k] * cn)));",
        "                c[k] = cn;",
        "                h[k] = og * tanhf(cn);",
        "            }",
    ]
    if y:
        lines.append(f"            for (long k = 0; k < {hidden}; ++k) "
                     f"{y}[((t * {dirs} + d) * {batch} + bb) * {hidden} + k] = h[k];")
    lines += ["        }", "    }"]
    if yh:
        lines.append(f"    for (long i = 0; i < {batch * hidden}; ++i) {yh}[d * {batch * hidden} + i] = H[i];")
    if yc:
        lines.append(f"    for (long i = 0; i < {batch * hidden}; ++i) {yc}[d * {batch * hidden} + i] = C[i];")
    lines.append("}")
    em.schedule(algorithm="X quantized once, h per row per step (onnxruntime's); int32 sums of int16 weights",
                kernel="dq_lstm", layout="NCHW", threads="one share per direction in the recurrence")
    em.step("\n".join(lines), name="dq_lstm_recurrence",
            doc=f"seq={seq} batch={batch} input={isz} hidden={hidden} directions={dirs}")
