"""Compiled models under concurrency, fork() and variant churn, and the memory variants hold.

Crash and hang cases run in a child Python (``helpers.run_python``), so a regression fails its
test instead of killing pytest. Builds are slowed down or held at a gate by wrapping
``smelt.api.build``; no timing is asserted beyond "the other caller kept completing calls".
"""

from __future__ import annotations

import shutil
import subprocess
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import chain_expected, chain_model, make_model, run_python, tensor
from onnx import helper

import smelt
import smelt.api
from smelt.errors import CompileError

TESTS = Path(__file__).parent
# Every LSTM here is lstm_model(8, 16, "B", "T") at 2 threads with bounds T 8 or 16 and B 4, as in
# concurrency_stress.py and tests/kernels/test_rnn_dynamic.py::test_bound_grows_geometrically, and
# the cache directory is that file's: one session compiles these two libraries once for both.

# Child prelude: a chain model with a symbolic batch, and a compiled dynamic LSTM helper.
PRELUDE = """
import os, sys, threading, time, traceback
import numpy as np
from helpers import chain_expected, chain_model, ort_run
import smelt
from smelt.frontend.zoo.rnn import lstm_model

def close(got, want):
    return all(g.shape == w.shape and float(np.abs(g - w).max()) <= 1e-5 * max(1.0, float(np.abs(w).max()))
               for g, w in zip(got, want, strict=True))
"""


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.getbasetemp() / "smelt-rnn-dyn-cache"  # see above


@pytest.fixture(autouse=True)
def _cache(cache_dir, monkeypatch):
    monkeypatch.setenv("SMELT_CACHE_DIR", str(cache_dir))


def _child(code: str, timeout: float = 300, **env: str) -> str:
    proc = run_python(PRELUDE + textwrap.dedent(code), timeout=timeout, extra_env=env)
    assert proc.returncode == 0, f"child failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout


def test_eviction_never_frees_a_variant_another_thread_is_running():
    """SMELT_MAX_VARIANTS=2 and four threads cycling through five batch sizes: every call evicts
    a variant some other thread may be inside (it aborted or deadlocked before)."""
    out = _child("""
        cm = smelt.compile(chain_model(8, ("N", 1 << 16)), threads=2)
        errors = []
        def worker(seed):
            rng = np.random.default_rng(seed)
            for i in range(25):
                n = 1 + (seed + i) % 5
                x = rng.standard_normal((n, 1 << 16)).astype(np.float32)
                if not np.array_equal(cm(x), chain_expected(x, 8)):
                    errors.append((seed, i))
        threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
        for t in threads: t.start()
        for t in threads: t.join()
        assert not errors, errors
        assert len(cm._variants) <= 2
        print("ok")
    """, SMELT_MAX_VARIANTS="2")
    assert "ok" in out


def test_two_instances_of_a_dynamic_lstm_share_nothing():
    """Two compiled instances of one dynamic LSTM share one .so; called at once with different
    sequence lengths and batches, each must answer for its own input (they shared the library's
    global T/B array before: wrong shapes, then a crash)."""
    out = _child("""
        model = lstm_model(8, 16, "B", "T")
        a = smelt.compile(model, threads=2, max_dims={"T": 8, "B": 4})
        b = smelt.compile(model, threads=2, max_dims={"T": 8, "B": 4})
        assert a._current().lib_path == b._current().lib_path
        rng = np.random.default_rng(0)
        cases = {m: rng.standard_normal(shape).astype(np.float32)
                 for m, shape in ((a, (8, 4, 8)), (b, (3, 1, 8)))}
        refs = {m: ort_run(model, {"x": x}) for m, x in cases.items()}
        bad = []
        def worker(m):
            for _ in range(300):
                if not close(m(cases[m]), refs[m]):
                    bad.append(m is a)
        threads = [threading.Thread(target=worker, args=(m,)) for m in (a, b)]
        for t in threads: t.start()
        for t in threads: t.join()
        assert not bad, f"{len(bad)} wrong answers"
        print("ok")
    """)
    assert "ok" in out


