"""The `smelt bench` report: its JSON schema, text/markdown tables and speedup charts.

The JSON is the contract other tools (CI dashboards, the docs) read, so its shape is pinned by
:data:`REPORT_SCHEMA` (JSON Schema draft 2020-12) and checked by the tests.
"""

from __future__ import annotations

import json
from pathlib import Path

from smelt.bench.output import fmt_opt, json_safe, pyplot, text_table

_NUM = {"type": ["number", "null"]}

ENGINE_SCHEMA = {
    "type": "object",
    "required": ["status", "median_ms", "spread_ms", "rel_error", "smelt_speedup", "gflops", "peak_share"],
    "properties": {
        "status": {"enum": ["ok", "mismatch", "skipped", "error"]},
        "reason": {"type": "string"},
        "version": {"type": "string"},
        "median_ms": _NUM,
        "spread_ms": {**_NUM, "description": "interquartile range of the per-call times"},
        "min_ms": _NUM,
        "p90_ms": _NUM,
        "samples": {"type": "integer"},
        "items_per_s": _NUM,
        "rel_error": {**_NUM, "description": "max|engine - smelt| / max|smelt|, worst output"},
        "smelt_speedup": {**_NUM, "description": "this engine's median / smelt's median (>1: smelt faster)"},
        "gflops": _NUM,
        "executed_gflops": {**_NUM, "description": "FLOPs the kernels executed (smelt: Winograd steps count "
                            "their fewer multiplies; peers: nominal) / median"},
        "peak_share": {**_NUM, "description": "executed_gflops / the measured fp32 peak, at these threads, of "
                       "the ISA this engine ran (isa)"},
        "isa": {"type": ["string", "null"], "description": "the ISA the engine ran (peak looked up by it)"},
        "details": {"type": "object", "properties": {
            "fallbacks": {"type": "array", "description": "smelt: the nodes onnx.reference runs, with why",
                          "items": {"type": "object", "required": ["node", "op", "reason"]}},
            "native_nodes": {"type": "integer"}}},
        "throughput": {"type": "object"},
    },
    "allOf": [
        {"if": {"properties": {"status": {"const": "ok"}}},
         "then": {"properties": {"median_ms": {"type": "number"}, "spread_ms": {"type": "number"}}}},
        {"if": {"properties": {"status": {"enum": ["skipped", "error", "mismatch"]}}},
         "then": {"required": ["reason"], "properties": {"median_ms": {"type": "null"}}}},
    ],
}

THROUGHPUT_SCHEMA = {
    "type": "object",
    "required": ["instances", "threads_per_instance", "items_per_s", "latency_median_ms", "latency_max_ms"],
    "properties": {
        "instances": {"type": "integer", "minimum": 1},
        "threads_per_instance": {"type": "integer", "minimum": 1},
        "cpus": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
        "items_per_s": {"type": "number"},
        "latency_median_ms": {"type": "number"},
        "latency_p99_ms": {"type": "number"},
        "latency_max_ms": {"type": "number"},
        "calls": {"type": "integer"},
    },
}

REPORT_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "smelt bench report",
    "type": "object",
    "required": ["schema_version", "tool", "date", "command", "machine", "settings", "models", "summary"],
    "properties": {
        "schema_version": {"const": 1},
        "tool": {"const": "smelt bench"},
        "date": {"type": "string"},
        "command": {"type": "string"},
        "machine": {
            "type": "object",
            "required": ["cpu", "isa", "smelt_isa", "caches", "cores", "peak_gflops"],
            "properties": {"cpu": {"type": "string", "description": "model name (family/model when terse)"},
                           "isa": {"type": "string", "description": "the host's widest ISA"},
                           "smelt_isa": {"type": "string", "description": "the ISA smelt compiled for"},
                           "caches": {"type": "object", "required": ["l1d_kib", "l2_kib", "l3_kib"]},
                           "cores": {"type": "integer"}, "peak_gflops": _NUM,
                           "peaks": {"type": "object", "additionalProperties": _NUM},
                           "peak": {"type": ["object", "null"]}},
        },
        "settings": {
            "type": "object",
            "required": ["threads", "rounds", "warmup", "block", "tolerance", "peers"],
        },
        "models": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["model", "batch", "inputs", "flops", "threads", "engines", "best_peer",
                             "speedup_vs_best_peer"],
                "properties": {
                    "model": {"type": "string"},
                    "batch": {"type": "integer"},
                    "flops": {"type": "integer"},
                    "engines": {"type": "object", "required": ["smelt"],
                                "additionalProperties": ENGINE_SCHEMA},
                    "best_peer": {"type": ["string", "null"]},
                    "speedup_vs_best_peer": _NUM,
                    "throughput": {"type": "object", "additionalProperties": {"anyOf": [
                        THROUGHPUT_SCHEMA,
                        {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
                    ]}},
                },
            },
        },
        "summary": {
            "type": "object",
            "required": ["models", "geomean_speedup", "geomean_speedup_vs_best_peer"],
            "properties": {"geomean_speedup": {"type": "object", "additionalProperties": _NUM},
                           "geomean_speedup_vs_best_peer": _NUM,
                           "isa_share_ratio": {"type": "object", "additionalProperties": {
                               "type": "object", "required": ["isa", "geomean", "min", "models"]}}},
        },
    },
}


