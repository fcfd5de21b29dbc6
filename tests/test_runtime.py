"""Runtime properties: idle cost, concurrent callers, cache reuse and races, name escaping."""

from __future__ import annotations

import os
import re
import threading
import time

import numpy as np
import pytest
from helpers import chain_expected, chain_model, make_model, tensor
from onnx import helper

import smelt


def _chain(n_nodes: int = 4, size: int = 1 << 16):
    return chain_model(n_nodes, (size,))


def test_idle_pool_uses_no_cpu():
    cm = smelt.compile(_chain(), threads=max(2, os.cpu_count() or 1))
    x = np.ones(1 << 16, np.float32)
    for _ in range(5):
        cm(x)
    time.sleep(1.0)  # the pool spins briefly after a call, then sleeps
    cpu0, wall0 = time.process_time(), time.perf_counter()
    time.sleep(1.0)
    used = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
    assert used < 0.05, f"idle model used {used:.1%} of a core"


def test_concurrent_callers_get_their_own_answers():
    cm = smelt.compile(_chain(6), threads=2)
    errors = []

    def worker(seed):
        rng = np.random.default_rng(seed)
        for _ in range(30):
            x = rng.standard_normal(1 << 16).astype(np.float32)
            if not np.array_equal(cm(x), chain_expected(x, 6)):
                errors.append(seed)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_one_native_call_per_inference_without_python_between_ops():
    """The whole graph runs in one foreign call: the Python work per inference does not grow with
    the number of operators."""
    import sys

    def python_calls(cm, x):
        count = 0

        def prof(frame, event, arg):
            nonlocal count
            if event == "call":
                count += 1

        sys.setprofile(prof)
        try:
            cm(x)
        finally:
            sys.setprofile(None)
        return count

    small, large = smelt.compile(_chain(2, 64), threads=2), smelt.compile(_chain(40, 64), threads=2)
    x = np.ones(64, np.float32)
    small(x), large(x)
    before = large.native_calls
    large(x)
    assert large.native_calls - before == 1
    assert python_calls(small, x) == python_calls(large, x)


def test_second_compile_loads_from_cache_quickly(tmp_path, monkeypatch):
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    model = _chain(10)
    first = smelt.compile(model)
    assert not first.from_cache
    start = time.perf_counter()
    second = smelt.compile(model)
    elapsed = time.perf_counter() - start
    assert second.from_cache
    assert elapsed < 1.0, f"cached compile took {elapsed:.2f} s"
    x = np.linspace(-1, 1, 1 << 16, dtype=np.float32)
    np.testing.assert_array_equal(first(x), second(x))


_CHILD = """
import os, sys
import numpy as np
import pytest
import onnx
import smelt
cm = smelt.compile(onnx.load(sys.argv[1]), threads=1)
x = np.linspace(-1, 1, 1 << 16, dtype=np.float32)
print(cm.source_path, float(cm(x).sum()))
"""


def test_two_processes_compiling_at_once_both_succeed(tmp_path):
    import subprocess
    import sys

    import onnx

    path = tmp_path / "m.onnx"
    onnx.save(_chain(12), str(path))
    cache = tmp_path / "cache"
    env = dict(os.environ, SMELT_CACHE_DIR=str(cache))
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD, str(path)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        results.append(out.strip())
    assert results[0] == results[1]
    libs = list((cache / "lib").rglob("*.so"))
    assert len(libs) == 1
    assert not list(cache.rglob("*.tmp")) and not list((cache / "models").rglob(".tmp-*"))
    assert len(list((cache / "models").rglob("plan.json"))) == 1


def test_hostile_names_never_reach_c_unescaped(monkeypatch):
    monkeypatch.setenv("SMELT_DEBUG", "1")  # keeps the generated C (source_path)
    evil = 'x*/ system("id"); /*'
    nodes = [helper.make_node("Relu", [evil], ["r*/ exit(1); /*"], name=evil),
             helper.make_node("Neg", ["r*/ exit(1); /*"], ["y\n#include </etc/passwd>"], name="n2\n#error boom")]
    model = make_model(nodes, [tensor(evil, [8])], [tensor("y\n#include </etc/passwd>", [8])],
                       name='g*/ int evil; /*')
    cm = smelt.compile(model, threads=1)
    source = cm.source_path.read_text()
    assert 'system("id")' not in source and "exit(1)" not in source
    assert "#include </etc/passwd>" not in source and "#error boom" not in source
    assert not re.search(r"\*/ *int evil", source)
    x = np.linspace(-1, 1, 8, dtype=np.float32)
    np.testing.assert_array_equal(cm(x), -np.maximum(x, 0))


