"""Schedules of the blocked int8 convolution (QLinearConv on NCHW<b>c uint8, int_conv_nchwc.py).

Everything about how such a conv runs is decided here, once, and written on the node as an
``IntConvSchedule``; the template only renders it:
- whether the node runs blocked at all (``int_nchwc_reason``): uint8 input with a constant
  scalar zero point, int8 weights with zero point 0 (symmetric, what static quantizers write),
  constant scales, 2-D, group 1, an ISA with an integer dot product;
- the **dot form**, always exact: VNNI's u8 x s8 quads (``u8s8_dot_acc``, vpdpbusd) where the
  host has it; else, when every weight lies in [-64, 63] (7-bit weights, what quantizers write
  with ``reduce_range`` for CPUs without VNNI: checked on the constant weights here),
  vpmaddubsw + vpmaddwd quads (``u8s7_dot_acc``): vpmaddubsw sums two u8 x s8 products into a
  saturating int16, which 2 * 255 * 64 <= 32767 keeps exact; else int16 pairs
  (``i16_dot_acc``, vpmaddwd, exact for any int8 weights). vpmaddubsw is never used on full-range
  weights, where 2 * 255 * 128 > 32767 would clip silently;
- the **layout block** (the ISA's int32 lanes: 16 on AVX-512, 8 on AVX2) — the layout planner
  names it ``NCHW<b>c`` like the float blocks (same indexing: [N][C/b][H][W][b] bytes);
- the **input block** the kernel reads (``ib``): the producer's block, or for a copied input
  the channels rounded up to the dot's group (4 for quads); a plain input of fewer than 4
  channels (the RGB stem) is instead copied as rows of interleaved channels and each kernel
  row's kw * C (kx, channel) values are read as ceil(kw * C / 4) quads (``kx_packed``: the 7x7
  stem's 21 values in 6 words, not 7 words of 3 channels and a zero);
- whether the input is first **copied** into a zero-point-padded blocked buffer (plain input,
  a block the kernel does not read directly, or padding the kernel does not take itself); a
  padded conv reading its producer's block in quads takes the padding in the kernel instead
  (``pad_in_kernel``: no copy step, see ``edge_tiles``);
- the **register tile** (``nv`` vectors of output channels x ``rw`` output pixels of one row)
  from the register count and a small cost model (``choose_tile``);
- the **fused ReLU** (the ``Max(y, y_zero_point)`` that lower_qdq writes for a Relu before the
  QuantizeLinear; a clamp at the zero point in the epilogue);
- the **fused QLinearClip** (lower_qdq's DQ -> Clip/Relu -> Q, MobileNet's Relu6 between its
  convs): its table's float rule (dequantize the code, clamp, divide by the output scale, round
  half to even, add the zero point, saturate) computed on the code in the conv's vector
  epilogue, so the conv writes the clipped tensor and the 8-bit intermediate never exists;
- the **fused residual add** (``ResidualAdd``: a com.microsoft QLinearAdd of this conv's output
  and an earlier uint8 value of the same shape and layout, ResNet's shortcut join): the conv's
  code, then MLAS's float formula on it and the residual's byte in the epilogue, so the conv's
  own output is never stored and read back (and, where the residual is dead, the result is
  written over it: ``inplace_operand``);
- **depthwise** convs (group = C = OC, one weight channel each) run their own kernel on the same
  layout: one channel per int32 lane, the input bytes zero-extended (``u8_to_i32``) and
  multiplied by int16 weights with the pair dot (``i16_dot_acc``, the high half 0; VNNI's
  vpdpwssd), a row of ``rw`` output pixels per tile, each input column loaded once per kernel
  row and used by every output pixel that reads it (``depthwise_tile``); kernel rows in pairs
  where the ISA forms them (``row_pairs``: one pair dot per two taps), and a padded conv on a
  blocked input pads in its kernel (``pad_in_kernel``: no padded copy, no step before it).

The zero-point compensation (``x_zero * sum(W)`` per output channel) and the requantization
multiplier ``(x_scale * w_scale[o]) / y_scale`` are folded at compile time by the template.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from smelt.codegen.kernels.isa import VectorIsa, vector_isa, with_int_dot
from smelt.ir.graph import Graph, Node
from smelt.target import Target

QUAD, PAIR = 4, 2
# the int32 sum of raw u8 x s8 products stays exact for up to this many products per output
# (255 * 128 * K < 2^31)
MAX_REDUCTION = (1 << 31) // (255 * 128)


# the tile model's constants (``choose_tile``): independent accumulators that hide the dot's
# latency (vpdpbusd: 4-5 cycles at one or two per cycle), and a load's cost in dot products
LATENCY_CHAINS = 4
LOAD_COST = 0.25
# a weight vector's load when one output-channel group's weights (K x nv vectors) do not fit L1:
# every tile streams them from L2 again, so a tile of more pixels per weight vector saves more
# (measured on Zen 4 at 1 thread: ResNet-50's 512-channel 3x3 on 7x7, 4 px x 64 oc 598 us, 7 px
# x 48 oc 508 us; its 256-channel 3x3 on 14x14, 5 px x 64 oc 528 us, 14 px x 32 oc 494 us)
L2_LOAD_COST = 1.0
# a padded conv takes its padding in the kernel (``pad_in_kernel``) when at most this many tiles
# of a row touch a column border: each such tile is its own body (its border pixels' taps
# choose between the input and a zero-point row)
MAX_EDGE_TILES = 4
# ``row_bands`` where the conv's int8 weights are at most this many bytes (every thread then
# reads all of them: cheap for these, a waste for the late layers' large ones) and its output has
# at least ROW_BANDS_MIN_TILES (row, tile) pairs (a band's ragged end then costs little balance):
# MobileNet's convs at 112, 56 and 28 pixels, the ones with the large tensors
ROW_BANDS_MAX_WEIGHTS = 16 << 10
ROW_BANDS_MIN_TILES = 32


@dataclass(frozen=True)
class IntConvGeometry:
    n: int
    c: int
    h: int
    w: int
    oc: int
    kh: int
    kw: int
    oh: int
    ow: int
    sh: int
    sw: int
    dh: int
    dw: int
    pt: int
    pl: int
    pb: int
    pr: int
    group: int = 1  # 1, or C (= OC): depthwise


@dataclass(frozen=True)
class ClipRequant:
    """A QLinearClip fused into the conv's epilogue: y = saturate(round_even(clamp(x_scale *
    (code - x_zero), lo, hi) / y_scale) + y_zero) on the conv's requantized code, in float32 step
    by step as the QLinearClip table is built (qlinear_ops.lookup_table), so equal to it."""

    x_scale: float
    x_zero: int
    lo: float  # -inf / inf where the Clip has no bound (Relu: lo 0, hi inf)
    hi: float
    y_scale: float
    y_zero: int
    # the conv's requantization and this map as one fused multiply-add on r = round(acc * m)
    # (the conv's code before its zero point): min(max(round_even(fma(r, a, b)), t_lo), t_hi),
    # used when it equals the table of (r + y_zero of the conv) on every r whose code the conv
    # can write (checked exhaustively by ``fit_affine``: at most 256 values). Past those codes
    # the map is monotone, so the clamp to the table's extremes is the conv's own clamp (and a
    # fused ReLU's) too: the epilogue drops them, the zero point's add and the division
    # (vdivps: ~5 cycles per vector on Zen 4, more than the dots of a small 1x1 conv)
    affine: tuple[float, float, int, int] | None = None

    def table(self, codes: np.ndarray) -> np.ndarray:
        """The QLinearClip's outputs for uint8 ``codes``, in float32 step by step as its table."""
        f32 = np.float32
        x = (f32(self.x_scale) * (codes.astype(np.int64) - self.x_zero).astype(f32)).astype(f32)
        x = np.minimum(np.maximum(x, f32(self.lo)), f32(self.hi)).astype(f32)
        q = np.rint((x / f32(self.y_scale)).astype(f32)).astype(np.float64) + self.y_zero
        return np.clip(q, 0, 255).astype(np.int64)


