"""The on-disk cache (smelt.cache): damaged entries are detected and rebuilt before anything is
loaded, the size bound holds, eviction never pulls an entry from under a process using it,
leftovers and sources are cleaned up; environment variables are validated (smelt.settings)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import const, make_model, tensor
from onnx import helper

import smelt
from smelt import cache, settings
from smelt.errors import ConfigError

N = 64
W = np.linspace(-2, 2, N, dtype=np.float32)


def _model(n: int = N) -> onnx.ModelProto:
    """An artifact with every kind of file: a library (two native blocks), weights, a fallback
    node model (Neg, forced) and a constant output (consts.npz)."""
    nodes = [helper.make_node("Add", ["x", "w"], ["a"], name="add"),
             helper.make_node("Neg", ["a"], ["b"], name="neg"),
             helper.make_node("Relu", ["b"], ["y"], name="relu"),
             helper.make_node("Add", ["c1", "c2"], ["k"], name="const_add")]
    w = np.linspace(-2, 2, n, dtype=np.float32)
    return make_model(nodes, [tensor("x", [n])], [tensor("y", [n]), tensor("k", [2])],
                      [const("w", w), const("c1", np.ones(2, np.float32)), const("c2", np.full(2, 2, np.float32))])


def _expected(x: np.ndarray) -> list[np.ndarray]:
    return [np.maximum(-(x + W), 0), np.full(2, 3, np.float32)]


def _cache_bytes(root: Path) -> int:
    return sum(p.lstat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def _entry(root: Path) -> Path:
    (entry,) = [p for p in (root / "models").glob("*/*") if not p.name.startswith(".")]
    return entry


KINDS = ["so_truncated", "so_other_library", "weights_changed", "plan_garbage", "fallback_garbage",
         "consts_changed", "manifest_garbage", "library_checksum_missing"]

# compiles the model twice in each cache directory given; one JSON line per directory
_CHILD = textwrap.dedent("""
    import json, os, sys, warnings
    import numpy as np, onnx, smelt
    from smelt.cache import CacheWarning
    model = onnx.load(sys.argv[1])
    x = np.linspace(-3, 3, 64, dtype=np.float32)
    for directory in sys.argv[2:]:
        os.environ["SMELT_CACHE_DIR"] = directory
        report = {}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for run in ("first", "again"):
                cm = smelt.compile(model, threads=1, force_fallback=["neg"])
                report[run] = [o.tolist() for o in cm(x)] + [cm.from_cache]
                cm.close()
        report["warnings"] = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
        print(json.dumps(report), flush=True)
