"""Depth-first fusion of a depthwise conv into the 1x1 conv that reads it (BrainSlug's idea on
MobileNet's inverted-residual blocks), decided after layouts and conv schedules are fixed.

A blocked depthwise Conv whose only reader is a blocked 1x1 Conv (stride 1, no padding, no
groups, reading the depthwise output in its layout) becomes one node, ``DwPwConv`` (smelt's
domain, rendered by ``templates/dw_pw_conv.py``): each work item computes the depthwise rows of a
*band* of output rows, every channel, into a per-thread buffer, and at once runs the 1x1 over that
band. The depthwise output (MobileNet-v2's expanded x6 tensor: 1.8 MiB at 56x56x144) is never
written to memory and read back: a band stays in L1/L2 between the two convs. The depthwise
node's fused activation (Clip/Relu) and bias are applied in registers before the band buffer; the
1x1's epilogue (bias, residual add, activation) as in its own kernel.

The decision (``DwPwSchedule``): the band height (the buffer fits ``BAND_L2_FRACTION`` of L2; of
those heights the one whose static split gives the busiest thread the fewest rows,
``balanced_band``), how many output-channel parts each band's 1x1 is split into when there are
fewer bands than threads (each thread recomputing the cheap depthwise band), and the register
tiles: the 1x1's tile is the one the conv schedule chose for
the 1x1 alone (``ConvSchedule.tile``), the depthwise tile's columns the depthwise conv's. A 1x1 scheduled ic-outer (small planes) keeps its tile shape, not its
order: the fused kernel accumulates all input channels in registers (the band is its whole
input, already in L1/L2; each output-channel part's weights are read by one thread only).
"""

from __future__ import annotations

from dataclasses import dataclass

from smelt.codegen.kernels.conv_geometry import ConvGeometry, is_depthwise
from smelt.codegen.kernels.epilogue import ACTIVATIONS
from smelt.codegen.kernels.isa import vector_isa
from smelt.codegen.registry import SMELT_DOMAIN
from smelt.ir.epilogue import EpilogueBinary
from smelt.ir.graph import PLAIN, Graph, Node, layout_block
from smelt.options import CompileOptions
from smelt.schedule.conv import ConvSchedule, vector_epilogue
from smelt.target import Target

FUSED_OP = "DwPwConv"
# the band buffer (every channel of the depthwise output for the band's rows) fits L2 / this,
# next to the 1x1's weights and the band's input rows
BAND_L2_FRACTION = 8
# pairs whose depthwise output fits L2 / this are left separate: the tensor stays in L2 between
# the convs anyway, and the separate 1x1 keeps its ic-outer weight reuse (MobileNet-v2's 7x7
# blocks, 188 KiB: 14% slower fused at AVX2, 1 thread, Zen 4; 2% faster at AVX-512)
SMALL_L2_FRACTION = 4
# with the expand conv fused too: the band buffer and the expand's ring of rows fit L2 / this
EXPAND_L2_FRACTION = 4
# the expand conv is fused only when the input rows its threads compute twice (each thread's
# first band recomputes the rows the previous thread's last band also needed) stay below this
# fraction of its rows: a 7x7 plane split over 2 threads recomputes 2 of 7 rows
MAX_EXPAND_RECOMPUTE = 1.0
# work items per thread wanted (bands x output-channel parts): fewer bands than threads (a plane
# of one row) split the 1x1 over output-channel parts (bands are balanced by rows already)
ITEMS_PER_THREAD = 1


@dataclass(frozen=True)
class DwPwSchedule:
    """How one fused depthwise -> 1x1 node runs (``node.schedule`` of a ``DwPwConv``)."""

    ib: int  # channel block of the input and of the depthwise output (one vector)
    ob: int  # the 1x1's output block (one vector)
    band_rows: int  # output rows per band
    oc_parts: int  # work items per band, each a contiguous run of the 1x1's output-channel tiles
    dw_cols: int  # depthwise register tile: output columns per tile
    pw_blocks: int  # 1x1 register tile: output-channel blocks (J)
    pw_cols: int  # 1x1 register tile: positions of the band (R)
    threads: int  # threads the work split was sized for
    # the expand 1x1 conv before the depthwise, fused too (0: none): its input block, its
    # register tile (J output blocks x R columns of an input row) and the rows of the ring
    # buffer that holds its output rows for the depthwise ((band_rows - 1) x stride + kernel)
    ex_ib: int = 0
    ex_blocks: int = 0
    ex_cols: int = 0
    ring_rows: int = 0


