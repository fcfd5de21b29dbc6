"""The driver: ONNX model + concrete input shapes -> cached artifact directory.

Two caches, both under the user cache directory: the shared library is keyed by
sha256(source ‖ compiler ‖ flags ‖ target) (see ``codegen.toolchain``); the whole artifact
(library path, weights, plan) is keyed by sha256(model ‖ input shapes ‖ options ‖ smelt sources
‖ target ‖ compiler), so a second compile of the same model skips every pass and loads in well
under a second. Both are checked against their checksums before use and kept within the cache's
size bound (``smelt.cache``).
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import gzip
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from smelt import cache, settings
from smelt.cache import atomic_write
from smelt.codegen import shape_slots, toolchain
from smelt.codegen.emit import epilogue_ops, generate
from smelt.codegen.plan import ExecutionPlan, FallbackStep, NativeBlock, build_plan
from smelt.errors import ArtifactError, CompileError, SmeltError, UnsupportedOpError
from smelt.frontend.contrib_transformer import expand_transformer_contrib_ops
from smelt.frontend.node_order import in_topological_order
from smelt.frontend.onnx_import import node_to_onnx, specialize_inputs, to_ir
from smelt.frontend.validate import DeclaredShapeWarning, check_model
from smelt.ir.epilogue import EpilogueBinary
from smelt.ir.graph import Graph, Value
from smelt.ir.ops import flops
from smelt.ir.types import onnx_from_np_dtype
from smelt.ir.verify import verify
from smelt.options import CompileOptions
from smelt.passes.pipeline import run_passes
from smelt.progress import Phases
from smelt.runtime import artifact
from smelt.runtime.artifact import ArtifactPlan, FallbackStepEntry, NativeBlockEntry, TensorSpec
from smelt.runtime.reference_ops import REFERENCE_CONTRIB_OPS
from smelt.schedule.rnn import decide_rnn_graph
from smelt.schedule.stage import fingerprint_for, schedule_graph, tuning_db
from smelt.target import Target, detect


@functools.lru_cache(maxsize=1)
def smelt_source_digest() -> str:
    """Hash of smelt's own sources: a new smelt never reuses an old artifact."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parent
    for path in sorted(root.rglob("*")):
        if path.suffix in (".py", ".h", ".c") and "__pycache__" not in path.parts:
            h.update(path.relative_to(root).as_posix().encode())
            h.update(path.read_bytes())
    return h.hexdigest()


@dataclass
class BuildResult:
    directory: Path
    lib_path: Path | None
    compile_seconds: float
    from_cache: bool
    plan: ArtifactPlan = field(repr=False, compare=False)  # its plan.json, read and validated
    # shared locks on the artifact directory and library (smelt.cache.Pin): eviction leaves them
    # alone while this result lives, so the loader that reads them next finds them whole
    pins: tuple[cache.Pin, ...] = field(default=(), repr=False, compare=False)


def _spec(v: Value) -> TensorSpec:
    shape = tuple(s if isinstance(s, int) else str(s) for s in (v.shape or ()))
    return TensorSpec(v.name, np.dtype(v.dtype) if v.dtype is not None else np.dtype("float32"), shape)


def _fallback_model(g: Graph, step: FallbackStep) -> tuple[onnx.ModelProto, list[str]]:
    """A one-node ONNX model for a fallback step; constants become its initializers."""
    node = step.node
    runtime_inputs, inputs, inits = [], [], []
    for name in dict.fromkeys(node.all_inputs()):
        v = g.values.get(name)
        if v is None:
            continue
        if v.const is not None:
            inits.append(numpy_helper.from_array(np.asarray(v.const), name))
            continue
        runtime_inputs.append(name)
        elem = onnx_from_np_dtype(v.dtype) if v.dtype is not None else 0
        inputs.append(helper.make_tensor_value_info(name, elem, None))
    outputs = [helper.make_empty_tensor_value_info(o) for o in node.outputs if o]
    nodes = [node_to_onnx(node)]
    if node.epilogue:  # a fused node that falls back still owes its epilogue
        nodes, extra_inits = _expand_epilogue(node)
        inits.extend(extra_inits)
    graph = helper.make_graph(nodes, f"fallback_{node.op}", inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in g.opset.items()])
    model.ir_version = max(model.ir_version, 8)
    return model, runtime_inputs


