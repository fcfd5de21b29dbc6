"""Dynamic quantization: weights quantized offline, activations at run time.

What onnxruntime's ``quantize_dynamic`` writes (QOperator format), so both runtimes load it:

- MatMul with a constant 2-D weight (and Gemm with transA = 0 and a constant B: alpha folds into
  the weights, beta * C is added after) becomes
  ``DynamicQuantizeLinear(x) -> MatMulInteger(x_q, W_q, x_zero, W_zero) -> Cast(float) ->
  Mul(., Mul(x_scale, W_scale))``, the product order onnxruntime's own quantizer writes and its
  MatMulIntegerToFloat fusion keeps, so the answer is the same float. One DynamicQuantizeLinear
  serves every quantized reader of a tensor. These are standard ONNX ops (smelt runs each
  natively: DynamicQuantizeLinear, the int_matmul kernel, Cast, Mul).
- LSTM with constant W and R becomes ``com.microsoft:DynamicQuantizeLSTM``: W and R transposed to
  [directions, input|hidden, 4*hidden] int8, scales and zero points per direction ([dirs]) or per
  gate column ([dirs, 4*hidden]), as onnxruntime's LSTM quantizer writes; smelt runs it natively
  (template ``dq_lstm``). Its weights are always symmetric (onnxruntime's kernel requires zero
  weight zero points; an asymmetric request is reported as symmetric for these). LSTMs with attributes that template refuses (other activations, clip,
  input_forget, a sequence_lens input) stay fp32.

Activations are uint8 (DynamicQuantizeLinear's type), so the activation scheme is fixed at 8-bit
asymmetric; weights take any scheme of 2..8 bits per tensor or per output column (a scale along
the reduction axis cannot be factored out of the integer sum). Conv stays fp32 (onnxruntime's
ConvInteger path is rarely faster than its float conv; use static quantization for CNNs).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from smelt.errors import SmeltError
from smelt.quantize.scheme import Scheme, check_accumulator, quantize_weight
from smelt.quantize.static import NodeConfig, QuantizeReport, node_name

MS_DOMAIN = "com.microsoft"
DYNAMIC_OPS = ("MatMul", "Gemm", "LSTM")
A_REACH = 255  # |a - a_zero| of a uint8 activation: its zero point is anywhere in [0, 255]


def _attr(n: onnx.NodeProto, name: str, default: object) -> object:
    a = next((a for a in n.attribute if a.name == name), None)
    return default if a is None else helper.get_attribute_value(a)


def dynamic_targets(model: onnx.ModelProto) -> tuple[list[onnx.NodeProto], list[tuple[str, str]]]:
    """The MatMul/Gemm/LSTM nodes dynamic quantization rewrites, and why others stay fp32."""
    inits = {i.name: i for i in model.graph.initializer}

    def const(name: str) -> onnx.TensorProto | None:
        t = inits.get(name)
        return t if t is not None and t.data_type == onnx.TensorProto.FLOAT else None

    chosen, skipped = [], []
    for n in model.graph.node:
        if n.op_type not in DYNAMIC_OPS or n.domain not in ("", "ai.onnx"):
            continue
        why = None
        if n.op_type in ("MatMul", "Gemm"):
            w = const(n.input[1])
            if w is None or len(w.dims) != 2:
                why = "the weight is not a 2-D float initializer"
            elif n.op_type == "Gemm" and int(_attr(n, "transA", 0)):
                why = "Gemm with transA"
            elif n.op_type == "Gemm" and len(n.input) > 2 and n.input[2] and const(n.input[2]) is None:
                why = "Gemm's C is not a float initializer"
        else:
            acts = [a.decode() if isinstance(a, bytes) else a for a in _attr(n, "activations", [])]
            if const(n.input[1]) is None or const(n.input[2]) is None:
                why = "W and R are not float initializers"
            elif acts and acts != ["Sigmoid", "Tanh", "Tanh"] * (len(acts) // 3):
                why = "non-default activations"
            elif _attr(n, "clip", None) is not None or int(_attr(n, "input_forget", 0)):
                why = "clip or input_forget"
            elif len(n.input) > 4 and n.input[4]:
                why = "a sequence_lens input"
            elif int(_attr(n, "layout", 0)):
                why = "layout = 1"
        if why:
            skipped.append((node_name(n), why))
        else:
            chosen.append(n)
    return chosen, skipped


def _weight_axis(scheme: Scheme, node: str) -> int | None:
    if scheme.bits > 8:
        raise SmeltError(f"node {node!r}: dynamic quantization stores weights in 8 bits (MatMulInteger, "
                         f"DynamicQuantizeLSTM); {scheme.bits} bits needs static quantization")
    if scheme.granularity == "row":
        raise SmeltError(f"node {node!r}: per-row weight scales lie along the reduction axis, which dynamic "
                         "quantization cannot factor out of the integer sum; use tensor or column/channel")
    return None if scheme.granularity == "tensor" else 1


def quantize_dynamic(src: onnx.ModelProto, configs: Mapping[str, NodeConfig], skipped: list[tuple[str, str]]
                     ) -> tuple[onnx.ModelProto, QuantizeReport]:
    """Write ``src`` with each node in ``configs`` (by node name) dynamically quantized."""
    out = onnx.ModelProto()
    out.CopyFrom(src)
    opset = next((o.version for o in out.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 11:
        raise SmeltError(f"DynamicQuantizeLinear needs opset >= 11; the model has {opset}")
    for node, cfg in configs.items():
        if cfg.act.bits != 8 or cfg.act.symmetric:
            raise SmeltError(f"node {node!r}: dynamic quantization's activations are uint8 asymmetric "
                             "(DynamicQuantizeLinear); activation bits/symmetry apply to static mode")
    inits = {i.name: i for i in out.graph.initializer}
    new_inits: list[onnx.TensorProto] = []
    dql: dict[str, onnx.NodeProto] = {}  # tensor -> its one DynamicQuantizeLinear
    replaced: dict[int, list[onnx.NodeProto]] = {}  # node index -> what replaces it
    quantized, schemes, acc_bits = [], {}, {}
    for index, n in enumerate(out.graph.node):
        base = node_name(n)
        if base not in configs:
            continue
        cfg = configs[base]
        axis = _weight_axis(cfg.weight, base)
        desc = f"w{cfg.weight.bits} {'sym' if cfg.weight.symmetric else 'asym'} per {cfg.weight.granularity}, a8 dynamic"
        if n.op_type == "LSTM":
            # onnxruntime's DynamicQuantizeLSTM requires zero weight zero points
            w_scheme = Scheme(cfg.weight.bits, True, cfg.weight.granularity)
            if not cfg.weight.symmetric:
                desc = desc.replace("asym", "sym (DynamicQuantizeLSTM takes zero weight zero points only)")
            replaced[index] = [_lstm(n, inits, w_scheme, axis, base, new_inits, acc_bits)]
        else:
            replaced[index] = _matmul(n, inits, cfg.weight, axis, base, new_inits, dql, acc_bits)
        quantized.append(base)
        schemes[base] = desc
    ordered: list[onnx.NodeProto] = []
    placed: set[str] = set()
    producers = {o for n in out.graph.node for o in n.output}
    for t, q in dql.items():  # graph inputs' quantizers first
        if t not in producers:
            ordered.append(q)
            placed.add(t)
    for index, n in enumerate(out.graph.node):
        ordered += replaced.get(index, [n])
        for o in n.output:
            if o in dql and o not in placed:
                ordered.append(dql[o])
                placed.add(o)
    del out.graph.node[:]
    out.graph.node.extend(ordered)
    if any(n.domain == MS_DOMAIN for n in ordered) and not any(o.domain == MS_DOMAIN for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    used = {i for node in ordered for i in node.input}
    kept = [i for i in out.graph.initializer if i.name in used]
    del out.graph.initializer[:]
    out.graph.initializer.extend(kept + new_inits)
    return out, QuantizeReport(quantized, skipped, {}, 0, "dynamic", schemes, acc_bits)


def _matmul(n: onnx.NodeProto, inits: dict[str, onnx.TensorProto], scheme: Scheme, axis: int | None, base: str,
            new_inits: list[onnx.TensorProto], dql: dict[str, onnx.NodeProto], acc_bits: dict[str, int]
            ) -> list[onnx.NodeProto]:
    w = numpy_helper.to_array(inits[n.input[1]]).astype(np.float32)
    c = None
    if n.op_type == "Gemm":
        if int(_attr(n, "transB", 0)):
            w = w.T
        w = (w.astype(np.float64) * float(_attr(n, "alpha", 1.0))).astype(np.float32)
        if len(n.input) > 2 and n.input[2]:
            c = (numpy_helper.to_array(inits[n.input[2]]).astype(np.float64) * float(_attr(n, "beta", 1.0)))
    w_q, w_scale, w_zero = quantize_weight(w, scheme, axis, signed=True)
    bound = check_accumulator(base, int(w.shape[0]), A_REACH, w_q, w_zero, axis)
    acc_bits[base] = bound.bit_length() + 1
    x = n.input[0]
    if x not in dql:
        dql[x] = helper.make_node("DynamicQuantizeLinear", [x], [f"{x}_quantized", f"{x}_scale", f"{x}_zero_point"],
                                  name=f"{x}_DynamicQuantizeLinear")
    names = {k: f"{base}_{k}" for k in ("W_quantized", "W_scale", "W_zero_point", "int32", "float", "scales",
                                        "mul", "C")}
    new_inits += [numpy_helper.from_array(w_q, names["W_quantized"]),
                  numpy_helper.from_array(w_scale.reshape(-1) if axis is not None else np.array(w_scale, np.float32),
                                          names["W_scale"]),
                  numpy_helper.from_array(w_zero.reshape(-1) if axis is not None else np.array(w_zero, w_zero.dtype),
                                          names["W_zero_point"])]
    y = n.output[0]
    mul_out = names["mul"] if c is not None else y
    nodes = [helper.make_node("MatMulInteger", [f"{x}_quantized", names["W_quantized"], f"{x}_zero_point",
                                                names["W_zero_point"]], [names["int32"]], name=f"{base}_MatMulInteger"),
             helper.make_node("Cast", [names["int32"]], [names["float"]], to=onnx.TensorProto.FLOAT,
                              name=f"{base}_Cast"),
             helper.make_node("Mul", [f"{x}_scale", names["W_scale"]], [names["scales"]], name=f"{base}_scales_Mul"),
             helper.make_node("Mul", [names["float"], names["scales"]], [mul_out], name=f"{base}_Mul")]
    if c is not None:
        new_inits.append(numpy_helper.from_array(c.astype(np.float32), names["C"]))
        nodes.append(helper.make_node("Add", [mul_out, names["C"]], [y], name=f"{base}_bias_Add"))
    return nodes


def _lstm(n: onnx.NodeProto, inits: dict[str, onnx.TensorProto], scheme: Scheme, axis: int | None, base: str,
          new_inits: list[onnx.TensorProto], acc_bits: dict[str, int]) -> onnx.NodeProto:
    extra = []
    bound = 0
    for k, tag in ((1, "W"), (2, "R")):
        w = numpy_helper.to_array(inits[n.input[k]]).astype(np.float32)  # [dirs, 4h, in|hidden]
        dirs, n4, kk = w.shape
        codes, scales, zeros = [], [], []
        for d in range(dirs):  # scales per direction (per tensor) or per gate column
            q, s, z = quantize_weight(w[d], scheme, None if axis is None else 0, signed=True)
            codes.append(q.T)
            scales.append(s)
            zeros.append(z)
            bound = max(bound, check_accumulator(base, kk, A_REACH, q, z, None if axis is None else 0))
        shape = (dirs,) if axis is None else (dirs, n4)
        new_inits += [numpy_helper.from_array(np.ascontiguousarray(np.stack(codes)), f"{base}_{tag}_quantized"),
                      numpy_helper.from_array(np.stack(scales).astype(np.float32).reshape(shape), f"{base}_{tag}_scale"),
                      numpy_helper.from_array(np.stack(zeros).reshape(shape), f"{base}_{tag}_zero_point")]
        extra += [f"{base}_{tag}_scale", f"{base}_{tag}_zero_point"]
    acc_bits[base] = bound.bit_length() + 1
    ins = list(n.input) + [""] * (8 - len(n.input))
    inputs = [ins[0], f"{base}_W_quantized", f"{base}_R_quantized"] + ins[3:8] + extra
    # DynamicQuantizeLSTM has no layout attribute (onnxruntime refuses the model if it is there);
    # layout = 1 was left fp32 by dynamic_targets, so 0 is dropped
    attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute if a.name != "layout"}
    return helper.make_node("DynamicQuantizeLSTM", inputs, list(n.output), name=f"{base}_quant",
                            domain=MS_DOMAIN, **attrs)
