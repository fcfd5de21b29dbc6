"""The fp32 peak microbenchmark (smelt/bench/peak.py): rendering, a short real run, the cache."""

from __future__ import annotations

import dataclasses
import json
import platform
import re
import shutil
import subprocess

import pytest

from smelt.bench import peak
from smelt.bench.peak import PeakResult, format_peak, load_or_measure_peak, render_peak_source
from smelt.errors import SmeltError
from smelt.target import Target, detect


def _target(**kw) -> Target:
    base = dict(arch="x86_64", isa="avx512", vector_bits=512, fma=True, flags=("avx512f",),
                physical_cores=4, core_cpus=(0, 1, 2, 3), l1d_bytes=48 << 10, l2_bytes=2 << 20,
                l3_bytes=32 << 20, model_name="test", vector_registers=32)
    base.update(kw)
    return Target(**base)


AVX512 = _target()
AVX2 = _target(isa="avx2", vector_bits=256, vector_registers=16, flags=("avx2", "fma"))
NEON = _target(arch="aarch64", isa="neon", vector_bits=128, vector_registers=32, flags=())
SSE_NO_FMA = _target(isa="sse", vector_bits=128, vector_registers=16, fma=False, flags=("sse4_2",))
# 16 registers so that, compiled on an x86 host (where this test builds it), nothing spills
SCALAR = _target(arch="riscv64", isa="scalar", vector_bits=32, vector_registers=16, fma=False, flags=())

HOST_X86 = platform.machine().lower() in ("x86_64", "amd64")
HAVE_CC = any(shutil.which(c) for c in ("cc", "gcc", "clang"))


def _fma_statements(source: str) -> int:
    return len(re.findall(r"^\s+a\d+ = VFMA\(a\d+, x, y\);$", source, flags=re.M))


@pytest.mark.parametrize("target, flavor, lanes, accs, intrinsic", [
    (AVX512, "avx512-fma", 16, 24, "_mm512_fmadd_ps"),
    (AVX2, "avx2-fma", 8, 12, "_mm256_fmadd_ps"),
    (NEON, "neon-fma", 4, 24, "vfmaq_f32"),
    (SSE_NO_FMA, "generic-128", 4, 12, "vector_size(16)"),
    (SCALAR, "generic-32", 1, 12, "typedef float vec_t;"),
])
def test_source_renders_per_isa(target, flavor, lanes, accs, intrinsic):
    k = render_peak_source(target)
    assert (k.flavor, k.lanes, k.accumulators, k.fmas_per_iter) == (flavor, lanes, accs, accs)
    assert k.flops_per_iter == 2 * lanes * accs  # a multiply and an add per lane per FMA
    assert intrinsic in k.source
    assert _fma_statements(k.source) == accs
    # the header names the template and its parameters
    head = k.source.split("*/", 1)[0]
    assert "fma_register_loop" in head and flavor in head
    assert f"{accs} independent accumulators" in head and f"{k.flops_per_iter} FLOPs per iteration" in head
    if target.arch != "x86_64":
        assert "immintrin" not in k.source
    assert "smelt_peak_run" in k.source


def test_accumulators_leave_registers_for_x_and_y():
    for t in (AVX512, AVX2, NEON, SCALAR):
        assert peak.default_accumulators(t) + 2 <= t.vector_registers
    assert render_peak_source(AVX512, accumulators=8).flops_per_iter == 2 * 16 * 8
    with pytest.raises(ValueError):
        render_peak_source(AVX512, accumulators=0)


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> PeakResult:
    """One short real measurement, shared by the tests below (its own cache dir for the .so)."""
    if not HAVE_CC:
        pytest.skip("no C compiler")
    mp = pytest.MonkeyPatch()
    mp.setenv("SMELT_CACHE_DIR", str(tmp_path_factory.mktemp("smelt-peak-cache")))
    try:
        return peak.measure_peak(duration_s=0.02, runs=3, sgemm_n=256, progress=False, busy_budget_s=0)
    finally:
        mp.undo()


