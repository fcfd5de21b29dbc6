"""`smelt profile`: where an inference spends its time, node by node, measured inside the native code.

``run_profile`` compiles two variants of the model: the ordinary build and an instrumented one
(``profile=True``) whose generated C takes a timestamp around every step (see the "Instrumented
build" section of ``runtime/csrc/smelt_rt.h``). It runs both, interleaved in blocks, and builds a
``ProfileReport``:

- per node: time per call (interquartile mean, see ``_report``), share of the total,
  FLOPs, GFLOPS and share of the machine's measured fp32 peak (Conv, Gemm, MatMul, RNN), the
  template and schedule that computed it, its layout and fused epilogue, and per-thread busy
  time (load imbalance);
- per op class, PyDTNN Table 1 style: count, time, share;
- totals: the sum of node times against the end-to-end latency of the uninstrumented build (what
  the model really costs) and of the instrumented one (their difference is the instrumentation's
  overhead), pool dispatch and Python glue outside the nodes, arena size, compile time.

A native step's time is measured on thread 0 from the end of the previous step's barrier to the
end of its own, so it includes waiting for the slowest thread, and the steps of a block add up
to the block's wall time. Nodes that fall back to onnx.reference are timed in Python.

The report prints as an aligned table (``format_table``), serialises to JSON (``to_dict``) and
renders as a self-contained HTML page (``write_html``) or a PNG chart (``write_chart``; both
charts need matplotlib, used with its Agg backend).
"""

from __future__ import annotations

import html
import io
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from smelt.bench.engines import step_executed_flops
from smelt.bench.output import fmt_opt, json_safe, pyplot, text_table
from smelt.errors import SmeltError
from smelt.runtime.artifact import ArtifactPlan, FallbackStepEntry, StepInfo

# Ops whose GFLOPS are worth comparing with the machine's peak (they are FMA-bound kernels).
PEAK_OPS = frozenset({"Conv", "Gemm", "MatMul", "LSTM", "GRU", "RNN"})

# Op class of each op, coarse for the cheap ops (PyDTNN's Table 1 groups layers the same way).
_CLASS_OF = {
    "Gemm": "Gemm/MatMul", "MatMul": "Gemm/MatMul",
    "LSTM": "RNN", "GRU": "RNN", "RNN": "RNN",
    "MaxPool": "Pooling", "AveragePool": "Pooling", "LpPool": "Pooling",
    "GlobalAveragePool": "Pooling", "GlobalMaxPool": "Pooling",
    "BatchNormalization": "Normalization", "LayerNormalization": "Normalization",
    "InstanceNormalization": "Normalization", "LRN": "Normalization",
    "Softmax": "Softmax/Reduce", "LogSoftmax": "Softmax/Reduce", "ArgMax": "Softmax/Reduce",
    "ArgMin": "Softmax/Reduce",
}

