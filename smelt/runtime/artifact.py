"""The artifact contract: what ``plan.json`` holds, as typed classes with one writer and one reader.

An artifact directory (``compiler.build``) holds ``plan.json``, ``weights.bin``, one
``fallback_<i>.onnx`` per fallback step, ``consts.npz`` when an output is a constant, and the
cache's manifest. The compiler builds an ``ArtifactPlan`` and writes it with ``save``; the
runtime (``runtime.module``), the cache check (``compiler._load_cached``), ``smelt profile``
and ``CompiledModel.plan`` read it with ``load``. Nothing else parses plan.json.

``load`` validates the whole file against this schema: a plan.json of another
``SCHEMA_VERSION``, with a missing key or a value of the wrong type raises ``ArtifactError``
naming the file and the field (e.g. ``steps[2].step_info[0].flops``). The cache treats that like
a failed checksum: the entry is damaged, a ``CacheWarning`` says so, and it is rebuilt.

Change the schema here only, and bump ``SCHEMA_VERSION`` with any change to what is written.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from smelt.errors import ArtifactError, SmeltError

# v1: the schema of smelt before this module (unversioned) had the same fields but carried a
# recurrent node's run-time dims as a JSON string in its schedule; such a file fails the version
# check and is rebuilt.
SCHEMA_VERSION = 3
PLAN_FILE = "plan.json"

Dim = int | str  # a concrete size, or the name of a symbolic dimension ("T", "B", ...)


@dataclass(frozen=True)
class TensorSpec:
    """A value crossing the boundary of a step: its name, element type and shape (a ``str``
    entry is a symbolic dimension, sized at run time)."""

    name: str
    dtype: np.dtype
    shape: tuple[Dim, ...]

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    def to_json(self) -> dict:
        return {"name": self.name, "dtype": np.dtype(self.dtype).name, "shape": list(self.shape)}


@dataclass(frozen=True)
class DynamicDims:
    """A recurrent node compiled for bounds of its sequence length T and batch B that reads the
    actual T and B at run time: the loader sets them before each call from the shape of input
    ``x`` and allocates the node's outputs by ``outputs`` (shapes in terms of "T" and "B")."""

    state: int  # byte offset of the node's int64 (T, B) pair in the instance state
    x: str  # the input whose shape carries T and B
    layout: int  # the ONNX RNN attribute: 0 -> x is [T, B, I], 1 -> [B, T, I]
    max_t: int  # the bounds the library was compiled for
    max_b: int
    outputs: Mapping[str, tuple[Dim, ...]]

    def sizes(self, x_shape: Sequence[int]) -> tuple[int, int]:
        """(T, B) of an input of shape ``x_shape``; SmeltError if it is outside the bounds."""
        if len(x_shape) != 3:
            raise SmeltError(f"recurrent input {self.x!r} must have rank 3, given shape {list(x_shape)}")
        T, B = (x_shape[0], x_shape[1]) if self.layout == 0 else (x_shape[1], x_shape[0])
        if not (1 <= T <= self.max_t and 1 <= B <= self.max_b):
            raise SmeltError(f"recurrent input {self.x!r} has sequence length {T} and batch {B}; this "
                             f"library was compiled for 1..{self.max_t} and 1..{self.max_b}")
        return int(T), int(B)

    def output_shapes(self, T: int, B: int) -> dict[str, tuple[int, ...]]:
        return {name: tuple(T if d == "T" else B if d == "B" else int(d) for d in shape)
                for name, shape in self.outputs.items()}

    def to_json(self) -> dict:
        return {"state": self.state, "x": self.x, "layout": self.layout, "max_t": self.max_t,
                "max_b": self.max_b, "outputs": {k: list(v) for k, v in self.outputs.items()}}


@dataclass(frozen=True)
class StepInfo:
    """One step of a native block, for ``smelt profile``: its node, the node's FLOPs (on every
    step of a multi-step node; ``part`` of ``parts`` says which step this is), what the node
    computes after its main loop (bias, fused epilogue) and how the template computes it
    (``BlockEmitter.schedule``: "template", "algorithm", "blocking", ... as text)."""

    node: str
    op: str
    part: int
    parts: int
    flops: int
    epilogue: tuple[str, ...]
    schedule: Mapping[str, str]

    def to_json(self) -> dict:
        return {"node": self.node, "op": self.op, "part": self.part, "parts": self.parts, "flops": self.flops,
                "epilogue": list(self.epilogue), "schedule": dict(self.schedule)}


