"""This machine's measured fp32 peak: the yardstick `smelt bench` and `smelt profile` divide by.

Two figures:

* **FMA peak**: a generated C microbenchmark keeps many independent vector accumulators in
  registers and runs ``acc = acc * x + y`` on each in a counted loop. With enough chains to cover
  FMA latency times the number of FMA ports, the loop is throughput-bound on the FMA units, which
  is the most fp32 work the cores can do. Measured on one pinned thread and on one pinned thread
  per physical core (the same CPUs smelt's runtime pins its workers to).
* **Achievable BLAS**: a large float32 matrix product through numpy's BLAS, i.e. what a tuned
  library reaches on this machine once memory and packing costs are paid.

A measurement takes a few seconds, so the result is cached as JSON in smelt's cache directory,
keyed by the target description, the core count and the compiler (see ``load_or_measure_peak``).
"""

from __future__ import annotations

import ctypes
import datetime as _dt
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from smelt.codegen.kernels.isa import vector_isa
from smelt.errors import SmeltError
from smelt.progress import stage, track
from smelt.target import Target, detect

CACHE_VERSION = 2  # bump when the measurement or the JSON layout changes: old figures are dropped

# Recurrence constants: acc -> acc * X + Y converges to Y / (1 - X) (about 1049) from any start,
# so the accumulators never overflow, underflow or go denormal (denormal FMAs take a slow path on
# some cores, which would understate the peak). Passed at run time so nothing folds at compile time.
_X = 1.0 - 2.0**-20
_Y = 1e-3


# ---------------------------------------------------------------------------------------------
# The C microbenchmark
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PeakKernel:
    """A rendered FMA loop and what one iteration of it computes."""

    source: str
    flavor: str  # "avx512-fma", "avx2-fma", "neon-fma", "generic-<bits>": names the template branch
    lanes: int  # fp32 lanes per vector
    accumulators: int  # independent dependency chains, each a register
    fmas_per_iter: int  # vector FMAs (or mul+add pairs) per loop iteration, per thread

    @property
    def flops_per_iter(self) -> int:
        """FLOPs per loop iteration per thread: an FMA is a multiply and an add, per lane."""
        return 2 * self.lanes * self.fmas_per_iter