def test_real_measurement_is_plausible(measured):
    t = detect()
    r = measured
    assert (r.isa, r.vector_bits, r.cores) == (t.isa, t.vector_bits, t.physical_cores)
    assert r.target_key == t.key()
    assert len(r.samples["fma_1t"]) == len(r.samples["fma_all"]) == len(r.samples["sgemm"]) == 3
    assert 0 < r.fma_gflops_1t <= r.fma_gflops_1t_max
    assert 0 < r.fma_gflops_all <= r.fma_gflops_all_max
    assert 0 < r.sgemm_gflops <= r.sgemm_gflops_max
    # loose bounds only: the machine is shared. A core does at most ~4 FMA pipes x 6 GHz.
    lanes = max(1, r.vector_bits // 32)
    assert r.fma_gflops_1t < 2 * lanes * 4 * 6.0
    assert r.fma_gflops_all >= 0.5 * r.fma_gflops_1t
    assert r.fma_gflops_all < r.cores * 2 * lanes * 4 * 6.0
    # a BLAS cannot beat the FMA units (their best run: the peak; the machine is shared)
    assert r.sgemm_gflops < 2 * r.fma_gflops_all_max
    assert r.measured_at[:4].isdigit() and "T" in r.measured_at


@pytest.mark.skipif(not (HOST_X86 and HAVE_CC), reason="needs an x86-64 host and a C compiler")
@pytest.mark.parametrize("target", [AVX2, SSE_NO_FMA, SCALAR], ids=["avx2", "sse", "scalar"])
def test_other_flavors_build_and_run_on_x86(target, tmp_path, monkeypatch):
    if target is AVX2 and "avx2" not in detect().flags:
        pytest.skip("host has no AVX2")
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    _, lib = peak._load_kernel(target)
    wall, per_thread = peak._run(lib, 1000, [-1])
    assert wall > 0 and len(per_thread) == 1


@pytest.mark.skipif(not (HOST_X86 and HAVE_CC and shutil.which("objdump")),
                    reason="needs an x86-64 host, a C compiler and objdump")
def test_host_loop_is_fmas_on_registers(tmp_path, monkeypatch):
    """The compiled loop is exactly the rendered FMAs on registers: no loads, stores or spills."""
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    from smelt.codegen.toolchain import build_shared_library

    target = detect()
    kernel = render_peak_source(target)
    if not kernel.flavor.endswith("-fma"):
        pytest.skip(f"host flavor {kernel.flavor} has no FMA intrinsic to look for")
    so = build_shared_library(kernel.source, name="peak", target=target, sanitize=False)
    dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(so)], capture_output=True,
                         text=True, check=True).stdout
    body = dis.split("<fma_loop>:", 1)[1].split("\n\n", 1)[0]
    insns = []  # (address, mnemonic, operands)
    for line in body.splitlines():
        m = re.match(r"\s*([0-9a-f]+):\s+(\S+)\s*(.*)", line)
        if m:
            insns.append((int(m.group(1), 16), m.group(2), m.group(3)))
    # the loop: the backward conditional jump, and everything from its target to it
    back = [(i, int(ops.split()[0], 16)) for i, (addr, mn, ops) in enumerate(insns)
            if mn.startswith("j") and mn != "jmp" and ops and int(ops.split()[0], 16) < addr]
    assert len(back) == 1, back
    end, start_addr = back[0]
    loop = [ins for ins in insns[: end + 1] if ins[0] >= start_addr]
    fmas = [ins for ins in loop if re.match(r"vfmadd\d{3}ps", ins[1])]
    reg = "zmm" if kernel.lanes == 16 else "ymm"
    assert len(fmas) == kernel.fmas_per_iter
    assert all(ops.count(f"%{reg}") == 3 for _, _, ops in fmas), fmas
    assert not [ins for ins in loop if "(" in ins[2]], "memory operand (spill?) in the FMA loop"
    assert len(loop) <= kernel.fmas_per_iter + 4  # plus counter, compare, branch (and alignment)


