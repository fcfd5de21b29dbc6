"""The machine smelt compiles for: ISA, vector width, physical cores and cache sizes.

Detected once per process from /proc/cpuinfo and /sys (Linux); templates read this description
rather than hard-coding a machine, so the same template serves AVX-512 and AVX2 hosts.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import platform
from collections.abc import Iterable
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
    # /proc/cpuinfo "cpu family" and "model" (x86): tell a generation apart when the model name
    # is terse (a cloud "AMD EPYC" is Zen 4 at family 25 model 17, Zen 3 at family 25 model 1)
    cpu_family: int = 0
    cpu_model: int = 0
    # the host's own ISA when this target is capped below it (``narrowed``); "" when not capped
    native_isa: str = ""
    # the ``isa=`` cap this target was narrowed to ("avx2_vnni" is ISA "avx2" with AVX-VNNI); ""
    cap: str = ""

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

    @property
    def cpu(self) -> str:
        """The CPU model as /proc/cpuinfo names it, with family/model where that name is too terse
        to tell a generation apart ("AMD EPYC" covers Zen 1 to Zen 5)."""
        name = self.model_name or "unknown CPU"
        if self.cpu_family and len(name.split()) <= 3:
            name += f" (family {self.cpu_family} model {self.cpu_model})"
        return name

    def isa_caps(self) -> tuple[str, ...]:
        """The ``isa=`` caps this host can run, widest first (see ``narrowed``)."""
        return tuple(name for name, cap in _CAPS.items()
                     if name == PORTABLE_ISA or (self.arch == "x86_64" and set(cap.requires) <= set(self.flags)))

    def narrowed(self, isa: str | None) -> Target:
        """This target held to at most ``isa`` (like oneDNN's ONEDNN_MAX_CPU_ISA): "avx512",
        "avx2_vnni" (AVX2 with AVX-VNNI's integer dot products), "avx2" (without them, also on a
        host that has them), or "scalar" (smelt's portable C, compiled without AVX). None or
        "native": unchanged.

        The narrowed target drops the wider ISA's feature flags, so its ``key()`` differs (no
        cached build is shared across caps) and ``compiler_flags()`` keeps gcc from using them
        in code smelt did not write with intrinsics. An ISA the host cannot run is a ValueError
        naming the requested and the host's ISA."""
        if isa is None or isa == NATIVE_ISA:
            return self
        check_isa_choice(isa)
        if isa not in self.isa_caps():
            raise ValueError(f"ISA {isa!r} was requested but this host cannot run it: {self.cpu} "
                             f"runs {self.isa} (it can be capped to {', '.join(self.isa_caps())})")
        cap = _CAPS[isa]
        family = cap.isa or isa
        # the host's own ISA keeps its flags but for those the cap drops (an AVX2 host with
        # AVX-VNNI under "avx2"); a narrower ISA keeps only its own
        flags = tuple(f for f in self.flags if f not in cap.drops and (family == self.isa or f in cap.keeps))
        if family == self.isa and flags == self.flags:
            return self
        return dataclasses.replace(self, isa=family, vector_bits=cap.vector_bits, vector_registers=cap.vector_registers,
                                   fma=self.fma and "fma" in cap.keeps, flags=flags,
                                   native_isa=self.native_isa or self.isa, cap=isa)

    def compiler_flags(self) -> tuple[str, ...]:
        """gcc flags (after -march=native) that keep the compiler's own vectorization within a
        capped ISA: without them gcc would auto-vectorize plain loops with the host's widest."""
        if self.arch != "x86_64" or not self.native_isa:
            return ()
        cap = self.cap or self.isa
        return _CAPS[cap].gcc_flags if cap in _CAPS else ()


# the ISA caps a user can ask for (``Target.narrowed``), widest first: the features a host needs
# for each, its vector width and architectural vector registers. They are the ISAs smelt has
# descriptions for (codegen/kernels/isa.py); "scalar" is the portable C path.
PORTABLE_ISA = "scalar"
NATIVE_ISA = "native"  # no cap: the host's widest


@dataclass(frozen=True)
class _Cap:
    requires: tuple[str, ...]  # /proc/cpuinfo flags a host needs to run it
    keeps: tuple[str, ...]  # the notable flags a target capped here keeps
    vector_bits: int
    vector_registers: int
    gcc_flags: tuple[str, ...]  # what stops gcc going past it after -march=native
    isa: str = ""  # the vector ISA the code is written for (codegen/kernels/isa.py); "" = the cap's name
    drops: tuple[str, ...] = ()  # flags it removes even on a host whose own ISA is the cap's


_AVX2_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c")
_CAPS: dict[str, _Cap] = {
    "avx512": _Cap(("avx512f", "avx512bw", "avx512vl", "avx512dq"), (), 512, 32, ()),
    # AVX2 with AVX-VNNI's ymm vpdpbusd/vpdpwssd for the integer kernels (Alder Lake and later
    # Intel clients, Zen 5): oneDNN's AVX2_VNNI. The fp32 code is the same as "avx2"'s.
    # -mno-avx512f disables every AVX-512 extension (and the 16 extra registers)
    "avx2_vnni": _Cap(("avx2", "avx_vnni"), (*_AVX2_FLAGS, "avx_vnni"), 256, 16, ("-mno-avx512f",), isa="avx2"),
    # plain AVX2 (Haswell to Zen 4 without AVX-512): integer products through vpmaddubsw/vpmaddwd,
    # like oneDNN's AVX2, also on a host that has AVX-VNNI, so that path is tested and measured
    # there too
    "avx2": _Cap(("avx2",), _AVX2_FLAGS, 256, 16, ("-mno-avx512f", "-mno-avxvnni"), drops=("avx_vnni",)),
    # -mno-avx: everything from AVX up (AVX2, FMA, AVX-512); gcc still vectorizes the portable
    # C's plain loops at the baseline's 128 bits (SSE2), with mul and add
    PORTABLE_ISA: _Cap((), ("sse4_2",), 128, 16, ("-mno-avx",)),
}
ISA_CAPS: tuple[str, ...] = tuple(_CAPS)
ISA_CHOICES: tuple[str, ...] = (*ISA_CAPS, NATIVE_ISA)


# What holds a peer to a cap (``smelt bench --isa``): oneDNN (PyTorch's convolutions, OpenVINO's
# CPU plugin) reads ONEDNN_MAX_CPU_ISA (older builds DNNL_MAX_CPU_ISA), PyTorch's ATen kernels
# ATEN_CPU_CAPABILITY, MKL MKL_ENABLE_INSTRUCTIONS. Each is read once, when the library first
# dispatches, so they must be in the environment before the peer is imported.
_PEER_ENV: dict[str, dict[str, str]] = {
    "avx512": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE", "ATEN_CPU_CAPABILITY": "avx512",
               "MKL_ENABLE_INSTRUCTIONS": "AVX512"},
    "avx2_vnni": {"ONEDNN_MAX_CPU_ISA": "AVX2_VNNI", "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    PORTABLE_ISA: {"ONEDNN_MAX_CPU_ISA": "SSE41", "ATEN_CPU_CAPABILITY": "default",
                   "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
}


def peer_isa_environment(isa: str) -> dict[str, str]:
    """The environment variables that hold oneDNN, PyTorch and MKL to the cap ``isa``."""
    check_isa_choice(isa)
    env = dict(_PEER_ENV.get(isa, {}))
    if "ONEDNN_MAX_CPU_ISA" in env:
        env["DNNL_MAX_CPU_ISA"] = env["ONEDNN_MAX_CPU_ISA"]
    return env


def isa_named_in(names: str | Iterable[str]) -> str | None:
    """The widest of smelt's ISA names that a peer's own kernel or capability names mention
    ("brgconv_avx512_f32", "jit:avx2", PyTorch's "AVX2" / "DEFAULT"): what the peer ran. None when
    they name none (generic "jit_uni" or "ref" kernels say nothing)."""
    text = (names if isinstance(names, str) else " ".join(names)).lower()
    for name in _CAPS:
        if name != PORTABLE_ISA and name in text:
            return name
    return PORTABLE_ISA if "default" in text.split() else None


def check_isa_choice(name: str | None, what: str = "isa") -> None:
    """ValueError unless ``name`` is None or one of ``ISA_CHOICES``."""
    if name is not None and name not in ISA_CHOICES:
        raise ValueError(f"{what} must be one of {', '.join(ISA_CHOICES)} (given {name!r})")


_NOTABLE = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq",
            "avx512_vnni", "avx512vbmi", "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "amx_int8",
            "amx_bf16")


def _cpuinfo() -> tuple[str, set[str], int, int]:
    """Model name, feature flags, family and model number of the first CPU in /proc/cpuinfo."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor(), set(), 0, 0
    model, flags, numbers = "", set(), {}
    for line in text.splitlines():
        key, _, val = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = val.strip()
        elif key in ("flags", "Features") and not flags:
            flags = set(val.split())
        elif key in ("cpu family", "model") and key not in numbers and val.strip().isdigit():
            numbers[key] = int(val)
    return model, flags, numbers.get("cpu family", 0), numbers.get("model", 0)


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
    model, flags, family, model_number = _cpuinfo()
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
        cpu_family=family,
        cpu_model=model_number,
    )
