"""Accuracy-driven mixed precision: keep the most harmful nodes in float until the output error
is within a bound (the loop of NNCF's accuracy control, with the numeric debug table as ranking).

Each round quantizes with the current float set (the calibrated ranges are reused: calibration
runs once), measures the model outputs against the float model on the calibration inputs (the
numeric debug run: the real integer kernels), and, while the bound is missed, moves the most
harmful still-quantized node to float. Harm is the noise a node *adds*: the noise-to-signal
power of its quantized output (10^(-SQNR/10)) less that of its quantized input, plus the noise
the input's own quantization adds (``TensorError.added_db``), from the same debug table. Ranking by the plain SQNR would always blame the last layers, which inherit every
earlier layer's error; the added noise points at the layer that creates it. A node whose output
is a model output (not quantized) is measured on that output.

Static models first rank their nodes by output sensitivity (``sensitivity.SwitchModel``: each
node alone quantized in one compiled float simulation) and move nodes in that order in the
simulation until the bound holds there (runs only, no compile); the integer kernels then confirm,
and while they miss the bound the next node in that order moves. Dynamic models rank by the
debug table each round.

The bound is ``min_sqnr_db`` (every model output's SQNR against fp32, in dB) or ``max_rel_error``
(every output's max |q - f| / max |f|).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import onnx

from smelt.quantize.numeric import DebugReport, TensorError


@dataclasses.dataclass(frozen=True)
class ErrorBound:
    """The output error allowed: an SQNR floor in dB, or a relative-error ceiling."""

    min_sqnr_db: float | None = None
    max_rel_error: float | None = None

    @staticmethod
    def parse(text: str | float) -> ErrorBound:
        """"30dB" -> SQNR >= 30 dB; "0.01" (or 0.01) -> max relative error 1%."""
        s = str(text).strip()
        if s.lower().endswith("db"):
            return ErrorBound(min_sqnr_db=float(s[:-2]))
        return ErrorBound(max_rel_error=float(s))

    def holds(self, outputs: list[TensorError]) -> bool:
        if self.min_sqnr_db is not None:
            return all(t.sqnr_db >= self.min_sqnr_db for t in outputs)
        assert self.max_rel_error is not None
        return all(t.max_abs <= self.max_rel_error * max(t.ref_max, 1e-30) for t in outputs)

    def describe(self, outputs: list[TensorError]) -> str:
        if self.min_sqnr_db is not None:
            return f"output SQNR {min(t.sqnr_db for t in outputs):.1f} dB (bound >= {self.min_sqnr_db} dB)"
        worst = max(t.max_abs / max(t.ref_max, 1e-30) for t in outputs)
        return f"output relative error {worst:.3g} (bound <= {self.max_rel_error})"


def added_noise(report: DebugReport, node_io: dict[str, tuple[str, str]]) -> dict[str, float]:
    """Per node (input tensor, output tensor): the noise-to-signal power its output adds over its
    input's, plus what its input's own quantization adds (the debug table's ``added_db``; a
    missing entry: a float tensor, no noise)."""
    nsr = {t.name: 10 ** (-t.sqnr_db / 10) if np.isfinite(t.sqnr_db) else 0.0
           for t in report.tensors + report.outputs}
    own = {t.name: 10 ** (-t.added_db / 10) if np.isfinite(t.added_db) else 0.0 for t in report.tensors}
    return {node: nsr.get(y, 0.0) - nsr.get(x, 0.0) + own.get(x, 0.0)
            for node, (x, y) in node_io.items() if y in nsr}


def keep_until_bound(quantize_with: Callable[[set[str]], tuple[onnx.ModelProto, dict[str, tuple[str, str]]]],
                     measure: Callable[[onnx.ModelProto], DebugReport], bound: ErrorBound, keep: set[str],
                     start: set[str] | None = None, order: list[str] | None = None
                     ) -> tuple[onnx.ModelProto, set[str], list[str]]:
    """The loop. ``quantize_with(float set)`` gives the model and, per quantized node, its
    (input, output) tensors; ``measure`` its debug table (the real integer kernels). ``start``:
    the nodes to begin with in float; ``order``: the nodes most harmful first (the sensitivity
    ranking), else each round ranks by ``added_noise`` of its own debug table. Returns the model,
    the nodes moved to float, and a line per round."""
    moved: set[str] = set(start or ())
    log: list[str] = []
    while True:
        model, io = quantize_with(keep | moved)
        if not io:  # the float model: no quantization error, the bound holds trivially
            log.append(f"holds only with every node in float ({len(moved)} moved): the model is not quantized")
            return model, moved, log
        report = measure(model)
        status = bound.describe(report.outputs)
        if bound.holds(report.outputs):
            log.append(f"{status} on the integer kernels: holds with {len(moved)} node(s) moved to float")
            return model, moved, log
        nxt = next((n for n in order if n in io and n not in moved), None) if order else None
        if nxt is not None:
            log.append(f"{status} on the integer kernels: {nxt} back to float (next by output sensitivity)")
        else:
            harm = added_noise(report, io)
            nxt = max(harm, key=lambda n: harm[n]) if harm else sorted(io)[0]
            log.append(f"{status}: {nxt} back to float (adds noise/signal {harm.get(nxt, 0.0):.3g})")
        moved.add(nxt)