@dataclass(frozen=True)
class SaturationCounter:
    """Where an integer kernel counts the values it saturated while writing ``value`` (a
    QuantizeLinear, QLinearConv, QLinearMatMul output): per share an int64 pair (low end, high
    end) from byte ``state`` of the instance state, summed by the loader
    (``LoadedArtifact.saturation_counts``)."""

    state: int
    value: str
    shares: int

    def to_json(self) -> dict:
        return {"state": self.state, "value": self.value, "shares": self.shares}


@dataclass(frozen=True)
class NativeBlockEntry:
    """A native block: one call of the library's ``smelt_block_<index>``."""

    index: int
    ext_inputs: tuple[TensorSpec, ...]  # its ``in`` pointers, in order
    ext_outputs: tuple[TensorSpec, ...]  # its ``out`` pointers, in order
    nodes: tuple[tuple[str, str], ...]  # (node, op) per node
    step_nodes: tuple[tuple[str, str], ...]  # (node, op) per step: a failing step's status names it
    step_info: tuple[StepInfo, ...]
    dynamic: tuple[DynamicDims, ...] = ()  # its nodes that read T and B at run time
    counters: tuple[SaturationCounter, ...] = ()  # its integer kernels' saturation counts

    kind = "native"

    def to_json(self) -> dict:
        return {"kind": self.kind, "index": self.index, "ext_inputs": [s.to_json() for s in self.ext_inputs],
                "ext_outputs": [s.to_json() for s in self.ext_outputs], "nodes": [list(n) for n in self.nodes],
                "step_nodes": [list(n) for n in self.step_nodes], "step_info": [i.to_json() for i in self.step_info],
                "dynamic": [d.to_json() for d in self.dynamic], "counters": [c.to_json() for c in self.counters]}


@dataclass(frozen=True)
class FallbackStepEntry:
    """A node run by onnx.reference between native blocks, from the one-node model ``model``."""

    model: str  # file name in the artifact directory
    node: str
    op: str
    reason: str  # why it has no native kernel
    inputs: tuple[str, ...]  # the model's run-time inputs (its constants are initializers)
    outputs: tuple[TensorSpec | None, ...]  # per output; None when its shape is not static
    flops: int
    epilogue: tuple[str, ...]

    kind = "fallback"

    def to_json(self) -> dict:
        return {"kind": self.kind, "model": self.model, "node": self.node, "op": self.op, "reason": self.reason,
                "inputs": list(self.inputs), "outputs": [o.to_json() if o else None for o in self.outputs],
                "flops": self.flops, "epilogue": list(self.epilogue)}


Step = NativeBlockEntry | FallbackStepEntry


@dataclass(frozen=True)
class ArtifactPlan:
    """Everything the loader and the profiler need besides the weights and the fallback models."""

    model: str  # the graph's name
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    steps: tuple[Step, ...]  # in execution order
    arena_bytes: int
    scratch_bytes: int  # after the arena, in the same buffer
    weights_bytes: int
    lib: str | None  # the shared library, relative to the cache directory (None: no native block)
    codegen_threads: int  # threads the generated code is sized for
    profile: bool  # an instrumented build (per-step timing)
    compile_seconds: float  # what building it cost (kept for reports on a cached build)
    # a library shared by every shape of one code structure (codegen/shape_slots.py): the integer
    # and floating-point numbers this shape's code reads at run time; None: a library of its own
    slots: tuple[tuple[int, ...], tuple[float, ...]] | None = None

    @property
    def native_blocks(self) -> tuple[NativeBlockEntry, ...]:
        return tuple(s for s in self.steps if isinstance(s, NativeBlockEntry))

    @property
    def fallback_steps(self) -> tuple[FallbackStepEntry, ...]:
        return tuple(s for s in self.steps if isinstance(s, FallbackStepEntry))

    @property
    def native_nodes(self) -> tuple[tuple[str, str], ...]:
        """(node, op) of every node with native code, in execution order."""
        return tuple(n for b in self.native_blocks for n in b.nodes)

    def step_infos(self) -> Iterator[StepInfo]:
        """Every native step's info, in execution order."""
        for b in self.native_blocks:
            yield from b.step_info

    def lib_path(self, cache_dir: Path) -> Path | None:
        return cache_dir / self.lib if self.lib else None

    def to_json(self) -> dict:
        return {"version": SCHEMA_VERSION, "model": self.model, "inputs": [s.to_json() for s in self.inputs],
                "outputs": [s.to_json() for s in self.outputs], "steps": [s.to_json() for s in self.steps],
                "arena_bytes": self.arena_bytes, "scratch_bytes": self.scratch_bytes,
                "weights_bytes": self.weights_bytes, "lib": self.lib, "codegen_threads": self.codegen_threads,
                "profile": self.profile, "compile_seconds": self.compile_seconds,
                "slots": None if self.slots is None else [list(self.slots[0]), list(self.slots[1])]}