def _flavor(target: Target) -> tuple[str, int, list[str]]:
    """Template branch for a target: (flavor, lanes, C lines defining vec_t and its macros).

    Explicit intrinsics rather than ``acc * x + y`` on GCC vector types for the ISAs with FMA:
    whether ``a * b + c`` becomes one FMA depends on -ffp-contract (on for gnu11, off for c11),
    and the peak must not hinge on a dialect flag.
    """
    vx = vector_isa(target)  # the description smelt's kernels render with (codegen/kernels/isa.py)
    if vx.vector and vx.fma:
        return f"{vx.name}-fma", vx.lanes, [
            f"#include <{vx.c_header}>",
            f"typedef {vx.vtype} vec_t;",
            f"#define VLANES {vx.lanes}",
            f"#define VSET1(v) {vx.set1('v')}",
            f"#define VFMA(acc, x, y) {vx.fmadd('(acc)', '(x)', '(y)')} /* acc * x + y, one rounding */",
            f"#define VSTORE(p, v) {vx.storeu('(p)', '(v)').rstrip(';')}",
        ]
    if target.arch == "aarch64" and target.isa == "neon":
        return "neon-fma", 4, [
            "#include <arm_neon.h>",
            "typedef float32x4_t vec_t;",
            "#define VLANES 4",
            "#define VSET1(v) vdupq_n_f32(v)",
            "#define VFMA(acc, x, y) vfmaq_f32((y), (acc), (x)) /* y + acc * x, one rounding */",
            "#define VSTORE(p, v) vst1q_f32((p), (v))",
        ]
    # Anything else (SSE, AVX without FMA, other architectures): GCC vector types of the target's
    # width, multiply then add. Whether the compiler fuses the pair or not, it is still one multiply
    # and one add per lane, so the FLOP count below holds either way.
    lanes = max(1, target.vector_bits // 32)
    if lanes == 1:
        typedef = "typedef float vec_t;"
        store = "#define VSTORE(p, v) (*(p) = (v))"
        set1 = "#define VSET1(v) (v)"
    else:
        typedef = f"typedef float vec_t __attribute__((vector_size({lanes * 4})));"
        store = "#define VSTORE(p, v) memcpy((p), &(v), sizeof(vec_t))"
        set1 = "#define VSET1(v) ((vec_t){0} + (v)) /* broadcast */"
    return f"generic-{lanes * 32}", lanes, [
        typedef,
        f"#define VLANES {lanes}",
        set1,
        "#define VFMA(acc, x, y) ((acc) * (x) + (y)) /* a multiply and an add per lane */",
        store,
    ]


# FMA latency (cycles) x FMA ports of the widest cores smelt runs on: 4 x 2 on Skylake..Sapphire
# Rapids and Zen 3/4, 5 x 2 on Haswell, 4 x 4 on Neoverse V1. Fewer independent chains than this
# leave an FMA port idle every cycle, and the "peak" is a fraction of the real one.
MAX_FMA_IN_FLIGHT = 16


def default_accumulators(target: Target) -> int:
    """Independent chains: enough to hide FMA latency on every FMA port, leaving registers spare.

    The register count is the ISA description's (codegen/kernels/isa.py; a capped target's, so an
    AVX2 measurement on an AVX-512 host has 16 registers, like a real AVX2 host). Extra chains cost
    nothing while they fit, so take every register but four (x and y, loop-invariant, plus two
    spare so the compiler never spills): 12 of 16 covers latency x ports up to 12 (every x86
    core), 24 of 32 covers MAX_FMA_IN_FLIGHT with room.
    """
    registers = vector_isa(target).registers if vector_isa(target).vector else target.vector_registers
    return max(1, min(MAX_FMA_IN_FLIGHT + 8, registers - 4))


def render_peak_source(target: Target, accumulators: int | None = None) -> PeakKernel:
    """Render the FMA microbenchmark for ``target`` as standalone C (no runtime header needed).

    Threads: the C creates its own pthreads, each pinned (by thread attribute, so it starts on
    its CPU) to one CPU of ``target.core_cpus``, and releases them together from a spin barrier.
    smelt's runtime pool would also do, but its thread 0 is the caller (a Python thread the pool
    does not pin) and its job hand-off and spin/sleep policy are part of what `smelt bench`
    measures; the peak should be the cores' alone, with every thread pinned and timed by itself.
    """
    flavor, lanes, defs = _flavor(target)
    n = accumulators if accumulators is not None else default_accumulators(target)
    if n < 1:
        raise ValueError(f"accumulators must be >= 1, got {n}")
    regs = "a0" if n == 1 else f"a0..a{n - 1}"
    init = "\n".join(f"    vec_t a{i} = VSET1(1.0f + {i} * 0.125f);" for i in range(n))
    # one statement per accumulator, so the loop body is exactly n independent FMAs
    body = "\n".join(f"        a{i} = VFMA(a{i}, x, y);" for i in range(n))
    # summed and returned so every chain is live; the value itself only serves a finiteness check
    sum_terms = " + ".join(f"a{i}" for i in range(n))
    header = f"""/* smelt peak microbenchmark, template "fma_register_loop" ({flavor}).
 * Parameters: {lanes} fp32 lanes per vector, {n} independent accumulators ({regs}),
 * {n} vector FMAs per iteration = {2 * lanes * n} FLOPs per iteration per thread
 * (2 FLOPs, a multiply and an add, per lane per FMA).
 * Target: {target.arch} {target.isa}, {target.vector_bits}-bit vectors, {target.vector_registers} vector registers.
 * Every accumulator depends only on itself, so the chains overlap and the loop runs at the FMA
 * units' throughput; x and y come from the caller so nothing folds at compile time, and the sum
 * of the accumulators is returned and stored so the loop is not dead code.
 */"""
    lines = [
        header,
        "#ifndef _GNU_SOURCE",
        "#define _GNU_SOURCE",
        "#endif",
        "#include <pthread.h>",
        "#include <sched.h>",
        "#include <stdatomic.h>",
        "#include <stdlib.h>",
        "#include <string.h>",
        "#include <time.h>",
        *defs,
        "",
        f"#define NACC {n}",
        "#define EXPORT __attribute__((visibility(\"default\")))",
        "",
        "static long now_ns(void) {",
        "    struct timespec ts;",
        "    clock_gettime(CLOCK_MONOTONIC, &ts);",
        "    return (long)ts.tv_sec * 1000000000L + ts.tv_nsec;",
        "}",
        "",
        "/* iters iterations of NACC independent FMAs; returns the sum of all lanes of all accumulators. */",
        "static __attribute__((noinline)) float fma_loop(long iters, float xs, float ys) {",
        "    const vec_t x = VSET1(xs), y = VSET1(ys);",
        init,
        "    for (long i = 0; i < iters; ++i) {",
        body,
        "    }",
        f"    vec_t s = {sum_terms};",
        "    float lanes[VLANES];",
        "    VSTORE(lanes, s);",
        "    float total = 0.0f;",
        "    for (int l = 0; l < VLANES; ++l) total += lanes[l];",
        "    return total;",
        "}",
        "",
        "typedef struct {",
        "    long iters;",
        "    float x, y;",
        "    int n_threads;",
        "    atomic_int *ready; /* start barrier: threads that reached the start line */",
        "    long t0, t1;       /* this thread's start and end, CLOCK_MONOTONIC ns */",
        "    float result;",
        "} peak_arg_t;",
        "",
        "static void *peak_thread(void *p) {",
        "    peak_arg_t *a = (peak_arg_t *)p;",
        "    /* spin (yielding, in case a CPU is shared) rather than block on a futex, so the threads",
        "     * leave the start line together instead of one wake-up latency apart */",
        "    atomic_fetch_add(a->ready, 1);",
        "    while (atomic_load(a->ready) < a->n_threads) sched_yield();",
        "    a->t0 = now_ns();",
        "    a->result = fma_loop(a->iters, a->x, a->y);",
        "    a->t1 = now_ns();",
        "    return NULL;",
        "}",
        "",
        "/* Run fma_loop(iters) on n_threads threads, thread i pinned to cpus[i] (-1: not pinned).",
        " * thread_s[i]: thread i's seconds; *wall_s: first start to last end; results[i]: its sum.",
        " * Returns 0, or the number of threads that could not be created (nothing is timed then). */",
        "EXPORT int smelt_peak_run(long iters, int n_threads, const int *cpus, double xs, double ys,",
        "                          double *thread_s, double *wall_s, float *results) {",
        "    if (n_threads < 1) return 1;",
        "    pthread_t *tids = calloc((size_t)n_threads, sizeof(pthread_t));",
        "    peak_arg_t *args = calloc((size_t)n_threads, sizeof(peak_arg_t));",
        "    int *ok = calloc((size_t)n_threads, sizeof(int));",
        "    if (!tids || !args || !ok) { free(tids); free(args); free(ok); return n_threads; }",
        "    atomic_int ready = 0;",
        "    int failed = 0;",
        "    for (int i = 0; i < n_threads; ++i) {",
        "        args[i] = (peak_arg_t){iters, (float)xs, (float)ys, n_threads, &ready, 0, 0, 0.0f};",
        "        pthread_attr_t attr;",
        "        pthread_attr_init(&attr);",
        "#if defined(__linux__)",
        "        /* pinned from its first instruction: the attribute, not a later setaffinity call */",
        "        if (cpus && cpus[i] >= 0) {",
        "            cpu_set_t set;",
        "            CPU_ZERO(&set);",
        "            CPU_SET(cpus[i], &set);",
        "            pthread_attr_setaffinity_np(&attr, sizeof(set), &set);",
        "        }",
        "#endif",
        "        ok[i] = pthread_create(&tids[i], &attr, peak_thread, &args[i]) == 0;",
        "        /* a CPU outside this process's affinity mask fails the create: run unpinned */",
        "        if (!ok[i]) ok[i] = pthread_create(&tids[i], NULL, peak_thread, &args[i]) == 0;",
        "        if (!ok[i]) ++failed;",
        "        pthread_attr_destroy(&attr);",
        "    }",
        "    /* a thread that never started never reaches the start line: release the others */",
        "    if (failed) atomic_fetch_add(&ready, failed);",
        "    for (int i = 0; i < n_threads; ++i)",
        "        if (ok[i]) pthread_join(tids[i], NULL);",
        "    if (!failed) {",
        "        long first = args[0].t0, last = args[0].t1;",
        "        for (int i = 0; i < n_threads; ++i) {",
        "            thread_s[i] = (args[i].t1 - args[i].t0) * 1e-9;",
        "            results[i] = args[i].result;",
        "            if (args[i].t0 < first) first = args[i].t0;",
        "            if (args[i].t1 > last) last = args[i].t1;",
        "        }",
        "        *wall_s = (last - first) * 1e-9;",
        "    }",
        "    free(tids);",
        "    free(args);",
        "    free(ok);",
        "    return failed;",
        "}",
        "",
    ]
    return PeakKernel("\n".join(lines), flavor, lanes, n, n)


# ---------------------------------------------------------------------------------------------
# The result
# ---------------------------------------------------------------------------------------------


@dataclass
class PeakResult:
    """Measured fp32 throughput of this machine. GFLOPS figures are medians unless named _max."""

    isa: str
    vector_bits: int
    cores: int  # threads in the all-threads figure: one per physical core
    kernel: str  # PeakKernel.flavor
    accumulators: int
    flops_per_iter: int  # per thread per loop iteration
    fma_gflops_1t: float
    fma_gflops_all: float
    fma_gflops_1t_max: float
    fma_gflops_all_max: float
    sgemm_gflops: float
    sgemm_gflops_max: float
    sgemm_n: int
    sgemm_threads: int | None  # threads numpy's BLAS used, when it says
    measured_at: str  # ISO 8601, UTC
    target_key: str
    compiler: str
    samples: dict[str, list[float]] = field(default_factory=dict)  # GFLOPS of every run
    # the 1-minute load average when measured: above the core count, other work shared the cores
    # and even the best run may be understated (a model can then show more than 100% of it)
    loadavg: float | None = None

    @property
    def fma_gflops_per_core(self) -> float:
        """All-threads peak per core: lower than the 1-thread one when clocks drop under load."""
        return self.fma_gflops_all_max / max(1, self.cores)

    def peak_gflops(self, threads: int) -> float:
        """FMA peak for a run on ``threads`` threads (at most one per core is useful).

        The best run, not the median: nothing makes a register-only FMA loop faster than the
        hardware, while a busy neighbour (a shared CI runner, another process) only slows it, so
        the median of a noisy machine understates the peak and a model can then show more than
        100% of it. 1 → the 1-thread figure; ``cores`` or more → the all-cores figure (extra
        threads share the same FMA units); in between → the all-cores per-core rate × threads,
        but never below the 1-thread figure.
        """
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        if threads == 1:
            return self.fma_gflops_1t_max
        if threads >= self.cores:  # more cores are never slower than one (a busy all-cores run can be)
            return max(self.fma_gflops_all_max, self.fma_gflops_1t_max)
        return max(self.fma_gflops_1t_max, self.fma_gflops_per_core * threads)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> PeakResult:
        """Inverse of to_dict; ignores keys it does not know (written by a newer smelt)."""
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in known}
        kwargs["samples"] = {k: [float(x) for x in v] for k, v in (kwargs.get("samples") or {}).items()}
        return cls(**kwargs)


