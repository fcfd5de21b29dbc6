"""Gate math: the activations and clip of onnxruntime's RNN ops over the ``VX_`` vector API."""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import c_literal
from smelt.codegen.kernels.epilogue import (
    vector_clamp,
    vector_hard_sigmoid,
    vector_leaky_relu,
    vector_relu,
)
from smelt.codegen.kernels.rnn_config import (
    RnnConfig,
)


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
    HardSigmoid rendered by codegen/kernels/epilogue.py). NaN as onnxruntime's RNN activation functors
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
