"""Static quantization: every Conv, MatMul and Gemm (transA = 0) with constant weights in QDQ.

The output is the QDQ format onnxruntime's ``quantize_static`` writes (any ONNX runtime loads
it). Per quantized node:

- its activation input through ``QuantizeLinear -> DequantizeLinear`` (per tensor, the range from
  calibration), and its output likewise (after its Relu or Clip when a single one whose range
  holds 0 follows, so it folds into the requantization: ``output_tensor``); asymmetric activations are unsigned (uint8/uint16), symmetric
  ones signed with zero point 0;
- its weights as ``DequantizeLinear(W_q, w_scale, w_zero[, axis])`` in the weight scheme (per
  tensor, per output channel, per row or per column);
- a Conv's or Gemm's constant bias as int32 ``DequantizeLinear(b_q, x_scale * w_scale)`` (Gemm's
  alpha folded into the weights, beta into the bias; a bias the weight scales cannot carry —
  per-row scales, a 2-D C — stays float).

A tensor read or written by several quantized nodes gets the widest activation scheme any of them
asks for. The model's outputs stay fp32. A 9..15-bit activation is clipped to its own codes before
its QuantizeLinear (``scheme.clips``). 16-bit Q/DQ needs opset 21; an older model is converted
with onnx's version converter first (an error says so when that fails). Each node's int32
accumulator bound is checked (``scheme.check_accumulator``): an overflow is refused.

smelt's ``lower_qdq`` runs each 8-bit Conv/MatMul group as QLinearConv/QLinearMatMul on the
integer kernels, as onnxruntime does with the same file; Gemm groups (onnxruntime: QGemm), 16-bit groups, and weights scaled along the reduction axis
("row" of a MatMul weight), run as dequantize + float op + quantize in both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from smelt.errors import SmeltError
from smelt.quantize.activation import activation_range
from smelt.quantize.calibrate import collect_ranges
from smelt.quantize.scheme import (
    Scheme,
    activation_reach,
    check_accumulator,
    clips,
    params,
    quantize_weight,
    weight_axis,
)

TARGET_OPS = ("Conv", "MatMul", "Gemm")


@dataclasses.dataclass(frozen=True)
class NodeConfig:
    """One node's schemes: its weights' and its activations' (None: the node stays float)."""

    weight: Scheme
    act: Scheme


@dataclasses.dataclass
class QuantizeReport:
    """What ``quantize`` did: the nodes quantized (with their schemes and accumulator bounds),
    the nodes kept in float and why, the tensors calibrated and their ranges."""

    quantized_nodes: list[str]
    skipped: list[tuple[str, str]]  # (node, why it stayed fp32)
    ranges: dict[str, tuple[float, float]]
    samples: int
    mode: str = "static"
    schemes: dict[str, str] = dataclasses.field(default_factory=dict)  # node -> "w8 sym channel, a8 asym"
    accumulator_bits: dict[str, int] = dataclasses.field(default_factory=dict)  # node -> bits its sum needs
    accuracy: list[str] = dataclasses.field(default_factory=list)  # the accuracy-driven steps, if any

    def format_text(self) -> str:
        kind = "QDQ" if self.mode == "static" else "dynamic: weights offline, activations at run time"
        lines = [f"quantized {len(self.quantized_nodes)} node(s) ({kind})"
                 + (f"; calibrated {len(self.ranges)} tensor(s) over {self.samples} sample(s)" if self.samples else "")]
        for node in self.quantized_nodes:
            acc = f", accumulator {self.accumulator_bits[node]} bits" if node in self.accumulator_bits else ""
            lines.append(f"  {node}: {self.schemes.get(node, '')}{acc}")
        lines += [f"  kept fp32: {node} ({why})" for node, why in self.skipped]
        lines += [f"  accuracy: {step}" for step in self.accuracy]
        return "\n".join(lines)


