"""Multi-instance throughput: K copies of a model on disjoint cores (PyDTNN's Fig. 6 setup).

A server with more cores than one request can use runs several model instances side by side.
Each instance here is its own process, confined with ``sched_setaffinity`` to its own physical
cores before any engine is loaded, so smelt's pool (which pins one worker per allowed core),
onnxruntime's and OpenVINO's pools and torch's OpenMP threads all stay on that instance's cores.
All instances start each measurement window together on a barrier and run back-to-back calls
for ``duration`` seconds; the total is items per second over all instances, and every call's
latency is kept so the worst one can be reported, not just the mean.

Engines take turns (one window of each engine per round, rotating the order), so machine noise
is shared the way :func:`smelt.bench.timing.time_interleaved` shares it for latency.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx

from smelt.bench.engines import ENGINES, BenchModel, EngineUnavailable
from smelt.errors import SmeltError


def core_sets(instances: int, threads_per_instance: int, cpus: Sequence[int] | None = None) -> list[list[int]]:
    """Disjoint CPU lists, one per instance, one logical CPU per physical core."""
    if instances < 1 or threads_per_instance < 1:
        raise SmeltError("--instances and --threads-per-instance must be at least 1")
    if cpus is None:
        from smelt.target import detect

        cpus = detect().core_cpus
    need = instances * threads_per_instance
    if need > len(cpus):
        raise SmeltError(f"{instances} instances x {threads_per_instance} threads = {need} cores, but only "
                         f"{len(cpus)} physical cores are available ({list(cpus)})")
    return [list(cpus[i * threads_per_instance:(i + 1) * threads_per_instance]) for i in range(instances)]


def _instance_main(conn, barrier, workdir: str, cpus: list[int], engines: list[str], threads: int) -> None:
    """One instance process: confine to ``cpus``, load every engine, then serve timing windows."""
    os.sched_setaffinity(0, cpus)  # before any engine creates threads, so they inherit it
    try:
        meta = json.loads((Path(workdir) / "meta.json").read_text())
        proto = onnx.load(str(Path(workdir) / "model.onnx"))
        with np.load(Path(workdir) / "feeds.npz") as z:
            feeds = {k: z[k] for k in meta["input_order"]}
        model = BenchModel(meta["name"], proto, feeds, meta["zoo_name"], meta["output_names"])
        runners, problems = {}, {}
        for name in engines:
            try:
                runners[name] = ENGINES[name](model, threads)
                for _ in range(3):
                    runners[name].run(feeds)
            except EngineUnavailable as exc:
                problems[name] = str(exc)
            except Exception as exc:
                problems[name] = f"{type(exc).__name__}: {exc}"
        conn.send(("ready", problems))
    except Exception as exc:
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    while True:
        msg = conn.recv()
        if msg[0] == "stop":
            break
        _, name, duration = msg
        run = runners[name].run
        barrier.wait()
        latencies = []
        start = time.perf_counter()
        deadline = start + duration
        now = start
        while now < deadline:
            t0 = now
            run(feeds)
            now = time.perf_counter()
            latencies.append((now - t0) * 1e3)
        conn.send((len(latencies), now - start, latencies))
    for r in runners.values():
        r.close()


def measure_throughput(model: BenchModel, engines: Sequence[str], instances: int, threads_per_instance: int,
                       duration: float = 2.0, rounds: int = 3, batch: int = 1, settle: float = 0.2,
                       progress: bool = True) -> dict[str, dict]:
    """Items/s of ``instances`` concurrent copies of each engine, and the latency distribution.

    Returns ``{engine: {instances, threads_per_instance, cpus, items_per_s, latency_median_ms,
    latency_p99_ms, latency_max_ms, calls}}``, or ``{engine: {"error": reason}}`` for an engine
    that could not be loaded in an instance. ``items_per_s`` is the median over ``rounds``.
    """
    from smelt.progress import counter

    sets = core_sets(instances, threads_per_instance)
    ctx = mp.get_context("spawn")  # a fork would inherit this process's engine threads and locks
    with tempfile.TemporaryDirectory(prefix="smelt-instances-") as workdir:
        onnx.save(model.proto, str(Path(workdir) / "model.onnx"))
        np.savez(Path(workdir) / "feeds.npz", **model.feeds)
        (Path(workdir) / "meta.json").write_text(json.dumps({
            "name": model.name, "zoo_name": model.zoo_name, "output_names": model.output_names,
            "input_order": list(model.feeds)}))
        barrier = ctx.Barrier(instances)
        pipes, procs = [], []
        for cpus in sets:
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_instance_main, args=(child, barrier, workdir, cpus, list(engines),
                                                         threads_per_instance), daemon=True)
            p.start()
            pipes.append(parent)
            procs.append(p)
        try:
            problems: dict[str, str] = {}
            for conn, proc in zip(pipes, procs, strict=True):
                try:
                    status, info = conn.recv()
                except EOFError:
                    proc.join(timeout=5)
                    raise SmeltError(f"a throughput instance exited before it was ready (exit code "
                                     f"{proc.exitcode}); see its error above") from None
                if status == "failed":
                    raise SmeltError(f"a throughput instance failed to start: {info}")
                problems.update(info)
            ok = [e for e in engines if e not in problems]
            per_engine: dict[str, dict] = {e: {"rates": [], "latencies": [], "calls": 0} for e in ok}
            tick = counter(f"[{model.name}] throughput, {instances} instances", rounds * len(ok), progress)
            step = 0
            for r in range(rounds):
                shift = r % len(ok) if ok else 0
                for name in ok[shift:] + ok[:shift]:
                    time.sleep(settle)
                    for conn in pipes:
                        conn.send(("run", name, duration))
                    rate = 0.0
                    for conn in pipes:
                        calls, elapsed, lats = conn.recv()
                        rate += calls * batch / elapsed
                        per_engine[name]["latencies"].extend(lats)
                        per_engine[name]["calls"] += calls
                    per_engine[name]["rates"].append(rate)
                    tick(step)
                    step += 1
        finally:
            for conn in pipes:
                try:
                    conn.send(("stop",))
                except (BrokenPipeError, OSError):
                    pass
            for p in procs:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
    results: dict[str, dict] = {e: {"error": reason} for e, reason in problems.items()}
    for name, acc in per_engine.items():
        lats = sorted(acc["latencies"])
        results[name] = {
            "instances": instances,
            "threads_per_instance": threads_per_instance,
            "cpus": sets,
            "items_per_s": statistics.median(acc["rates"]),
            "latency_median_ms": statistics.median(lats),
            "latency_p99_ms": lats[min(len(lats) - 1, int(0.99 * len(lats)))],
            "latency_max_ms": lats[-1],
            "calls": acc["calls"],
        }
    return results
