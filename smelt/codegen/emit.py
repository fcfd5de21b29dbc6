"""Render a planned graph as one C translation unit: one entry point per execution block.

Every native node becomes one or more *steps* of its block: C statements that every thread of
the pool runs with ``tid`` and ``nt`` in scope, followed by a barrier. A block's entry runs its
body as one job on the pool, so an inference of a fully native model is one call from Python and
one fork/join in C.

gcc's time follows the number of distinct step codes, not of nodes. A step's buffers
(``BlockEmitter.ptr``/``weight``/``scratch`` expressions) are lifted out of its code into
arguments, so its code names no particular buffer and becomes a step function emitted once per
distinct source: a 2,000-node chain of Relu on one shape compiles one Relu function. The block
body is a loop over a static table of (function, buffer references), not statements per step:
one indirect call per step at run time, and gcc's time does not grow with the step count.
Kernels are likewise emitted once per distinct source.

Nothing mutable lives in the library's globals: every instance loaded from one ``.so`` shares
them (dlopen of one path is one mapping). What a model must keep per instance besides its arena
goes into the *instance state*, a zeroed buffer the loader allocates (``smelt_state_bytes()``,
initialised by ``smelt_state_init``) and every entry receives as ``state``
(``BlockEmitter.state``): a dynamic RNN's run-time T and B, the profile counters.

An instrumented build (``profile=True``) adds timestamps around every step (see the
"Instrumented build" section of ``smelt_rt.h``); an ordinary build contains no profiling code.
Templates describe how they compute a node with ``BlockEmitter.schedule``; that and each step's
node, FLOPs and fused epilogue go into plan.json (``step_info``) for ``smelt profile``.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field
from functools import cache

import numpy as np

from smelt.codegen.plan import ExecutionPlan, NativeBlock
from smelt.codegen.templates.registry import find_template
from smelt.ir.graph import Graph, Node
from smelt.ir.ops import flops
from smelt.ir.types import c_type
from smelt.target import Target

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


class BlockEmitter:
    """What a template sees while rendering one node into an execution block."""

    def __init__(self, g: Graph, plan: ExecutionPlan, block: NativeBlock, target: Target,
                 weights: WeightsBlob, functions: dict[str, tuple[str, str]], n_threads: int,
                 state: InstanceState | None = None) -> None:
        self.g = g
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
        """Define a kernel function once; ``code`` names it FNAME. Returns its C name."""
        digest = hashlib.sha256(code.encode()).hexdigest()[:10]
        fname = f"{c_identifier(base)}_{digest}"
        if fname not in self._functions:
            header = f"/* template: {c_comment_text(base)}\n * {c_comment_text(doc)} */\n" if doc else ""
            self._functions[fname] = (fname, header + code.replace("FNAME", fname))
        return fname

    def step(self, code: str, name: str = "", doc: str = "", attributes: str = "") -> None:
        """Statements run by every thread (``tid``, ``nt`` and the buffers of ``ptr``, ``weight``
        and ``scratch`` in scope); a barrier follows. They become a step function shared with
        every step whose code differs only in its buffers, named ``name`` (a kernel's name, e.g.
        ``f32_gemm_...``; default ``step_<template>``) plus a digest of the code. ``doc`` goes
        into its header comment and must not depend on the buffers; ``attributes`` are C
        function attributes (e.g. the preferred vector width)."""
        assert self._node is not None
        lifted, refs = lift_refs(code)
        body = lifted.strip().replace("\n", "\n    ")
        fn = self.function(
            name or f"step_{self._schedule['template']}",
            f"static {attributes}__attribute__((noinline)) void FNAME({STEP_PARAMS}) {{\n"
            f"    {STEP_LOCALS}\n    {{ {body} }}\n}}\n",
            doc or " ".join([self._node.op] + [str(list(self.g.values[o].shape)) for o in self._node.outputs[:1] if o]))
        self.source.steps.append(Step(self._node, fn, refs, self._schedule))

    def schedule(self, **fields: str) -> None:
        """Record how the current node is computed, for ``smelt profile`` and plan.json; calls
        merge. Conventional keys (all optional, plain text): ``algorithm`` ("im2col fused into B
        packing"), ``kernel`` (the C kernel's base name), ``micro_kernel`` ("8x48 avx512"),
        ``blocking`` ("MC=.. KC=.. NC=.."), ``threads`` (how the work is split), ``layout``."""
        assert self._node is not None
        self._schedule.update({k: str(v) for k, v in fields.items() if v not in (None, "")})

    def emit_node(self, node: Node) -> None:
        tpl, reason = find_template(node, self.g)
        if tpl is None:  # the planner only puts nodes with templates in native blocks
            raise AssertionError(f"node {node.name} has no template: {reason}")
        self._node = node
        self._scratch_bytes = 0
        self._schedule = {"template": tpl.name}  # a new dict: earlier nodes' steps keep theirs
        tpl.emit(node, self.g, self)
        self._node = None


PRELUDE = """\
/* Generated by smelt: model {model}.
 * Execution blocks: {n_blocks}; threads: {threads}; target: {target}{variant}.
 * Do not edit: regenerate with `smelt compile --emit-c`. */
{profile_define}#include "smelt_rt.h"
#include <float.h>

#define SMELT_EXPORT __attribute__((visibility("default")))
#define SMELT_MIN(a, b) ((a) < (b) ? (a) : (b))
#define SMELT_MAX(a, b) ((a) > (b) ? (a) : (b))

SMELT_EXPORT void *smelt_create_pool(int n, const int *cpus) {{ return smelt_pool_create(n, cpus); }}
SMELT_EXPORT void smelt_destroy_pool(void *p) {{ smelt_pool_destroy((smelt_pool_t *)p); }}

typedef struct {{
    smelt_pool_t *pool;
    void *const *in;
    void *const *out;
    char *arena;
    char *scratch;
    const char *W;
    char *state; /* this instance's mutable state (InstanceState) */
    atomic_int status; /* 0, or 1 + the step that called SMELT_FAIL() */{profile_field}
}} smelt_ctx_t;

/* A kernel that meets invalid input (an index out of range) calls SMELT_FAIL(): the inference
 * finishes its steps, then the entry returns the failing step and Python raises naming the node. */
static _Thread_local int smelt_tls_error;
#define SMELT_FAIL() (smelt_tls_error = 1)

/* A block is a table of steps. A step function takes its buffers as arguments (emit.py's
 * lift_refs), so steps that differ only in their buffers share one function; each buffer is a
 * byte offset into the arena, the scratch or the weights, or the index of an external buffer. */
enum {{ SMELT_REF_ARENA, SMELT_REF_SCRATCH, SMELT_REF_WEIGHTS, SMELT_REF_IN, SMELT_REF_OUT }};
typedef struct {{ unsigned base; unsigned long long offset; }} smelt_ref_t;
typedef void (*smelt_step_fn)(smelt_ctx_t *c, int tid, int nt, void *const *smelt_args);
typedef struct {{ smelt_step_fn fn; unsigned first_ref, n_refs; }} smelt_step_t;

static inline void smelt_resolve(const smelt_ctx_t *c, const smelt_ref_t *r, unsigned n, void **args) {{
    for (unsigned j = 0; j < n; ++j) {{
        switch (r[j].base) {{
        case SMELT_REF_ARENA: args[j] = c->arena + r[j].offset; break;
        case SMELT_REF_SCRATCH: args[j] = c->scratch + r[j].offset; break;
        case SMELT_REF_WEIGHTS: args[j] = (void *)(c->W + r[j].offset); break;
        case SMELT_REF_IN: args[j] = c->in[r[j].offset]; break;
        default: args[j] = c->out[r[j].offset]; break;
        }}
    }}
}}
"""


def render_block(block: BlockSource, profile: bool = False, n_threads: int = 1, prof_offset: int = 0) -> str:
    """A block: its step table, a body looping over it with a barrier between steps, and the
    exported entry. The table keeps gcc's time independent of the number of steps (a body with
    one call and one inlined barrier per step took gcc 20 s at 2,000 steps).

    A step reports a run-time failure (e.g. an index out of range) with SMELT_FAIL(); the body
    records which step failed and the entry returns its number + 1 (0 = success).

    ``profile``: the instrumented variant. Each step is timed on every thread (busy time) and on
    thread 0 up to the end of its barrier; the last step ends after the join, in the entry. The
    block's counters are at ``prof_offset`` in the instance state (``render_state_exports``).
    """
    k = block.index
    n = len(block.steps)
    lines = []
    if n:
        refs, rows, first = [], [], 0
        for i, step in enumerate(block.steps):
            if step.refs:
                refs.append("    " + " ".join(f"{{{REF_BASES[b]}, {off}}}," for b, off in step.refs) + f" /* step {i} */")
            rows.append(f"    {{{step.function}, {first}, {len(step.refs)}}}, /* {i}: "
                        f"{c_comment_text(step.node.op)} {c_comment_text(step.node.name)} */")
            first += len(step.refs)
        lines.append(f"static const smelt_ref_t smelt_refs_{k}[{max(1, first)}] = {{")
        lines += refs or ["    {0, 0}, /* no step has a buffer */"]
        lines.append("};")
        lines.append(f"static const smelt_step_t smelt_steps_{k}[{n}] = {{")
        lines += rows
        lines.append("};")
    lines.append(f"static void smelt_body_{k}(void *vctx, int tid, int nt) {{")
    lines.append("    smelt_ctx_t *c = (smelt_ctx_t *)vctx;")
    if n:
        lines.append(f"    void *args[{max(1, max(len(st.refs) for st in block.steps))}];")
        if profile:
            lines.append(f"    uint64_t *prof = (uint64_t *)(c->state + {prof_offset}), t = smelt_prof_ticks(); /* t: start of the step */")
        lines += [f"    for (int i = 0; i < {n}; ++i) {{",
                  f"        const smelt_step_t *s = &smelt_steps_{k}[i];",
                  f"        smelt_resolve(c, smelt_refs_{k} + s->first_ref, s->n_refs, args);",
                  "        s->fn(c, tid, nt, args);",
                  "        if (smelt_tls_error) { atomic_store(&c->status, i + 1); smelt_tls_error = 0; }"]
        if profile:
            lines.append("        smelt_prof_busy(prof, i, tid, t);")
        lines.append(f"        if (i + 1 == {n}) break;")
        lines.append("        smelt_barrier(c->pool, nt);")
        if profile:
            lines.append("        t = smelt_prof_step(prof, i, tid, t);")
        lines.append("    }")
        if profile:
            lines.append("    if (tid == 0) c->prof_t = t; /* the entry ends the last step, after the join */")
    else:
        lines.append("    (void)c; (void)tid; (void)nt;")
    lines.append("}")
    entry = [f"SMELT_EXPORT int smelt_block_{k}(void *pool, void *const *in, void *const *out, "
             "char *arena, char *scratch, const char *W, char *state) {",
             "    smelt_ctx_t ctx = {(smelt_pool_t *)pool, in, out, arena, scratch, W, state, 0};"]
    if profile:
        entry.append("    const uint64_t t0 = smelt_prof_ticks(), ns0 = smelt_prof_ns();")
    entry.append(f"    smelt_pool_run((smelt_pool_t *)pool, smelt_body_{k}, &ctx);")
    if profile:
        entry.append(f"    smelt_prof_block_done((uint64_t *)(state + {prof_offset}), {n - 1}, ctx.prof_t, t0, ns0);")
    entry += ["    return atomic_load(&ctx.status);", "}", ""]
    return "\n".join(lines + entry)


def profile_words(steps: int, threads: int) -> int:
    """Size of a block's counter array in uint64 words: SMELT_PROF_WORDS in smelt_rt.h."""
    header, stride = 8, -(-steps // 8) * 8
    return header + stride * (1 + threads)


def render_state_exports(state_bytes: int, prof: list[tuple[int, int, int]] | None = None) -> str:
    """What the loader sizes and initialises the instance state with; for an instrumented build
    also what Python reads the counters through (``LoadedArtifact.profile_counters``). ``prof``:
    per block (offset in the state, steps, threads)."""
    code = f"SMELT_EXPORT long smelt_state_bytes(void) {{ return {state_bytes}; }}\n"
    init = "".join(f"    p = (uint64_t *)(state + {off}); p[SMELT_PROF_STEPS] = {n}; p[SMELT_PROF_THREADS] = {nt}; "
                   f"p[SMELT_PROF_STRIDE] = SMELT_PROF_STRIDE_OF({n});\n" for off, n, nt in prof or [])
    code += ("SMELT_EXPORT void smelt_state_init(char *state) {\n"
             + ("    uint64_t *p;\n" + init if init else "    (void)state;\n") + "}\n")
    if prof is None:
        return code
    n_blocks = len(prof)
    table = ", ".join(str(off) for off, _, _ in prof) or "0"
    return code + (f"static const long smelt_prof_offsets[{max(1, n_blocks)}] = {{{table}}};\n"
                   f"SMELT_EXPORT int smelt_profile_blocks(void) {{ return {n_blocks}; }}\n"
                   "SMELT_EXPORT uint64_t *smelt_profile_counters(char *state, int block) {\n"
                   f"    return block >= 0 && block < {n_blocks} ? (uint64_t *)(state + smelt_prof_offsets[block]) : 0;\n"
                   "}\n"
                   "SMELT_EXPORT void smelt_profile_reset(char *state) {\n"
                   f"    for (int k = 0; k < {n_blocks}; ++k) smelt_prof_reset((uint64_t *)(state + smelt_prof_offsets[k]));\n"
                   "}\n")


@dataclass
class GeneratedModule:
    source: str
    weights: np.ndarray
    scratch_bytes: int
    step_nodes: dict[int, list[list[str]]]  # block index -> [node name, op] per step
    step_info: dict[int, list[dict]] = field(default_factory=dict)  # block index -> per step, see step_info()


def epilogue_ops(node: Node) -> list[str]:
    """What a node computes after its main loop: a bias input and its fused epilogue ops."""
    ops = []
    if node.op in ("Conv", "Gemm") and len(node.inputs) > 2 and node.inputs[2]:
        ops.append("bias" if node.op == "Conv" else "C")
    return ops + [e["op"] for e in node.epilogue]


def step_info(g: Graph, block: BlockSource) -> list[dict]:
    """Per step of a block: its node, the node's FLOPs (on every step of a multi-step node; part
    and parts say which one this is), fused epilogue and schedule."""
    counts: dict[int, int] = {}
    for st in block.steps:
        counts[id(st.node)] = counts.get(id(st.node), 0) + 1
    seen: dict[int, int] = {}
    info = []
    for st in block.steps:
        part = seen[id(st.node)] = seen.get(id(st.node), -1) + 1
        info.append({"node": st.node.name, "op": st.node.op, "part": part, "parts": counts[id(st.node)],
                     "flops": int(flops(st.node, g)), "epilogue": epilogue_ops(st.node),
                     "schedule": dict(st.schedule)})
    return info


def generate(g: Graph, plan: ExecutionPlan, target: Target, n_threads: int,
             profile: bool = False) -> GeneratedModule:
    """Render every native block of ``plan`` into one C source plus its weights blob.

    ``profile``: the instrumented variant (per-step timestamps), a different source and library.
    """
    weights = WeightsBlob()
    state = InstanceState()
    functions: dict[str, tuple[str, str]] = {}
    blocks = []
    scratch = 0
    for block in plan.native_blocks():
        em = BlockEmitter(g, plan, block, target, weights, functions, n_threads, state)
        for node in block.nodes:
            em.emit_node(node)
            scratch = max(scratch, em.scratch_bytes)
        blocks.append(em.source)
    parts = [PRELUDE.format(
        model=c_comment_text(g.name), n_blocks=len(blocks), threads=n_threads, target=c_comment_text(target.isa),
        variant="; instrumented (per-step timing)" if profile else "",
        profile_define="#define SMELT_PROFILE 1 /* smelt_rt.h: timestamps around every step */\n" if profile else "",
        profile_field="\n    uint64_t prof_t; /* profiling: thread 0's start of the last step */" if profile else "")]
    parts += [code for _, code in functions.values()]
    # per block (counters' offset, steps, threads)
    prof = [(state.add(8 * profile_words(len(b.steps), n_threads)), len(b.steps), n_threads)
            for b in blocks] if profile else None
    parts += [render_block(b, profile, n_threads, prof[i][0] if prof else 0) for i, b in enumerate(blocks)]
    parts.append(render_state_exports(state.size, prof))
    step_nodes = {b.index: [[st.node.name, st.node.op] for st in b.steps] for b in blocks}
    infos = {b.index: step_info(g, b) for b in blocks}
    return GeneratedModule("\n".join(parts), weights.to_bytes(), scratch, step_nodes, infos)