def fold_batchnorms(model: onnx.ModelProto) -> int:
    """Fold each inference BatchNormalization that alone reads a Conv's output into that Conv's
    weights and bias, in place (float64 arithmetic, stored as fp32); returns how many. Quantizing
    first would put a Q/DQ pair between them and leave the BN in float (onnxruntime's quantizer
    asks for the same pre-processing)."""
    inits = {i.name: i for i in model.graph.initializer}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    outputs = {o.name for o in model.graph.output}
    producers = {o: n for n in model.graph.node for o in n.output}
    dead, folded = [], 0
    for bn in model.graph.node:
        if bn.op_type != "BatchNormalization" or len([o for o in bn.output if o]) != 1:
            continue
        conv = producers.get(bn.input[0])
        if conv is None or conv.op_type != "Conv" or len(readers.get(bn.input[0], [])) != 1 or bn.input[0] in outputs:
            continue
        if any(name not in inits for name in bn.input[1:5]) or conv.input[1] not in inits:
            continue
        if len(conv.input) > 2 and conv.input[2] and conv.input[2] not in inits:
            continue
        scale, bias, mean, var = (numpy_helper.to_array(inits[i]).astype(np.float64) for i in bn.input[1:5])
        eps = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
        s = scale / np.sqrt(var + eps)
        w = numpy_helper.to_array(inits[conv.input[1]]).astype(np.float64)
        b = (numpy_helper.to_array(inits[conv.input[2]]).astype(np.float64) if len(conv.input) > 2 and conv.input[2]
             else np.zeros(w.shape[0]))
        base = conv.name or conv.output[0]
        wn, bn_name = f"{base}_W_bnfolded", f"{base}_B_bnfolded"
        model.graph.initializer.extend([
            numpy_helper.from_array((w * s.reshape(-1, 1, 1, 1)).astype(np.float32), wn),
            numpy_helper.from_array(((b - mean) * s + bias).astype(np.float32), bn_name)])
        del conv.input[1:]
        conv.input.extend([wn, bn_name])
        conv.output[0] = bn.output[0]
        dead.append(bn)
        folded += 1
    for bn in dead:
        model.graph.node.remove(bn)
    return folded


def node_name(n: onnx.NodeProto) -> str:
    return n.name or n.output[0]


def targets(model: onnx.ModelProto, ops: Iterable[str] = TARGET_OPS
            ) -> tuple[list[onnx.NodeProto], list[tuple[str, str]]]:
    """The nodes of ``ops`` with constant float weights of the usual rank, and why the others of
    those ops stay fp32."""
    inits = {i.name: i for i in model.graph.initializer}
    chosen, skipped = [], []
    ops = tuple(ops)
    for n in model.graph.node:
        if n.op_type not in ops or n.domain not in ("", "ai.onnx"):
            continue
        w = inits.get(n.input[1]) if len(n.input) > 1 else None
        if w is None or w.data_type != onnx.TensorProto.FLOAT:
            skipped.append((node_name(n), "weights are not a float initializer"))
        elif n.op_type == "Conv" and len(w.dims) != 4:
            skipped.append((node_name(n), "only 2-D convolutions are quantized"))
        elif n.op_type in ("MatMul", "Gemm") and len(w.dims) != 2:
            skipped.append((node_name(n), f"only {n.op_type} with a 2-D weight is quantized"))
        elif n.op_type == "Gemm" and _attr(n, "transA", 0):
            skipped.append((node_name(n), "Gemm with transA"))
        else:
            chosen.append(n)
    return chosen, skipped


def _attr(n: onnx.NodeProto, name: str, default: float) -> float:
    a = next((a for a in n.attribute if a.name == name), None)
    return default if a is None else helper.get_attribute_value(a)


def _set_attr(n: onnx.NodeProto, name: str, value: float) -> None:
    for a in n.attribute:
        if a.name == name:
            n.attribute.remove(a)
            break
    n.attribute.append(helper.make_attribute(name, value))


def output_tensor(model: onnx.ModelProto, node: onnx.NodeProto) -> str:
    """The tensor to quantize after ``node``: its output, or the output of the one Relu or Clip
    that alone reads it when that activation's range holds 0 (a Relu, MobileNet's Relu6): the
    range calibrated after it then lies within the activation's bounds, so the requantization's
    own saturation is the activation and the integer op writes it (``lower_qdq`` drops it, as
    onnxruntime's ClipQuantFusion does). onnxruntime's quantizer folds them the same way; a
    separate QuantizeLinear on the op's output would spend its codes on values the activation
    then clamps, and the clamp would run as one more requantization."""
    y = node.output[0]
    readers = [n for n in model.graph.node if y in n.input]
    outputs = {o.name for o in model.graph.output}
    if len(readers) == 1 and y not in outputs:
        bounds = activation_range(model, readers[0])
        if bounds is not None and bounds[0] <= 0.0 < bounds[1]:
            return readers[0].output[0]
    return y


def _describe(cfg: NodeConfig) -> str:
    w, a = cfg.weight, cfg.act
    return (f"w{w.bits} {'sym' if w.symmetric else 'asym'} per {w.granularity}, "
            f"a{a.bits} {'sym' if a.symmetric else 'asym'}")


def _ensure_opset(model: onnx.ModelProto, need: int) -> onnx.ModelProto:
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset >= need:
        return model
    from onnx import version_converter

    try:
        return version_converter.convert_version(model, need)
    except Exception as e:  # the converter raises its own types for ops it cannot convert
        raise SmeltError(f"16-bit QuantizeLinear/DequantizeLinear need opset >= {need}; the model has {opset} "
                         f"and onnx's version converter failed ({e}): convert the model first or use <= 8 bits") from e