def dw_epilogue_ok(dw: Node) -> bool:
    """The depthwise node's fused chain is activations only (no operand to read: the band buffer
    holds no other value's layout)."""
    return all(not isinstance(e, EpilogueBinary) and e.op in ACTIVATIONS and not e.input for e in dw.epilogue)


def fusable(dw: Node, pw: Node, g: Graph, target: Target, always: bool = False) -> str | None:
    """None when ``dw`` -> ``pw`` can run fused, else why not (``always``: also when the
    depthwise output is small, ``dw_pw_fusion="always"``: tests reach every edge with small
    shapes)."""
    if not (isinstance(dw.schedule, ConvSchedule) and dw.schedule.algorithm == "direct"
            and isinstance(pw.schedule, ConvSchedule) and pw.schedule.algorithm == "direct"):
        return "both convs must run as NCHWc direct kernels"
    if dw.schedule.tile is None or pw.schedule.tile is None:
        return "no NCHWc tile"
    gd, gp = ConvGeometry(dw, g), ConvGeometry(pw, g)
    if not is_depthwise(gd) or gd.oc != gd.c or gd.rank != 2 or gd.dils != [1, 1] or gd.batch != gp.batch:
        return "not a 2-D undilated depthwise conv (one output channel per input channel)"
    if gp.ks != [1, 1] or gp.strides != [1, 1] or any(gp.pads) or gp.group != 1 or gp.dils != [1, 1]:
        return "the reader is not a plain 1x1 conv"
    y = dw.outputs[0]
    if pw.inputs[0] != y or y in g.outputs or any(e.input == y for e in pw.epilogue):
        return "the depthwise output is read elsewhere"
    lay = g.values[y].layout
    if lay == PLAIN or g.values[dw.inputs[0]].layout != lay or g.values[pw.outputs[0]].layout == PLAIN:
        return "layouts are not blocked"
    if not dw_epilogue_ok(dw) or not vector_epilogue(pw):
        return "an epilogue op without a vector form"
    # per image: the work splits by images before rows, and one image's tensor is what a thread's
    # L2 holds between the separate convs
    if not always and gd.oc * gd.ohw * 4 <= target.l2_bytes // SMALL_L2_FRACTION:
        return "the depthwise output fits L2 (nothing to save)"
    return None