# ---------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------


def _load_kernel(target: Target) -> tuple[PeakKernel, ctypes.CDLL]:
    from smelt.codegen.toolchain import build_shared_library

    kernel = render_peak_source(target)
    # sanitize=False: an ASan/UBSan -O1 build (SMELT_SANITIZE=1) would measure the sanitizer
    lib = ctypes.CDLL(str(build_shared_library(kernel.source, name="peak", target=target, sanitize=False)))
    fn = lib.smelt_peak_run
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.c_double,
                   ctypes.c_double, ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ctypes.c_double),
                   ctypes.POINTER(ctypes.c_float)]
    return kernel, lib


def _run(lib: ctypes.CDLL, iters: int, cpus: list[int]) -> tuple[float, list[float]]:
    """One timed run on len(cpus) pinned threads: (wall seconds, per-thread seconds)."""
    n = len(cpus)
    cpu_arr = (ctypes.c_int * n)(*cpus)
    thread_s = (ctypes.c_double * n)()
    results = (ctypes.c_float * n)()
    wall = ctypes.c_double()
    # ctypes releases the GIL for the call, so Python threads do not steal time from the loop
    rc = lib.smelt_peak_run(iters, n, cpu_arr, _X, _Y, thread_s, ctypes.byref(wall), results)
    if rc:
        raise SmeltError(f"the peak benchmark could not start {rc} of its {n} threads")
    if not all(r == r and abs(r) < 1e30 for r in results):  # NaN or inf: the recurrence broke
        raise SmeltError(f"the peak benchmark produced a non-finite result {list(results)}")
    return wall.value, list(thread_s)