def validate(report: dict) -> None:
    """Raise ``jsonschema.ValidationError`` if ``report`` breaks the schema (needs jsonschema)."""
    import jsonschema

    jsonschema.validate(report, REPORT_SCHEMA)


def write_json(report: dict, path: str | Path) -> None:
    Path(path).write_text(json.dumps(json_safe(report), indent=2) + "\n")


# ----------------------------------------------------------------------------- tables
def _threads(n: int) -> str:
    return f"{n} thread" + ("" if n == 1 else "s")


def _x(speedup: float | None) -> str:
    return fmt_opt(speedup, ".2f") + ("x" if speedup is not None else "")


def _pct(share: float | None) -> str:
    return fmt_opt(share, ".0%")


def engine_isas(report: dict) -> dict[str, tuple[str, str]]:
    """(ISA, how it was established) of each engine that ran, from its runner's details."""
    found: dict[str, tuple[str, str]] = {}
    for m in report["models"]:
        for name, e in m["engines"].items():
            d = e.get("details") or {}
            if d.get("isa") and name not in found:
                found[name] = (d["isa"], d.get("isa_note", ""))
    return found


def format_machine(report: dict) -> str:
    """The lines every bench report starts with: CPU model, caches, the ISA each engine ran and
    the peaks its shares are taken against."""
    m = report["machine"]
    caches = m.get("caches") or {}
    lines = [f"cpu: {m['cpu']}, {m['cores']} cores; L1d {caches.get('l1d_kib', '?')} KiB, "
             f"L2 {caches.get('l2_kib', '?')} KiB, L3 {caches.get('l3_kib', '?')} KiB"]
    isas = engine_isas(report)
    cap = (report.get("settings") or {}).get("isa")
    ran = "; ".join(f"{name} {isa}" + (f" ({note})" if note else "") for name, (isa, note) in isas.items())
    lines.append(f"isa: host {m['isa']}" + (f", capped to {cap}" if cap else "") + (f"; ran: {ran}" if ran else ""))
    peaks = m.get("peaks") or {}
    if peaks:
        n = (report.get("settings") or {}).get("threads")
        lines.append(f"fp32 FMA peak{f' at {_threads(n)}' if n else ''}: "
                     + ", ".join(f"{isa} {g:.1f} GFLOPS" for isa, g in peaks.items())
                     + "; % peak = executed FLOPs (smelt's Winograd counted as it runs) / the peak of the engine's ISA")
    lines += [f"note: {isa} peak {note}" for isa, note in (m.get("peak_notes") or {}).items()]
    over = sorted({n for mod in report["models"] for n, e in mod["engines"].items() if (e.get("peak_share") or 0) > 1})
    if over:
        lines.append(f"note: {', '.join(over)} above 100% of peak: the stored peak is understated (measured while "
                     "the machine was busy?); measure it again with `smelt info --peak [--isa ISA]`")
    return "\n".join(lines)


def smelt_native(entry: dict) -> str:
    """How much of the model smelt ran natively: "native" (every node), "K fallback" or "-" (not
    compiled, or a report from before the fallbacks were recorded)."""
    details = (entry["engines"].get("smelt") or {}).get("details") or {}
    if "fallbacks" not in details:
        return "-"
    return f"{len(details['fallbacks'])} fallback" if details["fallbacks"] else "native"


def format_fallbacks(entry: dict) -> list[str]:
    """One line per node smelt leaves to the onnx.reference fallback, with its reason, or one line
    saying the model ran fully native."""
    details = (entry["engines"].get("smelt") or {}).get("details") or {}
    if "fallbacks" not in details:
        return []
    fallbacks = details["fallbacks"]
    native = details.get("native_nodes")
    if not fallbacks:
        return [f"smelt: fully native{f' ({native} nodes)' if native is not None else ''}"]
    total = f" of {native + len(fallbacks)}" if native is not None else ""
    lines = [f"smelt: {len(fallbacks)}{total} nodes on the onnx.reference fallback:"]
    # nodes of one op falling back for one reason share a line (a QDQ model has ~80 of each)
    groups: dict[tuple[str, str], list[str]] = {}
    for f in fallbacks:
        groups.setdefault((f["op"], f["reason"]), []).append(f["node"])
    for (op, reason), nodes in groups.items():
        if len(nodes) == 1:
            lines.append(f"  fallback {op} {nodes[0]}: {reason}")
        else:
            lines.append(f"  fallback {op} x{len(nodes)}: {reason}: {', '.join(nodes)}")
    return lines


