"""The machine smelt compiles for: ISA, vector width, physical cores and cache sizes.

Detected once per process from /proc/cpuinfo and /sys (Linux); templates read this description
rather than hard-coding a machine, so the same template serves AVX-512 and AVX2 hosts.
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Target:
    arch: str  # "x86_64", "aarch64", ...
    isa: str  # best vector ISA: "avx512", "avx2", "sse", "neon", "scalar"
    vector_bits: int
    fma: bool
    flags: tuple[str, ...]  # notable CPU features (avx512f, avx512_vnni, amx_tile, ...)
    physical_cores: int
    core_cpus: tuple[int, ...]  # one logical CPU id per physical core, for pinning
    l1d_bytes: int
    l2_bytes: int
    l3_bytes: int
    model_name: str = ""
    vector_registers: int = field(default=16)

    @property
    def vector_floats(self) -> int:
        return self.vector_bits // 32

    def describe(self) -> str:
        return (
            f"{self.arch} {self.isa} ({self.vector_bits}-bit vectors, {self.vector_registers} registers"
            f"{', FMA' if self.fma else ''}), {self.physical_cores} physical cores, "
            f"L1d {self.l1d_bytes // 1024} KiB, L2 {self.l2_bytes // 1024} KiB, "
            f"L3 {self.l3_bytes // 1024} KiB per core group"
        )

    def key(self) -> str:
        """What the generated code depends on: part of every cache key."""
        return f"{self.arch}|{self.isa}|{','.join(self.flags)}|{self.l1d_bytes}|{self.l2_bytes}|{self.l3_bytes}"

    def to_dict(self) -> dict:
        return asdict(self)


_NOTABLE = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq",
            "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")


def _cpuinfo() -> tuple[str, set[str]]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor(), set()
    model, flags = "", set()
    for line in text.splitlines():
        key, _, val = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = val.strip()
        elif key in ("flags", "Features") and not flags:
            flags = set(val.split())
    return model, flags


def _cache_size(level: int, kind: tuple[str, ...]) -> int:
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for idx in sorted(base.glob("index*")):
        try:
            if int((idx / "level").read_text()) != level:
                continue
            if (idx / "type").read_text().strip() not in kind:
                continue
            text = (idx / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        mult = {"K": 1024, "M": 1024 * 1024, "G": 1024**3}.get(text[-1], 1)
        return int(text.rstrip("KMG")) * mult
    return {1: 32 * 1024, 2: 1024 * 1024, 3: 8 * 1024 * 1024}[level]


def _physical_core_cpus() -> tuple[int, ...]:
    """One allowed logical CPU per physical core (SMT siblings skipped)."""
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        allowed = list(range(os.cpu_count() or 1))
    seen: set[tuple[str, str]] = set()
    cpus = []
    for cpu in allowed:
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            key = ((topo / "physical_package_id").read_text().strip(), (topo / "core_id").read_text().strip())
        except OSError:
            key = (str(cpu), "")
        if key not in seen:
            seen.add(key)
            cpus.append(cpu)
    return tuple(cpus) or (0,)


@functools.lru_cache(maxsize=1)
def detect() -> Target:
    """Describe the host CPU (cached for the process)."""
    arch = platform.machine().lower()
    model, flags = _cpuinfo()
    if arch in ("x86_64", "amd64"):
        arch = "x86_64"
        if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
            isa, bits, regs = "avx512", 512, 32
        elif "avx2" in flags:
            isa, bits, regs = "avx2", 256, 16
        else:
            isa, bits, regs = "sse", 128, 16
        fma = "fma" in flags
    elif arch in ("aarch64", "arm64"):
        arch, isa, bits, regs, fma = "aarch64", "neon", 128, 32, True
    else:
        isa, bits, regs, fma = "scalar", 32, 16, False
    cores = _physical_core_cpus()
    return Target(
        arch=arch,
        isa=isa,
        vector_bits=bits,
        fma=fma,
        flags=tuple(f for f in _NOTABLE if f in flags),
        physical_cores=len(cores),
        core_cpus=cores,
        l1d_bytes=_cache_size(1, ("Data", "Unified")),
        l2_bytes=_cache_size(2, ("Unified", "Data")),
        l3_bytes=_cache_size(3, ("Unified", "Data")),
        model_name=model,
        vector_registers=regs,
    )
