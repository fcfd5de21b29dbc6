"""The on-disk cache: checksums verified before use, pins, a size bound with LRU eviction.

Layout of the cache directory (``settings.cache_dir()``)::

    lib/<k2>/<key>.so        a shared library (codegen.toolchain), keyed by its source
    lib/<k2>/<key>.sum       the library's size and sha256, written before it is renamed in place
    lib/<k2>/<key>.c         its source: kept only under SMELT_DEBUG=1 (or ``smelt compile --emit-c``)
    models/<k2>/<key>/       an artifact (compiler.build): plan.json, weights.bin, fallback_*.onnx,
                             consts.npz, and manifest.json (each file's size and sha256, written last)
    tuning.sqlite, peak/     the tuning database, measured peaks: counted in the size, never evicted

Integrity: nothing from the cache is used before it verifies. A file's sha256 is computed once
per process while the file is unchanged (same inode, size and mtime), so a model loaded again
in the same process costs a ``stat`` per file; the first load hashes (~0.2 s per 100 MB on one
core). A damaged artifact or library counts as a miss: it is deleted and rebuilt.

Pins: a process holds a shared ``flock`` on each artifact directory and library it has handed
out (``Pin``), until the artifact is dropped (artifacts) or the process ends (libraries loaded
with ``build_shared_library``). Eviction takes an exclusive lock without waiting and skips what
it cannot lock, so an entry another process is loading is never deleted under it, and the entry
a write just produced (pinned by its writer) is never evicted by that write.

Bound: after each write, under a cache-wide lock, least-recently-used artifacts and libraries
(last use: the directory's or the ``.sum`` file's mtime, touched on every load) are deleted until
the directory's total apparent size is within ``SMELT_CACHE_MAX_BYTES``; leftovers of crashed
processes (``.tmp`` files and directories older than an hour, unlocked ``.lock`` files, sources
without a library) go first. Pinned entries can keep the total above the bound while they are
in use: deleting them would free nothing a running process is not still holding.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import stat
import sys
import tempfile
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from smelt import settings

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
LIB_SUFFIX, SUM_SUFFIX, SOURCE_SUFFIX, LOCK_SUFFIX = ".so", ".sum", ".c", ".lock"
STALE_SECONDS = 3600.0  # a temporary file this old belongs to a process that died mid-write
_CHUNK = 1 << 20


class CacheWarning(UserWarning):
    """A cached file failed its checksum (it is rebuilt; the warning says which)."""


def root() -> Path:
    return settings.cache_dir()


def warn_damaged(path: Path, problem: str) -> None:
    warnings.warn(f"smelt: cache entry {path} is damaged ({problem}); rebuilding it", CacheWarning, stacklevel=3)


# -- checksums ---------------------------------------------------------------------------------
_digests: OrderedDict[tuple, str] = OrderedDict()  # (dev, inode, size, mtime_ns) -> sha256
_digests_lock = threading.Lock()
_MAX_DIGESTS = 4096


def _identity(st: os.stat_result) -> tuple:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def file_digest(path: Path) -> str:
    """sha256 of ``path``: hashed once per process while the file is unchanged."""
    with open(path, "rb", buffering=0) as fh:
        ident = _identity(os.fstat(fh.fileno()))
        with _digests_lock:
            known = _digests.get(ident)
        if known is not None:
            return known
        h = hashlib.sha256()
        buf = bytearray(_CHUNK)
        view = memoryview(buf)
        while n := fh.readinto(buf):
            h.update(view[:n])
    digest = h.hexdigest()
    with _digests_lock:
        _digests[ident] = digest
        while len(_digests) > _MAX_DIGESTS:
            _digests.popitem(last=False)
    return digest


def file_record(path: Path) -> dict:
    return {"size": os.stat(path).st_size, "sha256": file_digest(path)}


def check_file(path: Path, record: dict) -> str | None:
    """None when ``path`` is a regular file of the recorded size and sha256, else what is wrong."""
    try:
        st = os.stat(path)
    except OSError:
        return f"{path.name} is missing"
    if not stat.S_ISREG(st.st_mode):
        return f"{path.name} is not a regular file"
    if st.st_size != record.get("size"):
        return f"{path.name} has {st.st_size} bytes, {record.get('size')} were written"
    try:
        if file_digest(path) != record.get("sha256"):
            return f"{path.name} does not match its checksum"
    except OSError as exc:
        return f"{path.name} cannot be read: {exc.strerror or exc}"
    return None


def write_manifest(directory: Path) -> None:
    """Record every file of an artifact directory not yet visible (write it last)."""
    files = {p.name: file_record(p) for p in sorted(directory.iterdir()) if p.name != MANIFEST and p.is_file()}
    (directory / MANIFEST).write_text(json.dumps({"version": MANIFEST_VERSION, "files": files}, indent=1))


def check_manifest(directory: Path) -> str | None:
    """None when every file the manifest names is intact, else what is wrong."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
        files = manifest["files"]
        if manifest.get("version") != MANIFEST_VERSION or not isinstance(files, dict):
            return f"{MANIFEST} is of another version"
    except FileNotFoundError:
        return f"{MANIFEST} is missing"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"{MANIFEST} is unreadable: {exc}"
    for name, record in files.items():
        if os.path.basename(name) != name or not isinstance(record, dict):
            return f"{MANIFEST} names {name!r}"
        problem = check_file(directory / name, record)
        if problem:
            return problem
    return None


