"""Run a compiled artifact: load the shared library, own the thread pool, execute the plan.

An artifact is a directory holding ``plan.json`` (the steps, with every external value's name,
dtype and shape; its schema, reader and writer are ``smelt.runtime.artifact``), ``weights.bin``
and, for fallback steps, one small ONNX model per node. A fully
native model is a single native block: ``run`` makes exactly one foreign call per inference.

Concurrency: one ``LoadedArtifact`` has one arena and one pool, so calls are serialized by a
lock; concurrent callers are safe and are served one after the other (each inference already
uses every core). For parallel throughput, load several instances (``smelt bench --instances``):
instances share nothing mutable (one ``.so`` may back several, so the generated code keeps its
mutable state in the per-instance state buffer, never in library globals).

Lifetime: a call holds a reference (``acquire``/``release``; ``run`` takes one itself), and
``close`` only marks the artifact closed: its pool, arena, state and library are freed when the
last call in flight returns. The library is dlclosed then (each instance dlopens it, so it stays
mapped while another instance uses it), so memory is bounded by the artifacts kept.

fork(): the pool's workers do not exist in a forked child. After ``os.fork()`` every live
artifact re-creates its locks (another thread may have held them at the fork), forgets the calls
in flight in the parent, and replaces its pool with a new one on its next call (the C pool also
refuses to post jobs to workers of another process: see ``csrc/smelt_rt.h``).

An instrumented artifact (compiled with ``profile=True``) also keeps per-step timings: the native
code's counters (see the "Instrumented build" section of ``csrc/smelt_rt.h``), and the time of
each fallback step, measured here. ``profile_counters()`` reads them all, in execution order.

A dynamic artifact (recurrent models, ``smelt.api``'s dynamic mode) is compiled for bounds of the
sequence length T and batch B; its recurrent kernels read the actual T and B of each recurrent
node from the node's int64 pair in the instance state, which ``run`` sets from the node's X
before the call (the template records, with ``BlockEmitter.dynamic_dims``, where the pair is,
which input carries T and B, and the output shapes in terms of T and B: the block's
``artifact.DynamicDims``). Its fallback steps (the shape glue) run on whatever shapes arrive.
"""

from __future__ import annotations

import _ctypes
import ctypes
import math
import os
import re
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from smelt.errors import SmeltError, UnsupportedOpError
from smelt.runtime import artifact
from smelt.runtime.artifact import ArtifactPlan, DynamicDims, NativeBlockEntry, TensorSpec
from smelt.runtime.loop import BodyModel, NativeLoopRunner
from smelt.runtime.memory import ArenaPool, shared_weights

# Header words of a block's counter array (smelt_rt.h: SMELT_PROF_*).
_PROF_CALLS, _PROF_TICKS, _PROF_NS, _PROF_STEPS, _PROF_THREADS, _PROF_STRIDE, _PROF_HEADER = 0, 1, 2, 3, 4, 5, 8


@dataclass(frozen=True)
class ProfiledStep:
    """One step of the plan, in execution order: a native step (``block`` >= 0, ``step`` its
    index in the block) or a fallback node (``block`` None)."""

    block: int | None
    step: int
    node: str
    op: str


@dataclass
class ProfileCounters:
    """Cumulative timings of an instrumented artifact since its last reset.

    ``seconds[i]``: wall time of step i summed over its calls; a native step's runs on thread 0
    from the end of the previous step's barrier to the end of its own (so it includes waiting
    for the slowest thread). ``busy[i, t]``: thread t's time on step i, barrier wait excluded (a
    fallback step: all on thread 0). ``block_seconds[k]``: wall time of native block k's entry
    (its steps plus the pool's dispatch and join). ``calls``: inferences run.
    Subtracting two snapshots gives the timings of the calls between them.
    """

    steps: list[ProfiledStep]
    calls: int
    seconds: np.ndarray  # [steps] float64
    busy: np.ndarray  # [steps, threads] float64
    block_seconds: np.ndarray  # [native blocks] float64

    def __sub__(self, other: ProfileCounters) -> ProfileCounters:
        return ProfileCounters(self.steps, self.calls - other.calls, self.seconds - other.seconds,
                               self.busy - other.busy, self.block_seconds - other.block_seconds)