def _calibrate(lib: ctypes.CDLL, cpu: int, duration_s: float) -> int:
    """Iterations for one run of about ``duration_s`` on one thread.

    Grows a probe until it takes >= 1/8 of the target (and >= 2 ms) so timer resolution and the
    vector units' clock ramp-up (AVX-512 licence transitions take tens of microseconds) do not
    skew the rate it extrapolates from.
    """
    iters = 1 << 12
    floor = max(0.002, duration_s / 8)
    while True:
        wall, _ = _run(lib, iters, [cpu])
        if wall >= floor or iters >= 1 << 40:
            return max(1, int(iters * duration_s / max(wall, 1e-9)))
        iters *= 2 if wall > floor / 4 else 8


def _blas_threads() -> int | None:
    """Threads numpy's BLAS will use, asked from the library itself; None if it cannot be found.

    numpy has no API for this; its BLAS is whatever shared library the process has mapped
    (OpenBLAS, possibly renamed with a scipy_ prefix and 64_ suffix, or MKL, or BLIS).
    """
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    paths = sorted({line.split()[-1] for line in maps.splitlines()
                    if "/" in line and any(k in line.rsplit("/", 1)[-1].lower() for k in ("blas", "mkl", "blis"))})
    symbols = ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads",
               "openblas_get_num_threads64_", "openblas_get_num_threads", "MKL_Get_Max_Threads",
               "bli_thread_get_num_threads")
    for path in paths:
        try:
            lib = ctypes.CDLL(path)  # already mapped: dlopen hands back the loaded copy
        except OSError:
            continue
        for sym in symbols:
            fn = getattr(lib, sym, None)
            if fn is None:
                continue
            fn.restype, fn.argtypes = ctypes.c_int, []
            n = int(fn())
            if n > 0:
                return n
    return None


