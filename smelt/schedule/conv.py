"""Convolution schedules: every decision about how a Conv runs, made once, written on the node.

For each Conv the schedule stage resolves, in this order:
- the **algorithm**: the NCHW GEMM (``gemm``: im2col in packing, conv.py), the NCHW[x]c direct
  kernel (``direct``, conv_nchwc.py) or Winograd F(2x2, 3x3) on NCHW16c (``winograd``,
  winograd.py). The layout pass asks ``nchwc_reason`` and ``prefers_gemm`` whether a conv is
  blocked at all; after layouts are planned, ``winograd_choice`` decides between direct and
  Winograd;
- the **NCHWc tile** (``NchwcSchedule``): forced (the global layout search's pick, or a tuner's
  measurement graph) -> tuned (the tuning database, kind ``CONV_KIND``) -> default (the cost
  model, ``default_schedule``), then fitted to the blocks the layout pass chose (``fit``);
- the **Winograd order** (banded or phased) and the **in-place residual** (the row-outer kernel
  may write its output over a fused residual operand; the memory planner checks liveness);
- the kernels' remaining choices, each a typed field: the direct kernel's prefetches and work
  split (``DirectKernel``), the NCHW GEMM's (``GemmSchedule``), the NCHW depthwise kernel's
  register blocking and threading (``DepthwiseKernel``), Winograd's transform-domain register
  tile (``winograd_tile``). Those a caller may flip are ``CompileOptions`` fields.

Everything here reads target facts (vector lanes, registers, cache sizes) and the compile
options; no template is imported: templates only read ``node.schedule`` (a ``ConvSchedule``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from smelt.codegen.kernels.conv_geometry import (
    ConvGeometry,
    check_conv,
    is_depthwise,
    is_flat_pointwise,
    row_width,
)
from smelt.codegen.kernels.epilogue import ACTIVATIONS
from smelt.codegen.kernels.isa import half_width, vector_isa
from smelt.ir.epilogue import EpilogueActivation, EpilogueBinary
from smelt.ir.graph import PLAIN, Graph, Node, layout_block
from smelt.options import CompileOptions
from smelt.schedule.db import CONV_KIND, TuningDB
from smelt.schedule.gemm import GemmSchedule, gemm_schedule
from smelt.target import Target

# ic-outer order is in the space of convs with at most this many output positions per image
IC_OUTER_MAX_PLANE = 196
# Version of the schedule space, part of every tuning-database key: records searched over an
# older space (2: ic_chunk added) are not reused, since they never saw the newer choices.
SCHEDULE_SPACE = 2
GEMM_MIN_REDUCTION = 256  # input channels x kernel taps (see prefers_gemm)
# output positions per image below which a narrow-row conv stays direct (narrow_row_bound): the
# GEMM micro-kernel's column panel is 16-48 wide, so fewer columns leave it as idle as the direct tile
GEMM_MIN_COLUMNS = 64
# smallest ic-outer chunk, in input channels (one 16-lane input block)
MIN_IC_CHUNK = 16
# the NCHWc kernels are rendered for blocks of 8 and 16 lanes
NCHWC_BLOCKS = (16, 8)

# output-channel blocks of the transform-domain GEMM's register tile (J); the tile's columns
# (R transform tiles) fill the rest of the accumulator budget: 2 x 14 on 32 registers, 2 x 6
# on 16 (on ResNet-18 at AVX2, 1 thread, interleaved: 2 x 6 24.8 ms, 1 x 12 27.8, 3 x 4 28.5, by
# the fastest run; the machine was shared)
WINOGRAD_BLOCKS = 2
# The cost thresholds, by the target's vector registers: (fewest output positions per image,
# fewest input channels) that take Winograd by default.
# 32 registers (AVX-512): planes of 196 (ResNet-50's 7x7 layers were 5.6% slower with it: 16/9
# more weight bytes from memory) and 32 channels (SqueezeNet's 16->64 expand on 55x55: 0.195 ms
# Winograd vs 0.158 ms direct).
# 16 registers (AVX2, measured on the forced AVX2 path, Zen 4): Winograd won wherever legal on
# ResNet-18 and SqueezeNet 1.1, 7x7 planes and 16-channel inputs included (interleaved medians,
# direct / 32-register thresholds / these: ResNet-18 1 thread 44.7 / 27.9 / 24.9 ms, 2 threads
# 23.1 / 15.4 / 14.1; SqueezeNet 1 thread 7.48 / 6.84 / 5.69, 2 threads 4.91 / 4.64 / 4.38): the
# direct kernel's 12-accumulator tile does less per load than 28, and the 2.25x fewer FMAs pay
# for the transforms. The smallest measured winners set the floor (7x7 = 49 positions, 16
# channels); no data below it. A register count not listed takes the strictest thresholds.
WINOGRAD_THRESHOLDS = {32: (196, 32), 16: (49, 16)}
# Winograd's order (``winograd_choice``): never banded when the transformed weights exceed L3 /
# WINOGRAD_BANDED_MAX_L3_FRACTION (each band would re-read them from memory); banded when the
# phased buffers exceed WINOGRAD_PHASED_MAX_L2S times the threads' L2; between, banded when the
# weights fit L2 / WINOGRAD_BANDED_MAX_WEIGHTS
WINOGRAD_BANDED_MAX_L3_FRACTION = 4
WINOGRAD_PHASED_MAX_L2S = 2
WINOGRAD_BANDED_MAX_WEIGHTS = 4

# NCHWc direct kernel, ic-outer order: prefetch the weights this many chunks ahead (2: the chunk
# after next, so each chunk's weights had a whole chunk of FMAs to arrive from memory)
WEIGHT_PREFETCH_DISTANCE = 2
# row-outer order splits work by rows first when the weights fit L2 / this
ROW_SPLIT_L2_FRACTION = 2
# the direct kernel prefetches the next output row's input rows when an image's input exceeds
# this fraction of L2 (``prefetch_rows``)
PREFETCH_ROWS_L2_FRACTION = 2
# a row-outer direct kernel with fewer than ROW_SEGMENT_ITEMS work items per thread (images x
# output-channel tiles x rows) cuts each output row into segments of at least
# ROW_SEGMENT_MIN_TILES register tiles, each a work item of its own (``row_segments``)
ROW_SEGMENT_ITEMS = 4
ROW_SEGMENT_MIN_TILES = 4

# NCHW depthwise kernel (templates/conv.py): below this many multiply-adds thread 0 runs it alone
DW_PARALLEL_MIN_MACS = 1 << 15
# independent accumulators that hide the FMA latency (4 cycles x 2 FMA ports); more only take
# registers (the depthwise row's vectors in flight)
FMA_CHAINS = 8

ALGORITHMS = ("gemm", "direct", "winograd")
# fused activations the direct kernel applies after storing its tile (``epilogue_after_store``),
# the vector math functions of many constants (csrc/smelt_vec.h): in registers beside the tile,
# gcc kept those constants live across the FMA loop and spilled its accumulators. A 48->96 1x1
# conv at 160x160, 2 threads (EMR; 0.78 ms without an activation at AVX-512, 1.45 at AVX2):
# with GELU 1.68 -> 1.23 ms, SiLU 1.88 -> 1.56 (AVX2 3.97 -> 2.61), Tanh 1.74 -> 1.33; the erf
# GELU first measured 2.2x faster that way on one Zen 4 core
MEMORY_EPILOGUE_OPS = ("Gelu", "SiLU", "Sigmoid", "Tanh")


@dataclass(frozen=True)
class NchwcSchedule:
    """One point of the NCHWc template's schedule space (NeoCPU's tuple, extended)."""

    oc_bn: int  # output channels per block = the output layout's block = one vector
    reg_n: int  # output columns per register tile (R)
    oc_blocks: int = 1  # output-channel blocks per tile (J)
    unroll_ker: bool = True  # unroll the kernel-column loop in body tiles
    ic_bn: int = 0  # input layout block wanted (0: whatever the producer gives)
    # loop order: 0 = input channels innermost (a tile's accumulators live in registers over all
    # of IC); k > 0 = NeoCPU's ic-outer order: for each chunk of k input channels (rounded to
    # whole input blocks), every row of the work item is accumulated into the output in memory,
    # so a weight chunk comes from memory once and is reused from L1 for all rows (small planes,
    # big weights: ResNet-50's stage 4 went from 47-53% to 65-77% of peak in the network)
    ic_chunk: int = 0
    # column pairs: oc_bn is half the ISA's vector, and each vector holds two adjacent output
    # columns of one block (their 2 x oc_bn floats are contiguous in NCHW<oc_bn>c); ``reg_n``
    # still counts columns. Set by ``finish`` (``column_pairs``), never by the tuner.
    pairs: bool = False

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict) -> NchwcSchedule:
        return NchwcSchedule(int(d["oc_bn"]), int(d["reg_n"]), int(d.get("oc_blocks", 1)),
                             bool(d.get("unroll_ker", True)), int(d.get("ic_bn", 0)), int(d.get("ic_chunk", 0)),
                             bool(d.get("pairs", False)))


@dataclass(frozen=True)
class DirectKernel:
    """The NCHWc direct kernel's memory decisions (``direct_kernel``)."""

    # prefetch the next input-channel block's first input row into L1 at each block's start
    # (``options.conv_prefetch_input``; only kernels with more than one input block do it)
    prefetch_input: bool
    # prefetch the next weights into L2 a few lines per kernel tap: ic-outer order the chunk
    # ``weight_distance`` ahead, row-outer order the next output-channel tile
    # (``options.conv_prefetch_weights``; never with ``row_split``, whose weights stay in L2)
    prefetch_weights: bool
    weight_distance: int  # chunks ahead (ic-outer order)
    # row-outer work items row-major: each thread takes a band of output rows over every oc
    # tile (reading its own band of the input, which the previous layer's same split left in
    # its own L2) instead of oc tiles first; taken when the weights fit L2 / ROW_SPLIT_L2_FRACTION
    row_split: bool
    # row-outer order: while an output row computes, each tile prefetches into L2 its columns of
    # the input rows the next output row adds (``options.conv_prefetch_rows``, taken when the
    # input exceeds ``PREFETCH_ROWS_L2_FRACTION`` of L2), so an input that arrives from L3 or DRAM
    # is not first touched by the FMAs' loads
    prefetch_rows: bool = False
    # the output row's tail and right edge are laid out at run time (a shape class's graph,
    # ``Graph.shape_generic``): the code is the same for every width, so one library serves them
    runtime_width: bool = False
    # the tile stores its raw sums, then a loop over the stored vectors (in L1) applies the fused
    # epilogue (``epilogue_after_store``): an erf GELU's ~10 temporaries beside 24 live
    # accumulators made gcc 12 spill both, 24 ns a vector against 11 ns in a loop of its own
    epilogue_after_store: bool = False
    # row-outer order: each output row is cut into this many column segments, each a work item
    # (``row_segments``: a 1-D conv lifted to height 1 has one row per image)
    row_segments: int = 1