def test_growing_an_rnn_bound_never_stalls_or_breaks_other_callers():
    """One thread sends a longer sequence than the bound (a rebuild, slowed down here by 1.5 s);
    another keeps calling within the old bound and must keep completing calls during the build
    (it waited for the whole build before), on the old variant, which must stay valid until its
    last call returns (it was closed under it before). A third caller needing the same larger
    variant waits for that one build instead of starting another."""
    out = _child("""
        import smelt.api as api
        real_build, span = api.build, {}
        def slow_build(*args, **kwargs):
            span["start"] = time.monotonic()
            time.sleep(1.5)
            try:
                return real_build(*args, **kwargs)
            finally:
                span["end"] = time.monotonic()
        model = lstm_model(8, 16, "B", "T")
        cm = smelt.compile(model, threads=2, max_dims={"T": 8, "B": 4})
        api.build = slow_build
        rng = np.random.default_rng(0)
        small, big, mid = (rng.standard_normal(s).astype(np.float32) for s in ((4, 2, 8), (12, 2, 8), (9, 1, 8)))
        refs = {k: ort_run(model, {"x": x}) for k, x in (("small", small), ("big", big), ("mid", mid))}
        done, errors, stop = [], [], threading.Event()
        def small_caller():
            while not stop.is_set():
                if not close(cm(small), refs["small"]):
                    errors.append("small")
                done.append(time.monotonic())
        def grower(x, key):
            if not close(cm(x), refs[key]):
                errors.append(key)
        s = threading.Thread(target=small_caller)
        s.start()
        while len(done) < 3: time.sleep(0.01)
        g = threading.Thread(target=grower, args=(big, "big"))
        g.start()
        while "start" not in span: time.sleep(0.01)
        g2 = threading.Thread(target=grower, args=(mid, "mid"))  # needs T=9: covered by the build for 12
        g2.start()
        g.join(); g2.join()
        stop.set(); s.join()
        during = sum(span["start"] <= t <= span["end"] for t in done)
        assert not errors, errors
        assert cm.compilations == 2 and cm.max_dims == {"T": 16, "B": 4}, (cm.compilations, cm.max_dims)
        assert during >= 20, f"the small caller completed {during} calls during the {span['end'] - span['start']:.1f} s build"
        print("ok", during)
    """)
    assert "ok" in out


def _neg_model():
    return make_model([helper.make_node("Neg", ["x"], ["y"], name="neg")], [tensor("x", ["N"])], [tensor("y", ["N"])])


class _GatedBuild:
    """Wraps smelt.api.build: each build waits at a gate (bounded) and may fail."""

    def __init__(self, monkeypatch, fail_first: bool = False) -> None:
        self.real = smelt.api.build
        self.gate = threading.Event()
        self.calls = 0
        self.gate_timed_out = False
        self.fail_first = fail_first
        monkeypatch.setattr(smelt.api, "build", self)

    def __call__(self, *args, **kwargs):
        self.calls += 1
        first = self.calls == 1
        if not self.gate.wait(timeout=20):
            self.gate_timed_out = True
        if first and self.fail_first:
            raise CompileError("injected build failure")
        return self.real(*args, **kwargs)


def _wait_for_waiters(cm: smelt.CompiledModel, n: int) -> None:
    deadline = time.monotonic() + 30
    while sum(p.waiters for p in list(cm._pending.values())) < n:
        assert time.monotonic() < deadline, "callers never started waiting for the build"
        time.sleep(0.01)


def test_a_new_shape_builds_without_blocking_calls_on_loaded_variants(monkeypatch):
    cm = smelt.compile(_neg_model(), threads=1, input_shapes={"x": [2]})
    gated = _GatedBuild(monkeypatch)
    results = []
    builder = threading.Thread(target=lambda: results.append(cm(np.ones(3, np.float32))))
    builder.start()
    while gated.calls == 0:
        time.sleep(0.01)
    for _ in range(20):  # the build for shape [3] is held at the gate meanwhile
        np.testing.assert_array_equal(cm(np.ones(2, np.float32)), -np.ones(2, np.float32))
    assert not gated.gate_timed_out, "calls on a loaded variant waited for another shape's build"
    gated.gate.set()
    builder.join(timeout=120)
    np.testing.assert_array_equal(results[0], -np.ones(3, np.float32))