def format_model(entry: dict, markdown: bool = False) -> str:
    """One model: a row per engine with its ISA, median, spread, error, speedup, GFLOPS, share of peak."""
    head = (f"{entry['model']}: batch {entry['batch']}, {_threads(entry['threads'])}, "
            f"{entry['rounds']} rounds x {entry['block']} calls, {entry['flops'] / 1e9:.2f} GFLOP per call")
    rows = []
    for name, e in entry["engines"].items():
        isa = (e.get("details") or {}).get("isa") or "-"
        if e["status"] != "ok":
            err = f"{e['rel_error']:.1e}" if e.get("rel_error") is not None else "-"
            rows.append([name, e.get("version", "-"), isa, e["status"].upper(), "-", err, "-", "-", "-"])
            continue
        rows.append([name, e.get("version", "-"), isa, f"{e['median_ms']:.3f}", f"{e['spread_ms']:.3f}",
                     "0" if name == "smelt" else f"{e['rel_error']:.1e}",
                     _x(e["smelt_speedup"]), fmt_opt(e["gflops"], ".1f"), _pct(e["peak_share"])])
    table = text_table(["engine", "version", "ISA", "median ms", "IQR ms", "rel.err", "smelt speedup", "GFLOPS",
                        "% peak"], rows, right=set(range(3, 9)), markdown=markdown)
    notes = [f"  {n}: {e['reason']}" for n, e in entry["engines"].items() if e["status"] != "ok"]
    tail = (f"best peer: {entry['best_peer']}; smelt speedup over it {entry['speedup_vs_best_peer']:.2f}x"
            if entry["best_peer"] else "no peer timed")
    parts = [head, table, *notes, tail, *format_fallbacks(entry)]
    for engine, tp in (entry.get("throughput") or {}).items():
        if "error" in tp:
            parts.append(f"throughput {engine}: failed: {tp['error']}")
            continue
        parts.append(f"throughput {engine}: {tp['instances']} instances x {_threads(tp['threads_per_instance'])}: "
                     f"{tp['items_per_s']:.1f} items/s, latency median {tp['latency_median_ms']:.3f} ms, "
                     f"worst {tp['latency_max_ms']:.3f} ms")
    return "\n".join(parts)


def format_suite(report: dict, markdown: bool = False) -> str:
    """Many models: one row each, smelt's median, each peer's median and smelt's speedup over it."""
    peers = list(report["settings"]["peers"])
    header = ["model", "native", "smelt ms", *(f"{p} ms" for p in peers), *(f"vs {p}" for p in peers), "vs best",
              "smelt GFLOPS", "% peak"]
    rows = []
    for m in report["models"]:
        s = m["engines"]["smelt"]
        engines = [m["engines"].get(p, {}) for p in peers]
        rows.append([m["model"], smelt_native(m), fmt_opt(s["median_ms"], ".3f"),
                     *(fmt_opt(e.get("median_ms"), ".3f", e.get("status", "-")) for e in engines),
                     *(_x(e.get("smelt_speedup")) for e in engines),
                     _x(m["speedup_vs_best_peer"]), fmt_opt(s["gflops"], ".1f"), _pct(s["peak_share"])])
    summ = report["summary"]
    rows.append(["geomean", "", "", *["" for _ in peers], *(_x(summ["geomean_speedup"].get(p)) for p in peers),
                 _x(summ["geomean_speedup_vs_best_peer"]), "", ""])
    table = text_table(header, rows, right=set(range(2, len(header))), markdown=markdown)
    # every node a model leaves to the fallback, named with its reason; and why a model failed
    notes = []
    for m in report["models"]:
        s = m["engines"]["smelt"]
        if s["status"] != "ok":
            notes.append(f"{m['model']}: smelt {s['status']}: {s.get('reason', '')}")
        lines = format_fallbacks(m)
        if lines and not lines[0].startswith("smelt: fully native"):
            notes += [f"{m['model']}: {lines[0].removeprefix('smelt: ')}", *lines[1:]]
    for name, r in (summ.get("isa_share_ratio") or {}).items():
        worst = min(r["models"], key=r["models"].get)
        notes.append(f"{name}: share of the {r['isa']} peak over smelt's share of the {report['machine']['smelt_isa']} "
                     f"peak, same run: geomean {r['geomean']:.2f}, lowest {r['min']:.2f} ({worst})")
    return "\n".join([table, *notes])