def _expand_epilogue(node) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """ONNX nodes equivalent to ``node`` followed by its fused epilogue."""
    final = node.outputs[0]
    cur = f"{final}__pre_epilogue"
    head = node_to_onnx(node)
    head.output[0] = cur
    nodes, inits = [head], []
    for k, step in enumerate(node.epilogue):
        out = final if k == len(node.epilogue) - 1 else f"{final}__epilogue_{k}"
        op = step.op
        if isinstance(step, EpilogueBinary):
            ins = [step.input, cur] if step.swap else [cur, step.input]
            nodes.append(helper.make_node(op, ins, [out]))
        elif op == "Clip":
            lo, hi = f"{out}__min", f"{out}__max"
            inits += [numpy_helper.from_array(np.array(step.param("min"), np.float32), lo),
                      numpy_helper.from_array(np.array(step.param("max"), np.float32), hi)]
            nodes.append(helper.make_node("Clip", [cur, lo, hi], [out]))
        elif op == "SiLU":
            nodes.append(helper.make_node("Sigmoid", [cur], [f"{out}__sig"]))
            nodes.append(helper.make_node("Mul", [cur, f"{out}__sig"], [out]))
        elif op == "Gelu":  # the exporters' spelling it was fused from: x * 0.5 * (1 + erf(x / sqrt2))
            for name, c in (("sqrt2", np.sqrt(2.0)), ("one", 1.0), ("half", 0.5)):
                inits.append(numpy_helper.from_array(np.array(c, np.float32), f"{out}__{name}"))
            nodes += [helper.make_node("Div", [cur, f"{out}__sqrt2"], [f"{out}__d"]),
                      helper.make_node("Erf", [f"{out}__d"], [f"{out}__e"]),
                      helper.make_node("Add", [f"{out}__e", f"{out}__one"], [f"{out}__a"]),
                      helper.make_node("Mul", [cur, f"{out}__a"], [f"{out}__m"]),
                      helper.make_node("Mul", [f"{out}__m", f"{out}__half"], [out])]
        else:
            attrs = step.param_dict()  # the op's ONNX attributes (ACTIVATIONS[op].attrs)
            nodes.append(helper.make_node(op, [cur], [out], **attrs))
        cur = out
    return nodes, inits