""")


def _damage(kind: str, root: Path, other_so: bytes) -> None:
    entry = _entry(root)
    (lib,) = (root / "lib").rglob("*.so")
    if kind == "so_truncated":
        data = lib.read_bytes()
        lib.write_bytes(data[: len(data) // 3])
    elif kind == "so_other_library":
        lib.write_bytes(other_so)  # a valid smelt library, of another model
    elif kind == "weights_changed":
        weights = np.fromfile(entry / "weights.bin", dtype=np.float32)
        weights[3] += 1.0
        weights.tofile(entry / "weights.bin")
    elif kind == "plan_garbage":
        (entry / "plan.json").write_text('{"steps": [garbage')
    elif kind == "fallback_garbage":
        (fallback,) = entry.glob("fallback_*.onnx")
        fallback.write_bytes(b"\x08\x07not a model" * 10)
    elif kind == "consts_changed":
        np.savez(entry / "consts.npz", k=np.full(2, 7, np.float32))
    elif kind == "manifest_garbage":
        (entry / cache.MANIFEST).write_text("{")
    elif kind == "library_checksum_missing":
        lib.with_suffix(cache.SUM_SUFFIX).unlink()
    else:
        raise AssertionError(kind)


@pytest.fixture(scope="module")
def damaged(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    """For each kind of damage: a copy of a cache holding the model's artifact, damaged so, and
    what a child process compiling the model there saw (a crash fails every test)."""
    base = tmp_path_factory.mktemp("cache-damaged")
    model_path = base / "m.onnx"
    onnx.save(_model(), str(model_path))
    root, other_root = base / "pristine", base / "other"
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("SMELT_DEBUG", raising=False)
        mp.setenv("SMELT_CACHE_DIR", str(root))
        smelt.compile(_model(), threads=1, force_fallback=["neg"]).close()
        mp.setenv("SMELT_CACHE_DIR", str(other_root))
        smelt.compile(_model(32), threads=1, force_fallback=["neg"]).close()
    (other_lib,) = (other_root / "lib").rglob("*.so")
    assert (_entry(root) / "consts.npz").exists() and list(_entry(root).glob("fallback_*.onnx"))
    copies = {}
    for kind in KINDS:
        copies[kind] = base / kind
        shutil.copytree(root, copies[kind])  # the artifact names its library relative to the cache directory
        _damage(kind, copies[kind], other_lib.read_bytes())
    env = {k: v for k, v in os.environ.items() if k != "SMELT_DEBUG"}
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(model_path), *map(str, copies.values())],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, f"child failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    reports = [json.loads(line) for line in proc.stdout.strip().splitlines()]
    return {kind: (copies[kind], report) for kind, report in zip(KINDS, reports, strict=True)}


@pytest.mark.parametrize("kind", KINDS)
def test_damaged_entry_is_detected_and_rebuilt(kind, damaged):
    directory, report = damaged[kind]
    want = [w.tolist() for w in _expected(np.linspace(-3, 3, 64, dtype=np.float32))]
    assert report["first"][:2] == want and report["again"][:2] == want
    assert report["first"][2] is False, "the damaged entry was trusted"
    assert report["again"][2] is True, "the rebuilt entry does not verify"
    assert len(report["warnings"]) == 1 and "damaged" in report["warnings"][0]
    assert cache.check_manifest(_entry(directory)) is None
    (lib,) = (directory / "lib").rglob("*.so")
    assert cache.check_library(lib) is None


def test_library_is_verified_before_its_path_is_handed_out(tmp_path, monkeypatch):
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    from smelt.codegen.toolchain import build_shared_library

    source = '#include "smelt_rt.h"\n__attribute__((visibility("default"))) int smelt_answer(void) { return 42; }\n'
    lib = build_shared_library(source, name="answer")
    mtime = lib.stat().st_mtime_ns
    assert build_shared_library(source, name="answer") == lib and lib.stat().st_mtime_ns == mtime  # a hit
    lib.write_bytes(lib.read_bytes()[:100])
    with pytest.warns(cache.CacheWarning, match="damaged"):
        again = build_shared_library(source, name="answer")
    assert again == lib and cache.check_library(lib) is None  # rebuilt before being returned
    import ctypes

    assert ctypes.CDLL(str(lib)).smelt_answer() == 42


def _symbolic_model(force_all_fallback: bool) -> tuple[onnx.ModelProto, list[str]]:
    nodes = [helper.make_node("Add", ["x", "w"], ["a"], name="add"), helper.make_node("Relu", ["a"], ["y"], name="relu")]
    w = np.linspace(-1, 1, 1024, dtype=np.float32)
    model = make_model(nodes, [tensor("x", ["n", 1024])], [tensor("y", ["n", 1024])], [const("w", w)])
    return model, (["add", "relu"] if force_all_fallback else [])


def _compile_shapes(tmp_path, monkeypatch, shapes: int, bound: int, fallback: bool) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("SMELT_CACHE_DIR", str(root))
    monkeypatch.setenv("SMELT_CACHE_MAX_BYTES", str(bound))
    monkeypatch.setenv("SMELT_MAX_VARIANTS", "2")  # variants in memory pin their entries
    model, force = _symbolic_model(fallback)
    cm = smelt.compile(model, threads=1, force_fallback=force)
    w = np.linspace(-1, 1, 1024, dtype=np.float32)
    peak = 0
    for n in range(1, shapes + 1):
        x = np.random.default_rng(n).standard_normal((n, 1024)).astype(np.float32)
        np.testing.assert_array_equal(cm(x), np.maximum(x + w, 0))
        peak = max(peak, _cache_bytes(root))
        assert peak <= bound, f"cache holds {peak} bytes after {n} shapes, above its bound of {bound}"
    assert cm.compilations == shapes
    return root


def test_cache_stays_within_its_bound_over_50_shapes(tmp_path, monkeypatch):
    """50 shapes of a model whose nodes run in the fallback (no C compiler: fast); each artifact
    carries the weights (4 KiB) in its fallback model."""
    root = _compile_shapes(tmp_path, monkeypatch, 50, 40_000, fallback=True)
    assert 2 <= len([p for p in (root / "models").glob("*/*") if not p.name.startswith(".")]) < 10


def test_cache_bound_evicts_libraries(tmp_path, monkeypatch):
    """Each shape: a library and an artifact; the bound holds three and a half of them (the two
    variants in memory and the one being compiled are pinned while in use), measured on one
    shape first: the runtime embedded in every library changes size (it was ~17 KiB, then the
    work-sharing pool grew it past the old fixed bound)."""
    probe = tmp_path / "probe"
    monkeypatch.setenv("SMELT_CACHE_DIR", str(probe))
    model, force = _symbolic_model(False)
    smelt.compile(model, threads=1, force_fallback=force)(np.zeros((1, 1024), np.float32))
    entry = _cache_bytes(probe)
    root = _compile_shapes(tmp_path, monkeypatch, 5, int(3.5 * entry), fallback=False)
    libs = list((root / "lib").rglob("*.so"))
    assert 2 <= len(libs) < 5
    assert not [p for p in (root / "lib").rglob("*") if p.suffix in (".c", ".lock", ".tmp")]


@pytest.mark.slow
def test_cache_stays_within_its_bound_over_50_compiled_shapes(tmp_path, monkeypatch):
    _compile_shapes(tmp_path, monkeypatch, 50, 120_000, fallback=False)


def test_pinned_entries_survive_eviction_until_released(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("SMELT_CACHE_DIR", str(root))
    cm = smelt.compile(_model(), threads=1, force_fallback=["neg"])
    x = np.linspace(-3, 3, 64, dtype=np.float32)
    # another process clears the cache: what this one holds stays, all else goes
    env = dict(os.environ, SMELT_CACHE_DIR=str(root))
    code = "from smelt import cache; print(cache.clear())"
    assert subprocess.run([sys.executable, "-c", code], env=env, timeout=120).returncode == 0
    assert cache.check_manifest(_entry(root)) is None
    np.testing.assert_array_equal(cm(x)[0], _expected(x)[0])
    assert smelt.compile(_model(), threads=1, force_fallback=["neg"]).from_cache
    cm.close()
    del cm
    import gc

    gc.collect()
    assert cache.clear() > 0
    assert not [p for p in (root / "models").glob("*/*")] and not list((root / "lib").rglob("*.so"))


def test_entry_just_written_is_not_evicted_by_its_own_write(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("SMELT_CACHE_DIR", str(root))
    monkeypatch.setenv("SMELT_CACHE_MAX_BYTES", "1")  # smaller than any entry
    cm = smelt.compile(_model(), threads=1, force_fallback=["neg"])
    x = np.linspace(-3, 3, 64, dtype=np.float32)
    for got, want in zip(cm(x), _expected(x), strict=True):
        np.testing.assert_array_equal(got, want)
    assert cache.check_manifest(_entry(root)) is None
    del cm
    import gc

    gc.collect()
    cache.enforce_bound()  # unpinned now: within the bound again
    assert not [p for p in (root / "models").glob("*/*")] and not list((root / "lib").rglob("*.so"))


_LOADER = textwrap.dedent("""
    import sys, numpy as np, onnx, smelt
    model = onnx.load(sys.argv[1])
    x = np.linspace(-3, 3, 64, dtype=np.float32)
    want = np.maximum(-(x + np.linspace(-2, 2, 64, dtype=np.float32)), 0)
    for i in range(int(sys.argv[2])):
        cm = smelt.compile(model, threads=1, force_fallback=["neg"])
        assert np.array_equal(cm(x)[0], want), i
        cm.close()
