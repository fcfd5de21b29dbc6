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
from smelt.errors import SmeltError, UnsupportedOpError
from smelt.frontend.onnx_import import node_to_onnx, specialize_inputs, to_ir
from smelt.frontend.validate import check_model
from smelt.ir.graph import Graph, Value
from smelt.ir.ops import flops
from smelt.ir.types import onnx_from_np_dtype
from smelt.ir.verify import verify
from smelt.passes.layout import plan_layouts
from smelt.passes.pipeline import run_passes
from smelt.progress import Phases
from smelt.runtime.module import TensorSpec
from smelt.schedule.db import open_default
from smelt.schedule.rnn import RNN_KIND, decide_rnn_graph
from smelt.target import Target, detect

# the tuning database's record kind for NCHWc convolution schedules
CONV_KIND = "conv_nchwc"


@dataclass(frozen=True)
class CompileOptions:
    threads: int
    opt_level: int = 1
    allow_fallback: bool = True
    force_fallback: frozenset[str] = field(default_factory=frozenset)
    sanitize: bool = False
    # instrumented build: per-step timestamps in the native code (``smelt profile``); a separate
    # artifact and library, so the ordinary build carries no profiling code
    profile: bool = False
    # layout planning (smelt.passes.layout.MODES): "propagate" = NCHW[x]c convolutions with
    # transform elimination; "nchw", "conv" and "global" reproduce NeoCPU's Table 3 ablation
    layout: str = "propagate"
    # look up tuned schedules in the tuning database (smelt.schedule.db); off: template defaults only
    use_tuning_db: bool = True
    # 3x3 stride-1 convs may run as Winograd F(2x2,3x3) where it is faster (fp32 throughout;
    # templates/winograd.py); off: the direct kernels only (the direct sum's rounding)
    winograd: bool = True

    def codegen_threads(self, target: Target) -> int:
        """Threads the generated code is sized for (per-thread scratch). It runs correctly with any
        pool of up to this many threads, so 1-thread and all-core runs share one library."""
        return max(self.threads, target.physical_cores)

    def key(self, target: Target) -> str:
        return json.dumps([self.codegen_threads(target), self.opt_level, self.allow_fallback,
                           sorted(self.force_fallback), self.sanitize, self.profile, self.layout,
                           tuning_fingerprint(self, target), self.winograd])


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
    # shared locks on the artifact directory and library (smelt.cache.Pin): eviction leaves them
    # alone while this result lives, so the loader that reads them next finds them whole
    pins: tuple[cache.Pin, ...] = field(default=(), repr=False, compare=False)


def _spec(v: Value) -> TensorSpec:
    shape = tuple(v.shape) if v.shape is not None else ()
    return TensorSpec(v.name, np.dtype(v.dtype) if v.dtype is not None else np.dtype("float32"), shape)


def _spec_json(v: Value) -> dict:
    d = _spec(v).to_json()
    d["shape"] = [s if isinstance(s, int) else str(s) for s in (v.shape or ())]
    return d


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
        op = step["op"]
        if op in ("Add", "Sub", "Mul", "Div"):
            ins = [step["input"], cur] if step.get("swap") else [cur, step["input"]]
            nodes.append(helper.make_node(op, ins, [out]))
        elif op == "Clip":
            lo, hi = f"{out}__min", f"{out}__max"
            inits += [numpy_helper.from_array(np.array(step["min"], np.float32), lo),
                      numpy_helper.from_array(np.array(step["max"], np.float32), hi)]
            nodes.append(helper.make_node("Clip", [cur, lo, hi], [out]))
        elif op == "SiLU":
            nodes.append(helper.make_node("Sigmoid", [cur], [f"{out}__sig"]))
            nodes.append(helper.make_node("Mul", [cur, f"{out}__sig"], [out]))
        else:
            attrs = {key: val for key, val in step.items() if key in ("alpha", "beta")}
            nodes.append(helper.make_node(op, [cur], [out], **attrs))
        cur = out
    return nodes, inits