@dataclass(frozen=True)
class DepthwiseKernel:
    """The NCHW depthwise kernel's choices (templates/conv.py; ``depthwise_kernel``)."""

    threaded: bool  # planes split over threads (False: thread 0 alone, a tiny conv)
    # output vectors of a row accumulated in registers at once (the register kernels)
    row_vectors: int
    # a plane of at most this many output vectors runs as one flat block of registers
    plane_vectors: int


@dataclass(frozen=True)
class ConvSchedule:
    """How one Conv runs (``node.schedule``); the conv templates render exactly this."""

    algorithm: str  # one of ALGORITHMS
    tile: NchwcSchedule | None = None  # the NCHWc register tile ("direct"; None otherwise)
    source: str = "default"  # where the tile came from: "forced", "tuned" or "default"
    winograd_order: str = ""  # "banded" or "phased" ("winograd" only)
    # the fused residual operand the kernel may write its output over (the memory planner
    # applies it when the conv is that operand's last reader), or None
    inplace_operand: str | None = None
    # "direct": prefetches and work split (None until ``finish``, or ``forced_direct``)
    direct: DirectKernel | None = None
    # "gemm": the GEMM's schedule (1x1 and im2col convs) and the depthwise kernel's
    gemm: GemmSchedule | None = None
    depthwise: DepthwiseKernel | None = None
    # "winograd": the transform-domain GEMM's register tile (J output blocks, R transform tiles)
    winograd_tile: tuple[int, int] = (0, 0)
    # Winograd's code the same for every plane size (a shape class's graph, ``Graph.shape_generic``):
    # the GEMM's tail and the band sizes at run time, edge tiles always checked
    runtime_size: bool = False

    def __post_init__(self) -> None:
        assert self.algorithm in ALGORITHMS, self.algorithm


