"""The `smelt` command: compile | run | check | quantize | demo | info | bench | profile | tune | cache."""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
from pathlib import Path

import numpy as np

from smelt.errors import SmeltError


def load_model_arg(spec: str, batch: int = 1):
    """``(proto, name)`` of a MODEL argument: an .onnx path or a zoo name (see ``load_model_or_zoo``)."""
    from smelt.frontend.zoo import load_model_or_zoo

    proto, name, _ = load_model_or_zoo(spec, batch=batch)
    return proto, name


def _parse_shapes(items: list[str] | None) -> dict[str, list[int]]:
    shapes = {}
    for item in items or []:
        name, _, dims = item.partition("=")
        if not dims:
            raise SmeltError(f"--shape wants name=d0,d1,...; given {item!r}")
        shapes[name] = [int(d) for d in dims.split(",")]
    return shapes


def cmd_compile(args: argparse.Namespace) -> int:
    from contextlib import nullcontext

    import smelt
    from smelt.codegen.toolchain import keeping_sources

    proto, name = load_model_arg(args.model)
    # the cache keeps generated C only under SMELT_DEBUG=1: --emit-c asks for it (regenerated if
    # the library was cached without it)
    with keeping_sources() if args.emit_c else nullcontext():
        model = smelt.compile(proto, threads=args.threads, input_shapes=_parse_shapes(args.shape),
                              allow_fallback=not args.no_fallback, progress=True, isa=args.isa)
    if not model.built:  # nothing to report until a call brings the values (or shapes) it needs
        print(f"{name}: not compiled yet: {model.unbuilt_reason}; `smelt check` or `smelt run` it to see "
              "which nodes run natively")
        return 0
    native = model.native_nodes
    fallback = model.fallback_report
    if args.verbose:
        for node, op in native:
            print(f"  native    {op:<22} {node}")
    else:
        counts: dict[str, int] = {}
        for _, op in native:
            counts[op] = counts.get(op, 0) + 1
        if counts:
            print("  native:   " + ", ".join(f"{op} x{n}" for op, n in sorted(counts.items()))
                  + "   (-v lists every node)")
    for f in fallback:
        print(f"  FALLBACK  {f['op']:<22} {f['node']}   ({f['reason']})")
    total = len(native) + len(fallback)
    print(f"{name}: {len(native)}/{total} nodes native, {len(fallback)} through the onnx.reference fallback"
          f"{'' if fallback else ' (fully native: one native call per inference)'}")
    print(f"compile time {model.compile_seconds:.2f} s{' (from cache)' if model.from_cache else ''}; "
          f"arena {model.arena_bytes / 2**20:.2f} MiB; threads {model.threads}; isa {model.target.isa}")
    if model.source_path:
        print(f"generated C: {model.source_path}")
        if args.emit_c:
            target = Path(args.emit_c)
            target.write_text(model.source_path.read_text())
            print(f"wrote {target}")
    return 0


