"""Build generated C with the system compiler, cached by content, written atomically.

Cache key: sha256(source ‖ compiler identity ‖ flags ‖ target). The artifact is compiled to a
temporary file in the cache directory and renamed into place while holding an exclusive file
lock, so concurrent processes compiling the same model all succeed and leave one intact file.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from smelt.errors import CompileError, CompilerNotFoundError
from smelt.target import Target, detect

RUNTIME_HEADER = Path(__file__).resolve().parent.parent / "runtime" / "csrc" / "smelt_rt.h"


def debug_enabled() -> bool:
    return os.environ.get("SMELT_DEBUG", "") not in ("", "0")


def sanitize_enabled() -> bool:
    return os.environ.get("SMELT_SANITIZE", "") not in ("", "0")


def cache_dir() -> Path:
    """Where compiled artifacts live: $SMELT_CACHE_DIR, else the user cache directory."""
    env = os.environ.get("SMELT_CACHE_DIR")
    if env:
        path = Path(env)
    else:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        path = Path(base) / "smelt"
    path.mkdir(parents=True, exist_ok=True)
    return path


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
        return ["-march=native", "-mtune=native"]
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
             "-fno-ipa-pure-const", "-fno-ipa-modref"]
    flags += ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
              "-fno-sanitize-recover=undefined"] if sanitize else ["-O3"]
    return flags + arch_flags(target)


def source_with_runtime(source: str) -> str:
    """Generated sources embed the runtime header so each .c stands alone (and hashes whole)."""
    return source.replace('#include "smelt_rt.h"', RUNTIME_HEADER.read_text(), 1)


@contextmanager
def file_lock(path: Path):
    with open(path, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def artifact_key(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()


def build_shared_library(source: str, *, name: str = "model", target: Target | None = None,
                         sanitize: bool | None = None) -> Path:
    """Compile ``source`` (with the runtime embedded) to a cached shared library; return its path."""
    target = target or detect()
    compiler = find_compiler()
    full = source_with_runtime(source)
    flags = compile_flags(target, sanitize=sanitize)
    key = artifact_key(full, compiler.identity, " ".join(flags), target.key())
    out_dir = cache_dir() / "lib" / key[:2]
    out_dir.mkdir(parents=True, exist_ok=True)
    lib = out_dir / f"{key}.so"
    if lib.exists():
        return lib
    with file_lock(out_dir / f"{key}.lock"):
        if lib.exists():  # another process finished it while we waited
            return lib
        src = out_dir / f"{key}.c"
        atomic_write(src, full.encode())
        with tempfile.NamedTemporaryFile(dir=out_dir, suffix=".so.tmp", delete=False) as tmp:
            tmp_path = Path(tmp.name)
        cmd = [compiler.path, *flags, "-o", str(tmp_path), str(src), "-lm"]
        if debug_enabled():
            print("smelt: " + shlex.join(cmd), file=sys.stderr)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise CompileError(
                    f"the C compiler failed building {name} (a smelt bug; please report it).\n"
                    f"command: {shlex.join(cmd)}\n{proc.stderr[-8000:]}"
                )
            os.replace(tmp_path, lib)
        finally:
            if tmp_path.exists():
                tmp_path.unlink()
    return lib


def atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def source_path_for(lib: Path) -> Path:
    return lib.with_suffix(".c")