def _sgemm(n: int, runs: int) -> tuple[list[float], int | None]:
    """GFLOPS of ``runs`` float32 n×n×n matrix products through numpy (2 n³ FLOPs each)."""
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    c = np.empty((n, n), dtype=np.float32)
    np.matmul(a, b, out=c)  # warm-up: BLAS starts its threads and faults in its buffers here
    out = []
    for _ in range(runs):
        start = time.perf_counter()
        np.matmul(a, b, out=c)
        out.append(2.0 * n**3 / (time.perf_counter() - start) / 1e9)
    return out, _blas_threads()


def measure_peak(*, duration_s: float = 0.08, runs: int = 7, sgemm_n: int | None = None,
                 progress: bool = True, target: Target | None = None,
                 busy_budget_s: float = 20.0) -> PeakResult:
    """Measure now (no cache): FMA peak at 1 thread and at one thread per core, then sgemm.

    ``duration_s`` is one run's length per thread count; the 1-thread and all-threads runs are
    interleaved so a burst of load from elsewhere on a shared machine hits both alike. The
    all-threads rate is every thread's FLOPs over the wall time from the first thread's start to
    the last one's end, so a descheduled thread counts against it.

    The peak is the best run (``PeakResult.peak_gflops``). On a busy machine (load average above
    the core count) ``runs`` rounds rarely include a quiet one, so rounds go on, up to
    ``busy_budget_s`` seconds, until the best has not improved by 1% for 20 rounds (the all-cores
    run needs every core quiet at once, which is rarer). (Zen 4 at
    load 6 on 2 cores: 7 rounds gave 40 GFLOPS a thread, the best of a few hundred 117.5, the
    figure a quiet machine gives.)
    """
    from smelt.codegen.toolchain import find_compiler

    if runs < 1:
        raise ValueError(f"runs must be >= 1, got {runs}")
    target = target or detect()
    cpus = list(target.core_cpus)
    with stage("smelt: compiling the FMA peak microbenchmark", enabled=progress):
        kernel, lib = _load_kernel(target)
        iters = _calibrate(lib, cpus[0], duration_s)
    flops = float(kernel.flops_per_iter) * iters
    one, alls = [], []

    def round_() -> None:
        wall, _ = _run(lib, iters, cpus[:1])
        one.append(flops / wall / 1e9)
        wall, _ = _run(lib, iters, cpus)
        alls.append(flops * len(cpus) / wall / 1e9)

    for _ in track(range(runs), desc="smelt: FMA peak (1 thread, all threads)", total=runs,
                   enabled=progress):
        round_()
    load = _loadavg()
    if load is not None and load > len(cpus) and busy_budget_s > 0:
        with stage(f"smelt: load average {load:.1f} on {len(cpus)} cores: sampling until the best run "
                   f"settles (at most {busy_budget_s:.0f} s)", enabled=progress):
            deadline = time.monotonic() + busy_budget_s
            best, since = (max(one), max(alls)), 0
            while since < 20 and time.monotonic() < deadline:
                round_()
                now = (max(one), max(alls))
                improved = now[0] > 1.01 * best[0] or now[1] > 1.01 * best[1]
                best, since = (now, 0) if improved else (best, since + 1)
    # 2048 saturates BLAS on a desktop or small server; wide machines need a bigger product
    n = sgemm_n or (2048 if len(cpus) <= 16 else 4096)
    with stage(f"smelt: sgemm {n}x{n} through numpy", enabled=progress):
        sg, blas_threads = _sgemm(n, runs)
    return PeakResult(
        isa=target.isa,
        vector_bits=target.vector_bits,
        cores=len(cpus),
        kernel=kernel.flavor,
        accumulators=kernel.accumulators,
        flops_per_iter=kernel.flops_per_iter,
        fma_gflops_1t=statistics.median(one),
        fma_gflops_all=statistics.median(alls),
        fma_gflops_1t_max=max(one),
        fma_gflops_all_max=max(alls),
        sgemm_gflops=statistics.median(sg),
        sgemm_gflops_max=max(sg),
        sgemm_n=n,
        sgemm_threads=blas_threads,
        measured_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        target_key=target.key(),
        compiler=find_compiler().identity,
        samples={"fma_1t": one, "fma_all": alls, "sgemm": sg},
        loadavg=_loadavg(),
    )