def _safe_filename(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "output"


def cmd_run(args: argparse.Namespace) -> int:
    import smelt

    proto, name = load_model_arg(args.model)
    model = smelt.compile(proto, threads=args.threads, progress=True, isa=args.isa)
    feeds = _parse_inputs(args.input, [x.name for x in model.get_inputs()])
    outs = model.run_graph(feeds)  # .npy holds arrays: a ZipMap's maps are saved as their probabilities
    zipmaps = {zm.name: zm for zm in model.zipmap_outputs}
    out_dir = Path(args.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for meta, arr in zip(model.get_outputs(), outs, strict=True):
        path = out_dir / f"{_safe_filename(meta.name)}.npy"
        np.save(path, arr)
        what = (f" (ZipMap's probabilities, one column per label of {list(zipmaps[meta.name].labels)})"
                if meta.name in zipmaps else "")
        print(f"{meta.name}: shape {list(arr.shape)} {arr.dtype}{what} -> {path}")
    return 0


def _parse_inputs(items: list[str] | None, names: list[str]) -> dict[str, np.ndarray]:
    """``--input [NAME=]FILE.npy`` arrays by input name (positional ones in input order), and
    ``--input FILE.npz``: every array of the archive under its own name, which must be an input's
    (``NAME=FILE.npz`` takes an archive of one array)."""
    feeds = {}
    for i, item in enumerate(items or []):
        key, sep, path = item.partition("=")
        if not sep:
            key, path = "", item
        try:
            loaded = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise SmeltError(f"--input {item}: cannot read {path!r} as .npy or .npz: {e}") from None
        if isinstance(loaded, np.lib.npyio.NpzFile):
            with loaded:
                arrays = {k: loaded[k] for k in loaded.files}
            if key:
                if len(arrays) != 1:
                    raise SmeltError(f"--input {item}: {path!r} holds {len(arrays)} arrays ({sorted(arrays)}); "
                                     f"NAME=FILE.npz takes one (or give FILE.npz alone, its arrays named as inputs)")
                arrays = {key: next(iter(arrays.values()))}
            unknown = sorted(set(arrays) - set(names))
            if unknown:
                raise SmeltError(f"--input {item}: arrays {unknown} of {path!r} name no model input ({names})")
            feeds.update(arrays)
            continue
        if not key:
            if i >= len(names):
                raise SmeltError(f"more --input files than model inputs ({names})")
            key = names[i]
        feeds[key] = loaded
    return feeds


def cmd_check(args: argparse.Namespace) -> int:
    import smelt

    proto, name = load_model_arg(args.model)
    shapes = _parse_shapes(args.shape)
    names = [i.name for i in proto.graph.input if i.name not in {t.name for t in proto.graph.initializer}]
    feeds = _parse_inputs(args.input, names)
    for k, v in feeds.items():  # a given array sizes its symbolic dimensions
        shapes.setdefault(k, list(v.shape))
    report = smelt.check(proto, feeds, shapes=shapes, rtol=args.rtol, atol=args.atol, reference=args.reference,
                         seed=args.seed, localize=not args.no_localize, progress=not args.quiet, name=name,
                         threads=args.threads, isa=args.isa, **({"observe_bytes": 0} if args.bisect else {}))
    if args.json == "-":
        print(report.to_json())
    else:
        print(report.format_text())
        if args.json:
            Path(args.json).write_text(report.to_json() + "\n")
            print(f"wrote {args.json}")
    return 0 if report.ok else 1


def cmd_quantize(args: argparse.Namespace) -> int:
    import onnx

    from smelt.quantize import quantize

    proto, _ = load_model_arg(args.model)
    overrides = {}
    for item in args.override:
        name, sep, spec = item.rpartition("=")
        if not sep or not name:
            raise SystemExit(f"smelt quantize: --override {item!r}: write NAME=SPEC (SPEC: float, w4, a16, w4a16)")
        overrides[name] = spec
    if args.mode == "static" and not args.calibration:
        raise SystemExit("smelt quantize: --mode static needs --calibration DIR")
    model, report = quantize(proto, args.calibration, mode=args.mode, method=args.method,
                             percentile=args.percentile, granularity=args.granularity or
                             ("tensor" if args.per_tensor else "channel"),
                             weight_bits=args.weight_bits, activation_bits=args.activation_bits,
                             symmetric_weights=not args.asymmetric_weights,
                             symmetric_activations=args.symmetric_activations, keep=args.keep,
                             overrides=overrides, max_error=args.max_error, eval_samples=args.eval_samples,
                             threads=args.threads)
    onnx.save(model, args.output)
    print(report.format_text())
    fmt = "QDQ" if args.mode == "static" else "MatMulInteger/DynamicQuantizeLSTM"
    print(f"wrote {args.output} ({fmt}: onnxruntime loads it too)")
    if args.mode == "static" and args.weight_bits == 8:
        from smelt.codegen.kernels.isa import exact_byte_products
        from smelt.target import detect

        if not exact_byte_products(detect()):  # say it; never lower the precision unasked
            print("note: this CPU has no VNNI, so 8-bit weights run as exact int16 pairs (about 1.1x fp32 "
                  "here); --weight-bits 7 lets the byte products run (vpmaddubsw cannot saturate on 7-bit "
                  "weights), about 1.7x fp32, like onnxruntime's reduce_range")
    if args.debug:  # the integer kernels beside the fp32 model on (up to 8 of) the calibration inputs
        import itertools

        from smelt.quantize import calibration_inputs, debug_report

        if not args.calibration:
            raise SystemExit("smelt quantize: --debug runs on the --calibration inputs; give --calibration DIR")
        names = [i.name for i in proto.graph.input if i.name not in {t.name for t in proto.graph.initializer}]
        feeds = list(itertools.islice(calibration_inputs(args.calibration, names), 8))
        debug = debug_report(model, feeds, float_model=proto, threads=args.threads)
        print(debug.format_text(top=args.debug_top))
        if args.debug_chart:
            debug.save_chart(args.debug_chart)
            print(f"wrote {args.debug_chart}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    import smelt
    from smelt.bench.engines import ENGINES, EngineUnavailable
    from smelt.bench.harness import relative_error, resolve_model
    from smelt.bench.timing import time_interleaved
    from smelt.target import detect

    threads = args.threads or detect().physical_cores
    print(f"smelt demo: {threads} threads, {detect().cpu}: {detect().describe()}")
    status = 0
    for spec in args.models or ["resnet50", "lstm"]:
        bench_model = resolve_model(spec)
        name, feeds = bench_model.name, bench_model.feeds
        model = smelt.compile(bench_model.proto, threads=threads, progress=True)
        ours = model.run(feeds)
        try:
            ort = ENGINES["onnxruntime"](bench_model, threads)
            ref = ort.run(feeds)
        except EngineUnavailable:
            from onnx.reference import ReferenceEvaluator

            ort = None
            print("onnxruntime is not installed: checking against onnx.reference, no latency comparison "
                  "(pip install -e '.[test]' to get it)", file=sys.stderr)
            from smelt.runtime.reference_ops import FIXED_OPS

            ref = ReferenceEvaluator(bench_model.proto, new_ops=FIXED_OPS).run(None, feeds)
        err = relative_error(ref, ours)
        ok = err <= 1e-4
        status |= 0 if ok else 1
        fns = {"smelt": lambda m=model, f=feeds: m.run(f)}
        if ort is not None:
            fns["onnxruntime"] = lambda r=ort, f=feeds: r.run(f)
        times = time_interleaved(fns, args.rounds)
        med = {k: statistics.median(v) for k, v in times.items()}
        line = (f"[{name}] {'OK' if ok else 'MISMATCH'} rel.err {err:.1e}; fallback nodes: "
                f"{len(model.fallback_nodes)}; compile {model.compile_seconds:.1f} s"
                f"{' (cached)' if model.from_cache else ''}; smelt {med['smelt']:.3f} ms")
        if "onnxruntime" in med:
            line += f", onnxruntime {med['onnxruntime']:.3f} ms (smelt speedup {med['onnxruntime'] / med['smelt']:.2f}x)"
        print(line, flush=True)
    return status


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _cache_summary() -> str:
    from smelt.cache import usage

    u = usage()
    return (f"{u.directory}: {_size(u.total_bytes)} of {_size(u.bound_bytes)} (SMELT_CACHE_MAX_BYTES); "
            f"{u.models} artifacts ({_size(u.model_bytes)}), {u.libraries} libraries ({_size(u.library_bytes)})")


def cmd_info(args: argparse.Namespace) -> int:
    from smelt.codegen.toolchain import find_compiler
    from smelt.target import detect

    t = detect()
    print(f"cpu:        {t.cpu}")
    print(f"isa:        {t.isa} ({t.vector_bits}-bit vectors, {t.vector_registers} vector registers, "
          f"FMA {'yes' if t.fma else 'no'}); --isa / SMELT_ISA can cap it to {', '.join(t.isa_caps())}")
    print(f"features:   {' '.join(t.flags)}")
    print(f"cores:      {t.physical_cores} physical (pinning to CPUs {list(t.core_cpus)})")
    print(f"caches:     L1d {t.l1d_bytes // 1024} KiB, L2 {t.l2_bytes // 1024} KiB, L3 {t.l3_bytes // 1024} KiB")
    try:
        cc = find_compiler()
        print(f"compiler:   {cc.path} ({cc.identity})")
    except SmeltError as exc:
        print(f"compiler:   none ({exc})")
    print(f"cache dir:  {_cache_summary()}")
    if args.peak:
        from smelt import settings
        from smelt.bench.peak import format_peak, load_or_measure_peak

        isa = args.isa if args.isa is not None else settings.isa()
        print(format_peak(load_or_measure_peak(measure=True, progress=True, isa=isa)))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from smelt.bench import report as rep
    from smelt.bench.engines import parse_engines
    from smelt.bench.harness import apply_isa_cap, run_bench

    # before anything imports a peer: they read their ISA variables once, at their first dispatch
    apply_isa_cap(args.isa)
    from smelt.bench.suites import suite_models
    from smelt.target import detect

    if bool(args.model) == bool(args.suite):
        raise SmeltError("give either MODEL or --suite cnn|rnn|wild")
    if args.instances is not None and args.threads_per_instance is None:
        args.threads_per_instance = max(1, detect().physical_cores // args.instances)
    models = suite_models(args.suite) if args.suite else [args.model]
    peers = parse_engines(args.against)
    if args.ablation:  # NeoCPU Table 3: smelt's layout modes as peers of the default build
        from smelt.bench.engines import LAYOUT_ABLATION

        peers = parse_engines(LAYOUT_ABLATION + ("," + args.against if args.against else ""))
    threads = args.threads or detect().physical_cores
    result = run_bench(models, peers, threads, batch=args.batch, rounds=args.rounds, warmup=args.warmup,
                       tolerance=args.tolerance, shapes=_parse_shapes(args.shape), instances=args.instances,
                       threads_per_instance=args.threads_per_instance, duration=args.duration,
                       command=args.command_line, isa=args.isa)
    print(rep.format_machine(result))
    if args.suite:
        n = result["settings"]["threads"]
        print(f"suite {args.suite}: {len(models)} models, {n} thread{'s' if n != 1 else ''}, "
              f"batch {args.batch}, peak {result['machine']['peak_gflops']} GFLOPS")
        print(rep.format_suite(result, markdown=args.markdown))
    else:
        print(rep.format_model(result["models"][0], markdown=args.markdown))
    if args.json:
        rep.write_json(result, args.json)
        print(f"wrote {args.json}")
    if args.chart:
        if args.suite:
            rep.write_speedup_chart(result, args.chart, None)
        else:
            rep.write_latency_chart(result["models"][0], args.chart)
        print(f"wrote {args.chart}")
    mismatched = [m["model"] for m in result["models"]
                  if any(e["status"] in ("mismatch", "error") for e in m["engines"].values())]
    return 1 if mismatched else 0


def cmd_profile(args: argparse.Namespace) -> int:
    import json

    from smelt.bench.harness import resolve_model
    from smelt.bench.profile import run_profile

    model = resolve_model(args.model, args.batch, _parse_shapes(args.shape))
    report = run_profile(model.proto, model.feeds, threads=args.threads, rounds=args.rounds, progress=True,
                         name=model.name, isa=args.isa)
    print(report.format_table(top=args.top))
    if args.html:
        report.write_html(args.html)
        print(f"wrote {args.html}")
    if args.chart:
        report.write_chart(args.chart)
        print(f"wrote {args.chart}")
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_dict(), indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def parse_budget(text: str) -> float:
    """Seconds of a ``--budget`` such as 30s, 10m, 1.5h or 90 (seconds)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text or "")
    if not m or float(m.group(1)) <= 0:
        raise SmeltError(f"--budget wants a positive duration such as 30s, 10m or 1h; given {text!r}")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def cmd_tune(args: argparse.Namespace) -> int:
    import time

    from smelt.bench.harness import resolve_model
    from smelt.bench.suites import suite_models
    from smelt.frontend.onnx_import import specialize_inputs
    from smelt.progress import track
    from smelt.schedule.db import default_path, open_default
    from smelt.target import detect
    from smelt.tune.search import collect_tasks, lower_for_tuning, tune_tasks

    start = time.perf_counter()
    budget = parse_budget(args.budget)
    specs = list(dict.fromkeys(list(args.models) + (suite_models(args.suite) if args.suite else [])))
    if not specs:
        raise SmeltError("give MODEL names/paths or --suite cnn")
    db = open_default()
    if db is None:
        raise SmeltError("the tuning database is disabled (SMELT_TUNING_DB=off); point it at a file to tune")
    # held to --isa / $SMELT_ISA like a compile: records are stored under the capped target's key,
    # which is the key a capped compile looks them up by
    from smelt import settings

    target = detect().narrowed(args.isa if args.isa is not None else settings.isa())
    threads = args.threads or target.physical_cores
    lowered = []
    for spec in track(specs, "lowering models"):
        bm = resolve_model(spec)
        proto = specialize_inputs(bm.proto, {k: list(v.shape) for k, v in bm.feeds.items()})
        lowered.append((bm.name, lower_for_tuning(proto, threads, target)))
    tasks = collect_tasks(lowered, threads, target)
    if not tasks:
        print(f"no NCHWc convolutions to tune in {', '.join(specs)}")
        return 0
    print(f"tuning {len(tasks)} distinct conv workloads of {len(specs)} model(s), {threads} thread(s), "
          f"budget {budget:.0f} s, target {target.isa}", flush=True)
    report = tune_tasks(tasks, budget - (time.perf_counter() - start), threads, target, db, progress=True)
    rows = [("workload", "in", "models", "tried", "default ms", "best ms", "speedup", "best schedule", "stored")]
    for r in report.results:
        b = r.best
        rows.append((r.task.describe(), f"ib{r.task.ibs[0]}", ",".join(r.task.models)[:28], str(r.tried),
                     f"{r.default_s * 1e3:.3f}", f"{r.best_s * 1e3:.3f}", f"{r.speedup:.2f}x",
                     f"oc_bn={b.oc_bn} {b.oc_blocks}x{b.reg_n}{'' if b.unroll_ker else ' no-unroll'}",
                     ",".join(f"ib{ib}" for ib in r.stored) or "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
    saved = sum(r.default_s - r.best_s for r in report.results if r.task.ibs[0] in r.stored)
    print(f"{len(report.results)} workloads tuned; {sum(len(r.stored) for r in report.results)} schedule records "
          f"written (stored: the input blocks whose winner beat the default by >2% head to head; times at the "
          f"natural block 'in'); {saved * 1e3:.2f} ms saved per call, summed over one use each; "
          f"{report.transforms} layout transforms measured; {time.perf_counter() - start:.0f} s")
    for task, why in report.failed:
        print(f"FAILED {task.describe()}: {why}")
    if report.skipped:
        print(f"budget exhausted: {len(report.skipped)} workloads not tuned "
              f"({', '.join(t.describe() for t in report.skipped[:4])}{', ...' if len(report.skipped) > 4 else ''})")
    print(f"tuning database: {default_path()}")
    return 1 if report.failed else 0


def cmd_cache(args: argparse.Namespace) -> int:
    from smelt import cache

    if args.action == "clear":
        print(f"removed {_size(cache.clear())} (artifacts and libraries no running process uses)")
    elif args.action == "prune":
        print(f"removed {_size(cache.enforce_bound())} (leftovers, then least recently used entries)")
    print(_cache_summary())
    return 0


def _isa_arg(p: argparse.ArgumentParser, help: str | None = None) -> None:
    from smelt.target import ISA_CHOICES

    p.add_argument("--isa", choices=ISA_CHOICES, default=None,
                   help=help or "the widest ISA the compiled code may use (default: $SMELT_ISA, else the host's); "
                   "like oneDNN's ONEDNN_MAX_CPU_ISA")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="smelt", description="Optimizing compiler and runtime for "
                                     "neural-network inference on CPUs.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("compile", help="compile a model and report which nodes are native",
                       description="Compile an ONNX model (or zoo:NAME) and print which nodes run natively.")
    p.add_argument("model", help="path to an .onnx file, or zoo:NAME")
    p.add_argument("--threads", type=int, default=None, help="threads (default: physical cores)")
    p.add_argument("--shape", action="append", metavar="NAME=D0,D1,...",
                   help="concrete shape for an input with symbolic dimensions")
    p.add_argument("--emit-c", metavar="PATH", help="also write the generated C to PATH")
    p.add_argument("--no-fallback", action="store_true", help="fail if any node is not native")
    _isa_arg(p)
    p.add_argument("-v", "--verbose", action="store_true", help="list native nodes too")
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("run", help="run a model on .npy inputs and write .npy outputs",
                       description="Run a model once. Inputs: --input x.npy (in input order) or "
                       "--input name=x.npy. Outputs are written as OUTPUT_DIR/<output name>.npy.")
    p.add_argument("model", help="path to an .onnx file, or zoo:NAME")
    p.add_argument("--input", action="append", metavar="[NAME=]FILE.npy",
                   help="an input tensor (.npy), or FILE.npz with arrays named as the inputs")
    p.add_argument("--output-dir", default=".", help="where to write outputs (default: .)")
    p.add_argument("--threads", type=int, default=None)
    _isa_arg(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("check", help="run a model in smelt and in onnxruntime, compare, name the first diverging node",
                       description="Run MODEL once in smelt and in the reference (onnxruntime, else onnx.reference) "
                       "on random inputs (or --input arrays) and compare every output: max abs and relative error, "
                       "NaN/Inf positions. When they disagree, compile probes that also output intermediate "
                       "values and name the first node whose output diverges: its op, shapes, error, and "
                       "whether it ran native (which template) or through the fallback (and why). Exit status "
                       "0 when all outputs agree, 1 when not, 2 on an error.")
    p.add_argument("model", help="path to an .onnx file, or zoo:NAME")
    p.add_argument("--input", action="append", metavar="[NAME=]FILE.npy",
                   help="an input tensor (.npy), or FILE.npz with arrays named as the inputs (others are seeded "
                   "random: normal floats, zero integers, true booleans)")
    p.add_argument("--shape", action="append", metavar="NAME=D0,D1,...",
                   help="concrete shape for an input with symbolic dimensions")
    p.add_argument("--rtol", type=float, default=1e-4,
                   help="agree when max|smelt - ref| <= atol + rtol * max|ref| (default 1e-4)")
    p.add_argument("--atol", type=float, default=1e-6, help="absolute floor of the tolerance (default 1e-6)")
    p.add_argument("--reference", choices=["auto", "onnxruntime", "onnx"], default="auto",
                   help="auto: onnxruntime if installed, else onnx.reference")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--no-localize", action="store_true", help="compare the outputs only (no probe compiles)")
    p.add_argument("--bisect", action="store_true",
                   help="localize by bisection only (about log2(nodes) probes, each observing one cut of the graph) "
                   "instead of first observing every value at once; for faults that depend on memory placement")
    p.add_argument("--json", metavar="OUT", help="write the report as JSON to OUT ('-': print it instead of the table)")
    p.add_argument("--threads", type=int, default=None, help="threads (default: physical cores)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    _isa_arg(p)
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("quantize", help="write a quantized model (static QDQ or dynamic) that onnxruntime also loads",
                       description="Quantize MODEL's Conv/MatMul (static) or MatMul/Gemm/LSTM (dynamic) and write "
                       "OUT.onnx. Static: activation ranges from --calibration inputs (a folder of .npz files with "
                       "one array per input name, or .npy files for a single-input model), written in the QDQ "
                       "format (default: uint8 asymmetric activations per tensor, int8 symmetric weights per output "
                       "channel, int32 biases); smelt runs 8-bit groups on its integer kernels. Dynamic: weights "
                       "quantized offline, activations at run time (DynamicQuantizeLinear + MatMulInteger, "
                       "com.microsoft DynamicQuantizeLSTM), as onnxruntime's quantize_dynamic writes. A node whose "
                       "int32 accumulator could overflow (K x max|a| x max|w| > 2^31-1) is refused.")
    p.add_argument("model", help="path to an fp32 .onnx file, or zoo:NAME")
    p.add_argument("-o", "--output", required=True, metavar="OUT.onnx", help="where to write the quantized model")
    p.add_argument("--mode", choices=["static", "dynamic"], default="static",
                   help="static: calibrated activation ranges, QDQ; dynamic: activations quantized at run time "
                   "(default static)")
    p.add_argument("--calibration", metavar="DIR",
                   help="folder of .npz/.npy inputs: calibration (static), the error measure of --max-error, "
                   "and the --debug inputs")
    p.add_argument("--method", choices=["minmax", "percentile", "entropy"], default="minmax",
                   help="activation range: the extremes seen, --percentile of each side, or the KL-divergence "
                   "(entropy) threshold (default minmax)")
    p.add_argument("--percentile", type=float, default=99.99, help="with --method percentile (default 99.99)")
    p.add_argument("--weight-bits", type=int, default=8, metavar="N",
                   help="weight bits 2..16, stored in int8 up to 8 and int16 above (default 8)")
    p.add_argument("--activation-bits", type=int, default=8, metavar="N",
                   help="activation bits 2..16 (static), stored in (u)int8 up to 8 and (u)int16 above; 16-bit "
                   "Q/DQ needs opset 21, an older model is converted (default 8)")
    p.add_argument("--asymmetric-weights", action="store_true",
                   help="weights with a zero point over [min, max] (default symmetric, zero point 0)")
    p.add_argument("--symmetric-activations", action="store_true",
                   help="signed activations with zero point 0 (default asymmetric, unsigned)")
    p.add_argument("--granularity", choices=["tensor", "channel", "row", "column"],
                   help="weight scales: one per tensor, per output channel, per row or per column of a MatMul "
                   "weight (default channel)")
    p.add_argument("--per-tensor", action="store_true", help="the same as --granularity tensor")
    p.add_argument("--keep", action="append", default=[], metavar="NAME|OP",
                   help="keep this node (by name) or every node of this op type in float; repeatable")
    p.add_argument("--override", action="append", default=[], metavar="NAME|OP=SPEC",
                   help="per node or op type: float, wN (weight bits), aN (activation bits) or wNaM; a node name "
                   "wins over its op type; repeatable (e.g. --override Conv=w4 --override fc=float)")
    p.add_argument("--max-error", metavar="BOUND",
                   help="accuracy-driven mixed precision on the --calibration inputs: '30dB' (each output's SQNR "
                   "against fp32 at least 30 dB) or a relative error such as 0.01 (max|q-f| / max|f|); the nodes "
                   "that hurt the output most go back to float one by one until it holds on the integer kernels "
                   "(static models: ranked by each node's own harm at the output on one compiled float simulation)")
    p.add_argument("--eval-samples", type=int, default=16, metavar="N",
                   help="with --max-error: measure on the first N calibration inputs (default 16)")
    p.add_argument("--threads", type=int, default=None, help="threads for the calibration and measuring runs")
    p.add_argument("--debug", action="store_true",
                   help="then run the integer kernels beside the fp32 model on the calibration inputs: per quantized "
                   "tensor the error, SQNR and the elements the kernels saturated (counted inside them), worst first")
    p.add_argument("--debug-top", type=int, default=20, metavar="N", help="with --debug: list the N worst tensors")
    p.add_argument("--debug-chart", metavar="OUT.png", help="with --debug: also a chart (needs matplotlib)")
    p.set_defaults(func=cmd_quantize)

    p = sub.add_parser("demo", help="compile built-in models, check them against onnxruntime, time them",
                       description="Compile zoo models (default: resnet50 and lstm), check the results "
                       "against onnxruntime and print latency beside onnxruntime's.")
    p.add_argument("models", nargs="*", help="zoo model names (default: resnet50 lstm)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--rounds", type=int, default=10,
                   help="interleaved rounds; each times 5 calls per engine (default 10)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("info", help="print the detected target, compiler and cache directory",
                       description="Print the detected CPU target (ISA, vector width, cores, caches), "
                       "the C compiler and the cache directory; with --peak, measure the fp32 peak.")
    p.add_argument("--peak", action="store_true",
                   help="measure the fp32 peak (FMA register loop at 1 and all threads, numpy sgemm) "
                   "and store it for bench/profile")
    _isa_arg(p, "with --peak: measure that ISA's peak (stored apart from the host's)")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("bench", help="time smelt against onnxruntime, OpenVINO and PyTorch",
                       description="Check outputs against smelt's, then time smelt and its peers interleaved "
                       "in one process, same inputs and thread count. Peers that are not installed are "
                       "skipped with a note.")
    p.add_argument("model", nargs="?", help="an .onnx path or a zoo name (zoo:resnet50, "
                   "zoo:lstm-E256-H256-B1-T100, ...)")
    p.add_argument("--suite", choices=["cnn", "rnn", "wild"],
                   help="the zoo CNNs, DeepCPU's Table 1 LSTM+GRU shapes, or trained models from PyPI wheels")
    p.add_argument("--against", default=None, metavar="PEERS",
                   help="comma-separated peers (default: onnxruntime,openvino,torch); smelt@avx2 (or any --isa "
                   "cap) adds smelt held to that ISA, timed interleaved with the default build, and the report "
                   "gives its share of its ISA's peak over the default build's (never counted as the best peer)")
    p.add_argument("--ablation", action="store_true",
                   help="NeoCPU Table 3: time the default build against smelt:nchw (NCHW baseline), smelt:conv "
                   "(NCHWc convs, transforms around each), smelt:direct (transforms eliminated) and smelt:global "
                   "(global layout search), all with direct convolutions (the default adds Winograd), plus --against")
    p.add_argument("--threads", type=int, default=None, help="threads for every engine (default: physical cores)")
    p.add_argument("--batch", type=int, default=1, help="batch size for zoo models / symbolic batch dims")
    p.add_argument("--rounds", type=int, default=20, help="interleaved rounds, each 5 timed calls per engine")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls per engine before the rounds")
    p.add_argument("--tolerance", type=float, default=1e-4,
                   help="max relative error vs smelt before a peer counts as a mismatch (default 1e-4)")
    p.add_argument("--shape", action="append", metavar="NAME=D0,D1,...", help="concrete input shape")
    p.add_argument("--instances", type=int, default=None,
                   help="also measure throughput of K instances on disjoint cores")
    p.add_argument("--threads-per-instance", type=int, default=None, help="threads of each instance")
    p.add_argument("--duration", type=float, default=2.0, help="seconds per throughput window (default 2)")
    p.add_argument("--json", metavar="OUT", help="write the full report as JSON")
    p.add_argument("--chart", metavar="OUT.png", help="write a chart (latency per engine, or suite speedups)")
    p.add_argument("--markdown", action="store_true", help="print tables as markdown")
    _isa_arg(p, "hold smelt to ISA, and the peers that can be held (PyTorch: ATEN_CPU_CAPABILITY and oneDNN's "
             "ONEDNN_MAX_CPU_ISA; OpenVINO: its oneDNN kernels); onnxruntime cannot be capped. The report "
             "names the ISA each engine ran and takes its share of peak against that ISA's peak")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("profile", help="time per node and per op class, measured inside the native code",
                       description="Compile an instrumented build (timestamps around every kernel call) and "
                       "report time per node and per op class, GFLOPS and share of peak per conv/GEMM, "
                       "the kernel and schedule each uses, arena size and compile time, beside the "
                       "end-to-end latency of the normal build.")
    p.add_argument("model", help="an .onnx path or a zoo name (zoo:resnet50, ...)")
    p.add_argument("--threads", type=int, default=None, help="threads (default: physical cores)")
    p.add_argument("--batch", type=int, default=1, help="batch size for zoo models / symbolic batch dims")
    p.add_argument("--shape", action="append", metavar="NAME=D0,D1,...", help="concrete input shape")
    p.add_argument("--rounds", type=int, default=50, help="timed calls of each build (default 50)")
    p.add_argument("--top", type=int, default=None, help="list only the N slowest nodes")
    p.add_argument("--html", metavar="OUT.html", help="write a self-contained HTML report with a chart")
    p.add_argument("--chart", metavar="OUT.png", help="write a PNG chart of per-node and per-class time")
    p.add_argument("--json", metavar="OUT.json", help="write the profile as JSON")
    _isa_arg(p)
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("tune", help="measure conv schedules and layout transforms into the tuning database",
                       description="NeoCPU's local search: time every distinct NCHWc convolution of the models "
                       "under the default and the cost model's best schedules (many per compiled library), "
                       "and the layout transforms between blocks, within a time budget. Faster schedules "
                       "are stored in the tuning database (SMELT_TUNING_DB); later compiles use them, and "
                       "layout='global' uses the measured costs.")
    p.add_argument("models", nargs="*", help="ONNX paths or zoo names (zoo:resnet18, ...)")
    p.add_argument("--suite", choices=["cnn"], help="also tune the zoo CNNs")
    p.add_argument("--budget", default="10m", help="total time: 30s, 10m, 1h (default 10m)")
    p.add_argument("--threads", type=int, default=None, help="threads to tune for (default: physical cores)")
    _isa_arg(p, "tune the code of ISA (its records serve compiles held to the same ISA)")
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("cache", help="show, prune or clear the compiled-model cache",
                       description="info: the cache directory's size and bound (SMELT_CACHE_MAX_BYTES). "
                       "prune: remove leftovers of crashed processes, then least recently used entries "
                       "until the cache is within its bound (done after every compile anyway). clear: "
                       "remove every compiled artifact and library no running process uses; the tuning "
                       "database and measured peaks stay.")
    p.add_argument("action", nargs="?", choices=["info", "prune", "clear"], default="info")
    p.set_defaults(func=cmd_cache)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.command_line = ["smelt", *(sys.argv[1:] if argv is None else argv)]
    try:
        return args.func(args)
    except BrokenPipeError:  # `smelt info | head`: the reader left; no traceback for that
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except SmeltError as exc:
        print(f"smelt: error: {exc}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError) as exc:
        print(f"smelt: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