# ----------------------------------------------------------------------------- charts
PEER_COLORS = {"onnxruntime": "#4C72B0", "openvino": "#DD8452", "torch": "#C44E52",
               "smelt:nchw": "#8172B3", "smelt:conv": "#937860", "smelt:global": "#DA8BC3", "smelt:direct": "#8C8C8C"}


def write_speedup_chart(report: dict, path: str | Path, title: str | None = None) -> None:
    """Horizontal grouped bars: smelt's speedup over each peer, per model, growing from the 1× line.

    The NeoCPU and DeepCPU papers present their Table 2 / Table 1 this way: one bar per
    (model, peer); right of the line means smelt is faster. The axis is logarithmic, so 0.5×
    and 2× sit equally far from 1× and one 20× bar does not squash every bar near 1×.
    """
    plt = pyplot()
    from matplotlib.ticker import FixedLocator, NullLocator

    models = report["models"]
    peers = [p for p in report["settings"]["peers"]
             if any(m["engines"].get(p, {}).get("smelt_speedup") for m in models)]
    n = len(models)
    fig_h = max(2.5, 0.25 * n * max(1, len(peers)) ** 0.5 + 1.2)
    fig, ax = plt.subplots(figsize=(9, fig_h))
    bar_h = 0.8 / max(1, len(peers))
    lo, hi = 1.0, 1.0
    for j, peer in enumerate(peers):
        ys, xs = [], []
        for i, m in enumerate(models):
            sp = m["engines"].get(peer, {}).get("smelt_speedup")
            if sp:
                ys.append(i + (j - (len(peers) - 1) / 2) * bar_h)
                xs.append(sp)
        lo, hi = min([lo, *xs]), max([hi, *xs])
        geo = report["summary"]["geomean_speedup"].get(peer)
        label = f"vs {peer}" + (f" (geomean {geo:.2f}x)" if geo else "")
        ax.barh(ys, [x - 1.0 for x in xs], left=1.0, height=bar_h, color=PEER_COLORS.get(peer), label=label)
        for y, x in zip(ys, xs, strict=True):
            ax.text(x, y, f" {x:.2f} " if x >= 1 else f"{x:.2f} ", va="center", ha="left" if x >= 1 else "right",
                    fontsize=7)
    ax.axvline(1.0, color="black", lw=1)
    ax.set_xscale("log")
    ax.set_xlim(min(0.5, lo / 1.6), max(2.0, hi * 1.6))
    ticks = [t for t in (0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 20, 50) if lo / 1.6 <= t <= hi * 1.6 or t == 1]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([f"{t:g}x" for t in ticks])
    ax.set_yticks(range(n), [m["model"] for m in models], fontsize=8)
    ax.set_ylim(n - 0.5, -0.5)  # first model on top, no empty margin
    ax.set_xlabel("smelt speedup = peer latency / smelt latency (log scale; right of 1x: smelt faster)")
    s = report["settings"]
    geo_best = report["summary"].get("geomean_speedup_vs_best_peer")
    ax.set_title(title or (f"smelt vs peers, {_threads(s['threads'])}, batch {s.get('batch', 1)}"
                           + (f"; geomean vs best peer {geo_best:.2f}x" if geo_best else "")), fontsize=10)
    if peers:
        ax.legend(loc="lower right", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_latency_chart(entry: dict, path: str | Path) -> None:
    """One model: median latency per engine with interquartile whiskers, speedups annotated."""
    plt = pyplot()
    names = [n for n, e in entry["engines"].items() if e["status"] == "ok"]
    meds = [entry["engines"][n]["median_ms"] for n in names]
    iqrs = [entry["engines"][n]["spread_ms"] / 2 for n in names]
    fig, ax = plt.subplots(figsize=(7, 1.0 + 0.6 * len(names)))
    colors = ["#55A868" if n == "smelt" else PEER_COLORS.get(n, "#8C8C8C") for n in names]
    ax.barh(range(len(names)), meds, xerr=iqrs, color=colors, capsize=3)
    for i, n in enumerate(names):
        e = entry["engines"][n]
        note = f" {e['median_ms']:.3f} ms" + ("" if n == "smelt" else f"  (smelt {e['smelt_speedup']:.2f}x)")
        ax.text(meds[i] + iqrs[i] + 0.01 * max(meds), i, note, va="center", fontsize=8)
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlim(0, max(m + q for m, q in zip(meds, iqrs, strict=True)) * 1.5)
    ax.set_xlabel("median latency per call, ms (whiskers: interquartile range)")
    title = f"{entry['model']}, batch {entry['batch']}, {_threads(entry['threads'])}"
    smelt = entry["engines"]["smelt"]
    if smelt.get("gflops"):
        title += f"; smelt {smelt['gflops']:.0f} GFLOPS"
        if smelt.get("peak_share"):
            title += f" = {100 * smelt['peak_share']:.0f}% of measured peak"
    ax.set_title(title, fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