def test_callers_needing_one_variant_wait_for_one_build(monkeypatch):
    cm = smelt.compile(_neg_model(), threads=1)
    gated = _GatedBuild(monkeypatch)
    results = []
    threads = [threading.Thread(target=lambda: results.append(cm(np.full(5, 2, np.float32)))) for _ in range(4)]
    for t in threads:
        t.start()
    _wait_for_waiters(cm, 3)
    gated.gate.set()
    for t in threads:
        t.join(timeout=120)
    assert gated.calls == 1 and cm.compilations == 1
    assert len(results) == 4 and all(np.array_equal(r, np.full(5, -2, np.float32)) for r in results)


def test_a_failed_build_reaches_every_waiter_and_a_later_call_retries(monkeypatch):
    cm = smelt.compile(_neg_model(), threads=1)
    gated = _GatedBuild(monkeypatch, fail_first=True)
    errors = []

    def call():
        try:
            cm(np.ones(4, np.float32))
        except CompileError as err:
            errors.append(err)

    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
    _wait_for_waiters(cm, 2)
    gated.gate.set()
    for t in threads:
        t.join(timeout=120)
    assert len(errors) == 3 and all("injected build failure" in str(e) for e in errors)
    assert gated.calls == 1
    np.testing.assert_array_equal(cm(np.ones(4, np.float32)), -np.ones(4, np.float32))  # retried
    assert gated.calls == 2 and cm.compilations == 1


FORK_CHECK = """
def in_forked_child(fn, timeout=60):
    # fork, run fn() in the child (it must return True), fail on a crash, an error or a hang
    pid = os.fork()
    if pid == 0:
        code = 5
        try:
            code = 0 if fn() else 3
        except BaseException:
            traceback.print_exc()
            code = 4
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0, f"forked child exit {os.waitstatus_to_exitcode(status)}"
            return
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            raise AssertionError("the forked child hung")
        time.sleep(0.02)

cm = smelt.compile(chain_model(6, (1 << 16,)), threads=2)
x = np.linspace(-1, 1, 1 << 16, dtype=np.float32)
want = chain_expected(x, 6)
ok = lambda: np.array_equal(cm(x), want)
"""

FORK_SCENARIOS = {
    "before_any_call": """
        in_forked_child(ok)
        assert ok()  # the parent's pool still works
    """,
    "after_a_call": """
        assert ok()
        in_forked_child(lambda: ok() and ok())
        assert ok()
    """,
    "while_another_thread_is_mid_call": """
        stop = threading.Event()
        def busy():
            while not stop.is_set():
                assert ok()
        t = threading.Thread(target=busy)
        t.start()
        time.sleep(0.2)
        for _ in range(5):
            in_forked_child(ok)
        stop.set(); t.join()
        assert ok()
    """,
    "multiprocessing_fork_pool": """
        import multiprocessing as mp
        assert ok()
        with mp.get_context("fork").Pool(2) as pool:
            assert all(pool.map_async(lambda_ok, range(4)).get(timeout=60))
    """,
}


@pytest.mark.parametrize("scenario", list(FORK_SCENARIOS))
def test_compiled_model_works_in_a_forked_child(scenario):
    """A forked child has none of the pool's worker threads (a call there never returned, spinning
    on a core, and locks held by the parent's other threads stayed held)."""
    body = textwrap.dedent(FORK_SCENARIOS[scenario])
    out = _child(FORK_CHECK + "\ndef lambda_ok(_):\n    return ok()\n" + body + "\nprint('ok')\n", timeout=240)
    assert "ok" in out


def test_forked_child_rebuilds_the_pool_with_all_threads():
    """Not just a one-thread fallback: the child's next call gets a new pool of the model's size."""
    out = _child(FORK_CHECK + """
assert ok()
art = cm._current()
def child():  # one thread after the fork; the new pool adds its worker
    assert len(os.listdir("/proc/self/task")) == 1
    assert ok() and not art._pool_stale
    return len(os.listdir("/proc/self/task")) == 2
in_forked_child(child)
print("ok")
""")
    assert "ok" in out