# -- the one writer and the one reader ---------------------------------------------------------
def save(plan: ArtifactPlan, directory: Path) -> Path:
    """Write ``plan`` as ``directory/plan.json`` (the only writer of the file)."""
    path = Path(directory) / PLAN_FILE
    path.write_text(json.dumps(plan.to_json(), indent=1))
    return path


def load(directory: Path) -> ArtifactPlan:
    """Read and validate ``directory/plan.json`` (the only reader). ArtifactError, naming the file
    and the field, when it cannot be read or does not fit this schema."""
    path = Path(directory) / PLAN_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ArtifactError(path, None, f"unreadable: {exc}") from exc
    return from_json(data, path)


def from_json(data: Any, path: Path) -> ArtifactPlan:
    """An ``ArtifactPlan`` from plan.json's parsed content (``path`` names it in errors)."""
    r = _Reader(path)
    version = r.get(data, "version", "", int)
    if version != SCHEMA_VERSION:
        raise ArtifactError(path, "version", f"schema version {version}, this smelt reads {SCHEMA_VERSION}")
    return ArtifactPlan(
        model=r.get(data, "model", "", str),
        inputs=r.items(data, "inputs", "", r.spec),
        outputs=r.items(data, "outputs", "", r.spec),
        steps=r.items(data, "steps", "", r.step),
        arena_bytes=r.get(data, "arena_bytes", "", int),
        scratch_bytes=r.get(data, "scratch_bytes", "", int),
        weights_bytes=r.get(data, "weights_bytes", "", int),
        lib=r.get(data, "lib", "", str, optional=True),
        codegen_threads=r.get(data, "codegen_threads", "", int),
        profile=r.get(data, "profile", "", bool),
        compile_seconds=float(r.get(data, "compile_seconds", "", (int, float))),
        slots=r.slots(data),
    )


T = TypeVar("T")
_TYPE_NAMES = {int: "an integer", str: "a string", bool: "a boolean", float: "a number", list: "a list",
               dict: "an object"}


