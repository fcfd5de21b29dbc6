"""Quantization schemes: bits, symmetric or asymmetric, granularity; scales, zero points and the
accumulator bound (ModelCompiler §5).

A scheme's bit width (2..16) is its *effective* width; the stored type is the narrowest native one
that holds it (int8/uint8 up to 8 bits, int16/uint16 up to 16), as ModelCompiler casts widths to
native 8/16-bit arithmetic: a 4-bit signed weight is an int8 whose values lie in [-8, 7].

- symmetric: zero point 0, signed storage; the scale maps max|x| to the largest positive code
  (2^(b-1) - 1), so the codes used are [-(2^(b-1) - 1), 2^(b-1) - 1] (the most negative code is
  left out, as onnxruntime's symmetric int8 uses [-127, 127]: the range stays symmetric).
- asymmetric: the scale maps [min, max] (widened to include 0, which a zero point must represent
  exactly) onto all 2^b codes; weights are stored signed ([-2^(b-1), 2^(b-1) - 1]), activations
  unsigned ([0, 2^b - 1]), the types onnxruntime's U8S8 format uses.

The accumulator bound of an integer product over K terms is K * max|a - a_zero| * max|w - w_zero|
(ModelCompiler tracks this width per node): the weights' term is exact (they are constants), the
activations' the largest code distance on either side of the zero point: a value beyond the
calibrated range saturates at the *storage* type's limits (ONNX's QuantizeLinear has no narrower
saturation), except for 9..15-bit activations, which the static writer clips to their own codes
first (``clips``) so that their effective width is what the bound counts. A configuration whose bound exceeds 2^31 - 1 could
overflow int32 and is refused (``AccumulatorOverflow``), naming the node and the bound.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from smelt.errors import SmeltError

GRANULARITIES = ("tensor", "channel", "row", "column")
INT32_MAX = 2**31 - 1


class AccumulatorOverflow(SmeltError):
    """A quantized node whose int32 accumulator could overflow for the chosen bit widths."""


@dataclasses.dataclass(frozen=True)
class Scheme:
    """How one tensor is quantized: effective ``bits`` (2..16), ``symmetric``, ``granularity``
    (weights: "tensor", "channel" = output channel, "row", "column"; activations: "tensor")."""

    bits: int = 8
    symmetric: bool = True
    granularity: str = "tensor"

    def __post_init__(self) -> None:
        if not 2 <= self.bits <= 16:
            raise SmeltError(f"bit width {self.bits}: smelt quantizes to 2..16 bits")
        if self.granularity not in GRANULARITIES:
            raise SmeltError(f"granularity {self.granularity!r}: choose one of {', '.join(GRANULARITIES)}")

    def storage(self, signed: bool) -> np.dtype:
        """The native type holding this width: int8/uint8 up to 8 bits, else int16/uint16."""
        wide = self.bits > 8
        return np.dtype((np.int16 if wide else np.int8) if signed else (np.uint16 if wide else np.uint8))

    def code_range(self, signed: bool) -> tuple[int, int]:
        """The codes a value within the calibrated range maps to."""
        if self.symmetric:
            top = 2 ** (self.bits - 1) - 1
            return -top, top
        return (-(2 ** (self.bits - 1)), 2 ** (self.bits - 1) - 1) if signed else (0, 2**self.bits - 1)


def params(lo: np.ndarray | float, hi: np.ndarray | float, scheme: Scheme, signed: bool
           ) -> tuple[np.ndarray, np.ndarray]:
    """fp32 scale(s) and zero point(s) (in the storage type) for ranges [lo, hi] (elementwise)."""
    lo = np.minimum(np.asarray(lo, np.float64), 0.0)
    hi = np.maximum(np.asarray(hi, np.float64), 0.0)
    qmin, qmax = scheme.code_range(signed)
    if scheme.symmetric:
        amax = np.maximum(np.abs(lo), np.abs(hi))
        scale = np.where(amax > 0, amax / qmax, 1.0).astype(np.float32)
        zero = np.zeros(scale.shape, np.int64)
    else:
        span = hi - lo
        scale = np.where(span > 0, span / (qmax - qmin), 1.0).astype(np.float32)
        zero = np.clip(np.rint(qmin - lo / scale.astype(np.float64)), qmin, qmax).astype(np.int64)
    if not signed and scheme.symmetric:  # symmetric unsigned: the zero point at the middle code
        mid = 2 ** (scheme.bits - 1)
        zero = np.full(scale.shape, mid, np.int64)
    return scale, zero.astype(scheme.storage(signed))


def weight_axis(op: str, granularity: str, rank: int, trans_b: bool = False) -> int | None:
    """The weight axis that carries the scales (None: per tensor). "channel" is the output
    channel: Conv's axis 0, MatMul's column (axis 1), Gemm's N axis (0 when transB)."""
    if granularity == "tensor":
        return None
    if op == "Conv":
        if granularity not in ("channel",):
            raise SmeltError(f"a Conv weight is quantized per tensor or per channel, not per {granularity}")
        return 0
    n_axis = 0 if trans_b else rank - 1
    k_axis = rank - 1 if trans_b else 0
    return {"channel": n_axis, "column": n_axis, "row": k_axis}[granularity]


