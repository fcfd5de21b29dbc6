"""The activations smelt knows, once: ONNX attributes with defaults, whether they fuse into an
epilogue host, and what onnxruntime does with NaN/Inf (the numerics every rendering follows).

The C renderings (scalar and vector) live in codegen/kernels/epilogue.py, keyed by these names;
passes (fusion) and the element-wise template read this table; ``tests/kernels/
test_activation_numerics.py`` runs every fusable entry standalone and fused against onnxruntime.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from smelt.ir.epilogue import EpilogueActivation
from smelt.ir.graph import Node


@dataclass(frozen=True)
class Activation:
    name: str  # the ONNX op ("SiLU": the fused Sigmoid + Mul pattern, no ONNX op)
    attrs: dict[str, float] = field(default_factory=dict)  # ONNX attribute -> default
    fusable: bool = True  # may be fused into an epilogue host (Conv, Gemm, MatMul, BatchNorm)
    vector: bool = True  # has a vector rendering (else the epilogue falls back to scalar)
    needs_fma: bool = False  # the vector form calls the vector expf or tanhf (needs FMA)
    numerics: str = ""
    pattern: bool = False  # matched as a pattern of ONNX ops by the fuse pass, not one ONNX op


_TABLE = (
    Activation("Relu", numerics="max(0, x); NaN kept (onnxruntime's Relu op)"),
    Activation("Clip", numerics="min(max, max(min, x)); NaN kept; absent bounds are the float range, "
                                "so +-Inf -> +-FLT_MAX"),
    Activation("LeakyRelu", {"alpha": 0.01}, numerics="x >= 0 ? x : alpha x; NaN kept, -Inf -> -Inf"),
    Activation("HardSigmoid", {"alpha": 0.2, "beta": 0.5}, numerics="min(1, max(0, alpha x + beta)); NaN kept"),
    Activation("HardSwish", numerics="x * HardSigmoid(x; 1/6, 1/2); NaN kept, -Inf -> NaN (-Inf * 0)"),
    Activation("Sigmoid", needs_fma=True, numerics="1 / (1 + e^-x); +-Inf -> 1 / 0 exactly"),
    Activation("Tanh", needs_fma=True, numerics="vector form: x P(x^2) / Q(x^2) on x clamped to +-7.9988 "
                                                 "(the RNN's); +-Inf -> +-1, -0 -> -0, tiny x -> ~x"),
    Activation("SiLU", needs_fma=True, pattern=True,
               numerics="x / (1 + e^-x); -Inf -> NaN as onnxruntime's x * sigmoid(x)"),
    # the exact GELU as exporters spell it at opsets < 20: x * 0.5 * (1 + erf(x / sqrt2))
    # (passes/gelu_pattern.py); ONNX's own Gelu op, with its tanh approximation, is not this entry
    Activation("Gelu", needs_fma=True, pattern=True,
               numerics="x/2 (1 + erf(x/sqrt2)), vector erf of smelt_vec.h; +Inf -> +Inf, -Inf -> NaN "
                        "(-Inf * 0, as onnxruntime's spelled-out pattern), NaN kept"),
)
ACTIVATIONS: dict[str, Activation] = {a.name: a for a in _TABLE}

# ONNX ops fuse_epilogue fuses as an activation step (SiLU and Gelu are matched as patterns instead)
FUSABLE_OPS = frozenset(a.name for a in _TABLE if a.fusable and not a.pattern)

@dataclass(frozen=True)
class RnnActivation:
    """An activation of the RNN family's ``activations`` attribute (keyed in lower case: ONNX
    accepts them case-insensitively). ``alpha``/``beta``: None when the function takes no such
    attribute, else the default used when ``activation_alpha``/``activation_beta`` run out
    (onnxruntime's rnn_helpers.cc)."""

    alpha: float | None = None
    beta: float | None = None
    numerics: str = ""


# The vector renderings are in codegen/templates/rnn (``act_code``); Relu, HardSigmoid and
# ThresholdedRelu map NaN to 0 there as onnxruntime's rnn_activation_functors.h
# (``std::max(0.0f, x)``), unlike the standalone Relu/HardSigmoid ops, which keep NaN.
RNN_ACTIVATIONS: dict[str, RnnActivation] = {
    "affine": RnnActivation(0.0, 0.0, "alpha x + beta"),
    "relu": RnnActivation(numerics="max(0, x); NaN -> 0"),
    "leakyrelu": RnnActivation(0.01, None, "x >= 0 ? x : alpha x; NaN kept"),
    "thresholdedrelu": RnnActivation(0.0, None, "x > alpha ? x : 0; NaN -> 0"),
    "tanh": RnnActivation(numerics="NaN kept, +-Inf -> +-1"),
    "scaledtanh": RnnActivation(0.0, 0.0, "alpha tanh(beta x)"),
    "sigmoid": RnnActivation(numerics="NaN kept, +-Inf -> 1 / 0"),
    "hardsigmoid": RnnActivation(0.2, 0.5, "min(1, max(0, alpha x + beta)); NaN -> 0"),
    "elu": RnnActivation(1.0, None, "x >= 0 ? x : alpha (e^x - 1)"),
    "softsign": RnnActivation(numerics="x / (1 + |x|)"),
    "softplus": RnnActivation(numerics="log(1 + e^x)"),
}


def clip_default_bounds(dtype) -> tuple[float, float]:
    """Clip's bounds when an input/attribute is absent: ONNX's defaults, the float type's range
    (so Clip() maps +-Inf to +-FLT_MAX, as onnxruntime does)."""
    info = np.finfo(np.dtype(dtype))
    return float(info.min), float(info.max)


def activation_step(node: Node) -> EpilogueActivation:
    """The epilogue step of activation node ``node`` (not Clip, whose bounds may be inputs: see
    passes/fuse_epilogue.py), its attributes with ONNX's defaults filled in."""
    attrs = ACTIVATIONS[node.op].attrs
    return EpilogueActivation.of(node.op, {k: float(node.attr(k, d)) for k, d in attrs.items()})