def _fake(**kw) -> PeakResult:
    base = dict(isa="avx512", vector_bits=512, cores=4, kernel="avx512-fma", accumulators=24,
                flops_per_iter=768, fma_gflops_1t=100.0, fma_gflops_all=360.0, fma_gflops_1t_max=101.0,
                fma_gflops_all_max=365.0, sgemm_gflops=270.0, sgemm_gflops_max=280.0, sgemm_n=2048,
                sgemm_threads=4, measured_at="2025-01-02T03:04:05+00:00", target_key="k", compiler="cc",
                samples={"fma_1t": [100.0, 101.0], "fma_all": [360.0, 365.0], "sgemm": [270.0, 280.0]})
    base.update(kw)
    return PeakResult(**base)


def test_peak_gflops_per_thread_count():
    """The peak is the best run (interference only slows a register loop), not the median."""
    r = _fake()
    assert r.peak_gflops(1) == 101.0
    assert r.peak_gflops(2) == pytest.approx(182.5)  # all-cores per-core rate (91.25) x 2
    assert r.peak_gflops(3) == pytest.approx(273.75)
    assert r.peak_gflops(4) == 365.0
    assert r.peak_gflops(64) == 365.0  # more threads than cores share the same FMA units
    with pytest.raises(ValueError):
        r.peak_gflops(0)
    # badly throttled or shared: 2 threads' peak is never quoted below 1 thread's
    assert _fake(fma_gflops_all_max=120.0).peak_gflops(2) == 101.0
    assert _fake(fma_gflops_all_max=90.0).peak_gflops(4) == 101.0


def test_dict_round_trip():
    r = _fake()
    d = json.loads(json.dumps(r.to_dict()))
    assert PeakResult.from_dict(d) == r
    d["from_a_newer_smelt"] = 1
    assert PeakResult.from_dict(d) == r
    assert PeakResult.from_dict(_fake(sgemm_threads=None).to_dict()).sgemm_threads is None


def test_format_peak():
    text = format_peak(_fake())
    assert "1 thread:" in text and "4 threads:" in text
    assert "101.0 GFLOPS FMA (median 100.0)" in text and "365.0 GFLOPS FMA (median 360.0)" in text
    assert "91.2 per core" in text and "avx512 (512-bit)" in text
    assert "270.0 GFLOPS" in text and "74% of the 4-thread FMA peak" in text
    assert "2025-01-02" in text


def test_cache_round_trip(measured, tmp_path, monkeypatch):
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    calls = []

    def fake_measure(**kw):
        calls.append(kw)
        return dataclasses.replace(measured, measured_at=f"2025-01-0{len(calls)}T00:00:00+00:00")

    monkeypatch.setattr(peak, "measure_peak", fake_measure)
    assert peak.cached_peak() is None
    with pytest.raises(SmeltError, match="smelt info --peak"):
        load_or_measure_peak(measure=False)
    first = load_or_measure_peak(progress=False, duration_s=0.01)
    assert len(calls) == 1 and calls[0]["duration_s"] == 0.01
    path = peak.peak_cache_path()
    assert path.parent.parent == tmp_path and path.exists()
    assert load_or_measure_peak(progress=False) == first  # from the cache: not measured again
    assert load_or_measure_peak(measure=False) == first
    assert len(calls) == 1
    forced = load_or_measure_peak(measure=True, progress=False)  # re-measures, rewrites the cache
    assert len(calls) == 2 and forced.measured_at != first.measured_at
    assert peak.cached_peak() == forced
    path.write_text("{not json")  # a damaged cache file is measured over, not an error
    assert load_or_measure_peak(progress=False) is not None and len(calls) == 3
    assert json.loads(path.read_text())["result"]["measured_at"] == "2025-01-03T00:00:00+00:00"


def test_cache_key_covers_cores_and_target(tmp_path, monkeypatch):
    if not HAVE_CC:
        pytest.skip("no C compiler")  # the key includes the compiler's identity
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    t = detect()
    paths = {peak.peak_cache_path(t), peak.peak_cache_path(dataclasses.replace(t, core_cpus=(99,))),
             peak.peak_cache_path(dataclasses.replace(t, isa="other"))}
    assert len(paths) == 3