def lower(proto: onnx.ModelProto, options: CompileOptions, target: Target | None = None,
          *, decide_at: onnx.ModelProto | None = None) -> Graph:
    """Validate, import and optimize: the IR graph the code generator consumes.

    ``decide_at``: the same model specialized to other input shapes (the *decision shapes*):
    layouts and schedules are decided as for those shapes and then rendered at ``proto``'s, so
    every shape of a model gets the same decisions (a precondition of sharing one library,
    ``codegen.shape_slots``). Raises ``ShapeClassError`` when the passes turn the two into
    different graphs (a pass decided something from a shape)."""
    # onnxruntime's transformer ops in standard ONNX ops first: they are what gets validated
    proto = expand_transformer_contrib_ops(in_topological_order(proto))
    check_model(proto)  # InvalidModelError before anything trusts the model (frontend/validate.py)
    g = run_passes(to_ir(proto), options.opt_level, options.skipped_passes())
    actual: dict[str, object] = {}
    if decide_at is not None:
        with warnings.catch_warnings():  # the model's own shapes were checked above; these are ours
            warnings.simplefilter("ignore", DeclaredShapeWarning)
            ref = run_passes(to_ir(expand_transformer_contrib_ops(in_topological_order(decide_at))), options.opt_level,
                              options.skipped_passes())
        _same_graph(g, ref)
        actual = {name: v.shape for name, v in g.values.items()}
        for name, v in g.values.items():
            if name in ref.values:
                v.shape = ref.values[name].shape
        g.shape_generic = True
        for node in g.nodes:  # recurrent kernels whose code is the same for every T and B
            if node.op in ("LSTM", "GRU", "RNN") and node.domain in ("", "ai.onnx"):
                node.attrs["smelt_dynamic"] = 1
    g = schedule_graph(g, (target or detect()).narrowed(options.isa), options)
    if decide_at is not None:
        # back to the actual shapes; a layout transform the schedule inserted has its input's
        for node in g.nodes:
            for out in node.outputs:
                if out in actual:
                    g.values[out].shape = actual[out]
                elif node.op == "LayoutTransform":
                    g.values[out].shape = g.values[node.inputs[0]].shape
        for name, shape in actual.items():
            if name in g.values:
                g.values[name].shape = shape
        for node in g.nodes:  # a blocked value the layout pass made for a plain one (a conv writing
            # a graph output): the plain value's shape
            if node.op == "LayoutTransform" and node.inputs[0] not in actual and node.outputs[0] in actual:
                g.values[node.inputs[0]].shape = actual[node.outputs[0]]
        g.decision_shapes = {name: ref.values[name].shape for name in g.values if name in ref.values}
        # recurrent nodes are scheduled at their actual sizes: their grid table has a row per
        # batch size up to B (a larger batch than the decision's would have no row)
        narrowed = (target or detect()).narrowed(options.isa)
        decide_rnn_graph(g, narrowed, options.codegen_threads(narrowed), tuning_db(options))
    verify(g, "schedule")  # the graph codegen reads: invariants hold (cheap: linear)
    return g


class ShapeClassError(Exception):
    """Two shapes of one model lower to different graphs: they cannot share decisions."""


def _same_graph(a: Graph, b: Graph) -> None:
    """Raise ``ShapeClassError`` unless ``a`` and ``b`` have the same nodes (op, name, inputs,
    outputs, attributes, fused epilogue), values (dtype, rank, constness) and graph outputs."""
    if [n.name for n in a.nodes] != [n.name for n in b.nodes] or a.outputs != b.outputs or a.inputs != b.inputs:
        raise ShapeClassError("the graph passes leave different nodes at the two shapes")
    for x, y in zip(a.nodes, b.nodes, strict=True):
        if (x.op, x.domain, x.inputs, x.outputs, repr(x.epilogue)) != (y.op, y.domain, y.inputs, y.outputs,
                                                                       repr(y.epilogue)) \
                or not _same_attrs(x.attrs, y.attrs):
            raise ShapeClassError(f"node {x.name!r} ({x.op}) differs between the two shapes")
    for name, v in a.values.items():
        w = b.values.get(name)
        if w is None or v.dtype != w.dtype or (v.shape is None) != (w.shape is None) \
                or (v.shape is not None and len(v.shape) != len(w.shape)) or v.is_const != w.is_const:
            raise ShapeClassError(f"value {name!r} differs between the two shapes")


def _same_attrs(a: dict, b: dict) -> bool:
    """Equal attributes; lists compare as lists first (a LightGBM ensemble's millions of node
    values: the repr of each took seconds per render), by repr where that is unsure (NaN, arrays)."""
    if a.keys() != b.keys():
        return False
    for k, va in a.items():
        vb = b[k]
        if isinstance(va, list) and isinstance(vb, list) and len(va) == len(vb):
            try:
                if va == vb:
                    continue
            except ValueError:  # lists of arrays
                pass
        if repr(va) != repr(vb):
            return False
    return True