def test_fallback_node_failing_on_its_run_time_inputs_is_a_smelt_error(tmp_path, monkeypatch):
    """A fallback node whose run-time data no check can see (a Reshape to a shape fed as an
    input) raised numpy's ValueError; now a SmeltError naming the node and op."""
    import pytest
    from onnx import TensorProto

    from smelt.errors import SmeltError

    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path / "cache"))
    node = helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape_to_input")
    model = make_model([node], [tensor("x", [2, 3]), tensor("s", [2], TensorProto.INT64)],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    compiled = smelt.compile(model, threads=1)
    ok = compiled.run({"x": np.ones((2, 3), np.float32), "s": np.array([3, 2], np.int64)})
    assert ok[0].shape == (3, 2)
    with pytest.raises(SmeltError, match=r"reshape_to_input.*Reshape.*cannot reshape"):
        compiled.run({"x": np.ones((2, 3), np.float32), "s": np.array([4, 5], np.int64)})


def test_buffers_between_blocks_are_aligned_for_vector_stores(tmp_path, monkeypatch):
    """A blocked (NCHW8c/16c) conv output that crosses into the next native block through a
    fallback step lives in a buffer the runtime allocates; kernels store whole vectors there with
    aligned stores. numpy only aligns to 16 bytes: it crashed about 1 call in 2 on AVX2. Every
    buffer a native block writes (and every output handed back) is 64-byte aligned now; the
    model runs in a child process, so a crash fails the test instead of pytest."""
    import subprocess
    import sys

    script = tmp_path / "run.py"
    script.write_text('''
import numpy as np
import pytest
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
import smelt

w = numpy_helper.from_array(np.linspace(-1, 1, 16, dtype=np.float32).reshape(16, 1, 1, 1), "w")
b = numpy_helper.from_array(np.ones((8, 4), np.float32), "b")
nodes = [helper.make_node("Conv", ["img", "w"], ["c"], name="conv"),
         helper.make_node("Relu", ["c"], ["y"], name="relu"),
         helper.make_node("MatMul", ["col", "b"], ["m"], name="mm")]
graph = helper.make_graph(
    nodes, "g", [helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, 1, 4, 8]),
                 helper.make_tensor_value_info("col", TensorProto.FLOAT, [3, 8])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
     helper.make_tensor_value_info("m", TensorProto.FLOAT, None)], initializer=[w, b])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
feeds = {"img": np.arange(32, dtype=np.float32).reshape(1, 1, 4, 8) - 10, "col": np.ones((3, 8), np.float32)}
want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
# the MatMul between the conv and the transform that makes its blocked output plain splits the
# native code in two blocks: the conv's blocked output is a buffer between blocks
compiled = smelt.compile(model, threads=1, force_fallback=["mm"])
assert compiled.fallback_nodes == ["mm"], compiled.fallback_nodes
for _ in range(50):
    got = compiled.run(feeds)
    for g, w_ in zip(got, want):
        np.testing.assert_allclose(g, w_, rtol=1e-6, atol=1e-6)
    assert got[0].ctypes.data % 64 == 0  # written by a native block (m comes from the fallback)
print("ok")
''')
    env = dict(os.environ, SMELT_CACHE_DIR=str(tmp_path / "cache"))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), (run.returncode, run.stdout[-500:], run.stderr[-2000:])