# ------------------------------------------------------------------------------------------
# What the NCHWc kernels can run on this target
# ------------------------------------------------------------------------------------------
def vector_lanes(target: Target) -> int:
    """f32 lanes of the target's vectors (1 without a vector ISA description)."""
    vx = vector_isa(target)
    return vx.lanes if vx.vector else 1


def accumulator_budget(target: Target, oc_bn: int) -> int:
    """Accumulators a tile may hold: the vector registers minus the J weight vectors, a
    broadcast and the loop's addresses (28 of 32 registers, 12 of 16; AVX-512's 8-lane blocks
    keep its 32 registers)."""
    return vector_isa(target).registers - 4


def oc_block_choices(oc: int, target: Target) -> list[int]:
    """Output block sizes this target can run for ``oc`` output channels (best first): its
    vector width, then the half width where the ISA has one (AVX-512's ymm form)."""
    vx = vector_isa(target)
    if not vx.vector:
        return []
    return [d.lanes for d in (vx, half_width(vx)) if d is not None and d.lanes in NCHWC_BLOCKS and oc % d.lanes == 0]


def geometry_reason(node: Node, g: Graph) -> str | None:
    """What both the layout pass's test and the template's check require of the node itself."""
    why = check_conv(node, g)
    if why is not None:
        return why
    rank = ConvGeometry(node, g).rank
    return None if rank == 2 else f"NCHWc convolution is 2-D only (rank {rank})"


def nchwc_reason(node: Node, g: Graph, target: Target) -> str | None:
    """None when this Conv can run on the NCHW[x]c template, else why not."""
    if vector_lanes(target) < min(NCHWC_BLOCKS):
        return f"NCHWc convolution needs vectors of at least {min(NCHWC_BLOCKS)} floats ({vector_isa(target).name} has none)"
    why = geometry_reason(node, g)
    if why is not None:
        return why
    geo = ConvGeometry(node, g)
    if not oc_block_choices(geo.oc, target):
        return f"output channels {geo.oc} are not a multiple of {min(NCHWC_BLOCKS)}"
    if geo.group > 1 and not is_depthwise(geo):
        if geo.ocg % 8 or not oc_block_choices(geo.ocg, target):
            return f"grouped conv with {geo.ocg} output channels per group (needs a multiple of 8)"
    return None