# Objects whose ``_after_fork_in_child()`` runs in the child after os.fork() (see the module doc).
_FORK_AWARE: weakref.WeakSet = weakref.WeakSet()


def reinit_after_fork(obj: object) -> None:
    """Have ``obj._after_fork_in_child()`` called in every child forked from now on."""
    _FORK_AWARE.add(obj)


def _after_fork_in_child() -> None:
    for obj in list(_FORK_AWARE):
        obj._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


def aligned_empty(nbytes: int, align: int = 64) -> np.ndarray:
    """A zeroed byte buffer whose data pointer is ``align``-byte aligned."""
    buf = aligned_array((nbytes,), np.dtype(np.uint8), align)
    buf.fill(0)
    return buf


def _probe_data_offset() -> int | None:
    """Where an ndarray object keeps its data pointer: right after the object header in numpy's
    ``PyArrayObject_fields`` (16 bytes on a default CPython build). Checked here on real arrays,
    so a build with another layout (free-threaded CPython) gets None and the slow path."""
    off = 2 * ctypes.sizeof(ctypes.c_void_p)
    try:
        for a in (np.empty(3, np.float32), np.empty((5, 7), np.uint8)[1:]):
            if ctypes.c_void_p.from_address(id(a) + off).value != a.ctypes.data:
                return None
    except Exception:  # noqa: BLE001 - any surprise: the slow, documented path
        return None
    return off


_DATA_OFFSET = _probe_data_offset()
_VOIDP = ctypes.c_void_p


def data_ptr(arr: np.ndarray) -> int:
    """``arr.ctypes.data`` in ~0.15 us instead of ~1 us (numpy builds a helper object per
    ``.ctypes``): read per call for every fed and returned array, a T=1 LSTM's 15 us call spent
    6 us here. Falls back to ``.ctypes.data`` where the layout probe failed."""
    if _DATA_OFFSET is None or not isinstance(arr, np.ndarray):  # (a numpy scalar has no such field)
        return arr.ctypes.data
    return _VOIDP.from_address(id(arr) + _DATA_OFFSET).value or 0


def aligned_array(shape: tuple[int, ...], dtype: np.dtype, align: int = 64) -> np.ndarray:
    """An uninitialised array whose data is ``align``-byte aligned. Every buffer a native block
    writes is one: kernels store whole vectors with aligned stores (a blocked NCHW8c output
    is 32-byte vectors), and numpy only guarantees 16 bytes (a Conv whose blocked output crossed
    into the next block through a fallback step crashed 1 call in 2 on AVX2)."""
    dt = np.dtype(dtype)
    nbytes = math.prod(shape) * dt.itemsize  # math.prod: no Python-level numpy call per inference
    raw = np.empty(nbytes + align, dtype=np.uint8)
    return np.ndarray(shape, dt, raw, (-data_ptr(raw)) % align)


def _glue_fn(model):
    """A numpy implementation of a one-node shape-glue model (Squeeze, Unsqueeze, Reshape,
    Transpose, Identity), or None. onnx.reference costs ~15-30 us per such node; this ~1-3 us,
    which matters for recurrent models in dynamic mode, where this glue runs between kernels."""
    from onnx import helper, numpy_helper

    if len(model.graph.node) != 1:
        return None
    node = model.graph.node[0]
    if node.domain not in ("", "ai.onnx") or len(node.output) != 1:
        return None
    consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    data = node.input[0] if node.input else ""
    if not data or data in consts:
        return None
    second = consts.get(node.input[1]) if len(node.input) > 1 and node.input[1] else None
    if len(node.input) > 1 and node.input[1] and second is None:
        return None  # a run-time axes/shape input: leave it to onnx.reference
    op = node.op_type
    if op == "Identity":
        return lambda x: x
    if op == "Transpose":
        perm = attrs.get("perm")
        return lambda x: np.ascontiguousarray(np.transpose(x, perm))
    if op in ("Squeeze", "Unsqueeze"):
        axes = attrs.get("axes") if second is None else [int(a) for a in second.reshape(-1)]
        if op == "Squeeze":
            return lambda x: np.squeeze(x, axis=None if axes is None else tuple(axes))
        if axes is None:
            return None

        def unsqueeze(x):
            r = x.ndim + len(axes)
            return np.expand_dims(x, tuple(sorted(a % r for a in axes)))
        return unsqueeze
    if op == "Reshape" and second is not None and not attrs.get("allowzero", 0):
        spec = [int(v) for v in second.reshape(-1)]

        def reshape(x):
            shape = [x.shape[i] if v == 0 else v for i, v in enumerate(spec)]
            return x.reshape(shape)
        return reshape
    return None