""")
_EVICTOR = textwrap.dedent("""
    import sys, time
    from smelt import cache
    end = time.time() + float(sys.argv[1])
    while time.time() < end:
        cache.clear()
""")


def test_eviction_racing_loads_never_breaks_a_loader(tmp_path):
    """One process compiles (mostly loads) the model over and over while another clears the
    cache in a loop: every load verifies or rebuilds, none crashes or answers wrong."""
    model_path = tmp_path / "m.onnx"
    onnx.save(_model(), str(model_path))
    env = dict(os.environ, SMELT_CACHE_DIR=str(tmp_path / "cache"))
    loaders = [subprocess.Popen([sys.executable, "-c", _LOADER, str(model_path), "6"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    evictor = subprocess.Popen([sys.executable, "-c", _EVICTOR, "120"], env=env, stderr=subprocess.PIPE, text=True)
    for p in loaders:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    assert evictor.poll() is None, evictor.communicate()[1][-3000:]  # still clearing: no crash
    evictor.kill()
    evictor.wait()


def test_leftovers_are_removed_and_fresh_temporaries_kept(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("SMELT_CACHE_DIR", str(root))
    smelt.compile(_model(), threads=1, force_fallback=["neg"])
    shard = next((root / "lib").iterdir())
    models = _entry(root).parent
    old = time.time() - 2 * cache.STALE_SECONDS
    stale = [shard / "dead.so.tmp", shard / "deadbeef.c", shard / "deadbeef.sum", shard / "x.tmp"]
    for p in stale:
        p.write_text("left by a crashed process")
        os.utime(p, (old, old))
    lock = shard / "cafe.lock"
    lock.write_text("")
    tmp_dir = models / ".tmp-crashed"
    tmp_dir.mkdir()
    (tmp_dir / "weights.bin").write_bytes(b"\0" * 100)
    os.utime(tmp_dir, (old, old))
    trash = models / ".trash-1-2"
    trash.mkdir()
    fresh = [shard / "busy.so.tmp", models / ".tmp-writing"]
    fresh[0].write_text("a compile in progress")
    fresh[1].mkdir()
    cache.enforce_bound()
    for p in [*stale, lock, tmp_dir, trash]:
        assert not p.exists(), p
    for p in fresh:
        assert p.exists(), p
    assert cache.check_manifest(_entry(root)) is None  # the real entry stays


def test_generated_c_kept_only_when_debugging(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("SMELT_CACHE_DIR", str(root))
    plain = smelt.compile(_model(), threads=1)
    plain(np.zeros(N, np.float32))
    assert plain.source_path is None and not list(root.rglob("*.c"))
    monkeypatch.setenv("SMELT_DEBUG", "1")
    debug = smelt.compile(_model(), threads=1)  # the cached library, its source generated again
    debug(np.zeros(N, np.float32))
    assert debug.source_path is not None and "smelt_block_0" in debug.source_path.read_text()
    assert debug.plan.lib == plain.plan.lib


def test_emit_c_writes_the_source_of_a_cached_model(tmp_path, monkeypatch):
    from smelt import cli

    root = tmp_path / "cache"
    monkeypatch.setenv("SMELT_CACHE_DIR", str(root))
    model_path = tmp_path / "m.onnx"
    onnx.save(_model(), str(model_path))
    assert cli.main(["compile", str(model_path)]) == 0
    out = tmp_path / "out.c"
    assert cli.main(["compile", str(model_path), "--emit-c", str(out)]) == 0
    assert "smelt_block_0" in out.read_text()


def test_cache_cli_info_prune_clear(tmp_path, monkeypatch, capsys):
    from smelt import cli

    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("SMELT_CACHE_MAX_BYTES", "3G")
    smelt.compile(_model(), threads=1).close()
    assert cli.main(["cache"]) == 0
    out = capsys.readouterr().out
    assert "of 3.0 GiB" in out and "1 artifacts" in out and "1 libraries" in out
    assert cli.main(["cache", "prune"]) == 0 and "removed 0 B" in capsys.readouterr().out
    import gc

    gc.collect()
    assert cli.main(["cache", "clear"]) == 0
    assert "0 artifacts" in capsys.readouterr().out


# -- environment variables ---------------------------------------------------------------------
@pytest.mark.parametrize("name, value, allowed", [
    ("SMELT_MAX_VARIANTS", "-1", "integer >= 1"),
    ("SMELT_MAX_VARIANTS", "abc", "integer >= 1"),
    ("SMELT_MAX_VARIANTS", "0", "integer >= 1"),
    ("SMELT_SPIN_US", "-5", "from 0 to"),
    ("SMELT_SPIN_US", "1e3", "from 0 to"),
    ("SMELT_SPIN_US", "99999999999", "from 0 to"),
    ("SMELT_POOL_SHARE", "yes", "expected 0 or 1"),
    ("SMELT_CACHE_MAX_BYTES", "4x", "K, M, G or T"),
    ("SMELT_CACHE_MAX_BYTES", "-1", "K, M, G or T"),
    ("SMELT_CACHE_MAX_BYTES", "0", "K, M, G or T"),
    ("SMELT_DEBUG", "yes", "0 or 1"),
    ("SMELT_SANITIZE", "2", "0 or 1"),
])
def test_bad_environment_values_fail_the_compile_clearly(name, value, allowed, monkeypatch, tmp_path):
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as err:
        smelt.compile(_model(), threads=1)
    assert f"{name}={value!r}" in str(err.value) and allowed in str(err.value)
    assert not list(tmp_path.rglob("*.so"))  # failed before any work


def test_cache_dir_must_be_creatable_and_writable(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("SMELT_CACHE_DIR", str(blocker / "cache"))
    with pytest.raises(ConfigError, match="SMELT_CACHE_DIR=.*cannot create"):
        smelt.compile(_model(), threads=1)
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("SMELT_TUNING_DB", str(tmp_path))
    with pytest.raises(ConfigError, match="SMELT_TUNING_DB=.*is a directory"):
        smelt.compile(_model(), threads=1)


def test_bad_environment_value_does_not_break_import(tmp_path):
    """``import smelt`` reads no variable; the compile names the bad one."""
    onnx.save(_model(), str(tmp_path / "m.onnx"))
    env = dict(os.environ, SMELT_MAX_VARIANTS="abc", SMELT_CACHE_DIR=str(tmp_path / "cache"))
    code = ("import sys, smelt\n"
            "try:\n    smelt.compile(sys.argv[1])\nexcept smelt.SmeltError as e:\n    print(type(e).__name__, e)")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "m.onnx")], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ConfigError") and "SMELT_MAX_VARIANTS='abc'" in proc.stdout


def test_environment_values_parse():
    assert settings.parse_size("123") == 123
    assert settings.parse_size("500M") == 500 << 20
    assert settings.parse_size("4G") == settings.parse_size("4gib") == 4 << 30
    assert settings.parse_size("1.5K") == 1536 and settings.parse_size("2kb") == 2048
    assert settings.parse_size("4x") is None and settings.parse_size("") is None


def test_environment_defaults(monkeypatch, tmp_path):
    for name in ("SMELT_MAX_VARIANTS", "SMELT_SPIN_US", "SMELT_CACHE_MAX_BYTES", "SMELT_DEBUG", "SMELT_TUNING_DB"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path / "c"))
    assert settings.max_variants() == 8 and settings.spin_us() == 2000 and not settings.debug()
    assert settings.cache_max_bytes() == 4 << 30
    assert settings.tuning_db() == tmp_path / "c" / "tuning.sqlite"
    monkeypatch.setenv("SMELT_TUNING_DB", "off")
    assert settings.tuning_db() is None
