"""Pass: flush subnormal float32 weights (and the biases fused onto them) of the multiply-heavy
ops to zero.

Trained models often carry weights below FLT_MIN (1.18e-38): PP-OCRv6's text detector has
256 K of its 2.45 M conv weights there, PP-OCRv5's 15 K. Intel cores take a microcode assist on
every multiply with such an operand (AMD's Zen cores do not), so on Emerald Rapids the v6
detector ran 210 ms with them and 58 ms with them flushed, in smelt and onnxruntime alike.
OpenVINO's CPU plugin and OpenCV's DNN zero them when they load a model; smelt does the same,
on the weights only: activations keep IEEE gradual underflow (no FTZ/DAZ is set). The
constants of a fused epilogue count as the op's (a bias Add): in the same detector, channels whose
weights are all subnormal had a subnormal bias, so the 1x1 conv's GELU epilogue ran on subnormal
values (26% of its outputs) at 3.3 ms where its twin without them took 1.0.

Why the answers do not move: a subnormal weight times any activation below 1e30 is under
1.2e-8, and next to any sum that is not itself below ~1e-30 it vanishes in fp32 rounding (its
weight of the sum is under half an ulp). Only an output whose whole sum is subnormal-scale can
differ. ``CompileOptions.flush_denormal_weights = False`` (``smelt.compile(...,
schedule={"flush_denormal_weights": False})``) keeps them as given.

Dead output channels: a Conv output channel whose every weight is below ``DEAD_CHANNEL_MAX``
(1e-33) in magnitude is zeroed whole. Training leaves such channels (weight decay on a channel
nothing needs): PP-OCRv5's detector has 111 of 384 in one 1x1 conv, every weight below 1.35e-37,
normal but so small that their products with the activations and the partial sums are
subnormal: that conv ran at 1% of peak (16.5 ms for 78 MFLOP) and the model in 52.9 ms, 31.8
with them zeroed (OpenVINO 55.8, onnxruntime 157, both paying the same assists). Their sums over
activations below 2^40 and up to 2^24 terms are below 2^-110 * 2^64 = 2^-46 (1.4e-14); beside a
bias of normal size they vanish in rounding, and without one an output moves by at most that
(on the detector's page image the outputs were bit-identical, in smelt and in onnxruntime).

Needs: constants folded (BatchNorm folding can make subnormal weights) and epilogues fused.
Guarantees: float32 constants of at least ``MIN_ELEMENTS`` elements read by a ``WEIGHT_OPS``
node or its fused epilogue hold no subnormal value; scalars and few-element constants (an
epsilon) are never touched.
"""

from __future__ import annotations

import numpy as np

from smelt.ir.graph import Graph

# the ops whose constant operands are multiplied by every output position
WEIGHT_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm", "LSTM", "GRU", "RNN", "Einsum"})
# a weight or a per-channel bias, not an epsilon
MIN_ELEMENTS = 8
# a Conv output channel whose weights are all below this in magnitude is dead: zeroed whole
DEAD_CHANNEL_MAX = np.float32(1e-33)
FLT_MIN = np.finfo(np.float32).tiny


def subnormal_mask(a: np.ndarray) -> np.ndarray:
    """Where ``a`` holds a nonzero float32 value below FLT_MIN in magnitude."""
    return (a != 0) & (np.abs(a) < FLT_MIN)


def subnormal_count(a: np.ndarray) -> int:
    """Nonzero float32 values below FLT_MIN in magnitude."""
    return int(np.count_nonzero(subnormal_mask(a)))


def flush_denormal_weights(g: Graph) -> Graph:
    """Zero the subnormal values of the large float32 constants that ``WEIGHT_OPS`` nodes read
    (a constant shared with other readers is flushed for them too: the same tensor). Each
    becomes a zero of its own sign; zeros, normal values, Inf and NaN are kept bit for bit."""
    for node in g.nodes:
        if node.op not in WEIGHT_OPS or node.domain not in ("", "ai.onnx"):
            continue
        for name in node.all_inputs():
            v = g.values.get(name) if name else None
            if v is None or v.const is None:
                continue
            a = np.asarray(v.const)
            if a.dtype != np.float32 or a.size < MIN_ELEMENTS:
                continue
            tiny = subnormal_mask(a)
            if node.op == "Conv" and name == node.inputs[1] and a.ndim >= 3:
                tiny |= dead_channel_mask(a)
            if tiny.any():
                v.const = np.where(tiny, np.copysign(np.float32(0), a), a).astype(np.float32)
    return g


def dead_channel_mask(w: np.ndarray) -> np.ndarray:
    """Every weight of the output channels (axis 0) whose nonzero weights are all below
    ``DEAD_CHANNEL_MAX`` in magnitude; a channel of zeros, or with a NaN or Inf, is not dead."""
    peak = np.abs(w.reshape(w.shape[0], -1)).max(axis=1)
    dead = (peak > 0) & (peak < DEAD_CHANNEL_MAX)
    return np.broadcast_to(dead.reshape((-1,) + (1,) * (w.ndim - 1)), w.shape)