def balanced_band(oh: int, batch: int, max_band: int, threads: int) -> int:
    """Band height (at most ``max_band``, at least 1) whose static split of (image, band) items
    over ``threads`` gives the busiest thread the fewest output rows; ties: the tallest band
    (fewer bands, fewer partial 1x1 tiles). 14 rows on 2 threads: bands of 7 or 1 (7 rows
    each), not 4 (8 and 6)."""
    best, best_key = 1, None
    for b in range(1, max(1, min(oh, max_band)) + 1):
        nb = -(-oh // b)
        total = batch * nb
        worst = 0
        for t in range(max(1, threads)):
            lo, hi = total * t // threads, total * (t + 1) // threads
            worst = max(worst, sum(min(b, oh - (i % nb) * b) for i in range(lo, hi)))
        key = (worst, -b)
        if best_key is None or key < best_key:
            best, best_key = b, key
    return best


def dw_pw_schedule(dw: Node, pw: Node, g: Graph, target: Target, threads: int) -> DwPwSchedule:
    """Band height, output-channel parts and register tiles (see the module docstring)."""
    gd = ConvGeometry(dw, g)
    oh, ow = gd.outs
    ib = layout_block(g.values[dw.outputs[0]].layout)
    ob = layout_block(g.values[pw.outputs[0]].layout)
    row_bytes = gd.c * ow * 4
    band = balanced_band(oh, gd.batch, target.l2_bytes // BAND_L2_FRACTION // row_bytes, threads)
    bands = gd.batch * -(-oh // band)
    want = ITEMS_PER_THREAD * max(1, threads)
    pt = pw.schedule.tile
    ocb = int(g.values[pw.outputs[0]].shape[1]) // ob
    tiles = -(-ocb // pt.oc_blocks)
    parts = max(1, min(tiles, -(-want // bands)))
    regs = vector_isa(target).registers
    # depthwise: the schedule's columns within the accumulator budget (a weight and an input
    # vector in flight beside them)
    dw_cols = max(1, min(dw.schedule.tile.reg_n, ow, regs - 4))
    pw_cols = max(1, min(pt.reg_n, band * ow))
    return DwPwSchedule(ib, ob, band, parts, dw_cols, pt.oc_blocks, pw_cols, threads)


def expand_fusable(ex: Node, fused: Node, g: Graph) -> str | None:
    """None when the 1x1 ``ex`` (MobileNet-v2's expand conv) can run inside ``fused`` (a
    ``DwPwConv`` reading its output), computing its output rows into a ring buffer as the bands
    need them, else why not."""
    s = fused.schedule
    if not (isinstance(ex.schedule, ConvSchedule) and ex.schedule.algorithm == "direct" and ex.schedule.tile):
        return "the expand conv is not an NCHWc direct conv"
    ge = ConvGeometry(ex, g)
    if ge.ks != [1, 1] or ge.strides != [1, 1] or any(ge.pads) or ge.group != 1 or ge.rank != 2:
        return "not a plain 1x1 conv"
    y = ex.outputs[0]
    if fused.inputs[0] != y or y in g.outputs or g.values[y].layout == PLAIN:
        return "its output is read elsewhere"
    if layout_block(g.values[y].layout) != s.ib:  # (its input may be plain: a block of 1)
        return "layouts"
    if not dw_epilogue_ok(ex):
        return "an epilogue op with an operand"
    if s.oc_parts != 1:  # each thread would compute the whole expand of a band
        return "the band's 1x1 is split over threads"
    return None


def expand_recompute(s: DwPwSchedule, gd: ConvGeometry) -> float:
    """The fraction of the expand's rows computed twice under ``s``'s static split of bands over
    ``s.threads`` threads (each thread's ring starts empty)."""
    oh, ih = gd.outs[0], gd.ins[0]
    nb = -(-oh // s.band_rows)
    total = gd.batch * nb
    rows = 0
    for t in range(max(1, s.threads)):
        lo, hi = total * t // s.threads, total * (t + 1) // s.threads
        for n in {b // nb for b in range(lo, hi)}:  # per image of the thread's range
            bands = [b % nb for b in range(lo, hi) if b // nb == n]
            first, last = min(bands) * s.band_rows, min(oh, (max(bands) + 1) * s.band_rows) - 1
            rows += min(ih, last * gd.strides[0] - gd.pb[0] + gd.ks[0]) - max(0, first * gd.strides[0] - gd.pb[0])
    return rows / (gd.batch * ih) - 1.0


def with_expand(s: DwPwSchedule, ex: Node, fused: Node, g: Graph, target: Target) -> DwPwSchedule | None:
    """``s`` with the expand conv ``ex`` fused: the band shrinks until the band buffer and the
    ring of expanded rows fit L2 / EXPAND_L2_FRACTION (at least one row). None when the threads
    would recompute more than MAX_EXPAND_RECOMPUTE of the expand's rows."""
    gd = ConvGeometry(Node("Conv", "", [ex.outputs[0], fused.inputs[1]], [""], attrs=fused.attrs["dw_attrs"]), g)
    oh, ow = gd.outs
    iw = gd.ins[1]
    band = s.band_rows

    def ring(b: int) -> int:
        return min(gd.ins[0], (b - 1) * gd.strides[0] + gd.ks[0])

    fit = band
    while fit > 1 and (fit * ow + ring(fit) * iw) * gd.c * 4 > target.l2_bytes // EXPAND_L2_FRACTION:
        fit -= 1
    band = balanced_band(oh, gd.batch, fit, s.threads)
    et = ex.schedule.tile
    out = DwPwSchedule(s.ib, s.ob, band, 1, s.dw_cols, s.pw_blocks, max(1, min(s.pw_cols, band * ow)), s.threads,
                        ex_ib=layout_block(g.values[ex.inputs[0]].layout), ex_blocks=et.oc_blocks,
                        ex_cols=max(1, min(et.reg_n, iw)), ring_rows=ring(band))
    return out if expand_recompute(out, gd) <= MAX_EXPAND_RECOMPUTE else None


def fuse_dw_pw(g: Graph, target: Target, options: CompileOptions) -> Graph:
    """Replace each fusable depthwise -> 1x1 pair by one ``DwPwConv`` node (after
    ``schedule.conv.finish``). Inputs: x, the depthwise weights and bias, the 1x1's weights and
    bias ("" when absent); the 1x1's epilogue stays the node's epilogue; the depthwise node's
    attributes and activation chain are kept in the attributes ``dw_attrs`` / ``dw_epilogue``."""
    if not options.dw_pw_fusion or g.shape_generic:
        return g
    consumers, producers = g.consumers(), g.producers()
    threads = options.codegen_threads(target)
    fused: dict[str, Node] = {}  # pw name -> fused node
    drop: set[str] = set()
    for dw in g.nodes:
        if dw.op != "Conv" or dw.domain not in ("", "ai.onnx") or dw.name in options.force_fallback:
            continue
        readers = consumers.get(dw.outputs[0], [])
        if len(readers) != 1:
            continue
        pw = readers[0]
        if pw.op != "Conv" or pw.domain not in ("", "ai.onnx") or pw.name in options.force_fallback:
            continue
        if fusable(dw, pw, g, target, options.dw_pw_fusion == "always") is not None:
            continue
        node = Node(FUSED_OP, f"{dw.name}+{pw.name}",
                    [dw.inputs[0], dw.inputs[1], dw.inputs[2] if len(dw.inputs) > 2 else "",
                     pw.inputs[1], pw.inputs[2] if len(pw.inputs) > 2 else ""],
                    list(pw.outputs), attrs={"dw_attrs": dict(dw.attrs), "dw_epilogue": list(dw.epilogue)},
                    domain=SMELT_DOMAIN, epilogue=list(pw.epilogue),
                    schedule=dw_pw_schedule(dw, pw, g, target, threads))
        fused[pw.name] = node
        drop.add(dw.name)
    # the expand 1x1 before each fused pair, when its only reader is the pair
    for node in fused.values():
        producer = producers.get(node.inputs[0])
        # (a 1x1 that is itself the project conv of an earlier fused pair stays there: PP-LCNet's
        # dw -> pw -> dw -> pw chains, where taking it as the next pair's expand lost that pair)
        if (producer is None or producer.op != "Conv" or producer.domain not in ("", "ai.onnx")
                or producer.name in options.force_fallback or producer.name in fused or producer.name in drop
                or len(consumers.get(node.inputs[0], [])) != 1):
            continue
        if not options.expand_fusion or expand_fusable(producer, node, g) is not None:
            continue
        sched = with_expand(node.schedule, producer, node, g, target)
        if sched is None:
            continue
        node.schedule = sched
        node.name = f"{producer.name}+{node.name}"
        node.inputs = [producer.inputs[0], *node.inputs[1:],
                       producer.inputs[1], producer.inputs[2] if len(producer.inputs) > 2 else ""]
        node.attrs["ex_epilogue"] = list(producer.epilogue)
        drop.add(producer.name)
    # the fused-away outputs no longer exist (after every pair was tested)
    for n in g.nodes:
        if n.name in drop:
            g.values.pop(n.outputs[0], None)
    if fused:
        g.nodes = [fused.get(n.name, n) for n in g.nodes if n.name not in drop]
    return g