def _fma_f32(c: np.ndarray, a: float, b: float) -> np.ndarray | None:
    """fma(c, a, b) rounded once to float32 for integer codes ``c``; None where the float64
    sum is not exact (then rounding it again to float32 could differ from the fused result)."""
    from fractions import Fraction

    exact = c.astype(np.float64) * np.float64(a) + np.float64(b)  # c * a is exact (8 x 24 bits)
    if any(Fraction(float(e)) != Fraction(int(k)) * Fraction(a) + Fraction(b) for k, e in zip(c, exact, strict=True)):
        return None
    return exact.astype(np.float32)


def fit_affine(clip: ClipRequant, conv_zero: int, first_code: int, fma: bool) -> ClipRequant:
    """``clip`` with ``affine`` set when some (a, b) near (x_scale / y_scale, y_zero + (conv_zero
    - x_zero) * x_scale / y_scale) gives the table's value of r + conv_zero for every r whose code
    lies in [first_code, 255] (a fused ReLU raises the first code to the zero point): exact by
    exhaustion, else unchanged (the division form)."""
    if not fma:  # mul then add could be contracted by the compiler, or not: only the fused form is checked
        return clip
    codes = np.arange(first_code, 256)
    want = clip.table(codes)
    r = codes - conv_zero
    t_lo, t_hi = int(want.min()), int(want.max())
    a0 = np.float32(np.float32(clip.x_scale) / np.float32(clip.y_scale))
    b0 = np.float32(np.float64(clip.y_zero) + np.float64(conv_zero - clip.x_zero) * np.float64(a0))
    for da in (0, 1, -1):
        a = np.float32(a0)
        for _ in range(abs(da)):
            a = np.nextafter(a, np.float32(np.inf if da > 0 else -np.inf), dtype=np.float32)
        for db in (0, 1, -1, 2, -2, 3, -3, 4, -4):
            b = np.float32(b0)
            for _ in range(abs(db)):
                b = np.nextafter(b, np.float32(np.inf if db > 0 else -np.inf), dtype=np.float32)
            got = _fma_f32(r, float(a), float(b))
            if got is None:
                continue
            q = np.clip(np.rint(got).astype(np.int64), t_lo, t_hi)
            if np.array_equal(q, want):
                return replace(clip, affine=(float(a), float(b), t_lo, t_hi))
    return clip


