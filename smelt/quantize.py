"""``smelt quantize``: write a statically quantized QDQ model from an fp32 one.

The output is standard ONNX in the QDQ format onnxruntime's ``quantize_static`` writes (any ONNX
runtime loads it, so the user can check it elsewhere): every Conv and MatMul with constant
weights gets

- its activation input through ``QuantizeLinear -> DequantizeLinear`` (uint8, asymmetric, per
  tensor, the range from calibration), and its output likewise (after its Relu when a single
  Relu follows, so the Relu folds into the requantization);
- its weights as int8 ``DequantizeLinear(W_q, w_scale[, 0])``, symmetric, per output channel
  (``per_channel=True``, the default) or per tensor;
- its bias as int32 ``DequantizeLinear(b_q, x_scale * w_scale)``.

smelt's ``lower_qdq`` pass then runs each such group as QLinearConv/QLinearMatMul on the integer
kernels, which is what onnxruntime does with the same file.

Calibration runs the fp32 model (compiled by smelt, with the tensors to calibrate added as
outputs) over the calibration inputs and keeps, per tensor, the range: ``minmax`` (the extremes
seen) or ``percentile`` (the given percentile of |x| on each side, which trims outliers). The
range always includes 0 (a zero point must represent 0 exactly). Weights are never calibrated:
their own extremes give their scales.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from smelt.errors import SmeltError

METHODS = ("minmax", "percentile")


@dataclasses.dataclass
class QuantizeReport:
    """What ``quantize`` did: the ops quantized, the tensors calibrated and their ranges."""

    quantized_nodes: list[str]
    skipped: list[tuple[str, str]]  # (node, why it stayed fp32)
    ranges: dict[str, tuple[float, float]]
    samples: int

    def format_text(self) -> str:
        lines = [f"quantized {len(self.quantized_nodes)} node(s) to int8 (QDQ); calibrated "
                 f"{len(self.ranges)} tensor(s) over {self.samples} sample(s)"]
        lines += [f"  kept fp32: {node} ({why})" for node, why in self.skipped]
        return "\n".join(lines)


def calibration_inputs(source: str | Path | Iterable[Mapping[str, np.ndarray]], input_names: list[str]
                       ) -> Iterator[dict[str, np.ndarray]]:
    """Calibration feeds from a folder of .npz files (arrays by input name) or .npy files (the
    model's single input), or from an iterable of feed dicts."""
    if isinstance(source, (str, Path)):
        folder = Path(source)
        files = sorted(p for p in folder.iterdir() if p.suffix in (".npz", ".npy")) if folder.is_dir() else []
        if not files:
            raise SmeltError(f"calibration folder {str(folder)!r} has no .npz or .npy files")
        for path in files:
            if path.suffix == ".npz":
                with np.load(path) as npz:
                    yield {k: npz[k] for k in npz.files}
            elif len(input_names) == 1:
                yield {input_names[0]: np.load(path)}
            else:
                raise SmeltError(f"{path.name}: a .npy file feeds a single-input model; this one has inputs "
                                 f"{input_names}: use .npz files with one array per input name")
        return
    yield from ({k: np.asarray(v) for k, v in feed.items()} for feed in source)


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


def _targets(model: onnx.ModelProto) -> tuple[list[onnx.NodeProto], list[tuple[str, str]]]:
    """The Conv/MatMul nodes to quantize (constant float weights of the usual rank), and why
    the others stay fp32."""
    inits = {i.name: i for i in model.graph.initializer}
    chosen, skipped = [], []
    for n in model.graph.node:
        if n.op_type not in ("Conv", "MatMul") or n.domain not in ("", "ai.onnx"):
            continue
        w = inits.get(n.input[1]) if len(n.input) > 1 else None
        if w is None or w.data_type != onnx.TensorProto.FLOAT:
            skipped.append((n.name or n.output[0], "weights are not a float initializer"))
        elif n.op_type == "Conv" and len(w.dims) != 4:
            skipped.append((n.name or n.output[0], "only 2-D convolutions are quantized"))
        elif n.op_type == "MatMul" and len(w.dims) != 2:
            skipped.append((n.name or n.output[0], "only MatMul with a 2-D weight is quantized"))
        else:
            chosen.append(n)
    return chosen, skipped


def _output_tensor(model: onnx.ModelProto, node: onnx.NodeProto) -> str:
    """The tensor to quantize after ``node``: its output, or the output of the one Relu that
    alone reads it (the Relu then folds into the requantization)."""
    y = node.output[0]
    readers = [n for n in model.graph.node if y in n.input]
    outputs = {o.name for o in model.graph.output}
    if len(readers) == 1 and readers[0].op_type == "Relu" and y not in outputs:
        return readers[0].output[0]
    return y


def _calibrate(model: onnx.ModelProto, tensors: list[str], feeds: Iterable[Mapping[str, np.ndarray]],
               method: str, percentile: float, threads: int | None) -> tuple[dict[str, tuple[float, float]], int]:
    from smelt.api import compile as smelt_compile

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    present = {o.name for o in probe.graph.output}
    for t in tensors:
        if t not in present:
            probe.graph.output.append(helper.make_empty_tensor_value_info(t))
    names = [o.name for o in probe.graph.output]
    compiled = None
    lo: dict[str, list[float]] = {t: [] for t in tensors}
    hi: dict[str, list[float]] = {t: [] for t in tensors}
    samples = 0
    try:
        for feed in feeds:
            if compiled is None:
                compiled = smelt_compile(probe, threads=threads,
                                         input_shapes={k: list(np.shape(v)) for k, v in feed.items()})
            outs = dict(zip(names, compiled.run(feed), strict=True))
            for t in tensors:
                a = np.asarray(outs[t], np.float64)
                finite = a[np.isfinite(a)]
                if finite.size == 0:
                    continue
                if method == "percentile":
                    lo[t].append(float(np.percentile(finite, 100.0 - percentile)))
                    hi[t].append(float(np.percentile(finite, percentile)))
                else:
                    lo[t].append(float(finite.min()))
                    hi[t].append(float(finite.max()))
            samples += 1
    finally:
        if compiled is not None:
            compiled.close()
    if samples == 0:
        raise SmeltError("no calibration samples: give a folder of .npz/.npy files or an iterable of feeds")
    # minmax: the extremes over all samples; percentile: the mean of the per-sample percentiles
    pick = (min, max) if method == "minmax" else (lambda v: float(np.mean(v)), lambda v: float(np.mean(v)))
    return {t: (min(0.0, pick[0](lo[t])) if lo[t] else 0.0, max(0.0, pick[1](hi[t])) if hi[t] else 0.0)
            for t in tensors}, samples


def _activation_params(lo: float, hi: float) -> tuple[np.float32, np.uint8]:
    """uint8 asymmetric scale and zero point of [lo, hi] (which includes 0)."""
    scale = np.float32((hi - lo) / 255.0) if hi > lo else np.float32(1.0)
    zero = np.uint8(np.clip(np.rint(-lo / float(scale)), 0, 255))
    return scale, zero


def quantize(model: onnx.ModelProto | str | Path, calibration: str | Path | Iterable[Mapping[str, np.ndarray]], *,
             method: str = "minmax", percentile: float = 99.99, per_channel: bool = True,
             threads: int | None = None) -> tuple[onnx.ModelProto, QuantizeReport]:
    """Statically quantize ``model`` (QDQ, uint8 activations, int8 weights) with ranges from
    ``calibration``; returns the new model and a report. See the module doc."""
    if method not in METHODS:
        raise SmeltError(f"unknown calibration method {method!r}; choose one of {', '.join(METHODS)}")
    if not 50.0 < percentile <= 100.0:
        raise SmeltError(f"percentile must be in (50, 100]; given {percentile}")
    src = onnx.load(str(model)) if isinstance(model, (str, Path)) else model
    out = onnx.ModelProto()
    out.CopyFrom(src)
    fold_batchnorms(out)
    src = out  # calibrate what will be quantized: the folded model
    out = onnx.ModelProto()
    out.CopyFrom(src)
    opset = next((o.version for o in out.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 13 and per_channel:
        raise SmeltError(f"per-channel quantization needs opset >= 13 (DequantizeLinear's axis); the model has "
                         f"{opset}: pass per_channel=False")
    if opset < 10:
        raise SmeltError(f"QDQ needs opset >= 10; the model has {opset}")
    targets, skipped = _targets(out)
    if not targets:
        return out, QuantizeReport([], skipped, {}, 0)
    # the model's outputs stay fp32 (its answer is not re-quantized); so does an op writing one
    graph_outputs = {o.name for o in out.graph.output}
    acts = sorted(({n.input[0] for n in targets} | {_output_tensor(out, n) for n in targets}) - graph_outputs)
    targets = [n for n in targets if n.input[0] in acts]
    input_names = [i.name for i in out.graph.input if i.name not in {x.name for x in out.graph.initializer}]
    ranges, samples = _calibrate(src, acts, calibration_inputs(calibration, input_names), method, percentile,
                                 threads)
    inits = {i.name: i for i in out.graph.initializer}
    new_inits: list[onnx.TensorProto] = []
    params: dict[str, tuple[str, str]] = {}  # activation -> (scale name, zero point name)
    for t in acts:
        scale, zero = _activation_params(*ranges[t])
        params[t] = (f"{t}_scale", f"{t}_zero_point")
        new_inits += [numpy_helper.from_array(np.array(scale, np.float32), params[t][0]),
                      numpy_helper.from_array(np.array(zero, np.uint8), params[t][1])]
    # every reader of a calibrated activation reads its quantized-dequantized copy instead
    renamed = {t: f"{t}_dq" for t in acts}
    qdq_nodes: dict[str, list[onnx.NodeProto]] = {}
    for t in acts:
        s, z = params[t]
        qdq_nodes[t] = [helper.make_node("QuantizeLinear", [t, s, z], [f"{t}_q"], name=f"{t}_QuantizeLinear"),
                        helper.make_node("DequantizeLinear", [f"{t}_q", s, z], [renamed[t]],
                                         name=f"{t}_DequantizeLinear")]
    quantized = []
    for n in targets:
        w = numpy_helper.to_array(inits[n.input[1]]).astype(np.float32)
        axis = 0 if n.op_type == "Conv" else 1
        if per_channel:
            reduce_axes = tuple(a for a in range(w.ndim) if a != axis)
            amax = np.max(np.abs(w), axis=reduce_axes)
        else:
            amax = np.array(np.max(np.abs(w)))
        w_scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
        shape = [1] * w.ndim
        if per_channel:
            shape[axis] = -1
        w_q = np.clip(np.rint(w / w_scale.reshape(shape)), -127, 127).astype(np.int8)
        base = n.name or n.output[0]
        wq_name, ws_name, wz_name = f"{base}_W_quantized", f"{base}_W_scale", f"{base}_W_zero_point"
        new_inits += [numpy_helper.from_array(w_q, wq_name), numpy_helper.from_array(w_scale, ws_name),
                      numpy_helper.from_array(np.zeros(w_scale.shape, np.int8), wz_name)]
        attrs = {"axis": axis} if per_channel else {}
        dq_w = helper.make_node("DequantizeLinear", [wq_name, ws_name, wz_name], [f"{base}_W_dq"],
                                name=f"{base}_W_DequantizeLinear", **attrs)
        pre = [dq_w]
        new_inputs = [renamed[n.input[0]], f"{base}_W_dq"]
        if n.op_type == "Conv" and len(n.input) > 2 and n.input[2] and n.input[2] in inits:
            x_scale = np.float32(numpy_helper.to_array(next(i for i in new_inits if i.name == params[n.input[0]][0])))
            # x_scale * w_scale exactly as the integer op's requantization multiplies them
            b_scale = (x_scale * w_scale).astype(np.float32)  # [OC] per channel, else a scalar
            b = numpy_helper.to_array(inits[n.input[2]]).astype(np.float64).reshape(-1)
            b_q = np.clip(np.rint(b / b_scale.astype(np.float64)), -(2**31), 2**31 - 1).astype(np.int32)
            new_inits += [numpy_helper.from_array(b_q, f"{base}_B_quantized"),
                          numpy_helper.from_array(b_scale, f"{base}_B_scale"),
                          numpy_helper.from_array(np.zeros(b_scale.shape, np.int32), f"{base}_B_zero_point")]
            pre.append(helper.make_node("DequantizeLinear", [f"{base}_B_quantized", f"{base}_B_scale",
                                                             f"{base}_B_zero_point"], [f"{base}_B_dq"],
                                        name=f"{base}_B_DequantizeLinear", **({"axis": 0} if per_channel else {})))
            new_inputs.append(f"{base}_B_dq")
        elif len(n.input) > 2:
            new_inputs += list(n.input[2:])
        del n.input[:]
        n.input.extend(new_inputs)
        qdq_nodes.setdefault(f"__pre__{n.output[0]}", []).extend(pre)
        quantized.append(base)
    # rebuild the node list: each node's weight DQs before it; each activation's Q/DQ right after
    # its producer (graph inputs: at the top); every other reader of the activation rewired
    producers = {o: n for n in out.graph.node for o in n.output}
    nodes: list[onnx.NodeProto] = []
    for t in acts:
        if t not in producers:
            nodes += qdq_nodes[t]
    for n in list(out.graph.node):
        nodes += qdq_nodes.get(f"__pre__{n.output[0]}", [])
        for k, name in enumerate(n.input):
            if name in renamed:
                n.input[k] = renamed[name]
        nodes.append(n)
        for o in n.output:
            if o in qdq_nodes:
                nodes += qdq_nodes[o]
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    used = {i for node in nodes for i in node.input}
    kept = [i for i in out.graph.initializer if i.name in used]
    del out.graph.initializer[:]
    out.graph.initializer.extend(kept + new_inits)
    onnx.checker.check_model(out)
    return out, QuantizeReport(quantized, skipped, ranges, samples)


# -- numeric debug ---------------------------------------------------------------------------

@dataclasses.dataclass
class TensorError:
    """One quantized tensor against its float counterpart, over the debug inputs."""

    name: str  # the float tensor that is quantized (its name in both models)
    max_abs: float
    mean_abs: float
    sqnr_db: float  # 10 log10(sum ref^2 / sum err^2); inf when equal
    saturated: int  # elements the integer kernel clamped, counted inside it
    elements: int


@dataclasses.dataclass
class DebugReport:
    """Per quantized tensor, worst SQNR first (``tensors``), and the model outputs' errors."""

    tensors: list[TensorError]
    outputs: list[TensorError]
    samples: int

    def format_text(self, top: int | None = None) -> str:
        rows = [("tensor", "SQNR dB", "max abs", "mean abs", "saturated", "of")]
        for t in (self.tensors[:top] if top else self.tensors):
            rows.append((t.name, f"{t.sqnr_db:.1f}", f"{t.max_abs:.3g}", f"{t.mean_abs:.3g}", str(t.saturated),
                         str(t.elements)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [f"numeric debug over {self.samples} input(s): quantized tensors, worst SQNR first "
                 "(saturated: elements the integer kernel clamped, counted inside it)"]
        lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
        lines += [f"  model output {t.name}: SQNR {t.sqnr_db:.1f} dB, max abs {t.max_abs:.3g}" for t in self.outputs]
        return "\n".join(lines)

    def save_chart(self, path: str | Path, top: int = 30) -> None:
        """A bar chart of SQNR per tensor (worst first), saturation marked; needs matplotlib."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        shown = self.tensors[:top]
        fig, ax = plt.subplots(figsize=(max(6.0, 0.35 * len(shown) + 2), 4))
        colors = ["tab:red" if t.saturated else "tab:blue" for t in shown]
        ax.bar(range(len(shown)), [min(t.sqnr_db, 99.0) for t in shown], color=colors)
        ax.set_xticks(range(len(shown)), [t.name for t in shown], rotation=75, ha="right", fontsize=7)
        ax.set_ylabel("SQNR vs float (dB)")
        ax.set_title("quantized tensors, worst first (red: saturated inside the kernel)")
        fig.tight_layout()
        fig.savefig(str(path), dpi=120)
        plt.close(fig)


def strip_activation_qdq(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with each activation's QuantizeLinear -> DequantizeLinear pair removed (its
    readers read the float tensor again); weights stay dequantized. The float reference of a QDQ
    model when the original fp32 model is not at hand: what differs is then exactly the
    activation quantization and the integer arithmetic."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inits = {i.name for i in out.graph.initializer}
    q_in = {n.output[0]: n.input[0] for n in out.graph.node if n.op_type == "QuantizeLinear" and n.input[0] not in inits}
    dq_to_float = {n.output[0]: q_in[n.input[0]] for n in out.graph.node
                   if n.op_type == "DequantizeLinear" and n.input[0] in q_in}
    kept = [n for n in out.graph.node
            if not (n.op_type == "QuantizeLinear" and n.output[0] in q_in)
            and not (n.op_type == "DequantizeLinear" and n.output[0] in dq_to_float)]
    for n in kept:
        n.input[:] = [dq_to_float.get(i, i) for i in n.input]
    for o in out.graph.output:
        o.name = dq_to_float.get(o.name, o.name)
    del out.graph.node[:]
    out.graph.node.extend(kept)
    return out


def _pairs(model: onnx.ModelProto) -> list[tuple[str, str, str]]:
    """(float tensor, quantized tensor, dequantized tensor) of every activation Q -> DQ pair."""
    inits = {i.name for i in model.graph.initializer}
    dq_of = {n.input[0]: n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    return [(n.input[0], n.output[0], dq_of[n.output[0]]) for n in model.graph.node
            if n.op_type == "QuantizeLinear" and n.input[0] not in inits and n.output[0] in dq_of]


def debug_report(quantized: onnx.ModelProto, inputs: Iterable[Mapping[str, np.ndarray]],
                 float_model: onnx.ModelProto | None = None, *, threads: int | None = None) -> DebugReport:
    """Run the quantized model on smelt's integer kernels beside its float counterpart
    (``float_model``, else ``strip_activation_qdq(quantized)``) on ``inputs``; per quantized
    tensor the max and mean error of its dequantized value, its SQNR, and how many elements the
    kernel producing it saturated (counted inside the kernel: what a float-side comparison
    cannot see). Worst SQNR first."""
    from smelt.api import compile as smelt_compile

    reference = float_model if float_model is not None else strip_activation_qdq(quantized)
    pairs = _pairs(quantized)
    if not pairs:
        raise SmeltError("the model has no activation QuantizeLinear -> DequantizeLinear pairs to debug")
    q_probe, f_probe = onnx.ModelProto(), onnx.ModelProto()
    q_probe.CopyFrom(quantized)
    f_probe.CopyFrom(reference)
    model_outputs = [o.name for o in reference.graph.output]
    have_q = {o.name for o in q_probe.graph.output}
    have_f = {o.name for o in f_probe.graph.output}
    for f, _, dq in pairs:
        if dq not in have_q:
            q_probe.graph.output.append(helper.make_empty_tensor_value_info(dq))
        if f not in have_f:
            f_probe.graph.output.append(helper.make_empty_tensor_value_info(f))
    q_names = [o.name for o in q_probe.graph.output]
    f_names = [o.name for o in f_probe.graph.output]
    acc: dict[str, list[float]] = {}  # name -> [sum ref^2, sum err^2, max abs, sum abs, count]
    compiled_q = compiled_f = None
    samples = 0
    try:
        for feed in inputs:
            shapes = {k: list(np.shape(v)) for k, v in feed.items()}
            if compiled_q is None:
                compiled_q = smelt_compile(q_probe, threads=threads, input_shapes=shapes)
                compiled_f = smelt_compile(f_probe, threads=threads, input_shapes=shapes)
                compiled_q.run(feed)  # the variant exists: start its counters from zero
                compiled_q.reset_saturation_counts()
            assert compiled_f is not None
            got = dict(zip(q_names, compiled_q.run(feed), strict=True))
            ref = dict(zip(f_names, compiled_f.run(feed), strict=True))
            items = [(f, got[dq], ref[f]) for f, _, dq in pairs]
            items += [(o, got[o], ref[o]) for o in model_outputs if o in got and o in ref]
            for name, g_val, r_val in items:
                g64, r64 = np.asarray(g_val, np.float64), np.asarray(r_val, np.float64)
                err = np.abs(g64 - r64)
                a = acc.setdefault(name, [0.0, 0.0, 0.0, 0.0, 0.0])
                a[0] += float(np.sum(r64 * r64))
                a[1] += float(np.sum(err * err))
                a[2] = max(a[2], float(err.max()) if err.size else 0.0)
                a[3] += float(err.sum())
                a[4] += err.size
            samples += 1
        counts = compiled_q.saturation_counts() if compiled_q is not None else {}
    finally:
        for c in (compiled_q, compiled_f):
            if c is not None:
                c.close()
    if samples == 0:
        raise SmeltError("numeric debug needs at least one input")
    # counters are keyed by the value the kernel wrote: the Q's output, or (a Relu folded in)
    # a fresh "<q output>__k" the Max then reads; below a folded Relu the low-end clamps are the
    # Relu itself, not a loss, so a Relu's output counts its high-end clamps only
    relu_out = {n.output[0] for n in quantized.graph.node if n.op_type == "Relu"}
    relu_q = {q for f, q, _ in pairs if f in relu_out}
    saturated: dict[str, int] = {}
    for key, (low, high) in counts.items():
        head, _, tail = key.rpartition("__")
        base = head if head and tail.isdigit() and head in {q for _, q, _ in pairs} else key
        saturated[base] = saturated.get(base, 0) + high + (0 if base in relu_q else low)

    def entry(name: str, q_out: str | None) -> TensorError:
        s_ref, s_err, mx, s_abs, count = acc[name]
        sqnr = float("inf") if s_err == 0 else 10 * np.log10(max(s_ref, 1e-300) / s_err)
        return TensorError(name, mx, s_abs / max(count, 1), float(sqnr), saturated.get(q_out, 0) if q_out else 0,
                           int(count))

    tensors = sorted((entry(f, q) for f, q, _ in pairs), key=lambda t: (t.sqnr_db, -t.saturated))
    outputs = [entry(o, None) for o in model_outputs if o in acc]
    return DebugReport(tensors, outputs, samples)