# Colours per op class (chart and HTML), in a stable order; unknown classes cycle through the rest.
_PALETTE = {
    "Conv": "#1f77b4", "Conv (depthwise)": "#17becf", "Gemm/MatMul": "#ff7f0e", "RNN": "#9467bd",
    "Pooling": "#2ca02c", "Normalization": "#bcbd22", "Elementwise": "#d62728",
    "Data movement": "#8c564b", "Softmax/Reduce": "#e377c2",
}
_EXTRA_COLOURS = ["#7f7f7f", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94"]


def op_class(op: str, schedule: Mapping[str, str] | None = None) -> str:
    """The op class a node is summarised under (depthwise convolutions apart: another kernel)."""
    from smelt.ir.ops import traits

    if op == "Conv":
        return "Conv (depthwise)" if (schedule or {}).get("algorithm", "").startswith("depthwise") else "Conv"
    if op in _CLASS_OF:
        return _CLASS_OF[op]
    if op.startswith("Reduce"):
        return "Softmax/Reduce"
    fusion = traits(op).fusion
    if fusion in ("elementwise", "broadcast"):
        return "Elementwise"
    if fusion == "injective":
        return "Data movement"
    return op


def describe_schedule(schedule: Mapping[str, str]) -> str:
    """One line from a template's schedule record (``BlockEmitter.schedule``), most telling first."""
    keys = ("algorithm", "micro_kernel", "gemm", "blocking", "threads", "shape", "epilogue_at")
    parts = [schedule[k] if k != "epilogue_at" else f"epilogue {schedule[k]}" for k in keys if schedule.get(k)]
    if not parts:
        parts = [schedule.get("template", "")]
    return "; ".join(p for p in parts if p)


@dataclass
class NodeProfile:
    """One node of the plan (a native node may have several steps, e.g. an RNN)."""

    index: int  # execution order
    name: str
    op: str
    op_class: str
    block: int | None  # native block, None when the node falls back to onnx.reference
    steps: int
    ms: float  # per call: mean over the typical calls (ProfileReport.typical_calls)
    median_ms: float  # per call: median over every timed call
    pct: float  # of the sum of node times
    flops: int
    gflops: float | None  # flops / ms; None when the op reports no FLOPs
    peak_share: float | None  # gflops / peak, for PEAK_OPS when a peak is known
    template: str
    schedule: str
    layout: str
    epilogue: list[str]
    busy_ms: list[float]  # per call, per pool thread (barrier wait excluded), typical calls
    imbalance: float | None  # slowest thread's busy time over the mean (1.0 = even)
    fallback: bool
    detail: dict[str, str] = field(default_factory=dict)  # the template's full schedule record


@dataclass
class OpClassSummary:
    op_class: str
    count: int
    ms: float
    pct: float
    flops: int
    gflops: float | None


@dataclass
class ProfileReport:
    model: str
    threads: int
    calls: int  # timed calls of each build
    # Times are interquartile means: over the calls whose end-to-end time lies between its first
    # and third quartile ("typical calls"; for nodes, the instrumented build's typical calls)
    typical_calls: int
    isa: str
    nodes: list[NodeProfile]
    classes: list[OpClassSummary]
    node_sum_ms: float  # sum of node times
    e2e_ms: float  # uninstrumented build
    e2e_profiled_ms: float  # instrumented build
    dispatch_ms: float  # native blocks' wall time outside their steps (pool dispatch), typical calls
    glue_ms: float  # instrumented e2e minus native blocks and fallback nodes (Python, ctypes), typical calls
    arena_bytes: int
    scratch_bytes: int
    weights_bytes: int
    compile_seconds: float  # the ordinary build's compile (recorded at its first compile)
    compile_cached: bool  # the ordinary build came from the cache this time
    profile_compile_seconds: float
    peak_gflops: float | None
    peak_note: str
    timer: str = "rdtsc, calibrated against CLOCK_MONOTONIC_RAW"
    cpu: str = ""  # model name (family/model where the name is terse)
    caches: str = ""  # "L1d 32 KiB, L2 1024 KiB, L3 32768 KiB"

    @property
    def ratio(self) -> float:
        """Sum of node times over the uninstrumented end-to-end latency (1.0 = all accounted)."""
        return self.node_sum_ms / self.e2e_ms if self.e2e_ms else float("nan")

    @property
    def ratio_profiled(self) -> float:
        """Sum of node times over the instrumented build's end-to-end latency."""
        return self.node_sum_ms / self.e2e_profiled_ms if self.e2e_profiled_ms else float("nan")

    @property
    def overhead(self) -> float:
        """Instrumentation overhead: instrumented over uninstrumented end-to-end, minus 1."""
        return self.e2e_profiled_ms / self.e2e_ms - 1.0 if self.e2e_ms else float("nan")

    # -- output ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable: every field, plus ``ratio`` and ``overhead``."""
        d = asdict(self)
        d["ratio"] = self.ratio
        d["ratio_profiled"] = self.ratio_profiled
        d["overhead"] = self.overhead
        return json_safe(d)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ProfileReport:
        """The inverse of ``to_dict`` (e.g. to re-render a saved report)."""
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        kw["nodes"] = [NodeProfile(**n) for n in d["nodes"]]
        kw["classes"] = [OpClassSummary(**c) for c in d["classes"]]
        return cls(**kw)

    def summary_lines(self) -> list[str]:
        cached = " (build taken from the cache)" if self.compile_cached else ""
        peak = (f"{self.peak_gflops:.0f} GFLOPS fp32 FMA peak at {self.threads} thread"
                f"{'s' if self.threads != 1 else ''} ({self.peak_note})"
                if self.peak_gflops else f"no peak figure ({self.peak_note})")
        return [
            f"smelt profile: {self.model}, {self.threads} thread{'s' if self.threads != 1 else ''}, "
            f"{self.isa}, {self.calls} timed calls per build (interquartile means)",
            f"  cpu                             {self.cpu or '-'}; {self.caches or '-'}",
            f"  end-to-end, ordinary build      {self.e2e_ms:10.3f} ms",
            f"  end-to-end, instrumented build  {self.e2e_profiled_ms:10.3f} ms  "
            f"(instrumentation overhead {self.overhead * 100:+.1f}%)",
            f"  sum of node times               {self.node_sum_ms:10.3f} ms  "
            f"({self.ratio * 100:.1f}% of the ordinary end-to-end, {self.ratio_profiled * 100:.1f}% of the "
            "instrumented)",
            f"  outside the nodes               pool dispatch {self.dispatch_ms:.3f} ms, "
            f"Python/ctypes {self.glue_ms:.3f} ms",
            f"  memory                          arena {_mib(self.arena_bytes)} + scratch "
            f"{_mib(self.scratch_bytes)}, weights {_mib(self.weights_bytes)}",
            f"  compile                         {self.compile_seconds:.1f} s{cached}; instrumented build "
            f"{self.profile_compile_seconds:.1f} s",
            f"  peak                            {peak}",
            f"  timer                           {self.timer}",
        ]

    def format_table(self, top: int | None = None) -> str:
        """Summary, op-class table and node table as aligned text. ``top``: only the ``top``
        slowest nodes, slowest first; None: every node in execution order."""
        out = self.summary_lines() + [""]
        out.append(text_table(
            ["op class", "count", "ms", "%", "GFLOPS"],
            [[c.op_class, str(c.count), f"{c.ms:.3f}", f"{c.pct:.1f}", fmt_opt(c.gflops, ".1f")]
             for c in self.classes],
            right={1, 2, 3, 4}))
        out.append("")
        nodes = self.nodes
        if top is not None:
            nodes = sorted(nodes, key=lambda n: -n.ms)[:top]
            out.append(f"top {len(nodes)} of {len(self.nodes)} nodes by time")
        rows = []
        for n in nodes:
            rows.append([str(n.index), _clip(n.name, 32), n.op, f"{n.ms:.3f}", f"{n.pct:.1f}",
                         fmt_opt(n.gflops, ".1f"), fmt_opt(n.peak_share, ".0%"),
                         fmt_opt(n.imbalance, ".2f"), "+".join(n.epilogue) or "-",
                         _clip(("FALLBACK " if n.fallback else "") + n.schedule, 90)])
        out.append(text_table(["#", "node", "op", "ms", "%", "GFLOPS", "peak", "imbal", "epilogue", "schedule"],
                              rows, right={0, 3, 4, 5, 6, 7}))
        return "\n".join(out)

    def write_chart(self, path: str | Path) -> Path:
        """A PNG: time per node in execution order (bars coloured by op class) and per op class."""
        fig = self._figure()
        path = Path(path)
        fig.savefig(path, dpi=110)
        _close(fig)
        return path

    def write_html(self, path: str | Path) -> Path:
        """A self-contained HTML page (no external scripts or styles): summary, op-class table,
        per-node table with inline bars, and the chart as inline SVG when matplotlib is present."""
        path = Path(path)
        path.write_text(self.html(), encoding="utf-8")
        return path

    def html(self) -> str:
        e = html.escape
        colours = _colours([c.op_class for c in self.classes])
        try:
            fig = self._figure()
            buf = io.StringIO()
            fig.savefig(buf, format="svg", metadata={"Date": None})  # same report, same page
            _close(fig)
            svg = buf.getvalue()
            chart = svg[svg.index("<svg"):]  # drop the XML prolog: inline in HTML
        except SmeltError as exc:
            chart = f"<p class='note'>{e(str(exc))}</p>"
        summary = "\n".join(e(line) for line in self.summary_lines())
        max_cls = max([c.ms for c in self.classes] + [1e-12])
        cls_rows = "\n".join(
            f"<tr><td><span class='sw' style='background:{colours[c.op_class]}'></span>{e(c.op_class)}</td>"
            f"<td class='r'>{c.count}</td><td class='r'>{c.ms:.3f}</td><td class='r'>{c.pct:.1f}</td>"
            f"<td class='r'>{fmt_opt(c.gflops, '.1f')}</td>"
            f"<td class='bar'><div style='width:{100 * c.ms / max_cls:.1f}%;background:{colours[c.op_class]}'>"
            "</div></td></tr>"
            for c in self.classes)
        max_node = max([n.ms for n in self.nodes] + [1e-12])
        node_rows = "\n".join(
            f"<tr{' class=fb' if n.fallback else ''}><td class='r'>{n.index}</td><td>{e(n.name)}</td>"
            f"<td>{e(n.op)}</td><td>{e(n.op_class)}</td><td class='r'>{n.ms:.3f}</td>"
            f"<td class='r'>{n.pct:.1f}</td>"
            f"<td class='bar'><div style='width:{100 * n.ms / max_node:.1f}%;background:{colours[n.op_class]}'>"
            f"</div></td><td class='r'>{fmt_opt(n.gflops, '.1f')}</td>"
            f"<td class='r'>{fmt_opt(n.peak_share, '.0%')}</td><td class='r'>{fmt_opt(n.imbalance, '.2f')}</td>"
            f"<td>{e('+'.join(n.epilogue))}</td><td>{e(n.layout)}</td>"
            f"<td class='sched'>{'<b>fallback</b> ' if n.fallback else ''}{e(n.schedule)}</td></tr>"
            for n in self.nodes)
        return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>smelt profile: {e(self.model)}</title>
<style>
body {{ font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; }}
pre {{ background: #f6f6f6; padding: 1em; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
th, td {{ padding: 2px 8px; border-bottom: 1px solid #e4e4e4; text-align: left; vertical-align: top; }}
th {{ background: #f0f0f0; position: sticky; top: 0; }}
td.r {{ text-align: right; font-variant-numeric: tabular-nums; }}
td.bar {{ width: 160px; }} td.bar div {{ height: 11px; min-width: 1px; }}
td.sched {{ font-size: 12px; color: #444; }}
tr.fb td {{ background: #fff3f0; }}
.sw {{ display: inline-block; width: 10px; height: 10px; margin-right: 6px; }}
.note {{ color: #a00; }}
svg {{ max-width: 100%; height: auto; }}
</style></head><body>
<h1>smelt profile: {e(self.model)}</h1>
<pre>{summary}</pre>
<h2>By op class</h2>
<table><tr><th>op class</th><th>count</th><th>ms</th><th>%</th><th>GFLOPS</th><th></th></tr>
{cls_rows}
</table>
<h2>Chart</h2>
{chart}
<h2>Per node (execution order)</h2>
<p>Times per call are interquartile means: over the {self.typical_calls} of {self.calls} calls whose
end-to-end time lies between its quartiles. Node times are measured inside the native code on thread 0
up to the end of the barrier after the node (so it includes waiting for the slowest thread);
imbalance is the slowest thread's busy time over the mean. Fallback nodes run in Python
(onnx.reference) and are timed there.</p>
<table><tr><th>#</th><th>node</th><th>op</th><th>class</th><th>ms</th><th>%</th><th></th><th>GFLOPS</th>
<th>of peak</th><th>imbal.</th><th>epilogue</th><th>layout</th><th>schedule</th></tr>
{node_rows}
</table>
</body></html>
"""

    def _figure(self):
        """Left: every node in execution order, coloured by op class, GFLOPS beside the heavy
        ones. Right: the op-class breakdown and the totals."""
        plt = pyplot()
        nodes, classes = self.nodes, self.classes
        colours = _colours([c.op_class for c in classes])
        height = max(5.0, 0.16 * len(nodes) + 1.6)
        fig = plt.figure(figsize=(15, height), layout="constrained")
        # the class panel gets a height in proportion to its bars; the totals go below it
        class_rows = max(3, len(classes)) * 0.45 + 1.2
        grid = fig.add_gridspec(2, 2, width_ratios=[3, 1.25],
                                height_ratios=[class_rows, max(height - class_rows, 1.0)])
        ax = fig.add_subplot(grid[:, 0])
        y = np.arange(len(nodes))
        ax.barh(y, [n.ms for n in nodes], color=[colours[n.op_class] for n in nodes], height=0.8)
        ax.set_yticks(y, [_clip(f"{n.name} ({n.op})", 40) for n in nodes], fontsize=7)
        ax.invert_yaxis()  # execution order, top to bottom
        ax.set_xlabel("ms per call")
        ax.set_title(f"{self.model}: time per node, {self.threads} thread{'s' if self.threads != 1 else ''}",
                     fontsize=10)
        ax.grid(axis="x", alpha=0.3)
        ax.margins(y=0.005)
        xmax = max([n.ms for n in nodes] + [1e-9])
        for yi, n in zip(y, nodes, strict=True):
            if n.gflops is not None and n.op in PEAK_OPS:
                label = f" {n.gflops:.0f} GF/s" + (f" ({n.peak_share:.0%})" if n.peak_share is not None else "")
                ax.text(n.ms + xmax * 0.005, yi, label, va="center", fontsize=6, color="#333")
        ax.set_xlim(0, xmax * 1.18)

        ax2 = fig.add_subplot(grid[0, 1])
        cy = np.arange(len(classes))
        ax2.barh(cy, [c.ms for c in classes], color=[colours[c.op_class] for c in classes], height=0.7)
        ax2.set_yticks(cy, [f"{c.op_class} ({c.count})" for c in classes], fontsize=8)
        ax2.set_ylim(max(2.5, len(classes) - 0.5), -0.5)  # top to bottom; a few bars stay thin
        ax2.set_xlabel("ms per call")
        ax2.set_title("by op class", fontsize=10)
        cmax = max([c.ms for c in classes] + [1e-9])
        for yi, c in zip(cy, classes, strict=True):
            ax2.text(c.ms + cmax * 0.01, yi, f" {c.pct:.1f}%", va="center", fontsize=8)
        ax2.set_xlim(0, cmax * 1.3)
        ax2.grid(axis="x", alpha=0.3)

        ax3 = fig.add_subplot(grid[1, 1])
        ax3.axis("off")
        totals = [
            ("end-to-end, ordinary build", f"{self.e2e_ms:.3f} ms"),
            ("end-to-end, instrumented", f"{self.e2e_profiled_ms:.3f} ms ({self.overhead * 100:+.1f}%)"),
            ("sum of node times", f"{self.node_sum_ms:.3f} ms ({self.ratio * 100:.1f}%)"),
            ("pool dispatch / Python", f"{self.dispatch_ms:.3f} / {self.glue_ms:.3f} ms"),
            ("arena + scratch", _mib(self.arena_bytes + self.scratch_bytes)),
            ("weights", _mib(self.weights_bytes)),
            ("compile", f"{self.compile_seconds:.1f} s"),
            ("fp32 peak", f"{self.peak_gflops:.0f} GFLOPS" if self.peak_gflops else "-"),
        ]
        ax3.text(0.0, 1.0, "\n".join(f"{k}: {v}" for k, v in totals), va="top", ha="left", fontsize=8.5,
                 family="monospace", transform=ax3.transAxes)
        return fig


# ------------------------------------------------------------------------------------------
# Measuring
# ------------------------------------------------------------------------------------------
def run_profile(model: Any, feeds: Mapping[str, np.ndarray] | None = None, *, threads: int | None = None,
                rounds: int = 50, warmup: int = 3, block: int = 5, settle: float = 0.05,
                peak: bool = True, progress: bool = False, name: str | None = None,
                force_fallback: Sequence[str] = (), isa: str | None = None) -> ProfileReport:
    """Profile ``model`` (a path, bytes or ModelProto) and return the report.

    ``feeds``: input arrays (default: ``harness.random_inputs``, seeded random arrays of the
    declared shapes, a symbolic leading dimension taken as 1). ``threads``: pool size (default: physical cores). ``rounds``: timed calls
    of each build. The instrumented and the ordinary build run in alternating blocks of ``block``
    calls, each block after ``settle`` seconds idle and one untimed call (a pool's workers spin
    for a while after a call and would take the other pool's cores); ``warmup`` untimed calls
    each first. ``peak``: look up (or measure, once per machine) the fp32 peak for the
    share-of-peak column. ``progress``: say what is happening on stderr. ``name``: the model's
    name in the report (default: its graph name). ``force_fallback``: node names to run through
    onnx.reference anyway (to see what a fallback would cost). ``isa``: compile for that ISA
    (``smelt.compile(isa=...)``; default $SMELT_ISA, else the host's); the share of peak is
    against that ISA's peak.
    """
    import smelt
    from smelt.frontend.onnx_import import load_model
    from smelt.progress import stage

    proto = load_model(model)
    model_name = name or proto.graph.name or "model"
    if feeds is None:
        from smelt.bench.harness import random_inputs

        feeds = random_inputs(proto, model_name=model_name)
    plain = smelt.compile(proto, threads=threads, force_fallback=force_fallback, progress=progress, isa=isa)
    plain.run(feeds)  # compiles now if the inputs are symbolic
    prof = smelt.compile(proto, threads=threads, force_fallback=force_fallback, profile=True, progress=progress,
                         isa=isa)
    prof.run(feeds)
    try:
        with stage(f"timing {rounds} calls of each build", progress):
            steps, e2e_plain, e2e_prof = _measure(plain, prof, feeds, rounds, warmup, block, settle)
        peak_gflops, peak_note = None, "not requested"
        if peak:
            from smelt.bench.peak import busy_note, peak_or_reason

            result, peak_note = peak_or_reason(progress=progress, isa=prof.target.isa)
            peak_gflops = result.peak_gflops(prof.threads) if result else None
            # the peak of the ISA the build runs, and whether it was measured on a busy machine
            peak_note = "; ".join(x for x in (f"{prof.target.isa} peak, {peak_note}",
                                              busy_note(result) if result else "") if x)
        compile_s = plain.compile_seconds if not plain.from_cache else plain.plan.compile_seconds
        prof_compile_s = prof.compile_seconds if not prof.from_cache else prof.plan.compile_seconds
        return _report(model_name, prof, steps, e2e_plain, e2e_prof, rounds, peak_gflops, peak_note,
                       prof.target, compile_s, plain.from_cache, prof_compile_s)
    finally:
        plain.close()
        prof.close()


@dataclass
class _Samples:
    """Per timed call of the instrumented build: its counter deltas and its wall time."""

    seconds: list[np.ndarray] = field(default_factory=list)  # [steps] per call
    busy: list[np.ndarray] = field(default_factory=list)  # [steps, threads] per call
    blocks: list[np.ndarray] = field(default_factory=list)  # [blocks] per call
    step_list: list = field(default_factory=list)


def _measure(plain, prof, feeds, rounds: int, warmup: int, block: int,
             settle: float) -> tuple[_Samples, list[float], list[float]]:
    for fn in (plain, prof):
        for _ in range(warmup):
            fn.run(feeds)
    prof.profile_reset()
    samples = _Samples()
    e2e_plain: list[float] = []
    e2e_prof: list[float] = []

    def timed(model, out: list[float], record: bool) -> None:
        if settle:
            time.sleep(settle)
        model.run(feeds)  # untimed: the pool's workers may have gone to sleep during settle
        prev = prof.profile_counters() if record else None
        for _ in range(min(block, rounds - len(out))):
            start = time.perf_counter()
            model.run(feeds)
            out.append((time.perf_counter() - start) * 1e3)
            if record:
                cur = prof.profile_counters()  # between calls, outside the timed region
                d = cur - prev
                samples.seconds.append(d.seconds)
                samples.busy.append(d.busy)
                samples.blocks.append(d.block_seconds)
                samples.step_list = cur.steps
                prev = cur

    while len(e2e_plain) < rounds or len(e2e_prof) < rounds:
        if len(e2e_prof) < rounds:
            timed(prof, e2e_prof, True)
        if len(e2e_plain) < rounds:
            timed(plain, e2e_plain, False)
    return samples, e2e_plain, e2e_prof


def _report(model_name: str, prof, samples: _Samples, e2e_plain: list[float], e2e_prof: list[float],
            calls: int, peak_gflops: float | None, peak_note: str, target, compile_s: float,
            compile_cached: bool, prof_compile_s: float) -> ProfileReport:
    meta: ArtifactPlan = prof.plan
    n_threads = prof.threads
    all_secs = np.array(samples.seconds)  # [calls, steps]
    # Node times are averaged over the typical calls: those whose end-to-end time lies within its
    # interquartile range. A mean adds up (node times sum to the calls' time, unlike per-node
    # medians: on a busy machine each call's stall hits some other node), and leaving out the
    # outer quartiles keeps a preempted call from inflating the node it happened to land in.
    e2e = np.array(e2e_prof)
    typical = _typical(e2e)
    secs = all_secs[typical]
    busy = np.array(samples.busy)[typical][:, :, :n_threads]  # [calls, steps, pool threads]
    blocks = np.array(samples.blocks)[typical]  # [calls, blocks]
    steps = samples.step_list
    # step metadata in the same execution order as the counters
    info: list[StepInfo] = []
    fallbacks: set[int] = set()  # indices into info
    for st in meta.steps:
        if isinstance(st, FallbackStepEntry):
            fallbacks.add(len(info))
            info.append(StepInfo(st.node, st.op, 0, 1, st.flops, st.epilogue,
                                 {"template": "onnx.reference", "algorithm": f"fallback: {st.reason}"}))
        else:
            info += st.step_info
    assert len(info) == len(steps), (len(info), len(steps))
    # consecutive steps of one node form one row
    groups: list[list[int]] = []
    for i, st in enumerate(steps):
        if groups and info[i].part > 0 and steps[groups[-1][0]].block == st.block:
            groups[-1].append(i)
        else:
            groups.append([i])
    nodes: list[NodeProfile] = []
    for idx, g in enumerate(groups):
        first = info[g[0]]
        ms = float(secs[:, g].sum(axis=1).mean()) * 1e3
        median_ms = float(np.median(all_secs[:, g].sum(axis=1))) * 1e3
        node_busy = busy[:, g, :].sum(axis=1).mean(axis=0) * 1e3  # [threads]
        sched = first.schedule
        fl = first.flops
        gflops = fl / (ms * 1e6) if fl and ms > 0 else None
        fallback = g[0] in fallbacks
        # against the peak: what the kernel executed (a Winograd step multiplies 16/36 of its nominal FLOPs)
        executed = step_executed_flops(fl, sched) / (ms * 1e6) if fl and ms > 0 else None
        share = executed / peak_gflops if executed is not None and peak_gflops and first.op in PEAK_OPS else None
        imbalance = (float(node_busy.max() / node_busy.mean())
                     if not fallback and n_threads > 1 and node_busy.mean() > 0 else None)
        nodes.append(NodeProfile(
            index=idx, name=first.node, op=first.op, op_class=op_class(first.op, sched),
            block=steps[g[0]].block, steps=len(g), ms=ms, median_ms=median_ms, pct=0.0, flops=fl, gflops=gflops,
            peak_share=share, template=sched.get("template", ""), schedule=describe_schedule(sched),
            layout=sched.get("layout", ""), epilogue=list(first.epilogue),
            busy_ms=[float(b) for b in node_busy], imbalance=imbalance, fallback=fallback, detail=dict(sched)))
    node_sum = sum(n.ms for n in nodes)
    for n in nodes:
        n.pct = 100.0 * n.ms / node_sum if node_sum else 0.0
    classes: dict[str, OpClassSummary] = {}
    for n in nodes:
        c = classes.setdefault(n.op_class, OpClassSummary(n.op_class, 0, 0.0, 0.0, 0, None))
        c.count += 1
        c.ms += n.ms
        c.flops += n.flops
    for c in classes.values():
        c.pct = 100.0 * c.ms / node_sum if node_sum else 0.0
        c.gflops = c.flops / (c.ms * 1e6) if c.flops and c.ms > 0 else None
    native_steps = [i for i, st in enumerate(steps) if st.block is not None]
    fb_steps = [i for i, st in enumerate(steps) if st.block is None]
    block_total = blocks.sum(axis=1) if blocks.size else np.zeros(len(secs))
    dispatch = block_total - secs[:, native_steps].sum(axis=1)
    glue = e2e[typical] * 1e-3 - block_total - secs[:, fb_steps].sum(axis=1)
    return ProfileReport(
        model=model_name, threads=n_threads, calls=calls, typical_calls=int(typical.sum()), isa=target.isa,
        cpu=target.cpu, caches=(f"L1d {target.l1d_bytes // 1024} KiB, L2 {target.l2_bytes // 1024} KiB, "
                                f"L3 {target.l3_bytes // 1024} KiB"),
        nodes=nodes,
        classes=sorted(classes.values(), key=lambda c: -c.ms), node_sum_ms=node_sum,
        e2e_ms=float(np.array(e2e_plain)[_typical(np.array(e2e_plain))].mean()),
        e2e_profiled_ms=float(e2e[typical].mean()),
        dispatch_ms=float(dispatch.mean()) * 1e3, glue_ms=float(glue.mean()) * 1e3,
        arena_bytes=meta.arena_bytes, scratch_bytes=meta.scratch_bytes,
        weights_bytes=meta.weights_bytes, compile_seconds=compile_s, compile_cached=compile_cached,
        profile_compile_seconds=prof_compile_s, peak_gflops=peak_gflops, peak_note=peak_note,
        timer=("rdtsc, calibrated against CLOCK_MONOTONIC_RAW" if target.arch in ("x86_64", "i686")
               else "CLOCK_MONOTONIC_RAW"))


# ------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------
def _typical(samples: np.ndarray) -> np.ndarray:
    """Mask of the samples between the first and third quartile, by rank: the slowest and the
    fastest quarter left out (never empty)."""
    n = len(samples)
    mask = np.zeros(n, dtype=bool)
    mask[np.argsort(samples, kind="stable")[n // 4 : n - n // 4]] = True
    return mask


def _close(fig) -> None:
    import matplotlib.pyplot as plt

    plt.close(fig)


def _colours(classes: list[str]) -> dict[str, str]:
    out, extra = {}, iter(_EXTRA_COLOURS * 4)
    for c in classes:
        out[c] = _PALETTE.get(c) or next(extra, "#7f7f7f")
    return out


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"