@dataclass(frozen=True)
class ResidualAdd:
    """A QLinearAdd (com.microsoft) of the conv's uint8 output and ``residual`` (a uint8 value of
    the same shape, computed before the conv), fused into the epilogue: on the conv's clamped code
    c and the residual's byte r, ``fma(a, ra, fma(b, rb, fixed))`` with (a, b) = (c, r) or (r, c)
    as the add's operands are ordered, rounded half to even and saturated to uint8: onnxruntime's
    (MLAS's AVX2) QLinearAdd, the formula ``templates/qlinear_ops.py`` renders (``add_constants``
    there gives the same three constants: tested)."""

    residual: str
    ra: float  # s_a / s_c
    rb: float  # s_b / s_c
    fixed: float  # z_c - fma(ra, z_a, rb * z_b)
    conv_is_a: bool  # the conv's output is the add's first operand


def add_constants(sa: float, za: int, sb: float, zb: int, sc: float, zc: int) -> tuple[float, float, float]:
    """(ra, rb, fixed) of MLAS's AVX2 QLinearAdd in float32 as onnxruntime forms them (the inner
    fma exact in double: its product is exact there and the sum is rounded once to float)."""
    f32 = np.float32
    ra, rb = f32(f32(sa) / f32(sc)), f32(f32(sb) / f32(sc))
    inner = f32(np.float64(ra) * np.float64(za) + np.float64(f32(rb * f32(zb))))
    return float(ra), float(rb), float(f32(f32(zc) - inner))


