"""Numeric debug: the quantized model's tensors against the float model's, on the real kernels.

ModelCompiler §5.2's debug mode: the quantized model runs on smelt's integer kernels (not a float
simulation of them, as onnxruntime's ``qdq_loss_debug`` compares) beside the float model, and per
quantized tensor the max and mean absolute error, the SQNR and the elements the integer kernel
producing it saturated (counted inside the kernel: ``CompiledModel.saturation_counts()``) are
accumulated over the inputs seen, worst SQNR first.

The tensors compared: every activation ``QuantizeLinear -> DequantizeLinear`` pair of a static
(QDQ) model (its dequantized value against the float tensor of the same name), and the output of
every dynamically quantized op (``DynamicQuantizeLSTM``; the ``MatMulInteger -> Cast -> Mul``
chain), which keeps the float op's output name. The float reference is the original model when
given, else ``strip_activation_qdq`` of the quantized one (static models only).

This module does not compile anything itself: ``NumericDebugModel`` takes a ``make`` function
(``smelt.api`` passes its compiled-model constructor), so ``smelt.api`` can offer
``compile(..., numeric_debug=True)`` without an import circle.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from smelt.errors import SmeltError
from smelt.quantize.activation import activation_range


@dataclasses.dataclass
class TensorError:
    """One quantized tensor against its float counterpart, over the debug inputs."""

    name: str  # the float tensor that is quantized (its name in both models)
    max_abs: float
    mean_abs: float
    sqnr_db: float  # 10 log10(sum ref^2 / sum err^2); inf when equal
    saturated: int  # elements the integer kernel clamped, counted inside it
    elements: int
    ref_max: float = 0.0  # max |float value|: the scale a relative error is taken against
    # the noise this tensor's own quantization adds: its noise-to-signal power less the largest of
    # the quantized tensors it is computed from, as dB below the signal (inf: adds none). SQNR
    # alone blames every tensor downstream of a bad one; this points at the one that creates it
    added_db: float = float("inf")


@dataclasses.dataclass
class DebugReport:
    """Per quantized tensor, worst SQNR first (``tensors``), and the model outputs' errors."""

    tensors: list[TensorError]
    outputs: list[TensorError]
    samples: int

    def most_harmful(self) -> list[TensorError]:
        """The tensors by the noise they add themselves, most first (then by saturation)."""
        return sorted(self.tensors, key=lambda t: (t.added_db, -t.saturated))

    def format_text(self, top: int | None = None) -> str:
        rows = [("tensor", "SQNR dB", "adds dB", "max abs", "mean abs", "saturated", "of")]
        for t in (self.tensors[:top] if top else self.tensors):
            rows.append((t.name, f"{t.sqnr_db:.1f}", f"{t.added_db:.1f}", f"{t.max_abs:.3g}", f"{t.mean_abs:.3g}",
                         str(t.saturated), str(t.elements)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [f"numeric debug over {self.samples} input(s): quantized tensors, worst SQNR first (adds dB: "
                 "the noise its own quantization adds, below the signal; saturated: elements the integer kernel "
                 "clamped, counted inside it)"]
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


def _clip_source(model: onnx.ModelProto) -> dict[str, tuple[str, str]]:
    """Per Clip output read by a QuantizeLinear alone (the static writer's own-width saturation of
    a 9..15-bit activation): (the Clip's input, the Clip's name)."""
    readers: dict[str, int] = {}
    for n in model.graph.node:
        for i in n.input:
            readers[i] = readers.get(i, 0) + 1
    q_inputs = {n.input[0] for n in model.graph.node if n.op_type == "QuantizeLinear"}
    # (by its bounds' names: a model's own Clip before a Q, Relu6 folded into the op before it
    # by ``static.output_tensor``, is part of the float graph)
    return {n.output[0]: (n.input[0], n.name) for n in model.graph.node
            if n.op_type == "Clip" and n.output[0] in q_inputs and readers.get(n.output[0]) == 1
            and len(n.input) > 2 and n.input[1] == f"{n.input[0]}_clip_min"}


def _activation_clamps(model: onnx.ModelProto) -> dict[str, tuple[bool, bool]]:
    """Per output of a Relu or Clip (of the model, not the writer's own-width Clip) that a
    QuantizeLinear reads: whether the integer kernel's clamps at the low and at the high end of
    the codes are all the activation's own. The kernel counts a value v as clamped high where
    round(v / s) + z passes the type's top: with the Clip's max below (top - z + 1/2) * s every
    such v is above the max, so the Clip cut it anyway; a Relu's low clamps are all its own."""
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    quantizer = {n.input[0]: n for n in model.graph.node if n.op_type == "QuantizeLinear"}
    writers = {v[1] for v in _clip_source(model).values()}
    out: dict[str, tuple[bool, bool]] = {}
    for n in model.graph.node:
        q = quantizer.get(n.output[0]) if n.op_type in ("Relu", "Clip") and n.name not in writers else None
        if q is None or q.input[1] not in inits:
            continue
        scale = float(inits[q.input[1]].reshape(-1)[0])
        zp = inits.get(q.input[2]) if len(q.input) > 2 and q.input[2] else None
        info = np.iinfo(zp.dtype if zp is not None else np.uint8)
        z = int(zp.reshape(-1)[0]) if zp is not None else 0
        bounds = activation_range(model, n)
        if bounds is None:  # bounds computed at run time: every clamp counts
            continue
        lo, hi = bounds
        out[n.output[0]] = (n.op_type == "Relu" or lo > (info.min - z - 0.5) * scale,
                            hi < (info.max - z + 0.5) * scale)
    return out


def strip_activation_qdq(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with each activation's QuantizeLinear -> DequantizeLinear pair removed (its
    readers read the float tensor again); weights stay dequantized. The float reference of a QDQ
    model when the original fp32 model is not at hand: what differs is then exactly the
    activation quantization and the integer arithmetic."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inits = {i.name for i in out.graph.initializer}
    clipped = _clip_source(out)
    q_in = {n.output[0]: clipped.get(n.input[0], (n.input[0], ""))[0] for n in out.graph.node
            if n.op_type == "QuantizeLinear" and n.input[0] not in inits}
    dq_to_float = {n.output[0]: q_in[n.input[0]] for n in out.graph.node
                   if n.op_type == "DequantizeLinear" and n.input[0] in q_in}
    clip_names = {name for _, name in clipped.values()}
    kept = [n for n in out.graph.node
            if not (n.op_type == "QuantizeLinear" and n.output[0] in q_in)
            and not (n.op_type == "DequantizeLinear" and n.output[0] in dq_to_float)
            and not (n.op_type == "Clip" and n.name in clip_names and n.output[0] in clipped)]
    for n in kept:
        n.input[:] = [dq_to_float.get(i, i) for i in n.input]
    for o in out.graph.output:
        o.name = dq_to_float.get(o.name, o.name)
    del out.graph.node[:]
    out.graph.node.extend(kept)
    return out


def qdq_pairs(model: onnx.ModelProto) -> list[tuple[str, str, str]]:
    """(float tensor, quantized tensor, dequantized tensor) of every activation Q -> DQ pair (the
    float tensor before a Clip that only feeds the Q: the writer's own-width saturation)."""
    inits = {i.name for i in model.graph.initializer}
    dq_of = {n.input[0]: n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    clipped = _clip_source(model)
    return [(clipped.get(n.input[0], (n.input[0], ""))[0], n.output[0], dq_of[n.output[0]])
            for n in model.graph.node
            if n.op_type == "QuantizeLinear" and n.input[0] not in inits and n.output[0] in dq_of]


def dynamic_outputs(model: onnx.ModelProto) -> list[str]:
    """The float outputs of dynamically quantized ops: DynamicQuantizeLSTM's, and the end of each
    ``MatMulInteger -> Cast -> Mul [-> Add]`` chain (the float MatMul/Gemm's output name)."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    found = []
    for n in model.graph.node:
        if n.op_type == "DynamicQuantizeLSTM":
            found += [o for o in n.output if o]
        elif n.op_type == "MatMulInteger":
            y = n.output[0]
            for op in ("Cast", "Mul", "Add"):
                nxt = readers.get(y, [])
                if len(nxt) != 1 or nxt[0].op_type != op:
                    break
                y = nxt[0].output[0]
            if y != n.output[0]:
                found.append(y)
    return found


def debug_probes(quantized: onnx.ModelProto, float_model: onnx.ModelProto | None
                 ) -> tuple[onnx.ModelProto, onnx.ModelProto, list[tuple[str, str | None, str]]]:
    """The quantized and float models with the compared tensors added as outputs, and the
    compared tensors as (float name, the kernel output its saturation is counted on, the name in
    the quantized model)."""
    compared: list[tuple[str, str | None, str]] = [(f, q, dq) for f, q, dq in qdq_pairs(quantized)]
    compared += [(y, None, y) for y in dynamic_outputs(quantized)]
    if not compared:
        raise SmeltError("the model has no quantized tensors to debug (no activation QuantizeLinear -> "
                         "DequantizeLinear pairs, no dynamically quantized ops)")
    if float_model is None:
        if not qdq_pairs(quantized):
            raise SmeltError("numeric debug of a dynamically quantized model needs the float model beside it")
        float_model = strip_activation_qdq(quantized)
    q_probe, f_probe = onnx.ModelProto(), onnx.ModelProto()
    q_probe.CopyFrom(quantized)
    f_probe.CopyFrom(float_model)
    have_q = {o.name for o in q_probe.graph.output}
    have_f = {o.name for o in f_probe.graph.output}
    f_values = {o for n in f_probe.graph.node for o in n.output} | {i.name for i in f_probe.graph.input}
    compared = [c for c in compared if c[0] in f_values]
    for f, _, q in compared:
        if q not in have_q:
            q_probe.graph.output.append(helper.make_empty_tensor_value_info(q))
            have_q.add(q)
        if f not in have_f:
            f_probe.graph.output.append(helper.make_empty_tensor_value_info(f))
            have_f.add(f)
    return q_probe, f_probe, compared


def upstream(model: onnx.ModelProto, compared: list[tuple[str, str | None, str]]) -> dict[str, set[str]]:
    """Per compared tensor (float name), the compared tensors it is computed from nearest
    upstream in the quantized ``model`` (through any ops, Q/DQ pairs included)."""
    producer = {o: n for n in model.graph.node for o in n.output if o}
    # a name in the quantized model -> the compared tensor (float name) it carries
    carries = {q: f for f, _, q in compared} | {f: f for f, _, _ in compared}
    memo: dict[str, set[str]] = {}

    def sources(name: str, start: bool) -> set[str]:
        if not start and name in carries:
            return {carries[name]}
        if name in memo:
            return memo[name]
        memo[name] = set()  # cycles cannot occur in a valid graph; this guards the recursion
        node = producer.get(name)
        found: set[str] = set()
        if node is not None:
            for i in node.input:
                if i:
                    found |= sources(i, False)
        memo[name] = found
        return found

    return {f: sources(f, True) - {f} for f, _, _ in compared}


class NumericDebugModel:
    """A quantized model compiled beside its float counterpart: ``run`` returns the quantized
    model's outputs (as its own compiled model would) and accumulates the per-tensor errors;
    ``report()`` gives the table, worst first. Other attributes are the quantized compiled
    model's (``fallback_nodes``, ``saturation_counts()``, ...)."""

    def __init__(self, quantized: onnx.ModelProto, float_model: onnx.ModelProto | None,
                 make: Callable[[onnx.ModelProto], Any]) -> None:
        q_probe, f_probe, self._compared = debug_probes(quantized, float_model)
        self._outputs = [o.name for o in quantized.graph.output]
        self._q_names = [o.name for o in q_probe.graph.output]
        self._f_names = [o.name for o in f_probe.graph.output]
        folded = _activation_clamps(quantized)
        # per quantized tensor after a folded Relu or Clip: (its low-end, its high-end clamps are
        # the activation's own clamping, not a loss)
        self._own_clamps = {q: folded[f] for f, q, _ in self._compared if q and f in folded}
        self._inputs = [i.name for i in quantized.graph.input
                        if i.name not in {t.name for t in quantized.graph.initializer}]
        self._upstream = upstream(quantized, self._compared)
        self.quantized = make(q_probe)
        self.reference = make(f_probe)
        self._acc: dict[str, list[float]] = {}  # name -> [sum ref^2, sum err^2, max abs, sum abs, count, max |ref|]
        self._samples = 0
        self._fresh = True

    def run(self, feeds: Mapping[str, Any]) -> list[np.ndarray]:
        if self._fresh:  # the variant now exists: count its saturations from zero
            self.quantized.run_graph(feeds)
            self.quantized.reset_saturation_counts()
            self._fresh = False
        got = dict(zip(self._q_names, self.quantized.run_graph(feeds), strict=True))
        ref = dict(zip(self._f_names, self.reference.run_graph(feeds), strict=True))
        items = [(f, got[q], ref[f]) for f, _, q in self._compared]
        items += [(o, got[o], ref[o]) for o in self._outputs if o in ref]
        for name, g_val, r_val in items:
            g64, r64 = np.asarray(g_val, np.float64), np.asarray(r_val, np.float64)
            err = np.abs(g64 - r64)
            a = self._acc.setdefault(name, [0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
            a[0] += float(np.sum(r64 * r64))
            a[1] += float(np.sum(err * err))
            a[2] = max(a[2], float(err.max()) if err.size else 0.0)
            a[3] += float(err.sum())
            a[4] += err.size
            a[5] = max(a[5], float(np.abs(r64).max()) if r64.size else 0.0)
        self._samples += 1
        return [got[o] for o in self._outputs]

    def __call__(self, *args: Any, **kwargs: Any) -> np.ndarray | list[np.ndarray]:
        feeds = dict(zip(self._inputs, args, strict=False)) | kwargs
        outs = self.run(feeds)
        return outs[0] if len(outs) == 1 else outs

    def report(self) -> DebugReport:
        """The per-tensor table over every input run so far, worst SQNR first."""
        if self._samples == 0:
            raise SmeltError("numeric debug needs at least one run")
        counts = self.quantized.saturation_counts()
        # counters are keyed by the value the kernel wrote: the Q's output, or (a Relu or Clip
        # folded in) a fresh "<q output>__k" the Max then reads; below a folded Relu or Clip the
        # clamps that are the activation itself are not a loss (``_activation_clamps``)
        q_outs = {q for _, q, _ in self._compared if q}
        saturated: dict[str, int] = {}
        for key, (low, high) in counts.items():
            head, _, tail = key.rpartition("__")
            base = head if head and tail.isdigit() and head in q_outs else key
            own_low, own_high = self._own_clamps.get(base, (False, False))
            saturated[base] = saturated.get(base, 0) + (0 if own_high else high) + (0 if own_low else low)

        def entry(name: str, q_out: str | None) -> TensorError:
            s_ref, s_err, mx, s_abs, count, peak = self._acc[name]
            sqnr = float("inf") if s_err == 0 else 10 * np.log10(max(s_ref, 1e-300) / s_err)
            return TensorError(name, mx, s_abs / max(count, 1), float(sqnr),
                               saturated.get(q_out, 0) if q_out else 0, int(count), peak)

        tensors = [entry(f, q) for f, q, _ in self._compared]
        nsr = {t.name: 10 ** (-t.sqnr_db / 10) for t in tensors}
        for t in tensors:
            added = nsr[t.name] - max((nsr[u] for u in self._upstream[t.name] if u in nsr), default=0.0)
            t.added_db = float("inf") if added <= 0 else float(-10 * np.log10(added))
        tensors.sort(key=lambda t: (t.sqnr_db, -t.saturated))
        outputs = [entry(o, None) for o in self._outputs if o in self._acc]
        return DebugReport(tensors, outputs, self._samples)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["quantized"], name)

    def close(self) -> None:
        for c in (self.quantized, self.reference):
            c.close()
