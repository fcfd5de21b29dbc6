"""``smelt quantize`` / ``smelt.quantize(...)``: quantized ONNX models from fp32 ones.

One module per job:
- ``scheme``: bits (2..16, stored in 8 or 16 bits), symmetric or asymmetric, granularity; scales,
  zero points, and the int32 accumulator bound each node is checked against;
- ``calibrate``: calibration inputs (a folder of .npy/.npz files or an iterable of feeds) and the
  activation ranges (minmax, percentile, entropy);
- ``static``: the QDQ writer (static mode), BatchNormalization folding;
- ``dynamic``: the writer of onnxruntime's dynamic format (weights offline, activations at run
  time: DynamicQuantizeLinear + MatMulInteger, DynamicQuantizeLSTM);
- ``numeric``/``debug``: the numeric debug table (real integer kernels beside the float model);
- ``accuracy``: accuracy-driven mixed precision (nodes back to float until an error bound holds);
- ``sensitivity``: each node's harm at the output, from one compiled switchable simulation.

Mixed precision by hand: ``keep`` names nodes or op types that stay float; ``overrides`` maps a
node name or op type to "float" or a width spelling "w4", "a16", "w4a16" (weights 4 bits,
activations 16). A node name wins over its op type.

Everything written is standard ONNX (plus onnxruntime's ``com.microsoft`` DynamicQuantizeLSTM,
which onnxruntime ships) that onnxruntime loads.
"""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from smelt.errors import SmeltError
from smelt.quantize.accuracy import ErrorBound, keep_until_bound
from smelt.quantize.calibrate import METHODS, calibration_inputs, graph_inputs
from smelt.quantize.debug import debug_report
from smelt.quantize.dynamic import dynamic_targets, quantize_dynamic
from smelt.quantize.numeric import DebugReport, NumericDebugModel, TensorError, strip_activation_qdq
from smelt.quantize.scheme import AccumulatorOverflow, Scheme
from smelt.quantize.sensitivity import SwitchModel
from smelt.quantize.static import (
    NodeConfig,
    QuantizeReport,
    fold_batchnorms,
    node_name,
    output_tensor,
    quantize_static,
    targets,
)

MODES = ("static", "dynamic")
_SPEC = re.compile(r"^(?:w(\d+))?(?:a(\d+))?$")

__all__ = ["METHODS", "MODES", "AccumulatorOverflow", "DebugReport", "ErrorBound", "NumericDebugModel",
           "QuantizeReport", "Scheme", "TensorError", "calibration_inputs", "debug_report", "fold_batchnorms",
           "quantize", "strip_activation_qdq"]


def _configs(nodes: list[onnx.NodeProto], weight: Scheme, act: Scheme, keep: Iterable[str],
             overrides: Mapping[str, str]) -> tuple[dict[str, NodeConfig], list[tuple[str, str]]]:
    """Per node its schemes after ``keep`` and ``overrides`` (node name before op type)."""
    keep = set(keep)
    configs, skipped = {}, []
    for n in nodes:
        name = node_name(n)
        spec = overrides.get(name, overrides.get(n.op_type))
        if name in keep or n.op_type in keep or spec == "float":
            skipped.append((name, "kept in float as asked"))
            continue
        w, a = weight, act
        if spec is not None:
            m = _SPEC.match(spec.strip().lower())
            if not m or not (m.group(1) or m.group(2)):
                raise SmeltError(f"override {spec!r} for {name!r}: write 'float', 'wN', 'aN' or 'wNaM' (bits 2..16)")
            if m.group(1):
                w = Scheme(int(m.group(1)), w.symmetric, w.granularity)
            if m.group(2):
                a = Scheme(int(m.group(2)), a.symmetric, a.granularity)
        configs[name] = NodeConfig(w, a)
    return configs, skipped


