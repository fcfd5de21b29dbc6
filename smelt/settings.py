"""smelt's environment variables, read and validated in one place.

Each getter reads its variable when it is called, never at import, so a bad value fails the
compile that needs it (``compiler.build`` calls ``check_all`` first) with a ``ConfigError``
naming the variable, the value given and what is allowed, instead of failing deep inside or
(SMELT_SPIN_US, which the C runtime reads with ``atol``) being silently read as another number.
An unset or empty variable means its default.

| variable | allowed | default |
| --- | --- | --- |
| SMELT_CACHE_DIR | a directory smelt can create and write | $XDG_CACHE_HOME/smelt or ~/.cache/smelt |
| SMELT_CACHE_MAX_BYTES | bytes, or with a K/M/G/T suffix (powers of 1024): 500M, 4G | 4G |
| SMELT_MAX_VARIANTS | an integer >= 1 | 8 |
| SMELT_SPIN_US | an integer from 0 to 10**9 (microseconds) | 2000 |
| SMELT_TUNING_DB | a file path, or off | <cache dir>/tuning.sqlite |
| SMELT_DEBUG, SMELT_SANITIZE | 0 or 1 | 0 |
| SMELT_ISA | avx512, avx2_vnni, avx2, scalar or native (the widest ISA compiled code may use) | native |
| SMELT_POOL_SHARE | 0 or 1 (0: the barrier pool, no work sharing; read by the C runtime) | 1 |
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from smelt.errors import ConfigError
from smelt.target import ISA_CHOICES

DEFAULT_CACHE_MAX_BYTES = 4 << 30
DEFAULT_MAX_VARIANTS = 8
DEFAULT_SPIN_US = 2000  # the C runtime's own default (smelt_rt.h) when the variable is unset
MAX_SPIN_US = 10**9  # the pool multiplies by 1000 into a long: keep far from overflow
TUNING_DB_OFF = ("off", "none", "0")

_SIZE = re.compile(r"(\d+(?:\.\d*)?)\s*([kmgt]?)(?:i?b)?", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def _raw(name: str) -> str | None:
    value = os.environ.get(name)
    return None if value is None or not value.strip() else value.strip()


def _invalid(name: str, value: str, allowed: str, detail: str = "") -> ConfigError:
    return ConfigError(f"environment variable {name}={value!r} is not valid: {allowed}"
                       + (f" ({detail})" if detail else ""))


def _flag(name: str) -> bool:
    value = _raw(name)
    if value is None or value == "0":
        return False
    if value == "1":
        return True
    raise _invalid(name, value, "expected 0 or 1")


def _int(name: str, default: int, lo: int, hi: int | None, allowed: str) -> int:
    value = _raw(name)
    if value is None:
        return default
    try:
        n = int(value)
    except ValueError:
        raise _invalid(name, value, allowed) from None
    if n < lo or (hi is not None and n > hi):
        raise _invalid(name, value, allowed)
    return n


def debug() -> bool:
    """SMELT_DEBUG=1: print compile commands, keep generated C, verify the IR after every pass."""
    return _flag("SMELT_DEBUG")


def sanitize() -> bool:
    """SMELT_SANITIZE=1: build generated C with AddressSanitizer and UBSan."""
    return _flag("SMELT_SANITIZE")


def pool_share() -> bool:
    """SMELT_POOL_SHARE: the pool shares a late worker's work among the others (1, the default);
    0 runs the barrier pool (for comparisons). Read by the C runtime, validated here."""
    return _raw("SMELT_POOL_SHARE") is None or _flag("SMELT_POOL_SHARE")


def max_variants() -> int:
    """SMELT_MAX_VARIANTS: compiled shape variants a model keeps in memory."""
    return _int("SMELT_MAX_VARIANTS", DEFAULT_MAX_VARIANTS, 1, None, "expected an integer >= 1")


def spin_us() -> int:
    """SMELT_SPIN_US: microseconds idle pool threads spin before sleeping (read by the C runtime;
    validated here before any pool is created)."""
    return _int("SMELT_SPIN_US", DEFAULT_SPIN_US, 0, MAX_SPIN_US,
                f"expected an integer number of microseconds from 0 to {MAX_SPIN_US}")


def parse_size(text: str) -> int | None:
    """Bytes of ``text`` such as ``123``, ``500M``, ``4G``, ``1.5GiB``; None if it is not one."""
    m = _SIZE.fullmatch(text.strip())
    if m is None:
        return None
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def cache_max_bytes() -> int:
    """SMELT_CACHE_MAX_BYTES: the size bound of the cache directory (see ``smelt.cache``)."""
    value = _raw("SMELT_CACHE_MAX_BYTES")
    if value is None:
        return DEFAULT_CACHE_MAX_BYTES
    size = parse_size(value)
    if size is None or size < 1:
        raise _invalid("SMELT_CACHE_MAX_BYTES", value, "expected a positive size in bytes, optionally "
                       "with a K, M, G or T suffix (powers of 1024), e.g. 500M or 4G")
    return size


def cache_dir() -> Path:
    """SMELT_CACHE_DIR, else $XDG_CACHE_HOME/smelt or ~/.cache/smelt; created, and checked writable."""
    value = _raw("SMELT_CACHE_DIR")
    if value is not None:
        path = Path(value).expanduser().absolute()
    else:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        path = Path(base).absolute() / "smelt"
    what = ("SMELT_CACHE_DIR", value) if value is not None else ("SMELT_CACHE_DIR (unset: the default)", str(path))
    allowed = "expected a directory smelt can create and write"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _invalid(*what, allowed, f"cannot create {path}: {exc.strerror or exc}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise _invalid(*what, allowed, f"{path} is not writable")
    return path


def tuning_db() -> Path | None:
    """SMELT_TUNING_DB: the tuning database file, None when it is ``off``."""
    value = _raw("SMELT_TUNING_DB")
    if value is None:
        return cache_dir() / "tuning.sqlite"
    if value.lower() in TUNING_DB_OFF:
        return None
    path = Path(value).expanduser()
    if path.is_dir():
        raise _invalid("SMELT_TUNING_DB", value, "expected the path of a database file, or off",
                       "it is a directory")
    return path


def isa() -> str | None:
    """SMELT_ISA: the ISA cap a compile uses when its ``isa`` argument is not given (None: the
    host's own); whether the host can run it is checked when the compile narrows its target."""
    value = _raw("SMELT_ISA")
    if value is None:
        return None
    if value.lower() not in ISA_CHOICES:
        raise _invalid("SMELT_ISA", value, f"expected one of {', '.join(ISA_CHOICES)}")
    return value.lower()


def check_all() -> None:
    """Validate every variable (a compile calls this before doing any work)."""
    for getter in (debug, sanitize, max_variants, spin_us, pool_share, cache_max_bytes, cache_dir, tuning_db, isa):
        getter()