def quantize_static(src: onnx.ModelProto, feeds: list[dict[str, np.ndarray]], configs: Mapping[str, NodeConfig],
                    skipped: list[tuple[str, str]], *, method: str = "minmax", percentile: float = 99.99,
                    threads: int | None = None,
                    ranges: Mapping[str, tuple[float, float]] | None = None
                    ) -> tuple[onnx.ModelProto, QuantizeReport]:
    """Write ``src`` (BN already folded) with each node in ``configs`` (by node name) quantized.
    ``ranges``: calibrated ranges to reuse (the accuracy loop calibrates once)."""
    out = onnx.ModelProto()
    out.CopyFrom(src)
    if any(c.weight.bits > 8 or c.act.bits > 8 for c in configs.values()):
        out = _ensure_opset(out, 21)
    opset = next((o.version for o in out.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 10:
        raise SmeltError(f"QDQ needs opset >= 10; the model has {opset}")
    if opset < 13 and any(c.weight.granularity != "tensor" for c in configs.values()):
        raise SmeltError(f"per-axis weight scales need opset >= 13 (DequantizeLinear's axis); the model has "
                         f"{opset}: quantize the weights per tensor")
    nodes = [n for n in out.graph.node if node_name(n) in configs]
    graph_outputs = {o.name for o in out.graph.output}
    # each activation's scheme: the widest any quantized node touching it asks for
    act_scheme: dict[str, Scheme] = {}
    for n in nodes:
        for t in (n.input[0], output_tensor(out, n)):
            if t in graph_outputs:
                continue
            cur, want = act_scheme.get(t), configs[node_name(n)].act
            if cur is None or (want.bits, not want.symmetric) > (cur.bits, not cur.symmetric):
                act_scheme[t] = want
    nodes = [n for n in nodes if n.input[0] in act_scheme]  # an input that is a model output: not quantized
    for n in out.graph.node:
        if node_name(n) in configs and n not in nodes:
            skipped.append((node_name(n), "its input is a model output (kept fp32)"))
    acts = sorted(act_scheme)
    if ranges is None or any(t not in ranges for t in acts):
        ranges = collect_ranges(src, acts, feeds, method=method, percentile=percentile, threads=threads,
                                bits={t: (s.bits, s.symmetric) for t, s in act_scheme.items()})
    inits = {i.name: i for i in out.graph.initializer}
    new_inits: list[onnx.TensorProto] = []
    a_params: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for t in acts:
        s = act_scheme[t]
        scale, zero = params(*ranges[t], s, signed=s.symmetric)
        a_params[t] = (scale, zero)
        new_inits += [numpy_helper.from_array(np.array(scale, np.float32), f"{t}_scale"),
                      numpy_helper.from_array(np.array(zero, zero.dtype), f"{t}_zero_point")]
    renamed = {t: f"{t}_dq" for t in acts}
    qdq_nodes: dict[str, list[onnx.NodeProto]] = {}
    for t in acts:
        s, z = f"{t}_scale", f"{t}_zero_point"
        q_in, pre_q = t, []
        if clips(act_scheme[t]):  # saturate at the scheme's own codes, not the 16-bit storage's
            scale, zero = a_params[t]
            qmin, qmax = act_scheme[t].code_range(act_scheme[t].symmetric)
            lo = np.float32((qmin - int(zero)) * np.float32(scale))
            hi = np.float32((qmax - int(zero)) * np.float32(scale))
            new_inits += [numpy_helper.from_array(np.array(lo, np.float32), f"{t}_clip_min"),
                          numpy_helper.from_array(np.array(hi, np.float32), f"{t}_clip_max")]
            q_in = f"{t}_clipped"
            pre_q = [helper.make_node("Clip", [t, f"{t}_clip_min", f"{t}_clip_max"], [q_in], name=f"{t}_Clip")]
        qdq_nodes[t] = pre_q + [
            helper.make_node("QuantizeLinear", [q_in, s, z], [f"{t}_q"], name=f"{t}_QuantizeLinear"),
            helper.make_node("DequantizeLinear", [f"{t}_q", s, z], [renamed[t]], name=f"{t}_DequantizeLinear")]
    quantized, schemes, acc_bits = [], {}, {}
    for n in nodes:
        base = node_name(n)
        cfg = configs[base]
        w = numpy_helper.to_array(inits[n.input[1]]).astype(np.float32)
        trans_b = n.op_type == "Gemm" and bool(_attr(n, "transB", 0))
        bias = n.input[2] if len(n.input) > 2 and n.input[2] in inits else ""
        b_float = numpy_helper.to_array(inits[bias]).astype(np.float64) if bias else None
        if n.op_type == "Gemm":  # alpha into the weights, beta into C: the integer op has neither
            w = (w.astype(np.float64) * float(_attr(n, "alpha", 1.0))).astype(np.float32)
            if b_float is not None:
                b_float = b_float * float(_attr(n, "beta", 1.0))
            _set_attr(n, "alpha", 1.0)
            if b_float is not None:  # a C computed at run time keeps its beta
                _set_attr(n, "beta", 1.0)
        axis = weight_axis(n.op_type, cfg.weight.granularity, w.ndim, trans_b)
        w_q, w_scale, w_zero = quantize_weight(w, cfg.weight, axis, signed=True)
        n_axis = 0 if n.op_type == "Conv" or trans_b else 1
        k = int(np.prod(w.shape[1:])) if n.op_type == "Conv" else int(w.shape[1 if trans_b else 0])
        x_scheme = act_scheme[n.input[0]]
        bound = check_accumulator(base, k, activation_reach(x_scheme, a_params[n.input[0]][1], x_scheme.symmetric),
                                  w_q, w_zero, axis)
        acc_bits[base] = int(bound).bit_length() + 1  # + the sign bit
        wq_name, ws_name, wz_name = f"{base}_W_quantized", f"{base}_W_scale", f"{base}_W_zero_point"
        new_inits += [numpy_helper.from_array(w_q, wq_name), numpy_helper.from_array(w_scale, ws_name),
                      numpy_helper.from_array(w_zero, wz_name)]
        attrs = {"axis": axis} if axis is not None else {}
        pre = [helper.make_node("DequantizeLinear", [wq_name, ws_name, wz_name], [f"{base}_W_dq"],
                                name=f"{base}_W_DequantizeLinear", **attrs)]
        new_inputs = [renamed[n.input[0]], f"{base}_W_dq"]
        # the bias as int32 at x_scale * w_scale when that scale is per output channel (or one):
        # exactly as the integer op's requantization multiplies them
        if b_float is not None and b_float.size == w.shape[n_axis] and axis in (None, n_axis):
            b_scale = (np.float32(a_params[n.input[0]][0]) * w_scale).astype(np.float32)
            b_q = np.clip(np.rint(b_float.reshape(-1) / b_scale.astype(np.float64)), -(2**31), 2**31 - 1)
            new_inits += [numpy_helper.from_array(b_q.astype(np.int32), f"{base}_B_quantized"),
                          numpy_helper.from_array(b_scale, f"{base}_B_scale"),
                          numpy_helper.from_array(np.zeros(b_scale.shape, np.int32), f"{base}_B_zero_point")]
            pre.append(helper.make_node("DequantizeLinear", [f"{base}_B_quantized", f"{base}_B_scale",
                                                             f"{base}_B_zero_point"], [f"{base}_B_dq"],
                                        name=f"{base}_B_DequantizeLinear", **({"axis": 0} if axis is not None else {})))
            new_inputs.append(f"{base}_B_dq")
        elif b_float is not None:  # a bias the scales cannot carry stays float (beta applied)
            new_inits.append(numpy_helper.from_array(b_float.astype(np.float32), f"{base}_B_float"))
            new_inputs.append(f"{base}_B_float")
        elif len(n.input) > 2:
            new_inputs += list(n.input[2:])
        del n.input[:]
        n.input.extend(new_inputs)
        qdq_nodes.setdefault(f"__pre__{n.output[0]}", []).extend(pre)
        quantized.append(base)
        schemes[base] = _describe(cfg)
    # rebuild the node list: each node's weight DQs before it; each activation's Q/DQ right after
    # its producer (graph inputs: at the top); every other reader of the activation rewired
    producers = {o: n for n in out.graph.node for o in n.output}
    ordered: list[onnx.NodeProto] = []
    for t in acts:
        if t not in producers:
            ordered += qdq_nodes[t]
    for n in list(out.graph.node):
        ordered += qdq_nodes.get(f"__pre__{n.output[0]}", [])
        for k, name in enumerate(n.input):
            if name in renamed:
                n.input[k] = renamed[name]
        ordered.append(n)
        for o in n.output:
            if o in qdq_nodes:
                ordered += qdq_nodes[o]
    del out.graph.node[:]
    out.graph.node.extend(ordered)
    used = {i for node in ordered for i in node.input}
    kept = [i for i in out.graph.initializer if i.name in used]
    del out.graph.initializer[:]
    out.graph.initializer.extend(kept + new_inits)
    onnx.checker.check_model(out)
    return out, QuantizeReport(quantized, skipped, {t: ranges[t] for t in acts}, len(feeds), "static",
                               schemes, acc_bits)