def test_evicted_and_closed_variants_unmap_their_library():
    """Memory is bounded by the variants kept: an evicted variant's library is dlclosed (all 20
    libraries of a model stayed mapped before); a library two instances share stays mapped until
    both are closed."""
    out = _child("""
        cache = os.environ["SMELT_CACHE_DIR"]
        def mapped():
            with open("/proc/self/maps") as f:
                return {line.split()[-1] for line in f if cache in line and line.rstrip().endswith(".so")}
        cm = smelt.compile(chain_model(2, ("N",)), threads=2)
        for n in range(1, 6):
            assert np.array_equal(cm(np.ones(n, np.float32)), -np.ones(n, np.float32))
        assert len(cm._variants) == 2
        assert len(mapped()) == 2, sorted(mapped())
        cm.close()
        assert mapped() == set(), sorted(mapped())
        a = smelt.compile(chain_model(2, (64,)), threads=2)
        b = smelt.compile(chain_model(2, (64,)), threads=2)
        assert len(mapped()) == 1
        a.close()
        assert len(mapped()) == 1 and np.array_equal(b(np.ones(64, np.float32)), -np.ones(64, np.float32))
        b.close()
        assert mapped() == set()
        print("ok")
    """, SMELT_MAX_VARIANTS="2")
    assert "ok" in out


def _mutable_data_symbols(lib: Path, source: str) -> set[str]:
    """Writable data (sections .data, .bss and their thread-local twins; not .data.rel.ro, which
    holds const tables of pointers, read-only once relocated) the generated source defines (CRT
    symbols are not named in it); static locals carry a ".N" suffix."""
    out = subprocess.run(["objdump", "-t", str(lib)], capture_output=True, text=True, check=True).stdout
    writable = (".data", ".bss", ".tdata", ".tbss")
    names = {line.split()[-1] for line in out.splitlines()
             if len(line.split()) >= 5 and any(f" {sec}\t" in line for sec in writable)}
    return {n for n in names if n.split(".")[0] in source}


@pytest.mark.skipif(shutil.which("objdump") is None, reason="needs binutils' objdump")
def test_generated_libraries_have_no_mutable_globals(monkeypatch):
    """Instances of one model share its .so, so the generated code must keep nothing mutable in
    library globals (a dynamic RNN's T/B and the profile counters were). Allowed: the fork epoch
    and the per-thread error flag, process-wide by nature."""
    from smelt.frontend.zoo.rnn import lstm_model

    monkeypatch.setenv("SMELT_DEBUG", "1")  # keeps the generated C (source_path)
    models = [smelt.compile(lstm_model(8, 16, "B", "T"), threads=2, max_dims={"T": 8, "B": 4}),
              smelt.compile(chain_model(3, (256,)), threads=2, profile=True)]
    for cm in models:
        lib = cm._current().lib_path
        found = _mutable_data_symbols(lib, cm.source_path.read_text())
        assert found <= {"smelt_fork_epoch", "smelt_tls_error"}, (cm.source_path, found)


def test_profile_counters_are_per_instance():
    model = chain_model(3, (256,))
    a = smelt.compile(model, threads=2, profile=True)
    b = smelt.compile(model, threads=2, profile=True)
    assert a._current().lib_path == b._current().lib_path
    x = np.ones(256, np.float32)
    a.profile_reset()
    b.profile_reset()
    for _ in range(3):
        a(x)
    b(x)
    assert a.profile_counters().block_seconds.size == 1
    assert (a.profile_counters().calls, b.profile_counters().calls) == (3, 1)
    raw = [art._prof_views[0][0] for art in (a._current(), b._current())]  # native call counts
    assert list(raw) == [3, 1]


def test_stress_threads_variant_churn_two_instances_and_growth(tmp_path):
    """A few seconds of everything at once (see tests/concurrency_stress.py)."""
    from concurrency_stress import write_references

    refs = tmp_path / "refs.npz"
    write_references(str(refs))
    proc = run_python(TESTS / "concurrency_stress.py", "3", str(refs), timeout=600,
                      extra_env={"SMELT_MAX_VARIANTS": "2"})
    assert proc.returncode == 0 and "stress ok" in proc.stdout, proc.stderr[-4000:]


def test_eight_threads_two_hundred_calls_bit_identical():
    cm = smelt.compile(chain_model(6, (4096,)), threads=2)
    xs = [np.random.default_rng(s).standard_normal(4096).astype(np.float32) for s in range(8)]
    wants = [chain_expected(x, 6) for x in xs]
    bad = []

    def worker(i):
        for _ in range(200):
            if not np.array_equal(cm(xs[i]), wants[i]):
                bad.append(i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not bad