def prefers_gemm(node: Node, g: Graph, target: Target, options: CompileOptions) -> bool:
    """The per-layer algorithm choice: True when the NCHW GEMM (im2col in packing) beats the
    NCHWc template. That is the case for output rows too narrow for the direct kernel's register
    tile (``narrow_row_bound``), and when the output channels only divide into half-width blocks
    (8 on AVX-512): the direct kernel then runs at half the vector width, the GEMM's micro-kernel
    at full width (SqueezeNet's 512->1000 classifier, 13x13: 0.94 ms direct, 0.56 ms GEMM).
    The GEMM also costs a layout transform on each side when its neighbours are blocked, which
    only deep reductions repay (MobileNet-v2's 144->24 and 24->144 convs lost 13% as GEMMs).
    The half-width rule holds at stride 1 along the width only: there the GEMM's B packing copies
    runs of input columns, at stride 2 it gathers every other element (PP-OCRv6-det's 48->24 3x3
    stride-2 conv on a 320x320 input, 25600 output columns: 3.2 ms as the GEMM at 30% of peak;
    the model 4-5% faster with it direct, interleaved A/B on Zen 5, PP-OCRv3/v4-det unchanged).
    Depthwise and grouped convs stay direct (the GEMM runs them group by group)."""
    if nchwc_reason(node, g, target) is not None:
        return False
    geo = ConvGeometry(node, g)
    if geo.group != 1 or geo.c * geo.ks[0] * geo.ks[1] < GEMM_MIN_REDUCTION:
        return False
    if narrow_row_bound(geo, target):
        return True
    # column pairs run such a conv at full width; they take it when its output channels fit one
    # register tile (at most 4 blocks of 8: each input row is then read once, for every output
    # channel): PP-OCRv6-det's 96->24 3x3 on 160x160, 3.2-4.0 ms as the GEMM, 2.6 ms paired.
    # More channels keep the GEMM: SqueezeNet's 512->1000 classifier on 13x13 ran 18% slower
    # paired (42 oc tiles, each re-reading the input)
    # (the ic-outer order of small planes has no column pairs)
    paired = pairs_available(target, options) and geo.oc <= PAIRS_MAX_OC and not uses_ic_outer(geo)
    return options.gemm_for_half_width and geo.oc % vector_lanes(target) != 0 and geo.strides[1] == 1 and not paired


# half-width output channels that column pairs take instead of the NCHW GEMM (``prefers_gemm``):
# one register tile's worth (4 blocks of 8)
PAIRS_MAX_OC = 32


def pairs_available(target: Target, options: CompileOptions) -> bool:
    """Whether half-width output blocks run as column pairs on this target (``column_pairs``)
    rather than at half the vector width."""
    vx = vector_isa(target)
    return options.conv_column_pairs and vx.vector and vx.has("f32_pair_set1")


