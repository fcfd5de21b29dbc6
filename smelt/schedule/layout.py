"""Layout planning (NeoCPU §3.2-3.3): blocked NCHW<b>c layouts flow between convolutions, and a
``LayoutTransform`` node appears only where a consumer cannot take its producer's layout.

Needs: shapes inferred, epilogues fused, a target. Guarantees: graph inputs and outputs stay
plain; every value a node reads is in a layout some native template of that node accepts (the
templates' ``check`` is the single source of truth: the pass asks the registry, it never
special-cases ops); a node forced to fall back reads only plain values; weights are not touched
here (the NCHWc template re-lays them out at compile time).

Modes (NeoCPU's Table 3 ablation):
- ``nchw``: no blocked layouts (the NCHW GEMM/im2col convolutions).
- ``conv``: layout-optimized convolutions only: every NCHWc conv transforms its input from plain
  and its output back to plain (a transform pair around each conv).
- ``propagate`` (default): transform elimination: blocked values flow through every op whose
  template accepts them (pooling, concat on channels, element-wise, BatchNorm); transforms only
  at the boundary of layout-dependent ops.
- ``global``: as ``propagate``, with each conv's schedule (and wanted input block) chosen by the
  global search (``smelt.schedule.layout_search``, run by ``compiler.lower``), passed in as
  ``schedules``: its ``oc_bn`` is the output block the search picked and its ``ic_bn`` the input
  block, converted to here when it differs from the producer's.

Each NCHWc conv gets ``node.schedule = ConvSchedule("direct", tile, source)``; its tile comes
from ``schedules(node, g, in_block)`` (the global search's pick, or the tuning database) or the
cost model's default; ``schedule.conv.finish`` fits it and decides the rest afterwards.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from smelt.codegen.kernels.conv_geometry import ConvGeometry, is_depthwise
from smelt.codegen.registry import SMELT_DOMAIN, find_template
from smelt.ir.graph import PLAIN, Graph, Node, Value, blocked_layout, layout_block
from smelt.options import LAYOUT_MODES as MODES  # noqa: F401 (the modes, named where layouts are planned)
from smelt.options import CompileOptions
from smelt.schedule.conv import (
    NCHWC_BLOCKS,
    ConvSchedule,
    NchwcSchedule,
    default_schedule,
    nchwc_reason,
    prefers_gemm,
    vector_lanes,
)
from smelt.schedule.int_conv import (
    clip_requant,
    int_block,
    int_conv_schedule,
    int_isa,
    int_nchwc_reason,
    relu_zero_point,
    residual_add,
)
from smelt.target import Target

# dtypes a value may be blocked in: float32, and the 8-bit activations between blocked int8
# convolutions (``int_block``'s layout, same NCHW<b>c indexing, one byte per element)
BLOCKED_DTYPES = ("float32", "uint8", "int8")

# a conv whose input arrives plain with whole blocks of channels converts it to blocks first
# when its plane has at least PLAIN_INPUT_MIN_PLANE positions and its tile would read at least
# PLAIN_INPUT_MIN_ROWS input rows (channels x kernel rows) as 1-channel blocks
# (``conv_block_plain_input``)
PLAIN_INPUT_MIN_PLANE = 64
PLAIN_INPUT_MIN_ROWS = 64

# a conv's tile for the input block that arrives, and where it came from ("forced", "tuned"), or None
ScheduleFn = Callable[[Node, Graph, int], "tuple[NchwcSchedule, str] | None"]


class _Planner:
    def __init__(self, g: Graph, target: Target, options: CompileOptions, schedules: ScheduleFn | None) -> None:
        self.g, self.target, self.mode = g, target, options.layout
        self.options = options
        self.force_fallback = options.force_fallback
        self.schedules = schedules
        self.out: list[Node] = []
        self.converted: dict[tuple[str, str], str] = {}
        self.pending: list[tuple[tuple[str, str], Node, Value]] = []
        self.consumers = g.consumers()
        self.skip: set[str] = set()  # nodes fused away while planning (a quantized ReLU's Max)

    # -- transforms --------------------------------------------------------------------
    def convert(self, name: str, layout: str) -> str:
        """The name of ``name``'s data in ``layout`` (a staged LayoutTransform if needed)."""
        v = self.g.values[name]
        if v.layout == layout or v.const is not None:
            return name
        key = (name, layout)
        if key in self.converted:
            return self.converted[key]
        for k, node, _ in self.pending:
            if k == key:
                return node.outputs[0]
        new = self.g.fresh_name(f"{name}__{layout}")
        val = Value(new, v.dtype, v.shape, layout=layout)
        node = Node("LayoutTransform", self.g.fresh_name("layout_transform"), [name], [new],
                    attrs={"src": v.layout, "dst": layout}, domain=SMELT_DOMAIN)
        self.g.add_value(val)  # visible to the templates' checks; removed again on rollback
        self.pending.append((key, node, val))
        return new

    def commit(self) -> None:
        for key, node, _ in self.pending:
            self.converted[key] = node.outputs[0]
            self.out.append(node)
        self.pending.clear()

    def rollback(self) -> None:
        for _, _, val in self.pending:
            self.g.values.pop(val.name, None)
        self.pending.clear()

    def can_block(self, name: str, layout: str) -> bool:
        v = self.g.values[name]
        return (v.shape is not None and len(v.shape) == 4 and v.is_static and v.const is None
                and v.dtype is not None and np.dtype(v.dtype).name in BLOCKED_DTYPES
                and int(v.shape[1]) % layout_block(layout) == 0)

    # -- nodes ----------------------------------------------------------------------------
    def all_plain(self, node: Node) -> None:
        node.inputs = [self.convert(i, PLAIN) if i else i for i in node.inputs]
        node.epilogue = [e.with_input(self.convert(e.input, PLAIN)) if e.input else e for e in node.epilogue]
        for o in node.outputs:
            if o:
                self.g.values[o].layout = PLAIN
        self.commit()

    def conv(self, node: Node) -> bool:
        g = self.g
        if nchwc_reason(node, g, self.target) is not None:
            return False
        x = node.inputs[0]
        geo = ConvGeometry(node, g)
        in_block = layout_block(g.values[x].layout)
        found = self.schedules(node, g, in_block) if self.schedules else None
        sched, source = found if found is not None else (default_schedule(node, g, self.target), "default")
        ob = sched.oc_bn
        if is_depthwise(geo):
            want = ob
        elif self.mode == "conv":
            want = ob if geo.cg % ob == 0 and geo.c % ob == 0 else 1
        elif sched.ic_bn:
            want = sched.ic_bn
        elif (in_block == 1 and geo.group == 1 and geo.c % ob == 0 and self.options.conv_block_plain_input
              and geo.ins[0] * geo.ins[1] >= PLAIN_INPUT_MIN_PLANE and geo.c * geo.ks[0] >= PLAIN_INPUT_MIN_ROWS):
            # a plain input of whole blocks (a Split's, a DepthToSpace's output): one layout
            # transform, then the blocked kernel (and Winograd where it applies), instead of the
            # 1-channel-block kernel, whose tile reads C x KH separate input rows, more streams than
            # the hardware prefetchers follow (YOLOv8-seg's 128->128 3x3 on 160x160 after its
            # ConvTranspose: 56% of peak, 24.6 ms; the model 1.25x). Not on tiny planes (squeeze-
            # excite convs on 1x1) nor for few rows (basic-pitch's 8-channel 3x39 conv: 2.7% slower)
            want = ob
            tuned = self.schedules(node, g, want) if self.schedules else None
            if tuned is not None:  # a tile measured on the blocked input it now reads
                sched, source = tuned
                ob = sched.oc_bn
        else:
            want = in_block
        if geo.c % want or (geo.group > 1 and not is_depthwise(geo) and geo.cg % want):
            want = 1
        src = x
        if self.mode == "conv":  # a transform pair around every conv: its input arrives plain
            src = self.convert(x, PLAIN)
        node.inputs[0] = self.convert(src, blocked_layout(want))
        out_layout = blocked_layout(ob)
        node.epilogue = [e.with_input(self.convert(e.input, out_layout)) if e.input and e.broadcast == "full" else e
                         for e in node.epilogue]
        g.values[node.outputs[0]].layout = out_layout
        node.schedule = ConvSchedule("direct", sched, source)
        tpl, why = find_template(node, g)
        if tpl is None or tpl.name != "f32_conv_nchwc":  # should not happen: be safe, stay plain
            self.rollback()
            node.inputs[0] = x
            g.values[node.outputs[0]].layout = PLAIN
            node.schedule = None
            return False
        self.commit()
        return True

    def int_conv(self, node: Node) -> bool:
        """QLinearConv on the blocked int8 kernel (schedule/int_conv.py): it reads its input in
        whatever layout arrives (copying it when it must), fuses a following quantized ReLU
        (``Max(y, y_zero_point)``) and then a following QLinearClip (``clip_requant``) or else a
        residual QLinearAdd (``residual_add``: its other operand computed earlier, it and the sum
        NCHW<b>c; the operand becomes the conv's input 9), and writes NCHW<b>c when every reader
        takes that layout, else plain (so no int8 LayoutTransform is needed before a plain-only
        reader)."""
        g = self.g
        if node.name in self.force_fallback or int_nchwc_reason(node, g, self.target) is not None:
            return False
        y = node.outputs[0]
        readers = self.consumers.get(y, [])
        relu = (len(readers) == 1 and readers[0].name not in self.force_fallback
                and relu_zero_point(node, g, readers[0]))
        fused = [readers[0]] if relu else []
        out = readers[0].outputs[0] if relu else y
        after = self.consumers.get(out, [])
        clip = (clip_requant(out, g, after[0]) if len(after) == 1 and after[0].name not in self.force_fallback
                else None)
        if clip is not None:
            fused.append(after[0])
            out = after[0].outputs[0]
        block = int_block(self.target)
        assert block is not None
        in_block = layout_block(g.values[node.inputs[0]].layout)

        def blocked(name: str) -> bool:
            return (int(g.values[name].shape[1]) % block == 0 and name not in g.outputs
                    and self._int8_readers_take(name, blocked_layout(block)))

        # a residual QLinearAdd after it (ResNet's shortcut join), when its other operand is
        # already computed and both it and the sum are NCHW<b>c: the epilogue adds (ResidualAdd)
        after = self.consumers.get(out, [])
        add = None
        if clip is None and len(after) == 1 and after[0].name not in self.force_fallback:
            available = set(g.inputs) | {o for n in self.out for o in n.outputs}
            add = residual_add(out, g, after[0], available, int_isa(self.target).fma)
            if add is not None and not (g.values[add.residual].layout == blocked_layout(block)
                                        and blocked(after[0].outputs[0])):
                add = None
        if add is not None:
            fused.append(after[0])
            out = after[0].outputs[0]
            node.inputs = (list(node.inputs) + [""] * 9)[:9] + [add.residual]
        node.schedule = int_conv_schedule(node, g, self.target, in_block, relu, clip, add, self.options.inplace,
                                          self.options.int_conv_pad_in_kernel, self.options.int_conv_prefetch_weights)
        is_blocked = add is not None or blocked(out)
        node.outputs = [out]
        g.values[out].layout = blocked_layout(block) if is_blocked else PLAIN
        tpl, _ = find_template(node, g)
        if tpl is None or tpl.name != "int_conv_nchwc":  # should not happen: stay on the NCHW kernel
            node.outputs = [y]
            node.inputs = node.inputs[:9]
            g.values[out].layout = PLAIN
            node.schedule = None
            return False
        for r in fused:  # their outputs are written by the conv; the conv's own outputs no longer exist
            self.skip.add(r.name)
            g.values.pop(y, None)
            y = r.outputs[0]
        return True

    def _int8_readers_take(self, name: str, layout: str) -> bool:
        """Every reader of ``name`` runs natively with it in ``layout``: another blocked int8
        conv, or a node whose template accepts it with its other inputs of the same shape and
        its 4-D outputs in that layout too (an element-wise int8 op on two such inputs, a
        per-tensor DequantizeLinear, an 8-bit MaxPool; tried, then undone)."""
        g = self.g
        readers = self.consumers.get(name, [])
        if not readers:
            return False
        for r in readers:
            if r.name in self.force_fallback:
                return False
            if r.op == "QLinearConv" and r.inputs[0] == name and int_nchwc_reason(r, g, self.target) is None:
                continue
            shape = g.values[name].shape
            same = [i for i in r.all_inputs() if i in g.values and g.values[i].const is None
                    and g.values[i].shape == shape and self.can_block(i, layout)]
            # and its outputs that can hold the layout (an element-wise reader or a pool keeps it)
            same += [o for o in r.outputs if o and o not in g.outputs and self.can_block(o, layout)]
            saved = {i: g.values[i].layout for i in same}
            for i in same:
                g.values[i].layout = layout
            tpl, _ = find_template(r, g)
            for i, lay in saved.items():
                g.values[i].layout = lay
            if tpl is None:
                return False
        return True

    def try_layouts(self, node: Node, in_layout: str | None, out_layout: str | None) -> bool:
        """Convert data inputs to ``in_layout`` (None: keep), give outputs ``out_layout`` where
        they can hold it; keep it if some template accepts the result."""
        g = self.g
        saved_in = list(node.inputs)
        saved_ep = list(node.epilogue)
        saved_out = {o: g.values[o].layout for o in node.outputs if o}
        if in_layout is not None:
            node.inputs = [self.convert(i, in_layout) if i and self.can_block(i, in_layout) else i
                           for i in node.inputs]
            node.epilogue = [e.with_input(self.convert(e.input, in_layout))
                             if e.input and self.can_block(e.input, in_layout) else e for e in node.epilogue]
        for o in node.outputs:
            if o:
                ok = out_layout is not None and self.can_block(o, out_layout)
                g.values[o].layout = out_layout if ok else PLAIN
        tpl, _ = find_template(node, g) if node.name not in self.force_fallback else (None, "")
        if tpl is not None:
            self.commit()
            return True
        self.rollback()
        node.inputs = saved_in
        node.epilogue = saved_ep
        for o, lay in saved_out.items():
            g.values[o].layout = lay
        return False

    def other(self, node: Node) -> None:
        g = self.g
        names = [i for i in node.all_inputs() if i in g.values and g.values[i].const is None]
        layouts = [g.values[i].layout for i in names if g.values[i].layout != PLAIN]
        if not layouts or self.mode == "conv" or node.name in self.force_fallback:
            self.all_plain(node)
            return
        # the majority layout; ties go to the first input's (deterministic, and what the global
        # search in smelt.schedule.layout_search models)
        lay = max(dict.fromkeys(layouts), key=layouts.count)
        for in_l, out_l in ((None, lay), (lay, lay), (None, PLAIN), (lay, PLAIN)):
            if self.try_layouts(node, in_l, out_l):
                return
        self.all_plain(node)

    def run(self) -> Graph:
        for node in list(self.g.nodes):
            if node.name in self.skip:
                continue
            if node.op == "QLinearConv" and self.int_conv(node):
                self.out.append(node)
                continue
            if node.op == "Conv" and node.domain in ("", "ai.onnx") and node.name not in self.force_fallback:
                if prefers_gemm(node, self.g, self.target, self.options):  # the per-layer algorithm choice
                    self.all_plain(node)
                    self.out.append(node)
                    continue
                if self.conv(node):
                    self.out.append(node)
                    continue
            self.other(node)
            self.out.append(node)
        self.g.nodes = self.out
        self._plain_outputs()
        return self.g

    def _plain_outputs(self) -> None:
        """Graph outputs leave in plain layout: the producer writes a blocked twin that one
        final transform turns into the output."""
        g = self.g
        for out in list(g.outputs):
            v = g.values[out]
            if v.layout == PLAIN:
                continue
            twin = g.fresh_name(f"{out}__{v.layout}")
            g.add_value(Value(twin, v.dtype, v.shape, layout=v.layout))
            for node in g.nodes:
                node.outputs = [twin if o == out else o for o in node.outputs]
                node.inputs = [twin if i == out else i for i in node.inputs]
                node.epilogue = [e.with_input(twin) if e.input == out else e for e in node.epilogue]
            v.layout = PLAIN
            g.nodes.append(Node("LayoutTransform", g.fresh_name("layout_transform"), [twin], [out],
                                attrs={"src": g.values[twin].layout, "dst": PLAIN}, domain=SMELT_DOMAIN))


def plan_layouts(g: Graph, target: Target, options: CompileOptions, schedules: ScheduleFn | None = None) -> Graph:
    """Assign blocked layouts (see the module docstring) in ``options.layout``'s mode."""
    if options.layout == "nchw" or vector_lanes(target) < min(NCHWC_BLOCKS):
        return g
    return _Planner(g, target, options, schedules).run()
