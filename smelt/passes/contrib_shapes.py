"""Shapes and dtypes of the ops onnx's inference leaves untyped: ``com.microsoft`` and some of ``ai.onnx.ml``.

onnx's inference has no schema for onnxruntime's contrib ops, and its ``ai.onnx.ml`` schemas type
no output of Scaler, Normalizer, Imputer or LinearRegressor (nor LabelEncoder-1's, nor the tree
ensembles' below ml opset 3), so their outputs would stay untyped and everything after them off
the native path (skl2onnx's Scaler in front of an MLP sent the whole MLP to the fallback). Each rule here types one op's outputs
from its inputs, as onnxruntime's schema does; ``shape_inference.infer_shapes`` applies them
after onnx's pass and runs onnx's again so the values downstream are typed too.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from smelt.ir.graph import Graph, Node

MS_DOMAIN = "com.microsoft"
ML_DOMAIN = "ai.onnx.ml"
F32 = np.dtype(np.float32)


def _dynamic_quantize_lstm(node: Node, g: Graph) -> list[tuple[np.dtype, tuple] | None]:
    """Y [seq, num_directions, batch, hidden], Y_h and Y_c [num_directions, batch, hidden]: the
    LSTM's outputs (W_quantized is [num_directions, input, 4 * hidden])."""
    x, w = g.values[node.inputs[0]], g.values[node.inputs[1]]
    if x.shape is None or w.shape is None or len(x.shape) != 3 or len(w.shape) != 3:
        return [None, None, None]
    hidden = int(node.attr("hidden_size", 0)) or (w.shape[2] // 4 if isinstance(w.shape[2], int) else None)
    if hidden is None:
        return [None, None, None]
    seq, batch = x.shape[0], x.shape[1]
    dirs = w.shape[0]
    f32 = np.dtype(np.float32)
    return [(f32, (seq, dirs, batch, hidden)), (f32, (dirs, batch, hidden)), (f32, (dirs, batch, hidden))]


def _broadcast(*shapes: tuple) -> tuple | None:
    """numpy's broadcast of static shapes, None when a dim is symbolic or they do not broadcast."""
    if any(s is None or not all(isinstance(d, int) for d in s) for s in shapes):
        return None
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        return None


def _qlinear_binary(node: Node, g: Graph) -> list[tuple[np.dtype, tuple] | None]:
    """QLinearAdd / QLinearMul: A's type, A and B broadcast."""
    a, b = g.values[node.inputs[0]], g.values[node.inputs[3]]
    shape = _broadcast(a.shape, b.shape)
    return [None if shape is None or a.dtype is None else (np.dtype(a.dtype), shape)]


def _same_as_input(node: Node, g: Graph) -> list[tuple[np.dtype, tuple] | None]:
    """QLinearSigmoid / QLinearLeakyRelu / QLinearSoftmax / Imputer: X's type and shape."""
    x = g.values[node.inputs[0]]
    return [None if x.shape is None or x.dtype is None else (np.dtype(x.dtype), tuple(x.shape))]


def _qlinear_gap(node: Node, g: Graph) -> list[tuple[np.dtype, tuple] | None]:
    """QLinearGlobalAveragePool: the spatial dims become 1 (NCHW, or NHWC with channels_last)."""
    x = g.values[node.inputs[0]]
    if x.shape is None or x.dtype is None or len(x.shape) < 3:
        return [None]
    s = list(x.shape)
    shape = [s[0]] + [1] * (len(s) - 2) + [s[-1]] if int(node.attr("channels_last", 0)) else s[:2] + [1] * (len(s) - 2)
    return [(np.dtype(x.dtype), tuple(shape))]


def _qlinear_average_pool(node: Node, g: Graph) -> list[tuple[np.dtype, tuple] | None]:
    """QLinearAveragePool with explicit pads in floor mode (NCHW, or NHWC with channels_last);
    other forms stay untyped (and off the native path)."""
    x = g.values[node.inputs[0]]
    kernel = [int(k) for k in node.attr("kernel_shape", [])]
    if (x.shape is None or x.dtype is None or len(x.shape) != len(kernel) + 2
            or not all(isinstance(d, int) for d in x.shape) or int(node.attr("ceil_mode", 0))
            or str(node.attr("auto_pad", "NOTSET")) not in ("NOTSET", "VALID")):
        return [None]
    last = int(node.attr("channels_last", 0))
    spatial = list(x.shape[1:-1] if last else x.shape[2:])
    strides = [int(s) for s in node.attr("strides", [1] * len(kernel))]
    pads = [int(p) for p in node.attr("pads", [0] * 2 * len(kernel))]
    if str(node.attr("auto_pad", "NOTSET")) == "VALID":
        pads = [0] * 2 * len(kernel)
    k = len(kernel)
    outs = [(spatial[d] + pads[d] + pads[d + k] - kernel[d]) // strides[d] + 1 for d in range(k)]
    shape = [x.shape[0], *outs, x.shape[-1]] if last else [x.shape[0], x.shape[1], *outs]
    return [(np.dtype(x.dtype), tuple(shape))]


def _qlinear_concat(node: Node, g: Graph) -> list[tuple[np.dtype, tuple] | None]:
    """QLinearConcat: inputs 2, 5, 8, ... joined along ``axis``."""
    vals = [g.values[node.inputs[i]] for i in range(2, len(node.inputs), 3)]
    if not vals or any(v.shape is None or v.dtype is None for v in vals):
        return [None]
    rank = len(vals[0].shape)
    axis = int(node.attr("axis", 0)) % max(1, rank)
    dims = [v.shape[axis] for v in vals]
    if not all(isinstance(d, int) for d in dims):
        return [None]
    shape = list(vals[0].shape)
    shape[axis] = sum(dims)
    return [(np.dtype(vals[0].dtype), tuple(shape))]


def _matmul_to_float(node: Node, g: Graph) -> list[tuple[np.dtype, tuple] | None]:
    """DynamicQuantizeMatMul / MatMulIntegerToFloat: float32 A[..., M, K] @ B[K, N]."""
    a, b = g.values[node.inputs[0]], g.values[node.inputs[1]]
    if a.shape is None or b.shape is None or len(a.shape) < 1 or len(b.shape) != 2:
        return [None]
    return [(np.dtype(np.float32), tuple(a.shape[:-1]) + (b.shape[1],))]


def _qgemm(node: Node, g: Graph) -> list[tuple[np.dtype, tuple] | None]:
    """QGemm: [M, N]; float32 without y_scale, else y_zero_point's type (A's when absent)."""
    ins = list(node.inputs) + [""] * 9
    a, b = g.values[ins[0]], g.values[ins[3]]
    if a.shape is None or b.shape is None or len(a.shape) != 2 or len(b.shape) != 2:
        return [None]
    m = a.shape[1] if int(node.attr("transA", 0)) else a.shape[0]
    n = b.shape[0] if int(node.attr("transB", 0)) else b.shape[1]
    if not ins[7]:
        return [(np.dtype(np.float32), (m, n))]
    typed = g.values[ins[8]] if ins[8] else a
    return [None if typed.dtype is None else (np.dtype(typed.dtype), (m, n))]


def _float_like_input(node: Node, g: Graph) -> list[tuple[np.dtype, tuple] | None]:
    """Scaler / Normalizer: float32 of X's shape (whatever X's numeric type)."""
    x = g.values[node.inputs[0]]
    return [None if x.shape is None else (F32, tuple(x.shape))]


def _label_encoder(node: Node, g: Graph) -> list[tuple[np.dtype, tuple] | None]:
    """LabelEncoder: X's shape; opset 1 maps strings to int64 and int64 to strings, opset 2+
    to the type of its ``values_*`` attribute."""
    x = g.values[node.inputs[0]]
    if x.shape is None or x.dtype is None:
        return [None]
    if node.attr("classes_strings") is not None:
        out = np.dtype(np.int64) if np.dtype(x.dtype).kind in "OUS" else np.dtype(object)
    elif node.attr("values_tensor") is not None:
        out = np.asarray(node.attr("values_tensor")).dtype
    else:
        kinds = {"values_floats": F32, "values_int64s": np.dtype(np.int64), "values_strings": np.dtype(object)}
        out = next((dt for key, dt in kinds.items() if node.attr(key) is not None), None)
    return [None if out is None else (out, tuple(x.shape))]


def _linear_regressor(node: Node, g: Graph) -> list[tuple[np.dtype, tuple] | None]:
    """LinearRegressor: float32 [N, targets] (a 1-D X is one row)."""
    x = g.values[node.inputs[0]]
    if x.shape is None or len(x.shape) not in (1, 2):
        return [None]
    return [(F32, (1 if len(x.shape) == 1 else x.shape[0], int(node.attr("targets", 1))))]


def _tree_ensemble(node: Node, g: Graph) -> list[tuple[np.dtype, tuple] | None]:
    """TreeEnsembleRegressor: float32 [N, n_targets]; TreeEnsembleClassifier: labels [N] (int64,
    or strings) and float32 scores [N, classes] (a 1-D X is one row). onnx types them only
    from ml opset 3 on."""
    x = g.values[node.inputs[0]]
    if x.shape is None or len(x.shape) not in (1, 2):
        return [None] * len(node.outputs)
    rows = 1 if len(x.shape) == 1 else x.shape[0]
    if node.op == "TreeEnsembleRegressor":
        return [(F32, (rows, int(node.attr("n_targets") or 0)))]
    strings = node.attr("classlabels_strings")
    labels = strings if strings is not None else node.attr("classlabels_int64s") or []
    return [(np.dtype(object) if strings is not None else np.dtype(np.int64), (rows,)), (F32, (rows, len(labels)))]


RULES: dict[tuple[str, str], Callable[[Node, Graph], list[tuple[np.dtype, tuple] | None]]] = {
    (MS_DOMAIN, "DynamicQuantizeLSTM"): _dynamic_quantize_lstm,
    (MS_DOMAIN, "QLinearAdd"): _qlinear_binary,
    (MS_DOMAIN, "QLinearMul"): _qlinear_binary,
    (MS_DOMAIN, "QLinearSigmoid"): _same_as_input,
    (MS_DOMAIN, "QLinearLeakyRelu"): _same_as_input,
    (MS_DOMAIN, "QLinearSoftmax"): _same_as_input,
    (MS_DOMAIN, "QLinearGlobalAveragePool"): _qlinear_gap,
    (MS_DOMAIN, "QLinearConcat"): _qlinear_concat,
    (MS_DOMAIN, "QLinearAveragePool"): _qlinear_average_pool,
    (MS_DOMAIN, "DynamicQuantizeMatMul"): _matmul_to_float,
    (MS_DOMAIN, "MatMulIntegerToFloat"): _matmul_to_float,
    (MS_DOMAIN, "QGemm"): _qgemm,
    (ML_DOMAIN, "Scaler"): _float_like_input,
    (ML_DOMAIN, "Normalizer"): _float_like_input,
    (ML_DOMAIN, "Imputer"): _same_as_input,
    (ML_DOMAIN, "LabelEncoder"): _label_encoder,
    (ML_DOMAIN, "LinearRegressor"): _linear_regressor,
    (ML_DOMAIN, "TreeEnsembleRegressor"): _tree_ensemble,
    (ML_DOMAIN, "TreeEnsembleClassifier"): _tree_ensemble,
}


def apply_contrib_shapes(g: Graph) -> bool:
    """Type the outputs of nodes that have a rule; True when a value gained a shape."""
    changed = False
    for node in g.nodes:
        rule = RULES.get((node.domain, node.op))
        if rule is None:
            continue
        for name, typed in zip(node.outputs, rule(node, g), strict=False):
            if not name or typed is None:
                continue
            v = g.values[name]
            if v.shape is None or v.dtype is None or _sharper(v.shape, typed[1]):
                v.dtype, v.shape = typed
                changed = True
    return changed


def _sharper(old: tuple, new: tuple | None) -> bool:
    """``new`` sizes a dimension ``old`` left symbolic and agrees with it elsewhere (an input
    sized by a later fold round: Kokoro's DynamicQuantizeLSTM kept the symbolic batch of the
    first round and fell back, which a com.microsoft op cannot)."""
    if new is None or len(new) != len(old) or new == old:
        return False
    if any(isinstance(o, int) and o != n for o, n in zip(old, new, strict=True)):
        return False
    return any(isinstance(n, int) and not isinstance(o, int) for o, n in zip(old, new, strict=True))
