"""What a template sees: ``BlockEmitter`` (buffers, kernel functions, steps, the node's recorded
schedule) and the C spelling helpers every template uses (``c_literal``, ``c_identifier``,
``c_comment_text``).

A step's buffers are spelled by ``ref_expr`` and found again by ``lift_refs``, which turns them
into arguments of the step function (see ``emit.py``): so a template never names a particular
buffer in code, and steps that differ only in their buffers share one function.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING

import numpy as np

from smelt.ir.graph import Graph, Node
from smelt.ir.types import c_type
from smelt.runtime.artifact import DynamicDims, SaturationCounter
from smelt.target import Target

if TYPE_CHECKING:
    from smelt.codegen.plan import ExecutionPlan, NativeBlock

# Never '*' or '/' (no way to close the comment) and no line breaks or backslashes.
_SAFE = re.compile(r"[^A-Za-z0-9_.:\-\[\] ,=;()+<>']")


def c_comment_text(text: str, limit: int = 400) -> str:
    """Make arbitrary text (node names come from untrusted files) safe inside a C comment."""
    return _SAFE.sub("?", text)[:limit]


def c_identifier(text: str) -> str:
    ident = re.sub(r"[^A-Za-z0-9_]", "_", text)
    return ident if ident and not ident[0].isdigit() else f"_{ident}"


@cache
def _dtype_name(dtype: np.dtype | str) -> str:
    return np.dtype(dtype).name


def c_literal(value: float | int | bool, dtype: np.dtype | str = "float32") -> str:
    """A C literal of the given element type that round-trips exactly. (Templates render about
    15 literals a node: numpy's dtype and NaN tests cost more than the rest.)"""
    name = _dtype_name(dtype)
    if name in ("float32", "float64"):
        v = float(value)
        if math.isnan(v):
            return "NAN"
        if name == "float32" and not math.isinf(v):
            with np.errstate(over="ignore"):  # beyond the float range rounds to +-Inf, as a cast does
                v = float(np.float32(v))
        if math.isinf(v):
            return "INFINITY" if v > 0 else "(-INFINITY)"
        text = repr(v)
        return f"{text}f" if name == "float32" else text
    if name == "bool":
        return "1" if value else "0"
    iv = int(value)
    if name == "int64" and iv == -(2**63):
        return "INT64_MIN"
    suffix = {"int64": "LL", "uint64": "ULL", "uint32": "U"}.get(name, "")
    return f"{iv}{suffix}"


def c_float_exact(value: float | np.floating) -> str:
    """The C literal of float32 ``value`` in hexadecimal (exact, and what the scalar rules of the
    quantized ops compare bit for bit); NaN and the infinities as ``c_literal`` spells them
    (a quantizer's range that overflowed gives a QLinearAdd infinite scales and NaN terms)."""
    v = float(np.float32(value))
    return float.hex(v) + "f" if math.isfinite(v) else c_literal(v)


# Where a step's buffer lives: the base its byte offset is relative to (C names in PRELUDE).
# Every pointer a template gets from BlockEmitter is spelled by ``ref_expr`` and found again by
# ``_REF``, which lifts it out of the step's code into the step function's arguments.
REF_BASES = {"arena": "SMELT_REF_ARENA", "scratch": "SMELT_REF_SCRATCH", "W": "SMELT_REF_WEIGHTS",
             "in": "SMELT_REF_IN", "out": "SMELT_REF_OUT"}
_REF = re.compile(r"\(\((const )?([A-Za-z_][A-Za-z0-9_]*) \*\)(?:\((arena|scratch|W) \+ (\d+)\)|(in|out)\[(\d+)\])\)")
STEP_ARGS = "smelt_args"
STEP_PARAMS = f"smelt_ctx_t *c, int tid, int nt, void *const *{STEP_ARGS}"
# what a step's code could name without BlockEmitter: it compiles, but is not shared (no template
# does this today)
STEP_LOCALS = ("void *const *in = c->in; void *const *out = c->out; char *arena = c->arena; "
               "char *scratch = c->scratch; const char *W = c->W; char *state = c->state;\n"
               "    (void)in; (void)out; (void)arena; (void)scratch; (void)W; (void)state; (void)tid; (void)nt; "
               f"(void){STEP_ARGS};")


def ref_expr(base: str, offset: int, ctype: str, const: bool = False) -> str:
    """Typed pointer to byte ``offset`` of ``base`` (for ``in``/``out``: the ``offset``-th external
    buffer). Only these expressions may name a buffer in a step's code."""
    where = f"{base}[{offset}]" if base in ("in", "out") else f"({base} + {offset})"
    return f"(({'const ' if const else ''}{ctype} *){where})"


def lift_refs(code: str) -> tuple[str, list[tuple[str, int]]]:
    """``code`` with every buffer expression replaced by an argument of the step function, and
    the (base, offset) of each argument, numbered in order of first use."""
    refs: dict[tuple[str, int], int] = {}

    def arg(m: re.Match) -> str:
        const, ctype, base, off, ext, k = m.groups()
        key = (base, int(off)) if base else (ext, int(k))
        j = refs.setdefault(key, len(refs))
        return f"(({const or ''}{ctype} *){STEP_ARGS}[{j}])"

    return _REF.sub(arg, code), list(refs)


class WeightsBlob:
    """Constants the native code reads, packed 64-byte aligned into one buffer."""

    ALIGN = 64

    def __init__(self) -> None:
        self.chunks: list[tuple[int, np.ndarray]] = []
        self.size = 0
        self._by_key: dict[str, int] = {}

    def add(self, array: np.ndarray, key: str | None = None) -> int:
        if key is not None and key in self._by_key:
            return self._by_key[key]
        arr = np.ascontiguousarray(array)
        offset = self.size
        self.chunks.append((offset, arr))
        self.size = offset + (-(-arr.nbytes // self.ALIGN) * self.ALIGN or self.ALIGN)
        if key is not None:
            self._by_key[key] = offset
        return offset

    def to_bytes(self) -> np.ndarray:
        buf = np.zeros(max(self.size, self.ALIGN), dtype=np.uint8)
        for offset, arr in self.chunks:
            buf[offset : offset + arr.nbytes] = arr.reshape(-1).view(np.uint8)
        return buf


class InstanceState:
    """Offsets in the per-instance state buffer (see the module doc), 64-byte aligned regions."""

    ALIGN = 64

    def __init__(self) -> None:
        self.size = 0

    def add(self, nbytes: int) -> int:
        offset = self.size
        self.size += -(-max(1, nbytes) // self.ALIGN) * self.ALIGN
        return offset


@dataclass
class Step:
    node: Node
    function: str  # the step function (shared by steps whose lifted code is the same)
    refs: list[tuple[str, int]]  # its arguments: (base, byte offset) per buffer, see lift_refs
    # how the node is computed: {"template": ..., plus what the template told BlockEmitter.schedule};
    # shared by every step of the node
    schedule: dict = field(default_factory=dict)


@dataclass
class BlockSource:
    index: int
    steps: list[Step] = field(default_factory=list)
    dynamic: list[DynamicDims] = field(default_factory=list)  # see BlockEmitter.dynamic_dims
    counters: list[SaturationCounter] = field(default_factory=list)  # see BlockEmitter.saturation_counter
    # steps whose shares synchronize with each other (``BlockEmitter.step(synchronize=True)``)
    sync_steps: set[int] = field(default_factory=set)


class BlockEmitter:
    """What a template sees while rendering one node into an execution block."""

    def __init__(self, g: Graph, plan: ExecutionPlan, block: NativeBlock, target: Target,
                 weights: WeightsBlob, functions: dict[str, tuple[str, str]], n_threads: int,
                 state: InstanceState | None = None, count_saturation: bool = False) -> None:
        self.g = g
        self.count_saturation = count_saturation
        self.plan = plan
        self.block = block
        self.target = target
        self.weights = weights
        self.instance_state = state if state is not None else InstanceState()
        self._functions = functions
        self.n_threads = n_threads
        self.source = BlockSource(block.index)
        self._scratch_bytes = 0
        self._node: Node | None = None
        self._schedule: dict = {}

    # -- buffers ---------------------------------------------------------------------
    def ptr(self, name: str) -> str:
        """C expression for a typed pointer to value ``name``'s data."""
        v = self.g.values[name]
        ctype = c_type(v.dtype)
        if v.const is not None:
            return ref_expr("W", self.weights.add(v.const, key=f"value:{name}"), ctype, const=True)
        if name in self.block.ext_inputs:
            return ref_expr("in", self.block.ext_inputs.index(name), ctype)
        if name in self.block.ext_outputs:
            return ref_expr("out", self.block.ext_outputs.index(name), ctype)
        return ref_expr("arena", self.plan.arena_offsets[name], ctype)

    def weight(self, array: np.ndarray, key: str | None = None) -> str:
        """Add a compile-time transformed constant; returns a typed const pointer expression."""
        arr = np.ascontiguousarray(array)
        return ref_expr("W", self.weights.add(arr, key=key), c_type(arr.dtype), const=True)

    def scratch(self, nbytes: int, dtype: str = "float32") -> str:
        """Scratch memory valid during this node only (shared by all nodes of the model)."""
        nbytes = -(-nbytes // 64) * 64
        base = self._scratch_bytes
        self._scratch_bytes = base + nbytes
        return ref_expr("scratch", base, c_type(dtype))

    def state(self, nbytes: int) -> int:
        """Reserve ``nbytes`` of per-instance state (zeroed at load, kept across calls, written
        by the loader or the kernels); returns its byte offset from ``state``, which steps have
        in scope. For what a library global would otherwise hold (see the module doc)."""
        return self.instance_state.add(nbytes)

    @property
    def scratch_bytes(self) -> int:
        return self._scratch_bytes

    # -- code ------------------------------------------------------------------------
    def function(self, base: str, code: str, doc: str = "") -> str:
        """Define a kernel function once; ``code`` names it FNAME. Returns its C name.

        Functions with the same code are one function. In a shape class's graph
        (``Graph.shape_generic``) only for nodes whose values had the same shapes at the
        decision shapes too: two nodes' code may coincide at one shape and differ at another,
        and the library's structure should not change with the shape (if it does anyway, the
        shape gets a library of its own: slower, never wrong)."""
        salt = ""
        if self.g.shape_generic and self._node is not None:
            names = self._node.present_inputs() + [o for o in self._node.outputs if o]
            salt = repr([self.g.decision_shapes.get(n) for n in names])
        digest = hashlib.sha256((code + salt).encode()).hexdigest()[:10]
        fname = f"{c_identifier(base)}_{digest}"
        if fname not in self._functions:
            header = f"/* template: {c_comment_text(base)}\n * {c_comment_text(doc)} */\n" if doc else ""
            self._functions[fname] = (fname, header + code.replace("FNAME", fname))
        return fname

    def step(self, code: str, name: str = "", doc: str = "", attributes: str = "", synchronize: bool = False) -> None:
        """Statements run by every thread (``tid``, ``nt`` and the buffers of ``ptr``, ``weight``
        and ``scratch`` in scope); a barrier follows. They become a step function shared with
        every step whose code differs only in its buffers, named ``name`` (a kernel's name, e.g.
        ``f32_gemm_...``; default ``step_<template>``) plus a digest of the code. ``doc`` goes
        into its header comment and must not depend on the buffers; ``attributes`` are C
        function attributes (e.g. the preferred vector width). ``synchronize``: this step's
        shares meet inside it (a barrier), so they run at once, one per thread, as all steps of
        a ``shares_synchronize`` template do; the node's other steps stay shareable."""
        assert self._node is not None
        if self._node.guard is not None:  # a run-time If's branch: skipped when not taken (codegen/guards.py)
            cond, taken = self._node.guard
            code = f"if ({'!' if taken else ''}*{self.ptr(cond)}) return;\n" + code
        lifted, refs = lift_refs(code)
        body = lifted.strip().replace("\n", "\n    ")
        fn = self.function(
            name or f"step_{self._schedule['template']}",
            f"static {attributes}__attribute__((noinline)) void FNAME({STEP_PARAMS}) {{\n"
            f"    {STEP_LOCALS}\n    {{ {body} }}\n}}\n",
            doc or " ".join([self._node.op] + [str(list(self.g.values[o].shape)) for o in self._node.outputs[:1] if o]))
        if synchronize:
            self.source.sync_steps.add(len(self.source.steps))
        self.source.steps.append(Step(self._node, fn, refs, self._schedule))

    def schedule(self, **fields: str) -> None:
        """Record how the current node is computed, for ``smelt profile`` and plan.json; calls
        merge. Conventional keys (all optional, plain text): ``algorithm`` ("im2col fused into B
        packing"), ``kernel`` (the C kernel's base name), ``micro_kernel`` ("8x48 avx512"),
        ``blocking`` ("MC=.. KC=.. NC=.."), ``threads`` (how the work is split), ``layout``."""
        assert self._node is not None
        self._schedule.update({k: str(v) for k, v in fields.items() if v not in (None, "")})

    def saturation_counter(self, value: str) -> str:
        """A C pointer to this share's two int64 counters of the elements of ``value`` the current
        node saturated: [0] at the low end of the type's range, [1] at the high end (the integer
        kernels' requantization and QuantizeLinear add where they clamp). Kept in the instance
        state, zeroed at load, read by ``LoadedArtifact.saturation_counts``: the numeric debug
        report's counters come from inside the kernels themselves.

        "" when the build does not count (``CompileOptions.count_saturation`` off, the default):
        ``int_gemm.flush_counters("")`` renders nothing, so the counts are dead and gcc drops
        every instruction that computed them."""
        assert self._node is not None
        if not self.count_saturation:
            return ""
        offset = self.state(16 * max(1, self.n_threads))
        self.source.counters.append(SaturationCounter(offset, value, max(1, self.n_threads)))
        return f"((int64_t *)(state + {offset}) + 2 * tid)"

    def dynamic_dims(self, *, state: int, x: str, layout: int, max_t: int, max_b: int,
                     outputs: Mapping[str, Sequence[int | str]]) -> None:
        """Record that the current node reads its sequence length T and batch B at run time
        from the int64 pair at byte ``state`` of the instance state (``state()``), which the
        loader sets from the shape of input ``x`` (``layout`` 0: [T, B, ...], 1: [B, T, ...])
        within 1..``max_t`` and 1..``max_b``, and that its outputs have ``outputs``' shapes
        ("T" and "B" where the run-time sizes go). Goes into plan.json as the block's
        ``dynamic`` entries (``smelt.runtime.artifact.DynamicDims``)."""
        assert self._node is not None
        self.source.dynamic.append(DynamicDims(state, x, layout, max_t, max_b,
                                               {k: tuple(v) for k, v in outputs.items()}))

    def begin_node(self, node: Node, template: str) -> None:
        """Start rendering ``node`` with the template named ``template`` (emit.py calls it)."""
        self._node = node
        self._scratch_bytes = 0
        self._schedule = {"template": template}  # a new dict: earlier nodes' steps keep theirs

    def end_node(self) -> None:
        self._node = None
