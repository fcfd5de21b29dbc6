"""onnxruntime's ``com.microsoft`` MatMulNBits (block-quantized weights) as a MatMul on the
weights dequantized once, at compile time.

What onnxruntime's ``matmul_nbits_quantizer`` (and the "q4" exports built on it) writes for every
Linear: ``Y = A @ W.T (+ bias)`` where W [N, K] is stored as ``bits``-bit codes in blocks of
``block_size`` along K, with one scale (and zero point) per block:

- B: uint8 [N, k_blocks, blob] with k_blocks = ceil(K / block_size), blob = block_size * bits / 8;
  codes packed along K within each byte, lowest bits first (4-bit: low nibble, then high nibble).
  The last block is padded when K is not a multiple of block_size (the padding is dropped).
- scales: T1 (A's type) [N, k_blocks] (or flat [N * k_blocks]).
- zero_points: absent (2^(bits-1), e.g. 8 for 4-bit), packed uint8 [N, ceil(k_blocks * bits / 8)]
  (or flat) with B's bit packing, or unpacked in A's float type [N, k_blocks].
- W[n, k] = (code[n, k] - zp[n, blk(k)]) * scale[n, blk(k)], blk(k) = k // block_size, or
  g_idx[k] when the (deprecated) g_idx input is given.
- bias: T1 [N], added to the product.

Checked against onnxruntime 1.32's CPU kernel in tests/test_contrib_matmul_nbits.py: bits 2, 4
and 8, packed and float zero points, K not a multiple of the block, g_idx, bias, float16 A (for
which onnxruntime converts A, scales and bias to float32, multiplies in float32 and rounds the
result to float16 once: the expansion is Cast, MatMul, Add, Cast).

Precision: smelt multiplies in float32, what the op's ``accuracy_level`` 0/1 asks for. With
``accuracy_level`` 4 onnxruntime quantizes A to int8 per block internally (a relative difference
around 5e-3 from the float32 product); smelt still computes in float32, the more accurate result.

Left as it is (the compile refuses the node by name, as before): B, scales, zero_points or g_idx
not initializers; bits other than 2/4/8, a block size below 16 or not a power of two,
``weight_prepacked``, bfloat16 scales, shapes that do not match K/N/block_size; g_idx with bits
other than 4 (onnxruntime's CPU kernel fails or misreads the codes) or with uint8 zero points
(onnxruntime's CPU kernel then ignores the zero points and uses 2^(bits-1), against the op's
documentation, so neither reading can claim to be "the" semantics).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import numpy_helper

if TYPE_CHECKING:
    from smelt.frontend.contrib_transformer import _Rewriter

_FLOATS = (np.dtype(np.float32), np.dtype(np.float16))


def _unpack(packed: np.ndarray, bits: int) -> np.ndarray:
    """uint8 [..., L] -> the codes [..., L * 8 / bits], lowest bits of each byte first."""
    per = 8 // bits
    shifts = (np.arange(per, dtype=np.uint8) * bits).astype(np.uint8)
    codes = (packed[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return codes.reshape(*packed.shape[:-1], packed.shape[-1] * per)


def _present(names, k: int) -> str:
    return names[k] if len(names) > k else ""


def dequantize_weights(attrs: dict, b: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None = None,
                       g_idx: np.ndarray | None = None) -> np.ndarray | None:
    """The float32 [K, N] weight MatMulNBits multiplies A by, or None when the attributes or
    shapes are not the supported ones."""
    try:
        k_dim, n_dim, block = int(attrs["K"]), int(attrs["N"]), int(attrs["block_size"])
    except KeyError:
        return None
    bits = int(attrs.get("bits", 4))
    if (bits not in (2, 4, 8) or block < 16 or block & (block - 1) or k_dim <= 0 or n_dim <= 0
            or int(attrs.get("weight_prepacked", 0))):
        return None
    blocks = -(-k_dim // block)
    if b.dtype != np.uint8 or b.size != n_dim * blocks * block * bits // 8:
        return None
    if scales.dtype not in _FLOATS or scales.size != n_dim * blocks:
        return None
    codes = _unpack(b.reshape(n_dim, blocks * block * bits // 8), bits)[:, :k_dim].astype(np.float32)
    scale = scales.astype(np.float32).reshape(n_dim, blocks)
    if zero_points is None:
        zp = np.full((n_dim, blocks), float(1 << (bits - 1)), np.float32)
    elif zero_points.dtype == np.uint8:
        per_row = -(-blocks * bits // 8)
        if zero_points.size != n_dim * per_row:
            return None
        zp = _unpack(zero_points.reshape(n_dim, per_row), bits)[:, :blocks].astype(np.float32)
    elif zero_points.dtype in _FLOATS and zero_points.size == n_dim * blocks:
        zp = zero_points.astype(np.float32).reshape(n_dim, blocks)
    else:
        return None
    if g_idx is None:
        group = np.arange(k_dim) // block
    else:
        # onnxruntime's CPU kernel reads g_idx only on a 4-bit path that ignores uint8 zero points
        if (bits != 4 or (zero_points is not None and zero_points.dtype == np.uint8)
                or g_idx.dtype.kind not in "iu" or g_idx.size != k_dim):
            return None
        group = g_idx.reshape(-1).astype(np.int64)
        if group.min() < 0 or group.max() >= blocks:
            return None
    w = (codes - zp[:, group]) * scale[:, group]  # [N, K], float32
    return np.ascontiguousarray(w.T)


def expand_matmul_nbits(rw: _Rewriter, node: onnx.NodeProto) -> bool:
    """MatMulNBits -> ``MatMul(A, W)`` (+ ``Add`` bias) with W dequantized now; float16 A is cast
    to float32 around it, as onnxruntime computes. False (the node stays) when the weights are
    not constant or a form is unsupported (see the module docstring)."""
    ins = list(node.input)
    a_name, b_name, s_name = (ins + ["", "", ""])[:3]
    zp_name, g_name, bias_name = _present(ins, 3), _present(ins, 4), _present(ins, 5)
    if not a_name or any(x and x not in rw.inits for x in (b_name, s_name, zp_name, g_name)) \
            or not b_name or not s_name:
        return False
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    arrays = [numpy_helper.to_array(rw.inits[x]) if x else None for x in (b_name, s_name, zp_name, g_name)]
    w = dequantize_weights(attrs, *arrays)
    if w is None:
        return False
    half = arrays[1].dtype == np.float16  # scales have A's type (T1)
    hint = node.name or "matmul_nbits"
    x = rw.op("Cast", [a_name], hint, to=onnx.TensorProto.FLOAT) if half else a_name
    last = not bias_name and not half
    y = rw.op("MatMul", [x, rw.const(f"{hint}_w", w)], hint, out=node.output[0] if last else None)
    if bias_name:
        b = bias_name
        if half:
            b = (rw.const(f"{hint}_bias", numpy_helper.to_array(rw.inits[bias_name]).astype(np.float32))
                 if bias_name in rw.inits else rw.op("Cast", [bias_name], hint, to=onnx.TensorProto.FLOAT))
        y = rw.op("Add", [y, b], hint, out=None if half else node.output[0])
    if half:
        rw.op("Cast", [y], hint, out=node.output[0], to=onnx.TensorProto.FLOAT16)
    return True