def _loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def busy_note(result: PeakResult) -> str:
    """A warning when the machine was busy while the peak was measured, else ""."""
    if result.loadavg is not None and result.loadavg > result.cores:
        return (f"measured at load average {result.loadavg:.1f} on {result.cores} cores: other work shared them, "
                f"the peak may be understated; measure again on a quiet machine (`smelt info --peak`)")
    return ""


# ---------------------------------------------------------------------------------------------
# Cache
# ---------------------------------------------------------------------------------------------


def peak_cache_path(target: Target | None = None) -> Path:
    """The JSON file holding this machine's figure.

    Keyed by target.key() (ISA, features, caches), the pinned CPUs (target.key() leaves out the
    core count, and a taskset-restricted process has fewer cores: a different all-threads peak)
    and the compiler that built the loop.
    """
    from smelt.codegen.toolchain import artifact_key, cache_dir, find_compiler

    target = target or detect()
    key = artifact_key(f"peak-v{CACHE_VERSION}", target.key(), ",".join(map(str, target.core_cpus)),
                       find_compiler().identity)
    return cache_dir() / "peak" / f"{key[:32]}.json"


def cached_peak(target: Target | None = None) -> PeakResult | None:
    """The cached figure for this machine, or None (nothing measured yet, or unreadable)."""
    path = peak_cache_path(target)
    try:
        data = json.loads(path.read_text())
        if data.get("version") != CACHE_VERSION:
            return None
        return PeakResult.from_dict(data["result"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def peak_target(isa: str | None = None, target: Target | None = None) -> Target:
    """The target a peak is measured for: ``target`` (default: this host) held to ``isa``
    (``Target.narrowed``; None: its own). Each ISA's figure is cached apart (its key differs)."""
    return (target or detect()).narrowed(isa)


def load_or_measure_peak(measure: bool | None = None, progress: bool = True, *,
                         duration_s: float = 0.08, runs: int = 7, sgemm_n: int | None = None,
                         target: Target | None = None, isa: str | None = None) -> PeakResult:
    """This machine's peak at ``isa`` (None: its own): from the cache, measured (and cached) when
    there is none.

    ``measure``: None = cached figure if any, else measure; True = measure again and overwrite
    the cache (``smelt info --peak``); False = never measure (raise SmeltError if nothing is
    cached; use ``cached_peak()`` for a None instead). Measuring holds a lock in the cache
    directory: two processes measuring at once would each halve the other's figure, so the second
    waits and, unless forced, takes the first one's result.
    """
    from smelt.codegen.toolchain import atomic_write, file_lock

    target = peak_target(isa, target)
    if not measure:
        hit = cached_peak(target)
        if hit is not None:
            return hit
        if measure is False:
            flag = f" --isa {target.isa}" if target.native_isa else ""
            raise SmeltError(f"no measured fp32 {target.isa} peak for this machine yet; run `smelt info --peak{flag}`")
    path = peak_cache_path(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(path.with_suffix(".lock")):
        if not measure:
            hit = cached_peak(target)  # another process measured while we waited for the lock
            if hit is not None:
                return hit
        result = measure_peak(duration_s=duration_s, runs=runs, sgemm_n=sgemm_n, progress=progress,
                              target=target)
        payload = {"version": CACHE_VERSION, "result": result.to_dict()}
        atomic_write(path, (json.dumps(payload, indent=1) + "\n").encode())
    return result


def peak_or_reason(measure: bool | None = None, progress: bool = True,
                   isa: str | None = None) -> tuple[PeakResult | None, str]:
    """``(result, "measured")``, or ``(None, why not)``: for reports, where a missing share-of-peak
    column is better than no report at all. ``isa``: the peak of that ISA (None: the host's)."""
    try:
        return load_or_measure_peak(measure=measure, progress=progress, isa=isa), "measured"
    except Exception as exc:  # no compiler, a sandbox refusing pthreads, an unreadable cache ...
        return None, f"no peak measurement: {exc}"


def format_peak(result: PeakResult) -> str:
    """A few lines for `smelt info --peak` (labels 12 wide, like the rest of `smelt info`)."""
    n = result.cores
    share = result.sgemm_gflops / result.fma_gflops_all_max if result.fma_gflops_all_max else 0.0
    blas_threads = f", {result.sgemm_threads} BLAS threads" if result.sgemm_threads else ""
    runs = len(result.samples.get("fma_1t", []))
    all_label = f"{n} thread{'s' if n != 1 else ''}:"
    return "\n".join([
        f"fp32 peak:  {result.isa} ({result.vector_bits}-bit), measured {result.measured_at.split('T')[0]}"
        + (f", best of {runs} runs (the peak) and median" if runs else ""),
        f"  {'1 thread:':<12}{result.fma_gflops_1t_max:7.1f} GFLOPS FMA (median {result.fma_gflops_1t:.1f})",
        f"  {all_label:<12}{result.fma_gflops_all_max:7.1f} GFLOPS FMA (median {result.fma_gflops_all:.1f}) "
        f"= {result.fma_gflops_per_core:.1f} per core",
        f"  {'sgemm:':<12}{result.sgemm_gflops:7.1f} GFLOPS (numpy BLAS at its own ISA, n={result.sgemm_n}{blas_threads}) "
        f"= {share:.0%} of the {n}-thread FMA peak",
        f"  {'FMA loop:':<12}{result.kernel}, {result.accumulators} register accumulators, "
        f"{result.flops_per_iter} FLOPs per iteration per thread",
        *([f"  warning:    {busy_note(result)}"] if busy_note(result) else []),
    ])