class _FallbackRunner:
    """One node executed by onnx.reference, between native blocks (reported, never silent)."""

    def __init__(self, model_path: Path, inputs: list[str], outputs: list[TensorSpec | None],
                 check_shapes: bool = True) -> None:
        import onnx
        from onnx.reference import ReferenceEvaluator

        self.model = onnx.load(str(model_path))
        from smelt.runtime.reference_ops import FIXED_OPS

        try:
            self.evaluator = ReferenceEvaluator(self.model, new_ops=FIXED_OPS)
        except (NotImplementedError, RuntimeError, ValueError, TypeError) as exc:
            # an op onnx.reference lacks (ai.onnx.ml's ZipMap, whose sequence-of-maps output
            # smelt cannot represent either): say which node, not onnx's list of what it has
            node = self.model.graph.node[0]
            where = f"domain {node.domain!r}" if node.domain else "the ONNX standard"
            first = (re.split(r"\s+in\s", str(exc))[0].splitlines() or [type(exc).__name__])[0]  # not onnx's op list
            raise UnsupportedOpError(node.op_type, node.name,
                                     f"no native kernel, and onnx.reference (the fallback) has no implementation "
                                     f"of this {where} op either ({first})") from None
        self.inputs = inputs
        self.outputs = outputs
        self.check_shapes = check_shapes
        self.fast = _glue_fn(self.model)

    def run(self, env: dict[str, np.ndarray]) -> None:
        feeds = {name: env[name] for name in self.inputs}
        try:
            if self.fast is not None and len(self.inputs) == 1:
                results = [self.fast(feeds[self.inputs[0]])]
            else:
                results = self.evaluator.run(None, feeds)
        except Exception as exc:  # run-time data no check could see (a Reshape target fed as input)
            node = self.model.graph.node[0]
            raise SmeltError(f"node {node.name!r} ({node.op_type}, run by the onnx.reference fallback) failed "
                             f"on its run-time inputs: {type(exc).__name__}: {exc}") from exc
        for spec, name, value in zip(self.outputs, self.model.graph.output, results, strict=False):
            if value is None or isinstance(value, list):  # optional / sequence values pass through
                env[name.name] = value
                continue
            arr = np.asarray(value)
            if self.check_shapes and spec is not None and spec.shape and arr.shape != spec.shape:
                raise SmeltError(
                    f"fallback node produced {name.name!r} with shape {arr.shape}, "
                    f"but the plan expected {spec.shape}"
                )
            env[name.name] = arr


