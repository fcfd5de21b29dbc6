"""Single-precision GEMM, the kernel library part: a BLIS-style generator (``render_gemm``), its
micro-kernels and tile epilogues. The ONNX ``Gemm`` and ``MatMul`` templates
(``templates/gemm.py``) and the Conv templates (conv.py, conv_nchwc.py, winograd.py, blocked.py)
render with it. C[M, N] = A[M, K] . B[K, N], row-major, every
size a compile-time constant. The loop nest, per thread over its region of C:

    for jc in N by NC:                       B block (KB x NC) stays in L2
      for pc in K by KB (KC, balanced):      run-time B packed here (per-thread scratch)
        for ic in M by MC:                   run-time transposed A packed here
          for ir in MC by MR:                A micro-panel (MR x KB) stays in L1
            for jr in NC by NR:              B micro-panel streams from L2
              micro-kernel: MR x NR accumulators in registers; on the last K block the
              epilogue is applied before the store

Operands: constant ones (weights) are packed once at compile time, A as [M/MR][K][MR], B as
[N/NR][K][NR] (zero padded); a prepacked B's next block (the next K block, else the next NC
block) is prefetched into L2 while the current one computes, each micro-kernel call issuing an
equal share of its panel's lines one per k step (``GemmProblem.prefetch_next_b``); a run-time
row-major A is read in place (the kernel broadcasts
from MR rows ``lda`` apart); a transposed one is packed (whole, once per item, when small); a
run-time B is packed into NR-column panels, by a generic strided packer or by conv.py's
im2col packer. Ragged edges use micro-kernel variants specialized to the tail's rows and
vector count (the last vector loads and stores under a lane mask), so padding is never
stored; an N tail of 1-8 columns past whole vectors (N = 49, 196, 8, ...) goes to a column kernel
that vectorizes over M instead (8 rows per ymm, NP row panels at once).

Micro-kernels: AVX-512 8x48 (24 zmm accumulators; per k 3 B loads, 8 broadcasts, 24 FMAs;
software prefetch of the A stream and of the C tile), AVX2 6x16 (12 ymm), portable C 4x16 with
constant loop bounds (compiler-vectorized); a one-row tile (M = 1) keeps ONE_ROW_K_CHAINS
accumulator sets over k so its few FMA chains do not wait on the FMA latency. Cache blocking from the target: KC keeps the A
micro-panel in a quarter of L1d, NC the B block in a quarter of L2.

Epilogue: bias / Gemm C / alpha and the node's fused chain. When it has the form [+ row
operand] [+ column operand] [+ same-shape operand] [Relu | Clip] it is applied in registers
by the micro-kernel's store; otherwise by a pass over the L1-hot tile (vector ops, masked tail;
Sigmoid/Tanh/SiLU use a vector expf), or per element via ``epilogue_expr`` on the portable
target.

Threads: a node's independent items (batches of a batched MatMul, images x groups of a Conv)
are split between threads when that balances; otherwise each item's C is cut into a grid of
thread regions (MR x NR panel granularity) chosen to minimize the busiest thread's estimated
cost (threads sharing run-time packed B columns each pack them). Each thread packs into its
own slice of scratch. Results are bitwise identical for any thread count (every C element is
accumulated in the same order).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from smelt.codegen.emitter import BlockEmitter, c_literal
from smelt.codegen.kernels.epilogue import (
    ACTIVATIONS,
    BINARY_EPILOGUE_OPS,
    FMA_ACTIVATIONS,
    TileOperand,
    TileScale,
    epilogue_doc,
    epilogue_expr,
    scalar_binary,
    scalar_clamp,
    scalar_relu,
    unary_float_expr,
    vector_binary,
    vector_clamp,
    vector_relu,
    vector_unary_expr,
)
from smelt.codegen.kernels.isa import VectorIsa, by_name, half_width, vector_isa
from smelt.codegen.kernels.tile import RegisterTile
from smelt.ir.epilogue import EpilogueActivation, EpilogueBinary
from smelt.ir.graph import Node
from smelt.target import Target

FLOAT = "float32"


# ------------------------------------------------------------------------------------------
# Target description: vector ISA and cache blocking
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Blocking:
    """Micro-kernel geometry and cache blocking for one target."""

    isa: str  # the vector ISA's name (kernels/isa.py: the tag in kernel names)
    vec: int  # floats per vector (portable C: the width of its inner loops)
    mr: int
    nr: int
    kc: int
    nc: int
    mc: int
    fma: bool = True

    @property
    def vx(self) -> VectorIsa:
        """The vector ISA description this blocking renders with."""
        return by_name(self.isa, self.fma, self.vec)

    @property
    def nv(self) -> int:
        return self.nr // self.vec

    @property
    def tag(self) -> str:
        return f"{self.mr}x{self.nr}__{self.isa}"

    def kb(self, k: int) -> int:
        """Balanced K block: ceil(K / ceil(K / KC))."""
        blocks = max(1, -(-k // self.kc))
        return -(-k // blocks)


# Run-time A operands up to this size are packed whole once (per item) rather than per block.
PREPACK_A_BYTES = 2 << 20

# Software prefetch distance (k iterations) of the micro-kernel's A stream (0: none): weights
# stream from DRAM in a whole network (ResNet-50 stage 4: +30% on its layers, cold cache).
# A property of the packed-A kernel (64 k steps ahead of an MR-float panel row = a few lines),
# not a per-node choice; whether A is packed at all is the schedule's ``read_a_in_place``.
A_PREFETCH = 64

# Accumulator sets of a one-row micro-kernel tile (M = 1: a fully connected layer at batch 1),
# each over every 4th k: its 1-3 vectors would otherwise be as many dependent FMA chains, one
# FMA per FMA latency (4 cycles) where the core can issue one or two per cycle. Zen 4, the
# openWakeWord heads (a 1 x 1536 x 128 Gemm first): 15% faster per call at 1 and 2 threads.
ONE_ROW_K_CHAINS = 4

# Cache blocking: the A micro-panel (MR x KC) takes 1/KC_L1_FRACTION of L1d; the B block
# (KC x NC) 1/NC_L2_FRACTION of L2 (leaving room for the conv input image and C).
KC_L1_FRACTION = 4
NC_L2_FRACTION = 4

def blocking_for(target: Target, m: int | None = None, n: int | None = None, items: int = 1,
                 threads: int = 1) -> Blocking:
    """Micro-kernel shape (the ISA description's ``gemm_kernel``) and cache blocking.

    Given the problem (``m`` x ``n`` over ``items``, ``threads``): a matrix-vector product (one
    item, M no more than a kernel's rows) with fewer NR-wide column panels than twice the
    threads uses panels one vector wide, so the columns (and the weights streamed for them)
    split evenly: a wake-word MLP's 1 x 128 x 1536 layer had 3 panels of 48 for 2 threads,
    96 columns on one and 32 on the other."""
    vx = vector_isa(target)
    (mr, nr), vec = vx.gemm_kernel, vx.lanes
    if (m is not None and n is not None and items == 1 and threads > 1 and m <= mr
            and -(-n // nr) < 2 * threads and -(-n // vec) >= threads):
        nr = vec
    l1 = max(16 * 1024, target.l1d_bytes)
    l2 = max(128 * 1024, target.l2_bytes)
    kc = (l1 // KC_L1_FRACTION) // (mr * 4)
    kc = max(64, min(512, kc // 16 * 16))
    nc = max(4 * nr, ((l2 // NC_L2_FRACTION) // (kc * 4)) // nr * nr)
    mc = max(4 * mr, ((l2 // 4) // (kc * 4)) // mr * mr)
    return Blocking(vx.name, vec, mr, nr, kc, nc, mc, fma=vx.fma)


def _lit(x: float) -> str:
    return c_literal(x, FLOAT)


def define(em: BlockEmitter, base: str, code: str, doc: str) -> str:
    """``em.function`` plus a readable parameter comment inside the code (``doc`` is built only
    from numbers and fixed words, never from model-provided names)."""
    text = doc.replace("*/", "* /").replace("/*", "/ *")
    return em.function(base, f"/* {base}: {text} */\n{code}", doc)


# ------------------------------------------------------------------------------------------
# Micro-kernels
# ------------------------------------------------------------------------------------------
UKR_SIG = ("(long kc, const float *restrict A, long lda, const float *restrict B, long ldb, float *restrict C, "
           "long ldc, int accum, int lastn, int ef, const float *restrict rb, const float *restrict cb, "
           "const float *restrict fr, long ldf, float lo, float hi, const char *pf, long pfn)")

# Fused store epilogue of the micro-kernel (``ef`` bits, applied in this order on the last K
# block): + rb[row], + cb[col], + fr[row * ldf + col], Relu, Clip(lo, hi).
EF_ROW, EF_COL, EF_FULL, EF_RELU, EF_CLIP = 1, 2, 4, 8, 16


def microkernel_source(blk: Blocking, rows: int, nv: int, direct_a: bool = False, prefetch_c: bool = True,
                       prefetch_next_b: bool = False) -> str:
    """C source of the micro-kernel computing a ``rows`` x ``nv`` vectors tile (function FNAME).

    A is an MR-strided packed micro-panel, B has rows ``ldb`` floats apart (NR when packed);
    ``accum`` adds to C instead of overwriting it; the last vector loads B and stores C only in
    its first ``lastn`` lanes (so B may be read in place, up to the end of a matrix).
    ``prefetch_c``: the schedule's ``GemmSchedule.prefetch_c`` (``render_gemm`` always passes it).
    ``prefetch_next_b``: the kernel issues the driver's share of the next B block (``pf``,
    ``pfn``); otherwise those parameters are unused.
    """
    mr = blk.mr
    lines = [f"static __attribute__((noinline)) void FNAME{UKR_SIG} {{"]
    v = blk.vx
    if not v.vector:
        # portable C: every loop bound a constant (the packed B panel is NR wide), so the
        # compiler keeps acc in vector registers
        width = nv * blk.vec
        lines += [
            "    (void)pf; (void)pfn;",
            f"    float acc[{rows}][{width}];",
            f"    const int ncols = {(nv - 1) * blk.vec} + lastn;",
            f"    for (int r = 0; r < {rows}; ++r) for (int j = 0; j < {width}; ++j) acc[r][j] = 0.0f;",
            "    for (long k = 0; k < kc; ++k) {",
            "        const float *restrict b = B + k * ldb;",
            f"        #pragma GCC unroll {rows}",
            f"        for (int r = 0; r < {rows}; ++r) {{",
            ("            const float a = A[r * lda + k];" if direct_a else f"            const float a = A[k * {mr} + r];"),
            f"            #pragma GCC unroll {width}",
            f"            for (int j = 0; j < {width}; ++j) acc[r][j] += a * b[j];",
            "        }",
            "    }",
            f"    for (int r = 0; r < {rows}; ++r) {{",
            "        float *restrict c = C + r * ldc;",
            "        for (int j = 0; j < ncols; ++j) {",
            "            float x = accum ? c[j] + acc[r][j] : acc[r][j];",
            "            if (ef & 1) x = x + rb[r];",
            "            if (ef & 2) x = x + cb[j];",
            "            if (ef & 4) x = x + fr[r * ldf + j];",
            f"            if (ef & 8) x = {scalar_relu('x')};",
            f"            if (ef & 16) x = {scalar_clamp('x', 'lo', 'hi')};",
            "            c[j] = x;",
            "        }",
            "    }",
            "}",
        ]
        return "\n".join(lines)
    w = v.w
    last = nv - 1
    tile = RegisterTile(v, nv, rows, acc_fmt="c{r}_{j}", vec="b", bcast="a")
    lines.append(f"    const {v.mask_type} lm = {v.lane_mask('lastn')};")
    lines += ["    " + x for x in tile.declare(by_row=True)]
    if prefetch_c:  # the C tile (and a residual operand) arrive while the K loop runs
        lines.append(f"    for (int r = 0; r < {rows}; ++r) {{")
        lines += [f"        {v.prefetch(f'C + r * ldc + {j * w}')}" for j in range(nv)]
        lines.append("        if (ef & 4) {")
        lines += [f"            {v.prefetch(f'fr + r * ldf + {j * w}')}" for j in range(nv)]
        lines += ["        }", "    }"]
    between = [v.prefetch(f"A + {A_PREFETCH * mr}")] if A_PREFETCH and not direct_a else []
    if prefetch_next_b:
        # the driver's share of the NEXT B block for this call: one L2 line per k step, so the
        # lines arrive spread over the whole block's compute instead of stalling its first row tile
        between.append(f"if (pfn > 0) {{ {v.prefetch_l2('pf')} pf += 64; --pfn; }}")
    else:
        lines.append("    (void)pf; (void)pfn;")

    def step(t: RegisterTile, u: int = 0, indent: str = "        ", pre: list[str] | None = None) -> list[str]:
        """One k step into accumulator set ``t``, at k + u."""
        b, a = (f"B + {u} * ldb + " if u else "B + "), (f" + {u}" if u else "")
        return t.fma_step(lambda j: v.masked_load(f"{b}{j * w}", "lm" if j == last else None),
                          lambda r: v.set1(f"A[{r} * lda + k{a}]" if direct_a else f"A[{u * mr + r}]"),
                          indent=indent, between=pre or [])

    def advance(n: int) -> str:
        ldb = f"{n} * ldb" if n > 1 else "ldb"
        return f"        B += {ldb};" if direct_a else f"        A += {n * mr}; B += {ldb};"

    chains = ONE_ROW_K_CHAINS if rows == 1 else 1
    if chains > 1:
        # a one-row tile (a matrix-vector product) is nv FMA chains over K, latency-bound: run
        # `chains` accumulator sets over k mod chains, folded before the epilogue (the order
        # depends only on the tile's rows, which no thread count changes)
        sets = [tile] + [tile.second(f"_k{u}") for u in range(1, chains)]
        lines += ["    " + x for t in sets[1:] for x in t.declare(by_row=True)]
        lines += ["    long k = 0;", f"    for (; k + {chains} <= kc; k += {chains}) {{"]
        for u, t in enumerate(sets):
            lines += ["        {", *step(t, u, "            ", between if u == 0 else None), "        }"]
        lines += [advance(chains), "    }", "    for (; k < kc; ++k) {", *step(tile), advance(1), "    }"]
        for h in (1, 2):  # pairwise: (s0 + s1) + (s2 + s3)
            lines += ["    " + x for u in range(0, chains, 2 * h) for x in sets[u].add(sets[u + h], by_row=True)]
    else:
        lines += ["    #pragma GCC unroll 4", "    for (long k = 0; k < kc; ++k) {", *step(tile, pre=between),
                  advance(1), "    }"]
    def ld(r: int, j: int) -> str:
        return v.masked_load(f"C + {r} * ldc + {j * w}", "lm" if j == last else None)

    def st(r: int, j: int) -> str:
        return v.masked_store(f"C + {r} * ldc + {j * w}", f"c{r}_{j}", "lm" if j == last else None)

    lines.append("    if (accum) {")
    for r in range(rows):
        lines.append("        " + " ".join(f"c{r}_{j} = {v.op('add', f'c{r}_{j}', ld(r, j))};"
                                            for j in range(nv)))
    lines.append("    }")

    def ldp(ptr: str, j: int) -> str:  # a vector of B-row width at ptr (masked when last)
        return v.masked_load(ptr, "lm" if j == last else None)

    allc = [(r, j) for r in range(rows) for j in range(nv)]
    lines += ["    if (ef) {", "        if (ef & 1) {"]
    for r in range(rows):
        lines.append(f"            {{ const {v.t} e = {v.set1(f'rb[{r}]')}; "
                     + " ".join(f"c{r}_{j} = {v.op('add', f'c{r}_{j}', 'e')};" for j in range(nv)) + " }")
    lines += ["        }", "        if (ef & 2) {"]
    for j in range(nv):
        lines.append(f"            {{ const {v.t} e = {ldp(f'cb + {j * w}', j)}; "
                     + " ".join(f"c{r}_{j} = {v.op('add', f'c{r}_{j}', 'e')};" for r in range(rows)) + " }")
    lines += ["        }", "        if (ef & 4) {"]
    for r, j in allc:
        lines.append(f"            c{r}_{j} = {v.op('add', f'c{r}_{j}', ldp(f'fr + {r} * ldf + {j * w}', j))};")
    lines += ["        }", "        if (ef & 8) {"]
    lines += [f"            c{r}_{j} = {vector_relu(v, f'c{r}_{j}')};" for r, j in allc]
    lines += ["        }", "        if (ef & 16) {",
              f"            const {v.t} l = {v.set1('lo')}, h = {v.set1('hi')};"]
    lines += [f"            c{r}_{j} = {vector_clamp(v, f'c{r}_{j}', 'l', 'h')};" for r, j in allc]
    lines += ["        }", "    }"]
    for r in range(rows):
        lines.append("    " + " ".join(st(r, j) for j in range(nv)))
    lines.append("}")
    return "\n".join(lines)


# A ragged N tail of r <= 8 columns beyond whole vectors (N = 49, 196, ...) would waste half or
# more of a 16-lane vector; there a column kernel vectorizes over M instead: ymm loads of 8 packed
# A rows from NP panels at once, a broadcast per tail column, NP x r accumulators. At r = 8 it
# runs 3 panels x 8 columns (24 ymm FMAs per k) where the masked kernel runs 8 half-empty zmm
# FMAs: equal on two 512-bit FMA ports, twice the work per cycle where a zmm FMA takes both
# 256-bit halves (Zen 4: an STFT Conv1d with 8 output frames, 36% -> 57% of peak at 1 thread).
COL_TAIL_MAX = 8


def col_tail(blk: Blocking, n: int) -> tuple[int, int] | None:
    """(whole vectors, leftover columns) of the N tail when the column kernel takes it."""
    t = n % blk.nr
    half = half_width(blk.vx)
    if half is None or blk.mr != half.lanes or not t or not 0 < t % blk.vec <= COL_TAIL_MAX:
        return None
    return t // blk.vec, t % blk.vec


def col_panels(r: int) -> int:
    return max(1, min(8, 30 // (r + 1)))


def colkernel_source(blk: Blocking, npn: int, r: int) -> str:
    """C[npn*8 rows][r cols] (only ``rows`` rows stored); A: npn MR=8 panels ``aps`` apart."""
    h = half_width(blk.vx)  # one vector of the half width spans a panel's MR rows
    assert h is not None and h.lanes == blk.mr
    tile = RegisterTile(h, npn, r, acc_fmt="c{j}_{r}", vec="x", bcast_first=False)
    L = ["static __attribute__((noinline)) void FNAME(long kc, const float *restrict A, long aps, "
         "const float *restrict B, long ldb, float *restrict C, long ldc, int accum, long rows) {"]
    L += ["    " + x for x in tile.declare(by_row=False)]
    L.append("    " + " ".join(f"const float *restrict a{q} = A + {q} * aps;" for q in range(npn)))
    L += ["    for (long k = 0; k < kc; ++k) {"]
    L += tile.fma_step(lambda q: h.load(f"a{q} + k * {h.lanes}"), lambda j: h.broadcast(f"B + k * ldb + {j}"),
                       indent="        ")
    L += ["    }", f"    float t[{h.lanes}];"]
    for q in range(npn):
        for j in range(r):
            L += [f"    {h.storeu('t', f'c{q}_{j}')}",
                  f"    for (long i = 0; i < SMELT_MIN(8, rows - {8 * q}); ++i) {{",
                  f"        float *restrict c = C + ({8 * q} + i) * ldc + {j};",
                  "        *c = accum ? *c + t[i] : t[i];",
                  "    }"]
    L.append("}")
    return "\n".join(L)


def microkernel(em: BlockEmitter, blk: Blocking, rows: int, nv: int, direct_a: bool, prefetch_c: bool,
                prefetch_next_b: bool = False) -> str:
    kind = "ukrA" if direct_a else "ukr"
    a_doc = "A read in place (rows lda apart)" if direct_a else f"A packed (stride {blk.mr})"
    return define(em, f"f32_gemm_{kind}_{rows}x{nv * blk.vec}__{blk.isa}",
                  microkernel_source(blk, rows, nv, direct_a, prefetch_c, prefetch_next_b),
                  f"micro-kernel {rows} rows x {nv} vectors of {blk.vec}; {a_doc}; B rows ldb apart"
                  + ("; prefetches its share of the next B block" if prefetch_next_b else ""))


# ------------------------------------------------------------------------------------------
# Epilogue (applied per tile of C after its last K block)
# ------------------------------------------------------------------------------------------
# An epilogue op (``TileOp``): an activation (node.epilogue's ``EpilogueActivation``), a binary
# op with its operand resolved to a pointer (``TileOperand``) or a constant factor (``TileScale``).


TileOp = TileOperand | TileScale | EpilogueActivation


@dataclass
class TileEpilogue:
    """How a host node's output tile is finished: GEMM-level ops, then the node's fused chain."""

    ops: list[TileOp]
    node: Node | None = None
    row_mod: int = 0  # "row" channel index is (row % row_mod) when nonzero
    channel: str = "col"  # what node.epilogue's "channel" broadcast indexes: "row" or "col"

    def all_ops(self) -> list:
        ops = list(self.ops)
        if self.node is not None:
            ops += self.node.epilogue
        return ops

    def empty(self) -> bool:
        return not self.all_ops()


def node_epilogue_ops(em: BlockEmitter, node: Node, channel: str) -> list[TileOp]:
    """node.epilogue in this module's representation (pointers resolved)."""
    out = []
    for step in node.epilogue:
        if isinstance(step, EpilogueBinary):
            kind = {"full": "full", "scalar": "scalar", "channel": channel}[step.broadcast]
            out.append(TileOperand(step.op, em.ptr(step.input), kind, step.swap))
        else:
            out.append(step)
    return out


def _operand_index(kind: str, flat: str, row: str, col: str) -> str:
    return {"full": flat, "row": row, "col": col, "scalar": "0"}[kind]


def scalar_epilogue(ep: TileEpilogue, em: BlockEmitter, acc: str, flat: str, row: str, col: str) -> str:
    """C expression: the whole epilogue applied to scalar ``acc``.

    ``flat`` is the element's flat index in the output, ``row``/``col`` its GEMM coordinates
    (``row`` already includes any per-item row offset and modulo).
    """
    expr = acc
    for op in ep.ops:
        expr = _scalar_op(op, expr, flat, row, col)
    if ep.node is not None and ep.node.epilogue:
        channel = row if ep.channel == "row" else col
        expr = epilogue_expr(em, ep.node, expr, flat, channel)
    return expr


def _scalar_op(op: TileOp, expr: str, flat: str, row: str, col: str) -> str:
    name = op.op
    if isinstance(op, TileScale):
        return f"(({expr}) * {_lit(op.value)})"
    if isinstance(op, TileOperand):
        other = f"{op.ptr}[{_operand_index(op.kind, flat, row, col)}]"
        if op.scale is not None:
            other = f"({_lit(op.scale)} * {other})"
        a, b = (other, f"({expr})") if op.swap else (f"({expr})", other)
        return scalar_binary(name, a, b)
    return unary_float_expr(name, expr, op.param_dict())


def vector_epilogue_ok(ep: TileEpilogue, blk: Blocking) -> bool:
    ok = set(ACTIVATIONS) if blk.fma else set(ACTIVATIONS) - FMA_ACTIVATIONS
    return all(op.op in BINARY_EPILOGUE_OPS or op.op == "Scale" or op.op in ok for op in ep.all_ops())


def _vector_op(v: VectorIsa, op: TileOp, x: str, operand: str | None) -> str:
    name = op.op
    if isinstance(op, TileScale):
        return v.op("mul", x, v.set1(_lit(op.value)))
    if isinstance(op, TileOperand):
        assert operand is not None
        o = operand
        if op.scale is not None:
            o = v.op("mul", v.set1(_lit(op.scale)), o)
        return vector_binary(v, name, x, o, op.swap)
    return vector_unary_expr(v, op, x)


def describe_epilogue(ep: TileEpilogue) -> str:
    pre = [op.op + (f"({op.kind})" if isinstance(op, TileOperand) else f"({op.value!r})") for op in ep.ops]
    node = epilogue_doc(ep.node) if ep.node is not None and ep.node.epilogue else ""
    parts = ([f"first {' -> '.join(pre)}"] if pre else []) + ([node] if node else [])
    return "; ".join(parts) if parts else "no epilogue"


def kernel_epilogue(ep: TileEpilogue, em: BlockEmitter) -> dict | None:
    """The micro-kernel's fused store epilogue for ``ep`` (``ef`` bits and C argument
    expressions in terms of ``grow``, ``gcol``, ``coff``), or None when ``ep`` is not of the form
    [+ row operand] [+ column operand] [+ full operand] [Relu | Clip] (in that order)."""
    ops = list(ep.ops) + (node_epilogue_ops(em, ep.node, ep.channel) if ep.node is not None else [])
    if not ops:
        return None
    out = {"ef": 0, "rb": "0", "cb": "0", "fr": "0", "lo": "0.0f", "hi": "0.0f"}
    stage = 0
    for op in ops:
        name = op.op
        if isinstance(op, TileOperand) and name == "Add" and op.scale is None and op.kind in ("row", "col", "full"):
            st = {"row": 1, "col": 2, "full": 3}[op.kind]
            if st <= stage or (op.kind == "row" and ep.row_mod):
                return None
            stage = st
            out["ef"] |= {1: EF_ROW, 2: EF_COL, 3: EF_FULL}[st]
            key, idx = {1: ("rb", "grow"), 2: ("cb", "gcol"), 3: ("fr", "coff")}[st]
            out[key] = f"{op.ptr} + {idx}"
        elif name in ("Relu", "Clip") and stage < 4:
            stage = 4
            if name == "Relu":
                out["ef"] |= EF_RELU
            else:
                out["ef"] |= EF_CLIP
                out["lo"] = _lit(op.param("min"))
                out["hi"] = _lit(op.param("max"))
        else:
            return None
    return out


def vector_epilogue_stmts(ep: TileEpilogue, em: BlockEmitter, blk: Blocking, x: str, mask: str | None,
                          flat: str, row: str, col: str) -> list[str] | None:
    """Statements applying the whole epilogue to vector register ``x`` whose lane 0 is the output
    element at flat index ``flat``, GEMM row ``row`` and column ``col`` (consecutive lanes:
    consecutive columns); ``mask`` limits operand loads. None when some op has no vector form."""
    if not blk.vx.vector or not vector_epilogue_ok(ep, blk):
        return None
    v = blk.vx
    ops = list(ep.ops) + (node_epilogue_ops(em, ep.node, ep.channel) if ep.node is not None else [])
    out = []
    for op in ops:
        operand = None
        if isinstance(op, TileOperand):
            ptr = op.ptr
            operand = {"row": lambda p=ptr: v.set1(f"{p}[{row}]"),
                       "scalar": lambda p=ptr: v.set1(f"{p}[0]"),
                       "col": lambda p=ptr: v.masked_load(f"{p} + {col}", mask),
                       "full": lambda p=ptr: v.masked_load(f"{p} + {flat}", mask)}[op.kind]()
        out.append(f"{x} = {_vector_op(v, op, x, operand)};")
    return out


def tile_epilogue_code(ep: TileEpilogue, em: BlockEmitter, blk: Blocking, ldc: int) -> str:
    """C statements finishing the tile at ``cp`` (``rows`` x ``cols``, row stride ``ldc``).

    In scope: ``float *cp``, ``long coff`` (flat output index of the tile's first element),
    ``long grow`` (GEMM row of the tile's first row, item row offset included), ``long gcol``,
    ``long rows``, ``long cols``. Vector ISAs run the ragged end of a row under a lane mask.
    """
    if ep.empty():
        return ""
    row = f"((grow + r) % {ep.row_mod})" if ep.row_mod else "(grow + r)"
    lines = ["for (long r = 0; r < rows; ++r) {", f"    float *restrict cr = cp + r * {ldc};"]
    v = blk.vx
    if v.vector and vector_epilogue_ok(ep, blk):
        w = v.w
        full = vector_epilogue_stmts(ep, em, blk, "x", None, f"coff + r * {ldc} + j", row, "gcol + j")
        tail = vector_epilogue_stmts(ep, em, blk, "x", "m", f"coff + r * {ldc} + j", row, "gcol + j")
        assert full is not None and tail is not None
        lines += ["    long j = 0;",
                  f"    for (; j + {w} <= cols; j += {w}) {{",
                  f"        {v.t} x = {v.loadu('cr + j')};"]
        lines += ["        " + x for x in full]
        lines += [f"        {v.storeu('cr + j', 'x')}", "    }",
                  "    if (j < cols) {",
                  f"        const {v.mask_type} m = {v.lane_mask('cols - j')};",
                  f"        {v.t} x = {v.masked_load('cr + j', 'm')};"]
        lines += ["        " + x for x in tail]
        lines += [f"        {v.masked_store('cr + j', 'x', 'm')}", "    }"]
    else:
        expr = scalar_epilogue(ep, em, "cr[j]", f"(coff + r * {ldc} + j)", row, "(gcol + j)")
        lines.append(f"    for (long j = 0; j < cols; ++j) cr[j] = {expr};")
    lines.append("}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------
# The GEMM problem and its driver
# ------------------------------------------------------------------------------------------
@dataclass
class ConstPacked:
    """A constant operand packed at compile time (``ptr`` to [items][panels][K][MR or NR])."""

    ptr: str


@dataclass
class Strided:
    """A runtime matrix: element (i, k) of A (or (k, j) of B) at ``ptr + off + i*s0 + k*s1``."""

    ptr: str
    s0: int  # stride of the row index (A: m, B: k)
    s1: int  # stride of the column index (A: k, B: n)


@dataclass
class GemmProblem:
    """One GEMM node (possibly a batch of independent items) to render."""

    M: int
    N: int
    K: int
    a: ConstPacked | Strided
    b: object  # ConstPacked | Strided | a conv im2col packer (has .pack_code())
    y: str  # output pointer expression
    ldc: int
    epilogue: TileEpilogue
    items: int = 1
    # C statements computing long ao, bo, co, grow0 (A/B/C offsets in floats, row offset for
    # "row" epilogue operands) from the item index ``it``
    item_code: str = "const long ao = 0, bo = 0, co = 0, grow0 = 0;"
    name: str = "gemm"
    doc: str = ""
    extra: dict = field(default_factory=dict)
    # the schedule's decisions (``smelt.schedule.gemm.GemmSchedule``; the templates copy them):
    # read a run-time B with unit column stride in place instead of packing it (the kernels
    # keep their ldb parameter)
    direct_b: bool = False
    # read a run-time row-major A in place instead of packing MR-row panels
    direct_a: bool = False
    # the micro-kernel prefetches its C tile before the K loop
    prefetch_c: bool = False
    # prepacked B: each micro-kernel call prefetches its share of the next B block into L2
    prefetch_next_b: bool = False
    # fewer multiply-adds than this (all items): thread 0 alone
    parallel_min_macs: int = 0
    # the same code for every M and N (``GemmSchedule.runtime_shape``)
    runtime_shape: bool = False


def pack_const_a(a: np.ndarray, mr: int) -> np.ndarray:
    """[M, K] -> [ceil(M/MR), K, MR], zero padded."""
    m, k = a.shape
    mp = -(-m // mr) * mr
    buf = np.zeros((mp, k), np.float32)
    buf[:m] = a
    return np.ascontiguousarray(buf.reshape(mp // mr, mr, k).transpose(0, 2, 1))


def pack_const_b(b: np.ndarray, nr: int) -> np.ndarray:
    """[K, N] -> [ceil(N/NR), K, NR], zero padded."""
    k, n = b.shape
    np_ = -(-n // nr) * nr
    buf = np.zeros((k, np_), np.float32)
    buf[:, :n] = b
    return np.ascontiguousarray(buf.reshape(k, np_ // nr, nr).transpose(1, 0, 2))


def _split(total: int, parts: int) -> list[int]:
    base, rem = divmod(total, parts)
    return [base + (1 if t < rem else 0) for t in range(parts)]


def choose_partition(p: GemmProblem, blk: Blocking, nt: int) -> tuple[str, int]:
    """("single"|"items"|"grid", pn): how threads divide the work (pn: grid columns)."""
    if nt <= 1 or (p.items * p.M * p.N * p.K < p.parallel_min_macs and not p.runtime_shape):
        return "single", 1
    mp, np_ = -(-p.M // blk.mr), -(-p.N // blk.nr)
    pack_b = not isinstance(p.b, ConstPacked) and not (p.direct_b and isinstance(p.b, Strided) and p.b.s1 == 1)
    pack_a = not isinstance(p.a, ConstPacked) and not (p.direct_a and isinstance(p.a, Strided) and p.a.s1 == 1)

    def cost(rows_panels: int, cols_panels: int, last_m: bool, last_n: bool) -> float:
        rows = rows_panels * blk.mr - ((-p.M) % blk.mr if last_m else 0)
        cols = cols_panels * blk.nr - ((-p.N) % blk.nr if last_n else 0)
        cols_v = -(-cols // blk.vec) * blk.vec
        c = rows * cols_v / 32.0
        if pack_b:
            c += cols * 0.5
        if pack_a:
            c += rows * 0.5 * max(1, -(-cols // blk.nc))
        return c

    best = None
    for pn in range(1, nt + 1):
        if nt % pn:
            continue
        pm = nt // pn
        if pm > mp or pn > np_:
            continue
        ms, ns = _split(mp, pm), _split(np_, pn)
        worst = max(cost(ms[i], ns[j], i == pm - 1, j == pn - 1) for i in range(pm) for j in range(pn))
        total = cost(mp, np_, True, True)
        eff = total / (nt * worst)
        if best is None or eff > best[0] + 1e-9:
            best = (eff, pn)
    if best is None:
        best = (1.0 / nt, nt if np_ >= nt else 1)
    grid_eff, pn = best
    if p.items >= nt and not p.runtime_shape:
        items_eff = p.items / (nt * -(-p.items // nt))
        if items_eff >= grid_eff - 1e-9:
            return "items", 1
    return "grid", pn


def _dispatch(em: BlockEmitter, blk: Blocking, p: GemmProblem, direct_a: bool,
              ct: tuple[int, int] | None, next_b: bool) -> str:
    """Kernel calls by tile shape (only the shapes this problem has)."""
    m_tail, n_tail = p.M % blk.mr, p.N % blk.nr
    nv = blk.nv

    fe = kernel_epilogue(p.epilogue, em)
    if fe is None:
        eargs = "0, 0, 0, 0, 0, 0.0f, 0.0f"
    else:
        eargs = (f"pc + kb == {p.K} ? {fe['ef']} : 0, {fe['rb']}, {fe['cb']}, {fe['fr']}, {p.ldc}, "
                 f"{fe['lo']}, {fe['hi']}")

    def call(rows: int, cols: int) -> str:
        vecs = -(-cols // blk.vec)
        lastn = cols - (vecs - 1) * blk.vec
        fn = microkernel(em, blk, rows, vecs, direct_a, p.prefetch_c, next_b)
        return f"{fn}(kb, ap, lda, bp, ldb, cp, {p.ldc}, pc > 0, {lastn}, {eargs}, pf, pfn);"

    def by_cols(rows: int) -> str:
        if not n_tail:
            return call(rows, blk.nr)
        if ct is not None:
            return (f"if (cols == {blk.nr}) {call(rows, blk.nr)}"
                    + (f" else {call(rows, blk.vec * ct[0])}" if ct[0] else ""))
        return f"if (cols == {blk.nr}) {call(rows, blk.nr)} else {call(rows, n_tail)}"

    del nv
    if p.runtime_shape:  # every tail kernel, picked by the run-time rows and vectors of columns
        def by_vectors(rows: int) -> str:
            cases = []
            for vecs in range(1, blk.nv + 1):
                fn = microkernel(em, blk, rows, vecs, direct_a, p.prefetch_c, next_b)
                cases.append(f"case {vecs}: {fn}(kb, ap, lda, bp, ldb, cp, {p.ldc}, pc > 0, "
                             f"(int)(cols - {(vecs - 1) * blk.vec}), {eargs}, pf, pfn); break;")
            return f"switch ((cols + {blk.vec - 1}) / {blk.vec}) {{ {' '.join(cases)} }}"
        return ("switch (rows) { "
                + " ".join(f"case {r}: {{ {by_vectors(r)} }} break;" for r in range(blk.mr, 0, -1)) + " }")
    if not m_tail:
        return by_cols(blk.mr)
    return f"if (rows == {blk.mr}) {{ {by_cols(blk.mr)} }} else {{ {by_cols(m_tail)} }}"


def _pack_a_code(p: GemmProblem, blk: Blocking) -> str:
    """Runtime A block [ic, ic+mb) x [pc, pc+kb) into As as MR-row panels."""
    a = p.a
    assert isinstance(a, Strided)
    mr = blk.mr
    lines = [f"for (long q = 0; q < mb; q += {mr}) {{",
             f"    const long rr = SMELT_MIN({mr}, mb - q);",
             f"    float *restrict d = As + (q / {mr}) * kb * {mr};",
             f"    const float *restrict s = Abase + ao + (ic + q) * {a.s0}L + pc * {a.s1}L;"]
    if a.s1 == 1:
        lines += ["    for (long r = 0; r < rr; ++r) {",
                  f"        const float *restrict sr = s + r * {a.s0}L;",
                  f"        for (long k = 0; k < kb; ++k) d[k * {mr} + r] = sr[k];",
                  "    }"]
    else:
        lines += ["    for (long k = 0; k < kb; ++k)",
                  f"        for (long r = 0; r < rr; ++r) d[k * {mr} + r] = s[k * {a.s1}L + r * {a.s0}L];"]
    lines.append("}")
    return "\n".join(lines)


def pack_b_strided_code(b: Strided, blk: Blocking, base: str = "Bbase + bo") -> str:
    """Runtime B block [pc, pc+kb) x [jc, jc+nb) into Bs as NR-column panels."""
    nr = blk.nr
    lines = [f"for (long q = 0; q < nb; q += {nr}) {{",
             f"    const long cc = SMELT_MIN({nr}, nb - q);",
             f"    float *restrict d = Bs + (q / {nr}) * kb * {nr};",
             f"    const float *restrict s = {base} + pc * {b.s0}L + (jc + q) * {b.s1}L;"]
    if b.s1 == 1:
        lines += ["    for (long k = 0; k < kb; ++k) {",
                  f"        const float *restrict sk = s + k * {b.s0}L;",
                  f"        float *restrict dk = d + k * {nr};"]
        v = blk.vx
        if v.bit_masks:  # a whole panel row in vectors, the ragged one under a shifted bit mask
            nv, w = blk.nv, v.lanes
            lines.append(f"        if (cc == {nr}) {{")
            for j in range(nv):
                lines.append(f"            {v.store(f'dk + {w * j}', v.loadu(f'sk + {w * j}'))}")
            lines.append("        } else {")
            lines.append("            const unsigned long long m = (1ull << cc) - 1ull;")
            for j in range(nv):
                lines.append(f"            {v.store(f'dk + {w * j}', v.masked_load(f'sk + {w * j}', f'({v.mask_type})(m >> {w * j})'))}")
            lines.append("        }")
        else:
            lines.append("        for (long j = 0; j < cc; ++j) dk[j] = sk[j];")
        lines.append("    }")
    else:
        lines += ["    for (long j = 0; j < cc; ++j)",
                  f"        for (long k = 0; k < kb; ++k) d[k * {nr} + j] = s[j * {b.s1}L + k * {b.s0}L];"]
    lines.append("}")
    return "\n".join(lines)


def render_gemm(em: BlockEmitter, p: GemmProblem, blk: Blocking | None = None) -> None:
    """Emit the driver function of ``p`` and the step that calls it."""
    blk = blk or blocking_for(em.target)
    if p.M == 0 or p.N == 0 or p.items == 0:
        return
    nt = max(1, em.n_threads)
    mode, pn = choose_partition(p, blk, nt)
    mr, nr = blk.mr, blk.nr
    mp, np_ = -(-p.M // mr), -(-p.N // nr)
    kb_max = blk.kb(p.K)
    pack_b = not isinstance(p.b, ConstPacked)
    direct_b = p.direct_b and blk.vx.vector and isinstance(p.b, Strided) and p.b.s1 == 1
    pack_b = pack_b and not direct_b
    pack_a = not isinstance(p.a, ConstPacked)
    direct_a = p.direct_a and blk.vx.vector and isinstance(p.a, Strided) and p.a.s1 == 1
    pack_a = pack_a and not direct_a
    # a run-time A small enough is packed whole, once per item, instead of per (jc, pc) block
    prepack_a = pack_a and mp * mr * p.K * 4 <= PREPACK_A_BYTES and not p.runtime_shape
    mc = p.M if not pack_a or prepack_a else min(blk.mc, mp * mr)
    # per-thread scratch
    ncr = min(blk.nc, np_ * nr)
    slots = 1 if mode == "single" else nt
    lines = ["(void)in; (void)out; (void)arena; (void)scratch; (void)W;",
             f"if (tid >= {slots}) return;",
             f"const int nu = nt < {slots} ? nt : {slots}; /* threads with a scratch slice */"]
    if pack_b:
        bs_floats = kb_max * ncr
        bs = em.scratch(bs_floats * 4 * slots)
        lines.append(f"float *restrict Bs = {bs} + (long)tid * {bs_floats};")
    if hasattr(p.b, "table_bytes"):
        tb = -(-p.b.table_bytes(blk) // 64) * 64  # type: ignore[attr-defined]
        ts = em.scratch(tb * slots, "uint8")
        lines.append(f"char *restrict Ts = (char *){ts} + (long)tid * {tb};")
    if pack_a:
        as_floats = (p.K if prepack_a else kb_max) * -(-mc // mr) * mr
        as_ = em.scratch(as_floats * 4 * slots)
        lines.append(f"float *restrict As = {as_} + (long)tid * {as_floats};")
    a_expr = p.a.ptr
    b_expr = getattr(p.b, "ptr", "0")
    lines += [f"const float *restrict Abase = {a_expr};",
              f"const float *restrict Bbase = {b_expr};",
              f"float *restrict Y = {p.y};",
              "(void)Abase; (void)Bbase;",
              f"long it0 = 0, it1 = {p.items}, pm0 = 0, pm1 = {mp}, pn0 = 0, pn1 = {np_};"]
    if mode == "items":
        lines.append(f"smelt_range({p.items}, tid, nu, &it0, &it1);")
    elif mode == "grid":
        # the same code for every size (runtime_shape): the grid splits the longer side, decided
        # in C from the panel counts, which are slots there, instead of by the cost model
        grid_pn = f"({np_} >= {mp} ? {nt} : 1)" if p.runtime_shape else str(pn)
        lines += [f"{{ const int pn = nu == {nt} ? {grid_pn} : 1; const int pm = nu / pn;",
                  f"  smelt_range({mp}, tid / pn, pm, &pm0, &pm1); smelt_range({np_}, tid % pn, pn, &pn0, &pn1); }}"]
    else:
        lines.append("if (tid != 0) return; (void)nu;")
    lines += ["if (pm0 >= pm1 || pn0 >= pn1) return;",
              f"const long m0 = pm0 * {mr}, m1 = SMELT_MIN(pm1 * {mr}, {p.M});",
              f"const long n0 = pn0 * {nr}, n1 = SMELT_MIN(pn1 * {nr}, {p.N});",
              "for (long it = it0; it < it1; ++it) {",
              "    " + p.item_code.replace("\n", "\n    "),
              "    (void)ao; (void)bo; (void)grow0;"]
    if prepack_a and not direct_a:
        lines += [f"    {{ const long ic = m0, mb = m1 - m0, pc = 0, kb = {p.K};",
                  "      " + _pack_a_code(p, blk).replace("\n", "\n      "), "    }"]
    lines += [f"    for (long jc = n0; jc < n1; jc += {blk.nc}) {{",
              f"        const long nb = SMELT_MIN({blk.nc}, n1 - jc);",
              f"        for (long pc = 0; pc < {p.K}; pc += {kb_max}) {{",
              f"            const long kb = SMELT_MIN({kb_max}, {p.K} - pc);"]
    inner: list[str] = []
    if direct_b:
        assert isinstance(p.b, Strided)
        inner.append(f"const float *restrict bptr = Bbase + bo + pc * {p.b.s0}L + jc; const long bps = {nr};")
        inner.append(f"const long ldb = {p.b.s0};")
    elif pack_b:
        if isinstance(p.b, Strided):
            inner.append(pack_b_strided_code(p.b, blk))
        else:
            inner.append(p.b.pack_code(blk))  # type: ignore[attr-defined]
        inner.append(f"const float *restrict bptr = Bs; const long bps = kb * {nr}; const long ldb = {nr};")
    else:
        inner.append(f"const float *restrict bptr = Bbase + bo + (jc / {nr}) * {p.K * nr}L + pc * {nr};")
        inner.append(f"const long bps = {p.K * nr}L; const long ldb = {nr};")
    # prepacked weights: the next B block of this thread's (jc, pc) order is prefetched into L2
    # while this one computes, each micro-kernel call taking an equal share of its panel's lines
    # (weights of a whole network stream from DRAM, and a block's first row tile would otherwise
    # wait on them: at ~16 B per cycle it needs several times what DRAM gives one core)
    next_b = p.prefetch_next_b and blk.vx.vector and not pack_b and not direct_b
    if next_b:
        inner += ["const float *restrict bnext = 0; long nbn = 0, kbn = 0;",
                  f"if (pc + kb < {p.K}) {{ bnext = bptr + kb * {nr}; nbn = nb; kbn = SMELT_MIN({kb_max}, {p.K} - pc - kb); }}",
                  f"else if (jc + {blk.nc} < n1) {{ bnext = Bbase + bo + ((jc + {blk.nc}) / {nr}) * {p.K * nr}L; "
                  f"nbn = SMELT_MIN({blk.nc}, n1 - jc - {blk.nc}); kbn = {kb_max}; }}",
                  f"const long pf_rows = (SMELT_MIN({mc}, m1 - m0) + {mr - 1}) / {mr};  /* row tiles per block */",
                  f"const long pf_lines = (kbn * {nr * 4} + 63) / 64, pf_share = (pf_lines + pf_rows - 1) / pf_rows;"]
    inner += [f"for (long ic = m0; ic < m1; ic += {mc}) {{",
              f"    const long mb = SMELT_MIN({mc}, m1 - ic);"]
    if direct_a:
        assert isinstance(p.a, Strided)
        inner.append(f"    const float *restrict aptr = Abase + ao + ic * {p.a.s0}L + pc;")
        inner.append(f"    const long aps = {mr * p.a.s0}L, lda = {p.a.s0};")
    elif prepack_a:
        inner.append(f"    const float *restrict aptr = As + ((ic - m0) / {mr}) * {p.K * mr}L + pc * {mr};")
        inner.append(f"    const long aps = {p.K * mr}L, lda = 0;")
    elif pack_a:
        inner.append("    " + _pack_a_code(p, blk).replace("\n", "\n    "))
        inner.append(f"    const float *restrict aptr = As; const long aps = kb * {mr}, lda = 0;")
    else:
        inner.append(f"    const float *restrict aptr = Abase + ao + (ic / {mr}) * {p.K * mr}L + pc * {mr};")
        inner.append(f"    const long aps = {p.K * mr}L, lda = 0;")
    epi = tile_epilogue_code(p.epilogue, em, blk, p.ldc)
    # the column kernel reads packed A panels; its use depends on N
    ct = None if direct_a or p.runtime_shape else col_tail(blk, p.N)
    inner.append("    (void)lda;")
    inner += [f"    for (long ir = 0; ir < mb; ir += {mr}) {{",
              f"        const long rows = SMELT_MIN({mr}, mb - ir); (void)rows;",
              f"        const float *restrict ap = aptr + (ir / {mr}) * aps;",
              f"        for (long jr = 0; jr < nb; jr += {nr}) {{",
              f"            long cols = SMELT_MIN({nr}, nb - jr); (void)cols;",
              f"            const float *restrict bp = bptr + (jr / {nr}) * bps;",
              *(["            const char *pf = 0; long pfn = 0;",
                 f"            if (bnext && jr < nbn) {{ const long l0 = SMELT_MIN(pf_lines, ((ic - m0 + ir) / {mr}) * pf_share); "
                 f"pf = (const char *)(bnext + (jr / {nr}) * bps) + l0 * 64; pfn = SMELT_MIN(pf_share, pf_lines - l0); }}"]
                if next_b else ["            const char *pf = 0; long pfn = 0;"]),
              f"            float *restrict cp = Y + co + (ic + ir) * {p.ldc}L + jc + jr;",
              f"            const long coff = co + (ic + ir) * {p.ldc}L + jc + jr;",
              "            const long grow = grow0 + ic + ir, gcol = jc + jr;",
              "            (void)coff; (void)grow; (void)gcol;",
              "            " + _dispatch(em, blk, p, direct_a, ct, next_b)]
    if epi and kernel_epilogue(p.epilogue, em) is None:
        if ct is not None:  # the tail panel's leftover columns are finished below
            inner.append(f"            if (cols != {nr}) cols = {16 * ct[0]};")
        inner += [f"            if (pc + kb == {p.K} && cols > 0) {{",
                  "                " + epi.replace("\n", "\n                "),
                  "            }"]
    inner.append("        }")
    if ct is not None:
        # the leftover tail columns of a group of npn row panels, right after the group's last
        # panel (its A panels are still in cache)
        v, r = ct
        npn = col_panels(r)
        calls = []
        for q in range(npn, 0, -1):
            fn = define(em, f"f32_gemm_colukr_{8 * q}x{r}__{blk.isa}", colkernel_source(blk, q, r),
                             f"column kernel: {q} A panels x {r} tail columns")
            calls.append(f"{'if' if q == npn else 'else if'} (rows > {8 * (q - 1)}) "
                         f"{fn}(kb, ap, aps, bp, ldb, cp, {p.ldc}, pc > 0, rows);")
        inner += [f"        if (jc + nb == {p.N} && ((ir / {mr}) % {npn} == {npn - 1} || ir + {mr} >= mb)) {{",
                  f"            const long g0 = ir / {8 * npn} * {8 * npn};",
                  f"            const long jr = (nb - 1) / {nr} * {nr}, c0 = jr + {16 * v};",
                  f"            const float *restrict bp = bptr + (jr / {nr}) * bps + {16 * v};",
                  f"            const long rows = SMELT_MIN({8 * npn}, mb - g0);",
                  f"            const float *restrict ap = aptr + (g0 / {mr}) * aps;",
                  f"            float *restrict cp = Y + co + (ic + g0) * {p.ldc}L + jc + c0;",
                  "            " + "\n            ".join(calls)]
        if epi:
            inner += [f"            if (pc + kb == {p.K}) {{",
                      f"                const long coff = co + (ic + g0) * {p.ldc}L + jc + c0;",
                      f"                const long grow = grow0 + ic + g0, gcol = jc + c0, cols = {r};",
                      "                (void)coff; (void)grow; (void)gcol;",
                      "                " + epi.replace("\n", "\n                "),
                      "            }"]
        inner.append("        }")
    inner.append("    }")
    inner += ["}"]
    lines.append("            " + "\n".join(inner).replace("\n", "\n            "))
    lines += ["        }", "    }", "}"]
    doc = (f"{p.doc}; M={p.M} N={p.N} K={p.K} items={p.items}; MRxNR={mr}x{nr} KC={kb_max} NC={blk.nc} "
           f"MC={mc}; A {'read in place' if direct_a else 'prepacked' if not pack_a else 'packed whole at run time' if prepack_a else 'packed at run time'}, B "
           f"{'read in place' if direct_b else 'packed at run time' if pack_b else 'prepacked'}; threads: {mode}"
           f"{f' pn={pn}' if mode == 'grid' else ''}; {describe_epilogue(p.epilogue)}"
           f"{' (fused into the micro-kernel store)' if kernel_epilogue(p.epilogue, em) else ''}")
    a_how = "A read in place" if direct_a else "A prepacked" if not pack_a else "A packed at run time"
    b_how = "B read in place" if direct_b else "B packed at run time" if pack_b else "B prepacked"
    em.schedule(kernel=f"{p.name}_{blk.tag}",
                gemm=f"M={p.M} N={p.N} K={p.K}" + (f" x {p.items} items" if p.items > 1 else ""),
                micro_kernel=f"{mr}x{nr} {blk.isa}",
                blocking=f"MC={mc} KC={kb_max} NC={blk.nc}; {a_how}, {b_how}",
                threads=f"{mode}{f' pn={pn}' if mode == 'grid' else ''} (sized for {nt})",
                epilogue_at=("in the micro-kernel store" if kernel_epilogue(p.epilogue, em)
                             else "tile pass" if not p.epilogue.empty() else ""))
    em.step("\n".join(lines), name=f"{p.name}_{blk.tag}", doc=doc)


def kernel_param_epilogue(em: BlockEmitter, node: Node, bias: str | None) -> tuple[TileEpilogue, list[str]]:
    """A conv's tile epilogue (its bias, then the node's fused chain over output channels) with
    operand pointers renamed to kernel parameters e0, e1, ... and the call-site expressions for
    them (the NCHWc and Winograd kernels take their operands as parameters)."""
    ops: list[TileOp] = []
    args = []
    if bias is not None:
        ops.append(TileOperand("Add", bias, "col"))
    ops += node_epilogue_ops(em, node, "col")
    for i, op in enumerate(ops):
        if isinstance(op, TileOperand):
            args.append(op.ptr)
            ops[i] = dataclasses.replace(op, ptr=f"e{len(args) - 1}")
    return TileEpilogue(ops), args