class _Reader:
    """Reads one plan.json; every accessor takes the field's path so far ("steps[2].") for errors."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def slots(self, data: Any) -> tuple[tuple[int, ...], tuple[float, ...]] | None:
        value = self.get(data, "slots", "", list, optional=True)
        if value is None:
            return None
        if len(value) != 2 or not all(isinstance(v, list) for v in value) \
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in value[0]) \
                or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in value[1]):
            raise self.fail("slots", "expected [[integers], [numbers]]")
        return tuple(value[0]), tuple(float(x) for x in value[1])

    def fail(self, where: str, message: str) -> ArtifactError:
        return ArtifactError(self.path, where or None, message)

    def check(self, value: Any, where: str, kind: Any, optional: bool = False) -> Any:
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if value is None and optional:
            return None
        # JSON's true/false are not integers here, nor integers booleans
        ok = isinstance(value, kinds) and (bool in kinds or not isinstance(value, bool))
        if not ok:
            want = " or ".join(_TYPE_NAMES.get(k, k.__name__) for k in kinds) + (" or null" if optional else "")
            raise self.fail(where, f"expected {want}, found {json.dumps(value)[:80]}")
        return value

    def get(self, obj: Any, key: str, prefix: str, kind: Any, optional: bool = False) -> Any:
        where = f"{prefix}{key}"
        self.check(obj, prefix.rstrip("."), dict)
        if key not in obj:
            raise self.fail(where, "missing")
        return self.check(obj[key], where, kind, optional)

    def items(self, obj: Any, key: str, prefix: str, item: Callable[[Any, str], T]) -> tuple[T, ...]:
        where = f"{prefix}{key}"
        return tuple(item(v, f"{where}[{i}]") for i, v in enumerate(self.get(obj, key, prefix, list)))

    def strings(self, obj: Any, key: str, prefix: str) -> tuple[str, ...]:
        return self.items(obj, key, prefix, lambda v, w: self.check(v, w, str))

    def pair(self, value: Any, where: str) -> tuple[str, str]:
        self.check(value, where, list)
        if len(value) != 2:
            raise self.fail(where, f"expected a [node, op] pair, found {json.dumps(value)[:80]}")
        return self.check(value[0], f"{where}[0]", str), self.check(value[1], f"{where}[1]", str)

    def shape(self, value: Any, where: str) -> tuple[Dim, ...]:
        return tuple(self.check(d, f"{where}[{i}]", (int, str)) for i, d in enumerate(self.check(value, where, list)))

    def spec(self, value: Any, where: str) -> TensorSpec:
        p = f"{where}."
        dtype = self.get(value, "dtype", p, str)
        try:
            np_dtype = np.dtype(dtype)
        except TypeError as exc:
            raise self.fail(f"{p}dtype", f"not a numpy dtype: {dtype!r}") from exc
        return TensorSpec(self.get(value, "name", p, str), np_dtype, self.shape(self.get(value, "shape", p, list),
                                                                               f"{p}shape"))

    def step_info(self, value: Any, where: str) -> StepInfo:
        p = f"{where}."
        schedule = self.get(value, "schedule", p, dict)
        for k, v in schedule.items():
            self.check(v, f"{p}schedule.{k}", str)
        return StepInfo(self.get(value, "node", p, str), self.get(value, "op", p, str), self.get(value, "part", p, int),
                        self.get(value, "parts", p, int), self.get(value, "flops", p, int),
                        self.strings(value, "epilogue", p), dict(schedule))

    def dynamic(self, value: Any, where: str) -> DynamicDims:
        p = f"{where}."
        outputs = self.get(value, "outputs", p, dict)
        return DynamicDims(self.get(value, "state", p, int), self.get(value, "x", p, str),
                           self.get(value, "layout", p, int), self.get(value, "max_t", p, int),
                           self.get(value, "max_b", p, int),
                           {k: self.shape(v, f"{p}outputs.{k}") for k, v in outputs.items()})

    def counter(self, value: Any, where: str) -> SaturationCounter:
        p = f"{where}."
        return SaturationCounter(self.get(value, "state", p, int), self.get(value, "value", p, str),
                                 self.get(value, "shares", p, int))

    def step(self, value: Any, where: str) -> Step:
        p = f"{where}."
        kind = self.get(value, "kind", p, str)
        if kind == NativeBlockEntry.kind:
            return NativeBlockEntry(
                self.get(value, "index", p, int), self.items(value, "ext_inputs", p, self.spec),
                self.items(value, "ext_outputs", p, self.spec), self.items(value, "nodes", p, self.pair),
                self.items(value, "step_nodes", p, self.pair), self.items(value, "step_info", p, self.step_info),
                self.items(value, "dynamic", p, self.dynamic), self.items(value, "counters", p, self.counter))
        if kind == FallbackStepEntry.kind:
            model = self.get(value, "model", p, str)
            if Path(model).name != model:  # a file of the artifact directory, nowhere else
                raise self.fail(f"{p}model", f"expected a file name, found {model!r}")
            return FallbackStepEntry(
                model, self.get(value, "node", p, str), self.get(value, "op", p, str),
                self.get(value, "reason", p, str), self.strings(value, "inputs", p),
                self.items(value, "outputs", p, lambda v, w: None if v is None else self.spec(v, w)),
                self.get(value, "flops", p, int), self.strings(value, "epilogue", p))
        raise self.fail(f"{p}kind", f"expected 'native' or 'fallback', found {kind!r}")