def _open_private(lib_path: Path, slots: tuple[tuple[int, ...], tuple[float, ...]]) -> ctypes.CDLL:
    """A library shared by several shapes (``codegen.shape_slots``), loaded as a private copy
    (dlopen maps one file once per process, and each shape needs its own slot values) with this
    shape's slot values set. The copy is unlinked at once: the mapping keeps it alive."""
    fd, tmp = tempfile.mkstemp(suffix=".so", prefix=".slots-", dir=Path(lib_path).parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(Path(lib_path).read_bytes())
        lib = ctypes.CDLL(tmp)
    finally:
        os.unlink(tmp)
    ints, floats = slots
    lib.smelt_set_slots.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    si = (ctypes.c_long * max(1, len(ints)))(*ints)
    sf = (ctypes.c_double * max(1, len(floats)))(*floats)
    lib.smelt_set_slots(si, sf)
    return lib


class LoadedArtifact:
    """A compiled variant in memory: library, pool, weights, arena, instance state and plan.

    Reference-counted (see the module doc): ``acquire`` before a call (False once closed),
    ``release`` after; ``run`` does both. ``close`` frees everything once no call is in flight.
    """

    def __init__(self, directory: Path, lib_path: Path, n_threads: int, cpus: list[int],
                 dynamic: bool = False, arenas: ArenaPool | None = None,
                 compile_loop_body: Callable[[onnx.ModelProto], BodyModel] | None = None) -> None:
        self.directory = directory
        self.dynamic = dynamic
        meta = artifact.load(directory)
        self.plan: ArtifactPlan = meta
        self.inputs = list(meta.inputs)
        self.outputs = list(meta.outputs)
        self.lib_path = lib_path
        self._lock = threading.Lock()  # one call at a time: one arena, one pool
        self._refs_lock = threading.Lock()  # guards the lifetime fields below
        self._refs = 0  # calls in flight
        self._closed = False  # no new calls; freed when _refs drops to 0
        self._freed = False
        self.lib = (_open_private(lib_path, meta.slots) if meta.slots is not None
                    else ctypes.CDLL(str(lib_path)) if meta.native_blocks else None)
        # the same bytes as another loaded variant's (a shape class's variants): one buffer
        self.weights = (shared_weights(directory / "weights.bin", meta.weights_bytes, aligned_empty)
                        if meta.weights_bytes else aligned_empty(1))
        # the arena: its own, or taken per call from the model's pool (runtime/memory.py), which
        # its other variants share, so memory follows the largest shape rather than their sum
        self._arenas = arenas
        self._arena_bytes = max(64, meta.arena_bytes + meta.scratch_bytes)
        self.arena = aligned_empty(self._arena_bytes) if arenas is None else None
        self._arena_addr = 0  # with a pool: the address the pointers below were made for
        self._arena_ptr = self._scratch_ptr = None
        if self.arena is not None:
            self._arena_ptr = ctypes.c_void_p(self.arena.ctypes.data)
            self._scratch_ptr = ctypes.c_void_p(self.arena.ctypes.data + meta.arena_bytes)
        self._weights_ptr = ctypes.c_void_p(self.weights.ctypes.data)
        self.state = aligned_empty(64)  # mutable per-instance data of the generated code
        if self.lib is not None:
            self.lib.smelt_state_bytes.restype = ctypes.c_long
            self.lib.smelt_state_init.argtypes = [ctypes.c_void_p]
            self.state = aligned_empty(max(64, self.lib.smelt_state_bytes()))
            self.lib.smelt_state_init(self.state.ctypes.data)
        self._state_ptr = ctypes.c_void_p(self.state.ctypes.data)
        if meta.slots is not None and self.lib is not None:
            # a shape class's artifact is for one shape: its recurrent nodes' run-time (T, B)
            # are the sizes it was rendered at, set once
            pairs = self.state[: self.state.size // 8 * 8].view(np.int64)
            for step in meta.native_blocks:
                for d in step.dynamic:
                    pairs[d.state // 8], pairs[d.state // 8 + 1] = d.max_t, d.max_b
        self.n_threads = n_threads
        self._cpus = list(cpus)
        self.native_calls = 0
        self.profiling = meta.profile
        self._prof_views: list[np.ndarray] = []  # per native block, a view of its counters in the state
        self._fallback_ns: dict[int, int] = {}  # fallback step index -> ns summed over calls
        self._profile_calls = 0
        self.steps: list[tuple] = []
        self.consts: dict[str, np.ndarray] = {}
        if (directory / "consts.npz").exists():
            with np.load(directory / "consts.npz") as npz:
                self.consts = {k: npz[k] for k in npz.files}
        for step in meta.steps:
            if isinstance(step, NativeBlockEntry):
                fn = getattr(self.lib, f"smelt_block_{step.index}")
                fn.restype = ctypes.c_int
                fn.argtypes = [ctypes.c_void_p] * 7
                ins, outs = list(step.ext_inputs), list(step.ext_outputs)
                self.steps.append(("native", fn, ins, outs, (ctypes.c_void_p * max(1, len(ins)))(),
                                   (ctypes.c_void_p * max(1, len(outs)))(), step.step_nodes))
            else:
                runner = _FallbackRunner(directory / step.model, list(step.inputs), list(step.outputs),
                                         check_shapes=not dynamic)
                if step.op == "Loop" and compile_loop_body is not None:
                    # a run-time trip count or condition: the body compiled, iterated in Python
                    # (runtime/loop.py); the reference runner stays for what that cannot take
                    runner = NativeLoopRunner(directory / step.model, compile_loop_body, runner)
                self.steps.append(("fallback", runner, step.node, step.op))
        if self.profiling and self.lib is not None:
            self._bind_profile_counters()
        # dynamic artifacts: per native step, the recurrent nodes' run-time (T, B) slots in the state
        self._dyn: dict[int, tuple[DynamicDims, ...]] = {}
        self._dims = None
        if dynamic and self.lib is not None:
            self._dyn = {si: step.dynamic for si, step in enumerate(meta.steps)
                         if isinstance(step, NativeBlockEntry) and step.dynamic}
            if self._dyn:
                self._dims = (ctypes.c_int64 * (self.state.size // 8)).from_address(self.state.ctypes.data)
        self.pool = None
        self._pool_stale = False  # created before a fork(): replaced on the next call
        if self.lib is not None:
            self.lib.smelt_create_pool.restype = ctypes.c_void_p
            self.lib.smelt_create_pool.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
            self.lib.smelt_destroy_pool.argtypes = [ctypes.c_void_p]
            self.pool = self._create_pool()
        self._direct = self._direct_plan()
        reinit_after_fork(self)

    def _direct_plan(self) -> tuple | None:
        """For the common plan of one native block and nothing else (not profiling, static
        shapes, every graph output written by the block): which ``in`` slots take which feeds
        (constants' slots filled once here), the outputs' shapes, and each graph output's slot.
        ``run_acquired`` then skips the general step loop: a few microseconds a call, which is
        a fifth of a 20 us wake-word model."""
        if len(self.steps) != 1 or self.steps[0][0] != "native" or self.profiling or self._dims is not None:
            return None
        _, _, ins, outs, in_ptrs, _, _ = self.steps[0]
        feeds = []
        for i, spec in enumerate(ins):
            const = self.consts.get(spec.name)
            if const is not None:
                if const.dtype != spec.dtype or not const.flags.c_contiguous:
                    return None
                in_ptrs[i] = const.ctypes.data  # self.consts keeps it alive
            else:
                feeds.append((i, spec.name, spec.dtype))
        slots = {spec.name: i for i, spec in enumerate(outs)}
        if any(o.name not in slots for o in self.outputs):
            return None
        # every output in one 64-byte aligned allocation, each at a 64-byte multiple: one
        # np.empty and one address per call instead of one per output
        specs, at = [], 0
        for spec in outs:
            dt = np.dtype(spec.dtype)
            specs.append((tuple(spec.shape), dt, at))
            at += -(-math.prod(spec.shape) * dt.itemsize // 64) * 64
        return (tuple(feeds), tuple(specs), tuple(slots[o.name] for o in self.outputs), at)

    def _run_direct(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """``run_acquired`` for a ``_direct_plan`` (lock held)."""
        assert self._direct is not None
        feed_slots, out_specs, order, out_bytes = self._direct
        _, fn, _, _, in_ptrs, out_ptrs, step_nodes = self.steps[0]
        held = []  # converted inputs live until the call returns
        for i, name, dtype in feed_slots:
            arr = feeds[name]
            if not isinstance(arr, np.ndarray) or arr.dtype != dtype or not arr.flags.c_contiguous:
                arr = np.asarray(arr, dtype=dtype, order="C")
                held.append(arr)
            in_ptrs[i] = data_ptr(arr)
        raw = np.empty(out_bytes + 64, dtype=np.uint8)
        base = data_ptr(raw)
        shift = (-base) % 64
        results = []
        for i, (shape, dtype, at) in enumerate(out_specs):
            results.append(np.ndarray(shape, dtype, raw, shift + at))
            out_ptrs[i] = base + shift + at
        status = fn(self.pool, in_ptrs, out_ptrs, self._arena_ptr, self._scratch_ptr, self._weights_ptr,
                    self._state_ptr)
        self.native_calls += 1
        if status:
            node, op = step_nodes[status - 1]
            raise SmeltError(f"node {node!r} ({op}) failed at run time: an input is invalid "
                             "for it (for example an index out of range)")
        del held
        return [results[k] for k in order]

    def _create_pool(self) -> ctypes.c_void_p:
        assert self.lib is not None
        n = self.n_threads
        cpu_arr = (ctypes.c_int * max(1, n))(*(self._cpus + [-1] * n)[:n])
        return ctypes.c_void_p(self.lib.smelt_create_pool(n, cpu_arr))

    def _dynamic_shapes(self, si: int, env: dict[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
        """Set the recurrent nodes' T and B for native step ``si``; its outputs' actual shapes."""
        shapes: dict[str, tuple[int, ...]] = {}
        for d in self._dyn.get(si, ()):
            T, B = d.sizes(env[d.x].shape)
            assert self._dims is not None
            self._dims[d.state // 8], self._dims[d.state // 8 + 1] = T, B
            shapes.update(d.output_shapes(T, B))
        return shapes

    def _bind_profile_counters(self) -> None:
        """numpy views of every block's counter array (in this instance's state buffer)."""
        lib = self.lib
        assert lib is not None
        lib.smelt_profile_counters.restype = ctypes.POINTER(ctypes.c_uint64)
        lib.smelt_profile_counters.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.smelt_profile_reset.argtypes = [ctypes.c_void_p]
        lib.smelt_profile_reset.restype = None
        for k in range(lib.smelt_profile_blocks()):
            ptr = lib.smelt_profile_counters(self._state_ptr, k)
            header = np.ctypeslib.as_array(ptr, shape=(_PROF_HEADER,))
            steps, threads, stride = (int(header[i]) for i in (_PROF_STEPS, _PROF_THREADS, _PROF_STRIDE))
            self._prof_views.append(np.ctypeslib.as_array(ptr, shape=(_PROF_HEADER + stride * (1 + threads),)))

    # -- lifetime ----------------------------------------------------------------------
    def acquire(self) -> bool:
        """Take a reference for a call; False once the artifact is closed (then do not call it)."""
        with self._refs_lock:
            if self._closed:
                return False
            self._refs += 1
            return True

    def release(self) -> None:
        """Drop a reference taken by ``acquire``; the last one frees a closed artifact."""
        with self._refs_lock:
            self._refs -= 1
            free = self._closed and self._refs == 0 and not self._freed
            self._freed |= free
        if free:
            self._free()

    def loop_runners(self) -> dict[str, NativeLoopRunner]:
        """The fallback Loop steps whose bodies run compiled, by node name."""
        return {step[2]: step[1] for step in self.steps
                if step[0] == "fallback" and isinstance(step[1], NativeLoopRunner)}

    def close(self) -> None:
        """No new calls; free everything now, or when the calls in flight have returned."""
        with self._refs_lock:
            self._closed = True
            free = self._refs == 0 and not self._freed
            self._freed |= free
        if free:
            self._free()

    @property
    def closed(self) -> bool:
        return self._closed

    @contextmanager
    def _in_use(self) -> Iterator[None]:
        """A reference held for the block; SmeltError if the artifact is closed."""
        if not self.acquire():
            raise SmeltError(f"this compiled model variant ({self.directory.name}) was closed")
        try:
            yield
        finally:
            self.release()

    def _free(self) -> None:
        """Destroy the pool, drop every ctypes object of the library, then dlclose it (this
        instance's dlopen reference: the library stays mapped while another instance has it open)."""
        lib, pool = self.lib, self.pool
        self.pool = None
        if lib is not None and pool is not None:
            lib.smelt_destroy_pool(pool)
        self.steps = []  # the entries' ctypes function objects
        self._prof_views = []
        self._dims = None
        self.arena = self.weights = self.state = None  # type: ignore[assignment]
        self._arenas = None
        self._arena_ptr = self._scratch_ptr = self._weights_ptr = self._state_ptr = None  # type: ignore[assignment]
        self.lib = None
        if lib is not None:
            handle = lib._handle
            del lib  # and with it the function objects ctypes cached on the CDLL
            _ctypes.dlclose(handle)

    def _after_fork_in_child(self) -> None:
        """In a child after os.fork(): only the forking thread exists (see the module doc)."""
        self._lock = threading.Lock()
        self._refs_lock = threading.Lock()
        self._refs = 0
        self._pool_stale = self.pool is not None
        if self._closed and not self._freed:
            self._freed = True
            self._free()

    # -- running ---------------------------------------------------------------------
    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Run one inference on validated, contiguous inputs; returns fresh output arrays. Safe
        against a concurrent ``close``; raises SmeltError if the artifact is already closed."""
        with self._in_use():
            return self.run_acquired(feeds)

    def run_acquired(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """``run`` for a caller that holds a reference (``acquire``)."""
        with self._lock:
            if self._pool_stale:  # forked since the pool was made: its workers are the parent's
                self._pool_stale = False
                self.lib.smelt_destroy_pool(self.pool)  # the child's copy: freed, nothing joined
                self.pool = self._create_pool()
            if self._arenas is None:
                return self._run_locked(feeds)
            entry = self._arenas.take(self._arena_bytes)
            if entry[1] != self._arena_addr:  # usually the last call's buffer: pointers kept
                self._arena_addr = entry[1]
                self._arena_ptr = ctypes.c_void_p(entry[1])
                self._scratch_ptr = ctypes.c_void_p(entry[1] + self.plan.arena_bytes)
            try:
                return self._run_locked(feeds)
            finally:
                self._arenas.give(entry)

    def _run_locked(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """One inference with the arena in place (``self._lock`` held)."""
        if self._direct is not None:
            return self._run_direct(feeds)
        env: dict[str, np.ndarray] = dict(self.consts)
        env.update(feeds)
        for si, step in enumerate(self.steps):
            if step[0] == "native":
                _, fn, ins, outs, in_ptrs, out_ptrs, step_nodes = step
                dyn_shapes = self._dynamic_shapes(si, env) if self._dims is not None else {}
                for i, spec in enumerate(ins):
                    arr = env[spec.name]
                    if not isinstance(arr, np.ndarray) or arr.dtype != spec.dtype or not arr.flags.c_contiguous:
                        arr = env[spec.name] = np.asarray(arr, dtype=spec.dtype, order="C")
                    in_ptrs[i] = data_ptr(arr)
                for i, spec in enumerate(outs):
                    arr = aligned_array(dyn_shapes.get(spec.name, spec.shape), spec.dtype)
                    env[spec.name] = arr
                    out_ptrs[i] = data_ptr(arr)
                status = fn(self.pool, in_ptrs, out_ptrs, self._arena_ptr, self._scratch_ptr,
                            self._weights_ptr, self._state_ptr)
                self.native_calls += 1
                if status:
                    node, op = step_nodes[status - 1]
                    raise SmeltError(f"node {node!r} ({op}) failed at run time: an input is invalid "
                                     "for it (for example an index out of range)")
            elif self.profiling:  # timed here: the node runs in Python
                start = time.perf_counter_ns()
                step[1].run(env)
                self._fallback_ns[si] = self._fallback_ns.get(si, 0) + time.perf_counter_ns() - start
            else:
                step[1].run(env)
        if self.profiling:
            self._profile_calls += 1
        return [np.array(env[o.name], copy=True)
                if (o.name in feeds or o.name in self.consts) and isinstance(env[o.name], np.ndarray)
                else env[o.name] for o in self.outputs]

    def saturation_counts(self) -> dict[str, tuple[int, int]]:
        """Per value an integer kernel writes (QuantizeLinear, QLinearConv, QLinearMatMul
        outputs), how many elements it clamped at the low and at the high end of its type's
        range since the artifact was loaded (or ``reset_saturation_counts``); counted inside
        the kernels."""
        with self._in_use(), self._lock:
            words = self.state.view(np.int64)
            counts: dict[str, tuple[int, int]] = {}
            for step in self.plan.steps:
                for c in getattr(step, "counters", ()):
                    pairs = words[c.state // 8: c.state // 8 + 2 * c.shares].reshape(c.shares, 2).sum(axis=0)
                    lo, hi = counts.get(c.value, (0, 0))
                    counts[c.value] = (lo + int(pairs[0]), hi + int(pairs[1]))
            return counts

    def reset_saturation_counts(self) -> None:
        with self._in_use(), self._lock:
            words = self.state.view(np.int64)
            for step in self.plan.steps:
                for c in getattr(step, "counters", ()):
                    words[c.state // 8: c.state // 8 + 2 * c.shares] = 0

    # -- profiling (instrumented artifacts) -------------------------------------------
    def _require_profiling(self) -> None:
        if not self.profiling:
            raise SmeltError("this model was not compiled for profiling; compile it with profile=True")

    def profile_reset(self) -> None:
        """Zero every timing counter (native and fallback)."""
        self._require_profiling()
        with self._in_use(), self._lock:
            if self.lib is not None:
                self.lib.smelt_profile_reset(self._state_ptr)
            self._fallback_ns.clear()
            self._profile_calls = 0

    def profile_counters(self) -> ProfileCounters:
        """A snapshot of the timings since the last reset (see ``ProfileCounters``)."""
        self._require_profiling()
        with self._in_use(), self._lock:  # not in the middle of an inference
            raw = [v.copy() for v in self._prof_views]
            fallback_ns = dict(self._fallback_ns)
            calls = self._profile_calls
        # native ticks -> seconds: the entries' CLOCK_MONOTONIC_RAW total over their tick total
        ticks = sum(int(r[_PROF_TICKS]) for r in raw)
        ns = sum(int(r[_PROF_NS]) for r in raw)
        sec_per_tick = ns / ticks * 1e-9 if ticks else 0.0
        threads = max([int(r[_PROF_THREADS]) for r in raw] + [1])
        steps: list[ProfiledStep] = []
        seconds: list[float] = []
        busy: list[np.ndarray] = []
        k = -1  # native block index
        for si, step in enumerate(self.steps):
            if step[0] == "native":
                k += 1
                r = raw[k]
                n, nthr, stride = int(r[_PROF_STEPS]), int(r[_PROF_THREADS]), int(r[_PROF_STRIDE])
                wall = r[_PROF_HEADER : _PROF_HEADER + n].astype(np.float64) * sec_per_tick
                rows = r[_PROF_HEADER + stride :].reshape(nthr, stride)[:, :n].T.astype(np.float64) * sec_per_tick
                for i, (node, op) in enumerate(step[6]):
                    steps.append(ProfiledStep(k, i, node, op))
                    seconds.append(float(wall[i]))
                    b = np.zeros(threads)
                    b[:nthr] = rows[i]
                    busy.append(b)
            else:
                t = fallback_ns.get(si, 0) * 1e-9
                steps.append(ProfiledStep(None, 0, step[2], step[3]))
                seconds.append(t)
                b = np.zeros(threads)
                b[0] = t
                busy.append(b)
        block_seconds = np.array([int(r[_PROF_NS]) * 1e-9 for r in raw], dtype=np.float64)
        return ProfileCounters(steps, calls, np.array(seconds, dtype=np.float64),
                               np.array(busy, dtype=np.float64).reshape(len(steps), threads), block_seconds)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