def quantize(model: onnx.ModelProto | str | Path,
             calibration: str | Path | Iterable[Mapping[str, np.ndarray] | np.ndarray] | None = None, *,
             mode: str = "static", method: str = "minmax", percentile: float = 99.99,
             per_channel: bool = True, granularity: str | None = None,
             weight_bits: int = 8, activation_bits: int = 8,
             symmetric_weights: bool = True, symmetric_activations: bool = False,
             keep: Iterable[str] = (), overrides: Mapping[str, str] | None = None,
             max_error: str | float | ErrorBound | None = None, eval_samples: int = 16,
             threads: int | None = None) -> tuple[onnx.ModelProto, QuantizeReport]:
    """Quantize ``model``; returns the new model and a report.

    ``mode``: "static" (QDQ, activation ranges from ``calibration``) or "dynamic" (weights
    offline, activations quantized at run time; ``calibration`` only needed with ``max_error``).
    ``calibration``: a folder of .npz (arrays by input name) or .npy files (single-input model), or
    an iterable of feed dicts (or of arrays, single-input model). ``method``: "minmax",
    "percentile" (``percentile`` of each side) or "entropy" (KL threshold). Weights: ``weight_bits`` (2..16), ``symmetric_weights``,
    ``granularity`` "tensor", "channel" (output channel), "row" or "column" (default "channel",
    or "tensor" when ``per_channel`` is False). Activations: ``activation_bits``,
    ``symmetric_activations`` (per tensor). ``keep`` / ``overrides``: mixed precision by hand
    (package doc). ``max_error``: accuracy-driven mixed precision: "30dB" (SQNR floor of every
    output against fp32) or a relative error such as 0.01, measured on up to ``eval_samples``
    calibration inputs; the most harmful nodes go back to float until it holds. A node whose
    int32 accumulator could overflow is refused (``AccumulatorOverflow``).
    """
    if mode not in MODES:
        raise SmeltError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    if method not in METHODS:
        raise SmeltError(f"unknown calibration method {method!r}; choose one of {', '.join(METHODS)}")
    if not 50.0 < percentile <= 100.0:
        raise SmeltError(f"percentile must be in (50, 100]; given {percentile}")
    weight = Scheme(weight_bits, symmetric_weights, granularity or ("channel" if per_channel else "tensor"))
    act = Scheme(activation_bits, symmetric_activations, "tensor")
    overrides = dict(overrides or {})
    bound = max_error if isinstance(max_error, ErrorBound) or max_error is None else ErrorBound.parse(max_error)
    src = onnx.load(str(model)) if isinstance(model, (str, Path)) else model
    folded = onnx.ModelProto()
    folded.CopyFrom(src)
    if mode == "static":
        fold_batchnorms(folded)
    feeds: list[dict[str, np.ndarray]] = []
    if calibration is not None:
        feeds = list(calibration_inputs(calibration, graph_inputs(folded)))
    if mode == "static" and not feeds:
        raise SmeltError("static quantization needs calibration inputs: a folder of .npz/.npy files or an "
                         "iterable of feeds")
    if bound is not None and not feeds:
        raise SmeltError("max_error needs calibration inputs to measure the error on")
    nodes, base_skipped = (targets(folded) if mode == "static" else dynamic_targets(folded))
    ranges: dict[str, tuple[float, float]] = {}

    def quantize_with(floats: set[str]) -> tuple[onnx.ModelProto, QuantizeReport]:
        configs, skipped = _configs(nodes, weight, act, set(keep) | floats, overrides)
        skipped = list(base_skipped) + skipped
        if mode == "dynamic":
            return quantize_dynamic(folded, configs, skipped)
        if not configs:
            return folded, QuantizeReport([], skipped, {}, len(feeds))
        out, report = quantize_static(folded, feeds, configs, skipped, method=method, percentile=percentile,
                                      threads=threads, ranges=ranges or None)
        ranges.update(report.ranges)
        return out, report

    if bound is None:
        return quantize_with(set())
    by_name = {node_name(n): n for n in nodes}
    last: list[QuantizeReport] = []  # the report of the latest round: the model returned is its model

    def io_of(floats: set[str]) -> tuple[onnx.ModelProto, dict[str, tuple[str, str]]]:
        out, report = quantize_with(floats)
        last[:] = [report]
        io = {}
        for name in report.quantized_nodes:
            n = by_name[name]
            y = output_tensor(folded, n) if mode == "static" else next(o for o in n.output if o)
            io[name] = (n.input[0], y)
        return out, io

    evaluation = feeds[:eval_samples]
    start, order, sim_log = (_by_sensitivity(folded, quantize_with(set())[0], by_name, bound, evaluation, threads)
                             if mode == "static" else (set(), None, []))
    out, moved, log = keep_until_bound(io_of, lambda m: debug_report(m, evaluation, float_model=folded,
                                                                      threads=threads), bound, set(), start, order)
    log = sim_log + log
    report = last[0]
    report.accuracy = log
    report.skipped = [(n, "moved to float: accuracy" if n in moved else why) for n, why in report.skipped]
    return out, report


def _by_sensitivity(folded: onnx.ModelProto, quantized: onnx.ModelProto, by_name: dict[str, onnx.NodeProto],
                    bound: ErrorBound, feeds: list[dict[str, np.ndarray]], threads: int | None
                    ) -> tuple[set[str], list[str], list[str]]:
    """The nodes to start in float, the nodes most harmful first, and a log line: from one
    compiled switchable simulation (``sensitivity``) of the fully quantized static model."""
    from smelt.api import compile as smelt_compile

    inits = {i.name: i for i in folded.graph.initializer}
    nodes = [n for n in by_name if f"{n}_W_dq" in {o for node in quantized.graph.node for o in node.output}]
    if not nodes:
        return set(), [], []
    weights, acts = {}, {}
    for name in nodes:
        n = by_name[name]
        w = numpy_helper.to_array(inits[n.input[1]]).astype(np.float64)
        if n.op_type == "Gemm":
            alpha = next((a.f for a in n.attribute if a.name == "alpha"), 1.0)
            w = w * alpha
        weights[name] = w.astype(np.float32)
        acts[name] = (n.input[0], output_tensor(folded, n))
    shapes = {k: list(np.shape(v)) for k, v in feeds[0].items()}
    sim = SwitchModel(quantized, weights, acts, feeds,
                      lambda proto: smelt_compile(proto, threads=threads,
                                                  input_shapes=shapes | {i.name: [] for i in proto.graph.input
                                                                         if i.name.startswith("qswitch_")}))
    try:
        harm = sim.contributions()
        order = sorted(harm, key=lambda n: -harm[n])
        on = set(order)
        start: set[str] = set()
        for n in order:
            if bound.holds(sim.errors(on)):
                break
            on.discard(n)
            start.add(n)
        line = (f"simulation (one compiled float model, {len(order)} node switches): "
                f"{bound.describe(sim.errors(on))} with {len(start)} node(s) in float, "
                f"most harmful first: {', '.join(order[:5])}")
    finally:
        sim.close()
    return start, order, [line]


class _CallableModule(types.ModuleType):
    """``smelt.quantize(...)`` calls ``quantize`` while ``smelt.quantize.debug_report`` and
    ``from smelt.quantize import ...`` still name this package's contents."""

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[onnx.ModelProto, QuantizeReport]:
        return quantize(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
