"""Build generated C with the system compiler, cached by content, written atomically.

Cache key: sha256(source ‖ compiler identity ‖ flags ‖ target). The library is compiled to a
temporary file in the cache directory, its checksum written (``smelt.cache``), and renamed into
place while holding an exclusive file lock, so concurrent processes compiling the same model all
succeed and leave one intact file. A cached library is hashed before its path is handed out (it
is never dlopened unverified); one that fails is deleted and rebuilt. The generated source is
kept beside it only under SMELT_DEBUG=1 or inside ``keeping_sources()``.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from smelt import cache, settings
from smelt.cache import Pin, atomic_write, file_lock
from smelt.codegen.kernels.isa import VEC_HEADER
from smelt.errors import CompileError, CompilerNotFoundError
from smelt.target import Target, detect

RUNTIME_HEADER = Path(__file__).resolve().parent.parent / "runtime" / "csrc" / "smelt_rt.h"


def debug_enabled() -> bool:
    return settings.debug()


def sanitize_enabled() -> bool:
    return settings.sanitize()


def cache_dir() -> Path:
    """Where compiled artifacts live: $SMELT_CACHE_DIR, else the user cache directory."""
    return settings.cache_dir()


_keep_sources = 0


@contextmanager
def keeping_sources() -> Iterator[None]:
    """Keep the generated C of libraries built or loaded inside (``smelt compile --emit-c``)."""
    global _keep_sources
    _keep_sources += 1
    try:
        yield
    finally:
        _keep_sources -= 1


def keep_sources() -> bool:
    """Whether generated C stays beside its library: SMELT_DEBUG=1 or ``keeping_sources()``."""
    return _keep_sources > 0 or settings.debug()


@dataclass(frozen=True)
class Compiler:
    path: str
    identity: str  # first line of `cc --version`


@lru_cache(maxsize=1)
def find_compiler() -> Compiler:
    """The C compiler to use: $CC, else cc, gcc or clang on PATH."""
    candidates = [os.environ["CC"]] if os.environ.get("CC") else ["cc", "gcc", "clang"]
    for cand in candidates:
        exe = shutil.which(shlex.split(cand)[0]) if cand else None
        if not exe:
            continue
        try:
            out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0:
            return Compiler(exe, (out.stdout.splitlines() or ["unknown"])[0].strip())
    raise CompilerNotFoundError(
        "smelt needs a C compiler to build models, and none was found (tried "
        + ", ".join(candidates)
        + "). Install one, e.g. `apt install gcc` (Debian/Ubuntu), `dnf install gcc` (Fedora), "
        "`xcode-select --install` (macOS), or point $CC at a compiler."
    )


def arch_flags(target: Target) -> list[str]:
    if target.arch == "x86_64":
        # a capped target (``Target.narrowed``) adds -mno-... so gcc's own vectorization stays
        # within the cap too
        return ["-march=native", "-mtune=native", *target.compiler_flags()]
    if target.arch == "aarch64":
        return ["-mcpu=native"]
    return []


def compile_flags(target: Target, *, sanitize: bool | None = None) -> list[str]:
    """Flags for a model's shared library. No -ffast-math: fp32 semantics stay IEEE."""
    sanitize = sanitize_enabled() if sanitize is None else sanitize
    flags = ["-std=gnu11", "-fPIC", "-shared", "-pthread", "-fno-strict-aliasing", "-fvisibility=hidden",
             # gcc 12's predictive commoning at -O3 was seen storing to elements of an output
             # slice it had loaded early, racing with the thread that owns them
             "-fno-predictive-commoning",
             # gcc 12 at -O1 and above summarised some step functions (a tid-guarded loop
             # storing through a pointer loaded from the context) as free of side effects and
             # deleted their calls (tests/test_toolchain.py); these IPA analyses make that deduction
             "-fno-ipa-pure-const", "-fno-ipa-modref",
             # nothing reads errno or the FP exception flags: without these, sqrtf of a
             # negative goes through libm's errno path and a product under a condition is not
             # if-converted (loops of Sqrt, Elu, Max stayed scalar). Values are unchanged:
             # neither flag licenses reassociation, contraction or dropping NaN/Inf/-0.
             "-fno-math-errno", "-fno-trapping-math"]
    flags += ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
              "-fno-sanitize-recover=undefined"] if sanitize else ["-O3"]
    return flags + arch_flags(target)


