"""The schedule stage's driver: one call between the graph passes and code generation.

``schedule_graph`` plans layouts (NeoCPU's blocked layouts, which fix each conv's output block)
and then, for every heavy node, resolves forced -> tuned -> default and writes a typed schedule
on the node (``node.schedule``): ``ConvSchedule`` for convolutions (``schedule.conv``),
``RnnSchedule`` for LSTM/GRU/RNN (``schedule.rnn``: level, thread grids, direction order,
register budget, stacked-pipeline membership). Code generation reads nothing else: no
template opens the tuning database, runs a cost model or detects the CPU.

``fingerprint`` is what a build read from the tuning database; it is part of the artifact key, so
tuning rebuilds the models it affects.
"""

from __future__ import annotations

from smelt.ir.graph import Graph, Node
from smelt.options import CompileOptions
from smelt.schedule import conv
from smelt.schedule.db import (
    CONV_KIND,
    RNN_KIND,
    SCHEME_KIND,
    TRANSFORM_KIND,
    TuningDB,
    fingerprint,
    open_default,
)
from smelt.schedule.dwpw import fuse_dw_pw
from smelt.schedule.gemm import decide_gemm_graph
from smelt.schedule.int_channel_pad import pad_int8_channels
from smelt.schedule.layout import ScheduleFn, plan_layouts
from smelt.schedule.layout_search import global_schedules
from smelt.schedule.rnn import decide_rnn_graph
from smelt.target import Target


def tuning_db(options: CompileOptions) -> TuningDB | None:
    """The database this build reads (None: tuning off or no database yet)."""
    return open_default(create=False) if options.use_tuning_db else None


def _kinds_read(options: CompileOptions) -> tuple[str, ...]:
    """Record kinds a build reads: RNN grids always; conv tiles only when convs are blocked
    (not under layout "nchw"); the global search's costs in mode "global"."""
    if not blocks_convs(options):
        return (RNN_KIND,)
    return (CONV_KIND, RNN_KIND) + ((SCHEME_KIND, TRANSFORM_KIND) if options.layout == "global" else ())


def blocks_convs(options: CompileOptions) -> bool:
    """Whether layouts are planned (blocked convs, conv tiles from the database)."""
    return options.opt_level >= 1 and options.layout != "nchw"


def fingerprint_for(options: CompileOptions, target: Target) -> str:
    return fingerprint(tuning_db(options), target.key(), _kinds_read(options))


def _conv_tiles(g: Graph, target: Target, options: CompileOptions, db: TuningDB | None) -> ScheduleFn | None:
    """Where the layout pass gets a conv's tile for the block that arrives: the global search's
    pick (forced) in mode "global", else the tuning database (tuned); None: the cost model."""
    if options.layout == "global":
        return global_schedules(g, target, options.threads, db, options.force_fallback)
    if db is None:
        return None

    def tuned(node: Node, g: Graph, in_block: int):
        s = conv.tuned_schedule(db, node, g, in_block, options.threads, target)
        return (s, "tuned") if s is not None else None

    return tuned


def schedule_graph(g: Graph, target: Target, options: CompileOptions) -> Graph:
    """Plan layouts and write every heavy node's schedule (see the module docstring). At
    ``opt_level`` 0 layouts stay plain, but every heavy node still gets its schedule (the
    templates render nothing else)."""
    db = tuning_db(options)
    if blocks_convs(options):
        if options.int8_channel_padding:
            g = pad_int8_channels(g, target)
        g = plan_layouts(g, target, options, _conv_tiles(g, target, options, db))
    # every opt level: at 0 layouts stay plain and each Conv gets its NCHW GEMM's schedule
    for node in g.nodes:
        if node.op == "Conv" and node.domain in ("", "ai.onnx") and node.name not in options.force_fallback:
            conv.finish(node, g, target, options)
    if blocks_convs(options):  # depthwise convs fused into the 1x1 conv that reads them
        g = fuse_dw_pw(g, target, options)
    decide_gemm_graph(g, options)
    decide_rnn_graph(g, target, options.codegen_threads(target), db)
    return g