def seal_library(tmp: Path, lib: Path) -> None:
    """Write the checksum of the library compiled at ``tmp`` that is about to become ``lib``."""
    atomic_write(lib.with_suffix(SUM_SUFFIX), json.dumps(file_record(tmp)).encode())


def check_library(lib: Path) -> str | None:
    """None when ``lib`` matches its ``.sum`` file, else what is wrong."""
    try:
        record = json.loads(lib.with_suffix(SUM_SUFFIX).read_text())
        if not isinstance(record, dict):
            raise ValueError("not an object")
    except FileNotFoundError:
        return f"{lib.name} has no checksum file" if lib.exists() else f"{lib.name} is missing"
    except (OSError, ValueError) as exc:
        return f"the checksum file of {lib.name} is unreadable: {exc}"
    return check_file(lib, record)


# -- files, locks and pins ---------------------------------------------------------------------
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


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except OSError:
        return False


@contextmanager
def file_lock(path: Path, *, remove: bool = False) -> Iterator[None]:
    """An exclusive lock on ``path`` (created if need be); ``remove`` deletes the lock file when
    done. Re-opens if the file was removed while waiting, so a removed lock file never lets two
    holders in at once."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        if _same_file(fd, path):
            break
        os.close(fd)
    try:
        yield
    finally:
        if remove:
            try:
                os.unlink(path)
            except OSError:
                pass
        os.close(fd)


class Pin:
    """A shared lock on a cache file or directory: eviction skips what a live process pinned.
    Released by ``release()``, or when the object is collected."""

    def __init__(self, fd: int, path: Path) -> None:
        self.fd: int | None = fd
        self.path = path

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def same_file(self, path: Path) -> bool:
        return self.fd is not None and _same_file(self.fd, path)

    def __del__(self) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"Pin({str(self.path)!r})"


def pin(path: Path) -> Pin | None:
    """Pin ``path`` (a file or directory) as it is now; None if it does not exist."""
    for _ in range(8):
        try:
            fd = os.open(path, os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            return None
        fcntl.flock(fd, fcntl.LOCK_SH)  # waits only while an evictor renames it away
        if _same_file(fd, path):
            return Pin(fd, path)
        os.close(fd)  # replaced or removed while we waited: pin what is there now
    return None


def _lock_exclusive(path: Path) -> int | None:
    """An exclusive lock on ``path`` if no process pins it, else None (never waits)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            return None
        raise
    if not _same_file(fd, path):
        os.close(fd)
        return None
    return fd


def touch(path: Path) -> None:
    """Record a use (the LRU clock is the mtime)."""
    try:
        os.utime(path)
    except OSError:
        pass


def discard(path: Path, expected: Pin | None = None) -> None:
    """Delete an artifact directory (or a file): renamed away first, so no process ever sees a
    half-deleted entry. With ``expected``, only if ``path`` is still the pinned object."""
    if expected is not None and not expected.same_file(path):
        return
    trash = path.with_name(f".trash-{os.getpid()}-{time.monotonic_ns()}")
    try:
        os.rename(path, trash)
    except OSError:
        return
    if trash.is_dir():
        shutil.rmtree(trash, ignore_errors=True)
    else:
        _unlink(trash)


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def remove_library(lib: Path) -> None:
    """Delete a library with its checksum and source (callers hold its build lock or a lock on it)."""
    for p in (lib, lib.with_suffix(SUM_SUFFIX), lib.with_suffix(SOURCE_SUFFIX)):
        _unlink(p)


# -- the size bound ----------------------------------------------------------------------------
@dataclass
class _Unit:
    kind: str  # "model" or "library"
    path: Path  # the artifact directory, or the .so
    size: int
    last_use: float