def tuning_fingerprint(options: CompileOptions, target: Target) -> str:
    if not options.use_tuning_db:
        return ""
    db = open_default(create=False)
    if db is None:
        return ""
    # "rnn": recurrence grids from smelt.tune.rnn_calibrate, read by smelt.schedule.rnn in every
    # layout mode (conv schedules are not read under "nchw")
    rnn = db.fingerprint(RNN_KIND, target.key())
    if options.layout == "nchw":
        return rnn
    fp = db.fingerprint(CONV_KIND, target.key()) + "|" + rnn
    if options.layout == "global":  # the global search also reads scheme and transform costs
        from smelt.tune.search import SCHEME_KIND, TRANSFORM_KIND

        fp += "|" + db.fingerprint(SCHEME_KIND, target.key()) + "|" + db.fingerprint(TRANSFORM_KIND, target.key())
    return fp


def _db_schedules(options: CompileOptions, target: Target):
    """The layout pass's schedule source: the tuning database's record for each conv workload."""
    db = open_default(create=False) if options.use_tuning_db else None
    if db is None:
        return None
    from smelt.codegen.templates.conv_nchwc import NchwcSchedule, workload

    def lookup(node, g, in_block):
        cfg = db.lookup(CONV_KIND, workload(node, g, in_block, options.threads), target.key())
        return NchwcSchedule.from_dict(cfg) if cfg else None

    return lookup


