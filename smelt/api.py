"""The two public APIs: ``smelt.compile`` and the onnxruntime-compatible ``InferenceSession``.

Symbolic input dimensions: the model is specialized (and compiled) on the first call with each
new combination of input shapes; up to $SMELT_MAX_VARIANTS (default 8; ``smelt.settings``) compiled
variants are kept per model, least recently used evicted first. Compiled variants also persist
in the on-disk cache, so a re-visited shape reloads instead of recompiling. Guards
(``smelt.frontend.control_flow``) add to the variant key the branch of each If decided by small
inputs and the value of each small input that decides a shape (a Reshape target, reduction
axes, Resize scales given as inputs): those values are compiled in as constants. Distinct values
are capped at $SMELT_MAX_VARIANTS per model; later ones run one generic variant (the nodes they
size on the fallback, or an error with ``allow_fallback=False``) with a
``ValueSpecializationWarning``, never a compile per call. A model with guards compiles at its first
call, not ahead of it.

Recurrent models have dynamic axes instead (ModelCompiler's execution plans: sequence and batch
are parameters of the generated code). A model whose nodes are all LSTM/GRU/RNN or shape glue
(Squeeze, Unsqueeze, Reshape, Transpose, Identity, Constant) is compiled *once* with every
symbolic dimension bounded (``max_dims``, or the first call's size rounded up to a power of
two): the recurrent kernels read the actual sequence length and batch at run time, the glue runs
in numpy, and the arena is sized for the bounds. Calls within the bounds never recompile; a
larger call raises the bound (to the next power of two) with one recompile, so memory stays
bounded by the largest input seen. ``dynamic=False`` keeps per-shape variants.

Concurrency: a model may be called from any number of threads. A call holds a reference to its
variant for its duration (``LoadedArtifact.acquire``), so evicting or replacing a variant only
unlinks it; it is freed (pool, arena, library) when its last call returns. Variants are built
outside the model's lock: calls that fit a variant already loaded keep running while another
builds (in dynamic mode, calls within the current bounds keep using the current variant while a
larger one compiles), callers needing the same new variant wait for one build
(``_PendingBuild``), and a failed build raises in every caller that waited for it while a later
call tries again. After ``os.fork()`` a child re-creates the model's lock and forgets builds in
flight in the parent (``_after_fork_in_child``).
"""

from __future__ import annotations

import dataclasses
import threading
import warnings
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from smelt import settings
from smelt.check import (
    DEFAULT_ATOL,
    DEFAULT_RTOL,
    OBSERVE_BYTES,
    CheckError,
    CheckReport,
    CheckWarning,
    check_compiled,
)
from smelt.codegen.toolchain import sanitize_enabled, source_path_for
from smelt.compiler import BuildResult, ShapeClass, build
from smelt.errors import SmeltError
from smelt.frontend.control_flow import Decisions, guards, specialize
from smelt.frontend.onnx_import import ModelLike, load_model, model_input_specs, model_output_specs
from smelt.frontend.zipmap import ZipMapOutput, split_zipmaps
from smelt.ir.ops import ops_where
from smelt.ir.types import onnx_type_string
from smelt.options import CompileOptions
from smelt.runtime.artifact import ArtifactPlan
from smelt.runtime.memory import ArenaPool
from smelt.runtime.module import LoadedArtifact, ProfileCounters, aligned_empty, reinit_after_fork
from smelt.target import NATIVE_ISA, detect

DYNAMIC_KEY = ("__dynamic__",)  # the one variant of a dynamic model
# in a variant key: each guard's decision (the branch a guarded If takes, the value of a
# shape-deciding input: smelt.frontend.control_flow); "\0" keeps it apart from input names
GUARD_KEY = "\0guards"
RNN_OPS = ops_where(lambda t: t.recurrent)
# shape glue around recurrent nodes in exported models; run by the (shape-generic) fallback in
# dynamic mode
GLUE_OPS = ops_where(lambda t: t.shape_glue)


def dynamic_rnn_eligible(proto: onnx.ModelProto) -> bool:
    """Whether ``proto`` can run with run-time sequence length and batch (see the module doc)."""
    ops = [n.op_type for n in proto.graph.node]
    return (any(op in RNN_OPS for op in ops) and all(op in RNN_OPS or op in GLUE_OPS for op in ops)
            and all(n.domain in ("", "ai.onnx") for n in proto.graph.node))


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


class _PendingBuild:
    """A variant being built; callers that need the same one wait here instead of building it too."""

    def __init__(self, bounds: dict[str, int] | None = None) -> None:
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.bounds = bounds  # dynamic mode: the bounds it compiles for
        self.waiters = 0  # callers that waited for it (for tests and debugging)

    def wait(self) -> None:
        """Block until the build ends; raise its error if it failed."""
        self.done.wait()
        if self.error is not None:
            raise self.error


@dataclass(frozen=True)
class NodeArg:
    """Like onnxruntime's NodeArg: ``name``, ``shape`` (ints and symbol strings), ``type``."""

    name: str
    shape: list[int | str | None]
    type: str


def _resolve_threads(threads: int | None) -> int:
    cores = detect().physical_cores
    if threads is None or threads <= 0:
        return cores
    return int(threads)