def _check_fallbacks(plan: ExecutionPlan, options: CompileOptions) -> None:
    for step in plan.fallback_steps():
        if not options.allow_fallback and step.node.name not in options.force_fallback:
            raise UnsupportedOpError(step.node.op, step.node.name, f"no native kernel ({step.reason}) "
                                     "and fallback is disabled (allow_fallback=False)")
        refusal = REFERENCE_CONTRIB_OPS.get((step.node.domain, step.node.op))
        if refusal is not None and refusal(step.node.attrs, step.node.inputs):
            raise UnsupportedOpError(step.node.op, step.node.name,
                                     f"no native kernel ({step.reason}), and the fallback's {step.node.op} does not "
                                     f"take {refusal(step.node.attrs, step.node.inputs)} either")
        if not onnx.defs.has(step.node.op, step.node.domain) and refusal is None:
            where = f"domain {step.node.domain!r}" if step.node.domain else "the ONNX standard"
            raise UnsupportedOpError(step.node.op, step.node.name,
                                     f"no native kernel ({step.reason}), and not an operator of {where} that "
                                     "onnx.reference (the fallback) knows")
        if step.node.domain == "ai.onnx.ml" and not _reference_has_ml_op(step.node.op):
            # refused here, not after a whole compile at load (a LightGBM classifier's ZipMap
            # took two minutes to say so, before ZipMap ran: frontend/zipmap.py)
            raise UnsupportedOpError(step.node.op, step.node.name,
                                     f"no native kernel ({step.reason}), and onnx.reference (the fallback) has "
                                     "no implementation of this domain 'ai.onnx.ml' op either")


def _reference_has_ml_op(op: str) -> bool:
    """Whether onnx.reference implements the ``ai.onnx.ml`` op ``op`` (CastMap, CategoryMapper and
    ZipMap it does not)."""
    from onnx.reference.ops import aionnxml

    try:
        aionnxml.load_op("ai.onnx.ml", op, None)
    except NotImplementedError:
        return False
    return True


def build(proto: onnx.ModelProto, shapes: Mapping[str, Sequence[int]], options: CompileOptions,
          *, target: Target | None = None, progress: bool = False,
          shape_class: ShapeClass | None = None) -> BuildResult:
    """Compile ``proto`` specialized to ``shapes``; reuse a cached artifact when one exists.

    ``shape_class`` (a model with symbolic input dimensions): decide layouts and schedules at the
    class's decision shapes and serve ``shapes`` from a library shared by every shape whose
    generated C has the same structure (``codegen.shape_slots``), compiling only when no such
    library exists yet; where sharing is impossible, build as for a fixed shape."""
    settings.check_all()  # a bad SMELT_* value fails here, before any work (or any thread pool)
    # the ISA cap (options.isa) narrows the host description every later stage reads
    target = (target or detect()).narrowed(options.isa)
    compiler = toolchain.find_compiler()
    model_bytes = proto.SerializeToString()
    model_digest = hashlib.sha256(model_bytes).hexdigest()
    key = toolchain.artifact_key(
        model_digest, json.dumps({k: list(v) for k, v in sorted(shapes.items())}),
        options.key(target), fingerprint_for(options, target), smelt_source_digest(), target.key(), compiler.identity,
        shape_class.key() if shape_class is not None else "",
    )
    directory = toolchain.cache_dir() / "models" / key[:2] / key
    cached = _load_cached(directory)
    if cached is not None and (cached.lib_path is None or not toolchain.keep_sources()
                               or toolchain.source_path_for(cached.lib_path) is not None):
        return cached
    # a miss, or the generated C is wanted and was not kept: generate it again (the library and
    # artifact already cached are verified and reused, not rebuilt)
    start = time.perf_counter()
    if shape_class is not None and not options.profile:
        shared = _build_shared(proto, model_digest, shapes, options, target, shape_class, directory, start)
        if shared is not None:
            return shared
    with Phases(f"compiling {proto.graph.name or 'model'}", ["graph passes", "execution plan", "generating C",
                                                             "C compiler", "writing artifact"],
                enabled=progress) as phases:
        phases.start("graph passes")
        specialized = specialize_inputs(proto, shapes)
        g = lower(specialized, options, target)
        phases.start("execution plan")
        plan = build_plan(g, options.force_fallback, concat_views=options.concat_views)
        _check_fallbacks(plan, options)
        phases.start("generating C")
        module = generate(g, plan, target, options.codegen_threads(target), profile=options.profile,
                      count_saturation=options.count_saturation)
        lib_path = lib_pin = None
        if plan.native_blocks():
            phases.start("C compiler")
            lib_path, lib_pin = toolchain.shared_library(module.source, name=g.name, target=target,
                                                         sanitize=options.sanitize)
        phases.start("writing artifact")
        # compile_seconds is kept in the artifact so a report on a cached build can still say
        # what compiling cost
        fallbacks = _fallback_models(g, plan)
        meta = _artifact_plan(g, plan, module, lib_path, options, target, fallbacks,
                              round(time.perf_counter() - start, 3))
        written = _write_artifact(directory, g, meta, fallbacks, module.weights)
    result = _loaded(directory)
    del written, lib_pin  # the result pins both now
    cache.enforce_bound()
    result.compile_seconds = time.perf_counter() - start
    result.from_cache = False
    if toolchain.debug_enabled() and lib_path is not None:
        print(f"smelt: generated C kept at {toolchain.source_path_for(lib_path)}", file=sys.stderr)
    return result


