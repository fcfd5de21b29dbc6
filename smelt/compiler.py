"""The driver: ONNX model + concrete input shapes -> cached artifact directory.

Two caches, both under the user cache directory: the shared library is keyed by
sha256(source ‖ compiler ‖ flags ‖ target) (see ``codegen.toolchain``); the whole artifact
(library path, weights, plan) is keyed by sha256(model ‖ input shapes ‖ options ‖ smelt sources
‖ target ‖ compiler), so a second compile of the same model skips every pass and loads in well
under a second. Both are checked against their checksums before use and kept within the cache's
size bound (``smelt.cache``).
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from smelt import cache, settings
from smelt.codegen import toolchain
from smelt.codegen.emit import epilogue_ops, generate
from smelt.codegen.plan import ExecutionPlan, FallbackStep, NativeBlock, build_plan
from smelt.errors import ArtifactError, SmeltError, UnsupportedOpError
from smelt.frontend.onnx_import import node_to_onnx, specialize_inputs, to_ir
from smelt.frontend.validate import check_model
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
from smelt.schedule.stage import fingerprint_for, schedule_graph
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


def lower(proto: onnx.ModelProto, options: CompileOptions, target: Target | None = None) -> Graph:
    """Validate, import and optimize: the IR graph the code generator consumes."""
    check_model(proto)  # InvalidModelError before anything trusts the model (frontend/validate.py)
    g = to_ir(proto)
    g = run_passes(g, options.opt_level)
    g = schedule_graph(g, (target or detect()).narrowed(options.isa), options)
    verify(g, "schedule")  # the graph codegen reads: invariants hold (cheap: linear)
    return g


def _check_fallbacks(plan: ExecutionPlan, options: CompileOptions) -> None:
    for step in plan.fallback_steps():
        if not options.allow_fallback and step.node.name not in options.force_fallback:
            raise UnsupportedOpError(step.node.op, step.node.name, f"no native kernel ({step.reason}) "
                                     "and fallback is disabled (allow_fallback=False)")
        if not onnx.defs.has(step.node.op, step.node.domain):
            where = f"domain {step.node.domain!r}" if step.node.domain else "the ONNX standard"
            raise UnsupportedOpError(step.node.op, step.node.name,
                                     f"not an operator of {where} that smelt or onnx.reference knows "
                                     "(custom ops have no native template and cannot fall back)")


def build(proto: onnx.ModelProto, shapes: Mapping[str, Sequence[int]], options: CompileOptions,
          *, target: Target | None = None, progress: bool = False) -> BuildResult:
    """Compile ``proto`` specialized to ``shapes``; reuse a cached artifact when one exists."""
    settings.check_all()  # a bad SMELT_* value fails here, before any work (or any thread pool)
    # the ISA cap (options.isa) narrows the host description every later stage reads
    target = (target or detect()).narrowed(options.isa)
    compiler = toolchain.find_compiler()
    model_bytes = proto.SerializeToString()
    key = toolchain.artifact_key(
        hashlib.sha256(model_bytes).hexdigest(), json.dumps({k: list(v) for k, v in sorted(shapes.items())}),
        options.key(target), fingerprint_for(options, target), smelt_source_digest(), target.key(), compiler.identity,
    )
    directory = toolchain.cache_dir() / "models" / key[:2] / key
    cached = _load_cached(directory)
    if cached is not None and (cached.lib_path is None or not toolchain.keep_sources()
                               or toolchain.source_path_for(cached.lib_path) is not None):
        return cached
    # a miss, or the generated C is wanted and was not kept: generate it again (the library and
    # artifact already cached are verified and reused, not rebuilt)
    start = time.perf_counter()
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
        module = generate(g, plan, target, options.codegen_threads(target), profile=options.profile)
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
    module = generate(g, plan, target, options.codegen_threads(target), profile=options.profile)
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