@dataclass
class _Scan:
    total: int = 0  # apparent size of every file under the cache directory
    units: list[_Unit] = field(default_factory=list)
    stale: list[tuple[Path, int]] = field(default_factory=list)  # leftovers, removable now
    locks: list[Path] = field(default_factory=list)  # .lock files: removable when nobody holds them


def _tree_size(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


def _entries(base: Path) -> Iterator[os.DirEntry]:
    try:
        shards = [e for e in os.scandir(base) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return
    for shard in shards:
        try:
            yield from os.scandir(shard.path)
        except OSError:
            continue


def _scan(cache: Path, now: float) -> _Scan:
    scan = _Scan(total=_tree_size(cache))
    old = now - STALE_SECONDS
    for e in _entries(cache / "models"):
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        path = Path(e.path)
        if e.name.startswith(".trash-") or (e.name.startswith(".tmp-") and st.st_mtime < old):
            scan.stale.append((path, _tree_size(path) if e.is_dir(follow_symlinks=False) else st.st_size))
        elif stat.S_ISDIR(st.st_mode) and not e.name.startswith("."):
            scan.units.append(_Unit("model", path, _tree_size(path), st.st_mtime))
    groups: dict[Path, dict[str, os.stat_result]] = {}
    for e in _entries(cache / "lib"):
        path = Path(e.path)
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        if e.name.endswith(LOCK_SUFFIX):
            scan.locks.append(path)
        elif e.name.endswith(".tmp") or e.name.startswith(".trash-"):
            if st.st_mtime < old or e.name.startswith(".trash-"):
                scan.stale.append((path, st.st_size))
        elif path.suffix in (LIB_SUFFIX, SUM_SUFFIX, SOURCE_SUFFIX):
            groups.setdefault(path.with_suffix(LIB_SUFFIX), {})[path.suffix] = st
    for lib, parts in groups.items():
        size = sum(st.st_size for st in parts.values())
        if LIB_SUFFIX in parts:
            last = max(st.st_mtime for st in parts.values())
            scan.units.append(_Unit("library", lib, size, last))
        elif max(st.st_mtime for st in parts.values()) < old:  # a source or checksum whose build died
            scan.stale.extend((lib.with_suffix(s), st.st_size) for s, st in parts.items())
    return scan


def _remove_unit(unit: _Unit) -> bool:
    fd = _lock_exclusive(unit.path)
    if fd is None:
        return False  # pinned by a live process (or already gone)
    try:
        if unit.kind == "model":
            discard(unit.path)
        else:
            remove_library(unit.path)
    finally:
        os.close(fd)
    return True


def _evict(bound: int) -> int:
    """Delete leftovers, then least-recently-used entries until the cache is within ``bound``
    bytes (pinned entries are skipped); the bytes freed."""
    cache = root()
    with file_lock(cache / "evict.lock"):
        scan = _scan(cache, time.time())
        total = scan.total
        for path, size in scan.stale:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                _unlink(path)
            total -= size
        for lock in scan.locks:
            fd = _lock_exclusive(lock)
            if fd is not None:  # nobody builds under it: unlinking while holding it is safe
                _unlink(lock)
                os.close(fd)
        for unit in sorted(scan.units, key=lambda u: u.last_use):
            if total <= bound:
                break
            if _remove_unit(unit):
                total -= unit.size
        if settings.debug() and total > bound:
            print(f"smelt: cache {cache} holds {total} bytes, above its bound of {bound}: the rest is "
                  "in use by running processes", file=sys.stderr)
        return scan.total - total


def enforce_bound() -> int:
    """Bring the cache within SMELT_CACHE_MAX_BYTES (called after every write); bytes freed."""
    return _evict(settings.cache_max_bytes())


def clear() -> int:
    """Delete every artifact and library no running process uses (the tuning database and
    measured peaks stay); bytes freed."""
    return _evict(0)


@dataclass(frozen=True)
class Usage:
    directory: Path
    total_bytes: int
    bound_bytes: int
    models: int
    model_bytes: int
    libraries: int
    library_bytes: int


def usage() -> Usage:
    cache = root()
    scan = _scan(cache, time.time())
    models = [u for u in scan.units if u.kind == "model"]
    libs = [u for u in scan.units if u.kind == "library"]
    return Usage(cache, scan.total, settings.cache_max_bytes(), len(models), sum(u.size for u in models),
                 len(libs), sum(u.size for u in libs))