class CompiledModel:
    """A model compiled for this CPU. Call it with numpy arrays, positionally or by name.

    Attributes: ``fallback_nodes`` (nodes run by the onnx.reference fallback, [] when all are
    native: those of the variant the last call ran; an error before any is ``built``),
    ``arena_bytes`` (intermediate memory), ``source_path`` (the generated C), ``compile_seconds``
    and ``from_cache`` (of the most recent build), ``plan`` (the compiled plan: steps, their nodes
    and schedules, a ``smelt.runtime.artifact.ArtifactPlan``), ``target`` (the CPU description it
    compiles for: the host's, held to ``isa`` when one is given), ``graph_proto`` (the model as
    compiled: a classifier's ZipMap an Identity, ``frontend/zipmap.py``).

    ``profile=True`` builds the instrumented variant (a separate cached library) that times every
    step inside the native code: read with ``profile_counters()``, zero with ``profile_reset()``
    (each compiled instance keeps its own counters, even when instances share one library).
    ``smelt.bench.profile.run_profile`` turns that into a report.
    """

    def __init__(self, model: ModelLike, *, threads: int | None = None, opt_level: int = 1,
                 allow_fallback: bool = True, input_shapes: Mapping[str, Sequence[int]] | None = None,
                 force_fallback: Sequence[str] = (), profile: bool = False, progress: bool = False,
                 layout: str = "propagate", use_tuning_db: bool = True, dynamic: bool | None = None,
                 max_dims: Mapping[str, int] | None = None, winograd: bool | str = True,
                 schedule: Mapping[str, object] | None = None, isa: str | None = None,
                 share_shapes: bool = True, count_saturation: bool = False) -> None:
        self.progress = progress  # a progress bar on stderr while a variant compiles
        # symbolic input dimensions: shapes share decisions and, where the code allows, one
        # library (compiler.ShapeClass); the sizes they are decided at, fixed by the first call
        self.share_shapes = share_shapes
        self._class_sizes: dict[str, int] | None = None
        self._max_dims_given = {k: int(v) for k, v in (max_dims or {}).items()}
        self.proto: onnx.ModelProto = load_model(model)
        # what is compiled: the model with its classifiers' ZipMaps returning their probability
        # tensors, turned into onnxruntime's lists of dicts when a call returns (frontend/zipmap.py)
        self.graph_proto, self._zipmaps = split_zipmaps(self.proto)
        self.threads = _resolve_threads(threads)
        self.options = _options(self.threads, opt_level=opt_level, allow_fallback=allow_fallback,
                                force_fallback=frozenset(force_fallback), sanitize=sanitize_enabled(),
                                profile=profile, layout=layout, use_tuning_db=use_tuning_db, winograd=winograd,
                                isa=_resolve_isa(isa), count_saturation=count_saturation, **dict(schedule or {}))
        # fail here, before any build, when the host cannot run the cap
        self.target = detect().narrowed(self.options.isa)
        self._inputs = model_input_specs(self.proto)
        self._outputs = model_output_specs(self.proto)
        # guarded by _lock (never held during a build): the variants (LRU order), their build
        # results, the builds in progress, the dynamic bounds, the last variant used
        self._variants: OrderedDict[tuple, LoadedArtifact] = OrderedDict()
        self._builds: dict[tuple, BuildResult] = {}
        self._closed = False  # close() freed the variants: unbuilt_reason says so until a call builds one
        self._pending: dict[tuple, _PendingBuild] = {}
        self._lock = threading.Lock()
        # the arenas of all variants: one per concurrent call, as large as the largest shape
        # seen (runtime/memory.py), not one per variant
        self._arenas = ArenaPool(aligned_empty)
        self._last: tuple | None = None
        # (input signature, variant) of the last call without guards: a call whose arrays match
        # it skips validation and the variant lookup (a few microseconds of a 20 us model)
        self._fast: tuple[tuple, LoadedArtifact] | None = None
        self.compilations = 0  # variants built (or loaded from the disk cache) by this object
        # run-time Loops' bodies by their serialized model, shared by the variants (closed with this model)
        self._loop_bodies: dict[bytes, CompiledModel] = {}
        # Ifs decided by small inputs and small inputs deciding shapes (smelt.frontend.control_flow):
        # compiled per branch taken / per value, so nothing is built before a call brings their values
        self._guards = guards(self.graph_proto)
        self._decide = Decisions(self._guards)
        reinit_after_fork(self)
        symbols = {d for _, _, shp in self._inputs if shp for d in shp if isinstance(d, str)}
        # only a model that can have several variants takes its arenas from the pool (a fixed
        # model keeps one arena, and its calls skip the pool's ~0.3 us)
        self._share_arenas = bool(symbols) or any(shp is None for _, _, shp in self._inputs) or bool(self._guards)
        if dynamic is None:
            dynamic = bool(symbols) and dynamic_rnn_eligible(self.graph_proto)
        elif dynamic and not dynamic_rnn_eligible(self.graph_proto):
            raise ValueError("dynamic=True needs a model of LSTM/GRU/RNN nodes and shape glue only "
                             f"({', '.join(sorted(GLUE_OPS))})")
        self.dynamic = bool(dynamic)
        self._bounds: dict[str, int] = {k: int(v) for k, v in (max_dims or {}).items()}
        unknown = set(self._bounds) - symbols
        if unknown:
            raise ValueError(f"max_dims names {sorted(unknown)}, which are not symbolic input dimensions "
                             f"of the model (those are {sorted(symbols)})")
        if any(v < 1 for v in self._bounds.values()):
            raise ValueError(f"max_dims must be positive, given {dict(self._bounds)}")
        if self.dynamic:
            self._dyn_proto = self._annotate_dynamic(self.graph_proto)
            for name, _, shape in self._inputs:  # input_shapes seed the bounds max_dims leaves open
                for want, got in zip(shape or (), (input_shapes or {}).get(name, ()), strict=False):
                    if isinstance(want, str):
                        self._bounds[want] = max(self._bounds.get(want, 0), int(got))
            if set(self._bounds) == symbols:
                self._dynamic_variant({}).release()
            return
        shapes = dict(input_shapes or {})
        for name, _, shape in self._inputs:
            if name not in shapes and shape is not None and all(isinstance(d, int) for d in shape):
                shapes[name] = shape
        if len(shapes) == len([i for i in self._inputs if i[1] is not None]) and not self._guards:
            self._variant(self._key(shapes)).release()

    def _compile_loop_body(self, body: onnx.ModelProto) -> CompiledModel:
        """A Loop body (``runtime/loop.py``) compiled with this model's options and threads; its
        variants are built at its first iterations, one per input shape. Every variant of this
        model with the same body gets the same object."""
        key = body.SerializeToString()
        with self._lock:
            known = self._loop_bodies.get(key)
        if known is not None:
            return known
        o = self.options
        named = dict(opt_level=o.opt_level, allow_fallback=o.allow_fallback, layout=o.layout,
                     use_tuning_db=o.use_tuning_db, winograd=o.winograd, isa=o.isa,
                     count_saturation=o.count_saturation)
        # the node names force_fallback gives are the outer graph's; the body's profile is its
        # Loop step's time
        skip = set(named) | {"threads", "force_fallback", "profile", "sanitize"}
        rest = {f.name: getattr(o, f.name) for f in dataclasses.fields(o) if f.name not in skip}
        body_model = CompiledModel(body, threads=self.threads, schedule=rest, progress=self.progress, **named)
        # values that decide shapes in a body are mostly its iteration counters (a Slice at step
        # i): a new value every iteration, so specializing on them would compile a variant per
        # iteration up to the cap. The body runs the generic variant from the start: its value
        # guards are dropped, and with no other guard (an If's) every iteration after the first
        # takes ``run``'s fast path (same signature, no validation: ~25 us less per iteration)
        body_model._guards = [g for g in body_model._guards if not g.open_ended]
        body_model._decide = Decisions(body_model._guards, open_limit=0, warn=False)
        with self._lock:
            kept = self._loop_bodies.setdefault(key, body_model)
        if kept is not body_model:  # another variant made it meanwhile
            body_model.close()
        return kept

    # -- inputs ----------------------------------------------------------------------
    def get_inputs(self) -> list[NodeArg]:
        return [NodeArg(n, list(s) if s is not None else [], onnx_type_string(d) if d is not None else "")
                for n, d, s in self._inputs]

    def get_outputs(self) -> list[NodeArg]:
        zipmaps = {zm.index: zm for zm in self._zipmaps}
        return [NodeArg(n, [], zipmaps[i].type_string) if i in zipmaps else
                NodeArg(n, list(s) if s is not None else [], onnx_type_string(d) if d is not None else "")
                for i, (n, d, s) in enumerate(self._outputs)]

    @staticmethod
    def _key(shapes: Mapping[str, Sequence[int]]) -> tuple:
        return tuple(sorted((k, tuple(int(d) for d in v)) for k, v in shapes.items()))

    def _check_feed(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        names = [n for n, _, _ in self._inputs]
        unknown = [k for k in feeds if k not in names]
        if unknown:
            raise ValueError(f"unknown input name {unknown[0]!r}; the model's inputs are {names}")
        missing = [n for n in names if n not in feeds]
        if missing:
            raise ValueError(f"missing input {missing[0]!r}; the model's inputs are {names}")
        checked = {}
        for name, dtype, shape in self._inputs:
            arr = feeds[name]
            if dtype is None:  # a sequence or optional input: only the fallback can consume it
                checked[name] = arr
                continue
            if not isinstance(arr, np.ndarray):
                arr = np.asarray(arr)
            if arr.dtype != dtype:
                raise ValueError(f"input {name!r}: expected dtype {np.dtype(dtype).name} "
                                 f"({onnx_type_string(dtype)}), given {arr.dtype.name}")
            if shape is not None:
                if arr.ndim != len(shape):
                    raise ValueError(f"input {name!r}: expected shape {list(shape)} (rank {len(shape)}), "
                                     f"given {list(arr.shape)} (rank {arr.ndim})")
                bound: dict[str, int] = {}
                for want, got in zip(shape, arr.shape, strict=True):
                    if isinstance(want, int) and want != got:
                        raise ValueError(f"input {name!r}: expected shape {list(shape)}, given {list(arr.shape)}")
                    if isinstance(want, str) and not want.startswith("unk_"):
                        if bound.setdefault(want, got) != got:
                            raise ValueError(f"input {name!r}: dimension {want!r} must be the same size "
                                             f"everywhere; given shape {list(arr.shape)}")
            checked[name] = np.asarray(arr, order="C")  # keeps 0-d arrays 0-d
        return checked

    # -- variants --------------------------------------------------------------------
    @staticmethod
    def _annotate_dynamic(proto: onnx.ModelProto) -> onnx.ModelProto:
        """A copy whose recurrent nodes read T and B at run time (``smelt_dynamic``)."""
        out = onnx.ModelProto()
        out.CopyFrom(proto)
        for n in out.graph.node:
            if n.op_type in RNN_OPS and not any(a.name == "smelt_dynamic" for a in n.attribute):
                n.attribute.append(onnx.helper.make_attribute("smelt_dynamic", 1))
        return out

    def _dynamic_variant(self, arrays: Mapping[str, np.ndarray]) -> LoadedArtifact:
        """The one dynamic variant (recurrent models), acquired for a call with ``arrays``; rebuilt
        (outside the lock, once however many callers need it) only when a call exceeds a bound."""
        need: dict[str, int] = {}
        for name, _, shape in self._inputs:
            if shape is None or name not in arrays:
                continue
            for want, got in zip(shape, np.shape(arrays[name]), strict=False):
                if isinstance(want, str):
                    need[want] = max(need.get(want, 0), int(got))
        while True:
            with self._lock:
                art = self._variants.get(DYNAMIC_KEY)
                if art is not None and all(n <= self._bounds.get(d, 0) for d, n in need.items()) and art.acquire():
                    self._last = DYNAMIC_KEY
                    return art
                pending = next((b for b in self._pending.values()
                                if all(n <= b.bounds.get(d, 0) for d, n in need.items())), None)
                if pending is None:  # bounds at least those of the variant and of every build running
                    base = dict(self._bounds)
                    for b in self._pending.values():
                        base.update({d: max(v, base.get(d, 0)) for d, v in b.bounds.items()})
                    bounds = {d: _pow2(n) for d, n in need.items() if n > base.get(d, 0)}
                    bounds = {**base, **bounds}
                    pending = self._pending[tuple(sorted(bounds.items()))] = _PendingBuild(bounds)
                    owner = True
                else:
                    pending.waiters += 1
                    owner = False
            if not owner:
                pending.wait()
                continue  # the new variant is installed (or a larger one): look again
            shapes = {name: tuple(pending.bounds[d] if isinstance(d, str) else d for d in shape)
                      for name, dtype, shape in self._inputs if shape is not None and dtype is not None}
            glue = frozenset(n.name for n in self._dyn_proto.graph.node if n.op_type not in RNN_OPS)
            options = dataclasses.replace(self.options, allow_fallback=True,
                                          force_fallback=self.options.force_fallback | glue)
            art = self._build_variant(tuple(sorted(pending.bounds.items())), pending, self._dyn_proto, shapes,
                                      options, dynamic=True)
            if art is not None:
                return art

    @property
    def max_dims(self) -> dict[str, int]:
        """The current bound of each symbolic dimension (dynamic mode; {} otherwise)."""
        return dict(self._bounds) if self.dynamic else {}

    def _variant(self, key: tuple) -> LoadedArtifact:
        """The variant for input shapes ``key``, acquired for a call; built outside the lock
        (once however many callers need it) if it is not loaded."""
        while True:
            with self._lock:
                art = self._variants.get(key)
                if art is not None and art.acquire():  # in the LRU, so not closed: always succeeds
                    self._variants.move_to_end(key)
                    self._last = key
                    return art
                pending = self._pending.get(key)
                owner = pending is None
                if owner:
                    pending = self._pending[key] = _PendingBuild()
                else:
                    pending.waiters += 1
            if not owner:
                pending.wait()
                continue  # built: look again (it may have been evicted meanwhile)
            shapes = {k: v for k, v in key if k != GUARD_KEY}
            proto = (specialize(self.graph_proto, self._guards, dict(key)[GUARD_KEY]) if self._guards
                     else self.graph_proto)
            art = self._build_variant(key, pending, proto, shapes, self.options,
                                      shape_class=self._shape_class(shapes))
            if art is not None:
                return art

    def _shape_class(self, shapes: Mapping[str, Sequence[int]]) -> ShapeClass | None:
        """The shape class of a model with symbolic input dimensions (None: none, or sharing
        is off). Its decision sizes are ``max_dims`` or the first call's sizes (a size the model
        surely accepts: rounding one up can break a model whose "symbolic" height is fixed in
        practice) and stay fixed, so every later shape gets the same decisions."""
        declared = tuple((n, tuple(shp)) for n, _, shp in self._inputs
                         if shp is not None and any(isinstance(d, str) for d in shp))
        if not self.share_shapes or not declared:
            return None
        with self._lock:
            if self._class_sizes is None:
                sizes: dict[str, int] = {}
                for name, dims in declared:
                    for want, got in zip(dims, shapes.get(name, ()), strict=False):
                        if isinstance(want, str):
                            given = self._max_dims_given.get(want)
                            sizes[want] = given if given else int(got)
                self._class_sizes = sizes
            decide = tuple(sorted(self._class_sizes.items()))
        return ShapeClass(declared, decide)

    def _build_variant(self, pkey: tuple, pending: _PendingBuild, proto: onnx.ModelProto,
                       shapes: Mapping[str, Sequence[int]], options: CompileOptions, dynamic: bool = False,
                       shape_class: ShapeClass | None = None) -> LoadedArtifact | None:
        """Build and load a variant (no lock held), install it and wake whoever waits on
        ``pending``. Returns it acquired for the builder, or None when a larger dynamic variant
        was installed meanwhile (this one is dropped; the caller looks again)."""
        try:
            result = build(proto, shapes, options, progress=self.progress, shape_class=shape_class)
            art = LoadedArtifact(result.directory, result.lib_path, self.threads, list(detect().core_cpus),
                                 dynamic=dynamic,
                                 arenas=self._arenas if self._share_arenas else None,
                                 compile_loop_body=self._compile_loop_body)
        except BaseException as err:
            with self._lock:
                if self._pending.get(pkey) is pending:
                    del self._pending[pkey]  # a later call tries again
            pending.error = err
            pending.done.set()
            raise
        retired: list[LoadedArtifact] = []
        with self._lock:
            if self._pending.get(pkey) is pending:
                del self._pending[pkey]
            self.compilations += 1
            key = DYNAMIC_KEY if dynamic else pkey
            old = self._variants.get(key)
            if dynamic and old is not None and all(v <= self._bounds.get(d, 0) for d, v in pending.bounds.items()):
                retired.append(art)  # a build started later (larger bounds) finished first
                art = None
            else:
                if old is not None:
                    retired.append(self._variants.pop(key))
                if dynamic:
                    self._bounds = dict(pending.bounds)
                self._variants[key] = art
                self._builds[key] = result
                self._last = key
                art.acquire()
                while len(self._variants) > settings.max_variants():
                    old_key, evicted = self._variants.popitem(last=False)
                    self._builds.pop(old_key, None)
                    retired.append(evicted)
        pending.done.set()
        for r in retired:  # freed now, or by the last call still running on it
            r.close()
        return art

    def _current(self) -> LoadedArtifact | None:
        return self._variants.get(self._last) if self._last is not None else None

    # -- running ---------------------------------------------------------------------
    def run(self, feeds: Mapping[str, Any]) -> list[Any]:
        """The outputs for ``feeds`` (name → array): arrays, and for a classifier's ZipMap output a
        list of {label: probability} dicts, as onnxruntime returns them."""
        outs = self.run_graph(feeds)
        if self._zipmaps:
            outs = list(outs)
            for zm in self._zipmaps:
                outs[zm.index] = zm(outs[zm.index])
        return outs

    def run_graph(self, feeds: Mapping[str, Any]) -> list[np.ndarray]:
        """``run``'s outputs as the compiled graph computes them: every output an array (a ZipMap
        output is the probability tensor it would turn into maps; ``graph_proto`` is that graph)."""
        fast = self._fast
        if fast is not None and self._same_signature(feeds, fast[0]) and fast[1].acquire():
            try:  # the inputs of the last call's kind: already validated, same variant
                return fast[1].run_acquired(feeds)  # type: ignore[arg-type]
            finally:
                fast[1].release()
        arrays = self._check_feed(feeds)
        if self.dynamic:
            art = self._dynamic_variant(arrays)
        else:
            key = self._key({k: a.shape for k, a in arrays.items() if isinstance(a, np.ndarray)})
            if self._guards:  # the guards' decisions for these values are part of the variant
                key += ((GUARD_KEY, self._decide(arrays)),)
            art = self._variant(key)
            if not self._guards and all(type(a) is np.ndarray for a in arrays.values()):
                self._fast = (tuple((k, a.shape, a.dtype) for k, a in arrays.items()), art)
        try:
            return art.run_acquired(arrays)
        finally:
            art.release()

    @staticmethod
    def _same_signature(feeds: Mapping[str, Any], sig: tuple) -> bool:
        """``feeds`` are exactly the C-contiguous arrays of names, shapes and dtypes ``sig``
        (those of an earlier call that passed ``_check_feed``)."""
        if len(feeds) != len(sig):
            return False
        for name, shape, dtype in sig:
            a = feeds.get(name)
            if type(a) is not np.ndarray or a.shape != shape or a.dtype != dtype or not a.flags.c_contiguous:
                return False
        return True

    def __call__(self, *args: Any, **kwargs: Any) -> np.ndarray | list[np.ndarray]:
        names = [n for n, _, _ in self._inputs]
        if len(args) > len(names):
            raise ValueError(f"the model takes {len(names)} inputs ({names}); given {len(args)} positional")
        feeds = dict(zip(names, args, strict=False))
        for k, v in kwargs.items():
            if k in feeds:
                raise ValueError(f"input {k!r} given both positionally and by name")
            feeds[k] = v
        outs = self.run(feeds)
        return outs[0] if len(outs) == 1 else outs

    # -- introspection ---------------------------------------------------------------
    @property
    def zipmap_outputs(self) -> tuple[ZipMapOutput, ...]:
        """The outputs ``run`` returns as ZipMap's lists of dicts (``run_graph``: as tensors)."""
        return self._zipmaps

    @property
    def fallback_nodes(self) -> list[str]:
        return [f.node for f in self._built().plan.fallback_steps]

    @property
    def fallback_report(self) -> list[dict]:
        art = self._built()
        loops = art.loop_runners()
        return [{"node": f.node, "op": f.op,
                 "reason": f.reason + (f"; {loops[f.node].describe()}" if f.node in loops else "")}
                for f in art.plan.fallback_steps]

    def saturation_counts(self) -> dict[str, tuple[int, int]]:
        """Per value an integer kernel writes (QuantizeLinear, QLinearConv, QLinearMatMul
        outputs), the elements it clamped at the low and the high end of its type's range since
        the current variant was loaded: counted inside the kernels
        (``smelt.quantize.debug_report`` ranks layers by it). Needs a counting build
        (``count_saturation=True``; ``numeric_debug=True`` compiles one)."""
        if not self.options.count_saturation:
            raise SmeltError("this model was compiled without saturation counters: compile it with "
                             "count_saturation=True (numeric_debug=True does)")
        art = self._current()
        return {} if art is None else art.saturation_counts()

    def reset_saturation_counts(self) -> None:
        art = self._current()
        if art is not None:
            art.reset_saturation_counts()

    @property
    def native_nodes(self) -> list[tuple[str, str]]:
        return list(self._built().plan.native_nodes)

    @property
    def built(self) -> bool:
        """Whether a variant is built (a model with symbolic inputs and no ``input_shapes``, or
        whose variants depend on input values, builds at its first call)."""
        return self._current() is not None

    @property
    def unbuilt_reason(self) -> str | None:
        """Why no variant is built yet (None once one is)."""
        if self.built:
            return None
        if self._closed:
            return "close() freed its variants, and the next call rebuilds one"
        if self._guards:
            names = sorted({i for g in self._guards for i in g.inputs})
            return (f"its variants depend on the values of input(s) {', '.join(names)} (If conditions or "
                    "values that decide shapes), so it compiles at its first call")
        symbolic = sorted({d for _, _, shp in self._inputs if shp for d in shp if isinstance(d, str)})
        return (f"its inputs have symbolic dimensions ({', '.join(symbolic)}) and no input_shapes were given, "
                "so it compiles at its first call")

    def _built(self) -> LoadedArtifact:
        """The last variant used; before the first build, an error that says why there is none
        (an empty fallback list there read as "fully native" to a harness that asked)."""
        art = self._current()
        if art is None:
            raise SmeltError(f"no variant of this model is built yet: {self.unbuilt_reason}; call it once "
                             "(or `smelt check` it) before asking which nodes run natively")
        return art

    @property
    def arena_bytes(self) -> int:
        art = self._current()
        return 0 if art is None else art.plan.arena_bytes + art.plan.scratch_bytes

    @property
    def arena_bytes_held(self) -> int:
        """Bytes of arena this model holds over all its variants: the largest variant's arena
        per concurrent call (runtime/memory.py), not the sum over variants (a model of fixed
        shapes: its one variant's arena)."""
        if not self._share_arenas:
            return self.arena_bytes
        return self._arenas.allocated

    @property
    def source_path(self) -> Path | None:
        art = self._current()
        return None if art is None or art.lib_path is None else source_path_for(art.lib_path)

    @property
    def compile_seconds(self) -> float:
        result = self._builds.get(self._last)  # one lookup: another thread may evict it meanwhile
        return result.compile_seconds if result is not None else 0.0

    @property
    def from_cache(self) -> bool:
        result = self._builds.get(self._last)
        return result.from_cache if result is not None else False

    @property
    def plan(self) -> ArtifactPlan | None:
        """The current variant's plan (``smelt.runtime.artifact.ArtifactPlan``, its plan.json):
        steps with their nodes, ``step_info`` (schedule, FLOPs, fused epilogue per step),
        arena/scratch/weights sizes (None before compiling)."""
        art = self._current()
        return None if art is None else art.plan

    # -- profiling (profile=True) ----------------------------------------------------
    def _profiled(self) -> LoadedArtifact:
        art = self._current()
        if art is None:
            raise ValueError("the model has not been compiled yet: run it (or give input_shapes) first")
        return art

    def profile_counters(self) -> ProfileCounters:
        """Per-step timings of the current variant since the last reset (needs profile=True)."""
        return self._profiled().profile_counters()

    def profile_reset(self) -> None:
        """Zero the current variant's timing counters (needs profile=True)."""
        self._profiled().profile_reset()

    @property
    def native_calls(self) -> int:
        """Native entry calls made so far (one per native block per inference) by the variants kept."""
        with self._lock:
            return sum(a.native_calls for a in self._variants.values())

    def close(self) -> None:
        """Free every variant (those running a call: when it returns). A later call rebuilds."""
        with self._lock:
            arts = list(self._variants.values())
            self._variants.clear()
            self._builds.clear()
            self._closed = True
            bodies, self._loop_bodies = list(self._loop_bodies.values()), {}
        for art in arts:
            art.close()
        for body in bodies:
            body.close()

    def _after_fork_in_child(self) -> None:
        """In a child after os.fork(): the lock may have been held by a thread that is gone, and
        builds in flight belong to the parent's threads (a later call here builds again)."""
        self._lock = threading.Lock()
        self._pending = {}
        self._arenas.after_fork_in_child()


def compile(model: ModelLike, *, threads: int | None = None, opt_level: int = 1, allow_fallback: bool = True,
            input_shapes: Mapping[str, Sequence[int]] | None = None,
            force_fallback: Sequence[str] = (), profile: bool = False, progress: bool = False,
            layout: str = "propagate", use_tuning_db: bool = True, dynamic: bool | None = None,
            max_dims: Mapping[str, int] | None = None, winograd: bool | str = True,
            schedule: Mapping[str, object] | None = None, isa: str | None = None,
            check: bool | str = False, share_shapes: bool = True,
            numeric_debug: bool | ModelLike = False, count_saturation: bool = False) -> CompiledModel:
    """Compile an ONNX model (path, bytes or ModelProto) for this CPU.

    ``threads``: worker threads including the caller (default: physical cores).
    ``input_shapes``: concrete shapes for symbolic inputs, to compile ahead of the first call.
    ``allow_fallback``: when False, a node with no native template is an error.
    ``profile``: build the instrumented variant that times each step (``profile_counters()``).
    ``progress``: show a progress bar on stderr while compiling (cache hits show nothing).
    ``layout``: convolution layout planning (``smelt.options.LAYOUT_MODES``): "propagate" (NCHW[x]c
    with transform elimination, the default), "nchw", "conv" or "global" (NeoCPU's ablation).
    ``use_tuning_db``: use schedules from the tuning database (``smelt tune``) where it has them.
    ``dynamic``: run-time sequence length and batch for recurrent models (default: on when the
    model is eligible and has symbolic input dimensions; see the module doc). ``max_dims``
    bounds those dimensions up front (e.g. ``{"T": 512, "B": 32}``); given for every symbolic
    dimension, the model compiles before the first call. For other models with symbolic
    dimensions, ``max_dims`` gives the sizes their layouts and schedules are decided at
    (default: the first call's; see ``share_shapes``).
    ``winograd``: 3x3 stride-1 convolutions on AVX-512 and AVX2 may run as Winograd F(2x2, 3x3) where it is
    faster (still fp32; its rounding differs from the direct sum's by about 1e-6 relative);
    False keeps every convolution on the direct kernels; "always" takes it wherever it is legal.
    ``schedule``: further schedule-stage switches, by ``smelt.options.CompileOptions`` field name
    (``winograd_order``, ``inplace``, ``concat_views``, ``gemm_for_half_width``,
    ``gemm_read_b_in_place``, ``gemm_read_a_in_place``, ``gemm_prefetch_c``, ``gemm_prefetch_next_b``,
    ``conv_prefetch_input``, ``conv_prefetch_weights``, ``conv_row_split``, ``conv_column_pairs``,
    ``conv_prefetch_rows``, ``conv_block_plain_input``, ``dw_pw_fusion``, ``expand_fusion``,
    ``int_conv_pad_in_kernel``, ``int_conv_prefetch_weights``, ``int8_channel_padding``,
    ``flush_denormal_weights``); each is part of the cache key.
    ``flush_denormal_weights`` (on by default) reads subnormal float32 weights (below 1.2e-38) of
    Conv, MatMul, Gemm and recurrent nodes as zero, as OpenVINO and OpenCV load them: Intel cores
    take a microcode assist per multiply with one (PP-OCRv6's detector ran 3.6x slower), and
    next to any sum not itself subnormal-scale they vanish in fp32 rounding. Activations keep
    IEEE gradual underflow; False keeps the weights as given.
    ``isa``: the widest vector ISA the compiled code may use, like oneDNN's ONEDNN_MAX_CPU_ISA:
    avx512, avx2_vnni (AVX2 with AVX-VNNI's integer dot products), avx2 (without them), scalar
    (portable C built without AVX) or native (default: $SMELT_ISA,
    else the host's own). An ISA this host cannot run is a ValueError; part of the cache key.
    ``check``: after compiling, run the model once in smelt and in the reference (onnxruntime,
    else onnx.reference) on seeded random inputs (``input_shapes`` sizes symbolic dimensions) and
    compare (``smelt.check``). True: a disagreement raises ``smelt.CheckError`` naming the first
    diverging node; "warn": the same as a ``smelt.CheckWarning``; False (default): no check.
    ``share_shapes``: a model with symbolic input dimensions (not recurrent-only: those are
    ``dynamic``) decides its layouts and schedules once, at ``max_dims`` or the first call's
    sizes, and serves each new shape from a library already compiled for
    the same code structure, rendering its C in Python but not compiling it (see the module doc);
    False compiles every shape for itself.
    ``numeric_debug``: for a quantized model, True (or its float model) compiles it beside its
    float counterpart (the given float model, else the model without its activation Q/DQ pairs)
    and returns a ``smelt.quantize.NumericDebugModel``: it answers as the quantized model and
    ``report()`` tabulates per quantized tensor the error, SQNR and saturations counted inside
    the integer kernels, worst first (``smelt.quantize.numeric``).
    ``count_saturation``: the integer kernels count the elements they clamp, read with
    ``saturation_counts()`` (off by default: it costs a few vector operations per output in
    every requantization; ``numeric_debug`` turns it on).
    """
    if check not in (False, True, "warn"):
        raise ValueError(f"check must be False, True or 'warn'; given {check!r}")
    if numeric_debug is not False:
        from smelt.quantize.numeric import NumericDebugModel

        def make(proto: onnx.ModelProto) -> CompiledModel:
            return CompiledModel(proto, threads=threads, opt_level=opt_level, allow_fallback=allow_fallback,
                                 input_shapes=input_shapes, force_fallback=force_fallback, progress=progress,
                                 layout=layout, use_tuning_db=use_tuning_db, dynamic=dynamic, max_dims=max_dims,
                                 winograd=winograd, schedule=schedule, isa=isa, share_shapes=share_shapes,
                                 count_saturation=True)

        reference = None if numeric_debug is True else load_model(numeric_debug)
        return NumericDebugModel(load_model(model), reference, make)  # type: ignore[return-value]
    compiled = CompiledModel(model, threads=threads, opt_level=opt_level, allow_fallback=allow_fallback,
                             input_shapes=input_shapes, force_fallback=force_fallback, profile=profile,
                             progress=progress, layout=layout, use_tuning_db=use_tuning_db, dynamic=dynamic,
                             max_dims=max_dims, winograd=winograd, schedule=schedule, isa=isa,
                             share_shapes=share_shapes, count_saturation=count_saturation)
    if check:
        report = check_compiled(compiled, shapes=input_shapes, progress=progress)
        if not report.ok:
            if check == "warn":
                warnings.warn(CheckWarning(report.summary()), stacklevel=2)
            else:
                raise CheckError(report)
    return compiled


def check(model: ModelLike | CompiledModel, inputs: Mapping[str, np.ndarray] | None = None, *,
          shapes: Mapping[str, Sequence[int]] | None = None, rtol: float = DEFAULT_RTOL,
          atol: float = DEFAULT_ATOL, reference: str = "auto", seed: int = 0, localize: bool = True,
          progress: bool = False, name: str | None = None, observe_bytes: int = OBSERVE_BYTES,
          **compile_options: Any) -> CheckReport:
    """Run ``model`` once in smelt and in the reference and compare; name the first diverging
    node when they disagree (``smelt.check`` module doc). Returns a ``CheckReport`` (``ok``,
    per-output errors, ``culprit``, ``format_text()``, ``to_json()``); never raises for a
    disagreement.

    ``model``: a path, bytes, ModelProto (compiled here with ``compile_options``, e.g.
    ``threads``, ``isa``) or a ``CompiledModel``. ``inputs``: arrays by input name; the others
    are seeded random (``seed``), symbolic dimensions sized by ``shapes``. Agreement:
    ``max|smelt - ref| <= atol + rtol * max|ref|`` per value, NaN/Inf at the same positions.
    ``reference``: "auto" (onnxruntime if installed, else onnx.reference), "onnxruntime", "onnx".
    ``localize``: find the first diverging node (probe compiles; False: compare outputs only).
    ``name``: the model's name in the report (default: the graph's name).
    ``observe_bytes``: observe every intermediate value in one probe when they fit (default
    256 MiB), else bisect; 0 always bisects (the probes that disturb memory placement least).
    """
    if not isinstance(model, CompiledModel):
        model = CompiledModel(model, input_shapes=shapes, progress=progress, **compile_options)
    elif compile_options:
        raise ValueError(f"compile options ({', '.join(sorted(compile_options))}) apply to a model path or "
                         "proto, not to an already compiled model")
    return check_compiled(model, inputs, shapes=shapes, rtol=rtol, atol=atol, reference=reference, seed=seed,
                          localize=localize, progress=progress, name=name, observe_bytes=observe_bytes)


def _resolve_isa(isa: str | None) -> str | None:
    """The argument wins over $SMELT_ISA; "native" (either way), or a cap that drops nothing on
    this host, is no cap, stored as None so a native build shares its cache entry with one made
    without naming an ISA. A cap narrower than the host in features alone (dropping the integer
    dot products of a host whose vector ISA it keeps) is a cap, kept."""
    chosen = isa if isa is not None else settings.isa()
    if chosen in (None, NATIVE_ISA):
        return None
    host = detect()
    try:
        return None if host.narrowed(chosen) == host else chosen
    except ValueError:  # not a cap, or not one this host runs: CompileOptions names the problem
        return chosen


def _options(threads: int, **fields: object) -> CompileOptions:
    """CompileOptions from keyword fields; an unknown field or a bad value is a ValueError naming it."""
    known = {f.name for f in dataclasses.fields(CompileOptions)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(f"unknown compile option {unknown[0]!r} (known: {', '.join(sorted(known - {'threads'}))})")
    return CompileOptions(threads, **fields)  # type: ignore[arg-type]


class SessionOptions:
    """The subset of onnxruntime.SessionOptions smelt honours (others are accepted, ignored)."""

    def __init__(self) -> None:
        self.intra_op_num_threads = 0
        self.inter_op_num_threads = 0
        self.graph_optimization_level = None
        self.log_severity_level = 2


PROVIDER = "SmeltExecutionProvider"


def _provider_options(providers: Sequence[Any] | None, provider_options: Sequence[Mapping] | None) -> dict:
    """smelt's entry of onnxruntime-style provider options: ``providers=[(name, {...})]`` or the
    parallel ``provider_options=[{...}]`` list; other providers' entries are ignored."""
    found: dict = {}
    for i, p in enumerate(providers or ()):
        name, opts = (p[0], p[1]) if isinstance(p, tuple) else (p, None)
        if provider_options is not None and i < len(provider_options):
            opts = {**(opts or {}), **provider_options[i]}
        if name == PROVIDER and opts:
            found.update(opts)
    unknown = sorted(set(found) - {"isa"})
    if unknown:
        raise ValueError(f"unknown {PROVIDER} option {unknown[0]!r} (known: isa)")
    return found


class InferenceSession:
    """Drop-in for ``onnxruntime.InferenceSession``: ``run``, ``get_inputs``, ``get_outputs``.

    The ISA cap is a provider option, where onnxruntime users set an execution provider's own
    knobs: ``providers=[("SmeltExecutionProvider", {"isa": <cap>})]`` (or ``provider_options``);
    without it, $SMELT_ISA, else the host's ISA."""

    def __init__(self, model: ModelLike, sess_options: SessionOptions | Any | None = None,
                 providers: Sequence[Any] | None = None, provider_options: Sequence[Mapping] | None = None,
                 **kwargs: Any) -> None:
        threads = getattr(sess_options, "intra_op_num_threads", 0) if sess_options is not None else 0
        opts = _provider_options(providers, provider_options)
        self._model = CompiledModel(model, threads=threads or None, isa=opts.get("isa"))
        self._providers = [PROVIDER]

    def get_inputs(self) -> list[NodeArg]:
        return self._model.get_inputs()

    def get_outputs(self) -> list[NodeArg]:
        return self._model.get_outputs()

    def get_providers(self) -> list[str]:
        return list(self._providers)

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any],
            run_options: Any = None) -> list[np.ndarray]:
        outs = self._model.run(input_feed)
        if not output_names:
            return outs
        names = [o.name for o in self._model.get_outputs()]
        result = []
        for name in output_names:
            if name not in names:
                raise ValueError(f"unknown output name {name!r}; the model's outputs are {names}")
            result.append(outs[names.index(name)])
        return result

    @property
    def compiled(self) -> CompiledModel:
        return self._model