@dataclass(frozen=True)
class IntConvSchedule:
    """How one QLinearConv runs on the blocked int8 kernel (see the module docstring)."""

    block: int  # output layout block (= int32 lanes of the ISA's vector)
    group_k: int  # input channels per int32 word: 4 (u8 quads) or 2 (int16 pairs)
    dot: str  # the ISA's dot (``VectorIsa.x``): u8s8_dot_acc, u8s7_dot_acc (quads) or i16_dot_acc (pairs)
    ib: int  # input channels per block of the buffer the kernel reads
    copy_input: bool  # the input is first copied into a zero-point-padded NCHW<ib>c buffer (uint16 for pairs)
    nv: int  # output-channel vectors per register tile
    rw: int  # output pixels (along a row) per register tile
    relu: bool  # Max(y, y_zero_point) fused: clamp at the zero point
    # a 1x1, stride-1, unpadded conv runs over its plane as one row of H * W pixels (the pixels of
    # an NCHW<b>c plane are contiguous): no ragged tile per row (56 = 9 x 6 + 2; 3136 = 522 x 6 + 4)
    flat: bool = False
    depthwise: bool = False  # the depthwise kernel: one channel per lane, group_k 1, nv 1
    # depthwise: kernel rows taken two at a time, one row's input byte in the low int16 of each
    # lane and the next row's in the high one (``u8x2_to_i16_pairs``), against the two rows'
    # weights: one pair dot per two taps (a 3x3: 6 dots per output vector, not 9), for a
    # shuffle per column pair that the widening of one row's bytes already cost
    row_pairs: bool = False
    # the threads split the output by bands of rows (each thread every output-channel group over
    # its band, groups outermost), not by groups: a thread then reads the rows of a block's
    # tensors that it wrote itself, from its own core's L2, from the expand to the depthwise to
    # the project (splitting by groups, a thread reads half of each tensor from the other core)
    row_bands: bool = False
    clip: ClipRequant | None = None  # a QLinearClip fused into the epilogue
    residual: ResidualAdd | None = None  # a QLinearAdd fused into the epilogue (read as input 9)
    # fewer input channels than a quad (the RGB stem): each input row copied with its channels
    # interleaved (ib = C bytes per pixel) and a kernel row's kw * C (kx, channel) values read as
    # ceil(kw * C / 4) quads, instead of kw quads of C channels and 4 - C zeros (the 7x7 stem:
    # 6 words per kernel row, not 7)
    kx_packed: bool = False
    # the residual whose dead buffer the output may take (codegen/inplace.py checks liveness): each
    # output vector is computed from the residual's vector at the same place just before it is stored
    inplace_operand: str | None = None
    # a padded input read in place (no zero-point-padded copy: the copy step cost ResNet-50's
    # 3x3 convs ~5 us each at 1 thread, ~12 at 2, where the copy reads what the other core
    # wrote): rows outside the input read a row of zero-point bytes, and in the tiles of a row
    # that touch a column border (``edge_tiles``) the border pixels read their taps outside
    # it from that row too (the same sums as the padded copy's). The depthwise kernel likewise
    # (a row outside: the zero-point row; in an edge tile a column outside: the zero point's
    # vector instead of a load): MobileNet's 3x3s on its largest tensors
    pad_in_kernel: bool = False
    # while a work item runs, one prefetch (into L2) per word step walks the next output-channel
    # group's weights, each item of a group starting at its own share of them: the group's first
    # items otherwise wait on L3 for weights no hardware prefetcher fetched ahead (ResNet-50 int8
    # streams 25 MB of weights per call; its layer4 3x3s ran at 59% of the vpdpbusd peak)
    prefetch_next: bool = False

    def describe(self) -> str:
        form = {"u8s8_dot_acc": "u8s8 quads", "u8s7_dot_acc": "u8 x 7-bit quads"}.get(self.dot, "int16 pairs")
        if self.depthwise:
            form = "depthwise, u8 widened x int16" + (", kernel rows in pairs" if self.row_pairs else "")
        inb = f"rows of (kx, channel) quads, {self.ib} channels" if self.kx_packed else f"input block {self.ib}"
        copy = " (copied, padded)" if self.copy_input else " (padded in the kernel)" if self.pad_in_kernel else ""
        return (f"{form}, block {self.block}, {inb}{copy}, "
                f"tile {self.rw} px x {self.nv * self.block} oc{', relu' if self.relu else ''}"
                f"{(', clip fused (' + ('fma' if self.clip.affine else 'div') + ')') if self.clip else ''}"
                f"{', residual add fused' if self.residual else ''}{', row bands' if self.row_bands else ''}"
                f"{', next weights prefetched' if self.prefetch_next else ''}")


def int_isa(target: Target) -> VectorIsa:
    """The ISA description the blocked int8 kernel renders for (with VNNI's dots where present)."""
    return with_int_dot(vector_isa(target), target)