def source_with_runtime(source: str) -> str:
    """Generated sources embed the runtime header and the vector helpers of the ISA descriptions
    (kernels/csrc/smelt_vec.h) so each .c stands alone (and hashes whole)."""
    return source.replace('#include "smelt_rt.h"', RUNTIME_HEADER.read_text() + "\n" + VEC_HEADER.read_text(), 1)


def artifact_key(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()


_PROCESS_PINS: list[Pin] = []  # libraries handed out by build_shared_library, kept till exit


def build_shared_library(source: str, *, name: str = "model", target: Target | None = None,
                         sanitize: bool | None = None) -> Path:
    """Compile ``source`` (with the runtime embedded) to a cached shared library; return its path.
    The library stays pinned (never evicted) while this process lives: callers dlopen it."""
    lib, pin = shared_library(source, name=name, target=target, sanitize=sanitize)
    _PROCESS_PINS.append(pin)
    return lib


def shared_library(source: str, *, name: str = "model", target: Target | None = None,
                   sanitize: bool | None = None) -> tuple[Path, Pin]:
    """The verified cached library for ``source`` (compiled on a miss) and a pin that keeps
    eviction away from it until released."""
    target = target or detect()
    compiler = find_compiler()
    full = source_with_runtime(source)
    flags = compile_flags(target, sanitize=sanitize)
    key = artifact_key(full, compiler.identity, " ".join(flags), target.key())
    out_dir = cache_dir() / "lib" / key[:2]
    out_dir.mkdir(parents=True, exist_ok=True)
    lib = out_dir / f"{key}.so"
    src = lib.with_suffix(cache.SOURCE_SUFFIX)
    pin = open_library(lib)
    built = False
    if pin is None:
        with file_lock(lib.with_suffix(cache.LOCK_SUFFIX), remove=True):
            pin = open_library(lib)  # another process built it while we waited
            if pin is None:
                problem = cache.check_library(lib)
                if lib.exists() or lib.with_suffix(cache.SUM_SUFFIX).exists():
                    cache.warn_damaged(lib, problem or "replaced while checking")
                    cache.remove_library(lib)
                pin = _compile(full, flags, compiler, lib, src, name)
                built = True
    if keep_sources() and not src.exists():  # a cached library: its source was not kept
        atomic_write(src, full.encode())
    if built:
        cache.enforce_bound()
    return lib, pin


def open_library(lib: Path) -> Pin | None:
    """A pin on ``lib`` if it matches its checksum (its last use recorded), else None."""
    pin = cache.pin(lib)
    if pin is None:
        return None
    if cache.check_library(lib) is not None:
        pin.release()
        return None
    cache.touch(lib.with_suffix(cache.SUM_SUFFIX))
    return pin


def _compile(full: str, flags: list[str], compiler: Compiler, lib: Path, src: Path, name: str) -> Pin:
    """Compile under the library's lock: checksum first, then the library renamed into place."""
    atomic_write(src, full.encode())
    with tempfile.NamedTemporaryFile(dir=lib.parent, suffix=".so.tmp", delete=False) as tmp:
        tmp_path = Path(tmp.name)
    cmd = [compiler.path, *flags, "-o", str(tmp_path), str(src), "-lm"]
    if debug_enabled():
        print("smelt: " + shlex.join(cmd), file=sys.stderr)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise CompileError(
                f"the C compiler failed building {name} (a smelt bug; please report it with the "
                f"source, kept at {src}).\ncommand: {shlex.join(cmd)}\n{proc.stderr[-8000:]}"
            )
        pin = cache.pin(tmp_path)  # the inode keeps its pin through the rename
        assert pin is not None
        cache.seal_library(tmp_path, lib)
        os.replace(tmp_path, lib)
        if not keep_sources():
            src.unlink()
        return pin
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def source_path_for(lib: Path) -> Path | None:
    """The generated C of ``lib`` if it was kept (SMELT_DEBUG=1, ``keeping_sources()``)."""
    src = lib.with_suffix(cache.SOURCE_SUFFIX)
    return src if src.exists() else None