def quantize_weight(w: np.ndarray, scheme: Scheme, axis: int | None, signed: bool = True
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(codes, scale, zero point) of constant ``w`` with one scale per index of ``axis`` (or one)."""
    w64 = w.astype(np.float64)
    if axis is None:
        lo, hi = np.array(w64.min() if w64.size else 0.0), np.array(w64.max() if w64.size else 0.0)
    else:
        red = tuple(a for a in range(w.ndim) if a != axis)
        lo, hi = w64.min(axis=red), w64.max(axis=red)
    scale, zero = params(lo, hi, scheme, signed)
    shape = [1] * w.ndim
    if axis is not None:
        shape[axis] = -1
    qmin, qmax = scheme.code_range(signed)
    codes = np.rint(w64 / scale.astype(np.float64).reshape(shape)) + zero.astype(np.int64).reshape(shape)
    return np.clip(codes, qmin, qmax).astype(scheme.storage(signed)), scale, zero


def clips(scheme: Scheme) -> bool:
    """Whether the static writer puts a Clip before this activation's QuantizeLinear so that it
    saturates at its own width: 9..15 bits (stored in 16, which the accumulator bound would
    otherwise have to assume). Below 8 bits the 8-bit storage bound is small anyway, and a Clip
    between an op and its Q would keep smelt from lowering the group to the integer kernels."""
    return 8 < scheme.bits < 16


def activation_reach(scheme: Scheme, zero: np.ndarray, signed: bool) -> int:
    """The largest |a - a_zero| a stored activation can reach: its code range when ``clips``,
    else the storage type's (a value beyond the calibrated range saturates there)."""
    if clips(scheme):
        lo, hi = scheme.code_range(signed)
    else:
        info = np.iinfo(scheme.storage(signed))
        lo, hi = int(info.min), int(info.max)
    z = np.asarray(zero, np.int64)
    return int(max(np.max(hi - z), np.max(z - lo)))


def accumulator_bound(k: int, a_reach: int, w_codes: np.ndarray, w_zero: np.ndarray, axis: int | None) -> int:
    """K * max|a - a_zero| * max|w - w_zero|: the largest |int32 sum| the integer op can form."""
    shape = [1] * w_codes.ndim
    if axis is not None:
        shape[axis] = -1
    w_dist = np.abs(w_codes.astype(np.int64) - np.asarray(w_zero, np.int64).reshape(shape))
    return int(k) * int(a_reach) * int(w_dist.max() if w_dist.size else 0)


def check_accumulator(node: str, k: int, a_reach: int, w_codes: np.ndarray, w_zero: np.ndarray,
                      axis: int | None) -> int:
    """The bound, or ``AccumulatorOverflow`` when it exceeds int32 (refused, not split: see the
    package doc)."""
    bound = accumulator_bound(k, a_reach, w_codes, w_zero, axis)
    if bound > INT32_MAX:
        raise AccumulatorOverflow(
            f"node {node!r}: K={k} x max|a-za|={a_reach} x max|w-zw|={bound // max(1, k * a_reach)} = {bound} "
            f"> 2^31-1, the int32 accumulator could overflow; lower the activation or weight bits for this node, "
            f"or keep it in float (keep=[{node!r}])")
    return bound