def build_lowered(g: Graph, options: CompileOptions, directory: Path, *, target: Target | None = None,
                  plan: ExecutionPlan | None = None) -> BuildResult:
    """Plan (unless ``plan`` is given), generate, compile and write an artifact for an
    already-lowered graph into ``directory`` (which must not exist yet). No artifact cache and no
    passes: the tuner builds throwaway measurement graphs whose nodes already carry their layouts
    and schedules (the shared library itself is still cached by source hash)."""
    settings.check_all()
    # the ISA cap (options.isa) narrows the host description every later stage reads
    target = (target or detect()).narrowed(options.isa)
    start = time.perf_counter()
    plan = plan or build_plan(g, options.force_fallback, concat_views=options.concat_views)
    _check_fallbacks(plan, options)
    module = generate(g, plan, target, options.codegen_threads(target), profile=options.profile,
                      count_saturation=options.count_saturation)
    lib_path, lib_pin = (toolchain.shared_library(module.source, name=g.name, target=target,
                                                  sanitize=options.sanitize) if plan.native_blocks() else (None, None))
    fallbacks = _fallback_models(g, plan)
    meta = _artifact_plan(g, plan, module, lib_path, options, target, fallbacks,
                          round(time.perf_counter() - start, 3))
    written = _write_artifact(Path(directory), g, meta, fallbacks, module.weights)
    result = _loaded(Path(directory))
    del written, lib_pin
    result.compile_seconds, result.from_cache = time.perf_counter() - start, False
    return result


def _fallback_models(g: Graph, plan: ExecutionPlan) -> dict[int, tuple[onnx.ModelProto, list[str]]]:
    """Per fallback step (by step index): its one-node model and the model's run-time inputs."""
    return {i: _fallback_model(g, step) for i, step in enumerate(plan.steps) if isinstance(step, FallbackStep)}


def _fallback_file(i: int) -> str:
    return f"fallback_{i}.onnx"


def _artifact_plan(g: Graph, plan: ExecutionPlan, module, lib_path: Path | None, options: CompileOptions,
                   target: Target, fallbacks: Mapping[int, tuple[onnx.ModelProto, list[str]]],
                   compile_seconds: float) -> ArtifactPlan:
    steps: list[NativeBlockEntry | FallbackStepEntry] = []
    for i, step in enumerate(plan.steps):
        if isinstance(step, NativeBlock):
            steps.append(NativeBlockEntry(
                index=step.index,
                ext_inputs=tuple(_spec(g.values[n]) for n in step.ext_inputs),
                ext_outputs=tuple(_spec(g.values[n]) for n in step.ext_outputs),
                nodes=tuple((n.name, n.op) for n in step.nodes),
                step_nodes=tuple((node, op) for node, op in module.step_nodes[step.index]),
                step_info=tuple(module.step_info[step.index]),
                dynamic=tuple(module.dynamic.get(step.index, ())),
                counters=tuple(module.counters.get(step.index, ())),
            ))
        else:
            outs = tuple(_spec(g.values[o]) if g.values[o].is_static else None for o in step.node.outputs if o)
            steps.append(FallbackStepEntry(
                model=_fallback_file(i), node=step.node.name, op=step.node.op, reason=step.reason,
                inputs=tuple(fallbacks[i][1]), outputs=outs, flops=int(flops(step.node, g)),
                epilogue=tuple(epilogue_ops(step.node))))
    return ArtifactPlan(
        model=g.name,
        inputs=tuple(_spec(g.values[n]) for n in g.inputs),
        outputs=tuple(_spec(g.values[n]) for n in g.outputs),
        steps=tuple(steps),
        arena_bytes=plan.arena_bytes,
        scratch_bytes=module.scratch_bytes,
        weights_bytes=int(module.weights.nbytes),
        # relative to the cache directory, so a moved or copied cache stays whole
        lib=lib_path.relative_to(toolchain.cache_dir()).as_posix() if lib_path else None,
        codegen_threads=options.codegen_threads(target),
        profile=options.profile,
        compile_seconds=compile_seconds,
    )