def lower(proto: onnx.ModelProto, options: CompileOptions, target: Target | None = None) -> Graph:
    """Validate, import and optimize: the IR graph the code generator consumes."""
    check_model(proto)  # InvalidModelError before anything trusts the model (frontend/validate.py)
    g = to_ir(proto)
    g = run_passes(g, options.opt_level)
    if options.opt_level >= 1:
        target = target or detect()
        schedules = _db_schedules(options, target)
        if options.layout == "global":  # NeoCPU's global search picks every conv's blocks
            from smelt.schedule.layout_search import global_schedules

            db = open_default(create=False) if options.use_tuning_db else None
            schedules = global_schedules(g, target, options.threads, db, options.force_fallback)
        g = plan_layouts(g, target, options.layout, options.force_fallback, schedules)
        if not options.winograd:
            for node in g.nodes:
                if node.op == "Conv":
                    node.schedule["algorithm"] = "direct"
        verify(g, "plan_layouts")  # the graph codegen reads: invariants hold (cheap: linear)
    # --- schedule stage, RNN part (to be folded into the stage's driver) ---
    target = target or detect()
    decide_rnn_graph(g, target, options.codegen_threads(target),
                     open_default(create=False) if options.use_tuning_db else None)
    # --- end RNN schedule ---
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
    target = target or detect()
    compiler = toolchain.find_compiler()
    model_bytes = proto.SerializeToString()
    key = toolchain.artifact_key(
        hashlib.sha256(model_bytes).hexdigest(), json.dumps({k: list(v) for k, v in sorted(shapes.items())}),
        options.key(target), smelt_source_digest(), target.key(), compiler.identity,
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
        plan = build_plan(g, options.force_fallback)
        _check_fallbacks(plan, options)
        phases.start("generating C")
        module = generate(g, plan, target, options.codegen_threads(target), profile=options.profile)
        lib_path = lib_pin = None
        if plan.native_blocks():
            phases.start("C compiler")
            lib_path, lib_pin = toolchain.shared_library(module.source, name=g.name, target=target,
                                                         sanitize=options.sanitize)
        phases.start("writing artifact")
        meta = _plan_json(g, plan, module, lib_path, options, target)
        # kept in the artifact so a report on a cached build can still say what compiling cost
        meta["compile_seconds"] = round(time.perf_counter() - start, 3)
        written = _write_artifact(directory, g, plan, meta, module.weights)
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
    target = target or detect()
    start = time.perf_counter()
    plan = plan or build_plan(g, options.force_fallback)
    _check_fallbacks(plan, options)
    module = generate(g, plan, target, options.codegen_threads(target), profile=options.profile)
    lib_path, lib_pin = (toolchain.shared_library(module.source, name=g.name, target=target,
                                                  sanitize=options.sanitize) if plan.native_blocks() else (None, None))
    written = _write_artifact(Path(directory), g, plan, _plan_json(g, plan, module, lib_path, options, target),
                              module.weights)
    result = _loaded(Path(directory))
    del written, lib_pin
    result.compile_seconds, result.from_cache = time.perf_counter() - start, False
    return result


def _plan_json(g: Graph, plan: ExecutionPlan, module, lib_path: Path | None, options: CompileOptions,
               target: Target) -> dict:
    steps = []
    fallback_nodes = []
    for i, step in enumerate(plan.steps):
        if isinstance(step, NativeBlock):
            steps.append({
                "kind": "native", "index": step.index,
                "ext_inputs": [_spec_json(g.values[n]) for n in step.ext_inputs],
                "ext_outputs": [_spec_json(g.values[n]) for n in step.ext_outputs],
                "nodes": [[n.name, n.op] for n in step.nodes],
                "step_nodes": module.step_nodes[step.index],
                "step_info": module.step_info[step.index],
            })
        else:
            outs = [(_spec_json(g.values[o]) if g.values[o].is_static else None) for o in step.node.outputs if o]
            steps.append({"kind": "fallback", "model": f"fallback_{i}.onnx", "node": step.node.name,
                          "op": step.node.op, "reason": step.reason, "outputs": outs,
                          "flops": int(flops(step.node, g)), "epilogue": epilogue_ops(step.node)})
            fallback_nodes.append({"node": step.node.name, "op": step.node.op, "reason": step.reason})
    return {
        "model": g.name,
        "inputs": [_spec_json(g.values[n]) for n in g.inputs],
        "outputs": [_spec_json(g.values[n]) for n in g.outputs],
        "steps": steps,
        "native_blocks": len(plan.native_blocks()),
        "fallback_nodes": fallback_nodes,
        "arena_bytes": plan.arena_bytes,
        "scratch_bytes": module.scratch_bytes,
        "weights_bytes": int(module.weights.nbytes),
        # relative to the cache directory, so a moved or copied cache stays whole
        "lib": lib_path.relative_to(toolchain.cache_dir()).as_posix() if lib_path else None,
        "codegen_threads": options.codegen_threads(target),
        "profile": options.profile,
        "native_nodes": [[n.name, n.op] for b in plan.native_blocks() for n in b.nodes],
    }


def _write_artifact(directory: Path, g: Graph, plan: ExecutionPlan, meta: dict, weights: np.ndarray) -> cache.Pin:
    """Write the artifact to a temporary directory, its manifest last, and rename it into place
    (atomic; if another process got there first, its artifact is kept when intact). Returns a
    pin on the installed directory."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=".tmp-"))
    try:
        written = cache.pin(tmp)  # the inode keeps its pin through the rename
        assert written is not None
        for i, step in enumerate(plan.steps):
            if isinstance(step, FallbackStep):
                model, runtime_inputs = _fallback_model(g, step)
                onnx.save(model, str(tmp / f"fallback_{i}.onnx"))
                meta["steps"][i]["inputs"] = runtime_inputs
        consts = {o: g.values[o].const for o in g.outputs if g.values[o].const is not None}
        if consts:
            np.savez(tmp / "consts.npz", **consts)
        weights.tofile(tmp / "weights.bin")
        (tmp / "plan.json").write_text(json.dumps(meta, indent=1))
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
        try:
            meta = json.loads((directory / "plan.json").read_text())
        except (OSError, ValueError) as exc:
            problem = f"plan.json is unreadable: {exc}"
    if problem is not None or meta is None:
        if directory.exists():
            cache.warn_damaged(directory, problem or "plan.json is unreadable")
            cache.discard(directory, entry)
        return None
    pins = [entry]
    lib = toolchain.cache_dir() / meta["lib"] if meta.get("lib") else None
    if lib is not None:
        lib_pin = toolchain.open_library(lib)
        if lib_pin is None:  # evicted or damaged: rebuild everything (the library is fixed then)
            cache.discard(directory, entry)
            return None
        pins.append(lib_pin)
    cache.touch(directory)
    return BuildResult(directory, lib, 0.0, True, pins=tuple(pins))


def _loaded(directory: Path) -> BuildResult:
    """The artifact just written (pinned by its writer, so it is there)."""
    result = _load_cached(directory)
    if result is None:
        raise SmeltError(f"the compiled artifact at {directory} failed its checksum right after it was written "
                         "(is something else writing to the cache directory?)")
    return result