def _pool_counts(cm) -> tuple[int, int, int, int]:
    """(shares run, shares stolen, steps run alone by the caller, steps per call) of the compiled
    model's current variant."""
    import ctypes

    art = cm._current()
    out = (ctypes.c_ulonglong * 3)()
    art.lib.smelt_pool_counts.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    art.lib.smelt_pool_counts(art.pool, out)
    steps = sum(len(s.step_nodes) for s in art.plan.steps if hasattr(s, "step_nodes"))
    return out[0], out[1], out[2], steps


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_unaligned_and_strided_graph_inputs(isa, tmp_path):
    """Graph inputs 4 bytes past a 64-byte boundary (numpy views of a byte buffer) and odd-strided
    views go to every kind of template a model starts with: a recurrent layer, a blocked conv net
    (layout transform, NCHWc, pooling), Resize/ConvTranspose, a GEMM. The answers equal those of
    aligned contiguous inputs; run in a child, so an aligned vector load on an input would fail
    the test rather than crash pytest."""
    import subprocess
    import sys

    from smelt.target import detect

    if isa == "avx2" and (detect().isa == "avx2" or "avx2" not in detect().isa_caps()):
        pytest.skip("avx2 is the native ISA here (or not runnable)")
    script = tmp_path / "run.py"
    script.write_text(f'''
import numpy as np, smelt
from smelt.bench.harness import resolve_model
def unaligned(a):
    buf = np.empty(a.nbytes + 64, np.uint8)
    base = (-buf.ctypes.data) % 64 + 4
    u = np.frombuffer(buf[base:base + a.nbytes], a.dtype).reshape(a.shape)
    u[...] = a
    return u
for spec in ("zoo:lstm-E32-H48-B3-T7-bi", "zoo:squeezenet1_1"):
    bm = resolve_model(spec)
    cm = smelt.compile(bm.proto, threads=2, input_shapes={{k: v.shape for k, v in bm.feeds.items()}}, isa={isa!r})
    want = cm.run(bm.feeds)
    odd = {{k: unaligned(v) for k, v in bm.feeds.items()}}
    assert all(v.ctypes.data % 64 == 4 for v in odd.values())
    strided = {{k: np.repeat(v, 3, axis=-1)[..., 1::3] for k, v in bm.feeds.items()}}
    for feeds in (odd, strided):
        for g, w in zip(cm.run(feeds), want):
            assert np.array_equal(g, w), spec
print("ok")
''')
    env = dict(os.environ, SMELT_CACHE_DIR=str(tmp_path / "cache"))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), (run.returncode, run.stderr[-2000:])


def test_a_late_worker_s_shares_run_once_by_the_others(monkeypatch):
    """A worker the OS runs late (the test hook sleeps before it enters each job): its shares of
    every step are run by the caller, each exactly once, and the answers do not change. With
    a 1 ms delay on ~0.1 ms steps the worker joins mid-job in some calls and not at all in others."""
    n_nodes, calls = 24, 12
    model = chain_model(n_nodes, (1 << 18,))
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(1 << 18).astype(np.float32) for _ in range(calls)]
    for delay in ("1:1000", "1:50000"):
        monkeypatch.setenv("SMELT_TEST_DELAY_WORKER", delay)
        cm = smelt.compile(model, threads=2)
        for x in xs:
            assert np.array_equal(cm(x), chain_expected(x, n_nodes))
        run, stolen, solo, steps = _pool_counts(cm)
        assert steps >= n_nodes // 2
        assert solo == 0  # no step synchronizes: nothing to run alone
        assert run == calls * steps * 2, (delay, run, calls, steps)
        assert stolen > 0, delay
        if delay == "1:50000":  # the worker sleeps through most calls: the caller ran their shares
            assert stolen >= calls * steps // 2, (stolen, calls, steps)


def test_synchronizing_steps_wait_for_a_worker_or_run_alone(monkeypatch):
    """The RNN recurrence's shares meet inside the step (group barriers): never stolen. A worker
    that has entered is waited for; one that has not entered within the grace period is not:
    the caller runs the node (and the rest of the job) alone. Answers match onnxruntime either way,
    and every step runs exactly once per call (as nt shares, or alone)."""
    from helpers import ort_run

    from smelt.frontend.zoo.rnn import lstm_model

    model = lstm_model(32, 64, 2, 12)
    x = np.random.default_rng(1).standard_normal((12, 2, 32)).astype(np.float32)
    name = model.graph.input[0].name
    want = ort_run(model, {name: x})
    for delay in ("1:0", "1:50000"):
        monkeypatch.setenv("SMELT_TEST_DELAY_WORKER", delay)
        cm = smelt.compile(model, threads=2)
        for _ in range(4):
            got = cm.run({name: x})
            for g, w in zip(got, want, strict=True):
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
        run, _, solo, steps = _pool_counts(cm)
        assert run + 2 * solo == 4 * steps * 2, (delay, run, solo, steps)
        if delay == "1:50000":
            assert solo >= 2 * steps, (run, solo, steps)