def _write_artifact(directory: Path, g: Graph, meta: ArtifactPlan,
                    fallbacks: Mapping[int, tuple[onnx.ModelProto, list[str]]], weights: np.ndarray) -> cache.Pin:
    """Write the artifact to a temporary directory, its manifest last, and rename it into place
    (atomic; if another process got there first, its artifact is kept when intact). Returns a
    pin on the installed directory."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=".tmp-"))
    try:
        written = cache.pin(tmp)  # the inode keeps its pin through the rename
        assert written is not None
        for i, (model, _) in fallbacks.items():
            onnx.save(model, str(tmp / _fallback_file(i)))
        consts = {o: g.values[o].const for o in g.outputs if g.values[o].const is not None}
        if consts:
            np.savez(tmp / "consts.npz", **consts)
        weights.tofile(tmp / "weights.bin")
        artifact.save(meta, tmp)
        cache.write_manifest(tmp)
        for _ in range(8):
            try:
                os.rename(tmp, directory)  # atomic; fails if another process got there first
                return written
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                theirs = cache.pin(directory)
                if theirs is not None and cache.check_manifest(directory) is None:
                    return theirs
                if theirs is not None:
                    cache.discard(directory, theirs)  # damaged: replace it with ours
        raise SmeltError(f"could not install the compiled artifact at {directory}: another process keeps "
                         "replacing it")
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _load_cached(directory: Path) -> BuildResult | None:
    """The artifact at ``directory`` if it and its library verify, pinned; else None (a damaged
    one is deleted, so the caller rebuilds it)."""
    entry = cache.pin(directory)
    if entry is None:
        return None
    problem = cache.check_manifest(directory)
    meta = None
    if problem is None:
        try:  # intact but of another schema (or a smelt bug): damaged all the same
            meta = artifact.load(directory)
        except ArtifactError as exc:
            problem = str(exc)
    if problem is not None or meta is None:
        if directory.exists():
            cache.warn_damaged(directory, problem or f"{artifact.PLAN_FILE} is unreadable")
            cache.discard(directory, entry)
        return None
    pins = [entry]
    lib = meta.lib_path(toolchain.cache_dir())
    if lib is not None:
        lib_pin = toolchain.open_library(lib)
        if lib_pin is None:  # evicted or damaged: rebuild everything (the library is fixed then)
            cache.discard(directory, entry)
            return None
        pins.append(lib_pin)
    cache.touch(directory)
    return BuildResult(directory, lib, 0.0, True, meta, pins=tuple(pins))


def _loaded(directory: Path) -> BuildResult:
    """The artifact just written (pinned by its writer, so it is there)."""
    result = _load_cached(directory)
    if result is None:
        raise SmeltError(f"the compiled artifact at {directory} failed its checksum right after it was written "
                         "(is something else writing to the cache directory?)")
    return result


# -- one library for many shapes (codegen/shape_slots.py) -------------------------------------
@dataclass(frozen=True)
class ShapeClass:
    """The shapes of a model with symbolic input dimensions that share decisions and, where
    their generated C allows, one library.

    ``declared``: each input's dimensions as the model declares them (ints, symbol names;
    ``unk_`` names are each their own symbol). ``decide``: the size every symbol is decided at
    (layouts, schedules): fixed for the life of a compiled model, so all its shapes get the
    same decisions."""

    declared: tuple[tuple[str, tuple[int | str, ...]], ...]
    decide: tuple[tuple[str, int], ...]

    def key(self) -> str:
        return json.dumps([self.declared, self.decide])

    def symbols(self, shapes: Mapping[str, Sequence[int]]) -> dict[str, int]:
        """Each symbol's size in ``shapes``."""
        out: dict[str, int] = {}
        for name, dims in self.declared:
            for want, got in zip(dims, shapes.get(name, ()), strict=False):
                if isinstance(want, str):
                    out[want] = int(got)
        return out

    def shapes_for(self, shapes: Mapping[str, Sequence[int]], sizes: Mapping[str, int]) -> dict[str, list[int]]:
        """``shapes`` with each symbol named in ``sizes`` set to that size."""
        out = {k: list(v) for k, v in shapes.items()}
        for name, dims in self.declared:
            if name in out:
                out[name] = [sizes.get(d, got) if isinstance(d, str) else got
                             for d, got in zip(dims, out[name], strict=False)]
        return out