def direct_accumulators(geo: ConvGeometry, target: Target, columns: int) -> int:
    """The most accumulators a direct-kernel register tile holds on this conv when a tile row
    spans at most ``columns`` output columns: J output blocks (at most 4, the candidates' bound)
    times R columns, within the target's accumulator budget, at its widest block."""
    blocks = oc_block_choices(geo.oc, target)
    if not blocks:
        return 0
    ocb = geo.oc // blocks[0]
    budget = accumulator_budget(target, blocks[0])
    return max(j * min(columns, budget // j) for j in range(1, min(4, ocb) + 1))


def narrow_row_bound(geo: ConvGeometry, target: Target) -> bool:
    """A conv the direct kernel runs FMA-latency-bound for want of columns, while the GEMM has a
    full panel of them: its register tile spans one output row, and rows this narrow leave fewer
    than ``FMA_CHAINS`` accumulators where a wider row would give them (a plane of width 1:
    magika's 256->512 5x1 conv on [512, 1] gets a 4x1 tile, and ran 1.5x faster as the GEMM,
    interleaved on Zen 4); and at least ``GEMM_MIN_COLUMNS`` output positions per image for the
    GEMM's columns (an SE block's 1x1 plane has none to offer either way, and stays direct)."""
    if geo.outs[0] * geo.outs[1] < GEMM_MIN_COLUMNS:
        return False
    have = direct_accumulators(geo, target, row_width(geo))
    return have < FMA_CHAINS <= direct_accumulators(geo, target, accumulator_budget(target, 0))


def workload(node: Node, g: Graph, in_block: int, threads: int) -> dict:
    """The numbers that define this conv's kernel: the tuning database key."""
    geo = ConvGeometry(node, g)
    return {"n": geo.batch, "c": geo.c, "h": geo.ins[0], "w": geo.ins[1], "oc": geo.oc,
            "kh": geo.ks[0], "kw": geo.ks[1], "sh": geo.strides[0], "sw": geo.strides[1],
            "dh": geo.dils[0], "dw": geo.dils[1], "pt": geo.pb[0], "pl": geo.pb[1],
            "pb": geo.pads[2], "pr": geo.pads[3], "group": geo.group, "ib": in_block, "threads": threads,
            "space": SCHEDULE_SPACE}


# ------------------------------------------------------------------------------------------
# Schedule space and the deterministic default (the cost model)
# ------------------------------------------------------------------------------------------
def _tile_cycles(j: int, r: int) -> float:
    """Cycles per (input channel, kernel tap) of a J x R tile on a 2-FMA-port core: FMA
    throughput, load throughput (J weight loads + R broadcasts, 2 vector loads per cycle) and the FMA
    latency (4 cycles x 2 ports = 8 independent accumulators needed)."""
    return max(j * r / 2.0, (j + r) / 2.0, 4.0)


def schedule_cost(geo: ConvGeometry, s: NchwcSchedule) -> float:
    """Modelled cycles of the whole conv (per input channel and tap) under schedule ``s``."""
    ow = row_width(geo)
    oh = 1 if is_flat_pointwise(geo) else geo.outs[0]
    ocb = geo.oc // s.oc_bn
    col_tiles = math.ceil(ow / s.reg_n)
    oc_tiles = math.ceil(ocb / s.oc_blocks)
    ragged_j = ocb % s.oc_blocks
    full = oc_tiles - (1 if ragged_j else 0)
    per_row = col_tiles * (full * _tile_cycles(s.oc_blocks, s.reg_n)
                           + (_tile_cycles(ragged_j, s.reg_n) if ragged_j else 0.0))
    # half-width vectors do half the work per instruction
    return per_row * oh * (max(NCHWC_BLOCKS) / s.oc_bn)


def uses_ic_outer(geo: ConvGeometry) -> bool:
    """Whether the ic-outer order is in this conv's space: a small output plane (few rows to
    reuse a weight tile over, so streaming the weights from memory once per row dominates) and
    enough input channels to chunk."""
    return (not is_depthwise(geo) and geo.outs[0] * geo.outs[1] <= IC_OUTER_MAX_PLANE
            and geo.cg >= 2 * MIN_IC_CHUNK)


def chunk_weight_bytes(geo: ConvGeometry, s: NchwcSchedule, channels: int) -> int:
    """Bytes of one tile's weights for ``channels`` input channels."""
    return channels * geo.ks[0] * geo.ks[1] * s.oc_blocks * s.oc_bn * 4


def ic_chunk_for(geo: ConvGeometry, s: NchwcSchedule, target: Target) -> int:
    """Input channels per chunk: the most (a power of two, at least ``MIN_IC_CHUNK``) whose
    tile weights fit a third of L1, next to the chunk's input rows and the tile's partial sums."""
    per_channel = chunk_weight_bytes(geo, s, 1)
    c = MIN_IC_CHUNK
    while c * 2 * per_channel <= target.l1d_bytes // 3 and c * 2 <= geo.cg // 2:
        c *= 2
    return c


def candidate_schedules(node: Node, g: Graph, target: Target) -> list[NchwcSchedule]:
    """The local search's space for this conv (every legal point)."""
    geo = ConvGeometry(node, g)
    ow = row_width(geo)
    out = []
    for ob in oc_block_choices(geo.oc, target):
        budget = accumulator_budget(target, ob)
        if is_depthwise(geo):
            for r in range(1, min(ow, budget) + 1):
                out.append(NchwcSchedule(ob, r, 1, True))
            continue
        ocb = (geo.ocg if geo.group > 1 else geo.oc) // ob
        for j in range(1, min(4, ocb) + 1):
            if ocb % j and geo.group > 1:
                continue
            for r in range(1, min(ow, budget // j) + 1):
                for unroll in (True, False):
                    if not unroll and geo.ks[1] == 1:
                        continue
                    s = NchwcSchedule(ob, r, j, unroll)
                    out.append(s)
                    if uses_ic_outer(geo):
                        c = ic_chunk_for(geo, s, target)
                        out += [NchwcSchedule(ob, r, j, unroll, 0, k) for k in sorted({c, 4 * c}) if k < geo.cg]
    return out


def default_schedule(node: Node, g: Graph, target: Target) -> NchwcSchedule:
    """The cost model's best point: no measurement, deterministic, already good."""
    geo = ConvGeometry(node, g)
    cands = [s for s in candidate_schedules(node, g, target) if s.unroll_ker or geo.ks[1] == 1]
    if is_depthwise(geo):
        ow = geo.outs[1]
        ob = cands[0].oc_bn
        # the fewest column tiles, then the widest tile
        return min((s for s in cands if s.oc_bn == ob), key=lambda s: (math.ceil(ow / s.reg_n), -s.reg_n))
    if uses_ic_outer(geo):
        # ic-outer, with chunks whose weights stay in L1 over the rows (at least one input block
        # of 16 must fit half of L1: 2x7, not 4x7, on a 3x3 kernel) ...
        def within(share: float) -> list[NchwcSchedule]:
            return [s for s in cands if s.ic_chunk == ic_chunk_for(geo, s, target)
                    and chunk_weight_bytes(geo, s, MIN_IC_CHUNK) <= target.l1d_bytes * share]
        fits = within(1 / 2)
        # ... or two thirds of it where half leaves too few accumulators to hide the FMA latency
        # (ICLabel's 256->512 4x4 conv on a 4x4 plane: 1 x 4, 59% of peak; 2 x 4 in 32 of 48 KiB:
        # the model 1.12x on Zen 5; ResNet-50's 3x3 stage-4 convs, which have 2 x 7, keep it)
        widest = max(s.oc_bn for s in cands)
        if max((s.oc_blocks * s.reg_n for s in fits if s.oc_bn == widest), default=0) < FMA_CHAINS:
            fits = within(2 / 3) or fits
        if geo.outs[0] == 1:
            # one output row: an ic-outer item is a whole image's tile, and too few of them leave
            # threads idle (a lifted 1-D conv at batch 1: 32 channels, one item); the row-outer
            # order cuts its row into segments instead (``row_segments``)
            fits = [s for s in fits if geo.batch * output_tiles(geo, s) >= ROW_SEGMENT_ITEMS * target.physical_cores]
            cands = fits or [s for s in cands if s.ic_chunk == 0]
        else:
            cands = fits or cands
    else:
        cands = [s for s in cands if s.ic_chunk == 0]
    # ties: the most accumulators (each weight vector and each broadcast feeds more FMAs, so
    # less L2 traffic per FMA), then wide blocks and rows
    return min(cands, key=lambda s: (schedule_cost(geo, s), -s.oc_blocks * s.reg_n, -s.oc_bn, -s.reg_n))


def tuned_schedule(db: TuningDB | None, node: Node, g: Graph, in_block: int, threads: int,
                   target: Target) -> NchwcSchedule | None:
    """The tuning database's record for this conv's workload, if any."""
    if db is None:
        return None
    cfg = db.lookup(CONV_KIND, workload(node, g, in_block, threads), target.key())
    return NchwcSchedule.from_dict(cfg) if cfg else None


def fit(s: NchwcSchedule, geo: ConvGeometry, out_block: int) -> NchwcSchedule:
    """``s`` made legal for the output block the layout pass chose and for this geometry (a
    stale or foreign schedule keeps its tile shape where it can): J divides the group's blocks,
    R is at most a row."""
    if is_depthwise(geo):
        return NchwcSchedule(out_block, max(1, min(s.reg_n, geo.outs[1])), 1, True)
    ocg = geo.ocg if geo.group > 1 else geo.oc
    j = max(1, min(s.oc_blocks, ocg // out_block))
    while geo.group > 1 and (ocg // out_block) % j:
        j -= 1
    return NchwcSchedule(out_block, max(1, min(s.reg_n, row_width(geo))), j, s.unroll_ker, ic_chunk=s.ic_chunk)


# ------------------------------------------------------------------------------------------
# Epilogue capability, Winograd and in-place (after layouts are planned)
# ------------------------------------------------------------------------------------------
def vector_epilogue(node: Node) -> bool:
    """Whether every fused epilogue op of ``node`` has a vector rendering in the NCHWc and
    Winograd kernels (else they store the accumulator and finish element by element in scalar
    code)."""
    return all(isinstance(e, EpilogueBinary) or e.op in ACTIVATIONS for e in node.epilogue)


def winograd_thresholds(target: Target) -> tuple[int, int]:
    """(fewest output positions, fewest input channels) for Winograd by default on ``target``
    (``WINOGRAD_THRESHOLDS`` by its vector registers; the strictest for a count not measured)."""
    strictest = (max(p for p, _ in WINOGRAD_THRESHOLDS.values()), max(c for _, c in WINOGRAD_THRESHOLDS.values()))
    return WINOGRAD_THRESHOLDS.get(vector_isa(target).registers, strictest)


def winograd_choice(node: Node, g: Graph, target: Target, options: CompileOptions) -> str:
    """"" when the conv runs direct, else its Winograd order ("banded" or "phased").

    Legal: 3x3, stride 1, no dilation, no groups, blocks of the target's full vector width in
    and out (16 lanes on AVX-512, 8 on AVX2: the kernels render one vector per block), a vector
    epilogue. Chosen: ``options.winograd`` True and the target's cost thresholds met
    (``winograd_thresholds``: a big enough plane and enough input channels); "always" skips the
    thresholds (tests reach every edge with small shapes); False never."""
    lanes = vector_lanes(target)
    if not options.winograd or lanes not in NCHWC_BLOCKS:
        return ""
    geo = ConvGeometry(node, g)
    ib = layout_block(g.values[node.inputs[0]].layout)
    ob = layout_block(g.values[node.outputs[0]].layout)
    legal = (geo.rank == 2 and geo.group == 1 and geo.ks == [3, 3] and geo.strides == [1, 1]
             and geo.dils == [1, 1] and ib == lanes and ob == lanes
             and geo.c % lanes == 0 and geo.oc % lanes == 0 and vector_epilogue(node))
    if not legal:
        return ""
    min_plane, min_channels = winograd_thresholds(target)
    wins = geo.outs[0] * geo.outs[1] >= min_plane and geo.c >= min_channels
    if options.winograd != "always" and not wins:
        return ""
    if options.winograd_order in ("banded", "phased"):
        return options.winograd_order
    # Never banded when each band would re-read the transformed weights U from memory (VGG-16's
    # 512-channel layers, U 16 MiB of a 32 MiB L3: 3-9% slower banded). Always banded when the
    # phased order's plane-sized V and M buffers (4x the input and output bytes) exceed twice the
    # threads' L2: they go to L3 or memory (a DNSMOS 128->64 conv on 900x161 took 73 ms phased,
    # 26 banded, 47 direct; VGG-16's 64- to 256-channel layers ran 1.2-3.2x faster banded, the
    # model 1.13x; DenseNet-121 and Inception-v3 1.05x; Zen 5, 2 threads). Between, banded when U
    # and a band's buffers fit a quarter of L2 each: there the phased buffers stay in cache and
    # split evenly, where 7 bands of tile rows over 2 threads do not (ResNet-18 was 2-4% slower
    # with its 28x28 and 14x14 layers banded).
    l2 = target.l2_bytes
    u_bytes = 16 * geo.c * geo.oc * 4
    tile_bytes = 16 * (geo.c + geo.oc) * 4  # V and M bytes per transform tile
    tiles = -(-geo.outs[0] // 2) * -(-geo.outs[1] // 2)
    if u_bytes > target.l3_bytes // WINOGRAD_BANDED_MAX_L3_FRACTION:
        return "phased"
    if geo.batch * tiles * tile_bytes > WINOGRAD_PHASED_MAX_L2S * l2 * options.codegen_threads(target):
        return "banded"
    tiles_per_row = -(-geo.outs[1] // 2)
    banded = u_bytes <= l2 // WINOGRAD_BANDED_MAX_WEIGHTS and tile_bytes * tiles_per_row <= l2 // 4
    return "banded" if banded else "phased"


def inplace_residual(node: Node, g: Graph) -> str | None:
    """The residual operand this direct conv may write its output over (codegen/inplace.py
    checks liveness), or None.

    Safe when every output element is finished in one go: row-outer order (ic-outer keeps partial
    sums in y between chunks, which would overwrite the residual before the last chunk reads it)
    and an epilogue with a vector form (the scalar fallback stores the accumulator first, then
    re-reads y and the operand)."""
    out = g.values[node.outputs[0]]
    geo = ConvGeometry(node, g)
    if out.layout == PLAIN or is_depthwise(geo) or uses_ic_outer(geo) or not vector_epilogue(node):
        return None
    for e in node.epilogue:
        src = e.input
        if (isinstance(e, EpilogueBinary) and e.broadcast == "full" and src and src != node.inputs[0]
                and g.values[src].layout == out.layout and g.values[src].shape == out.shape
                and g.values[src].dtype == out.dtype):
            return src
    return None


# ------------------------------------------------------------------------------------------
# The kernels' remaining choices
# ------------------------------------------------------------------------------------------
def ic_outer_blocks(geo: ConvGeometry, s: NchwcSchedule, ib: int) -> int:
    """Input blocks per chunk when tile ``s`` runs ic-outer on ``ib``-channel input blocks, 0
    when it runs row-outer (no chunk, or one chunk covering every input block)."""
    chunk = max(1, s.ic_chunk // ib)
    return chunk if s.ic_chunk > 0 and chunk < geo.cg // ib and not is_depthwise(geo) else 0


def epilogue_after_store(node: Node, inplace_operand: str | None) -> bool:
    """Whether the direct kernel applies ``node``'s epilogue after storing its tile: when the
    epilogue holds an activation of MEMORY_EPILOGUE_OPS. Not when the output may be written over
    a residual operand (the raw sums would overwrite operand values not yet read)."""
    return inplace_operand is None and any(isinstance(e, EpilogueActivation) and e.op in MEMORY_EPILOGUE_OPS
                                           for e in node.epilogue)


def direct_kernel(geo: ConvGeometry, s: NchwcSchedule, ib: int, target: Target,
                  options: CompileOptions, runtime_width: bool = False,
                  after_store: bool = False) -> DirectKernel:
    """The direct kernel's prefetches and work split for tile ``s`` on ``ib``-channel input
    blocks (``DirectKernel``); ``after_store``: ``epilogue_after_store``'s answer."""
    dw = is_depthwise(geo)
    wbytes = geo.oc * geo.cg * geo.ks[0] * geo.ks[1] * 4
    row_split = (options.conv_row_split and not ic_outer_blocks(geo, s, ib) and not dw
                 and wbytes <= target.l2_bytes // ROW_SPLIT_L2_FRACTION)
    return DirectKernel(prefetch_input=options.conv_prefetch_input,
                        prefetch_weights=options.conv_prefetch_weights and not dw and not row_split,
                        weight_distance=WEIGHT_PREFETCH_DISTANCE, row_split=row_split,
                        runtime_width=runtime_width, epilogue_after_store=after_store,
                        prefetch_rows=prefetch_rows(geo, s, ib, target, options),
                        row_segments=row_segments(geo, s, ib, target, options))


def output_tiles(geo: ConvGeometry, s: NchwcSchedule) -> int:
    """The direct kernel's output-channel tiles per image (depthwise: one block each; else
    ``oc_blocks`` blocks per tile within each group)."""
    if is_depthwise(geo):
        return geo.oc // s.oc_bn
    ocg = geo.ocg if geo.group > 1 else geo.oc
    return geo.group * -(-(ocg // s.oc_bn) // s.oc_blocks)


def row_segments(geo: ConvGeometry, s: NchwcSchedule, ib: int, target: Target, options: CompileOptions) -> int:
    """Column segments per output row (``DirectKernel.row_segments``): enough for
    ROW_SEGMENT_ITEMS work items per thread where images x output-channel tiles x rows fall
    short, each of at least ROW_SEGMENT_MIN_TILES register tiles; 1 otherwise. A 1-D conv lifted
    to height 1 (passes/lift_1d.py) at batch 1 has one row: 32 output channels in one tile gave
    one thread all the work. Not for flat 1x1 pseudo-rows (already cut to size) or ic-outer
    kernels (an item is a whole image). With a run-time width (a shape class) the count is
    decided at the decision shapes and each segment's tiles computed at run time."""
    if not options.conv_row_segments or is_flat_pointwise(geo) or ic_outer_blocks(geo, s, ib):
        return 1
    items = geo.batch * output_tiles(geo, s) * geo.outs[0]
    want = -(-ROW_SEGMENT_ITEMS * options.codegen_threads(target) // items)
    most = geo.outs[1] // s.reg_n // ROW_SEGMENT_MIN_TILES
    return max(1, min(want, most))


def prefetch_rows(geo: ConvGeometry, s: NchwcSchedule, ib: int, target: Target, options: CompileOptions) -> bool:
    """Whether the row-outer direct kernel prefetches the next output row's new input rows
    (``DirectKernel.prefetch_rows``): when an image's input exceeds L2 / PREFETCH_ROWS_L2_FRACTION,
    so its rows come from L3 or memory. A 48->24 3x3 stride-2 conv on a 320x320 input (PP-OCRv6-
    det's third) ran at 30% of peak without it, 81% on an 80x80 input; 1.54x faster with it."""
    if not options.conv_prefetch_rows or is_depthwise(geo) or ic_outer_blocks(geo, s, ib):
        return False
    in_bytes = geo.c * geo.ins[0] * geo.ins[1] * 4
    return options.conv_prefetch_rows == "always" or in_bytes > target.l2_bytes // PREFETCH_ROWS_L2_FRACTION


def forced_direct(node: Node, g: Graph, s: NchwcSchedule, target: Target, options: CompileOptions) -> ConvSchedule:
    """A complete "direct" schedule with tile ``s`` (the tuner's measurement graphs, which skip
    the stage): the kernel's other choices as ``finish`` would make them."""
    ib = layout_block(g.values[node.inputs[0]].layout)
    return ConvSchedule("direct", s, "forced", direct=direct_kernel(ConvGeometry(node, g), s, ib, target, options))


def depthwise_kernel(geo: ConvGeometry, target: Target) -> DepthwiseKernel:
    """The NCHW depthwise kernel's threading and register blocking. The register kernels keep
    FMA_CHAINS row vectors in flight (enough to hide the FMA latency, 8 of 32 registers) and
    take planes of up to half the register file as one block: the other half holds the taps in
    flight (a gather's index vector, a stride-2 tap's two loads and its even-lane index)."""
    vx = vector_isa(target)
    macs = geo.batch * geo.oc * geo.ohw * geo.ksp
    return DepthwiseKernel(threaded=macs >= DW_PARALLEL_MIN_MACS, row_vectors=min(FMA_CHAINS, vx.registers // 2),
                           plane_vectors=vx.registers // 2)


def winograd_tile(target: Target) -> tuple[int, int]:
    """The transform-domain GEMM's register tile (J, R): WINOGRAD_BLOCKS output blocks x as many
    transform tiles as the accumulator budget holds (28 accumulators of 32 registers: 2 x 14;
    12 of 16: 2 x 6)."""
    j = WINOGRAD_BLOCKS
    return j, accumulator_budget(target, vector_lanes(target)) // j


def column_pairs(geo: ConvGeometry, s: NchwcSchedule, ib: int, target: Target, options: CompileOptions,
                 runtime_width: bool) -> NchwcSchedule:
    """``s`` with two output columns per vector where its output block is half the vector width
    (8 channels on AVX-512): the half-width kernel did half an FMA's work per instruction
    (PP-OCRv6-det's 24-channel convs ran at 26-43% of peak). Its weights are duplicated into both
    halves, each input tap is a two-scalar broadcast, and the tile keeps its accumulator count
    over twice the columns (3 blocks x 8 columns of 8-lane vectors become 3 x 8 pairs: 16
    columns in 16-lane vectors). Only row-outer,
    fixed-width, non-depthwise tiles; the epilogue runs after the raw store, on half-width
    vectors, so the output is never written over a residual operand."""
    vx = vector_isa(target)
    if (not pairs_available(target, options) or s.oc_bn * 2 != vx.lanes
            or is_depthwise(geo) or ic_outer_blocks(geo, s, ib) or runtime_width):
        return s
    budget = accumulator_budget(target, vx.lanes)
    pairs = max(1, min(budget // s.oc_blocks, s.reg_n))  # the accumulators the half-width tile had
    return replace(s, pairs=True, unroll_ker=True, reg_n=max(1, min(2 * pairs, row_width(geo))))


def finish(node: Node, g: Graph, target: Target, options: CompileOptions) -> None:
    """After layout planning: fix each Conv's algorithm, its tile for the chosen blocks, the
    Winograd order and the in-place operand (``node.schedule`` becomes a ``ConvSchedule``)."""
    out = g.values[node.outputs[0]]
    sched = node.schedule
    if out.layout == PLAIN:
        # conv.py: the NCHW GEMM (or its depthwise kernel); a conv no native kernel takes (the
        # fallback runs it) has no geometry to schedule
        geo = ConvGeometry(node, g) if check_conv(node, g) is None else None
        node.schedule = ConvSchedule("gemm", gemm=gemm_schedule(options, g.shape_generic),
                                     depthwise=depthwise_kernel(geo, target) if geo and geo.is_depthwise else None)
        return
    assert isinstance(sched, ConvSchedule) and sched.tile is not None, f"conv {node.name} blocked without a tile"
    geo = ConvGeometry(node, g)
    tile = fit(sched.tile, geo, layout_block(out.layout))
    order = winograd_choice(node, g, target, options)
    ib = layout_block(g.values[node.inputs[0]].layout)
    if not order and sched.source == "default":  # a tuned tile was measured as it is
        tile = column_pairs(geo, tile, ib, target, options, g.shape_generic)
    # both kernels finish each output element in one go (the Winograd output transform reads
    # the residual element it then writes), so the in-place rule is the same for both; column
    # pairs store raw sums first
    inplace = inplace_residual(node, g) if options.inplace and not tile.pairs else None
    node.schedule = replace(sched, algorithm="winograd" if order else "direct", tile=tile,
                            winograd_order=order, inplace_operand=inplace,
                            direct=None if order else direct_kernel(geo, tile, ib, target, options, g.shape_generic,
                                                                  epilogue_after_store(node, inplace)),
                            winograd_tile=winograd_tile(target) if order else (0, 0),
                            runtime_size=bool(order) and g.shape_generic)