def int_block(target: Target) -> int | None:
    """The blocked int8 layout's channel block on ``target`` (None: no blocked int8 kernel)."""
    v = int_isa(target)
    if not v.vector or not all(v.has(k) for k in ("i16_dot_acc", "i32_add", "word_set1", "i32_to_f32")):
        return None
    return v.lanes


def _const(g: Graph, name: str) -> np.ndarray | None:
    if not name or name not in g.values or g.values[name].const is None:
        return None
    return np.asarray(g.values[name].const)


def _dtype(g: Graph, name: str) -> str | None:
    v = g.values.get(name)
    return None if v is None or v.dtype is None else np.dtype(v.dtype).name


def geometry(node: Node, g: Graph) -> IntConvGeometry | str:
    """The conv's shape facts, or why the blocked kernel cannot take it."""
    ins = list(node.inputs) + [""] * 9
    x, w, y = g.values[ins[0]].shape, g.values[ins[3]].shape, g.values[node.outputs[0]].shape
    if x is None or w is None or y is None or len(x) != 4 or len(w) != 4 or len(y) != 4:
        return "2-D only (4-D tensors of known shape)"
    auto_pad = node.attr("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad not in ("NOTSET", "VALID"):
        return f"auto_pad {auto_pad}"
    group = int(node.attr("group", 1))
    if group != 1 and not (group == x[1] == w[0] and w[1] == 1):
        return "grouped convolution (other than depthwise)"
    pads = list(node.attr("pads", [0, 0, 0, 0])) if auto_pad == "NOTSET" else [0, 0, 0, 0]
    (sh, sw), (dh, dw) = list(node.attr("strides", [1, 1])), list(node.attr("dilations", [1, 1]))
    if x[1] != w[1] * group:
        return "channels do not match the weights"
    if w[1] * w[2] * w[3] > MAX_REDUCTION:
        return f"receptive field {w[1] * w[2] * w[3]} could overflow int32"
    return IntConvGeometry(n=int(x[0]), c=int(x[1]), h=int(x[2]), w=int(x[3]), oc=int(w[0]), kh=int(w[2]),
                           kw=int(w[3]), oh=int(y[2]), ow=int(y[3]), sh=int(sh), sw=int(sw), dh=int(dh), dw=int(dw),
                           pt=int(pads[0]), pl=int(pads[1]), pb=int(pads[2]), pr=int(pads[3]), group=group)


def is_flat(geo: IntConvGeometry) -> bool:
    """1x1, stride 1, no padding: output pixel p reads input pixel p."""
    return geo.group == 1 and (geo.kh, geo.kw, geo.sh, geo.sw, geo.pt, geo.pl, geo.pb, geo.pr) == (1, 1, 1, 1, 0, 0, 0, 0)


def flattened(geo: IntConvGeometry) -> IntConvGeometry:
    """``geo`` seen as one row of all its pixels (``is_flat`` convs)."""
    return replace(geo, h=1, w=geo.h * geo.w, oh=1, ow=geo.oh * geo.ow)


def int_nchwc_reason(node: Node, g: Graph, target: Target) -> str | None:
    """None when the blocked int8 kernel can run ``node`` on ``target``, else why not."""
    if node.op != "QLinearConv" or node.domain not in ("", "ai.onnx"):
        return "not a QLinearConv"
    if int_block(target) is None:
        return "no integer dot product on this ISA"
    ins = list(node.inputs) + [""] * 9
    if _dtype(g, ins[0]) != "uint8" or _dtype(g, ins[3]) != "int8":
        return "uint8 input and int8 weights only"
    if _dtype(g, node.outputs[0]) != "uint8":
        return "uint8 output only (what u8 x s8 quantizers write; onnxruntime has no u8-in s8-out kernel)"
    w = _const(g, ins[3])
    if w is None:
        return "weights must be constant"
    wz = _const(g, ins[5])
    if ins[5] and (wz is None or np.any(wz != 0)):
        return "weight zero point must be 0 (symmetric weights)"
    for role, i in (("x scale", 1), ("w scale", 4), ("y scale", 6)):
        s = _const(g, ins[i])
        if s is None or _dtype(g, ins[i]) != "float32":
            return f"{role} must be a float32 constant"
    for role, i in (("x zero point", 2), ("y zero point", 7)):
        if ins[i] and (_const(g, ins[i]) is None or _const(g, ins[i]).size != 1):
            return f"{role} must be a constant scalar"
    if _const(g, ins[1]).size != 1 or _const(g, ins[6]).size != 1 or _const(g, ins[4]).size not in (1, w.shape[0]):
        return "per-tensor activation scales; weight scale per tensor or per output channel"
    if ins[8] and (_const(g, ins[8]) is None or _dtype(g, ins[8]) != "int32"):
        return "the bias must be a constant int32"
    geo = geometry(node, g)
    if isinstance(geo, str):
        return geo
    if not all(g.values[n].is_static for n in (ins[0], node.outputs[0])):
        return "static shapes only"
    return None


def relu_zero_point(node: Node, g: Graph, reader: Node) -> bool:
    """``reader`` is ``Max(y, y_zero_point)`` on this conv's output ``y``: the quantized ReLU
    (exact to fuse as a clamp at the zero point: quantization is monotonic)."""
    ins = list(node.inputs) + [""] * 9
    if reader.op != "Max" or reader.domain not in ("", "ai.onnx") or len(reader.inputs) != 2:
        return False
    if reader.inputs[0] != node.outputs[0] or node.outputs[0] in g.outputs:
        return False
    c, yz = _const(g, reader.inputs[1]), _const(g, ins[7]) if ins[7] else np.zeros(1, np.uint8)
    return (c is not None and c.size == 1 and _dtype(g, reader.inputs[1]) == _dtype(g, node.outputs[0])
            and int(c.reshape(-1)[0]) == int(yz.reshape(-1)[0]))


def clip_requant(y: str, g: Graph, reader: Node) -> ClipRequant | None:
    """``reader`` is smelt's QLinearClip (passes/lower_qdq.py) of the uint8 value ``y`` into
    uint8 with constant scalar parameters: the epilogue computes it (``ClipRequant``)."""
    if reader.op != "QLinearClip" or reader.domain != "ai.smelt" or len(reader.inputs) != 5:
        return None
    if reader.inputs[0] != y or y in g.outputs or _dtype(g, y) != "uint8" or _dtype(g, reader.outputs[0]) != "uint8":
        return None
    params = [_const(g, n) for n in reader.inputs[1:]]
    if any(p is None or p.size != 1 for p in params):
        return None
    xs, xz, ys, yz = (p.reshape(-1)[0] for p in params)  # type: ignore[union-attr]
    if np.asarray(xs).dtype != np.float32 or np.asarray(ys).dtype != np.float32:
        return None
    return ClipRequant(x_scale=float(xs), x_zero=int(xz), lo=float(np.float32(reader.attr("min", -np.inf))),
                       hi=float(np.float32(reader.attr("max", np.inf))), y_scale=float(ys), y_zero=int(yz))


def residual_add(y: str, g: Graph, reader: Node, available: set[str], fma: bool) -> ResidualAdd | None:
    """``reader`` is a QLinearAdd of ``y`` (the conv's uint8 output, read by nothing else) and a
    uint8 value of the same shape in ``available`` (computed before the conv runs), with
    constant scalar float32 scales and zero points: the epilogue computes it (``ResidualAdd``).
    Only with a fused multiply-add (the formula's two roundings are fma's) and where every value
    the formula can give converts to int32 exactly (then the saturating stores clamp it)."""
    if not fma or reader.op != "QLinearAdd" or reader.domain != "com.microsoft" or y in g.outputs:
        return None
    ins = list(reader.inputs) + [""] * 8
    if (ins[0] == y) == (ins[3] == y) or not ins[6]:  # exactly one operand is the conv's (not y + y)
        return None
    other = ins[3] if ins[0] == y else ins[0]
    out = reader.outputs[0]
    if other not in available:
        return None
    if any(_dtype(g, v) != "uint8" for v in (y, other, out)) or not (
            g.values[other].shape == g.values[y].shape == g.values[out].shape):
        return None
    params = []
    for si, zi in ((1, 2), (4, 5), (6, 7)):
        s = _const(g, ins[si])
        z = _const(g, ins[zi]) if ins[zi] else np.zeros(1, np.uint8)
        if s is None or s.size != 1 or _dtype(g, ins[si]) != "float32" or z is None or z.size != 1:
            return None
        params += [float(s.reshape(-1)[0]), int(z.reshape(-1)[0])]
    ra, rb, fixed = add_constants(*params)
    if not all(np.isfinite((ra, rb, fixed))) or 255.0 * (abs(ra) + abs(rb)) + abs(fixed) >= 2.0**30:
        return None
    return ResidualAdd(residual=other, ra=ra, rb=rb, fixed=fixed, conv_is_a=ins[0] == y)


def choose_tile(geo: IntConvGeometry, lanes: int, registers: int, l1_bytes: int = 32 << 10,
                weight_bytes: int = 1) -> tuple[int, int]:
    """(nv, rw): output-channel vectors and output pixels per register tile. All nv * rw
    accumulators, nv weight vectors and one broadcast fit the registers; among those, the least
    modelled time per output row and input word: dot products (output channels padded to
    nv * lanes; a tile of fewer than ``LATENCY_CHAINS`` accumulators waits on the dot's latency)
    plus ``LOAD_COST`` per load (nv weight vectors and one broadcast per pixel), a weight
    vector's ``L2_LOAD_COST`` when a group's weights (``weight_bytes`` each) exceed ``l1_bytes``."""
    best: tuple[float, int, int] | None = None
    oc_vectors = -(-geo.oc // lanes)
    for nv in range(1, 5):
        if nv > oc_vectors:
            break
        groups = -(-oc_vectors // nv)
        streamed = geo.c * geo.kh * geo.kw * nv * lanes * weight_bytes > l1_bytes
        w_cost = L2_LOAD_COST if streamed else LOAD_COST
        rw_max = min((registers - nv - 1) // nv, geo.ow)
        for rw in range(1, rw_max + 1):
            full, rem = divmod(geo.ow, rw)
            cost = 0.0
            for count, width in ((full, rw), (1 if rem else 0, rem)):
                cost += count * (max(nv * width, LATENCY_CHAINS) + w_cost * nv + LOAD_COST * width)
            cost *= groups
            if best is None or cost < best[0] - 1e-9:
                best = (cost, nv, rw)
    assert best is not None
    return best[1], best[2]


def edge_tiles(geo: IntConvGeometry, rw: int) -> list[int]:
    """The tiles of ``rw`` output pixels along a row (``ow`` pixels, the last tile ragged) that
    read a column outside the input: a tap kx of output pixel ox reads column
    ox * sw + kx * dw - pl."""
    out = []
    for t in range(-(-geo.ow // rw)):
        first, last = t * rw, min(geo.ow, (t + 1) * rw) - 1
        if first * geo.sw - geo.pl < 0 or last * geo.sw + (geo.kw - 1) * geo.dw - geo.pl >= geo.w:
            out.append(t)
    return out


def depthwise_tile(geo: IntConvGeometry, registers: int) -> int:
    """rw: output pixels of a row per depthwise tile. Per kernel row the tile loads the
    (rw - 1) * stride + kw input columns it spans once each and runs kw * rw dots; more pixels
    load fewer columns per pixel, up to half the registers as accumulators (the kernel's kh * kw
    weight vectors then stay in registers on AVX-512; AVX2 reads them as memory operands). Among
    those, the least modelled time over the row, ragged last tile included."""
    best: tuple[float, int] | None = None
    span = (geo.kw - 1) * geo.dw + 1
    for rw in range(1, min(geo.ow, registers // 2) + 1):
        full, rem = divmod(geo.ow, rw)
        cost = 0.0
        for count, width in ((full, rw), (1 if rem else 0, rem)):
            loads = geo.kh * ((width - 1) * geo.sw + span)
            cost += count * (max(geo.kh * geo.kw * width, LATENCY_CHAINS) + LOAD_COST * 4 * loads)
        if best is None or cost < best[0] - 1e-9:
            best = (cost, rw)
    assert best is not None
    return best[1]


def int_conv_schedule(node: Node, g: Graph, target: Target, in_block: int, relu: bool,
                      clip: ClipRequant | None = None, residual: ResidualAdd | None = None,
                      inplace: bool = False, pad_in_kernel: bool = True,
                      prefetch_weights: bool = True) -> IntConvSchedule:
    """The schedule of ``node`` (``int_nchwc_reason`` is None) reading an input in the layout
    of block ``in_block`` (1: plain). ``pad_in_kernel``: a padded input in the kernel's own
    block may be read in place (``IntConvSchedule.pad_in_kernel``); ``prefetch_weights``: the
    next output-channel group's weights may be prefetched (``IntConvSchedule.prefetch_next``)."""
    geo = geometry(node, g)
    assert isinstance(geo, IntConvGeometry)
    v = int_isa(target)
    block = v.lanes
    padded = any((geo.pt, geo.pl, geo.pb, geo.pr))
    if clip is not None:
        yz_c = _const(g, node.inputs[7]) if len(node.inputs) > 7 and node.inputs[7] else None
        yz = int(yz_c.reshape(-1)[0]) if yz_c is not None else 0
        clip = fit_affine(clip, yz, yz if relu else 0, v.fma)
    if geo.group > 1:
        # one channel per lane: the kernel reads the NCHW<block>c bytes as they are (a copy pads
        # them, or blocks a plain input with channels past C at 0)
        in_kernel = pad_in_kernel and padded and in_block == block
        return IntConvSchedule(block=block, group_k=1, dot="i16_dot_acc", ib=block, pad_in_kernel=in_kernel,
                               copy_input=(padded and not in_kernel) or in_block != block, nv=1,
                               rw=depthwise_tile(geo, v.registers),
                               relu=relu, depthwise=True, clip=clip,
                               row_pairs=geo.kh >= 2 and v.has("u8x2_to_i16_pairs"),
                               row_bands=_row_bands(geo, depthwise_tile(geo, v.registers)))
    w = _const(g, node.inputs[3])
    if v.has("u8s8_dot_acc"):
        dot = "u8s8_dot_acc"
    elif v.has("u8s7_dot_acc") and w is not None and int(w.min()) >= -64 and int(w.max()) <= 63:
        dot = "u8s7_dot_acc"  # vpmaddubsw cannot saturate on these weights (checked here, on the constants)
    else:
        dot = "i16_dot_acc"
    group_k = PAIR if dot == "i16_dot_acc" else QUAD
    # the pair form always reads a copy, widened to uint16: one 32-bit broadcast is then a pair
    # (bytes would need a broadcast and a zero-extension per pixel and word)
    direct = in_block == block and not padded and group_k == QUAD
    readable = in_block == block and group_k == QUAD  # the producer's bytes as the kernel reads them
    ib = block if direct else min(block, -(-geo.c // group_k) * group_k)
    flat = is_flat(geo)
    packed = group_k == QUAD and geo.c < QUAD and geo.kw > 1 and geo.dw == 1 and in_block == 1
    if packed:  # the kernel sees one quad-padded row of kw * C values per kernel row
        ib = geo.c
        tiled = replace(geo, c=-(-geo.kw * geo.c // QUAD) * QUAD, kw=1)
    else:
        tiled = flattened(geo) if flat else geo
    nv, rw = choose_tile(tiled, block, v.registers, target.l1d_bytes or 32 << 10, 1 if group_k == QUAD else 2)
    in_kernel = (pad_in_kernel and readable and padded and not flat and not packed
                 and len(edge_tiles(geo, rw)) <= MAX_EDGE_TILES)
    # over the residual's buffer only where the conv does not read it: its own input would be
    # overwritten while other tiles still read it
    over = residual.residual if residual is not None and inplace and residual.residual != node.inputs[0] else None
    groups = -(-geo.oc // (nv * block))
    return IntConvSchedule(block=block, group_k=group_k, dot=dot, ib=ib, copy_input=not (direct or in_kernel), nv=nv,
                           rw=rw, relu=relu, flat=flat, clip=clip, residual=residual, inplace_operand=over,
                           kx_packed=packed, pad_in_kernel=in_kernel, row_bands=_row_bands(tiled, rw),
                           prefetch_next=prefetch_weights and groups > 1)


def _row_bands(geo: IntConvGeometry, rw: int) -> bool:
    """Whether the threads split ``geo`` (as the kernel tiles it) by bands of rows (``row_bands``)."""
    return (geo.oc * (geo.c // geo.group) * geo.kh * geo.kw <= ROW_BANDS_MAX_WEIGHTS
            and geo.oh * -(-geo.ow // rw) >= ROW_BANDS_MIN_TILES)