def test_accumulators_cover_fma_latency_times_ports():
    """The chain count comes from the ISA description's registers and covers latency x ports
    (MAX_FMA_IN_FLIGHT on 32 registers; every x86 core's 2 ports x 5 cycles on 16), with x, y and
    two spare registers, so the loop neither starves a port nor spills."""
    for target, registers in ((AVX512, 32), (AVX2, 16)):
        n = peak.default_accumulators(target)
        assert n + 4 <= registers
        assert n >= (peak.MAX_FMA_IN_FLIGHT if registers == 32 else 2 * 5)
    # an AVX2 cap on an AVX-512 host measures with AVX2's 16 registers, like a real AVX2 host
    capped = dataclasses.replace(AVX512, flags=("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq"))
    assert peak.default_accumulators(capped.narrowed("avx2")) == peak.default_accumulators(AVX2) == 12
    assert peak.default_accumulators(capped) == 24


def test_peak_is_stored_per_isa(tmp_path, monkeypatch):
    """`smelt info --peak --isa avx2` measures and caches the AVX2 figure apart from the host's:
    the measurement gets the capped target and each ISA has its own cache file."""
    if not HAVE_CC:
        pytest.skip("no C compiler")  # the key includes the compiler's identity
    host = detect()
    caps = host.isa_caps()
    if len(caps) < 2:
        pytest.skip("the host runs one ISA only")
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    seen = []

    def fake_measure(*, target, **kw):
        seen.append(target.isa)
        return _fake(isa=target.isa, vector_bits=target.vector_bits, target_key=target.key(),
                     fma_gflops_1t_max=10.0 * len(seen))

    monkeypatch.setattr(peak, "measure_peak", fake_measure)
    low = caps[1]
    native = load_or_measure_peak(progress=False)
    capped = load_or_measure_peak(progress=False, isa=low)
    assert seen == [host.isa, host.narrowed(low).isa]  # "avx2_vnni" runs ISA "avx2"
    assert (native.isa, capped.isa) == (host.isa, host.narrowed(low).isa)
    assert peak.peak_cache_path(host) != peak.peak_cache_path(host.narrowed(low))
    # from the cache, each its own figure
    assert load_or_measure_peak(measure=False, isa=low).peak_gflops(1) == 20.0
    assert load_or_measure_peak(measure=False).peak_gflops(1) == 10.0
    assert len(seen) == 2
    with pytest.raises(ValueError, match="cannot run"):
        load_or_measure_peak(measure=False, isa="avx512", target=host.narrowed(low))


def test_a_peak_measured_on_a_busy_machine_says_so():
    assert "warning" not in format_peak(_fake(loadavg=1.0))
    assert "warning" not in format_peak(_fake(loadavg=None))  # older cache files have none
    text = format_peak(_fake(loadavg=7.5))  # 4 cores
    assert "load average 7.5 on 4 cores" in text and "understated" in text


@pytest.mark.skipif(not HAVE_CC, reason="needs a C compiler")
def test_a_busy_machine_samples_until_the_best_run_settles(tmp_path, monkeypatch):
    """Above the core count's load, rounds go on past ``runs`` (a quiet one sets the peak), at
    least 20 without a 1% improvement, within the budget; the load is recorded and reported."""
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(peak, "_loadavg", lambda: 99.0)
    r = peak.measure_peak(duration_s=0.002, runs=2, sgemm_n=64, progress=False, busy_budget_s=5.0)
    assert 2 + 20 <= len(r.samples["fma_1t"]) == len(r.samples["fma_all"])
    assert len(r.samples["sgemm"]) == 2
    assert r.loadavg == 99.0 and "understated" in peak.busy_note(r)
    quiet = dataclasses.replace(r, loadavg=0.5)
    assert peak.busy_note(quiet) == ""