def _class_dir(proto_digest: str, options: CompileOptions, target: Target, shape_class: ShapeClass) -> Path:
    key = toolchain.artifact_key(proto_digest, shape_class.key(), options.key(target), fingerprint_for(options, target),
                                 smelt_source_digest(), target.key(), toolchain.find_compiler().identity)
    return toolchain.cache_dir() / "shapeclass" / key[:2] / key


def _render(proto: onnx.ModelProto, shapes: Mapping[str, Sequence[int]], options: CompileOptions, target: Target,
            decide: Mapping[str, Sequence[int]]) -> tuple[Graph, ExecutionPlan, object]:
    g = lower(specialize_inputs(proto, shapes), options, target, decide_at=specialize_inputs(proto, decide))
    plan = build_plan(g, options.force_fallback, concat_views=options.concat_views)
    _check_fallbacks(plan, options)
    return g, plan, generate(g, plan, target, options.codegen_threads(target),
                             count_saturation=options.count_saturation)


def _read_json_gz(path: Path) -> dict | None:
    try:
        return json.loads(gzip.decompress(path.read_bytes()))
    except (OSError, ValueError, EOFError):
        return None


def _build_shared(proto: onnx.ModelProto, model_digest: str, shapes: Mapping[str, Sequence[int]],
                  options: CompileOptions,
                  target: Target, shape_class: ShapeClass, directory: Path, start: float) -> BuildResult | None:
    """``build`` for a shape of a shape class: its render served by the class's library for its
    structure (compiled on the first shape of that structure). None: this shape cannot share
    (the caller builds it alone); the reason is kept in the class directory (``why.txt``)."""
    cdir = _class_dir(model_digest, options, target, shape_class)
    cdir.mkdir(parents=True, exist_ok=True)
    sizes = shape_class.symbols(shapes)
    keyed_file = cdir / "keyed.json"
    try:
        keyed = set(json.loads(keyed_file.read_text())["keyed"])
    except (OSError, ValueError, KeyError, TypeError):
        keyed = None
    decide_sizes = dict(shape_class.decide)

    def decision(sz: Mapping[str, int], keyed_now: set[str]) -> dict[str, list[int]]:
        return shape_class.shapes_for(shapes, {k: (sz[k] if k in keyed_now else decide_sizes.get(k, sz[k]))
                                               for k in sz})

    try:
        g, plan, module = _render(proto, shapes, options, target, decision(sizes, keyed or set()))
        if not plan.native_blocks():
            return None
        rendered = shape_slots.tokenize(module.source)
        if keyed is None:
            # the class's first shape: render each symbol at other sizes. One larger decides
            # whether the symbol can vary at all (else each of its sizes is its own class);
            # the others (other parities and magnitudes, past the size thresholds of serial
            # or split loops) only teach more slots up front, so fewer later shapes need a
            # recompile to add one
            keyed, probes = set(), []
            for sym in sorted(sizes):
                v = sizes[sym]
                for k, size in enumerate(dict.fromkeys((v + 1, 2 * v + 3, v // 2 + 2, 8 * v + 5, v // 8 + 1))):
                    bumped = dict(sizes, **{sym: size})
                    try:
                        with warnings.catch_warnings():  # shapes of ours, not the user's: no shape warnings
                            warnings.simplefilter("ignore", DeclaredShapeWarning)
                            _, _, pm = _render(proto, shape_class.shapes_for(shapes, bumped), options, target,
                                               decision(bumped, set()))
                        pr = shape_slots.tokenize(pm.source)
                    except SmeltError:  # a size the model does not accept (say, a fixed height)
                        pr = None
                    if pr is not None and pr.structure == rendered.structure:
                        probes.append(pr)
                    elif k == 0:
                        keyed.add(sym)
                        why = shape_slots.first_difference(rendered, pr) if pr is not None else "not accepted"
                        atomic_write(cdir / "why.txt", f"{sym}: {why}\n".encode())
                        break
            atomic_write(keyed_file, json.dumps({"keyed": sorted(keyed)}).encode())
            if keyed:  # decided at another shape: render again with the keyed symbols' own sizes
                g, plan, module = _render(proto, shapes, options, target, decision(sizes, keyed))
                rendered = shape_slots.tokenize(module.source)
        else:
            probes = []
    except ShapeClassError as exc:  # the passes decide something by shape: every shape alone
        atomic_write(cdir / "keyed.json", json.dumps({"keyed": sorted(sizes)}).encode())
        atomic_write(cdir / "why.txt", f"{exc}\n".encode())
        return None
    except SmeltError:  # a shape the model refuses: the plain build says why
        return None
    if set(sizes) <= keyed:
        return None
    sub = hashlib.sha256(json.dumps([sorted((k, sizes[k]) for k in keyed), rendered.structure_digest]).encode())
    map_file = cdir / f"{sub.hexdigest()[:32]}.json.gz"
    stored = _read_json_gz(map_file)
    smap = values = None
    if stored is not None:
        try:
            smap = shape_slots.SlotMap(stored["digest"], tuple(stored["slots"]), tuple(stored["fixed"]),
                                       stored["source"])
        except (KeyError, TypeError):
            stored = None
        else:
            values = smap.values(rendered)
            if values is None:  # same structure, but a number the library fixed differs here: a slot too
                smap = shape_slots.slot_map(shape_slots.tokenize(stored["reference"]), [rendered], smap.slots)
    else:
        smap = shape_slots.slot_map(rendered, probes)
    if smap is not None and values is None:
        values = smap.values(rendered)
        if values is not None:
            reference = stored["reference"] if stored is not None else rendered.text
            atomic_write(map_file, gzip.compress(json.dumps({
                "digest": smap.structure_digest, "slots": list(smap.slots), "fixed": list(smap.fixed),
                "source": smap.source, "reference": reference}).encode(), compresslevel=1))
    if smap is None or values is None:
        return None
    try:
        lib_path, lib_pin = toolchain.shared_library(smap.source, name=g.name, target=target, sanitize=options.sanitize)
    except CompileError as exc:  # a slot in a constant expression: every shape of this class alone
        atomic_write(cdir / "keyed.json", json.dumps({"keyed": sorted(sizes)}).encode())
        atomic_write(cdir / "why.txt", f"the slotted C does not compile: {str(exc)[:2000]}\n".encode())
        return None
    fallbacks = _fallback_models(g, plan)
    meta = _artifact_plan(g, plan, module, lib_path, options, target, fallbacks, round(time.perf_counter() - start, 3))
    meta = dataclasses.replace(meta, slots=(tuple(values[0]), tuple(values[1])))
    written = _write_artifact(directory, g, meta, fallbacks, module.weights)
    result = _loaded(directory)
    del written, lib_pin
    cache.enforce_bound()
    result.compile_seconds = time.perf_counter() - start
    result.from_cache = False
    return result