def test_arena_pool_keeps_one_buffer_per_concurrent_caller():
    """runtime/memory.py: one caller holds one buffer, grown to the largest request; a second
    caller while the first holds it gets its own; sizes never shrink below a request."""
    from smelt.runtime.memory import ArenaPool
    from smelt.runtime.module import aligned_empty

    pool = ArenaPool(aligned_empty)
    a = pool.take(1000)
    assert a[0].nbytes >= 1000 and a[1] == a[0].ctypes.data and a[1] % 64 == 0
    pool.give(a)
    b = pool.take(500)  # the free 1000-byte buffer serves it
    assert b[0] is a[0] and pool.allocated == 1000
    pool.give(b)
    c = pool.take(4000)  # too small: dropped, a bigger one made
    assert c[0].nbytes >= 4000 and pool.allocated == 4000
    d = pool.take(100)  # c is taken: a second caller's own buffer
    assert d[0] is not c[0] and pool.allocated == 4100
    pool.give(c)
    pool.give(d)
    assert pool.take(3000)[0] is c[0] and pool.largest() == d[0].nbytes


def test_data_pointers_and_direct_call_outputs(monkeypatch):
    """``data_ptr`` (the data pointer read from the array object, not through numpy's
    ``.ctypes`` helper) agrees with ``.ctypes.data`` on contiguous arrays, views at an offset,
    strided and empty arrays, and falls back to ``.ctypes.data`` where the layout probe failed.
    The one-native-block call puts every output in one allocation: each 64-byte aligned, none
    overlapping another, and a later call never writes into the arrays an earlier call returned."""
    from smelt.runtime import module

    base = np.arange(4 * 8 * 6, dtype=np.float32).reshape(4, 8, 6)
    for a in (base, base[1:], base[:, 3:, 1:], base[::2, :, ::3], np.empty((0, 5), np.float64),
              np.frombuffer(bytearray(24), np.uint8)[5:]):
        assert module.data_ptr(a) == a.ctypes.data
    with pytest.raises(AttributeError):  # a numpy scalar: no data field to read, loud not wild
        module.data_ptr(np.float32(1.5))
    monkeypatch.setattr(module, "_DATA_OFFSET", None)
    assert module.data_ptr(base[2:]) == base[2:].ctypes.data
    monkeypatch.undo()

    x = helper.make_tensor_value_info("x", 1, [3, 5])
    outs = [helper.make_tensor_value_info(n, 1, None) for n in ("r", "n", "s")]
    model = make_model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["x"], ["n"]),
                        helper.make_node("Sigmoid", ["x"], ["s"])], [x], outs)
    cm = smelt.compile(model, threads=1)
    feed = np.linspace(-2, 2, 15, dtype=np.float32).reshape(3, 5)
    first = cm.run({"x": feed})
    assert cm._current()._direct is not None  # the path under test
    spans = sorted((module.data_ptr(a), module.data_ptr(a) + a.nbytes) for a in first)
    assert all(lo % 64 == 0 for lo, _ in spans)
    assert all(spans[i][1] <= spans[i + 1][0] for i in range(len(spans) - 1))
    kept = [a.copy() for a in first]
    second = cm.run({"x": -feed})
    for a, k in zip(first, kept, strict=True):
        np.testing.assert_array_equal(a, k)
    np.testing.assert_array_equal(second[0], np.maximum(-feed, 0))
    np.testing.assert_array_equal(first[1], -feed)


def test_a_one_thread_recurrence_does_not_wait_for_a_worker(monkeypatch):
    """A recurrence whose grid gives its direction group one thread (small steps: GRU H=16 B=1;
    a T=1 LSTM without initial state, whose one step has no h·R) has no barrier inside, so its
    step stays shareable like the projection before it: a late worker's shares are run by the
    caller (stolen), nothing waits for it or runs "alone", and the answers match onnxruntime."""
    from helpers import ort_run

    from smelt.frontend.zoo.rnn import lstm_model

    for model, shape in ((lstm_model(8, 16, 1, 12, cell="gru"), (12, 1, 8)), (lstm_model(32, 256, 1, 1), (1, 1, 32))):
        x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
        name = model.graph.input[0].name
        want = ort_run(model, {name: x})
        monkeypatch.setenv("SMELT_TEST_DELAY_WORKER", "1:50000")
        cm = smelt.compile(model, threads=2)
        for _ in range(3):
            for g, w in zip(cm.run({name: x}), want, strict=True):
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
        run, stolen, solo, steps = _pool_counts(cm)
        assert solo == 0 and run == 3 * steps * 2, (run, solo, steps)
        assert stolen >= 3 * steps // 2, (stolen, steps)
